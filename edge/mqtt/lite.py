"""A lean MQTT 5 / 3.1.1 subscriber for the collector (``edgekit fleet collect --client lite``).

paho-mqtt reads one packet per call and builds a message object (and, on MQTT 5, property
objects) for each: measured, that caps the collector near 30,000 messages per CPU-second before
it stores anything. This client does only what the collector needs:

- CONNECT (clean start false, session expiry, receive maximum, maximum packet size, user name
  and password, TLS through ``BrokerConfig.ssl_context``), one SUBSCRIBE (QoS 1, shared or
  plain), PUBLISH received at QoS 0/1, PUBACK written only when the owner calls ``ack`` (the
  collector does after its commit), PUBLISH QoS 1 out (rebirth requests), PINGREQ keep-alive,
  DISCONNECT; reconnects with the same back-off as ``edge.mqtt.netloop.Connection``.
- Reads whatever the socket holds in one ``recv`` and parses every whole packet in it; a
  PUBLISH becomes ``on_publish(topic, payload, mid, qos)`` and nothing else (its properties are
  skipped by their length).
- Everything read is untrusted: a packet over ``max_packet_bytes`` (announced to an MQTT 5
  broker as its Maximum Packet Size, so it drops such messages rather than sending them; an MQTT
  3.1.1 broker sends them: such a PUBLISH is handed on as ``TooLarge`` and its payload skipped
  unread, anything else oversized is refused), a malformed length, a packet type a subscriber never gets, or a field past its packet ends the
  connection with one logged line (``Malformed``) and a reconnect, never an exception out of the
  network loop.

It runs on the collector's ``NetworkLoop``: the client object looks to the loop like a paho client
(``loop_read``/``loop_write``/``loop_misc``/``socket`` and the socket callbacks ``watch`` sets).
"""

from __future__ import annotations

import logging
import socket
import ssl
import struct
import time
from typing import Any, Callable

from edge.errors import daemon_error_line
from edge.mqtt.client import BrokerConfig
from edge.mqtt.netloop import Backoff, NetworkLoop, Reconnecting

log = logging.getLogger("edge.mqtt")

MAX_PACKET_BYTES = 1 << 20  # the collector refuses payloads over 64 KiB anyway (counted as oversized)


class TooLarge:
    """The payload of a PUBLISH over ``max_packet_bytes``, skipped unread: only its length is known (``len``)."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"TooLarge({self.size})"


READ_BYTES = 1 << 20
NOT_UTF8 = "<not UTF-8>"

CONNECT, CONNACK, PUBLISH, PUBACK, SUBSCRIBE, SUBACK, PINGREQ, PINGRESP, DISCONNECT = 1, 2, 3, 4, 8, 9, 12, 13, 14
#: packets a subscriber can get from a broker, and the fixed-header flags each must carry (PUBLISH: any)
_FLAGS = {CONNACK: 0, PUBACK: 0, SUBACK: 0, PINGRESP: 0, DISCONNECT: 0}

# MQTT 5 property identifiers by the size of their value
_P_BYTE = frozenset((0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A))
_P_TWO = frozenset((0x13, 0x21, 0x22, 0x23))
_P_FOUR = frozenset((0x02, 0x11, 0x18, 0x27))
_P_VARINT = frozenset((0x0B,))
_P_STRING = frozenset((0x03, 0x08, 0x12, 0x15, 0x1A, 0x1C, 0x1F, 0x09, 0x16))  # strings and binary data alike
_P_PAIR = frozenset((0x26,))


class Malformed(Exception):
    """A packet this client will not accept; the message is the one-line reason."""


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def mqtt_string(s: str | bytes) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else s
    if len(b) > 65535:
        raise ValueError("an MQTT string is at most 65535 bytes")
    return struct.pack("!H", len(b)) + b


def mqtt_packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + varint(len(body)) + body


def _read_varint(data: bytes, p: int, end: int) -> tuple[int, int]:
    """A variable byte integer at ``p`` (not past ``end``): its value and the position after it."""
    n = shift = 0
    for _ in range(4):
        if p >= end:
            raise Malformed("variable byte integer runs past the packet")
        b = data[p]
        p += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, p
        shift += 7
    raise Malformed("variable byte integer longer than 4 bytes")


def properties(data: bytes, p: int, end: int) -> tuple[dict[int, Any], int]:
    """MQTT 5 properties at ``p``: {identifier: value} (the last one wins; user properties dropped), position after."""
    length, p = _read_varint(data, p, end)
    stop = p + length
    if stop > end:
        raise Malformed(f"properties of {length} bytes run past the packet")
    out: dict[int, Any] = {}
    while p < stop:
        pid = data[p]
        p += 1
        if pid in _P_BYTE:
            size = 1
        elif pid in _P_TWO:
            size = 2
        elif pid in _P_FOUR:
            size = 4
        elif pid in _P_VARINT:
            v, p = _read_varint(data, p, stop)
            out[pid] = v
            continue
        elif pid in _P_STRING or pid in _P_PAIR:
            for _ in range(2 if pid in _P_PAIR else 1):
                if p + 2 > stop:
                    raise Malformed(f"property 0x{pid:02x} runs past its properties")
                n = (data[p] << 8) | data[p + 1]
                if p + 2 + n > stop:
                    raise Malformed(f"property 0x{pid:02x} runs past its properties")
                if pid not in _P_PAIR:
                    out[pid] = bytes(data[p + 2 : p + 2 + n])
                p += 2 + n
            continue
        else:
            raise Malformed(f"unknown property 0x{pid:02x}")
        if p + size > stop:
            raise Malformed(f"property 0x{pid:02x} runs past its properties")
        out[pid] = int.from_bytes(data[p : p + size], "big")
        p += size
    return out, stop


class PacketReader:
    """Splits a byte stream into MQTT packets a subscriber receives.

    ``feed(data)`` parses every whole packet: a PUBLISH calls ``on_publish(topic, payload, mid, qos)``
    (mid 0 at QoS 0), anything else ``on_control(type, body)``; a partial packet waits for the next
    ``feed``. Raises ``Malformed`` at the first packet it will not take (the connection is then
    unusable: the caller closes it). ``on_publish`` may set ``stopped`` to end the current ``feed``."""

    __slots__ = ("mqtt5", "max_packet", "on_publish", "on_control", "_rest", "stopped", "_topics", "_skip")

    def __init__(
        self,
        mqtt5: bool,
        on_publish: Callable[[str, bytes | TooLarge, int, int], None],
        on_control: Callable[[int, bytes], None],
        max_packet: int = MAX_PACKET_BYTES,
    ) -> None:
        self.mqtt5, self.max_packet = mqtt5, max_packet
        self.on_publish, self.on_control = on_publish, on_control
        self._rest = b""
        self.stopped = False
        self._topics: dict[bytes, str] = {}
        self._skip = 0  # bytes of an oversized PUBLISH's payload still to discard as they arrive

    @property
    def buffered(self) -> int:
        return len(self._rest)

    def _oversized(self, data: bytes, p: int, q: int, length: int) -> int | None:
        """An oversized PUBLISH at ``p`` (its remaining length ``length`` starts at ``q``): hand it on as
        ``TooLarge`` once its topic and packet id are here, and skip its payload; where parsing goes on, or None
        to wait for more bytes (at most a 64 KiB topic's worth is held)."""
        n, b0 = len(data), data[p]
        qos = (b0 >> 1) & 3
        if qos > 1:
            raise Malformed(
                f"PUBLISH at QoS {qos}: this client subscribes at QoS 1" if qos == 2 else "PUBLISH with QoS bits 3"
            )
        if q + 2 > n:
            return None
        t = q + 2 + ((data[q] << 8) | data[q + 1])
        head = t + (2 if qos else 0)
        if head > q + length:
            raise Malformed("PUBLISH topic runs past the packet")
        if head > n:
            return None
        raw = data[q + 2 : t]
        if not raw:
            raise Malformed("PUBLISH with an empty topic (topic aliases were not allowed)")
        try:
            topic = raw.decode("utf-8")
        except UnicodeDecodeError:
            topic = NOT_UTF8
        mid = ((data[t] << 8) | data[t + 1]) if qos else 0
        if qos and not mid:
            raise Malformed("PUBLISH with packet id 0")
        end = q + length
        self.on_publish(topic, TooLarge(end - head), mid, qos)
        if end > n:
            self._skip = end - n
            return n
        return end

    def feed(self, data: bytes) -> None:
        if self._skip:
            drop = min(self._skip, len(data))
            self._skip -= drop
            data = data[drop:]
            if not data:
                return
        if self._rest:
            data = self._rest + data
            self._rest = b""
        n = len(data)
        p = 0
        on_publish = self.on_publish
        while p < n and not self.stopped:
            # fixed header: type and flags, then the remaining length (1 to 4 bytes)
            b0 = data[p]
            q = p + 1
            length = shift = 0
            while True:
                if q >= n:
                    if q - p > 4:
                        raise Malformed("remaining length longer than 4 bytes")
                    self._rest = data[p:]
                    return
                b = data[q]
                q += 1
                length |= (b & 0x7F) << shift
                if not b & 0x80:
                    break
                shift += 7
                if shift > 21:
                    raise Malformed("remaining length longer than 4 bytes")
            if length + (q - p) > self.max_packet:
                if b0 >> 4 != PUBLISH:
                    raise Malformed(f"packet of {length + (q - p)} bytes is over the limit of {self.max_packet}")
                # An MQTT 3.1.1 broker has no Maximum Packet Size to honour: refusing the packet would reconnect
                # and get it re-delivered for ever (one device's oversized message stopping the fleet's
                # telemetry). Its topic and packet id are read, its payload skipped unread as it arrives, and
                # the owner gets ``TooLarge`` for it (the collector counts it oversized and acknowledges it).
                got = self._oversized(data, p, q, length)
                if got is None:
                    self._rest = data[p:]
                    return
                p = got
                continue
            end = q + length
            if end > n:
                self._rest = data[p:]
                return
            kind = b0 >> 4
            if kind == PUBLISH:
                self._publish(data, b0, q, end, on_publish)
            else:
                want = _FLAGS.get(kind)
                if want is None:
                    raise Malformed(f"packet type {kind} is not one a subscriber receives")
                if b0 & 0x0F != want:
                    raise Malformed(f"packet type {kind} with reserved flags 0x{b0 & 0x0F:x}")
                self.on_control(kind, data[q:end])
                on_publish = self.on_publish  # a CONNACK changes it
            p = end
        if p < n:
            self._rest = data[p:]

    def _publish(self, data: bytes, b0: int, q: int, end: int, on_publish: Any) -> None:
        """One PUBLISH (its variable header from ``q``, the packet ending at ``end``) handed to ``on_publish``."""
        qos = (b0 >> 1) & 3
        if qos > 1:
            raise Malformed(
                f"PUBLISH at QoS {qos}: this client subscribes at QoS 1" if qos == 2 else "PUBLISH with QoS bits 3"
            )
        if q + 2 > end:
            raise Malformed("PUBLISH too short for its topic length")
        t = q + 2 + ((data[q] << 8) | data[q + 1])
        if t > end:
            raise Malformed("PUBLISH topic runs past the packet")
        raw = data[q + 2 : t]
        topics = self._topics
        topic = topics.get(raw)
        if topic is None:
            if not raw:
                raise Malformed("PUBLISH with an empty topic (topic aliases were not allowed)")
            try:
                topic = raw.decode("utf-8")
            except UnicodeDecodeError:
                topic = NOT_UTF8  # the collector counts and acknowledges it, as with paho
            if len(topics) >= 100_000:
                topics.clear()
            topics[raw] = topic
        mid = 0
        if qos:
            if t + 2 > end:
                raise Malformed("PUBLISH too short for its packet id")
            mid = (data[t] << 8) | data[t + 1]
            if not mid:
                raise Malformed("PUBLISH with packet id 0")
            t += 2
        if self.mqtt5:  # properties: skipped by their length
            b = data[t] if t < end else 0x80
            if b < 0x80:
                t += 1 + b
            else:
                plen, t = _read_varint(data, t, end)
                t += plen
            if t > end:
                raise Malformed("PUBLISH properties run past the packet")
        on_publish(topic, data[t:end], mid, qos)


class LiteClient:
    """One connection attempt: a socket, the packets read from it, the bytes waiting to be written.

    The network loop drives it like a paho client; ``Connection``-like bookkeeping is ``LiteConnection``'s."""

    def __init__(self, owner: LiteConnection) -> None:
        self.owner = owner
        self.mqtt5 = owner.broker.mqtt5
        self.reader = PacketReader(self.mqtt5, self._early_publish, self._control, owner.max_packet_bytes)
        self._sock: Any = None
        self._out = bytearray()
        self._want_write = False
        self.connacked = False
        self.keepalive = owner.broker.keepalive_s
        self.server_receive_max = 65535
        self._last_in = self._last_out = self._opened = time.monotonic()
        self._ping_at: float | None = None
        self._mid = 0
        self._inflight: set[int] = set()  # our QoS 1 publishes not acknowledged yet
        self.sub_mid = 0
        self.closed_reason: str | None = None
        self._heard = False  # any byte from the broker on this connection
        self._paused = False  # the loop does not read our socket (flow control, ``NetworkLoop.pause_reading``)
        # set by NetworkLoop.watch
        self.on_socket_open: Callable[..., None] | None = None
        self.on_socket_close: Callable[..., None] | None = None
        self.on_socket_register_write: Callable[..., None] | None = None
        self.on_socket_unregister_write: Callable[..., None] | None = None

    # connecting --------------------------------------------------------------------------
    def connect(self) -> None:
        """TCP (and TLS) connect, blocking for at most the broker's connect timeout, then CONNECT (to the node
        of the broker's addresses this attempt is for)."""
        b, o = self.owner.node, self.owner
        sock: Any = socket.create_connection((b.host, b.port), timeout=b.connect_timeout_s)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            ctx = b.ssl_context()
            if ctx is not None:
                sock = ctx.wrap_socket(sock, server_hostname=b.host)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._opened = self._last_in = time.monotonic()
        if self.on_socket_open:
            self.on_socket_open(self, None, sock)
        self._send(self._connect_packet(o))

    def _connect_packet(self, o: LiteConnection) -> bytes:
        b = o.broker
        flags = 0 if not o.clean_start else 0x02
        payload = mqtt_string(o.client_id)
        if b.username is not None:
            flags |= 0x80
            payload += mqtt_string(b.username)
            if b.password is not None:
                flags |= 0x40
                payload += mqtt_string(b.password)
        head = mqtt_string("MQTT") + bytes((5 if self.mqtt5 else 4, flags)) + struct.pack("!H", b.keepalive_s)
        if self.mqtt5:
            props = bytearray()
            if o.session_expiry_s:
                props += b"\x11" + struct.pack("!I", o.session_expiry_s)
            if o.receive_maximum:
                props += b"\x21" + struct.pack("!H", o.receive_maximum)
            props += b"\x27" + struct.pack("!I", o.max_packet_bytes)
            head += varint(len(props)) + bytes(props)
        return mqtt_packet(CONNECT << 4, head + payload)

    def subscribe(self, subs: list[tuple[str, int]]) -> None:
        self.sub_mid = self._next_mid()
        body = struct.pack("!H", self.sub_mid) + (b"\x00" if self.mqtt5 else b"")
        for topic, qos in subs:
            body += mqtt_string(topic) + bytes((qos & 3,))
        self._send(mqtt_packet((SUBSCRIBE << 4) | 0x02, body))

    def _next_mid(self) -> int:
        self._mid = self._mid % 65535 + 1
        return self._mid

    # the loop's interface ----------------------------------------------------------------
    def socket(self) -> Any:
        return self._sock

    def loop_read(self) -> None:
        """Everything the socket holds (TLS: record after record, up to ``READ_BYTES``), then every packet in it."""
        sock = self._sock
        if sock is None:
            return
        chunks: list[bytes] = []
        total, eof, error, reset = 0, False, None, False
        tls = isinstance(sock, ssl.SSLSocket)
        while total < READ_BYTES:
            try:
                data = sock.recv(READ_BYTES)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            except OSError as e:
                error = f"read failed: {e}"
                reset = isinstance(e, ConnectionResetError)
                break
            if not data:
                eof = True
                break
            chunks.append(data)
            total += len(data)
            if not tls:  # one recv took what the kernel held
                break
        if chunks:
            self._heard = True
            self._last_in = time.monotonic()
            try:
                self.reader.feed(chunks[0] if len(chunks) == 1 else b"".join(chunks))
            except Malformed as m:
                self.close(f"malformed packet from the broker: {m}", level=logging.WARNING)
                return
            except Exception as e:  # a bug behind the callback: drop the connection, unacknowledged ones come again
                log.error("%s: %s", self.owner.client_id, daemon_error_line("mqtt packet handling", e))
                self.close(f"error handling a packet: {type(e).__name__}", level=logging.WARNING)
                return
        if error or eof:
            if (eof or reset) and self.mqtt5 and not tls and not self._heard:
                self.owner._unanswered_mqtt5()  # plain TCP, CONNECT sent, closed without a byte of answer
            self.close(error or "the broker closed the connection")

    def loop_write(self) -> None:
        sock = self._sock
        if sock is None:
            return
        while self._out:
            try:
                n = sock.send(self._out)
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                break
            except OSError as e:
                self.close(f"write failed: {e}")
                return
            del self._out[:n]
        want = bool(self._out)
        if want != self._want_write:
            self._want_write = want
            cb = self.on_socket_register_write if want else self.on_socket_unregister_write
            if cb:
                cb(self, None, sock)

    def loop_misc(self) -> None:
        if self._sock is None:
            return
        now = time.monotonic()
        if not self.connacked:
            if now - self._opened > max(self.owner.broker.connect_timeout_s, 1.0):
                self.close("no CONNACK from the broker in time")
            return
        if self._paused:  # nothing is read: no answer to wait for; a ping now and then keeps the broker's side alive
            if self.keepalive and now - self._last_out >= self.keepalive:
                self._send(b"\xc0\x00")
            return
        if self.keepalive and now - self._last_in > 1.5 * self.keepalive:
            self.close(f"nothing from the broker for {now - self._last_in:.0f} s (keep-alive {self.keepalive} s)")
            return
        if self.keepalive and now - self._last_out >= self.keepalive and self._ping_at is None:
            self._ping_at = now
            self._send(b"\xc0\x00")

    def on_reading_paused(self, paused: bool) -> None:
        """The loop stopped (or resumed) reading this socket: keep-alive waits for nothing meanwhile."""
        self._paused = paused
        if not paused:
            self._last_in, self._ping_at = time.monotonic(), None

    # writing -----------------------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        if self._sock is None:
            return
        self._out += data
        self._last_out = time.monotonic()
        if not self._want_write:
            self.loop_write()

    def ack(self, mid: int) -> None:
        self._out += b"\x40\x02" + struct.pack("!H", mid)

    def ack_done(self) -> None:
        """Write the PUBACKs queued by ``ack`` (one send for a whole batch)."""
        if self._out and self._sock is not None:
            self._last_out = time.monotonic()
            if not self._want_write:
                self.loop_write()

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> int | None:
        if self._sock is None or not self.connacked:
            return None
        if qos and len(self._inflight) >= self.server_receive_max:
            return None
        mid = 0
        var = mqtt_string(topic)
        if qos:
            mid = self._next_mid()
            var += struct.pack("!H", mid)
            self._inflight.add(mid)
        if self.mqtt5:
            var += b"\x00"
        self._send(mqtt_packet((PUBLISH << 4) | (min(qos, 1) << 1) | (1 if retain else 0), var + payload))
        return mid

    # control packets ---------------------------------------------------------------------
    @staticmethod
    def _early_publish(topic: str, payload: bytes | TooLarge, mid: int, qos: int) -> None:
        raise Malformed("PUBLISH before CONNACK")

    def _control(self, kind: int, body: bytes) -> None:
        if kind == CONNACK:
            self._connack(body)
        elif kind == PUBACK:
            if len(body) < 2:
                raise Malformed("PUBACK too short")
            self._inflight.discard((body[0] << 8) | body[1])
        elif kind == SUBACK:
            if len(body) < 3:
                raise Malformed("SUBACK too short")
            p = 2
            if self.mqtt5:
                _, p = properties(body, 2, len(body))
            codes = body[p:]
            if not codes:
                raise Malformed("SUBACK without a reason code")
            if any(c >= 0x80 for c in codes):
                log.error("%s: the broker refused the subscription (reason 0x%02x)", self.owner.client_id, max(codes))
        elif kind == PINGRESP:
            self._ping_at = None
        elif kind == DISCONNECT:
            code = body[0] if body else 0
            why = ""
            if self.mqtt5 and len(body) > 1:
                try:
                    props, _ = properties(body, 1, len(body))
                    why = props.get(0x1F, b"").decode("utf-8", "replace")[:200]
                except Malformed:
                    pass
            self.close(f"the broker disconnected this client (reason 0x{code:02x}{': ' + why if why else ''})")
            self.reader.stopped = True

    def _connack(self, body: bytes) -> None:
        if self.connacked:
            raise Malformed("a second CONNACK")
        if len(body) < 2:
            raise Malformed("CONNACK too short")
        if body[0] & 0xFE:
            raise Malformed("CONNACK with reserved flags set")
        code = body[1]
        if self.mqtt5 and len(body) > 2:
            props, _ = properties(body, 2, len(body))
            if 0x13 in props:
                self.keepalive = props[0x13]
            if props.get(0x21):
                self.server_receive_max = props[0x21]
        if code != 0:
            self.close(f"broker refused the connection (reason 0x{code:02x})", refused=True)
            self.reader.stopped = True
            return
        self.connacked = True
        self.reader.on_publish = self.owner._publish_in
        self.owner._connected(self, session_present=bool(body[0] & 1))

    # closing -----------------------------------------------------------------------------
    def disconnect(self) -> None:
        """A normal DISCONNECT (the session stays; whatever was not acknowledged is re-delivered), then close."""
        if self._sock is not None:
            self._out += b"\xe0\x00"
            try:
                self._sock.setblocking(True)
                self._sock.settimeout(1.0)
                self._sock.sendall(self._out)
            except OSError:
                pass
            self._out.clear()
        self.close("disconnected by this client", level=logging.INFO)

    def close(self, why: str, *, level: int = logging.INFO, refused: bool = False) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        self.reader.stopped = True
        self.closed_reason = why
        if self.on_socket_close:
            self.on_socket_close(self, None, sock)
        try:
            sock.close()
        except OSError:  # pragma: no cover
            pass
        self.owner._disconnected(self, why, level, refused)


class LiteConnection(Reconnecting):
    """Same duties and interface as ``edge.mqtt.netloop.Connection`` for a subscriber with manual acks:
    ``start``, ``connected``, ``publish``, ``ack``, ``ack_done``, ``close``/``closed``, ``client``; messages
    come to ``on_publish(conn, client, topic, payload, mid, qos)``."""

    def __init__(
        self,
        loop: NetworkLoop,
        broker: BrokerConfig,
        client_id: str,
        *,
        subscriptions: list[tuple[str, int]],
        on_publish: Callable[[LiteConnection, LiteClient, str, bytes | TooLarge, int, int], None],
        clean_start: bool = False,
        session_expiry_s: int = 0,
        receive_maximum: int | None = None,
        backoff: Backoff = Backoff(),
        max_packet_bytes: int = MAX_PACKET_BYTES,
    ) -> None:
        self.loop, self.broker, self.client_id = loop, broker, client_id
        self.subscriptions = list(subscriptions)
        self._on_publish = on_publish
        self.clean_start, self.session_expiry_s, self.receive_maximum = clean_start, session_expiry_s, receive_maximum
        self.backoff, self.max_packet_bytes = backoff, max_packet_bytes
        self._init_reconnect()

    def _attempt(self) -> None:
        self._retry = None
        if self.closing:
            return
        self._next_node()
        c = LiteClient(self)
        self.loop.watch(c)
        self.client = c
        try:
            c.connect()
        except Exception as e:  # refused, unreachable, TLS failure: all retried, the reason kept
            self.client = None
            c.close("connect failed")  # nothing when no socket was opened; not this connection's any more
            self._failed(f"{type(e).__name__}: {e}")

    def _connected(self, client: LiteClient, session_present: bool) -> None:
        if client is not self.client:
            return
        self._up()
        log.info(
            "%s: connected to %s (lean client, session present: %s)", self.client_id, self.node.url, session_present
        )
        if self.subscriptions:
            client.subscribe(self.subscriptions)

    def _disconnected(self, client: LiteClient, why: str, level: int, refused: bool) -> None:
        if client is not self.client:
            return
        was = self.connected
        self.connected = False
        self.client = None
        if self.closing:
            self.closed.set()
            return
        if was:
            self._lost(why)
        else:
            self._failed(why)

    def _publish_in(self, topic: str, payload: bytes | TooLarge, mid: int, qos: int) -> None:
        self._on_publish(self, self.client, topic, payload, mid, qos)

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> int | None:
        if not self.connected or self.client is None:
            return None
        mid: int | None = self.client.publish(topic, payload, qos=qos, retain=retain)
        return mid

    def ack(self, client: Any, mid: int, qos: int) -> None:
        """Queue the PUBACK of a message this connection delivered (nothing for QoS 0 or an older connection)."""
        if qos and client is self.client and client is not None:
            client.ack(mid)

    def ack_done(self) -> None:
        if self.client is not None:
            self.client.ack_done()

    def close(self) -> None:
        """Disconnect cleanly; ``closed`` is set when done."""
        self.closing = True
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self.client is not None:
            self.client.disconnect()
        self.connected = False
        self.client = None
        self.closed.set()
