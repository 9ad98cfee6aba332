"""Numbers read from the environment: validated, or refused in one line naming the variable."""

from __future__ import annotations

import math
import os

from edge.errors import EdgeError


def seconds_from_env(name: str, default: float) -> float:
    """``$name`` as a finite number of seconds > 0, ``default`` when unset or blank; EdgeError otherwise."""
    raw = os.environ.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise EdgeError(f"${name} is {raw[:40]!r}, not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise EdgeError(f"${name} must be > 0 seconds, got {raw[:40]!r}")
    return value
