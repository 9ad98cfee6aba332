"""The rollout operations: start a rollout, pause/resume/abort it, read its status (``edge.fleet.rollout`` re-exports
them beside the controller that drives what they record)."""

from __future__ import annotations

import fnmatch
import logging
import secrets
import time
from typing import Any, Sequence

from edge.fleet.db import FleetDB
from edge.fleet.rollout_spec import RolloutBundle, RolloutError, RolloutSpec
from edge.fleet.rollout_store import FINAL, RolloutStore
from edge.fleet.rollout_view import DeviceView, FleetView
from edge.mqtt.topics import check_part

log = logging.getLogger("edge.fleet.rollout")


# -- the operations --------------------------------------------------------------------------------


def new_rollout_id() -> str:
    return time.strftime("r%Y%m%d-%H%M%S-", time.gmtime()) + secrets.token_hex(3)


def start_rollout(
    db: FleetDB,
    view: FleetView,
    spec: RolloutSpec,
    bundles: list[RolloutBundle],
    *,
    previous: Sequence[RolloutBundle] = (),
    rollout_id: str | None = None,
    sync_timeout_s: float = 15.0,
    now: float | None = None,
) -> str:
    """Record a new rollout (nothing is published yet: the controller's first step does that). Refuses an
    empty fleet, two bundles for one target class, and a target filter that names none of the bundles."""
    store = RolloutStore(db)
    if not bundles:
        raise RolloutError("no bundle to roll out")
    by_target: dict[str, RolloutBundle] = {}
    for b in bundles:
        if b.target in by_target:
            raise RolloutError(
                f"two bundles for target class {b.target}: {by_target[b.target].bundle_id} and {b.bundle_id}",
                hint="a rollout takes one bundle per target class",
            )
        by_target[b.target] = b
    if spec.targets:
        unknown = sorted(set(spec.targets) - set(by_target))
        if unknown:
            raise RolloutError(
                f"--target {', '.join(unknown)}: no bundle of this rollout is built for it",
                hint=f"the bundles are for {', '.join(sorted(by_target))}",
            )
        by_target = {t: b for t, b in by_target.items() if t in spec.targets}
    if not view.wait_synced(sync_timeout_s):
        raise RolloutError(
            f"cannot read the fleet from the broker {view.broker.url} within {sync_timeout_s:g} s: {view.conn.last_error or 'no answer'}"
        )
    snap = view.snapshot()
    rid = rollout_id or new_rollout_id()
    check_part(rid, "rollout id")
    ctl_probe = _Probe(spec)
    sizes = {t: sum(1 for dv in snap.values() if ctl_probe.matches(dv, t)) for t in by_target}
    if not any(sizes.values()):
        seen = sorted({dv.target or "?" for dv in snap.values() if dv.birth is not None})
        raise RolloutError(
            f"fleet {spec.fleet!r} has no device for this rollout (target {', '.join(by_target)}"
            f"{', groups ' + ' '.join(f'{k}={v}' for k, v in spec.groups) if spec.groups else ''})",
            hint=f"devices seen: {len(snap)}, targets: {', '.join(seen) or 'none'}",
        )
    if store.rollout(rid) is not None:
        raise RolloutError(f"rollout {rid} exists already")
    now = time.time() if now is None else now
    try:
        store.create(rid, spec.fleet, spec.to_json(), now)
        for b in [*previous, *by_target.values()]:
            store.register_artifact(b.bundle_id, b.artifact, b.target, now)
        for t, b in sorted(by_target.items()):
            for old in store.active_cohorts(spec.fleet, t, rid):
                store.update_cohort(old, t, now, state="superseded", reason=f"superseded by rollout {rid}")
                store.event(old, "cohort_superseded", now, cohort=t, reason=f"superseded by rollout {rid}")
            store.add_cohort(rid, t, b.bundle_id, b.artifact, now)
        store.event(
            rid,
            "rollout_started",
            now,
            reason=f"{len(by_target)} cohort(s)",
            detail={
                "cohorts": {t: {"bundle": b.bundle_id, "devices": sizes[t]} for t, b in by_target.items()},
                "spec": spec.to_json(),
            },
        )
        db.commit()
    except BaseException:
        db.rollback()
        raise
    return rid


class _Probe:
    def __init__(self, spec: RolloutSpec) -> None:
        self.spec = spec

    def matches(self, dv: DeviceView, target: str) -> bool:
        if dv.birth is None or dv.target != target:
            return False
        return all(fnmatch.fnmatchcase(dv.field(k) or "", pat) for k, pat in self.spec.groups)


def _need(store: RolloutStore, rid: str) -> dict[str, Any]:
    r = store.rollout(rid)
    if r is None:
        known = [x["id"] for x in store.rollouts()][-5:]
        raise RolloutError(f"no rollout {rid!r}", hint=f"recent: {', '.join(known) or 'none'}")
    return r


def set_state(db: FleetDB, rid: str, action: str, reason: str | None = None) -> dict[str, Any]:
    """``pause``, ``resume`` or ``abort`` a rollout (recorded; a running controller acts on it at its next step,
    ``abort`` without one: run a step, see ``edgekit fleet rollout abort``)."""
    store = RolloutStore(db)
    r = _need(store, rid)
    now = time.time()
    allowed = {
        "pause": ("running",),
        "resume": ("paused", "running", "completed", "partial"),
        "abort": ("running", "paused", "completed", "partial", "aborting"),
    }[action]
    if r["state"] not in allowed:
        raise RolloutError(f"rollout {rid} is {r['state']}; cannot {action} it")
    new = {"pause": "paused", "resume": "running", "abort": "aborting"}[action]
    why = (
        reason or {"pause": "paused by request", "resume": "resumed by request", "abort": "aborted by request"}[action]
    )
    if action == "resume" and r["state"] in FINAL:  # devices that joined since get the bundle of completed cohorts
        new, why = r["state"], reason or "resumed to give devices that joined since the bundle of completed cohorts"
    try:
        if new != r["state"]:
            store.set_rollout_state(rid, new, why if action == "abort" else r["reason"], now)
        kind = {"pause": "rollout_paused", "resume": "rollout_resumed", "abort": "rollout_abort_requested"}[action]
        store.event(rid, kind, now, reason=why)
        db.commit()
    except BaseException:
        db.rollback()
        raise
    return status(db, rid)


def status(db: FleetDB, rid: str | None = None, *, fleet: str | None = None, events: int = 50) -> dict[str, Any]:
    """A rollout's state, cohorts, device counts and latest decisions (``rid`` None: the latest one)."""
    store = RolloutStore(db)
    if rid is None:
        all_ = store.rollouts(fleet)
        if not all_:
            raise RolloutError("no rollout in this database" + (f" for fleet {fleet!r}" if fleet else ""))
        rid = all_[-1]["id"]
    r = _need(store, rid)
    rows = store.devices(rid)
    cohorts = []
    for c in store.cohorts(rid):
        crows = [x for x in rows if x["cohort"] == c["cohort"]]
        counts: dict[str, int] = {}
        for x in crows:
            counts[x["state"]] = counts.get(x["state"], 0) + 1
        rb: dict[str, int] = {}
        for x in crows:
            if x["rb_state"]:
                rb[x["rb_state"]] = rb.get(x["rb_state"], 0) + 1
        cohorts.append(
            {
                "cohort": c["cohort"],
                "bundle_id": c["bundle_id"],
                "state": c["state"],
                "wave": c["wave"],
                "reason": c["reason"],
                "devices": counts,
                "rollback": rb,
            }
        )
    evs = store.events(rid)
    return {
        "id": rid,
        "fleet": r["fleet"],
        "state": r["state"],
        "reason": r["reason"],
        "created_at": r["created_at"],
        "finished_at": r["finished_at"],
        "spec": r["spec"],
        "cohorts": cohorts,
        "devices": [
            {
                k: x[k]
                for k in (
                    "device",
                    "cohort",
                    "wave",
                    "version",
                    "state",
                    "reason",
                    "prev_bundle",
                    "rb_version",
                    "rb_state",
                    "rb_reason",
                )
            }
            for x in rows
        ],
        "events": [
            {k: e[k] for k in ("seq", "ts", "kind", "cohort", "device", "reason", "detail")} for e in evs[-events:]
        ]
        if events
        else [],
        "events_total": len(evs),
    }
