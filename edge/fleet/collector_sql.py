"""The collector's SQL statements (portable: SQLite and PostgreSQL) and their parameter types."""

from __future__ import annotations

from edge.fleet.decode import TELEMETRY_METRICS
from edge.mqtt.topics import STREAM_KINDS as STREAM_KINDS  # declared once there; the writer reads it here

# a session's connections count up by one a reconnect: a birth or death of the row's session more than this far
# below the row's connection means the row's is not the device's (a forged connection 2**53-1 once won for good)
CONNECTION_REWIND = 16
NEWER = (
    "devices.session IS NULL OR devices.session < excluded.session OR "
    "(devices.session = excluded.session AND (devices.connection <= excluded.connection OR "
    f"excluded.connection + {CONNECTION_REWIND} < devices.connection))"
)
INSERT_TELEMETRY = (
    "INSERT INTO telemetry (fleet, device, session, seq, ts, received_at, historical, fps, p50_ms, p99_ms, max_ms, "
    "misses, frames, cpu_percent, rss_mb, temp_c, payload) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT DO NOTHING"
)
INSERT_STATE = (
    "INSERT INTO states (fleet, device, session, seq, ts, received_at, historical, state, detail, payload) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)
UPSERT_STREAM = (  # n new messages of one stream, the highest seq among them
    "INSERT INTO streams (fleet, device, session, received, max_seq, announced_seq, updated_at) "
    "VALUES (?, ?, ?, ?, ?, 0, ?) ON CONFLICT (fleet, device, session) DO UPDATE SET "
    "received = streams.received + excluded.received, updated_at = excluded.updated_at, max_seq = CASE WHEN "
    "excluded.max_seq > streams.max_seq THEN excluded.max_seq ELSE streams.max_seq END"
)
UPSERT_SEEN = (
    "INSERT INTO devices (fleet, device, last_seen) VALUES (?, ?, ?) ON CONFLICT (fleet, device) "
    "DO UPDATE SET last_seen = excluded.last_seen "
    "WHERE devices.last_seen IS NULL OR devices.last_seen < excluded.last_seen"
)
NEWER_SEQ = (
    "fleet = ? AND device = ? AND (last_session IS NULL OR last_session < ? OR (last_session = ? AND last_seq < ?))"
)
UPDATE_TELEMETRY = (
    "UPDATE devices SET last_session = ?, last_seq = ?, last_ts = ?, fps = ?, p50_ms = ?, p99_ms = ?, "
    "max_ms = ?, misses = ?, frames = ?, cpu_percent = ?, rss_mb = ?, temp_c = ?, budget_ms = ?, "
    "throttled = ?, spool_pending = ?, spool_dropped = ?, interval_s = coalesce(?, interval_s), "
    "bundle_id = coalesce(?, bundle_id) WHERE " + NEWER_SEQ
)  # the values in TELEMETRY_METRICS order
UPDATE_STATE = (
    "UPDATE devices SET last_session = ?, last_seq = ?, last_ts = ?, state = ?, state_detail = ? WHERE " + NEWER_SEQ
)
# PostgreSQL column types of the statements' parameters, in order (``FleetDB.bulk`` sends them as arrays)
STATE_TYPES = ("text", "text", "bigint", "bigint", "float8", "float8", "boolean", "text", "text", "text")
STREAM_TYPES = ("text", "text", "bigint", "bigint", "bigint", "float8")
SEEN_TYPES = ("text", "text", "float8")
WHERE_TYPES = ("text", "text", "bigint", "bigint", "bigint")
UPDATE_TELEMETRY_TYPES = (
    "bigint",
    "bigint",
    "float8",
    "float8",
    "float8",
    "float8",
    "float8",
    "bigint",
    "bigint",
    "float8",
    "float8",
    "float8",
    "float8",
    "boolean",
    "bigint",
    "bigint",
    "float8",
    "text",
    *WHERE_TYPES,
)
UPDATE_STATE_TYPES = ("bigint", "bigint", "float8", "text", "text", *WHERE_TYPES)


def seen_upsert(columns: tuple[str, ...]) -> str:
    """``UPSERT_SEEN`` and ``UPDATE_TELEMETRY``/``UPDATE_STATE`` in one statement: last_seen when later, the
    columns when the message is past the row's (session, seq); interval_s and bundle_id kept when null."""
    # a row value comparison (SQLite 3.15+, PostgreSQL) and the alias d: the statement stays under psycopg's 4 KB
    # cache limit, past which it re-parses the query text on every execution (2.5 ms a batch)
    newer = "(d.last_session IS NULL OR (d.last_session, d.last_seq) < (excluded.last_session, excluded.last_seq))"
    sets = [
        "last_seen = CASE WHEN d.last_seen IS NULL OR d.last_seen < excluded.last_seen THEN excluded.last_seen ELSE d.last_seen END",
        # a live message of the row's session past its position after a death: the device is alive (a forged death
        # once marked a live device offline for good). Not for a device with a pinned key: its deaths are signed, so
        # a death is its own, and unsigned telemetry must not make a stopped device look alive
        f"online = CASE WHEN d.online = FALSE AND d.session = excluded.last_session AND {newer} AND NOT EXISTS "
        "(SELECT 1 FROM device_keys k WHERE k.fleet = d.fleet AND k.device = d.device) THEN TRUE ELSE d.online END",
    ]
    for c in columns:
        v = f"coalesce(excluded.{c}, d.{c})" if c in ("interval_s", "bundle_id") else f"excluded.{c}"
        sets.append(f"{c} = CASE WHEN {newer} THEN {v} ELSE d.{c} END")
    return (
        f"INSERT INTO devices AS d (fleet, device, last_seen, {', '.join(columns)}) VALUES "
        f"({', '.join(['?'] * (len(columns) + 3))}) ON CONFLICT (fleet, device) DO UPDATE SET " + ", ".join(sets)
    )


# the stream position, then UPDATE_TELEMETRY's columns in its order
SEEN_TELEMETRY = seen_upsert(("last_session", "last_seq", "last_ts", *TELEMETRY_METRICS))
SEEN_STATE = seen_upsert(("last_session", "last_seq", "last_ts", "state", "state_detail"))
SEEN_TELEMETRY_TYPES = (*SEEN_TYPES, *UPDATE_TELEMETRY_TYPES[: -len(WHERE_TYPES)])
SEEN_STATE_TYPES = (*SEEN_TYPES, *UPDATE_STATE_TYPES[: -len(WHERE_TYPES)])

GAP_QUERY_PG = (
    "SELECT t.fleet, t.device, t.session, t.received, t.max_seq, t.announced_seq FROM unnest(%b::text[], "
    "%b::text[], %b::bigint[]) AS k(f, d, s) JOIN streams t ON t.fleet = k.f AND t.device = k.d "
    "AND t.session = k.s"
)
