#!/usr/bin/env python3
"""OpenVINO CPU: which threads and pinning hold with one core busy (issue #25, the evidence for
``edge.backends.openvino.run``'s thread policy).

One process compiles each intel-igpu bundle's IR (``benchmarks/vs_runtime_defaults.py --workdir`` builds them)
five ways and reads back what each compiled model runs (INFERENCE_NUM_THREADS, ENABLE_CPU_PINNING,
SCHEDULING_CORE_TYPE, PERFORMANCE_HINT, NUM_STREAMS, INFERENCE_PRECISION_HINT):

  plain        ``compile_model(xml, "CPU")``, nothing set: the plugin's own (benchmark_app's defaults)
  1-unpinned   LATENCY, INFERENCE_NUM_THREADS 1, ENABLE_CPU_PINNING false  (edgekit where the CPUs are shared)
  1-pinned     LATENCY, 1 thread, pinned
  2-pinned     LATENCY, 2 threads, pinned
  2-unpinned   LATENCY, 2 threads, unpinned

and times them in rounds, the candidates' order rotated each round, in blocks of ``--block`` inferences:

  back-to-back  one inference after the other (what vs_runtime_defaults.py times): p50, p90, p99
  paced         one every 1/``--fps`` s, as frames from a camera arrive: p50, p99 and the frames over the
                frame budget. The pool's threads sleep between frames here, and wake on a core that may be busy.

with one core kept busy by a child ``python -c 'while 1: pass'`` (``--idle``: without it). About 1-2 minutes for
the three default models on the 2-core host.

    .venv/bin/python benchmarks/openvino_threads.py --workdir /tmp/vsd
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from edge.capabilities import measured_on

CANDIDATES: dict[str, dict[str, Any]] = {
    "plain": {},
    "1-unpinned": {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 1, "ENABLE_CPU_PINNING": False},
    "1-pinned": {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 1, "ENABLE_CPU_PINNING": True},
    "2-pinned": {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 2, "ENABLE_CPU_PINNING": True},
    "2-unpinned": {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 2, "ENABLE_CPU_PINNING": False},
}
READ_BACK = ("INFERENCE_NUM_THREADS", "ENABLE_CPU_PINNING", "SCHEDULING_CORE_TYPE", "NUM_STREAMS")


def timed(
    requests: dict[str, Any], feeds: dict[str, np.ndarray], args: Any, fps: float | None
) -> dict[str, list[float]]:
    """Per candidate, each inference's ms; ``fps``: paced, else back-to-back."""
    names = list(requests)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            req, due = requests[n], time.perf_counter()
            for _ in range(args.block):
                t = time.perf_counter_ns()
                req.infer(feeds)
                times[n].append((time.perf_counter_ns() - t) / 1e6)
                if fps:
                    due += 1 / fps
                    time.sleep(max(0.0, due - time.perf_counter()))
    return times


def main() -> int:
    print("measured on " + measured_on(), file=sys.stderr)  # the CPU's ISA class and the load
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True, help="vs_runtime_defaults.py's: <model>-intel-igpu/model.xml")
    p.add_argument("--models", nargs="*", default=["ppocr-det", "ddddocr-det", "yolov8n-320"])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--block", type=int, default=25, help="inferences per candidate per round (default 25)")
    p.add_argument("--fps", type=float, default=60.0, help="the paced mode's frame rate (default 60)")
    p.add_argument("--idle", action="store_true", help="no busy child")
    args = p.parse_args()
    import openvino as ov

    core = ov.Core()
    print("uptime before:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    for m in args.models:
        xml = Path(args.workdir) / f"{m}-intel-igpu" / "model.xml"
        if not xml.is_file():
            print(f"{m}: no {xml} (build it with vs_runtime_defaults.py --workdir)")
            continue
        model = core.read_model(str(xml))
        rng = np.random.default_rng(0)
        feeds = {i.get_any_name(): rng.random(tuple(i.get_shape()), dtype=np.float32) for i in model.inputs}
        requests = {}
        for name, config in CANDIDATES.items():
            t = time.perf_counter()
            compiled = core.compile_model(model, "CPU", config)
            ms = (time.perf_counter() - t) * 1000
            got = {k: str(compiled.get_property(k)).replace("SchedulingCoreType.", "") for k in READ_BACK}
            print(f"{m} {name:10s} compile {ms:4.0f} ms  runs {got}")
            requests[name] = compiled.create_infer_request()
            for _ in range(3):
                requests[name].infer(feeds)
        child = None if args.idle else subprocess.Popen([sys.executable, "-c", "while 1: pass"])
        try:
            time.sleep(0.5)
            for mode, fps in (("back-to-back", None), (f"paced {args.fps:g} fps", args.fps)):
                times = timed(requests, feeds, args, fps)
                base = statistics.median(times["plain"])
                cond = "idle" if args.idle else "one core busy"
                print(f"{m}, {mode}, {cond}, load {os.getloadavg()[0]:.2f}, {len(times['plain'])} each:")
                for n, v in times.items():
                    over = f"  over {1000 / fps:.1f} ms: {sum(x > 1000 / fps for x in v)}" if fps else ""
                    print(
                        f"   {n:10s} p50 {statistics.median(v):6.2f} ({statistics.median(v) / base:4.2f}x plain)"
                        f"  p90 {np.percentile(v, 90):6.2f}  p99 {np.percentile(v, 99):6.2f}{over}"
                    )
        finally:
            if child is not None:
                child.kill()
                child.wait()
    print("uptime after:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
