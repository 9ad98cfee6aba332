"""The collector's configuration and the state its parts share (``edge.fleet.collector``)."""

from __future__ import annotations

import queue
import socket
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from edge.errors import EdgeError
from edge.fleet.db import FleetDB
from edge.fleet.decode import MAX_PAYLOAD_BYTES, MAX_SESSION_SKEW_S, REASONS, Decoded
from edge.mqtt.client import BrokerConfig
from edge.mqtt.lite import LiteConnection
from edge.mqtt.netloop import Backoff, Connection, NetworkLoop, Timer
from edge.mqtt.ratelog import RateLimitedLog
from edge.mqtt.topics import check_part

# a decoded message, its payload as text, when it arrived, and for telemetry its values (``telemetry_columns``):
# read as it arrives, so the parsed payload (some fifty objects) is freed at once instead of living until the
# batch is written (measured: JSON parsing 2.8 instead of 5.0 µs a message when nothing parsed is kept)
Queued = tuple[Decoded, str, float, "tuple[Any, ...] | None"]
CLIENTS = ("paho", "lite")
READ: Any = MappingProxyType({})  # the payload of a queued telemetry message: its values were read as it arrived


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


def new_stats() -> dict[str, Any]:
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
class StreamUpdate:
    """What one batch of newly stored stream messages changes (``Collector._aggregate``)."""

    streams: dict[tuple[str, str, int], list[Any]] = field(default_factory=dict)  # count, highest seq, last time
    seen: dict[tuple[str, str], float] = field(default_factory=dict)  # device -> last seen
    latest: dict[tuple[str, str, str], tuple[int, int, int]] = field(default_factory=dict)  # (session, seq, index)
    carried: dict[tuple[str, str], list[Any]] = field(default_factory=dict)  # the latest non-null interval, bundle
    births: dict[tuple[str, str], int] = field(default_factory=dict)  # device -> its latest birth's session


class CollectorState:
    """What the collector's parts share (``Collector.__init__`` sets it): the parts are mixins of one object, each
    in its own module (intake and MQTT: ``collector``; batching and the pipeline: ``collector_batch``; the
    database writes: ``collector_writer``; rebirth requests: ``collector_rebirth``)."""

    config: CollectorConfig
    db: FleetDB
    stats: dict[str, Any]
    loop: NetworkLoop | None
    conn: Connection | LiteConnection | None
    _acks: list[tuple[Any, int, int]]
    _births: Bounded[tuple[str, str], int]
    _rebirth_at: Bounded[tuple[str, str], float]
    _touched: set[tuple[str, str, int]]
    _gappy: Bounded[tuple[str, str, int], tuple[float, bool]]
    _positions: Bounded[tuple[str, str, int], int]
    _rewound: dict[int, int]
    _ratelog: RateLimitedLog
    _pending: list[Queued]
    _uncommitted: int
    _tally: dict[str, int]
    _batch_t0: float | None
    _timer: Timer | None
    _writer: threading.Thread | None
    _batches: queue.SimpleQueue[tuple[list[Queued], list[tuple[Any, int, int]]] | None]
    _inflight: bool
    _idle: threading.Event
    _done: tuple[list[tuple[Any, int, int]], BaseException | None] | None
    _broken: bool
    _paused_client: Any

    # implemented by the parts (declared here so that each part knows the others' signatures)
    def _write(self, pending: list[Queued] | None = None) -> list[bool | None]:
        raise NotImplementedError

    def _check_gaps(self) -> None:
        raise NotImplementedError

    def _check_known(self, fleet: str, device: str, session: int, known: int | None) -> None:
        raise NotImplementedError

    def _batch_due(self) -> None:
        raise NotImplementedError

    def _db_failed(self, e: BaseException) -> None:
        raise NotImplementedError
