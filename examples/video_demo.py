#!/usr/bin/env python3
"""Video-frame inference end to end, through the Python API (what `edgekit run` calls).

    python examples/video_demo.py                 # writes under examples/out/video/

build the example YOLO-style detector (320x320, deterministic random weights, no download)
-> write a 640x480 test clip with OpenCV -> convert for x86-cpu (parity inside) -> run the
pipelined runner offline on every frame, detections to JSONL -> run it again in realtime,
fed at the clip's 60 fps -> print both reports. Offline on this host; needs the `video`
extra (OpenCV).

The detector's weights are random: the boxes are meaningless, their number and the timing
are realistic. Same commands on the CLI:

    edgekit convert examples/out/video/det.onnx -t x86-cpu --preprocess yolo -o examples/out/video/det-cpu
    edgekit run examples/out/video/det-cpu --video examples/out/video/clip.mp4 --fps 60 --out detections.jsonl
    edgekit run examples/out/video/det-cpu --video examples/out/video/clip.mp4 --fps 60 --realtime
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edge.graph.samples import build_yolo_detector
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest
from edge.video import PipelineOptions, open_source, run_pipeline, write_synthetic_clip


def show(title: str, report: object) -> None:
    r = report.to_json()  # type: ignore[attr-defined]
    f = r["frames"]
    print(f"\n{title}")
    print(
        f"  frames: in {f['in']}, processed {f['processed']}, dropped {f['dropped']} {f['dropped_by_reason']}, "
        f"late {f['late']}"
    )
    print(
        "  stages p50/p99 ms: "
        + ", ".join(f"{k} {v['p50_ms']:.2f}/{v['p99_ms']:.2f}" for k, v in r["stages"].items() if v)
    )
    print(f"  end-to-end p50/p99/max ms: {r['e2e']['p50_ms']:.2f}/{r['e2e']['p99_ms']:.2f}/{r['e2e']['max_ms']:.2f}")
    print(f"  {r['effective_fps']:.1f} fps; slowest stage {r['bottleneck']} bounds it at {r['bound_fps']:.1f} fps")
    print(f"  verdict: {r['verdict']}: {r['summary']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out" / "video")
    ap.add_argument("--frames", type=int, default=240, help="clip length (default 240 = 4 s at 60 fps)")
    ap.add_argument("--infer-workers", type=int, default=1)
    args = ap.parse_args()
    out: Path = args.out
    model = build_yolo_detector(out / "det.onnx")
    clip = write_synthetic_clip(out / "clip.mp4", frames=args.frames, width=640, height=480, fps=60)
    print(f"model: {model}\nclip:  {clip} ({args.frames} frames, 640x480, 60 fps, mp4v)")
    bundle = convert(
        model,
        "x86-cpu",
        out / "det-cpu",
        ConvertRequest(preprocess="yolo"),
        force=True,
        on_step=lambda m: print(f"  {m}"),
    )
    print(f"bundle: {bundle.id} (parity {'pass' if bundle.manifest['parity']['passed'] else 'FAIL'})")

    detections = out / "detections.jsonl"
    common = {"budget_ms": 1000 / 60, "budget_source": "60 fps", "infer_workers": args.infer_workers}
    with open_source(video=clip) as source:
        offline = run_pipeline(bundle, source, PipelineOptions(out=detections, **common))
    offline.raise_for_failure()
    show("offline (every frame, as fast as it goes)", offline)
    first = json.loads(detections.read_text().splitlines()[0])
    print(
        f"  {detections}: {offline.processed} lines; frame 0: {len(first['detections'])} boxes, "
        f"e.g. {first['detections'][:1]}"
    )

    with open_source(video=clip) as source:
        live = run_pipeline(bundle, source, PipelineOptions(realtime=True, **common))
    live.raise_for_failure()
    show("realtime (fed at the clip's 60 fps, late frames dropped)", live)


if __name__ == "__main__":
    main()
