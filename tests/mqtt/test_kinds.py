"""The MQTT message kinds, declared once (``edge.mqtt.topics.DEVICE_KINDS``): the topic check, the session's
stream, the collector's stored and ignored kinds and the published JSON Schema all agree with that one table
(before, four hand-written lists: topics, payloads, fleet/decode, fleet/collector_sql)."""

from __future__ import annotations

from edge.fleet import decode
from edge.fleet.collector_sql import STREAM_KINDS as WRITER_STREAM_KINDS
from edge.mqtt import payloads
from edge.mqtt.topics import CONTROL_KINDS, DEVICE_KINDS, INBOUND_KINDS, KINDS, STORED_KINDS, STREAM_KINDS


def test_every_kind_has_one_role_and_the_lists_derive_from_it() -> None:
    assert KINDS == tuple(DEVICE_KINDS) and set(DEVICE_KINDS.values()) <= {
        "stream",
        "control",
        "rollout",
        "reply",
        "command",
    }
    assert STREAM_KINDS == ("telemetry", "state") and CONTROL_KINDS == ("birth", "death")
    assert set(STORED_KINDS) == set(STREAM_KINDS) | set(CONTROL_KINDS)
    assert payloads.STREAM_KINDS is STREAM_KINDS and WRITER_STREAM_KINDS is STREAM_KINDS


def test_the_collector_stores_or_leaves_every_kind_a_device_sends() -> None:
    assert decode.KINDS == STORED_KINDS
    assert set(decode.NOT_STORED) == {"reported", "tune", "desired"}
    assert set(decode.KINDS) | set(decode.NOT_STORED) | {"cmd"} == set(KINDS) | set(INBOUND_KINDS)
    assert not set(decode.KINDS) & set(decode.NOT_STORED)


def test_the_published_schema_describes_the_kinds_with_a_body() -> None:
    """Every kind whose payload is an edgekit message (not a tune reply or a command) has its schema, and the
    envelope's ``type`` names exactly the device's."""
    schema = payloads.load_schema()
    with_body = [k for k, role in DEVICE_KINDS.items() if role in ("stream", "control", "rollout")]
    assert schema["$defs"]["envelope"]["properties"]["type"]["enum"] == with_body
    refs = [one["$ref"].rsplit("/", 1)[1] for one in schema["oneOf"]]
    assert sorted(refs) == sorted([*with_body, *INBOUND_KINDS])
