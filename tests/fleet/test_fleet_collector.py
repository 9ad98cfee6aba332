"""The collector's store logic without a broker: de-duplication, gaps, birth/death ordering, status, both databases."""

from __future__ import annotations

import json
import time
from pathlib import Path

from edge.fleet.collector import Collector, CollectorConfig
from edge.fleet.db import open_db
from edge.fleet.status import fleet_status, summarize
from edge.mqtt.client import BrokerConfig
from edge.mqtt.payloads import encode, message
from tests.support.cli import assert_user_error, run_cli

T0 = 1_767_225_600.0


def tel(
    seq: int, *, session: int = 5, device: str = "cam-01", fps: float = 30.0, historical: bool = False
) -> tuple[str, bytes]:
    body = {
        "historical": historical,
        "interval_s": 5.0,
        "state": "running",
        "bundle_id": "b1",
        "inference": {
            "frames": 150,
            "fps": fps,
            "budget_ms": 16.7,
            "budget_misses": 2,
            "latency_ms": {"count": 150, "p50_ms": 4.0, "p99_ms": 9.5, "max_ms": 12.0},
        },
        "process": {"cpu_percent": 40.0, "rss_mb": 80.0},
        "thermal": {"max_c": 61.5, "throttled_now": False},
        "spool": {"pending": 0, "dropped_total": 0},
    }
    return f"edgekit/lab/{device}/telemetry", encode(
        message("telemetry", "lab", device, session, seq, body, ts=T0 + seq)
    )


def birth(session: int, connection: int, seq: int = 0, device: str = "cam-01") -> tuple[str, bytes]:
    body = {
        "connection": connection,
        "state": "running",
        "agent": {"edgekit_version": "0.1.0", "interval_s": 5.0},
        "bundle": {"id": "b1", "target": "x86-cpu", "precision": "fp32"},
        "runner": {"runtime": "onnxruntime 1.31.1", "device_used": "CPUExecutionProvider"},
        "host": {"hostname": "box"},
    }
    return f"edgekit/lab/{device}/birth", encode(message("birth", "lab", device, session, seq, body, ts=T0))


def death(session: int, connection: int, seq: int = 0, reason: str = "shutdown") -> tuple[str, bytes]:
    return "edgekit/lab/cam-01/death", encode(
        message("death", "lab", "cam-01", session, seq, {"connection": connection, "reason": reason}, ts=T0)
    )


def collector(url: str = "sqlite:///:memory:") -> Collector:
    return Collector(CollectorConfig(BrokerConfig("127.0.0.1", 1), url, gap_grace_s=0.0))


def status(c: Collector, url: str, now: float) -> dict:
    c.flush()
    return {r["device"]: r for r in fleet_status(url, now=now)}


def exercise(url: str) -> None:
    """The same scenario on SQLite and PostgreSQL."""
    c = collector(url)
    try:
        assert c.handle(*birth(5, 1), received_at=T0) == "stored"
        for seq in (1, 2, 4):
            assert c.handle(*tel(seq), received_at=T0 + seq) == "stored"
        assert c.handle(*tel(2), received_at=T0 + 9) == "duplicate"
        s = status(c, url, now=T0 + 5)["cam-01"]
        assert (s["status"], s["missing"], s["messages"], s["bundle_id"], s["fps"], s["p99_ms"]) == (
            "online",
            1,
            3,
            "b1",
            30.0,
            9.5,
        )
        assert s["runtime"] == "onnxruntime 1.31.1" and s["temp_c"] == 61.5 and s["misses"] == 2
        assert c.handle(*tel(3, fps=10.0, historical=True), received_at=T0 + 6) == "stored"  # replayed: fills the gap
        s = status(c, url, now=T0 + 6)["cam-01"]
        assert s["missing"] == 0 and s["fps"] == 30.0, "an older (replayed) message must not overwrite newer status"
        assert c.stats["gaps_detected"] == 1 and c.stats["gaps_filled"] == 1
        assert c.handle(*birth(5, 2, seq=6), received_at=T0) == "stored"  # reconnect: the birth says seq 6 exists
        assert status(c, url, now=T0 + 7)["cam-01"]["missing"] == 2
        assert (
            c.handle(*death(5, 1, reason="last will"), received_at=T0) == "stored"
        )  # a late will of the older connection
        assert status(c, url, now=T0 + 7)["cam-01"]["status"] == "online"
        assert status(c, url, now=T0 + 60)["cam-01"]["status"] == "stale"
        assert c.handle(*death(5, 2, seq=6), received_at=T0) == "stored"
        s = status(c, url, now=T0 + 8)["cam-01"]
        assert s["status"] == "offline" and s["death_reason"] == "shutdown"
        assert c.handle(*birth(6, 1), received_at=T0) == "stored"  # the device restarted: new session
        assert status(c, url, now=T0 + 9)["cam-01"]["status"] == "online"
        assert c.handle(*tel(1, device="cam-02"), received_at=T0 + 1) == "stored"  # no birth seen for it
        c.flush()
        rows = fleet_status(url, now=T0 + 9)
        assert {r["device"]: r["status"] for r in rows} == {"cam-01": "online", "cam-02": "unknown"}
        assert summarize(rows)["devices"] == 2
        assert c.handle("edgekit/lab/cam-01/telemetry", b"garbage") == "malformed"
        assert c.stats["rejected"]["malformed"] == 1 and c.stats["duplicates"] == 1
        c.flush()
        with open_db(url) as db:
            assert db.query("SELECT count(*) AS n FROM telemetry")[0]["n"] == 5
    finally:
        c.db.close()


def test_collector_store_on_sqlite(tmp_path: Path) -> None:
    exercise(f"sqlite:///{tmp_path}/fleet.db")


def test_status_cli_table_and_json(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/fleet.db"
    c = collector(url)
    c.handle(*birth(5, 1), received_at=time.time())
    c.handle(*tel(1), received_at=time.time())
    c.handle(*death(5, 1), received_at=T0)
    c.handle(*tel(1, device="cam-02"), received_at=time.time() - 3600)
    c.flush()
    c.db.close()
    p = run_cli("fleet", "status", "--db", url, "--json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["summary"]["offline"] == 1 and data["summary"]["unknown"] == 1
    p = run_cli("fleet", "status", "--db", url)
    assert p.returncode == 0, p.stderr
    assert "lab/cam-01" in p.stdout and "offline" in p.stdout and "1 offline, 1 unknown of 2 devices" in p.stdout
    assert_user_error(run_cli("fleet", "status", "--db", f"sqlite:///{tmp_path}/nope.db"), "does not exist")
    assert_user_error(run_cli("fleet", "status", "--db", "mysql://x/y"), "unsupported database URL")


def test_collector_store_on_postgresql(postgres_url: str) -> None:
    exercise(postgres_url)
    with open_db(postgres_url) as db:  # same schema: the shared tables exist with the same columns
        cols = {
            r["column_name"]
            for r in db.query("SELECT column_name FROM information_schema.columns WHERE table_name = 'telemetry'")
        }
        assert {"fleet", "device", "session", "seq", "ts", "received_at", "historical", "p99_ms", "payload"} <= cols
