"""The lean agent entry (``python -m edge.agent``): what it imports with a bundle in its store.

Asserted as the set of modules the real entry point has loaded when it exits, never as a time or a size:
the CLI stack (typer, rich, click, ``edge.cli``) never, numpy and the runtime only when a model runs.
Resident memory is measured, not asserted: ``benchmarks/agent_rss.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edge.bundle.bundle import Bundle
from edge.deploy import DeviceStore
from edge.pipeline import convert

REPO = Path(__file__).resolve().parents[2]
NEVER = ("typer", "rich", "click", "edge.cli")
WHEN_A_MODEL_RUNS = ("numpy", "onnxruntime")

# runs the real entry point (edge/agent/__main__.py), then writes the modules it loaded
_WRAPPER = (
    "import atexit, json, runpy, sys; out = sys.argv.pop(1); "
    "atexit.register(lambda: open(out, 'w').write(json.dumps(sorted(sys.modules)))); "
    "sys.argv[0] = 'edge.agent'; runpy.run_module('edge.agent', run_name='__main__', alter_sys=True)"
)


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory: pytest.TempPathFactory, models: dict[str, Path]) -> Bundle:
    return convert(models["tiny"], "x86-cpu", tmp_path_factory.mktemp("bundle") / "tiny")


def agent_modules(tmp_path: Path, broker_url: str, bundle: Bundle, source: str) -> tuple[set[str], dict[str, Any]]:
    store = tmp_path / "store"
    DeviceStore(store).install(bundle)
    out = tmp_path / "modules.json"
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            _WRAPPER,
            str(out),
            "--device-id",
            "cam-01",
            "--fleet",
            "lab",
            "--broker",
            broker_url,
            "--store",
            str(store),
            "--source",
            source,
            "--interval",
            "0.5",
            "--duration",
            "1",
            "--flush-timeout",
            "2",
            "--json",
            "--log-level",
            "warning",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert p.returncode == 0, p.stderr
    return set(json.loads(out.read_text())), json.loads(p.stdout.strip().splitlines()[-1])


def test_agent_with_a_bundle_and_no_model_run_imports_no_cli_numpy_or_runtime(
    tmp_path: Path, broker: Any, tiny_bundle: Bundle
) -> None:
    mods, summary = agent_modules(tmp_path, broker.url, tiny_bundle, "none")
    assert summary["device"] == "cam-01" and summary["births"] >= 1
    # the bundle was opened and its manifest checked against the runner's declared options...
    assert {"edge.bundle.bundle", "edge.bundle.schema", "edge.backends.onnxruntime.run"} <= mods
    # ...without the CLI, numpy or the runtime
    assert not {m for m in mods if m.split(".")[0] in NEVER or m.startswith("edge.cli")}
    assert not {m for m in mods if m.split(".")[0] in WHEN_A_MODEL_RUNS}


def test_agent_running_the_model_imports_the_runtime_and_still_no_cli(
    tmp_path: Path, broker: Any, tiny_bundle: Bundle
) -> None:
    mods, _ = agent_modules(tmp_path, broker.url, tiny_bundle, "synthetic")
    assert {"numpy", "onnxruntime"} <= mods  # the check above sees them when they are there
    assert not {m for m in mods if m.split(".")[0] in NEVER or m.startswith("edge.cli")}
