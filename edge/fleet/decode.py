"""Decode one MQTT message into a checked record, or say exactly why not.

The collector never trusts a payload: every failure is a ``Rejected`` with one of
``REASONS`` (counted and logged by the collector), never another exception. Fuzzed with
hypothesis in ``tests/fleet/test_fleet_decode.py``.

JSON is parsed with orjson when it is installed (the ``fleet`` extra; about 4x faster than the
standard library on a telemetry message, which matters at tens of thousands of messages a
second), and with the standard library otherwise. A payload orjson refuses is parsed again
with the standard library, so both accept exactly the same messages (orjson alone refuses
lone surrogate escapes, which ``json.dumps`` writes for a ``surrogateescape``'d string).
"""

from __future__ import annotations

import json
import math
from types import MappingProxyType
from typing import Any, Callable, Mapping, NamedTuple

from edge.mqtt.identity import BadSignedMessage, Signed, signed_part
from edge.mqtt.lite import TooLarge
from edge.mqtt.payloads import SCHEMA_VERSION
from edge.mqtt.topics import INBOUND_KINDS, STORED_KINDS, Topic, TopicError
from edge.mqtt.topics import KINDS as TOPIC_KINDS

_orjson: Any  # the orjson module, or None where it is not installed
try:
    import orjson as _orjson
except ImportError:  # optional: the standard library parses the same messages, slower
    _orjson = None

MAX_PAYLOAD_BYTES = 64 * 1024
REASONS = (
    "not_stored",
    "bad_topic",
    "oversized",
    "malformed",
    "unknown_schema",
    "topic_mismatch",
    "future_session",
    "seq_jump",
    "unsigned",
    "wrong_key",
    "bad_signature",
)  # seq_jump: decided by the collector against the stream's position (Collector.max_seq_jump); unsigned, wrong_key,
# bad_signature: a birth or death against the device's pinned key (edge.fleet.device_keys)
KINDS = STORED_KINDS
#: device topics the collector's subscription also sees and leaves alone (counted, not logged): desired, reported,
#: tune (replies to edgekit fleet tune, edge.agent.tune_cmd)
NOT_STORED = tuple(k for k in (*TOPIC_KINDS, *INBOUND_KINDS) if k not in STORED_KINDS and k != "cmd")
# Every integer stored is below 2**53: exact in JSON everywhere (JavaScript, float parsers), and a sum of
# up to 1024 of them still fits the 64-bit integers of SQLite and PostgreSQL.
INT_LIMIT = 2**53
MAX_SESSION_SKEW_S = 300.0


class Rejected(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        assert reason in REASONS
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


class Decoded(NamedTuple):
    """A checked message. A tuple (made at C speed, unlike a frozen dataclass: about 2 µs less a message);
    its first five fields, ``d[:5]``, are the message's identity."""

    kind: str
    fleet: str
    device: str
    session: int
    seq: int
    ts: float
    payload: dict[str, Any]
    connection: int | None = None  # birth, death
    historical: bool = False  # telemetry, state
    signed: Signed | None = None  # birth, death: the device key's signature, its form checked (edge.mqtt.identity)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _uint(obj: dict[str, Any], key: str) -> int:
    v = obj.get(key)
    if type(v) is not int or not 0 <= v < INT_LIMIT:
        raise Rejected("malformed", f"{key} must be an integer from 0 to 2**53-1, got {str(v)[:40]!r}")
    return v


def _std_loads(payload: bytes) -> Any:
    return json.loads(payload.decode("utf-8"), parse_constant=_no_constants)


def _fast_loads(payload: bytes) -> Any:
    try:
        return _orjson.loads(payload)
    except _orjson.JSONDecodeError:
        return _std_loads(payload)  # the exact verdict (and message) of the standard library


JSON_LIBRARY = "orjson" if _orjson is not None else "json"
loads: Callable[[bytes], Any] = _fast_loads if _orjson is not None else _std_loads


def parse_topic(topic: str) -> Topic:
    try:
        t = Topic.parse(topic)
    except TopicError as e:
        raise Rejected("bad_topic", str(e)) from None
    if t.kind in NOT_STORED:
        raise Rejected("not_stored", f"{t.kind} messages are the rollout's (edge.mqtt.desired), not telemetry")
    if t.kind not in KINDS:
        raise Rejected("bad_topic", f"the collector does not take {t.kind} messages")
    return t


def decode(
    topic: str | Topic,
    payload: bytes | TooLarge,
    *,
    max_bytes: int = MAX_PAYLOAD_BYTES,
    now: float | None = None,
    max_session_skew_s: float = MAX_SESSION_SKEW_S,
) -> Decoded:
    """One message, checked. With ``now`` (the receiver's clock, Unix seconds), a session ahead of it by more
    than ``max_session_skew_s`` is refused: agents number sessions from their clock, and a larger session
    always wins, so one forged far-future session would freeze a device's row on forged data for good.
    ``topic`` may be a ``Topic`` that ``parse_topic`` returned (``TopicCache`` keeps them)."""
    t = topic if isinstance(topic, Topic) else parse_topic(topic)
    if len(payload) > max_bytes or isinstance(payload, TooLarge):  # TooLarge: skipped unread by the lean client
        raise Rejected("oversized", f"{len(payload)} bytes, limit {max_bytes}")
    try:
        obj = loads(payload)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise Rejected("malformed", f"not JSON: {str(e)[:80]}") from None
    if not isinstance(obj, dict):
        raise Rejected("malformed", f"payload is a JSON {type(obj).__name__}, not an object")
    version = obj.get("schema_version")
    if type(version) is not int:
        raise Rejected("malformed", "no integer schema_version")
    if version != SCHEMA_VERSION:
        raise Rejected("unknown_schema", f"schema_version {version}; this collector reads {SCHEMA_VERSION}")
    if obj.get("type") != t.kind:
        raise Rejected("topic_mismatch", f"type {str(obj.get('type'))[:40]!r} on a {t.kind} topic")
    if obj.get("fleet") != t.fleet or obj.get("device") != t.device:
        raise Rejected(
            "topic_mismatch",
            f"payload says {str(obj.get('fleet'))[:40]!r}/{str(obj.get('device'))[:40]!r}, topic says {t.fleet}/{t.device}",
        )
    session, seq = _uint(obj, "session"), _uint(obj, "seq")
    if now is not None and session > now + max_session_skew_s:
        raise Rejected(
            "future_session",
            f"session {session} is {session - now:.0f} s ahead of this collector's clock (at most {max_session_skew_s:.0f} s allowed)",
        )
    ts = obj.get("ts")
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not math.isfinite(ts):  # JSON: exactly these
        raise Rejected("malformed", "ts must be a finite number")
    connection = _uint(obj, "connection") if t.kind in ("birth", "death") else None
    historical = obj.get("historical", False)
    if type(historical) is not bool:
        raise Rejected("malformed", "historical must be true or false")
    if t.kind in ("telemetry", "state") and seq == 0:
        raise Rejected("malformed", "stream messages are numbered from 1")
    if connection is None:  # telemetry, state: the hot path, nothing signed
        return Decoded(t.kind, t.fleet, t.device, session, seq, float(ts), obj, None, historical)
    try:
        signed = signed_part(bytes(payload), obj)
    except BadSignedMessage as e:
        raise Rejected("malformed", f"signed {t.kind}: {e}") from None
    return Decoded(t.kind, t.fleet, t.device, session, seq, float(ts), obj, connection, historical, signed)


class TopicCache:
    """``parse_topic`` remembered for up to ``cap`` valid topics (the oldest forgotten first): a device sends on
    the same few topics all day, and checking every part of a topic costs more than orjson's parse of the payload.
    Refused topics are not kept, so forged ones cost time, not memory."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._seen: dict[str, Topic] = {}

    def __call__(self, topic: str) -> Topic:
        t = self._seen.get(topic)
        if t is None:
            t = self._seen[topic] = parse_topic(topic)
            if len(self._seen) > self.cap:
                del self._seen[next(iter(self._seen))]
        return t

    def __len__(self) -> int:
        return len(self._seen)


# lenient readers for the columns: a metric of the wrong type is stored as NULL, the message is kept
def number(v: Any) -> float | None:
    """``v`` as a float when it is a JSON number (not a bool) of magnitude below 1e300; None otherwise."""
    t = type(v)
    if (t is float or t is int) and -1e300 < v < 1e300:  # NaN and infinities fail; huge ints never overflow
        return float(v)
    return None


def num(obj: Any, *path: str) -> float | None:
    for p in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(p)
    return number(obj)


def section(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``obj[key]`` when it is an object, else an empty one (the lenient readers then give None)."""
    v = obj.get(key)
    return v if type(v) is dict else _EMPTY


_EMPTY: Mapping[str, Any] = MappingProxyType({})


def whole(v: Any) -> int | None:
    """``v`` as an int when it is a JSON number with no fraction below 2**53 in magnitude; None otherwise."""
    f = number(v)
    return int(f) if f is not None and abs(f) < INT_LIMIT and f == int(f) else None


def integer(obj: Any, *path: str) -> int | None:
    for p in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(p)
    return whole(obj)


def text(obj: Any, *path: str, limit: int = 200) -> str | None:
    for p in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(p)
    if not isinstance(obj, str):
        return None
    # PostgreSQL text holds neither NUL nor lone surrogates (both can arrive as JSON escapes)
    return obj[:limit].replace("\x00", "").encode("utf-8", "replace").decode("utf-8")


def flag(obj: Any, *path: str) -> bool | None:
    for p in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(p)
    return obj if isinstance(obj, bool) else None


#: what ``telemetry_columns`` returns, in order: the telemetry table's metric columns first, then the device row's
TELEMETRY_METRICS = (
    "fps",
    "p50_ms",
    "p99_ms",
    "max_ms",
    "misses",
    "frames",
    "cpu_percent",
    "rss_mb",
    "temp_c",
    "budget_ms",
    "throttled",
    "spool_pending",
    "spool_dropped",
    "interval_s",
    "bundle_id",
)


def telemetry_columns(x: Mapping[str, Any]) -> tuple[Any, ...]:
    """A telemetry payload's stored values (``TELEMETRY_METRICS``), each read as the lenient readers above read
    it (``number``, ``whole``, ``flag``, ``text``: a value of the wrong type is None), in one pass: the
    collector's hot path, once a message for the telemetry row and the device row both."""
    inf, proc, spool = section(x, "inference"), section(x, "process"), section(x, "spool")
    thermal, lat = section(x, "thermal"), section(inf, "latency_ms")
    throttled = thermal.get("throttled_now")
    bundle = x.get("bundle_id")
    return (
        number(inf.get("fps")),
        number(lat.get("p50_ms")),
        number(lat.get("p99_ms")),
        number(lat.get("max_ms")),
        whole(inf.get("budget_misses")),
        whole(inf.get("frames")),
        number(proc.get("cpu_percent")),
        number(proc.get("rss_mb")),
        number(thermal.get("max_c")),
        number(inf.get("budget_ms")),
        throttled if type(throttled) is bool else None,
        whole(spool.get("pending")),
        whole(spool.get("dropped_total")),
        number(x.get("interval_s")),
        text(x, "bundle_id") if type(bundle) is str else None,
    )
