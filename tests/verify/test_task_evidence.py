"""A task gate applies only where the task is declared or unambiguous (issue #23, class 2): models whose
output shapes alone look like another task's, converted with default arguments."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest
from edge.verify.parity import THRESHOLDS, compare, guess_task
from tests.support.cli import run_cli
from tests.support.next_models import anchor_detector, regressor, text_encoder
from tests.test_targets import VALID


def _outputs(b: object) -> dict[str, dict[str, object]]:
    return {o["name"]: o for o in b.manifest["parity"]["outputs"]}  # type: ignore[attr-defined]


def test_an_anchor_detector_with_a_yolo_row_count_is_not_a_yolo_head(tmp_path: Path) -> None:
    """2016 anchors = 21 * 96 rows: before, [1, 2016, 18] was decoded as a YOLO head and the x86-cpu bundle failed
    'detection precision 11.0% < 95%' against an fp32 copy of itself."""
    b = convert(anchor_detector(tmp_path / "palm.onnx"), "x86-cpu", tmp_path / "out")
    outs = _outputs(b)
    assert b.manifest["parity"]["passed"] is True
    for name in ("regressors", "classificators"):
        assert outs[name]["task"] is None and outs[name]["top1"] is None
        assert "SSD-style anchor head" in str(outs[name]["task_note"])


def test_regression_and_hidden_states_get_no_task_gate(tmp_path: Path) -> None:
    """Before: landmarks [1, 10] got a top-1 and top-5 gate; a text encoder's [1, 16, 32] hidden state a 'sequence'
    gate (argmax over hidden units)."""
    lm = convert(regressor(tmp_path / "lm.onnx"), "x86-cpu", tmp_path / "lm")
    o = _outputs(lm)["Identity"]
    assert o["task"] is None and o["top1"] is None and "raw figures only" in str(o["task_note"])
    enc = convert(text_encoder(tmp_path / "enc.onnx"), "x86-cpu", tmp_path / "enc")
    o = _outputs(enc)["last_hidden_state"]
    assert o["task"] is None and o["sequence"] is None and "hidden" in str(o["task_note"])


def test_evidence_decides_not_the_shape() -> None:
    rng = np.random.default_rng(0)
    raw = [rng.standard_normal((1, 10)).astype(np.float32) for _ in range(4)]
    probs = [np.exp(r) / np.exp(r).sum() for r in raw]
    assert guess_task("Identity", raw).task is None  # logits, landmarks or an embedding alike
    assert guess_task("Identity", probs).task == "classifier"  # softmax rows
    assert guess_task("logits", raw).task == "classifier"  # declared by its name
    assert guess_task("landmarks", probs).task == "classifier"  # rows that are distributions outweigh a name
    steps = [rng.standard_normal((1, 12, 40)).astype(np.float32) for _ in range(4)]
    assert guess_task("Identity", steps).task is None
    assert guess_task("ctc_logits", steps).task == "sequence"
    feats = [rng.standard_normal((1, 64, 20, 20)).astype(np.float32) for _ in range(2)]
    assert guess_task("Identity", feats).task is None and guess_task("seg_out", feats).task == "segmentation"
    [o] = compare([{"Identity": r} for r in raw], [{"Identity": r} for r in raw], THRESHOLDS["fp32"], task="classifier")
    assert o.task == "classifier" and o.top1 == 1.0  # declared with --task: judged


def test_a_small_classifier_prints_its_top1(tmp_path: Path) -> None:
    """A 3-class softmax classifier: before, the task row said 'not judged' though top-1 was judged (and gated)."""
    model = regressor(tmp_path / "cls3.onnx", 3, output="output", softmax=True)
    p = run_cli("convert", str(model), "-t", "x86-cpu", "-o", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr
    row = next(line for line in p.stdout.splitlines() if "output (classifier)" in line)
    assert "not judged" not in row and "top-1 100.0%" in row


def test_a_file_shipped_as_is_is_exact_by_identity(tmp_path: Path) -> None:
    """A profile that ships the ONNX unchanged: parity is exact by identity, and recorded so, whatever the
    runner's own arithmetic (here: graph optimisations off, where the reference runs them all)."""
    d = tmp_path / "targets"
    d.mkdir()
    (d / "as-is.toml").write_text(
        VALID.format(name="as-is")
        .replace('"onnx->onnx"', '"tflite->onnx"')
        .replace("intra_op_num_threads = 1", 'graph_optimization_level = "disable"')
    )
    b = convert(anchor_detector(tmp_path / "palm.onnx"), "as-is", tmp_path / "out", ConvertRequest(targets_dir=[d]))
    par = b.manifest["parity"]
    assert par["shipped_as_is"] is True and par["passed"] is True
    assert "byte for byte" in par["host_notes"][0]
    assert all(o["max_abs"] == 0.0 for o in par["outputs"])
    assert b.manifest["source"]["route"].startswith("shipped as it is")


@pytest.mark.parametrize("bad", ["classifier", "sequence"])
def test_a_declared_task_that_does_not_fit_says_so(bad: str) -> None:
    ref = [{"y": np.ones((1, 4, 4, 4, 4), np.float32)}]
    [o] = compare(ref, ref, THRESHOLDS["fp32"], task=bad)
    assert o.task is None and "does not fit" in str(o.task_note)
