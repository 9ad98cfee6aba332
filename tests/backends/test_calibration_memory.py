"""int8 calibration memory is bounded (issue #23, class 6): onnxruntime's percentile and entropy calibrators keep
every activation of every sample until the end (a layout detector's percentile fallback was OOM-killed at
22 GiB); edgekit gives them the samples that fit in a quarter of the available RAM (or calibration_memory_mb),
and refuses in one line a model whose single sample does not fit. Memory is measured with
tracemalloc (numpy's allocations, onnxruntime's outputs included), not estimated."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge.backends.converter import ConversionRequest
from edge.backends.onnxruntime.convert import OnnxToOnnx, calibration_memory
from edge.errors import ConversionError
from edge.graph.model import save_onnx
from edge.spec import Calibration, IOSpec, TensorSpec

SAMPLES = 24
IO = IOSpec((TensorSpec("x", (1, 3, 128, 128), "float32", "NCHW"),), (TensorSpec("y", (1, 16), "float32"),))


def _wide_net(path: Path) -> Path:
    """Two 16-channel 3x3 convolutions at 128x128: about 4 MiB of float activations per sample."""
    rng = np.random.default_rng(5)
    w1 = numpy_helper.from_array((rng.standard_normal((16, 3, 3, 3)) * 0.2).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((16, 16, 3, 3)) * 0.1).astype(np.float32), "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 128, 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
        [w1, w2],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return save_onnx(m, path)


def _quantize(tmp: Path, **options: object) -> tuple[dict[str, object], int]:
    rng = np.random.default_rng(6)
    samples = tuple({"x": rng.random((1, 3, 128, 128), dtype=np.float32)} for _ in range(SAMPLES))
    work = tmp / f"w{len(list(tmp.iterdir()))}"
    work.mkdir()
    request = ConversionRequest(
        _wide_net(tmp / "wide.onnx"),
        work,
        "int8",
        IO,
        calibration=Calibration("test", "tensors", SAMPLES, samples),
        options={"mixed_precision": "off", **options},
    )
    tracemalloc.start()
    try:
        result = OnnxToOnnx().convert(request)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return {**result.details, "notes": result.notes}, peak


def test_percentile_holds_no_more_than_its_limit(tmp_path: Path) -> None:
    per_sample = calibration_memory(_wide_net(tmp_path / "m.onnx"), SAMPLES, "percentile")["per_sample_mb"]
    assert 3.5 < per_sample < 5  # type: ignore[operator]
    limit_mb = 16
    details, peak = _quantize(tmp_path, calibrate_method="percentile", calibration_memory_mb=limit_mb)
    used = details["calibration_memory"]["percentile"]  # type: ignore[index]
    assert used["samples"] == 3 < SAMPLES  # 16 MiB hold three samples of 4 MiB and 32 values
    assert peak < 3 * limit_mb * 2**20, peak / 2**20  # before: every sample kept, twice (about 190 MiB here)


def test_minmax_is_bounded_too_and_says_so(tmp_path: Path) -> None:
    details, peak = _quantize(tmp_path, calibration_memory_mb=16)
    used = details["calibration_memory"]["minmax"]  # type: ignore[index]
    assert used["samples"] < SAMPLES and peak < 48 * 2**20, peak / 2**20
    assert any("of the 24 calibration samples" in n for n in details["notes"])  # type: ignore[attr-defined]


def test_without_a_limit_every_sample_fits_here(tmp_path: Path) -> None:
    details, _ = _quantize(tmp_path)
    used = details["calibration_memory"]["minmax"]  # type: ignore[index]
    assert used["samples"] == SAMPLES and used["limit_mb"] > 100  # a quarter of this host's available RAM


def test_a_sample_that_does_not_fit_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match=r"holds 4 MiB of activations per sample, more than the 1 MiB"):
        _quantize(tmp_path, calibrate_method="percentile", calibration_memory_mb=1)
