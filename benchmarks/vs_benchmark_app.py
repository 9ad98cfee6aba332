#!/usr/bin/env python3
"""``edgekit bench`` against OpenVINO's own ``benchmark_app`` on the same IR and settings.

The IR is an ``intel-igpu`` bundle of the example MobileNetV2 (fp32 by default): its
model.xml. Both sides run on device CPU (the runner falls back from GPU and says so), with:

  API           sync: edgekit's runner calls ``InferRequest.infer`` per frame; benchmark_app ``-api sync``
  hint          LATENCY: the profile's ``performance_hint``; ``-hint latency``
  threads       N = the runner's INFERENCE_NUM_THREADS read back with the profile's options
                (``runner.info.threads``), or ``--threads``; passed to both: runner option
                ``num_threads=N``, and for benchmark_app ``-load_config`` with
                {"CPU": {"INFERENCE_NUM_THREADS": N}} because benchmark_app refuses ``-nthreads``
                unless ``-hint none`` (its own UI rule); both read back and checked
  precision     ``-infer_precision`` = what the runner computes in (f32 for an fp32 bundle)
  input         the same tensor: ``edge.bench.random_feeds(runner, seed=0)``, saved as .npy and
                given with ``-i``; ``-ip f32`` keeps the f32 input (without it benchmark_app makes
                image-like inputs u8 and adds a conversion to the model)
  iterations    ``-niter N`` = edgekit ``iterations=N``; one untimed first inference each; edgekit
                warm-up 0 by default (benchmark_app has none)

Rounds alternate edgekit, benchmark_app, edgekit, benchmark_app, ...; each run loads and
compiles the model afresh. edgekit's side runs in this process through
``edge.bench.run_benchmark`` (the function ``edgekit bench`` calls), or with ``--edgekit cli``
through ``edgekit bench --json`` in a subprocess. Compared: the median of the per-round
medians of each side; goal |difference| <= 5%.

benchmark_app's latency is ``InferRequest.latency`` (time inside OpenVINO, no Python); its
"Median" is the lower middle sample, printed with 2 decimals. edgekit's is wall time around
``runner.infer(feeds)`` (Python dispatch, output copy and dict included), interpolated median.

    .venv/bin/python benchmarks/vs_benchmark_app.py               # ~1-2 min
    .venv/bin/python benchmarks/vs_benchmark_app.py --rounds 5 -n 1000 --json vs_ba.json
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

GOAL_PCT = 5.0
BENCHMARK_APP = Path(sys.executable).parent / "benchmark_app"
EDGEKIT = Path(sys.executable).parent / "edgekit"
_KEYS = (
    "PERFORMANCE_HINT",
    "INFERENCE_PRECISION_HINT",
    "INFERENCE_NUM_THREADS",
    "NUM_STREAMS",
    "ENABLE_CPU_PINNING",
    "EXECUTION_DEVICES",
)
_OV_TYPE = {"f32": "f32", "bf16": "bf16", "f16": "f16"}


# -- benchmark_app -----------------------------------------------------------------------


def parse_benchmark_app(out: str) -> dict[str, Any]:
    """Median/average/min/max latency (ms), count, and the compiled model's properties (step 8)."""

    def lat(label: str) -> float | None:
        m = re.search(rf"^\[ INFO \]\s+{label}:\s+([0-9.]+)\s*(ms|us)\s*$", out, re.M)
        if not m:
            return None
        v = float(m.group(1))
        return v / 1000.0 if m.group(2) == "us" else v

    res: dict[str, Any] = {
        "median_ms": lat("Median"),
        "average_ms": lat("Average"),
        "min_ms": lat("Min"),
        "max_ms": lat("Max"),
    }
    m = re.search(r"Count:\s+(\d+) iterations", out)
    res["count"] = int(m.group(1)) if m else None
    m = re.search(r"First inference took ([0-9.]+) ms", out)
    res["first_inference_ms"] = float(m.group(1)) if m else None
    m = re.search(r"Throughput:\s+([0-9.]+) FPS", out)
    res["throughput_fps"] = float(m.group(1)) if m else None
    step8 = out.split("[Step 8/11]", 1)[-1].split("[Step 9/11]", 1)[0]
    res["properties"] = dict(re.findall(r"^\[ INFO \]   ([A-Z_]+): (.*)$", step8, re.M))
    step6 = out.split("[Step 6/11]", 1)[-1].split("[Step 7/11]", 1)[0]
    m = re.search(r"Model inputs:\s*\n\[ INFO \]\s+(.*)", step6)
    res["input"] = m.group(1).strip() if m else None
    return res


def run_benchmark_app(
    xml: Path, *, niter: int, threads: int, precision: str, npy: Path, cfg: Path, timeout: float
) -> dict[str, Any]:
    cfg.write_text(json.dumps({"CPU": {"INFERENCE_NUM_THREADS": str(threads)}}))
    cmd = [
        str(BENCHMARK_APP),
        "-m",
        str(xml),
        "-d",
        "CPU",
        "-api",
        "sync",
        "-hint",
        "latency",
        "-infer_precision",
        precision,
        "-ip",
        "f32",
        "-i",
        str(npy),
        "-niter",
        str(niter),
        "-load_config",
        str(cfg),
    ]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if p.returncode != 0 or "Median:" not in p.stdout:
        raise SystemExit(
            f"benchmark_app failed (exit {p.returncode}): {' '.join(cmd)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        )
    res = parse_benchmark_app(p.stdout)
    if res["median_ms"] is None:
        raise SystemExit(f"could not find benchmark_app's 'Median:' line in:\n{p.stdout[-3000:]}")
    res.update(cmd=cmd, wall_s=round(wall, 2))
    return res


# -- edgekit ---------------------------------------------------------------------------


def run_edgekit_inprocess(
    bundle: Any, *, niter: int, threads: int, warmup: int, feeds: dict[str, np.ndarray]
) -> dict[str, Any]:
    from edge.bench import BenchOptions, run_benchmark

    props: dict[str, str] = {}

    def open_runner() -> Any:
        r = bundle.open_runner({"num_threads": threads})
        compiled = getattr(r, "_compiled", None)  # private: read back what benchmark_app prints in step 8
        if compiled is not None:
            for k in _KEYS:
                try:
                    props[k] = str(compiled.get_property(k))
                except Exception:  # noqa: BLE001
                    pass
        return r

    t0 = time.perf_counter()
    rep = run_benchmark(
        open_runner, BenchOptions(iterations=niter, warmup=warmup, bundle=bundle.id, target=bundle.target), feeds=feeds
    )
    data = rep.to_json()
    data["properties"] = props
    data["wall_s"] = round(time.perf_counter() - t0, 2)
    return data


def clock_split(bundle: Any, *, niter: int, threads: int, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
    """One extra run of the runner timing every call with both clocks: wall time around
    ``runner.infer`` (edgekit's) and ``InferRequest.latency`` (benchmark_app's), to show how much
    of a difference is the Python side rather than the inference itself."""
    with bundle.open_runner({"num_threads": threads}) as r:
        req = getattr(r, "_request", None)  # private: the runner's InferRequest
        if req is None:
            return {}
        r.infer(feeds)
        wall = np.empty(niter)
        lat = np.empty(niter)
        clock = time.perf_counter_ns
        for i in range(niter):
            t = clock()
            r.infer(feeds)
            wall[i] = (clock() - t) / 1e6
            lat[i] = req.latency
    return {
        "iterations": niter,
        "wall_median_ms": float(np.median(wall)),
        "latency_median_ms": float(np.median(lat)),
        "python_side_median_us": float(np.median(wall - lat)) * 1e3,
    }


def run_edgekit_cli(bundle: Any, *, niter: int, warmup: int, timeout: float) -> dict[str, Any]:
    cmd = [str(EDGEKIT), "bench", str(bundle.path), "-n", str(niter), "--warmup", str(warmup), "--json"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode not in (0, 1):  # 1 = budget verdict "fail", still a report
        raise SystemExit(
            f"edgekit bench failed (exit {p.returncode}): {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
        )
    data = json.loads(p.stdout)
    data["wall_s"] = round(time.perf_counter() - t0, 2)
    data["cmd"] = cmd
    data["properties"] = {}
    return data


# -- main ------------------------------------------------------------------------------


def main() -> int:
    C.print_measured_on()  # the CPU's ISA class and the load, with every figure
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    C.add_common_args(p, iterations=500)
    p.add_argument("--rounds", type=int, default=3, help="runs per side, alternating (default 3)")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="inference threads for both (default: what the runner uses with the profile's options)",
    )
    p.add_argument(
        "--precision",
        choices=("fp32", "fp16", "int8"),
        default="fp32",
        help="bundle precision (default fp32); -infer_precision follows what the runner computes in",
    )
    p.add_argument("--warmup", type=int, default=0, help="edgekit untimed iterations after the first (default 0)")
    p.add_argument(
        "--edgekit",
        choices=("inprocess", "cli"),
        default="inprocess",
        help="edgekit side: edge.bench.run_benchmark in this process (default) or `edgekit bench --json`",
    )
    p.add_argument("--timeout", type=float, default=300, help="seconds per subprocess run (default 300)")
    args = p.parse_args()
    C.json_to_stdout(args)
    if not BENCHMARK_APP.exists():
        found = shutil.which("benchmark_app")
        if not found:
            raise SystemExit(f"benchmark_app not found at {BENCHMARK_APP} nor on PATH (pip install openvino)")
        globals()["BENCHMARK_APP"] = Path(found)

    from edge.bench import random_feeds

    info = C.host_info()
    started = time.perf_counter()
    results: dict[str, Any] = {
        "host": info,
        "args": {k: v for k, v in vars(args).items() if k != "json"},
        "goal_pct": GOAL_PCT,
        "rounds": [],
    }
    with C.workdir(args.workdir) as wd:
        model = C.mobilenet_v2(wd)
        extra = {"calib": "random"} if args.precision == "int8" else {}
        b = C.convert_cached(
            model,
            "intel-igpu",
            wd / f"mnv2-intel-igpu-{args.precision}",
            reuse=bool(args.workdir),
            precision=args.precision,
            **extra,
        )
        xml = b.artifact
        with b.open_runner() as probe:
            default_threads = probe.info.threads
            feeds = random_feeds(probe, seed=0)
            runner_info = probe.info.to_json()
        threads = args.threads or default_threads
        if not threads:
            raise SystemExit("the runner did not report its thread count; pass --threads")
        if args.edgekit == "cli" and threads != default_threads:
            raise SystemExit(
                f"--edgekit cli runs with the profile's options ({default_threads} threads); "
                f"--threads {threads} needs --edgekit inprocess"
            )
        precision = _OV_TYPE.get(runner_info["precision_used"])
        if precision is None:
            raise SystemExit(f"runner computes in {runner_info['precision_used']!r}: no -infer_precision for that")
        ((name, arr),) = feeds.items()
        npy = wd / "input.npy"
        np.save(npy, arr)
        cfg = wd / "benchmark_app_config.json"
        results.update(
            bundle=b.id,
            xml=str(xml),
            threads=threads,
            infer_precision=precision,
            runner_info=runner_info,
            input={"name": name, "shape": list(arr.shape), "dtype": str(arr.dtype)},
            model_sha256=b.manifest["source"]["sha256"],
            edgekit_mode=args.edgekit,
        )
        C.log(
            f"IR {xml}; {threads} threads; -infer_precision {precision}; {args.iterations} iterations; "
            f"{args.rounds} rounds, edgekit {args.edgekit}"
        )
        for k in range(args.rounds):
            if args.edgekit == "inprocess":
                e = run_edgekit_inprocess(b, niter=args.iterations, threads=threads, warmup=args.warmup, feeds=feeds)
            else:
                e = run_edgekit_cli(b, niter=args.iterations, warmup=args.warmup, timeout=args.timeout)
            C.log(f"  round {k + 1}: edgekit median {e['latency']['p50_ms']:.3f} ms")
            a = run_benchmark_app(
                xml, niter=args.iterations, threads=threads, precision=precision, npy=npy, cfg=cfg, timeout=args.timeout
            )
            C.log(f"  round {k + 1}: benchmark_app median {a['median_ms']:.3f} ms")
            results["rounds"].append({"edgekit": e, "benchmark_app": a})
        if args.edgekit == "inprocess":
            results["clock_split"] = clock_split(b, niter=args.iterations, threads=threads, feeds=feeds)
    rounds = results["rounds"]
    e_med = np.array([r["edgekit"]["latency"]["p50_ms"] for r in rounds])
    a_med = np.array([r["benchmark_app"]["median_ms"] for r in rounds])
    results["edgekit_median_of_medians_ms"] = float(np.median(e_med))
    results["benchmark_app_median_of_medians_ms"] = float(np.median(a_med))
    results["difference_pct"] = C.pct(np.median(e_med), np.median(a_med))
    results["per_round_difference_pct"] = [C.pct(x, y) for x, y in zip(e_med, a_med)]
    results["total_s"] = round(time.perf_counter() - started, 1)
    results["host"]["loadavg_1m_end"] = C.host_info().get("loadavg_1m")

    # -- checks: did both really run with the same settings? -------------------------------
    checks = []
    ba_props = rounds[0]["benchmark_app"]["properties"]
    ek_props = rounds[0]["edgekit"].get("properties") or {}
    ek_runner = rounds[0]["edgekit"]["runner"]
    want = {"INFERENCE_NUM_THREADS": str(threads), "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1"}
    for key, value in want.items():
        checks.append((f"benchmark_app {key}", ba_props.get(key), value))
    checks.append(("edgekit threads (runner.info)", str(ek_runner.get("threads")), str(threads)))
    checks.append(("edgekit precision (runner.info)", ek_runner.get("precision_used"), precision))
    for key in _KEYS:
        if key in ek_props:
            checks.append((f"{key}: edgekit vs benchmark_app", ek_props[key], ba_props.get(key)))
    results["checks"] = [{"what": w, "got": g, "expected": x, "ok": g == x} for w, g, x in checks]

    # -- print ------------------------------------------------------------------------------
    print(C.host_line(info))
    ri = results["runner_info"]
    print(f"IR: {results['xml']} (bundle {results['bundle']})")
    print(
        f"settings: CPU, sync, LATENCY hint, {threads} threads, inference precision {precision}, "
        f"{args.iterations} iterations per run, input {name} {tuple(arr.shape)} {arr.dtype} "
        f"(same values both sides), edgekit warm-up {args.warmup}"
    )
    print(
        f"edgekit side: {'edge.bench.run_benchmark in-process' if args.edgekit == 'inprocess' else 'edgekit bench --json'}"
        f" ({ri['runtime']} on {ri['device_used']}; fallback: {ri['fallback'] or 'none'})"
    )
    print(
        "benchmark_app: "
        + " ".join(Path(c).name if i == 0 else c for i, c in enumerate(rounds[0]["benchmark_app"]["cmd"]))
    )
    rows = []
    for k, r in enumerate(rounds):
        e, a = r["edgekit"], r["benchmark_app"]
        rows.append(
            [
                k + 1,
                C.f(e["latency"]["p50_ms"]),
                C.f(a["median_ms"], 2),
                C.signed(results["per_round_difference_pct"][k]),
                C.f(e["latency"]["mean_ms"]),
                C.f(a["average_ms"], 2),
                C.f(e["latency"]["min_ms"]),
                C.f(a["min_ms"], 2),
                f"{e['latency']['count']}/{a['count']}",
            ]
        )
    print(
        C.table(
            [
                "round",
                "edgekit median",
                "b_app median",
                "diff",
                "edgekit mean",
                "b_app mean",
                "edgekit min",
                "b_app min",
                "n (e/b)",
            ],
            rows,
        )
    )
    verdict = "PASS" if abs(results["difference_pct"]) <= GOAL_PCT else "FAIL"
    print(
        f"median of round medians: edgekit {results['edgekit_median_of_medians_ms']:.3f} ms, benchmark_app "
        f"{results['benchmark_app_median_of_medians_ms']:.2f} ms -> {C.signed(results['difference_pct'])}   "
        f"goal within +-{GOAL_PCT:g}%: {verdict}"
    )
    cs = results.get("clock_split")
    if cs:
        print(
            f"one extra edgekit run timed with both clocks ({cs['iterations']} calls): median wall around runner.infer "
            f"{cs['wall_median_ms']:.3f} ms, median InferRequest.latency (benchmark_app's clock) "
            f"{cs['latency_median_ms']:.3f} ms; Python side {cs['python_side_median_us']:.1f} us per call "
            f"({cs['python_side_median_us'] / 10 / cs['latency_median_ms']:.2f}% of the latency)"
        )
    print("same settings read back:")
    for c in results["checks"]:
        print(
            f"  {'ok ' if c['ok'] else 'DIFF'} {c['what']}: {c['got']}"
            + ("" if c["ok"] else f" (expected {c['expected']})")
        )
    print(
        f"total {results['total_s']} s; 1-min load average {info.get('loadavg_1m', float('nan')):.2f} at start, "
        f"{results['host']['loadavg_1m_end']:.2f} at end"
    )
    C.dump_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
