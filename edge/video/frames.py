"""The contract between the device agent and its frame sources, kept free of numpy and OpenCV so the
agent's lean start (``--source synthetic``/``none``/``app``) imports neither: an ``AgentFrame`` and the
pacing that paces every source at its ``fps``.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterator, Mapping, NamedTuple


class AgentFrame(NamedTuple):
    """One frame of the agent's workload (contract: ``edge.agent.sources``)."""

    feeds: Mapping[str, Any]
    started_ns: int
    finish: Callable[[Mapping[str, Any]], Any] | None = None


def paced(fps: float, stop: threading.Event, counter: Any) -> Iterator[int]:
    """0, 1, 2, ... at ``fps``; when more than a frame behind, skips (as a camera would), adding to
    ``counter.dropped``. Ends when ``stop`` is set."""
    period = 1.0 / fps
    due = time.monotonic()
    i = 0
    while not stop.is_set():
        now = time.monotonic()
        if now < due:
            if stop.wait(due - now):
                return
        elif now - due > period:
            missed = int((now - due) / period)
            counter.dropped += missed
            due += missed * period
        yield i
        i += 1
        due += period
