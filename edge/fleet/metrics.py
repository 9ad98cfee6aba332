"""Prometheus metrics of the fleet, computed from the collector's database when Prometheus scrapes.

A custom ``prometheus_client`` collector: nothing is counted at ingest, every scrape reads the
``devices`` table (one row per device: its latest telemetry window, bundle, target, state), the latest
birth of each device (what its runner actually uses) and the latest ``state`` message of each device's
session (the rollout it is in, from ``edge.agent``'s reported state). So it is decoupled from ingest,
gives the same answer behind any number of collectors sharing one database, and can run apart from
them (``edgekit fleet metrics --db URL``).

Labels are fleet aggregates, never device ids: ``fleet``, ``target`` (the cohort: a target class),
``bundle``; rollout series add ``rollout``, ``desired_bundle``, ``state`` or ``reason`` (closed sets).
Target, bundle and rollout ids come from devices, so they are checked and bounded: at most
``max_groups`` (fleet, target, bundle) groups and ``max_rollouts`` rollouts per scrape, the rest are
folded into ``other`` (and counted in ``edgekit_fleet_label_overflow``) -- a forged id costs a sample,
never an unbounded label set.

Latency and fps are the distribution across *online* devices of their latest telemetry window, as
summaries (``quantile`` 0 = min, 1 = max, ``_count`` devices, ``_sum``): ``edgekit_latency_p99_seconds{quantile="0.5"}``
is the median device's window p99, ``{quantile="1"}`` the worst device. Stale and offline devices are counted,
not averaged. Every unit is a base unit (seconds), so ``promtool check metrics`` passes (tested).

Rollouts, two views: ``edgekit_rollout_devices`` & co. are what devices report now (their latest state
message); ``edgekit_rollout_cohort_*`` and ``edgekit_rollout_info`` come from the rollout controller's own
tables (``edge.fleet.rollout_facts``) and keep what a rollout did after its devices went back to the old
bundle: an aborted rollout stays aborted, its failures stay counted.

Several collectors on one database: each serves its own counters (``edgekit_collector_*``, labelled
``collector``); the fleet-wide gauges come from the database, so only the process holding the metrics lease
(``metrics_leader`` table, taken at a scrape, held ``lease_s``) serves them -- a ``sum()`` over every
scraped collector counts each device once. ``edgekit_fleet_metrics_leader`` says which one (1) it is.

Metric reference: ``METRICS`` (name -> help); the Grafana dashboard in ``examples/grafana/`` uses
only those names (``tests/fleet/test_fleet_metrics.py`` checks it).
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

from edge.errors import EdgeError, MissingDependencyError
from edge.fleet.db import FleetDB, open_db, redact, scrub
from edge.fleet.rollout_facts import CohortFacts, rollout_facts
from edge.fleet.status import STATUSES, classify

log = logging.getLogger("edge.fleet.metrics")

QUANTILES = (0.0, 0.01, 0.5, 0.9, 0.99, 1.0)
#: reported rollout states (edge.mqtt.desired.STATES) and reason codes (REASONS), copied so the collector host
#: needs no agent import here; tests check they match
ROLLOUT_STATES = (
    "idle",
    "downloading",
    "verifying",
    "smoke-testing",
    "switching",
    "watching",
    "running",
    "rolled-back",
    "failed",
)
OTHER = "other"
_LABEL_OK = re.compile(r"[A-Za-z0-9._:+@=-]{1,128}")
_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
_REASON = re.compile(r"[a-z0-9_]{1,40}")
_KEYS_PER_QUERY = 200  # 4 values per key: 800 parameters, below SQLite's oldest limit of 999

GROUP = ("fleet", "target", "bundle")
METRICS: dict[str, str] = {
    "edgekit_devices": "Devices by status (online, stale, offline, unknown), per fleet, target and bundle.",
    "edgekit_devices_error": "Online devices whose agent reports state 'error' (inference failed).",
    "edgekit_devices_fallback": "Online devices whose runner does not use the device it was asked for "
    "(runner.fallback set, or device_used != device_requested).",
    "edgekit_devices_over_budget": "Online devices whose latest window p99 is over their frame budget.",
    "edgekit_latency_p50_seconds": "Across online devices (summary: quantile, count, sum), their latest "
    "window's p50 latency.",
    "edgekit_latency_p99_seconds": "Across online devices (summary: quantile, count, sum), their latest "
    "window's p99 latency.",
    "edgekit_fps": "Across online devices (summary: quantile, count, sum), their latest window's frames per second.",
    "edgekit_budget_seconds": "The frame budget of the group (the largest its online devices report).",
    "edgekit_budget_miss_ratio": "Budget misses / frames over the online devices' latest windows.",
    "edgekit_rollout_devices": "Devices whose latest reported state belongs to a rollout, by rollout, target, "
    "desired bundle and reported state.",
    "edgekit_rollout_devices_on_desired": "Devices of a rollout that run its desired bundle now.",
    "edgekit_rollout_failures": "Devices of a rollout that rolled back or failed, by reason code.",
    "edgekit_rollout_info": "1 for each rollout (the latest ones), labelled with its state: running, paused, "
    "aborting, completed, partial, aborted (from the rollout controller's tables).",
    "edgekit_rollout_cohort_devices": "Devices a rollout gave its bundle, per cohort (target class), by outcome "
    "(assigned, running, failed, rolled-back, timed-out).",
    "edgekit_rollout_cohort_devices_on_bundle": "Devices of a rollout's cohort that answered running on its "
    "bundle and were not rolled back since.",
    "edgekit_rollout_cohort_failed_devices": "Devices of a rollout's cohort that failed, rolled back or timed "
    "out on its bundle, by reason code; kept after an abort.",
    "edgekit_rollout_cohort_rollbacks": "Rollbacks of a rollout's cohort by outcome (pending, running = back on "
    "the old bundle, failed, rolled-back, timed-out, impossible).",
    "edgekit_rollout_cohort_state": "1 for each cohort of a rollout, labelled with its state (rolling, "
    "completed, aborted, superseded).",
    "edgekit_fleet_metrics_leader": "1 when this process serves the fleet-wide metrics (it holds the metrics "
    "lease of its database), 0 when another process does.",
    "edgekit_fleet_scrape_seconds": "How long reading the fleet database took for this scrape.",
    "edgekit_fleet_scrape_ok": "1 when this scrape read the fleet database, 0 when it failed (see the log).",
    "edgekit_fleet_label_overflow": "Devices folded into the label value 'other' (too many groups or rollouts, "
    "or an id that is not a valid label).",
}
COLLECTOR_METRICS: dict[str, str] = {  # the in-process collector's own counters (fleet collect --metrics-port)
    "edgekit_collector_received": "Messages the collector received.",
    "edgekit_collector_stored": "Messages stored, by kind.",
    "edgekit_collector_duplicates": "Re-delivered messages already stored.",
    "edgekit_collector_rejected": "Messages refused, by reason.",
    "edgekit_collector_ignored": "Messages on the fleet subscription that are not the collector's to store "
    "(the rollout's desired/reported states): expected, not refused.",
    "edgekit_collector_shed": "QoS 0 messages shed while the backlog was full.",
    "edgekit_collector_read_pauses": "Times the collector stopped reading from the broker (backlog full: flow "
    "control, nothing refused).",
    "edgekit_collector_db_errors": "Database errors (each one rolls back and waits for re-delivery).",
    "edgekit_collector_connected": "1 while the collector is connected to its broker.",
}


def label(value: Any) -> str | None:
    """A device-supplied text as a label value when it is a plain id (no spaces, quotes or controls), else None."""
    return value if isinstance(value, str) and _LABEL_OK.fullmatch(value) else None


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default) of a non-empty sorted sequence."""
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass(frozen=True)
class RolloutView:
    """What a device's latest state message says about the rollout it is in (checked, closed sets)."""

    rollout_id: str
    desired_bundle: str | None
    state: str
    reason: str | None

    @classmethod
    def parse(cls, payload: Any) -> RolloutView | None:
        """From a stored ``state`` payload (text); None when it names no rollout or is not well formed."""
        try:
            obj = json.loads(payload) if isinstance(payload, str) else None
        except (ValueError, RecursionError):
            return None
        r = obj.get("rollout") if isinstance(obj, dict) else None
        if not isinstance(r, dict):
            return None
        rid, state = r.get("rollout_id"), r.get("state")
        if not isinstance(rid, str) or not _ID.fullmatch(rid) or state not in ROLLOUT_STATES:
            return None
        desired = r.get("desired_bundle")
        reason = r.get("reason")
        return cls(
            rid,
            desired if isinstance(desired, str) and _ID.fullmatch(desired) else None,
            state,
            reason if isinstance(reason, str) and _REASON.fullmatch(reason) else None,
        )


def runner_fallback(payload: Any) -> bool | None:
    """From a stored birth payload: does the runner compute elsewhere than asked? None: no runner in it."""
    try:
        obj = json.loads(payload) if isinstance(payload, str) else None
    except (ValueError, RecursionError):
        return None
    runner = obj.get("runner") if isinstance(obj, dict) else None
    if not isinstance(runner, dict):
        return None
    if isinstance(runner.get("fallback"), str) and runner["fallback"]:
        return True
    asked, used = runner.get("device_requested"), runner.get("device_used")
    if isinstance(asked, str) and isinstance(used, str):
        return asked != used
    return False


@dataclass
class _Group:
    counts: dict[str, int] = field(default_factory=lambda: {s: 0 for s in STATUSES})
    error: int = 0
    fallback: int = 0
    over_budget: int = 0
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    fps: list[float] = field(default_factory=list)
    budget: float | None = None
    misses: int = 0
    frames: int = 0


@dataclass
class _Rollout:
    states: dict[str, int] = field(default_factory=dict)
    on_desired: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


@dataclass
class FleetSnapshot:
    """The fleet's aggregates at one moment; ``families()`` turns it into Prometheus metric families."""

    groups: dict[tuple[str, str, str], _Group] = field(default_factory=dict)
    # (fleet, rollout, target, desired bundle) -> states
    rollouts: dict[tuple[str, str, str, str], _Rollout] = field(default_factory=dict)
    cohorts: list[CohortFacts] = field(default_factory=list)  # what each rollout did (the controller's tables)
    devices: int = 0
    overflow: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # of the reading thread (SQLite's work included): apart from how loaded the host is

    def families(self, ok: bool = True, leader: bool = True) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily, Metric

        def gauge(name: str, labels: Sequence[str]) -> Any:
            return GaugeMetricFamily(name, METRICS[name], labels=list(labels))

        yield GaugeMetricFamily("edgekit_fleet_metrics_leader", METRICS["edgekit_fleet_metrics_leader"], int(leader))
        yield GaugeMetricFamily("edgekit_fleet_scrape_ok", METRICS["edgekit_fleet_scrape_ok"], value=int(ok))
        if not leader:  # another process serves the fleet's gauges: a sum over both counts each device once
            return

        devices = gauge("edgekit_devices", (*GROUP, "status"))
        error, fallback, over = (
            gauge(n, GROUP)
            for n in ("edgekit_devices_error", "edgekit_devices_fallback", "edgekit_devices_over_budget")
        )
        p50, p99, fps = (
            Metric(n, METRICS[n], "summary")
            for n in ("edgekit_latency_p50_seconds", "edgekit_latency_p99_seconds", "edgekit_fps")
        )
        budget, miss = gauge("edgekit_budget_seconds", GROUP), gauge("edgekit_budget_miss_ratio", GROUP)
        for key, g in sorted(self.groups.items()):
            k = list(key)
            for status, n in g.counts.items():
                devices.add_metric([*k, status], n)
            error.add_metric(k, g.error)
            fallback.add_metric(k, g.fallback)
            over.add_metric(k, g.over_budget)
            for fam, values, scale in ((p50, g.p50, 1e-3), (p99, g.p99, 1e-3), (fps, g.fps, 1.0)):
                if not values:
                    continue
                values.sort()
                lab = dict(zip(GROUP, k))
                for q in QUANTILES:
                    fam.add_sample(fam.name, {**lab, "quantile": _q(q)}, quantile(values, q) * scale)
                fam.add_sample(fam.name + "_count", lab, len(values))
                fam.add_sample(fam.name + "_sum", lab, sum(values) * scale)
            if g.budget is not None:
                budget.add_metric(k, g.budget / 1000.0)
            if g.frames:
                miss.add_metric(k, g.misses / g.frames)
        rlabels = ("fleet", "rollout", "target", "desired_bundle")
        rdev = gauge("edgekit_rollout_devices", (*rlabels, "state"))
        ron = gauge("edgekit_rollout_devices_on_desired", rlabels)
        rfail = gauge("edgekit_rollout_failures", (*rlabels, "reason"))
        for rkey, r in sorted(self.rollouts.items()):
            k = list(rkey)
            for state in ROLLOUT_STATES:
                rdev.add_metric([*k, state], r.states.get(state, 0))
            ron.add_metric(k, r.on_desired)
            for reason, n in sorted(r.reasons.items()):
                rfail.add_metric([*k, reason], n)
        yield from (devices, error, fallback, over, p50, p99, fps, budget, miss, rdev, ron, rfail)
        yield from self._rollout_families()
        yield GaugeMetricFamily(
            "edgekit_fleet_scrape_seconds", METRICS["edgekit_fleet_scrape_seconds"], value=self.seconds
        )
        yield GaugeMetricFamily(
            "edgekit_fleet_label_overflow", METRICS["edgekit_fleet_label_overflow"], value=self.overflow
        )

    def _rollout_families(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        def gauge(name: str, labels: Sequence[str]) -> Any:
            return GaugeMetricFamily(name, METRICS[name], labels=list(labels))

        info = gauge("edgekit_rollout_info", ("fleet", "rollout", "state"))
        clabels = ("fleet", "rollout", "target", "bundle")
        cdev = gauge("edgekit_rollout_cohort_devices", (*clabels, "outcome"))
        con = gauge("edgekit_rollout_cohort_devices_on_bundle", clabels)
        cfail = gauge("edgekit_rollout_cohort_failed_devices", (*clabels, "reason"))
        crb = gauge("edgekit_rollout_cohort_rollbacks", (*clabels, "state"))
        cstate = gauge("edgekit_rollout_cohort_state", (*clabels, "state"))
        seen: set[str] = set()
        for f in self.cohorts:
            if f.rollout not in seen:
                seen.add(f.rollout)
                info.add_metric([f.fleet, f.rollout, f.rollout_state], 1)
            k = [f.fleet, f.rollout, label(f.cohort) or OTHER, label(f.bundle) or OTHER]
            for outcome in ("assigned", "running", "failed", "rolled-back", "timed-out"):
                cdev.add_metric([*k, outcome], f.outcomes.get(outcome, 0))
            con.add_metric(k, f.on_bundle)
            for reason, n in sorted(f.failed.items()):
                cfail.add_metric([*k, reason], n)
            for state, n in sorted(f.rollback.items()):
                crb.add_metric([*k, state], n)
            cstate.add_metric([*k, f.state], 1)
        yield from (info, cdev, con, cfail, crb, cstate)


def _q(q: float) -> str:
    return f"{q:g}"


_DEVICES = (
    "SELECT d.fleet, d.device, d.online, d.last_seen, d.interval_s, d.bundle_id, d.target, d.state, d.fps, "
    "d.p50_ms, d.p99_ms, d.budget_ms, d.misses, d.frames, d.session, d.connection, d.last_session, "
    "(SELECT max(b.seq) FROM births b WHERE b.fleet = d.fleet AND b.device = d.device AND b.session = d.session "
    "AND b.connection = d.connection) AS birth_seq, "
    "(SELECT max(s.seq) FROM states s WHERE s.fleet = d.fleet AND s.device = d.device "
    "AND s.session = d.last_session) AS state_seq FROM devices d"
)


class FleetReader:
    """Reads a ``FleetSnapshot`` from a fleet database. Keeps the parsed latest birth and state of each device
    (keyed by their stream position, so only new ones are parsed again): a steady fleet costs one query."""

    def __init__(
        self,
        *,
        fleet: str | None = None,
        stale_factor: float = 3.0,
        min_stale_s: float = 15.0,
        max_groups: int = 500,
        max_rollouts: int = 100,
    ) -> None:
        self.fleet, self.stale_factor, self.min_stale_s = fleet, stale_factor, min_stale_s
        self.max_groups, self.max_rollouts = max_groups, max_rollouts
        self._births: dict[tuple[str, str], tuple[tuple[Any, ...], bool | None]] = {}
        self._states: dict[tuple[str, str], tuple[tuple[Any, ...], RolloutView | None]] = {}
        self._labels: dict[Any, str | None] = {}  # device-supplied text -> its label value, per read

    def _latest(
        self, db: FleetDB, table: str, column: str, wanted: list[tuple[Any, ...]], parse: Callable[[Any], Any]
    ) -> dict[tuple[Any, ...], Any]:
        """``parse(payload)`` of the rows of ``table`` at the (fleet, device, session, <column>) keys given."""
        out: dict[tuple[Any, ...], Any] = {}
        for i in range(0, len(wanted), _KEYS_PER_QUERY):
            chunk = wanted[i : i + _KEYS_PER_QUERY]
            # a join with the keys as a table: SQLite scans the whole table for a row-value IN (VALUES ...)
            rows = db.execute(
                "WITH k(f, d, s, p) AS (VALUES " + ", ".join(["(?, ?, ?, ?)"] * len(chunk)) + ") "
                f"SELECT t.fleet, t.device, t.session, t.{column}, t.payload FROM k JOIN {table} t "
                f"ON t.fleet = k.f AND t.device = k.d AND t.session = k.s AND t.{column} = k.p",
                [v for key in chunk for v in key],
            ).fetchall()
            for fleet, device, session, pos, payload in rows:
                out[(fleet, device, int(session), int(pos))] = parse(payload)
        return out

    def read(self, db: FleetDB, now: float | None = None) -> FleetSnapshot:
        t0, c0 = time.perf_counter(), time.thread_time()
        now = time.time() if now is None else now
        where, params = (" WHERE d.fleet = ?", (self.fleet,)) if self.fleet else ("", ())
        rows = db.query(_DEVICES + where, params)
        # the latest birth (runner facts) and state (rollout) of each device: parse only what changed
        need_births, need_states = [], []
        for r in rows:
            dk = (r["fleet"], r["device"])
            if r["birth_seq"] is not None:
                bk = (r["fleet"], r["device"], int(r["session"]), int(r["connection"]), int(r["birth_seq"]))
                if self._births.get(dk, ((),))[0] != bk:
                    need_births.append(bk)
            if r["state_seq"] is not None:
                sk = (r["fleet"], r["device"], int(r["last_session"]), int(r["state_seq"]))
                if self._states.get(dk, ((),))[0] != sk:
                    need_states.append(sk)
        births = self._births_at(db, need_births)
        states = self._latest(db, "states", "seq", need_states, RolloutView.parse)
        cohorts = rollout_facts(db, fleet=self.fleet, limit=self.max_rollouts)
        if db.dialect == "postgresql":
            db.rollback()  # end the read transaction: no snapshot held between scrapes
        births_now: dict[tuple[str, str], tuple[tuple[Any, ...], bool | None]] = {}
        states_now: dict[tuple[str, str], tuple[tuple[Any, ...], RolloutView | None]] = {}
        snap = FleetSnapshot(devices=len(rows), cohorts=cohorts)
        self._labels = {}
        for r in rows:
            dk = (r["fleet"], r["device"])
            if r["birth_seq"] is not None:
                bk = (r["fleet"], r["device"], int(r["session"]), int(r["connection"]), int(r["birth_seq"]))
                births_now[dk] = (bk, births[bk]) if bk in births else self._births.get(dk, (bk, None))
            if r["state_seq"] is not None:
                sk = (r["fleet"], r["device"], int(r["last_session"]), int(r["state_seq"]))
                states_now[dk] = (sk, states[sk]) if sk in states else self._states.get(dk, (sk, None))
            elif dk in self._states:  # a new session with no state message yet: the last one known stands
                states_now[dk] = self._states[dk]
            self._add(snap, r, now, births_now.get(dk, ((), None))[1], states_now.get(dk, ((), None))[1])
        self._births, self._states = births_now, states_now  # devices gone from the table are forgotten
        snap.seconds, snap.cpu_seconds = time.perf_counter() - t0, time.thread_time() - c0
        return snap

    def _births_at(self, db: FleetDB, keys: list[tuple[Any, ...]]) -> dict[tuple[Any, ...], bool | None]:
        out: dict[tuple[Any, ...], bool | None] = {}
        for i in range(0, len(keys), _KEYS_PER_QUERY // 2):
            chunk = keys[i : i + _KEYS_PER_QUERY // 2]
            rows = db.execute(
                "WITH k(f, d, s, c, q) AS (VALUES "
                + ", ".join(["(?, ?, ?, ?, ?)"] * len(chunk))
                + ") SELECT b.fleet, b.device, b.session, b.connection, b.seq, b.payload FROM k "
                "JOIN births b ON b.fleet = k.f AND b.device = k.d AND b.session = k.s "
                "AND b.connection = k.c AND b.seq = k.q",
                [v for key in chunk for v in key],
            ).fetchall()
            for fleet, device, session, connection, seq, payload in rows:
                out[(fleet, device, int(session), int(connection), int(seq))] = runner_fallback(payload)
        return out

    def _add(
        self, snap: FleetSnapshot, r: dict[str, Any], now: float, fallback: bool | None, rollout: RolloutView | None
    ) -> None:
        fleet = r["fleet"]  # checked by the collector (edge.mqtt.topics.check_part): a label as it is
        labels = self._labels
        target = labels[r["target"]] if r["target"] in labels else labels.setdefault(r["target"], label(r["target"]))
        bundle = (
            labels[r["bundle_id"]]
            if r["bundle_id"] in labels
            else labels.setdefault(r["bundle_id"], label(r["bundle_id"]))
        )
        folded = (r["target"] is not None and target is None) or (r["bundle_id"] is not None and bundle is None)
        key = (fleet, OTHER, OTHER) if folded else (fleet, target or "unknown", bundle or "none")
        if key not in snap.groups and len(snap.groups) >= self.max_groups:
            key, folded = (fleet, OTHER, OTHER), True
        snap.overflow += folded
        g = snap.groups.get(key)
        if g is None:
            g = snap.groups[key] = _Group()
        status = classify(r, now, stale_factor=self.stale_factor, min_stale_s=self.min_stale_s)
        g.counts[status] += 1
        if rollout is not None:
            self._add_rollout(snap, fleet, key[1], r["bundle_id"], rollout)
        if status != "online":
            return
        if r["state"] == "error":
            g.error += 1
        if fallback:
            g.fallback += 1
        p50, p99, fps, budget = _finite(r["p50_ms"]), _finite(r["p99_ms"]), _finite(r["fps"]), _finite(r["budget_ms"])
        if p50 is not None:
            g.p50.append(p50)
        if p99 is not None:
            g.p99.append(p99)
            if budget is not None and p99 > budget:
                g.over_budget += 1
        if fps is not None:
            g.fps.append(fps)
        if budget is not None and (g.budget is None or budget > g.budget):
            g.budget = budget
        misses, frames = r["misses"], r["frames"]
        if isinstance(frames, int) and isinstance(misses, int) and 0 <= misses <= frames:
            g.misses += misses
            g.frames += frames

    def _add_rollout(self, snap: FleetSnapshot, fleet: str, target: str, running: Any, v: RolloutView) -> None:
        key = (fleet, v.rollout_id, target, v.desired_bundle or "none")
        r = snap.rollouts.get(key)
        if r is None:
            if len({k[:2] for k in snap.rollouts} | {key[:2]}) > self.max_rollouts:
                key = (fleet, OTHER, target, OTHER)
                snap.overflow += 1
                r = snap.rollouts.get(key)
            if r is None:
                r = snap.rollouts[key] = _Rollout()
        r.states[v.state] = r.states.get(v.state, 0) + 1
        if v.desired_bundle is not None and running == v.desired_bundle:
            r.on_desired += 1
        if v.state in ("rolled-back", "failed"):
            reason = v.reason or "unknown"
            r.reasons[reason] = r.reasons.get(reason, 0) + 1


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and -1e300 < v < 1e300 else None


_LEADER_TABLE = (
    "CREATE TABLE IF NOT EXISTS metrics_leader (name TEXT PRIMARY KEY, owner TEXT NOT NULL, "
    "lease_until DOUBLE PRECISION NOT NULL)"
)
_CLAIM = (
    "INSERT INTO metrics_leader (name, owner, lease_until) VALUES ('fleet', ?, ?) ON CONFLICT (name) DO UPDATE "
    "SET owner = excluded.owner, lease_until = excluded.lease_until "
    "WHERE metrics_leader.owner = excluded.owner OR metrics_leader.lease_until < ?"
)


class FleetCollector:
    """The ``prometheus_client`` collector: one database connection (opened on the first scrape, reopened after
    an error), scrapes serialized. A failed read answers ``edgekit_fleet_scrape_ok 0``, logged, not a 500.

    Several processes serving metrics of one database (collectors with ``--metrics-port``, ``fleet metrics``):
    at each scrape each tries to take (or renew) the database's metrics lease for ``lease_s``; only the holder
    reads and serves the fleet-wide gauges, the others ``edgekit_fleet_metrics_leader 0``. A holder that stops
    cleanly gives the lease back; one that dies loses it ``lease_s`` after its last scrape."""

    def __init__(self, db_url: str, *, owner: str | None = None, lease_s: float = 60.0, **reader: Any) -> None:
        self.db_url = db_url
        self.reader = FleetReader(**reader)
        self._db: FleetDB | None = None
        self._lock = threading.RLock()
        self.last: FleetSnapshot | None = None
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self.lease_s = lease_s
        self.leader = False

    def _lead(self, db: FleetDB) -> bool:
        now = time.time()
        db.execute(_CLAIM, (self.owner, now + self.lease_s, now))
        row = db.execute("SELECT owner FROM metrics_leader WHERE name = 'fleet'").fetchone()
        db.commit()
        return bool(row) and row[0] == self.owner

    def describe(self) -> list[Any]:
        return []  # registering must not query the database; the names are in METRICS

    def collect(self) -> Iterable[Any]:
        with self._lock:
            try:
                if self._db is None:
                    self._db = open_db(self.db_url, must_exist=True)
                    if self._db.dialect == "sqlite":  # pages shared with the OS cache: a write by the collector
                        self._db.execute("PRAGMA mmap_size = 1073741824")  # between scrapes costs no re-read
                    self._db.execute(_LEADER_TABLE)
                    self._db.commit()
                self.leader = self._lead(self._db)
                snap = self.reader.read(self._db) if self.leader else FleetSnapshot()
                ok = True
            except Exception as e:  # a database error or a bug: said in the scrape and the log, never a 500
                log.error("fleet metrics: cannot read %s: %s", redact(self.db_url), scrub(str(e), self.db_url))
                self.close()
                snap, ok = FleetSnapshot(), False
            self.last = snap
        return list(snap.families(ok, self.leader or not ok))

    def close(self) -> None:
        with self._lock:
            db, self._db = self._db, None
        if db is not None:
            try:
                if self.leader:  # a clean stop hands the lease on at once
                    db.execute("DELETE FROM metrics_leader WHERE owner = ?", (self.owner,))
                    db.commit()
                self.leader = False
            except Exception:  # noqa: BLE001 - the lease then runs out on its own
                pass
            try:
                db.close()
            except Exception:  # pragma: no cover - the connection is gone already
                pass


class CollectorStats:
    """The counters of an in-process ``edge.fleet.collector.Collector`` as Prometheus counters."""

    def __init__(self, collector: Any) -> None:
        self.collector = collector

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        c = self.collector
        try:
            s = c.snapshot()
        except Exception:  # stopped: its loop is gone
            return []
        m = COLLECTOR_METRICS

        who = collector_label(c)

        def counter(name: str, value: float | None = None, labels: Sequence[str] = ()) -> Any:
            fam = CounterMetricFamily(name, m[name], labels=["collector", *labels])
            if value is not None:
                fam.add_metric([who], value)
            return fam

        stored = counter("edgekit_collector_stored", labels=["kind"])
        for kind, n in s["stored"].items():
            stored.add_metric([who, kind], n)
        rejected = counter("edgekit_collector_rejected", labels=["reason"])
        for reason, n in s["rejected"].items():
            rejected.add_metric([who, reason], n)
        connected = GaugeMetricFamily(
            "edgekit_collector_connected", m["edgekit_collector_connected"], labels=["collector"]
        )
        connected.add_metric([who], int(bool(c.connected)))
        return [
            counter("edgekit_collector_received", s["received"]),
            stored,
            counter("edgekit_collector_duplicates", s["duplicates"]),
            rejected,
            counter("edgekit_collector_ignored", s.get("ignored", 0)),
            counter("edgekit_collector_shed", s.get("shed", 0)),
            counter("edgekit_collector_read_pauses", s.get("read_pauses", 0)),
            counter("edgekit_collector_db_errors", s["db_errors"]),
            connected,
        ]


def collector_label(collector: Any) -> str:
    """The ``collector`` label of a collector's counters: its MQTT client id, as a label value."""
    cid = str(getattr(getattr(collector, "config", None), "client_id", None) or "collector")
    return re.sub(r"[^A-Za-z0-9._:+@=-]", "_", cid)[:128]


def registry(db_url: str, *, collector: Any = None, **reader: Any) -> tuple[Any, FleetCollector]:
    """A ``CollectorRegistry`` with the fleet metrics (and the collector's counters when given one)."""
    try:
        from prometheus_client import CollectorRegistry
    except ImportError:
        raise MissingDependencyError(
            "Prometheus metrics need prometheus_client", hint="pip install 'edgekit-ml[fleet]'"
        ) from None
    reg = CollectorRegistry(auto_describe=False)
    fleet = FleetCollector(db_url, **reader)
    reg.register(fleet)
    if collector is not None:
        reg.register(CollectorStats(collector))
    return reg, fleet


class MetricsServer:
    """``/metrics`` over HTTP on a thread (prometheus_client's WSGI server); ``close()`` stops it and its database."""

    def __init__(
        self, db_url: str, *, port: int, addr: str = "127.0.0.1", collector: Any = None, **reader: Any
    ) -> None:
        if not 0 <= port <= 65535:
            raise EdgeError(f"metrics port {port} is not between 0 and 65535")
        self.registry, self.fleet = registry(db_url, collector=collector, **reader)
        from prometheus_client import start_http_server

        try:
            self._httpd, self._thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as e:
            self.fleet.close()
            raise EdgeError(
                f"cannot serve metrics on {addr}:{port}: {e.strerror or e}",
                hint="choose another --metrics-port / --port, or --metrics-addr",
            ) from None
        self.addr, self.port = addr, int(self._httpd.server_port)

    def add_collector(self, collector: Any) -> None:
        """Also serve the counters of an in-process collector (started after this server)."""
        self.registry.register(CollectorStats(collector))

    @property
    def url(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5.0)
        self.fleet.close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
