"""A parity that cannot fail is a defect (issue #23): an output whose reference is constant across every parity
sample is marked "not discriminating", and a bundle none of whose outputs discriminates is unverified, not passed.

Real conversions (onnxruntime) of constructed models: a keyword-spotter-like probability that saturates to 0 on
every input (what microWakeWord's okay-nabu gave on standard-normal int8 inputs), beside a control output."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge.bundle.schema import parse_manifest
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest
from edge.spec import IOSpec
from edge.verify.gates import check_gates, parity_verdict
from edge.verify.inputs import describe_generated, generated_samples
from edge.verify.parity import NOT_DISCRIMINATING


def _model(path: Path, *, with_live_output: bool) -> Path:
    """x [1, 40] -> prob = Sigmoid(x @ w - 200): ~0 (exactly 0 in fp32) on any plausible input; with
    ``with_live_output`` also score = x @ w, which follows the input."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((0.1 * rng.standard_normal((40, 4))).astype(np.float32), "w")
    bias = numpy_helper.from_array(np.full((4,), -200.0, np.float32), "bias")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["score"]),
        helper.make_node("Add", ["score", "bias"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["prob"]),
    ]
    outputs = [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 4])]
    if with_live_output:
        outputs.append(helper.make_tensor_value_info("score", TensorProto.FLOAT, [1, 4]))
    graph = helper.make_graph(
        nodes, "kws", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 40])], outputs, [w, bias]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_a_constant_reference_makes_the_bundle_unverified_not_passed(tmp_path: Path) -> None:
    src = _model(tmp_path / "kws.onnx", with_live_output=False)
    b = convert(src, "x86-cpu", tmp_path / "b", ConvertRequest(task="none"))
    par = b.manifest["parity"]
    [o] = par["outputs"]
    n = par["samples"]
    assert o["degenerate"] and o["degenerate_note"].startswith(
        f"{NOT_DISCRIMINATING}the reference output is constant across {n} samples"
    ), o
    assert par["unverified"].startswith("unverified: no output discriminates"), par
    m = parse_manifest(b.manifest, "test")
    v = parity_verdict(m)
    assert v.state == "unverified" and v.skipped == par["unverified"], v
    check_gates(m)  # ships, as a bundle whose parity was skipped does: unverified, with the reason
    from edge.verify.refpairs import open_checked

    with open_checked(b, None, mode=True) as runner:  # the device's check on first load
        check = runner.info.details["reference_check"]
    assert check["passed"] is True and check["unverified"].startswith("unverified: no output discriminates"), check
    # the verdict is recomputed from the recorded ranges: dropping the record's word does not make it a pass
    edited = copy.deepcopy(b.manifest)
    del edited["parity"]["unverified"]
    assert parity_verdict(parse_manifest(edited, "test")).state == "unverified"


def test_one_discriminating_output_keeps_the_verdict_but_the_constant_one_is_marked(tmp_path: Path) -> None:
    src = _model(tmp_path / "kws2.onnx", with_live_output=True)
    b = convert(src, "x86-cpu", tmp_path / "b", ConvertRequest(task="none"))
    par = b.manifest["parity"]
    figs = {o["name"]: o for o in par["outputs"]}
    assert figs["prob"]["degenerate"] and figs["prob"]["degenerate_note"].startswith(NOT_DISCRIMINATING)
    assert not figs["score"]["degenerate"] and figs["score"]["degenerate_note"] is None
    assert par["passed"] is True and "unverified" not in par
    assert parity_verdict(parse_manifest(b.manifest, "test")).state == "pass"


def test_a_degenerate_reference_that_the_candidate_misses_still_fails() -> None:
    # unverified is only for a record with no failure: a candidate far from a constant reference fails as before
    from edge.verify.parity import THRESHOLDS, ParityReport, compare

    ref = [{"p": np.zeros((1, 4), np.float32)} for _ in range(8)]
    cand = [{"p": np.full((1, 4), 0.5, np.float32)} for _ in range(8)]
    outs = compare(ref, cand, THRESHOLDS["fp32"], task="none")
    r = ParityReport("fp32", THRESHOLDS["fp32"], 8, "generated", "ref", {}, outs)
    assert not r.passed and r.unverified is None
    ok = ParityReport("fp32", THRESHOLDS["fp32"], 8, "generated", "ref", {}, compare(ref, ref, THRESHOLDS["fp32"]))
    assert ok.passed and ok.unverified is not None and "across 8 samples" in ok.unverified
    assert dataclasses.replace(ok, outputs=[]).unverified is None


@pytest.mark.parametrize("span", [0.0, 1e-7])
def test_constant_means_constant_across_the_samples(span: float) -> None:
    from edge.verify.parity import degenerate_reason

    assert "constant across 32 samples" in (degenerate_reason(0.25, 0.25 + span, 32) or "")
    assert degenerate_reason(0.25, 0.5, 32) is None


def test_a_quantized_tflite_input_is_fed_its_whole_range() -> None:
    """microWakeWord okay-nabu's input is int8 with scale 0.102 and zero point -128 (floats 0..26): standard-normal
    floats cast into it sat on its lowest levels (the runner quantizes x / scale - 128). Its input now gets every
    level, as floats the runner quantizes back exactly; the keyword spotter still says 0 on them (no keyword in
    noise), which the corpus test's UNVERIFIED records and parity marks unverified."""
    from edge.backends.litert.run import LiteRTRunner
    from tests.support.corpus import corpus_model

    with LiteRTRunner(corpus_model("micro-wakeword-okay-nabu"), options={"delegate": "reference"}) as r:
        io = IOSpec(tuple(r.inputs), tuple(r.outputs))
    [t] = io.inputs
    assert t.dtype == "float32" and t.quant is not None and t.quant[1:] == (-128, -128, 127), t
    assert describe_generated(io, None)[t.name].startswith("uniform over the quantized input's levels -128..127")
    x = np.stack([s[t.name] for s in generated_samples(io, None, 32)])
    scale, zp = t.quant[0], t.quant[1]
    levels = np.rint(x / scale) + zp
    assert np.allclose(x, scale * (levels - zp), rtol=0, atol=1e-5 * scale)  # exact levels: quantized back as given
    assert levels.min() == -128 and levels.max() == 127 and len(np.unique(levels)) > 200  # spread, not one corner


def test_explain_says_the_quantized_input_gets_every_level() -> None:
    from edge.pipeline.explain import explain
    from edge.pipeline.request import ConvertRequest
    from tests.support.corpus import corpus_model

    [i] = explain(corpus_model("micro-wakeword-okay-nabu"), ConvertRequest())["inputs"]
    assert i["generator"].startswith("uniform over the quantized input's levels -128..127"), i
    assert "quantizes it (scale 0.102, zero point -128)" in i["evidence"], i
