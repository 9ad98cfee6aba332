"""``edgekit tune`` against the exhaustive sweep of the same space, on the example MobileNetV2 and the pretrained
PP-OCR text-direction classifier, target x86-cpu (onnxruntime and OpenVINO CPU), objective latency.

For each model: the sweep (``strategy="exhaustive"``: every configuration measured at full length, interleaved)
runs once, converting every recipe into a cache; then ``tune`` (successive halving) runs on the same cache.
Reported:

* both tables (configuration, parity, size, raw p50/p99, the figure relative to the anchor, fps);
* pick ratio: the latency of tune's pick as the sweep measured it over the sweep's best. The sweep measures its
  trials in chunks (edge.tune.measure.MAX_OPEN open at once) under background load that drifts between them, so
  one anchor trial is measured in every chunk and the sweep ranks by each trial's ratio to it in the same chunk
  ("vs anchor"): the pick ratio is the ratio of those figures (the raw p50 ratio is printed beside it). And,
  because on a shared host the two runs see different load, the **head to head**: the pick and the sweep's best
  interleaved side by side in one run (ratio of medians, 95% bootstrap CI); goal <= 1.05;
* search wall-time ratio: tune's measuring time over the sweep's (conversions excluded: cached); goal <= 1/3;
* total wall-time ratio from a cold cache: (conversions + tune's search) / (conversions + sweep's search).

    python benchmarks/tune.py [--workdir DIR] [--json FILE] [--models mobilenetv2,ppocr-cls]

With ``--workdir`` kept from an earlier run the sweep is not measured again (its study file has every trial; its
timings are read from ``sweep-NAME/timing.json``, written when it ran): only ``tune`` runs again, from scratch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

from edge.pipeline.request import ConvertRequest

PPOCR_SHAPE = (1, 3, 48, 192)


def rows(result: Any) -> list[list[Any]]:
    from edge.tune.report import row

    def order(t: dict[str, Any]) -> tuple[float, float]:  # as the search ranked: by the figure relative to the anchor
        res = t["result"] or {}
        return res.get("vs_anchor", float("inf")), res.get("score", float("inf"))

    out = []
    for t in sorted(result.trials, key=order):
        r = row(t)
        rel = (t["result"] or {}).get("vs_anchor")
        out.append(
            [
                r["configuration"],
                r["status"],
                r["size_mb"],
                r["parity"],
                C.f(r["p50_ms"]),
                C.f(r["p99_ms"]),
                f"{rel:.3f}" if rel is not None else "-",
                r["fps"],
                r["measured"],
            ]
        )
    return out


def pick_ratio(pick: dict[str, Any], best: dict[str, Any]) -> tuple[float, str]:
    """The pick over the sweep's best in the sweep's own figures: by their ratios to the anchor measured in the
    same chunk when the sweep has them (its chunks ran under different background load), else by raw p50."""
    a, b = pick["result"], best["result"]
    if (
        a.get("vs_anchor") is not None
        and b.get("vs_anchor") is not None
        and a.get("anchor", {}).get("id") == b.get("anchor", {}).get("id")
    ):
        return a["vs_anchor"] / b["vs_anchor"], "relative to the anchor in each chunk"
    return a["score"] / b["score"], "raw p50"


def head_to_head(best: dict[str, Any], pick: dict[str, Any], iterations: int) -> dict[str, Any]:
    """tune's pick against the sweep's best, side by side in one interleaved run (blocks of 5, order rotated):
    the ratio of their medians, with a 95% bootstrap interval over paired blocks."""
    from edge.bundle.bundle import Bundle
    from edge.tune.measure import open_trial_runner
    from edge.tune.space import Config

    if best["id"] == pick["id"]:
        return {"same": True, "ratio": 1.0, "ci_pct": [0.0, 0.0]}
    calls, opened = {}, []
    try:
        for name, t in (("pick", pick), ("best", best)):
            cfg = Config(
                t["runner"], t["precision"], tuple(t["recipe"].items()), tuple(t["options"].items()), t["workers"]
            )
            runner, feeds = open_trial_runner(dict(t), Bundle.open(t["bundle"], trust=False), cfg)
            opened.append(runner)
            calls[name] = (runner.infer, (feeds,))
        ms = C.interleaved(calls, iterations, block=5, warmup=20)
    finally:
        for r in opened:
            r.close()
    lo, hi = C.ratio_ci(ms["pick"], ms["best"], block=5)
    return {
        "same": False,
        "ratio": float(np.median(ms["pick"]) / np.median(ms["best"])),
        "ci_pct": [lo, hi],
        "pick_p50_ms": float(np.median(ms["pick"])),
        "best_p50_ms": float(np.median(ms["best"])),
    }


HEAD = ["configuration", "status", "size MB", "parity", "p50 ms", "p99 ms", "vs anchor", "fps", "measured at"]


def main() -> int:
    C.print_measured_on()  # the CPU's ISA class and the load, with every figure
    from edge.tune.search import TuneOptions, tune

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--workdir", metavar="DIR")
    p.add_argument("--models", default="mobilenetv2,ppocr-cls")
    p.add_argument("--iterations", "-n", type=int, default=400, help="head-to-head iterations per side (default 400)")
    args = p.parse_args()
    info = C.host_info()
    results: dict[str, Any] = {"host": info, "models": {}}
    with C.workdir(args.workdir) as wd:
        for name in args.models.split(","):
            if name == "mobilenetv2":
                model, req = C.mobilenet_v2(wd), ConvertRequest(calib="random")
            elif name == "ppocr-cls":
                model, req = (
                    C.ppocr_cls(),
                    ConvertRequest(calib="random", input_shapes={"x": PPOCR_SHAPE}, preprocess="ppocr"),
                )
            else:
                raise SystemExit(f"unknown model {name!r}")
            cache = wd / f"cache-{name}"
            common = TuneOptions(cache=cache, pictures=False)
            C.log(f"{name}: exhaustive sweep (converting every recipe into {cache})")
            sweep = tune(
                model,
                "x86-cpu",
                req,
                dataclasses.replace(common, out=wd / f"sweep-{name}", strategy="exhaustive"),
                on_step=lambda m: C.log("  " + m),
            )
            timing = wd / f"sweep-{name}" / "timing.json"
            if sweep.measured:  # measured now: its timings are kept for a later run that reuses the sweep
                timing.write_text(
                    json.dumps(
                        {
                            "convert_s": sweep.convert_s,
                            "search_s": sweep.search_s,
                            "loadavg_1m_at_end": C.host_info().get("loadavg_1m"),
                        }
                    )
                )
            else:  # every trial came from the study: the sweep's own timings are those of the run that measured it
                if not timing.is_file():
                    raise SystemExit(f"{timing} is missing: remove {wd / f'sweep-{name}'} to measure the sweep again")
                t = json.loads(timing.read_text())
                sweep.convert_s, sweep.search_s = float(t["convert_s"]), float(t["search_s"])
                C.log(f"{name}: the sweep came from its study (measured earlier: {sweep.search_s:.1f} s)")
            C.log(f"{name}: tune (successive halving, same conversion cache)")
            shutil.rmtree(wd / f"tune-{name}", ignore_errors=True)  # a fresh search, never resumed
            tuned = tune(
                model,
                "x86-cpu",
                req,
                dataclasses.replace(common, out=wd / f"tune-{name}"),
                on_step=lambda m: C.log("  " + m),
            )
            by_id = {t["id"]: t for t in sweep.trials}
            best = sweep.winner
            pick_in_sweep = by_id[tuned.winner["id"]]
            ratio, basis = pick_ratio(pick_in_sweep, best)
            raw_ratio = pick_in_sweep["result"]["score"] / best["result"]["score"]
            search_ratio = tuned.search_s / sweep.search_s
            total_ratio = (sweep.convert_s + tuned.search_s) / (sweep.convert_s + sweep.search_s)
            h2h = head_to_head(best, tuned.winner, args.iterations)
            print(
                C.table(
                    HEAD,
                    rows(sweep),
                    title=f"\n{name}: exhaustive sweep, {len(sweep.trials)} configurations "
                    f"(conversions {sweep.convert_s:.1f} s, measuring {sweep.search_s:.1f} s)",
                )
            )
            print(
                C.table(
                    HEAD,
                    rows(tuned),
                    title=f"\n{name}: tune, successive halving (measuring {tuned.search_s:.1f} s, "
                    f"{tuned.measured} measurements, {tuned.converted} conversions)",
                )
            )
            print(
                f"\n{name}: sweep best {best['label']} p50 {best['result']['score']:.3f} ms; tune's pick "
                f"{tuned.winner['label']}, {pick_in_sweep['result']['score']:.3f} ms in the sweep -> pick ratio "
                f"{ratio:.3f} ({basis}; raw p50s: {raw_ratio:.3f}; goal <= 1.05)"
            )
            for note in sweep.notes + tuned.notes:
                if "anchor" in note:
                    print(f"{name}: {note}")
            if h2h["same"]:
                print(f"{name}: head to head: tune picked the sweep's best configuration (ratio 1)")
            else:
                print(
                    f"{name}: head to head, interleaved, {args.iterations} each: pick {h2h['pick_p50_ms']:.3f} ms vs "
                    f"best {h2h['best_p50_ms']:.3f} ms -> ratio {h2h['ratio']:.3f} (95% CI {h2h['ci_pct'][0]:+.1f}% "
                    f"to {h2h['ci_pct'][1]:+.1f}%; goal <= 1.05)"
                )
            print(
                f"{name}: measuring time tune/sweep {tuned.search_s:.1f}/{sweep.search_s:.1f} s = {search_ratio:.2f} "
                f"(goal <= 0.33); with the {sweep.convert_s:.1f} s of conversions from a cold cache: "
                f"{total_ratio:.2f}"
            )
            print(f"{name}: pruned: " + "; ".join(sweep.pruned))
            results["models"][name] = {
                "sweep": sweep.to_json(),
                "tune": tuned.to_json(),
                "pick_ratio": ratio,
                "pick_ratio_basis": basis,
                "pick_ratio_raw_p50": raw_ratio,
                "head_to_head": h2h,
                "search_ratio": search_ratio,
                "total_ratio": total_ratio,
            }
    print("\n" + C.host_line(info))
    C.dump_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
