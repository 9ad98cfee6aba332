"""A real Mosquitto for tests and benchmarks: own temporary config, a free loopback port, stopped after.

Never port 1883, never a non-loopback address. Imported by the MQTT tests (not by conftest)
and by ``benchmarks/fleet_ingest.py``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from edge.mqtt.lite import mqtt_packet, mqtt_string

HOST = "127.0.0.1"


def mosquitto_binary() -> str | None:
    found = shutil.which("mosquitto")
    if found:
        return found
    return "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port = int(s.getsockname()[1])
    assert port != 1883
    return port


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((HOST, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listens on {HOST}:{port} after {timeout} s")


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(directory: Path, name: str = "edgekit-test-ca") -> TlsFiles:
    """A CA, a server certificate for 127.0.0.1/localhost, and a client certificate (openssl CLI, EC keys)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl program is not installed (apt-get install openssl)")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "2",
        "-subj",
        f"/CN={name}",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        cwd=d,
    )
    for who, san in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"), ("client", None)):
        _openssl(
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            f"/CN={who}",
            "-keyout",
            f"{who}.key",
            "-out",
            f"{who}.csr",
            cwd=d,
        )
        ext = d / f"{who}.ext"
        ext.write_text((san + "\n") if san else "basicConstraints=CA:FALSE\n")
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{who}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            f"{who}.pem",
            "-extfile",
            ext.name,
            cwd=d,
        )
    for f in d.glob("*.key"):
        f.chmod(0o644)  # mosquitto may drop privileges when started by root
    return TlsFiles(d / "ca.pem", d / "ca.key", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key")


@dataclass(frozen=True)
class FleetPki:
    """A fleet CA made by ``edge.fleet.pki``, a broker certificate for 127.0.0.1, and provisioned clients."""

    ca_dir: Path
    tls: TlsFiles  # for ``Mosquitto(tls=...)``: the fleet CA, the broker's certificate and key
    clients: dict[str, Any]  # device id or "collector:<name>" -> edge.fleet.pki.Provisioned


def make_fleet_pki(directory: Path, devices: tuple[str, ...] = (), collectors: tuple[str, ...] = ("main",)) -> FleetPki:
    """Everything an mTLS fleet broker needs, made the way `edgekit fleet ca init` / `fleet provision` make it."""
    pytest.importorskip("cryptography", reason="cryptography is not installed (pip install 'edgekit-ml[fleet]')")
    from edge.fleet.pki import Role, init_ca, provision

    d = Path(directory)
    ca = init_ca(d / "ca")
    server = provision(HOST, ca.directory, d / "broker", role=Role.SERVER, sans=(HOST, "localhost"))
    clients: dict[str, Any] = {}
    for name in devices:
        clients[name] = provision(name, ca.directory, d / "devices" / name)
    for name in collectors:
        clients[f"collector:{name}"] = provision(name, ca.directory, d / "collectors" / name, role=Role.COLLECTOR)
    server.key.chmod(0o644)  # mosquitto may drop privileges when started by root
    tls = TlsFiles(ca.cert, ca.key, server.cert, server.key, server.cert, server.key)
    return FleetPki(ca.directory, tls, clients)


def mtls_broker(workdir: Path, pki: FleetPki, acl_file: Path) -> Mosquitto:
    """A broker (not started) that takes only fleet-CA client certificates, their CN as the user name, and the ACL.

    ``max_queued_messages 1000`` (a later line wins): with the ``0`` of the other test brokers, Mosquitto 2.0
    also disconnects a client whose publish the ACL denied (it compares its queue length with the limit
    there), which a production broker with the default limit does not do."""
    return Mosquitto(
        workdir,
        tls=pki.tls,
        require_certificate=True,
        identity_as_username=True,
        acl_file=acl_file,
        extra="max_queued_messages 1000\n",
    )


def password_file(path: Path, users: dict[str, str]) -> Path:
    exe = shutil.which("mosquitto_passwd")
    if exe is None:
        pytest.skip("mosquitto_passwd is not installed (it comes with the mosquitto package)")
    path.write_text("")
    for user, pw in users.items():
        subprocess.run([exe, "-b", str(path), user, pw], check=True, capture_output=True, timeout=30)
    path.chmod(0o644)
    return path


class Mosquitto:
    """One broker process. ``restart()`` keeps the port and the persistence file."""

    def __init__(
        self,
        workdir: Path,
        *,
        port: int | None = None,
        tls: TlsFiles | None = None,
        require_certificate: bool = False,
        passwords: Path | None = None,
        identity_as_username: bool = False,
        acl_file: Path | None = None,
        extra: str = "",
    ) -> None:
        exe = mosquitto_binary()
        if exe is None:
            pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
        self.exe = exe
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.tls = tls
        anonymous = not (passwords or identity_as_username)
        lines = [
            f"listener {self.port} {HOST}",
            f"allow_anonymous {'true' if anonymous else 'false'}",
            "persistence true",
            f"persistence_location {self.workdir}/",
            "autosave_interval 1",
            "max_queued_messages 0",
            f"log_dest file {self.workdir}/mosquitto.log",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "log_type information",
        ]
        if os.geteuid() == 0:
            lines.append("user root")
        if passwords:
            lines.append(f"password_file {passwords}")
        if tls:
            lines += [
                f"cafile {tls.ca}",
                f"certfile {tls.server_cert}",
                f"keyfile {tls.server_key}",
                f"require_certificate {'true' if require_certificate else 'false'}",
            ]
        if identity_as_username:  # the client certificate's CN is the user name the ACL's %u stands for
            if not (tls and require_certificate):
                raise ValueError("use_identity_as_username needs a TLS listener with require_certificate")
            lines.append("use_identity_as_username true")
        if acl_file:
            lines.append(f"acl_file {acl_file}")
        self.config = self.workdir / "mosquitto.conf"
        self.config.write_text("\n".join(lines) + "\n" + extra)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{HOST}:{self.port}"

    def start(self) -> Mosquitto:
        self.proc = subprocess.Popen(
            [self.exe, "-c", str(self.config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            wait_port(self.port)
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"mosquitto did not start: {self.log()[-2000:]}") from None
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        p, self.proc = self.proc, None
        if p is None:
            return
        if p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if p.stderr:
            p.stderr.close()

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()

    def log(self) -> str:
        f = self.workdir / "mosquitto.log"
        return f.read_text(errors="replace") if f.exists() else ""

    def __enter__(self) -> Mosquitto:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def preload_qos1(port: int, messages: list[tuple[str, bytes]], window: int = 5000) -> float:
    """QoS 1 PUBLISH packets on one MQTT 3.1.1 connection, at most ``window`` unacknowledged; seconds taken.

    Written out by hand: paho's Python loop would take longer to fill the broker than the collector takes
    to drain it, and the pre-load is not what is measured."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as s:
        body = (
            mqtt_string("MQTT")
            + bytes([4, 0x02])
            + struct.pack("!H", 60)
            + mqtt_string(f"edgekit-bench-preload-{os.getpid()}")
        )
        s.sendall(mqtt_packet(0x10, body))
        if s.recv(4) != b"\x20\x02\x00\x00":
            raise RuntimeError("the broker refused the pre-loader's connection")
        buf = bytearray()
        acked = 0
        for start in range(0, len(messages), window):
            chunk = messages[start : start + window]
            out = bytearray()
            for i, (topic, payload) in enumerate(chunk):
                mid = (start + i) % 65535 + 1
                var = mqtt_string(topic) + struct.pack("!H", mid)
                out += mqtt_packet(0x32, var + payload)
            s.sendall(out)
            want = (start + len(chunk)) * 4
            while acked * 4 < want:
                data = s.recv(1 << 16)
                if not data:
                    raise RuntimeError("the broker closed the pre-loader's connection")
                buf += data
                acked += len(data) // 4  # PUBACKs: 4 bytes each
                del buf[: len(data) - len(data) % 4]
        s.sendall(b"\xe0\x00")
    return time.monotonic() - t0


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    with Mosquitto(tmp_path / "broker") as m:
        yield m


BRIDGE_TOPICS = ("edgekit/# out 1", "edgekit/+/+/cmd/# in 1", "edgekit/+/+/desired in 1")


def bridge_config(
    central: Mosquitto, *, name: str = "central", topics: tuple[str, ...] = BRIDGE_TOPICS, protocol: str = "mqttv311"
) -> str:
    """Mosquitto config lines that bridge a site broker to ``central`` (for ``Mosquitto(extra=...)``): what the
    devices publish goes out, commands and desired states come in; a persistent bridge session (QoS 1 kept
    while the link is down), reconnecting after 1 s. ``protocol``: ``mqttv311`` or ``mqttv50``."""
    lines = [
        f"connection {name}",
        f"address {HOST}:{central.port}",
        *(f"topic {t}" for t in topics),
        "cleansession false",
        f"remote_clientid edgekit-bridge-{name}-{os.getpid()}",
        "restart_timeout 1",
        f"bridge_protocol_version {protocol}",
        "try_private true",
    ]
    return "\n".join(lines) + "\n"
