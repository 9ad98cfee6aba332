"""The thread and spin-wait policy (edge.backends.threads): the decision from what shares the CPUs, and what
each CPU runtime reports back it was given (issue #25). Nothing here times anything."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edge.backends.threads import PIPELINE_STAGE_CPUS, CpuLoad, measure_load, parse_proc_stat, plan_threads, usable_cpus
from edge.errors import EdgeError


def load(cpus: int, others: float) -> CpuLoad:
    return CpuLoad(cpus=cpus, others=others, load_1m=None, method="given")


@pytest.mark.parametrize(
    ("cpus", "others", "reserve", "threads", "shared"),
    [
        (2, 0.0, 0.0, 2, False),  # idle: every core
        (2, 1.0, 0.0, 1, True),  # one core busy elsewhere: the one left
        (2, 0.0, 3 * PIPELINE_STAGE_CPUS, 2, True),  # idle, the video pipeline's three stages beside it
        (2, 1.0, 3 * PIPELINE_STAGE_CPUS, 1, True),  # one core busy and the pipeline: still one thread
        (2, 2.0, 0.0, 1, True),  # all busy: at least one
        (2, 0.2, 3 * PIPELINE_STAGE_CPUS, 2, True),  # a little background load beside the pipeline: still both
        (8, 2.6, 0.45, 5, True),
        (4, 0.1, 0.0, 4, False),  # a little noise is not a busy core
    ],
)
def test_policy_leaves_what_shares_the_cpus(
    cpus: int, others: float, reserve: float, threads: int, shared: bool
) -> None:
    plan = plan_threads(0, None, reserve=reserve, load=load(cpus, others))
    assert (plan.threads, plan.spinning, plan.shared) == (threads, False, shared)
    assert (plan.threads_from, plan.spinning_from) == ("policy", "policy")
    assert f"-> {threads} thread(s)" in plan.reason and "spin-wait off" in plan.reason


def test_an_explicit_option_always_wins() -> None:
    plan = plan_threads(4, True, load=load(2, 1.0))
    assert (plan.threads, plan.spinning, plan.threads_from, plan.spinning_from) == (4, True, "option", "option")
    assert "policy would take 1" in plan.reason
    assert plan_threads(0, False, load=load(2, 0.0)).spinning_from == "option"
    no_spin = plan_threads(0, None, load=load(2, 0.0), spin_option=False)
    assert (no_spin.spinning, no_spin.spinning_from) == (False, "runtime")


def test_measured_load_is_this_process_s_cpus() -> None:
    got = measure_load(0.05)
    assert got.cpus == len(os.sched_getaffinity(0)) == usable_cpus()
    assert 0.0 <= got.others <= got.cpus and got.method.startswith("sampled /proc/stat")


STAT = """cpu  300 0 100 500 100 0 0 0 0 0
cpu0 200 0 50 100 50 0 0 0 0 0
cpu1 100 0 50 400 50 0 0 0 0 0
intr 12345
"""


def test_proc_stat_counts_only_this_process_s_cpus() -> None:
    assert parse_proc_stat(STAT) == (400, 1000)  # the all-CPU line: iowait counts as idle
    assert parse_proc_stat(STAT, frozenset({0})) == (250, 400)
    assert parse_proc_stat(STAT, frozenset({1})) == (150, 600)
    assert parse_proc_stat(STAT, frozenset({0, 1})) == (400, 1000)
    assert parse_proc_stat(STAT, frozenset({7})) is None and parse_proc_stat("garbage") is None


# -- what each runtime reports back --------------------------------------------------------------


def test_onnxruntime_session_options_read_back(models: dict[str, Path]) -> None:
    from edge.backends.onnxruntime.run import OnnxRuntimeRunner

    with OnnxRuntimeRunner(models["tiny"]) as r:
        so = r._session.get_session_options()
        policy = r.info.details["threads_policy"]
        assert so.intra_op_num_threads == r.info.threads == policy["threads"] >= 1
        assert policy["threads_from"] == "policy" and policy["threads"] <= usable_cpus()
        # onnxruntime's own default spins; edgekit's does not
        assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        assert so.get_session_config_entry("session.inter_op.allow_spinning") == "0"
        assert r.info.details["allow_spinning"] is False
    with OnnxRuntimeRunner(models["tiny"], options={"intra_op_num_threads": 3, "allow_spinning": True}) as r:
        so = r._session.get_session_options()
        assert so.intra_op_num_threads == 3 and so.get_session_config_entry("session.intra_op.allow_spinning") == "1"
        assert r.info.details["threads_policy"]["threads_from"] == "option"
    with OnnxRuntimeRunner(models["tiny"], options={"reserve_cpus": 4096}) as r:  # nothing left: still one
        assert r._session.get_session_options().intra_op_num_threads == 1
    with pytest.raises(EdgeError, match="reserve_cpus must be a number"):
        OnnxRuntimeRunner(models["tiny"], options={"reserve_cpus": "all"})


def test_openvino_threads_and_pinning_read_back(models: dict[str, Path]) -> None:
    from edge.backends.openvino.run import OpenVINORunner

    with OpenVINORunner(models["tiny"], options={"reserve_cpus": 4096}) as r:
        policy = r.info.details["threads_policy"]
        # INFERENCE_NUM_THREADS as the compiled model reports it
        assert r.info.threads == policy["threads"] == r._compiled.get_property("INFERENCE_NUM_THREADS") == 1
        assert policy["shared"] and r._compiled.get_property("ENABLE_CPU_PINNING") is False
        assert policy["cpu_pinning"] is False
    with OpenVINORunner(models["tiny"], options={"num_threads": 1}) as r:
        assert r._compiled.get_property("INFERENCE_NUM_THREADS") == 1
        assert r.info.details["threads_policy"]["threads_from"] == "option"
    with OpenVINORunner(models["tiny"]) as r:
        assert r._compiled.get_property("INFERENCE_NUM_THREADS") == r.info.details["threads_policy"]["threads"]


def test_litert_threads_from_the_policy(tmp_path: Path) -> None:
    from edge.backends.litert.run import LiteRTRunner
    from tests.backends.test_litert import add_model

    model = add_model(tmp_path / "add.tflite")
    with LiteRTRunner(model, options={"reserve_cpus": 4096}) as r:
        assert r.info.threads == 1 and r.info.details["threads_policy"]["threads_from"] == "policy"
    with LiteRTRunner(model, options={"num_threads": 2}) as r:
        assert r.info.threads == 2 and r.info.details["threads_policy"]["threads_from"] == "option"
