"""``edgekit convert --explain`` (issue #23): each conclusion about a model with its evidence, nothing converted."""

from __future__ import annotations

import json
from pathlib import Path

from edge.pipeline.explain import explain
from edge.pipeline.request import ConvertRequest
from tests.support.cli import run_cli
from tests.support.next_models import anchor_detector, one_channel_net, quantized, regressor


def test_inputs_and_outputs_with_their_evidence(tmp_path: Path) -> None:
    kws = explain(one_channel_net(tmp_path / "kws.onnx", (1, 49, 40, 1), name="mel_input"))
    [i] = kws["inputs"]
    assert i["preprocess"] is None and i["layout"] == "NHWC" and i["generator"].startswith("log-mel spectrogram")
    assert "no pre-processing is guessed" in i["evidence"] and "audio features" in i["evidence"]
    [o] = kws["outputs"]
    assert o["task"] == "classifier" and "named 'logits'" in o["evidence"]  # its name declares class scores
    palm = explain(anchor_detector(tmp_path / "palm.onnx"))
    assert palm["inputs"][0]["preprocess"] == "imagenet" and "auto: a 3-channel" in palm["inputs"][0]["evidence"]
    assert all(o["task"] is None and "SSD-style" in o["evidence"] for o in palm["outputs"])
    cls = explain(regressor(tmp_path / "cls.onnx", 3, output="out", softmax=True))
    assert cls["outputs"][0]["task"] == "classifier" and "probabilitie" in cls["outputs"][0]["evidence"]
    told = explain(regressor(tmp_path / "lm.onnx"), ConvertRequest(task="classifier"))
    assert told["outputs"][0]["task"] == "classifier" and "declared" in told["outputs"][0]["evidence"]


def test_the_cli_explains_and_converts_nothing(tmp_path: Path) -> None:
    q = quantized(tmp_path / "q.onnx", "QDQ", tmp_path)
    p = run_cli("convert", str(q), "-t", "x86-cpu", "-o", str(tmp_path / "out"), "--explain", "--json")
    assert p.returncode == 0, p.stderr
    found = json.loads(p.stdout)
    assert found["quantized"].startswith("QDQ") and found["outputs"][0]["name"] == "logits"
    assert not (tmp_path / "out").exists()
    p = run_cli("convert", str(q), "-t", "x86-cpu", "--explain")
    assert p.returncode == 0 and "already quantized" in p.stdout and "in image" in p.stdout


def _clamped(path: Path, floor: float) -> Path:
    """y = max(x, floor) on a float [1] feature: constant wherever every input stays under ``floor``."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Max", ["x", "floor"], ["y"])],
        "clamped",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [helper.make_tensor("floor", TensorProto.FLOAT, [1], [floor])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_an_output_constant_on_the_probe_but_not_on_paritys_inputs_is_not_called_constant(tmp_path: Path) -> None:
    """Before: --explain said 'cannot discriminate: the reference output is constant across 2 samples: judged on
    absolute error instead' for ViSQOL's lattice MOS, whose reference spans 1.0..2.97 over parity's 32 samples (and
    parity judged it by cosine and SNR). Two probe samples do not decide it; parity's own inputs do."""
    from edge.spec import IOSpec, TensorSpec
    from edge.verify.inputs import choose_parity_inputs, generated_samples

    io = IOSpec((TensorSpec("x", (1,), "float32"),), (TensorSpec("y", (1,), "float32"),))
    probe = max(float(s["x"][0]) for s in generated_samples(io, None, 2))
    parity = [float(s["x"][0]) for s in choose_parity_inputs(io, None, count=32).samples]
    assert max(parity) > probe + 0.01  # the model below is constant on the probe, not on parity's inputs
    model = _clamped(tmp_path / "clamped.onnx", probe + 0.01)
    [o] = explain(model)["outputs"]
    assert "cannot discriminate" not in o["metric"] and o["range"][1] > o["range"][0], o
    # constant on parity's inputs too: said so, with parity's count
    [o] = explain(_clamped(tmp_path / "flat.onnx", max(parity) + 1.0))["outputs"]
    assert "cannot discriminate" in o["metric"] and "32 samples" in o["metric"], o
    p = run_cli("convert", str(model), "-t", "x86-cpu", "--explain")  # an input without a layout: no stray space
    assert p.returncode == 0 and "float32[1]; pre-processing none" in p.stdout and " ;" not in p.stdout, p.stdout
