"""``edgekit tune --objective e2e`` on the video path: frames dropped at 60 fps realtime before and after.

The example YOLO-style detector (``edge.samples.build_yolo_detector``, 320x320, deterministic weights) on a
synthetic 640x480 clip at 60 fps (``edge.video.write_synthetic_clip``), run as ``edgekit run --realtime``
runs it (``edge.video.run_pipeline``: decode, pre-processing, inference, post-processing; frames that would be
late are dropped):

* before: the target's default configuration (x86-cpu: onnxruntime fp32, the profile's runner options,
  one inference worker);
* tune: ``edge.tune.tune(objective="e2e", video=clip)`` over the target's space (the video pipeline's frame
  rate is the objective; parity a hard constraint), budget 60 fps;
* after: the bundle converted with the winner's overlay (``convert --tuned``), with the winner's inference
  workers (the overlay carries runner options, not the pipeline's workers: passed as ``--infer-workers``).

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

FPS = 60.0


def realtime(bundle: Any, clip: Path, workers: int, frames: int) -> dict[str, Any]:
    from edge.video import PipelineOptions, open_source, run_pipeline

    with open_source(video=str(clip)) as source:
        rep = run_pipeline(bundle, source, PipelineOptions(realtime=True, budget_ms=1000.0 / FPS, budget_source="60 fps",
                                                           infer_workers=workers, max_frames=frames))
    rep.raise_for_failure()
    r = rep.to_json()
    f = r["frames"]
    return {"in": f["in"], "processed": f["processed"], "dropped": f["dropped"], "late": f["late"],
            "dropped_by_reason": f["dropped_by_reason"], "effective_fps": r["effective_fps"],
            "bound_fps": r["bound_fps"], "bottleneck": r["bottleneck"],
            "infer_p50_ms": (r["stages"].get("infer") or {}).get("p50_ms")}


def main() -> int:
    from edge.pipeline import convert
    from edge.samples import build_yolo_detector
    from edge.tune import tune
    from edge.tune_report import row
    from edge.video import write_synthetic_clip

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--workdir", metavar="DIR")
    p.add_argument("--frames", type=int, default=600, help="clip length (default 600 = 10 s at 60 fps)")
    p.add_argument("--pairs", type=int, default=3, help="realtime runs per side, alternated (default 3)")
    p.add_argument("--precisions", default="fp32,fp16,int8-dynamic,int8",
                   help="precisions tune tries (int8 calibrates on generated inputs)")
    p.add_argument("--runners", default=None, help="runners tune tries (default: every one serving x86-cpu)")
    p.add_argument("--time-budget", type=float, default=None, help="tune's --time-budget in seconds")
    args = p.parse_args()
    info = C.host_info()
    with C.workdir(args.workdir) as wd:
        model = build_yolo_detector(wd / "det.onnx")
        clip = write_synthetic_clip(wd / "clip.mp4", frames=args.frames, width=640, height=480, fps=int(FPS))
        C.log(f"model {model}, clip {clip} ({args.frames} frames, 640x480, {FPS:.0f} fps)")
        before = convert(model, "x86-cpu", wd / "default", preprocess="yolo", force=True)
        C.log(f"default configuration: {before.info.runner.name} {before.precision} {before.info.runner.options_dict}")
        result = tune(model, "x86-cpu", out=wd / "tune", objective="e2e", video=clip, fps=FPS, calib="random",
                      preprocess="yolo", precisions=args.precisions.split(","),
                      runners=args.runners.split(",") if args.runners else None, time_budget_s=args.time_budget,
                      pictures=False, on_step=lambda m: C.log("  " + m))
        print(C.table(["configuration", "status", "parity", "fps", "p50 ms", "p99 ms"],
                      [[r["configuration"], r["status"], r["parity"], C.f(r["fps"], 1), C.f(r["p50_ms"]),
                        C.f(r["p99_ms"])]
                       for r in (row(t) for t in sorted(result.trials, key=lambda t: (t["result"] or {}).get(
                           "score", float("inf"))))],
                      title=f"\ntune e2e: {result.summary()}"))
        if result.winner is None:
            print("no configuration passed parity: nothing to compare")
            return 1
        workers = int(result.winner["workers"])
        after = convert(model, "x86-cpu", wd / "tuned", tuned=result.overlay_path, preprocess="yolo", force=True,
                        calib="random")
        C.log(f"tuned: {result.applied}; infer workers {workers}")
        runs: dict[str, list[dict[str, Any]]] = {"default": [], "tuned": []}
        for i in range(args.pairs):
            for side, b, w in (("default", before, 1), ("tuned", after, workers))[::1 if i % 2 == 0 else -1]:
                runs[side].append(realtime(b, clip, w, args.frames))
                r = runs[side][-1]
                C.log(f"  {side} run {len(runs[side])}: processed {r['processed']}/{r['in']}, dropped {r['dropped']} "
                      f"{r['dropped_by_reason']}, {r['effective_fps']:.1f} fps (bound {r['bound_fps']:.1f}, "
                      f"{r['bottleneck']})")
        rows = []
        for side, label in (("default", f"{before.info.runner.name} {before.precision} (profile defaults), 1 worker"),
                            ("tuned", f"{result.winner['label']}")):
            rs = runs[side]
            rows.append([side, label, " ".join(str(r["dropped"]) for r in rs),
                         statistics.median(r["dropped"] for r in rs),
                         statistics.median(r["processed"] for r in rs), rs[0]["in"],
                         C.f(statistics.median(r["bound_fps"] for r in rs), 1),
                         C.f(statistics.median(r["infer_p50_ms"] or 0 for r in rs))])
        print(C.table(["side", "configuration", "dropped per run", "median dropped", "median processed", "frames",
                       "bound fps", "infer p50 ms"], rows,
                      title=f"\n640x480 clip at {FPS:.0f} fps realtime, {args.pairs} alternated runs per side"))
        print("\n" + C.host_line(info))
        C.dump_json(args.json, {"host": info, "tune": result.to_json(), "runs": runs, "workers": workers,
                                "applied": result.applied})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
