"""Simulated fleet -> Mosquitto -> collector -> SQLite: messages/s ingested and end-to-end delay.

Three processes on this machine, each on its own MQTT connections: Mosquitto (own temporary
config, free loopback port), the collector (`edgekit fleet collect`, a subprocess), and this
script driving N simulated devices (`edge.fleet.simulate.SimulatedFleet`: the agent's own
DeviceSession per device, one real MQTT connection each, one network thread for all).

    .venv/bin/python benchmarks/fleet_ingest.py                      # 1,000 devices at 1 Hz for 60 s
    .venv/bin/python benchmarks/fleet_ingest.py --devices 200 --duration 20 --json out.json

End-to-end delay = collector's receive time - the device's message timestamp (same clock:
one machine), per stored telemetry message. "Keeps up" = everything the devices made is
stored exactly once, and the backlog after the devices stop drains within a few seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from mqtt_broker import Mosquitto, mosquitto_binary  # noqa: E402

from edge.agent.mqtt import BrokerConfig  # noqa: E402
from edge.fleet.simulate import SimulatedFleet  # noqa: E402


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


def count(db: Path) -> int:
    try:
        with sqlite3.connect(db, timeout=30) as c:
            return int(c.execute("SELECT count(*) FROM telemetry").fetchone()[0])
    except sqlite3.OperationalError:
        return 0


def run(args: argparse.Namespace) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * args.devices + 256)), hard))
    work = Path(tempfile.mkdtemp(prefix="edgekit-fleet-bench-"))
    db = work / "fleet.db"
    out: dict[str, Any] = {"devices": args.devices, "rate_hz": args.rate, "duration_s": args.duration,
                           "load_start": loadavg(), "cpus": os.cpu_count()}
    with Mosquitto(work / "broker") as broker:
        env = {**os.environ, "NO_COLOR": "1"}
        collector = subprocess.Popen([sys.executable, "-m", "edge", "fleet", "collect", "--broker", broker.url,
                                      "--db", f"sqlite:///{db}", "--json", "--log-level", "warning",
                                      "--stats-interval", "3600"],
                                     stdout=subprocess.PIPE, stderr=open(work / "collector.log", "wb"), env=env)
        time.sleep(1.5)  # the collector subscribes before the devices publish
        fleet = SimulatedFleet(BrokerConfig.from_url(broker.url), devices=args.devices, rate_hz=args.rate,
                               connect_per_s=args.connect_rate)
        t = time.monotonic()
        fleet.start()
        try:
            deadline = t + args.devices / args.connect_rate + 60
            while fleet.connected() < args.devices and time.monotonic() < deadline:
                time.sleep(0.2)
            out["connected"] = fleet.connected()
            out["connect_s"] = round(time.monotonic() - t, 2)
            time.sleep(2.0)  # every device past its first telemetry
            cpu0 = {"collector": cpu_seconds(collector.pid), "broker": cpu_seconds(broker.proc.pid),  # type: ignore[union-attr]
                    "simulator": cpu_seconds(os.getpid())}
            sub0, n0, w0 = fleet.submitted, count(db), time.time()
            m0 = time.monotonic()
            time.sleep(args.duration)
            m1 = time.monotonic()
            sub1, n1, w1 = fleet.submitted, count(db), time.time()
            cpu1 = {"collector": cpu_seconds(collector.pid), "broker": cpu_seconds(broker.proc.pid),  # type: ignore[union-attr]
                    "simulator": cpu_seconds(os.getpid())}
            fleet.pause()
            made = fleet.submitted
            drain0 = time.monotonic()
            while count(db) < made and time.monotonic() - drain0 < 120:
                time.sleep(0.2)
            out["drain_s"] = round(time.monotonic() - drain0, 2)
            out["pending_on_devices"] = fleet.pending()
        finally:
            fleet.stop()
            collector.send_signal(signal.SIGTERM)
            cout, _ = collector.communicate(timeout=60)
        window = m1 - m0
        out["offered_msgs_per_s"] = round(args.devices * args.rate, 1)
        out["made_msgs_per_s"] = round((sub1 - sub0) / window, 1)
        out["ingested_msgs_per_s"] = round((n1 - n0) / window, 1)
        out["cpu_percent"] = {k: round(100 * (cpu1[k] - cpu0[k]) / window, 1) for k in cpu0}
        out["collector"] = json.loads(cout) if cout.strip() else None
        with sqlite3.connect(db) as c:
            stored = int(c.execute("SELECT count(*) FROM telemetry").fetchone()[0])
            delays = [r[0] * 1e3 for r in c.execute("SELECT received_at - ts FROM telemetry WHERE ts BETWEEN ? AND ?",
                                                     (w0, w1))]
            by_window = []  # steady state or a transient? p99 per 10 s of the measured window
            for lo in range(0, int(w1 - w0), 10):
                d = [r[0] * 1e3 for r in c.execute("SELECT received_at - ts FROM telemetry WHERE ts >= ? AND ts < ?",
                                                    (w0 + lo, min(w1, w0 + lo + 10)))]
                by_window.append({"from_s": lo, "count": len(d), "p50": round(pct(d, 0.5), 2), "p99": round(pct(d, 0.99), 2)})
            missing = int(c.execute("SELECT coalesce(sum(CASE WHEN max_seq > announced_seq THEN max_seq ELSE "
                                    "announced_seq END - received), 0) FROM streams").fetchone()[0])
        out.update(made=made, stored=stored, missing_in_streams=missing,
                   e2e_ms={"count": len(delays), "p50": round(pct(delays, 0.5), 2), "p99": round(pct(delays, 0.99), 2),
                           "max": round(max(delays), 2) if delays else None}, e2e_ms_per_10s=by_window)
    out["load_end"] = loadavg()
    out["keeps_up"] = bool(stored == made and out["drain_s"] < 5 and out["made_msgs_per_s"] >= 0.95 * out["offered_msgs_per_s"])
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=1.0, help="telemetry messages per device per second")
    ap.add_argument("--duration", type=float, default=60.0, help="measured seconds (after all devices connected)")
    ap.add_argument("--connect-rate", type=float, default=200.0, help="new connections per second at start")
    ap.add_argument("--json", default=None, help="write the results as JSON to this file ('-': stdout)")
    args = ap.parse_args()
    if mosquitto_binary() is None:
        sys.exit("mosquitto is not installed (apt-get install mosquitto)")
    r = run(args)
    lines = [
        f"devices {r['connected']}/{r['devices']} connected in {r['connect_s']} s, {r['rate_hz']:g} Hz, {r['duration_s']:g} s measured",
        f"offered {r['offered_msgs_per_s']} msg/s, made {r['made_msgs_per_s']} msg/s, ingested {r['ingested_msgs_per_s']} msg/s",
        f"stored {r['stored']} of {r['made']} made (duplicates {r['collector']['duplicates'] if r['collector'] else '?'}, "
        f"missing {r['missing_in_streams']}); backlog drained in {r['drain_s']} s",
        f"end-to-end delay ms: p50 {r['e2e_ms']['p50']}  p99 {r['e2e_ms']['p99']}  max {r['e2e_ms']['max']} "
        f"({r['e2e_ms']['count']} messages)",
        "p99 per 10 s: " + ", ".join(f"{w['p99']}" for w in r["e2e_ms_per_10s"]),
        f"CPU %: collector {r['cpu_percent']['collector']}, mosquitto {r['cpu_percent']['broker']}, "
        f"simulator {r['cpu_percent']['simulator']} (100 = one core, {r['cpus']} cores)",
        f"load average {r['load_start']} -> {r['load_end']}; keeps up: {'yes' if r['keeps_up'] else 'NO'}",
    ]
    print("\n".join(lines), file=sys.stderr if args.json == "-" else sys.stdout)
    if args.json:
        text = json.dumps(r, indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
