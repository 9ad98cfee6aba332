"""Issue 11, attack 7: whoever can publish to the broker must not be able to rewrite the fleet.

Two layers. The broker: per-device certificates from the fleet CA and a generated ACL, tested
against a real Mosquitto with an mTLS listener (device A cannot publish as B, nor read B's
commands). The collector, for whatever still gets through (a leaked key, a broker without the
ACL): bounded sessions and sequence numbers, bounded memory, a status table that prints device
text as text, no password in any message, and rejection logs at a rate no sender chooses.
"""

from __future__ import annotations

import inspect
import json
import logging
import stat
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("cryptography", reason="cryptography is not installed (pip install 'edgekit-ml[fleet]')")

from edge.errors import EdgeError  # noqa: E402
from edge.fleet.acl import mosquitto_acl, write_acl  # noqa: E402
from edge.fleet.collector import Collector, CollectorConfig  # noqa: E402
from edge.fleet.db import open_db  # noqa: E402
from edge.fleet.pki import PkiError, Role, init_ca, make_device_key_and_csr, provision, sign_csr  # noqa: E402
from edge.fleet.status import fleet_status  # noqa: E402
from edge.mqtt.client import BrokerConfig  # noqa: E402
from edge.mqtt.netloop import Backoff, Connection, ConnectOptions, NetworkLoop  # noqa: E402
from edge.mqtt.outbox import MemoryOutbox  # noqa: E402
from edge.mqtt.payloads import encode, message  # noqa: E402
from edge.mqtt.ratelog import RateLimitedLog  # noqa: E402
from edge.mqtt.session import DeviceSession, SessionOptions  # noqa: E402
from tests.support.cli import assert_user_error, run_cli, wait_for  # noqa: E402
from tests.support.fleet_db import count  # noqa: E402
from tests.support.mqtt_broker import Mosquitto, make_fleet_pki, mtls_broker  # noqa: E402

FAST = Backoff(0.05, 0.5)
BIG = 2**63 - 1


# certificates ---------------------------------------------------------------------------------
def _cert(pem: bytes) -> Any:
    from cryptography import x509

    return x509.load_pem_x509_certificate(pem)


def _pub_der(obj: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return obj.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def test_the_ca_signs_a_csr_and_never_sees_the_device_key(tmp_path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca = init_ca(tmp_path / "ca")
    assert stat.S_IMODE(ca.key.stat().st_mode) == 0o600
    assert "key" not in inspect.signature(sign_csr).parameters  # the CA side takes CSR bytes, not a key
    made = make_device_key_and_csr("cam-01", tmp_path / "device")
    assert stat.S_IMODE(made.key.stat().st_mode) == 0o600 and b"PRIVATE" not in made.csr
    cert = _cert(sign_csr(made.csr, ca.directory))
    device_key = serialization.load_pem_private_key(made.key.read_bytes(), None)
    assert _pub_der(cert) == _pub_der(device_key)  # issued for the key that stayed on the device
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "cam-01"
    assert cert.issuer == _cert(ca.cert.read_bytes()).subject
    cert.verify_directly_issued_by(_cert(ca.cert.read_bytes()))
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]  # a device certificate cannot serve as a broker's
    assert sorted(p.name for p in ca.directory.iterdir()) == ["ca.crt", "ca.key"]  # nothing of the device's there

    p = provision("main", ca.directory, tmp_path / "col", role=Role.COLLECTOR)
    assert p.identity == "collector:main" and p.ca_cert.read_bytes() == ca.cert.read_bytes()
    with pytest.raises(PkiError, match="already exists"):
        init_ca(ca.directory)  # a CA is never overwritten


@pytest.mark.parametrize("name", ["", "a/b", "cam+", "cam#", "x" * 65, "collector:main", "cam 01", "cam\n01", "é"])
def test_device_ids_outside_the_charset_are_refused(tmp_path: Path, name: str) -> None:
    init_ca(tmp_path / "ca")
    with pytest.raises(PkiError, match="device id"):
        provision(name, tmp_path / "ca", tmp_path / "out")
    assert not list(tmp_path.glob("out/*"))  # refused before any key was made


def test_the_ca_checks_what_it_signs(tmp_path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import NameOID

    ca = init_ca(tmp_path / "ca")

    def csr(key: Any, *attrs: tuple[Any, str]) -> bytes:
        from cryptography.hazmat.primitives import serialization

        name = x509.Name([x509.NameAttribute(oid, v) for oid, v in attrs])
        return (
            x509.CertificateSigningRequestBuilder()
            .subject_name(name)
            .sign(key, hashes.SHA256())
            .public_bytes(serialization.Encoding.PEM)
        )

    k = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(PkiError, match="single CN"):  # nothing but the CN is copied, so nothing else is accepted
        sign_csr(csr(k, (NameOID.COMMON_NAME, "cam-01"), (NameOID.ORGANIZATION_NAME, "x")), ca.directory)
    with pytest.raises(PkiError, match="device id"):
        sign_csr(csr(k, (NameOID.COMMON_NAME, "collector:main")), ca.directory)  # no device gets a collector's CN
    with pytest.raises(PkiError, match="collector:"):
        sign_csr(csr(k, (NameOID.COMMON_NAME, "cam-01")), ca.directory, role=Role.COLLECTOR)
    with pytest.raises(PkiError, match="RSA"):
        sign_csr(csr(rsa.generate_private_key(65537, 2048), (NameOID.COMMON_NAME, "cam-01")), ca.directory)
    good = csr(k, (NameOID.COMMON_NAME, "cam-01"))
    lines = good.split(b"\n")  # a CSR whose bytes were changed after signing: one base64 character flipped
    for i in (1, 3):  # in the public key, in the signature
        line = bytearray(lines[i])
        line[10] = ord("A") if line[10] != ord("A") else ord("B")
        with pytest.raises(PkiError):
            sign_csr(b"\n".join([*lines[:i], bytes(line), *lines[i + 1 :]]), ca.directory)
    with pytest.raises(PkiError, match="not a PEM"):
        sign_csr(b"garbage", ca.directory)


def test_credential_commands(tmp_path: Path) -> None:
    ca, dev, acl = tmp_path / "ca", tmp_path / "dev", tmp_path / "acl.conf"
    p = run_cli("fleet", "ca", "init", "--dir", str(ca))
    assert p.returncode == 0, p.stderr
    p = run_cli("fleet", "provision", "cam-01", "--ca", str(ca), "--out", str(dev), "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["identity"] == "cam-01" and Path(out["cert"]).is_file() and Path(out["key"]).is_file()
    p = run_cli("fleet", "csr", "cam-02", "--out", str(tmp_path / "d2"))  # the two halves, as on two machines
    assert p.returncode == 0, p.stderr
    p = run_cli(
        "fleet",
        "sign-csr",
        str(tmp_path / "d2" / "cam-02.csr"),
        "--ca",
        str(ca),
        "--out",
        str(tmp_path / "d2" / "cam-02.crt"),
        "--json",
    )
    assert p.returncode == 0 and json.loads(p.stdout)["identity"] == "cam-02", p.stderr
    p = run_cli("fleet", "acl", "--fleet", "lab", "--out", str(acl))
    assert p.returncode == 0 and acl.read_text() == mosquitto_acl("lab"), p.stderr
    assert_user_error(run_cli("fleet", "ca", "init", "--dir", str(ca)), "already exists")
    assert_user_error(run_cli("fleet", "provision", "a/b", "--ca", str(ca), "--out", str(dev)), "device id")
    assert_user_error(
        run_cli("fleet", "provision", "cam-03", "--ca", str(tmp_path / "nope"), "--out", str(dev)), "no fleet CA"
    )
    assert_user_error(
        run_cli("fleet", "provision", "cam-03", "--role", "root", "--ca", str(ca), "--out", str(dev)), "--role"
    )
    assert_user_error(run_cli("fleet", "acl", "--fleet", "a/#", "--out", str(acl)), "fleet")
    assert_user_error(
        run_cli("fleet", "sign-csr", str(dev / "cam-01.crt"), "--ca", str(ca), "--out", str(tmp_path / "x.crt")),
        "not a PEM certificate signing request",
    )


def test_the_acl_text() -> None:
    text = mosquitto_acl("lab", collectors=["main", "backup"])
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert "pattern write edgekit/lab/%u/telemetry" in lines and "pattern read edgekit/lab/%u/cmd/#" in lines
    assert not [ln for ln in lines if ln.startswith("pattern") and "%u" not in ln]  # every device line is its own
    assert "user collector:main" in lines and "user collector:backup" in lines
    with pytest.raises(EdgeError):
        mosquitto_acl("l%ab")


# the broker: real Mosquitto, mTLS, identity as user name, the generated ACL --------------------
class Spy:
    """A raw client with some certificate, subscribed to what it should not see."""

    def __init__(self, loop: NetworkLoop, url: str, creds: Any, client_id: str, subs: list[str]) -> None:
        self.got: list[tuple[str, bytes]] = []
        self.conn = Connection(
            loop,
            BrokerConfig.from_url(url, ca_file=creds.ca_cert, cert_file=creds.cert, key_file=creds.key),
            client_id,
            options=ConnectOptions(backoff=FAST),
            subscriptions=[(s, 1) for s in subs],
            on_message=lambda _c, m: self.got.append((m.topic, bytes(m.payload))),
        )


def test_device_a_can_neither_publish_as_b_nor_read_bs_commands(tmp_path: Path) -> None:
    pki = make_fleet_pki(tmp_path / "pki", devices=("cam-a", "cam-b"), collectors=("main",))
    a, b, col_creds = pki.clients["cam-a"], pki.clients["cam-b"], pki.clients["collector:main"]
    acl = write_acl(tmp_path / "acl.conf", "lab", collectors=["main"])

    def cfg(creds: Any, url: str) -> BrokerConfig:
        return BrokerConfig.from_url(url, ca_file=creds.ca_cert, cert_file=creds.cert, key_file=creds.key)

    db = tmp_path / "fleet.db"
    with mtls_broker(tmp_path / "broker", pki, acl) as broker, NetworkLoop(name="edgekit-test") as loop:
        col = Collector(
            CollectorConfig(
                cfg(col_creds, broker.url), f"sqlite:///{db}", fleet="lab", backoff=FAST, rebirth_interval_s=0.0
            )
        ).start(loop)
        body = lambda: {"agent": {"interval_s": 1.0}, "state": "running"}  # noqa: E731
        dev_a = DeviceSession(
            loop,
            cfg(a, broker.url),
            "lab",
            "cam-a",
            MemoryOutbox(),
            options=SessionOptions(backoff=FAST),
            birth_body=body,
        )
        dev_b = DeviceSession(
            loop,
            cfg(b, broker.url),
            "lab",
            "cam-b",
            MemoryOutbox(),
            options=SessionOptions(backoff=FAST),
            birth_body=body,
        )
        # device A's certificate, claiming to be B: what a stolen or misconfigured device would do
        impostor = DeviceSession(
            loop,
            cfg(a, broker.url),
            "lab",
            "cam-b",
            MemoryOutbox(),
            options=SessionOptions(client_id="impostor", backoff=FAST),
            birth_body=lambda: {"state": "impostor"},
        )
        spy = Spy(loop, broker.url, a, "spy", ["edgekit/lab/cam-b/cmd/#", "edgekit/lab/+/+", "edgekit/lab/cam-a/cmd/#"])
        try:
            for s in (dev_a, dev_b):
                loop.run(s.start)
            loop.run(spy.conn.start)
            wait_for(
                lambda: col.connected and dev_a.connected and dev_b.connected and spy.conn.connected,
                what="every client connected over mTLS",
            )
            loop.run(dev_a.submit, "telemetry", {"inference": {"fps": 30.0}})
            loop.run(dev_b.submit, "telemetry", {"inference": {"fps": 30.0}})
            wait_for(lambda: count(db, "SELECT count(*) FROM telemetry") == 2, what="A's and B's own telemetry")

            loop.run(impostor.start)
            wait_for(lambda: impostor.connected, what="the impostor connected (with a valid certificate)")
            for _ in range(3):
                loop.run(impostor.submit, "telemetry", {"inference": {"fps": 1.0}, "bundle_id": "evil"})
            wait_for(lambda: impostor.counters["rejected_by_broker"] == 3, what="the broker's 'not authorized' PUBACKs")
            loop.run(dev_a.submit, "telemetry", {"inference": {"fps": 30.0}})  # after the forged ones, same broker
            wait_for(
                lambda: count(db, "SELECT count(*) FROM telemetry WHERE device = 'cam-a'") == 2,
                what="A's later telemetry",
            )
            assert count(db, "SELECT count(*) FROM telemetry WHERE device = 'cam-b'") == 1  # B's own, nothing forged
            assert count(db, "SELECT count(*) FROM births WHERE payload LIKE '%impostor%'") == 0  # its birth too
            assert count(db, "SELECT count(*) FROM telemetry WHERE payload LIKE '%evil%'") == 0

            # commands: the collector may write any device's cmd/; A's certificate reads only A's
            loop.run(col.request_rebirth, "lab", "cam-a", "probe")
            wait_for(lambda: any(t.endswith("cam-a/cmd/rebirth") for t, _ in spy.got), what="the spy's subscriptions")
            loop.run(col.request_rebirth, "lab", "cam-b", "for B only")
            loop.run(col.request_rebirth, "lab", "cam-a", "after B's")
            wait_for(lambda: sum(t.endswith("cam-a/cmd/rebirth") for t, _ in spy.got) == 2, what="A's second command")
            wait_for(lambda: dev_b.counters["rebirth_requests"] == 1, what="B got its own command")
            assert [t for t, _ in spy.got] == ["edgekit/lab/cam-a/cmd/rebirth"] * 2  # no B command, no telemetry
        finally:
            for s in (impostor, dev_a, dev_b):
                s.close(timeout=2)
            loop.run(spy.conn.close)
            spy.conn.closed.wait(2)
            col.stop()
        assert "cam-b" in broker.log() and "u'cam-a'" in broker.log()  # the broker saw the certificates' CNs


def test_only_the_fleet_ca_gets_in(tmp_path: Path) -> None:
    pki = make_fleet_pki(tmp_path / "pki", devices=("cam-a",))
    other = make_fleet_pki(tmp_path / "other", devices=("cam-a",))  # same CN, another CA
    acl = write_acl(tmp_path / "acl.conf", "lab")
    with mtls_broker(tmp_path / "broker", pki, acl) as broker, NetworkLoop(name="edgekit-test") as loop:
        creds = other.clients["cam-a"]
        cfg = BrokerConfig.from_url(
            broker.url, ca_file=pki.clients["cam-a"].ca_cert, cert_file=creds.cert, key_file=creds.key
        )
        conn = Connection(loop, cfg, "outsider", options=ConnectOptions(backoff=FAST))
        loop.run(conn.start)
        wait_for(lambda: conn.last_error, what="the refusal")
        assert not conn.connected
        loop.run(conn.close)
        conn.closed.wait(2)
        wait_for(
            lambda: "certificate verify failed" in broker.log() or "unknown ca" in broker.log().lower(),
            what="the broker's certificate error",
        )


def test_broker_fixture_refuses_identity_without_client_certificates(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="require_certificate"):
        Mosquitto(tmp_path / "b", identity_as_username=True)


# the collector, for whatever still reaches it -----------------------------------------------------
def msg(
    kind: str, device: str, session: int, seq: int, body: dict[str, Any] | None = None, fleet: str = "lab"
) -> tuple[str, bytes]:
    extra = {"connection": 1} if kind in ("birth", "death") else {"historical": False}
    return f"edgekit/{fleet}/{device}/{kind}", encode(
        message(kind, fleet, device, session, seq, {**extra, **(body or {})})
    )


def birth(device: str, session: int, bundle: str = "b1") -> tuple[str, bytes]:
    return msg(
        "birth", device, session, 0, {"state": "running", "agent": {"interval_s": 5.0}, "bundle": {"id": bundle}}
    )


def collector(url: str = "sqlite:///:memory:", **kw: Any) -> Collector:
    return Collector(CollectorConfig(BrokerConfig("127.0.0.1", 1), url, gap_grace_s=0.0, **kw))


def test_a_far_future_session_cannot_freeze_a_device(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/fleet.db"
    c = collector(url)
    now = time.time()
    s0 = int(now)
    assert c.handle(*birth("cam-01", s0, "real-1"), received_at=now) == "stored"
    assert c.handle(*birth("cam-01", BIG, "forged"), received_at=now) == "malformed"  # 2**63-1: out of range
    assert c.handle(*birth("cam-01", s0 + 10**6, "forged"), received_at=now) == "future_session"
    assert (
        c.handle(*msg("telemetry", "cam-01", s0 + 10**6, 1, {"bundle_id": "forged"}), received_at=now)
        == "future_session"
    )
    assert c.stats["rejected"]["future_session"] == 2 and c.stats["rejected"]["malformed"] == 1
    c.flush()
    with open_db(url) as db:  # refused means never stored, anywhere
        assert db.query("SELECT count(*) AS n FROM births")[0]["n"] == 1
        assert db.query("SELECT count(*) AS n FROM telemetry")[0]["n"] == 0
    # the device restarts (its next session) and its row follows it
    assert c.handle(*birth("cam-01", s0 + 1, "real-2"), received_at=now + 1) == "stored"
    c.flush()
    row = {r["device"]: r for r in fleet_status(url, now=now + 2)}["cam-01"]
    assert (row["session"], row["bundle_id"]) == (s0 + 1, "real-2")
    c.db.close()


def test_sequence_numbers_are_bounded_and_status_never_overflows(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/fleet.db"
    c = collector(url)
    now = time.time()
    assert c.handle(*msg("telemetry", "cam-01", 7, 2**53), received_at=now) == "malformed"
    assert c.handle(*msg("telemetry", "cam-01", 7, BIG), received_at=now) == "malformed"
    assert (
        c.handle(
            *msg("telemetry", "cam-01", 7, 5, {"inference": {"frames": 2**60, "budget_misses": -(2**60)}}),
            received_at=now,
        )
        == "stored"
    )
    # a stream message that far past its stream's position is refused (#26: it would have won the stream)...
    assert c.handle(*msg("state", "cam-02", 1, 2**53 - 1), received_at=now) == "seq_jump"
    for session in range(1, 1101):  # ...births announce any position: many, each the largest seq, sums past 2**63
        assert c.handle(*msg("birth", "cam-02", session, 2**53 - 1), received_at=now) == "stored"
    c.flush()
    c.db.close()
    rows = {r["device"]: r for r in fleet_status(url, now=now)}
    assert rows["cam-02"]["missing"] > 2**63 and rows["cam-01"]["frames"] is None
    p = run_cli("fleet", "status", "--db", url)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    p = run_cli("fleet", "status", "--db", url, "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["summary"]["devices"] == 2, p.stderr


def test_fifty_thousand_forged_ids_keep_memory_bounded(caplog: pytest.LogCaptureFixture) -> None:
    class Conn:  # a connected broker connection that takes every rebirth request
        connected = True
        sent = 0

        def publish(self, *_a: Any, **_k: Any) -> int:
            Conn.sent += 1
            return 1

    cap = 5_000
    c = collector(max_tracked=cap)
    c.conn = Conn()  # type: ignore[assignment]
    now = time.time()
    with caplog.at_level(logging.INFO, logger="edge.fleet"):
        for i in range(50_000):
            dev = f"forged-{i:05d}"
            if i % 2:
                c.handle(*birth(dev, 1), received_at=now)  # remembered as "birth seen"
            c.handle(*msg("telemetry", dev, 2, 3), received_at=now)  # a gap, and a rebirth request
            if i % 500 == 499:
                c.flush()
        c.flush()
    assert len(caplog.records) <= 2 * (1 + int(time.time() - now) // 10)  # a gap line, a rebirth line per 10 s
    assert c.stats["gaps_detected"] == 50_000
    sizes = c.tracked()
    assert max(sizes.values()) <= cap and min(sizes.values()) == cap, sizes
    assert c.stats["evicted"] >= 3 * (25_000 - cap) and Conn.sent == 50_000
    assert c.db.execute("SELECT count(*) FROM devices").fetchone()[0] == 50_000  # the store holds them; memory not
    # a real device is still served right: its birth is looked up in the store when the cache lost it
    c.handle(*birth("cam-01", 5), received_at=now)
    for i in range(cap + 10):
        c.handle(*birth(f"more-{i}", 1), received_at=now)
    sent = Conn.sent
    c.handle(*msg("telemetry", "cam-01", 5, 1), received_at=now)
    assert Conn.sent == sent  # no rebirth asked: the store knew its birth
    c.db.close()


def test_status_prints_device_text_as_text(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/fleet.db"
    c = collector(url)
    now = time.time()
    weird = "[/x]"
    c.handle(
        *msg(
            "birth",
            "[bold]cam",
            int(now),
            0,
            {
                "bundle": {"id": weird},
                "agent": {"interval_s": 5.0},
                "runner": {"runtime": "[red]rt[/red]", "device_used": "[/]"},
            },
        ),
        received_at=now,
    )
    c.handle(
        *msg(
            "telemetry",
            "[bold]cam",
            int(now),
            1,
            {"bundle_id": weird + "\x1b]0;owned\x07\u202e", "inference": {"fps": 1e299}},
        ),
        received_at=now,
    )
    c.handle(*msg("death", "cam-2", int(now), 0, {"reason": "[link=file:///etc/passwd]x[/link]"}), received_at=now)
    c.flush()
    c.db.close()
    p = run_cli("fleet", "status", "--db", url)
    assert p.returncode == 0, p.stderr
    assert "[bold]cam" in p.stdout and "[/x]" in p.stdout and "[red]rt[/red]" in p.stdout and "[link=" in p.stdout
    assert "\x1b" not in p.stdout and "\u202e" not in p.stdout and "1e+299" in p.stdout


def test_no_password_in_any_message(postgres_url: str) -> None:
    secret = "s3cret-Pw"
    url = postgres_url.replace("edgekit@", f"edgekit:{secret}@")  # the test server trusts; the password is carried
    with open_db(url) as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
        db.commit()
    try:
        with pytest.raises(EdgeError) as e:
            open_db(url)
        assert "schema" in str(e.value) and secret not in str(e.value) and "***" in str(e.value)
        p = run_cli("fleet", "status", "--db", url)
        assert_user_error(p, "schema")
        assert secret not in p.stderr + p.stdout
    finally:
        with _raw_pg(postgres_url) as conn:
            conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    host, port = "127.0.0.1", postgres_url.rsplit(":", 1)[1].split("/")[0]
    for bad in (
        f"postgresql://edgekit:{secret}@{host}:1/postgres",  # nothing listens: the driver's own words
        f"postgresql://edgekit:{secret}@[{host}:{port}/postgres",  # the driver cannot parse it
        f"postgresql://edgekit@{host}:{port}/postgres?password={secret}&bogus=1",
    ):
        with pytest.raises(EdgeError) as e:
            open_db(bad)
        assert secret not in str(e.value), str(e.value)
        assert_user_error(p := run_cli("fleet", "status", "--db", bad))
        assert secret not in p.stderr + p.stdout


def _raw_pg(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True)


def test_rejections_are_logged_at_a_bounded_rate(caplog: pytest.LogCaptureFixture) -> None:
    c = collector()
    with caplog.at_level(logging.INFO, logger="edge.fleet"):
        for _ in range(5_000):
            c.handle("edgekit/lab/cam-01/telemetry", b"not json")
            c.handle(*msg("telemetry", "cam-01", int(time.time()) + 10**6, 1), received_at=time.time())
    lines = [r for r in caplog.records if r.name == "edge.fleet"]
    assert c.stats["rejected"]["malformed"] == 5_000 and c.stats["rejected"]["future_session"] == 5_000
    assert len(lines) == 2, [r.getMessage() for r in lines]  # one per reason in 10 s
    c.db.close()

    clock = [0.0]
    rl = RateLimitedLog(logging.getLogger("edge.test"), interval_s=10.0, clock=lambda: clock[0])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="edge.test"):
        assert rl.warning("x", "bad %d", 1) and not rl.warning("x", "bad %d", 2) and not rl.warning("x", "bad %d", 3)
        clock[0] = 10.5
        assert rl.warning("x", "bad %d", 4)
    assert [r.getMessage() for r in caplog.records] == ["bad 1", "bad 4 (and 2 more like it in the last 10 s)"]
    for i in range(200):  # reasons are a closed set; past the cap they share one
        rl.info(f"r{i}", "m")
    assert len(rl.total) <= rl.max_reasons + 1


def test_unknown_commands_are_logged_at_a_bounded_rate(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with Mosquitto(tmp_path / "broker") as broker, NetworkLoop(name="edgekit-test") as loop:
        cfg = BrokerConfig.from_url(broker.url)
        dev = DeviceSession(
            loop, cfg, "lab", "cam-01", MemoryOutbox(), options=SessionOptions(backoff=FAST), birth_body=lambda: {}
        )
        sender = Connection(loop, cfg, "flooder", options=ConnectOptions(backoff=FAST))
        with caplog.at_level(logging.INFO, logger="edge.agent"):
            start = time.monotonic()
            loop.run(dev.start)
            loop.run(sender.start)
            wait_for(lambda: dev.connected and sender.connected, what="both connected")
            # the device subscribes after its CONNACK: knock until it hears, then flood
            wait_for(
                lambda: (
                    loop.run(sender.publish, "edgekit/lab/cam-01/cmd/knock", b"{}", 1)
                    and dev.counters["unknown_commands"]
                ),
                what="the device's subscription",
            )
            first = dev.counters["unknown_commands"]
            for i in range(2_000):
                loop.run(sender.publish, f"edgekit/lab/cam-01/cmd/bogus-{i % 7}", b"{}", 1)
            wait_for(lambda: dev.counters["unknown_commands"] >= first + 2_000, what="every command received")
            elapsed = time.monotonic() - start
            dev.close(timeout=2)
            loop.run(sender.close)
            sender.closed.wait(2)
    lines = [r.getMessage() for r in caplog.records if "unknown command" in r.getMessage()]
    assert 1 <= len(lines) <= 1 + int(elapsed // 10), lines  # one line per 10 s, whatever the flood
