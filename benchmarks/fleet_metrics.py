"""Prometheus /metrics scrape time against a fleet database of N devices (edge.fleet.metrics).

The database is filled through the collector's own library (``Collector.add``/``flush``: births with a runner,
telemetry, and state messages carrying a rollout for a fifth of the devices), then ``/metrics`` is scraped over
HTTP from a real ``MetricsServer``: the first scrape (every birth and state parsed) and the following ones
(only what changed; ``--churn`` devices send a new state message between scrapes). Medians of ``--repeat``.

    .venv/bin/python benchmarks/fleet_metrics.py                       # 10,000 devices, SQLite
    .venv/bin/python benchmarks/fleet_metrics.py --devices 50000 --repeat 5
    .venv/bin/python benchmarks/fleet_metrics.py --db postgresql://user@host/db
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge.capabilities import measured_on
from edge.fleet.collector import Collector, CollectorConfig  # noqa: E402
from edge.fleet.metrics import MetricsServer  # noqa: E402
from edge.mqtt.client import BrokerConfig  # noqa: E402
from edge.mqtt.payloads import encode, message  # noqa: E402

TARGETS = ("x86-cpu", "jetson-orin", "coral-edgetpu", "rpi5-xnnpack")


def birth(fleet: str, dev: str, i: int, now: float) -> tuple[str, bytes]:
    target = TARGETS[i % len(TARGETS)]
    body = {
        "connection": 1,
        "state": "running",
        "agent": {
            "edgekit_version": "0.1.0",
            "pid": 100,
            "started_at": now,
            "interval_s": 5.0,
            "source": "video:/data/cam.mp4",
            "fps": 30.0,
            "budget_ms": 33.3,
        },
        "bundle": {
            "id": f"model-{target}-fp16-{'canary' if i % 10 == 0 else 'base'}",
            "target": target,
            "precision": "fp16",
        },
        "runner": {
            "runtime": "onnxruntime 1.22.0",
            "device_requested": "CUDAExecutionProvider",
            "device_used": "CPUExecutionProvider" if i % 50 == 0 else "CUDAExecutionProvider",
            "precision_used": "f16",
            "threads": 4,
            "fallback": None,
            "details": {"providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]},
        },
        "reference_check": {"passed": True, "samples": 16, "skipped": None},
        "host": {"hostname": f"host-{i:05d}", "os": "linux", "arch": "aarch64", "model": "NVIDIA Jetson"},
    }
    return f"edgekit/{fleet}/{dev}/birth", encode(message("birth", fleet, dev, 1000, 0, body, ts=now))


def telemetry(fleet: str, dev: str, i: int, seq: int, now: float) -> tuple[str, bytes]:
    p50 = 8.0 + (i % 97) / 10
    body = {
        "interval_s": 5.0,
        "window_s": 5.0,
        "state": "running",
        "bundle_id": None,
        "uptime_s": 100.0,
        "inference": {
            "frames": 150,
            "fps": 30.0 - (i % 7) / 10,
            "target_fps": 30.0,
            "budget_ms": 33.3,
            "budget_misses": i % 3,
            "latency_ms": {"count": 150, "p50_ms": p50, "p99_ms": p50 * 1.7, "max_ms": p50 * 2},
        },
        "process": {"cpu_percent": 40.0, "rss_mb": 35.0},
        "thermal": {"max_c": 55.0, "throttled_now": False},
        "spool": {"pending": 0, "dropped_total": 0},
    }
    return f"edgekit/{fleet}/{dev}/telemetry", encode(message("telemetry", fleet, dev, 1000, seq, body, ts=now))


def state(fleet: str, dev: str, i: int, seq: int, now: float, step: str) -> tuple[str, bytes]:
    body = {
        "state": "running",
        "detail": None,
        "bundle_id": None,
        "rollout": {
            "rollout_id": "r-2026-11-25",
            "desired_bundle": f"model-{TARGETS[i % len(TARGETS)]}-fp16-canary",
            "desired_version": 7,
            "state": step,
            "reason": None,
        },
    }
    return f"edgekit/{fleet}/{dev}/state", encode(message("state", fleet, dev, 1000, seq, body, ts=now))


def seed(url: str, n: int) -> float:
    t0 = time.perf_counter()
    c = Collector(CollectorConfig(BrokerConfig("127.0.0.1", 1), url, max_tracked=n + 10))
    now = time.time()
    try:
        for i in range(n):
            dev = f"dev-{i:05d}"
            c.add(*birth("sim", dev, i, now), received_at=now)
            for seq in (1, 2, 3):
                c.add(*telemetry("sim", dev, i, seq, now), received_at=now)
            if i % 5 == 0:
                c.add(*state("sim", dev, i, 4, now, "watching"), received_at=now)
            if i % 2000 == 1999:
                c.flush()
        c.flush()
    finally:
        c.db.close()
    return time.perf_counter() - t0


def churn(url: str, n: int, k: int, seq: int) -> None:
    """``k`` devices report a new rollout state (what a wave in progress does between two scrapes)."""
    c = Collector(CollectorConfig(BrokerConfig("127.0.0.1", 1), url))
    now = time.time()
    try:
        for i in range(0, min(k * 5, n), 5):
            c.add(*state("sim", f"dev-{i:05d}", i, seq, now, "running"), received_at=now)
        c.flush()
    finally:
        c.db.close()


def scrape(url: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as r:
        body = r.read()
    return time.perf_counter() - t0, len(body)


def main() -> int:
    print("measured on " + measured_on(), file=sys.stderr)  # the CPU's ISA class and the load
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--churn", type=int, default=100, help="devices with a new state message between scrapes")
    ap.add_argument("--db", default=None, help="database URL (default: a new SQLite file)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = a.db or f"sqlite:///{tmp}/fleet.db"
        took = seed(url, a.devices)
        print(f"seeded {a.devices} devices ({a.devices * 3} telemetry, {a.devices // 5} states) in {took:.1f} s")
        with MetricsServer(url, port=0, min_stale_s=3600) as server:  # every seeded device counts as online
            cold, size = scrape(server.url)
            last = server.fleet.last
            assert last is not None
            read_cold, cpu_cold = last.seconds, last.cpu_seconds
            warm, reads, cpus, churned, churn_reads, churn_cpus = [], [], [], [], [], []
            for r in range(a.repeat):
                s, _ = scrape(server.url)
                warm.append(s)
                reads.append(server.fleet.last.seconds)
                cpus.append(server.fleet.last.cpu_seconds)
                churn(url, a.devices, a.churn, 5 + r)
                s, _ = scrape(server.url)
                churned.append(s)
                churn_reads.append(server.fleet.last.seconds)
                churn_cpus.append(server.fleet.last.cpu_seconds)
        ms = lambda xs: f"{statistics.median(xs) * 1000:.0f} ms"  # noqa: E731
        print(
            f"devices {a.devices}, /metrics {size} bytes; first scrape {cold * 1000:.0f} ms "
            f"(database read {read_cold * 1000:.0f} ms, {cpu_cold * 1000:.0f} ms CPU)"
        )
        print(f"steady scrape: median {ms(warm)} (database read {ms(reads)}, {ms(cpus)} CPU) over {a.repeat}")
        print(
            f"after {a.churn} new state messages: median {ms(churned)} (database read {ms(churn_reads)}, "
            f"{ms(churn_cpus)} CPU)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
