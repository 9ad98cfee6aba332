"""A simulated fleet: many device sessions in one process, each a real MQTT connection.

Every simulated device is the agent's own ``DeviceSession`` (birth, will, sequence numbers,
outbox, replay) on one shared ``NetworkLoop``; only the telemetry body is made up (no model
runs). Outboxes are in memory (``MemoryOutbox``): a thousand SQLite files would measure the
disk rather than the broker and the collector. Used by ``benchmarks/fleet_ingest.py`` and the tests.
"""

from __future__ import annotations

import functools
import random
import selectors
import socket
import struct
import threading
import time
from typing import Any, cast

import edge
from edge.mqtt.client import BrokerConfig
from edge.mqtt.lite import mqtt_packet, mqtt_string
from edge.mqtt.netloop import Backoff, NetworkLoop
from edge.mqtt.outbox import MemoryOutbox
from edge.mqtt.payloads import encode, message
from edge.mqtt.session import DeviceSession, SessionOptions


def birth_body(i: int, rate_hz: float) -> dict[str, Any]:
    """The birth body of simulated device ``i`` (the envelope and ``connection`` are the session's)."""
    return {
        "state": "running",
        "state_detail": None,
        "agent": {
            "edgekit_version": edge.__version__,
            "pid": 0,
            "started_at": round(time.time(), 3),
            "interval_s": 1.0 / rate_hz,
            "source": "simulated",
            "fps": 30.0,
            "budget_ms": 33.3,
        },
        "bundle": {"id": "simulated-x86-cpu-fp32-0000000000", "target": "x86-cpu", "precision": "fp32"},
        "runner": {"runtime": "simulated", "device_requested": "CPU", "device_used": "CPU", "precision_used": "f32"},
        "host": {"hostname": f"sim-{i:05d}", "os": "linux", "arch": "aarch64", "model": "simulated"},
    }


def telemetry_body(r: random.Random, rate_hz: float) -> dict[str, Any]:
    """A telemetry body like the agent's (about 800 bytes of JSON with the envelope), numbers drawn from ``r``."""
    p50 = 8.0 + r.random() * 4
    return {
        "interval_s": 1.0 / rate_hz,
        "window_s": 1.0 / rate_hz,
        "state": "running",
        "bundle_id": "simulated-x86-cpu-fp32-0000000000",
        "uptime_s": 0.0,
        "inference": {
            "frames": 30,
            "fps": round(29 + r.random() * 2, 2),
            "target_fps": 30.0,
            "budget_ms": 33.3,
            "budget_misses": int(r.random() < 0.05),
            "frames_dropped": 0,
            "frames_total": 0,
            "budget_misses_total": 0,
            "latency_ms": {
                "count": 30,
                "p50_ms": round(p50, 4),
                "p90_ms": round(p50 * 1.2, 4),
                "p99_ms": round(p50 * 1.6, 4),
                "max_ms": round(p50 * 1.9, 4),
                "min_ms": round(p50 * 0.8, 4),
                "mean_ms": round(p50 * 1.05, 4),
                "std_ms": 0.8,
            },
        },
        "process": {"cpu_percent": round(40 + r.random() * 20, 2), "rss_mb": 80.5, "threads": 6},
        "system": {"cpu_percent": 55.0, "load1": 1.2, "mem_available_mb": 3000.0, "uptime_s": 1000},
        "thermal": {"zones_c": {"cpu-thermal": round(50 + r.random() * 10, 2)}, "max_c": 55.0, "throttled_now": False},
        "spool": {"pending": 0, "pending_bytes": 0, "dropped_total": 0, "max_messages": 50000},
    }


class SimulatedFleet:
    def __init__(
        self,
        broker: BrokerConfig,
        *,
        devices: int,
        rate_hz: float = 1.0,
        fleet: str = "sim",
        prefix: str = "dev",
        loop: NetworkLoop | None = None,
        connect_per_s: float = 250.0,
        seed: int = 0,
        backoff: Backoff = Backoff(0.2, 5.0),
    ) -> None:
        self.broker, self.n, self.rate_hz, self.fleet = broker, devices, rate_hz, fleet
        self.loop = loop or NetworkLoop(name="edgekit-simfleet")
        self._own_loop = loop is None
        self._rng = random.Random(seed)
        self.connect_per_s = connect_per_s
        self.sessions = [
            DeviceSession(
                self.loop,
                broker,
                fleet,
                f"{prefix}-{i:05d}",
                MemoryOutbox(),
                birth_body=functools.partial(birth_body, i, rate_hz),
                options=SessionOptions(client_id=f"edgekit-{fleet}-{prefix}-{i:05d}", backoff=backoff),
            )
            for i in range(devices)
        ]
        self._timers: list[Any] = []
        self.submitted = 0
        self._running = False

    def _tick(self, s: DeviceSession) -> None:
        if self._running:
            s.submit("telemetry", telemetry_body(self._rng, self.rate_hz))
            self.submitted += 1

    def _start_all(self) -> None:
        self._running = True
        period = 1.0 / self.rate_hz
        for i, s in enumerate(self.sessions):
            self.loop.call_later(i / self.connect_per_s, s.start)
            first = i / self.connect_per_s + 0.5 + self._rng.random() * period
            self._timers.append(self.loop.call_every(period, self._tick, s, first=first))

    def start(self) -> SimulatedFleet:
        if self._own_loop:
            self.loop.start()
        self.loop.run(self._start_all)
        return self

    def connected(self) -> int:
        return int(self.loop.run(lambda: sum(s.connected for s in self.sessions)))

    def pending(self) -> int:
        return int(self.loop.run(lambda: sum(s.outbox.pending() for s in self.sessions)))

    def pause(self) -> None:
        """Stop making telemetry (connections stay up)."""
        self.loop.run(self._pause)

    def _pause(self) -> None:
        self._running = False
        for t in self._timers:
            t.cancel()
        self._timers.clear()

    def stop(self, timeout: float = 30.0) -> None:
        """Clean shutdown of every device: death, DISCONNECT."""

        def close_all() -> None:
            self._pause()
            for s in self.sessions:
                s.publish_death("shutdown")  # queued before the DISCONNECT on the same stream
                s.conn.close()

        self.loop.run(close_all)
        deadline = time.monotonic() + timeout
        for s in self.sessions:
            s.conn.closed.wait(max(0.0, deadline - time.monotonic()))
        if self._own_loop:
            self.loop.stop()

    def __enter__(self) -> SimulatedFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LightFleet:
    """Many devices at a small cost each, for the live benchmark at 10,000 devices on a small host.

    Each device is still one real MQTT connection of its own (MQTT 3.1.1, its own client id, a retained
    death armed as its will), and sends what an agent sends, so the broker and the collector do per device
    exactly what they do for agents: a retained birth (seq 0, connection 1), then QoS 1 telemetry numbered
    1, 2, ... in one session, each stamped with the time it is written to the socket, and a death (with the
    stream position) before DISCONNECT at ``stop``. What is left out is the agent's own machinery: no
    outbox, no replay, no re-connection (a dropped connection is counted in ``lost``, not re-made), no
    keep-alive (0: off). Payloads are encoded once per device (``telemetry_body``) and only seq and ts are
    written into a copy per message. All sockets are served by one thread (``selectors``), telemetry is
    spread evenly over each period, device after device."""

    _SEQ, _TS = 987654321987654, 1234567890.123456  # placeholders in the encoded template

    def __init__(
        self,
        host: str,
        port: int,
        *,
        devices: int,
        rate_hz: float = 1.0,
        fleet: str = "sim",
        prefix: str = "dev",
        connect_per_s: float = 1000.0,
        seed: int = 0,
    ) -> None:
        if devices < 1 or rate_hz <= 0 or connect_per_s <= 0:
            raise ValueError("devices, rate and connect rate must be positive")
        self.host, self.port, self.n, self.rate_hz, self.fleet = host, port, devices, rate_hz, fleet
        self.prefix, self.connect_per_s = prefix, connect_per_s
        self.session = int(time.time()) - 1
        rng = random.Random(seed)
        self.names = [f"{prefix}-{i:05d}" for i in range(devices)]
        self._topics = [f"edgekit/{fleet}/{d}/telemetry".encode() for d in self.names]
        self._templates = [self._template(d, rng) for d in self.names]
        self._socks: list[Any] = [None] * devices
        self._out: dict[int, bytearray] = {}  # device -> bytes the socket did not take yet
        self.seq = [0] * devices
        self.submitted = 0  # telemetry messages written (or queued behind a full socket)
        self.acked = 0  # PUBACKs and CONNACKs read, minus the CONNACKs
        self.lost = 0  # connections the broker closed (or that could not be made) before ``stop``
        self._stop = threading.Event()
        self._paused = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _template(self, device: str, rng: random.Random) -> tuple[bytes, bytes, bytes]:
        body = {"historical": False, **telemetry_body(rng, self.rate_hz)}
        raw = encode(message("telemetry", self.fleet, device, self.session, self._SEQ, body, ts=self._TS))
        head, rest = raw.split(b"%d" % self._SEQ)
        mid, tail = rest.split(b"%.6f" % self._TS)
        return head, mid, tail

    # MQTT packets (3.1.1) ----------------------------------------------------------------
    @staticmethod
    def _publish(topic: bytes, payload: bytes, mid: int, retain: bool = False) -> bytes:
        return mqtt_packet(0x32 | int(retain), mqtt_string(topic) + struct.pack("!H", mid) + payload)

    def _connect(self, i: int) -> bytes:
        dev = self.names[i]
        will_topic = f"edgekit/{self.fleet}/{dev}/death".encode()
        will = encode(
            message(
                "death", self.fleet, dev, self.session, 0, {"connection": 1, "reason": "last will: connection lost"}
            )
        )
        cid = f"edgekit-{self.fleet}-{dev}".encode()
        body = (
            mqtt_string(b"MQTT")
            + b"\x04"
            + bytes([0x02 | 0x04 | 0x08 | 0x20])
            + b"\x00\x00"  # clean, will QoS 1 retained
            + mqtt_string(cid)
            + mqtt_string(will_topic)
            + mqtt_string(will)
        )
        birth = encode(
            message("birth", self.fleet, dev, self.session, 0, {"connection": 1, **birth_body(i, self.rate_hz)})
        )
        return mqtt_packet(0x10, body) + self._publish(
            f"edgekit/{self.fleet}/{dev}/birth".encode(), birth, 1, retain=True
        )

    # the loop ------------------------------------------------------------------------------
    def _send(self, i: int, data: bytes) -> None:
        s = self._socks[i]
        if s is None:
            return
        pending = self._out.get(i)
        if pending is not None:
            pending += data
            return
        try:
            k = s.send(data)
        except BlockingIOError:
            k = 0
        except OSError:
            self._drop(i)
            return
        if k < len(data):
            self._out[i] = bytearray(data[k:])
            self._sel.modify(s, selectors.EVENT_READ | selectors.EVENT_WRITE, i)

    def _drop(self, i: int) -> None:
        s, self._socks[i] = self._socks[i], None
        if s is not None:
            self.lost += not self._stop.is_set()  # closed by the broker before ``stop``
            self._out.pop(i, None)
            self._sel.unregister(s)
            s.close()

    def _io(self, timeout: float) -> None:
        for key, events in self._sel.select(timeout):
            i, s = key.data, cast(socket.socket, key.fileobj)  # only sockets are registered here
            if events & selectors.EVENT_READ:
                try:
                    data = s.recv(65536)
                except (BlockingIOError, InterruptedError):
                    data = None
                except OSError:
                    data = b""
                if data == b"":
                    self._drop(i)
                    continue
                if data:
                    self.acked += len(data) // 4  # CONNACK and PUBACK: 4 bytes each on MQTT 3.1.1
            if events & selectors.EVENT_WRITE and self._socks[i] is not None:
                buf = self._out[i]
                try:
                    k = s.send(buf)
                except BlockingIOError:
                    k = 0
                except OSError:
                    self._drop(i)
                    continue
                del buf[:k]
                if not buf:
                    del self._out[i]
                    self._sel.modify(s, selectors.EVENT_READ, i)

    def _run(self) -> None:
        period = 1.0 / self.rate_hz
        t0 = time.monotonic()
        opened = 0
        sent = 0  # telemetry slots passed (device k % n, its seq k // n + 1)
        t_send = None
        while not self._stop.is_set():
            now = time.monotonic()
            want = min(self.n, int((now - t0) * self.connect_per_s) + 1)
            while opened < want:
                try:
                    s = socket.create_connection((self.host, self.port), timeout=10)
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    s.setblocking(False)
                    self._socks[opened] = s
                    self._sel.register(s, selectors.EVENT_READ, opened)
                    self._send(opened, self._connect(opened))
                except OSError:
                    self.lost += 1
                opened += 1
            if opened == self.n and t_send is None:
                t_send = time.monotonic() + 0.5  # every birth out first
            if t_send is not None and not self._paused:
                due = int((time.monotonic() - t_send) * self.n * self.rate_hz)
                while sent < due:
                    i = sent % self.n
                    sent += 1
                    if self._socks[i] is None:
                        continue
                    seq = self.seq[i] = self.seq[i] + 1
                    head, mid, tail = self._templates[i]
                    payload = b"%b%d%b%.6f%b" % (head, seq, mid, time.time(), tail)
                    self._send(i, self._publish(self._topics[i], payload, seq % 65535 + 1))
                    self.submitted += 1
            elif t_send is not None:
                sent = max(sent, int((time.monotonic() - t_send) * self.n * self.rate_hz))
            self._io(min(0.002, period / 4))
        self._close_all()

    def _close_all(self) -> None:
        for i, s in enumerate(self._socks):
            if s is None:
                continue
            dev = self.names[i]
            death = encode(
                message("death", self.fleet, dev, self.session, self.seq[i], {"connection": 1, "reason": "shutdown"})
            )
            self._send(
                i, self._publish(f"edgekit/{self.fleet}/{dev}/death".encode(), death, 65535, retain=True) + b"\xe0\x00"
            )
        deadline = time.monotonic() + 10
        while self._out and time.monotonic() < deadline:
            self._io(0.01)
        for s in self._socks:
            if s is not None:
                try:
                    s.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
        deadline = time.monotonic() + 5  # the broker reads the death before it sees the connection end
        while any(s is not None for s in self._socks) and time.monotonic() < deadline:
            self._io(0.01)
        for i in range(self.n):
            s, self._socks[i] = self._socks[i], None
            if s is not None:
                self._sel.unregister(s)
                s.close()
        self._sel.close()

    # control (any thread) ------------------------------------------------------------------
    def start(self) -> LightFleet:
        self._sel = selectors.DefaultSelector()
        self._thread = threading.Thread(target=self._run, name="edgekit-lightfleet", daemon=True)
        self._thread.start()
        return self

    def connected(self) -> int:
        return sum(s is not None for s in self._socks)

    def pending(self) -> int:
        """Telemetry written and not acknowledged yet (approximate while connections are being made)."""
        return max(0, self.submitted - (self.acked - self.connected() * 2))

    def pause(self) -> None:
        """Stop making telemetry (connections stay up)."""
        self._paused = True

    def stop(self, timeout: float = 30.0) -> None:
        """A death per device (its stream position), then DISCONNECT."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> LightFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
