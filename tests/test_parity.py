from __future__ import annotations

import numpy as np

from edge.parity import THRESHOLDS, compare, thresholds_for

RNG = np.random.default_rng(0)
REF = [{"logits": RNG.standard_normal((1, 10)).astype(np.float32), "boxes": RNG.standard_normal((1, 5, 4))} for _ in range(8)]


def test_identical_outputs_pass_with_full_agreement() -> None:
    res = compare(REF, REF, THRESHOLDS["fp32"])
    assert all(r.passed for r in res)
    logits, boxes = res
    assert logits.top1 == 1.0 and logits.max_abs == 0.0 and logits.cosine > 0.999999
    assert boxes.top1 is None  # not classifier-shaped


def test_every_kind_of_failure_is_named() -> None:
    cand = [{"logits": -r["logits"], "boxes": np.full((1, 5, 4), np.nan)} for r in REF]
    logits, boxes = compare(REF, cand, THRESHOLDS["int8"])
    assert any("cosine" in f for f in logits.failures) and any("top-1" in f for f in logits.failures)
    assert any("NaN" in f for f in boxes.failures)
    res = compare(REF, [{"logits": r["logits"][:, :5]} for r in REF], THRESHOLDS["fp32"])
    assert "differs" in res[0].failures[0] and "missing" in res[1].failures[0]


def test_one_bad_sample_fails_and_is_reported() -> None:
    cand = [dict(r) for r in REF]
    cand[3] = {"logits": RNG.standard_normal((1, 10)).astype(np.float32), "boxes": REF[3]["boxes"]}
    logits, boxes = compare(REF, cand, THRESHOLDS["fp16"])
    assert not logits.passed and logits.cosine_min < 0.5 and logits.cosine_min < logits.cosine < 0.999
    assert "worst sample" in logits.failures[0] and boxes.passed


def test_thresholds_loosen_to_the_compute_precision_only() -> None:
    assert thresholds_for("fp16", "f16") == THRESHOLDS["fp16"]
    assert thresholds_for("fp16", "bf16").min_cosine == THRESHOLDS["bf16"].min_cosine
    assert thresholds_for("fp32", "f32") == THRESHOLDS["fp32"]
    assert thresholds_for("int8", "bf16") == THRESHOLDS["int8"]  # never stricter than the bundle's own
    assert thresholds_for("int8", "int8 (QDQ)") == THRESHOLDS["int8"]
