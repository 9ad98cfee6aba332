"""The fleet collector: an MQTT 5 shared subscription into SQLite or PostgreSQL, nothing lost.

- Subscribes to ``$share/<group>/edgekit/<fleet>/+/+``: several collectors in one group
  split the fleet's messages between them (each message goes to one of them). On an MQTT 3.1.1
  broker (``BrokerConfig.protocol``) the subscription is the plain filter, said in one log line.
- Persistent MQTT session (clean_start false, session expiry): while a collector is away
  the broker keeps its messages. Messages are acknowledged (manual PUBACK) only after the
  transaction holding them is committed, so a crash between the two re-delivers instead of losing.
- Batches: messages are decoded as they arrive and written together, one transaction per
  ``batch_max`` messages or ``batch_interval_ms`` after the first one, whichever comes first
  (a telemetry run is one multi-row INSERT plus one upsert per stream and per device, not
  five statements a message; on PostgreSQL each of those is one statement over column arrays, not one
  execution per row, ``FleetDB.bulk``). The broker sends at most ``receive_maximum`` unacknowledged
  messages, so that is at least ``batch_max``: it keeps sending while a batch commits.
- Pipelined (``pipeline``, the default for a running collector): a writer thread writes and commits one batch
  while the network thread reads and decodes the next (the database's round trips and the server's work no
  longer stall the socket). A batch goes to the writer as soon as it is free (group commit: ``batch_interval_ms``
  only bounds the wait without the pipeline; ``batch_max`` still caps a batch). One batch in flight at a time, so
  batches commit in arrival order; each batch's
  PUBACKs go out from the network thread after its commit, in order; a failed write drops the connection and
  everything unacknowledged is re-delivered, as without the pipeline.
- De-duplicates by primary key: telemetry/state by (fleet, device, session, seq), births by
  (fleet, device, session, connection, seq), deaths by (fleet, device, session, connection);
  partitioned PostgreSQL telemetry by key lookup under per-device locks (``edge.fleet.db``). On
  PostgreSQL every batch first locks its devices (advisory, one global order): collectors
  sharing a fleet take turns per device and never deadlock on the upserts.
- Gaps: ``streams`` counts, per device session, the stream messages received and the
  highest seq seen or announced (births and deaths carry the stream position); the
  difference is what is still missing (in flight, in the device's outbox, or dropped there).
- State unknown (telemetry from a session whose birth this store has not seen, e.g. the
  collector started after the retained birth, which shared subscriptions never deliver):
  it sends ``cmd/rebirth`` to the device, at most once per ``rebirth_interval_s``.
- Malformed, oversized, unknown-schema and topic/device mismatched payloads, and sessions
  ahead of this collector's clock by more than ``max_session_skew_s``, are counted, logged at
  most once per reason per 10 s (``Rejected``), acknowledged, never stored, and never stop it.
- MQTT client: ``edge.mqtt.lite`` by default (``client="lite"``: many messages parsed per socket read, no
  message objects; measured 2x the collector's messages per CPU-second of paho), or paho-mqtt (``client="paho"``).
- Whatever it keeps in memory per device is a cache of the database, bounded (least recently
  updated entries evicted past ``max_tracked``): forged device ids cost rows, not memory.
- Bounded backlog at every QoS: at most ``max_backlog`` messages wait decoded for the writer (plus the one
  batch it writes, plus what one socket read holds). Past that, QoS 0 messages (which the broker's receive
  maximum does not limit) are shed before they are decoded, counted in ``shed``; a QoS 1 message there stops
  the reading of the socket until the writer has taken the backlog (``read_pauses``): the kernel's buffers fill,
  TCP's window holds the broker back, and it sends the rest when reading resumes. Flow control, never a refusal:
  Mosquitto 2.0 sends a resumed session's whole queue regardless of the receive maximum, and dropping the
  connection there made it send everything again, for ever (a backlog of 200,000 never drained). A flood costs
  counters, never memory.
- Forged streams (a broker without the ACL) cannot take a device's row: a session replaces the row's only with a
  birth (telemetry of a session other than the device's latest birth is stored, never shown as the device's
  state; a birth resets the row's stream position), and a message more than ``max_seq_jump`` past its stream's
  position (the highest seq stored or announced by a birth) is refused (``seq_jump``), counted, and flagged on
  the device (``stream_flags``, shown by ``fleet status``) instead of winning the stream.
"""

from __future__ import annotations

import json
import logging
import queue
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from edge.errors import EdgeError
from edge.fleet import pgarray
from edge.fleet.db import COLLECTOR_APPLICATION, FleetDB, open_db, scrub
from edge.fleet.decode import (
    MAX_PAYLOAD_BYTES,
    MAX_SESSION_SKEW_S,
    REASONS,
    TELEMETRY_METRICS,
    Decoded,
    Rejected,
    TopicCache,
    decode,
    num,
    telemetry_columns,
    text,
)
from edge.mqtt.client import DEGRADED, BrokerConfig
from edge.mqtt.lite import LiteConnection, TooLarge
from edge.mqtt.netloop import Backoff, Connection, ConnectOptions, NetworkLoop, Timer
from edge.mqtt.payloads import SCHEMA_VERSION, encode
from edge.mqtt.ratelog import RateLimitedLog
from edge.mqtt.topics import Topic, check_part, fleet_filter, shared

log = logging.getLogger("edge.fleet")

# a session's connections count up by one a reconnect: a birth or death of the row's session more than this far
# below the row's connection means the row's is not the device's (a forged connection 2**53-1 once won for good)
CONNECTION_REWIND = 16
_NEWER = (
    "devices.session IS NULL OR devices.session < excluded.session OR "
    "(devices.session = excluded.session AND (devices.connection <= excluded.connection OR "
    f"excluded.connection + {CONNECTION_REWIND} < devices.connection))"
)
STREAM_KINDS = ("telemetry", "state")
_INSERT_TELEMETRY = (
    "INSERT INTO telemetry (fleet, device, session, seq, ts, received_at, historical, fps, p50_ms, p99_ms, max_ms, "
    "misses, frames, cpu_percent, rss_mb, temp_c, payload) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT DO NOTHING"
)
_INSERT_STATE = (
    "INSERT INTO states (fleet, device, session, seq, ts, received_at, historical, state, detail, payload) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)
_UPSERT_STREAM = (  # n new messages of one stream, the highest seq among them
    "INSERT INTO streams (fleet, device, session, received, max_seq, announced_seq, updated_at) "
    "VALUES (?, ?, ?, ?, ?, 0, ?) ON CONFLICT (fleet, device, session) DO UPDATE SET "
    "received = streams.received + excluded.received, updated_at = excluded.updated_at, max_seq = CASE WHEN "
    "excluded.max_seq > streams.max_seq THEN excluded.max_seq ELSE streams.max_seq END"
)
_UPSERT_SEEN = (
    "INSERT INTO devices (fleet, device, last_seen) VALUES (?, ?, ?) ON CONFLICT (fleet, device) "
    "DO UPDATE SET last_seen = excluded.last_seen "
    "WHERE devices.last_seen IS NULL OR devices.last_seen < excluded.last_seen"
)
_NEWER_SEQ = (
    "fleet = ? AND device = ? AND (last_session IS NULL OR last_session < ? OR (last_session = ? AND last_seq < ?))"
)
_UPDATE_TELEMETRY = (
    "UPDATE devices SET last_session = ?, last_seq = ?, last_ts = ?, fps = ?, p50_ms = ?, p99_ms = ?, "
    "max_ms = ?, misses = ?, frames = ?, cpu_percent = ?, rss_mb = ?, temp_c = ?, budget_ms = ?, "
    "throttled = ?, spool_pending = ?, spool_dropped = ?, interval_s = coalesce(?, interval_s), "
    "bundle_id = coalesce(?, bundle_id) WHERE " + _NEWER_SEQ
)  # the values in TELEMETRY_METRICS order
_UPDATE_STATE = (
    "UPDATE devices SET last_session = ?, last_seq = ?, last_ts = ?, state = ?, state_detail = ? WHERE " + _NEWER_SEQ
)
# PostgreSQL column types of the statements' parameters, in order (``FleetDB.bulk`` sends them as arrays)
_STATE_TYPES = ("text", "text", "bigint", "bigint", "float8", "float8", "boolean", "text", "text", "text")
_STREAM_TYPES = ("text", "text", "bigint", "bigint", "bigint", "float8")
_SEEN_TYPES = ("text", "text", "float8")
_WHERE_TYPES = ("text", "text", "bigint", "bigint", "bigint")
_UPDATE_TELEMETRY_TYPES = (
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
    *_WHERE_TYPES,
)
_UPDATE_STATE_TYPES = ("bigint", "bigint", "float8", "text", "text", *_WHERE_TYPES)


def _seen_upsert(columns: tuple[str, ...]) -> str:
    """``_UPSERT_SEEN`` and ``_UPDATE_TELEMETRY``/``_UPDATE_STATE`` in one statement: last_seen when later, the
    columns when the message is past the row's (session, seq); interval_s and bundle_id kept when null."""
    # a row value comparison (SQLite 3.15+, PostgreSQL) and the alias d: the statement stays under psycopg's 4 KB
    # cache limit, past which it re-parses the query text on every execution (2.5 ms a batch)
    newer = "(d.last_session IS NULL OR (d.last_session, d.last_seq) < (excluded.last_session, excluded.last_seq))"
    sets = [
        "last_seen = CASE WHEN d.last_seen IS NULL OR d.last_seen < excluded.last_seen THEN excluded.last_seen ELSE d.last_seen END",
        # a live message of the row's session past its position after a death: the device is alive (a forged death
        # once marked a live device offline for good)
        f"online = CASE WHEN d.online = FALSE AND d.session = excluded.last_session AND {newer} THEN TRUE "
        "ELSE d.online END",
    ]
    for c in columns:
        v = f"coalesce(excluded.{c}, d.{c})" if c in ("interval_s", "bundle_id") else f"excluded.{c}"
        sets.append(f"{c} = CASE WHEN {newer} THEN {v} ELSE d.{c} END")
    return (
        f"INSERT INTO devices AS d (fleet, device, last_seen, {', '.join(columns)}) VALUES "
        f"({', '.join(['?'] * (len(columns) + 3))}) ON CONFLICT (fleet, device) DO UPDATE SET " + ", ".join(sets)
    )


# the stream position, then _UPDATE_TELEMETRY's columns in its order
_SEEN_TELEMETRY = _seen_upsert(("last_session", "last_seq", "last_ts", *TELEMETRY_METRICS))
_SEEN_STATE = _seen_upsert(("last_session", "last_seq", "last_ts", "state", "state_detail"))
_SEEN_TELEMETRY_TYPES = (*_SEEN_TYPES, *_UPDATE_TELEMETRY_TYPES[: -len(_WHERE_TYPES)])
_SEEN_STATE_TYPES = (*_SEEN_TYPES, *_UPDATE_STATE_TYPES[: -len(_WHERE_TYPES)])

_GAP_QUERY_PG = (
    "SELECT t.fleet, t.device, t.session, t.received, t.max_seq, t.announced_seq FROM unnest(%b::text[], "
    "%b::text[], %b::bigint[]) AS k(f, d, s) JOIN streams t ON t.fleet = k.f AND t.device = k.d "
    "AND t.session = k.s"
)

# a decoded message, its payload as text, when it arrived, and for telemetry its values (``telemetry_columns``):
# read as it arrives, so the parsed payload (some fifty objects) is freed at once instead of living until the
# batch is written (measured: JSON parsing 2.8 instead of 5.0 µs a message when nothing parsed is kept)
_Queued = tuple[Decoded, str, float, "tuple[Any, ...] | None"]
CLIENTS = ("paho", "lite")
_READ: Any = MappingProxyType({})  # the payload of a queued telemetry message: its values were read as it arrived


@dataclass
class CollectorConfig:
    broker: BrokerConfig
    db_url: str = "sqlite:///fleet.db"
    fleet: str = "+"
    group: str = "edgekit-collectors"
    client_id: str | None = None
    session_expiry_s: int = 3600
    max_payload_bytes: int = MAX_PAYLOAD_BYTES
    rebirth_interval_s: float = 30.0
    gap_grace_s: float = 10.0  # a gap shorter than this is a replay in progress, not worth a log line
    # messages per transaction at most... (5000: measured at 10,000 devices x 1 Hz on 2 shared cores, p99 764 ms vs
    # 2.3 s with 2000, the backlog no longer growing; drain +23 % on SQLite, +20 % on PostgreSQL)
    batch_max: int = 5000
    batch_interval_ms: float = 50.0  # ...and at most this long after the first one arrived (0: every read round)
    receive_maximum: int = 10_000  # unacknowledged messages the broker may send; at least batch_max
    # decoded messages waiting for the writer at most; QoS 0 past it is shed (module doc). 0: twice batch_max, at
    # least 20,000 (a few MB: a decoded telemetry message holds about 1 KB)
    max_backlog: int = 0
    max_session_skew_s: float = MAX_SESSION_SKEW_S  # a session further ahead of our clock is refused
    max_tracked: int = 100_000  # per-device (and per-stream) entries kept in memory, each map
    # a stream message further than this past its stream's position is refused and flagged (see the module doc):
    # an agent's seq grows by one a message and every reconnect's birth announces it, so a real stream never
    # jumps this far between two messages the collector sees
    max_seq_jump: int = 1_000_000
    # a live (not replayed) stream message this far below its stream's position means the position is not the
    # device's (a forged message ahead of the real stream, up to max_seq_jump): the stream and the device row go
    # back to the real stream instead of waiting for it to catch up (999,999 messages: 58 days at 5 s)
    max_reorder: int = 100
    backoff: Backoff = field(default_factory=Backoff)
    client: str = "lite"  # MQTT client: "lite" (edge.mqtt.lite, a lean subscriber) or "paho" (paho-mqtt)
    # write and commit each batch on a writer thread while the network thread decodes the next (see the module doc)
    pipeline: bool = True

    def __post_init__(self) -> None:
        if self.max_tracked < 1:
            raise ValueError("max_tracked must be at least 1")
        problems = []
        if not 1 <= self.max_seq_jump < 2**53:
            problems.append(f"max seq jump {self.max_seq_jump} is not between 1 and 2**53-1")
        if not 1 <= self.batch_max <= 65535:
            problems.append(f"batch size {self.batch_max} is not between 1 and 65535")
        if not 0 <= self.batch_interval_ms <= 60_000:
            problems.append(f"batch interval {self.batch_interval_ms} ms is not between 0 and 60000")
        if not 1 <= self.receive_maximum <= 65535:  # a two-byte MQTT 5 property
            problems.append(f"receive maximum {self.receive_maximum} is not between 1 and 65535")
        elif self.receive_maximum < self.batch_max:
            problems.append(
                f"receive maximum {self.receive_maximum} is below the batch size {self.batch_max}: "
                "the broker would stop sending before a batch is full"
            )
        if self.max_backlog == 0:
            self.max_backlog = max(20_000, 2 * self.batch_max)
        if not self.batch_max <= self.max_backlog <= 1_000_000:
            problems.append(f"backlog limit {self.max_backlog} is not between the batch size and 1000000")
        if self.client not in CLIENTS:
            problems.append(f"unknown MQTT client {str(self.client)[:40]!r} (one of {', '.join(CLIENTS)})")
        if problems:
            raise EdgeError(
                "; ".join(problems),
                hint="e.g. --batch-max 5000 --batch-interval-ms 50 --receive-maximum 10000 (the receive maximum at least the batch size)",
            )
        if self.fleet != "+":
            check_part(self.fleet, "fleet")
        check_part(self.group, "shared subscription group")
        if self.client_id is None:
            self.client_id = f"edgekit-collector-{self.group}-{socket.gethostname()}"[:200]


def _new_stats() -> dict[str, Any]:
    return {
        "received": 0,
        "stored": {"birth": 0, "death": 0, "telemetry": 0, "state": 0},
        "duplicates": 0,
        "rejected": {r: 0 for r in REASONS if r != "not_stored"},
        "ignored": 0,  # the rollout's desired/reported states on the fleet subscription: not the collector's
        "rebirths_sent": 0,
        "gaps_detected": 0,
        "gaps_filled": 0,
        "db_errors": 0,
        "evicted": 0,
        "shed": 0,
        "read_pauses": 0,
        "rewinds": 0,  # streams put back to the real stream, below a position that was ahead of it
        "backlog_high": 0,
    }


K = TypeVar("K")
V = TypeVar("V")


class Bounded(OrderedDict, Generic[K, V]):  # type: ignore[type-arg]
    """A dict of at most ``cap`` entries: setting one makes it the newest, the oldest goes past the cap."""

    def __init__(self, cap: int, stats: dict[str, Any]) -> None:
        super().__init__()
        self.cap, self._stats = cap, stats

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.cap:
            self.popitem(last=False)
            self._stats["evicted"] += 1


@dataclass
class _StreamUpdate:
    """What one batch of newly stored stream messages changes (``Collector._aggregate``)."""

    streams: dict[tuple[str, str, int], list[Any]] = field(default_factory=dict)  # count, highest seq, last time
    seen: dict[tuple[str, str], float] = field(default_factory=dict)  # device -> last seen
    latest: dict[tuple[str, str, str], tuple[int, int, int]] = field(default_factory=dict)  # (session, seq, index)
    carried: dict[tuple[str, str], list[Any]] = field(default_factory=dict)  # the latest non-null interval, bundle
    births: dict[tuple[str, str], int] = field(default_factory=dict)  # device -> its latest birth's session


class Collector:
    def __init__(self, config: CollectorConfig, *, db: FleetDB | None = None) -> None:
        self.config = config
        self.db = db if db is not None else open_db(config.db_url, application_name=COLLECTOR_APPLICATION)
        self._own_db = db is None
        self.stats = _new_stats()
        self.loop: NetworkLoop | None = None
        self.conn: Connection | LiteConnection | None = None
        self._acks: list[tuple[Any, int, int]] = []
        cap = config.max_tracked
        self._births: Bounded[tuple[str, str], int] = Bounded(cap, self.stats)  # device -> latest birth session known
        self._rebirth_at: Bounded[tuple[str, str], float] = Bounded(cap, self.stats)
        self._touched: set[tuple[str, str, int]] = set()  # emptied by every flush
        # stream -> (first seen, reported)
        self._gappy: Bounded[tuple[str, str, int], tuple[float, bool]] = Bounded(cap, self.stats)
        # stream -> its position: the highest seq stored or announced (a cache of ``streams``)
        self._positions: Bounded[tuple[str, str, int], int] = Bounded(cap, self.stats)
        self._rewound: dict[int, int] = {}  # index in the run being written -> the position it was far below
        self._ratelog = RateLimitedLog(log)
        self._topics = TopicCache(cap)
        self._pending: list[_Queued] = []  # decoded, not written yet
        self._uncommitted = 0  # written, not committed yet
        # what the open transaction added to stats["stored"] and stats["duplicates"]: taken back on a rollback, so
        # a batch that fails and is re-delivered is counted once
        self._tally: dict[str, int] = {}
        self._batch_t0: float | None = None  # when the first message of the open batch arrived (monotonic)
        self._timer: Timer | None = None  # wakes the loop when the open batch is due
        self._own_loop = False
        # the pipeline (loop thread: _inflight, _broken; writer thread: _write, _check_gaps, commit)
        self._writer: threading.Thread | None = None
        self._batches: queue.SimpleQueue[tuple[list[_Queued], list[tuple[Any, int, int]]] | None] = queue.SimpleQueue()
        self._inflight = False  # a batch handed to the writer and not completed on the loop thread yet
        self._idle = threading.Event()  # the writer holds no batch (set before it posts the completion)
        self._idle.set()
        self._done: tuple[list[tuple[Any, int, int]], BaseException | None] | None = None  # its last batch's outcome
        self._broken = False  # a failure on the loop thread while a batch was in flight: cleaned up after it
        self._paused_client: Any = None  # the MQTT client whose socket is not read while the backlog is full

    # storing -----------------------------------------------------------------------------
    def add(self, topic: str, payload: bytes | TooLarge, received_at: float | None = None) -> str | None:
        """Decode one message and queue it for the next write; the reason when it is refused (counted, logged)."""
        self.stats["received"] += 1
        now = time.time() if received_at is None else received_at
        try:
            d = decode(
                self._topics(topic),
                payload,
                max_bytes=self.config.max_payload_bytes,
                now=now,
                max_session_skew_s=self.config.max_session_skew_s,
            )
        except Rejected as r:
            if r.reason == "not_stored":  # the rollout's own topics: expected on the fleet subscription, not refused
                self.stats["ignored"] += 1
                return r.reason
            n = self.stats["rejected"][r.reason] = self.stats["rejected"][r.reason] + 1
            self._ratelog.warning(r.reason, "rejected message #%d (%s) on %.200r: %s", n, r.reason, topic, r.detail)
            return r.reason
        m = None
        if d.kind == "telemetry":
            m = telemetry_columns(d.payload)
            d = Decoded(d.kind, d.fleet, d.device, d.session, d.seq, d.ts, _READ, d.connection, d.historical)
        text = payload.decode("utf-8") if isinstance(payload, bytes) else ""  # decode refuses a TooLarge
        self._pending.append((d, text, now, m))
        return None

    def handle(self, topic: str, payload: bytes, received_at: float | None = None) -> str:
        """Decode and store one message (not committed until ``flush``). Returns what happened."""
        reason = self.add(topic, payload, received_at)
        if reason is not None:
            return reason
        new = self._write()[-1]
        return "seq_jump" if new is None else "stored" if new else "duplicate"

    def _write(self, pending: list[_Queued] | None = None) -> list[bool | None]:
        """Write the queued messages (``pending``, else those queued here; not committed), in arrival order: runs of
        telemetry and state together, births and deaths one by one between them. Which of them were new (None:
        refused for a sequence jump)."""
        if pending is None:
            pending, self._pending = self._pending, []
        if pending and self.db.dialect == "postgresql":
            # partitions first (DDL waits for other writers), then this batch's devices in one order: collectors
            # sharing the fleet take turns per device, so the upserts below never deadlock between them
            self.db.ensure_partitions_for(item[2] for item in pending)
            self.db.lock_devices({(item[0].fleet, item[0].device) for item in pending})
        new: list[bool | None] = []
        run: list[_Queued] = []
        for item in pending:
            d, raw, now, _ = item
            if d.kind in STREAM_KINDS:
                run.append(item)
                continue
            if run:
                new += self._store_streams(run)
                run = []
            new.append(self._store_birth(d, raw, now) if d.kind == "birth" else self._store_death(d, raw, now))
        if run:
            new += self._store_streams(run)
        stored, tally = self.stats["stored"], self._tally
        for (d, _, _, _), ok in zip(pending, new):
            key = "seq_jump" if ok is None else d.kind if ok else "duplicates"
            tally[key] = tally.get(key, 0) + 1
            if ok is None:
                self.stats["rejected"]["seq_jump"] += 1
            elif ok:
                stored[d.kind] += 1
            else:
                self.stats["duplicates"] += 1
        self._uncommitted += len(pending)
        return new

    def _store_streams(self, run: list[_Queued]) -> list[bool | None]:
        """Telemetry and state messages: one multi-row INSERT per table (duplicates skipped by primary key), then
        one upsert per stream (counts), per device (last seen) and per device and kind (latest values). Messages
        too far past their stream's position are refused (None), and only messages of a device's latest birth's
        session (or of any, while no birth is known) update its row."""
        refused = self._seq_jumps(run)
        rewound, self._rewound = self._rewound, {}
        new = self._insert_messages(run, refused)
        rewound = {i: at for i, at in rewound.items() if new[i]}  # a re-delivered copy says nothing new
        if rewound:
            self._rewind_rows(run, rewound)
        agg = self._aggregate(run, new, rewound)
        if not agg.streams:
            return new
        self.db.bulk(_UPSERT_STREAM, [(*k, n, mx, at) for k, (n, mx, at) in agg.streams.items()], _STREAM_TYPES)
        if rewound:
            self._rewind_streams(run, rewound)
        self._touched.update(agg.streams)
        self._update_devices(run, agg)
        for fleet, device, session in agg.streams:
            self._check_known(fleet, device, session, agg.births.get((fleet, device)))
        return new

    def _rewind_rows(self, run: list[_Queued], rewound: dict[int, int]) -> None:
        """Device rows whose position is further ahead of a live message of their session than ``max_reorder``: the
        position goes back to just below it, so the real stream updates the row again."""
        w = self.config.max_reorder
        for i in sorted(rewound):
            d = run[i][0]
            self.db.execute(
                "UPDATE devices SET last_seq = ? WHERE fleet = ? AND device = ? AND last_session = ? AND last_seq > ?",
                (d.seq - 1, d.fleet, d.device, d.session, d.seq + w),
            )
            self.stats["rewinds"] += 1
            self._ratelog.warning(
                "rewind",
                "%s/%s session %d: a live %s with seq %d is %d below the stream's position: the position was not "
                "the device's (forged?); back to the real stream",
                d.fleet,
                d.device,
                d.session,
                d.kind,
                d.seq,
                rewound[i] - d.seq,
            )

    def _rewind_streams(self, run: list[_Queued], rewound: dict[int, int]) -> None:
        """The rewound streams' highest seq and announcement back to the real stream's position (``_positions``)."""
        for k in {run[i][0][1:4] for i in rewound}:
            at = self._positions.get(k)
            if at is not None:
                self.db.execute(
                    "UPDATE streams SET max_seq = ?, announced_seq = CASE WHEN announced_seq > ? THEN ? ELSE "
                    "announced_seq END WHERE fleet = ? AND device = ? AND session = ?",
                    (at, at, at, *k),
                )

    def _insert_messages(self, run: list[_Queued], refused: set[int]) -> list[bool | None]:
        """Each message's row inserted (a re-delivered copy in the same batch once); per message: newly stored,
        a duplicate (False), or refused (None)."""
        db = self.db
        new: list[bool | None] = [None if i in refused else False for i in range(len(run))]
        t_idx: list[int] = []
        t_rows: list[tuple[Any, ...]] = []
        s_idx: list[int] = []
        s_rows: list[tuple[Any, ...]] = []
        first: set[tuple[Any, ...]] = set()
        for i, (d, raw, now, m) in enumerate(run):
            key = d[:5]  # kind, fleet, device, session, seq
            if key in first or i in refused:  # a re-delivered copy in the same batch as the first one
                continue
            first.add(key)
            if m is not None:  # telemetry
                t_idx.append(i)
                t_rows.append((d.fleet, d.device, d.session, d.seq, d.ts, now, d.historical, *m[:9], raw))
            else:
                x = d.payload
                s_idx.append(i)
                s_rows.append(
                    (
                        d.fleet,
                        d.device,
                        d.session,
                        d.seq,
                        d.ts,
                        now,
                        d.historical,
                        text(x, "state"),
                        text(x, "detail", limit=2000),
                        raw,
                    )
                )
        if t_idx:
            for i, ok in zip(t_idx, db.insert_telemetry(_INSERT_TELEMETRY, t_rows)):
                new[i] = ok
        if s_idx:
            for i, ok in zip(s_idx, db.insert_new(_INSERT_STATE, s_rows, _STATE_TYPES)):
                new[i] = ok
        return new

    def _aggregate(self, run: list[_Queued], new: list[bool | None], rewound: dict[int, int]) -> _StreamUpdate:
        """What the newly stored messages change: per stream its count, highest seq and time; per device its last
        seen, the latest message of each kind past every earlier one (of its latest birth's session) and the last
        non-null interval and bundle."""
        agg = _StreamUpdate()
        top: dict[tuple[str, str], tuple[int, int]] = {}  # device -> highest (session, seq) so far, arrival order
        newest: dict[tuple[str, str], int] = {}  # device -> its newest session in this run
        for i, (d, _, _, _) in enumerate(run):
            if new[i] and newest.get((d.fleet, d.device), -1) < d.session:
                newest[(d.fleet, d.device)] = d.session
        agg.births = self._birth_sessions(newest)
        for i, (d, _, now, m) in enumerate(run):
            if not new[i]:
                continue
            sk = (d.fleet, d.device, d.session)
            s = agg.streams.get(sk)
            if s is None:
                agg.streams[sk] = [1, d.seq, now]
            else:
                s[0] += 1
                if d.seq > s[1]:
                    s[1] = d.seq
                if now > s[2]:
                    s[2] = now
            dk = sk[:2]
            if agg.seen.get(dk, -1.0) < now:
                agg.seen[dk] = now
            pos = (d.session, d.seq)
            t = top.get(dk)
            birth = agg.births.get(dk)
            if birth is not None and d.session != birth:  # another session than the latest birth's: history only
                continue
            if t is None or pos > t or i in rewound:  # only a message past every earlier one updates the row
                top[dk] = pos
                agg.latest[(d.fleet, d.device, d.kind)] = (d.session, d.seq, i)
                if m is not None and (m[-2] is not None or m[-1] is not None):  # kept by the row when null later
                    kept = agg.carried.setdefault(dk, [None, None])
                    if m[-2] is not None:
                        kept[0] = m[-2]
                    if m[-1] is not None:
                        kept[1] = m[-1]
        return agg

    def _update_devices(self, run: list[_Queued], agg: _StreamUpdate) -> None:
        """Per device, the last telemetry and the last state that were each past every message before them, in
        stream order: the row ends exactly as one UPDATE per message in arrival order leaves it (an older,
        replayed message never overwrites a newer one), for two statements per device instead of one a message.
        The first of them also carries the device's last_seen, as an upsert (the row may not exist yet): one
        write of the device row instead of two (measured at 10,000 devices, 500 a batch: PostgreSQL 13% more
        messages a second, SQLite 2%)."""
        db, seen = self.db, agg.seen
        firsts: dict[str, list[tuple[Any, ...]]] = {"telemetry": [], "state": []}
        seconds: dict[str, list[tuple[Any, ...]]] = {"telemetry": [], "state": []}
        for (fleet, device, kind), (session, seq, i) in agg.latest.items():
            other = agg.latest.get((fleet, device, "state" if kind == "telemetry" else "telemetry"))
            later = other is not None and (session, seq) > other[:2]
            m = run[i][3]
            held = agg.carried.get((fleet, device))
            if m is not None and held is not None:  # as one UPDATE a message leaves coalesce(?, column)
                m = (*m[:-2], held[0] if m[-2] is None else m[-2], held[1] if m[-1] is None else m[-1])
            row = self._device_update(run[i][0], m)
            if later:
                seconds[kind].append(row)
            else:
                firsts[kind].append((fleet, device, seen.pop((fleet, device), None), *row[:-5]))
        if seen:  # every device seen has a first row above; this is for the case that it has not
            db.bulk(_UPSERT_SEEN, [(*k, at) for k, at in seen.items()], _SEEN_TYPES)
        for kind, sql, types in (
            ("telemetry", _SEEN_TELEMETRY, _SEEN_TELEMETRY_TYPES),
            ("state", _SEEN_STATE, _SEEN_STATE_TYPES),
        ):
            if firsts[kind]:
                db.bulk(sql, firsts[kind], types)
        for kind, sql, types in (
            ("telemetry", _UPDATE_TELEMETRY, _UPDATE_TELEMETRY_TYPES),
            ("state", _UPDATE_STATE, _UPDATE_STATE_TYPES),
        ):
            if seconds[kind]:
                db.bulk(sql, seconds[kind], types)

    def _birth_sessions(self, newest: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
        """Each device's latest birth session known (the cache; the store when the cache has none or one older
        than the device's newest session here: another collector may have seen the birth); devices with none
        are left out."""
        out: dict[tuple[str, str], int] = {}
        for key, session in newest.items():
            known = self._births.get(key)
            if known is None or known < session:
                row = self.db.execute("SELECT max(session) FROM births WHERE fleet = ? AND device = ?", key).fetchone()
                if row and row[0] is not None:
                    known = self._births[key] = int(row[0])
            if known is not None:
                out[key] = known
        return out

    def _seq_jumps(self, run: list[_Queued]) -> set[int]:
        """The indices of ``run`` whose seq is more than ``max_seq_jump`` past their stream's position (the highest
        seq stored or announced; 0 for a stream not known yet: a session numbers its messages from 1, and a device
        whose birth this store never saw is asked for one, which announces its position). Each is checked again
        against the store before it is refused (another collector of the group may have moved the stream on);
        each device so refused is flagged (``stream_flags``) and logged at a bounded rate."""
        bound, positions = self.config.max_seq_jump, self._positions
        keys = {(d.fleet, d.device, d.session) for d, _, _, _ in run}
        unknown = [k for k in keys if k not in positions]
        if unknown:
            for fleet, device, session, _, max_seq, announced in self._stream_rows(unknown):
                positions[(fleet, device, int(session))] = int(max(max_seq, announced))
        suspects: list[int] = []
        for i, (d, _, _, _) in enumerate(run):
            k = (d.fleet, d.device, d.session)
            at = positions.get(k)
            if d.seq > (at or 0) + bound:
                suspects.append(i)
            elif at is None or d.seq > at:
                positions[k] = d.seq
            elif d.seq + self.config.max_reorder < at and not d.historical:
                self._rewound[i] = at  # the position is ahead of the real stream (see max_reorder)
                positions[k] = d.seq
        if not suspects:
            return set()
        fresh = {
            (f, dv, int(s)): int(max(m, a))
            for f, dv, s, _, m, a in self._stream_rows(list({run[i][0][1:4] for i in suspects}))
        }
        refused: set[int] = set()
        for i in suspects:
            d, _, now, _ = run[i]
            k = (d.fleet, d.device, d.session)
            at = max(fresh.get(k, 0), positions.get(k, 0))
            if d.seq <= at + bound:
                positions[k] = max(at, d.seq)
                continue
            refused.add(i)
            self._flag(d, at, now)
            if k not in fresh:  # a stream no birth announced: if the device is real, its birth says where it is
                self._check_known(d.fleet, d.device, d.session, self._births.get((d.fleet, d.device)))
        return refused

    def _flag(self, d: Decoded, at: int, now: float) -> None:
        self.db.execute(
            "INSERT INTO stream_flags (fleet, device, session, reason, refused, max_seq, stream_seq, first_at, last_at) "
            "VALUES (?, ?, ?, 'seq_jump', 1, ?, ?, ?, ?) ON CONFLICT (fleet, device) DO UPDATE SET "
            "refused = CASE WHEN stream_flags.session = excluded.session THEN stream_flags.refused + 1 ELSE 1 END, "
            "first_at = CASE WHEN stream_flags.session = excluded.session THEN stream_flags.first_at "
            "ELSE excluded.first_at END, max_seq = CASE WHEN stream_flags.session = excluded.session AND "
            "stream_flags.max_seq > excluded.max_seq THEN stream_flags.max_seq ELSE excluded.max_seq END, "
            "session = excluded.session, stream_seq = excluded.stream_seq, last_at = excluded.last_at",
            (d.fleet, d.device, d.session, d.seq, at, now, now),
        )
        self._ratelog.warning(
            "seq_jump",
            "%s/%s session %d: refused a %s with seq %d, %d past the stream's position "
            "%d (more than %d: forged or broken; flagged in fleet status)",
            d.fleet,
            d.device,
            d.session,
            d.kind,
            d.seq,
            d.seq - at,
            at,
            self.config.max_seq_jump,
        )

    @staticmethod
    def _device_update(d: Decoded, metrics: tuple[Any, ...] | None = None) -> tuple[Any, ...]:
        """The parameters of ``_UPDATE_TELEMETRY`` or ``_UPDATE_STATE`` for this message (``metrics``: its
        ``telemetry_columns``, when already read)."""
        x = d.payload
        where = (d.fleet, d.device, d.session, d.session, d.seq)
        if d.kind == "state":
            return (d.session, d.seq, d.ts, text(x, "state"), text(x, "detail", limit=2000), *where)
        return (d.session, d.seq, d.ts, *(metrics or telemetry_columns(x)), *where)

    def _store_birth(self, d: Decoded, raw: str, now: float) -> bool:
        x, db = d.payload, self.db
        cur = db.execute(
            "INSERT INTO births (fleet, device, session, connection, seq, ts, received_at, payload) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (d.fleet, d.device, d.session, d.connection, d.seq, d.ts, now, raw),
        )
        if cur.rowcount != 1:
            return False
        db.execute(
            "INSERT INTO devices (fleet, device, online, session, connection, birth_at, last_seen, interval_s, bundle_id, "
            "target, runtime, device_used, precision_used, edgekit_version, hostname, state, state_detail, "
            "last_session, last_seq) "
            "VALUES (?, ?, TRUE, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (fleet, device) DO UPDATE SET "
            "online = TRUE, session = excluded.session, connection = excluded.connection, birth_at = excluded.birth_at, "
            "last_seen = excluded.last_seen, interval_s = excluded.interval_s, bundle_id = excluded.bundle_id, "
            "target = excluded.target, runtime = excluded.runtime, device_used = excluded.device_used, "
            "precision_used = excluded.precision_used, edgekit_version = excluded.edgekit_version, "
            "hostname = excluded.hostname, state = excluded.state, state_detail = excluded.state_detail, "
            "death_at = NULL, death_reason = NULL, "
            # the birth's session is the device's now: its stream position restarts at the birth's (whatever a
            # stream of another session, e.g. a forged one, had put there)
            "last_session = excluded.last_session, last_seq = CASE WHEN devices.last_session = excluded.last_session "
            "AND devices.last_seq > excluded.last_seq THEN devices.last_seq ELSE excluded.last_seq END WHERE " + _NEWER,
            (
                d.fleet,
                d.device,
                d.session,
                d.connection,
                d.ts,
                now,
                num(x, "agent", "interval_s"),
                text(x, "bundle", "id"),
                text(x, "bundle", "target"),
                text(x, "runner", "runtime"),
                text(x, "runner", "device_used"),
                text(x, "runner", "precision_used"),
                text(x, "agent", "edgekit_version"),
                text(x, "host", "hostname"),
                text(x, "state"),
                text(x, "state_detail", limit=2000),
                d.session,
                d.seq,
            ),
        )
        self._announce(d, now)
        key = (d.fleet, d.device)
        if self._births.get(key, -1) < d.session:
            self._births[key] = d.session
        return True

    def _store_death(self, d: Decoded, raw: str, now: float) -> bool:
        db = self.db
        reason = text(d.payload, "reason")
        cur = db.execute(
            "INSERT INTO deaths (fleet, device, session, connection, seq, ts, received_at, reason, payload) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (d.fleet, d.device, d.session, d.connection, d.seq, d.ts, now, reason, raw),
        )
        if cur.rowcount != 1:
            return False
        db.execute(
            "INSERT INTO devices (fleet, device, online, session, connection, death_at, death_reason) "
            "VALUES (?, ?, FALSE, ?, ?, ?, ?) ON CONFLICT (fleet, device) DO UPDATE SET online = FALSE, "
            "session = excluded.session, connection = excluded.connection, death_at = excluded.death_at, "
            "death_reason = excluded.death_reason WHERE " + _NEWER,
            (d.fleet, d.device, d.session, d.connection, now, reason),
        )
        self._announce(d, now)
        return True

    def _announce(self, d: Decoded, now: float) -> None:
        """Births and deaths carry the stream position: messages up to it exist somewhere."""
        self.db.execute(
            "INSERT INTO streams (fleet, device, session, received, max_seq, announced_seq, updated_at) "
            "VALUES (?, ?, ?, 0, 0, ?, ?) ON CONFLICT (fleet, device, session) DO UPDATE SET "
            "announced_seq = CASE WHEN excluded.announced_seq > streams.announced_seq "
            "THEN excluded.announced_seq ELSE streams.announced_seq END",
            (d.fleet, d.device, d.session, d.seq, now),
        )
        self._touched.add((d.fleet, d.device, d.session))
        k = (d.fleet, d.device, d.session)
        if self._positions.get(k, -1) < d.seq:
            self._positions[k] = d.seq

    # state unknown -> rebirth ------------------------------------------------------------
    def _check_known(self, fleet: str, device: str, session: int, known: int | None) -> None:
        """Ask for a rebirth when no birth is known for ``session`` (``known``: the latest birth session known,
        from ``_birth_sessions``, which already asked the store)."""
        if known is None or known < session:
            self.request_rebirth(fleet, device, f"no birth seen for session {session}")

    def request_rebirth(self, fleet: str, device: str, reason: str) -> bool:
        if self.loop is not None and self._writer is not None and not self.loop.in_loop:
            self.loop.call_soon(self.request_rebirth, fleet, device, reason)  # the writer: MQTT is the loop's
            return False
        key = (fleet, device)
        now = time.monotonic()
        if now - self._rebirth_at.get(key, -1e9) < self.config.rebirth_interval_s:
            return False
        if self.conn is None or not self.conn.connected:
            return False
        self._rebirth_at[key] = now
        body = {
            "schema_version": SCHEMA_VERSION,
            "type": "cmd",
            "command": "rebirth",
            "fleet": fleet,
            "device": device,
            "reason": reason,
            "ts": round(time.time(), 6),
        }
        self.conn.publish(str(Topic(fleet, device, "cmd", "rebirth")), encode(body), qos=1)
        self.stats["rebirths_sent"] += 1
        self._ratelog.info("rebirth", "asked %s/%s for a rebirth (%s)", fleet, device, reason)
        return True

    # committing --------------------------------------------------------------------------
    def flush(self) -> None:
        """Write what is queued, commit, then acknowledge what the commit made durable; then look at the
        streams touched."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._inflight:  # the writer's batch first: its commit and PUBACKs come before this one's
            self._idle.wait()
            self._complete()
            if self._broken:
                return
        self._batch_t0 = None
        if not self._pending and not self._uncommitted and not self._acks:
            return
        try:
            self._write()
            self._check_gaps()
            self.db.commit()
        except Exception as e:
            self._db_failed(e)
            return
        self._uncommitted = 0
        self._tally = {}
        acks, self._acks = self._acks, []
        self._acknowledge(acks)

    def _acknowledge(self, acks: list[tuple[Any, int, int]]) -> None:
        """Loop thread: a committed batch's PUBACKs, in order."""
        if self.conn is not None:
            for client, mid, qos in acks:
                self.conn.ack(client, mid, qos)
            done = getattr(self.conn, "ack_done", None)  # the lean client: the batch's PUBACKs in one write
            if done is not None:
                done()

    def _after_io(self) -> None:
        """After every round of socket events: commit the open batch when it is due, else wake up when it is.
        Pipelined, a batch is due as soon as the writer is free (group commit: what arrived while the last batch
        was committing goes in the next one, so batches grow with the load and a quiet fleet waits for nothing;
        a broker that sends few unacknowledged messages at a time, such as RabbitMQ's default prefetch of 10, is
        not held to one batch per interval)."""
        if self._paused_client is not None:
            self._resume_reading()
        if self._batch_t0 is None:
            return
        wait = self.config.batch_interval_ms / 1000.0 - (time.monotonic() - self._batch_t0)
        if wait <= 0 or (self._writer is not None and not self._inflight):
            self._batch_due()
        elif self._timer is None and self.loop is not None:
            self._timer = self.loop.call_later(wait, self._due)

    def _batch_due(self) -> None:
        """The open batch is full or old enough: to the writer (pipelined), else written here."""
        if self._writer is None:
            self.flush()
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._inflight:  # the writer is busy: this batch goes when it is done (_complete)
            return
        self._batch_t0 = None
        if not self._pending and not self._acks:
            return
        pending, acks = self._pending, self._acks
        self._pending, self._acks = [], []
        self._inflight = True
        self._idle.clear()
        self._batches.put((pending, acks))

    def _write_batches(self) -> None:
        """The writer thread: write, look at the gaps, commit; then the loop thread acknowledges (``_complete``)."""
        while True:
            item = self._batches.get()
            if item is None:
                return
            pending, acks = item
            error: BaseException | None = None
            try:
                self._write(pending)
                self._check_gaps()
                self.db.commit()
                self._uncommitted = 0
                self._tally = {}
            except Exception as e:  # handled on the loop thread (_complete -> _db_failed)
                error = e
            self._done = (acks, error)
            self._idle.set()
            loop = self.loop
            if loop is not None:
                loop.call_soon(self._complete)

    def _complete(self) -> None:
        """Loop thread: the writer's batch is committed (acknowledge it) or failed (roll back, reconnect)."""
        if not self._idle.is_set():  # the writer is still finishing: its own call comes next
            return
        done, self._done = self._done, None
        if done is None:  # already completed by a flush
            return
        self._inflight = False
        acks, error = done
        if error is not None or self._broken:
            self._broken = False
            self._db_failed(error if error is not None else RuntimeError("failed while a batch was being written"))
            return
        self._acknowledge(acks)
        if len(self._acks) >= self.config.batch_max:
            self._batch_due()
        else:
            self._after_io()

    def _due(self) -> None:
        self._timer = None  # the loop runs _after_io right after its timers

    GAP_QUERY_KEYS = 300  # streams per query: 900 parameters, below SQLite's oldest limit of 999

    def _check_gaps(self) -> None:
        touched, self._touched = list(self._touched), set()
        now = time.monotonic()
        for fleet, device, session, received, max_seq, announced in self._stream_rows(touched):
            key = (fleet, device, int(session))
            missing = max(max_seq, announced) - received
            if missing > 0:
                since, reported = self._gappy.setdefault(key, (now, False))
                if not reported and now - since >= self.config.gap_grace_s:
                    self._gappy[key] = (since, True)
                    self.stats["gaps_detected"] += 1
                    self._ratelog.warning(
                        "gap",
                        "%s/%s session %d: %d message(s) missing for %.0f s (seq up to %d, %d received)",
                        fleet,
                        device,
                        key[2],
                        missing,
                        now - since,
                        max(max_seq, announced),
                        received,
                    )
            elif key in self._gappy:
                since, reported = self._gappy.pop(key)
                if reported:
                    self.stats["gaps_filled"] += 1
                    self._ratelog.info(
                        "gap_filled", "%s/%s session %d: gap filled after %.0f s", fleet, device, key[2], now - since
                    )

    def _stream_rows(self, touched: list[tuple[str, str, int]]) -> list[tuple[Any, ...]]:
        """(fleet, device, session, received, max_seq, announced_seq) of these streams, those the store has."""
        rows: list[tuple[Any, ...]] = []
        if touched and self.db.dialect == "postgresql":  # the keys as three arrays: one short statement
            rows = self.db.execute(_GAP_QUERY_PG, pgarray.columns(touched, ("text", "text", "bigint"))).fetchall()
            touched = []
        for i in range(0, len(touched), self.GAP_QUERY_KEYS):
            chunk = touched[i : i + self.GAP_QUERY_KEYS]
            # the keys as a joined table: for a row-value IN (VALUES ...) SQLite scans all of streams (measured
            # 48 ms vs 1 ms per 300 keys at 100,000 streams), on every flush
            rows += self.db.execute(
                "WITH k(f, d, s) AS (VALUES " + ", ".join(["(?, ?, ?)"] * len(chunk)) + ") "
                "SELECT t.fleet, t.device, t.session, t.received, t.max_seq, t.announced_seq FROM k JOIN streams t "
                "ON t.fleet = k.f AND t.device = k.d AND t.session = k.s",
                [v for key in chunk for v in key],
            ).fetchall()
        return rows

    def _db_failed(self, e: BaseException) -> None:
        """Roll back and drop the connection: the broker re-delivers everything not yet acknowledged."""
        if self._inflight:  # the writer holds the database: drop the connection now, clean up after its batch
            self._broken = True
            self._acks.clear()
            self._pending.clear()
            if self.conn is not None and self.conn.client is not None:
                self.conn.client.disconnect()
            log.error(
                "error while a batch was being written, reconnecting for re-delivery: %s",
                scrub(str(e), self.config.db_url),
            )
            return
        self.stats["db_errors"] += 1
        log.error(
            "database error, rolling back and reconnecting for re-delivery: %s", scrub(str(e), self.config.db_url)
        )
        try:
            self.db.rollback()
        except Exception:  # pragma: no cover - the connection itself is gone
            pass
        tally, self._tally = self._tally, {}
        for key, n in tally.items():  # rolled back: counted again when re-delivered
            if key == "duplicates":
                self.stats["duplicates"] -= n
            elif key == "seq_jump":
                self.stats["rejected"]["seq_jump"] -= n
            else:
                self.stats["stored"][key] -= n
        self._acks.clear()
        self._pending.clear()
        self._uncommitted = 0
        self._touched.clear()
        if self.conn is not None and self.conn.client is not None:
            self.conn.client.disconnect()

    # MQTT --------------------------------------------------------------------------------
    @property
    def subscription(self) -> str:
        """The shared subscription (MQTT 5); a plain one on MQTT 3.1.1, where ``$share`` is not standard."""
        if not self.config.broker.mqtt5:
            return fleet_filter(self.config.fleet)
        return shared(self.config.group, fleet_filter(self.config.fleet))

    def _admit(self, qos: int) -> bool:
        """Whether one more message fits the backlog (see the module doc); counts and logs what does not. At the
        bound a QoS 1 message is taken and the socket is no longer read until the writer has taken the backlog
        (flow control: the broker holds the rest, and sends it when TCP's window opens again)."""
        n = len(self._pending)
        if n > self.stats["backlog_high"]:
            self.stats["backlog_high"] = n
        if n < self.config.max_backlog:
            return True
        if not qos:
            self.stats["received"] += 1
            self.stats["shed"] += 1
            self._ratelog.warning(
                "shed",
                "backlog full (%d messages waiting for the database): shedding QoS 0 messages (%d so far)",
                n,
                self.stats["shed"],
            )
            return False
        self._pause_reading()
        return True

    def _pause_reading(self) -> None:
        client = self.conn.client if self.conn is not None else None
        if self.loop is None or client is None or self._paused_client is client:
            return
        self.loop.pause_reading(client, True)
        self._paused_client = client
        self.stats["read_pauses"] += 1
        self._ratelog.info(
            "paused",
            "backlog full (%d messages waiting for the database): not reading from the broker until the writer "
            "catches up (%d pauses so far)",
            len(self._pending),
            self.stats["read_pauses"],
        )

    def _resume_reading(self) -> None:
        """Loop thread, after every round: read again once the backlog is below the bound."""
        client, loop = self._paused_client, self.loop
        if client is not None and len(self._pending) < self.config.max_backlog:
            self._paused_client = None
            if loop is not None:
                loop.pause_reading(client, False)

    def _message(self, conn: Connection, msg: Any) -> None:
        if not self._admit(msg.qos):
            return
        try:
            topic = msg.topic
        except UnicodeDecodeError:
            topic = "<not UTF-8>"
        try:
            self.add(topic, msg.payload)
        except Exception as e:  # a bug, not a message: re-delivered after the reconnect, not acknowledged
            self._db_failed(e)
            return
        self._acks.append((conn.client, msg.mid, msg.qos))
        if self._batch_t0 is None:
            self._batch_t0 = time.monotonic()
        if len(self._acks) >= self.config.batch_max:
            self._batch_due()

    def _lite_message(self, conn: Any, client: Any, topic: str, payload: bytes | TooLarge, mid: int, qos: int) -> None:
        """``_message`` for the lean client (edge.mqtt.lite): the same, without a message object."""
        if not self._admit(qos):
            return
        try:
            self.add(topic, payload)
        except Exception as e:  # a bug, not a message: re-delivered after the reconnect, not acknowledged
            self._db_failed(e)
            return
        self._acks.append((client, mid, qos))
        if self._batch_t0 is None:
            self._batch_t0 = time.monotonic()
        if len(self._acks) >= self.config.batch_max:
            self._batch_due()

    def start(self, loop: NetworkLoop | None = None) -> Collector:
        c = self.config
        if not c.broker.mqtt5:
            log.warning(DEGRADED["collector"])
        self.loop = loop or NetworkLoop(name="edgekit-collector").start()
        self._own_loop = loop is None
        if c.client == "lite":
            conn: Connection | LiteConnection = LiteConnection(
                self.loop,
                c.broker,
                str(c.client_id),
                subscriptions=[(self.subscription, 1)],
                on_publish=self._lite_message,
                clean_start=False,
                session_expiry_s=c.session_expiry_s,
                receive_maximum=c.receive_maximum,
                backoff=c.backoff,
            )
        else:
            conn = Connection(
                self.loop,
                c.broker,
                str(c.client_id),
                subscriptions=[(self.subscription, 1)],
                on_message=self._message,
                options=ConnectOptions(
                    clean_start=False,
                    session_expiry_s=c.session_expiry_s,
                    manual_ack=True,
                    receive_maximum=c.receive_maximum,
                    backoff=c.backoff,
                ),
            )
        self.conn = conn
        self.loop.run(self.loop.after_io, self._after_io)
        if c.pipeline:
            self._writer = threading.Thread(target=self._write_batches, name="edgekit-collector-writer", daemon=True)
            self._writer.start()
        conn.start()
        return self

    def tracked(self) -> dict[str, int]:
        """How many entries each in-memory map holds (each at most ``config.max_tracked``)."""
        return {
            "births": len(self._births),
            "rebirth_requests": len(self._rebirth_at),
            "gaps": len(self._gappy),
            "topics": len(self._topics),
            "streams": len(self._positions),
        }

    def snapshot(self) -> dict[str, Any]:
        """The counters, read on the loop thread (consistent)."""
        stats: dict[str, Any] = (
            json.loads(json.dumps(self.stats))
            if self.loop is None
            else self.loop.run(lambda: json.loads(json.dumps(self.stats)))
        )
        return stats

    @property
    def connected(self) -> bool:
        return self.conn is not None and self.conn.connected

    def stop(self, timeout: float = 5.0) -> None:
        if self.loop is not None and self.conn is not None:
            self.loop.run(self.flush, timeout=max(timeout, 60.0))  # the writer's batch, then the rest
            self.loop.run(self.conn.close)
            self.conn.closed.wait(timeout)
            if self._own_loop:
                self.loop.stop()
        if self._writer is not None:
            self._batches.put(None)
            self._writer.join(timeout)
            self._writer = None
        self.loop = None
        if self._own_db:
            self.db.close()

    def __enter__(self) -> Collector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
