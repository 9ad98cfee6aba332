"""``edgekit fleet trust-key DEVICE KEYFILE`` and ``edgekit fleet forget-key DEVICE``: the devices' pinned identity
keys in the collector's database (library: ``edge.fleet.device_keys``; the device side: ``edge.mqtt.identity``)."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from edge.cli._common import FleetDb, JsonOut, command, console, print_json, safe

Device = typer.Argument(..., help="The device id, as in its topics (edgekit/<fleet>/<device>/...).")
Fleet = typer.Option("default", "--fleet", help="The device's fleet.")


@command
def trust_key_cmd(
    device: str = Device,
    key_file: Path = typer.Argument(
        ...,
        help="The device's public key: <store>/agent/device-key.pub from the device (PEM), or its base64 as "
        "`fleet status --json` shows it.",
    ),
    fleet: str = Fleet,
    db: str = FleetDb,
    as_json: bool = JsonOut,
) -> None:
    """Pin this key for the device (a reinstalled device, or one not yet seen): from now on only births and deaths
    it signed are stored; any earlier pin and its refusals are replaced."""
    from edge.fleet.device_keys import trust_key
    from edge.mqtt.identity import read_public

    new, old = trust_key(db, fleet, device, read_public(key_file), now=time.time())
    if as_json:
        print_json({"pinned": new.as_dict(), "replaced": old.as_dict() if old else None})
        return
    was = f" (was {old.key_id}, pinned by {old.pinned_by})" if old else ""
    console.print(safe(f"{fleet}/{device}: key {new.key_id} pinned{was}"), highlight=False, soft_wrap=True)


@command
def forget_key_cmd(device: str = Device, fleet: str = Fleet, db: str = FleetDb, as_json: bool = JsonOut) -> None:
    """Remove the device's pinned key: its next signed birth pins again (whoever signs first wins; `trust-key` pins
    the key you give instead)."""
    from edge.fleet.device_keys import forget_key

    old = forget_key(db, fleet, device)
    if as_json:
        print_json({"forgotten": old.as_dict() if old else None})
        return
    line = f"{fleet}/{device}: key {old.key_id} forgotten" if old else f"{fleet}/{device} had no pinned key"
    console.print(safe(line + "; its next signed birth pins again"), highlight=False, soft_wrap=True)
