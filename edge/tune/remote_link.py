"""The two channels of a remote tune: an HTTP server that hands the device the trial bundles (``ArtifactServer``)
and the MQTT link that sends tune requests and gathers the replies (``DeviceLink``), each reply bounded
(``MAX_REPLY``)."""

from __future__ import annotations

import functools
import json
import queue
import secrets
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from edge.errors import EdgeError
from edge.fleet.acl import own_level
from edge.mqtt.client import BrokerConfig
from edge.mqtt.netloop import Backoff, Connection, ConnectOptions, NetworkLoop
from edge.mqtt.payloads import encode
from edge.mqtt.topics import Topic, TopicError, check_part


class RemoteTuneError(EdgeError):
    """The device cannot be tuned: not connected, another class, refused or did not answer."""


MAX_REPLY = 1 << 20


class ArtifactServer:
    """``root``'s files over HTTP on ``addr`` (``HOST:PORT``, port 0: any free one), until ``close``."""

    def __init__(self, root: Path, addr: str) -> None:
        host, _, port = addr.rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise RemoteTuneError(f"--serve {addr!r}: expected HOST:PORT (port 0: any free one)")

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def list_directory(self, path: Any) -> None:
                self.send_error(404)  # the archives by name only
                return None

        try:
            self.httpd = ThreadingHTTPServer((host, int(port)), functools.partial(Handler, directory=str(root)))
        except OSError as e:
            raise RemoteTuneError(f"--serve {addr}: cannot listen there: {e}") from None
        self.httpd.daemon_threads = True
        shown = host if host not in ("0.0.0.0", "::", "") else __import__("socket").getfqdn()
        self.base_url = f"http://{shown}:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="edgekit-tune-http", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5.0)

    def __enter__(self) -> ArtifactServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DeviceLink:
    """One MQTT connection to one device: its retained birth and death, and its ``tune`` replies."""

    def __init__(self, broker: BrokerConfig, fleet: str, device: str, client_id: str | None = None) -> None:
        check_part(fleet, "fleet")
        check_part(device, "device id")
        self.fleet, self.device = fleet, device
        self.client_id = client_id or f"edgekit-tune-{secrets.token_hex(4)}"
        self.topics = {k: str(Topic(fleet, device, k)) for k in ("birth", "death", "tune")}
        # under the identity the broker knows (edge.fleet.acl.own_level): the generated ACL lets it read only its own
        self._sync = str(Topic(fleet, own_level(broker, self.client_id), "cmd", "tune-sync"))
        self._token = secrets.token_hex(8)
        self.birth: dict[str, Any] | None = None
        self.death: dict[str, Any] | None = None
        self.replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self.synced = threading.Event()
        self.loop = NetworkLoop(name="edgekit-tune")
        subs = [(self.topics[k], 1) for k in ("birth", "death", "tune")] + [(self._sync, 1)]
        self.conn = Connection(
            self.loop,
            broker,
            self.client_id,
            subscriptions=subs,
            on_message=self._message,
            on_connected=self._connected,
            options=ConnectOptions(backoff=Backoff(0.2, 5.0)),
        )

    def __enter__(self) -> DeviceLink:
        self.loop.start()
        self.conn.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.loop.run(self.conn.close)
            self.conn.closed.wait(5.0)
        finally:
            self.loop.stop()

    def _connected(self, conn: Connection) -> None:
        conn.publish(self._sync, self._token.encode(), qos=1)  # comes back after the retained messages

    def _message(self, _conn: Connection, msg: Any) -> None:
        try:
            topic, payload = msg.topic, bytes(msg.payload)
        except UnicodeDecodeError:
            return
        if topic == self._sync:
            if payload == self._token.encode():
                self.synced.set()
            return
        try:
            t = Topic.parse(topic)
        except TopicError:
            return
        if not payload or len(payload) > MAX_REPLY:
            if not payload and t.kind in ("birth", "death"):
                setattr(self, t.kind, None)
            return
        try:
            obj = json.loads(payload.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            return
        if not isinstance(obj, dict) or obj.get("device") != self.device or obj.get("fleet") != self.fleet:
            return
        if t.kind in ("birth", "death"):
            setattr(self, t.kind, obj)
        elif t.kind == "tune" and obj.get("type") == "tune":
            self.replies.put(obj)

    def online(self) -> bool:
        from edge.fleet.rollout_view import DeviceView

        return DeviceView(self.device, birth=self.birth, death=self.death).online

    def send(self, payload: dict[str, Any]) -> None:
        topic = str(Topic(self.fleet, self.device, "cmd", "tune"))
        data = encode(payload)
        if self.loop.run(lambda: self.conn.publish(topic, data, qos=1)) is None:
            raise RemoteTuneError(f"cannot send the tune request to {self.device}: not connected to the broker")
