"""Issue #26 item 8: a QoS 0 flood of distinct device ids costs the collector counters, not memory.

A real Mosquitto, the real collector, its database held busy by another writer while the flood arrives: the
backlog waiting for the database stops at ``max_backlog``, the rest is shed and counted. Before, every message
was decoded and queued (1M ids at 8k msg/s grew a collector from 59 MB to 1.18 GB).
"""

from __future__ import annotations

import os
import socket
import sqlite3
import struct
import threading
import time
from pathlib import Path

from edge.fleet.collector import Collector, CollectorConfig
from edge.mqtt.client import BrokerConfig
from edge.mqtt.lite import mqtt_packet, mqtt_string
from edge.mqtt.netloop import Backoff
from edge.mqtt.payloads import encode, message
from tests.support.cli import wait_for
from tests.support.mqtt_broker import Mosquitto

FLOOD = 60_000
BACKLOG = 3_000


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _flood(port: int, n: int, session: int) -> None:
    """QoS 0 telemetry from ``n`` distinct forged device ids, written as fast as the socket takes them."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        body = mqtt_string("MQTT") + bytes([4, 0x02]) + struct.pack("!H", 60) + mqtt_string(f"flood-{os.getpid()}")
        s.sendall(mqtt_packet(0x10, body))
        assert s.recv(4) == b"\x20\x02\x00\x00"
        pad = {"inference": {"fps": 30.0, "latency_ms": {"p50_ms": 1.0, "p99_ms": 2.0}}, "note": "x" * 600}
        for start in range(0, n, 2_000):
            out = bytearray()
            for i in range(start, min(n, start + 2_000)):
                dev = f"flood-{i:06d}"
                payload = encode(message("telemetry", "lab", dev, session, 1, {"historical": False, **pad}))
                out += mqtt_packet(0x30, mqtt_string(f"edgekit/lab/{dev}/telemetry") + payload)
            s.sendall(out)
        s.sendall(b"\xe0\x00")


def test_a_qos0_flood_is_shed_not_queued(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    with Mosquitto(tmp_path / "broker") as broker:
        cfg = CollectorConfig(
            BrokerConfig.from_url(broker.url),
            f"sqlite:///{db}",
            fleet="lab",
            backoff=Backoff(0.05, 0.5),
            batch_max=1_000,
            receive_maximum=1_000,
            max_backlog=BACKLOG,
            max_tracked=2_000,
        )
        with Collector(cfg) as col:
            wait_for(lambda: col.connected, what="the collector connected")
            blocker = sqlite3.connect(db, timeout=10, isolation_level=None)
            blocker.execute("BEGIN EXCLUSIVE")  # the database is busy: nothing can be written meanwhile
            before = _rss_mb()
            sender = threading.Thread(target=_flood, args=(broker.port, FLOOD, int(time.time())))
            sender.start()
            try:  # at most 8 s: the collector's SQLite writer waits 10 s for a lock before it gives up
                deadline = time.monotonic() + 8
                while col.snapshot()["received"] < FLOOD and time.monotonic() < deadline:
                    time.sleep(0.05)
                during, held = _rss_mb(), col.snapshot()
            finally:
                sender.join()
                blocker.execute("ROLLBACK")
                blocker.close()
            wait_for(
                lambda: col.snapshot()["stored"]["telemetry"] + col.snapshot().get("shed", 0) >= FLOOD,
                timeout=60,
                what="the backlog written once the database is free",
            )
            s = col.snapshot()
    print(
        f"RSS {before:.0f} MB -> {during:.0f} MB during the flood; {s['shed']} shed, "
        f"{s['stored']['telemetry']} stored, backlog at most {s['backlog_high']}"
    )
    assert held["received"] > 4 * BACKLOG, held  # the flood outran the busy database: there was a backlog to bound
    assert s["backlog_high"] <= BACKLOG
    assert s["shed"] >= held["received"] - 2 * BACKLOG - cfg.batch_max  # what did not fit was shed, and counted
    assert s["stored"]["telemetry"] + s["shed"] == FLOOD
    assert during - before < 40, (before, during)  # 60,000 queued messages were ~150 MB
