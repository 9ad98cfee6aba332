"""``--preprocess auto`` takes the pre-processing a model file declares over the ImageNet guess (issue #34: MediaPipe's
BlazeFace, trained on ``(pixel - 127.5) / 127.5``, failed its coral-edgetpu int8 parity by default)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest

from edge.backends.litert.format import read_tflite
from edge.backends.litert.metadata import METADATA_IDENTIFIER
from edge.pipeline.explain import explain
from edge.pipeline.request import ConvertRequest
from tests.support.corpus import corpus_model
from tests.support.next_models import regressor


def test_a_tflite_metadata_normalisation_is_read_and_wins_over_the_guess() -> None:
    face = corpus_model("face-detection")
    assert dict(read_tflite(face).normalization)["input"].mean == (127.5,)
    [i] = explain(face)["inputs"]
    assert i["preprocess"] == "tflite-metadata", i  # was 'imagenet'
    assert "(pixel - 127.5) / 127.5" in i["evidence"]
    [told] = explain(face, ConvertRequest(preprocess="imagenet"))["inputs"]
    assert told["preprocess"] == "imagenet" and "declared with --preprocess" in told["evidence"]
    [none] = explain(face, ConvertRequest(preprocess="none"))["inputs"]
    assert none["preprocess"] is None


def _ultralytics(path: Path, task: str, author: str = "Ultralytics") -> Path:
    model = onnx.load(regressor(path))
    onnx.helper.set_model_props(model, {"author": author, "task": task, "stride": "32"})
    onnx.save(model, path)
    return path


@pytest.mark.parametrize(
    ("task", "author", "preset"),
    [
        ("detect", "Ultralytics", "yolo"),
        ("classify", "Ultralytics", "unit"),
        ("detect", "someone", "imagenet"),
        ("track", "Ultralytics", "imagenet"),
    ],
)
def test_an_ultralytics_export_says_its_task(tmp_path: Path, task: str, author: str, preset: str) -> None:
    [i] = explain(_ultralytics(tmp_path / "y.onnx", task, author))["inputs"]
    assert i["preprocess"] == preset, i
    if preset != "imagenet":
        assert f"Ultralytics metadata (task '{task}')" in i["evidence"]


def test_the_declared_preprocessing_reaches_the_bundle(tmp_path: Path) -> None:
    from edge.pipeline import convert

    bundle = convert(_ultralytics(tmp_path / "y.onnx", "detect"), "x86-cpu", tmp_path / "b", ConvertRequest())
    pre = bundle.manifest["preprocess"]
    assert pre["preset"] == "yolo" and pre["resize"] == "letterbox" and pre["mean"] == [0, 0, 0], pre


def test_hostile_metadata_declares_nothing_and_never_raises(tmp_path: Path) -> None:
    """Every byte of the real metadata buffer overwritten in turn (0xFF, then 0x00): the file still reads, and what it
    declares, if anything, is finite with a non-zero std."""
    data = bytearray(corpus_model("face-detection").read_bytes())
    start = data.find(METADATA_IDENTIFIER) - 4
    assert start > 0
    seen = 0
    for k in range(start, min(start + 600, len(data))):
        for byte in (0xFF, 0x00):
            bad = bytearray(data)
            bad[k] = byte
            path = tmp_path / "fuzz.tflite"
            path.write_bytes(bytes(bad))
            try:
                norm = read_tflite(path).normalization
            except Exception as e:  # noqa: BLE001 - only the model's own parse may refuse, in one typed error
                assert type(e).__name__ == "InputFileError", e
                continue
            finally:
                path.unlink()
            for n in norm.values():
                seen += 1
                assert all(math.isfinite(v) for v in (*n.mean, *n.std)) and all(s > 0 for s in n.std)
                assert len(n.mean) <= 4 and len(n.std) <= 4
    assert seen > 0  # most single-byte changes leave a readable declaration


@pytest.mark.corpus_full
def test_blazeface_for_coral_passes_on_its_declared_preprocessing(tmp_path: Path) -> None:
    """Before: ImageNet normalisation by default, int8 parity refused (regressors cosine 0.881, classificators 0.735);
    after: the file's (pixel - 127.5) / 127.5, parity passes (0.995 / 0.982). ~40 s."""
    from edge.pipeline import convert

    bundle = convert(corpus_model("face-detection"), "coral-edgetpu", tmp_path / "b", ConvertRequest())
    pre = bundle.manifest["preprocess"]
    assert pre["preset"] == "tflite-metadata" and np.isclose(pre["mean"][0], 127.5), pre
