"""What an output means, and the agreement a user of it feels: task decoders for parity.

Raw-tensor metrics (cosine, SNR) say how close two tensors are; these say whether the converted
model *does the same thing*: a classifier picks the same class, a detector finds the same boxes, a
probability map covers the same pixels, a recognizer reads the same text. Each task has a detector
(:func:`detect_task`, from the output's shape and the reference's values) and an accumulator that
takes (reference, candidate) one sample at a time and returns its figures.

numpy only: ``edge.verify.parity`` imports this, and the device-side reference-pair check imports
``edge.verify.parity`` (tests/test_layering.py keeps that graph small).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

#: the tasks parity knows how to decode; "auto" detects one per output, "none" keeps raw metrics only
TASKS = ("classifier", "multi-label", "detector", "prob-map", "segmentation", "sequence")
TASK_CHOICES = ("auto", *TASKS, "none")

#: DBNet's binarisation threshold (PaddleOCR det_db_thresh); a probability map is compared thresholded here
PROB_THRESHOLD = 0.3
#: detections: score threshold (YOLO's usual conf), NMS IoU, and the IoU that pairs a detection with another
DET_SCORE = 0.25
DET_NMS_IOU = 0.45
DET_MATCH_IOU = 0.5
#: a detection scoring within this fraction below DET_SCORE still counts as present when pairing: a score
#: of 0.26 in one model and 0.24 in the other is the same detection, not a miss and a false positive
DET_SCORE_MARGIN = 0.2
#: multi-label outputs (independent sigmoid probabilities per class): a label is present at this score
LABEL_THRESHOLD = 0.5
#: a CTC or per-step vocabulary has at least this many classes (blank + 10 digits is 11); fewer columns per row are
#: coordinates (x, y, z, visibility) or a box, whose first column being the largest says nothing
MIN_VOCAB = 10
#: an autoregressive decoder runs at most this many steps (SLANet: 500; PARSeq: 26); an SSD head has more anchors
MAX_STEPS = 1024
#: the fewest anchors of an SSD-style head edgekit has met (MediaPipe BlazeFace short range: 896): under it, rows
#: shared by two outputs may as well be a decoder's steps as anchors
_SSD_MIN_ANCHORS = 896
_YOLO_STRIDES = (8, 16, 32)
_MIN_GRID = 21 * 4  # a YOLO head has sum over strides 8/16/32 of (H/s)(W/s) = 21*H*W/1024 cells


def _dims(shape: Sequence[int]) -> list[int]:
    return [int(d) for d in shape]


def is_classifier(shape: Sequence[int]) -> bool:
    """[N, C] or [N, C, 1, 1] with C > 1."""
    dims = [d for d in shape[1:] if d != 1]
    return len(shape) >= 2 and len(dims) == 1 and dims[0] > 1 and shape[1] == dims[0]


def _in_unit(lo: float, hi: float) -> bool:
    return lo >= -1e-6 and hi <= 1 + 1e-6


@dataclass(frozen=True)
class YoloLayout:
    """How a YOLO-family head lays out its predictions (one output tensor, batch 1)."""

    transposed: bool  # [1, 4 + C, N] (YOLOv8) instead of [1, N, K]
    objectness: bool  # column 4 is objectness (YOLOv5 / YOLOX), else class scores start at 4 (YOLOv8)
    raw_boxes: bool  # YOLOX without decode_in_inference: xy offsets and log sizes per grid cell
    sigmoid: bool  # scores are logits


def yolo_layout(shape: Sequence[int], lo: np.ndarray | None = None, hi: np.ndarray | None = None) -> YoloLayout | None:
    """The head layout of a [1, N, K] or [1, K, N] output, or None when it is not YOLO-shaped.

    ``lo``/``hi``: the reference's per-column minimum and maximum (K values each), when known: they tell a
    decoded head (box centres in input pixels) from a raw YOLOX one (offsets of a few cells), and
    probabilities from logits."""
    s = _dims(shape)
    if len(s) != 3 or s[0] != 1:
        return None
    n, k, transposed = (s[1], s[2], False) if s[1] >= s[2] else (s[2], s[1], True)
    if n % 21 or n < _MIN_GRID or not 5 <= k <= 1024:
        return None
    objectness = not transposed and k >= 6
    raw = sigmoid = False
    if lo is not None and hi is not None:
        raw = float(max(abs(lo[0]), abs(hi[0]), abs(lo[1]), abs(hi[1]))) < 8.0  # decoded centres reach the image
        raw = raw and (not transposed) and _grid_side(n) is not None
        sigmoid = not _in_unit(float(lo[4:].min()), float(hi[4:].max()))
    return YoloLayout(transposed, objectness, raw, sigmoid)


def _grid_side(n: int) -> int | None:
    """The square input side a YOLOX head of ``n`` cells was exported at (21 * side^2 / 1024 = n)."""
    side = math.isqrt(n * 1024 // 21)
    return side if side % 32 == 0 and sum((side // s) ** 2 for s in _YOLO_STRIDES) == n else None


def _sigmoid(x: np.ndarray) -> np.ndarray:
    y: np.ndarray = 1.0 / (1.0 + np.exp(-np.clip(x, -60, 60)))
    return y


def decode_yolo(
    pred: np.ndarray, layout: YoloLayout, score: float = DET_SCORE
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One image's head output -> (boxes xyxy [M, 4], scores [M], classes [M]) after class-aware NMS, scores
    >= ``score``, best first."""
    p = np.asarray(pred, dtype=np.float64).reshape(pred.shape[-2:])
    if layout.transposed:
        p = p.T
    p = p.copy()
    if layout.raw_boxes:
        side = _grid_side(len(p))
        grids, strides = [], []
        for s in _YOLO_STRIDES:
            g = side // s  # type: ignore[operator]
            yy, xx = np.mgrid[0:g, 0:g]
            grids.append(np.stack([xx.ravel(), yy.ravel()], axis=1))
            strides.append(np.full((g * g, 1), s))
        grid, stride = np.concatenate(grids), np.concatenate(strides)
        p[:, :2] = (p[:, :2] + grid) * stride
        p[:, 2:4] = np.exp(np.clip(p[:, 2:4], -20, 20)) * stride
    scores = p[:, 4:]
    if layout.sigmoid:
        scores = _sigmoid(scores)
    if layout.objectness:
        cls = scores[:, 1:] if scores.shape[1] > 1 else np.ones((len(p), 1))
        conf_all = scores[:, :1] * cls
    else:
        conf_all = scores
    classes = conf_all.argmax(axis=1)
    conf = conf_all[np.arange(len(p)), classes]
    keep = conf >= score
    cx, cy, w, h = p[keep, 0], p[keep, 1], p[keep, 2], p[keep, 3]
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    kept = nms(boxes, conf[keep], classes[keep])
    return boxes[kept], conf[keep][kept], classes[keep][kept]


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix [len(a), len(b)] of xyxy boxes."""
    if not len(a) or not len(b):
        return np.zeros((len(a), len(b)))
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(axis=2)
    area_a = np.clip(a[:, 2:] - a[:, :2], 0, None).prod(axis=1)
    area_b = np.clip(b[:, 2:] - b[:, :2], 0, None).prod(axis=1)
    union = area_a[:, None] + area_b[None, :] - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / union, 0.0)


def nms(
    boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou: float = DET_NMS_IOU, max_det: int = 300
) -> np.ndarray:
    """Indices kept by greedy class-aware NMS, best score first."""
    order = np.argsort(-scores, kind="stable")[: 10 * max_det]
    keep: list[int] = []
    while len(order) and len(keep) < max_det:
        i = int(order[0])
        keep.append(i)
        rest = order[1:]
        same = classes[rest] == classes[i]
        overlap = box_iou(boxes[i : i + 1], boxes[rest])[0]
        order = rest[~(same & (overlap > iou))]
    return np.asarray(keep, dtype=np.int64)


def match_detections(
    ref: tuple[np.ndarray, np.ndarray, np.ndarray],
    cand: tuple[np.ndarray, np.ndarray, np.ndarray],
    iou: float = DET_MATCH_IOU,
) -> int:
    """Pairs (greedy, best candidate score first): IoU >= ``iou`` and the same class, each used once."""
    rb, _, rc = ref
    cb, cs, cc = cand
    if not len(rb) or not len(cb):
        return 0
    m = box_iou(cb, rb)
    m[cc[:, None] != rc[None, :]] = 0.0
    used = np.zeros(len(rb), bool)
    pairs = 0
    for i in np.argsort(-cs, kind="stable"):
        j = np.where(~used & (m[i] >= iou))[0]
        if len(j):
            used[j[m[i, j].argmax()]] = True
            pairs += 1
    return pairs


def _strict(dets: tuple[np.ndarray, np.ndarray, np.ndarray], score: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    keep = dets[1] >= score
    return dets[0][keep], dets[1][keep], dets[2][keep]


def tie_aware_argmax(ref: np.ndarray, cand: np.ndarray, rtol: float, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference's and the converted model's argmax along ``axis``, the latter taken as the reference's where
    the two are tied within ``rtol`` x max(1, the magnitude along the axis) in either output: a step, pixel or row
    whose best is a tie at the precision is not a disagreement (issue #34)."""
    r, c = np.asarray(ref, np.float64), np.asarray(cand, np.float64)
    br, bc = r.argmax(axis=axis), c.argmax(axis=axis)
    if rtol <= 0:
        return br, bc
    tol = rtol * np.maximum(1.0, np.abs(r).max(axis=axis))

    def at(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
        return np.take_along_axis(x, np.expand_dims(idx, axis), axis=axis).squeeze(axis)

    tied = (at(r, bc) >= at(r, br) - tol) | (at(c, br) >= at(c, bc) - tol)
    return br, np.where(tied, br, bc)


def ctc_collapse(best: Sequence[int] | np.ndarray, blank: int = 0) -> list[int]:
    """A best path with repeats collapsed and blanks dropped."""
    out, prev = [], -1
    for t in np.asarray(best).tolist():
        if t != prev and t != blank:
            out.append(t)
        prev = t
    return out


def ctc_greedy(logits: np.ndarray, blank: int = 0) -> list[int]:
    """argmax per step, repeats collapsed, blanks dropped (CTC best path)."""
    return ctc_collapse(np.asarray(logits).reshape(-1, np.shape(logits)[-1]).argmax(axis=1), blank)


def edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
    """Levenshtein distance."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


#: a task figure that cannot tell a right conversion from a wrong one on these inputs (ties, nothing detected)
NO_DISCRIMINATION = "cannot discriminate: "


@dataclass
class TaskFigures:
    """One output's task-level agreement of the converted model with the reference."""

    task: str
    figures: dict[str, float | None]  # e.g. {"top1": 0.98, "top5": 1.0}
    note: str | None = None  # how it was decoded, or why it could not be judged
    degenerate: bool = False  # nothing to agree on with these inputs (no detections, empty maps)


@dataclass
class _Acc:
    task: str
    counts: dict[str, float] = field(default_factory=dict)
    samples: int = 0

    def add(self, key: str, value: float) -> None:
        self.counts[key] = self.counts.get(key, 0.0) + value


class TaskJudge:
    """Accumulates one output's task figures over samples: ``add(ref, cand)`` per sample, then ``result()``."""

    def __init__(
        self,
        task: str,
        shape: Sequence[int],
        lo: np.ndarray | None = None,
        hi: np.ndarray | None = None,
        *,
        ctc_blank_share: float = 0.0,
        tie_rtol: float = 0.0,
    ) -> None:
        self.task = task
        #: values within this of each other (x max(1, the row's largest magnitude)) are equal at the precision judged:
        #: an argmax among them is a tie, not a disagreement; a label this close to the threshold is undecided
        self.tie_rtol = tie_rtol
        self.shape = _dims(shape)
        self.acc = _Acc(task)
        self.layout = yolo_layout(shape, lo, hi) if task == "detector" else None
        self.ctc = ctc_blank_share >= 0.2  # the blank (class 0) is the reference's best class at >= 20 % of steps
        if task == "detector" and self.layout is None:
            raise ValueError(f"shape {self.shape} is not a YOLO-family head ([1, N, 5 + C] or [1, 4 + C, N])")

    def add(self, ref: np.ndarray, cand: np.ndarray) -> None:
        a = self.acc
        r: np.ndarray  # the reference's and the candidate's outputs, as the task reads them
        c: np.ndarray
        a.samples += 1
        if self.task == "classifier":
            self._add_classifier(ref, cand)
        elif self.task == "multi-label":
            r, c = np.asarray(ref, np.float64), np.asarray(cand, np.float64)
            decided = np.abs(r - LABEL_THRESHOLD) > self.tie_rtol  # a label this close to 0.5 goes either way
            r_on, c_on = r >= LABEL_THRESHOLD, c >= LABEL_THRESHOLD
            a.add("inter", float((r_on & c_on & decided).sum()))
            a.add("union", float(((r_on | c_on) & decided).sum()))
            a.add("ref_labels", float(r_on.sum()))
            a.add("undecided", float((~decided).sum()))
        elif self.task == "detector":
            assert self.layout is not None
            low = DET_SCORE * (1 - DET_SCORE_MARGIN)
            rd, cd = decode_yolo(ref, self.layout, low), decode_yolo(cand, self.layout, low)
            rs, cs = _strict(rd, DET_SCORE), _strict(cd, DET_SCORE)
            a.add("ref", len(rs[0]))
            a.add("cand", len(cs[0]))
            a.add("tp_cand", match_detections(rd, cs))  # converted detections the reference has
            a.add("tp_ref", match_detections(cd, rs))  # reference detections the converted model has
        elif self.task == "prob-map":
            r, c = np.asarray(ref) >= PROB_THRESHOLD, np.asarray(cand) >= PROB_THRESHOLD
            a.add("inter", float((r & c).sum()))
            a.add("union", float((r | c).sum()))
            a.add("ref_px", float(r.sum()))
        elif self.task == "segmentation":
            r, c = tie_aware_argmax(np.asarray(ref), np.asarray(cand), self.tie_rtol, axis=1)
            a.add("agree", float((r == c).sum()))
            a.add("px", float(r.size))
            for k in np.union1d(np.unique(r), np.unique(c)).tolist():
                a.add(f"i{k}", float(((r == k) & (c == k)).sum()))
                a.add(f"u{k}", float(((r == k) | (c == k)).sum()))
        elif self.task == "sequence":
            # each sample's own steps: a decoder that stops at its end token gives [1, 25, 50] for one input and
            # [1, 44, 50] for the next (SLANet-plus); the first sample's shape does not fit the others
            r = np.asarray(ref)
            r = r.reshape(-1, r.shape[-2], r.shape[-1])
            c = np.asarray(cand).reshape(r.shape)
            for rr, cc in zip(r, c):
                br, bc = tie_aware_argmax(rr, cc, self.tie_rtol, axis=1)
                if self.ctc:
                    sr, sc = ctc_collapse(br), ctc_collapse(bc)
                else:
                    sr, sc = br.tolist(), bc.tolist()
                a.add("seqs", 1)
                a.add("same", float(sr == sc))
                a.add("dist", float(edit_distance(sr, sc)))
                a.add("len", float(max(len(sr), len(sc))))
        else:
            raise ValueError(f"unknown task {self.task!r}")

    def _add_classifier(self, ref: np.ndarray, cand: np.ndarray) -> None:
        """Top-1 and top-5, tie-aware: the converted model's best class agrees when the reference holds it within
        the tolerance of its own best (or the converted model holds the reference's best within it of its own)."""
        a = self.acc
        r = np.asarray(ref, np.float64).reshape(self.shape[0], -1)
        c = np.asarray(cand, np.float64).reshape(self.shape[0], -1)
        rows = np.arange(len(r))
        tol = self.tie_rtol * np.maximum(1.0, np.abs(r).max(axis=1))
        top_ref, top_cand = r.argmax(axis=1), c.argmax(axis=1)
        r_best, c_best = r[rows, top_ref], c[rows, top_cand]
        agree = (r[rows, top_cand] >= r_best - tol) | (c[rows, top_ref] >= c_best - tol)
        a.add("n", len(r))
        a.add("top1", float(agree.sum()))
        a.add("tied", float(((r >= (r_best - tol)[:, None]).sum(axis=1) > 1).sum()))
        k = min(5, r.shape[1])
        top5 = np.argsort(-c, axis=1, kind="stable")[:, :k]
        a.add("top5", float((r[rows[:, None], top5] >= (r_best - tol)[:, None]).any(axis=1).sum()))

    def _classifier_result(self) -> TaskFigures:
        c = self.acc.counts
        n = c.get("n", 0.0) or 1.0
        figs: dict[str, float | None] = {"top1": c.get("top1", 0.0) / n}
        if self.shape and max(self.shape[1:], default=0) > 5:
            figs["top5"] = c.get("top5", 0.0) / n
        tied = int(c.get("tied", 0.0))
        if not tied:
            return TaskFigures("classifier", figs)
        note = (
            f"the reference's best class is tied (within {self.tie_rtol:.0e} of the row's scale) in {tied} of "
            f"{int(n)} samples: a converted model picking another of the tied classes agrees"
        )
        if tied < n:
            return TaskFigures("classifier", figs, note)
        return TaskFigures(
            "classifier",
            figs,
            NO_DISCRIMINATION + note + "; judged by the raw figures (cosine, SNR, error over the range)",
            degenerate=True,
        )

    def _multi_label_result(self) -> TaskFigures:
        c = self.acc.counts
        note = (
            f"labels at >= {LABEL_THRESHOLD} compared (IoU of the label sets); the reference has "
            f"{int(c.get('ref_labels', 0))}"
        )
        if c.get("undecided"):
            note += f", {int(c['undecided'])} scores within {self.tie_rtol:.0e} of {LABEL_THRESHOLD} left out"
        if not c.get("union"):
            return TaskFigures(
                "multi-label", {"iou": None}, NO_DISCRIMINATION + note + ": no label on these inputs", degenerate=True
            )
        return TaskFigures("multi-label", {"iou": c.get("inter", 0.0) / c["union"]}, note)

    def result(self) -> TaskFigures:
        c, t = self.acc.counts, self.task
        if t == "classifier":
            return self._classifier_result()
        if t == "multi-label":
            return self._multi_label_result()
        if t == "detector":
            assert self.layout is not None
            how = (
                "YOLOX raw head, grid-decoded"
                if self.layout.raw_boxes
                else "YOLOv8 head"
                if self.layout.transposed
                else "YOLOv5/YOLOX decoded head"
            )
            note = (
                f"{how}; score >= {DET_SCORE} (pairs down to {DET_SCORE * (1 - DET_SCORE_MARGIN):.2f}), "
                f"NMS IoU {DET_NMS_IOU}, paired at IoU >= {DET_MATCH_IOU} with the same class; "
                f"{int(c.get('ref', 0))} reference and {int(c.get('cand', 0))} converted detections"
            )
            if not c.get("ref") and not c.get("cand"):
                return TaskFigures(
                    t,
                    {"precision": None, "recall": None, "detections": 0.0},
                    note + ": no detections on these inputs",
                    degenerate=True,
                )
            # no detections claimed: no false ones (recall says what was missed), and the other way round
            precision = c.get("tp_cand", 0.0) / c["cand"] if c.get("cand") else 1.0
            recall = c.get("tp_ref", 0.0) / c["ref"] if c.get("ref") else 1.0
            return TaskFigures(t, {"precision": precision, "recall": recall, "detections": c.get("ref", 0.0)}, note)
        if t == "prob-map":
            note = f"pixels >= {PROB_THRESHOLD} compared; the reference marks {int(c.get('ref_px', 0))}"
            if not c.get("union"):
                return TaskFigures(t, {"iou": None}, note + ": both maps are empty on these inputs", degenerate=True)
            return TaskFigures(t, {"iou": c.get("inter", 0.0) / c["union"]}, note)
        if t == "segmentation":
            ious = [c[f"i{k[1:]}"] / c[k] for k in c if k.startswith("u") and c[k] > 0]
            return TaskFigures(
                t,
                {
                    "iou": float(np.mean(ious)) if ious else None,
                    "pixel_agreement": c.get("agree", 0.0) / (c.get("px") or 1.0),
                },
                "per-pixel argmax; mean IoU over the classes present",
            )
        n = c.get("seqs", 0.0) or 1.0
        how = "CTC greedy decode (blank 0)" if self.ctc else "argmax per position"
        if not c.get("len"):
            return TaskFigures(
                t, {"sequence": None, "tokens": None}, how + ": every decoded sequence is empty", degenerate=True
            )
        return TaskFigures(
            t,
            {"sequence": c.get("same", 0.0) / n, "tokens": 1.0 - c.get("dist", 0.0) / c["len"]},
            f"{how}; 'sequence': identical decoded sequences, 'tokens': 1 - edit distance / length",
        )


#: what an output without a task is judged by, in the words every such conclusion ends with
RAW_ONLY = "raw figures only (compares numbers: cosine, SNR, error over the range)"
#: an SSD-style head has at least this many anchors (BlazeFace short range: 896, SSD MobileNet: 1917)
_MIN_ANCHORS = 64
#: the box regressor's width: 4 box values, plus keypoints (BlazeFace: 4 + 6 x 2 = 16)
_BOX_COLUMNS = (4, 64)


def anchor_head(shape: Sequence[int], others: Sequence[Sequence[int]] = (), rows: str | None = None) -> str | None:
    """Why an output is one tensor of an SSD-style anchor head (a note), or None.

    Such a head gives, per anchor, box offsets in one output ([1, N, 4 + 2k]) and scores in another
    ([1, N, C]), the same N in both and N larger than any width. Neither is decodable without the anchor
    table, which lives outside the model (MediaPipe's BlazeFace: [1, 896, 16] regressors and [1, 896, 1]
    logits); read alone, the scores look like a classifier over N "classes" and the regressors like a
    sequence of N steps. Both are judged on raw figures only. ``others``: the model's other outputs.

    An autoregressive decoder's per-step outputs share their rows too (SLANet: [1, 500, 50] token probabilities
    and [1, 500, 8] boxes per step). ``rows`` (:func:`row_kind` of this output): a distribution over at least
    :data:`MIN_VOCAB` tokens on each of at most :data:`MAX_STEPS` rows is a decoder's tokens, not anchors (None);
    under :data:`_SSD_MIN_ANCHORS` rows the note names both readings instead of claiming an SSD head."""
    s = _dims(shape)
    if len(s) != 3 or s[0] != 1 or s[1] < _MIN_ANCHORS or s[2] >= s[1]:
        return None
    if rows is not None and s[2] >= MIN_VOCAB and s[1] <= MAX_STEPS:
        return None
    group = [s] + [_dims(o) for o in others if len(o) == 3 and _dims(o)[:2] == s[:2] and _dims(o)[2] < s[1]]
    if len(group) < 2 or not any(_BOX_COLUMNS[0] <= g[2] <= _BOX_COLUMNS[1] for g in group):
        return None
    widths = " and ".join(f"[1, {s[1]}, {g[2]}]" for g in sorted(group, key=lambda g: -g[2]))
    if s[1] < _SSD_MIN_ANCHORS:
        return (
            f"{widths} share their {s[1]} rows: per-row boxes and scores of a dense head's cells, a small anchor "
            f"head's anchors or a decoder's steps alike, none decodable from the shapes alone: {RAW_ONLY}"
        )
    return (
        f"SSD-style anchor head ({widths}: box offsets and scores per anchor, decodable only with the anchor "
        f"table, which is not in the model): {RAW_ONLY}"
    )


#: output names that declare a decodable task (a classifier's or recogniser's scores)
SCORE_NAMES = re.compile(r"logit|prob|softmax|class|cls|score|label|pred|ctc|char|token|tag", re.I)
#: output names that declare a regression or a representation: no class, box or token to agree on
VALUE_NAMES = re.compile(
    r"landmark|keypoint|kpt|point|embed|feature|feat|hidden|state|encoder|pool|vector|"
    r"coord|pose|regress|mesh|depth|angle|offset|box|proj|output_\d+_value",
    re.I,
)
_LOGIT_NAMES = re.compile(r"logit", re.I)
_SEG_NAMES = re.compile(r"seg|mask|semantic|parsing|label|class|logit", re.I)


def row_kind(refs: Sequence[np.ndarray], axis: int = -1) -> str | None:
    """What every row of the reference along ``axis`` is, over all samples: ``probabilities`` (in [0, 1], sum 1:
    a softmax), ``log-probabilities`` (<= 0, logsumexp 0: a log-softmax), or None (raw values)."""
    prob = logp = True
    for r in refs:
        x = np.moveaxis(np.asarray(r, dtype=np.float64), axis, -1)
        if x.size == 0 or x.shape[-1] < 2 or not np.isfinite(x).all():
            return None
        if prob and not (x.min() >= -1e-6 and x.max() <= 1 + 1e-6 and np.allclose(x.sum(-1), 1.0, atol=1e-3)):
            prob = False
        if logp and not (x.max() <= 1e-6 and np.allclose(np.log(np.exp(x).sum(-1)), 0.0, atol=1e-3)):
            logp = False
        if not (prob or logp):
            return None
    return "probabilities" if prob else "log-probabilities"


@dataclass(frozen=True)
class TaskGuess:
    """The task an output is judged by (None: raw figures only) and the evidence for that conclusion."""

    task: str | None
    evidence: str


def unit_rows(refs: Sequence[np.ndarray]) -> bool:
    """Every value of the reference in [0, 1] and its rows (last axis) not all summing to 1: independent
    probabilities (a multi-label sigmoid), a mask or per-bin gains, or normalised coordinates -- not a softmax."""
    ok = False
    for r in refs:
        x = np.asarray(r, dtype=np.float64)
        if x.ndim == 0 or x.shape[-1] < 2 or not np.isfinite(x).all() or not _in_unit(float(x.min()), float(x.max())):
            return False
        ok = ok or not np.allclose(x.sum(-1), 1.0, atol=1e-3)
    return ok


def explain_task(
    name: str,
    shape: Sequence[int],
    lo: np.ndarray | None,
    hi: np.ndarray | None,
    ctc_blank_share: float = 0.0,
    *,
    others: Sequence[Sequence[int]] = (),
    rows: str | None = None,
    channel_rows: str | None = None,
    independent: bool = False,
) -> TaskGuess:
    """The task an output is unambiguously, with the evidence; else None and why its shape alone does not tell.

    A shape is never enough on its own: a ``[1, C]`` tensor is a classifier's logits, a landmark regressor's
    coordinates or an embedding; ``[1, T, C]`` is per-step logits or a transformer's hidden state; an
    SSD anchor head's ``[1, 2016, 18]`` has as many rows as a YOLO head. Evidence is the reference's values
    (``rows``: :func:`row_kind` over the last axis; ``channel_rows``: over axis 1; ``ctc_blank_share``;
    ``independent``: :func:`unit_rows`), the output's name, and the model's other outputs. ``lo``/``hi``: per
    last-axis column min/max."""
    s = _dims(shape)
    anchors = anchor_head(s, others, rows)
    if anchors is not None:
        return TaskGuess(None, anchors)
    named_scores = bool(SCORE_NAMES.search(name)) and not VALUE_NAMES.search(name)
    if is_classifier(s):
        return _classifier_guess(name, s, rows, named_scores, independent)
    layout = yolo_layout(s, lo, hi)
    if layout is not None:
        split = [list(o) for o in others if len(o) == 3 and _dims(o)[:2] == s[:2]]
        if split:
            return TaskGuess(
                None,
                f"{s} shares its {s[1]} rows with {split}: boxes and scores in separate "
                f"tensors (an anchor or split head), not one YOLO head: {RAW_ONLY}",
            )
        return TaskGuess(
            "detector",
            f"one [1, N, K] head with N = {s[1] if not layout.transposed else s[2]} = 21k "
            "(YOLO's three strides) and no other per-row output",
        )
    unit = lo is not None and hi is not None and _in_unit(float(lo.min()), float(hi.max()))
    if len(s) == 4 and s[1] == 1 and min(s[2:]) >= 8 and unit:
        return TaskGuess("prob-map", "a 1-channel plane with every value in [0, 1]")
    if len(s) == 4 and s[3] == 1 and min(s[1:3]) >= 8 and unit:  # channels-last (a TFLite model's [N, H, W, 1])
        return TaskGuess("prob-map", "a 1-channel plane (channels last) with every value in [0, 1]")
    if len(s) == 4 and 2 <= s[1] <= 1024 and min(s[2:]) >= 8:
        if channel_rows is not None:
            return TaskGuess("segmentation", f"per-pixel {channel_rows} over {s[1]} channels")
        if _SEG_NAMES.search(name) and not VALUE_NAMES.search(name):
            return TaskGuess("segmentation", f"[N, C, H, W] output named {name!r}")
        return TaskGuess(
            None, f"a {s} map may be class scores or features: {RAW_ONLY} (--task segmentation judges per-pixel argmax)"
        )
    if len(s) == 3 and s[1] >= 2 and s[2] >= 3:  # [N, T, C]; a squeezed [N, H, W] map needs --task prob-map
        return _sequence_guess(name, s, rows, named_scores, independent, ctc_blank_share)
    return TaskGuess(None, f"no task decodes a {s} output: {RAW_ONLY}")


def _classifier_guess(name: str, s: list[int], rows: str | None, named_scores: bool, independent: bool) -> TaskGuess:
    """An [N, C] output: softmax rows or a score name make a classifier; independent probabilities named as
    scores are multi-label; the rest is a regression, an embedding or logits alike."""
    classes = max(s[1:])
    if rows is not None:
        return TaskGuess("classifier", f"every row is a distribution of {rows} over {classes} classes")
    if independent and not _LOGIT_NAMES.search(name):  # logits (so named) that happen to lie in [0, 1] are logits
        if named_scores:
            return TaskGuess(
                "multi-label",
                f"values in [0, 1] that do not sum to 1 over {classes} classes, named {name!r}: independent "
                f"probabilities (a sigmoid per class), so labels, not one class",
            )
        return TaskGuess(
            None,
            f"values in [0, 1] that do not sum to 1: independent probabilities, a mask or normalised coordinates "
            f"alike: {RAW_ONLY} (--task multi-label compares labels at >= {LABEL_THRESHOLD})",
        )
    if named_scores:
        return TaskGuess("classifier", f"[N, C] output named {name!r} (class scores)")
    what = "a regression (named so)" if VALUE_NAMES.search(name) else "logits, landmarks or an embedding alike"
    return TaskGuess(None, f"a {s} output is {what}: {RAW_ONLY} (--task classifier gates top-1)")


def _sequence_guess(
    name: str, s: list[int], rows: str | None, named_scores: bool, independent: bool, blank: float
) -> TaskGuess:
    """An [N, T, C] output: a distribution per step, or logits over a vocabulary (a CTC blank's share, a score
    name) make a sequence; values in [0, 1] per column are a mask; a few columns per row are coordinates."""
    if rows is not None:
        return TaskGuess("sequence", f"every step is a distribution of {rows} over {s[2]} tokens: argmax per step")
    if independent and not _LOGIT_NAMES.search(name):
        if named_scores:
            return TaskGuess(
                "multi-label",
                f"values in [0, 1] that do not sum to 1 over {s[2]} classes per step, named {name!r}: independent "
                "probabilities, so labels per step",
            )
        return TaskGuess(
            None,
            f"values in [0, 1] that do not sum to 1 over the last axis ({s[2]} columns): a mask or per-bin gains, "
            f"not scores over a vocabulary: {RAW_ONLY}",
        )
    if blank >= 0.2 and s[2] >= MIN_VOCAB:
        return TaskGuess("sequence", f"class 0 (a CTC blank) is the best class at {blank:.0%} of steps")
    if named_scores:
        return TaskGuess("sequence", f"[N, T, C] output named {name!r} (per-step scores)")
    if s[2] < MIN_VOCAB:
        return TaskGuess(
            None,
            f"{s[2]} values per row: coordinates or a box per point, not scores over a vocabulary "
            f"(fewer than {MIN_VOCAB} classes): {RAW_ONLY}",
        )
    return TaskGuess(
        None,
        f"a {s} output may be per-step logits or hidden states: {RAW_ONLY} (--task sequence judges decoded sequences)",
    )


def detect_task(
    name: str,
    shape: Sequence[int],
    lo: np.ndarray | None,
    hi: np.ndarray | None,
    ctc_blank_share: float = 0.0,
    *,
    others: Sequence[Sequence[int]] = (),
    rows: str | None = None,
    channel_rows: str | None = None,
    independent: bool = False,
) -> str | None:
    """The task an output unambiguously is (:func:`explain_task`), or None."""
    return explain_task(
        name,
        shape,
        lo,
        hi,
        ctc_blank_share,
        others=others,
        rows=rows,
        channel_rows=channel_rows,
        independent=independent,
    ).task


def fits(task: str, shape: Sequence[int], lo: np.ndarray | None, hi: np.ndarray | None) -> bool:
    """Whether ``task`` (asked for with --task) can decode an output of this shape."""
    s = _dims(shape)
    if task == "classifier":
        return is_classifier(s)
    if task == "multi-label":
        return len(s) >= 2 and s[-1] >= 2
    if task == "detector":
        return yolo_layout(s, lo, hi) is not None
    if task == "prob-map":
        return (
            (len(s) == 3 and min(s[-2:]) >= 8)
            or (len(s) == 4 and s[1] == 1 and min(s[2:]) >= 8)
            or (len(s) == 4 and s[3] == 1 and min(s[1:3]) >= 8)
        )
    if task == "segmentation":
        return len(s) == 4 and s[1] >= 2 and min(s[2:]) >= 8
    if task == "sequence":
        return len(s) == 3 and s[1] >= 2 and s[2] >= 2
    return False


def column_range(
    ref: Sequence[np.ndarray], transposed_ok: bool = True
) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
    """Per-column (last axis; the middle axis of a [1, K, N] head) min and max over samples; (None, None) when the
    samples disagree on the columns' count (an output as long as the input asks: no column is the same quantity
    in every sample)."""
    a = np.atleast_1d(np.asarray(ref[0]))  # a scalar output is one column
    axis_last = not (a.ndim == 3 and a.shape[1] < a.shape[2] and transposed_ok and a.shape[2] % 21 == 0)
    column_axis = -1 if axis_last else 1
    shapes = [np.atleast_1d(np.asarray(r)).shape for r in ref]
    if any(len(t) != a.ndim or t[column_axis] != a.shape[column_axis] for t in shapes):
        return None, None
    lo = hi = None
    for r in ref:
        x = np.atleast_1d(np.asarray(r, dtype=np.float64))
        x = x.reshape(-1, x.shape[-1]) if axis_last else np.moveaxis(x, 1, -1).reshape(-1, x.shape[1])
        rl, rh = x.min(axis=0), x.max(axis=0)
        lo = rl if lo is None else np.minimum(lo, rl)
        hi = rh if hi is None else np.maximum(hi, rh)
    return lo, hi


def blank_share(ref: Sequence[np.ndarray]) -> float:
    """The share of steps where class 0 is the best class (CTC's blank dominates a recognizer's output)."""
    best = np.concatenate([np.asarray(r).reshape(-1, np.shape(r)[-1]).argmax(axis=1) for r in ref])
    return float((best == 0).mean()) if best.size else 0.0
