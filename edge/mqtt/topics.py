"""MQTT topics of the edgekit protocol, as a value that formats and parses itself.

    edgekit/<fleet>/<device>/{birth,telemetry,state,death,reported}   the device publishes
    edgekit/<fleet>/<device>/tune                                      the device's replies to cmd/tune
    edgekit/<fleet>/<device>/desired                                   the device reads (retained)
    edgekit/<fleet>/<device>/cmd/<name>                                the device reads

A fleet, device or command name containing ``/``, ``+`` or ``#`` (or nothing, or a NUL)
would silently change what a topic or a subscription means, and one with a control character
(newline, ESC) would forge log lines or terminal output wherever it is shown, so both are
refused here, once, instead of being escaped somewhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge.errors import EdgeError

ROOT = "edgekit"
#: The message kinds, declared once: what a device publishes, plus ``cmd`` (read), and what each is. The broker ACL
#: (edge.fleet.acl) lets a device write every kind here except ``cmd``; ``desired`` is in ``INBOUND_KINDS``: a device
#: reads it, never writes it. The collector stores the stream and control kinds (``STORED_KINDS``).
DEVICE_KINDS = {
    "birth": "control",  # retained, one per connection (edge.mqtt.session)
    "telemetry": "stream",  # spooled, numbered, replayed (edge.mqtt.outbox)
    "state": "stream",
    "death": "control",  # the will armed with each birth
    "reported": "rollout",  # retained: where the device stands with its desired state (edge.mqtt.desired)
    "tune": "reply",  # cmd/tune replies (edge.agent.tune_cmd)
    "cmd": "command",  # read by the device
}
KINDS = tuple(DEVICE_KINDS)
INBOUND_KINDS = ("desired",)
STREAM_KINDS = tuple(k for k, role in DEVICE_KINDS.items() if role == "stream")
CONTROL_KINDS = tuple(k for k, role in DEVICE_KINDS.items() if role == "control")
STORED_KINDS = tuple(k for k, role in DEVICE_KINDS.items() if role in ("stream", "control"))
_FORBIDDEN = ("/", "+", "#", "\x00")
MAX_PART = 128


class TopicError(EdgeError):
    """A topic, or a part of one, that is not a valid edgekit topic."""


def check_part(value: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise TopicError(f"{what} must be a non-empty string, got {value!r}")
    bad = [c for c in _FORBIDDEN if c in value]
    if bad:
        raise TopicError(
            f"{what} {value!r} contains {', '.join(repr(c) for c in bad)}",
            hint="device ids, fleet and command names may not contain '/', '+', '#' or NUL",
        )
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value):  # MQTT 5 §1.5.4: SHOULD NOT appear
        raise TopicError(
            f"{what} {value!r} contains a control character",
            hint="a device id ends up in log lines and terminal tables, where one could forge either",
        )
    if len(value) > MAX_PART:
        raise TopicError(f"{what} is {len(value)} characters long; at most {MAX_PART}")
    if value != value.strip():
        raise TopicError(f"{what} {value!r} has leading or trailing whitespace")
    return value


@dataclass(frozen=True)
class Topic:
    fleet: str
    device: str
    kind: str
    command: str | None = None  # only for kind == "cmd"

    def __post_init__(self) -> None:
        check_part(self.fleet, "fleet")
        check_part(self.device, "device id")
        if self.kind not in KINDS and self.kind not in INBOUND_KINDS:
            raise TopicError(f"unknown topic kind {self.kind!r}; one of {', '.join(KINDS + INBOUND_KINDS)}")
        if (self.kind == "cmd") != (self.command is not None):
            raise TopicError("a command name goes with kind 'cmd', and only with it")
        if self.command is not None:
            check_part(self.command, "command name")

    def __str__(self) -> str:
        base = f"{ROOT}/{self.fleet}/{self.device}/{self.kind}"
        return base if self.command is None else f"{base}/{self.command}"

    @classmethod
    def parse(cls, topic: str) -> Topic:
        parts = topic.split("/")
        if len(parts) not in (4, 5) or parts[0] != ROOT:
            raise TopicError(f"not an edgekit topic: {topic[:200]!r}")
        if len(parts) == 5 and parts[3] != "cmd":
            raise TopicError(f"not an edgekit topic: {topic[:200]!r}")
        return cls(parts[1], parts[2], parts[3], parts[4] if len(parts) == 5 else None)


def fleet_filter(fleet: str = "+", kind: str = "+") -> str:
    """A subscription filter for one kind of message (``+``: any) of every device of a fleet (``+``: any)."""
    if fleet != "+":
        check_part(fleet, "fleet")
    if kind != "+" and kind not in KINDS and kind not in INBOUND_KINDS:
        raise TopicError(f"unknown topic kind {kind!r}")
    return f"{ROOT}/{fleet}/+/{kind}"


def shared(group: str, topic_filter: str) -> str:
    """An MQTT 5 shared subscription: the broker gives each message to one member of ``group``."""
    check_part(group, "shared subscription group")
    return f"$share/{group}/{topic_filter}"
