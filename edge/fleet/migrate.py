"""``edgekit fleet partition``: turn an unpartitioned PostgreSQL ``telemetry`` table into daily partitions.

A database created before partitioning keeps working as it is (``FleetDB.partitioned`` is false:
primary-key de-duplication, row deletes on prune). This converts it, with the collectors stopped (a
collector chooses how to write when it opens the database; it refuses while one is connected; the
broker keeps their messages meanwhile), in one transaction that holds the table's lock:

1. the table is renamed ``telemetry_legacy`` (its primary key and index too);
2. the partitioned ``telemetry`` is created with its daily partitions (yesterday to three days ahead);
3. the rows that arrived since the first daily partition starts are moved into it;
4. ``telemetry_legacy`` is attached as the partition of everything before that point, keeping its
   rows where they are (PostgreSQL checks the range and builds the key index on it once);
5. ``meta.telemetry_legacy_until`` records where it ends: ``prune`` drops it whole once the cut
   passes that point, and deletes its rows before the cut until then.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from edge.errors import EdgeError
from edge.fleet.db import (
    COLLECTOR_APPLICATION,
    PARTITION_S,
    PARTITIONS_AHEAD,
    PG_PARTITIONED_TELEMETRY,
    FleetDB,
    open_db,
)

LEGACY = "telemetry_legacy"
LEGACY_UNTIL_KEY = "telemetry_legacy_until"


@dataclass(frozen=True)
class PartitionReport:
    kept_in_legacy: int  # rows now in the telemetry_legacy partition
    moved: int  # recent rows moved into daily partitions
    legacy_until: float  # the legacy partition holds rows that arrived before this (Unix seconds)


def partition_telemetry(db: FleetDB, *, now: float | None = None) -> PartitionReport:
    if db.dialect != "postgresql":
        raise EdgeError(f"{db.url} is SQLite: it has no partitions", hint="`fleet prune` deletes rows there")
    if db.partitioned:
        raise EdgeError(f"telemetry in {db.url} is already partitioned", hint="nothing to do")
    if db.execute("SELECT to_regclass(?)", (LEGACY,)).fetchone()[0] is not None:
        raise EdgeError(f"{db.url} already has a table {LEGACY}", hint="rename or drop it first")
    busy = int(
        db.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name = ?",
            (COLLECTOR_APPLICATION,),
        ).fetchone()[0]
    )
    if busy:  # a collector decides how to write when it opens the database: it would go on the old way
        raise EdgeError(
            f"{busy} collector(s) are connected to {db.url}; stop them before converting",
            hint="stop the collectors, run `edgekit fleet partition`, start them again (the broker keeps their messages meanwhile)",
        )
    now = time.time() if now is None else now
    first_day = int(now // PARTITION_S) - 1
    until = float(first_day * PARTITION_S)
    try:
        db.execute("LOCK TABLE telemetry IN ACCESS EXCLUSIVE MODE")
        db.execute(f"ALTER TABLE telemetry RENAME TO {LEGACY}")
        db.execute(f"ALTER TABLE {LEGACY} RENAME CONSTRAINT telemetry_pkey TO {LEGACY}_pkey")
        db.execute(f"ALTER INDEX IF EXISTS telemetry_received RENAME TO {LEGACY}_received")
        for stmt in PG_PARTITIONED_TELEMETRY:
            db.execute(stmt)
        db.partitioned = True
        top = db.execute(f"SELECT max(received_at) FROM {LEGACY}").fetchone()[0]
        last_day = max(first_day + PARTITIONS_AHEAD + 1, int((top or 0) // PARTITION_S))
        db.ensure_partitions(range(first_day, last_day + 1))
        moved = int(
            db.execute(f"INSERT INTO telemetry SELECT * FROM {LEGACY} WHERE received_at >= ?", (until,)).rowcount
        )
        db.execute(f"DELETE FROM {LEGACY} WHERE received_at >= ?", (until,))
        db.execute(f"ALTER TABLE telemetry ATTACH PARTITION {LEGACY} FOR VALUES FROM (MINVALUE) TO ({until})")
        kept = int(db.execute(f"SELECT count(*) FROM {LEGACY}").fetchone()[0])
        db.execute("INSERT INTO meta(key, value) VALUES (?, ?)", (LEGACY_UNTIL_KEY, repr(until)))
        db.commit()
    except Exception:
        db.rollback()
        db.partitioned = False
        db.forget_partitions()
        raise
    return PartitionReport(kept_in_legacy=kept, moved=moved, legacy_until=until)


def partition_url(db_url: str, *, now: float | None = None) -> PartitionReport:
    with open_db(db_url, must_exist=True) as db:
        return partition_telemetry(db, now=now)


def legacy_until(db: FleetDB) -> float | None:
    """Where the attached legacy partition ends, or None when there is none."""
    if not db.partitioned:
        return None
    row = db.execute("SELECT value FROM meta WHERE key = ?", (LEGACY_UNTIL_KEY,)).fetchone()
    return float(row[0]) if row else None
