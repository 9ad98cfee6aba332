"""Long-running processes print no traceback either (issue #23, class 3): a bug behind a callback of the MQTT
network loop (the agent's and the collector's) or in an agent thread is one log line ending ``details in
FILE``, the traceback in FILE, written once per step and exception type however often the bug trips."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from edge.errors import daemon_error_line
from edge.mqtt.netloop import NetworkLoop
from tests.support.cli import wait_for


@pytest.fixture(autouse=True)
def crash_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EDGEKIT_LOG_DIR", str(tmp_path / "crashes"))
    return tmp_path / "crashes"


def test_a_bug_behind_a_loop_callback_is_one_line_and_one_file(
    crash_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    done = threading.Event()

    def buggy(n: int) -> None:
        if n == 4:
            done.set()
        {}[f"missing-{n}%s"]  # noqa: B018 - the bug: a KeyError on every call, '%s' in its message

    loop = NetworkLoop(name="edgekit-test-loop").start()
    try:
        with caplog.at_level(logging.ERROR):
            for n in range(5):
                loop.call_soon(buggy, n)
            wait_for(done.is_set, 10, "the callbacks to run")
            wait_for(lambda: loop.errors >= 5, 10, "the loop to count the errors")
    finally:
        loop.stop()
    records = [r for r in caplog.records if "MQTT network loop" in r.getMessage()]
    assert records, caplog.text
    for r in records:
        assert not r.exc_info and "Traceback" not in r.getMessage()
        assert "internal error in mqtt network loop: KeyError: 'missing-0%s'" in r.getMessage(), r.getMessage()
        assert "details in " in r.getMessage()
    logs = list(crash_dir.glob("*.log"))
    assert len(logs) == 1, logs  # five failures, one traceback file
    assert "Traceback (most recent call last)" in logs[0].read_text() and "in buggy" in logs[0].read_text()


def test_a_typed_error_is_its_message_without_a_file(crash_dir: Path) -> None:
    from edge.errors import ModelError

    line = daemon_error_line("agent inference", ModelError("input 'x' is the wrong shape", hint="re-export"))
    assert line.startswith("agent inference: input 'x' is the wrong shape") and "internal error" not in line
    assert not crash_dir.exists()
