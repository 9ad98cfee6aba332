"""The main job as a user runs it: the README Quickstart's `edgekit deploy` on built-in defaults, the
`python -m edge` entry point, and the two examples, each in a temporary working directory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from edge.bundle.bundle import Bundle
from edge.deploy import DeviceStore
from tests.support.cli import REPO, run_cli


def _py(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


def _check_shipped(store: Path, out: str) -> Bundle:
    """devices/local/current is a verified bundle of the example for x86-cpu: parity passed, benchmark recorded."""
    current = DeviceStore(store).bundle()  # Bundle.open verifies every artifact's hash
    m = current.manifest
    assert m["target"]["name"] == "x86-cpu", m["target"]
    assert m["parity"]["passed"] is True, m["parity"]
    bench = m["benchmark"]
    assert bench["verdict"] in ("pass", "fail") and bench["budget_ms"] == pytest.approx(1000 / 60, abs=0.01), bench
    # steady state: at least the 200 iterations asked for, and at least 2 s of them (edge.tune.verdict)
    assert bench["on_target_device"] is True and bench["latency"]["count"] >= 200, bench
    assert bench["steadiness"]["load_before"] is not None and bench["steadiness"]["runs_p99_ms"], bench
    assert f"shipped {current.id}" in out, out
    return current


@pytest.mark.slow
def test_quickstart_deploy_on_defaults(tmp_path: Path) -> None:
    """`edgekit deploy`, no arguments: build the example, convert for x86-cpu, parity, bench at 60 fps, ship.

    Exit-code policy (edge/cli/deploy.py -> edge.deploy.ship): p99 within budget -> 0, shipped, the table says
    "pass"; over budget on the target's own runtime (x86-cpu runs here, no fallback) -> 1 (as `edgekit bench`), one error line, nothing
    shipped. A loaded host may be over budget, so both are accepted, each checked for consistency."""
    p = run_cli("deploy", cwd=tmp_path)
    assert "Traceback" not in p.stderr, p.stderr
    assert "using the built-in example MobileNetV2 at build/example/mobilenetv2.onnx" in " ".join(p.stderr.split())
    assert (tmp_path / "build" / "example" / "mobilenetv2.onnx").is_file()
    built = Bundle.open(tmp_path / "build" / "mobilenetv2-x86-cpu")
    assert built.manifest["parity"]["passed"] is True, built.manifest["parity"]
    verdict = built.manifest["benchmark"]["verdict"]
    store = tmp_path / "devices" / "local"
    if p.returncode == 0:
        assert verdict == "pass", built.manifest["benchmark"]
        assert re.search(r"budget\s+│?\s*pass: p99 [\d.]+ ms vs 16\.67 ms", p.stdout), p.stdout
        shipped = _check_shipped(store, p.stdout)
        assert shipped.id == built.id
    else:
        assert verdict == "fail", (p.returncode, built.manifest["benchmark"], p.stderr)
        assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)  # a verdict (as bench's), not a crash
        last = p.stderr.strip().splitlines()[-1]  # progress lines come before it on stderr
        assert p.stderr.count("error:") == 1 and last.startswith(f"error: refusing to ship {built.id}: p99 "), p.stderr
        assert "over the 16.67 ms budget" in last and "--accept-budget-failure" in last, last
        assert DeviceStore(store).current is None  # the gate held: nothing shipped
        # The same job, told to ship anyway: the bundle lands, with its "fail" verdict recorded.
        p = run_cli("deploy", "--accept-budget-failure", cwd=tmp_path)
        assert p.returncode == 0, (p.stdout, p.stderr)
        _check_shipped(store, p.stdout)
    history = [json.loads(x) for x in (store / "history.jsonl").read_text().splitlines()]
    assert history[-1]["action"] == "deploy"


def test_python_m_edge_help(tmp_path: Path) -> None:
    p = _py("-m", "edge", "--help", cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    for cmd in ("deploy", "convert", "bench", "targets", "doctor", "rollback", "toolchain", "run"):
        assert cmd in p.stdout, (cmd, p.stdout)
    p = _py("-m", "edge", "deploy", "--help", cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    out = " ".join(p.stdout.split())
    for opt in ("--target", "--device", "--accept-budget-failure", "--iterations", "built-in example"):
        assert opt in out, (opt, p.stdout)
    assert not any(tmp_path.iterdir())  # --help writes nothing


@pytest.mark.slow
def test_example_full_flow(tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = _py(str(REPO / "examples" / "full_flow.py"), "--out", str(out), "--iterations", "20", cwd=tmp_path)
    assert p.returncode == 0, (p.stdout, p.stderr)
    for needle in ("model: ", "x86-cpu", "intel-igpu", "bench: p50", "deployed ", "rollback -> "):
        assert needle in p.stdout, (needle, p.stdout)
    store = DeviceStore(out / "devices" / "cam-01")
    assert store.current is not None and store.previous is not None  # two deploys, then a rollback
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out"]  # everything under --out


@pytest.mark.slow
def test_example_video_demo(tmp_path: Path) -> None:
    out = tmp_path / "video"
    p = _py(str(REPO / "examples" / "video_demo.py"), "--out", str(out), "--frames", "30", cwd=tmp_path)
    assert p.returncode == 0, (p.stdout, p.stderr)
    for needle in ("offline (every frame", "realtime (fed at", "verdict: ", "frames: in 30"):
        assert needle in p.stdout, (needle, p.stdout)
    assert len((out / "detections.jsonl").read_text().splitlines()) == 30
    assert sorted(x.name for x in tmp_path.iterdir()) == ["video"]


def test_ci_runs_the_readme_test_command() -> None:
    """.ci/run ends with exactly the README Quickstart's second line (less the venv it makes above)."""
    readme = (REPO / "README.md").read_text()
    block = readme.split("## Quickstart", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    second = block.splitlines()[1].strip()
    ci_last = [x for x in (REPO / ".ci" / "run").read_text().splitlines() if x.strip()][-1].strip()
    venv = "python3 -m venv .venv && . .venv/bin/activate && "
    assert second.startswith(venv) and second.endswith("python -m pytest -q"), second
    assert ci_last == second.removeprefix(venv), (ci_last, second)
    assert "export CI=true" in (REPO / ".ci" / "run").read_text()
