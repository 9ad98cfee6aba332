"""Versioned JSON payloads of the edgekit MQTT protocol.

Every message is one JSON object with the same envelope::

    {"schema_version": 1, "type": "telemetry", "fleet": "lab", "device": "cam-01",
     "session": 7, "seq": 42, "ts": 1767225600.123, ...}

- ``session`` counts agent runs on the device (persisted in its outbox, +1 at every start).
- ``seq`` numbers the device's durable stream within a session: every telemetry and state
  message gets the next one (1, 2, 3, ...), so a collector can tell what is missing.
  A birth or death carries the stream position it was made at (the last ``seq`` issued,
  0 before the first), not a number of its own: births are re-published and a will is armed
  in advance, so giving them numbers would leave holes that are not losses.
- ``connection`` (birth, death) counts connections within a session; a death only marks the
  device offline when it belongs to the device's latest birth (a late will from an older
  connection does not).
- ``historical`` (telemetry, state) is true when the message is replayed from the outbox
  after a reconnect rather than sent live.

The JSON Schema is published as ``edge/mqtt/schema/edgekit-mqtt-v1.schema.json``
(``SCHEMA_FILE``); a change that old collectors cannot read bumps ``SCHEMA_VERSION``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from edge.mqtt.topics import CONTROL_KINDS as CONTROL_KINDS  # the kinds are declared in topics; re-exported
from edge.mqtt.topics import STREAM_KINDS as STREAM_KINDS

SCHEMA_VERSION = 1
#: the largest cmd/tune request a device reads (the host refuses to send a bigger one)
MAX_TUNE_REQUEST_BYTES = 64 * 1024
SCHEMA_FILE = Path(__file__).resolve().parent / "schema" / "edgekit-mqtt-v1.schema.json"


def finite(obj: Any) -> Any:
    """JSON has no NaN/Infinity: non-finite floats become null (recursively)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def message(
    kind: str, fleet: str, device: str, session: int, seq: int, body: dict[str, Any], ts: float | None = None
) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "type": kind,
        "fleet": fleet,
        "device": device,
        "session": session,
        "seq": seq,
        "ts": round(time.time() if ts is None else ts, 6),
        **finite(body),
    }


def encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False, default=str).encode()


def mark_historical(payload: bytes) -> bytes:
    obj = json.loads(payload)
    obj["historical"] = True
    return encode(obj)


def load_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    return schema
