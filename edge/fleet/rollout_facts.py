"""What each rollout did, from the controller's own tables (``edge.fleet.rollout_store``), for metrics and status.

The devices' latest reported state cannot say it: after an abort they report ``running`` on the bundle they
went back to, so a rollout that failed looked, from the devices, like one that succeeded (the dashboard drew
100% and no failure). The controller's rows keep each device's outcome of the new bundle (``state``,
``reason``) and of the rollback (``rb_state``), and the rollout's final state, for good.

Per rollout and cohort (target class): the target bundle, the devices given it, those on it now (answered
``running`` and not rolled back since), those that failed, rolled back or timed out (by reason code), the
rollbacks by outcome, and the rollout's and cohort's state (``completed``, ``partial``, ``aborted`` ...).
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass, field
from typing import Any

from edge.fleet.db import FleetDB
from edge.fleet.rollout_store import FINAL, ROLLOUT_STATES, init

#: device outcomes that count as failures of the new bundle
FAILED = ("failed", "rolled-back", "timed-out")
#: rollback outcomes (``rollout_devices.rb_state``)
ROLLBACK_STATES = ("pending", "running", "failed", "rolled-back", "timed-out", "impossible")
#: what ``edgekit fleet rollout start/resume`` exits with, by the rollout's state (documented in docs/agent-fleet.md)
EXIT_CODES = {"completed": 0, "partial": 4, "aborted": 5}
NOT_FINISHED = 6  # running, paused or aborting: the controller stopped (--timeout, a signal) before the end
_REASON = re.compile(r"[a-z0-9_]{1,40}")
_READY: weakref.WeakSet[FleetDB] = weakref.WeakSet()  # connections whose rollout tables are known to exist


def exit_code(state: str) -> int:
    """0 completed, 4 partial (some cohort aborted, or no device on the bundle), 5 aborted, 6 not finished."""
    return EXIT_CODES.get(state, NOT_FINISHED)


@dataclass
class CohortFacts:
    rollout: str
    fleet: str
    rollout_state: str
    cohort: str
    bundle: str
    state: str
    assigned: int = 0
    on_bundle: int = 0
    failed: dict[str, int] = field(default_factory=dict)  # reason code -> devices (failed, rolled back, timed out)
    outcomes: dict[str, int] = field(default_factory=dict)  # device state -> devices
    rollback: dict[str, int] = field(default_factory=dict)  # rollback state -> devices
    created_at: float = 0.0
    finished_at: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _reason(state: str, reason: Any) -> str:
    if isinstance(reason, str) and _REASON.fullmatch(reason):
        return reason
    return state.replace("-", "_")  # a free-text reason (a timeout's sentence) or none: the outcome names it


def rollout_facts(db: FleetDB, *, fleet: str | None = None, limit: int = 100) -> list[CohortFacts]:
    """The latest ``limit`` rollouts' cohorts (unfinished ones first kept), oldest first."""
    if db not in _READY:  # once per connection: the tables exist from then on
        init(db)
        _READY.add(db)
    where, params = ("WHERE fleet = ?", (fleet,)) if fleet else ("", ())
    rollouts = db.query(
        f"SELECT id, fleet, state, created_at, finished_at FROM rollouts {where} ORDER BY created_at DESC", params
    )
    keep = [r for r in rollouts if r["state"] not in FINAL] + [r for r in rollouts if r["state"] in FINAL]
    keep = sorted(keep[:limit], key=lambda r: (r["created_at"], r["id"]))
    if not keep:
        return []
    ids = {r["id"]: r for r in keep}
    out: dict[tuple[str, str], CohortFacts] = {}
    marks = ", ".join("?" * len(ids))
    for c in db.query(
        f"SELECT rollout_id, cohort, bundle_id, state FROM rollout_cohorts WHERE rollout_id IN ({marks})", list(ids)
    ):
        r = ids[c["rollout_id"]]
        if r["state"] not in ROLLOUT_STATES:
            continue
        out[(c["rollout_id"], c["cohort"])] = CohortFacts(
            c["rollout_id"],
            r["fleet"],
            r["state"],
            c["cohort"],
            c["bundle_id"],
            c["state"],
            created_at=float(r["created_at"]),
            finished_at=r["finished_at"],
        )
    for d in db.query(
        f"SELECT rollout_id, cohort, state, reason, rb_state FROM rollout_devices WHERE rollout_id IN ({marks})",
        list(ids),
    ):
        f = out.get((d["rollout_id"], d["cohort"]))
        if f is None or d["state"] == "skipped":
            continue
        f.assigned += 1
        f.outcomes[d["state"]] = f.outcomes.get(d["state"], 0) + 1
        if d["rb_state"]:
            f.rollback[d["rb_state"]] = f.rollback.get(d["rb_state"], 0) + 1
        if d["state"] == "running" and d["rb_state"] != "running":
            f.on_bundle += 1  # until its rollback is done (rb_state running) the device is on the new bundle
        if d["state"] in FAILED:
            code = _reason(d["state"], d["reason"])
            f.failed[code] = f.failed.get(code, 0) + 1
    return sorted(out.values(), key=lambda f: (f.created_at, f.rollout, f.cohort))
