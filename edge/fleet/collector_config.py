"""The collector's configuration and the state its parts share (``edge.fleet.collector``)."""

from __future__ import annotations

import queue
import socket
import threading
from collections import OrderedDict
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from edge.errors import EdgeError, InputFileError
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


def option(default: Any, flag: str, help: str) -> Any:  # noqa: A002 - the word the CLI uses
    """A ``CollectorConfig`` field that is also a command-line option (``edgekit fleet collect FLAG``) and a key of
    the collector's config file (``--config``): declared once, here (``options()``)."""
    return field(default=default, metadata={"flag": flag, "help": help})


@dataclass
class CollectorConfig:
    """Everything a collector is told. The fields made with ``option()`` are ``edgekit fleet collect``'s options
    and the keys of its ``--config`` TOML file (generated from here: ``options()``, ``from_file()``)."""

    broker: BrokerConfig
    db_url: str = "sqlite:///fleet.db"
    fleet: str = option("+", "--fleet", "Fleet to collect ('+': every fleet).")
    group: str = option(
        "edgekit-collectors",
        "--group",
        "Shared-subscription group: collectors in one group split the messages between them.",
    )
    client_id: str | None = option(
        None,
        "--client-id",
        "MQTT client id; keep it stable, the broker keeps this collector's messages under it while it is away "
        "(default: edgekit-collector-<group>-<hostname>).",
    )
    session_expiry_s: int = option(
        3600, "--session-expiry", "How long (s) the broker keeps messages for this collector while it is disconnected."
    )
    max_payload_bytes: int = MAX_PAYLOAD_BYTES
    rebirth_interval_s: float = option(
        30.0, "--rebirth-interval", "At most one rebirth request per device per this many seconds."
    )
    gap_grace_s: float = 10.0  # a gap shorter than this is a replay in progress, not worth a log line
    # messages per transaction at most... (5000: measured at 10,000 devices x 1 Hz on 2 shared cores, p99 764 ms vs
    # 2.3 s with 2000, the backlog no longer growing; drain +23 % on SQLite, +20 % on PostgreSQL)
    batch_max: int = option(
        5000,
        "--batch-max",
        "Messages per database transaction at most; they are acknowledged to the broker after its commit.",
    )
    # ...and at most this long after the first one arrived (0: every read round)
    batch_interval_ms: float = option(
        50.0,
        "--batch-interval-ms",
        "Commit at most this long after a batch's first message (0: after every read from the socket); bounds "
        "the delay batching adds.",
    )
    receive_maximum: int = option(
        10_000, "--receive-maximum", "Unacknowledged messages the broker may send (MQTT 5); at least --batch-max."
    )
    # a few MB at the default: a decoded telemetry message holds about 1 KB
    max_backlog: int = option(
        0,
        "--max-backlog",
        "Messages waiting for the database at most: past it QoS 0 messages are shed (counted) and the socket is "
        "not read until the writer catches up (0: twice --batch-max, at least 20000).",
    )
    max_session_skew_s: float = option(
        MAX_SESSION_SKEW_S,
        "--max-session-skew",
        "Refuse (and count) messages whose session is further ahead of this host's clock, in seconds: a forged "
        "far-future session would otherwise hide a device's real messages.",
    )
    max_tracked: int = 100_000  # per-device (and per-stream) entries kept in memory, each map
    # an agent's seq grows by one a message and every reconnect's birth announces it, so a real stream never
    # jumps this far between two messages the collector sees
    max_seq_jump: int = option(
        1_000_000,
        "--max-seq-jump",
        "Refuse (count, flag in fleet status) a message this far past its stream's position: forged or broken.",
    )
    max_reorder: int = option(
        100,
        "--max-reorder",
        "A live message this far below its stream's position puts the stream and the device's row back to it "
        "(the position was a forged message's; 999,999 ahead froze a row for 58 days at 5 s).",
    )
    backoff: Backoff = field(default_factory=Backoff)
    client: str = option(
        "lite",
        "--client",
        "MQTT client: lite (a lean subscriber that parses many messages per socket read) or paho (paho-mqtt); "
        "both acknowledge after the commit.",
    )
    pipeline: bool = option(
        True,
        "--pipeline/--no-pipeline",
        "Write and commit each batch on a writer thread while the next one is read and decoded (default); "
        "--no-pipeline does both on the network thread, one after the other.",
    )

    @classmethod
    def options(cls) -> list[Field[Any]]:
        """The fields that are command-line options and config-file keys, in declaration order."""
        return [f for f in fields(cls) if "flag" in f.metadata]

    @classmethod
    def from_file(cls, path: Path) -> dict[str, Any]:
        """The option values a TOML file sets (keys: the field names, e.g. ``batch_max = 2000``); unknown keys and
        values of the wrong type are refused, all at once."""
        from edge.base.typedjson import Invalid, loads_toml_strict

        try:
            data = loads_toml_strict(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, Invalid) as e:
            raise InputFileError(f"cannot read the collector config {path}: {e}") from None
        known = {f.name: f for f in cls.options()}
        problems = [f"unknown key {k!r}" for k in data if k not in known]
        for k, v in data.items():
            f = known.get(k)
            if f is None:
                continue
            want = type(f.default) if f.default is not None else str
            if want is float and type(v) is int:
                data[k] = float(v)
            elif type(v) is not want:
                problems.append(f"{k} must be {want.__name__}, not {type(v).__name__}")
        if problems:
            raise InputFileError(f"{path}: " + "; ".join(problems), hint="keys: " + ", ".join(known))
        return data

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
    def _write(self, pending: list[Queued] | None = None) -> list[bool | str]:
        raise NotImplementedError

    def _key_refusal(self, d: Decoded, now: float) -> str | None:
        raise NotImplementedError

    def _check_gaps(self) -> None:
        raise NotImplementedError

    def _check_known(self, fleet: str, device: str, session: int, known: int | None) -> None:
        raise NotImplementedError

    def _batch_due(self) -> None:
        raise NotImplementedError

    def _db_failed(self, e: BaseException) -> None:
        raise NotImplementedError
