"""A simulated fleet: many device sessions in one process, each a real MQTT connection.

Every simulated device is the agent's own ``DeviceSession`` (birth, will, sequence numbers,
outbox, replay) on one shared ``NetworkLoop``; only the telemetry body is made up (no model
runs). Outboxes are in memory (``MemoryOutbox``): a thousand SQLite files would measure the
disk rather than the broker and the collector. Used by ``benchmarks/fleet_ingest.py`` and the tests.
"""

from __future__ import annotations

import random
import time
from typing import Any

import edge
from edge.agent.mqtt import BrokerConfig
from edge.agent.netloop import Backoff, NetworkLoop
from edge.agent.outbox import MemoryOutbox
from edge.agent.session import DeviceSession


def birth_body(i: int, rate_hz: float) -> dict[str, Any]:
    """The birth body of simulated device ``i`` (the envelope and ``connection`` are the session's)."""
    return {"state": "running", "state_detail": None,
            "agent": {"edgekit_version": edge.__version__, "pid": 0, "started_at": round(time.time(), 3),
                      "interval_s": 1.0 / rate_hz, "source": "simulated", "fps": 30.0, "budget_ms": 33.3},
            "bundle": {"id": "simulated-x86-cpu-fp32-0000000000", "target": "x86-cpu", "precision": "fp32"},
            "runner": {"runtime": "simulated", "device_requested": "CPU", "device_used": "CPU", "precision_used": "f32"},
            "host": {"hostname": f"sim-{i:05d}", "os": "linux", "arch": "aarch64", "model": "simulated"}}


def telemetry_body(r: random.Random, rate_hz: float) -> dict[str, Any]:
    """A telemetry body like the agent's (about 800 bytes of JSON with the envelope), numbers drawn from ``r``."""
    p50 = 8.0 + r.random() * 4
    return {"interval_s": 1.0 / rate_hz, "window_s": 1.0 / rate_hz, "state": "running",
            "bundle_id": "simulated-x86-cpu-fp32-0000000000", "uptime_s": 0.0,
            "inference": {"frames": 30, "fps": round(29 + r.random() * 2, 2), "target_fps": 30.0, "budget_ms": 33.3,
                          "budget_misses": int(r.random() < 0.05), "frames_dropped": 0, "frames_total": 0,
                          "budget_misses_total": 0,
                          "latency_ms": {"count": 30, "p50_ms": round(p50, 4), "p90_ms": round(p50 * 1.2, 4),
                                         "p99_ms": round(p50 * 1.6, 4), "max_ms": round(p50 * 1.9, 4),
                                         "min_ms": round(p50 * 0.8, 4), "mean_ms": round(p50 * 1.05, 4),
                                         "std_ms": 0.8}},
            "process": {"cpu_percent": round(40 + r.random() * 20, 2), "rss_mb": 80.5, "threads": 6},
            "system": {"cpu_percent": 55.0, "load1": 1.2, "mem_available_mb": 3000.0, "uptime_s": 1000},
            "thermal": {"zones_c": {"cpu-thermal": round(50 + r.random() * 10, 2)}, "max_c": 55.0,
                        "throttled_now": False},
            "spool": {"pending": 0, "pending_bytes": 0, "dropped_total": 0, "max_messages": 50000}}


class SimulatedFleet:
    def __init__(self, broker: BrokerConfig, *, devices: int, rate_hz: float = 1.0, fleet: str = "sim",
                 prefix: str = "dev", loop: NetworkLoop | None = None, connect_per_s: float = 250.0, seed: int = 0,
                 backoff: Backoff = Backoff(0.2, 5.0)) -> None:
        self.broker, self.n, self.rate_hz, self.fleet = broker, devices, rate_hz, fleet
        self.loop = loop or NetworkLoop(name="edgekit-simfleet")
        self._own_loop = loop is None
        self._rng = random.Random(seed)
        self.connect_per_s = connect_per_s
        self.sessions = [DeviceSession(self.loop, broker, fleet, f"{prefix}-{i:05d}", MemoryOutbox(),
                                       birth_body=lambda i=i: birth_body(i, rate_hz),
                                       client_id=f"edgekit-{fleet}-{prefix}-{i:05d}", backoff=backoff)
                         for i in range(devices)]
        self._timers: list[Any] = []
        self.submitted = 0
        self._running = False

    def _tick(self, s: DeviceSession) -> None:
        if self._running:
            s.submit("telemetry", telemetry_body(self._rng, self.rate_hz))
            self.submitted += 1

    def _start_all(self) -> None:
        self._running = True
        period = 1.0 / self.rate_hz
        for i, s in enumerate(self.sessions):
            self.loop.call_later(i / self.connect_per_s, s.start)
            first = i / self.connect_per_s + 0.5 + self._rng.random() * period
            self._timers.append(self.loop.call_every(period, self._tick, s, first=first))

    def start(self) -> "SimulatedFleet":
        if self._own_loop:
            self.loop.start()
        self.loop.run(self._start_all)
        return self

    def connected(self) -> int:
        return int(self.loop.run(lambda: sum(s.connected for s in self.sessions)))

    def pending(self) -> int:
        return int(self.loop.run(lambda: sum(s.outbox.pending() for s in self.sessions)))

    def pause(self) -> None:
        """Stop making telemetry (connections stay up)."""
        self.loop.run(self._pause)

    def _pause(self) -> None:
        self._running = False
        for t in self._timers:
            t.cancel()
        self._timers.clear()

    def stop(self, timeout: float = 30.0) -> None:
        """Clean shutdown of every device: death, DISCONNECT."""
        def close_all() -> None:
            self._pause()
            for s in self.sessions:
                s.publish_death("shutdown")  # queued before the DISCONNECT on the same stream
                s.conn.close()

        self.loop.run(close_all)
        deadline = time.monotonic() + timeout
        for s in self.sessions:
            s.conn.closed.wait(max(0.0, deadline - time.monotonic()))
        if self._own_loop:
            self.loop.stop()

    def __enter__(self) -> "SimulatedFleet":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
