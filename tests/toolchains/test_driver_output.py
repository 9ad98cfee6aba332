"""The toolchain drivers' output plumbing is one module (edge/toolchains/driver_output.py), loaded by path.

Each ``*_driver.py`` runs standalone in its toolchain's Python (``python -I``, no edgekit), so the shared module
must load from the driver's own directory; every driver keeps the original stdout for its JSON events and sends
whatever else is printed (a traceback included) to ``convert.log``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOLCHAINS = Path(__file__).resolve().parents[2] / "edge" / "toolchains"
DRIVERS = sorted(TOOLCHAINS.glob("*_driver.py"))


def test_every_driver_uses_the_shared_redirect() -> None:
    assert {p.name for p in DRIVERS} >= {"coreml_driver.py", "rknn_driver.py", "tflite_driver.py"}
    for p in DRIVERS:
        text = p.read_text(encoding="utf-8")
        assert "def _redirect_output" not in text and '"convert.log", "ab"' not in text, f"{p.name} has its own copy"
        assert "redirect_output(work)" in text, f"{p.name} does not use driver_output.redirect_output"


@pytest.mark.parametrize("driver", DRIVERS, ids=lambda p: p.stem)
def test_a_driver_run_standalone_keeps_events_on_stdout_and_the_rest_in_its_log(driver: Path, tmp_path: Path) -> None:
    """Run as the toolchain runs it (``python -I driver.py job.json``) on a job that lacks its model: one error
    event on stdout and nothing else; the traceback in ``convert.log``."""
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"workdir": str(tmp_path)}), encoding="utf-8")
    p = subprocess.run(
        [sys.executable, "-I", str(driver), str(job)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert p.returncode != 0, p.stderr
    events = [json.loads(line) for line in p.stdout.splitlines()]
    assert events and events[-1]["event"] == "error", p.stdout
    assert p.stderr == ""
    assert "Traceback" in (tmp_path / "convert.log").read_text(encoding="utf-8")
