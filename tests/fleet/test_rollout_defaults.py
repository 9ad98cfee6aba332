"""Issue #26 items 14-15: with no --abort-if a failed canary stops its cohort, and "completed" is said only when
devices reached the bundle (a real Mosquitto; devices speak the agent's own DeviceSession/DesiredState); a
fleet rollback to a bundle deployed by hand is applied from the device's store (a real agent, a real HTTP server).

Before: two canary devices failed (untrusted), the waves went on, and the rollout said "completed".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edge.fleet.rollout import (
    RolloutBundle,
    RolloutController,
    RolloutError,
    RolloutFlags,
    RolloutSpec,
    set_state,
    start_rollout,
    status,
)
from edge.fleet.rollout_sim import Outcome
from edge.mqtt.desired import DesiredState
from edge.store import DeviceStore
from tests.fleet.test_fleet_rollout import (  # noqa: F401
    FLEET,
    agent_store,
    bundles,
    db,
    drive,
    http,
    prepared,
    sims,
    start_agent,
    synced_with,
    view,
)
from tests.support.cli import wait_for


def _fake(bundle_id: str, target: str) -> RolloutBundle:
    """A bundle the simulated devices never download (they answer from their behaviour)."""
    return RolloutBundle(
        bundle_id=bundle_id, target=target, url=f"http://127.0.0.1:9/{bundle_id}.tar", sha256="ab" * 32, size=1000
    )


def untrusted(device: str, d: DesiredState) -> Outcome:
    return Outcome("running") if d.bundle_id == "model-old" else Outcome("failed", "untrusted")


def _run(broker: Any, db: Any, view: Any, abort_if: list[str]) -> dict[str, Any]:  # noqa: F811
    old, new = _fake("model-old", "x86-cpu"), _fake("model-new", "x86-cpu")
    fleet = sims(broker, {f"sim-{i}": ("x86-cpu", old.bundle_id) for i in range(3)}, behaviour=untrusted)
    try:
        synced_with(view, 3)
        spec = RolloutSpec.parse(
            RolloutFlags(
                fleet=FLEET, canary="5%", waves="50%,100%", watch="0.2s", device_timeout="20s", abort_if=abort_if
            )
        )
        rid = start_rollout(db, view, spec, [new], previous=[old])
        drive(RolloutController(db, rid, view), lambda r: r.finished, 60, "the rollout to finish")
        return status(db, rid)
    finally:
        fleet.stop()


def test_a_failed_canary_stops_the_cohort_by_default(broker: Any, db: Any, view: Any) -> None:  # noqa: F811
    st = _run(broker, db, view, [])
    assert st["state"] == "aborted", st
    c = st["cohorts"][0]
    assert c["state"] == "aborted" and c["wave"] == 0 and c["reason"].startswith("failed>0"), c
    assert len(st["devices"]) == 1 and st["devices"][0]["reason"] == "untrusted"  # only the canary got it


def test_completed_says_how_many_devices_run_the_bundle(broker: Any, db: Any, view: Any) -> None:  # noqa: F811
    st = _run(broker, db, view, ["none"])  # the operator asked for no criterion: every wave goes
    assert st["cohorts"][0]["state"] == "completed" and len(st["devices"]) == 3
    assert st["state"] == "partial", st  # not "completed": no device reached the bundle
    assert st["reason"].startswith("completed: 0 of 3 devices on the bundle (3 failed)"), st["reason"]


def test_none_is_alone() -> None:
    assert RolloutSpec.parse(RolloutFlags(fleet=FLEET)).abort_if == ("failed>0",)
    assert RolloutSpec.parse(RolloutFlags(fleet=FLEET, abort_if=["none"])).abort_if == ()
    with pytest.raises(RolloutError, match="none cannot be combined"):
        RolloutSpec.parse(RolloutFlags(fleet=FLEET, abort_if=["none", "p99>budget"]))


def test_a_bundle_deployed_by_hand_is_rolled_back_to_from_the_store(
    broker: Any,
    db: Any,
    view: Any,  # noqa: F811
    bundles: dict[str, Any],
    http: Any,
    tmp_path: Path,
) -> None:
    """#26 item 15: the device runs A, deployed by hand (no artifact registered for it anywhere). A rollout of B
    aborted after the switch rolls it back to A from its own store: no --previous-url, no download."""
    a, b = bundles["a"], bundles["b"]
    agent = start_agent(broker.url, agent_store(tmp_path / "cam-01", a), "cam-01")
    try:
        synced_with(view, 1)
        wait_for(lambda: view.snapshot()["cam-01"].bundle.get("archive_sha256"), 30, "the birth's archive hash")
        spec = RolloutSpec.parse(
            RolloutFlags(fleet=FLEET, canary="100%", waves="100%", watch="60s", device_timeout="60s")
        )
        rid = start_rollout(db, view, spec, [prepared(bundles, http, "b")])  # no --previous-bundle/-url
        ctl = RolloutController(db, rid, view)
        drive(
            ctl,
            lambda r: status(db, rid)["devices"] and status(db, rid)["devices"][0]["state"] == "running",
            90,
            "cam-01 on B",
        )
        assert DeviceStore(tmp_path / "cam-01").state().current == b.id
        set_state(db, rid, "abort", "the operator changed their mind")
        drive(ctl, lambda r: r.finished, 90, "the rollback")
        dev = status(db, rid)["devices"][0]
        assert dev["rb_state"] == "running" and dev["prev_bundle"] == a.id, dev
        assert DeviceStore(tmp_path / "cam-01").state().current == a.id
        assert agent.counters["downloads"] == 1 and agent.counters["local_switches"] == 1, agent.counters
    finally:
        agent.stop(1.0)
