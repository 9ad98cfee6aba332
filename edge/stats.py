"""Latency statistics: one definition for bench, the video pipeline and the agent's telemetry."""

from __future__ import annotations

import resource
import sys
from dataclasses import asdict, dataclass
from typing import Any, Iterable

import numpy as np

from edge.errors import EdgeError


@dataclass(frozen=True)
class LatencyStats:
    count: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    min_ms: float
    mean_ms: float
    std_ms: float

    @classmethod
    def from_ms(cls, samples_ms: Iterable[float] | np.ndarray) -> LatencyStats:
        a = np.asarray(samples_ms, dtype=np.float64)
        if a.size == 0:
            raise ValueError("no latency samples")
        p50, p90, p99 = np.percentile(a, [50, 90, 99])
        return cls(
            count=int(a.size),
            p50_ms=float(p50),
            p90_ms=float(p90),
            p99_ms=float(p99),
            max_ms=float(a.max()),
            min_ms=float(a.min()),
            mean_ms=float(a.mean()),
            std_ms=float(a.std(ddof=1)) if a.size > 1 else 0.0,
        )

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def budget_from(fps: float | None, budget_ms: float | None, default_ms: float | None) -> tuple[float | None, str]:
    """The frame budget in ms and where it came from. ``--fps`` and ``--budget-ms`` exclude each other."""
    if fps is not None and budget_ms is not None:
        raise EdgeError("give either --fps or --budget-ms, not both")
    if fps is not None:
        if fps <= 0:
            raise EdgeError(f"--fps must be > 0, got {fps}")
        return 1000.0 / fps, f"{fps:g} fps"
    if budget_ms is not None:
        if budget_ms <= 0:
            raise EdgeError(f"--budget-ms must be > 0, got {budget_ms}")
        return budget_ms, f"{budget_ms:g} ms"
    if default_ms is not None:
        return default_ms, "target profile"
    return None, "none"


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB (ru_maxrss is bytes on macOS, KiB elsewhere)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024
