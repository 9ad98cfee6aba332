"""The wheel ships the target profiles: build it, install it in a fresh venv, run `edgekit targets`."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.conftest import REPO


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
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True, capture_output=True, text=True)
    p = subprocess.run(
        [str(env_dir / "bin" / "edgekit"), "targets", "--json"], capture_output=True, text=True, cwd=tmp_path
    )
    assert p.returncode == 0, p.stderr
    profiles = json.loads(p.stdout)
    assert len(profiles) >= 6
    assert all(str(env_dir) in t["path"] and "/edge/targets/" in t["path"] for t in profiles)
    # the base install carries no runtime: doctor must say what to install, not crash
    p = subprocess.run(
        [str(env_dir / "bin" / "edgekit"), "doctor", "--json"], capture_output=True, text=True, cwd=tmp_path
    )
    assert p.returncode == 0, p.stderr
    x86 = next(t for t in json.loads(p.stdout)["targets"] if t["target"] == "x86-cpu")
    assert not x86["can_run"] and "pip install 'edgekit-ml[onnx]'" in x86["run_problem"]
