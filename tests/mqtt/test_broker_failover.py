"""Several nodes of one broker cluster in ``--broker`` (issue #16, "beyond one broker"): parsing into the typed
``BrokerConfig``, and the agent's client (paho, ``Connection``) and the collector's lean client (``LiteConnection``)
moving to the next node when one cannot be reached or goes away, on real Mosquitto processes. The three-node
RabbitMQ cluster test is in ``tests/mqtt/test_broker_rabbitmq.py``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from edge.errors import EdgeError
from edge.mqtt.client import MQTT5_UNANSWERED, BrokerConfig
from edge.mqtt.lite import LiteConnection
from edge.mqtt.netloop import Backoff, Connection, ConnectOptions, NetworkLoop
from tests.support.cli import wait_for
from tests.support.mqtt_broker import HOST, Mosquitto, free_port, make_ca

FAST = Backoff(0.05, 0.3)
pytestmark = pytest.mark.usefixtures("no_leaked_threads")  # tests/conftest.py


def test_one_address_is_parsed_as_before() -> None:
    b = BrokerConfig.from_url("mqtt://cam@broker.lan")
    assert (b.host, b.port, b.addresses, b.endpoints) == ("broker.lan", 1883, (), (("broker.lan", 1883),))
    assert b.url == "mqtt://cam@broker.lan:1883" and b.at(0) is b and b.at(5) is b


def test_several_nodes_of_one_cluster() -> None:
    b = BrokerConfig.from_url(" mqtts://a.lan , mqtts://b.lan:8884,mqtts://10.0.0.3 ", username="dev")
    assert b.endpoints == (("a.lan", 8883), ("b.lan", 8884), ("10.0.0.3", 8883)) and (b.host, b.port) == ("a.lan", 8883)
    assert b.url == "mqtts://dev@a.lan:8883,mqtts://dev@b.lan:8884,mqtts://dev@10.0.0.3:8883"
    second = b.at(4)  # round robin: 4 % 3
    assert (second.host, second.port, second.addresses, second.tls, second.username) == ("b.lan", 8884, (), True, "dev")
    assert second.url == "mqtts://dev@b.lan:8884"
    assert BrokerConfig.from_url("mqtt://u@a,mqtt://u@b").username == "u"
    assert BrokerConfig.from_url("mqtt://[::1]:1884,mqtt://b").url == "mqtt://[::1]:1884,mqtt://b:1883"


@pytest.mark.parametrize(
    "url, says",
    [
        ("mqtt://a:1883,mqtts://b:8883", "uses mqtts:// and 'mqtt://a:1883' mqtt://"),
        ("mqtt://u@a,mqtt://b", "names another user"),
        ("mqtt://a,mqtt://a:1883", "listed twice"),
        ("mqtt://a,", "bad broker address ''"),
        ("mqtt://a,b:1883", "bad broker address 'b:1883'"),
        ("mqtt://a,mqtt://b:99999", "bad port"),
        ("mqtt://a,mqtt://b:0", "bad port"),
        ("mqtt://a,mqtt://u:pw@b", "password in the broker URL"),
        ("mqtt://a,mqtt://b/x", "no path or query"),
        (",".join(f"mqtt://n{i}" for i in range(17)), "at most 16 nodes"),
    ],
)
def test_bad_cluster_addresses_are_one_clear_error(url: str, says: str) -> None:
    with pytest.raises(EdgeError) as e:
        BrokerConfig.from_url(url)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_check_reachable_wants_one_node(tmp_path: Path) -> None:
    with Mosquitto(tmp_path / "broker") as live:
        dead = f"mqtt://{HOST}:{free_port()}"
        BrokerConfig.from_url(f"{dead},{live.url}").check_reachable()
        dead2 = f"mqtt://{HOST}:{free_port()}"
    with pytest.raises(EdgeError) as e:
        BrokerConfig.from_url(f"{dead},{dead2}").check_reachable()
    assert f"cannot reach any node of the MQTT broker: {dead}: " in str(e.value) and f"; {dead2}: " in str(e.value)


def paho_conn(loop: NetworkLoop, url: str, **kw: Any) -> Connection:
    return Connection(
        loop, BrokerConfig.from_url(url, **kw), "edgekit-failover-probe", options=ConnectOptions(backoff=FAST)
    )


def lite_conn(loop: NetworkLoop, url: str, got: list[bytes], **kw: Any) -> LiteConnection:
    def on_publish(conn: LiteConnection, client: Any, topic: str, payload: bytes, mid: int, qos: int) -> None:
        got.append(bytes(payload))
        conn.ack(client, mid, qos)
        conn.ack_done()

    return LiteConnection(
        loop,
        BrokerConfig.from_url(url, **kw),
        "edgekit-failover-lite",
        subscriptions=[("failover/#", 1)],
        on_publish=on_publish,
        backoff=FAST,
    )


def publish_once(loop: NetworkLoop, url: str, payload: bytes) -> None:
    """One QoS 1 message through a short-lived connection, waited for its PUBACK."""
    acked: list[int] = []
    pub = Connection(
        loop,
        BrokerConfig.from_url(url),
        "edgekit-failover-pub",
        options=ConnectOptions(backoff=FAST),
        on_published=lambda _c, mid, _rc: acked.append(mid),
    )
    loop.run(pub.start)
    wait_for(lambda: pub.connected, what="the publisher connected")
    mid = loop.run(pub.publish, "failover/x", payload, 1)
    wait_for(lambda: mid in acked, what="the publisher's PUBACK")
    loop.run(pub.close)
    assert pub.closed.wait(5)


@pytest.mark.parametrize("lean", [False, True], ids=["paho", "lite"])
def test_dead_first_node_then_lost_connection_move_to_the_next(
    lean: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """First address a dead port: the client connects to the second. That node stops: the client goes on to the
    next (round robin: the third, a second Mosquitto) without being restarted, and works there."""
    caplog.set_level(logging.INFO, logger="edge.mqtt")
    dead = f"mqtt://{HOST}:{free_port()}"
    with Mosquitto(tmp_path / "a") as a, Mosquitto(tmp_path / "b") as b, NetworkLoop() as loop:
        got: list[bytes] = []
        conn: Any = (
            lite_conn(loop, f"{dead},{a.url},{b.url}", got) if lean else paho_conn(loop, f"{dead},{a.url},{b.url}")
        )
        if not lean:
            conn.subscriptions = [("failover/#", 1)]
            conn._on_message = lambda _c, msg: got.append(bytes(msg.payload))
        conn.start()
        try:
            wait_for(lambda: conn.connected, what="connected to the second address")
            assert conn.node.url == a.url and conn.connects == 1
            publish_once(loop, a.url, b"on a")
            wait_for(lambda: got == [b"on a"], what="the message through node a")
            a.stop()
            wait_for(lambda: conn.connected and conn.node.url == b.url, what="moved to node b")
            assert conn.connects == 2
            publish_once(loop, b.url, b"on b")
            wait_for(lambda: got == [b"on a", b"on b"], what="the message through node b")
        finally:
            loop.run(conn.close)
            conn.closed.wait(5)
    text = caplog.text
    assert f"cannot connect to {dead} (" in text and f"; retrying {a.url} in " in text
    assert f"connected to {a.url}" in text and f"connected to {b.url}" in text
    assert f"connection to {a.url} lost (" in text and f"; trying {b.url}" in text
    assert MQTT5_UNANSWERED not in text


@pytest.mark.parametrize("lean", [False, True], ids=["paho", "lite"])
def test_no_protocol_hint_on_a_refused_client_certificate(
    lean: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A TLS listener that wants a client certificate ends the session before any CONNACK too; that is no sign of
    an MQTT 3.1.1 broker and must not say so. (The hint itself is checked on RabbitMQ 3.10, which does close MQTT 5
    CONNECTs: tests/mqtt/test_broker_rabbitmq.py.)"""
    caplog.set_level(logging.DEBUG, logger="edge.mqtt")
    tls = make_ca(tmp_path / "pki")
    with Mosquitto(tmp_path / "broker", tls=tls, require_certificate=True) as m, NetworkLoop() as loop:
        conn: Any = lite_conn(loop, m.url, [], ca_file=tls.ca) if lean else paho_conn(loop, m.url, ca_file=tls.ca)
        conn.start()
        try:
            wait_for(lambda: conn.attempts >= 2, what="two refused attempts")
            assert not conn.connected
        finally:
            loop.run(conn.close)
            conn.closed.wait(5)
        wait_for(lambda: "peer did not return a certificate" in m.log(), what="the broker's no-certificate error")
    assert MQTT5_UNANSWERED not in caplog.text and "cannot connect to" in caplog.text
