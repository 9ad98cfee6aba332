"""The fleet as the broker has it, for the rollout controller: retained births, deaths, desired and reported
states of every device of a fleet (and live telemetry when an ``fps`` criterion needs it), on one MQTT
connection. Nothing in a payload is trusted: topics are parsed, payloads bounded, checked to name the device
of their topic, reported states checked against the protocol's closed sets (``ReportedState``).
"""

from __future__ import annotations

import json
import math
import secrets
import threading
from dataclasses import dataclass
from typing import Any, Mapping

from edge.mqtt.client import BrokerConfig
from edge.mqtt.desired import ReportedState
from edge.mqtt.netloop import Backoff, Connection, ConnectOptions, NetworkLoop
from edge.mqtt.payloads import encode
from edge.mqtt.topics import Topic, TopicError, check_part

MAX_PAYLOAD = 64 * 1024


@dataclass
class DeviceView:
    device: str
    birth: dict[str, Any] | None = None
    death: dict[str, Any] | None = None
    reported: dict[str, Any] | None = None
    desired: dict[str, Any] | None = None
    telemetry: dict[str, Any] | None = None

    @property
    def online(self) -> bool:
        if self.birth is None:
            return False
        if self.death is None:
            return True
        b = (_int(self.birth.get("session")), _int(self.birth.get("connection")))
        d = (_int(self.death.get("session")), _int(self.death.get("connection")))
        return b > d

    @property
    def bundle(self) -> Mapping[str, Any]:
        b = self.birth.get("bundle") if self.birth else None
        return b if isinstance(b, dict) else {}

    @property
    def target(self) -> str | None:
        t = self.bundle.get("target")
        return t if isinstance(t, str) else None

    @property
    def bundle_id(self) -> str | None:
        r = self.reported
        running = r.get("bundle_running") if r is not None else None
        if r is not None and isinstance(running, str):
            if self.birth is None or _int(r.get("ts")) >= _int(self.birth.get("ts")):
                return running
        b = self.bundle.get("id")
        return b if isinstance(b, str) else None

    @property
    def desired_version(self) -> int:
        v = self.desired.get("version") if self.desired else None
        return v if type(v) is int else 0

    @property
    def reported_version(self) -> int:
        v = self.reported.get("desired_version") if self.reported else None
        return v if type(v) is int else 0

    def field(self, key: str) -> str | None:
        if key == "device":
            return self.device
        obj: Any = self.birth or {}
        for part in key.split("."):
            if not isinstance(obj, dict):
                return None
            obj = obj.get(part)
        return None if obj is None or isinstance(obj, (dict, list)) else str(obj)


def _int(v: Any) -> int:
    return v if type(v) is int else (int(v) if type(v) is float and math.isfinite(v) else -1)


class FleetView:
    """The fleet as the broker has it: one MQTT connection subscribed to the retained birth, death, desired
    and reported topics of every device (and telemetry when asked). ``synced`` is set once the retained
    messages of the current connection have arrived (a marker the controller sends itself comes back
    after them); decisions wait for it, so a version is never computed from half a picture."""

    def __init__(
        self,
        broker: BrokerConfig,
        fleet: str,
        *,
        telemetry: bool = False,
        client_id: str | None = None,
        backoff: Backoff = Backoff(0.2, 5.0),
    ) -> None:
        check_part(fleet, "fleet")
        self.broker, self.fleet, self.telemetry = broker, fleet, telemetry
        self.client_id = client_id or f"edgekit-rollout-{secrets.token_hex(4)}"
        from edge.fleet.acl import own_level  # the identity the broker knows: the generated ACL lets it read its own

        self._sync_topic = str(Topic(fleet, own_level(broker, self.client_id), "cmd", "rollout-sync"))
        self._token = ""
        kinds = ["birth", "death", "desired", "reported"] + (["telemetry"] if telemetry else [])
        subs = [(f"edgekit/{fleet}/+/{k}", 0 if k == "telemetry" else 1) for k in kinds] + [(self._sync_topic, 1)]
        self._lock = threading.Lock()
        self._devices: dict[str, DeviceView] = {}
        self.synced = threading.Event()
        self.rejected = 0
        self._closed = False
        self.loop = NetworkLoop(name="edgekit-rollout")
        self.conn = Connection(
            self.loop,
            broker,
            self.client_id,
            subscriptions=subs,
            on_message=self._message,
            on_connected=self._connected,
            on_disconnected=self._disconnected,
            options=ConnectOptions(backoff=backoff),
        )

    def start(self) -> FleetView:
        self.loop.start()
        self.conn.start()
        return self

    def wait_synced(self, timeout: float) -> bool:
        return self.synced.wait(timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.loop.run(self.conn.close)
            self.conn.closed.wait(5.0)
        finally:
            self.loop.stop()

    def __enter__(self) -> FleetView:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connected(self, conn: Connection) -> None:
        self.synced.clear()
        self._token = secrets.token_hex(8)
        conn.publish(self._sync_topic, self._token.encode(), qos=1)

    def _disconnected(self, _conn: Connection, _why: str) -> None:
        self.synced.clear()

    def _message(self, _conn: Connection, msg: Any) -> None:
        try:
            topic = msg.topic
        except UnicodeDecodeError:
            self.rejected += 1
            return
        if topic == self._sync_topic:
            if bytes(msg.payload) == self._token.encode():
                self.synced.set()
            return
        payload = bytes(msg.payload)
        try:
            t = Topic.parse(topic)
        except TopicError:
            self.rejected += 1
            return
        if t.fleet != self.fleet or t.kind not in ("birth", "death", "desired", "reported", "telemetry"):
            return
        if not payload:  # a cleared retained message
            with self._lock:
                dv = self._devices.get(t.device)
                if dv is not None:
                    setattr(dv, t.kind, None)
            return
        obj = _payload(payload)
        if obj is None or obj.get("device") != t.device or obj.get("fleet") != t.fleet:
            self.rejected += 1
            return
        if t.kind == "reported":
            try:
                ReportedState.from_json(obj)  # closed sets of state and reason code
            except (KeyError, TypeError, ValueError):
                self.rejected += 1
                return
        with self._lock:
            dv = self._devices.get(t.device)
            if dv is None:
                dv = self._devices[t.device] = DeviceView(t.device)
            setattr(dv, t.kind, obj)

    def snapshot(self) -> dict[str, DeviceView]:
        with self._lock:
            return {
                k: DeviceView(v.device, v.birth, v.death, v.reported, v.desired, v.telemetry)
                for k, v in self._devices.items()
            }

    def publish_desired(self, device: str, payload: dict[str, Any]) -> bool:
        topic = str(Topic(self.fleet, device, "desired"))
        data = encode(payload)
        return bool(self.loop.run(lambda: self.conn.publish(topic, data, qos=1, retain=True) is not None))

    @property
    def connected(self) -> bool:
        return self.conn.connected


def _payload(data: bytes) -> dict[str, Any] | None:
    if len(data) > MAX_PAYLOAD:
        return None
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None
