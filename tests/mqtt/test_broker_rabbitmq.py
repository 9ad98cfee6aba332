"""The fleet on RabbitMQ (issue #16, "beyond one broker"): a broker that clusters and that users run freely.

Debian 12's RabbitMQ 3.10 speaks MQTT 3.1.1 only (native MQTT 5 came in 3.13, not tested here), so the
agent and the collector run with ``--protocol 3.1.1`` and say, each in one line, what that degrades. Real
processes: three RabbitMQ nodes in one cluster (``tests/support/rabbitmq_broker.py``), the agent's own entry point
``python -m edge.agent`` and ``edgekit fleet collect``."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from edge.mqtt.client import DEGRADED, MQTT5_UNANSWERED, BrokerConfig
from edge.mqtt.lite import LiteConnection, mqtt_packet, mqtt_string
from edge.mqtt.netloop import Backoff, Connection, ConnectOptions, NetworkLoop
from tests.support.cli import REPO, wait_for
from tests.support.mqtt_broker import HOST
from tests.support.rabbitmq_broker import RabbitCluster, rabbitmq_missing, rabbitmq_version

pytestmark = pytest.mark.skipif(rabbitmq_missing() is not None, reason=str(rabbitmq_missing()))
FLEET = "lab"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitCluster]:
    """Three RabbitMQ nodes, ``b`` and ``c`` joined to ``a`` the way the RabbitMQ guide does it (stop_app,
    join_cluster, start_app). Three, not two: RabbitMQ 3.8-3.11's MQTT plugin keeps its client ids in a Raft
    group that needs a majority of the nodes, and its guide says it does not support two-node clusters."""
    with RabbitCluster(tmp_path_factory.mktemp("rabbitmq"), ("a", "b", "c")) as c:
        c["b"].join(c["a"])
        c["c"].join(c["a"])
        yield c
    # stopped cleanly: nothing of the cluster holds a port any more (its own epmd included)
    held = [p for node in c.nodes.values() for p in (node.port, node.amqp_port, node.dist_port)] + [c.epmd_port]
    assert not [p for p in held if listening(p)], "a RabbitMQ process outlived the cluster"


def listening(port: int) -> bool:
    try:
        socket.create_connection((HOST, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def count(db: Path, sql: str, *args: Any) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(db) as c:
        try:
            return int(c.execute(sql, args).fetchone()[0])
        except sqlite3.OperationalError:  # the collector has not made its tables yet
            return 0


def seqs(db: Path, device: str, session: int) -> list[int]:
    """The session's stream as stored: telemetry and state messages share one sequence."""
    with sqlite3.connect(db) as c:
        return [
            s
            for (s,) in c.execute(
                "SELECT seq FROM telemetry WHERE device = ? AND session = ? UNION ALL "
                "SELECT seq FROM states WHERE device = ? AND session = ? ORDER BY 1",
                (device, session, device, session),
            )
        ]


def collector(url: str, db: Path, log: Path, client_id: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "edge",
            "fleet",
            "collect",
            "--broker",
            url,
            "--db",
            f"sqlite:///{db}",
            "--protocol",
            "3.1.1",
            "--client-id",
            client_id,
            "--json",
            "--reconnect-max",
            "0.5",
            "--batch-interval-ms",
            "20",
            "--log-level",
            "info",
        ],
        cwd=REPO,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"},
        stdout=subprocess.PIPE,
        stderr=open(log, "ab"),
    )


def agent(url: str, store: Path, log: Path, device: str) -> subprocess.Popen[bytes]:
    store.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "edge.agent",
            "--device-id",
            device,
            "--fleet",
            FLEET,
            "--broker",
            url,
            "--protocol",
            "3.1.1",
            "--store",
            str(store),
            "--source",
            "none",
            "--interval",
            "0.2",
            "--reconnect-max",
            "0.5",
            "--flush-timeout",
            "30",
            "--json",
            "--log-level",
            "info",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=open(log, "ab"),
    )


def stop(p: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
    """SIGTERM, then its JSON summary (and exit 0)."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=90)
    assert p.returncode == 0, log.read_text()[-3000:]
    return json.loads(out)


def accepted(node: Any, client_id: str) -> bool:
    """The node's log says it accepted an MQTT connection of ``client_id``. (Not ``rabbitmqctl
    list_mqtt_connections``: with a node of the two down it listed none, RabbitMQ 3.10's client-id tracking
    having lost its majority.)"""
    return f"client id: {client_id})" in node.log()


def kill_left(procs: list[subprocess.Popen[bytes]]) -> None:
    """Whatever a failed test left running."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def test_agent_and_collector_through_rabbitmq_mqtt_3_1_1(cluster: RabbitCluster, tmp_path: Path) -> None:
    """Birth, telemetry and death from the agent through one RabbitMQ node, each stored once; both sides
    connected with MQTT 3.1.1 and said what that degrades. Node b: the cluster test stops node a."""
    node = cluster["b"]
    db, clog, alog = tmp_path / "fleet.db", tmp_path / "collector.log", tmp_path / "agent.log"
    col = collector(node.url, db, clog, "edgekit-test-col-1")
    procs = [col]
    try:
        # the collector first: its persistent session must exist before devices publish (no MQTT 5 PUBACK
        # reason "no matching subscribers" on 3.1.1 to hold messages for it)
        wait_for(lambda: f"connected to {node.url}" in clog.read_text(), 60, "the collector connected")
        ag = agent(node.url, tmp_path / "store", alog, "cam-01")
        procs.append(ag)
        wait_for(lambda: count(db, "SELECT count(*) FROM telemetry") >= 10, 60, "10 telemetry messages stored")
        summary = stop(ag, alog)
        session, last = summary["session"], summary["last_seq"]
        wait_for(
            lambda: count(db, "SELECT count(*) FROM deaths WHERE session = ? AND reason = 'shutdown'", session),
            30,
            "the agent's death",
        )
        stats = stop(col, clog)
    finally:
        kill_left(procs)
    assert summary["outbox_flushed"] is True and summary["births"] == 1
    assert seqs(db, "cam-01", session) == list(range(1, last + 1)), "lost or stored twice"
    assert count(db, "SELECT count(*) FROM births WHERE device = 'cam-01'") == 1
    assert stats["duplicates"] == 0 and stats["db_errors"] == 0
    assert accepted(node, "edgekit-test-col-1") and accepted(node, f"edgekit-{FLEET}-cam-01"), node.log()[-3000:]
    for log, side in ((clog, "collector"), (alog, "agent")):
        lines = [ln for ln in log.read_text().splitlines() if DEGRADED[side] in ln]
        assert len(lines) == 1 and "WARNING" in lines[0], log.read_text()[-3000:]


def outbox_rows(store: Path) -> int:
    f = store / "agent" / "outbox.sqlite"
    if not f.exists():
        return 0
    with sqlite3.connect(f) as c:
        return int(c.execute("SELECT count(*) FROM outbox").fetchone()[0])


def telemetry(db: Path, device: str) -> int:
    return count(db, "SELECT count(*) FROM telemetry WHERE device = ?", device)


def test_cluster_node_stopped_one_agent_fails_over_the_other_waits(cluster: RabbitCluster, tmp_path: Path) -> None:
    """The collector on node c; agent cam-02 given node a only, agent cam-03 given nodes a and b
    (``--broker mqtt://a,mqtt://b``); both connect to a and the cluster routes their streams to c. Node a stops:
    cam-03 moves to b by itself (no restart) and its stream goes on; cam-02 (one address, no fail-over) keeps its
    stream in its outbox and retries a. Node a back (it rejoins the cluster by itself): cam-02 reconnects and
    replays its outbox. Both streams stored exactly once."""
    a, b, c = cluster["a"], cluster["b"], cluster["c"]
    if not a.running:  # a test run in another order stopped it
        a.start()
    db, clog = tmp_path / "fleet.db", tmp_path / "collector.log"
    one, two = tmp_path / "cam-02", tmp_path / "cam-03"
    alog = {d: d / "agent.log" for d in (one, two)}
    col = collector(c.url, db, clog, "edgekit-test-col-2")
    procs = [col]
    try:
        wait_for(lambda: f"connected to {c.url}" in clog.read_text(), 60, "the collector connected to node c")
        ag1 = agent(a.url, one / "s", alog[one], "cam-02")
        ag2 = agent(f"{a.url},{b.url}", two / "s", alog[two], "cam-03")
        procs += [ag1, ag2]
        wait_for(
            lambda: telemetry(db, "cam-02") >= 10 and telemetry(db, "cam-03") >= 10,
            60,
            "telemetry of both agents from node a stored via c",
        )
        assert f"connected to {a.url}" in alog[two].read_text(), alog[two].read_text()[-3000:]  # the first node
        a.stop()  # a clean shutdown of node a; b and c stay up
        held2 = telemetry(db, "cam-03")
        wait_for(lambda: f"connected to {b.url}" in alog[two].read_text(), 60, "cam-03 moved to node b")
        wait_for(lambda: telemetry(db, "cam-03") >= held2 + 15, 60, "cam-03's telemetry through node b")
        wait_for(lambda: outbox_rows(one / "s") >= 10, 60, "10 messages kept in cam-02's outbox")
        assert not a.running and ag1.poll() is None and ag2.poll() is None
        assert f"cannot connect to {a.url}" in alog[one].read_text(), alog[one].read_text()[-3000:]
        assert f"connection to {a.url} lost" in alog[two].read_text(), alog[two].read_text()[-3000:]
        held1 = telemetry(db, "cam-02")
        a.start()
        wait_for(lambda: alog[one].read_text().count(f"connected to {a.url}") >= 2, 60, "cam-02 reconnected to a")
        wait_for(
            lambda: outbox_rows(one / "s") == 0 and telemetry(db, "cam-02") >= held1 + 15,
            60,
            "cam-02's outbox replayed and live telemetry after it",
        )
        summaries = [stop(ag1, alog[one]), stop(ag2, alog[two])]
        for sm in summaries:
            wait_for(
                lambda sm=sm: count(
                    db, "SELECT count(*) FROM deaths WHERE session = ? AND reason = 'shutdown'", sm["session"]
                ),
                30,
                f"{sm['device']}'s death",
            )
        stats = stop(col, clog)
    finally:
        kill_left(procs)
    one_sum, two_sum = summaries
    assert one_sum["outbox_flushed"] is True and one_sum["replayed"] >= 10
    assert two_sum["outbox_flushed"] is True
    for sm in summaries:
        assert seqs(db, sm["device"], sm["session"]) == list(range(1, sm["last_seq"] + 1)), (
            f"{sm['device']}: lost or stored twice"
        )
    assert stats["db_errors"] == 0  # copies (a PUBACK lost as node a went down: replayed) the database dropped
    assert accepted(a, f"edgekit-{FLEET}-cam-02") and accepted(c, "edgekit-test-col-2")
    assert accepted(a, f"edgekit-{FLEET}-cam-03") and accepted(b, f"edgekit-{FLEET}-cam-03")


def connack(port: int, level: int) -> bytes:
    """The broker's answer to a bare CONNECT of protocol level 4 (MQTT 3.1.1) or 5 (b'': it closed the socket)."""
    props = b"\x00" if level == 5 else b""
    body = (
        mqtt_string("MQTT")
        + bytes([level, 0x02])
        + struct.pack("!H", 30)
        + props
        + mqtt_string(f"edgekit-probe-{level}")
    )
    with socket.create_connection((HOST, port), timeout=10) as s:
        s.sendall(mqtt_packet(0x10, body))
        return s.recv(16)


def test_rabbitmq_before_3_13_closes_an_mqtt_5_connect_without_an_answer(
    cluster: RabbitCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Why ``--protocol 3.1.1`` is needed (docs/fleet-scale.md says so): RabbitMQ before 3.13 answers an MQTT 5 CONNECT by
    closing the connection, no CONNACK; edgekit's default (MQTT 5) then retries for ever, and says once (both
    clients: the agent's paho and the collector's lean one) what to do."""
    version = rabbitmq_version()
    node = cluster["b"]
    assert connack(node.port, 4) == b"\x20\x02\x00\x00", version  # accepted
    if tuple(int(x) for x in version.split(".")[:2]) >= (3, 13):  # native MQTT 5 (untested: Debian 12 has 3.10)
        assert connack(node.port, 5)[:1] == b"\x20", version
        return
    assert connack(node.port, 5) == b"", version
    caplog.set_level(logging.INFO, logger="edge.mqtt")
    broker = BrokerConfig.from_url(node.url)  # MQTT 5, the default
    with NetworkLoop() as loop:
        conns = [
            Connection(loop, broker, "edgekit-probe-paho", options=ConnectOptions(backoff=Backoff(0.05, 0.2))),
            LiteConnection(
                loop,
                broker,
                "edgekit-probe-lite",
                subscriptions=[("x/#", 1)],
                on_publish=lambda *_: None,
                backoff=Backoff(0.05, 0.2),
            ),
        ]
        for conn in conns:
            conn.start()
        try:
            wait_for(lambda: all(conn.attempts >= 3 for conn in conns), 30, "three unanswered attempts each")
        finally:
            for conn in conns:
                loop.run(conn.close)
    for who in ("edgekit-probe-paho", "edgekit-probe-lite"):
        said = [r for r in caplog.records if r.getMessage().startswith(f"{who}: {node.url}: {MQTT5_UNANSWERED}")]
        assert len(said) == 1 and said[0].levelno == logging.WARNING, caplog.text[-3000:]
