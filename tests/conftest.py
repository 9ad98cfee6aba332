"""Shared fixtures: models built in code (no downloads), temporary targets directories."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edge.samples import build_mobilenet_v2, build_tiny_cnn, build_two_input_model

REPO = Path(__file__).resolve().parent.parent
EDGEKIT = shutil.which("edgekit", path=str(Path(sys.executable).parent)) or "edgekit"


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


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real console script in a subprocess: exit codes and stderr exactly as a user sees them."""
    full_env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", **(env or {})}
    return subprocess.run([EDGEKIT, *args], capture_output=True, text=True, cwd=cwd, env=full_env, timeout=300)


def assert_user_error(p: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit code 2, one line on stderr naming the problem, no traceback."""
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    err = " ".join(p.stderr.split())
    for n in needles:
        assert n in err, f"{n!r} not in stderr: {p.stderr}"
