"""Issue #33, red team "fleet rows (no ACL)": forged messages on a device's real session may flicker its row, never
hold it. The collector's store logic on a real SQLite (no broker needed: what reaches the collector is the point).

Before: a telemetry message 999,999 ahead (inside --max-seq-jump) froze the row until the real stream caught up
(58 days at 5 s); a birth or death with connection 2**53-1 on the real session won over every later real birth; a
forged death marked a live device offline for good.
"""

from __future__ import annotations

from pathlib import Path

from edge.fleet.collector import Collector, CollectorConfig
from edge.fleet.status import fleet_status
from edge.mqtt.client import BrokerConfig
from edge.mqtt.payloads import encode, message

T0 = 1_767_225_600.0
S = int(T0) - 100  # the device's real session


def _msg(kind: str, seq: int, body: dict, session: int = S) -> tuple[str, bytes]:
    return f"edgekit/lab/cam-01/{kind}", encode(message(kind, "lab", "cam-01", session, seq, body, ts=T0 + seq))


def tel(seq: int, fps: float, **kw: object) -> tuple[str, bytes]:
    return _msg("telemetry", seq, {"historical": False, "interval_s": 5.0, "inference": {"fps": fps}, **kw})


def birth(seq: int, connection: int, host: str) -> tuple[str, bytes]:
    return _msg("birth", seq, {"connection": connection, "state": "running", "host": {"hostname": host}})


def death(seq: int, connection: int) -> tuple[str, bytes]:
    return _msg("death", seq, {"connection": connection, "reason": "will"})


def _row(c: Collector, url: str) -> dict:
    c.flush()
    return fleet_status(url, now=T0 + 10)[0]


def _collector(tmp_path: Path) -> tuple[Collector, str]:
    url = f"sqlite:///{tmp_path}/fleet.db"
    c = Collector(CollectorConfig(BrokerConfig("127.0.0.1", 1), url, gap_grace_s=0.0))
    assert c.handle(*birth(0, 1, "real"), received_at=T0) == "stored"
    for seq in (1, 2):
        assert c.handle(*tel(seq, 30.0), received_at=T0 + seq) == "stored"
    return c, url


def test_a_telemetry_message_far_ahead_on_the_real_session_does_not_freeze_the_row(tmp_path: Path) -> None:
    c, url = _collector(tmp_path)
    try:
        assert c.handle(*tel(999_999, 1.0), received_at=T0 + 3) == "stored"  # inside max_seq_jump: history
        c.flush()
        assert c.handle(*tel(3, 29.0), received_at=T0 + 4) == "stored"  # the real stream goes on
        row = _row(c, url)
        assert row["fps"] == 29.0 and row["last_seq"] == 3, row  # was: 1.0 and 999999 until seq passed it
        assert row["missing"] == 0, row  # the stream's position is the real one again
        # both in one batch: the real one after the forged one wins too
        c.handle(*tel(999_990, 1.0), received_at=T0 + 5)
        c.handle(*tel(4, 28.0), received_at=T0 + 6)
        assert _row(c, url)["fps"] == 28.0
        assert c.stats["rewinds"] == 2
    finally:
        c.db.close()


def test_a_replayed_old_message_does_not_rewind_the_row(tmp_path: Path) -> None:
    c, url = _collector(tmp_path)
    try:
        assert c.handle(*tel(1_000, 30.0), received_at=T0 + 3) == "stored"  # messages in between were lost
        # an outbox replay (historical) far below the position is history, never the row's
        body = {"historical": True, "interval_s": 5.0, "inference": {"fps": 1.0}}
        assert c.handle(*_msg("telemetry", 500, body), received_at=T0 + 4) == "stored"
        row = _row(c, url)
        assert row["last_seq"] == 1_000 and row["fps"] == 30.0 and c.stats["rewinds"] == 0, row
    finally:
        c.db.close()


def test_a_connection_far_ahead_on_the_real_session_loses_to_the_next_real_birth(tmp_path: Path) -> None:
    c, url = _collector(tmp_path)
    try:
        assert c.handle(*birth(2, 2**53 - 1, "forged"), received_at=T0 + 3) == "stored"
        assert _row(c, url)["hostname"] == "forged"
        assert c.handle(*birth(3, 2, "real"), received_at=T0 + 4) == "stored"  # the real device reconnects
        row = _row(c, url)
        assert row["hostname"] == "real" and row["connection"] == 2 and row["status"] == "online", row
        assert c.handle(*death(3, 2**53 - 1), received_at=T0 + 5) == "stored"  # a forged death, far ahead
        assert c.handle(*birth(4, 3, "real"), received_at=T0 + 6) == "stored"
        assert _row(c, url)["status"] == "online"
    finally:
        c.db.close()


def test_a_forged_death_does_not_mark_a_live_device_offline_for_good(tmp_path: Path) -> None:
    c, url = _collector(tmp_path)
    try:
        assert c.handle(*death(2, 1), received_at=T0 + 3) == "stored"  # on the real session and connection
        assert _row(c, url)["status"] == "offline"
        assert c.handle(*tel(3, 30.0), received_at=T0 + 4) == "stored"  # the device is heard from, live
        row = _row(c, url)
        assert row["status"] == "online" and row["fps"] == 30.0, row
        # a late older message after a real death does not bring it back
        c.handle(*birth(4, 2, "real"), received_at=T0 + 5)
        c.handle(*tel(6, 30.0), received_at=T0 + 6)
        c.handle(*death(6, 2), received_at=T0 + 7)
        c.handle(*tel(5, 30.0), received_at=T0 + 8)
        assert _row(c, url)["status"] == "offline"
    finally:
        c.db.close()


def test_a_birth_announcing_a_far_position_on_the_real_session_does_not_freeze_the_row(tmp_path: Path) -> None:
    """A forged birth of the real session and connection announcing seq 2**53-1: the row followed it, and every
    real message after it was older (births are not bounded by --max-seq-jump: they announce positions)."""
    c, url = _collector(tmp_path)
    try:
        assert c.handle(*birth(2**53 - 1, 1, "forged"), received_at=T0 + 3) == "stored"
        c.flush()
        assert c.handle(*tel(3, 27.0), received_at=T0 + 4) == "stored"
        row = _row(c, url)
        assert row["fps"] == 27.0 and row["last_seq"] == 3 and row["missing"] == 0, row
        state = _msg("state", 4, {"historical": False, "state": "running"})
        assert c.handle(*state, received_at=T0 + 5) == "stored"
        assert _row(c, url)["state"] == "running"
    finally:
        c.db.close()
