"""The wheel ships the target profiles: build it, install it in a fresh venv, run `edgekit targets`. The core install
is numpy alone (a device adds its runtime's extra); the command line is the `cli` extra."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from edge.cli import CLI_MISSING
from tests.support.cli import REPO


@pytest.mark.slow
def test_wheel_ships_targets(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(REPO)],
        check=True,
        capture_output=True,
        text=True,
    )
    wheel = next(dist.glob("edgekit_ml-*.whl"))
    import zipfile

    # the natural photographs edgekit calibrates and checks parity on by default (edge.verify.natural)
    assert "edge/verify/natural_images/index.json" in zipfile.ZipFile(wheel).namelist()
    # the installed wheel alone: a PYTHONPATH (a worktree's checkout) would shadow what it installed
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", str(wheel)], check=True, capture_output=True, text=True, env=clean
    )
    # the core install: numpy only; the library and the lean agent work, `edgekit` says what to install
    p = subprocess.run(
        [str(py), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, env=clean, check=True
    )
    installed = {line.split("==")[0].lower() for line in p.stdout.split()}
    assert not installed & {"typer", "rich", "click"}, installed
    p = subprocess.run([str(env_dir / "bin" / "edgekit")], capture_output=True, text=True, env=clean, cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [CLI_MISSING], p.stderr
    p = subprocess.run([str(py), "-m", "edge.agent", "--help"], capture_output=True, text=True, env=clean, cwd=tmp_path)
    assert p.returncode == 0 and "--device-id" in p.stdout, p.stderr
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", f"{wheel}[cli]"], check=True, capture_output=True, text=True, env=clean
    )
    p = subprocess.run(
        [str(env_dir / "bin" / "edgekit"), "targets", "--json"], capture_output=True, text=True, env=clean, cwd=tmp_path
    )
    assert p.returncode == 0, p.stderr
    profiles = json.loads(p.stdout)
    assert len(profiles) >= 6
    assert all(str(env_dir) in t["path"] and "/edge/targets/" in t["path"] for t in profiles)
    # the base install carries no runtime: doctor must say what to install, not crash
    p = subprocess.run(
        [str(env_dir / "bin" / "edgekit"), "doctor", "--json"], capture_output=True, text=True, env=clean, cwd=tmp_path
    )
    assert p.returncode == 0, p.stderr
    x86 = next(t for t in json.loads(p.stdout)["targets"] if t["target"] == "x86-cpu")
    assert not x86["can_run"] and "pip install 'edgekit-ml[onnx]'" in x86["run_problem"]


def _extras() -> tuple[list[str], dict[str, list[str]]]:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return project["dependencies"], project["optional-dependencies"]


def _includes(extras: dict[str, list[str]], name: str) -> set[str]:
    """The extras ``name`` pulls in, itself included, following ``edgekit-ml[...]`` references."""
    seen, todo = set(), [name]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        for req in extras[n]:
            if req.startswith("edgekit-ml["):
                todo += req[len("edgekit-ml[") : req.index("]")].split(",")
    return seen


def test_core_install_is_numpy_and_the_cli_is_an_extra() -> None:
    """A device installs the core and its runtime: no typer or rich (the lean agent never imports them); every
    host-side extra brings the command line; ``[all]`` holds fleet (issue #33)."""
    core, extras = _extras()
    assert [d.split(">")[0].split("=")[0] for d in core] == ["numpy"], core
    assert {d.split(">")[0] for d in extras["cli"]} == {"typer", "rich"}
    for host in ("all", "convert", "fleet", "tune", "dev"):
        assert "cli" in _includes(extras, host), host
    for device in ("onnx", "openvino", "litert", "coreml", "tensorrt", "llm", "mqtt", "sign", "video", "rknn"):
        assert "cli" not in _includes(extras, device), device
    assert {"fleet", "mqtt", "sign", "onnx", "openvino", "litert", "llm", "video", "tune", "convert"} <= _includes(
        extras, "all"
    )


def test_bare_edgekit_without_the_cli_extra_is_one_line() -> None:
    code = "import sys; sys.modules['typer'] = None; from edge.cli import main; main(sys.argv[1:])"
    for args in ([], ["targets"], ["--help"]):
        p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
        assert p.stderr.strip().splitlines() == [CLI_MISSING] and "pip install 'edgekit-ml[cli]'" in CLI_MISSING
