"""Pinned device keys: the collector's known_hosts (trust on first use; the device side is ``edge.mqtt.identity``).

The first signed birth the collector accepts for a device pins the key that signed it (``device_keys``, one row per
fleet and device). From then on a birth or death of that device is stored only when the pinned key signed it:
an unsigned one (``unsigned``), one signed by another key (``wrong_key``) or one whose signature does not verify
(``bad_signature``) is refused, counted in the collector's ``rejected`` counters, and recorded on the pin (shown by
``fleet status``). A device that never signed (an agent from before device keys) is not pinned and is handled as
before. ``edgekit fleet trust-key`` pins a key the operator gives (a reinstalled device, or before its first birth);
``edgekit fleet forget-key`` removes a pin, and the device's next signed birth pins again.

What a pin does not stop: whoever publishes a signed birth for a device id before the device's own first one wins
the pin (the real device is then refused until an operator re-pins), and telemetry is not signed (the sequence
rules guard it). The broker ACL (``edgekit fleet acl``) stops both and stays the first defence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edge.errors import EdgeError
from edge.fleet.db import FleetDB, open_db
from edge.mqtt.identity import BadSignedMessage, key_id, key_text, parse_key_text
from edge.mqtt.topics import check_part

PINNED_BY = ("birth", "operator")
REFUSALS = ("unsigned", "wrong_key", "bad_signature")
DAMAGED = b""  # a stored key that is not one: nothing verifies with it (fail closed)


@dataclass(frozen=True)
class Pin:
    fleet: str
    device: str
    key: bytes
    pinned_at: float
    pinned_by: str

    @property
    def key_id(self) -> str:
        return key_id(self.key) if self.key else "damaged"

    def as_dict(self) -> dict[str, Any]:
        return {
            "fleet": self.fleet,
            "device": self.device,
            "key": key_text(self.key) if self.key else None,
            "key_id": self.key_id,
            "pinned_at": self.pinned_at,
            "pinned_by": self.pinned_by,
        }


def pinned_key(db: FleetDB, fleet: str, device: str) -> bytes | None:
    """The device's pinned key (``DAMAGED`` when the stored one is not a key), None when it has none."""
    row = db.execute("SELECT key FROM device_keys WHERE fleet = ? AND device = ?", (fleet, device)).fetchone()
    if row is None:
        return None
    try:
        return parse_key_text(row[0])
    except BadSignedMessage:
        return DAMAGED


def pin_first(db: FleetDB, fleet: str, device: str, key: bytes, now: float) -> bytes:
    """Pin ``key`` unless the device has a key pinned already (another collector may have pinned one a moment
    ago); the key pinned now. In the caller's transaction."""
    db.execute(
        "INSERT INTO device_keys (fleet, device, key, pinned_at, pinned_by, refused) VALUES (?, ?, ?, ?, 'birth', 0) "
        "ON CONFLICT (fleet, device) DO NOTHING",
        (fleet, device, key_text(key), now),
    )
    got = pinned_key(db, fleet, device)
    return DAMAGED if got is None else got


def record_refusal(db: FleetDB, fleet: str, device: str, reason: str, key: bytes | None, now: float) -> None:
    """One more birth or death refused against the device's pin (``reason`` one of ``REFUSALS``; ``key``: the
    key the message named, if any)."""
    db.execute(
        "UPDATE device_keys SET refused = refused + 1, refused_reason = ?, refused_key = ?, refused_at = ? "
        "WHERE fleet = ? AND device = ?",
        (reason, key_text(key) if key else None, now, fleet, device),
    )


# the operator's commands (edgekit fleet trust-key / forget-key / keys) -------------------------------------------
def _check_ids(fleet: str, device: str) -> None:
    check_part(fleet, "fleet")
    check_part(device, "device id")


def trust_key(db_url: str, fleet: str, device: str, key: bytes, *, now: float) -> tuple[Pin, Pin | None]:
    """Pin ``key`` (32 raw bytes) for the device, replacing any pin it had (its refusals cleared); the new pin and
    the one it replaced."""
    _check_ids(fleet, device)
    if len(key) != 32:
        raise EdgeError(f"a device key is 32 bytes, not {len(key)}")
    with open_db(db_url, must_exist=True) as db:
        old = _pin(db, fleet, device)
        db.execute("DELETE FROM device_keys WHERE fleet = ? AND device = ?", (fleet, device))
        db.execute(
            "INSERT INTO device_keys (fleet, device, key, pinned_at, pinned_by, refused) "
            "VALUES (?, ?, ?, ?, 'operator', 0)",
            (fleet, device, key_text(key), now),
        )
        db.commit()
    return Pin(fleet, device, key, now, "operator"), old


def forget_key(db_url: str, fleet: str, device: str) -> Pin | None:
    """Remove the device's pin (its next signed birth pins again); the pin removed, None when it had none."""
    _check_ids(fleet, device)
    with open_db(db_url, must_exist=True) as db:
        old = _pin(db, fleet, device)
        db.execute("DELETE FROM device_keys WHERE fleet = ? AND device = ?", (fleet, device))
        db.commit()
    return old


def _pin(db: FleetDB, fleet: str, device: str) -> Pin | None:
    row = db.execute(
        "SELECT pinned_at, pinned_by FROM device_keys WHERE fleet = ? AND device = ?", (fleet, device)
    ).fetchone()
    if row is None:
        return None
    key = pinned_key(db, fleet, device)
    return Pin(fleet, device, key or DAMAGED, float(row[0]), str(row[1])[:20])
