"""Nothing executable or loadable is named by a bundle (issue 11, attack 2).

The attack: a manifest with ``delegate: "edgetpu"`` and ``edgetpu_library`` pointing at a shared
library that travelled inside the bundle; running the bundle ran the library's constructor. Here
the library is real (compiled with gcc, its constructor writes a marker file), and the proof is
that the marker never appears -- while the same library given by the device's own configuration
(``$EDGEKIT_EDGETPU_LIBRARY``) is loaded, so the check is not vacuous.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from string import Template
from typing import Any

import numpy as np
import pytest

from edge.bundle.bundle import Bundle
from edge.errors import EdgeError, HardwareUnavailableError, ManifestError, TargetError
from edge.pipeline import convert
from tests.support.cli import assert_user_error, run_cli

pytest.importorskip("ai_edge_litert", reason="ai-edge-litert is not installed (pip install 'edgekit-ml[litert]')")

from edge.backends.litert.run import EDGETPU_CUSTOM_OP, EDGETPU_LIBRARY_ENV, LiteRTRunner, edgetpu_library  # noqa: E402
from edge.pipeline.request import ConvertRequest
from tests.backends.test_litert import quantized_model  # noqa: E402

MARKER_ENV = "EDGEKIT_TEST_CONSTRUCTOR_MARKER"
CONSTRUCTOR = Template(r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void ran(void) {
    const char *p = getenv("$marker");
    if (p) { FILE *f = fopen(p, "w"); if (f) { fputs("constructor ran", f); fclose(f); } }
}
""").substitute(marker=MARKER_ENV)


def _library(path: Path) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed (apt-get install gcc): needed to build the test library")
    src = path.with_suffix(".c")
    src.write_text(CONSTRUCTOR)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(path), str(src)], check=True, capture_output=True)
    src.unlink()
    return path


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _edgetpu_bundle(d: Path, options: dict[str, Any], extra: dict[str, bytes] | None = None) -> Path:
    """A hand-made LiteRT bundle: an Edge TPU-compiled model and ``extra`` files, all listed with their hashes."""
    d.mkdir(parents=True)
    model = quantized_model(d / "model_edgetpu.tflite", np.uint8, custom_op=EDGETPU_CUSTOM_OP)
    for name, data in (extra or {}).items():
        (d / name).write_bytes(data)
    files = [model, *(d / name for name in extra or {})]
    manifest = {
        "schema_version": 1,
        "edgekit_version": "0.1.0",
        "bundle_id": "tpu-coral-edgetpu-int8-0123456789",
        "target": {"name": "coral-edgetpu"},
        "precision": "int8",
        "format": "tflite",
        "primary_artifact": model.name,
        "artifacts": [{"path": f.name, "sha256": _sha(f), "bytes": f.stat().st_size} for f in files],
        "io": {
            "inputs": [{"name": "x", "shape": [1, 6], "dtype": "uint8"}],
            "outputs": [{"name": "z", "shape": [1, 6], "dtype": "uint8"}],
        },
        "runner": {"name": "litert", "options": options},
        "parity": {"passed": None, "skipped": "needs the device's accelerator"},
    }
    (d / "manifest.json").write_text(json.dumps(manifest))
    return d


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    m = tmp_path / "PWNED"
    monkeypatch.setenv(MARKER_ENV, str(m))
    monkeypatch.delenv(EDGETPU_LIBRARY_ENV, raising=False)
    return m


def test_a_bundle_cannot_make_the_device_load_its_library(tmp_path: Path, marker: Path) -> None:
    """The issue's attack as it was: the library inside the bundle (listed, hash right), named by the manifest."""
    lib = _library(tmp_path / "libevil.so")
    d = tmp_path / "b"
    _edgetpu_bundle(
        d, {"delegate": "edgetpu", "edgetpu_library": str(d / "libevil.so")}, extra={"libevil.so": lib.read_bytes()}
    )
    with pytest.raises(ManifestError, match="field runner.options.edgetpu_library: names a file, library or command"):
        Bundle.open(d)
    assert_user_error(
        run_cli("run", str(d), "--synthetic", "64x48", "-n", "2", env={MARKER_ENV: str(marker)}),
        "runner.options.edgetpu_library",
        "never a bundle",
    )
    assert_user_error(
        run_cli("bench", str(d), "--iterations", "2", env={MARKER_ENV: str(marker)}), "runner.options.edgetpu_library"
    )
    assert not marker.exists(), "the bundle's library was loaded"


def test_an_unlisted_library_in_the_bundle_is_refused(tmp_path: Path, marker: Path) -> None:
    lib = _library(tmp_path / "libevil.so")
    d = _edgetpu_bundle(tmp_path / "b", {"delegate": "edgetpu", "allow_cpu_fallback": True})
    shutil.copy(lib, d / "libedgetpu.so.1")
    with pytest.raises(EdgeError, match="libedgetpu.so.1: not listed in the manifest"):
        Bundle.open(d)
    assert not marker.exists()


def test_the_device_chooses_the_library(tmp_path: Path, marker: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$EDGEKIT_EDGETPU_LIBRARY (device configuration) is honoured -- and checked."""
    lib = _library(tmp_path / "libdevice.so")
    model = quantized_model(tmp_path / "m_edgetpu.tflite", np.uint8, custom_op=EDGETPU_CUSTOM_OP)
    for bad, why in (
        ("libdevice.so", "absolute path"),
        (str(tmp_path / "nope.so"), "not an existing regular file"),
        (str(tmp_path), "not an existing regular file"),
    ):
        monkeypatch.setenv(EDGETPU_LIBRARY_ENV, bad)
        with pytest.raises(EdgeError, match=why):
            edgetpu_library()
        with pytest.raises(EdgeError, match=why):
            LiteRTRunner(model, options={"delegate": "edgetpu"}, precision="int8")
    assert not marker.exists()
    monkeypatch.setenv(EDGETPU_LIBRARY_ENV, str(lib))
    assert edgetpu_library() == str(lib)
    with pytest.raises(HardwareUnavailableError, match="libdevice.so could not be loaded"):
        LiteRTRunner(model, options={"delegate": "edgetpu"}, precision="int8")  # not a real delegate
    assert marker.read_text() == "constructor ran"  # the device's own library was loaded
    monkeypatch.delenv(EDGETPU_LIBRARY_ENV)
    with pytest.raises(EdgeError, match="runner option edgetpu_library must be an absolute path"):
        edgetpu_library("libedgetpu.so.1")
    assert edgetpu_library(str(lib)) == str(lib)  # the agent's --runner-option, from its own config


def test_a_profile_cannot_put_a_library_into_bundles(models: dict[str, Path], tmp_path: Path) -> None:
    targets = tmp_path / "targets"
    targets.mkdir()
    text = (
        (Path(__file__).resolve().parents[2] / "targets" / "x86-cpu.toml")
        .read_text()
        .replace('name = "x86-cpu"', 'name = "mine"')
    )
    (targets / "mine.toml").write_text(text.replace("[run.options]", '[run.options]\ncustom_ops_library = "/tmp/x.so"'))
    with pytest.raises(TargetError, match="custom_ops_library name a file, library or command"):
        convert(models["tiny"], "mine", tmp_path / "out", ConvertRequest(targets_dir=[targets]))
    assert not (tmp_path / "out").exists()


def test_sidecar_cannot_point_outside_the_bundle(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    compiled = quantized_model(tmp_path / "b" / "model_edgetpu.tflite", np.uint8, custom_op=EDGETPU_CUSTOM_OP)
    compiled.with_suffix(".io.json").write_text(
        json.dumps({"schema": "edgekit.tflite-io/1", "cpu_model": "../elsewhere.tflite"})
    )
    quantized_model(tmp_path / "elsewhere.tflite", np.uint8)
    with pytest.raises(EdgeError, match="cpu_model must name a file next to the model"):
        LiteRTRunner(compiled, options={"delegate": "edgetpu", "allow_cpu_fallback": True})
