"""``edgekit tune --objective e2e`` on the video path: frames dropped at 60 fps realtime before and after.

The example YOLO-style detector (``edge.graph.samples.build_yolo_detector``, 320x320, deterministic weights) on a
synthetic 640x480 clip at 60 fps (``edge.video.write_synthetic_clip``), run as ``edgekit run --realtime``
runs it (``edge.video.run_pipeline``: decode, pre-processing, inference, post-processing; frames that would be
late are dropped):

* before: the target's default configuration (x86-cpu: onnxruntime fp32, the profile's runner options,
  one inference worker);
* tune: ``edge.tune.search.tune(objective="e2e", video=clip, fps=60)`` over the target's space: every trial runs the
  video pipeline in realtime at 60 fps; ranked by the frames it missed (dropped, or processed past their deadline),
  then by its median frame time; parity a hard constraint;
* after: the bundle converted with the winner's overlay (``convert --tuned``); the overlay's inference workers are
  recorded in the bundle and the pipeline runs with them by default (as ``edgekit run`` and the agent do).

Before and after run alternately, ``--pairs`` times each (a shared host's background load hits both alike);
reported: frames in/processed/dropped per run and the median dropped of each side.

    python benchmarks/tune_video.py [--frames 600] [--pairs 3] [--precisions fp32,int8-dynamic] [--time-budget S]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

from edge.pipeline.request import ConvertRequest
from edge.tune.search import TuneOptions

FPS = 60.0


def realtime(bundle: Any, clip: Path, frames: int) -> dict[str, Any]:
    """One ``edgekit run --realtime --fps 60`` of ``bundle`` (its own inference workers: 1, or the tuned ones)."""
    from edge.video import PipelineOptions, open_source, run_pipeline

    with open_source(video=str(clip)) as source:
        rep = run_pipeline(
            bundle,
            source,
            PipelineOptions(realtime=True, budget_ms=1000.0 / FPS, budget_source="60 fps", max_frames=frames),
        )
    rep.raise_for_failure()
    r = rep.to_json()
    f = r["frames"]
    return {
        "in": f["in"],
        "processed": f["processed"],
        "dropped": f["dropped"],
        "late": f["late"],
        "missed": rep.deadline_misses,
        "workers": r["infer_workers"],
        "dropped_by_reason": f["dropped_by_reason"],
        "effective_fps": r["effective_fps"],
        "bound_fps": r["bound_fps"],
        "bottleneck": r["bottleneck"],
        "infer_p50_ms": (r["stages"].get("infer") or {}).get("p50_ms"),
    }


def main() -> int:
    C.print_measured_on()  # the CPU's ISA class and the load, with every figure
    from edge.graph.samples import build_yolo_detector
    from edge.pipeline import convert
    from edge.tune.report import row
    from edge.tune.search import tune
    from edge.video import write_synthetic_clip

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--workdir", metavar="DIR")
    p.add_argument("--frames", type=int, default=600, help="clip length (default 600 = 10 s at 60 fps)")
    p.add_argument("--pairs", type=int, default=3, help="realtime runs per side, alternated (default 3)")
    p.add_argument(
        "--precisions",
        default="fp32,fp16,int8-dynamic,int8",
        help="precisions tune tries (int8 calibrates on generated inputs)",
    )
    p.add_argument("--runners", default=None, help="runners tune tries (default: every one serving x86-cpu)")
    p.add_argument("--time-budget", type=float, default=None, help="tune's --time-budget in seconds")
    args = p.parse_args()
    info = C.host_info()
    with C.workdir(args.workdir) as wd:
        model = build_yolo_detector(wd / "det.onnx")
        clip = write_synthetic_clip(wd / "clip.mp4", frames=args.frames, width=640, height=480, fps=int(FPS))
        C.log(f"model {model}, clip {clip} ({args.frames} frames, 640x480, {FPS:.0f} fps)")
        before = convert(model, "x86-cpu", wd / "default", ConvertRequest(preprocess="yolo"), force=True)
        C.log(f"default configuration: {before.info.runner.name} {before.precision} {before.info.runner.options_dict}")
        result = tune(
            model,
            "x86-cpu",
            ConvertRequest(calib="random", preprocess="yolo"),
            TuneOptions(
                out=wd / "tune",
                objective="e2e",
                video=clip,
                fps=FPS,
                precisions=args.precisions.split(","),
                runners=args.runners.split(",") if args.runners else None,
                time_budget_s=args.time_budget,
                pictures=False,
            ),
            on_step=lambda m: C.log("  " + m),
        )

        def rank(t: dict[str, Any]) -> tuple[float, float]:
            res = t["result"] or {}
            return (res.get("missed", 1e9) or 0) / (res.get("frames") or 1), res.get("score", float("inf"))

        print(
            C.table(
                ["configuration", "status", "parity", "missed at 60 fps", "fps", "p50 ms", "p99 ms", "measured at"],
                [
                    [
                        r["configuration"],
                        r["status"],
                        r["parity"],
                        r["missed"] or "-",
                        C.f(r["fps"], 1),
                        C.f(r["p50_ms"]),
                        C.f(r["p99_ms"]),
                        r["measured"],
                    ]
                    for r in (row(t) for t in sorted(result.trials, key=rank))
                    if r["measured"]
                ],
                title=f"\ntune e2e (measured trials; {result.measured} measurements in {result.search_s:.0f} s, "
                f"{result.converted} conversions in {result.convert_s:.0f} s): {result.summary()}",
            )
        )
        if result.winner is None:
            print("no configuration passed parity: nothing to compare")
            return 1
        workers = int(result.winner["workers"])
        after = convert(
            model,
            "x86-cpu",
            wd / "tuned",
            ConvertRequest(tuned=result.overlay_path, preprocess="yolo", calib="random"),
            force=True,
        )
        C.log(f"tuned: {result.applied}; the bundle records {after.info.tuned.infer_workers} inference workers")
        runs: dict[str, list[dict[str, Any]]] = {"default": [], "tuned": []}
        for i in range(args.pairs):
            for side, b in (("default", before), ("tuned", after))[:: 1 if i % 2 == 0 else -1]:
                runs[side].append(realtime(b, clip, args.frames))
                r = runs[side][-1]
                C.log(
                    f"  {side} run {len(runs[side])} ({r['workers']} workers): processed {r['processed']}/{r['in']}, "
                    f"missed {r['missed']}, dropped {r['dropped']} "
                    f"{r['dropped_by_reason']}, {r['effective_fps']:.1f} fps (bound {r['bound_fps']:.1f}, "
                    f"{r['bottleneck']})"
                )
        rows = []
        for side, label in (
            ("default", f"{before.info.runner.name} {before.precision} (profile defaults), 1 worker"),
            ("tuned", f"{result.winner['label']}"),
        ):
            rs = runs[side]
            rows.append(
                [
                    side,
                    label,
                    rs[0]["workers"],
                    " ".join(str(r["dropped"]) for r in rs),
                    statistics.median(r["dropped"] for r in rs),
                    " ".join(str(r["missed"]) for r in rs),
                    statistics.median(r["processed"] for r in rs),
                    rs[0]["in"],
                    C.f(statistics.median(r["bound_fps"] for r in rs), 1),
                    C.f(statistics.median(r["infer_p50_ms"] or 0 for r in rs)),
                ]
            )
        print(
            C.table(
                [
                    "side",
                    "configuration",
                    "workers",
                    "dropped per run",
                    "median dropped",
                    "missed per run (dropped + late)",
                    "median processed",
                    "frames",
                    "bound fps",
                    "infer p50 ms",
                ],
                rows,
                title=f"\n640x480 clip at {FPS:.0f} fps realtime, {args.pairs} alternated runs per side",
            )
        )
        print("\n" + C.host_line(info))
        C.dump_json(
            args.json,
            {"host": info, "tune": result.to_json(), "runs": runs, "workers": workers, "applied": result.applied},
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
