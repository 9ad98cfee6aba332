"""The device agent: runs the store's current bundle on a frame source and reports over MQTT.

Threads: the inference worker (runner.infer in a loop, paced by the source) and the
``NetworkLoop`` (MQTT, outbox, and the telemetry timer). The worker only appends latency
samples under a lock; telemetry takes the window every interval.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import edge
from edge.agent.health import CpuMeter, host_facts, process_and_system
from edge.agent.mqtt import BrokerConfig
from edge.agent.netloop import Backoff, NetworkLoop
from edge.agent.outbox import DEFAULT_MAX_BYTES, DEFAULT_MAX_MESSAGES, SqliteOutbox
from edge.agent.session import DeviceSession
from edge.agent.sources import open_source, parse_source
from edge.agent.thermal import ThermalProbe
from edge.agent.topics import check_part
from edge.errors import EdgeError
from edge.refpairs import describe as describe_check, runner_json

log = logging.getLogger("edge.agent")
DEFAULT_FPS = 30.0


@dataclass
class AgentConfig:
    fleet: str
    device_id: str
    broker: BrokerConfig
    store: Path
    source: str = "synthetic"
    fps: float | None = None  # source rate; default: the bundle's frame budget as a rate, else 30
    budget_ms: float | None = None  # default: the bundle's target frame budget, else 1000/fps
    interval_s: float = 5.0
    spool_max_messages: int = DEFAULT_MAX_MESSAGES
    spool_max_bytes: int = DEFAULT_MAX_BYTES
    backoff: Backoff = field(default_factory=Backoff)
    client_id: str | None = None
    runner_options: dict[str, Any] = field(default_factory=dict)  # override the bundle's (e.g. intra_op_num_threads)
    trust_dir: Path | None = None  # default: $EDGEKIT_TRUST_DIR, else <store>/trust when it exists

    def __post_init__(self) -> None:
        check_part(self.fleet, "fleet")
        check_part(self.device_id, "device id")
        if self.interval_s <= 0:
            raise EdgeError(f"--interval must be > 0, got {self.interval_s}")
        parse_source(self.source)


class InferenceWorker:
    """runner.infer on every frame of the source; latency samples per telemetry window."""

    def __init__(self, runner: Any, source: Any, budget_ms: float) -> None:
        self.runner, self.source, self.budget_ms = runner, source, budget_ms
        self._lock = threading.Lock()
        self._samples: list[float] = []
        self._misses = 0
        self.total = 0
        self.total_misses = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="edgekit-inference", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        infer = self.runner.infer
        clock = time.perf_counter_ns
        try:
            for feeds in self.source.frames(self._stop):
                t = clock()
                infer(feeds)
                ms = (clock() - t) / 1e6
                with self._lock:
                    self._samples.append(ms)
                    if ms > self.budget_ms:
                        self._misses += 1
        except Exception as e:  # reported in state and telemetry; the agent keeps reporting
            self.error = f"{type(e).__name__}: {e}"
            log.exception("inference failed")

    def take_window(self) -> tuple[list[float], int]:
        with self._lock:
            samples, misses = self._samples, self._misses
            self._samples, self._misses = [], 0
        self.total += len(samples)
        self.total_misses += misses
        return samples, misses

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.started = time.time()
        self._t0 = time.monotonic()
        self.bundle: Any = None
        self.runner: Any = None
        self.reference_check: dict[str, Any] | None = None  # edge.refpairs.check_on_load's result
        self.worker: InferenceWorker | None = None
        self.state, self.state_detail = "idle", None
        self.fps: float | None = None
        self.budget_ms: float | None = None
        self._source_desc = config.source
        self.loop: NetworkLoop | None = None
        self.session: DeviceSession | None = None
        self.outbox: SqliteOutbox | None = None
        self.thermal: ThermalProbe | None = None
        self._meter = CpuMeter()
        self._last_tel = time.monotonic()
        self._host = host_facts()

    # bundle and runner -------------------------------------------------------------------
    def _load(self) -> None:
        from edge.deploy import DeviceStore

        cfg = self.config
        if not cfg.store.is_dir():
            raise EdgeError(f"device store {cfg.store} does not exist",
                            hint="deploy a bundle to it first: edgekit deploy MODEL --device DIR")
        try:
            store = DeviceStore(cfg.store, trust=cfg.trust_dir)
        except EdgeError as e:  # a trust store named but missing: refuse to run anything
            self.state, self.state_detail = "error", str(e)
            log.error("%s", e)
            return
        if store.trust is None:
            from edge.trust import no_trust_note

            log.info(no_trust_note(f"device store {cfg.store}"))
        if store.current is None:
            self.state, self.state_detail = "idle", "no bundle deployed in this store"
            log.warning("%s has no current bundle: reporting health only", cfg.store)
            return
        try:
            self.bundle = store.bundle()  # verified, and vouched for by the trust store when there is one
        except EdgeError as e:
            self.state, self.state_detail = "error", str(e)
            log.error("cannot open the current bundle: %s", e)
            return
        frame_budget = self.bundle.manifest.get("target", {}).get("frame_budget_ms")
        self.fps = cfg.fps or (1000.0 / frame_budget if frame_budget else DEFAULT_FPS)
        self.budget_ms = cfg.budget_ms or frame_budget or 1000.0 / self.fps
        if parse_source(cfg.source)[0] == "none":
            self.state, self.state_detail = "idle", "frame source 'none': the model is not run"
            return
        try:  # the reference pairs checked on first load, recorded in the store (edge.refpairs)
            self.runner = self.bundle.open_runner(cfg.runner_options or None, check_reference="first", records=store)
            source = open_source(cfg.source, bundle=self.bundle, runner=self.runner, fps=self.fps)
        except EdgeError as e:
            if self.runner is not None:
                self.runner.close()
                self.runner = None
            self.state, self.state_detail = "error", str(e)
            log.error("cannot run bundle %s: %s", self.bundle.id, e)
            return
        self._source_desc = getattr(source, "description", cfg.source)
        self.worker = InferenceWorker(self.runner, source, self.budget_ms)
        self.state, self.state_detail = "running", None
        self.reference_check = self.runner.info.details.get("reference_check")
        failed = describe_check(self.reference_check)
        if failed is not None:  # reported in birth and state; rollout decides what to do about it
            self.state_detail = failed
            log.warning("%s", failed)

    # payload bodies ----------------------------------------------------------------------
    def birth_body(self) -> dict[str, Any]:
        b = self.bundle
        return {
            "state": self.state, "state_detail": self.state_detail,
            "agent": {"edgekit_version": edge.__version__, "pid": os.getpid(), "started_at": round(self.started, 3),
                      "interval_s": self.config.interval_s, "source": self._source_desc, "fps": self.fps,
                      "budget_ms": self.budget_ms},
            "bundle": None if b is None else {"id": b.id, "target": b.target, "precision": b.precision},
            "runner": None if self.runner is None else runner_json(self.runner),
            "reference_check": self.reference_check,
            "host": self._host,
        }

    def telemetry_body(self) -> dict[str, Any]:
        now = time.monotonic()
        window = now - self._last_tel
        self._last_tel = now
        inference: dict[str, Any] | None = None
        if self.worker is not None:
            from edge.stats import LatencyStats

            samples, misses = self.worker.take_window()
            if self.worker.error and self.state != "error":
                self._set_state("error", self.worker.error)
            inference = {
                "frames": len(samples), "fps": round(len(samples) / window, 2) if window > 0 else None,
                "target_fps": self.fps, "budget_ms": self.budget_ms, "budget_misses": misses,
                "frames_dropped": getattr(self.worker.source, "dropped", 0),
                "frames_total": self.worker.total, "budget_misses_total": self.worker.total_misses,
                "latency_ms": LatencyStats.from_ms(samples).to_json() if samples else None,
            }
        assert self.outbox is not None
        return {
            "interval_s": self.config.interval_s, "window_s": round(window, 3), "state": self.state,
            "bundle_id": self.bundle.id if self.bundle is not None else None,
            "uptime_s": round(now - self._t0, 1), "inference": inference, **process_and_system(self._meter),
            "thermal": self.thermal.sample() if self.thermal else None,
            "spool": {"pending": self.outbox.pending(), "pending_bytes": self.outbox.pending_bytes(),
                      "dropped_total": self.outbox.dropped_total, "max_messages": self.outbox.max_messages},
        }

    def _set_state(self, state: str, detail: str | None) -> None:
        self.state, self.state_detail = state, detail
        if self.session is not None:
            self.session.submit("state", {"state": state, "detail": detail,
                                          "bundle_id": self.bundle.id if self.bundle is not None else None})

    def _tick(self) -> None:
        assert self.session is not None
        self.session.submit("telemetry", self.telemetry_body())

    # lifecycle ---------------------------------------------------------------------------
    def start(self) -> "Agent":
        cfg = self.config
        self._load()
        try:
            self.outbox = SqliteOutbox(cfg.store / "agent" / "outbox.sqlite", max_messages=cfg.spool_max_messages,
                                       max_bytes=cfg.spool_max_bytes)
            self.thermal = ThermalProbe()
            self.loop = NetworkLoop().start()
            self.session = DeviceSession(self.loop, cfg.broker, cfg.fleet, cfg.device_id, self.outbox,
                                         birth_body=self.birth_body, client_id=cfg.client_id, backoff=cfg.backoff)
            log.info("agent %s/%s session %d, %s, state %s", cfg.fleet, cfg.device_id, self.session.session,
                     self._source_desc, self.state)
            self._last_tel = time.monotonic()
            self.loop.run(self.session.start)
            self.loop.run(self._set_state, self.state, self.state_detail)
            self.loop.run(self.loop.call_every, cfg.interval_s, self._tick)
            if self.worker is not None:
                self.worker.start()
        except BaseException:
            self.close()
            raise
        return self

    def stop(self, flush_timeout: float = 10.0) -> bool:
        """Stop inference, send a last telemetry window, flush the outbox, publish death, disconnect.

        Returns True when the outbox was empty at the end (everything acknowledged by the broker).
        """
        if self.worker is not None:
            self.worker.stop()
        flushed = False
        if self.loop is not None and self.session is not None:
            self.loop.run(self._tick)
            flushed = self.session.drain(flush_timeout)
            self.session.close(timeout=min(5.0, flush_timeout))
        self.close()
        return flushed

    def close(self) -> None:
        if self.worker is not None:
            self.worker.stop()
            close_source = getattr(self.worker.source, "close", None)
            if close_source is not None:
                close_source()
        if self.loop is not None:
            self.loop.stop()
            self.loop = None
        for res in (self.runner, self.outbox, self.thermal):
            if res is not None:
                res.close()
        self.runner = self.outbox = self.thermal = None

    def __enter__(self) -> "Agent":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
