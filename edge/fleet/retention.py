"""Retention: ``edgekit fleet prune --older-than 30d`` drops what arrived before a cut.

- Telemetry: PostgreSQL with daily partitions drops every partition that ends at or before the
  cut (no row-by-row delete, no vacuum debt; the ``telemetry_legacy`` partition of a converted
  database too, once all of it is past the cut) and deletes from the one partition the cut falls in;
  SQLite and an unpartitioned PostgreSQL table delete rows by ``received_at``.
- States, births, deaths: deleted by ``received_at``, except each device's current session's
  birth (the collector asks the store whether it has seen a session's birth).
- Streams (the per-session gap counters): deleted when their last message is older than the cut and
  the session is not the device's current one.
- Stream flags (a device's latest refused stream, shown by ``fleet status``): deleted when the last refusal
  is older than the cut; a device still sending forged or broken sequence numbers is flagged again at once.
- Device keys (each device's pinned identity key, ``edge.fleet.device_keys``): never; the births and deaths
  refused against a pin are forgotten (``key_refusals``) when the last one is older than the cut.
- Devices (one row each, where every device stands): never.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from edge.errors import EdgeError
from edge.fleet.db import PARTITION_S, FleetDB, open_db
from edge.fleet.migrate import LEGACY, LEGACY_UNTIL_KEY, legacy_until

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``3600s``, ``2w`` (or plain seconds) -> seconds; at least one second."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", str(text)[:40])
    if not m:
        raise EdgeError(f"bad age {str(text)[:40]!r}", hint="e.g. 30d, 12h, 90m, 3600s or 2w")
    seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if not 1 <= seconds <= 100 * 365 * 86400:
        raise EdgeError(f"age {text!r} is out of range", hint="between 1 s and 100 years")
    return seconds


@dataclass
class PruneReport:
    cut: float  # rows that arrived before this (Unix seconds) are gone
    dropped_partitions: list[str] = field(default_factory=list)
    deleted: dict[str, int] = field(default_factory=dict)  # table -> rows deleted
    partitioned: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "cut": self.cut,
            "partitioned": self.partitioned,
            "dropped_partitions": self.dropped_partitions,
            "deleted": self.deleted,
        }


def prune(db: FleetDB, older_than_s: float, *, now: float | None = None) -> PruneReport:
    """Remove what arrived more than ``older_than_s`` before ``now``; committed before it returns."""
    cut = (time.time() if now is None else now) - older_than_s
    rep = PruneReport(cut=cut, partitioned=db.partitioned)
    try:
        if db.partitioned:
            for day, name in sorted(db.partitions().items()):
                if (day + 1) * PARTITION_S <= cut:
                    n = int(db.execute(f"SELECT count(*) FROM {name}").fetchone()[0])
                    db.execute(f"DROP TABLE {name}")  # name: telemetry_pYYYYMMDD from the catalogue, checked
                    rep.dropped_partitions.append(name)
                    rep.deleted["telemetry"] = rep.deleted.get("telemetry", 0) + n
                    db.commit()  # one partition at a time: each DROP holds the parent's lock only briefly
            until = legacy_until(db)  # the rows of a table partitioned by `edgekit fleet partition`
            if until is not None and until <= cut:
                n = int(db.execute(f"SELECT count(*) FROM {LEGACY}").fetchone()[0])
                db.execute(f"DROP TABLE {LEGACY}")
                db.execute("DELETE FROM meta WHERE key = ?", (LEGACY_UNTIL_KEY,))
                rep.dropped_partitions.append(LEGACY)
                rep.deleted["telemetry"] = rep.deleted.get("telemetry", 0) + n
                db.commit()
            db.forget_partitions()
        rep.deleted["telemetry"] = rep.deleted.get("telemetry", 0) + int(
            db.execute("DELETE FROM telemetry WHERE received_at < ?", (cut,)).rowcount
        )
        rep.deleted["states"] = int(db.execute("DELETE FROM states WHERE received_at < ?", (cut,)).rowcount)
        current = "NOT EXISTS (SELECT 1 FROM devices d WHERE d.fleet = {t}.fleet AND d.device = {t}.device AND d.session = {t}.session)"
        rep.deleted["births"] = int(
            db.execute("DELETE FROM births WHERE received_at < ? AND " + current.format(t="births"), (cut,)).rowcount
        )
        rep.deleted["deaths"] = int(
            db.execute("DELETE FROM deaths WHERE received_at < ? AND " + current.format(t="deaths"), (cut,)).rowcount
        )
        rep.deleted["streams"] = int(
            db.execute("DELETE FROM streams WHERE updated_at < ? AND " + current.format(t="streams"), (cut,)).rowcount
        )
        rep.deleted["stream_flags"] = int(db.execute("DELETE FROM stream_flags WHERE last_at < ?", (cut,)).rowcount)
        rep.deleted["key_refusals"] = int(
            db.execute(
                "UPDATE device_keys SET refused = 0, refused_reason = NULL, refused_key = NULL, refused_at = NULL "
                "WHERE refused_at < ?",
                (cut,),
            ).rowcount
        )
        db.commit()
    except Exception:
        db.rollback()
        raise
    return rep


def prune_url(db_url: str, older_than: str | float, *, now: float | None = None) -> PruneReport:
    age = parse_age(older_than) if isinstance(older_than, str) else float(older_than)
    with open_db(db_url, must_exist=True) as db:
        return prune(db, age, now=now)
