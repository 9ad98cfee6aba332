"""The exception firewall (issue #23, class 3): a bug anywhere in a command is one line on stderr
(``internal error in STEP: Type: message; details in FILE``), exit code 3, and its traceback in FILE; a
user error stays exit 2. Each stage is made to fail for real: a sitecustomize in the subprocess replaces
one library function with one that raises, before the command runs (no runtime is mocked)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from edge.pipeline import convert
from tests.support.cli import EDGEKIT, run_cli

SITECUSTOMIZE = """
import importlib, os
spec = os.environ.get("EDGEKIT_TEST_RAISE")
if spec:
    module, _, attr = spec.partition(":")
    owner = importlib.import_module(module)
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    def injected(*args, **kwargs):
        raise RuntimeError("injected fault in " + attr + "\\nsecond line")
    setattr(owner, name, injected)
"""
LINE = re.compile(
    r"^error: internal error in (?P<step>[a-z ]+): RuntimeError: injected fault in [\w.]+ \| second line; "
    r"details in (?P<file>\S+\.log)$"
)


@pytest.fixture(scope="module")
def fault_env(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], Path]:
    d = tmp_path_factory.mktemp("fault")
    (d / "site").mkdir()
    (d / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    logs = d / "state"
    return {"PYTHONPATH": str(d / "site"), "XDG_STATE_HOME": str(logs)}, logs / "edgekit" / "crashes"


@pytest.fixture(scope="module")
def bundle(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("b") / "tiny"
    convert(models["tiny"], "x86-cpu", out)
    return out


def _check(p: subprocess.CompletedProcess[str], step: str, attr: str, logs: Path) -> None:
    assert p.returncode == 3, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, p.stderr
    m = LINE.match(lines[0])
    assert m is not None and m.group("step") == step, lines[0]
    log = Path(m.group("file"))
    assert log.parent == logs and log.is_file() and (log.stat().st_mode & 0o077) == 0
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and f"injected fault in {attr}" in text
    assert "in injected" in text and "sitecustomize.py" in text  # the frame that raised is in the saved traceback


@pytest.mark.parametrize(
    "step, attr, args",
    [
        ("convert", "edge.pipeline.sources:OnnxSource.io", ["convert", "{model}", "-t", "x86-cpu", "-o", "{tmp}/out"]),
        ("deploy", "edge.pipeline.sources:OnnxSource.io", ["deploy", "{model}", "-t", "x86-cpu", "-d", "{tmp}/dev"]),
        (
            "tune",
            "edge.pipeline.sources:OnnxSource.io",
            ["tune", "{model}", "-t", "x86-cpu", "--out", "{tmp}/tuned", "--max-trials", "1"],
        ),
        ("bench", "edge.bundle.bundle:Bundle.open", ["bench", "{bundle}"]),
        ("run", "edge.bundle.bundle:Bundle.open", ["run", "{bundle}", "--synthetic", "64x64", "--max-frames", "2"]),
        ("verify", "edge.bundle.bundle:Bundle.open", ["verify", "{bundle}"]),
        (
            "agent",
            "edge.agent.main:config_from",
            ["agent", "--device-id", "d1", "--store", "{tmp}/store", "--duration", "1"],
        ),
    ],
)
def test_every_stage_fails_as_one_line_exit_3_and_a_log(
    step: str,
    attr: str,
    args: list[str],
    models: dict[str, Path],
    bundle: Path,
    fault_env: tuple[dict[str, str], Path],
    tmp_path: Path,
) -> None:
    env, logs = fault_env
    argv = [a.format(model=models["tiny"], bundle=bundle, tmp=tmp_path) for a in args]
    p = run_cli(*argv, env={**env, "EDGEKIT_TEST_RAISE": attr})
    _check(p, step, attr.split(":")[1], logs)


def test_the_agent_without_the_cli_too(fault_env: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    env, logs = fault_env
    p = subprocess.run(
        [sys.executable, "-m", "edge.agent", "--device-id", "d1", "--store", str(tmp_path / "s"), "--duration", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env, "EDGEKIT_TEST_RAISE": "edge.agent.main:config_from"},
    )
    _check(p, "agent", "config_from", logs)


def test_a_user_error_stays_exit_2(fault_env: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    env, _ = fault_env
    p = run_cli("convert", str(tmp_path / "missing.onnx"), "-t", "x86-cpu", env=env)
    assert p.returncode == 2 and "internal error" not in p.stderr and "Traceback" not in p.stderr
    assert EDGEKIT  # the real console script ran


def test_an_unwritable_log_directory_falls_back_to_the_temp_dir(
    models: dict[str, Path], fault_env: tuple[dict[str, str], Path], tmp_path: Path
) -> None:
    env, _ = fault_env
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the directory should be
    (tmp_path / "tmp").mkdir()
    p = run_cli(
        "convert",
        str(models["tiny"]),
        "-t",
        "x86-cpu",
        "-o",
        str(tmp_path / "o"),
        env={
            **env,
            "EDGEKIT_TEST_RAISE": "edge.pipeline.sources:OnnxSource.io",
            "EDGEKIT_LOG_DIR": str(blocked / "logs"),
            "TMPDIR": str(tmp_path / "tmp"),
        },
    )
    assert p.returncode == 3 and "Traceback" not in p.stderr
    m = LINE.match(p.stderr.strip())
    assert m is not None and Path(m.group("file")).parent.parent == tmp_path / "tmp"
