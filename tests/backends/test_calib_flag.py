"""The calibration flag is declared once (``edge.verify.inputs.CALIB_FLAG``): the commands that take calibration
data declare their option with it and every hint that tells a user to pass calibration data names it. OpenVINO's
converter told users ``--calibration``, a flag no command takes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from edge.verify.inputs import CALIB_FLAG
from tests.support.cli import run_cli

EDGE = Path(__file__).resolve().parents[2] / "edge"


def test_no_source_names_another_calibration_flag() -> None:
    wrong = [
        f"{p.relative_to(EDGE.parent)}:{n}: {line.strip()}"
        for p in sorted(EDGE.rglob("*.py"))
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"--calib[\w-]", line)
    ]
    assert wrong == []


@pytest.mark.parametrize("command", [("convert",), ("tune",), ("fleet", "tune")])
def test_every_command_that_calibrates_takes_the_flag(command: tuple[str, ...]) -> None:
    p = run_cli(*command, "--help", env={"COLUMNS": "300"})
    assert p.returncode == 0, p.stderr
    assert CALIB_FLAG in p.stdout
