"""Where did it diverge (issue #23, class 4): on a parity failure of an ONNX -> ONNX conversion, the first node
whose output differs is named in the message and the manifest."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from edge.backends.converter import CONVERTERS, ConversionRequest, ConversionResult, Converter
from edge.errors import ParityError
from edge.graph.divergence import first_divergence
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest
from tests.support.next_models import anchor_detector
from tests.test_targets import VALID

BROKEN = "s2_w"  # the second convolution's weights: the first divergence is there, not at the outputs


def _break(src: Path, dst: Path) -> Path:
    m = onnx.load(str(src))
    w = next(t for t in m.graph.initializer if t.name == BROKEN)
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * 1.5, w.name))
    onnx.save(m, str(dst))
    return dst


class ScalingConverter(Converter):
    """Converts by changing one convolution's weights: a conversion bug with a known place."""

    name = "onnx->onnx-scaling"
    source_format = "onnx"
    target_format = "onnx"
    precisions = frozenset({"fp32"})

    def convert(self, request: ConversionRequest) -> ConversionResult:
        out = _break(request.source, request.workdir / "model.onnx")
        return ConversionResult(out, "onnx", [out], {})


def test_the_first_diverging_node_is_named(tmp_path: Path) -> None:
    src = anchor_detector(tmp_path / "palm.onnx")
    bad = _break(src, tmp_path / "bad.onnx")
    rng = np.random.default_rng(0)
    samples = [{"image": rng.random((1, 3, 192, 192), dtype=np.float32)} for _ in range(2)]
    found = first_divergence(src, bad, samples)
    assert found is not None and found.op == "Conv" and found.tensor == "s2_c", found
    assert first_divergence(src, src, samples) is None


@pytest.fixture
def scaling_target(tmp_path: Path):
    CONVERTERS.register(ScalingConverter)
    d = tmp_path / "targets"
    d.mkdir()
    (d / "scaling.toml").write_text(VALID.format(name="scaling").replace('"onnx->onnx"', '"onnx->onnx-scaling"'))
    yield d
    CONVERTERS.unregister(ScalingConverter.name)


def test_a_parity_failure_says_where_and_records_it(tmp_path: Path, scaling_target: Path) -> None:
    """Before: the failure gave the output figures only."""
    src = anchor_detector(tmp_path / "palm.onnx")
    with pytest.raises(ParityError, match=r"first diverging node: .* \(Conv\), output 's2_c'"):
        convert(src, "scaling", tmp_path / "out", ConvertRequest(targets_dir=[scaling_target]))
    b = convert(
        src, "scaling", tmp_path / "kept", ConvertRequest(targets_dir=[scaling_target], accept_parity_failure=True)
    )
    d = b.manifest["parity"]["first_divergence"]
    assert d["tensor"] == "s2_c" and d["op"] == "Conv" and d["rel_err"] > 0.02


def test_an_openvino_ir_is_compared_by_its_onnx_names(tmp_path: Path) -> None:
    ov = pytest.importorskip("openvino")
    src = anchor_detector(tmp_path / "palm.onnx")
    bad = _break(src, tmp_path / "bad.onnx")
    ov.save_model(ov.convert_model(str(bad)), str(tmp_path / "bad.xml"), compress_to_fp16=False)
    ov.save_model(ov.convert_model(str(src)), str(tmp_path / "good.xml"), compress_to_fp16=False)
    rng = np.random.default_rng(0)
    samples = [{"image": rng.random((1, 3, 192, 192), dtype=np.float32)}]
    found = first_divergence(src, tmp_path / "bad.xml", samples)
    assert found is not None and found.tensor == "s2_c", found
    assert first_divergence(src, tmp_path / "good.xml", samples) is None
