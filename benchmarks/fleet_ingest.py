"""Fleet telemetry ingest: the collector's drain capacity, and end-to-end delay under a live simulated fleet.

Drain (capacity of the collector alone): the collector's persistent session is registered
(MQTT 5, clean_start false, session expiry), the collector is down, and a raw MQTT publisher
pre-loads the broker with N QoS 1 messages (a birth per device, then telemetry round-robin
over the devices) that the broker holds for the session. Then `edgekit fleet collect` starts
and drains them; capacity = messages / (last received_at - first received_at), read from the
database it wrote (the collector's own clock, start-up excluded). Then: every message stored
exactly once (count, streams without gaps, collector duplicates 0).

Live (end-to-end delay): Mosquitto, the collector and N simulated devices (the agent's own
DeviceSession per device, one real MQTT connection each, one network thread for all) on this
machine. End-to-end delay = collector's receive time - the device's message timestamp. ``--sim light``
(``edge.fleet.simulate.LightFleet``): still one real MQTT connection per device with its own birth, seq,
ts, will and death, but pre-encoded payloads and no outbox, so 10,000 devices fit on 2 cores beside the
collector.

    .venv/bin/python benchmarks/fleet_ingest.py                                  # both: drain 200,000 + live 1,000 x 1 Hz
    .venv/bin/python benchmarks/fleet_ingest.py --mode drain --db sqlite,postgresql
    .venv/bin/python benchmarks/fleet_ingest.py --mode live --devices 10000 --duration 60 --sim light --connect-rate 1000
    .venv/bin/python benchmarks/fleet_ingest.py --mode drain --variant src=/tmp/old --variant '' --repeat 3
    .venv/bin/python benchmarks/fleet_ingest.py --mode decode                    # json vs orjson vs msgspec
    .venv/bin/python benchmarks/fleet_ingest.py --mode drain --variant collectors=1 --variant collectors=2
    .venv/bin/python benchmarks/fleet_ingest.py --mode drain --profile drain.prof  # collector in-process, cProfile

``--variant`` runs the drain once per variant, interleaved round-robin ``--repeat`` times, so
variants compare under the same load: comma-separated ``src=DIR`` (another source tree's
collector, e.g. ``git archive HEAD edge | tar -x -C DIR``), ``sync=off|normal|full`` (SQLite),
``batch=N``, ``interval=MS``, ``receive=N`` (the collector's options), ``collectors=N`` (N collector
processes in one shared-subscription group, as ``--collectors``), ``protocol=3.1.1`` (the collector on MQTT
3.1.1: no shared subscription, and paho parses no MQTT 5 properties); ``''`` is the defaults;
``paho`` is the MQTT client alone (paho on the collector's network loop, acknowledging every
message at once, nothing decoded or stored): the ceiling of a paho-based collector; ``lite`` the same
with the lean client (edge.mqtt.lite); ``client=lite`` the collector on the lean client; ``pipeline=off`` the collector writing on its network thread
(``fleet collect --client lite``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.support: the brokers and databases the tests run

from edge.capabilities import measured_on  # noqa: E402
from edge.fleet.db import open_db  # noqa: E402
from edge.fleet.simulate import LightFleet, SimulatedFleet, birth_body, telemetry_body  # noqa: E402
from edge.mqtt.client import BrokerConfig  # noqa: E402
from edge.mqtt.payloads import encode, message  # noqa: E402
from tests.support.mqtt_broker import Mosquitto, mosquitto_binary, preload_qos1  # noqa: E402

CLIENT_ID = "edgekit-bench-collector"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU of a process and its direct children (PostgreSQL: the postmaster and its backends)."""
    total = cpu_seconds(pid)
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except (OSError, IndexError):
                pass
    return total


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def pct(a: list[float], q: float) -> float:
    if not a:
        return float("nan")
    a = sorted(a)
    k = (len(a) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(a) - 1)
    return a[lo] + (a[hi] - a[lo]) * (k - lo)


def scalar(db_url: str, sql: str, *params: Any) -> Any:
    try:
        with open_db(db_url, must_exist=True) as db:
            return db.execute(sql, params).fetchone()[0]
    except Exception:  # not created yet, or locked for a moment
        return None


def stored_count(db_url: str) -> int:
    return int(scalar(db_url, "SELECT count(*) FROM telemetry") or 0)


def missing_in_streams(db_url: str) -> int:
    return int(
        scalar(
            db_url,
            "SELECT coalesce(sum(CASE WHEN max_seq > announced_seq THEN max_seq ELSE "
            "announced_seq END - received), 0) FROM streams",
        )
        or 0
    )


# databases ------------------------------------------------------------------------------
class Databases:
    """A fresh database URL per run: SQLite files in ``work``, or databases on one throw-away PostgreSQL."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self._pg: Any = None
        self._pg_url = ""
        self.n = 0

    def new(self, kind: str, sync: str | None = None) -> str:
        self.n += 1
        if kind == "sqlite":
            return f"sqlite:///{self.work}/fleet-{self.n}.db" + (f"?synchronous={sync}" if sync else "")
        if self._pg is None:
            from tests.support.pg_server import PostgresServer

            self._pg = PostgresServer(durable=True)  # fsync on: what a real server does
            self._pg_url = self._pg.start()
        import psycopg

        with psycopg.connect(self._pg_url, autocommit=True) as c:
            c.execute(f"CREATE DATABASE bench{self.n}")
        return self._pg_url.rsplit("/", 1)[0] + f"/bench{self.n}"

    def server_pid(self) -> int | None:
        return self._pg.pid() if self._pg else None

    def close(self) -> None:
        if self._pg is not None:
            self._pg.stop()


# pre-loading the broker ------------------------------------------------------------------
def fleet_messages(n: int, devices: int, fleet: str = "sim", seed: int = 0) -> list[tuple[str, bytes]]:
    """A birth per device, then ``n`` telemetry messages round-robin over the devices (seq 1, 2, ...)."""
    rng, now = random.Random(seed), time.time()
    session = int(now) - 10
    out = [
        (
            f"edgekit/{fleet}/dev-{i:05d}/birth",
            encode(
                message("birth", fleet, f"dev-{i:05d}", session, 0, {**birth_body(i, 1.0), "connection": 1}, ts=now)
            ),
        )
        for i in range(devices)
    ]
    for k in range(n):
        i, seq = k % devices, k // devices + 1
        dev = f"dev-{i:05d}"
        out.append(
            (
                f"edgekit/{fleet}/{dev}/telemetry",
                encode(message("telemetry", fleet, dev, session, seq, telemetry_body(rng, 1.0), ts=now)),
            )
        )
    return out


# the collector -----------------------------------------------------------------------------
def client_ids(n: int) -> list[str]:
    """The collectors' client ids: one collector keeps the historical id; several are numbered."""
    return [CLIENT_ID] if n == 1 else [f"{CLIENT_ID}-{i + 1}" for i in range(n)]


def register_session(broker_url: str, client_id: str = CLIENT_ID, protocol: str = "5") -> None:
    """Connect once as the collector (persistent session, shared subscription), then go away."""
    from edge.fleet.collector import Collector, CollectorConfig

    with open_db("sqlite:///:memory:") as db:
        c = Collector(
            CollectorConfig(
                BrokerConfig.from_url(broker_url, protocol=protocol), "sqlite:///:memory:", client_id=client_id
            ),
            db=db,
        ).start()
        deadline = time.monotonic() + 10
        while not c.connected and time.monotonic() < deadline:
            time.sleep(0.02)
        if not c.connected:
            raise RuntimeError("the collector's session could not be registered")
        time.sleep(0.3)  # SUBACK
        c.stop()


def collector_cmd(broker_url: str, db_url: str, options: list[str], client_id: str = CLIENT_ID) -> list[str]:
    return [
        sys.executable,
        "-m",
        "edge",
        "fleet",
        "collect",
        "--broker",
        broker_url,
        "--db",
        db_url,
        "--json",
        "--log-level",
        "warning",
        "--stats-interval",
        "3600",
        "--client-id",
        client_id,
        *options,
    ]


def parse_variant(spec: str) -> tuple[Path, str | None, list[str]]:
    src, sync, opts = REPO, None, []
    names = {"batch": "--batch-max", "interval": "--batch-interval-ms", "receive": "--receive-maximum"}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, _, value = part.partition("=")
        if key == "src":
            src = Path(value).resolve()
        elif key == "sync":
            sync = value
        elif key in names:
            opts += [names[key], value]
        elif key == "protocol":
            opts += ["--protocol", value]
        elif key == "client":
            opts += ["--client", value]
        elif key == "pipeline":
            opts += ["--pipeline" if value == "on" else "--no-pipeline"]
        elif key == "collectors":
            opts += ["--collectors", value]  # taken out again by drain_once: not a collector option
        else:
            raise SystemExit(
                f"unknown variant part {part!r}: src=DIR, sync=MODE, batch=N, interval=MS, receive=N, "
                "collectors=N, protocol=5|3.1.1, client=paho|lite, pipeline=on|off"
            )
    return src, sync, opts


def drain_once(
    args: argparse.Namespace, dbs: Databases, kind: str, variant: str, msgs: list[tuple[str, bytes]]
) -> dict[str, Any]:
    src, sync, opts = parse_variant("" if variant in ("paho", "lite") else variant)
    collectors = args.collectors
    if "--collectors" in opts:
        i = opts.index("--collectors")
        collectors = int(opts[i + 1])
        del opts[i : i + 2]
    work = Path(tempfile.mkdtemp(prefix="edgekit-drain-", dir=dbs.work))
    db_url = dbs.new(kind, sync)
    n = len(msgs) - args.drain_devices
    out: dict[str, Any] = {
        "db": kind,
        "variant": variant or "defaults",
        "messages": n,
        "load_start": loadavg(),
        "collectors": collectors,
    }
    with Mosquitto(
        work / "broker", extra="persistence false\n" + os.environ.get("BENCH_BROKER_EXTRA", "").replace(";", "\n")
    ) as broker:  # the session lives in memory
        ids = client_ids(collectors)
        for cid in ids:  # the broker splits the pre-loaded messages between these sessions, round-robin
            register_session(broker.url, cid, opts[opts.index("--protocol") + 1] if "--protocol" in opts else "5")
        out["preload_s"] = round(preload_qos1(broker.port, msgs), 2)
        env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(src)}
        log = open(work / "collector.log", "wb")
        if variant in ("paho", "lite"):
            out[variant] = paho_drain(broker.url, len(msgs), lite=variant == "lite")
            print(f"{variant} alone: {out[variant]}", file=sys.stderr)
            proc, stats = None, None
        elif args.profile:
            stats, prof = profile_drain(broker.url, db_url, n, opts)
            out["profile"] = prof
            proc = None
        else:
            procs = [
                subprocess.Popen(
                    collector_cmd(broker.url, db_url, opts, cid), cwd=src, env=env, stdout=subprocess.PIPE, stderr=log
                )
                for cid in ids
            ]
            proc = procs[0]
        t0 = time.monotonic()
        first_cpu: tuple[float, float, float] | None = None
        last, last_change, done_cpu = -1, t0, (0.0, 0.0, 0.0)
        srv = dbs.server_pid()
        while proc is not None:
            time.sleep(0.25)
            got = stored_count(db_url)
            now = time.monotonic()
            cpus = (
                sum(cpu_seconds(p.pid) for p in procs),
                cpu_seconds(broker.proc.pid),  # type: ignore[union-attr]
                tree_cpu_seconds(srv) if srv else 0.0,
            )
            if got > 0 and first_cpu is None:
                first_cpu, t_first, n_first = cpus, now, got
            if got != last:
                last, last_change = got, now
            if got >= n:
                done_cpu, t_done = cpus, now
                break
            if now - last_change > 30 or any(p.poll() is not None for p in procs):
                out["stalled_at"] = got
                log.flush()
                print(
                    f"the collector stalled at {got} of {n} (exit {proc.poll()}): "
                    f"{(work / 'collector.log').read_text(errors='replace')[-1500:]}",
                    file=sys.stderr,
                )
                break
        if proc is not None:
            outs = []
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                cout, _ = p.communicate(timeout=120)
                outs.append(json.loads(cout) if cout.strip() else None)
            stats = None if None in outs else {k: sum(o[k] for o in outs) for k in ("duplicates", "db_errors")}
            if first_cpu is not None and "stalled_at" not in out and t_done > t_first:
                w = t_done - t_first
                out["cpu_percent"] = {
                    k: round(100 * (done_cpu[i] - first_cpu[i]) / w, 1)
                    for i, k in enumerate(("collector", "mosquitto", "postgresql"))
                }
                # the host is shared: messages per CPU-second of the collector is what one core of its own would do
                if done_cpu[0] > first_cpu[0]:
                    out["msgs_per_collector_cpu_s"] = round((n - n_first) / (done_cpu[0] - first_cpu[0]))
        log.close()
    first, last_at, stored = (
        scalar(db_url, f"SELECT {f}(received_at) FROM telemetry") for f in ("min", "max", "count")
    )
    out.update(
        stored=int(stored or 0),
        missing_in_streams=missing_in_streams(db_url),
        duplicates=stats["duplicates"] if stats else None,
        db_errors=stats["db_errors"] if stats else None,
    )
    span = (last_at - first) if first is not None and last_at is not None else 0.0
    out["drain_s"] = round(span, 3)
    out["msgs_per_s"] = round((out["stored"] - 1) / span) if span > 0 else None
    out["exact"] = out["stored"] == n and out["missing_in_streams"] == 0 and out["duplicates"] == 0
    out["load_end"] = loadavg()
    if kind == "sqlite":
        for f in Path(db_url.split("sqlite:///", 1)[1].split("?")[0]).parent.glob(f"fleet-{dbs.n}.db*"):
            f.unlink()
    shutil.rmtree(work, ignore_errors=True)
    return out


def paho_drain(broker_url: str, n: int, lite: bool = False) -> dict[str, Any]:
    """The MQTT client alone: the collector's Connection (paho, MQTT 5, manual acks) on its NetworkLoop, every
    message acknowledged at once, nothing decoded or stored. The ceiling of a paho-based collector here.
    ``lite``: the same with edge.mqtt.lite's LiteConnection (acks written once per socket read)."""
    from edge.mqtt.netloop import Connection, ConnectOptions, NetworkLoop

    got = {"n": 0, "t0": 0.0, "t1": 0.0}

    def on_message(conn: Any, msg: Any) -> None:
        if got["n"] == 0:
            got["t0"] = time.monotonic()
        got["n"] += 1
        got["t1"] = time.monotonic()
        conn.ack(conn.client, msg.mid, msg.qos)

    def on_publish(conn: Any, client: Any, topic: str, payload: bytes, mid: int, qos: int) -> None:
        if got["n"] == 0:
            got["t0"] = time.monotonic()
        got["n"] += 1
        got["t1"] = time.monotonic()
        conn.ack(client, mid, qos)

    with NetworkLoop(name="edgekit-bench-paho") as loop:
        from edge.mqtt.topics import fleet_filter, shared

        if lite:
            from edge.mqtt.lite import LiteConnection

            conn = LiteConnection(
                loop,
                BrokerConfig.from_url(broker_url),
                CLIENT_ID,
                subscriptions=[(shared("edgekit-collectors", fleet_filter("+")), 1)],
                on_publish=on_publish,
                clean_start=False,
                session_expiry_s=3600,
                receive_maximum=10_000,
            )
            loop.run(lambda: loop.after_io(conn.ack_done))
        else:
            conn = Connection(
                loop,
                BrokerConfig.from_url(broker_url),
                CLIENT_ID,  # type: ignore[assignment]
                subscriptions=[(shared("edgekit-collectors", fleet_filter("+")), 1)],
                on_message=on_message,
                options=ConnectOptions(
                    clean_start=False, session_expiry_s=3600, manual_ack=True, receive_maximum=10_000
                ),
            )
        cpu = loop.run(time.thread_time)  # the loop thread's CPU
        conn.start()
        deadline = time.monotonic() + 300
        while got["n"] < n and time.monotonic() < deadline:
            time.sleep(0.1)
        cpu = loop.run(time.thread_time) - cpu
        loop.run(conn.close)
        conn.closed.wait(5)
    span = got["t1"] - got["t0"]
    return {
        "messages": got["n"],
        "msgs_per_s": round(got["n"] / span) if span else None,
        "msgs_per_loop_cpu_s": round(got["n"] / cpu) if cpu else None,
    }


def profile_drain(broker_url: str, db_url: str, n: int, opts: list[str]) -> tuple[dict[str, Any], str]:
    """The collector in this process, cProfile on its network thread (where all its work runs)."""
    from edge.fleet.collector import Collector, CollectorConfig

    kw: dict[str, Any] = {}
    for flag, value in zip(opts[::2], opts[1::2]):
        kw[
            {
                "--batch-max": "batch_max",
                "--batch-interval-ms": "batch_interval_ms",
                "--receive-maximum": "receive_maximum",
            }[flag]
        ] = int(value)
    prof = cProfile.Profile()
    c = Collector(CollectorConfig(BrokerConfig.from_url(broker_url), db_url, client_id=CLIENT_ID, **kw))
    c.start()
    assert c.loop is not None
    c.loop.run(prof.enable)
    deadline = time.monotonic() + 600
    while stored_count(db_url) < n and time.monotonic() < deadline:
        time.sleep(0.25)
    c.loop.run(prof.disable)
    stats = c.snapshot()
    c.stop()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
    return stats, s.getvalue()


def drain(args: argparse.Namespace) -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="edgekit-fleet-bench-"))
    dbs = Databases(work)
    msgs = fleet_messages(args.drain_messages, args.drain_devices)
    results = []
    try:
        for r in range(args.repeat):
            for kind in args.db.split(","):
                for variant in args.variant or [""]:
                    res = drain_once(args, dbs, kind, variant, msgs)
                    res["round"] = r + 1
                    results.append(res)
                    print(
                        f"drain {kind:10s} {res['variant']:28s} round {r + 1}: {res['msgs_per_s']} msg/s "
                        f"({res['stored']}/{res['messages']} stored in {res['drain_s']} s, dup {res['duplicates']}, "
                        f"missing {res['missing_in_streams']}; {res.get('msgs_per_collector_cpu_s')} msg per collector CPU-s; "
                        f"CPU % {res.get('cpu_percent')}; "
                        f"load {res['load_start']} -> {res['load_end']})",
                        file=sys.stderr,
                        flush=True,
                    )
                    if res.get("profile"):
                        print(res["profile"], file=sys.stderr)
    finally:
        dbs.close()
        shutil.rmtree(work, ignore_errors=True)
    return results


# decoding on its own ---------------------------------------------------------------------
def decode_bench(args: argparse.Namespace) -> dict[str, Any]:
    """µs per telemetry message: JSON parse alone (json, orjson, msgspec where installed) and the whole decode()."""
    from edge.fleet import decode as dec

    msgs = fleet_messages(20_000, 1000)[1000:]
    payloads = [p for _, p in msgs]

    def nc(name: str) -> Any:
        raise ValueError(name)

    cands: dict[str, Callable[[bytes], Any]] = {"json": lambda p: json.loads(p.decode(), parse_constant=nc)}
    try:
        import orjson

        cands["orjson"] = orjson.loads
    except ImportError:
        pass
    try:
        import msgspec

        cands["msgspec"] = msgspec.json.Decoder().decode
    except ImportError:
        pass
    topics = dec.TopicCache(10_000)
    now = time.time()
    cands[f"decode() [{dec.JSON_LIBRARY}, topic cache]"] = None  # type: ignore[assignment]
    times: dict[str, list[float]] = {k: [] for k in cands}
    for _ in range(args.repeat * 3):  # interleaved: the same load for each
        for name, fn in cands.items():
            t = time.perf_counter()
            if fn is None:
                for topic, p in msgs:
                    dec.decode(topics(topic), p, now=now)
            else:
                for p in payloads:
                    fn(p)
            times[name].append((time.perf_counter() - t) / len(payloads) * 1e6)
    return {k: round(min(v), 2) for k, v in times.items()}


# live simulation ---------------------------------------------------------------------------
def live(args: argparse.Namespace) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * args.devices + 256)), hard))
    work = Path(tempfile.mkdtemp(prefix="edgekit-fleet-bench-"))
    dbs = Databases(work)
    db_url = dbs.new(args.db.split(",")[0])
    out: dict[str, Any] = {
        "devices": args.devices,
        "rate_hz": args.rate,
        "duration_s": args.duration,
        "sim": args.sim,
        "collector_opts": " ".join(args.collector_opts),
        "db": args.db.split(",")[0],
        "load_start": loadavg(),
        "cpus": os.cpu_count(),
    }
    try:
        with Mosquitto(work / "broker") as broker:
            env = {**os.environ, "NO_COLOR": "1"}
            collectors = [
                subprocess.Popen(
                    collector_cmd(broker.url, db_url, args.collector_opts, cid),
                    stdout=subprocess.PIPE,
                    stderr=open(work / "collector.log", "ab"),
                    env=env,
                )
                for cid in client_ids(args.collectors)
            ]
            time.sleep(2.0)  # the collector subscribes before the devices publish
            fleet: Any
            if args.sim == "light":
                fleet = LightFleet(
                    "127.0.0.1", broker.port, devices=args.devices, rate_hz=args.rate, connect_per_s=args.connect_rate
                )
            else:
                fleet = SimulatedFleet(
                    BrokerConfig.from_url(broker.url),
                    devices=args.devices,
                    rate_hz=args.rate,
                    connect_per_s=args.connect_rate,
                )
            t = time.monotonic()
            fleet.start()
            try:
                deadline = t + args.devices / args.connect_rate + 60
                while fleet.connected() < args.devices and time.monotonic() < deadline:
                    time.sleep(0.2)
                out["connected"] = fleet.connected()
                out["connect_s"] = round(time.monotonic() - t, 2)
                time.sleep(2.0)  # every device past its first telemetry
                pids = {"broker": broker.proc.pid, "simulator": os.getpid()}  # type: ignore[union-attr]
                pids.update((f"collector-{i + 1}", c.pid) for i, c in enumerate(collectors))
                cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
                sub0, n0, w0 = fleet.submitted, stored_count(db_url), time.time()
                m0 = time.monotonic()
                time.sleep(args.duration)
                m1 = time.monotonic()
                sub1, n1, w1 = fleet.submitted, stored_count(db_url), time.time()
                cpu1 = {k: cpu_seconds(p) for k, p in pids.items()}
                fleet.pause()
                made = fleet.submitted
                drain0 = time.monotonic()
                while stored_count(db_url) < made and time.monotonic() - drain0 < 120:
                    time.sleep(0.2)
                out["drain_s"] = round(time.monotonic() - drain0, 2)
                out["pending_on_devices"] = fleet.pending()
                if args.sim == "light":
                    out["connections_lost"] = fleet.lost
            finally:
                fleet.stop()
                for c in collectors:
                    c.send_signal(signal.SIGTERM)
                couts = [c.communicate(timeout=60)[0] for c in collectors]
            window = m1 - m0
            out["offered_msgs_per_s"] = round(args.devices * args.rate, 1)
            out["made_msgs_per_s"] = round((sub1 - sub0) / window, 1)
            out["ingested_msgs_per_s"] = round((n1 - n0) / window, 1)
            out["cpu_percent"] = {k: round(100 * (cpu1[k] - cpu0[k]) / window, 1) for k in cpu0}
            outs = [json.loads(c) if c.strip() else None for c in couts]
            out["collector"] = None if None in outs else {"duplicates": sum(o["duplicates"] for o in outs)}
            out["collectors"] = len(collectors)
            out["cpu_percent"]["collector"] = round(
                sum(v for k, v in out["cpu_percent"].items() if k.startswith("collector-")), 1
            )
            with open_db(db_url, must_exist=True) as db:
                stored = int(db.execute("SELECT count(*) FROM telemetry").fetchone()[0])
                delays = [
                    r[0] * 1e3
                    for r in db.execute(
                        "SELECT received_at - ts FROM telemetry WHERE ts BETWEEN ? AND ?", (w0, w1)
                    ).fetchall()
                ]
                by_window = []  # steady state or a transient? p99 per 10 s of the measured window
                for lo in range(0, int(w1 - w0), 10):
                    d = [
                        r[0] * 1e3
                        for r in db.execute(
                            "SELECT received_at - ts FROM telemetry WHERE ts >= ? AND ts < ?",
                            (w0 + lo, min(w1, w0 + lo + 10)),
                        ).fetchall()
                    ]
                    by_window.append(
                        {"from_s": lo, "count": len(d), "p50": round(pct(d, 0.5), 2), "p99": round(pct(d, 0.99), 2)}
                    )
            out.update(
                made=made,
                stored=stored,
                missing_in_streams=missing_in_streams(db_url),
                e2e_ms={
                    "count": len(delays),
                    "p50": round(pct(delays, 0.5), 2),
                    "p99": round(pct(delays, 0.99), 2),
                    "max": round(max(delays), 2) if delays else None,
                },
                e2e_ms_per_10s=by_window,
            )
    finally:
        dbs.close()
        shutil.rmtree(work, ignore_errors=True)
    out["load_end"] = loadavg()
    dup = out["collector"]["duplicates"] if out.get("collector") else None
    out["keeps_up"] = bool(
        out["stored"] == made
        and dup == 0
        and out["drain_s"] < 5
        and out["made_msgs_per_s"] >= 0.95 * out["offered_msgs_per_s"]
    )
    return out


def live_lines(r: dict[str, Any]) -> list[str]:
    return [
        f"live [{r['sim']} simulator]: devices {r['connected']}/{r['devices']} connected in {r['connect_s']} s, "
        f"{r['rate_hz']:g} Hz, "
        f"{r['duration_s']:g} s measured, {r['db']}",
        f"offered {r['offered_msgs_per_s']} msg/s, made {r['made_msgs_per_s']} msg/s, ingested {r['ingested_msgs_per_s']} msg/s",
        f"stored {r['stored']} of {r['made']} made (duplicates {r['collector']['duplicates'] if r['collector'] else '?'}, "
        f"missing {r['missing_in_streams']}); backlog drained in {r['drain_s']} s",
        f"end-to-end delay ms: p50 {r['e2e_ms']['p50']}  p99 {r['e2e_ms']['p99']}  max {r['e2e_ms']['max']} "
        f"({r['e2e_ms']['count']} messages)",
        "p99 per 10 s: " + ", ".join(f"{w['p99']}" for w in r["e2e_ms_per_10s"]),
        f"CPU %: collector {r['cpu_percent']['collector']} ({r['collectors']} process(es)), mosquitto "
        f"{r['cpu_percent']['broker']}, "
        f"simulator {r['cpu_percent']['simulator']} (100 = one core, {r['cpus']} cores)",
        f"load average {r['load_start']} -> {r['load_end']}; keeps up: {'yes' if r['keeps_up'] else 'NO'}",
    ]


def main() -> None:
    print("measured on " + measured_on(), file=sys.stderr)  # the CPU's ISA class and the load
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("both", "drain", "live", "decode"), default="both")
    ap.add_argument(
        "--db",
        default="sqlite",
        help="sqlite, postgresql, or both comma-separated (drain); "
        "live uses the first. PostgreSQL: a throw-away server with fsync on",
    )
    ap.add_argument("--drain-messages", type=int, default=200_000, help="telemetry messages pre-loaded for the drain")
    ap.add_argument("--drain-devices", type=int, default=1000, help="devices they come from (one birth each)")
    ap.add_argument("--variant", action="append", help="a drain configuration (see above); repeatable")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of the drain variants, interleaved")
    ap.add_argument(
        "--collectors",
        type=int,
        default=1,
        help="drain: collector processes in one shared-"
        "subscription group (the broker splits the messages between them)",
    )
    ap.add_argument("--profile", default=None, help="drain: run the collector in-process under cProfile, print the top")
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=1.0, help="telemetry messages per device per second")
    ap.add_argument("--duration", type=float, default=60.0, help="measured seconds (after all devices connected)")
    ap.add_argument("--connect-rate", type=float, default=200.0, help="new connections per second at start")
    ap.add_argument(
        "--collector-opts",
        type=str.split,
        default=[],
        help="live: `fleet collect` options, one string (e.g. '--batch-max 5000 --batch-interval-ms 100')",
    )
    ap.add_argument(
        "--sim",
        choices=("sessions", "light"),
        default="sessions",
        help="live: 'sessions' (the agent's DeviceSession per device) or 'light' (edge.fleet.simulate."
        "LightFleet: one raw MQTT connection per device, pre-encoded payloads; for 10,000 devices here)",
    )
    ap.add_argument("--json", default=None, help="write the results as JSON to this file ('-': stdout)")
    args = ap.parse_args()
    if mosquitto_binary() is None:
        sys.exit("mosquitto is not installed (apt-get install mosquitto)")
    res: dict[str, Any] = {"load_start": loadavg(), "cpus": os.cpu_count()}
    lines: list[str] = []
    if args.mode == "decode":
        res["decode_us_per_msg"] = d = decode_bench(args)
        lines.append("decode µs/message (best of interleaved runs): " + ", ".join(f"{k} {v}" for k, v in d.items()))
    if args.mode in ("both", "drain"):
        res["drain"] = runs = drain(args)
        for r in runs:
            alone = "paho" if r.get("paho") else "lite" if r.get("lite") else None
            if alone:
                lines.append(
                    f"MQTT client alone [{alone}, round {r['round']}]: {r[alone]['msgs_per_s']} msg/s, "
                    f"{r[alone]['msgs_per_loop_cpu_s']} msg per CPU-second of its loop thread"
                )
                continue
            lines.append(
                f"drain capacity [{r['db']}, {r['variant']}, {r['collectors']} collector(s)]: "
                f"{r['msgs_per_s']} msg/s "
                f"({r['stored']}/{r['messages']} stored in {r['drain_s']} s, duplicates {r['duplicates']}, "
                f"missing {r['missing_in_streams']}, exact: {'yes' if r['exact'] else 'NO'}; "
                f"{r.get('msgs_per_collector_cpu_s')} msg per collector CPU-second; CPU % {r.get('cpu_percent')})"
            )
    if args.mode in ("both", "live"):
        res["live"] = r = live(args)
        lines += live_lines(r)
    res["load_end"] = loadavg()
    lines.append(f"load average {res['load_start']} -> {res['load_end']} ({res['cpus']} cores)")
    print("\n".join(lines), file=sys.stderr if args.json == "-" else sys.stdout)
    if args.json:
        text = json.dumps(res, indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
