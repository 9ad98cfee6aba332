"""What a device imports: a runner, the bundle reader and the agent pull no converter or toolchain code.

Each check runs in a fresh interpreter and reads ``sys.modules`` after the import: the import graph
is what a device install pays for, so it is asserted, not assumed.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Build-host code: converters, toolchain launchers and the conversion pipeline.
BUILD_SIDE = ("edge.backends.converter", "edge.toolchains", "edge.pipeline", "edge.verify.inputs")
RUNNERS = ["edge.backends.onnxruntime.run", "edge.backends.openvino.run", "edge.backends.litert.run",
           "edge.backends.tensorrt.run", "edge.backends.coreml.run", "edge.backends.llamacpp.run"]


def _imported_after(module: str) -> list[str]:
    code = (f"import importlib, json, sys; importlib.import_module({module!r}); "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('edge'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _build_side(mods: list[str]) -> list[str]:
    return [m for m in mods if m.startswith(BUILD_SIDE) or m.endswith(".convert") or m.endswith(".edgetpu")]


@pytest.mark.parametrize("module", RUNNERS + ["edge.bundle.bundle", "edge.verify.refpairs", "edge.agent.agent", "edge.video.pipeline"])
def test_device_side_imports_no_converter_code(module: str) -> None:
    mods = _imported_after(module)
    assert module in mods
    assert _build_side(mods) == [], f"{module} pulls build-host code: {_build_side(mods)}"


def test_the_check_sees_a_converter_when_one_is_imported() -> None:
    # the check itself can fail: importing a converter module is caught
    mods = _imported_after("edge.backends.onnxruntime.convert")
    assert "edge.backends.onnxruntime.convert" in _build_side(mods)
    assert "edge.backends.converter" in _build_side(mods)
