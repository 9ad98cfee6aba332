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
- Forged births and deaths: each device's identity key is pinned at its first signed birth (``device_keys``), and
  a birth or death that key did not sign is refused (``unsigned``, ``wrong_key``, ``bad_signature``), counted and
  shown by ``fleet status`` (``edge.fleet.collector_keys``, ``edge.fleet.device_keys``; the device side:
  ``edge.mqtt.identity``). Devices that sign nothing are never pinned and are handled as before.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from typing import Any

from edge.fleet.collector_batch import Batching
from edge.fleet.collector_config import CLIENTS, READ, Bounded, CollectorConfig, CollectorState, Queued, new_stats
from edge.fleet.collector_keys import Keys
from edge.fleet.collector_rebirth import Rebirth
from edge.fleet.collector_writer import Writer
from edge.fleet.db import COLLECTOR_APPLICATION, FleetDB, open_db
from edge.fleet.decode import Decoded, Rejected, TopicCache, decode, telemetry_columns
from edge.mqtt.client import DEGRADED
from edge.mqtt.lite import LiteConnection, TooLarge
from edge.mqtt.netloop import Connection, ConnectOptions, NetworkLoop, Timer
from edge.mqtt.ratelog import RateLimitedLog
from edge.mqtt.topics import fleet_filter, shared

log = logging.getLogger("edge.fleet")

__all__ = ["CLIENTS", "Collector", "CollectorConfig"]


class Collector(Batching, Writer, Keys, Rebirth, CollectorState):
    def __init__(self, config: CollectorConfig, *, db: FleetDB | None = None) -> None:
        self.config = config
        self.db = db if db is not None else open_db(config.db_url, application_name=COLLECTOR_APPLICATION)
        self._own_db = db is None
        self.stats = new_stats()
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
        self._pending: list[Queued] = []  # decoded, not written yet
        self._uncommitted = 0  # written, not committed yet
        # what the open transaction added to stats["stored"] and stats["duplicates"]: taken back on a rollback, so
        # a batch that fails and is re-delivered is counted once
        self._tally: dict[str, int] = {}
        self._batch_t0: float | None = None  # when the first message of the open batch arrived (monotonic)
        self._timer: Timer | None = None  # wakes the loop when the open batch is due
        self._own_loop = False
        # the pipeline (loop thread: _inflight, _broken; writer thread: _write, _check_gaps, commit)
        self._writer: threading.Thread | None = None
        self._batches: queue.SimpleQueue[tuple[list[Queued], list[tuple[Any, int, int]]] | None] = queue.SimpleQueue()
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
            d = Decoded(d.kind, d.fleet, d.device, d.session, d.seq, d.ts, READ, d.connection, d.historical)
        text = payload.decode("utf-8") if isinstance(payload, bytes) else ""  # decode refuses a TooLarge
        self._pending.append((d, text, now, m))
        return None

    def handle(self, topic: str, payload: bytes, received_at: float | None = None) -> str:
        """Decode and store one message (not committed until ``flush``). Returns what happened."""
        reason = self.add(topic, payload, received_at)
        if reason is not None:
            return reason
        new = self._write()[-1]
        return new if isinstance(new, str) else "stored" if new else "duplicate"

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
