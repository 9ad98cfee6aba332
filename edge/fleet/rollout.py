"""Fleet rollouts: a bundle moves through cohorts per target class, canary first, then waves, and a cohort
whose devices breach the abort criteria is rolled back to the bundle each device ran before.

    spec = RolloutSpec.parse(RolloutFlags(fleet="lab", canary="5%", waves="25%,50%,100%", watch="10m",
                                          abort_if=["p99>budget", "errors>1%@"], ...))
    rid = start_rollout(db, view, spec, [RolloutBundle.prepare(bundle_dir, url)])
    RolloutController(db, rid, view).run()

- **Cohorts** are target classes: a device belongs to the cohort of the target its running bundle was
  built for (its retained birth says so). A rollout takes one bundle per target class; each cohort moves on
  its own, so a bundle broken on one class aborts that cohort while the others go on.
- **Waves**: the canary (a share of the cohort, at least one device; online devices first), then each wave's
  share of the cohort *as it is now*, so devices that join during a rollout are counted and assigned; after
  the last wave (100%) a newcomer gets the bundle at the next step. A wave ends when its watch time has
  passed and each of its devices has answered (running, failed, rolled back) or timed out: a device that
  never answers is marked timed out and never holds a wave up.
- **Abort criteria** (``--abort-if``, AWS IoT Jobs ``abortConfig`` style): a per-device condition and how
  many devices may meet it: ``p99>budget``, ``p99>1.2*budget``, ``p99>20`` (ms), ``fps<0.95*target``,
  ``fallback``, ``parity<threshold`` (any device: abort) or with ``@N`` (more than N devices) or ``@P%``
  (more than P% of the devices that finished, once ``min_devices`` have); counters ``errors>1%``,
  ``failed>2``, ``rolled_back>0``, ``timed_out>10%`` compare the count itself.
- **Abort** of a cohort re-publishes, to every device of the cohort that was given the new bundle, a desired
  state naming the bundle it ran before (its artifact from the device's previous desired state, or the
  artifacts this database knows), with a higher version; the reason is stored and shown by ``status``.

Modules: ``rollout_spec`` (the spec, criteria, bundle artifact), ``rollout_view`` (the fleet read from MQTT),
``rollout_store`` (the tables), this one (the controller and the operations; it re-exports the others' names).

Device state is read from MQTT directly (retained birth, death, desired and reported; live telemetry only
when an ``fps`` criterion needs it), not from the collector's database: the collector does not store the
rollout's own topics (``desired``/``reported``), a controller must not depend on a collector being up, and
the retained messages are the authority a device itself acts on. Decisions go to the fleet database
(``edge.fleet.rollout_store``), committed before the desired states they imply are published; every step
re-publishes whatever the broker does not hold yet, so a controller or broker restart loses no decision.
"""

from __future__ import annotations

import fnmatch
import logging
import math
import re
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from edge.fleet.db import FleetDB
from edge.fleet.rollout_ops import set_state, start_rollout, status
from edge.fleet.rollout_spec import (
    CRITERIA_HELP,
    Criterion,
    RolloutBundle,
    RolloutError,
    RolloutFlags,
    RolloutSpec,
    breaches,
    check_url,
    evaluate,
    parse_duration,
    parse_group,
    parse_percent,
    parse_waves,
)
from edge.fleet.rollout_store import FINAL, Assignment, RolloutStore
from edge.fleet.rollout_view import DeviceView, FleetView
from edge.mqtt.desired import HELD_URL, TERMINAL, DesiredState

log = logging.getLogger("edge.fleet.rollout")
_SHA256 = re.compile(r"[0-9a-f]{64}")


# -- the controller --------------------------------------------------------------------------------


def _slim(report: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if report is None:
        return None
    keep = ("state", "bundle_running", "desired_version", "reason", "smoke", "health")
    out = {k: report.get(k) for k in keep if report.get(k) is not None}
    rc = report.get("reference_check")
    if isinstance(rc, dict):
        out["reference_passed"] = rc.get("passed")
    return out


@dataclass
class StepResult:
    rollout_id: str
    state: str
    waiting: str | None = None  # why nothing was decided (no broker, not synced yet)
    events: int = 0  # decisions recorded by this step
    published: int = 0
    pending: int = 0  # devices still expected to answer (new bundle or rollback)
    unconfirmed: int = 0  # desired states the broker does not hold yet
    other_controller: bool = False  # another controller holds the rollout's lease: it publishes

    @property
    def finished(self) -> bool:
        return self.state in FINAL and self.pending == 0 and self.unconfirmed == 0


class RolloutController:
    """Drives one rollout: ``step()`` observes, decides, records, publishes; ``run()`` repeats it.

    Everything it acts on is re-read from the database at every step, so ``pause``/``resume``/``abort``
    from another process take effect at the next step, and a new controller continues where one stopped."""

    def __init__(
        self,
        db: FleetDB,
        rollout_id: str,
        view: FleetView,
        *,
        clock: Callable[[], float] = time.time,
        republish_s: float = 2.0,
        lease_s: float = 15.0,
    ) -> None:
        """``lease_s``: how long this controller holds the rollout after each step; a second controller (a CLI
        ``abort`` beside a running ``start``) waits, and one started after a crash takes over once it ran out."""
        self.db, self.store, self.view, self.rid = db, RolloutStore(db), view, rollout_id
        self.clock, self.republish_s, self.lease_s = clock, republish_s, lease_s
        self.owner = f"{view.client_id}-{secrets.token_hex(3)}"
        self._published_at: dict[str, tuple[int, float]] = {}  # device -> (version, when) of our last publish
        r = self.store.rollout(rollout_id)
        if r is None:
            raise RolloutError(f"no rollout {rollout_id!r} in {db.url}")
        self.fleet = r["fleet"]
        self.spec = RolloutSpec.from_json(r["spec"])
        self.criteria = self.spec.criteria
        if any(c.metric == "fps" for c in self.criteria) and not view.telemetry:
            raise RolloutError(
                f"rollout {rollout_id} has an fps criterion: its FleetView must read telemetry (FleetView(..., telemetry=True))"
            )
        self._events = 0

    # helpers ---------------------------------------------------------------------------------
    def _event(self, kind: str, now: float, **kw: Any) -> None:
        self.store.event(self.rid, kind, now, **kw)
        self._events += 1
        log.info(
            "rollout %s: %s %s %s", self.rid, kind, kw.get("cohort") or kw.get("device") or "", kw.get("reason") or ""
        )

    def _matches(self, dv: DeviceView, cohort: str) -> bool:
        if dv.birth is None or dv.target != cohort:
            return False
        return all(fnmatch.fnmatchcase(dv.field(k) or "", pat) for k, pat in self.spec.groups)

    def _report_for(self, dv: DeviceView | None, version: int | None) -> dict[str, Any] | None:
        if dv is None or dv.reported is None or version is None:
            return None
        r = dv.reported
        return r if r.get("rollout_id") == self.rid and r.get("desired_version") == version else None

    def _prev_artifact(self, dv: DeviceView) -> tuple[str | None, dict[str, Any] | None]:
        running = dv.bundle_id
        if running is None:
            return None, None
        d = dv.desired
        if (
            d is not None
            and d.get("bundle_id") == running
            and isinstance(d.get("artifact_url"), str)
            and isinstance(d.get("sha256"), str)
        ):
            size = d.get("size")
            return running, {
                "url": d["artifact_url"],
                "sha256": d["sha256"],
                "size": size if type(size) is int else None,
            }
        registered = self.store.artifact(running)
        if registered is not None:
            return running, registered
        # no artifact registered anywhere (deployed by hand): the device's store keeps the bundle it runs now as
        # its previous one after the switch, and applies a rollback to it from there (HELD_URL: no download)
        sha = dv.bundle.get("archive_sha256") if dv.bundle.get("id") == running else None
        if isinstance(sha, str) and _SHA256.fullmatch(sha):
            return running, {"url": HELD_URL, "sha256": sha, "size": None}
        return running, None

    def _next_version(self, dv: DeviceView | None, device: str, floor: int = 0) -> int:
        seen = 0 if dv is None else max(dv.desired_version, dv.reported_version)
        return max(seen, floor, self.store.max_version(self.fleet, device)) + 1

    # the step --------------------------------------------------------------------------------
    def step(self) -> StepResult:
        r = self.store.rollout(self.rid)
        if r is None:
            raise RolloutError(f"rollout {self.rid!r} disappeared from {self.db.url}")
        if not self.view.synced.is_set():
            return StepResult(self.rid, r["state"], waiting="broker (not connected, or retained state not read yet)")
        now = self.clock()
        claimed, holder, until = self.store.claim(self.rid, self.owner, now, self.lease_s)
        if not claimed:
            return StepResult(
                self.rid,
                r["state"],
                waiting=f"controller {holder} drives this rollout (lease until {time.strftime('%H:%M:%S', time.localtime(until or 0))})",
                other_controller=True,
            )
        self._events = 0
        snap = self.view.snapshot()
        try:
            state = self._decide(r, snap, now)
            self.db.commit()
        except BaseException:
            self.db.rollback()
            raise
        published, unconfirmed, pending = self._publish(snap, now)
        return StepResult(
            self.rid, state, events=self._events, published=published, pending=pending, unconfirmed=unconfirmed
        )

    def _decide(self, r: dict[str, Any], snap: dict[str, DeviceView], now: float) -> str:
        state: str = r["state"]
        cohorts = self.store.cohorts(self.rid)
        rows = self.store.devices(self.rid)
        for row in rows:
            self._observe(row, snap.get(row["device"]), now)
        if state == "aborting":
            for c in cohorts:
                if c["state"] in ("rolling", "completed"):
                    self._abort_cohort(c, rows, snap, now, f"aborted by request: {r['reason'] or 'no reason given'}")
        for c in cohorts:
            crows = [x for x in rows if x["cohort"] == c["cohort"]]
            if c["state"] == "rolling":
                reason = self._breach(c, crows, snap)
                if reason is not None:
                    self._abort_cohort(c, crows, snap, now, reason)
                elif state == "running":
                    self._advance(c, crows, snap, now)
            elif c["state"] == "completed" and state in ("running", "completed", "partial"):
                self._assign_up_to(c, crows, snap, now, None, late=True)  # newcomers after the last wave
        if state not in FINAL and state != "paused":
            finals = [c["state"] for c in cohorts]
            if all(s != "rolling" for s in finals):
                if state == "aborting" or all(s in ("aborted", "superseded") for s in finals):
                    new = "aborted"
                elif all(s == "completed" for s in finals):
                    new = "completed"
                else:
                    new = "partial"
                reason = (
                    r["reason"]
                    if state == "aborting"
                    else "; ".join(
                        f"{c['cohort']}: {c['state']}" + (f" ({c['reason']})" if c["reason"] else "") for c in cohorts
                    )
                )
                if new == "completed":
                    new, reason = self._on_bundle(rows, reason)
                self.store.set_rollout_state(self.rid, new, reason, now)
                self._event(f"rollout_{new}", now, reason=reason)
                state = new
        return state

    @staticmethod
    def _on_bundle(rows: list[dict[str, Any]], cohorts: str) -> tuple[str, str]:
        """Every cohort completed its waves: "completed" says how many devices run the bundle, and is only said
        when some do (none: "partial", "completed: 0 of 3 devices on the bundle")."""
        active = [x for x in rows if x["state"] != "skipped"]
        on = sum(1 for x in active if x["state"] == "running")
        others = {
            s: sum(1 for x in active if x["state"] == s) for s in ("failed", "rolled-back", "timed-out", "assigned")
        }
        detail = ", ".join(f"{n} {s}" for s, n in others.items() if n)
        reason = (
            f"completed: {on} of {len(active)} devices on the bundle"
            + (f" ({detail})" if detail else "")
            + f"; {cohorts}"
        )
        return ("completed" if on else "partial"), reason

    def _observe(self, row: dict[str, Any], dv: DeviceView | None, now: float) -> None:
        dev = row["device"]
        if row["state"] == "skipped":
            return
        if row["rb_version"] is not None:
            if row["rb_state"] in ("pending", "timed-out"):
                rep = self._report_for(dv, row["rb_version"])
                if rep is not None and rep.get("state") in TERMINAL:
                    code = (rep.get("reason") or {}).get("code")
                    kind = "device_rolled_back" if rep["state"] == "running" else "device_rollback_failed"
                    self.store.update_device(self.rid, dev, now, rb_state=rep["state"], rb_reason=code)
                    self._event(
                        kind,
                        now,
                        cohort=row["cohort"],
                        device=dev,
                        reason=code,
                        detail={"bundle_running": rep.get("bundle_running"), "state": rep["state"]},
                    )
                    row["rb_state"] = rep["state"]
                elif row["rb_state"] == "pending" and now - (row["rb_at"] or now) > self.spec.device_timeout_s:
                    self.store.update_device(self.rid, dev, now, rb_state="timed-out")
                    self._event(
                        "device_rollback_timed_out",
                        now,
                        cohort=row["cohort"],
                        device=dev,
                        reason=f"no answer to the rollback within {self.spec.device_timeout_s:g} s",
                    )
                    row["rb_state"] = "timed-out"
            return
        rep = self._report_for(dv, row["version"])
        if rep is not None and rep.get("state") in TERMINAL and rep["state"] != row["state"]:
            code = (rep.get("reason") or {}).get("code")
            late = row["state"] == "timed-out"
            self.store.update_device(self.rid, dev, now, state=rep["state"], reason=code, report=_slim(rep))
            self._event(
                "device_answered_late" if late else f"device_{rep['state'].replace('-', '_')}",
                now,
                cohort=row["cohort"],
                device=dev,
                reason=code or rep["state"],
                detail={"state": rep["state"], "bundle_running": rep.get("bundle_running")},
            )
            row.update(state=rep["state"], reason=code, report=_slim(rep))
        elif row["state"] == "assigned" and now - row["assigned_at"] > self.spec.device_timeout_s:
            self.store.update_device(
                self.rid, dev, now, state="timed-out", reason=f"no answer within {self.spec.device_timeout_s:g} s"
            )
            self._event(
                "device_timed_out",
                now,
                cohort=row["cohort"],
                device=dev,
                reason=f"no answer within {self.spec.device_timeout_s:g} s",
                detail={
                    "online": dv.online if dv else False,
                    "last_state": dv.reported.get("state") if dv and dv.reported else None,
                },
            )
            row["state"] = "timed-out"

    def _breach(self, c: dict[str, Any], rows: list[dict[str, Any]], snap: dict[str, DeviceView]) -> str | None:
        reports: dict[str, Any] = {}
        tel: dict[str, Any] = {}
        for row in rows:
            dv = snap.get(row["device"])
            reports[row["device"]] = self._report_for(dv, row["version"]) or row["report"]
            tel[row["device"]] = dv.telemetry if dv is not None else None
        for crit in self.criteria:
            why = evaluate(crit, rows, reports, tel, c["bundle_id"], self.spec.min_devices)
            if why is not None:
                return why
        return None

    def _population(
        self, c: dict[str, Any], rows: list[dict[str, Any]], snap: dict[str, DeviceView]
    ) -> tuple[int, list[DeviceView]]:
        have = {x["device"] for x in rows}
        eligible = [dv for d, dv in snap.items() if d not in have and self._matches(dv, c["cohort"])]
        eligible.sort(key=lambda dv: (not dv.online, dv.device))
        n = len([x for x in rows if x["state"] != "skipped"]) + len(eligible)
        return n, eligible

    def _waves(self) -> list[float]:
        return [self.spec.canary, *self.spec.waves]

    def _assign_up_to(
        self,
        c: dict[str, Any],
        rows: list[dict[str, Any]],
        snap: dict[str, DeviceView],
        now: float,
        share: float | None,
        *,
        late: bool = False,
    ) -> int:
        """Assign eligible devices until ``share`` of the cohort has the bundle (None: all of them)."""
        n, eligible = self._population(c, rows, snap)
        wave = int(c["wave"])
        want = n if share is None else min(n, max(1, math.ceil(share * n - 1e-9)))
        have = len([x for x in rows if x["state"] != "skipped"])
        added = 0
        for dv in eligible:
            if have >= want:
                break
            row = self._assign(c, dv, wave, now, late=late)
            rows.append(row)
            if row["state"] != "skipped":
                have += 1
                added += 1
        return added

    def _assign(self, c: dict[str, Any], dv: DeviceView, wave: int, now: float, *, late: bool) -> dict[str, Any]:
        prev_bundle, prev = self._prev_artifact(dv)
        version = self._next_version(dv, dv.device)
        replaces = dv.desired_version or None
        if replaces is not None and replaces >= version:  # pragma: no cover - _next_version is above it
            replaces = None
        if prev_bundle is not None and prev is None:
            why = (
                f"no artifact known for its bundle {prev_bundle}, and its agent did not report the bundle's "
                "archive hash (an older agent), so it could not be rolled back; register one with "
                "--previous-bundle/--previous-url"
            )
            self.store.assign(
                self.rid,
                Assignment(
                    dv.device, c["cohort"], wave, version, replaces, prev_bundle, None, state="skipped", reason=why
                ),
                now,
            )
            self._event("device_skipped", now, cohort=c["cohort"], device=dv.device, reason=why)
            return {"device": dv.device, "state": "skipped"}
        self.store.assign(self.rid, Assignment(dv.device, c["cohort"], wave, version, replaces, prev_bundle, prev), now)
        self._event(
            "device_assigned",
            now,
            cohort=c["cohort"],
            device=dv.device,
            reason="joined after the last wave" if late else f"wave {wave}",
            detail={"version": version, "bundle": c["bundle_id"], "previous": prev_bundle, "online": dv.online},
        )
        return {
            "device": dv.device,
            "state": "assigned",
            "cohort": c["cohort"],
            "version": version,
            "rb_version": None,
            "report": None,
            "assigned_at": now,
        }

    def _advance(self, c: dict[str, Any], rows: list[dict[str, Any]], snap: dict[str, DeviceView], now: float) -> None:
        waves = self._waves()
        wave = int(c["wave"])
        if wave < 0:
            self._start_wave(c, rows, snap, now, 0)
            return
        self._assign_up_to(c, rows, snap, now, waves[wave])  # devices that joined during this wave
        active = [x for x in rows if x["state"] != "skipped"]
        waiting = [x for x in active if x["state"] == "assigned"]
        if waiting or now < (c["wave_started_at"] or now) + self.spec.watch_s:
            return
        answered = [x for x in active if x["state"] in ("running", "failed", "rolled-back")]
        rate = sum(1 for x in answered if x["state"] == "running") / len(answered) if answered else 1.0
        if self.spec.success_rate is not None and rate < self.spec.success_rate - 1e-9:
            self._abort_cohort(
                c,
                rows,
                snap,
                now,
                f"success rate {100 * rate:.1f}% below "
                f"{100 * self.spec.success_rate:g}% after wave {wave} ({len(answered)} device(s) "
                "answered; timed-out ones not counted)",
            )
            return
        if wave + 1 < len(waves):
            self._start_wave(c, rows, snap, now, wave + 1)
        else:
            counts = {
                s: sum(1 for x in active if x["state"] == s) for s in ("running", "failed", "rolled-back", "timed-out")
            }
            self.store.update_cohort(self.rid, c["cohort"], now, state="completed")
            self._event(
                "cohort_completed",
                now,
                cohort=c["cohort"],
                reason=f"{len(active)} device(s) given {c['bundle_id']}",
                detail=counts,
            )
            c["state"] = "completed"

    def _start_wave(
        self, c: dict[str, Any], rows: list[dict[str, Any]], snap: dict[str, DeviceView], now: float, wave: int
    ) -> None:
        share = self._waves()[wave]
        c["wave"], c["wave_started_at"] = wave, now
        self.store.update_cohort(self.rid, c["cohort"], now, wave=wave, wave_started_at=now)
        added = self._assign_up_to(c, rows, snap, now, share)
        n, _ = self._population(c, rows, snap)
        self._event(
            "wave_started",
            now,
            cohort=c["cohort"],
            reason="canary" if wave == 0 else f"wave {wave}",
            detail={
                "wave": wave,
                "share": share,
                "cohort_size": n,
                "assigned_now": added,
                "assigned_total": len([x for x in rows if x["state"] != "skipped"]),
            },
        )

    def _abort_cohort(
        self, c: dict[str, Any], rows: list[dict[str, Any]], snap: dict[str, DeviceView], now: float, reason: str
    ) -> None:
        self.store.update_cohort(self.rid, c["cohort"], now, state="aborted", reason=reason)
        c["state"], c["reason"] = "aborted", reason
        back = 0
        stored = {x["device"]: x for x in self.store.devices(self.rid)}
        for row in rows:
            if row["cohort"] != c["cohort"] or row["state"] == "skipped" or row.get("rb_version") is not None:
                continue
            full = stored[row["device"]]
            dev = row["device"]
            if full["prev_artifact"] is None:
                self.store.update_device(
                    self.rid, dev, now, rb_state="impossible", rb_reason="the device ran no bundle before this rollout"
                )
                self._event(
                    "device_not_rolled_back",
                    now,
                    cohort=c["cohort"],
                    device=dev,
                    reason="the device ran no bundle before this rollout",
                )
                continue
            version = self._next_version(snap.get(dev), dev, floor=int(full["version"]))
            self.store.update_device(
                self.rid, dev, now, rb_version=version, rb_state="pending", rb_reason=None, rb_at=now
            )
            row["rb_version"] = version
            back += 1
        self._event(
            "cohort_aborted",
            now,
            cohort=c["cohort"],
            reason=reason,
            detail={"rolling_back": back, "bundle": c["bundle_id"]},
        )

    # publishing ------------------------------------------------------------------------------
    def _publish(self, snap: dict[str, DeviceView], now: float) -> tuple[int, int, int]:
        """Publish each device's desired state the broker does not hold yet; (published, unconfirmed, pending)."""
        cohorts = {c["cohort"]: c for c in self.store.cohorts(self.rid)}
        published = unconfirmed = pending = 0
        for row in self.store.devices(self.rid):
            if row["state"] == "skipped" or row["rb_state"] == "impossible":
                continue
            if row["rb_version"] is not None:
                version, bundle, art = int(row["rb_version"]), row["prev_bundle"], row["prev_artifact"]
                pending += row["rb_state"] == "pending"
            else:
                c = cohorts[row["cohort"]]
                if c["state"] == "superseded":
                    continue
                version, bundle, art = int(row["version"]), c["bundle_id"], c["artifact"]
                pending += row["state"] == "assigned"
            dv = snap.get(row["device"])
            if dv is not None and dv.desired_version >= version:
                continue  # the broker holds it (or a newer one: another rollout's)
            unconfirmed += 1
            last = self._published_at.get(row["device"])
            if last is not None and last[0] == version and now - last[1] < self.republish_s:
                continue
            d = DesiredState(
                rollout_id=self.rid,
                bundle_id=bundle,
                version=version,
                replaces=row["replaces"] if row["rb_version"] is None else int(row["version"]),
                artifact_url=art["url"],
                sha256=art["sha256"],
                size=art.get("size"),
                # the rollout's budget for the rollback too: the device's old bundle is smoke-tested against the
                # budget the operator gave, not a profile's it never met (the agent does not gate a return to the
                # bundle it ran before on its budget either)
                budget_ms=self.spec.budget_ms,
                watch_s=self.spec.device_watch_s,
            )
            if self.view.publish_desired(row["device"], d.to_json(self.fleet, row["device"])):
                self._published_at[row["device"]] = (version, now)
                published += 1
        return published, unconfirmed, pending

    def release(self) -> None:
        """Give the lease back (a clean stop): another controller may drive the rollout at once."""
        try:
            self.store.release(self.rid, self.owner)
        except Exception as e:  # noqa: BLE001 - the lease then runs out on its own
            if not _db_error(e):
                raise

    def run(
        self,
        *,
        poll_s: float = 0.5,
        timeout_s: float | None = None,
        stop: threading.Event | None = None,
        on_step: Callable[[StepResult], None] | None = None,
        wait_devices: bool = True,
    ) -> StepResult:
        """Step until the rollout is final and every device answered (or timed out; ``wait_devices`` False: until
        the broker holds every desired state), ``stop`` is set, or ``timeout_s`` passed (the rollout then stays as
        it is in the database: ``resume`` continues it)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        stop = stop or threading.Event()
        while True:
            try:
                res = self.step()
            except Exception as e:  # noqa: BLE001 - a database hiccup (locked, connection lost): nothing is lost,
                if not _db_error(e):  # the step was rolled back and is made again from the database
                    raise
                log.warning("rollout %s: database error, retrying the step: %s", self.rid, str(e)[:300])
                stop.wait(poll_s)
                continue
            if on_step is not None:
                on_step(res)
            done = (
                res.finished
                if wait_devices
                else res.state in FINAL and (res.other_controller or (res.unconfirmed == 0 and not res.waiting))
            )
            if done or stop.is_set() or (deadline is not None and time.monotonic() >= deadline):
                self.release()  # a clean stop: `resume` need not wait for the lease to run out
                return res
            stop.wait(poll_s)


def _db_error(e: BaseException) -> bool:
    mod = type(e).__module__ or ""
    return mod.startswith(("sqlite3", "psycopg"))


__all__ = [
    "CRITERIA_HELP",
    "Criterion",
    "DeviceView",
    "FleetView",
    "RolloutBundle",
    "RolloutController",
    "RolloutFlags",
    "RolloutError",
    "RolloutSpec",
    "RolloutStore",
    "StepResult",
    "breaches",
    "check_url",
    "evaluate",
    "parse_duration",
    "parse_group",
    "parse_percent",
    "parse_waves",
    "set_state",
    "start_rollout",
    "status",
]
