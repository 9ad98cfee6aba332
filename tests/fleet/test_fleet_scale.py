"""Fleet telemetry at scale (issue #16): several collectors in one shared-subscription group on one PostgreSQL
(one SIGKILLed mid-run), time-partitioned PostgreSQL telemetry and retention, a site broker bridged to a
central one, MQTT 3.1.1 brokers. Real Mosquitto, real PostgreSQL."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from edge.errors import EdgeError
from edge.fleet.collector import Collector, CollectorConfig
from edge.fleet.db import PARTITION_S, SCHEMA, open_db
from edge.fleet.retention import parse_age, prune
from edge.fleet.simulate import SimulatedFleet
from edge.fleet.status import fleet_status
from edge.mqtt.client import BrokerConfig
from edge.mqtt.payloads import encode, message
from tests.support.cli import REPO, assert_user_error, run_cli, wait_for
from tests.support.mqtt_broker import BRIDGE_TOPICS, Mosquitto, bridge_config, preload_qos1

DAY = PARTITION_S


def new_database(pg: str, name: str) -> str:
    import psycopg

    with psycopg.connect(pg, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name}")
        c.execute(f"CREATE DATABASE {name}")
    return pg.rsplit("/", 1)[0] + "/" + name


def tel(device: str, session: int, seq: int, ts: float, fleet: str = "lab") -> tuple[str, bytes]:
    body = {"inference": {"fps": float(seq), "frames": seq, "latency_ms": {"p99_ms": 1.0}}}
    return f"edgekit/{fleet}/{device}/telemetry", encode(message("telemetry", fleet, device, session, seq, body, ts=ts))


def birth(device: str, session: int, ts: float, fleet: str = "lab") -> tuple[str, bytes]:
    return f"edgekit/{fleet}/{device}/birth", encode(
        message("birth", fleet, device, session, 0, {"connection": 1, "agent": {"interval_s": 1.0}}, ts=ts)
    )


def offline_collector(url: str) -> Collector:
    return Collector(CollectorConfig(BrokerConfig("127.0.0.1", 1), url, gap_grace_s=0.0))


# several collectors, one killed ----------------------------------------------------------
def collect(broker: Mosquitto, db_url: str, client_id: str, log: Path, *opts: str) -> subprocess.Popen[bytes]:
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
            db_url,
            "--json",
            "--log-level",
            "warning",
            "--client-id",
            client_id,
            "--group",
            "scale",
            "--batch-max",
            "500",
            "--batch-interval-ms",
            "100",
            "--receive-maximum",
            "2000",
            *opts,
        ],
        cwd=REPO,
        env={**os.environ, "NO_COLOR": "1"},
        stdout=subprocess.PIPE,
        stderr=open(log, "ab"),
    )


def scalar(url: str, sql: str) -> Any:
    with open_db(url, must_exist=True) as db:
        return db.execute(sql).fetchone()[0]


@pytest.mark.parametrize("client", ["paho", "lite"])
def test_two_collectors_one_killed_mid_run_lose_nothing_and_store_nothing_twice(
    postgres_url: str, tmp_path: Path, client: str
) -> None:
    """Two collector processes share the fleet (one shared-subscription group, one PostgreSQL); one is SIGKILLed
    mid-drain, more telemetry and re-sent copies arrive while it is down, it restarts under its client id (the
    broker kept its session): every message stored exactly once, every device's row at its highest seq."""
    url = new_database(postgres_url, f"several_{client}")
    devices, per_device, session, now = 40, 400, int(time.time()) - 100, time.time()
    first = [birth(f"d{i:02d}", session, now) for i in range(devices)]
    first += [tel(f"d{k % devices:02d}", session, k // devices + 1, now) for k in range(devices * per_device // 2)]
    later = [
        tel(f"d{k % devices:02d}", session, k // devices + 1, now)
        for k in range(devices * per_device // 2, devices * per_device)
    ]
    resent = first[devices : devices + 1000]  # a device re-sends what it had no PUBACK for: same (session, seq)
    n = devices * per_device
    log = tmp_path / "collectors.log"
    with Mosquitto(tmp_path / "broker") as broker:
        for cid in ("c1", "c2"):  # register both persistent sessions, then go away
            p = collect(broker, url, cid, log, "--duration", "0.5", "--client", client)
            assert p.wait(60) == 0, log.read_text()[-2000:]
        preload_qos1(broker.port, first)  # the broker splits them between the two sessions
        c1, c2 = (collect(broker, url, cid, log, "--client", client) for cid in ("c1", "c2"))
        try:
            wait_for(lambda: scalar(url, "SELECT count(*) FROM telemetry") >= 2000, 60, "2000 rows stored")
            c1.send_signal(signal.SIGKILL)
            c1.wait(30)
            killed_at = scalar(url, "SELECT count(*) FROM telemetry")
            assert killed_at < len(first) - devices, f"the kill came after the drain ({killed_at})"
            preload_qos1(broker.port, later + resent)  # while c1 is down: its share waits in its session
            time.sleep(1.0)
            c1 = collect(broker, url, "c1", log, "--client", client)
            wait_for(lambda: scalar(url, "SELECT count(*) FROM telemetry") >= n, 120, f"{n} rows stored")
            time.sleep(1.0)  # anything re-delivered late would show up now
        finally:
            outs = []
            for p in (c1, c2):
                p.send_signal(signal.SIGTERM)
                out, _ = p.communicate(timeout=60)
                outs.append(json.loads(out) if out.strip() else None)
    assert all(o is not None for o in outs), log.read_text()[-3000:]
    with open_db(url) as db:
        assert db.partitioned
        total, distinct = db.execute(
            "SELECT count(*), count(DISTINCT (device, session, seq)) FROM telemetry"
        ).fetchone()
        assert (total, distinct) == (n, n)
        assert db.execute("SELECT min(seq), max(seq) FROM telemetry").fetchone() == (1, per_device)
        missing = db.execute("SELECT coalesce(sum(max_seq - received), 0) FROM streams").fetchone()[0]
        assert missing == 0
        last = {r["device"]: r["last_seq"] for r in db.query("SELECT device, last_seq FROM devices")}
    assert last == {f"d{i:02d}": per_device for i in range(devices)}  # messages arrived out of order, split in two
    stored = sum(o["stored"]["telemetry"] for o in outs)
    assert stored <= n and sum(o["db_errors"] for o in outs) == 0
    assert sum(o["duplicates"] for o in outs) >= len(resent)  # the re-sent copies, recognised by the database
    assert min(o["stored"]["telemetry"] for o in outs) > 0, "both collectors took a share"


# PostgreSQL partitions and retention -------------------------------------------------------
def test_partitioned_postgresql_dedupes_across_days_and_prunes_whole_partitions(postgres_url: str) -> None:
    url = new_database(postgres_url, "parts")
    now = time.time()
    today = int(now // DAY)
    with open_db(url) as db:
        assert db.partitioned
        assert set(range(today - 1, today + 4)) <= set(db.partitions())
        kind = db.execute("SELECT relkind FROM pg_class WHERE relname = 'telemetry'").fetchone()[0]
        assert kind == "p"
    c = offline_collector(url)
    try:
        assert c.handle(*birth("cam", 100, now), received_at=now) == "stored"
        for seq, age_days in ((1, 45), (2, 40), (3, 31), (4, 29.5), (5, 10), (6, 0)):
            assert c.handle(*tel("cam", 100, seq, now), received_at=now - age_days * DAY) == "stored"
        c.flush()
        # the same (session, seq) arriving days later lands in another partition: still a duplicate
        for seq in (1, 3, 6):
            assert c.handle(*tel("cam", 100, seq, now), received_at=now) == "duplicate"
        assert c.handle(*tel("cam", 100, 7, now), received_at=now) == "stored"
        c.flush()
    finally:
        c.db.close()
    with open_db(url) as db:
        days = set(db.partitions())
        assert {today - 45, today - 40, today - 31, int((now - 29.5 * DAY) // DAY)} <= days  # made on demand
        assert db.execute("SELECT count(*) FROM telemetry").fetchone()[0] == 7
        rep = prune(db, parse_age("30d"), now=now)
        assert sorted(rep.dropped_partitions) == sorted(
            f"telemetry_p{time.strftime('%Y%m%d', time.gmtime(d * DAY))}" for d in (today - 45, today - 40, today - 31)
        )
        left = [r[0] for r in db.execute("SELECT seq FROM telemetry ORDER BY seq").fetchall()]
        assert left == [4, 5, 6, 7] and rep.deleted["telemetry"] == 3
        assert db.query("SELECT last_seq FROM devices")[0]["last_seq"] == 7  # devices are never pruned
        keyed = db.execute(
            "SELECT count(*) FROM pg_indexes WHERE tablename LIKE ? AND indexdef LIKE ?",
            ("telemetry_p%", "%(fleet, device, session, seq)"),
        ).fetchone()[0]
        assert keyed == len(db.partitions())  # every partition has the key index the duplicate lookup probes
    # the cut inside a partition: rows before it deleted, the partition kept
    with open_db(url) as db:
        rep = prune(db, 10 * DAY, now=now + 0.5 * DAY)
        assert rep.deleted["telemetry"] == 2  # seq 4 (29.5 days old: its partition dropped) and seq 5 (10 days)
        assert [r[0] for r in db.execute("SELECT seq FROM telemetry ORDER BY seq")] == [6, 7]


def test_partitioned_batch_mixing_new_rows_redeliveries_and_gap_fillers(postgres_url: str) -> None:
    """One batch of three kinds, in one insert: rows past the stream's stored max seq (copied in without a
    lookup), re-deliveries of stored rows and a late gap filler below max seq (both looked up by key)."""
    url = new_database(postgres_url, "mixed")
    now = time.time()
    c = offline_collector(url)
    try:
        for m in (birth("a", 100, now), birth("b", 100, now)):
            c.add(*m, received_at=now)
        for dev, seqs in (("a", (1, 2, 4, 5)), ("b", (1, 2))):
            for seq in seqs:
                c.add(*tel(dev, 100, seq, now), received_at=now)
        c.flush()  # a: max seq 5 with 3 missing; b: 1, 2
        # a: 5 and 2 again (stored), 3 (the gap), 6 (new); b: 1 again, 3, 4 (new); c: a stream with no row yet
        for dev, seq in (("a", 5), ("a", 3), ("b", 1), ("a", 2), ("b", 3), ("a", 6), ("b", 4), ("c", 1)):
            c.add(*tel(dev, 100, seq, now), received_at=now)
        new = c._write()
        c.flush()
        assert new == [False, True, False, False, True, True, True, True]
    finally:
        c.db.close()
    with open_db(url) as db:
        got = {(r[0], r[1]) for r in db.execute("SELECT device, seq FROM telemetry").fetchall()}
        assert got == {("a", s) for s in range(1, 7)} | {("b", s) for s in range(1, 5)} | {("c", 1)}
        assert db.execute("SELECT count(*) FROM telemetry").fetchone()[0] == len(got)  # nothing twice
        streams = {r[0]: r[1:] for r in db.execute("SELECT device, received, max_seq FROM streams").fetchall()}
        assert streams == {"a": (6, 6), "b": (4, 4), "c": (1, 1)}
        fps = db.execute("SELECT fps FROM telemetry WHERE device = 'a' AND seq = 3").fetchone()[0]
        assert fps == 3.0  # the gap filler's own values, through the lookup statement


def test_a_batch_refused_at_commit_is_not_counted_twice_when_redelivered(postgres_url: str) -> None:
    """The counters follow the database: a batch whose commit fails is rolled back and taken out of
    stats["stored"], so its re-delivery counts once (a deferred constraint trigger refuses the commit)."""
    url = new_database(postgres_url, "atcommit")
    now = time.time()
    with open_db(url) as db:
        db.execute("CREATE TABLE trap (armed BOOLEAN)")
        db.execute("INSERT INTO trap VALUES (TRUE)")
        db.execute(
            "CREATE FUNCTION trap() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF (SELECT armed FROM trap) THEN RAISE EXCEPTION 'refused at commit'; END IF; RETURN NULL; END $$"
        )
        db.execute(
            "CREATE CONSTRAINT TRIGGER trap AFTER INSERT OR UPDATE ON streams DEFERRABLE INITIALLY DEFERRED "
            "FOR EACH ROW EXECUTE FUNCTION trap()"
        )
        db.commit()
    msgs = [birth("cam", 100, now)] + [tel("cam", 100, seq, now) for seq in (1, 2, 3)]
    c = offline_collector(url)
    try:
        for m in msgs:
            c.add(*m, received_at=now)
        c.flush()  # the commit fails: rolled back
        assert c.stats["db_errors"] == 1
        assert c.stats["stored"] == {"birth": 0, "death": 0, "telemetry": 0, "state": 0}
        with open_db(url) as db:
            db.execute("UPDATE trap SET armed = FALSE")
            db.commit()
        for m in msgs:  # the broker's re-delivery
            c.add(*m, received_at=now)
        c.flush()
        assert c.stats["stored"] == {"birth": 1, "death": 0, "telemetry": 3, "state": 0}
        assert c.stats["duplicates"] == 0 and c.stats["db_errors"] == 1
    finally:
        c.db.close()
    with open_db(url) as db:
        assert db.execute("SELECT count(*) FROM telemetry").fetchone()[0] == 3


def test_an_unpartitioned_postgresql_database_keeps_working(postgres_url: str) -> None:
    """A database created before partitioning (telemetry a plain table with its primary key): used as it is."""
    import psycopg

    url = new_database(postgres_url, "legacy")
    with psycopg.connect(url) as c:  # the schema as the previous edgekit created it
        for stmt in SCHEMA:
            if "states_received" not in stmt:
                c.execute(stmt)
        c.execute("INSERT INTO meta(key, value) VALUES ('schema_version', '1')")
    now = time.time()
    c = offline_collector(url)
    try:
        assert not c.db.partitioned
        assert c.handle(*tel("cam", 100, 1, now), received_at=now - 40 * DAY) == "stored"
        assert c.handle(*tel("cam", 100, 2, now), received_at=now) == "stored"
        assert c.handle(*tel("cam", 100, 1, now), received_at=now) == "duplicate"
        c.flush()
    finally:
        c.db.close()
    p = run_cli("fleet", "prune", "--db", url, "--older-than", "30d", "--json")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["partitioned"] is False and rep["dropped_partitions"] == [] and rep["deleted"]["telemetry"] == 1
    assert scalar(url, "SELECT count(*) FROM telemetry") == 1
    c = offline_collector(url)
    try:
        assert c.handle(*tel("cam", 100, 3, now), received_at=now - 5 * DAY) == "stored"
        c.flush()
    finally:
        c.db.close()
    # converted on request, with the collectors stopped: the old rows stay, as one partition
    running = Collector(CollectorConfig(BrokerConfig("127.0.0.1", 1), url))
    try:
        assert_user_error(run_cli("fleet", "partition", "--db", url), "1 collector(s) are connected")
    finally:
        running.db.close()
    p = run_cli("fleet", "partition", "--db", url, "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["kept_in_legacy"] == 1 and json.loads(p.stdout)["moved"] == 1
    assert_user_error(run_cli("fleet", "partition", "--db", url), "already partitioned")
    c = offline_collector(url)
    try:
        assert c.db.partitioned
        assert c.handle(*tel("cam", 100, 3, now), received_at=now) == "duplicate"  # found in the legacy partition
        assert c.handle(*tel("cam", 100, 2, now), received_at=now) == "duplicate"  # found in a daily one
        assert c.handle(*tel("cam", 100, 4, now), received_at=now) == "stored"
        c.flush()
        assert [r[0] for r in c.db.execute("SELECT seq FROM telemetry ORDER BY seq")] == [2, 3, 4]
        assert c.db.execute("SELECT seq FROM telemetry_legacy").fetchall() == [(3,)]
        until = (int(now // DAY) - 1) * DAY  # the legacy partition ends where the first daily one starts
        rep2 = prune(c.db, now - (until + DAY / 2), now=now)  # a cut past its end: dropped whole
        assert "telemetry_legacy" in rep2.dropped_partitions
        assert [r[0] for r in c.db.execute("SELECT seq FROM telemetry ORDER BY seq")] == [2, 4]
    finally:
        c.db.close()


def test_prune_on_sqlite_and_its_cli(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/fleet.db"
    now = time.time()
    c = offline_collector(url)
    try:
        c.handle(*birth("old", 50, now), received_at=now - 60 * DAY)
        c.handle(*tel("old", 50, 1, now), received_at=now - 60 * DAY)
        c.handle(*birth("old", 60, now), received_at=now - 50 * DAY)  # a newer session of the same device
        c.handle(*tel("old", 60, 1, now), received_at=now - 50 * DAY)
        for seq in range(1, 4):
            c.handle(*tel("new", 70, seq, now), received_at=now - seq * 12 * DAY)  # 12, 24, 36 days ago
        c.flush()
        flag = "INSERT INTO stream_flags VALUES (?, ?, ?, 'seq_jump', 1, 9, 1, ?, ?)"
        c.db.execute(flag, ("lab", "old", 60, now - 50 * DAY, now - 40 * DAY))  # last refused 40 days ago
        c.db.execute(flag, ("lab", "new", 70, now - 50 * DAY, now - 1 * DAY))  # still refused yesterday
        c.db.commit()
    finally:
        c.db.close()
    p = run_cli("fleet", "prune", "--db", url, "--older-than", "30d")
    assert p.returncode == 0, p.stderr
    assert "3 telemetry" in p.stdout and "1 births" in p.stdout, p.stdout
    with open_db(url) as db:
        assert [r[0] for r in db.execute("SELECT seq FROM telemetry ORDER BY seq")] == [1, 2]
        assert db.execute("SELECT session FROM births").fetchall() == [(60,)]  # the current session's birth stays
        assert {r[0] for r in db.execute("SELECT device FROM devices")} == {"old", "new"}
        assert db.execute("SELECT count(*) FROM streams WHERE device = 'old'").fetchone()[0] == 1
        assert db.execute("SELECT device FROM stream_flags").fetchall() == [("new",)]
    p = run_cli("fleet", "status", "--db", url, "--limit", "1")  # at fleet scale the table shows a first page
    assert p.returncode == 0, p.stderr
    assert "1 more devices not shown" in p.stdout and "of 2 devices" in p.stdout
    assert parse_age("12h") == 43200 and parse_age("90m") == 5400 and parse_age("3600") == 3600
    with pytest.raises(EdgeError, match="bad age"):
        parse_age("30 days")
    assert_user_error(run_cli("fleet", "prune", "--db", url, "--older-than", "-1d"), "bad age")
    assert_user_error(
        run_cli("fleet", "prune", "--db", f"sqlite:///{tmp_path}/none.db", "--older-than", "30d"), "does not exist"
    )


# beyond one broker -------------------------------------------------------------------------
def run_fleet(
    broker_url: str, collector_broker: str, db: Path, *, protocol: str = "5", devices: int = 20
) -> tuple[Collector, int]:
    """A collector on ``collector_broker``, ``devices`` simulated agents on ``broker_url`` for about a second."""
    col = Collector(
        CollectorConfig(
            BrokerConfig.from_url(collector_broker, protocol=protocol),
            f"sqlite:///{db}",
            client_id="edgekit-test-collector",
            batch_interval_ms=20,
        )
    ).start()
    wait_for(lambda: col.connected, what="collector connected")
    time.sleep(0.3)  # its SUBACK
    fleet = SimulatedFleet(
        BrokerConfig.from_url(broker_url, protocol=protocol), devices=devices, rate_hz=10.0, connect_per_s=400
    ).start()
    try:
        wait_for(lambda: fleet.connected() == devices, what=f"{devices} devices connected")
        time.sleep(0.3)  # their SUBACKs (cmd/+)
        # and the way back: a command from the collector's broker reaches a device
        assert col.loop is not None and col.loop.run(col.request_rebirth, "sim", "dev-00001", "test")
        wait_for(
            lambda: fleet.loop.run(lambda: fleet.sessions[1].counters["rebirth_requests"]) == 1,
            what="the rebirth command delivered to the device",
        )
        wait_for(lambda: fleet.submitted >= 10 * devices, what="a second of telemetry made")
        fleet.pause()
        made = fleet.submitted
        wait_for(lambda: fleet.pending() == 0, 30, "every outbox acknowledged")
        url = f"sqlite:///{db}"
        wait_for(lambda: scalar(url, "SELECT count(*) FROM telemetry") >= made, 30, "all telemetry stored")
    finally:
        fleet.stop()
    wait_for(lambda: scalar(f"sqlite:///{db}", "SELECT count(*) FROM deaths") >= devices, 30, "shutdown deaths")
    return col, made


@pytest.mark.parametrize(
    "bridge_protocol, topics",
    [("mqttv311", BRIDGE_TOPICS), ("mqttv50", BRIDGE_TOPICS), ("mqttv50", ("edgekit/# both 1",))],
)
def test_site_broker_bridged_to_a_central_one(tmp_path: Path, bridge_protocol: str, topics: tuple[str, ...]) -> None:
    """Agents on a site Mosquitto, the collector on a central one, a Mosquitto bridge between them (``out`` for
    what devices publish and ``in`` for commands, or one ``both``: nothing comes back over the bridge twice)."""
    db = tmp_path / "fleet.db"
    with Mosquitto(tmp_path / "central") as central:
        with Mosquitto(
            tmp_path / "site", extra=bridge_config(central, protocol=bridge_protocol, topics=topics)
        ) as site:
            wait_for(lambda: "as edgekit-bridge-central-" in central.log(), what="the bridge connected")
            col, made = run_fleet(site.url, central.url, db)
            stats = col.snapshot()
            col.stop()
    url = f"sqlite:///{db}"
    assert scalar(url, "SELECT count(*) FROM telemetry") == made
    assert scalar(url, "SELECT count(DISTINCT device) FROM births") == 20
    assert stats["duplicates"] == 0 and stats["db_errors"] == 0
    st = fleet_status(url)
    assert len(st) == 20 and {r["status"] for r in st} == {"offline"} and all(r["missing"] == 0 for r in st)


def test_agents_and_collector_on_mqtt_3_1_1(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Both sides speak MQTT 3.1.1: everything arrives once; what MQTT 5 would add is said in one line each."""
    db = tmp_path / "fleet.db"
    caplog.set_level(logging.WARNING)
    from edge.mqtt import session as agent_session

    agent_session._say_degraded.cache_clear()  # once per process: this test wants to see it
    with Mosquitto(tmp_path / "broker") as broker:
        col, made = run_fleet(broker.url, broker.url, db, protocol="3.1.1", devices=10)
        assert col.subscription == "edgekit/+/+/+"  # no $share on 3.1.1
        stats = col.snapshot()
        col.stop()
        log = broker.log()
    assert scalar(f"sqlite:///{db}", "SELECT count(*) FROM telemetry") == made
    assert stats["duplicates"] == 0
    # Mosquitto names each client's protocol: p2 is MQTT 3.1.1, p5 MQTT 5
    assert "as edgekit-test-collector (p2," in log and "as edgekit-sim-dev-00000 (p2," in log, log[-2000:]
    degraded = [r.getMessage() for r in caplog.records if r.getMessage().startswith("MQTT 3.1.1:")]
    assert len(degraded) == 2 and any("no shared subscription" in m for m in degraded)
    with pytest.raises(EdgeError, match="unknown MQTT protocol"):
        BrokerConfig.from_url(broker.url, protocol="4")
    from edge.agent.main import build_parser, config_from  # the agent's own entry point takes it too

    ns = build_parser().parse_args(["--device-id", "d", "--store", str(tmp_path), "--protocol", "3.1.1"])
    assert config_from(ns).broker.protocol == "3.1.1"
    assert_user_error(
        run_cli("fleet", "collect", "--broker", "mqtt://127.0.0.1:1", "--protocol", "3.1"), "unknown MQTT protocol"
    )


def test_an_oversized_message_on_mqtt_3_1_1_is_counted_not_a_reconnect_loop(tmp_path: Path) -> None:
    """A 3.1.1 broker has no Maximum Packet Size to honour and sends a 2 MiB message to the collector, whose lean
    client reads at most 1 MiB a packet: it used to drop the connection, get the message re-delivered on
    reconnect, and loop for ever, every device's telemetry stuck behind it. Now it is counted as oversized,
    acknowledged, and what follows is stored; the collector connected once."""
    db = tmp_path / "fleet.db"
    now = time.time()
    with Mosquitto(tmp_path / "broker") as broker:
        col = Collector(
            CollectorConfig(
                BrokerConfig.from_url(broker.url, protocol="3.1.1"),
                f"sqlite:///{db}",
                client_id="edgekit-test-collector",
                batch_interval_ms=20,
            )
        ).start()
        try:
            wait_for(lambda: col.connected, what="collector connected")
            time.sleep(0.3)  # its SUBACK
            big = ("edgekit/lab/d1/telemetry", b"x" * (2 << 20))
            preload_qos1(broker.port, [birth("d1", 1, now), big, tel("d1", 1, 1, now), tel("d1", 1, 2, now)])
            url = f"sqlite:///{db}"
            wait_for(lambda: scalar(url, "SELECT count(*) FROM telemetry") == 2, 30, "the two telemetry messages")
            stats = col.snapshot()
        finally:
            col.stop()
        log = broker.log()
    assert stats["rejected"]["oversized"] == 1, stats["rejected"]
    assert log.count("as edgekit-test-collector (p2,") == 1, log[-2000:]
