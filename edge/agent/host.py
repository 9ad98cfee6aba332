"""What a deployment (``apply.Applier``) and a tune job (``tune_cmd.TuneJob``) may touch of the agent.

The agent hands itself to both; they see it only through :class:`AgentHost`, so neither imports
``edge.agent.agent`` and the agent can change everything not named here.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from edge.mqtt.desired import DesiredState, ReportedState
from edge.mqtt.ratelog import RateLimitedLog


class AgentHost(Protocol):
    config: Any  # edge.agent.agent.AgentConfig
    store: Any  # edge.store.local.DeviceStore, None before the first load
    bundle: Any  # the current edge.bundle.bundle.Bundle, or None
    runner: Any  # its runner, or None
    worker: Any  # edge.agent.worker.InferenceWorker, or None
    app: Any  # edge.agent.appsocket.AppSocket with --source app, else None
    session: Any  # edge.mqtt.session.DeviceSession, or None before the first connection
    loop: Any  # edge.mqtt.netloop.NetworkLoop, or None
    state: str
    budget_ms: float | None  # the budget the running bundle is judged against (the bundle's, or --budget-ms)
    state_detail: str | None
    counters: dict[str, int]
    held: DesiredState | None  # a desired state waiting for a tune to end
    runtime_lock: threading.RLock  # the runner, worker and bundle change together, under it
    ratelog: RateLimitedLog  # every line caused by a message: at most one per reason per interval

    def reload(self, why: str) -> None: ...

    def record_desired(self, desired: DesiredState, state: str) -> None: ...

    def report(self, state: ReportedState) -> None: ...

    def tune_start(self, job: Any) -> str | None: ...

    def tune_done(self, job: Any) -> None: ...
