#!/usr/bin/env python3
"""YOLOv8n-320 held in realtime on a busy device, with no flags (issue #25 item 4).

Per host runtime (x86-cpu: onnxruntime, intel-igpu: OpenVINO CPU, arm-xnnpack: LiteRT XNNPack), the
bundle of YOLOv8n-320 (``examples/fetch_pretrained.py --model yolov8n-320``) runs as a user runs it:

    edgekit run BUNDLE --synthetic 640x480 --realtime --fps 60  --max-frames 600 --json   # one core busy
    edgekit run BUNDLE --synthetic 640x480 --realtime --fps 120 --max-frames 600 --json   # idle

in a subprocess, no runner option given (edgekit picks workers, threads and spin-wait). "One core busy"
is a child ``python -c 'while 1: pass'`` started half a second before and killed after. Configurations
are interleaved: each round runs every runtime busy at 60 fps and idle at 120 fps, alternating the
order. Reported per run: frames in, late, dropped (by reason), the share late or dropped (goal <= 1%),
effective fps, infer p50/p99, the threads/spin-wait edgekit chose; the load average before and after.

    .venv/bin/python benchmarks/realtime_busy.py --workdir /tmp/rt            # builds the bundles once
    .venv/bin/python benchmarks/realtime_busy.py --workdir /tmp/rt --rounds 2 --frames 600
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

MODEL = C.REPO / "examples" / "models" / "nudenet_320n.onnx"
TARGETS = {"onnxruntime": "x86-cpu", "openvino": "intel-igpu", "litert": "arm-xnnpack"}
CONDITIONS = (("busy", 60.0), ("idle", 120.0))
EDGEKIT = shutil.which("edgekit", path=str(Path(sys.executable).parent)) or "edgekit"


def build(work: Path, target: str) -> Path:
    out = work / f"yolov8n-320-{target}"
    C.convert_cached(
        MODEL,
        target,
        out,
        reuse=True,
        parity_samples=8,
        input_shapes={"images": (1, 3, 320, 320)},
        preprocess="yolo",
        task="detector",
    )
    return out


def run_once(bundle: Path, fps: float, frames: int, busy: bool, stage_threads: int | None = None) -> dict[str, Any]:
    child = subprocess.Popen([sys.executable, "-c", "while 1: pass"]) if busy else None
    try:
        if child is not None:
            time.sleep(0.5)
        p = subprocess.run(
            [
                EDGEKIT,
                "run",
                str(bundle),
                "--synthetic",
                "640x480",
                "--realtime",
                "--fps",
                str(fps),
                "--max-frames",
                str(frames),
                "--json",
                *(["--stage-threads", str(stage_threads)] if stage_threads else []),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        if child is not None:
            child.kill()
            child.wait()
    try:
        d = json.loads(p.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"edgekit run failed (exit {p.returncode}): {p.stderr.strip()[-500:]}") from None
    f = d["frames"]
    lost = f["late"] + f["dropped"] + f["abandoned"]
    infer = d["stages"].get("infer") or {}
    policy = d["runner"].get("details", {}).get("threads_policy", {})
    return {
        "frames_in": f["in"],
        "late": f["late"],
        "dropped": f["dropped"],
        "dropped_by_reason": f["dropped_by_reason"],
        "abandoned": f["abandoned"],
        "lost_pct": 100.0 * lost / max(1, f["in"]),
        "effective_fps": d["effective_fps"],
        "bound_fps": d.get("bound_fps"),
        "pct_of_bound": d.get("pct_of_bound"),
        "stage_threads": len(d.get("threads") or {}) or None,
        "waits": d.get("waits"),
        "verdict": d["verdict"],
        "infer_p50_ms": infer.get("p50_ms"),
        "infer_p99_ms": infer.get("p99_ms"),
        "threads": d["runner"].get("threads"),
        "spinning": None if policy.get("spinning_from") == "runtime" else policy.get("spinning"),
        "precision": d["runner"].get("precision_used"),
        "workers": d["infer_workers"],
        "policy": policy.get("reason"),
        "load_avg": d.get("load_avg"),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", required=True, help="bundles are built here once and reused")
    p.add_argument("--runtimes", nargs="*", default=list(TARGETS), choices=list(TARGETS))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--frames", type=int, default=600)
    p.add_argument("--json", metavar="FILE")
    p.add_argument(
        "--stage-threads",
        nargs="*",
        type=int,
        default=[0],
        help="run each configuration with these stage layouts (4, 2; 0: edgekit's default), interleaved",
    )
    p.add_argument("--busy-fps", type=float, default=CONDITIONS[0][1], help="the rate with one core busy")
    p.add_argument("--idle-fps", type=float, default=CONDITIONS[1][1], help="the rate idle")
    args = p.parse_args()
    if not MODEL.is_file():
        raise SystemExit(f"{MODEL.name} missing: python examples/fetch_pretrained.py --model yolov8n-320")
    work = Path(args.workdir)
    bundles = {rt: build(work, TARGETS[rt]) for rt in args.runtimes}
    before = C.measured_on()
    C.log("measured on: " + before)
    rows, results = [], []
    conditions = (("busy", args.busy_fps), ("idle", args.idle_fps))
    for r in range(args.rounds):
        order = [(rt, c, th) for rt in args.runtimes for c in conditions for th in args.stage_threads]
        for rt, (cond, fps), th in order if r % 2 == 0 else order[::-1]:
            got = run_once(bundles[rt], fps, args.frames, cond == "busy", th or None)
            results.append({"round": r + 1, "runtime": rt, "condition": cond, "fps": fps, **got})
            rows.append(
                [
                    r + 1,
                    rt,
                    f"{cond} @{fps:.4g}",
                    got["stage_threads"],
                    got["frames_in"],
                    got["late"],
                    got["dropped"],
                    f"{got['lost_pct']:.1f}%",
                    f"{got['effective_fps']:.1f}",
                    f"{got['bound_fps'] or 0:.1f}",
                    f"{got['pct_of_bound'] or 0:.0f}%",
                    f"{got['infer_p50_ms'] or 0:.1f}/{got['infer_p99_ms'] or 0:.1f}",
                    got["threads"],
                    {True: "on", False: "off", None: "-"}[got["spinning"]],
                    got["precision"],
                    got["verdict"],
                ]
            )
            C.log(
                f"  round {r + 1} {rt} {cond}: {got['lost_pct']:.1f}% late or dropped, {got['effective_fps']:.1f} fps"
            )
    after = C.measured_on()
    print(
        C.table(
            [
                "round",
                "runtime",
                "condition",
                "stage threads",
                "in",
                "late",
                "dropped",
                "late+dropped",
                "fps",
                "bound fps",
                "of bound",
                "infer p50/p99 ms",
                "threads",
                "spin",
                "precision",
                "verdict",
            ],
            rows,
            title="YOLOv8n-320, edgekit run --synthetic 640x480 --realtime, no flags (goal: <= 1% late or dropped)",
        )
    )
    print("measured on (before): " + before)
    print("measured on (after):  " + after)
    C.dump_json(
        args.json, {"host": C.host_info(), "measured_on_before": before, "measured_on_after": after, "results": results}
    )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
