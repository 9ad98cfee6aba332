"""OpenVINO's hidden defaults (issue #23, class 7): fp32 means fp32, and every precision-affecting property the
CPU plugin applies is read back into the runner's report."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge.backends.openvino.run import PRECISION_PROPERTIES
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest
from tests.support.next_models import int8_weight_encoder

pytest.importorskip("openvino")


def test_an_fp32_bundle_of_an_int8_weight_encoder_computes_in_fp32(tmp_path: Path) -> None:
    """Before: the CPU plugin quantized the MatMul activations in groups of 32 while reporting f32, and the fp32
    bundle was refused ('mean cosine 0.9961 < 0.99999'); with DYNAMIC_QUANTIZATION_GROUP_SIZE 0 it is exact."""
    b = convert(
        int8_weight_encoder(tmp_path / "enc.onnx"), "intel-igpu", tmp_path / "out", ConvertRequest(precision="fp32")
    )
    par = b.manifest["parity"]
    assert b.precision == "fp32" and par["passed"] is True
    [o] = par["outputs"]
    assert o["cosine"] > 0.99999
    props = par["candidate"]["details"]["precision_properties"]
    assert props["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == "0" and props["INFERENCE_PRECISION_HINT"] == "f32"
    assert set(props) <= set(PRECISION_PROPERTIES) and "KV_CACHE_PRECISION" in props  # reported, whatever it is
    assert b.manifest["source"]["quantized"].startswith("weight-only")


def test_a_tuned_group_size_is_applied_and_reported(tmp_path: Path) -> None:
    b = convert(int8_weight_encoder(tmp_path / "enc.onnx", layers=1), "intel-igpu", tmp_path / "out")
    with b.open_runner({"dynamic_quantization_group_size": 32}) as r:
        assert r.info.details["precision_properties"]["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == "32"
