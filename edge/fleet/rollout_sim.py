"""Simulated devices that speak the rollout protocol: many on one ``NetworkLoop``, each its own MQTT connection.

Each one is the agent's own ``DeviceSession`` (retained birth, last will, retained ``reported``, the
``desired`` subscription) and applies a desired state as the agent's protocol does -- parsed by
``DesiredState``, refused when its version is not above every version seen, reported through
``ReportedState`` (downloading, then running, failed or rolled-back with a reason code) -- without
downloading or running a model: ``outcome(device, desired)`` says how the apply ends. Used by the
rollout tests (beside real agents) and ``benchmarks/rollout.py`` (200 devices).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import edge
from edge.mqtt.client import BrokerConfig
from edge.mqtt.desired import DesiredError, DesiredState, Reason, ReportedState
from edge.mqtt.netloop import Backoff, NetworkLoop
from edge.mqtt.outbox import MemoryOutbox
from edge.mqtt.session import DeviceSession, SessionOptions


@dataclass(frozen=True)
class Outcome:
    state: str = "running"  # running, failed or rolled-back
    code: str | None = None  # reason code (edge.mqtt.desired.REASONS) when not running
    p99_ms: float = 5.0
    budget_ms: float = 16.67
    delay_s: float = 0.05  # how long the apply takes


Behaviour = Callable[[str, DesiredState], Outcome]


def always_running(_device: str, _d: DesiredState) -> Outcome:
    return Outcome()


class SimDevice:
    def __init__(self, fleet: SimRolloutFleet, device: str, target: str, bundle_id: str) -> None:
        self.fleet, self.device, self.target, self.bundle_id = fleet, device, target, bundle_id
        self.previous: str | None = None
        self.seen = 0
        self.applied: list[tuple[int, str, str, float]] = []  # (version, bundle, state, time.monotonic())
        self.session = DeviceSession(
            fleet.loop,
            fleet.broker,
            fleet.fleet,
            device,
            MemoryOutbox(),
            birth_body=self._birth,
            on_desired=self._on_desired,
            options=SessionOptions(client_id=f"edgekit-sim-{fleet.fleet}-{device}", backoff=fleet.backoff),
        )

    def _birth(self) -> dict[str, Any]:
        return {
            "state": "running",
            "state_detail": None,
            "agent": {
                "edgekit_version": edge.__version__,
                "pid": 0,
                "started_at": round(time.time(), 3),
                "interval_s": 5.0,
                "source": "simulated",
                "fps": 30.0,
                "budget_ms": 16.67,
            },
            "bundle": {"id": self.bundle_id, "target": self.target, "precision": "fp32"},
            "runner": {"runtime": "simulated", "device_requested": "CPU", "device_used": "CPU"},
            "host": {"hostname": self.device, "os": "linux", "arch": "x86_64", "model": "simulated"},
        }

    def _on_desired(self, payload: bytes) -> None:  # loop thread
        try:
            d = DesiredState.parse(payload, fleet=self.fleet.fleet, device=self.device)
        except DesiredError:
            return
        if d.version <= self.seen:
            return
        self.seen = d.version
        self._report(d, "downloading", None, None)
        out = self.fleet.behaviour(self.device, d)
        self.fleet.loop.call_later(out.delay_s, self._finish, d, out)

    def _finish(self, d: DesiredState, out: Outcome) -> None:
        if d.version != self.seen:
            return  # superseded meanwhile
        health = None
        if out.state == "running":
            if self.bundle_id != d.bundle_id:
                self.previous, self.bundle_id = self.bundle_id, d.bundle_id
                self.session._publish_birth()
            health = {
                "frames": 100,
                "p50_ms": out.p99_ms / 2,
                "p99_ms": out.p99_ms,
                "budget_ms": out.budget_ms,
                "errors": 0,
            }
        elif out.state == "rolled-back":
            health = {
                "frames": 100,
                "p50_ms": out.p99_ms / 2,
                "p99_ms": out.p99_ms,
                "budget_ms": out.budget_ms,
                "errors": 0,
            }
        reason = (
            None
            if out.code is None
            else Reason(
                out.code, f"simulated: {out.code}", "watching" if out.state == "rolled-back" else "smoke-testing"
            )
        )
        self._report(d, out.state, reason, health)
        self.applied.append((d.version, d.bundle_id, out.state, time.monotonic()))

    def _report(self, d: DesiredState, state: str, reason: Reason | None, health: dict[str, Any] | None) -> None:
        r = ReportedState(
            state=state,
            bundle_running=self.bundle_id,
            rollout_id=d.rollout_id,
            desired_version=d.version,
            desired_bundle=d.bundle_id,
            reason=reason,
            health=health,
        )
        self.session.publish_reported(r.body())


class SimRolloutFleet:
    def __init__(
        self,
        broker: BrokerConfig,
        fleet: str,
        devices: dict[str, tuple[str, str]],
        *,
        behaviour: Behaviour = always_running,
        loop: NetworkLoop | None = None,
        backoff: Backoff = Backoff(0.1, 2.0),
    ) -> None:
        """``devices``: device id -> (target class, bundle id it runs)."""
        self.broker, self.fleet, self.behaviour, self.backoff = broker, fleet, behaviour, backoff
        self.loop = loop or NetworkLoop(name="edgekit-sim-rollout")
        self._own_loop = loop is None
        self.devices = {d: SimDevice(self, d, t, b) for d, (t, b) in devices.items()}

    def start(self) -> SimRolloutFleet:
        if self._own_loop:
            self.loop.start()

        def go() -> None:
            for dev in self.devices.values():
                dev.session.start()

        self.loop.run(go)
        return self

    def connected(self) -> int:
        return int(self.loop.run(lambda: sum(d.session.connected for d in self.devices.values())))

    def bundles(self) -> dict[str, str]:
        return dict(self.loop.run(lambda: {k: d.bundle_id for k, d in self.devices.items()}))

    def stop(self, timeout: float = 10.0) -> None:
        def close_all() -> None:
            for d in self.devices.values():
                d.session.conn.close()

        self.loop.run(close_all)
        deadline = time.monotonic() + timeout
        for d in self.devices.values():
            d.session.conn.closed.wait(max(0.0, deadline - time.monotonic()))
        if self._own_loop:
            self.loop.stop()

    def __enter__(self) -> SimRolloutFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
