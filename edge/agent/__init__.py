"""The device agent: runs the current bundle, applies desired states, reports over MQTT.

Small on purpose: paho-mqtt (imported on first use), the one runtime the bundle needs, and
the standard library. Modules: ``topics`` and ``payloads`` (the protocol), ``mqtt`` (broker
address, TLS, credentials), ``netloop`` (one thread driving MQTT clients, reconnect with
back-off and jitter), ``outbox`` (the durable, bounded spool), ``session`` (birth, death,
sequence numbers, replay), ``health``/``thermal``/``tegrastats`` (what the device reports),
``sources`` (frames: synthetic, or the application's workload through ``edge.video``),
``desired``/``download``/``artifact``/``apply`` (desired and reported state: download with resume,
verify, smoke test, switch, watch, roll back), ``agent`` (all of it together), ``main`` (the lean
command line: ``python -m edge.agent``, no typer/rich), ``appsocket`` (an application reports its own
frames to the agent: ``edge.agent.report(latency_ms=...)`` or ``AppReporter``).
"""

from __future__ import annotations

from typing import Any


def report(**kwargs: Any) -> bool:
    """Report the application's inference to the local agent (``--source app``); see ``edge.agent.appsocket.report``."""
    from edge.agent.appsocket import report as _report

    return _report(**kwargs)
