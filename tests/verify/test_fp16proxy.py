"""The fp16 proxy (issue #32): parity with every intermediate tensor rounded to fp16, for devices that compute
in fp16 (jetson-orin, apple-ane). A LayerNorm whose variance overflows fp16 passes the f32 parity and must fail
the proxy, naming the node whose output overflowed."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge.bundle.schema import parse_manifest
from edge.errors import ParityError
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest
from edge.verify.fp16proxy import LABEL, fp16_rounded_model, run_fp16_proxy
from edge.verify.gates import parity_verdict
from edge.verify.parity import reference_outputs


def _layernorm(path: Path) -> Path:
    """A decomposed LayerNorm over 64 channels: x - mean, squared, mean, + eps, sqrt, divide."""
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1], name="mean"),
        helper.make_node("Sub", ["x", "mean"], ["centred"], name="centred"),
        helper.make_node("Mul", ["centred", "centred"], ["sq"], name="squared"),
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1], name="variance"),
        helper.make_node("Add", ["var", "eps"], ["vareps"], name="var_eps"),
        helper.make_node("Sqrt", ["vareps"], ["std"], name="std"),
        helper.make_node("Div", ["centred", "std"], ["y"], name="normalised"),
    ]
    g = helper.make_graph(
        nodes,
        "ln",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 64])],
        [numpy_helper.from_array(np.array(1e-5, np.float32), "eps")],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def _samples(scale: float, n: int = 4) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"x": (rng.standard_normal((1, 16, 64)) * scale).astype(np.float32)} for _ in range(n)]


def test_every_float_tensor_is_rounded_and_exposed(tmp_path: Path) -> None:
    m, rounded, in_subgraphs = fp16_rounded_model(onnx.load(_layernorm(tmp_path / "ln.onnx")))
    assert [r.node for r in rounded] == ["mean", "centred", "squared", "variance", "var_eps", "std", "normalised"]
    assert in_subgraphs == 0
    onnx.checker.check_model(m)
    assert [o.name for o in m.graph.output][0] == "y"  # the model's own output keeps its name


def test_layernorm_variance_overflow_fails_naming_the_squared_node(tmp_path: Path) -> None:
    src = _layernorm(tmp_path / "ln.onnx")
    s = _samples(300.0)  # (x - mean)^2 reaches ~1e6 > 65504
    ref = reference_outputs(src, s)
    assert np.isfinite(ref[0]["y"]).all()  # f32 is fine
    r = run_fp16_proxy(src, s, ref)
    assert not r.passed
    assert r.overflowed[0].node == "squared"
    assert any("'squared'" in f for f in r.failures)
    ok = run_fp16_proxy(src, _samples(1.0), reference_outputs(src, _samples(1.0)))
    assert ok.passed and not ok.overflowed
    assert ok.outputs[0].cosine > 0.9999


def _npz_dir(d: Path, samples: list[dict[str, np.ndarray]]) -> Path:
    d.mkdir()
    for i, s in enumerate(samples):
        np.savez(d / f"{i}.npz", **s)
    return d


def test_jetson_orin_fp16_bundle_records_the_proxy_and_refuses_the_overflow(tmp_path: Path) -> None:
    src = _layernorm(tmp_path / "ln.onnx")
    b = convert(
        src, "jetson-orin", tmp_path / "ok", ConvertRequest(parity_data=_npz_dir(tmp_path / "d1", _samples(1.0)))
    )
    fp = b.info.parity.fp16_proxy
    assert fp is not None and fp.label == LABEL and fp.passed
    assert "accumulation precision" in fp.not_modelled
    assert parity_verdict(b.info).state == "pass"
    # the gate recomputes the proxy's verdict from its figures: an edited record that claims a pass fails
    raw = copy.deepcopy(b.manifest)
    raw["parity"]["fp16_proxy"]["outputs"][0]["cosine"] = 0.5
    edited = parity_verdict(parse_manifest(raw, "edited"))
    assert edited.state == "fail" and edited.edited and "fp16 proxy: y" in edited.failures[0]
    with pytest.raises(ParityError, match=r"fp16 proxy.*'squared' \(Mul\)"):
        convert(
            src, "jetson-orin", tmp_path / "bad", ConvertRequest(parity_data=_npz_dir(tmp_path / "d2", _samples(300.0)))
        )
    assert not (tmp_path / "bad").exists()


def test_fp32_bundle_has_no_proxy(tmp_path: Path) -> None:
    src = _layernorm(tmp_path / "ln.onnx")
    b = convert(src, "jetson-orin", tmp_path / "b", ConvertRequest(precision="fp32"))
    assert b.info.parity.fp16_proxy is None
