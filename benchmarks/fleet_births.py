"""Births a second through the collector's store path, unsigned (an agent from before device keys) and signed
(``edge.mqtt.identity``): the first signed birth of a device verifies and pins its key, a later one verifies
against the pin (``edge.fleet.collector_keys``). Births are rare (one a connection); this says what a fleet
reconnecting at once (a broker restart) costs.

The collector in-process on a fresh SQLite file (``Collector.add`` + ``flush``, ``--batch`` births a
transaction), ``--devices`` devices, each variant ``--repeat`` times interleaved; payloads are made (and signed)
before the clock starts. The Ed25519 verify alone is timed too.

    .venv/bin/python benchmarks/fleet_births.py                 # 5,000 devices
    .venv/bin/python benchmarks/fleet_births.py --devices 1000 --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edge.capabilities import measured_on  # noqa: E402
from edge.fleet.collector import Collector, CollectorConfig  # noqa: E402
from edge.fleet.decode import decode  # noqa: E402
from edge.fleet.simulate import birth_body  # noqa: E402
from edge.mqtt.client import BrokerConfig  # noqa: E402
from edge.mqtt.identity import DeviceIdentity  # noqa: E402
from edge.mqtt.payloads import encode, message  # noqa: E402


def payloads(devices: int, session: int, keys: list[DeviceIdentity] | None) -> list[tuple[str, bytes]]:
    out = []
    for i in range(devices):
        dev = f"dev-{i:05d}"
        m = message("birth", "bench", dev, session, 0, {"connection": 1, **birth_body(i, 1.0)})
        out.append((f"edgekit/bench/{dev}/birth", encode(m) if keys is None else keys[i].sign(m)))
    return out


def run(url: str, rounds: list[list[tuple[str, bytes]]], batch: int) -> list[float]:
    """Births a second for each round of payloads, stored in that order into one database."""
    c = Collector(CollectorConfig(BrokerConfig("127.0.0.1", 1), url, batch_max=batch, receive_maximum=batch))
    rates = []
    try:
        for msgs in rounds:
            t0 = time.perf_counter()
            for i in range(0, len(msgs), batch):
                for topic, payload in msgs[i : i + batch]:
                    c.add(topic, payload)
                c.flush()
            rates.append(len(msgs) / (time.perf_counter() - t0))
        refused = sum(v for k, v in c.stats["rejected"].items())
        assert refused == 0 and c.stats["stored"]["birth"] == sum(map(len, rounds)), c.stats
    finally:
        c.db.close()
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=5000)
    ap.add_argument("--batch", type=int, default=500, help="births a transaction")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    keys = [DeviceIdentity.generate() for _ in range(args.devices)]
    now = int(time.time())
    got: dict[str, list[float]] = {"unsigned": [], "signed, first (pins)": [], "signed, pinned": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            old = payloads(args.devices, now - 10 - r, None)
            got["unsigned"] += run(f"sqlite:///{tmp}/u{r}.db", [old], args.batch)
            first, later = payloads(args.devices, now - 10, keys), payloads(args.devices, now - 9, keys)
            pin, pinned = run(f"sqlite:///{tmp}/s{r}.db", [first, later], args.batch)
            got["signed, first (pins)"].append(pin)
            got["signed, pinned"].append(pinned)
    d = decode(*payloads(1, now, keys)[0], now=now)
    assert d.signed is not None
    n = 2000
    verify_us = min(timeit.repeat(lambda: d.signed.verifies_with(keys[0].public), number=n, repeat=3)) / n * 1e6
    print(f"{args.devices} devices, {args.batch} births a transaction, SQLite, {args.repeat} rounds (median):")
    for name, rates in got.items():
        print(
            f"  {name:22} {statistics.median(rates):9.0f} births/s   (rounds: {', '.join(f'{x:.0f}' for x in rates)})"
        )
    print(f"  Ed25519 verify alone   {verify_us:9.1f} us")
    print(measured_on())


if __name__ == "__main__":
    main()
