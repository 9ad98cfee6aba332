"""Fleet rollouts (edge.fleet.rollout) against a real Mosquitto and a real HTTP server serving bundle archives.

Devices: real in-process agents (``edge.agent.Agent``, each its own MQTT connection, store and ONNX Runtime
session on the tiny CNN) beside protocol-level simulated devices (``edge.fleet.rollout_sim``: the agent's
own ``DeviceSession`` and the real ``DesiredState``/``ReportedState``, one MQTT connection each, no model).
The controller is driven step by step (``RolloutController.step``) so every decision is checked as it is made.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from edge.agent.agent import Agent, AgentConfig
from edge.agent.download import DownloadOptions
from edge.bundle.archive import pack_bundle
from edge.deploy import DeviceStore
from edge.fleet.db import open_db
from edge.fleet.rollout import (
    Criterion,
    FleetView,
    RolloutBundle,
    RolloutController,
    RolloutError,
    RolloutFlags,
    RolloutSpec,
    set_state,
    start_rollout,
    status,
)
from edge.fleet.rollout_sim import Outcome, SimRolloutFleet
from edge.graph.samples import build_tiny_cnn
from edge.mqtt.client import BrokerConfig
from edge.mqtt.desired import DesiredState
from edge.mqtt.netloop import Backoff
from edge.pipeline import convert
from edge.targets import get_target
from tests.agent.test_agent_rollout import ArtifactServer
from tests.support import mqtt_broker
from tests.support.cli import assert_user_error, run_cli, wait_for

FLEET = "lab"
N_REAL = 50  # real in-process agents in the good rollout: measured 5 s to start 50, ~150 MB, ~20% of one core


# -- bundles: A (now) and B (new) for two target classes -------------------------------------------------


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory, models: dict[str, Path]) -> dict[str, Any]:
    """x86-cpu: A, B. x86-slow (the same runtime, a class of slower devices): A with the usual frame budget,
    B with a budget no device meets -- the new model is over budget on that class only."""
    d = tmp_path_factory.mktemp("rollout")
    # budgets no loaded CI host misses, but for B on the slow class
    cpu = dataclasses.replace(get_target("x86-cpu"), frame_budget_ms=500.0)
    slow = dataclasses.replace(cpu, name="x86-slow")
    slow_tight = dataclasses.replace(slow, frame_budget_ms=0.0001)
    src_b = build_tiny_cnn(d / "src-b" / "tiny.onnx", seed=1)
    out = {
        "a": convert(models["tiny"], cpu, d / "a"),
        "b": convert(src_b, cpu, d / "b"),
        "a_slow": convert(models["tiny"], slow, d / "a_slow"),
        "b_slow": convert(src_b, slow_tight, d / "b_slow"),
    }
    www = d / "www"
    www.mkdir()
    for name, b in out.items():
        pack_bundle(b.path, www / f"{name}.tar")
    return {**out, "www": www}


@pytest.fixture
def http(bundles: dict[str, Any]) -> Iterator[ArtifactServer]:
    with ArtifactServer(bundles["www"]) as s:
        yield s


def prepared(bundles: dict[str, Any], http: ArtifactServer, name: str) -> RolloutBundle:
    return RolloutBundle.prepare(bundles[name].path, http.url(f"{name}.tar"))


def start_agent(url: str, store: Path, device: str, **kw: Any) -> Agent:
    cfg = dict(
        fleet=FLEET,
        device_id=device,
        broker=BrokerConfig.from_url(url),
        store=store,
        source="synthetic",
        fps=20.0,
        interval_s=1.0,
        backoff=Backoff(0.05, 0.5),
        runner_options={"intra_op_num_threads": 1},
        poll_current_s=0.5,
        watch_s=0.8,
        smoke_frames=10,
        download=DownloadOptions(timeout_s=60, read_timeout_s=5, retry_delay_s=0.05),
    )
    cfg.update(kw)
    return Agent(AgentConfig(**cfg)).start()


def agent_store(root: Path, bundle: Any) -> Path:
    DeviceStore(root).install(bundle)
    return root


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Any]:
    with open_db(f"sqlite:///{tmp_path}/fleet.db") as d:
        yield d


@pytest.fixture
def view(broker: Any) -> Iterator[FleetView]:
    v = FleetView(BrokerConfig.from_url(broker.url), FLEET, client_id="test-rollout").start()
    yield v
    v.close()


def drive(ctl: RolloutController, until: Any, timeout: float = 60.0, what: str = "the rollout") -> Any:
    """Step the controller until ``until(step result)`` is truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        res = ctl.step()
        if until(res):
            return res
        time.sleep(0.1)
    raise AssertionError(
        f"timed out after {timeout} s waiting for {what}; last step {res}, status {status(ctl.db, ctl.rid)['cohorts']}"
    )


def _events(db: Any, rid: str) -> list[dict[str, Any]]:
    return status(db, rid, events=100_000)["events"]


def sims(broker: Any, devices: dict[str, tuple[str, str]], **kw: Any) -> SimRolloutFleet:
    f = SimRolloutFleet(BrokerConfig.from_url(broker.url), FLEET, devices, **kw).start()
    wait_for(lambda: f.connected() == len(devices), 30, "simulated devices connected")
    return f


def synced_with(view: FleetView, n: int) -> None:
    wait_for(
        lambda: view.synced.is_set() and sum(1 for d in view.snapshot().values() if d.birth) >= n,
        30,
        f"{n} births seen by the controller",
    )


# -- parsing: the abort criteria and the spec ---------------------------------------------------------


@pytest.mark.parametrize(
    "text, metric, factor, absolute, count, percent",
    [
        ("p99>budget", "p99", 1.0, None, 0, None),
        ("p99 > 1.2*budget @ 10%", "p99", 1.2, None, None, 10.0),
        ("p99>25", "p99", None, 25.0, 0, None),
        ("fps<0.95*target", "fps", 0.95, None, 0, None),
        ("fallback@2", "fallback", None, None, 2, None),
        ("parity<threshold", "parity", None, None, 0, None),
        ("errors>1%", "errors", None, None, None, 1.0),
        ("rolled_back>3", "rolled_back", None, None, 3, None),
        ("timed_out>50%", "timed_out", None, None, None, 50.0),
    ],
)
def test_abort_criteria_parse(text: str, metric: str, factor: Any, absolute: Any, count: Any, percent: Any) -> None:
    c = Criterion.parse(text)
    assert (c.metric, c.factor, c.absolute, c.count, c.percent) == (metric, factor, absolute, count, percent)


@pytest.mark.parametrize(
    "text",
    [
        "p99>",
        "p99<budget",
        "latency>budget",
        "fps<0.95*budget",
        "errors",
        "errors>1.5",
        "parity<0.9",
        "fallback@",
        "errors>150%",
        "p99>0",
        "import os",
    ],
)
def test_malformed_abort_criteria_are_refused(text: str) -> None:
    with pytest.raises(RolloutError):
        Criterion.parse(text)


def _report(state: str, code: str | None = None, **kw: Any) -> dict[str, Any]:
    from edge.mqtt.desired import Reason, ReportedState

    reason = Reason(code, "x", "watching") if code else None
    return ReportedState(
        state=state, bundle_running="b", rollout_id="r", desired_version=2, desired_bundle="b", reason=reason, **kw
    ).body()


@pytest.mark.parametrize(
    "crit, reports, telemetry, breached",
    [
        ("p99>budget", [_report("failed", "over_budget", smoke={"p99_ms": 3.0, "budget_ms": 2.0})], None, True),
        ("p99>2*budget", [_report("failed", "over_budget", smoke={"p99_ms": 3.0, "budget_ms": 2.0})], None, False),
        ("p99>budget", [_report("running", health={"p99_ms": 1.0, "budget_ms": 2.0})], None, False),
        ("p99>budget", [_report("rolled-back", "watch_p99_over_budget")], None, True),  # no numbers: the reason
        (
            "p99>budget",
            [_report("running")],
            {"bundle_id": "b", "inference": {"latency_ms": {"p99_ms": 9.0}, "budget_ms": 5.0}},
            True,
        ),
        (
            "p99>budget",
            [_report("running")],
            {"bundle_id": "a", "inference": {"latency_ms": {"p99_ms": 9.0}, "budget_ms": 5.0}},
            False,
        ),  # old bundle
        (
            "fps<0.95*target",
            [_report("running")],
            {"bundle_id": "b", "inference": {"fps": 20.0, "target_fps": 30.0, "frames": 100}},
            True,
        ),
        (
            "fps<0.95*target",
            [_report("running")],
            {"bundle_id": "b", "inference": {"fps": 29.0, "target_fps": 30.0, "frames": 100}},
            False,
        ),
        ("fallback", [_report("failed", "fallback")], None, True),
        ("fallback", [_report("running", smoke={"fallback": "CPU instead of GPU"})], None, True),
        ("parity<threshold", [_report("rolled-back", "watch_reference_drift")], None, True),
        ("parity<threshold", [_report("running", reference_check={"passed": True})], None, False),
        ("errors>1%", [_report("failed", "download_failed")] + [_report("running")] * 99, None, False),
        ("errors>1%", [_report("failed", "download_failed")] * 2 + [_report("running")] * 98, None, True),
        ("errors>0", [_report("failed", "superseded")], None, False),  # superseded is not an error
        ("rolled_back>1", [_report("rolled-back", "watch_fallback")] * 2, None, True),
        ("rolled_back>2", [_report("rolled-back", "watch_fallback")] * 2, None, False),
        ("fallback@50%", [_report("failed", "fallback"), _report("running"), _report("running")], None, False),
    ],
)
def test_abort_criteria_on_reported_states(
    crit: str, reports: list[dict[str, Any]], telemetry: Any, breached: bool
) -> None:
    from edge.fleet.rollout import evaluate

    rows = [{"device": f"d{i}", "state": r["state"], "report": None} for i, r in enumerate(reports)]
    why = evaluate(
        Criterion.parse(crit),
        rows,
        {f"d{i}": r for i, r in enumerate(reports)},
        {f"d{i}": telemetry for i in range(len(reports))},
        "b",
        min_devices=1,
    )
    assert (why is not None) == breached, why
    if why:
        assert why.startswith(crit + ": ")


def test_percentages_wait_for_the_minimum_number_of_devices() -> None:
    from edge.fleet.rollout import evaluate

    rows = [{"device": "d0", "state": "failed", "report": None}, {"device": "d1", "state": "assigned", "report": None}]
    reps = {"d0": _report("failed", "load_failed"), "d1": None}
    c = Criterion.parse("errors>10%")
    assert evaluate(c, rows, reps, {}, "b", min_devices=2) is None  # 1 finished < 2
    assert "1 of 1 finished" in evaluate(c, rows, reps, {}, "b", min_devices=1)


def test_spec_checks_waves_and_durations() -> None:
    s = RolloutSpec.parse(
        RolloutFlags(fleet=FLEET, canary="5%", waves="25%,50%,100%", watch="10m", device_timeout="90s")
    )
    assert s.waves == (0.25, 0.5, 1.0) and s.watch_s == 600 and s.device_timeout_s == 90
    assert RolloutSpec.from_json(s.to_json()) == s
    for kw, needle in (
        ({"waves": "50%,25%,100%"}, "increase"),
        ({"waves": "25%,50%"}, "100%"),
        ({"canary": "0%"}, "canary"),
        ({"watch": "ten minutes"}, "duration"),
        ({"groups": ["nolabel"]}, "label=value"),
    ):
        with pytest.raises(RolloutError, match=needle):
            RolloutSpec.parse(RolloutFlags(fleet=FLEET, **kw))


# -- (a) + (c): a good bundle, canary -> waves -> 100%; an offline device catches up on reconnect ---------


def stop_all(agents: list[Agent]) -> None:
    """Stop agents side by side (each waits on its broker round trips, not the CPU)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda ag: ag.stop(1.0), agents))  # no collector holds telemetry: no flush to wait for


def test_good_bundle_rolls_out_canary_waves_to_all_and_an_offline_device_catches_up(
    tmp_path: Path, broker: Any, http: ArtifactServer, bundles: dict[str, Any], db: Any, view: FleetView
) -> None:
    """50 real agents (and 4 simulated devices) on one cohort; one more real agent is offline meanwhile."""
    a, b = bundles["a"], bundles["b"]
    real = [f"cam-{i:02d}" for i in range(N_REAL)]
    agents = [start_agent(broker.url, agent_store(tmp_path / d, a), d) for d in real]
    offline = start_agent(broker.url, agent_store(tmp_path / "zz-offline", a), "zz-offline")
    fleet = sims(broker, {f"sim-{i}": ("x86-cpu", a.id) for i in range(4)})
    try:
        n = N_REAL + 5
        synced_with(view, n)
        offline.stop(1.0)  # its death is retained: the controller sees it offline
        wait_for(lambda: not view.snapshot()["zz-offline"].online, 10, "the device offline")
        spec = RolloutSpec.parse(
            RolloutFlags(
                fleet=FLEET,
                canary="5%",
                waves="25%,50%,100%",
                watch="0.5s",
                device_timeout="10s",
                abort_if=["p99>budget", "errors>10%", "fallback"],
            )
        )
        rid = start_rollout(db, view, spec, [prepared(bundles, http, "b")], previous=[prepared(bundles, http, "a")])
        ctl = RolloutController(db, rid, view)
        res = ctl.step()
        assert res.events == 4 and res.published == 3  # wave 0 started, 3 canary devices assigned and published
        assigned = [e["device"] for e in _events(db, rid) if e["kind"] == "device_assigned"]
        assert assigned == real[:3], assigned  # ceil(5% of 55) = 3, online devices first, by id
        drive(ctl, lambda r: status(db, rid)["cohorts"][0]["wave"] >= 1, 60, "wave 1")
        canary = [d for d in status(db, rid)["devices"] if d["wave"] == 0]
        assert {d["state"] for d in canary} == {"running"}, canary
        # the offline device is given the bundle in the last wave, times out, and never holds that wave up
        res = drive(ctl, lambda r: r.state == "completed", 120, "completion")
        assert [e["device"] for e in _events(db, rid) if e["kind"] == "device_timed_out"] == ["zz-offline"]
        waves = [e["detail"]["wave"] for e in _events(db, rid) if e["kind"] == "wave_started"]
        assert waves == [0, 1, 2, 3]
        sizes = [e["detail"]["assigned_total"] for e in _events(db, rid) if e["kind"] == "wave_started"]
        assert sizes == [3, 14, 28, 55], sizes  # ceil(share * 55): 5%, 25%, 50%, 100%
        assert status(db, rid)["cohorts"][0]["devices"] == {"running": n - 1, "timed-out": 1}
        for d in real:  # every real agent switched its store to B, and runs it
            assert DeviceStore(tmp_path / d).state().current == b.id
        assert {ag.bundle.id for ag in agents} == {b.id}
        assert fleet.bundles() == {k: b.id for k in fleet.devices}
        offline = start_agent(broker.url, tmp_path / "zz-offline", "zz-offline")  # it comes back
        drive(
            ctl,
            lambda r: any(e["kind"] == "device_answered_late" for e in _events(db, rid)),
            60,
            "the offline device to catch up",
        )
        assert DeviceStore(tmp_path / "zz-offline").state().current == b.id
        assert status(db, rid)["cohorts"][0]["devices"] == {"running": n}
        evs = _events(db, rid)
        print(
            "rollout timeline (s):",
            {
                e["kind"] + (f" {e['reason']}" if e["kind"] == "wave_started" else ""): round(e["ts"] - evs[0]["ts"], 1)
                for e in evs
                if e["kind"] in ("wave_started", "device_timed_out", "rollout_completed")
            },
        )
    finally:
        fleet.stop()
        stop_all([*agents, offline])


# -- (b) over budget on one target class: that cohort aborts after its canary, the other completes -----------


def test_bundle_over_budget_on_one_target_class_aborts_that_cohort_and_rolls_its_canary_back(
    tmp_path: Path, broker: Any, http: ArtifactServer, bundles: dict[str, Any], db: Any, view: FleetView
) -> None:
    a, a_slow, b, b_slow = bundles["a"], bundles["a_slow"], bundles["b"], bundles["b_slow"]

    def behaviour(_device: str, d: DesiredState) -> Outcome:  # simulated slow-class devices: the same outcome
        if d.bundle_id == b_slow.id:
            return Outcome("failed", "over_budget", p99_ms=0.4, budget_ms=0.0001)
        return Outcome()

    slow_real = ["a-slow-0", "a-slow-1"]  # first in the slow cohort: its canary
    agents = {d: start_agent(broker.url, agent_store(tmp_path / d, a_slow), d) for d in slow_real}
    agents["cam-0"] = start_agent(broker.url, agent_store(tmp_path / "cam-0", a), "cam-0")
    devices = {f"sim-{i:03d}": ("x86-cpu", a.id) for i in range(20)}
    devices.update({f"slow-{i:03d}": ("x86-slow", a_slow.id) for i in range(20)})
    fleet = sims(broker, devices, behaviour=behaviour)
    try:
        synced_with(view, 43)
        spec = RolloutSpec.parse(
            RolloutFlags(
                fleet=FLEET,
                canary="5%",
                waves="50%,100%",
                watch="0.3s",
                device_timeout="60s",
                abort_if=["p99>budget", "errors>20%"],
            )
        )
        rid = start_rollout(
            db,
            view,
            spec,
            [prepared(bundles, http, "b"), prepared(bundles, http, "b_slow")],
            previous=[prepared(bundles, http, "a"), prepared(bundles, http, "a_slow")],
        )
        ctl = RolloutController(db, rid, view)
        res = drive(ctl, lambda r: r.finished, 120, "both cohorts to finish")
        st = status(db, rid)
        assert st["state"] == "partial", st["reason"]
        by = {c["cohort"]: c for c in st["cohorts"]}
        assert by["x86-cpu"]["state"] == "completed" and by["x86-cpu"]["devices"] == {"running": 21}
        slow = by["x86-slow"]
        assert slow["state"] == "aborted" and slow["wave"] == 0  # after the canary, no further wave
        assert slow["reason"].startswith("p99>budget: ") and "smoke test p99" in slow["reason"], slow["reason"]
        canary = [d for d in st["devices"] if d["cohort"] == "x86-slow"]
        assert sorted(d["device"] for d in canary) == slow_real  # 5% of 22 -> 2: only the canary got B
        # the first to fail the smoke test aborts the cohort; the other may be cut short by its rollback
        assert {d["state"] for d in canary} <= {"failed", "assigned"}, canary
        assert any(d["reason"] == "over_budget" for d in canary), canary
        assert all(d["rb_state"] == "running" and d["prev_bundle"] == a_slow.id for d in canary), canary
        for d in slow_real:  # the real agents: back on (still on) A, their retained report says so
            assert DeviceStore(tmp_path / d).state().current == a_slow.id
            rep = view.snapshot()[d].reported
            assert rep["bundle_running"] == a_slow.id and rep["state"] == "running", rep
        assert {fleet.devices[k].bundle_id for k in devices if k.startswith("slow-")} == {a_slow.id}
        assert all(not fleet.devices[k].applied for k in devices if k.startswith("slow-"))  # never given B
        assert {fleet.devices[k].bundle_id for k in devices if k.startswith("sim-")} == {b.id}
        aborted = [e for e in _events(db, rid) if e["kind"] == "cohort_aborted"]
        assert len(aborted) == 1 and aborted[0]["cohort"] == "x86-slow" and aborted[0]["detail"]["rolling_back"] == 2
        assert sorted(e["device"] for e in _events(db, rid) if e["kind"] == "device_rolled_back") == slow_real
        assert res.pending == 0 and res.unconfirmed == 0
    finally:
        fleet.stop()
        for ag in agents.values():
            ag.stop(1.0)


# -- (d) controller restart (a crash between its commit and its publish) and a broker restart -------------


def _fake(bundle_id: str, target: str) -> RolloutBundle:
    return RolloutBundle(
        bundle_id=bundle_id, target=target, url=f"http://127.0.0.1:9/{bundle_id}.tar", sha256="ab" * 32, size=1000
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def any_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "sqlite":
        with open_db(f"sqlite:///{tmp_path}/fleet.db") as d:
            yield d
        return
    with open_db(request.getfixturevalue("postgres_url")) as d:  # tests/fleet/conftest.py
        yield d


def test_controller_and_broker_restart_mid_rollout_lose_no_decision(broker: Any, any_db: Any, view: FleetView) -> None:
    db = any_db
    old, new = _fake("model-old", "x86-cpu"), _fake("model-new", "x86-cpu")
    fleet = sims(broker, {f"sim-{i:03d}": ("x86-cpu", old.bundle_id) for i in range(40)})
    try:
        synced_with(view, 40)
        spec = RolloutSpec.parse(
            RolloutFlags(
                fleet=FLEET,
                canary="5%",
                waves="25%,50%,100%",
                watch="0.2s",
                device_timeout="60s",
                abort_if=["errors>5%"],
            )
        )
        rid = start_rollout(db, view, spec, [new], previous=[old])
        ctl = RolloutController(db, rid, view, lease_s=1.0)
        drive(ctl, lambda r: status(db, rid)["cohorts"][0]["wave"] == 1, 30, "wave 1")

        # the controller 'crashes' after committing wave 2's decisions, before publishing any of them
        def answered() -> bool:
            reps = [d.reported for d in view.snapshot().values()]
            return sum(1 for r in reps if r and r.get("rollout_id") == rid and r["state"] == "running") == 10

        wait_for(answered, 30, "wave 1 answered")
        time.sleep(0.25)
        ctl._decide(ctl.store.rollout(rid), view.snapshot(), time.time())
        ctl.db.commit()
        st = status(db, rid)
        assert st["cohorts"][0]["wave"] == 2 and st["cohorts"][0]["devices"] == {"running": 10, "assigned": 10}
        view.close()
        broker.restart()  # retained desired/reported/birth survive in the broker's persistence file
        wait_for(lambda: fleet.connected() == 40, 30, "the devices back on the broker")
        with open_db(db.url) as db2:  # a new controller process: its own connection and view
            v2 = FleetView(BrokerConfig.from_url(broker.url), FLEET, client_id="test-rollout-2").start()
            try:
                ctl2 = RolloutController(db2, rid, v2)
                res = drive(ctl2, lambda r: r.finished, 60, "completion after the restarts")
                assert any(e["kind"] == "device_assigned" for e in _events(db, rid))
            finally:
                v2.close()
        assert res.state == "completed"
        evs = _events(db, rid)
        assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))  # numbered without gaps
        assigned = [e["device"] for e in evs if e["kind"] == "device_assigned"]
        assert sorted(assigned) == sorted(fleet.devices) and len(set(assigned)) == 40  # each exactly once
        assert fleet.bundles() == {k: new.bundle_id for k in fleet.devices}
        assert all(len(d.applied) == 1 for d in fleet.devices.values())  # one apply each: nothing sent twice
    finally:
        fleet.stop()


# -- pause, resume, abort (fleet-wide rollback of that rollout), a newer rollout supersedes --------------


def test_pause_resume_and_abort_roll_every_device_back(broker: Any, db: Any, view: FleetView) -> None:
    old, new = _fake("model-old", "x86-cpu"), _fake("model-new", "x86-cpu")
    fleet = sims(broker, {f"sim-{i:03d}": ("x86-cpu", old.bundle_id) for i in range(20)})
    try:
        synced_with(view, 20)
        spec = RolloutSpec.parse(
            RolloutFlags(fleet=FLEET, canary="10%", waves="50%,100%", watch="0.2s", device_timeout="60s")
        )
        rid = start_rollout(db, view, spec, [new], previous=[old])
        ctl = RolloutController(db, rid, view)
        ctl.step()
        other = RolloutController(db, rid, view).step()  # a second controller waits for the first one's lease
        assert other.other_controller and other.waiting.startswith("controller ") and other.events == 0
        set_state(db, rid, "pause", "looking at the canary")
        drive(ctl, lambda r: status(db, rid)["cohorts"][0]["devices"] == {"running": 2}, 30, "the canary")
        for _ in range(5):
            ctl.step()
            time.sleep(0.1)
        st = status(db, rid)
        assert st["state"] == "paused" and st["cohorts"][0]["wave"] == 0  # paused: no next wave
        set_state(db, rid, "resume")
        drive(ctl, lambda r: status(db, rid)["cohorts"][0]["wave"] == 1, 30, "wave 1 after resume")
        set_state(db, rid, "abort", "operator saw a drift")
        res = drive(ctl, lambda r: r.finished, 30, "the abort")
        st = status(db, rid)
        assert st["state"] == "aborted" and st["reason"] == "operator saw a drift"
        assert st["cohorts"][0]["reason"] == "aborted by request: operator saw a drift"
        got = [d for d in st["devices"]]
        assert len(got) == 10 and all(d["rb_state"] == "running" for d in got), got
        assert fleet.bundles() == {k: old.bundle_id for k in fleet.devices}
        untouched = [k for k, d in fleet.devices.items() if not d.applied]
        assert len(untouched) == 10  # the rest never got the new bundle
        assert res.pending == 0
        k = [e["kind"] for e in _events(db, rid)]
        assert (
            k.index("rollout_paused")
            < k.index("rollout_resumed")
            < k.index("rollout_abort_requested")
            < k.index("cohort_aborted")
            < k.index("rollout_aborted")
        )
        # a newer rollout for the same class supersedes an unfinished one instead of queueing behind it
        rid2 = start_rollout(db, view, spec, [new], previous=[old])
        rid3 = start_rollout(db, view, spec, [_fake("model-newer", "x86-cpu")], previous=[old])
        assert status(db, rid2)["cohorts"][0]["state"] == "superseded"
        assert status(db, rid3)["cohorts"][0]["state"] == "rolling"
        with pytest.raises(RolloutError, match="no device"):
            start_rollout(db, view, dataclasses.replace(spec, groups=(("host.model", "jetson*"),)), [new])
    finally:
        fleet.stop()


def test_a_wave_below_the_success_rate_aborts_its_cohort(broker: Any, db: Any, view: FleetView) -> None:
    old, new = _fake("model-old", "x86-cpu"), _fake("model-new", "x86-cpu")

    def behaviour(device: str, d: DesiredState) -> Outcome:  # one canary device cannot download the new bundle
        if d.bundle_id == new.bundle_id and device == "sim-001":
            return Outcome("failed", "download_failed")
        return Outcome()

    fleet = sims(broker, {f"sim-{i:03d}": ("x86-cpu", old.bundle_id) for i in range(20)}, behaviour=behaviour)
    try:
        synced_with(view, 20)
        spec = RolloutSpec.parse(
            RolloutFlags(fleet=FLEET, canary="20%", waves="100%", watch="0.1s", success_rate="90%", abort_if=["none"])
        )  # the success rate alone (no default failed>0)
        rid = start_rollout(db, view, spec, [new], previous=[old])
        res = drive(RolloutController(db, rid, view), lambda r: r.finished, 30, "the abort")
        c = status(db, rid)["cohorts"][0]
        assert res.state == "aborted" and c["wave"] == 0, c  # no criterion breached; the wave's success rate did
        assert c["reason"].startswith("success rate 75.0% below 90% after wave 0 (4 device(s) answered"), c
        assert c["rollback"] == {"running": 4} and fleet.bundles() == {k: old.bundle_id for k in fleet.devices}
    finally:
        fleet.stop()


# -- bad input: one line, exit 2, nothing published ----------------------------------------------------


def test_cli_refuses_bad_input_with_one_line(
    tmp_path: Path, broker: Any, http: ArtifactServer, bundles: dict[str, Any]
) -> None:
    base = [
        "fleet",
        "rollout",
        "start",
        "--fleet",
        FLEET,
        "--broker",
        broker.url,
        "--db",
        f"sqlite:///{tmp_path}/fleet.db",
        "--watch",
        "1s",
    ]
    b = str(bundles["b"].path)
    assert_user_error(run_cli(*base, str(tmp_path / "nope"), "--artifact-url", http.url("b.tar")), "not a bundle")
    assert_user_error(
        run_cli(*base, b, "--artifact-url", http.url("b.tar"), "--abort-if", "p99>>budget"), "malformed --abort-if"
    )
    assert_user_error(run_cli(*base, b, "--artifact-url", http.url("missing.tar")), "HTTP 404")
    assert_user_error(
        run_cli(*base, b, "--artifact-url", f"http://127.0.0.1:{mqtt_broker.free_port()}/b.tar"), "unreachable"
    )
    (bundles["www"] / "short.tar").write_bytes(b"x" * 10)
    assert_user_error(run_cli(*base, b, "--artifact-url", http.url("short.tar")), "serves 10 bytes")
    assert_user_error(run_cli(*base, b, "--artifact-url", http.url("b.tar")), "no device")  # empty fleet
    assert {p for p, _ in http.requests} == {"/b.tar", "/missing.tar", "/short.tar"}  # HEAD/GET checks only
    p = run_cli("fleet", "rollout", "status", "--db", f"sqlite:///{tmp_path}/fleet.db", "r-nope")
    assert_user_error(p, "no rollout")


def test_cli_start_status_pause_abort(
    tmp_path: Path, broker: Any, http: ArtifactServer, bundles: dict[str, Any]
) -> None:
    import json

    a, b = bundles["a"], bundles["b"]
    fleet = sims(broker, {f"sim-{i}": ("x86-cpu", a.id) for i in range(8)})
    dbu = f"sqlite:///{tmp_path}/fleet.db"
    common = ["--broker", broker.url, "--db", dbu, "--json"]
    try:
        p = run_cli(
            "fleet",
            "rollout",
            "start",
            str(b.path),
            "--fleet",
            FLEET,
            "--artifact-url",
            http.url("b.tar"),
            "--previous-bundle",
            str(a.path),
            "--previous-url",
            http.url("a.tar"),
            "--canary",
            "10%",
            "--waves",
            "50%,100%",
            "--watch",
            "0.2s",
            "--abort-if",
            "p99>budget",
            "--id",
            "r-cli",
            *common,
        )
        assert p.returncode == 0, p.stderr
        st = json.loads(p.stdout)
        assert st["id"] == "r-cli" and st["state"] == "completed", st
        assert st["cohorts"][0]["devices"] == {"running": 8}
        assert fleet.bundles() == {k: b.id for k in fleet.devices}
        p = run_cli("fleet", "rollout", "status", "--db", dbu, "--json")  # the latest rollout
        assert json.loads(p.stdout)["events_total"] == st["events_total"]
        assert_user_error(run_cli("fleet", "rollout", "pause", "r-cli", "--db", dbu), "completed", "cannot pause")
        late = sims(broker, {"sim-late": ("x86-cpu", a.id)})  # joins after the rollout completed
        p = run_cli("fleet", "rollout", "resume", "r-cli", *common)
        assert p.returncode == 0, p.stderr
        st = json.loads(p.stdout)
        assert st["state"] == "completed" and st["cohorts"][0]["devices"] == {"running": 9}
        assert late.bundles() == {"sim-late": b.id}
        joined = [e for e in st["events"] if e["device"] == "sim-late" and e["kind"] == "device_assigned"]
        assert joined and joined[0]["reason"] == "joined after the last wave"
        p = run_cli("fleet", "rollout", "abort", "r-cli", "--reason", "field reports", "--wait", *common)
        assert p.returncode == 0, p.stderr
        st = json.loads(p.stdout)
        assert st["state"] == "aborted" and st["cohorts"][0]["rollback"] == {"running": 9}, st["cohorts"]
        assert fleet.bundles() == {k: a.id for k in fleet.devices} and late.bundles() == {"sim-late": a.id}
        p = run_cli("fleet", "rollout", "status", "r-cli", "--db", dbu)  # the table, for people
        assert p.returncode == 0 and "aborted" in p.stdout and "field reports" in p.stdout
    finally:
        fleet.stop()
        if "late" in locals():
            late.stop()


def test_cli_exit_codes_tell_an_abort_from_a_success_and_the_rollback_keeps_the_budget(
    tmp_path: Path, broker: Any, http: ArtifactServer, bundles: dict[str, Any]
) -> None:
    """Issue #33: `rollout start` exited 0 for an aborted rollout; the rollback's desired state carried no
    budget (the device smoke-tested its old bundle against the profile's 16.67 ms and refused it)."""
    import json

    a, b = bundles["a"], bundles["b"]
    fleet = sims(
        broker,
        {f"sim-{i}": ("x86-cpu", a.id) for i in range(3)},
        behaviour=lambda _dev, d: Outcome("failed", "over_budget") if d.bundle_id == b.id else Outcome(),
    )
    dbu = f"sqlite:///{tmp_path}/fleet.db"
    try:
        p = run_cli(
            "fleet", "rollout", "start", str(b.path), "--fleet", FLEET, "--artifact-url", http.url("b.tar"),
            "--previous-bundle", str(a.path), "--previous-url", http.url("a.tar"), "--canary", "34%",
            "--waves", "100%", "--watch", "0.1s", "--budget-ms", "1000", "--id", "r-bad",
            "--broker", broker.url, "--db", dbu, "--json",
        )  # fmt: skip
        st = json.loads(p.stdout)
        assert p.returncode == 5 and st["state"] == "aborted", (p.returncode, st["state"], p.stderr)
        with open_db(dbu) as db:
            rows = status(db, "r-bad")["devices"]
        assert any(row["rb_version"] is not None for row in rows), rows
        # fleet status keeps what the rollout did (the devices' rows show them back on the old bundle)
        ro = json.loads(run_cli("fleet", "status", "--db", dbu, "--json").stdout)["rollouts"]
        assert [(f["rollout"], f["rollout_state"], f["on_bundle"]) for f in ro] == [("r-bad", "aborted", 0)], ro
        assert set(ro[0]["failed"]) == {"over_budget"} and ro[0]["bundle"] == b.id, ro
        # a rollout the controller stopped driving (--timeout) before it finished: 6
        slow = sims(broker, {"slow-0": ("x86-cpu", a.id)}, behaviour=lambda _dev, _d: Outcome(delay_s=60.0))
        try:
            p = run_cli(
                "fleet", "rollout", "start", str(b.path), "--fleet", FLEET, "--artifact-url", http.url("b.tar"),
                "--group", "device=slow-*", "--watch", "10m", "--timeout", "1", "--id", "r-slow",
                "--broker", broker.url, "--db", dbu, "--json",
            )  # fmt: skip
            assert p.returncode == 6 and json.loads(p.stdout)["state"] == "running", (p.returncode, p.stderr)
        finally:
            slow.stop()
        with FleetView(BrokerConfig.from_url(broker.url), FLEET, client_id="test-exit-view") as v:
            synced_with(v, 3)
            for row in rows:
                if row["rb_version"] is not None:  # the rollback carries the rollout's budget
                    wait_for(
                        lambda r=row: (v.snapshot()[r["device"]].desired or {}).get("version") == r["rb_version"], 10
                    )
                    assert v.snapshot()[row["device"]].desired["budget_ms"] == 1000.0
    finally:
        fleet.stop()
