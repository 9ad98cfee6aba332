"""An already-quantized ONNX keeps its own quantization (issue #23, class 5): detected before any converter runs,
recorded as the bundle's precision, never quantized again; a float precision is refused in one line."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge.errors import PrecisionError
from edge.graph.quantized import quantization_of
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest
from tests.support.cli import assert_user_error, run_cli
from tests.support.next_models import quantized, regressor


@pytest.fixture(scope="module")
def qmodels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("q")
    return {s: quantized(d / f"{s}.onnx", s, d) for s in ("QDQ", "QOperator", "dynamic")}


def test_each_scheme_is_detected(qmodels: dict[str, Path], tmp_path: Path) -> None:
    seen = {s: quantization_of(onnx.load(str(p))) for s, p in qmodels.items()}
    assert {s: (q.scheme, q.precision) for s, q in seen.items() if q} == {
        "QDQ": ("QDQ", "int8"),
        "QOperator": ("QOperator", "int8"),
        "dynamic": ("dynamic", "int8-dynamic"),
    }
    assert quantization_of(onnx.load(str(regressor(tmp_path / "f.onnx")))) is None
    w = numpy_helper.from_array(__import__("numpy").ones((4, 4), "int8"), "w")  # int8 weights dequantized on load
    g = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["w", "s"], ["wf"]), helper.make_node("MatMul", ["x", "wf"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [w, numpy_helper.from_array(__import__("numpy").float32(0.1), "s")],
    )
    q = quantization_of(helper.make_model(g))
    assert q is not None and (q.scheme, q.precision) == ("weight-only", "fp32")  # float arithmetic: an fp32 bundle


@pytest.mark.parametrize(
    "scheme, precision",
    [("QDQ", "int8"), ("QDQ", None), ("QOperator", "int8"), ("dynamic", "int8-dynamic"), ("dynamic", "int8")],
)
def test_its_own_quantization_is_kept_and_recorded(
    qmodels: dict[str, Path], tmp_path: Path, scheme: str, precision: str | None
) -> None:
    """Before: QDQ with --precision int8 failed in onnxruntime's quantizer ('produced an invalid model: two nodes
    with same node name'); QOperator could not be loaded (no U8U8 QGemm kernel under x64quantprecision); the
    dynamic encoder was quantized a second time."""
    b = convert(qmodels[scheme], "x86-cpu", tmp_path / "out", ConvertRequest(precision=precision))
    own = "int8-dynamic" if scheme == "dynamic" else "int8"
    assert b.precision == own and b.manifest["parity"]["passed"] is True
    assert b.manifest["source"]["precision"] == own and b.manifest["source"]["quantized"].startswith(scheme)
    assert [s["precision"] for s in b.manifest["chain"]] == ["fp32"]  # converted as it is, not quantized again
    assert b.manifest.get("calibration") is None  # nothing to calibrate


def test_a_float_precision_is_refused_in_one_line(qmodels: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(PrecisionError, match="already quantized \\(int8\\); its float weights are not in the file"):
        convert(qmodels["QDQ"], "x86-cpu", tmp_path / "out", ConvertRequest(precision="fp32"))
    p = run_cli("convert", str(qmodels["dynamic"]), "-t", "x86-cpu", "-p", "fp16", "-o", str(tmp_path / "o"))
    assert_user_error(p, "already quantized (int8-dynamic)", "cannot make it fp16", "--precision keep")
    p = run_cli("convert", str(qmodels["dynamic"]), "-t", "intel-igpu", "-o", str(tmp_path / "o2"))
    assert_user_error(p, "intel-igpu does not run int8-dynamic models")
