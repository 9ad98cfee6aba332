"""Device identity keys without a broker: the key file on the device, the signed form the collector accepts (every
other form is refused as malformed, fail closed), the pin in both stores (SQLite and PostgreSQL) and the
migration of a database made before device keys (edge.mqtt.identity, edge.fleet.device_keys)."""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

from edge.fleet.collector import Collector, CollectorConfig
from edge.fleet.db import SCHEMA
from edge.fleet.decode import Rejected, decode
from edge.fleet.device_keys import trust_key
from edge.fleet.retention import prune_url
from edge.fleet.status import fleet_status
from edge.mqtt.client import BrokerConfig
from edge.mqtt.identity import SUFFIX_LEN, DeviceIdentity, IdentityError, read_public
from edge.mqtt.payloads import encode, message

T0 = time.time()
S = int(T0) - 100
TOPIC = "edgekit/lab/cam-01/birth"


def birth(session: int = S, host: str = "real", key: DeviceIdentity | None = None, connection: int = 1) -> bytes:
    m = message("birth", "lab", "cam-01", session, 0, {"connection": connection, "host": {"hostname": host}})
    return encode(m) if key is None else key.sign(m)


def death(key: DeviceIdentity | None, session: int = S, connection: int = 1) -> bytes:
    m = message("death", "lab", "cam-01", session, 0, {"connection": connection, "reason": "will"})
    return encode(m) if key is None else key.sign(m)


def test_the_key_file_is_made_once_0600_and_refused_when_others_can_read_it(tmp_path: Path) -> None:
    d = tmp_path / "agent"
    a = DeviceIdentity.load_or_create(d)
    assert (d / "device-key.pem").stat().st_mode & 0o777 == 0o600
    assert DeviceIdentity.load_or_create(d).key_id == a.key_id  # the same key at every start
    assert read_public(d / "device-key.pub") == a.public
    (tmp_path / "b64").write_text(a.key_text + "\n")
    assert read_public(tmp_path / "b64") == a.public
    os.chmod(d / "device-key.pem", 0o644)
    with pytest.raises(IdentityError, match="readable by others"):
        DeviceIdentity.load_or_create(d)
    os.chmod(d / "device-key.pem", 0o600)
    (d / "device-key.pem").write_bytes(b"not a key")
    with pytest.raises(IdentityError, match="not a PEM private key"):  # never silently replaced
        DeviceIdentity.load_or_create(d)
    for bad in (b"x" * 64, b"", base64.b64encode(b"k" * 31)):
        (tmp_path / "bad.pub").write_bytes(bad)
        with pytest.raises(IdentityError):
            read_public(tmp_path / "bad.pub")


def _forms(key: DeviceIdentity) -> dict[str, bytes]:
    good = birth(key=key)
    head, sig = good[:-SUFFIX_LEN], json.loads(good)["sig"]
    obj = json.loads(good)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    loose = sig[:85] + alphabet[alphabet.index(sig[85]) + 1] + "=="  # the same 64 bytes, non-zero padding bits
    return {
        "key without sig": encode({k: v for k, v in obj.items() if k != "sig"}),
        "sig not last": head + b',"sig":"' + sig.encode() + b'","x":1}',
        "sig too short": head + b',"sig":"' + sig[:-4].encode() + b'"}',
        "sig not base64": head + b',"sig":"' + b"!" * 88 + b'"}',
        "key not 32 bytes": encode({**obj, "key": base64.b64encode(b"k" * 31).decode()}),
        "a second sig before": head + b',"sig":"' + b"A" * 86 + b'==",' + good[-SUFFIX_LEN + 1 :],
        "non-canonical base64": head + b',"sig":"' + loose.encode() + b'"}',
    }


@pytest.mark.parametrize(
    "form",
    [
        "key without sig",
        "sig not last",
        "sig too short",
        "sig not base64",
        "key not 32 bytes",
        "a second sig before",
        "non-canonical base64",
    ],
)
def test_a_payload_that_claims_a_signature_in_any_other_form_is_malformed(form: str) -> None:
    with pytest.raises(Rejected) as e:
        decode(TOPIC, _forms(DeviceIdentity.generate())[form], now=T0)
    assert e.value.reason == "malformed", e.value


def test_the_signature_covers_every_byte_of_the_message() -> None:
    key = DeviceIdentity.generate()
    good = birth(key=key)
    d = decode(TOPIC, good, now=T0)
    assert d.signed is not None and d.signed.key == key.public and d.signed.verifies_with(key.public)
    edited = good.replace(b'"hostname":"real"', b'"hostname":"evil"')
    e = decode(TOPIC, edited, now=T0)
    assert e.signed is not None and not e.signed.verifies_with(key.public)
    assert not d.signed.verifies_with(DeviceIdentity.generate().public)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/fleet.db"
    return str(request.getfixturevalue("postgres_url"))


def test_the_pin_in_both_stores(db_url: str) -> None:
    real, forger = DeviceIdentity.generate(), DeviceIdentity.generate()
    c = Collector(CollectorConfig(BrokerConfig("127.0.0.1", 1), db_url, gap_grace_s=0.0))
    try:
        assert c.handle(TOPIC, birth(key=real), received_at=T0) == "stored"  # first sight pins
        assert c.handle(TOPIC, birth(S + 250, "forged"), received_at=T0) == "unsigned"
        assert c.handle(TOPIC, birth(S + 251, "forged", forger), received_at=T0) == "wrong_key"
        death_topic = TOPIC.replace("birth", "death")
        assert c.handle(death_topic, death(None), received_at=T0) == "unsigned"
        assert c.handle(death_topic, death(forger, connection=2), received_at=T0) == "wrong_key"
        # telemetry on the forged session is history: the row keeps the birth's session and figures
        tel = message("telemetry", "lab", "cam-01", S + 250, 1, {"historical": False, "inference": {"fps": 1.0}})
        assert c.handle(TOPIC.replace("birth", "telemetry"), encode(tel), received_at=T0) == "stored"
        assert c.handle(TOPIC, birth(S + 1, "real-2", real), received_at=T0 + 1) == "stored"
        c.flush()
        row = fleet_status(db_url, now=T0 + 2)[0]
        assert (row["hostname"], row["session"], row["status"], row["fps"]) == ("real-2", S + 1, "online", None)
        assert row["key"]["key_id"] == real.key_id and row["key"]["refused"] == 4, row["key"]
        assert {k: v for k, v in c.stats["rejected"].items() if v} == {"unsigned": 2, "wrong_key": 2}
    finally:
        c.db.close()
    rep = prune_url(db_url, 5.0, now=T0 + 10)  # retention forgets old refusals, never the pin
    row = fleet_status(db_url, now=T0 + 10)[0]
    assert rep.deleted["key_refusals"] == 1 and row["key"]["refused"] == 0 and row["key"]["key_id"] == real.key_id


def test_a_database_made_before_device_keys_gains_the_table_and_keeps_its_legacy_devices(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as old:  # schema 1 as released, without device_keys
        for stmt in SCHEMA:
            if "device_keys" not in stmt:
                old.execute(stmt)
        old.execute("INSERT INTO meta(key, value) VALUES ('schema_version', '1')")
    url = f"sqlite:///{path}"
    c = Collector(CollectorConfig(BrokerConfig("127.0.0.1", 1), url, gap_grace_s=0.0))
    try:
        assert c.handle(TOPIC, birth(), received_at=T0) == "stored"  # a legacy agent: unsigned, never pinned
        assert c.handle(TOPIC, birth(S + 1, "legacy-2"), received_at=T0) == "stored"
        key = DeviceIdentity.generate()  # upgraded: its first signed birth pins
        assert c.handle(TOPIC, birth(S + 2, "upgraded", key), received_at=T0) == "stored"
        assert c.handle(TOPIC, birth(S + 3, "forged"), received_at=T0) == "unsigned"
        c.flush()
        row = fleet_status(url, now=T0)[0]
        assert row["hostname"] == "upgraded" and row["key"]["pinned_by"] == "birth"
    finally:
        c.db.close()


def test_telemetry_moves_no_row_of_a_device_pinned_before_its_first_birth(tmp_path: Path) -> None:
    """Pinned by the operator before any birth was stored: no session is the device's yet, so telemetry (unsigned)
    of any session is history until a birth its key signed arrives (before, any session's telemetry was the row's
    while no birth was known)."""
    url = f"sqlite:///{tmp_path}/fleet.db"
    key = DeviceIdentity.generate()
    c = Collector(CollectorConfig(BrokerConfig("127.0.0.1", 1), url, gap_grace_s=0.0))
    tel_topic = TOPIC.replace("birth", "telemetry")

    def tel(session: int, seq: int, fps: float) -> bytes:
        return encode(
            message("telemetry", "lab", "cam-01", session, seq, {"historical": False, "inference": {"fps": fps}})
        )

    try:
        trust_key(url, "lab", "cam-01", key.public, now=T0)
        assert c.handle(tel_topic, tel(S + 200, 1, 1.0), received_at=T0) == "stored"  # a forger's session
        c.flush()
        assert fleet_status(url, now=T0)[0]["fps"] is None
        assert c.handle(TOPIC, birth(key=key), received_at=T0) == "stored"
        assert c.handle(tel_topic, tel(S, 1, 30.0), received_at=T0) == "stored"
        c.flush()
        row = fleet_status(url, now=T0)[0]
        assert (row["session"], row["fps"], row["key"]["pinned_by"]) == (S, 30.0, "operator")
    finally:
        c.db.close()


def test_unsigned_telemetry_does_not_bring_a_stopped_pinned_device_back_online(db_url: str) -> None:
    """A legacy device's live telemetry after a death brings it back online (a forged death once kept it offline);
    a pinned device's deaths are signed, so its death stands and forged telemetry on its session cannot make it
    look alive (it did before: online = true on the first message past the stream's position)."""
    key = DeviceIdentity.generate()
    tel_topic = TOPIC.replace("birth", "telemetry")
    c = Collector(CollectorConfig(BrokerConfig("127.0.0.1", 1), db_url, gap_grace_s=0.0))

    def tel(device: str, seq: int) -> tuple[str, bytes]:
        body = {"historical": False, "inference": {"fps": 30.0}}
        return tel_topic.replace("cam-01", device), encode(message("telemetry", "lab", device, S, seq, body))

    try:
        legacy = encode(message("birth", "lab", "cam-02", S, 0, {"connection": 1}))
        assert c.handle(TOPIC.replace("cam-01", "cam-02"), legacy, received_at=T0) == "stored"
        assert c.handle(TOPIC, birth(key=key), received_at=T0) == "stored"
        for dev, k in (("cam-01", key), ("cam-02", None)):
            assert c.handle(*tel(dev, 1), received_at=T0) == "stored"
            m = message("death", "lab", dev, S, 1, {"connection": 1, "reason": "shutdown"})
            assert (
                c.handle(f"edgekit/lab/{dev}/death", encode(m) if k is None else k.sign(m), received_at=T0) == "stored"
            )
            assert c.handle(*tel(dev, 2), received_at=T0 + 1) == "stored"  # live, past the death's position
        c.flush()
        status = {r["device"]: r["status"] for r in fleet_status(db_url, now=T0 + 2)}
        assert status == {"cam-01": "offline", "cam-02": "online"}, status
    finally:
        c.db.close()
