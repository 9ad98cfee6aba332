"""Log lines caused by what others send, at a rate no sender can choose.

Anyone who can publish to the broker can make the agent or the collector see a bad message
as often as they like; one log line each would fill the disk and bury everything else. A
:class:`RateLimitedLog` writes at most one line per *reason* per ``interval_s``; the next
line that gets through says how many were held back in between. Reasons are a small closed
set chosen by the code (``"unknown_command"``, ``"malformed"``), never text from a message,
and at most ``max_reasons`` of them are tracked.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable


class RateLimitedLog:
    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval_s: float = 10.0,
        max_reasons: int = 64,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger, self.interval_s, self.max_reasons, self._clock = logger, interval_s, max_reasons, clock
        self._last: dict[str, float] = {}  # reason -> when its last line was written
        self._held: dict[str, int] = {}  # reason -> lines held back since then
        self.total: dict[str, int] = {}  # reason -> every call, written or not

    def log(self, level: int, reason: str, msg: str, *args: Any, exc_info: bool = False) -> bool:
        """Log ``msg % args`` unless a line for ``reason`` was written less than ``interval_s`` ago. True if written."""
        if reason not in self.total and len(self.total) >= self.max_reasons:
            reason = "other"
        self.total[reason] = self.total.get(reason, 0) + 1
        now = self._clock()
        last = self._last.get(reason)
        if last is not None and now - last < self.interval_s:
            self._held[reason] = self._held.get(reason, 0) + 1
            return False
        held = self._held.pop(reason, 0)
        self._last[reason] = now
        if held:
            msg += " (and %d more like it in the last %.0f s)"
            args = (*args, held, now - last if last is not None else 0.0)
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True

    def warning(self, reason: str, msg: str, *args: Any) -> bool:
        return self.log(logging.WARNING, reason, msg, *args)

    def info(self, reason: str, msg: str, *args: Any) -> bool:
        return self.log(logging.INFO, reason, msg, *args)

    def error(self, reason: str, msg: str, *args: Any) -> bool:
        return self.log(logging.ERROR, reason, msg, *args)
