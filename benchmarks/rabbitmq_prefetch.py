"""The collector's drain rate on RabbitMQ (MQTT 3.1.1) against RabbitMQ's ``mqtt.prefetch``.

RabbitMQ sends one MQTT subscriber at most ``mqtt.prefetch`` unacknowledged messages (default 10); the
collector acknowledges after its commit. Pipelined (its default) it commits as soon as its writer is free
(group commit), so ``--batch-interval-ms`` only bounds the wait; before that, a batch waited for the interval
and the default prefetch held the collector to ~10 messages per 50 ms (~180 msg/s measured). One
RabbitMQ node (``tests/support/rabbitmq_broker.py``); per variant: the collector's persistent session registered,
N QoS 1 messages pre-loaded while it is away (a birth per device, then telemetry round-robin), then
``edgekit fleet collect --protocol 3.1.1`` drains them into SQLite. Rate = messages / (last received_at -
first received_at) from the database (collector start-up excluded); variants interleaved round-robin
``--repeat`` times on the same node (the prefetch is set between runs with ``rabbitmqctl eval``; it applies
to new connections), medians printed.

    .venv/bin/python benchmarks/rabbitmq_prefetch.py                      # 5,000 messages, 3 rounds
    .venv/bin/python benchmarks/rabbitmq_prefetch.py --messages 20000 --variant 1000:50 --variant 1000:0
"""

from __future__ import annotations

import argparse
import shutil
import socket
import sqlite3
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.support: the brokers and databases the tests run

from edge.capabilities import measured_on  # noqa: E402
from edge.mqtt.lite import mqtt_packet, mqtt_string  # noqa: E402
from edge.mqtt.payloads import encode, message  # noqa: E402
from tests.support.mqtt_broker import preload_qos1  # noqa: E402
from tests.support.rabbitmq_broker import RabbitCluster, rabbitmq_missing, rabbitmq_version  # noqa: E402

DEVICES = 50


def messages(n: int) -> list[tuple[str, bytes]]:
    now = time.time()
    session = int(now) - 100
    out = [
        (
            f"edgekit/lab/d{i}/birth",
            encode(
                message("birth", "lab", f"d{i}", session, 0, {"connection": 1, "agent": {"interval_s": 1.0}}, ts=now)
            ),
        )
        for i in range(DEVICES)
    ]
    for k in range(n):
        body = {"inference": {"fps": 1.0, "frames": k, "latency_ms": {"p99_ms": 1.0}}}
        out.append(
            (
                f"edgekit/lab/d{k % DEVICES}/telemetry",
                encode(message("telemetry", "lab", f"d{k % DEVICES}", session, k // DEVICES + 1, body, ts=now)),
            )
        )
    return out


def forget(port: int, client_id: str) -> None:
    """A clean-session CONNECT under the collector's id, then DISCONNECT: RabbitMQ deletes its queue, so the
    next run's pre-load is not copied into it too."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(
            mqtt_packet(0x10, mqtt_string("MQTT") + bytes([4, 0x02]) + struct.pack("!H", 30) + mqtt_string(client_id))
        )
        if s.recv(4) != b"\x20\x02\x00\x00":
            raise RuntimeError(f"the broker refused {client_id}'s clean session")
        s.sendall(b"\xe0\x00")


def drain(node, workdir: Path, n: int, prefetch: int, interval_ms: int, run: int) -> dict[str, float]:
    node.ctl("eval", f"application:set_env(rabbitmq_mqtt, prefetch, {prefetch}).")
    db = workdir / f"run{run}.db"
    cmd = [
        sys.executable,
        "-m",
        "edge",
        "fleet",
        "collect",
        "--broker",
        node.url,
        "--db",
        f"sqlite:///{db}",
        "--protocol",
        "3.1.1",
        "--client-id",
        f"bench-{run}",
        "--log-level",
        "warning",
        "--batch-interval-ms",
        str(interval_ms),
    ]
    subprocess.run(cmd + ["--duration", "1"], check=True, capture_output=True, timeout=120, cwd=REPO)
    preload_qos1(node.port, messages(n))
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stored = 0
    try:
        while stored < n and time.monotonic() - t0 < 600:
            time.sleep(0.1)
            try:
                with sqlite3.connect(db) as c:
                    stored = c.execute("SELECT count(*) FROM telemetry").fetchone()[0]
            except sqlite3.OperationalError:
                pass
        wall = time.monotonic() - t0
    finally:
        p.terminate()
        p.wait(60)
    forget(node.port, f"bench-{run}")
    with sqlite3.connect(db) as c:
        first, last, count = c.execute("SELECT min(received_at), max(received_at), count(*) FROM telemetry").fetchone()
    if count != n:
        raise SystemExit(f"run {run}: stored {count} of {n}")
    return {"rate": n / max(last - first, 1e-6), "wall_rate": n / wall}


def main() -> int:
    print("measured on " + measured_on(), file=sys.stderr)  # the CPU's ISA class and the load
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--variant",
        action="append",
        help="PREFETCH:BATCH_INTERVAL_MS (repeatable; default: 10:50, "
        "10:0, 1000:50 — RabbitMQ's and the collector's defaults first)",
    )
    ns = ap.parse_args()
    missing = rabbitmq_missing()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    variants = [tuple(int(x) for x in v.split(":")) for v in (ns.variant or ["10:50", "10:0", "1000:50"])]
    work = Path(tempfile.mkdtemp(prefix="edgekit-rabbit-bench-"))
    results: dict[tuple[int, ...], list[dict[str, float]]] = {v: [] for v in variants}
    try:
        with RabbitCluster(work / "broker", ("a",)) as cluster:
            run = 0
            for _ in range(ns.repeat):
                for v in variants:
                    run += 1
                    r = drain(cluster["a"], work, ns.messages, v[0], v[1], run)
                    results[v].append(r)
                    print(
                        f"  prefetch {v[0]:>5}  batch-interval-ms {v[1]:>3}: {r['rate']:8.0f} msg/s "
                        f"({r['wall_rate']:.0f} counting the collector's start)",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"RabbitMQ {rabbitmq_version()}, one node, SQLite, {ns.messages} messages x {ns.repeat} rounds "
        f"(median, min-max):"
    )
    for v, rs in results.items():
        rates = [r["rate"] for r in rs]
        print(
            f"  mqtt.prefetch {v[0]:>5}  --batch-interval-ms {v[1]:>3}: {statistics.median(rates):8.0f} msg/s "
            f"({min(rates):.0f}-{max(rates):.0f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
