"""``edgekit fleet status`` at fleet scale: how long it takes at 10,000 devices (goal: < 200 ms).

The store is seeded through the library, the way the collector fills it (``Collector.add`` +
``flush``): per device a birth per session, ``--sessions`` sessions, ``--telemetry`` telemetry
messages each. Then, per database, interleaved ``--repeat`` times:

- ``fleet_status()`` (the library call the command makes: open, query devices and streams, classify), wall
  time and this process's CPU time (the host may be shared; PostgreSQL's own work is not in the latter);
- ``edgekit fleet status --json`` and the table, as a user runs them (a fresh process: the
  interpreter's start-up and imports included), wall time.

    .venv/bin/python benchmarks/fleet_status.py                       # 10,000 devices, SQLite and PostgreSQL
    .venv/bin/python benchmarks/fleet_status.py --devices 1000 --db sqlite
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.support: the brokers and databases the tests run

from edge.capabilities import measured_on  # noqa: E402
from edge.fleet.collector import Collector, CollectorConfig  # noqa: E402
from edge.fleet.simulate import birth_body, telemetry_body  # noqa: E402
from edge.fleet.status import fleet_status  # noqa: E402
from edge.mqtt.client import BrokerConfig  # noqa: E402
from edge.mqtt.payloads import encode, message  # noqa: E402

EDGEKIT = str(Path(sys.executable).with_name("edgekit"))


def seed(url: str, devices: int, sessions: int, telemetry: int) -> float:
    rng, now = random.Random(0), time.time()
    c = Collector(CollectorConfig(BrokerConfig("127.0.0.1", 1), url, batch_max=5000, receive_maximum=5000))
    t0 = time.monotonic()
    try:
        for s in range(sessions):
            session = int(now) - 3600 * (sessions - s)
            for i in range(devices):
                dev = f"dev-{i:05d}"
                c.add(
                    f"edgekit/sim/{dev}/birth",
                    encode(message("birth", "sim", dev, session, 0, {**birth_body(i, 1.0), "connection": 1}, ts=now)),
                    received_at=now - 60,
                )
                for seq in range(1, telemetry + 1):
                    c.add(
                        f"edgekit/sim/{dev}/telemetry",
                        encode(message("telemetry", "sim", dev, session, seq, telemetry_body(rng, 1.0), ts=now)),
                        received_at=now - 5,
                    )
                if len(c._pending) >= 5000:
                    c.flush()
        c.flush()
    finally:
        c.db.close()
    return time.monotonic() - t0


def timed_cli(*args: str) -> float:
    t0 = time.monotonic()
    p = subprocess.run(
        [EDGEKIT, *args], capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    )
    if p.returncode != 0:
        raise SystemExit(f"edgekit {' '.join(args)} failed: {p.stderr[-500:]}")
    return time.monotonic() - t0


def main() -> None:
    print("measured on " + measured_on(), file=sys.stderr)  # the CPU's ISA class and the load
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=10_000)
    ap.add_argument("--sessions", type=int, default=2, help="sessions per device (a birth and a stream each)")
    ap.add_argument("--telemetry", type=int, default=3, help="telemetry messages per device session")
    ap.add_argument("--db", default="sqlite,postgresql")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="edgekit-status-bench-"))
    pg = None
    urls = {}
    try:
        for kind in args.db.split(","):
            if kind == "sqlite":
                urls[kind] = f"sqlite:///{work}/fleet.db"
            else:
                from tests.support.pg_server import PostgresServer

                pg = PostgresServer(durable=True)
                urls[kind] = pg.start()
            s = seed(urls[kind], args.devices, args.sessions, args.telemetry)
            print(
                f"{kind}: seeded {args.devices} devices x {args.sessions} sessions x ({args.telemetry} telemetry "
                f"+ birth) in {s:.1f} s",
                flush=True,
            )
        lib: dict[str, list[float]] = {k: [] for k in urls}
        lib_cpu: dict[str, list[float]] = {k: [] for k in urls}  # this process's CPU (the host is shared)
        cli_json: dict[str, list[float]] = {k: [] for k in urls}
        cli_table: dict[str, list[float]] = {k: [] for k in urls}
        for _ in range(args.repeat):  # interleaved: the databases see the same machine load
            for kind, url in urls.items():
                t0, c0 = time.perf_counter(), time.process_time()
                rows = fleet_status(url)
                lib[kind].append(time.perf_counter() - t0)
                lib_cpu[kind].append(time.process_time() - c0)
                assert len(rows) == args.devices, len(rows)
                cli_json[kind].append(timed_cli("fleet", "status", "--db", url, "--json"))
                cli_table[kind].append(timed_cli("fleet", "status", "--db", url))
        t0 = time.monotonic()
        timed_cli("--help")
        startup = time.monotonic() - t0
        for kind in urls:
            print(
                f"{kind}: fleet_status() at {args.devices} devices: median {1e3 * statistics.median(lib[kind]):.0f} ms "
                f"(min {1e3 * min(lib[kind]):.0f}; CPU of this process median "
                f"{1e3 * statistics.median(lib_cpu[kind]):.0f} ms); `edgekit fleet status --json` median "
                f"{1e3 * statistics.median(cli_json[kind]):.0f} ms, table median "
                f"{1e3 * statistics.median(cli_table[kind]):.0f} ms (process start-up, `edgekit --help`: "
                f"{1e3 * startup:.0f} ms); {args.repeat} runs"
            )
        print(f"load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])} ({os.cpu_count()} cores)")
    finally:
        if pg is not None:
            pg.stop()
        import shutil

        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
