"""The collector's lean MQTT client (edge.mqtt.lite, ``fleet collect --client lite``) on a real Mosquitto:
acknowledged only after the commit (a collector killed before it loses nothing), shared subscriptions, MQTT
3.1.1, TLS with a client certificate, user names and passwords, rebirth requests out; and a parser that
refuses whatever it will not take with one logged line, never an exception out of the network loop."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge.fleet.collector import Collector, CollectorConfig
from edge.fleet.db import open_db
from edge.mqtt.client import BrokerConfig
from edge.mqtt.lite import LiteConnection, Malformed, PacketReader, TooLarge, properties, varint
from edge.mqtt.netloop import Backoff, Connection, ConnectOptions, NetworkLoop
from edge.mqtt.payloads import encode, message
from tests.support.cli import REPO, wait_for
from tests.support.mqtt_broker import Mosquitto, free_port, make_ca, password_file, preload_qos1

T0 = time.time() - 100
FAST = Backoff(0.05, 0.2)


def msg(
    kind: str, device: str, seq: int, session: int = int(T0), body: dict[str, Any] | None = None
) -> tuple[str, bytes]:
    if kind == "birth":
        body = {"connection": 1, **(body or {})}
    return f"edgekit/lab/{device}/{kind}", encode(message(kind, "lab", device, session, seq, body or {}, ts=T0 + seq))


def fleet(devices: int, per_device: int, births: bool = True) -> list[tuple[str, bytes]]:
    out = [msg("birth", f"d{i}", 0) for i in range(devices)] if births else []
    return out + [
        msg("telemetry", f"d{k % devices}", k // devices + 1, body={"inference": {"fps": 1.0}})
        for k in range(devices * per_device)
    ]


def count(url: str, sql: str = "SELECT count(*) FROM telemetry") -> int:
    try:
        with open_db(url, must_exist=True) as db:
            return int(db.execute(sql).fetchone()[0])
    except Exception:  # not created yet
        return 0


def lite_collector(broker: BrokerConfig, url: str, client_id: str, **kw: Any) -> Collector:
    return Collector(
        CollectorConfig(broker, url, client_id=client_id, gap_grace_s=0.0, backoff=FAST, client="lite", **kw)
    )


# acknowledged after the commit ---------------------------------------------------------------
def collect(broker: Mosquitto, db: Path, *opts: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "edge",
            "fleet",
            "collect",
            "--client",
            "lite",
            "--broker",
            broker.url,
            "--db",
            f"sqlite:///{db}",
            "--json",
            "--log-level",
            "warning",
            "--client-id",
            "lite-test",
            *opts,
        ],
        cwd=REPO,
        env={**os.environ, "NO_COLOR": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_killed_before_commit_the_broker_redelivers_and_nothing_is_lost_or_doubled(tmp_path: Path) -> None:
    """Batches of 1000 and a 60 s batch interval: of 2,500 messages two batches commit, the last 500 are
    received (the broker sends them once the first 2,000 are acknowledged) but never committed. SIGKILL
    there: a client that acknowledged before the commit would lose those 500."""
    devices, per_device = 25, 100
    n = devices * per_device
    msgs = fleet(devices, per_device)
    db = tmp_path / "fleet.db"
    url = f"sqlite:///{db}"
    # without the pipeline: a batch waits for its interval on the network thread (the pipeline's group commit
    # would write it at once; its kill is the next test)
    opts = ("--batch-max", "1000", "--batch-interval-ms", "60000", "--receive-maximum", "1000", "--no-pipeline")
    with Mosquitto(tmp_path / "broker") as broker:
        p = collect(broker, db, *opts, "--duration", "0.5")  # registers the persistent session, then goes away
        assert p.wait(60) == 0, p.stderr.read().decode()[-2000:] if p.stderr else ""
        preload_qos1(broker.port, msgs)
        p = collect(broker, db, *opts)
        wait_for(lambda: count(url) >= 1975, 60, "two batches committed")  # 25 births + 1975 telemetry
        time.sleep(1.0)  # the last 525 arrive (not committed: the batch is neither full nor due)
        assert count(url) == 1975
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        p = collect(broker, db, "--batch-interval-ms", "50")
        wait_for(lambda: count(url) >= n, 60, f"{n} rows")
        time.sleep(0.5)  # anything re-delivered late would show up now
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err.decode()[-2000:]
    stats = json.loads(out)
    with open_db(url) as s:
        assert tuple(s.execute("SELECT count(*), count(DISTINCT device || '/' || seq) FROM telemetry").fetchone()) == (
            n,
            n,
        )
        assert s.execute("SELECT coalesce(sum(max_seq - received), 0) FROM streams").fetchone()[0] == 0
    assert stats["stored"]["telemetry"] == n - 1975 and stats["duplicates"] == 0 and stats["db_errors"] == 0


def test_pipelined_collector_killed_while_its_writer_waits_loses_nothing(tmp_path: Path) -> None:
    """The pipeline reads on while its writer is held (another process holds SQLite's write lock): messages it
    received are not acknowledged before their commit, so SIGKILL there loses none of them."""
    import sqlite3

    devices, per_device = 20, 100
    n = devices * per_device
    db = tmp_path / "fleet.db"
    url = f"sqlite:///{db}"
    with Mosquitto(tmp_path / "broker") as broker:
        p = collect(broker, db, "--duration", "0.5")  # the schema and the persistent session
        assert p.wait(60) == 0, p.stderr.read().decode()[-2000:] if p.stderr else ""
        preload_qos1(broker.port, fleet(devices, per_device))
        lock = sqlite3.connect(db, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")  # the writer's first INSERT waits (busy timeout 10 s)
        try:
            p = collect(broker, db, "--receive-maximum", "5000")
            time.sleep(2.5)  # connected, the backlog received and decoded, the first batch waiting on the lock
            assert p.poll() is None
            p.send_signal(signal.SIGKILL)
            p.wait(30)
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        assert count(url) == 0
        p = collect(broker, db)
        wait_for(lambda: count(url) >= n, 60, f"{n} rows")
        time.sleep(0.5)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err.decode()[-2000:]
    stats = json.loads(out)
    assert stats["received"] >= n + devices  # every message came again: none had been acknowledged
    assert count(url) == n and count(url, "SELECT count(*) FROM births") == devices
    assert count(url, "SELECT coalesce(sum(max_seq - received), 0) FROM streams") == 0


def test_a_batch_failing_on_the_writer_thread_is_rolled_back_unacknowledged_and_redelivered(tmp_path: Path) -> None:
    """The pipeline (a writer thread commits while the network thread reads on): a batch whose write fails is
    rolled back and never acknowledged, the connection is dropped, and the broker's re-delivery stores every
    message once the store takes it again, while later batches keep their order."""
    url = f"sqlite:///{tmp_path}/f.db"
    with open_db(url) as db:  # a trap: the store refuses seq 40 while armed
        db.execute("CREATE TABLE trap (armed INTEGER)")
        db.execute("INSERT INTO trap VALUES (1)")
        db.execute(
            "CREATE TRIGGER trap_seq BEFORE INSERT ON telemetry WHEN NEW.seq = 40 AND "
            "(SELECT armed FROM trap) = 1 BEGIN SELECT RAISE(ABORT, 'trap'); END"
        )
        db.commit()
    msgs = fleet(5, 60)
    with Mosquitto(tmp_path / "broker") as broker:
        c = lite_collector(
            BrokerConfig.from_url(broker.url), url, "piped", batch_max=50, batch_interval_ms=20, receive_maximum=100
        ).start()
        try:
            assert c._writer is not None and c._writer.is_alive()
            wait_for(lambda: c.connected, 20, "the collector")
            time.sleep(0.3)
            preload_qos1(broker.port, msgs)
            wait_for(lambda: c.snapshot()["db_errors"] >= 2, 30, "the trapped batch failing (and again, re-delivered)")
            assert count(url) < 300
            with open_db(url) as db:
                db.execute("UPDATE trap SET armed = 0")
                db.commit()
            wait_for(lambda: count(url) >= 300, 60, "every message stored after the trap is gone")
            time.sleep(0.3)
        finally:
            c.stop()
    assert c._writer is None
    assert count(url) == 300 and count(url, "SELECT count(*) FROM births") == 5
    assert count(url, "SELECT sum(received) FROM streams") == 300  # the failed batches' counts rolled back too
    assert count(url, "SELECT count(*) FROM streams WHERE received <> max_seq") == 0  # no gaps


# shared subscriptions, MQTT 3.1.1 ---------------------------------------------------------------
def test_two_lite_collectors_in_one_group_split_the_messages(tmp_path: Path) -> None:
    n_dev, per = 10, 150
    msgs = fleet(n_dev, per, births=False)
    urls = [f"sqlite:///{tmp_path}/c{i}.db" for i in (1, 2)]
    with Mosquitto(tmp_path / "broker") as broker:
        cfg = BrokerConfig.from_url(broker.url)
        cs = [lite_collector(cfg, u, f"lite-{i}", group="g", batch_interval_ms=20) for i, u in enumerate(urls)]
        for c in cs:
            c.start()
        try:
            wait_for(lambda: all(c.connected for c in cs), 20, "both connected")
            time.sleep(0.3)  # SUBACK
            preload_qos1(broker.port, msgs)
            wait_for(lambda: sum(count(u) for u in urls) >= len(msgs), 60, "every message stored")
            time.sleep(0.3)
        finally:
            for c in cs:
                c.stop()
    keys = [
        set(r[0] for r in open_db(u).execute("SELECT device || '/' || seq FROM telemetry").fetchall()) for u in urls
    ]
    assert len(keys[0]) + len(keys[1]) == len(msgs) and not keys[0] & keys[1]
    assert min(len(k) for k in keys) > len(msgs) // 10, "the group split the messages"


def test_lite_collector_on_mqtt_3_1_1_and_a_rebirth_request_out(tmp_path: Path) -> None:
    """MQTT 3.1.1 (plain subscription); telemetry of a session with no birth: a QoS 1 cmd/rebirth goes out."""
    got: list[tuple[str, bytes]] = []
    with Mosquitto(tmp_path / "broker") as broker, NetworkLoop(name="edgekit-test") as loop:
        spy = Connection(
            loop,
            BrokerConfig.from_url(broker.url),
            "spy",
            options=ConnectOptions(backoff=FAST),
            subscriptions=[("edgekit/+/+/cmd/#", 1)],
            on_message=lambda _c, m: got.append((m.topic, m.payload)),
        )
        loop.run(spy.start)
        wait_for(lambda: spy.connected, 20, "the spy")
        c = lite_collector(
            BrokerConfig.from_url(broker.url, protocol="3.1.1"),
            f"sqlite:///{tmp_path}/f.db",
            "lite-311",
            batch_interval_ms=10,
        ).start()
        try:
            wait_for(lambda: c.connected, 20, "the collector")
            time.sleep(0.3)
            preload_qos1(broker.port, fleet(3, 20, births=False))
            wait_for(lambda: count(f"sqlite:///{tmp_path}/f.db") >= 60, 30, "60 rows")
            wait_for(lambda: len(got) >= 3, 20, "three rebirth requests")
        finally:
            c.stop()
            loop.run(spy.close)
            spy.closed.wait(2)
    assert sorted(t for t, _ in got) == [f"edgekit/lab/d{i}/cmd/rebirth" for i in range(3)]
    assert all(json.loads(p)["command"] == "rebirth" for _, p in got)
    assert c.stats["stored"]["telemetry"] == 60 and c.stats["db_errors"] == 0


# TLS, user names and passwords ------------------------------------------------------------------
def test_tls_with_a_client_certificate_and_a_wrong_ca_refused(tmp_path: Path) -> None:
    tls = make_ca(tmp_path / "ca")
    other = make_ca(tmp_path / "other", name="another-ca")
    plain = free_port()  # the pre-loader speaks plain MQTT on a second listener
    url = f"sqlite:///{tmp_path}/f.db"
    with Mosquitto(
        tmp_path / "broker", tls=tls, require_certificate=True, extra=f"listener {plain} 127.0.0.1\n"
    ) as broker:
        good = BrokerConfig.from_url(broker.url, ca_file=tls.ca, cert_file=tls.client_cert, key_file=tls.client_key)
        c = lite_collector(good, url, "lite-tls", batch_interval_ms=10).start()
        bad = lite_collector(
            BrokerConfig.from_url(broker.url, ca_file=other.ca, cert_file=other.client_cert, key_file=other.client_key),
            "sqlite:///:memory:",
            "lite-bad",
        )
        bad.start()
        try:
            wait_for(lambda: c.connected, 20, "the TLS collector")
            time.sleep(0.3)
            preload_qos1(plain, fleet(5, 200))
            wait_for(lambda: count(url) >= 1000, 30, "1000 rows over TLS")
            assert bad.conn is not None
            wait_for(lambda: bad.conn.last_error, 20, "the wrong CA's refusal")  # type: ignore[union-attr]
            assert "CERTIFICATE_VERIFY_FAILED" in bad.conn.last_error and not bad.connected  # type: ignore[union-attr]
        finally:
            c.stop()
            bad.stop()
    assert c.stats["stored"]["telemetry"] == 1000 and c.stats["stored"]["birth"] == 5
    assert c.stats["db_errors"] == 0


def test_user_name_and_password(tmp_path: Path) -> None:
    pw = password_file(tmp_path / "passwd", {"collector": "s3cret"})
    with Mosquitto(tmp_path / "broker", passwords=pw) as broker, NetworkLoop(name="edgekit-test") as loop:
        conns = {}
        for name, password in (("right", "s3cret"), ("wrong", "nope")):
            cfg = BrokerConfig.from_url(broker.url, username="collector", password=password)
            conns[name] = LiteConnection(
                loop, cfg, f"lite-{name}", subscriptions=[("edgekit/#", 1)], on_publish=lambda *a: None, backoff=FAST
            )
            loop.run(conns[name].start)
        wait_for(lambda: conns["right"].connected, 20, "the right password")
        wait_for(lambda: conns["wrong"].last_error, 20, "the wrong password's refusal")
        assert "refused the connection (reason 0x8" in str(conns["wrong"].last_error)  # 0x86/0x87 by broker version
        assert not conns["wrong"].connected
        for c in conns.values():
            loop.run(c.close)
        assert loop.errors == 0


# untrusted bytes ------------------------------------------------------------------------------
def publish_packet(
    topic: bytes, payload: bytes, mid: int = 0, qos: int = 1, mqtt5: bool = True, props: bytes = b""
) -> bytes:
    var = struct.pack("!H", len(topic)) + topic + (struct.pack("!H", mid) if qos else b"")
    if mqtt5:
        var += varint(len(props)) + props
    return bytes((0x30 | qos << 1,)) + varint(len(var) + len(payload)) + var + payload


def read_all(chunks: list[bytes], mqtt5: bool = True, max_packet: int = 1 << 20) -> tuple[list[Any], list[Any]]:
    pubs: list[Any] = []
    ctl: list[Any] = []
    r = PacketReader(mqtt5, lambda *a: pubs.append(a), lambda k, b: ctl.append((k, bytes(b))), max_packet)
    for c in chunks:
        r.feed(c)
    return pubs, ctl


@given(st.binary(max_size=300), st.booleans())
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_bytes_are_parsed_or_refused_cleanly(data: bytes, mqtt5: bool) -> None:
    try:
        pubs, _ = read_all([data], mqtt5, max_packet=200)
    except Malformed as m:
        assert str(m) and "\n" not in str(m)
        return
    for topic, payload, mid, qos in pubs:
        assert isinstance(topic, str) and isinstance(payload, (bytes, TooLarge)) and qos in (0, 1)
        assert (mid > 0) == (qos == 1)


@pytest.mark.parametrize("mqtt5", [False, True])
def test_an_oversized_publish_is_skipped_not_refused(mqtt5: bool) -> None:
    """An MQTT 3.1.1 broker sends a PUBLISH over the client's limit (it has no Maximum Packet Size to honour):
    refusing it reconnected and got it re-delivered for ever. Its topic and id are handed on with ``TooLarge``
    (only the length), its payload skipped unread however it is split, and the next packet reads as ever."""
    big = publish_packet(b"edgekit/f/d1/telemetry", b"x" * 5000, 7, 1, mqtt5)
    after = publish_packet(b"edgekit/f/d1/telemetry", b"{}", 8, 1, mqtt5)
    stream = big + after
    for cuts in ([], [1], [3, 10], [30, 2000, 4000], list(range(1, len(stream), 997))):
        chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]
        pubs: list[Any] = []
        r = PacketReader(mqtt5, lambda *a, pubs=pubs: pubs.append(a), lambda k, b: None, 1024)
        for c in chunks:
            r.feed(c)
        (topic, payload, mid, qos), second = pubs
        assert (topic, mid, qos) == ("edgekit/f/d1/telemetry", 7, 1) and isinstance(payload, TooLarge)
        assert len(payload) == 5000 + (1 if mqtt5 else 0)  # MQTT 5: its (empty) properties' length byte too
        assert second == ("edgekit/f/d1/telemetry", b"{}", 8, 1)
        assert r.buffered == 0


@given(
    st.lists(
        st.tuples(
            st.text(min_size=1, max_size=30),
            st.binary(max_size=60),
            st.integers(1, 65535),
            st.integers(0, 1),
            st.binary(max_size=8),
        ),
        min_size=1,
        max_size=12,
    ),
    st.lists(st.integers(0, 2000), max_size=6),
    st.booleans(),
)
@settings(max_examples=150, deadline=None)
def test_packets_split_anywhere_read_the_same(packets: list[Any], cuts: list[int], mqtt5: bool) -> None:
    """Valid PUBLISH packets (with properties skipped by length) split at arbitrary points: the same messages."""
    props = lambda b: b"\x01\x01" + (b"\x26" + struct.pack("!H", len(b)) + b + b"\x00\x00")  # noqa: E731
    stream = b"".join(
        publish_packet(t.encode(), p, mid if q else 0, q, mqtt5, props(pr) if mqtt5 else b"")
        for t, p, mid, q, pr in packets
    )
    pos = sorted({min(c, len(stream)) for c in cuts})
    chunks = [stream[a:b] for a, b in zip([0, *pos], [*pos, len(stream)])]
    pubs, _ = read_all(chunks, mqtt5)
    assert pubs == [(t, p, mid if q else 0, q) for t, p, mid, q, _ in packets]


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"\x30\xff\xff\xff\xff\x01", "longer than 4 bytes"),
        (b"\x90\xff\xff\x7f", "over the limit"),  # an oversized PUBLISH is skipped (below); anything else refused
        (b"\x32\x03\x00\x05a", "topic runs past"),
        (b"\x32\x04\x00\x01a\x00", "packet id"),
        (b"\x32\x05\x00\x01a\x00\x00", "packet id 0"),
        (b"\x34\x05\x00\x01a\x00\x01", "QoS 2"),
        (b"\x32\x06\x00\x01a\x00\x01\x09", "properties run past"),
        (b"\x30\x03\x00\x00\x00", "empty topic"),
        (b"\x10\x00", "not one a subscriber receives"),
        (b"\xd1\x00", "reserved flags"),
    ],
)
def test_malformed_packets_are_named(data: bytes, reason: str) -> None:
    r = PacketReader(True, lambda *a: None, lambda k, b: None, 4096)
    with pytest.raises(Malformed, match=reason):
        r.feed(data)


def test_properties_of_control_packets_are_checked() -> None:
    assert properties(b"\x08\x13\x00\x3c\x21\x00\x0a\x01\x01", 0, 9) == ({0x13: 60, 0x21: 10, 0x01: 1}, 9)
    for data, reason in (
        (b"\x02\x05\x00", "unknown property 0x05"),
        (b"\x05\x13\x00", "run past the packet"),
        (b"\x02\x13\x00", "runs past its properties"),
        (b"\x03\x1f\x00\x05", "runs past"),
        (b"\xff\xff\xff\xff\x7f", "longer than 4 bytes"),
    ):
        with pytest.raises(Malformed, match=reason):
            properties(data, 0, len(data))


class HostileBroker:
    """A TCP server that answers CONNECT with a CONNACK, then sends ``garbage``; counts the connections."""

    def __init__(self, garbage: bytes) -> None:
        self.garbage, self.connections, self.stop = garbage, 0, False
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.srv.settimeout(0.1)
        self.port = self.srv.getsockname()[1]
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while not self.stop:
            try:
                s, _ = self.srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            with s:
                try:
                    s.recv(4096)
                    s.sendall(b"\x20\x03\x00\x00\x00" + self.garbage)
                    s.settimeout(2)
                    s.recv(4096)  # until the client closes
                except OSError:
                    pass

    def close(self) -> None:
        self.stop = True
        self.thread.join(5)
        self.srv.close()


@pytest.mark.parametrize(
    "garbage", [b"\xf0\x00", b"\x30\xff\xff\xff\xff\xff", b"\x32\x03\x00\x09ab", b"\x20\x03\x00\x00\x00"]
)
def test_a_hostile_broker_gets_a_closed_connection_and_a_log_line(
    garbage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    hostile = HostileBroker(garbage)
    got: list[Any] = []
    caplog.set_level(logging.INFO, "edge.mqtt")
    try:
        with NetworkLoop(name="edgekit-test") as loop:
            conn = LiteConnection(
                loop,
                BrokerConfig("127.0.0.1", hostile.port),
                "victim",
                subscriptions=[("edgekit/#", 1)],
                on_publish=lambda *a: got.append(a),
                backoff=FAST,
            )
            loop.run(conn.start)
            wait_for(lambda: hostile.connections >= 2, 20, "a reconnect after the refusal")
            loop.run(conn.close)
            assert loop.errors == 0  # nothing escaped into the loop
    finally:
        hostile.close()
    lines = [r.getMessage() for r in caplog.records if "malformed packet" in r.getMessage()]
    assert lines and all("\n" not in x for x in lines)
    assert not got


def test_messages_in_the_same_read_as_the_connack_are_delivered(caplog: pytest.LogCaptureFixture) -> None:
    """A persistent session's queued messages may follow the CONNACK in one TCP segment (one read)."""
    hostile = HostileBroker(publish_packet(b"edgekit/lab/a/telemetry", b"{}", 7) + publish_packet(b"t", b"x", 0, 0))
    got: list[Any] = []
    caplog.set_level(logging.INFO, "edge.mqtt")
    try:
        with NetworkLoop(name="edgekit-test") as loop:
            conn = LiteConnection(
                loop,
                BrokerConfig("127.0.0.1", hostile.port),
                "early",
                subscriptions=[("edgekit/#", 1)],
                on_publish=lambda *a: got.append(a[2:]),
                backoff=FAST,
            )
            loop.run(conn.start)
            wait_for(lambda: len(got) >= 2, 20, "both messages")
            loop.run(conn.close)
            assert loop.errors == 0
    finally:
        hostile.close()
    assert got[:2] == [("edgekit/lab/a/telemetry", b"{}", 7, 1), ("t", b"x", 0, 0)]
    assert not [r for r in caplog.records if "malformed" in r.getMessage()]


def test_unknown_client_is_refused_in_one_line() -> None:
    from edge.errors import EdgeError
    from tests.support.cli import assert_user_error, run_cli

    with pytest.raises(EdgeError, match="unknown MQTT client 'mosquitto'"):
        CollectorConfig(BrokerConfig("127.0.0.1", 1), client="mosquitto")
    assert_user_error(
        run_cli(
            "fleet", "collect", "--broker", "mqtt://127.0.0.1:1", "--db", "sqlite:///:memory:", "--client", "other"
        ),
        "unknown MQTT client",
    )


@given(st.sampled_from([0x20, 0x40, 0x90, 0xD0, 0xE0]), st.binary(max_size=60), st.binary(max_size=40), st.booleans())
@settings(max_examples=400, deadline=None)
def test_random_control_packets_after_the_connack_are_handled_or_refused(
    first: int, body: bytes, tail: bytes, mqtt5: bool
) -> None:
    """The client's own handling of CONNACK/SUBACK/PUBACK/PINGRESP/DISCONNECT bodies (well framed, random
    inside, random bytes behind): refused with ``Malformed`` or taken, no other exception."""
    data = bytes((first,)) + varint(len(body)) + body + tail
    from edge.mqtt.lite import LiteClient

    loop = NetworkLoop(name="edgekit-test-unstarted")
    try:
        conn = LiteConnection(
            loop,
            BrokerConfig("127.0.0.1", 1, protocol="5" if mqtt5 else "3.1.1"),
            "fuzz",
            subscriptions=[],
            on_publish=lambda *a: None,
        )
        client = LiteClient(conn)
        try:
            client.reader.feed(b"\x20\x03\x00\x00\x00" if mqtt5 else b"\x20\x02\x00\x00")
            assert client.connacked
            client.reader.feed(data)
        except Malformed as m:
            assert str(m) and "\n" not in str(m)
    finally:
        loop.stop()
