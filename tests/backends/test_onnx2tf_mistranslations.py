"""onnx2tf mistranslations (issue #23, class 9): a byte-level classifier built from 1-D convolutions as jax2tf exports
them (Magika's pattern: Unsqueeze -> Conv 5x1 -> a Slice that keeps everything -> Squeeze) converted for arm-xnnpack
with outputs unrelated to the source; onnx2tf applied the Slice's ``[:, :, :, :1]`` to the channels-last tensor. The
rewrite before onnx2tf (``edge.graph.lower.drop_noop_slice_axes``) takes the Slice out; parity then passes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from edge import toolchains
from edge.graph.lower import drop_noop_slice_axes
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest
from tests.next_models import byte_conv1d_classifier

SHAPES = {"bytes": (1, 256)}


def _needs_onnx2tf() -> None:
    st = toolchains.status("tflite")
    if not st.usable:
        pytest.skip(f"needs the tflite toolchain: {st.problem}")


def _bytes(seed: int) -> dict[str, np.ndarray]:
    return {"bytes": np.random.default_rng(seed).integers(0, 256, (1, 256)).astype(np.int32)}


def _parity_bytes(d: Path) -> Path:
    """Six byte samples parity compares on: three of uniform bytes, three of ASCII text (an integer input named
    ``bytes`` may otherwise get one generated kind only)."""
    d.mkdir()
    text = np.frombuffer(((__doc__ or "") * 8).encode(), np.uint8).astype(np.int32)
    for i in range(3):
        np.save(d / f"uniform{i}.npy", _bytes(i)["bytes"])
        np.save(d / f"text{i}.npy", text[i * 300 : i * 300 + 256][None])
    return d


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_a_slice_that_keeps_a_whole_axis_by_its_length_loses_it(tmp_path: Path) -> None:
    """``ends`` 1 on a length-1 axis keeps it whole: only the axis lengths tell (before: only an end of INT32_MAX or
    more counted as "to the end", and the Slice stayed)."""
    src = onnx.load(str(byte_conv1d_classifier(tmp_path / "bytes.onnx")))
    kept, _ = drop_noop_slice_axes(onnx.load(str(tmp_path / "bytes.onnx")))
    assert [x.op_type for x in kept.graph.node].count("Slice") == 1  # without shapes: the length-1 axis is cut
    out, n = drop_noop_slice_axes(onnx.load(str(tmp_path / "bytes.onnx")), SHAPES)
    assert n == 1 and "Slice" not in [x.op_type for x in out.graph.node]
    onnx.checker.check_model(out, full_check=True)
    for seed in range(3):
        np.testing.assert_array_equal(_run(out, _bytes(seed)), _run(src, _bytes(seed)))

    # a Slice that cuts one axis keeps that one only: [:, 1:3, :, :1] of [1, 4, 5, 1]
    inits = [
        numpy_helper.from_array(np.array(v, np.int64), k)
        for k, v in (("s", [0, 1, 0, 0]), ("e", [9, 3, 10**9, 1]), ("a", [0, 1, 2, 3]))
    ]
    g = helper.make_graph(
        [helper.make_node("Slice", ["x", "s", "e", "a"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
        "cut",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 5, 1])],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [1, 2, 5, 1])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cut, n = drop_noop_slice_axes(onnx.ModelProto.FromString(m.SerializeToString()), {"x": (1, 4, 5, 1)})
    sl = next(x for x in cut.graph.node if x.op_type == "Slice")
    axes = next(numpy_helper.to_array(i) for i in cut.graph.initializer if i.name == sl.input[3])
    assert n == 1 and axes.tolist() == [1]
    x = {"x": np.arange(20, dtype=np.float32).reshape(1, 4, 5, 1)}
    np.testing.assert_array_equal(_run(cut, x), _run(m, x))


@pytest.mark.slow
def test_the_jax2tf_conv1d_classifier_converts_for_arm_xnnpack(tmp_path: Path) -> None:
    """Before the rewrite: parity failed (top-1 0 %); after it, the Slice is gone and parity passes."""
    _needs_onnx2tf()
    src = byte_conv1d_classifier(tmp_path / "bytes.onnx")
    b = convert(src, "arm-xnnpack", tmp_path / "b", ConvertRequest(parity_data=_parity_bytes(tmp_path / "parity")))
    parity = b.manifest["parity"]
    assert parity["passed"] is True and parity.get("accepted_failure") is not True, parity
    assert parity["input_provenance"]["count"] == 6 and parity["outputs"][0]["top1"] == 1.0
    assert b.manifest["chain"][0]["details"]["lowered"] == {"Slice": 1}
