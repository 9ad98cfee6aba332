"""One thread that drives many MQTT clients: a selector, timers, and calls handed over from other threads.

paho-mqtt's own ``loop_start`` costs a thread per client and reconnects without jitter. Here
one ``NetworkLoop`` thread owns every client (the agent has one, the fleet simulator a
thousand, the collector one), so no client is ever touched from two threads: other threads
hand work over with ``call_soon``.

``Connection`` is one client identity on a loop. Every connection attempt uses a fresh
paho client, so nothing paho kept in memory from the last connection is re-sent behind
the caller's back (the device's durable outbox decides what is re-sent). Before each
attempt the will is re-armed; after each CONNACK the subscription table is replayed and
the owner's ``on_connected`` runs. Failed attempts back off exponentially with jitter. A broker
given as several nodes of one cluster is tried node after node (round robin): each failed attempt
and each lost connection moves to the next one.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import selectors
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from edge.errors import daemon_error_line
from edge.mqtt.client import MQTT5_UNANSWERED, BrokerConfig
from edge.mqtt.ratelog import RateLimitedLog

log = logging.getLogger("edge.mqtt")


class Timer:
    __slots__ = ("when", "fn", "args", "cancelled", "interval")

    def __init__(self, when: float, fn: Callable[..., Any], args: tuple[Any, ...], interval: float | None) -> None:
        self.when, self.fn, self.args, self.cancelled, self.interval = when, fn, args, False, interval

    def cancel(self) -> None:
        self.cancelled = True


class NetworkLoop:
    """Selector + timers + a hand-over queue, on one thread named ``edgekit-mqtt``."""

    MISC_INTERVAL_S = 1.0  # keep-alive pings and timeouts of every client

    def __init__(self, name: str = "edgekit-mqtt") -> None:
        self._sel = selectors.DefaultSelector()
        self._timers: list[tuple[float, int, Timer]] = []
        self._count = itertools.count()
        self._calls: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._clients: dict[Any, Any] = {}  # paho client -> its socket
        self._paused: set[Any] = set()  # clients whose socket is not read (``pause_reading``)
        self._writing: set[Any] = set()  # clients with bytes waiting to be written
        self._after_io: list[Callable[[], None]] = []
        self._stop = False
        self._errlog = RateLimitedLog(log)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.errors = 0

    # lifecycle ---------------------------------------------------------------------------
    def start(self) -> NetworkLoop:
        self._thread.start()
        self.call_every(self.MISC_INTERVAL_S, self._misc)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread.is_alive():
            self.call_soon(self._set_stop)
            self._thread.join(timeout)
        for sock in list(self._clients.values()):  # clients whose owner did not close them: no leaked sockets
            try:
                sock.close()
            except OSError:
                pass
        self._clients.clear()
        for s in (self._wake_r, self._wake_w):
            s.close()
        self._sel.close()

    def __enter__(self) -> NetworkLoop:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _set_stop(self) -> None:
        self._stop = True

    @property
    def in_loop(self) -> bool:
        return threading.current_thread() is self._thread

    # scheduling --------------------------------------------------------------------------
    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop thread (thread-safe)."""
        self._calls.append((fn, args))
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # already awake, or closing

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any, _every: float | None = None) -> Timer:
        """Schedule on the loop thread; call from the loop thread (use ``call_soon`` to get there)."""
        t = Timer(time.monotonic() + delay, fn, args, _every)
        heapq.heappush(self._timers, (t.when, next(self._count), t))
        return t

    def call_every(self, interval: float, fn: Callable[..., Any], *args: Any, first: float | None = None) -> Timer:
        return self.call_later(interval if first is None else first, fn, *args, _every=interval)

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = 10.0) -> Any:
        """Run ``fn`` on the loop thread and return its result (from another thread)."""
        if self.in_loop:
            return fn(*args)
        done = threading.Event()
        box: dict[str, Any] = {}

        def call() -> None:
            try:
                box["value"] = fn(*args)
            except BaseException as e:  # handed back to the caller
                box["error"] = e
            finally:
                done.set()

        self.call_soon(call)
        if not done.wait(timeout):
            raise TimeoutError(f"network loop did not run {getattr(fn, '__name__', fn)} within {timeout} s")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def after_io(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` after every round of socket events (the collector commits and acknowledges there)."""
        self._after_io.append(fn)

    # paho clients ------------------------------------------------------------------------
    def watch(self, client: Any) -> None:
        client.on_socket_open = self._on_socket_open
        client.on_socket_close = self._on_socket_close
        client.on_socket_register_write = self._on_register_write
        client.on_socket_unregister_write = self._on_unregister_write

    def _on_socket_open(self, client: Any, _ud: Any, sock: Any) -> None:
        self._clients[client] = sock
        self._paused.discard(client)
        self._writing.discard(client)
        self._sel.register(sock, selectors.EVENT_READ, client)

    def _on_socket_close(self, client: Any, _ud: Any, sock: Any) -> None:
        self._clients.pop(client, None)
        self._paused.discard(client)
        self._writing.discard(client)
        try:
            self._sel.unregister(sock)
        except (KeyError, ValueError):
            pass

    def _on_register_write(self, client: Any, _ud: Any, sock: Any) -> None:
        self._writing.add(client)
        self._interest(client)

    def _on_unregister_write(self, client: Any, _ud: Any, sock: Any) -> None:
        self._writing.discard(client)
        self._interest(client)

    def pause_reading(self, client: Any, paused: bool) -> None:
        """Stop (``paused``) or resume reading ``client``'s socket (loop thread). What the broker sends meanwhile
        waits in the kernel's buffers, then TCP's window holds the broker back: flow control for a reader that
        cannot keep up, where dropping the connection would make the broker send it all again. Writing goes on
        (acknowledgements, pings)."""
        if paused == (client in self._paused):
            return
        if paused:
            self._paused.add(client)
        else:
            self._paused.discard(client)
        hook = getattr(client, "on_reading_paused", None)
        if hook is not None:
            hook(paused)
        self._interest(client)
        sock = self._clients.get(client)
        pending = getattr(sock, "pending", None)  # TLS: bytes decrypted before the pause, unseen by the selector
        if not paused and pending is not None and pending():
            self.call_soon(self._resume_read, client, sock)

    def _resume_read(self, client: Any, sock: Any) -> None:
        if self._clients.get(client) is sock and client not in self._paused:
            self._read(client, sock)

    def _interest(self, client: Any) -> None:
        """Register the client's socket for what it waits on now (nothing: out of the selector)."""
        sock = self._clients.get(client)
        if sock is None:
            return
        events = (0 if client in self._paused else selectors.EVENT_READ) | (
            selectors.EVENT_WRITE if client in self._writing else 0
        )
        try:
            self._sel.get_key(sock)
            known = True
        except (KeyError, ValueError):
            known = False
        try:
            if not events:
                if known:
                    self._sel.unregister(sock)
            elif known:
                self._sel.modify(sock, events, client)
            else:
                self._sel.register(sock, events, client)
        except (KeyError, ValueError, OSError):
            pass

    def _misc(self) -> None:
        for client in list(self._clients):
            if client in self._paused and not hasattr(client, "on_reading_paused"):
                continue  # paho would miss the PINGRESP it cannot read: it waits with its pings until resumed
            self._guard(client.loop_misc)

    def _guard(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as e:  # a bug in one callback must not stop every client on this loop
            self.errors += 1  # rate-limited: a message that trips a bug may arrive a thousand times a second
            line = daemon_error_line("mqtt network loop", e)  # one traceback file per type, not per message
            self._errlog.log(logging.ERROR, "callback", "error in MQTT network loop: %s", line)
            return None

    # the loop ----------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop:
            timeout = 1.0
            if self._timers:
                timeout = max(0.0, min(timeout, self._timers[0][0] - time.monotonic()))
            if self._calls:
                timeout = 0.0
            for key, mask in self._sel.select(timeout):
                client = key.data
                if client is None:
                    try:
                        while self._wake_r.recv(4096):
                            pass
                    except (BlockingIOError, OSError):
                        pass
                    continue
                if mask & selectors.EVENT_READ and client not in self._paused:
                    self._guard(self._read, client, key.fileobj)
                if mask & selectors.EVENT_WRITE and client in self._clients:
                    self._guard(client.loop_write)
            while self._calls:
                fn, args = self._calls.popleft()
                self._guard(fn, *args)
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                _, _, t = heapq.heappop(self._timers)
                if t.cancelled:
                    continue
                if t.interval is not None:
                    t.when = max(t.when + t.interval, now)
                    heapq.heappush(self._timers, (t.when, next(self._count), t))
                self._guard(t.fn, *t.args)
            for fn in self._after_io:
                self._guard(fn)

    READ_BURST = 256  # packets read from one socket per round (paho's loop_read reads one)

    def _read(self, client: Any, sock: Any) -> None:
        """Read what the socket holds, up to a burst, so a busy collector commits in batches, not per message."""
        pending = getattr(sock, "pending", None)  # TLS: decrypted bytes the selector cannot see
        for _ in range(NetworkLoop.READ_BURST):
            client.loop_read()
            if client.socket() is not sock or client in self._paused:
                return
            if pending is not None:
                if not pending():
                    return
                continue
            try:
                if not sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                    return  # EOF: the next round sees it
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return


@dataclass(frozen=True)
class Backoff:
    """Exponential back-off with jitter: attempt n waits min(max, base * 2**n) * uniform(1 - jitter, 1)."""

    base_s: float = 0.5
    max_s: float = 60.0
    jitter: float = 0.5

    def delay(self, attempt: int, rng: random.Random = random._inst) -> float:
        d = min(self.max_s, self.base_s * (2.0 ** min(attempt, 30)))
        return d * rng.uniform(1.0 - self.jitter, 1.0)


@dataclass(frozen=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 1
    retain: bool = True


class Reconnecting:
    """The connect/retry state that ``Connection`` and the collector's lean client
    (``edge.mqtt.lite.LiteConnection``) share; the subclass makes ``_attempt``."""

    loop: NetworkLoop
    broker: BrokerConfig
    client_id: str
    backoff: Backoff

    def _init_reconnect(self) -> None:
        self.client: Any = None
        self.connected = False
        self.closing = False
        self.closed = threading.Event()
        self.last_error: str | None = None
        self.attempts = 0  # failed attempts since the last successful connect
        self.connects = 0
        self._retry: Timer | None = None
        self._logged_error: str | None = None
        self._node = 0  # which of the broker's addresses the next attempt uses (round robin)
        self.node: BrokerConfig = self.broker.at(0)  # the address of the current (or last) attempt
        self._errors_said: set[str] = set()  # several nodes: each node's error said once at WARNING until connected
        self._hinted_mqtt5 = False  # the MQTT5_UNANSWERED line, said once

    def start(self) -> None:
        self.loop.call_soon(self._attempt)

    def _attempt(self) -> None:
        raise NotImplementedError

    def _next_node(self) -> BrokerConfig:
        """The address for this attempt (round robin over a cluster's nodes; always the one for a single address)."""
        self.node = self.broker.at(self._node)
        return self.node

    def _advance(self) -> str:
        """After a failure or a lost connection: move to the next node; how the retry log line names it."""
        n = len(self.broker.endpoints)
        if n == 1:
            return ""
        self._node = (self._node + 1) % n
        return f" {self.broker.at(self._node).url}"

    def _up(self) -> None:
        """Bookkeeping of a successful CONNACK."""
        self.connected = True
        self.connects += 1
        self.attempts = 0
        self.last_error = self._logged_error = None
        self._errors_said.clear()

    def _failed(self, why: str) -> None:
        self.last_error = why
        delay = self.backoff.delay(self.attempts)
        self.attempts += 1
        where = self.node.url
        nxt = self._advance()
        if nxt:  # several nodes: the round robin would repeat each node's error, said once
            key = f"{where}: {why}"
            level = logging.WARNING if key not in self._errors_said else logging.DEBUG
            self._errors_said.add(key)
        else:
            level = logging.WARNING if why != self._logged_error else logging.DEBUG
        log.log(level, "%s: cannot connect to %s (%s); retrying%s in %.1f s", self.client_id, where, why, nxt, delay)
        self._logged_error = why
        if not self.closing:
            self._retry = self.loop.call_later(delay, self._attempt)
        else:
            self.closed.set()

    def _lost(self, why: str) -> None:
        """A connection that was up went away: retry at once-ish (first back-off step), on the next node."""
        where = self.node.url
        nxt = self._advance()
        log.warning("%s: connection to %s lost (%s)%s", self.client_id, where, why, f"; trying{nxt}" if nxt else "")
        self.attempts = 0
        self.last_error = f"connection lost: {why}"
        self._retry = self.loop.call_later(self.backoff.delay(0), self._attempt)

    def _unanswered_mqtt5(self) -> None:
        """The broker closed a plain-TCP MQTT 5 CONNECT without any CONNACK: say once what that likely means."""
        if not self._hinted_mqtt5:
            self._hinted_mqtt5 = True
            log.warning("%s: %s: %s", self.client_id, self.node.url, MQTT5_UNANSWERED)


@dataclass(frozen=True)
class ConnectOptions:
    """How a :class:`Connection` holds its session: MQTT's clean start and session expiry, whether the
    application acknowledges QoS 1 messages itself (``manual_ack``: after they are stored), the Receive
    Maximum it asks for, and the reconnect back-off."""

    clean_start: bool = True
    session_expiry_s: int = 0
    manual_ack: bool = False
    receive_maximum: int | None = None
    backoff: Backoff = Backoff()


class Connection(Reconnecting):
    """One MQTT client identity on a ``NetworkLoop``; all methods run on the loop thread."""

    def __init__(
        self,
        loop: NetworkLoop,
        broker: BrokerConfig,
        client_id: str,
        *,
        subscriptions: list[tuple[str, int]] | None = None,
        will: Callable[[], Will | None] | None = None,
        on_connected: Callable[[Connection], None] | None = None,
        on_disconnected: Callable[[Connection, str], None] | None = None,
        on_message: Callable[[Connection, Any], None] | None = None,
        on_published: Callable[[Connection, int, int], None] | None = None,
        options: ConnectOptions = ConnectOptions(),
    ) -> None:
        self.loop, self.broker, self.client_id = loop, broker, client_id
        self.subscriptions = list(subscriptions or [])  # replayed after every CONNACK
        self._will, self._on_connected, self._on_disconnected = will, on_connected, on_disconnected
        self._on_message, self._on_published = on_message, on_published
        o = options
        self.clean_start, self.session_expiry_s, self.manual_ack = o.clean_start, o.session_expiry_s, o.manual_ack
        self.receive_maximum, self.backoff = o.receive_maximum, o.backoff
        self._connack_seen = False  # this attempt got a CONNACK (accepting or refusing)
        self._init_reconnect()

    # connecting --------------------------------------------------------------------------
    def _attempt(self) -> None:
        self._retry = None
        if self.closing:
            return
        node = self._next_node()
        self._connack_seen = False
        c = node.new_client(self.client_id, manual_ack=self.manual_ack, clean_session=self.clean_start)
        c.on_connect, c.on_disconnect = self._connected, self._disconnected
        c.on_message, c.on_publish = self._message, self._published
        will = self._will() if self._will else None
        if will is not None:
            c.will_set(will.topic, will.payload, qos=will.qos, retain=will.retain)
        props = None
        v5: dict[str, Any] = {"clean_start": self.clean_start} if self.broker.mqtt5 else {}  # 3.1.1: clean_session
        if self.broker.mqtt5 and (self.session_expiry_s or self.receive_maximum):
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties

            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]  # paho leaves it unannotated
            if self.session_expiry_s:
                props.SessionExpiryInterval = self.session_expiry_s
            if self.receive_maximum:
                props.ReceiveMaximum = self.receive_maximum
        self.loop.watch(c)
        self.client = c
        try:
            c.connect(node.host, node.port, keepalive=node.keepalive_s, properties=props, **v5)
        except Exception as e:  # refused, unreachable, TLS failure: all retried, the reason kept
            c.on_disconnect = None
            try:
                c._sock_close()  # the half-open socket of a failed TLS handshake (paho leaves it open)
            except Exception:  # pragma: no cover
                pass
            self.client = None
            self._failed(f"{type(e).__name__}: {e}")

    def _connected(self, client: Any, _ud: Any, _flags: Any, reason: Any, _props: Any) -> None:
        if client is not self.client:
            return
        self._connack_seen = True
        if reason.is_failure:
            self.last_error = f"broker refused the connection: {reason}"
            return  # the broker closes the socket; _disconnected schedules the retry
        self._up()
        log.info("%s: connected to %s", self.client_id, self.node.url)
        if self.subscriptions:
            client.subscribe(list(self.subscriptions))
        if self._on_connected:
            self._on_connected(self)

    def _disconnected(self, client: Any, _ud: Any, flags: Any, reason: Any, _props: Any) -> None:
        if client is not self.client:
            return
        if (
            not self.connected
            and not self._connack_seen
            and self.node.mqtt5
            and not self.node.tls
            and not getattr(flags, "is_disconnect_packet_from_server", False)
            and str(reason) == "Unspecified error"
        ):
            # TCP connected, CONNECT sent, then the socket closed without a byte of answer (a reset or EOF: paho
            # says "Unspecified error"; garbage would be a protocol error, a silent broker a keep-alive timeout)
            self._unanswered_mqtt5()
        was = self.connected
        self.connected = False
        self.client = None
        why = self.last_error if not was and self.last_error else str(reason)
        if was and self._on_disconnected:
            self._on_disconnected(self, why)
        if self.closing:
            self.closed.set()
            return
        if was:
            self._lost(why)
        else:
            self._failed(why)

    # messages ----------------------------------------------------------------------------
    def _message(self, client: Any, _ud: Any, msg: Any) -> None:
        if client is self.client and self._on_message:
            self._on_message(self, msg)

    def _published(self, client: Any, _ud: Any, mid: int, reason: Any, _props: Any) -> None:
        if client is self.client and self._on_published:
            self._on_published(self, mid, int(reason.value))  # MQTT 5 PUBACK reason code (0 for MQTT 3)

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> int | None:
        """Queue a message on the live connection; its mid, or None when not connected."""
        if not self.connected or self.client is None:
            return None
        info = self.client.publish(topic, payload, qos=qos, retain=retain)
        return None if info.rc != 0 else int(info.mid)

    def ack(self, client: Any, mid: int, qos: int) -> None:
        if client is self.client and client is not None:
            client.ack(mid, qos)

    # closing -----------------------------------------------------------------------------
    def close(self) -> None:
        """Disconnect cleanly (a normal DISCONNECT: the broker drops the will). ``closed`` is set when done."""
        self.closing = True
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self.client is not None and self.connected:
            self.client.disconnect()
        else:
            if self.client is not None:
                try:
                    self.client._sock_close()
                except Exception:  # pragma: no cover
                    pass
                self.client = None
            self.connected = False
            self.closed.set()
