"""Resident memory of the lean agent, ``python -m edge.agent``, against a real Mosquitto.

Three cases, ``--repeat`` runs each (median of the peak VmRSS sampled every 0.1 s over ~5 s):
no bundle with ``--source none``; a tiny ONNX bundle with ``--source none`` (the bundle is opened and its
manifest checked, no runtime loaded); the same bundle on ``--source synthetic`` (onnxruntime runs it).
The issue's goal: without a runtime, at most 40 MB.

    .venv/bin/python benchmarks/agent_rss.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from edge.capabilities import measured_on  # noqa: E402
from edge.deploy import DeviceStore  # noqa: E402
from edge.graph.samples import build_tiny_cnn  # noqa: E402
from edge.pipeline import convert  # noqa: E402
from tests.support.mqtt_broker import Mosquitto  # noqa: E402


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def peak_rss(broker_url: str, store: Path, source: str, i: int) -> float:
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "edge.agent",
            "--device-id",
            f"d{i}",
            "--fleet",
            "lab",
            "--store",
            str(store),
            "--broker",
            broker_url,
            "--source",
            source,
            "--interval",
            "1",
            "--duration",
            "6",
            "--log-level",
            "warning",
        ],
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    peak, t0 = 0.0, time.monotonic()
    while p.poll() is None and time.monotonic() - t0 < 5.5:
        peak = max(peak, rss_mb(p.pid))
        time.sleep(0.1)
    _, err = p.communicate(timeout=30)
    if p.returncode != 0:
        raise SystemExit(f"the agent failed: {err.strip()}")
    return peak


def main() -> int:
    print("measured on " + measured_on(), file=sys.stderr)  # the CPU's ISA class and the load
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="edgekit-rss-"))
    with Mosquitto(work / "mqtt") as broker:
        empty = work / "empty"
        empty.mkdir()
        bundle = convert(build_tiny_cnn(work / "tiny.onnx"), "x86-cpu", work / "bundle")
        store = work / "store"
        DeviceStore(store).install(bundle)
        for label, st, source in (
            ("no bundle, --source none", empty, "none"),
            ("ONNX bundle, --source none (no runtime)", store, "none"),
            ("ONNX bundle, --source synthetic (onnxruntime)", store, "synthetic"),
        ):
            vals = [peak_rss(broker.url, st, source, i) for i in range(a.repeat)]
            print(f"{label}: peak RSS median {statistics.median(vals):.1f} MB ({', '.join(f'{v:.1f}' for v in vals)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
