from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edge.bundle import Bundle, staging_dir
from edge.convert import convert
from edge.errors import BundleError


@pytest.fixture
def bundle(models: dict[str, Path], tmp_path: Path) -> Bundle:
    return convert(models["tiny"], "x86-cpu", tmp_path / "b")


def test_open_verifies_and_runs(bundle: Bundle) -> None:
    b = Bundle.open(bundle.path)
    with b.open_runner() as r:
        y = r.infer({"input": np.zeros((1, 3, 32, 32), np.float32)})
    assert y["logits"].shape == (1, 10)


def test_altered_artifact_is_refused(bundle: Bundle) -> None:
    with open(bundle.artifact, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(BundleError, match="model.onnx: sha256 differs from the manifest"):
        Bundle.open(bundle.path)


def test_missing_artifact_is_refused(bundle: Bundle) -> None:
    bundle.artifact.unlink()
    with pytest.raises(BundleError, match="model.onnx: missing"):
        Bundle.open(bundle.path)


def test_artifact_path_cannot_escape(bundle: Bundle) -> None:
    m = bundle.manifest
    m["artifacts"].append({"path": "../outside", "sha256": "0" * 64, "bytes": 1})
    (bundle.path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match="escapes the bundle"):
        Bundle.open(bundle.path)


def test_not_a_bundle(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="no manifest.json"):
        Bundle.open(tmp_path)
    with pytest.raises(BundleError, match="does not exist"):
        Bundle.open(tmp_path / "nope")
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(BundleError, match="not valid JSON"):
        Bundle.open(tmp_path)


def test_staging_leaves_nothing_on_failure_and_keeps_the_old(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "old").write_text("old")
    with pytest.raises(RuntimeError):
        with staging_dir(dest, force=True) as stage:
            (stage / "new").write_text("half")
            raise RuntimeError("converter crashed")
    assert (dest / "old").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest"]
    with staging_dir(dest, force=True) as stage:
        (stage / "new").write_text("new")
    assert [p.name for p in dest.iterdir()] == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest"]


def test_record_keeps_bundle_valid(bundle: Bundle) -> None:
    bundle.record("benchmark", {"verdict": "pass"})
    assert Bundle.open(bundle.path).manifest["benchmark"] == {"verdict": "pass"}
