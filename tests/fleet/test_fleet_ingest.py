"""The collector's batches: options checked, a batch stores what message-by-message storing stores, and a
collector killed mid-batch loses nothing and stores nothing twice (real Mosquitto, persistent session)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from edge.errors import EdgeError
from edge.fleet import decode as dec
from edge.fleet.collector import Collector, CollectorConfig
from edge.fleet.db import open_db
from edge.mqtt.client import BrokerConfig
from edge.mqtt.payloads import encode, message
from tests.support.cli import REPO
from tests.support.mqtt_broker import Mosquitto, preload_qos1

T0 = 1_767_225_600.0
CLIENT_ID = "edgekit-test-collector"


def cfg(url: str = "sqlite:///:memory:", **kw: Any) -> CollectorConfig:
    return CollectorConfig(BrokerConfig("127.0.0.1", 1), url, gap_grace_s=0.0, **kw)


def test_batch_options_are_checked_all_at_once() -> None:
    with pytest.raises(EdgeError) as e:
        cfg(batch_max=0, batch_interval_ms=-1, receive_maximum=70_000)
    msg = str(e.value)
    assert "batch size 0" in msg and "batch interval -1" in msg and "receive maximum 70000" in msg
    with pytest.raises(EdgeError, match="below the batch size"):
        cfg(batch_max=5000, receive_maximum=1000)
    c = cfg(batch_max=1, batch_interval_ms=0, receive_maximum=1)  # the smallest: one message per transaction
    assert (c.batch_max, c.batch_interval_ms, c.receive_maximum) == (1, 0, 1)


def test_cli_refuses_bad_batch_options() -> None:
    from tests.support.cli import assert_user_error, run_cli

    assert_user_error(
        run_cli(
            "fleet",
            "collect",
            "--broker",
            "mqtt://127.0.0.1:1",
            "--db",
            "sqlite:///:memory:",
            "--batch-max",
            "20000",
            "--receive-maximum",
            "100",
        ),
        "below the batch size",
    )


def test_sqlite_synchronous_option(tmp_path: Path) -> None:
    for mode, want in (("", 2), ("?synchronous=normal", 1), ("?synchronous=OFF", 0)):
        with open_db(f"sqlite:///{tmp_path}/f{want}.db{mode}") as db:
            assert db.execute("PRAGMA synchronous").fetchone()[0] == want
            assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with pytest.raises(EdgeError, match="synchronous=full"):
        open_db(f"sqlite:///{tmp_path}/x.db?synchronous=sometimes")


# a batch stores what one message at a time stores --------------------------------------
def _msg(kind: str, device: str, session: int, seq: int, body: dict[str, Any] | None = None) -> tuple[str, bytes]:
    return f"edgekit/lab/{device}/{kind}", encode(message(kind, "lab", device, session, seq, body or {}, ts=T0 + seq))


def scenario() -> list[tuple[str, bytes]]:
    """Births mid-run, telemetry and state interleaved, a replayed older message, in-batch and stored duplicates."""
    out = [_msg("birth", "a", 5, 0, {"connection": 1, "agent": {"interval_s": 1.0}})]
    for seq in range(1, 40):
        dev = "a" if seq % 3 else "b"
        kind = "state" if seq % 7 == 0 else "telemetry"
        body = (
            {"state": f"s{seq}"}
            if kind == "state"
            else {"inference": {"fps": float(seq), "frames": seq, "latency_ms": {"p99_ms": seq / 2}}}
        )
        out.append(_msg(kind, dev, 5, seq, body))
        if seq == 20:
            out.append(_msg("birth", "b", 5, 19, {"connection": 2}))
            out.append(out[5])  # a re-delivered copy, in the same batch or a later one
    out.append(_msg("telemetry", "a", 5, 2, {"inference": {"fps": -1.0}, "historical": True}))  # stored already
    out.append(_msg("telemetry", "a", 5, 41, {"inference": {"fps": 41.0}}))
    out.append(_msg("state", "a", 5, 40, {"state": "older than seq 41"}))  # arrives after 41, must not win
    out.append(_msg("death", "b", 5, 39, {"connection": 2, "reason": "shutdown"}))
    out.append(_msg("telemetry", "c", 9, 1, {"inference": {"fps": 10**400}}))  # no birth; huge int
    return out


def dump(url: str) -> dict[str, Any]:
    with open_db(url) as db:
        return {t: db.query(f"SELECT * FROM {t} ORDER BY 1, 2, 3, 4") for t in ("devices", "streams")} | {
            t: db.query(f"SELECT fleet, device, session, seq, payload FROM {t} ORDER BY 1, 2, 3, 4")
            for t in ("telemetry", "states")
        }


def store_both_ways(url_one: str, url_batch: str, batch: int) -> None:
    msgs = scenario()
    one = Collector(cfg(url_one))
    try:
        outcomes = [one.handle(t, p, received_at=T0 + 100) for t, p in msgs]
        one.flush()
    finally:
        one.db.close()
    b = Collector(cfg(url_batch, batch_max=batch, receive_maximum=max(batch, 10)))
    try:
        for i in range(0, len(msgs), batch):
            for t, p in msgs[i : i + batch]:
                assert b.add(t, p, received_at=T0 + 100) is None
            b.flush()
    finally:
        b.db.close()
    assert outcomes.count("duplicate") == 2
    for k in ("received", "stored", "duplicates", "rejected"):
        assert b.stats[k] == one.stats[k], k
    x, y = dump(url_one), dump(url_batch)
    for rows in (*x.values(), *y.values()):
        for r in rows:
            r.pop("updated_at", None)
    assert x == y
    dev = {r["device"]: r for r in y["devices"]}
    assert dev["a"]["last_seq"] == 41 and dev["a"]["fps"] == 41.0 and dev["a"]["state"] == "s35"
    assert dev["b"]["online"] in (False, 0) and dev["c"]["fps"] is None  # 10**400: not a storable number


@pytest.mark.parametrize("batch", [1, 7, 1000])
def test_a_batch_stores_what_one_message_at_a_time_stores(tmp_path: Path, batch: int) -> None:
    store_both_ways(f"sqlite:///{tmp_path}/one.db", f"sqlite:///{tmp_path}/batch.db", batch)


def test_a_batch_stores_what_one_message_at_a_time_stores_on_postgresql(postgres_url: str) -> None:
    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as c:
        for name in ("one", "batch"):
            c.execute(f"DROP DATABASE IF EXISTS {name}")
            c.execute(f"CREATE DATABASE {name}")
    base = postgres_url.rsplit("/", 1)[0]
    store_both_ways(f"{base}/one", f"{base}/batch", 1000)


def test_orjson_and_json_accept_the_same_messages() -> None:
    if dec.JSON_LIBRARY != "orjson":
        pytest.skip("orjson is not installed (pip install 'edgekit-ml[fleet]')")
    lone = (
        b'{"schema_version": 1, "type": "telemetry", "fleet": "lab", "device": "a", "session": 1, "seq": 1, '
        b'"ts": 1.0, "historical": false, "bundle_id": "\\udcff"}'
    )  # what json.dumps writes for surrogateescape
    assert dec.decode("edgekit/lab/a/telemetry", lone).payload["bundle_id"] == "\udcff"  # orjson refuses it alone
    with pytest.raises(dec.Rejected, match="not JSON"):
        dec.decode("edgekit/lab/a/telemetry", b'{"ts": NaN}')


# killed mid-batch: nothing lost, nothing twice -------------------------------------------
def collect(broker: Mosquitto, db: Path, *opts: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "edge",
            "fleet",
            "collect",
            "--broker",
            broker.url,
            "--db",
            f"sqlite:///{db}",
            "--json",
            "--log-level",
            "warning",
            "--client-id",
            CLIENT_ID,
            *opts,
        ],
        cwd=REPO,
        env={**os.environ, "NO_COLOR": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def telemetry_count(db: Path) -> int:
    try:
        with open_db(f"sqlite:///{db}", must_exist=True) as s:
            return int(s.execute("SELECT count(*) FROM telemetry").fetchone()[0])
    except Exception:  # not created yet
        return 0


@pytest.mark.parametrize("client", ["paho", "lite"])
def test_collector_killed_mid_batch_loses_nothing_and_stores_nothing_twice(tmp_path: Path, client: str) -> None:
    devices, per_device = 50, 300
    n = devices * per_device
    msgs = [_msg("birth", f"d{i}", 5, 0, {"connection": 1}) for i in range(devices)]
    msgs += [_msg("telemetry", f"d{k % devices}", 5, k // devices + 1, {"inference": {"fps": 1.0}}) for k in range(n)]
    db = tmp_path / "fleet.db"
    opts = ("--batch-max", "700", "--batch-interval-ms", "300", "--receive-maximum", "3000", "--client", client)
    with Mosquitto(tmp_path / "broker") as broker:
        p = collect(broker, db, *opts, "--duration", "1")  # registers the persistent session, then goes away
        assert p.wait(60) == 0, p.stderr.read().decode()[-2000:] if p.stderr else ""
        preload_qos1(broker.port, msgs)  # held by the broker for the absent collector
        p = collect(broker, db, *opts)
        deadline = time.monotonic() + 60
        while telemetry_count(db) < 1400 and time.monotonic() < deadline:  # two batches committed, more in flight
            time.sleep(0.005)
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        first = telemetry_count(db)
        assert 0 < first < n, f"the kill came at {first} of {n}: not mid-drain"
        p = collect(broker, db, *opts)
        deadline = time.monotonic() + 90
        while telemetry_count(db) < n and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # anything re-delivered late would show up now
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err.decode()[-2000:]
    stats = json.loads(out)
    with open_db(f"sqlite:///{db}") as s:
        stored = s.execute("SELECT count(*), count(DISTINCT device || '/' || seq) FROM telemetry").fetchone()
        missing = s.execute("SELECT coalesce(sum(max_seq - received), 0) FROM streams").fetchone()[0]
        received = s.execute("SELECT sum(received) FROM streams").fetchone()[0]
    assert tuple(stored) == (n, n) and missing == 0 and received == n
    # the second run stored exactly what the first had not committed; what it had committed but not yet
    # acknowledged came again and was recognised (births: re-delivered when their batch had not committed)
    assert stats["stored"]["telemetry"] == n - first
    assert stats["rejected"] == {k: 0 for k in stats["rejected"]} and stats["db_errors"] == 0


# the hot path's readers, the PostgreSQL array statements, the light simulator -----------------------
def test_telemetry_columns_read_what_the_lenient_readers_read() -> None:
    import random

    from edge.fleet.simulate import telemetry_body

    full = telemetry_body(random.Random(1), 1.0)
    odd = {
        "inference": {
            "fps": True,
            "budget_misses": 2.5,
            "frames": 2**60,
            "budget_ms": "33",
            "latency_ms": {"p50_ms": 10**400, "p99_ms": None, "max_ms": -0.0},
        },
        "process": [],
        "thermal": {"max_c": float("nan"), "throttled_now": 1},
        "spool": {"pending": 3.0},
        "interval_s": 2,
        "bundle_id": "b\x00\udcffx" * 80,
    }
    wrong = {"inference": "x", "thermal": {"throttled_now": True}, "spool": None, "bundle_id": 7}
    for x in (full, odd, wrong, {}):
        want = (
            dec.num(x, "inference", "fps"),
            dec.num(x, "inference", "latency_ms", "p50_ms"),
            dec.num(x, "inference", "latency_ms", "p99_ms"),
            dec.num(x, "inference", "latency_ms", "max_ms"),
            dec.integer(x, "inference", "budget_misses"),
            dec.integer(x, "inference", "frames"),
            dec.num(x, "process", "cpu_percent"),
            dec.num(x, "process", "rss_mb"),
            dec.num(x, "thermal", "max_c"),
            dec.num(x, "inference", "budget_ms"),
            dec.flag(x, "thermal", "throttled_now"),
            dec.integer(x, "spool", "pending"),
            dec.integer(x, "spool", "dropped_total"),
            dec.num(x, "interval_s"),
            dec.text(x, "bundle_id"),
        )
        got = dec.telemetry_columns(x)
        assert len(got) == len(dec.TELEMETRY_METRICS) and got == want, x
    assert dec.telemetry_columns(full)[0] == full["inference"]["fps"]  # not all None: the test can fail


def test_unnest_turns_a_row_statement_into_one_over_column_arrays() -> None:
    from edge.fleet.db import _unnest

    assert _unnest("INSERT INTO s (a, b, c) VALUES (?, 0, ?) ON CONFLICT DO NOTHING", ("text", "bigint")) == (
        "INSERT INTO s (a, b, c) SELECT u.c0, 0, u.c1 FROM unnest(%b::text[], %b::bigint[]) AS u(c0, c1) "
        "ON CONFLICT DO NOTHING"
    )
    assert _unnest("UPDATE d SET x = coalesce(?, x) WHERE k = ? AND (v < ?)", ("float8", "text", "bigint")) == (
        "UPDATE d SET x = coalesce(u.c0, x) FROM unnest(%b::float8[], %b::text[], %b::bigint[]) AS u(c0, c1, c2) "
        "WHERE k = u.c1 AND (v < u.c2)"
    )
    with pytest.raises(ValueError, match="2 types for 3 parameters"):
        _unnest("UPDATE d SET x = ? WHERE k = ? AND v = ?", ("text", "text"))


def _device_and_row(url: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    import random

    from edge.fleet.simulate import telemetry_body

    body = telemetry_body(random.Random(3), 2.0)
    body["thermal"]["throttled_now"] = True
    body["spool"].update(pending=4, dropped_total=2)
    c = Collector(cfg(url))
    try:
        for t, p in (
            _msg("birth", "a", 5, 0, {"connection": 1}),
            _msg("telemetry", "a", 5, 1, body),
            _msg("telemetry", "a", 5, 2, {**body, "bundle_id": None, "interval_s": "x"}),
        ):
            assert c.add(t, p, received_at=T0 + 100) is None
        c.flush()
    finally:
        c.db.close()
    with open_db(url) as db:
        dev = db.query("SELECT * FROM devices")[0]
        row = db.query("SELECT * FROM telemetry WHERE seq = 2")[0]
    return body, dev, row


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_the_device_row_and_the_telemetry_row_hold_the_payloads_values(
    tmp_path: Path, dialect: str, request: pytest.FixtureRequest
) -> None:
    if dialect == "sqlite":
        url = f"sqlite:///{tmp_path}/f.db"
    else:
        import psycopg

        base = request.getfixturevalue("postgres_url")
        with psycopg.connect(base, autocommit=True) as c:
            c.execute("DROP DATABASE IF EXISTS columns")
            c.execute("CREATE DATABASE columns")
        url = base.rsplit("/", 1)[0] + "/columns"
    body, dev, row = _device_and_row(url)
    inf, lat = body["inference"], body["inference"]["latency_ms"]
    want = {
        "last_seq": 2,
        "fps": inf["fps"],
        "p50_ms": lat["p50_ms"],
        "p99_ms": lat["p99_ms"],
        "max_ms": lat["max_ms"],
        "misses": inf["budget_misses"],
        "frames": inf["frames"],
        "cpu_percent": body["process"]["cpu_percent"],
        "rss_mb": body["process"]["rss_mb"],
        "temp_c": body["thermal"]["max_c"],
        "budget_ms": inf["budget_ms"],
        "throttled": True,
        "spool_pending": 4,
        "spool_dropped": 2,
        "interval_s": 0.5,
        "bundle_id": body["bundle_id"],
    }  # seq 2's null and bad values keep seq 1's
    assert {k: dev[k] for k in want} == want
    assert {
        k: row[k] for k in ("fps", "p50_ms", "p99_ms", "max_ms", "misses", "frames", "cpu_percent", "rss_mb", "temp_c")
    } == {
        k: want[k] for k in ("fps", "p50_ms", "p99_ms", "max_ms", "misses", "frames", "cpu_percent", "rss_mb", "temp_c")
    }


def test_the_light_simulator_is_seen_by_the_collector_as_devices(tmp_path: Path) -> None:
    from edge.fleet.simulate import LightFleet

    devices, rate = 40, 5.0
    url = f"sqlite:///{tmp_path}/fleet.db"
    with Mosquitto(tmp_path / "broker") as broker:
        c = Collector(
            CollectorConfig(BrokerConfig.from_url(broker.url), url, client_id=CLIENT_ID, batch_interval_ms=20)
        ).start()
        try:
            deadline = time.monotonic() + 20
            while not c.connected and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.3)  # SUBACK
            fleet = LightFleet("127.0.0.1", broker.port, devices=devices, rate_hz=rate, connect_per_s=400).start()
            deadline = time.monotonic() + 20
            while fleet.submitted < devices * 8 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert fleet.connected() == devices and fleet.lost == 0
            fleet.stop()
            assert fleet.lost == 0 and fleet.connected() == 0  # every device said goodbye (death, DISCONNECT)
            made = fleet.submitted
            deadline = time.monotonic() + 20
            while c.snapshot()["stored"]["death"] < devices and time.monotonic() < deadline:
                time.sleep(0.05)
            stats = c.snapshot()
        finally:
            c.stop()
    assert made >= devices * 8 and sum(fleet.seq) == made
    assert stats["stored"] == {"birth": devices, "telemetry": made, "state": 0, "death": devices}
    assert stats["duplicates"] == 0 and stats["rebirths_sent"] == 0 and stats["rejected"]["malformed"] == 0
    with open_db(url) as db:
        assert db.execute("SELECT count(*), count(DISTINCT device) FROM telemetry").fetchone() == (made, devices)
        assert (
            db.execute("SELECT coalesce(sum(max(max_seq, announced_seq) - received), 0) FROM streams").fetchone()[0]
            == 0
        )
        offline = db.execute("SELECT count(*) FROM devices WHERE online = 0 AND death_reason = 'shutdown'")
        assert offline.fetchone()[0] == devices
        lag = db.execute("SELECT max(received_at - ts) FROM telemetry").fetchone()[0]
        assert 0 <= lag < 30  # each message stamped when it was written, on this host's clock
