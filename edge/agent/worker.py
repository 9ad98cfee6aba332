"""The agent's inference worker: ``runner.infer`` on every frame of the source in its own thread, latency samples
per telemetry window and per rollout watch, and the lock that keeps every other use of the live runner (a
reference check) between two frames.

Imports stay lean: ``edge.verify.refpairs`` (numpy) is imported only when a check runs.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from edge.errors import daemon_error_line

log = logging.getLogger("edge.agent")


class InferenceWorker:
    """runner.infer on every frame of the source; latency samples per telemetry window.

    ``infer_lock`` is held for each ``runner.infer``: anything else that runs the live runner (the watch's
    reference check, :meth:`check_live`) takes it too. LiteRT's interpreter and OpenVINO's infer request are
    not thread-safe: a check from another thread while a frame infers failed 8 (LiteRT) and 12 (OpenVINO) of
    20 times and rolled good rollouts back."""

    def __init__(self, runner: Any, source: Any, budget_ms: float) -> None:
        self.runner, self.source, self.budget_ms = runner, source, budget_ms
        self.infer_lock = threading.Lock()
        # a check waiting for infer_lock holds the turnstile, which the worker passes before each frame: the
        # worker, re-taking infer_lock at once after each frame, would otherwise starve it (locks are not fair)
        self._turnstile = threading.Lock()
        self._lock = threading.Lock()
        self._samples: list[float] = []
        self._health: list[float] = []  # a rollout's watch window (edge.agent.apply), apart from telemetry's
        self._misses = 0
        self.total = 0
        self.total_misses = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="edgekit-inference", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        infer, infer_lock, turnstile = self.runner.infer, self.infer_lock, self._turnstile
        clock = time.perf_counter_ns
        try:
            for frame in self.source.frames(self._stop):
                with turnstile:
                    pass
                with infer_lock:
                    outputs = infer(frame.feeds)
                if frame.finish is not None:
                    frame.finish(outputs)
                ms = (clock() - frame.started_ns) / 1e6
                with self._lock:
                    self._samples.append(ms)
                    if len(self._health) < 100_000:
                        self._health.append(ms)
                    if ms > self.budget_ms:
                        self._misses += 1
        except Exception as e:  # reported in state and telemetry; the agent keeps reporting
            self.error = f"{type(e).__name__}: {e}"
            log.error("inference failed: %s", daemon_error_line("agent inference", e))

    def check_live(self, bundle: Any) -> dict[str, Any]:
        """``bundle``'s reference pairs on the live runner, between two frames (under ``infer_lock``)."""
        from edge.verify.refpairs import check_reference_pairs

        with self._turnstile:
            self.infer_lock.acquire()
        try:
            return check_reference_pairs(bundle, self.runner)
        finally:
            self.infer_lock.release()

    def take_window(self) -> tuple[list[float], int]:
        with self._lock:
            samples, misses = self._samples, self._misses
            self._samples, self._misses = [], 0
        self.total += len(samples)
        self.total_misses += misses
        return samples, misses

    def take_health(self) -> list[float]:
        with self._lock:
            samples, self._health = self._health, []
        return samples

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
