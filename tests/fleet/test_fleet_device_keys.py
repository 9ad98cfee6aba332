"""Issue #33, red team "fleet rows (no ACL)", last case: births and deaths signed with the device's identity key,
pinned by the collector at first sight (edge.mqtt.identity, edge.fleet.device_keys). A real Mosquitto without an
ACL, the real collector, the agent's own protocol layer as the device, a second client as the forger.

Before: a forged birth with session now+250 (inside the 300 s skew window) took the device's row over (hostname,
bundle, then its telemetry's p99); a forged death on the real session and connection marked the live device offline.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from edge.fleet.collector import Collector, CollectorConfig
from edge.fleet.status import fleet_status
from edge.mqtt.client import BrokerConfig
from edge.mqtt.identity import DeviceIdentity
from edge.mqtt.netloop import Backoff, Connection, ConnectOptions, NetworkLoop
from edge.mqtt.outbox import MemoryOutbox, Outbox
from edge.mqtt.payloads import encode, message
from edge.mqtt.session import DeviceSession, SessionOptions
from tests.support.cli import run_cli, wait_for
from tests.support.fleet_db import count
from tests.support.mqtt_broker import Mosquitto

FAST = Backoff(0.05, 0.5)
LAT = {"p50_ms": 4.0, "p99_ms": 9.0, "max_ms": 11.0}


class Fleet:
    """A broker, a collector, a forger's connection, and devices made on demand."""

    def __init__(self, tmp_path: Path, loop: NetworkLoop, broker: Mosquitto) -> None:
        self.db, self.loop = tmp_path / "fleet.db", loop
        self.url = f"sqlite:///{self.db}"
        self.cfg = BrokerConfig.from_url(broker.url)
        self.col = Collector(CollectorConfig(self.cfg, self.url, fleet="lab", backoff=FAST, gap_grace_s=0.0))
        self.col.start(loop)
        self.forger = Connection(loop, self.cfg, "forger", options=ConnectOptions(backoff=FAST))
        loop.run(self.forger.start)
        self.devices: list[DeviceSession] = []

    def device(self, identity: DeviceIdentity | None, outbox: Outbox, host: str = "real") -> DeviceSession:
        dev = DeviceSession(
            self.loop,
            self.cfg,
            "lab",
            "cam-01",
            outbox,
            options=SessionOptions(backoff=FAST, identity=identity),
            birth_body=lambda: {"agent": {"interval_s": 1.0}, "state": "running", "host": {"hostname": host}},
        )
        self.devices.append(dev)
        self.loop.run(dev.start)
        wait_for(lambda: dev.connected and self.col.connected and self.forger.connected, what="everyone connected")
        return dev

    def forge(self, kind: str, session: int, body: dict[str, Any], signer: DeviceIdentity | None = None) -> None:
        msg = message(kind, "lab", "cam-01", session, 0, body)
        payload = encode(msg) if signer is None else signer.sign(msg)
        self.loop.run(self.forger.publish, f"edgekit/lab/cam-01/{kind}", payload, 1)

    def refused(self) -> int:
        r = self.col.snapshot()["rejected"]
        return int(r["unsigned"] + r["wrong_key"] + r["bad_signature"])

    def row(self) -> dict[str, Any]:
        return {r["device"]: r for r in fleet_status(self.url)}["cam-01"]

    def close(self) -> None:
        for dev in self.devices:
            dev.close(timeout=2)
        self.loop.run(self.forger.close)
        self.forger.closed.wait(2)
        self.col.stop()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Mosquitto(tmp_path / "broker") as broker, NetworkLoop(name="edgekit-test") as loop:
        f = Fleet(tmp_path, loop, broker)
        try:
            yield f
        finally:
            f.close()


def test_a_forged_birth_with_a_newer_session_leaves_a_pinned_row_as_it_was(fleet: Fleet) -> None:
    key, outbox = DeviceIdentity.generate(), MemoryOutbox()
    dev = fleet.device(key, outbox)
    fleet.loop.run(dev.submit, "telemetry", {"inference": {"latency_ms": LAT}})
    wait_for(lambda: count(fleet.db, "SELECT count(*) FROM telemetry") == 1, what="the real telemetry")
    ahead = dev.session + 250
    assert ahead <= time.time() + 300  # inside the collector's skew window: only the key stops it
    forged = {"connection": 1, "state": "running", "host": {"hostname": "forged"}, "agent": {"interval_s": 1.0}}
    fleet.forge("birth", ahead, forged)  # unsigned
    fleet.forge("birth", ahead + 1, forged, signer=DeviceIdentity.generate())  # the forger's own key
    # the device's key is public (every birth carries it): named, with a signature it did not make
    stolen = DeviceIdentity.generate()
    stolen.key_text = key.key_text
    fleet.forge("birth", ahead + 2, forged, signer=stolen)
    tel = {"historical": False, "inference": {"latency_ms": {**LAT, "p99_ms": 999.0}}}
    msg = message("telemetry", "lab", "cam-01", ahead, 1, tel)
    fleet.loop.run(fleet.forger.publish, "edgekit/lab/cam-01/telemetry", encode(msg), 1)
    # one forger, one subscription: its telemetry arrives after its births
    wait_for(lambda: count(fleet.db, "SELECT count(*) FROM telemetry") == 2, what="the forged telemetry stored")
    row = fleet.row()
    assert (row["session"], row["hostname"], row["p99_ms"], row["status"]) == (dev.session, "real", 9.0, "online")
    assert count(fleet.db, f"SELECT count(*) FROM births WHERE session >= {ahead}") == 0  # refused, not stored
    assert row["key"]["key_id"] == key.key_id  # pinned by the device's first signed birth
    r = fleet.col.snapshot()["rejected"]
    assert (r["unsigned"], r["wrong_key"], r["bad_signature"]) == (1, 1, 1), r
    assert row["key"]["refused"] == 3 and row["key"]["last_refused"]["reason"] == "bad_signature", row["key"]
    p = run_cli("fleet", "status", "--db", fleet.url)
    assert p.returncode == 0 and "key refused" in p.stdout, p.stdout + p.stderr
    # the real device's next birth (a restart: the next session, the same key) is stored and takes the row
    dev.close(timeout=2)
    dev2 = fleet.device(key, outbox, host="real-2")
    assert dev2.session > dev.session
    wait_for(lambda: fleet.row()["hostname"] == "real-2", what="the real device's next birth")
    assert fleet.row()["session"] == dev2.session and fleet.refused() == 3


def test_a_forged_death_leaves_a_pinned_device_online(fleet: Fleet) -> None:
    key = DeviceIdentity.generate()
    dev = fleet.device(key, MemoryOutbox())
    wait_for(lambda: count(fleet.db, "SELECT count(*) FROM births") == 1, what="the signed birth")
    death = {"connection": dev.connection, "reason": "forged"}  # the real session and connection
    fleet.forge("death", dev.session, death)
    fleet.forge("death", dev.session, {**death, "connection": dev.connection + 1}, signer=DeviceIdentity.generate())
    other = message("telemetry", "lab", "cam-02", dev.session, 1, {"historical": False})  # after them, in order
    fleet.loop.run(fleet.forger.publish, "edgekit/lab/cam-02/telemetry", encode(other), 1)
    wait_for(lambda: count(fleet.db, "SELECT count(*) FROM telemetry") == 1, what="the forger's next message")
    assert fleet.row()["status"] == "online" and count(fleet.db, "SELECT count(*) FROM deaths") == 0
    assert fleet.refused() == 2
    # the real last will (armed, and signed, when the device connected): the connection drops without a DISCONNECT
    first = dev.connection
    fleet.loop.run(lambda: dev.conn.client.socket().shutdown(socket.SHUT_RDWR))
    wait_for(lambda: count(fleet.db, "SELECT count(*) FROM deaths") == 1, what="the device's signed will")
    assert count(fleet.db, f"SELECT count(*) FROM deaths WHERE connection = {first} AND reason LIKE 'last will%'")
    wait_for(lambda: count(fleet.db, "SELECT count(*) FROM births") == 2, what="the birth of its reconnection")
    wait_for(lambda: fleet.row()["status"] == "online", what="online again")
    assert fleet.refused() == 2


def test_a_reinstalled_device_is_refused_until_its_key_is_trusted_or_forgotten(fleet: Fleet, tmp_path: Path) -> None:
    old = DeviceIdentity.generate()
    dev = fleet.device(old, MemoryOutbox())
    wait_for(lambda: count(fleet.db, "SELECT count(*) FROM births") == 1, what="the first birth")
    dev.close(timeout=2)
    # reinstalled: a new key made at its first start, in its store's agent directory
    new = DeviceIdentity.load_or_create(tmp_path / "store" / "agent")
    assert (tmp_path / "store" / "agent" / "device-key.pem").stat().st_mode & 0o777 == 0o600
    outbox = MemoryOutbox()
    dev = fleet.device(new, outbox, host="reinstalled")
    # the refusal as committed (the collector's counter moves before its transaction commits)
    wait_for(lambda: fleet.row()["key"]["refused"] == 1, what="the new key's birth refused")
    assert fleet.row()["key"]["last_refused"] == {
        "reason": "wrong_key",
        "key_id": new.key_id,
        "at": fleet.row()["key"]["last_refused"]["at"],
    }
    pub = str(tmp_path / "store" / "agent" / "device-key.pub")
    p = run_cli("fleet", "trust-key", "cam-01", pub, "--fleet", "lab", "--db", fleet.url)
    assert p.returncode == 0 and new.key_id in p.stdout and old.key_id in p.stdout, p.stdout + p.stderr
    dev.close(timeout=2)
    dev = fleet.device(new, outbox, host="reinstalled")
    wait_for(lambda: fleet.row()["hostname"] == "reinstalled", what="the trusted key's birth")
    assert fleet.row()["key"]["pinned_by"] == "operator" and fleet.row()["key"]["refused"] == 0
    # forget-key: the next signed birth pins again, whichever key signs it
    p = run_cli("fleet", "forget-key", "cam-01", "--fleet", "lab", "--db", fleet.url, "--json")
    assert p.returncode == 0 and new.key_id in p.stdout, p.stdout + p.stderr
    third = DeviceIdentity.generate()
    dev.close(timeout=2)
    fleet.device(third, outbox, host="third")
    wait_for(lambda: fleet.row()["hostname"] == "third", what="the next signed birth pins")
    assert fleet.row()["key"]["key_id"] == third.key_id and fleet.row()["key"]["pinned_by"] == "birth"
