"""Frame -> model input, from the bundle's ``PreprocessSpec``.

One implementation serves calibration, parity and (later) the video pipeline, so they agree.
Normalisation is folded into one multiply-add per channel written into a reused buffer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge.errors import InputFileError, MissingDependencyError
from edge.spec import PreprocessSpec

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".ppm", ".pgm", ".tif", ".tiff"})


@dataclass(frozen=True)
class LetterboxTransform:
    """Maps model-input coordinates back to the source frame: ``src = (x - pad) / scale``."""

    scale: float
    pad_x: int
    pad_y: int


def _resize(img: np.ndarray, width: int, height: int) -> np.ndarray:
    if img.shape[1] == width and img.shape[0] == height:
        return img
    try:
        import cv2

        return cv2.resize(img, (width, height), interpolation=cv2.INTER_LINEAR)
    except ImportError:
        pass
    try:
        from PIL import Image
    except ImportError:
        raise MissingDependencyError("resizing frames needs OpenCV or Pillow",
                                     hint="pip install opencv-python-headless (or pillow)") from None
    return np.asarray(Image.fromarray(img).resize((width, height), Image.BILINEAR))


class Preprocessor:
    """Callable: HxWx3 uint8 frame in ``src_color`` order -> batch-of-1 tensor for the model."""

    def __init__(self, spec: PreprocessSpec, src_color: str = "RGB") -> None:
        self.spec = spec
        self.swap = src_color != spec.color
        std = np.asarray(spec.std, dtype=np.float32)
        self._mul = (spec.scale / std).astype(np.float32)
        self._add = (-np.asarray(spec.mean, dtype=np.float32) / std).astype(np.float32)
        h, w = spec.size
        self._hwc = np.empty((h, w, 3), dtype=np.float32)
        self._canvas = np.full((h, w, 3), spec.pad_value, dtype=np.uint8)

    def __call__(self, frame: np.ndarray) -> tuple[np.ndarray, LetterboxTransform]:
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            raise InputFileError(f"expected an HxWx3 uint8 frame, got {frame.dtype}{list(frame.shape)}")
        h, w = self.spec.size
        if self.spec.resize == "letterbox":
            scale = min(h / frame.shape[0], w / frame.shape[1])
            nw, nh = max(1, round(frame.shape[1] * scale)), max(1, round(frame.shape[0] * scale))
            px, py = (w - nw) // 2, (h - nh) // 2
            canvas = self._canvas
            canvas[...] = self.spec.pad_value
            canvas[py:py + nh, px:px + nw] = _resize(frame, nw, nh)
            img, tf = canvas, LetterboxTransform(scale, px, py)
        else:
            img = _resize(frame, w, h)
            tf = LetterboxTransform(min(h / frame.shape[0], w / frame.shape[1]), 0, 0)
        if self.swap:
            img = img[..., ::-1]
        np.multiply(img, self._mul, out=self._hwc, casting="unsafe")
        self._hwc += self._add
        x = self._hwc.transpose(2, 0, 1) if self.spec.layout == "NCHW" else self._hwc
        # a fresh contiguous array: the caller may keep it while the next frame is prepared
        return np.ascontiguousarray(x[None], dtype=self.spec.dtype), tf


def read_image(path: Path) -> np.ndarray:
    """An image file as HxWx3 uint8 RGB."""
    try:
        from PIL import Image
    except ImportError:
        raise MissingDependencyError("reading calibration images needs Pillow",
                                     hint="pip install 'edgekit-ml[convert]'") from None
    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))
    except Exception as e:
        raise InputFileError(f"cannot read image {path}: {e}") from None


def random_frames(count: int, height: int, width: int, seed: int = 0) -> Any:
    """Deterministic smooth-ish synthetic frames (gradients plus noise), uint8 RGB."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    for _ in range(count):
        base = np.stack([
            (xx / max(width - 1, 1)) * rng.uniform(0, 255),
            (yy / max(height - 1, 1)) * rng.uniform(0, 255),
            np.full_like(xx, rng.uniform(0, 255)),
        ], axis=-1)
        noise = rng.normal(0, 40, size=(height, width, 3))
        yield np.clip(base + noise, 0, 255).astype(np.uint8)
