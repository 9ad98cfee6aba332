"""The agent and the collector against a real Mosquitto: nothing lost, nothing stored twice, TLS enforced."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from edge.agent.agent import Agent, AgentConfig
from edge.bundle.bundle import Bundle
from edge.deploy import DeviceStore
from edge.fleet.collector import Collector, CollectorConfig
from edge.fleet.simulate import SimulatedFleet
from edge.fleet.status import fleet_status
from edge.mqtt.client import BrokerConfig
from edge.mqtt.identity import DeviceIdentity
from edge.mqtt.netloop import Backoff, Connection, ConnectOptions, NetworkLoop
from edge.mqtt.payloads import load_schema
from edge.pipeline import convert
from tests.support.cli import EDGEKIT, wait_for
from tests.support.mqtt_broker import Mosquitto, make_ca, password_file

FAST = Backoff(0.05, 0.5)


pytestmark = pytest.mark.usefixtures("no_leaked_threads")  # tests/conftest.py


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory: pytest.TempPathFactory, models: dict[str, Path]) -> Bundle:
    return convert(models["tiny"], "x86-cpu", tmp_path_factory.mktemp("bundle") / "tiny")


def make_store(root: Path, bundle: Bundle | None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if bundle is not None:
        DeviceStore(root).install(bundle)
    return root


def rows(db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db, timeout=10) as c:
        return c.execute(sql, params).fetchall()


def count(db: Path, sql: str, *params: Any) -> int:
    """For polling: 0 while the collector has not created the database yet."""
    try:
        return int(rows(db, sql, *params)[0][0]) if db.exists() else 0
    except sqlite3.OperationalError:
        return 0


def collector_for(url: str, db: Path, **kw: Any) -> Collector:
    return Collector(
        CollectorConfig(
            BrokerConfig.from_url(url, **kw), f"sqlite:///{db}", backoff=FAST, rebirth_interval_s=0.5, gap_grace_s=0.0
        )
    ).start()


# A small JSON Schema checker, so the test needs no extra package and always runs. It covers the keywords the
# published schema uses and refuses any other (a schema change that adds one fails here, never passes unchecked).
CHECKED = {
    "$ref",
    "type",
    "const",
    "enum",
    "minimum",
    "minLength",
    "maxLength",
    "pattern",
    "allOf",
    "oneOf",
    "required",
    "properties",
    "additionalProperties",
}
ANNOTATIONS = {"$schema", "$id", "$defs", "title", "description"}


def schema_errors(inst: Any, sch: dict[str, Any], root: dict[str, Any], path: str = "$") -> list[str]:
    unknown = set(sch) - CHECKED - ANNOTATIONS
    assert not unknown, f"schema_errors does not check {sorted(unknown)}: extend it"
    if "$ref" in sch:
        ref = root
        for part in sch["$ref"].lstrip("#/").split("/"):
            ref = ref[part]
        errs = schema_errors(inst, ref, root, path)
        sch = {k: v for k, v in sch.items() if k != "$ref"}
        return errs + schema_errors(inst, sch, root, path)
    errs: list[str] = []
    types = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
    if "type" in sch:
        allowed = sch["type"] if isinstance(sch["type"], list) else [sch["type"]]

        def ok(t: str) -> bool:
            if t == "integer":
                return type(inst) is int
            if t == "number":
                return type(inst) in (int, float)
            return isinstance(inst, types[t]) and not (t != "boolean" and isinstance(inst, bool))

        if not any(ok(t) for t in allowed):
            return [f"{path}: {inst!r} is not {allowed}"]
    if "const" in sch and inst != sch["const"]:
        errs.append(f"{path}: {inst!r} != {sch['const']!r}")
    if "enum" in sch and inst not in sch["enum"]:
        errs.append(f"{path}: {inst!r} not in {sch['enum']}")
    if "minimum" in sch and type(inst) in (int, float) and inst < sch["minimum"]:
        errs.append(f"{path}: {inst} < {sch['minimum']}")
    if isinstance(inst, str):
        if len(inst) < sch.get("minLength", 0) or len(inst) > sch.get("maxLength", 1 << 30):
            errs.append(f"{path}: length")
        if "pattern" in sch and not re.search(sch["pattern"], inst):
            errs.append(f"{path}: pattern")
    for sub in sch.get("allOf", []):
        errs += schema_errors(inst, sub, root, path)
    if "oneOf" in sch:
        n = sum(not schema_errors(inst, sub, root, path) for sub in sch["oneOf"])
        if n != 1:
            errs.append(f"{path}: matches {n} of oneOf")
    if isinstance(inst, dict):
        errs += [f"{path}: missing {k}" for k in sch.get("required", []) if k not in inst]
        for k, v in inst.items():
            if k in sch.get("properties", {}):
                errs += schema_errors(v, sch["properties"][k], root, f"{path}.{k}")
            elif isinstance(sch.get("additionalProperties"), dict):
                errs += schema_errors(v, sch["additionalProperties"], root, f"{path}.{k}")
            elif sch.get("additionalProperties") is False:
                errs.append(f"{path}: unexpected {k}")
    return errs


def test_schema_checker_finds_what_is_wrong() -> None:
    # the checker the payload test relies on must be able to fail: each kind of fault, one at a time
    root = {
        "$defs": {"n": {"type": "integer", "minimum": 0}},
        "type": "object",
        "required": ["kind", "n"],
        "additionalProperties": False,
        "properties": {
            "kind": {"enum": ["a", "b"]},
            "v": {"const": 1},
            "n": {"$ref": "#/$defs/n"},
            "id": {"type": "string", "minLength": 2, "maxLength": 4, "pattern": "^x"},
            "m": {"type": "object", "additionalProperties": {"type": ["number", "null"]}},
            "o": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
        },
    }
    good = {"kind": "a", "v": 1, "n": 3, "id": "xy", "m": {"p": 1.5, "q": None}, "o": 2}
    assert schema_errors(good, root, root) == []
    for bad, why in (
        (dict(good, kind="c"), "not in"),
        (dict(good, v=2), "!="),
        (dict(good, n=-1), "< 0"),
        (dict(good, n=True), "is not ['integer']"),
        (dict(good, n=1.5), "is not ['integer']"),
        (dict(good, id="yy"), "pattern"),
        (dict(good, id="x"), "length"),
        (dict(good, id="xxxxx"), "length"),
        (dict(good, m={"p": "1"}), "$.m.p"),
        (dict(good, o=1.5), "matches 0 of oneOf"),
        ({k: v for k, v in good.items() if k != "n"}, "missing n"),
        (dict(good, extra=1), "unexpected extra"),
    ):
        errs = schema_errors(bad, root, root)
        assert any(why in e for e in errs), (bad, errs)
    with pytest.raises(AssertionError, match="does not check"):
        schema_errors({}, {"type": "object", "minProperties": 1}, {})


def test_agent_reports_and_every_payload_matches_the_schema(
    broker: Mosquitto, tiny_bundle: Bundle, tmp_path: Path
) -> None:
    db = tmp_path / "fleet.db"
    col = collector_for(broker.url, db)
    wait_for(lambda: col.connected, what="collector connected")
    cfg = dict(broker=BrokerConfig.from_url(broker.url), interval_s=0.2, backoff=FAST, fps=200.0)
    a1 = Agent(AgentConfig("lab", "cam-01", store=make_store(tmp_path / "s1", tiny_bundle), **cfg)).start()
    a2 = Agent(AgentConfig("lab", "cam-02", store=make_store(tmp_path / "s2", None), **cfg)).start()  # nothing deployed
    try:
        wait_for(
            lambda: (
                rows(db, "SELECT count(*) FROM telemetry WHERE device = 'cam-01' AND p99_ms IS NOT NULL")[0][0] >= 4
            ),
            what="cam-01 telemetry with latency",
        )
        status = {r["device"]: r for r in fleet_status(f"sqlite:///{db}")}
        assert status["cam-01"]["status"] == "online" and status["cam-01"]["bundle_id"] == tiny_bundle.id
        assert status["cam-01"]["runtime"].startswith("onnxruntime") and status["cam-01"]["device_used"]
        assert status["cam-01"]["fps"] > 50 and status["cam-02"]["state"] == "idle"
    finally:
        assert a1.stop() and a2.stop()  # flushed: the broker acknowledged everything
        # the deaths are the last messages of both streams: once stored, everything before them is
        wait_for(
            lambda: count(db, "SELECT count(*) FROM deaths WHERE device IN ('cam-01', 'cam-02')") == 2,
            what="both deaths stored",
        )
        col.stop()
    status = {r["device"]: r for r in fleet_status(f"sqlite:///{db}")}
    assert status["cam-01"]["status"] == "offline" and status["cam-01"]["death_reason"] == "shutdown"
    assert all(s["missing"] == 0 for s in status.values()), status
    # each agent made its identity key at its first start (0600) and signed its births and death with it: the
    # collector pinned the key and refused nothing (edge.mqtt.identity, edge.fleet.device_keys)
    key = tmp_path / "s1" / "agent" / "device-key.pem"
    assert key.stat().st_mode & 0o777 == 0o600
    assert status["cam-01"]["key"]["key_id"] == DeviceIdentity.load_or_create(key.parent).key_id
    assert all(s["key"]["refused"] == 0 for s in status.values()), status
    schema = load_schema()
    payloads = [
        json.loads(p)
        for (p,) in rows(
            db,
            "SELECT payload FROM births UNION ALL SELECT payload FROM telemetry "
            "UNION ALL SELECT payload FROM states UNION ALL SELECT payload FROM deaths",
        )
    ]
    assert {p["type"] for p in payloads} == {"birth", "telemetry", "state", "death"}
    for p in payloads:
        assert not schema_errors(p, schema, schema), (schema_errors(p, schema, schema), p)
    birth = next(p for p in payloads if p["type"] == "birth" and p["device"] == "cam-01")
    assert (
        birth["bundle"]["id"] == tiny_bundle.id
        and birth["host"]["cpu_count"] >= 1
        and birth["agent"]["edgekit_version"]
    )
    tel = [p for p in payloads if p["type"] == "telemetry" and p["device"] == "cam-01"]
    # the last window (sent at stop, after inference ended) may hold no frame: its latency is null then
    timed = [p for p in tel if p["inference"]["latency_ms"] is not None]
    assert all(p["process"]["rss_mb"] > 0 for p in tel) and timed and timed[-1]["inference"]["latency_ms"]["p99_ms"] > 0


def stream_seqs(db: Path, device: str, session: int) -> list[int]:
    return [
        s
        for (s,) in rows(
            db,
            "SELECT seq FROM telemetry WHERE device = ? AND session = ? UNION ALL "
            "SELECT seq FROM states WHERE device = ? AND session = ? ORDER BY 1",
            device,
            session,
            device,
            session,
        )
    ]


def test_broker_restart_every_message_stored_exactly_once(
    broker: Mosquitto, tiny_bundle: Bundle, tmp_path: Path
) -> None:
    db = tmp_path / "fleet.db"
    col = collector_for(broker.url, db)
    wait_for(lambda: col.connected, what="collector connected")
    agent = Agent(
        AgentConfig(
            "lab",
            "cam-01",
            BrokerConfig.from_url(broker.url),
            make_store(tmp_path / "s", tiny_bundle),
            interval_s=0.1,
            backoff=FAST,
            fps=100.0,
        )
    ).start()
    try:
        wait_for(lambda: rows(db, "SELECT count(*) FROM telemetry")[0][0] >= 5, what="telemetry before the restart")
        broker.restart(down_s=1.0)  # ~10 telemetry messages are made while the broker is down
        wait_for(
            lambda: rows(db, "SELECT count(*) FROM telemetry WHERE historical")[0][0] >= 5, what="replayed messages"
        )
        live = rows(db, "SELECT count(*) FROM telemetry WHERE NOT historical")[0][0]
        wait_for(
            lambda: rows(db, "SELECT count(*) FROM telemetry WHERE NOT historical")[0][0] >= live + 3,
            what="live telemetry after the replay",
        )
    finally:
        assert agent.stop(), "outbox not flushed"
        session, last = agent.session.session, agent.session.seq  # type: ignore[union-attr]
    wait_for(lambda: len(stream_seqs(db, "cam-01", session)) >= last, what="every message stored")
    wait_for(
        lambda: count(db, "SELECT count(*) FROM deaths WHERE session = ? AND reason = 'shutdown'", session) == 1,
        what="the death, the stream's last message",
    )
    stats = col.snapshot()
    col.stop()
    assert stream_seqs(db, "cam-01", session) == list(range(1, last + 1)), "lost or stored twice"
    assert sum(stats["stored"].values()) - stats["stored"]["birth"] - stats["stored"]["death"] == last
    assert [r["missing"] for r in fleet_status(f"sqlite:///{db}")] == [0]


def outbox_pending(store: Path) -> list[tuple[int, int]]:
    with sqlite3.connect(store / "agent" / "outbox.sqlite") as c:
        return [(json.loads(p)["session"], json.loads(p)["seq"]) for (p,) in c.execute("SELECT payload FROM outbox")]


def start_cli_agent(url: str, store: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    # --flush-timeout 60: on a loaded 2-core host the default 10 s for the last acknowledgements was once too short
    return subprocess.Popen(
        [
            EDGEKIT,
            "agent",
            "--device-id",
            "cam-01",
            "--fleet",
            "lab",
            "--broker",
            url,
            "--store",
            str(store),
            "--interval",
            "0.1",
            "--fps",
            "100",
            "--reconnect-max",
            "0.3",
            "--flush-timeout",
            "60",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=open(log, "ab"),
        env=env,
    )


def test_sigkill_and_restart_the_outbox_replays_nothing_twice(
    broker: Mosquitto, tiny_bundle: Bundle, tmp_path: Path
) -> None:
    db, store, log = tmp_path / "fleet.db", make_store(tmp_path / "store", tiny_bundle), tmp_path / "agent.log"
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    collect = subprocess.Popen(
        [
            EDGEKIT,
            "fleet",
            "collect",
            "--broker",
            broker.url,
            "--db",
            f"sqlite:///{db}",
            "--reconnect-max",
            "0.3",
            "--rebirth-interval",
            "1",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / "collect.log", "ab"),
        env=env,
    )
    procs = [collect]
    try:
        # run 1: killed while connected -> the broker publishes its last will
        a = start_cli_agent(broker.url, store, log)
        procs.append(a)
        wait_for(lambda: count(db, "SELECT count(*) FROM telemetry") >= 3, 30, "run 1 telemetry")
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        wait_for(
            lambda: count(db, "SELECT count(*) FROM deaths WHERE reason LIKE '%last will%'") == 1, 10, "the last will"
        )
        assert [r["status"] for r in fleet_status(f"sqlite:///{db}")] == ["offline"]
        made = set(outbox_pending(store))
        # run 2: the broker is down; telemetry goes to the outbox; killed again
        broker.stop()
        a = start_cli_agent(broker.url, store, log)
        procs.append(a)
        wait_for(lambda: len(outbox_pending(store)) >= 10, 30, "run 2 spooling")
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        made |= set(outbox_pending(store))
        sessions = sorted({s for s, _ in made})
        # run 3: broker back; the outbox of run 2 replays; then a clean SIGTERM
        broker.start()
        a = start_cli_agent(broker.url, store, log)
        procs.append(a)
        wait_for(
            lambda: all(set(stream_seqs(db, "cam-01", s)) >= {q for ss, q in made if ss == s} for s in sessions),
            30,
            "the spooled messages of runs 1-2",
        )
        marks = ",".join("?" * len(sessions))
        wait_for(
            lambda: (
                count(
                    db, f"SELECT count(*) FROM telemetry WHERE session NOT IN ({marks}) AND NOT historical", *sessions
                )
                >= 3
            ),
            30,
            "live telemetry from run 3",
        )
        a.send_signal(signal.SIGTERM)
        out, _ = a.communicate(timeout=90)
        assert a.returncode == 0, log.read_text()[-2000:]
        summary = json.loads(out)
        assert summary["outbox_flushed"] is True and summary["replayed"] >= 10
        wait_for(lambda: len(stream_seqs(db, "cam-01", summary["session"])) >= summary["last_seq"], 30, "run 3 stored")
        wait_for(
            lambda: (
                count(db, "SELECT count(*) FROM deaths WHERE session = ? AND reason = 'shutdown'", summary["session"])
                == 1
            ),
            30,
            "run 3's death",
        )
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        cout, _ = collect.communicate(timeout=30)
        for p in procs:
            p.wait(10)
    assert collect.returncode == 0, (tmp_path / "collect.log").read_text()[-2000:]
    stats = json.loads(cout)
    all_sessions = [s for (s,) in rows(db, "SELECT DISTINCT session FROM telemetry ORDER BY 1")]
    assert len(all_sessions) == 3
    for s in all_sessions:  # every run's stream complete from 1, each message once (the key forbids twice)
        seqs = stream_seqs(db, "cam-01", s)
        assert seqs == list(range(1, seqs[-1] + 1)), (s, seqs)
    assert (
        rows(
            db,
            "SELECT (SELECT count(*) FROM telemetry WHERE historical) + (SELECT count(*) FROM states WHERE historical)",
        )[0][0]
        >= 10
    )
    assert stats["rejected"] == {k: 0 for k in stats["rejected"]} and stats["db_errors"] == 0
    final = fleet_status(f"sqlite:///{db}")[0]
    assert final["status"] == "offline" and final["death_reason"] == "shutdown" and final["missing"] == 0


def test_collector_that_missed_the_birth_asks_for_a_rebirth(
    broker: Mosquitto, tiny_bundle: Bundle, tmp_path: Path
) -> None:
    db = tmp_path / "fleet.db"
    agent = Agent(
        AgentConfig(
            "lab",
            "cam-01",
            BrokerConfig.from_url(broker.url),
            make_store(tmp_path / "s", tiny_bundle),
            interval_s=0.1,
            backoff=FAST,
            source="none",
        )
    ).start()
    try:
        wait_for(lambda: agent.session and agent.session.counters["unmatched"] >= 1, what="a message nobody took")
        # The broker forgets the retained birth (as one restarted without persistence does; and brokers that
        # follow MQTT 5 never deliver retained messages on shared subscriptions at all).
        acked: set[int] = set()
        clear = Connection(
            agent.loop,
            BrokerConfig.from_url(broker.url),
            "clearer",
            options=ConnectOptions(backoff=FAST),
            on_published=lambda _c, mid, _rc: acked.add(mid),
        )
        clear.start()
        wait_for(lambda: clear.connected, what="clearer connected")
        mid = agent.loop.run(clear.publish, "edgekit/lab/cam-01/birth", b"", 1, True)  # type: ignore[union-attr]
        assert mid is not None
        wait_for(lambda: mid in acked, what="the broker's PUBACK for the cleared birth")
        agent.loop.run(clear.close)  # type: ignore[union-attr]
        col = collector_for(broker.url, db)
        try:
            wait_for(lambda: col.stats["rebirths_sent"] >= 1, what="a rebirth request")
            wait_for(lambda: [r["status"] for r in fleet_status(f"sqlite:///{db}")] == ["online"], what="online")
            assert fleet_status(f"sqlite:///{db}")[0]["bundle_id"] == tiny_bundle.id
            assert agent.session.counters["rebirth_requests"] >= 1  # type: ignore[union-attr]
        finally:
            agent.stop()
            wait_for(
                lambda: count(db, "SELECT count(*) FROM deaths WHERE device = 'cam-01'") == 1, what="the death stored"
            )
            col.stop()
    finally:
        agent.close()
    seqs = stream_seqs(db, "cam-01", agent.session.session)  # type: ignore[union-attr]
    assert seqs == list(range(1, seqs[-1] + 1)) and len(seqs) >= 2  # held while nobody listened, then delivered


def try_connect(url: str, **kw: Any) -> tuple[bool, str | None]:
    """Connected, or the error of the first failed attempt; waiting for one or the other (a slow host is no refusal)."""
    with NetworkLoop() as loop:
        conn = Connection(loop, BrokerConfig.from_url(url, **kw), "probe", options=ConnectOptions(backoff=FAST))
        conn.start()
        wait_for(lambda: conn.connected or conn.last_error, 30, "a connection or a connection error")
        ok, err = conn.connected, conn.last_error
        loop.run(conn.close)
        conn.closed.wait(2)
    return ok, err


def test_tls_and_passwords(tiny_bundle: Bundle, tmp_path: Path) -> None:
    tls = make_ca(tmp_path / "pki")
    other = make_ca(tmp_path / "other-pki", name="someone-else")
    users = password_file(tmp_path / "passwd", {"cam-01": "device-secret", "collector": "collector-secret"})
    (tmp_path / "dev.pw").write_text("device-secret\n")
    (tmp_path / "col.pw").write_text("collector-secret\n")
    with Mosquitto(tmp_path / "broker", tls=tls, require_certificate=True, passwords=users) as b:
        good = dict(ca_file=tls.ca, cert_file=tls.client_cert, key_file=tls.client_key)
        ok, err = try_connect(
            b.url,
            ca_file=other.ca,
            cert_file=other.client_cert,
            key_file=other.client_key,
            username="cam-01",
            password_file=tmp_path / "dev.pw",
        )
        assert not ok and "CERTIFICATE_VERIFY_FAILED" in str(err), err  # a client without the right CA is refused
        # without a client certificate the broker ends the TLS session before any CONNACK: paho reports the
        # dropped connection as "Unspecified error"; the broker's log says why
        ok, err = try_connect(b.url, ca_file=tls.ca, username="cam-01", password_file=tmp_path / "dev.pw")
        assert not ok and err == "Unspecified error", err
        wait_for(lambda: "peer did not return a certificate" in b.log(), what="the broker's no-certificate error")
        (tmp_path / "bad.pw").write_text("wrong\n")
        ok, err = try_connect(b.url, **good, username="cam-01", password_file=tmp_path / "bad.pw")
        assert not ok and err == "broker refused the connection: Not authorized", err
        plain = b.url.replace("mqtts://", "mqtt://")
        ok, err = try_connect(plain, username="cam-01", password_file=tmp_path / "dev.pw")
        assert not ok and err == "Unspecified error", err  # plain MQTT on a TLS listener: no CONNACK either
        wait_for(lambda: "wrong version number" in b.log(), what="the broker's not-TLS error")
        db = tmp_path / "fleet.db"
        col = collector_for(b.url, db, **good, username="collector", password_file=tmp_path / "col.pw")
        agent = Agent(
            AgentConfig(
                "lab",
                "cam-01",
                BrokerConfig.from_url(b.url, **good, username="cam-01", password_file=tmp_path / "dev.pw"),
                make_store(tmp_path / "s", tiny_bundle),
                interval_s=0.1,
                backoff=FAST,
                source="none",
            )
        ).start()
        try:
            wait_for(lambda: count(db, "SELECT count(*) FROM telemetry") >= 3, what="telemetry over TLS")
        finally:
            agent.stop()
            col.stop()


def test_simulated_fleet_end_to_end(broker: Mosquitto, tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    col = collector_for(broker.url, db)
    wait_for(lambda: col.connected, what="collector connected")
    fleet = SimulatedFleet(BrokerConfig.from_url(broker.url), devices=40, rate_hz=5.0, connect_per_s=400).start()
    try:
        wait_for(lambda: fleet.connected() == 40, what="40 devices connected")
        wait_for(lambda: fleet.submitted >= 200, what="200 telemetry messages made (1 s of the fleet)")
        fleet.pause()
        made = fleet.submitted
        wait_for(lambda: rows(db, "SELECT count(*) FROM telemetry")[0][0] >= made, what="all telemetry stored")
        assert len(fleet_status(f"sqlite:///{db}")) == 40
    finally:
        fleet.stop()
        wait_for(
            lambda: count(db, "SELECT count(DISTINCT device) FROM deaths WHERE reason = 'shutdown'") == 40,
            30,
            "40 shutdown deaths stored",
        )
        col.stop()
    assert rows(db, "SELECT count(*) FROM telemetry")[0][0] == made
    st = fleet_status(f"sqlite:///{db}")
    assert {r["status"] for r in st} == {"offline"} and all(r["missing"] == 0 for r in st)
