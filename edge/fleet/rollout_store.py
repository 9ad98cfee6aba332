"""Where a rollout's state and every decision of its controller live: tables in the fleet database.

The controller keeps nothing that matters in memory. Each ``step`` reads the rollout from here,
decides, writes its decisions (and why) in one transaction, and only then publishes the desired
states they imply; the desired states are re-published from these rows until the broker holds
them, so a controller (or broker) that dies between the commit and the publish loses nothing, and
a restarted controller continues from the rows.

    rollouts            one row per rollout: fleet, state, the spec it was started with
    rollout_cohorts     one per (rollout, target class): its bundle and artifact, wave, state, reason
    rollout_devices     one per (rollout, device): the version it was given, its outcome, the previous
                        bundle it goes back to and the rollback's version and outcome
    rollout_events      every decision, numbered per rollout, with its reason (``status`` shows them)
    rollout_artifacts   bundle id -> artifact (URL, sha256, size): what a device can be rolled back to

Same portable SQL as ``edge.fleet.db`` (SQLite and PostgreSQL).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from edge.fleet.db import FleetDB

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS rollouts (
        id TEXT PRIMARY KEY, fleet TEXT NOT NULL, state TEXT NOT NULL, reason TEXT, spec TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL,
        finished_at DOUBLE PRECISION, owner TEXT, lease_until DOUBLE PRECISION)""",
    """CREATE TABLE IF NOT EXISTS rollout_cohorts (
        rollout_id TEXT NOT NULL, cohort TEXT NOT NULL, bundle_id TEXT NOT NULL, artifact TEXT NOT NULL,
        state TEXT NOT NULL, wave BIGINT NOT NULL, wave_started_at DOUBLE PRECISION, reason TEXT,
        updated_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (rollout_id, cohort))""",
    """CREATE TABLE IF NOT EXISTS rollout_devices (
        rollout_id TEXT NOT NULL, device TEXT NOT NULL, cohort TEXT NOT NULL, wave BIGINT NOT NULL,
        version BIGINT NOT NULL, replaces BIGINT, assigned_at DOUBLE PRECISION NOT NULL, state TEXT NOT NULL,
        reason TEXT, report TEXT, prev_bundle TEXT, prev_artifact TEXT,
        rb_version BIGINT, rb_state TEXT, rb_reason TEXT, rb_at DOUBLE PRECISION,
        updated_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (rollout_id, device))""",
    """CREATE TABLE IF NOT EXISTS rollout_events (
        rollout_id TEXT NOT NULL, seq BIGINT NOT NULL, ts DOUBLE PRECISION NOT NULL, kind TEXT NOT NULL,
        cohort TEXT, device TEXT, reason TEXT, detail TEXT, PRIMARY KEY (rollout_id, seq))""",
    """CREATE TABLE IF NOT EXISTS rollout_artifacts (
        bundle_id TEXT PRIMARY KEY, url TEXT NOT NULL, sha256 TEXT NOT NULL, size BIGINT,
        target TEXT, registered_at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS rollouts_fleet ON rollouts (fleet, state)",
]

#: rollout states; the last three are final
ROLLOUT_STATES = ("running", "paused", "aborting", "completed", "partial", "aborted")
FINAL = ("completed", "partial", "aborted")
#: cohort states; all but ``rolling`` are final
COHORT_STATES = ("rolling", "completed", "aborted", "superseded")
#: device outcome of the new bundle (and of the rollback, ``rb_state``)
DEVICE_STATES = ("assigned", "running", "failed", "rolled-back", "timed-out", "skipped")


def init(db: FleetDB) -> None:
    for stmt in SCHEMA:
        db.execute(stmt)
    db.commit()


def _j(v: Any) -> str | None:
    return None if v is None else json.dumps(v, separators=(",", ":"), sort_keys=True)


def _unj(v: Any) -> Any:
    return None if v is None else json.loads(v)


@dataclass(frozen=True)
class Assignment:
    """A device's place in a rollout: its cohort and wave, the desired-state version it gets (and the one it
    replaces), the bundle and artifact it goes back to on a rollback; ``state`` "skipped" with the ``reason``
    where it cannot be rolled back."""

    device: str
    cohort: str
    wave: int
    version: int
    replaces: int | None
    prev_bundle: str | None
    prev_artifact: dict[str, Any] | None
    state: str = "assigned"
    reason: str | None = None


class RolloutStore:
    """The SQL of the rollout tables. Writes are not committed here: the caller commits a whole decision."""

    def __init__(self, db: FleetDB) -> None:
        self.db = db
        init(db)

    # rollouts -------------------------------------------------------------------------------
    def create(self, rid: str, fleet: str, spec: dict[str, Any], now: float) -> None:
        self.db.execute(
            "INSERT INTO rollouts (id, fleet, state, reason, spec, created_at, updated_at) VALUES (?, ?, 'running', NULL, ?, ?, ?)",
            (rid, fleet, _j(spec), now, now),
        )

    def rollout(self, rid: str) -> dict[str, Any] | None:
        rows = self.db.query("SELECT * FROM rollouts WHERE id = ?", (rid,))
        if not rows:
            return None
        r = rows[0]
        r["spec"] = _unj(r["spec"])
        return r

    def rollouts(self, fleet: str | None = None) -> list[dict[str, Any]]:
        if fleet is None:
            return self.db.query(
                "SELECT id, fleet, state, reason, created_at, updated_at, finished_at FROM rollouts ORDER BY created_at"
            )
        return self.db.query(
            "SELECT id, fleet, state, reason, created_at, updated_at, finished_at FROM rollouts WHERE fleet = ? ORDER BY created_at",
            (fleet,),
        )

    def set_rollout_state(self, rid: str, state: str, reason: str | None, now: float) -> None:
        if state not in ROLLOUT_STATES:
            raise ValueError(state)
        self.db.execute(
            "UPDATE rollouts SET state = ?, reason = ?, updated_at = ?, finished_at = ? WHERE id = ?",
            (state, reason, now, now if state in FINAL else None, rid),
        )

    def claim(self, rid: str, owner: str, now: float, lease_s: float) -> tuple[bool, str | None, float | None]:
        """Take or extend the rollout's lease for ``owner`` (committed at once): one controller drives a rollout
        at a time; another takes over when the lease ran out (its controller died). (claimed, holder, until)."""
        cur = self.db.execute(
            "UPDATE rollouts SET owner = ?, lease_until = ? WHERE id = ? AND (owner IS NULL OR "
            "owner = ? OR lease_until IS NULL OR lease_until < ?)",
            (owner, now + lease_s, rid, owner, now),
        )
        ok = cur.rowcount == 1
        self.db.commit()
        if ok:
            return True, owner, now + lease_s
        row = self.db.execute("SELECT owner, lease_until FROM rollouts WHERE id = ?", (rid,)).fetchone()
        return False, row[0] if row else None, row[1] if row else None

    def release(self, rid: str, owner: str) -> None:
        self.db.execute("UPDATE rollouts SET owner = NULL, lease_until = NULL WHERE id = ? AND owner = ?", (rid, owner))
        self.db.commit()

    # cohorts --------------------------------------------------------------------------------
    def add_cohort(self, rid: str, cohort: str, bundle_id: str, artifact: dict[str, Any], now: float) -> None:
        self.db.execute(
            "INSERT INTO rollout_cohorts (rollout_id, cohort, bundle_id, artifact, state, wave, "
            "wave_started_at, reason, updated_at) VALUES (?, ?, ?, ?, 'rolling', -1, NULL, NULL, ?)",
            (rid, cohort, bundle_id, _j(artifact), now),
        )

    def cohorts(self, rid: str) -> list[dict[str, Any]]:
        rows = self.db.query("SELECT * FROM rollout_cohorts WHERE rollout_id = ? ORDER BY cohort", (rid,))
        for r in rows:
            r["artifact"] = _unj(r["artifact"])
        return rows

    def update_cohort(self, rid: str, cohort: str, now: float, **fields: Any) -> None:
        allowed = {"state", "wave", "wave_started_at", "reason"}
        if not fields or set(fields) - allowed:
            raise ValueError(f"bad cohort fields {sorted(fields)}")
        cols = ", ".join(f"{k} = ?" for k in fields)
        self.db.execute(
            f"UPDATE rollout_cohorts SET {cols}, updated_at = ? WHERE rollout_id = ? AND cohort = ?",
            (*fields.values(), now, rid, cohort),
        )

    def active_cohorts(self, fleet: str, cohort: str, exclude: str) -> list[str]:
        """Rollouts of ``fleet`` other than ``exclude`` still rolling ``cohort`` (a newer rollout supersedes them)."""
        rows = self.db.query(
            "SELECT c.rollout_id FROM rollout_cohorts c JOIN rollouts r ON r.id = c.rollout_id "
            "WHERE r.fleet = ? AND c.cohort = ? AND c.state = 'rolling' AND c.rollout_id <> ?",
            (fleet, cohort, exclude),
        )
        return [r["rollout_id"] for r in rows]

    # devices --------------------------------------------------------------------------------
    def assign(self, rid: str, a: Assignment, now: float) -> None:
        self.db.execute(
            "INSERT INTO rollout_devices (rollout_id, device, cohort, wave, version, replaces, "
            "assigned_at, state, reason, report, prev_bundle, prev_artifact, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?)",
            (
                rid,
                a.device,
                a.cohort,
                a.wave,
                a.version,
                a.replaces,
                now,
                a.state,
                a.reason,
                a.prev_bundle,
                _j(a.prev_artifact),
                now,
            ),
        )

    def devices(self, rid: str) -> list[dict[str, Any]]:
        rows = self.db.query("SELECT * FROM rollout_devices WHERE rollout_id = ? ORDER BY device", (rid,))
        for r in rows:
            r["prev_artifact"] = _unj(r["prev_artifact"])
            r["report"] = _unj(r["report"])
        return rows

    def update_device(self, rid: str, device: str, now: float, **fields: Any) -> None:
        allowed = {"state", "reason", "report", "rb_version", "rb_state", "rb_reason", "rb_at"}
        if not fields or set(fields) - allowed:
            raise ValueError(f"bad device fields {sorted(fields)}")
        if "report" in fields:
            fields["report"] = _j(fields["report"])
        cols = ", ".join(f"{k} = ?" for k in fields)
        self.db.execute(
            f"UPDATE rollout_devices SET {cols}, updated_at = ? WHERE rollout_id = ? AND device = ?",
            (*fields.values(), now, rid, device),
        )

    def max_version(self, fleet: str, device: str) -> int:
        """The highest desired version any rollout of ``fleet`` gave ``device`` (0: none)."""
        row = self.db.execute(
            "SELECT max(CASE WHEN d.rb_version IS NOT NULL AND d.rb_version > d.version THEN d.rb_version "
            "ELSE d.version END) FROM rollout_devices d JOIN rollouts r ON r.id = d.rollout_id "
            "WHERE r.fleet = ? AND d.device = ?",
            (fleet, device),
        ).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    # events ---------------------------------------------------------------------------------
    def event(
        self,
        rid: str,
        kind: str,
        now: float,
        *,
        cohort: str | None = None,
        device: str | None = None,
        reason: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        row = self.db.execute("SELECT max(seq) FROM rollout_events WHERE rollout_id = ?", (rid,)).fetchone()
        seq = (int(row[0]) if row and row[0] is not None else 0) + 1
        self.db.execute(
            "INSERT INTO rollout_events (rollout_id, seq, ts, kind, cohort, device, reason, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (rid, seq, now, kind, cohort, device, None if reason is None else reason[:2000], _j(detail)),
        )

    def events(self, rid: str, *, since: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        sql = "SELECT * FROM rollout_events WHERE rollout_id = ? AND seq > ? ORDER BY seq"
        rows = self.db.query(sql + (f" LIMIT {int(limit)}" if limit else ""), (rid, since))
        for r in rows:
            r["detail"] = _unj(r["detail"])
        return rows

    # artifacts ------------------------------------------------------------------------------
    def register_artifact(self, bundle_id: str, artifact: dict[str, Any], target: str | None, now: float) -> None:
        self.db.execute(
            "INSERT INTO rollout_artifacts (bundle_id, url, sha256, size, target, registered_at) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (bundle_id) DO UPDATE SET url = excluded.url, "
            "sha256 = excluded.sha256, size = excluded.size, target = excluded.target, "
            "registered_at = excluded.registered_at",
            (bundle_id, artifact["url"], artifact["sha256"], artifact.get("size"), target, now),
        )

    def artifact(self, bundle_id: str) -> dict[str, Any] | None:
        rows = self.db.query("SELECT url, sha256, size FROM rollout_artifacts WHERE bundle_id = ?", (bundle_id,))
        return dict(rows[0]) if rows else None

    def now(self) -> float:
        return time.time()
