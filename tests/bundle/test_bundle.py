from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from edge.base.typedjson import to_json
from edge.bundle.bundle import Bundle, bundle_id, staging_dir
from edge.bundle.schema import ID, Manifest
from edge.errors import BundleError, ManifestError
from edge.pipeline import convert


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


@pytest.mark.parametrize(
    "path", ["../outside", "/etc/passwd", "a/../../x", "./model.onnx", "a//b", ".hidden", "-rf", "a\\b", ""]
)
def test_artifact_path_cannot_escape(bundle: Bundle, path: str) -> None:
    m = bundle.manifest
    m["artifacts"].append({"path": path, "sha256": "0" * 64, "bytes": 1})
    (bundle.path / "manifest.json").write_text(json.dumps(m))
    last = len(m["artifacts"]) - 1  # the model, and reference.npz when the pipeline wrote one
    with pytest.raises(ManifestError, match=rf"manifest.json: field artifacts\[{last}\]\.path: "):
        Bundle.open(bundle.path)


def test_a_bundle_is_exactly_its_listed_files(bundle: Bundle, tmp_path: Path) -> None:
    """Attack 2 (issue 11): a library travelled inside the bundle as an unlisted file. Opening (and so
    running or shipping) refuses anything not listed: files, directories, symlinks -- each named."""
    (bundle.path / "libedgetpu.so.1").write_bytes(b"\x7fELF not listed")
    with pytest.raises(BundleError, match="libedgetpu.so.1: not listed in the manifest"):
        Bundle.open(bundle.path)
    (bundle.path / "libedgetpu.so.1").unlink()
    (bundle.path / "extra").mkdir()
    with pytest.raises(BundleError, match="extra/: not listed"):
        Bundle.open(bundle.path)
    (bundle.path / "extra").rmdir()
    (bundle.path / "link").symlink_to(tmp_path)
    with pytest.raises(BundleError, match="link: a symlink"):
        Bundle.open(bundle.path)
    (bundle.path / "link").unlink()
    # a listed artifact replaced by a symlink to an identical file outside is still refused
    outside = tmp_path / "outside.onnx"
    outside.write_bytes(bundle.artifact.read_bytes())
    bundle.artifact.unlink()
    bundle.artifact.symlink_to(outside)
    with pytest.raises(BundleError, match="model.onnx: a symlink") as e:
        Bundle.open(bundle.path)
    assert "missing" not in str(e.value)
    bundle.artifact.unlink()
    bundle.artifact.write_bytes(outside.read_bytes())
    # the manifest's signature (added by signing) is the one other file a bundle may hold
    (bundle.path / "manifest.sig").write_bytes(b"sig")
    Bundle.open(bundle.path)
    assert Bundle.open(bundle.path, verify=False).id == bundle.id


def test_manifest_may_not_be_a_symlink(bundle: Bundle, tmp_path: Path) -> None:
    real = tmp_path / "elsewhere.json"
    real.write_bytes((bundle.path / "manifest.json").read_bytes())
    (bundle.path / "manifest.json").unlink()
    (bundle.path / "manifest.json").symlink_to(real)
    with pytest.raises(ManifestError, match="is a symlink"):
        Bundle.open(bundle.path, verify=False)


def test_typed_manifest_is_what_code_reads(bundle: Bundle) -> None:
    b = Bundle.open(bundle.path)
    assert isinstance(b.info, Manifest) and b.info.bundle_id == b.id == b.manifest["bundle_id"]
    assert b.info.runner.name == "onnxruntime" and b.info.artifacts[0].path == "model.onnx"
    assert b.io.inputs[0].name == "input" and b.preprocess is not None and b.preprocess.size == (32, 32)
    assert b.frame_budget_ms == pytest.approx(16.67)
    with pytest.raises(AttributeError):
        b.info.bundle_id = "other"  # type: ignore[misc]
    assert to_json(b.info)["runner"] == b.manifest["runner"]


def test_bundle_ids_are_safe_names() -> None:
    for stem in ("-rf", "../..", "x$(id>PWNED)", "модель", ""):
        bid = bundle_id(stem, "x86-cpu", "fp32", ["0" * 64], {})
        assert re.fullmatch(ID, bid), bid


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
    from edge.bench import BenchOptions, run_benchmark

    report = run_benchmark(
        bundle.open_runner,
        BenchOptions(iterations=3, warmup=1, budget_ms=1000.0, bundle=bundle.id, target=bundle.target),
    ).to_json()
    bundle.record("benchmark", report)
    again = Bundle.open(bundle.path)
    assert again.manifest["benchmark"] == report and again.info.benchmark.latency.count == 3  # type: ignore[union-attr]
    before = (bundle.path / "manifest.json").read_bytes()
    with pytest.raises(ManifestError, match="field benchmark.load_ms: missing"):
        bundle.record("benchmark", {"verdict": "pass"})
    assert (bundle.path / "manifest.json").read_bytes() == before  # nothing written
