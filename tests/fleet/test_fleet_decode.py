"""The collector's decoder and store never crash on what arrives: hypothesis fuzzing plus the known bad cases."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("hypothesis", reason="hypothesis is not installed (pip install 'edgekit-ml[dev]')")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from edge.fleet.collector import Collector, CollectorConfig  # noqa: E402
from edge.fleet.db import open_db  # noqa: E402
from edge.fleet.decode import REASONS, Decoded, Rejected, decode, flag, integer, num, text  # noqa: E402
from edge.mqtt.client import BrokerConfig  # noqa: E402

TOPIC = "edgekit/lab/cam-01/telemetry"


def good(kind: str = "telemetry", **over: object) -> dict:
    msg: dict = {
        "schema_version": 1,
        "type": kind,
        "fleet": "lab",
        "device": "cam-01",
        "session": 3,
        "seq": 7,
        "ts": 1767225600.5,
    }
    if kind in ("telemetry", "state"):
        msg["historical"] = False
    if kind in ("birth", "death"):
        msg["connection"] = 1
    msg.update(over)
    return msg


def enc(obj: object) -> bytes:
    return json.dumps(obj).encode()


def test_decodes_a_good_message() -> None:
    d = decode(TOPIC, enc(good(inference={"fps": 29.5})))
    assert (d.kind, d.fleet, d.device, d.session, d.seq, d.historical) == ("telemetry", "lab", "cam-01", 3, 7, False)
    assert num(d.payload, "inference", "fps") == 29.5


@pytest.mark.parametrize(
    "topic, payload, reason",
    [
        ("edgekit/lab/cam-01", enc(good()), "bad_topic"),
        ("other/lab/cam-01/telemetry", enc(good()), "bad_topic"),
        ("edgekit/lab/cam-01/cmd/rebirth", enc(good()), "bad_topic"),
        ("edgekit/lab/cam-01/bogus", enc(good()), "bad_topic"),
        (TOPIC, b"x" * 70_000, "oversized"),
        (TOPIC, b"\xff\xfe", "malformed"),
        (TOPIC, b"{not json", "malformed"),
        (TOPIC, b"[1, 2]", "malformed"),
        (TOPIC, b'{"schema_version": 1, "ts": NaN}', "malformed"),
        (TOPIC, b"[" * 100_000 + b"]" * 100_000, "oversized"),
        (TOPIC, b"[" * 20_000 + b"]" * 20_000, "malformed"),
        (TOPIC, enc(good(schema_version=2)), "unknown_schema"),
        (TOPIC, enc(good(schema_version="1")), "malformed"),
        (TOPIC, enc(good(device="cam-02")), "topic_mismatch"),
        (TOPIC, enc(good(fleet="other")), "topic_mismatch"),
        (TOPIC, enc(good(type="state")), "topic_mismatch"),
        (TOPIC, enc(good(seq=-1)), "malformed"),
        (TOPIC, enc(good(seq=0)), "malformed"),
        (TOPIC, enc(good(seq=True)), "malformed"),
        (TOPIC, enc(good(session=2**70)), "malformed"),
        (TOPIC, enc(good(ts="yesterday")), "malformed"),
        (
            TOPIC,
            b'{"schema_version": 1, "type": "telemetry", "fleet": "lab", "device": "cam-01", "session": 1, '
            b'"seq": 1, "ts": 1e999, "historical": false}',
            "malformed",
        ),
        (TOPIC, enc(good(historical="no")), "malformed"),
        ("edgekit/lab/cam-01/birth", enc(good("birth", connection=None)), "malformed"),
    ],
)
def test_rejects_with_a_reason(topic: str, payload: bytes, reason: str) -> None:
    with pytest.raises(Rejected) as e:
        decode(topic, payload)
    assert e.value.reason == reason


def test_a_skipped_payload_is_oversized_whatever_the_limit() -> None:
    """The lean client hands an over-limit PUBLISH on as ``TooLarge`` (its payload skipped unread): refused as
    oversized even where --max-payload-bytes is raised past the client's packet limit (json raised TypeError)."""
    from edge.mqtt.lite import TooLarge

    with pytest.raises(Rejected) as e:
        decode(TOPIC, TooLarge(100), max_bytes=1 << 21)
    assert e.value.reason == "oversized"


def test_lenient_metric_readers() -> None:
    x = {"a": {"b": "7", "c": 1e400, "d": True, "e": 3, "s": "ok\x00\ud800"}}
    assert num(x, "a", "b") is None and num(x, "a", "c") is None and num(x, "a", "d") is None
    assert integer(x, "a", "e") == 3 and num(x, "a", "missing", "deeper") is None
    assert flag(x, "a", "d") is True and flag(x, "a", "e") is None
    assert text(x, "a", "s") == "ok?"


json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_value = st.recursive(
    json_leaf,
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)),
    max_leaves=20,
)
KEYS = [
    "schema_version",
    "type",
    "fleet",
    "device",
    "session",
    "seq",
    "ts",
    "historical",
    "connection",
    "inference",
    "process",
    "thermal",
    "spool",
    "bundle",
    "runner",
    "agent",
    "host",
    "state",
    "detail",
    "reason",
]
topic_part = st.sampled_from(["lab", "cam-01", "+", "#", "", "edgekit", "a/b", "x" * 200, "é"])
topics = st.one_of(
    st.builds(
        lambda a, b, c: f"edgekit/{a}/{b}/{c}",
        topic_part,
        topic_part,
        st.sampled_from(["birth", "telemetry", "state", "death", "cmd", "x"]),
    ),
    st.text(max_size=60),
)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, bytes]:
    kind = draw(st.sampled_from(["birth", "telemetry", "state", "death"]))
    msg = good(kind)
    for key in draw(st.lists(st.sampled_from(KEYS), max_size=5)):
        if draw(st.booleans()):
            msg[key] = draw(json_value)
        else:
            msg.pop(key, None)
    raw = json.dumps(msg, allow_nan=True).encode()
    cut = draw(st.integers(min_value=0, max_value=len(raw)))
    if draw(st.booleans()):
        raw = raw[:cut] + draw(st.binary(max_size=8)) + raw[cut:]
    return f"edgekit/lab/cam-01/{kind}", raw


def _check(topic: str, payload: bytes) -> None:
    try:
        d = decode(topic, payload)
    except Rejected as r:
        assert r.reason in REASONS
        return
    assert isinstance(d, Decoded) and d.session >= 0 and d.seq >= 0 and math.isfinite(d.ts)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topics, st.binary(max_size=300))
def test_fuzz_random_bytes(topic: str, payload: bytes) -> None:
    _check(topic, payload)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_fuzz_mutated_messages(case: tuple[str, bytes]) -> None:
    _check(*case)


@pytest.fixture(scope="module")
def store_collector() -> Collector:
    db = open_db("sqlite:///:memory:")
    c = Collector(CollectorConfig(BrokerConfig("127.0.0.1", 1), "sqlite:///:memory:"), db=db)
    yield c
    db.close()


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(st.one_of(mutated(), st.tuples(topics, st.binary(max_size=200))))
def test_fuzz_the_whole_store_path(store_collector: Collector, case: tuple[str, bytes]) -> None:
    """decode + insert + gap accounting on a real SQLite store: an outcome, never an exception."""
    outcome = store_collector.handle(*case)
    assert outcome in ("stored", "duplicate", *REASONS)
    store_collector.flush()
