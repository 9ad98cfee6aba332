"""Rollout controller: time from start to 100%, and from a breach to every affected device rolled back.

A real Mosquitto on loopback, ``--devices`` simulated devices (``edge.fleet.rollout_sim``: the agent's own
DeviceSession per device, one MQTT connection each, the real DesiredState/ReportedState; no model runs, an
apply takes ``--apply-s``), the controller (``edge.fleet.rollout``) with SQLite, stepping every ``--poll-s``.

1. good: canary 5%, waves 25%,50%,100%, each wave watched ``--watch-s``; time from ``start_rollout`` to the
   rollout's ``completed`` (every device reported running on the new bundle).
2. breach: the same rollout, but the devices given the bundle in the last wave report ``rolled-back``
   (watch_p99_over_budget); ``--abort-if rolled_back>0`` aborts the cohort and every device that got the
   new bundle is sent back. Time from the first breaching report (device clock) to the last device's
   rollback applied (device clock), and the number of devices rolled back.

    .venv/bin/python benchmarks/rollout.py                       # 200 devices, 3 repeats, medians
    .venv/bin/python benchmarks/rollout.py --devices 1000 --watch-s 1 --repeat 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support: the Mosquitto fixture

from edge.capabilities import measured_on
from edge.fleet.db import open_db  # noqa: E402
from edge.fleet.rollout import FleetView, RolloutBundle, RolloutController, RolloutFlags, RolloutSpec, start_rollout  # noqa: E402
from edge.fleet.rollout_sim import Outcome, SimRolloutFleet  # noqa: E402
from edge.mqtt.client import BrokerConfig  # noqa: E402
from edge.mqtt.desired import DesiredState  # noqa: E402
from tests.support import mqtt_broker  # noqa: E402  (the Mosquitto fixture)

OLD = RolloutBundle("model-old", "x86-cpu", "http://127.0.0.1:9/model-old.tar", "ab" * 32, 1000)


def one(
    broker: mqtt_broker.Mosquitto, work: Path, n: int, i: int, breach: bool, args: argparse.Namespace
) -> dict[str, float]:
    fleet_name = f"bench{i}{'b' if breach else 'g'}"
    new = RolloutBundle(f"model-new-{i}", "x86-cpu", f"http://127.0.0.1:9/new-{i}.tar", "cd" * 32, 1000)
    devices = {f"dev-{k:05d}": ("x86-cpu", OLD.bundle_id) for k in range(n)}
    last_wave = set(sorted(devices)[int(n * 0.5) + 1 :])  # assigned in the 100% wave (canary, waves go by id)

    def behaviour(device: str, d: DesiredState) -> Outcome:
        if breach and d.bundle_id == new.bundle_id and device in last_wave:
            return Outcome("rolled-back", "watch_p99_over_budget", p99_ms=40.0, delay_s=args.apply_s)
        return Outcome(delay_s=args.apply_s)

    cfg = BrokerConfig.from_url(broker.url)
    with (
        SimRolloutFleet(cfg, fleet_name, devices, behaviour=behaviour) as fleet,
        open_db(f"sqlite:///{work}/{fleet_name}.db") as db,
        FleetView(cfg, fleet_name, client_id=f"bench-rollout-{fleet_name}") as view,
    ):
        deadline = time.monotonic() + 60
        while (
            fleet.connected() < n or sum(1 for d in view.snapshot().values() if d.birth) < n
        ) and time.monotonic() < deadline:
            time.sleep(0.05)
        spec = RolloutSpec.parse(
            RolloutFlags(
                fleet=fleet_name,
                canary="5%",
                waves="25%,50%,100%",
                watch=args.watch_s,
                device_timeout="120s",
                abort_if=["rolled_back>0"] if breach else [],
            )
        )
        t0 = time.monotonic()
        rid = start_rollout(db, view, spec, [new], previous=[OLD])
        res = RolloutController(db, rid, view).run(poll_s=args.poll_s, timeout_s=300)
        t_done = time.monotonic()
        out = {"state": res.state, "to_final_s": t_done - t0}
        if breach:
            applied = [a for d in fleet.devices.values() for a in d.applied]
            first = min(t for _, b, s, t in applied if b == new.bundle_id and s == "rolled-back")
            back = [
                t for d in fleet.devices.values() for (_, b, s, t) in d.applied if b == OLD.bundle_id and s == "running"
            ]
            out.update(
                breach_to_all_back_s=max(back) - first,
                rolled_back=len(back),
                given_new=sum(1 for d in fleet.devices.values() if any(b == new.bundle_id for _, b, _, _ in d.applied)),
            )
        return out


def main() -> None:
    print("measured on " + measured_on(), file=sys.stderr)  # the CPU's ISA class and the load
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", type=int, default=200)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--watch-s", type=float, default=0.0, help="watch per wave (s)")
    p.add_argument("--apply-s", type=float, default=0.2, help="simulated apply time per device (s)")
    p.add_argument("--poll-s", type=float, default=0.2, help="controller step interval (s)")
    args = p.parse_args()
    good, bad = [], []
    with (
        tempfile.TemporaryDirectory(prefix="edgekit-bench-rollout-") as tmp,
        mqtt_broker.Mosquitto(Path(tmp) / "broker") as broker,
    ):
        for i in range(args.repeat):  # good and breach interleaved
            good.append(one(broker, Path(tmp), args.devices, i, False, args))
            bad.append(one(broker, Path(tmp), args.devices, i, True, args))
            print(f"round {i}: good {good[-1]}  breach {bad[-1]}", file=sys.stderr)
    med = statistics.median
    print(
        f"{args.devices} simulated devices, canary 5% + waves 25/50/100%, watch {args.watch_s:g} s per wave, "
        f"apply {args.apply_s:g} s per device, controller step every {args.poll_s:g} s, {args.repeat} rounds"
    )
    print(
        f"  start -> 100% running:                   median {med(g['to_final_s'] for g in good):.2f} s  "
        f"(all {[round(g['to_final_s'], 2) for g in good]}, states {sorted({g['state'] for g in good})})"
    )
    print(
        f"  breach -> every affected device back:    median {med(b['breach_to_all_back_s'] for b in bad):.2f} s  "
        f"(all {[round(b['breach_to_all_back_s'], 2) for b in bad]}; rolled back "
        f"{[b['rolled_back'] for b in bad]} of given the new bundle {[b['given_new'] for b in bad]}, "
        f"states {sorted({b['state'] for b in bad})})"
    )


if __name__ == "__main__":
    main()
