"""Shared fixtures: models built in code (no downloads), temporary targets directories."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from edge.graph.samples import build_mobilenet_v2, build_tiny_cnn, build_two_input_model
from tests.support.skips import HARDWARE, altstack_problem, ci_strict


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("models")
    return {
        "tiny": build_tiny_cnn(d / "tiny.onnx"),
        "tiny_dynamic": build_tiny_cnn(d / "tiny_dynamic.onnx", dynamic_batch=True),
        "two_input": build_two_input_model(d / "two_input.onnx"),
    }


@pytest.fixture(scope="session")
def mobilenet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_mobilenet_v2(tmp_path_factory.mktemp("mnv2") / "mobilenetv2.onnx")


# -- Skips: under CI=true only missing hardware may skip ------------------------------------------
# CI (.ci/run) installs every tool and package the tests use: Mosquitto, RabbitMQ, openssl, PostgreSQL,
# sshd/rsync, gcc/g++, the toolchain venvs, the pretrained example model and the `dev` extra
# (llama-cpp-python, ai-edge-litert, nncf, onnxruntime, openvino, OpenCV, hypothesis). There a
# skip means a broken install, so with CI=true it fails the run instead. The only skips that stay
# skips are for hardware (or an OS) CI cannot have, or for hardware present that hides an error path:
# their reason starts with "hardware: ", then a short label, e.g.
# `pytest.skip("hardware: no Edge TPU compiler: ...")`, `pytest.mark.skipif(..., reason="hardware: not macOS: ...")`.
_SKIPS = pytest.StashKey[list]()


def _skip_reason(rep: pytest.CollectReport | pytest.TestReport) -> str:
    lr = rep.longrepr
    msg = lr[2] if isinstance(lr, tuple) and len(lr) == 3 else str(lr)
    return msg.removeprefix("Skipped: ")


def _police_skip(config: pytest.Config, rep: pytest.CollectReport | pytest.TestReport) -> None:
    if not rep.skipped or hasattr(rep, "wasxfail"):
        return
    reason = _skip_reason(rep)
    seen = config.stash.setdefault(_SKIPS, [])
    if reason.startswith(HARDWARE):
        seen.append(("hardware", reason.removeprefix(HARDWARE)))
    elif ci_strict():
        seen.append(("failed", reason))
        rep.outcome = "failed"
        rep.longrepr = (
            f"CI=true: a skip that is not for missing hardware is a failure here: {reason}\n"
            f"(CI installs everything the tests use; only reasons starting with {HARDWARE!r} may skip "
            "— tests/conftest.py)"
        )
    else:
        seen.append(("other", reason))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests outside CI's representative sample (tests/support/ci_sample.py) get ``corpus_full`` before ``-m``
    deselects: the default run (CI, the README) leaves them to ``pytest -m corpus_full``."""
    from tests.support.ci_sample import OUTSIDE_CI

    for item in items:
        if item.nodeid in OUTSIDE_CI:
            item.add_marker(pytest.mark.corpus_full)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    outcome = yield
    _police_skip(item.config, outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):  # module-level importorskip / skip
    outcome = yield
    _police_skip(collector.config, outcome.get_result())


def _label(reason: str) -> str:
    """The first clause of a reason: 'no NVIDIA GPU: TensorRT engine build needs ...' -> 'no NVIDIA GPU'."""
    for sep in (": ", "; ", " ("):
        reason = reason.split(sep, 1)[0]
    return reason if len(reason) <= 60 else reason[:57] + "..."


def _tally(reasons: list[str]) -> str:
    counts: dict[str, int] = {}
    for r in reasons:
        counts[_label(r)] = counts.get(_label(r), 0) + 1
    return ", ".join(f"{k} x{n}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    seen = config.stash.get(_SKIPS, [])
    hw = [r for k, r in seen if k == "hardware"]
    other = [r for k, r in seen if k == "other"]
    failed = [r for k, r in seen if k == "failed"]
    line = (
        f"edgekit skips: {len(hw) + len(other)} (hardware: {len(hw)}{' — ' + _tally(hw) if hw else ''}; "
        f"other: {len(other)}{' — ' + _tally(other) if other else ''})"
    )
    if failed:
        line += f"; CI=true turned {len(failed)} skip(s) into failures: {_tally(failed)}"
    terminalreporter.write_line(line)
    # Threads a test left running (native inference or network loops) are the first suspects for the
    # occasional SIGSEGV at the end of the run; name them so a crashing run says where to look.
    import threading

    left = sorted({t.name for t in threading.enumerate() if t is not threading.main_thread()})
    if left:
        terminalreporter.write_line(f"threads still running at the end: {', '.join(left)}")


# -- The main thread's alternate signal stack must stay in mapped memory ---------------------------
# OpenVINO's CPU plugin swaps the calling thread's sigaltstack per plugin instance and restores it in
# destruction order; two ov.Core objects freed out of order left it pointing at unmapped memory and the
# next signal handler (faulthandler, Ctrl-C) crashed the run or corrupted memory (rc 139 in CI; see
# edge.backends.openvino.format.ov_core). Checked after every test so a regression names the test.
@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    problem = altstack_problem()
    if problem:
        pytest.fail(
            f"{problem}: a signal handler would run on unmapped memory (did this test make its own "
            "openvino.Core? use edge.backends.openvino.format.ov_core)",
            pytrace=False,
        )


# -- Exit straight after the summary ---------------------------------------------------------------
# This one process loads every runtime (onnxruntime, OpenVINO, LiteRT, llama.cpp, OpenCV) and their
# thread pools. On a loaded 2-core host the interpreter's own shutdown then crashed now and then
# (SIGSEGV after pytest's summary line, exit code 139, every test passed; no Python frame to show, so a
# native teardown), which CI would count as a failed run. The results are complete by then, so the run
# ends with os._exit(pytest's exit status) instead of interpreter finalisation. Devices and CLI calls
# load one runtime; their exit codes are asserted by the tests that start them.
_EXIT_STATUS = pytest.StashKey[int]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    status = config.stash.get(_EXIT_STATUS, None)
    if status is None or config.pluginmanager.hasplugin("xdist"):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


@pytest.fixture
def no_leaked_threads() -> Iterator[None]:
    """After the test, every ``edgekit-*`` thread it started has stopped (within 5 s): use it with
    ``pytestmark = pytest.mark.usefixtures("no_leaked_threads")``."""
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = [t.name for t in threading.enumerate() if t.name.startswith("edgekit-")]
        if not left:
            return
        time.sleep(0.05)
    pytest.fail(f"threads left running: {left}")
