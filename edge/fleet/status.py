"""``edgekit fleet status``: one row per device from the collector's store.

A device is ``online`` when its latest birth is not followed by a matching death and it
was heard from within ``stale_factor`` telemetry intervals (at least ``min_stale_s``);
``stale`` when it is online by the books but silent for longer; ``offline`` after a death
(clean shutdown or last will); ``unknown`` when telemetry arrived but no birth yet.
"""

from __future__ import annotations

import time
from typing import Any

from edge.fleet.db import open_db

STATUSES = ("online", "stale", "offline", "unknown")


def classify(row: dict[str, Any], now: float, *, stale_factor: float = 3.0, min_stale_s: float = 15.0) -> str:
    online = row.get("online")
    if online is not None and not online:
        return "offline"
    interval = row.get("interval_s") or 5.0
    limit = max(min_stale_s, stale_factor * interval)
    last = row.get("last_seen")
    if online is None:
        return "unknown"
    return "stale" if last is None or now - last > limit else "online"


def fleet_status(db_url: str, *, fleet: str | None = None, now: float | None = None, stale_factor: float = 3.0,
                 min_stale_s: float = 15.0) -> list[dict[str, Any]]:
    now = time.time() if now is None else now
    with open_db(db_url, must_exist=True) as db:
        where, params = ("WHERE fleet = ?", (fleet,)) if fleet else ("", ())
        rows = db.query(f"SELECT * FROM devices {where} ORDER BY fleet, device", params)
        # summed as floating point: a device may have any number of sessions, and SQLite's integer sum()
        # raises "integer overflow" past 2**63 instead of giving a number
        gaps = db.query(f"SELECT fleet, device, sum(CAST(CASE WHEN max_seq > announced_seq THEN max_seq "
                        f"ELSE announced_seq END - received AS DOUBLE PRECISION)) AS missing, "
                        f"sum(CAST(received AS DOUBLE PRECISION)) AS received FROM streams {where} "
                        f"GROUP BY fleet, device", params)
    missing = {(g["fleet"], g["device"]): (int(g["missing"] or 0), int(g["received"] or 0)) for g in gaps}
    out = []
    for r in rows:
        r = dict(r)
        for k in ("online", "throttled"):
            if r.get(k) is not None:
                r[k] = bool(r[k])
        r["status"] = classify(r, now, stale_factor=stale_factor, min_stale_s=min_stale_s)
        r["seen_ago_s"] = None if r.get("last_seen") is None else round(now - r["last_seen"], 1)
        r["missing"], r["messages"] = missing.get((r["fleet"], r["device"]), (0, 0))
        out.append(r)
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, int]:
    counts = {s: 0 for s in STATUSES}
    for r in rows:
        counts[r["status"]] += 1
    counts["devices"] = len(rows)
    return counts
