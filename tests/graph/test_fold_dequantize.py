"""Constant int8 weights behind DequantizeLinear folded to float32 before a graph is quantized again from float
(``edge.graph.lower.fold_weight_dequantize``; issue #34 class 6): onnx2tf's full-integer model of tf2onnx's ONNX of
a dynamic-range TFLite computed unrelated outputs with them unfolded."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from edge.graph.lower import fold_weight_dequantize


def _model(axis: int | None) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, size=(4, 3), dtype=np.int8)
    per_axis = axis is not None
    scale = (rng.uniform(0.01, 0.1, size=(3,) if per_axis else ())).astype(np.float32)
    zp = np.zeros(scale.shape, np.int8)
    dq = helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"], **({"axis": axis} if per_axis else {}))
    mm = helper.make_node("MatMul", ["x", "wf"], ["y"])
    g = helper.make_graph(
        [dq, mm],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zp, "z")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _run(m: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    # unoptimized: onnxruntime fuses DequantizeLinear -> MatMul into an integer MatMul that quantizes x (not exact)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def test_weight_dequantize_folds_exactly() -> None:
    x = np.random.default_rng(1).normal(size=(2, 4)).astype(np.float32)
    for axis in (None, 1, -1):
        m = _model(axis)
        want = _run(m, x)
        folded, n = fold_weight_dequantize(_model(axis))
        assert n == 1 and [node.op_type for node in folded.graph.node] == ["MatMul"]
        assert {i.name for i in folded.graph.initializer} == {"wf"}  # the int8 weights, scale and zero point went
        np.testing.assert_allclose(_run(folded, x), want, rtol=1e-6, atol=1e-6)


def test_a_dequantize_of_data_stays() -> None:
    m = _model(None)
    m.graph.initializer.pop(0)  # w: now a graph input, not a constant
    m.graph.input.append(helper.make_tensor_value_info("w", TensorProto.INT8, [4, 3]))
    _, n = fold_weight_dequantize(m)
    assert n == 0 and [node.op_type for node in m.graph.node] == ["DequantizeLinear", "MatMul"]
