"""Issue #26 item 7: a forged stream cannot take a device's row (a real Mosquitto, the real collector, the agent's
own protocol layer as the device).

Before: one telemetry message with a session inside the 300 s skew window and seq 2**53-1 won the device's row,
and the real agent's telemetry was discarded as older for as long as the forged session stayed ahead.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from edge.fleet.collector import Collector, CollectorConfig
from edge.fleet.status import fleet_status
from edge.mqtt.client import BrokerConfig
from edge.mqtt.netloop import Backoff, Connection, ConnectOptions, NetworkLoop
from edge.mqtt.outbox import MemoryOutbox
from edge.mqtt.payloads import encode, message
from edge.mqtt.session import DeviceSession, SessionOptions
from tests.support.cli import run_cli, wait_for
from tests.support.fleet_db import count
from tests.support.mqtt_broker import Mosquitto

FAST = Backoff(0.05, 0.5)
TOP = 2**53 - 1


def test_a_forged_session_or_seq_jump_never_locks_out_the_real_stream(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    url = f"sqlite:///{db}"
    with Mosquitto(tmp_path / "broker") as broker, NetworkLoop(name="edgekit-test") as loop:
        cfg = BrokerConfig.from_url(broker.url)
        col = Collector(CollectorConfig(cfg, url, fleet="lab", backoff=FAST, gap_grace_s=0.0)).start(loop)
        dev = DeviceSession(
            loop,
            cfg,
            "lab",
            "cam-01",
            MemoryOutbox(),
            options=SessionOptions(backoff=FAST),
            birth_body=lambda: {"agent": {"interval_s": 1.0}, "state": "running", "bundle": {"id": "real"}},
        )
        forger = Connection(loop, cfg, "forger", options=ConnectOptions(backoff=FAST))
        try:
            loop.run(dev.start)
            loop.run(forger.start)
            wait_for(lambda: col.connected and dev.connected and forger.connected, what="everyone connected")
            loop.run(dev.submit, "telemetry", {"inference": {"fps": 30.0}, "bundle_id": "real"})
            wait_for(lambda: count(db, "SELECT count(*) FROM telemetry") == 1, what="the real telemetry")

            def forge(session: int, fps: float, seq: int = TOP) -> None:
                body = message(
                    "telemetry",
                    "lab",
                    "cam-01",
                    session,
                    seq,
                    {"historical": False, "inference": {"fps": fps}, "bundle_id": "forged"},
                )
                loop.run(forger.publish, "edgekit/lab/cam-01/telemetry", encode(body), 1)

            assert dev.session + 100 <= time.time() + 300  # inside the collector's skew window
            forge(dev.session + 100, 1.0)  # a session no birth announced, far ahead
            forge(dev.session, 2.0)  # the device's own session, seq 2**53-1
            wait_for(lambda: col.snapshot()["rejected"]["seq_jump"] == 2, what="both forgeries refused")
            forge(dev.session + 50, 3.0, seq=5)  # a plausible seq in a session no birth announced: history only
            wait_for(lambda: count(db, "SELECT count(*) FROM telemetry") == 2, what="the forged session stored")
            for fps in (29.0, 31.0):
                loop.run(dev.submit, "telemetry", {"inference": {"fps": fps}, "bundle_id": "real"})
            wait_for(
                lambda: count(db, "SELECT count(*) FROM telemetry") == 4, what="the real stream after the forgeries"
            )
        finally:
            dev.close(timeout=2)
            loop.run(forger.close)
            forger.closed.wait(2)
            col.stop()
    row = {r["device"]: r for r in fleet_status(url)}["cam-01"]
    # the row follows the real agent: its session, its latest seq, its figures
    assert (row["last_session"], row["last_seq"], row["fps"], row["bundle_id"]) == (
        dev.session,
        dev.seq,
        31.0,
        "real",
    ), row
    assert row["flag"] is not None and row["flag"]["max_seq"] == TOP, row["flag"]
    assert count(db, f"SELECT count(*) FROM telemetry WHERE seq = {TOP}") == 0  # refused, not stored
    assert row["missing"] == 4  # seqs 1-4 of the forged session; no forged gap of 2**53 messages
    p = run_cli("fleet", "status", "--db", url)
    assert p.returncode == 0 and "flagged" in p.stdout and "refused" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("jump", [10, 2_000_000])
def test_seq_jump_bound(tmp_path: Path, jump: int) -> None:
    """In process: a jump within the bound is a gap (stored), beyond it a refusal (flagged)."""
    url = f"sqlite:///{tmp_path}/fleet.db"
    c = Collector(CollectorConfig(BrokerConfig("127.0.0.1", 1), url, gap_grace_s=0.0))
    now = time.time()
    s = int(now)
    birth = message("birth", "lab", "cam-01", s, 0, {"connection": 1, "state": "running"})
    assert c.handle("edgekit/lab/cam-01/birth", encode(birth), received_at=now) == "stored"
    t1 = message("telemetry", "lab", "cam-01", s, 1, {"historical": False})
    assert c.handle("edgekit/lab/cam-01/telemetry", encode(t1), received_at=now) == "stored"
    far = message("telemetry", "lab", "cam-01", s, 1 + jump, {"historical": False})
    want = "stored" if jump <= c.config.max_seq_jump else "seq_jump"
    assert c.handle("edgekit/lab/cam-01/telemetry", encode(far), received_at=now) == want
    c.flush()
    c.db.close()
