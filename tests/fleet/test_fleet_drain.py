"""Issue #33 item 0: a collector meeting a backlog at the broker drains it, each message stored exactly once.

A real Mosquitto holds 3,000 QoS 1 messages for the collector's persistent session (queued while it was away),
30 times its receive maximum. Mosquitto 2.0 sends a resumed session's queue regardless of the receive maximum;
the collector used to drop the connection there ("the broker sent more unacknowledged messages than the receive
maximum"), and the broker sent everything again, for ever (stored 9,000 of 200,000 in the drain benchmark). Now
it stops reading the socket while its backlog is full (TCP flow control holds the broker back).
"""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

from edge.fleet.collector import Collector, CollectorConfig
from edge.fleet.db import open_db
from edge.mqtt.client import BrokerConfig
from edge.mqtt.lite import READ_BYTES, mqtt_packet, mqtt_string
from edge.mqtt.netloop import Backoff
from edge.mqtt.payloads import encode, message
from tests.support.cli import wait_for
from tests.support.mqtt_broker import Mosquitto

BACKLOG = 3_000


def _publish_qos1(port: int, items: list[tuple[str, bytes]]) -> None:
    """QoS 1 publishes on a raw MQTT 3.1.1 connection; returns once the broker acknowledged every one."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        body = mqtt_string("MQTT") + bytes([4, 0x02]) + struct.pack("!H", 60) + mqtt_string("backlog-writer")
        s.sendall(mqtt_packet(0x10, body))
        assert s.recv(4) == b"\x20\x02\x00\x00"
        out = bytearray()
        for mid, (topic, payload) in enumerate(items, start=1):
            out += mqtt_packet(0x32, mqtt_string(topic) + struct.pack("!H", mid) + payload)
        s.sendall(out)
        want, got = 4 * len(items), 0
        while got < want:  # every PUBACK (4 bytes): the broker holds them all
            chunk = s.recv(65536)
            assert chunk, "broker closed the connection"
            got += len(chunk)
        s.sendall(b"\xe0\x00")


def test_a_backlog_over_the_receive_maximum_drains_exactly_once(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    session = int(time.time())
    with Mosquitto(tmp_path / "broker") as broker:
        cfg = CollectorConfig(
            BrokerConfig.from_url(broker.url),
            f"sqlite:///{db}",
            fleet="lab",
            backoff=Backoff(0.05, 0.5),
            batch_max=50,
            receive_maximum=100,
            max_backlog=200,
        )
        with Collector(cfg) as col:  # the persistent session exists: the broker queues for it from now on
            wait_for(lambda: col.connected, what="the collector connected")
        items = [
            (
                f"edgekit/lab/cam-{i % 10:02d}/telemetry",
                encode(message("telemetry", "lab", f"cam-{i % 10:02d}", session, 1 + i // 10, {"historical": False})),
            )
            for i in range(BACKLOG)
        ]
        _publish_qos1(broker.port, items)
        with Collector(cfg) as col:
            wait_for(lambda: col.snapshot()["stored"]["telemetry"] >= BACKLOG, timeout=60, what="the backlog stored")
            time.sleep(0.3)  # anything sent twice would arrive now
            s = col.snapshot()
    with open_db(f"sqlite:///{db}") as store:
        rows = store.execute("SELECT count(*) FROM telemetry").fetchone()[0]
    assert rows == BACKLOG, s
    assert s["stored"]["telemetry"] == BACKLOG and s["duplicates"] == 0, s
    # the bound, plus what one socket read held when reading stopped
    assert s["backlog_high"] <= cfg.max_backlog + READ_BYTES // min(len(p) for _, p in items), s
