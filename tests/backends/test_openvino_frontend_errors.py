"""OpenVINO's ONNX frontend failures reach the user as one line: the op, the node, what takes it instead —
not the frontend's source lines (``unconverted_ops_report.cpp:151``, ``loop.cpp:263``) nor edgekit's temp path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("openvino")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from edge.backends.openvino.frontend_errors import frontend_error, parse_frontend_failure  # noqa: E402
from edge.errors import ConversionError  # noqa: E402
from edge.pipeline import convert  # noqa: E402
from edge.pipeline.request import ConvertRequest  # noqa: E402


def _save(path: Path, graph: object) -> Path:
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def test_an_op_without_a_conversion_rule_is_one_line(tmp_path: Path) -> None:
    f = TensorProto.FLOAT
    det = _save(
        tmp_path / "det.onnx",
        helper.make_graph(
            [helper.make_node("Det", ["x"], ["y"], name="det_0")],
            "g",
            [helper.make_tensor_value_info("x", f, [2, 3, 3])],
            [helper.make_tensor_value_info("y", f, [2])],
        ),
    )
    with pytest.raises(ConversionError) as e:
        convert(det, "intel-igpu", tmp_path / "b", ConvertRequest(preprocess="none"))
    text = str(e.value)
    assert "\n" not in text and ".cpp" not in text and "/tmp/" not in text and "source.static" not in text, text
    assert "cannot convert node 'det_0' (Det: its ONNX frontend has no conversion rule for it)" in text, text
    assert "ONNX Runtime implements Det: try --target x86-cpu" in (e.value.hint or "")


def test_a_loop_the_frontend_refuses_names_the_node_and_why(tmp_path: Path) -> None:
    """A Loop with a trip count and no condition input: OpenVINO's Loop translation stops on a check in
    loop.cpp (the real failure, read from ov.convert_model), and edgekit says which node and why."""
    import openvino as ov

    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, [])],
    )
    loop = _save(
        tmp_path / "loop.onnx",
        helper.make_graph(
            [helper.make_node("Loop", ["M"], ["y"], name="decoder/while_loop", body=body)],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
            [numpy_helper.from_array(np.array(3, np.int64), "M")],
        ),
    )
    with pytest.raises(Exception) as raw:
        ov.convert_model(str(loop))
    assert "loop.cpp" in str(raw.value)  # what reached the user before
    (failed,) = parse_frontend_failure(str(raw.value))
    assert (failed.op, failed.output) == ("Loop", "y")
    err = frontend_error(str(raw.value), loop, "2026.4.1")
    assert err.message == (
        "OpenVINO 2026.4.1 cannot convert node 'decoder/while_loop' (Loop: Expecting at least two canonical "
        "inputs for Loop op: trip count and termination condition)"
    )
    assert (err.hint or "").startswith("ONNX Runtime implements Loop: try --target x86-cpu")


def test_other_failures_keep_openvino_words_without_its_source_lines(tmp_path: Path) -> None:
    err = frontend_error(
        "Check 'false' failed at src/frontends/onnx/frontend/src/frontend.cpp:12:\nFrontEnd API failed with "
        "GeneralFailure:\nthe model file is damaged\n",
        tmp_path / "missing.onnx",
        "2026.4.1",
    )
    assert err.message == f"OpenVINO 2026.4.1 could not convert {tmp_path / 'missing.onnx'}: the model file is damaged"
