"""Parity and calibration inputs follow each input's own shape, layout, dtype and range (issue #23, class 1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge.pipeline import convert
from edge.preprocess import Preprocessor
from edge.spec import IOSpec, TensorSpec, default_preprocess
from edge.verify.inputs import describe_generated, generated_samples
from tests.support.next_models import one_channel_net


def _io(*inputs: TensorSpec) -> IOSpec:
    return IOSpec(tuple(inputs), (TensorSpec("y", (1, 8), "float32"),))


def test_auto_preprocessing_only_where_certain() -> None:
    rgb = _io(TensorSpec("x", (1, 3, 32, 32), "float32"))
    grey = _io(TensorSpec("x", (1, 1, 32, 100), "float32"))
    spec = _io(TensorSpec("x", (1, 49, 40, 1), "float32"))
    u8 = _io(TensorSpec("x", (1, 64, 64, 3), "uint8"))
    assert default_preprocess(rgb).preset == "imagenet"  # type: ignore[union-attr]
    assert default_preprocess(u8).preset == "raw"  # type: ignore[union-attr]
    assert default_preprocess(grey) is None and default_preprocess(spec) is None
    declared = default_preprocess(grey, "ppocr")
    assert declared is not None and declared.color == "GRAY"
    out, _ = Preprocessor(declared)(np.full((40, 120, 3), 255, np.uint8))
    assert out.shape == (1, 1, 32, 100) and np.allclose(out, 1.0)  # (255/255 - 0.5) / 0.5


@pytest.mark.parametrize(
    "tensor, layout_shape, lo, hi",
    [
        (TensorSpec("x", (1, 1, 32, 100), "float32"), (1, 1, 32, 100), 0.0, 1.0),  # grey text line, NCHW
        (TensorSpec("image", (1, 48, 48, 1), "uint8"), (1, 48, 48, 1), 0, 255),  # grey picture, NHWC uint8
        (TensorSpec("x", (1, 3, 32, 32), "float32"), (1, 3, 32, 32), 0.0, 1.0),  # colour, --preprocess none
    ],
)
def test_planes_without_declared_preprocessing_follow_the_input(
    tensor: TensorSpec, layout_shape: tuple[int, ...], lo: float, hi: float
) -> None:
    io = _io(tensor)
    kind = describe_generated(io, None)[tensor.name]
    assert "natural-image frames" in kind and "no pre-processing declared" in kind
    for s in generated_samples(io, None, 3):
        a = s[tensor.name]
        assert a.shape == layout_shape and a.dtype == np.dtype(tensor.dtype)
        assert lo <= a.min() and a.max() <= hi and a.std() > 0.02 * (hi - lo)  # structured, not a constant


def test_spectrogram_named_input_gets_log_mel() -> None:
    io = _io(TensorSpec("mel_input", (1, 49, 40, 1), "float32"))
    assert describe_generated(io, None)["mel_input"].startswith("log-mel spectrogram")
    a = generated_samples(io, None, 1)[0]["mel_input"]
    assert a.shape == (1, 49, 40, 1) and abs(float(a.mean())) < 1e-3 and abs(float(a.std()) - 1) < 1e-2
    plane = a[0, :, :, 0]
    assert np.isfinite(plane).all() and plane.min() > -6  # no empty band at log(0)
    neighbours = np.corrcoef(plane[:, :-1].ravel(), plane[:, 1:].ravel())[0, 1]
    assert neighbours > 0.5  # a spectral envelope: adjacent bands move together, unlike white noise


@pytest.mark.parametrize("shape, name", [((1, 1, 32, 100), "x"), ((1, 49, 40, 1), "x"), ((1, 49, 40, 1), "fbank")])
def test_one_channel_models_convert_with_default_arguments(tmp_path: Path, shape: tuple[int, ...], name: str) -> None:
    """Before: 3-channel generated frames, onnxruntime's ``index: 1 Got: 3 Expected: 1``, a traceback."""
    model = one_channel_net(tmp_path / "m.onnx", shape, name=name)
    b = convert(model, "x86-cpu", tmp_path / "out")
    assert b.manifest["parity"]["passed"] is True
    assert b.preprocess is None  # nothing guessed for a 1-channel input
    made = b.manifest["parity"]["input_provenance"]["generated"][name]
    assert ("log-mel" if name == "fbank" else "grey natural-image") in made


def test_byte_input_gets_file_like_bytes() -> None:
    """An integer input named like raw bytes (Magika's ``bytes`` [1, 2048]) was fed zeros: 32 identical samples, one
    class every time, so parity compared one point. It gets file-like bytes now: text, markup, source code, binary
    headers; on the real Magika model they fall in many different content types."""
    import onnxruntime as ort

    from tests.support.corpus import corpus_model

    io = _io(TensorSpec("bytes", (1, 2048), "int32"))
    assert describe_generated(io, None)["bytes"].startswith("file-like bytes in 0..255")
    samples = generated_samples(io, None, 32)
    for s in samples:
        a = s["bytes"]
        assert a.shape == (1, 2048) and a.dtype == np.int32 and 0 <= a.min() and a.max() <= 255
    assert len({s["bytes"].tobytes() for s in samples}) == 32
    assert generated_samples(io, None, 2)[1]["bytes"].tobytes() == samples[1]["bytes"].tobytes()  # deterministic
    assert describe_generated(_io(TensorSpec("bytes", (1, 4), "int32")), None)["bytes"] == "zeros"  # not a file

    session = ort.InferenceSession(str(corpus_model("magika")), providers=["CPUExecutionProvider"])
    top1 = {int(session.run(None, s)[0].argmax()) for s in samples}
    assert len(top1) >= 8, top1  # zeros: the same class for all 32
