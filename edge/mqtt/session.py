"""The device side of the protocol on one MQTT connection: birth, death, sequence numbers, outbox.

Used by the real agent (one session) and by the fleet simulator (a thousand on one loop).
Everything here runs on the ``NetworkLoop`` thread; other threads use ``submit_threadsafe``.

- Before every connection attempt the will is armed: a retained death carrying this
  attempt's ``connection`` number.
- After every CONNACK: the retained birth is published, the subscription table
  (``cmd/+``) is replayed by the connection, and the outbox is pumped.
- The pump publishes outbox rows oldest first, QoS 1, at most ``max_inflight`` at a time;
  a row is deleted when its PUBACK arrives. Rows made before the current connection are
  re-encoded with ``historical: true``.
- A PUBACK with reason "no matching subscribers" (MQTT 5, 0x10) means the broker took the
  message and gave it to nobody: typically the collector has not (re-)subscribed yet, e.g.
  right after a broker restart (Mosquitto 2.0 does not restore shared subscriptions from its
  persistence file). The row is kept, the stream is held and rewound to the oldest such row,
  and resumed after a back-off, so the outbox (not the void) keeps what nobody received.
- ``cmd/rebirth`` re-publishes the birth (a collector that lost track asks for it).
- With ``on_desired``, the retained ``desired`` topic is subscribed too and its payloads handed
  over; ``publish_reported`` publishes the retained ``reported`` state, again after every CONNACK.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from edge.mqtt.client import DEGRADED, BrokerConfig
from edge.mqtt.identity import DeviceIdentity
from edge.mqtt.netloop import Backoff, Connection, ConnectOptions, NetworkLoop, Will
from edge.mqtt.outbox import Outbox
from edge.mqtt.payloads import STREAM_KINDS, encode, mark_historical, message
from edge.mqtt.ratelog import RateLimitedLog
from edge.mqtt.topics import Topic

log = logging.getLogger("edge.agent")
REBIRTH_MIN_INTERVAL_S = 1.0
NO_MATCHING_SUBSCRIBERS = 0x10


@functools.lru_cache(maxsize=1)
def _say_degraded() -> None:
    """Once per process (a simulated fleet has a thousand sessions)."""
    log.warning(DEGRADED["agent"])


@dataclass(frozen=True)
class SessionOptions:
    """How a :class:`DeviceSession` connects and sends: its client id (default ``edgekit-FLEET-DEVICE``), the
    QoS 1 messages in flight at most, the reconnect back-off, and whether (and how patiently) it holds the
    outbox when the broker answers that no subscriber matched (``hold_unmatched``/``hold_backoff``), and the
    device's identity key that signs its births and deaths (``edge.mqtt.identity``; None: unsigned, as before)."""

    client_id: str | None = None
    max_inflight: int = 20
    backoff: Backoff = Backoff()
    hold_unmatched: bool = True
    hold_backoff: Backoff = Backoff(0.5, 30.0)
    identity: DeviceIdentity | None = None


class DeviceSession:
    def __init__(
        self,
        loop: NetworkLoop,
        broker: BrokerConfig,
        fleet: str,
        device: str,
        outbox: Outbox,
        *,
        birth_body: Callable[[], dict[str, Any]],
        on_command: Callable[[str, bytes], None] | None = None,
        on_desired: Callable[[bytes], None] | None = None,
        options: SessionOptions = SessionOptions(),
    ) -> None:
        client_id, max_inflight, backoff = options.client_id, options.max_inflight, options.backoff
        hold_unmatched, hold_backoff = options.hold_unmatched, options.hold_backoff
        self.fleet, self.device, self.outbox, self.loop = fleet, device, outbox, loop
        self.topics = {
            k: str(Topic(fleet, device, k)) for k in ("birth", "telemetry", "state", "death", "reported", "desired")
        }
        self.cmd_filter = str(Topic(fleet, device, "cmd", "x"))[:-1] + "+"
        self._birth_body, self._on_command, self._on_desired = birth_body, on_command, on_desired
        self.identity = options.identity
        self._reported: bytes | None = None  # the latest reported state, re-published after every CONNACK
        self._ratelog = RateLimitedLog(log)  # whoever can publish to cmd/ chooses how often these happen
        self.max_inflight = max_inflight
        self.session = outbox.next_session()
        self.seq = 0  # last stream seq issued in this session
        self.connection = 0  # connection attempts in this session (the will of attempt n carries n)
        self._inflight: dict[int, int] = {}  # mid -> outbox row id
        self._inflight_rows: set[int] = set()
        self.hold_unmatched, self._hold_backoff = hold_unmatched, hold_backoff
        self._held = False
        self._rewind_to: int | None = None
        self._hold_attempts = 0
        self._control: dict[int, threading.Event] = {}  # mid -> set on PUBACK (death at shutdown)
        self._last_sent = 0
        self._high_sent = 0
        self._last_birth = 0.0
        self.counters = {
            "published": 0,
            "replayed": 0,
            "rejected_by_broker": 0,
            "unmatched": 0,
            "births": 0,
            "rebirth_requests": 0,
            "unknown_commands": 0,
        }
        if not broker.mqtt5:
            _say_degraded()
        self.conn = Connection(
            loop,
            broker,
            client_id or f"edgekit-{fleet}-{device}",
            subscriptions=[(self.cmd_filter, 1)] + ([(self.topics["desired"], 1)] if on_desired is not None else []),
            will=self._will,
            on_connected=self._connected,
            on_disconnected=self._disconnected,
            on_message=self._message,
            on_published=self._published,
            options=ConnectOptions(backoff=backoff),
        )

    def start(self) -> None:
        self.conn.start()

    @property
    def connected(self) -> bool:
        return self.conn.connected

    def _conn_key(self) -> str:
        return f"{self.session}:{self.connection}"

    # control messages --------------------------------------------------------------------
    def _will(self) -> Will:
        self.connection += 1
        death = message(
            "death",
            self.fleet,
            self.device,
            self.session,
            self.seq,
            {"connection": self.connection, "reason": "last will: connection lost"},
        )
        return Will(self.topics["death"], self._signed(death), qos=1, retain=True)  # fixed now: signed now

    def _signed(self, msg: dict[str, Any]) -> bytes:
        """A birth or death as sent: signed with the device's key when it has one."""
        return encode(msg) if self.identity is None else self.identity.sign(msg)

    def _publish_birth(self) -> None:
        body = {"connection": self.connection, **self._birth_body()}
        birth = message("birth", self.fleet, self.device, self.session, self.seq, body)
        self.conn.publish(self.topics["birth"], self._signed(birth), qos=1, retain=True)
        self.counters["births"] += 1
        self._last_birth = time.monotonic()

    def _connected(self, _conn: Connection) -> None:
        self._publish_birth()
        if self._reported is not None:
            self.conn.publish(self.topics["reported"], self._reported, qos=1, retain=True)
        self.pump()

    def _disconnected(self, _conn: Connection, _why: str) -> None:
        self._inflight.clear()
        self._inflight_rows.clear()
        self._last_sent = 0  # the next connection starts again from the oldest unacknowledged row
        self._rewind_to = None
        for ev in self._control.values():
            ev.set()
        self._control.clear()

    def _message(self, _conn: Connection, msg: Any) -> None:
        try:
            t = Topic.parse(msg.topic)
        except Exception:
            return
        if t.device != self.device or t.fleet != self.fleet:
            return
        if t.kind == "desired":
            if self._on_desired is not None:
                self._on_desired(bytes(msg.payload))
            return
        if t.kind != "cmd":
            return
        if t.command == "rebirth":
            self.counters["rebirth_requests"] += 1
            if time.monotonic() - self._last_birth >= REBIRTH_MIN_INTERVAL_S:
                self._publish_birth()
        elif self._on_command is not None:
            self._on_command(str(t.command), bytes(msg.payload))
        else:
            self.counters["unknown_commands"] += 1
            self._ratelog.info("unknown_command", "%s: ignoring unknown command %r", self.device, t.command)

    # the durable stream ------------------------------------------------------------------
    def submit(self, kind: str, body: dict[str, Any]) -> int:
        """Number ``body``, write it to the outbox, and send it if connected. Loop thread only."""
        if kind not in STREAM_KINDS:
            raise ValueError(f"{kind!r} is not a stream message kind")
        self.seq += 1
        msg = message(kind, self.fleet, self.device, self.session, self.seq, {"historical": False, **body})
        key = self._conn_key() if self.conn.connected else None
        self.outbox.append(self.topics[kind], encode(msg), key)
        self.pump()
        return self.seq

    def publish_reported(self, body: dict[str, Any]) -> None:
        """The retained reported state (loop thread); kept and re-published after every CONNACK."""
        self._reported = encode(message("reported", self.fleet, self.device, self.session, self.seq, body))
        self.conn.publish(self.topics["reported"], self._reported, qos=1, retain=True)

    def submit_threadsafe(self, kind: str, body: dict[str, Any]) -> None:
        self.loop.call_soon(self.submit, kind, body)

    def pump(self) -> None:
        if not self.conn.connected or self._held:
            return
        room = self.max_inflight - len(self._inflight)
        while room > 0:
            rows = self.outbox.peek(self._last_sent, room)
            if not rows:
                return
            for row in rows:
                if row.id in self._inflight_rows:  # still in flight from before a rewind
                    self._last_sent = row.id
                    continue
                # live: made on this connection and sent for the first time; anything else is a replay
                live = row.conn_key == self._conn_key() and row.id > self._high_sent
                self._high_sent = max(self._high_sent, row.id)
                payload = row.payload if live else mark_historical(row.payload)
                mid = self.conn.publish(row.topic, payload, qos=1)
                if mid is None:
                    return
                self._inflight[mid] = row.id
                self._inflight_rows.add(row.id)
                self._last_sent = row.id
                self.counters["published"] += 1
                if not live:
                    self.counters["replayed"] += 1
                room -= 1

    def _published(self, _conn: Connection, mid: int, code: int) -> None:
        ev = self._control.pop(mid, None)
        if ev is not None:
            ev.set()
            return
        row = self._inflight.pop(mid, None)
        if row is None:
            return
        self._inflight_rows.discard(row)
        if code == NO_MATCHING_SUBSCRIBERS and self.hold_unmatched:
            self.counters["unmatched"] += 1
            self._hold(row)
            return
        if code >= 0x80:  # e.g. not authorised: retrying would block the stream forever
            self.counters["rejected_by_broker"] += 1
            self._ratelog.error(
                "rejected_by_broker",
                "%s: broker rejected a message (reason code 0x%02x); dropped "
                "(0x87: not authorized: is the device id the CN of this device's certificate?)",
                self.device,
                code,
            )
        else:
            self._hold_attempts = 0
        self.outbox.ack(row)
        self.pump()

    def _hold(self, row_id: int) -> None:
        self._rewind_to = row_id if self._rewind_to is None else min(self._rewind_to, row_id)
        if self._held:
            return
        self._held = True
        delay = self._hold_backoff.delay(self._hold_attempts)
        self._hold_attempts += 1
        log.log(
            logging.INFO if self._hold_attempts == 1 else logging.DEBUG,
            "%s: no subscriber took message #%d; holding the outbox (%d pending), retry in %.1f s",
            self.device,
            row_id,
            self.outbox.pending(),
            delay,
        )
        self.loop.call_later(delay, self._resume)

    def _resume(self) -> None:
        self._held = False
        if self._rewind_to is not None:
            self._last_sent = min(self._last_sent, self._rewind_to - 1)
            self._rewind_to = None
        self.pump()

    # shutdown ----------------------------------------------------------------------------
    def drain(self, timeout: float) -> bool:
        """Wait (from another thread) until the outbox is empty; False when it is not by ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.loop.run(lambda: self.outbox.pending() == 0 or not self.conn.connected):
                break
            time.sleep(0.02)
        return bool(self.loop.run(self.outbox.pending) == 0)

    def publish_death(self, reason: str) -> int | None:
        """A retained death for the current connection (loop thread); its mid, None when not connected."""
        msg = message(
            "death", self.fleet, self.device, self.session, self.seq, {"connection": self.connection, "reason": reason}
        )
        return self.conn.publish(self.topics["death"], self._signed(msg), qos=1, retain=True)

    def close(self, timeout: float = 5.0, reason: str = "shutdown") -> None:
        """Publish a retained death (when connected), wait for its PUBACK, disconnect. From another thread."""
        acked = threading.Event()

        def death() -> None:
            mid = self.publish_death(reason)
            if mid is None:
                acked.set()
            else:
                self._control[mid] = acked

        deadline = time.monotonic() + timeout
        self.loop.run(death)
        acked.wait(max(0.0, deadline - time.monotonic()))
        self.loop.run(self.conn.close)
        self.conn.closed.wait(max(0.1, deadline - time.monotonic()))
