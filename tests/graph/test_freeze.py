"""--freeze-input (edge.graph.freeze) and the LSTM lowering for onnx2tf (edge.graph.lower), on graphs built here and on
Silero VAD from the corpus: what is inlined, what stays, what is refused, and that nothing computes differently."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from edge.errors import EdgeError, InputFileError
from edge.graph.freeze import freeze_inputs, parse_freeze
from edge.graph.lower import lower_lstm, needs_lowering
from edge.graph.model import io_spec, load_onnx, resolve_static_inputs
from edge.pipeline.request import ConvertRequest
from tests.graph.test_graphs import SHAPES, build_lstm_state, build_vad_like
from tests.support.corpus import corpus_model


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _data_if(path: Path) -> Path:
    """y = If(sum(x) > 0) then x*2 else x*3, and z = If(mode == 1) then x+1 else x-1: one If reads data, one a setting."""
    c = lambda name, v: h.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.array(v)))  # noqa: E731
    branch = lambda tag, op, k: h.make_graph(  # noqa: E731
        [c(f"{tag}_k", np.float32(k)), h.make_node(op, ["x", f"{tag}_k"], [f"{tag}_o"])],
        tag,
        [],
        [h.make_tensor_value_info(f"{tag}_o", T.FLOAT, None)],
    )
    g = h.make_graph(
        [
            h.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
            c("zero", np.float32(0)),
            h.make_node("Greater", ["s", "zero"], ["pos"]),
            h.make_node(
                "If",
                ["pos"],
                ["y"],
                then_branch=branch("t2", "Mul", 2),
                else_branch=branch("t3", "Mul", 3),
                name="If_data",
            ),
            c("one", np.int64(1)),
            h.make_node("Equal", ["mode", "one"], ["is1"]),
            h.make_node(
                "If",
                ["is1"],
                ["z"],
                then_branch=branch("p1", "Add", 1),
                else_branch=branch("m1", "Sub", 1),
                name="If_mode",
            ),
        ],
        "ifs",
        [h.make_tensor_value_info("x", T.FLOAT, ["n", 4]), h.make_tensor_value_info("mode", T.INT64, [])],
        [h.make_tensor_value_info("y", T.FLOAT, ["n", 4]), h.make_tensor_value_info("z", T.FLOAT, ["n", 4])],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def test_a_setting_is_inlined_and_an_if_on_data_stays(tmp_path: Path) -> None:
    path = _data_if(tmp_path / "ifs.onnx")
    model = load_onnx(path)
    io = resolve_static_inputs(io_spec(model), {"x": (2, 4)}, path)
    frozen, rest, rec = freeze_inputs(model, {"mode": "0"}, io, source=path)
    assert [t.name for t in rest.inputs] == ["x"]
    assert rec.inlined_if == 1 and rec.kept_if == ["If_data"], rec
    assert [n.name for n in frozen.graph.node if n.op_type == "If"] == ["If_data"]
    assert rec.to_json()["inputs"] == [{"name": "mode", "dtype": "int64", "shape": [], "value": [0.0]}]
    x = np.array([[1, -2, 3, 4], [-1, -1, -1, -1]], np.float32)
    got = _run(frozen, {"x": x})
    np.testing.assert_array_equal(got[1], x - 1)  # mode 0: the else branch
    np.testing.assert_array_equal(got[0], _run(model, {"x": x, "mode": np.array(0, np.int64)})[0])
    np.testing.assert_array_equal(_run(frozen, {"x": -x})[0], -x * 3)  # the data If still decides at run time


def test_bad_freeze_values_are_one_line_errors(tmp_path: Path) -> None:
    path = _data_if(tmp_path / "ifs.onnx")
    model = load_onnx(path)
    io = resolve_static_inputs(io_spec(model), {"x": (2, 4)}, path)
    for values, match in (
        ({"rate": "1"}, r"ifs\.onnx has no such input"),
        ({"mode": "1.5"}, "not fractions"),
        ({"mode": "1,2"}, "is a scalar: give one number"),
        ({"mode": "abc"}, "is not a number"),
        ({"mode": "1", "x": "1"}, "only scalars and 1-D|freezes every input"),
    ):
        with pytest.raises(EdgeError, match=match):
            freeze_inputs(model, values, io, source=path)
    with pytest.raises(InputFileError, match="expected NAME=VALUE"):
        parse_freeze(["mode"])
    with pytest.raises(InputFileError, match="names 'mode' twice"):
        parse_freeze(["mode=1", "mode=2"])


def test_the_vad_like_graph_loses_every_if_at_16k(tmp_path: Path) -> None:
    """Both Ifs (sr's, then the frame-count one whose condition is a shape) are decided with sr and the shapes."""
    path = build_vad_like(tmp_path / "vad_like.onnx")
    model = load_onnx(path)
    io = resolve_static_inputs(io_spec(model), SHAPES["vad_like"], path)
    frozen, rest, rec = freeze_inputs(model, {"sr": "16000"}, io, source=path)
    assert rec.inlined_if == 2 and not rec.kept_if and rec.check["max_error_over_range"] <= 1e-6
    assert not [n for n in frozen.graph.node if n.op_type == "If"]
    assert [t.name for t in rest.inputs] == ["input", "state"]


@pytest.mark.parametrize("name", ["lstm_state", "vad_like"])
def test_lowered_lstm_computes_what_onnxruntime_does(name: str, tmp_path: Path) -> None:
    path = (build_lstm_state if name == "lstm_state" else build_vad_like)(tmp_path / f"{name}.onnx")
    model = load_onnx(path)
    io = resolve_static_inputs(io_spec(model), SHAPES[name], path)
    if name == "vad_like":
        model, io, _ = freeze_inputs(model, {"sr": "16000"}, io, source=path)
    else:
        from edge.graph.model import make_static

        model = make_static(model, io)
    assert any(needs_lowering(n) for n in model.graph.node)
    lowered, count = lower_lstm(onnx.ModelProto.FromString(model.SerializeToString()))
    assert count == 1 and not [n for n in lowered.graph.node if n.op_type == "LSTM"]
    rng = np.random.default_rng(3)
    for _ in range(3):
        feeds = {t.name: rng.standard_normal([int(d) for d in t.shape]).astype(np.float32) for t in io.inputs}
        for a, b in zip(_run(model, feeds), _run(lowered, feeds)):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_silero_freezes_and_converts_for_openvino(tmp_path: Path) -> None:
    """The real model: 7 top-level Ifs inlined at sr=16000, exact on onnxruntime; OpenVINO then takes it with parity
    on speech-like audio, and the manifest says what was frozen."""
    from edge.pipeline import convert

    path = corpus_model("silero-vad")
    convert(
        path,
        "intel-igpu",
        tmp_path / "b",
        ConvertRequest(
            precision="fp32", input_shapes={"input": (1, 512), "state": (2, 1, 128)}, freeze={"sr": "16000"}
        ),
    )
    m = json.loads((tmp_path / "b" / "manifest.json").read_text())
    fz = m["source"]["frozen"]
    assert fz["inputs"] == [{"name": "sr", "dtype": "int64", "shape": [], "value": [16000.0]}]
    assert fz["inlined_if"] == 7 and fz["check"]["max_error_over_range"] == 0.0
    assert [t["name"] for t in m["io"]["inputs"]] == ["input", "state"]
    assert [t["name"] for t in m["io"]["outputs"]] == ["output", "stateN"]
    assert m["parity"]["passed"] and m["parity"]["input_provenance"]["generated"]["input"].startswith("speech-like")


def test_freeze_input_on_a_non_onnx_source_is_refused(tmp_path: Path) -> None:
    from edge.pipeline import convert

    path = corpus_model("face-detection")
    with pytest.raises(InputFileError, match="--freeze-input fixes inputs of an ONNX graph"):
        convert(path, "arm-xnnpack", tmp_path / "b", ConvertRequest(freeze={"x": "1"}))


def test_an_lstm_given_its_state_converts_for_litert(tmp_path: Path) -> None:
    """onnx2tf 1.29.24 fails on this LSTM (state given, no bias); unrolled first (edge.graph.lower), it converts with fp32
    parity, and the manifest says it was lowered."""
    from edge import toolchains
    from edge.pipeline import convert

    if not toolchains.status("tflite").usable:
        pytest.skip("the tflite toolchain is not installed: edgekit toolchain install tflite")
    path = build_lstm_state(tmp_path / "lstm_state.onnx")
    convert(
        path,
        "arm-xnnpack",
        tmp_path / "b",
        ConvertRequest(precision="fp32", input_shapes=SHAPES["lstm_state"], preprocess="none"),
    )
    m = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert m["parity"]["passed"] and m["chain"][0]["details"]["lowered"]["LSTM"] == 1


def test_tune_trials_convert_the_frozen_graph(tmp_path: Path) -> None:
    """edgekit tune --freeze-input: every trial converts the graph with sr fixed (OpenVINO cannot take its Ifs
    otherwise); a value the graph cannot run with at these shapes is one line, not a traceback."""
    from edge.tune.search import Schedule, TuneOptions, tune

    path = build_vad_like(tmp_path / "vad_like.onnx")
    req = ConvertRequest(input_shapes=SHAPES["vad_like"], preprocess="none", parity_samples=4)
    opts = TuneOptions(
        runners=["openvino"],
        precisions=["fp32"],
        threads=[1],
        pictures=False,
        schedule=Schedule(reps=2, iters=5, warmup=1),
    )
    res = tune(path, "intel-igpu", req.replace(freeze={"sr": "16000"}), dataclasses.replace(opts, out=tmp_path / "t"))
    assert res.winner is not None, res.summary()
    # sr = 8000 picks the 256-sample branch: two frames of the 512-sample window, which its LSTM cannot take. Each
    # trial says so in one line, and none reuses the sr=16000 conversions (the frozen values are in the recipe)
    bad = tune(
        path,
        "intel-igpu",
        req.replace(freeze={"sr": "8000"}),
        dataclasses.replace(opts, out=tmp_path / "t2", cache=tmp_path / "t" / "cache"),
    )
    assert bad.winner is None and bad.trials
    for t in bad.trials:
        assert t["status"].startswith(
            "conversion failed: vad_like.onnx does not run with sr=8000 at these input shapes: "
        ), t["status"]
        assert "\n" not in t["status"] and "LSTM" in t["status"]
    assert not {t["recipe_key"] for t in bad.trials} & {t["recipe_key"] for t in res.trials}
