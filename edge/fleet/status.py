"""``edgekit fleet status``: one row per device from the collector's store.

A device is ``online`` when its latest birth is not followed by a matching death and it
was heard from within ``stale_factor`` telemetry intervals (at least ``min_stale_s``);
``stale`` when it is online by the books but silent for longer; ``offline`` after a death
(clean shutdown or last will); ``unknown`` when telemetry arrived but no birth yet.

``flag`` (or None) says when the collector refused a stream of the device for a sequence jump (a forged or
broken sender, ``Collector.max_seq_jump``): the row shows the device's real stream, the flag that someone tried.
``key`` (or None) is the device's pinned identity key (``edge.fleet.device_keys``) and the births and deaths refused
against it (``refused``: a forger without the device's key, or a reinstalled device that needs ``fleet trust-key``).
"""

from __future__ import annotations

import time
from typing import Any

from edge.fleet.db import open_db
from edge.mqtt.identity import BadSignedMessage, key_id, parse_key_text

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


def fleet_status(
    db_url: str,
    *,
    fleet: str | None = None,
    now: float | None = None,
    stale_factor: float = 3.0,
    min_stale_s: float = 15.0,
) -> list[dict[str, Any]]:
    now = time.time() if now is None else now
    with open_db(db_url, must_exist=True) as db:
        where, params = ("WHERE fleet = ?", (fleet,)) if fleet else ("", ())
        # one query, one pass (10,000 devices in well under 200 ms): the devices, each with its streams' gaps
        # summed as floating point: a device may have any number of sessions, and SQLite's integer sum()
        # raises "integer overflow" past 2**63 instead of giving a number
        rows = db.query(
            f"SELECT d.*, g.gap_missing, g.gap_received, f.reason AS flag_reason, f.session AS flag_session, "
            f"f.refused AS flag_refused, f.max_seq AS flag_max_seq, f.stream_seq AS flag_stream_seq, "
            f"f.last_at AS flag_at, k.key AS key_key, k.pinned_at AS key_pinned_at, k.pinned_by AS key_pinned_by, "
            f"k.refused AS key_refused, k.refused_reason AS key_refused_reason, k.refused_key AS key_refused_key, "
            f"k.refused_at AS key_refused_at FROM devices d LEFT JOIN (SELECT fleet, device, "
            f"sum(CASE WHEN max_seq > announced_seq AND max_seq > received THEN CAST(max_seq - received AS DOUBLE "
            f"PRECISION) WHEN announced_seq > received THEN CAST(announced_seq - received AS DOUBLE PRECISION) "
            f"ELSE 0 END) AS gap_missing, sum(CAST(received AS DOUBLE PRECISION)) AS gap_received FROM streams "
            f"{where} GROUP BY fleet, device) g ON g.fleet = d.fleet AND g.device = d.device "
            f"LEFT JOIN stream_flags f ON f.fleet = d.fleet AND f.device = d.device "
            f"LEFT JOIN device_keys k ON k.fleet = d.fleet AND k.device = d.device "
            f"{where.replace('fleet', 'd.fleet')} ORDER BY d.fleet, d.device",
            params * 2,
        )
    out = []
    for r in rows:
        for k in ("online", "throttled"):
            if r.get(k) is not None:
                r[k] = bool(r[k])
        r["status"] = classify(r, now, stale_factor=stale_factor, min_stale_s=min_stale_s)
        r["seen_ago_s"] = None if r.get("last_seen") is None else round(now - r["last_seen"], 1)
        r["missing"], r["messages"] = int(r.pop("gap_missing") or 0), int(r.pop("gap_received") or 0)
        flag = {
            k[5:]: r.pop(k)
            for k in ("flag_reason", "flag_session", "flag_refused", "flag_max_seq", "flag_stream_seq", "flag_at")
        }
        r["flag"] = (
            None
            if flag["reason"] is None
            else {
                **flag,
                "summary": f"{flag['refused']} message(s) of session {flag['session']} refused: seq up to "
                f"{flag['max_seq']} where the stream was at {flag['stream_seq']}",
            }
        )
        r["key"] = _key(r)
        out.append(r)
    return out


_KEY_COLUMNS = ("key", "pinned_at", "pinned_by", "refused", "refused_reason", "refused_key", "refused_at")


def _key(r: dict[str, Any]) -> dict[str, Any] | None:
    """The device's pin and what was refused against it (the row's ``key_*`` columns, taken out of ``r``)."""
    k = {c: r.pop("key_" + c) for c in _KEY_COLUMNS}
    if k["key"] is None:
        return None
    try:
        kid = key_id(parse_key_text(k["key"]))
    except BadSignedMessage:
        kid = "damaged"
    out = {"key": k["key"] if kid != "damaged" else None, "key_id": kid, "pinned_at": k["pinned_at"]}
    out["pinned_by"], out["refused"] = k["pinned_by"], int(k["refused"] or 0)
    if out["refused"]:
        claimed = k["refused_key"]
        try:
            claimed = key_id(parse_key_text(claimed)) if claimed else "none"
        except BadSignedMessage:
            claimed = "damaged"
        out["last_refused"] = {"reason": k["refused_reason"], "key_id": claimed, "at": k["refused_at"]}
        out["summary"] = (
            f"{out['refused']} birth/death message(s) refused ({k['refused_reason']}, signed by {claimed}); "
            f"pinned key {kid}"
        )
    return out


def rollout_summary(db_url: str, *, fleet: str | None = None, limit: int = 5) -> list[dict[str, Any]]:
    """The latest ``limit`` rollouts' cohorts as the controller recorded them (``edge.fleet.rollout_facts``): the
    bundle, devices given it and on it now, failures by reason, rollbacks, states. Kept after an abort, when the
    devices' own rows show them back on their old bundle."""
    from edge.fleet.rollout_facts import rollout_facts

    with open_db(db_url, must_exist=True) as db:
        return [f.as_dict() for f in rollout_facts(db, fleet=fleet, limit=limit)]


def rollout_line(f: dict[str, Any]) -> str:
    """One line for a rollout's cohort: ``r1 x86-cpu -> b2: aborted (cohort aborted), 0 of 2 on it, ...``."""
    parts = [f"{f['on_bundle']} of {f['assigned']} devices on it"]
    if f["failed"]:
        parts.append("failed: " + ", ".join(f"{k} {v}" for k, v in sorted(f["failed"].items())))
    if f["rollback"]:
        parts.append("rollbacks: " + ", ".join(f"{k} {v}" for k, v in sorted(f["rollback"].items())))
    return f"{f['rollout']} {f['cohort']} -> {f['bundle']}: {f['rollout_state']} (cohort {f['state']}); " + "; ".join(
        parts
    )


def summarize(rows: list[dict[str, Any]]) -> dict[str, int]:
    counts = {s: 0 for s in STATUSES}
    for r in rows:
        counts[r["status"]] += 1
    counts["devices"] = len(rows)
    return counts
