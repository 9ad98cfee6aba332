"""Issue #26 item 14: with no --abort-if a failed canary stops its cohort, and "completed" is said only when
devices reached the bundle (a real Mosquitto; devices speak the agent's own DeviceSession/DesiredState).

Before: two canary devices failed (untrusted), the waves went on, and the rollout said "completed".
"""

from __future__ import annotations

from typing import Any

import pytest

from edge.fleet.rollout import RolloutController, RolloutError, RolloutSpec, start_rollout, status
from edge.fleet.rollout_sim import Outcome
from edge.mqtt.desired import DesiredState
from tests.fleet.test_fleet_rollout import FLEET, _fake, broker, db, drive, sims, synced_with, view  # noqa: F401


def untrusted(device: str, d: DesiredState) -> Outcome:
    return Outcome("running") if d.bundle_id == "model-old" else Outcome("failed", "untrusted")


def _run(broker: Any, db: Any, view: Any, abort_if: list[str]) -> dict[str, Any]:  # noqa: F811
    old, new = _fake("model-old", "x86-cpu"), _fake("model-new", "x86-cpu")
    fleet = sims(broker, {f"sim-{i}": ("x86-cpu", old.bundle_id) for i in range(3)}, behaviour=untrusted)
    try:
        synced_with(view, 3)
        spec = RolloutSpec.parse(fleet=FLEET, canary="5%", waves="50%,100%", watch="0.2s", device_timeout="20s",
                                 abort_if=abort_if)
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
    assert RolloutSpec.parse(fleet=FLEET).abort_if == ("failed>0",)
    assert RolloutSpec.parse(fleet=FLEET, abort_if=["none"]).abort_if == ()
    with pytest.raises(RolloutError, match="none cannot be combined"):
        RolloutSpec.parse(fleet=FLEET, abort_if=["none", "p99>budget"])
