"""An output whose length depends on the input (issue #34: SLANet-plus, a step-by-step decoder that stops at its end
token: [1, 25, 50] on one parity input, [1, 44, 50] on the next). The bundle's I/O spec recorded the first sample's
shape, so the bundle's own reference check refused sample 1 ("reference pairs unusable"); a dim the reference
samples disagree on is dynamic in the spec now, named as the graph names it, and the check judges each sample at its
own length."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge.pipeline.request import ConvertRequest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


def _positives_model(path: Path, *, last_axis: bool = False) -> Path:
    """x [1, 8] -> y [1, steps, 2]: a row (1, 1), then (v, -v) for each positive value v of x in order (1 to 9 rows,
    by the input; the varying axis is the middle one, as a decoder's steps). ``last_axis``: y [1, steps], 1 then the
    positive values (the varying axis is the last)."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Greater", ["x", "zero"], ["mask2d"]),
        helper.make_node("Squeeze", ["mask2d", "axis0"], ["mask"]),
        helper.make_node("Compress", ["x", "mask"], ["kept"], axis=1),
        helper.make_node("Unsqueeze", ["kept", "axis2"], ["kept3"]),
        helper.make_node("Neg", ["kept3"], ["negated"]),
        helper.make_node("Concat", ["kept3", "negated"], ["rows"], axis=2),
        helper.make_node("Concat", ["first", "rows"], ["y"], axis=1),
    ]
    if last_axis:
        nodes = [*nodes[:3], helper.make_node("Concat", ["one", "kept"], ["y"], axis=1)]
    graph = helper.make_graph(
        nodes,
        "positives",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "steps"] if last_axis else [1, "steps", 2])],
        [
            helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
            helper.make_tensor("axis0", TensorProto.INT64, [1], [0]),
            helper.make_tensor("axis2", TensorProto.INT64, [1], [2]),
            helper.make_tensor("first", TensorProto.FLOAT, [1, 1, 2], [1.0, 1.0]),
            helper.make_tensor("one", TensorProto.FLOAT, [1, 1], [1.0]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


def test_an_output_whose_length_depends_on_the_input_passes_its_own_reference_check(tmp_path: Path) -> None:
    from edge.pipeline import convert
    from edge.verify.refpairs import load_reference_pairs, open_checked

    b = convert(_positives_model(tmp_path / "positives.onnx"), "x86-cpu", tmp_path / "b", ConvertRequest())
    assert b.manifest["parity"]["passed"] is True
    pairs = load_reference_pairs(b.path, b.info.reference_pairs, b.io)
    lengths = {np.shape(o["y"])[1] for o in pairs.outputs}
    assert len(lengths) > 1, lengths  # the pairs do hold several lengths
    assert [t.shape for t in b.io.outputs] == [(1, "steps", 2)]  # the graph's own name for the dim
    with open_checked(b, None, mode=True) as runner:
        check = runner.info.details["reference_check"]
    assert check["passed"] is True, check.get("error") or check.get("failures")
    assert check["samples"] == len(pairs.outputs)


def test_an_output_whose_last_axis_depends_on_the_input_is_judged_not_a_traceback(tmp_path: Path) -> None:
    """y [1, steps]: parity's per-column ranges (task detection) took every sample's last axis as the same columns
    and numpy raised ValueError ("operands could not be broadcast together") out of convert; there are no columns
    to compare across samples then, and the output gets raw figures, sample by sample."""
    from edge.pipeline import convert
    from edge.verify.refpairs import check_bundle

    model = _positives_model(tmp_path / "positives.onnx", last_axis=True)
    b = convert(model, "x86-cpu", tmp_path / "b", ConvertRequest())
    assert b.manifest["parity"]["passed"] is True
    assert [t.shape for t in b.io.outputs] == [(1, "steps")]
    check = check_bundle(b, None, mode=True)
    assert check["passed"] is True, check.get("error") or check.get("failures")
