"""int8 that says why (issue #25 item 5): every onnxruntime int8 conversion records which ops stayed in float, why,
and the quantize/dequantize boundaries, read from onnxruntime's own optimised graph; the build's int8 vs fp32 timing
is recorded and ``edgekit bench`` shows it. Nothing here asserts a timing or an ISA feature."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto as T  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from edge.backends.converter import ConversionRequest  # noqa: E402
from edge.backends.onnxruntime.convert import OnnxToOnnx  # noqa: E402
from edge.cli import app  # noqa: E402
from edge.graph.model import io_spec  # noqa: E402
from edge.graph.quantized import FLOAT_REASONS, int8_placement, optimized_onnx, placement_of, quantizer_op_types  # noqa: E402
from edge.pipeline import convert  # noqa: E402
from edge.pipeline.request import ConvertRequest  # noqa: E402
from edge.spec import Calibration  # noqa: E402


def hard_swish_silu_net() -> onnx.ModelProto:
    """conv -> hard-swish (HardSigmoid * x: no int8 rule in onnxruntime's quantizer) -> conv -> SiLU (Sigmoid * x:
    int8 kernels) -> global pool: the two activation shapes of the corpus conv nets (PP-OCR, YOLO)."""
    rng = np.random.default_rng(0)
    w1 = nh.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w1")
    w2 = nh.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32), "w2")
    nodes = [
        h.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        h.make_node("HardSigmoid", ["c1"], ["hs"], name="hsig", alpha=1 / 6, beta=0.5),
        h.make_node("Mul", ["c1", "hs"], ["a1"], name="hswish"),
        h.make_node("Conv", ["a1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        h.make_node("Sigmoid", ["c2"], ["s2"], name="sig"),
        h.make_node("Mul", ["c2", "s2"], ["a2"], name="silu"),
        h.make_node("GlobalAveragePool", ["a2"], ["y"], name="pool"),
    ]
    g = h.make_graph(
        nodes,
        "hswish_silu",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 16, 16])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 8, 1, 1])],
        [w1, w2],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def conv_transpose_net() -> onnx.ModelProto:
    """conv -> transposed conv (upsampling, as PP-OCR's detector head): the quantizer has a QDQ rule for
    ConvTranspose, onnxruntime's CPU provider no int8 kernel or fusion for it."""
    rng = np.random.default_rng(2)
    w1 = nh.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w1")
    wt = nh.from_array((rng.standard_normal((4, 4, 2, 2)) * 0.3).astype(np.float32), "wt")
    nodes = [
        h.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        h.make_node("ConvTranspose", ["r1", "wt"], ["y"], name="up", strides=[2, 2]),
    ]
    g = h.make_graph(
        nodes,
        "up",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 16, 16])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 32, 32])],
        [w1, wt],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def _int8(tmp_path: Path, model: onnx.ModelProto | None = None, **options: object):  # type: ignore[no-untyped-def]
    model = model or hard_swish_silu_net()
    src = tmp_path / "src.onnx"
    onnx.save(model, str(src))
    samples = tuple({"x": a} for a in np.random.default_rng(1).standard_normal((8, 1, 3, 16, 16)).astype(np.float32))
    out = tmp_path / "out"
    out.mkdir()
    request = ConversionRequest(
        source=src,
        workdir=out,
        precision="int8",
        io=io_spec(model),
        calibration=Calibration("random", "random", len(samples), samples),
        options={"mixed_precision": "off", **options},
    )
    return OnnxToOnnx().convert(request)


def test_int8_conversion_says_which_ops_stay_float_and_why(tmp_path: Path) -> None:
    result = _int8(tmp_path)
    report = result.details["int8_report"]
    placement = report["placement"]
    rows = {(r["op"], r["reason"]): r["count"] for r in placement["float_ops"]}
    # the hard-sigmoid has no quantizer rule: float, between a DequantizeLinear and a QuantizeLinear
    assert rows.get(("HardSigmoid", "quantizer")) == 1, placement
    assert all(r["why"] == FLOAT_REASONS[r["reason"]] for r in placement["float_ops"])
    assert placement["int8_kernels"].get("QLinearConv") == 2, placement  # both convolutions compute in int8
    assert placement["boundaries"] == placement["quantize"] + placement["dequantize"] > 0
    assert placement["float_op_count"] == sum(r["count"] for r in placement["float_ops"])
    kernels = sum(placement["int8_kernels"].values())
    assert f"int8: {kernels} int8 kernels, 1 op stays in float: HardSigmoid 1 (quantizer); " in result.notes[0]
    speed = report["speedup"]  # measured, not judged: figures exist and are positive
    assert speed["fp32_p50_ms"] > 0 and speed["int8_p50_ms"] > 0 and speed["samples"] >= 3
    assert speed["ratio"] == pytest.approx(speed["fp32_p50_ms"] / speed["int8_p50_ms"], rel=0.01)
    assert any(n.startswith("int8 vs fp32 measured at build") for n in result.notes)


def test_an_op_quantized_around_without_an_int8_kernel_is_qdq_placement(tmp_path: Path) -> None:
    placement = _int8(tmp_path, conv_transpose_net(), measure_speedup=False).details["int8_report"]["placement"]
    rows = {(r["op"], r["reason"]): r["count"] for r in placement["float_ops"]}
    assert rows == {("ConvTranspose", "no-kernel"): 1}, placement
    assert placement["int8_kernels"].get("QLinearConv") == 1 and placement["dequantize"] >= 1


def test_the_timing_can_be_left_out(tmp_path: Path) -> None:
    report = _int8(tmp_path, measure_speedup=False).details["int8_report"]
    assert "speedup" not in report and report["placement"]["int8_kernels"]


def test_excluded_nodes_are_named_as_edgekit_s_choice(tmp_path: Path) -> None:
    """A node the mixed-precision search kept float is reported as excluded, not as the runtime's limit."""
    result = _int8(tmp_path, measure_speedup=False)
    graph = optimized_onnx(result.artifact, tmp_path / "opt.onnx").graph
    float_names = [n.name for n in graph.node if n.op_type == "HardSigmoid"]
    placed = int8_placement(graph, kept_float=float_names, quantizable=quantizer_op_types())
    assert ("HardSigmoid", "excluded") in {(f.op, f.reason) for f in placed.float_ops}


def test_bench_shows_the_build_s_int8_speedup(models: dict[str, Path], tmp_path: Path) -> None:
    b = convert(models["tiny"], "x86-cpu", tmp_path / "b", ConvertRequest(precision="int8", calib="random"))
    chain = b.manifest["chain"]
    assert chain[0]["details"]["int8_report"]["placement"]["int8_kernels"]  # in the manifest, as recorded
    got = CliRunner().invoke(app, ["bench", str(b.path), "-n", "5", "--json"])
    assert got.exit_code == 0, got.output
    data = json.loads(got.output)
    assert data["int8_speedup_at_build"] == chain[0]["details"]["int8_report"]["speedup"]
    table = CliRunner().invoke(app, ["bench", str(b.path), "-n", "5"], env={"COLUMNS": "200"})
    assert "int8 vs fp32 measured at build" in table.output


def test_openvino_int8_says_which_layers_stay_float_and_why(tmp_path: Path) -> None:
    """An intel-igpu int8 (NNCF) bundle lists its float layers by IR op type with the reason, read from the CPU
    plugin's compiled graph: the hard-sigmoid has no FakeQuantize-fed int8 kernel there either."""
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    src = tmp_path / "m.onnx"
    onnx.save(hard_swish_silu_net(), str(src))
    request = ConvertRequest(precision="int8", calib="random", preprocess="none", accept_parity_failure=True)
    b = convert(src, "intel-igpu", tmp_path / "b", request)
    step = b.manifest["chain"][0]
    placement = step["details"]["int8_report"]["placement"]
    assert placement["int8_kernels"].get("Convolution", 0) >= 1, placement  # the convolutions run in int8
    floats = {r["op"]: r["reason"] for r in placement["float_ops"]}
    assert floats.get("HardSigmoid") in ("nncf", "cpu-plugin"), placement
    assert all(r["why"] == FLOAT_REASONS[r["reason"]] for r in placement["float_ops"])
    assert placement["quantize"] >= 1 and placement["boundaries"] == placement["quantize"] + placement["dequantize"]
    assert any(n.startswith("int8: ") and "int8 layers" in n for n in step["notes"])


def test_kept_nodes_are_recognised_after_onnxruntime_renames_them(tmp_path: Path) -> None:
    """onnxruntime renames what it rewrites (an NCHWc convolution "<output>_nchwc", a SiLU "<mul>/QuickGeluFusion/"):
    nodes the search kept float still read as excluded, matched by their output tensors."""
    from onnxruntime import quantization as q

    rng = np.random.default_rng(0)
    w1 = nh.from_array((rng.standard_normal((32, 3, 3, 3)) * 0.3).astype(np.float32), "w1")
    w2 = nh.from_array((rng.standard_normal((32, 32, 3, 3)) * 0.1).astype(np.float32), "w2")
    nodes = [
        h.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c1"], ["a1"], name="relu1"),
        h.make_node("Conv", ["a1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        h.make_node("Sigmoid", ["c2"], ["s2"], name="sig2"),
        h.make_node("Mul", ["c2", "s2"], ["y"], name="silu2"),
    ]
    g = h.make_graph(
        nodes,
        "kept",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 32, 32])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 32, 32, 32])],
        [w1, w2],
    )
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8), str(tmp_path / "f.onnx"))
    calib = iter([{"x": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(4)])

    class Reader(q.CalibrationDataReader):
        def get_next(self) -> dict | None:
            return next(calib, None)

    kept = ["conv2", "sig2", "silu2"]
    q.quantize_static(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), Reader(), nodes_to_exclude=kept)
    placement = placement_of(tmp_path / "q.onnx", kept)
    reasons = {(f.op, f.reason) for f in placement.float_ops}
    assert ("Conv", "excluded") in reasons and ("QuickGelu", "excluded") in reasons, placement
    assert not {op for op, why in reasons if why != "excluded"} & {"Conv", "QuickGelu"}, placement
