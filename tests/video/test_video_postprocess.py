"""Pre-processing into reused buffers (the code parity uses) and post-processing: top-k, YOLO boxes, NMS."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from edge.errors import EdgeError, InputFileError
from edge.preprocess import LetterboxTransform, Preprocessor, read_image
from edge.spec import PRESETS, IOSpec, PreprocessSpec, TensorSpec
from edge.video.postprocess import Classifier, PostConfig, RawSummary, YoloDetector, make_postprocessor, nms

YOLO = PreprocessSpec(input="images", size=(320, 320), preset="yolo", **PRESETS["yolo"])


def _textbook(spec: PreprocessSpec, img_rgb: np.ndarray) -> np.ndarray:
    """(pixel * scale - mean) / std in the spec's colour order and layout, in float64."""
    x = img_rgb if spec.color == "RGB" else img_rgb[..., ::-1]
    x = (x * spec.scale - np.array(spec.mean)) / np.array(spec.std)
    return (x.transpose(2, 0, 1) if spec.layout == "NCHW" else x)[None]


@pytest.mark.parametrize("preset", ["imagenet", "ppocr", "yolo"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_preprocess_matches_the_formula_and_reuses_buffers(preset: str, layout: str, dtype: str) -> None:
    spec = PreprocessSpec(
        input="x",
        size=(24, 32),
        layout=layout,
        dtype=dtype,
        preset=preset,  # type: ignore[arg-type]
        **{**PRESETS[preset], "resize": "resize"},
    )
    rgb = np.random.default_rng(1).integers(0, 256, (24, 32, 3), dtype=np.uint8)  # model size: no resampling
    fresh, _ = Preprocessor(spec, "RGB")(rgb)
    pre = Preprocessor(spec, "BGR")
    buf = pre.new_output()
    out, _ = pre(np.ascontiguousarray(rgb[..., ::-1]), out=buf)
    assert out is buf and out.dtype == np.dtype(dtype) and out.shape == fresh.shape
    np.testing.assert_array_equal(out, fresh)  # source colour order handled in the same pass
    tol = 1e-6 if dtype == "float32" else 2e-3
    np.testing.assert_allclose(out.astype(np.float64), _textbook(spec, rgb), rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="out must be"):
        pre(rgb, out=np.empty((1, 3, 2, 2), np.float32))


def test_video_path_and_calibration_path_agree(tmp_path: Path) -> None:
    """OpenCV BGR frames through the video pre-processing == Pillow RGB images through calibration's."""
    img = tmp_path / "frame.png"
    cv2.imwrite(str(img), np.random.default_rng(2).integers(0, 256, (120, 160, 3), dtype=np.uint8))
    spec = PreprocessSpec(input="images", size=(64, 64), preset="yolo", **PRESETS["yolo"])
    video, tf_v = Preprocessor(spec, "BGR")(cv2.imread(str(img)))
    calib, tf_c = Preprocessor(spec)(read_image(img))
    np.testing.assert_array_equal(video, calib)
    assert tf_v == tf_c == LetterboxTransform(0.4, 0, 8)


def test_letterbox_geometry_and_boxes_back_to_the_frame() -> None:
    pre = Preprocessor(YOLO, "BGR")
    frame = np.full((480, 640, 3), 200, np.uint8)
    x, tf = pre(frame)
    assert tf == LetterboxTransform(0.5, 0, 40)
    assert np.allclose(x[0, :, :40], 114 / 255) and np.allclose(x[0, :, 40:280], 200 / 255)
    model_box = np.array([[100.0, 90.0, 200.0, 140.0], [-10.0, 0.0, 330.0, 400.0]])
    back = tf.boxes_to_source(model_box, (480, 640))
    np.testing.assert_allclose(back[0], [200, 100, 400, 200])
    np.testing.assert_allclose(back[1], [0, 0, 640, 480])  # clipped to the frame
    # a plain resize scales the axes apart
    _, tf = Preprocessor(YOLO.with_(resize="resize"), "BGR")(frame)
    np.testing.assert_allclose(
        tf.boxes_to_source(np.array([[160.0, 160.0, 320.0, 320.0]]), (480, 640)), [[320, 240, 640, 480]]
    )


def test_frames_that_cannot_be_letterboxed() -> None:
    pre = Preprocessor(YOLO, "BGR")
    with pytest.raises(InputFileError, match="a 2000x2 frame cannot be letterboxed into the model's 320x320 input"):
        pre(np.zeros((2, 2000, 3), np.uint8))
    with pytest.raises(InputFileError, match="empty frame"):
        pre(np.zeros((0, 10, 3), np.uint8))
    with pytest.raises(InputFileError, match="HxWx3 uint8"):
        pre(np.zeros((10, 10), np.uint8))
    x, _ = pre(np.zeros((10, 1000, 3), np.uint8))  # extreme but possible: a 320x3 picture
    assert x.shape == (1, 3, 320, 320)


def test_nms() -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30], [0, 0, 10, 10.5]], np.float32)
    scores = np.array([0.9, 0.8, 0.7, 0.95], np.float32)
    assert nms(boxes, scores, 0.5).tolist() == [3, 2]
    assert nms(boxes, scores, 0.99).tolist() == [3, 0, 1, 2]
    assert nms(boxes[:0], scores[:0], 0.5).tolist() == []


def _rows(n: int, classes: int) -> np.ndarray:
    """[1, n, 5 + classes] YOLO rows: all background (objectness 0.01)."""
    pred = np.zeros((1, n, 5 + classes), np.float32)
    pred[0, :, :4] = [50, 50, 10, 10]
    pred[0, :, 4] = 0.01
    return pred


def test_yolo_rows_decode_nms_and_letterbox_undone() -> None:
    pred = _rows(100, 3)
    pred[0, 7] = [160, 100, 40, 20, 0.9, 0.1, 0.8, 0.1]  # class 1, score 0.72
    pred[0, 8] = [162, 101, 40, 20, 0.8, 0.1, 0.9, 0.1]  # same object, class 1, score 0.72 -> one survives
    pred[0, 9] = [160, 100, 40, 20, 0.9, 0.0, 0.1, 0.6]  # same place, class 2: kept (class-aware)
    pred[0, 10] = [10, 10, 4, 4, 0.9, 0.2, 0.2, 0.2]  # score 0.18 < conf
    io = IOSpec((TensorSpec("images", (1, 3, 320, 320), "float32"),), (TensorSpec("output", (1, 100, 8), "float32"),))
    post = make_postprocessor(io)
    assert isinstance(post, YoloDetector) and not post.channels_first and post.objectness
    tf = LetterboxTransform(0.5, 0, 40)  # 640x480 frame into 320x320
    dets = post({"output": pred}, tf, (480, 640))["detections"]
    assert [(d["class"], d["score"]) for d in dets] == [(1, 0.72), (2, 0.54)]
    assert dets[0]["box"] == [280.0, 100.0, 360.0, 140.0]  # (160 +- 20, 100 +- 10 - 40) / 0.5
    agnostic = make_postprocessor(io, PostConfig(class_agnostic=True))
    assert len(agnostic({"output": pred}, tf, (480, 640))["detections"]) == 1
    strict = make_postprocessor(io, PostConfig(conf=0.6))
    assert [d["class"] for d in strict({"output": pred}, tf, (480, 640))["detections"]] == [1]


def test_yolov8_channels_first_without_objectness() -> None:
    pred = np.zeros((1, 4 + 2, 50), np.float32)
    pred[0, :4, :] = 5
    pred[0, :, 3] = [100, 60, 20, 20, 0.1, 0.85]
    io = IOSpec((TensorSpec("images", (1, 3, 320, 320), "float32"),), (TensorSpec("output0", (1, 6, 50), "float32"),))
    post = make_postprocessor(io)
    assert isinstance(post, YoloDetector) and post.channels_first and not post.objectness
    dets = post({"output0": pred}, LetterboxTransform(1.0, 0, 0), (320, 320))["detections"]
    assert dets == [{"box": [90.0, 50.0, 110.0, 70.0], "score": 0.85, "class": 1}]


def test_classifier_top_k() -> None:
    post = Classifier("logits", 3)
    logits = np.array([[1.0, 3.0, 2.0, -1.0]], np.float32)
    top = post({"logits": logits}, LetterboxTransform(1, 0, 0), (10, 10))["top_k"]
    p = np.exp(logits[0] - 3) / np.exp(logits[0] - 3).sum()
    assert [t["class"] for t in top] == [1, 2, 0]
    assert top[0]["score"] == pytest.approx(p[1], abs=1e-5)
    probs = np.array([[0.1, 0.2, 0.7]], np.float32)  # already probabilities: used as they are
    top = Classifier("p", 5)({"p": probs}, LetterboxTransform(1, 0, 0), (10, 10))["top_k"]
    assert [(t["class"], t["score"]) for t in top] == [
        (2, pytest.approx(0.7)),
        (1, pytest.approx(0.2)),
        (0, pytest.approx(0.1)),
    ]


def test_postprocessor_choice_and_task_errors() -> None:
    img = (TensorSpec("x", (1, 3, 32, 32), "float32"),)
    cls_io = IOSpec(img, (TensorSpec("logits", (1, 10), "float32"),))
    odd_io = IOSpec(img, (TensorSpec("emb", (1, 4, 8), "float32"), TensorSpec("mask", (1, 1, 32, 32), "float32")))
    assert isinstance(make_postprocessor(cls_io), Classifier)
    assert isinstance(make_postprocessor(cls_io, PostConfig(task="raw")), RawSummary)
    raw = make_postprocessor(odd_io)
    assert isinstance(raw, RawSummary)
    out = raw(
        {"emb": np.arange(32, dtype=np.float32).reshape(1, 4, 8), "mask": np.zeros((1, 1, 32, 32))},
        LetterboxTransform(1, 0, 0),
        (32, 32),
    )
    assert out["outputs"]["emb"] == {"shape": [1, 4, 8], "argmax": 31, "max": 31.0}
    with pytest.raises(EdgeError, match="not one YOLO-style detection output"):
        make_postprocessor(cls_io, PostConfig(task="detect"))
    with pytest.raises(EdgeError, match="no classifier output"):
        make_postprocessor(odd_io, PostConfig(task="classify"))
    with pytest.raises(EdgeError, match="unknown task"):
        PostConfig(task="segment")  # type: ignore[arg-type]
    with pytest.raises(EdgeError, match="--conf"):
        PostConfig(conf=2.0)
