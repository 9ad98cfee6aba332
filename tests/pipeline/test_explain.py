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
