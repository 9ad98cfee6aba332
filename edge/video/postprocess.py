"""Model outputs -> per-frame results: top-k for classifiers, boxes + NMS for YOLO-style detectors.

The output layout is read from the bundle's I/O spec:

* classifier: an output ``[1, C]`` (or ``[1, C, 1, 1]``) with C > 1 -> top-k classes with
  softmax scores (the values are used as they are when they already are probabilities);
* YOLOv5 / YOLOX (decoded): one output ``[1, N, 5 + C]`` with N > 5 + C rows of ``cx, cy, w,
  h, objectness, class scores`` in model-input pixels, scores after the sigmoid; score =
  objectness x class score;
* YOLOv8-style: one output ``[1, 4 + C, N]`` with N > 4 + C (channel-major, no objectness);
* anything else -> a summary per output (shape, argmax, max), so any bundle runs.

Boxes are mapped back to the source frame through the pre-processor's
:class:`~edge.preprocess.LetterboxTransform` (letterbox undone, clipped to the frame).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import Any, Literal, Mapping

import numpy as np

from edge.errors import EdgeError
from edge.preprocess import LetterboxTransform
from edge.spec import IOSpec, TensorSpec

Task = Literal["auto", "classify", "detect", "raw"]


@dataclass(frozen=True)
class PostConfig:
    task: Task = "auto"
    top_k: int = 5
    conf: float = 0.25  # detection score threshold
    iou: float = 0.45  # NMS overlap threshold
    max_det: int = 100
    class_agnostic: bool = False  # NMS across classes

    def __post_init__(self) -> None:
        if self.task not in ("auto", "classify", "detect", "raw"):
            raise EdgeError(f"unknown task {self.task!r}", hint="choose auto, classify, detect or raw")
        if self.top_k < 1 or self.max_det < 1:
            raise EdgeError("--top-k and --max-det must be >= 1")
        if not (0.0 <= self.conf <= 1.0 and 0.0 < self.iou <= 1.0):
            raise EdgeError(f"--conf must be in [0, 1] and --iou in (0, 1], got {self.conf} and {self.iou}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class PostProcessor(ABC):
    task: str

    @abstractmethod
    def __call__(
        self, outputs: Mapping[str, np.ndarray], tf: LetterboxTransform, frame_hw: tuple[int, int]
    ) -> dict[str, Any]:
        """The JSON-ready result for one frame."""

    def describe(self) -> str:
        return self.task


def softmax_if_logits(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.float64, copy=False)
    if v.min() >= 0.0 and v.max() <= 1.0 and abs(float(v.sum()) - 1.0) < 1e-3:
        return v  # already probabilities
    e = np.exp(v - v.max())
    p: np.ndarray = e / e.sum()
    return p


class Classifier(PostProcessor):
    task = "classify"

    def __init__(self, output: str, top_k: int) -> None:
        self.output = output
        self.top_k = top_k

    def __call__(
        self, outputs: Mapping[str, np.ndarray], tf: LetterboxTransform, frame_hw: tuple[int, int]
    ) -> dict[str, Any]:
        p = softmax_if_logits(outputs[self.output].reshape(-1))
        k = min(self.top_k, p.size)
        top = np.argpartition(-p, k - 1)[:k]
        top = top[np.argsort(-p[top], kind="stable")]
        return {"top_k": [{"class": int(i), "score": round(float(p[i]), 5)} for i in top]}

    def describe(self) -> str:
        return f"classify: top-{self.top_k} of {self.output!r}"


def nms(boxes: np.ndarray, scores: np.ndarray, iou: float) -> np.ndarray:
    """Greedy non-maximum suppression; indices kept, best first. ``boxes`` is [N, 4] x1, y1, x2, y2."""
    x1, y1, x2, y2 = boxes.T
    areas = np.maximum(x2 - x1, 0) * np.maximum(y2 - y1, 0)
    order = np.argsort(-scores, kind="stable")
    keep = []
    while order.size:
        i = order[0]
        keep.append(i)
        rest = order[1:]
        w = np.maximum(np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]), 0)
        h = np.maximum(np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]), 0)
        inter = w * h
        overlap = inter / np.maximum(areas[i] + areas[rest] - inter, 1e-9)
        order = rest[overlap <= iou]
    return np.asarray(keep, dtype=np.int64)


class YoloDetector(PostProcessor):
    """Score threshold, class-aware NMS, boxes back into the source frame."""

    task = "detect"

    def __init__(self, output: str, *, channels_first: bool, objectness: bool, config: PostConfig) -> None:
        self.output = output
        self.channels_first = channels_first
        self.objectness = objectness
        self.config = config

    def detect(self, pred: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """[N, K] rows -> (xyxy boxes in model-input pixels, scores, class ids) after NMS."""
        c = self.config
        first_cls = 5 if self.objectness else 4
        if self.objectness:
            pred = pred[pred[:, 4] > c.conf]  # score = obj x cls <= obj: a cheap first cut
            cls_scores = pred[:, first_cls:] * pred[:, 4:5]
        else:
            cls_scores = pred[:, first_cls:]
        if cls_scores.shape[1] == 0:
            cls_scores = pred[:, 4:5]
        ids = cls_scores.argmax(axis=1)
        scores = cls_scores[np.arange(len(ids)), ids]
        keep = scores > c.conf
        pred, ids, scores = pred[keep], ids[keep], scores[keep]
        xyxy = np.empty((len(pred), 4), dtype=np.float32)
        half_w, half_h = pred[:, 2] / 2, pred[:, 3] / 2
        xyxy[:, 0], xyxy[:, 1] = pred[:, 0] - half_w, pred[:, 1] - half_h
        xyxy[:, 2], xyxy[:, 3] = pred[:, 0] + half_w, pred[:, 1] + half_h
        if len(pred):
            # class-aware NMS in one pass: boxes of different classes are moved apart
            offset = 0.0 if c.class_agnostic else ids[:, None] * (float(np.abs(xyxy).max()) + 1.0) * 2
            kept = nms(xyxy + offset, scores, c.iou)[: c.max_det]
            xyxy, scores, ids = xyxy[kept], scores[kept], ids[kept]
        return xyxy, scores, ids

    def __call__(
        self, outputs: Mapping[str, np.ndarray], tf: LetterboxTransform, frame_hw: tuple[int, int]
    ) -> dict[str, Any]:
        raw = outputs[self.output][0]
        pred = raw.T if self.channels_first else raw
        xyxy, scores, ids = self.detect(pred)
        boxes = tf.boxes_to_source(xyxy, frame_hw)
        return {
            "detections": [
                {"box": [round(float(v), 1) for v in b], "score": round(float(s), 4), "class": int(k)}
                for b, s, k in zip(boxes, scores, ids)
            ]
        }

    def describe(self) -> str:
        c = self.config
        kind = "YOLOv8-style [1, 4+C, N]" if self.channels_first else "YOLO [1, N, 5+C]"
        return f"detect: {kind} {self.output!r}, conf {c.conf}, NMS IoU {c.iou}, max {c.max_det}"


class RawSummary(PostProcessor):
    task = "raw"

    def __call__(
        self, outputs: Mapping[str, np.ndarray], tf: LetterboxTransform, frame_hw: tuple[int, int]
    ) -> dict[str, Any]:
        summary: dict[str, dict[str, Any]] = {}
        for name, a in outputs.items():
            flat = a.reshape(-1)
            summary[name] = {"shape": list(a.shape)}
            if flat.size and np.issubdtype(a.dtype, np.number):
                summary[name].update(argmax=int(flat.argmax()), max=round(float(flat.max()), 5))
        return {"outputs": summary}

    def describe(self) -> str:
        return "raw: shape, argmax and max per output"


def _dims(t: TensorSpec) -> tuple[int, ...] | None:
    return tuple(int(d) for d in t.shape) if t.is_static else None


def _detector_layout(t: TensorSpec) -> tuple[bool, bool] | None:
    """(channels_first, objectness) when ``t`` looks like a YOLO-style detection output."""
    d = _dims(t)
    if d is None or len(d) != 3 or d[0] != 1:
        return None
    n, k = d[1], d[2]
    if n > k >= 6:
        return False, True  # [1, N, 5 + C]
    if k > n >= 5:
        return True, False  # [1, 4 + C, N]
    return None


def _classifier_output(t: TensorSpec) -> bool:
    d = _dims(t)
    if d is None or d[0] != 1 or len(d) not in (2, 4) or d[1] < 2:
        return False
    return len(d) == 2 or d[2:] == (1, 1)


def make_postprocessor(io: IOSpec, config: PostConfig | None = None) -> PostProcessor:
    """The post-processor for this model's outputs (``config.task`` forces one, or says why it cannot)."""
    config = config or PostConfig()
    outs = io.outputs
    det = [(t, layout) for t in outs if (layout := _detector_layout(t)) is not None]
    cls = [t for t in outs if _classifier_output(t)]
    shapes = ", ".join(t.describe() for t in outs)
    if config.task in ("auto", "detect") and len(outs) == 1 and det:
        t, (channels_first, objectness) = det[0]
        return YoloDetector(t.name, channels_first=channels_first, objectness=objectness, config=config)
    if config.task == "detect":
        raise EdgeError(
            f"the model's outputs ({shapes}) are not one YOLO-style detection output ([1, N, 5+C] or [1, 4+C, N])",
            hint="use --task classify or --task raw",
        )
    if config.task in ("auto", "classify") and cls:
        return Classifier(cls[0].name, config.top_k)
    if config.task == "classify":
        raise EdgeError(
            f"the model has no classifier output ([1, C]) among {shapes}", hint="use --task detect or --task raw"
        )
    return RawSummary()
