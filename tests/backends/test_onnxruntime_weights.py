"""An fp32 ONNX bundle of a model with int8 weights (issue #23: all-MiniLM-L6-v2 int8, a 23 MB source whose x86-cpu
bundle was 90 MB): onnxruntime's offline constant folding turned each int8 weight's Cast + Mul into an f32 constant.
The dequantisation stays in the graph now (onnxruntime folds it as the device loads the model: the same fp32
arithmetic on the same weights), recorded in the step's details and notes; ``fold_quantized_weights`` folds it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge.backends.converter import ConversionRequest
from edge.backends.onnxruntime.convert import OnnxToOnnx
from edge.graph.model import io_spec, load_onnx
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest
from tests.support.next_models import int8_weight_encoder

ort = pytest.importorskip("onnxruntime")


def test_an_fp32_bundle_keeps_int8_weights_int8(tmp_path: Path) -> None:
    """Before: model.onnx 3.9x the source (787 KB from 197 KB: every weight an f32 constant). Now about the source's
    size, and the bundle computes what the source does in fp32."""
    src = int8_weight_encoder(tmp_path / "enc.onnx", cast_mul=True)
    b = convert(src, "x86-cpu", tmp_path / "out", ConvertRequest(precision="fp32"))
    assert b.manifest["parity"]["passed"] is True
    assert (b.path / "model.onnx").stat().st_size < 1.2 * src.stat().st_size
    [step] = [s for s in b.manifest["chain"] if s["converter"] == "onnx->onnx"]
    kept = step["details"]["quantized_weights"]
    assert kept["kept"] is True and kept["folded_weight_bytes"] > 3.5 * kept["source_weight_bytes"]
    assert any("keep their dequantisation in the graph" in n for n in step["notes"])
    x = np.random.default_rng(0).standard_normal((1, 16, 256)).astype(np.float32)
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with b.open_runner() as r:
        (got,) = r.infer({"x": x}).values()
    np.testing.assert_allclose(got, want, atol=1e-4)  # fp32 (threads and kernels may order sums differently)


def test_fold_quantized_weights_folds_them_and_says_so(tmp_path: Path) -> None:
    src = int8_weight_encoder(tmp_path / "enc.onnx", layers=1, cast_mul=True)
    io = io_spec(load_onnx(src))
    (tmp_path / "w").mkdir()
    request = ConversionRequest(
        source=src, workdir=tmp_path / "w", precision="fp32", io=io, options={"fold_quantized_weights": True}
    )
    result = OnnxToOnnx().convert(request)
    assert result.artifact.stat().st_size > 3.5 * src.stat().st_size
    assert result.details["quantized_weights"]["kept"] is False and "folded into f32 constants" in result.notes[0]


def test_a_float_model_is_optimised_as_before(tmp_path: Path) -> None:
    """No int8 weights (DequantizeLinear ones onnxruntime does not fold either): nothing is recorded."""
    src = int8_weight_encoder(tmp_path / "enc.onnx", layers=1)
    io = io_spec(load_onnx(src))
    (tmp_path / "w").mkdir()
    result = OnnxToOnnx().convert(ConversionRequest(source=src, workdir=tmp_path / "w", precision="fp32", io=io))
    assert "quantized_weights" not in result.details and not result.notes


FOLDING = """
schema_version = 1
name = "folding"
title = "x86-cpu folding int8 weights"
hardware = "this host"
default_precision = "fp32"
precisions = ["fp32"]
frame_budget_ms = 33.3

[convert]
chain = ["onnx->onnx"]
os = ["linux", "darwin", "windows"]
arch = ["x86_64", "aarch64"]

[convert.options."onnx->onnx"]
fold_quantized_weights = true

[run]
runner = "onnxruntime"
os = ["linux", "darwin", "windows"]
arch = ["x86_64", "aarch64"]
device_arch = ["x86_64"]
"""


def test_a_bundle_much_bigger_than_its_source_says_so_and_why(tmp_path: Path) -> None:
    """Where the weights are folded anyway (here by the option; on arm-xnnpack by onnx2tf: MiniLM 23 -> 90 MB), the
    report and the manifest's chain notes say how much bigger and why. Before: nothing said it."""
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "folding.toml").write_text(FOLDING)
    src = int8_weight_encoder(tmp_path / "enc.onnx", layers=1, cast_mul=True)
    b = convert(src, "folding", tmp_path / "out", ConvertRequest(targets_dir=[tmp_path / "targets"]))
    notes = [n for s in b.manifest["chain"] for n in s["notes"]]
    grew = [n for n in notes if n.startswith("the bundle's model is ")]
    assert grew and "MB source (4.0x): the source's int8 weights are float constants in the fp32 model" in grew[0], (
        notes
    )
