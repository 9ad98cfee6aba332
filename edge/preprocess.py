"""Frame -> model input, from the bundle's ``PreprocessSpec``.

One implementation serves calibration, parity and the video pipeline (``edge.video``), so
they agree. Normalisation is folded into one multiply-add per channel; for NCHW it is
written straight into the channel planes of the output (no HWC intermediate, no transpose
copy), and the caller may pass that output buffer in (``out=``) to reuse it frame after frame.
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
    """Maps model-input coordinates back to the source frame: ``src = (x - pad) / scale``.

    Letterboxing scales both axes alike; a plain resize scales them apart (``scale_y``).
    """

    scale: float
    pad_x: int
    pad_y: int
    scale_y: float | None = None  # None: the same as ``scale``

    def boxes_to_source(self, xyxy: np.ndarray, frame_hw: tuple[int, int]) -> np.ndarray:
        """[N, 4] x1, y1, x2, y2 in model-input pixels -> source-frame pixels, clipped to the frame."""
        sy = self.scale if self.scale_y is None else self.scale_y
        out = np.empty_like(xyxy, dtype=np.float32)
        out[:, 0::2] = (xyxy[:, 0::2] - self.pad_x) / self.scale
        out[:, 1::2] = (xyxy[:, 1::2] - self.pad_y) / sy
        np.clip(out[:, 0::2], 0, frame_hw[1], out=out[:, 0::2])
        np.clip(out[:, 1::2], 0, frame_hw[0], out=out[:, 1::2])
        return out


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
        raise MissingDependencyError(
            "resizing frames needs OpenCV or Pillow", hint="pip install opencv-python-headless (or pillow)"
        ) from None
    return np.asarray(Image.fromarray(img).resize((width, height), Image.Resampling.BILINEAR))


#: ITU-R BT.601 luma weights (R, G, B): what a grey model input is made of
LUMA = (0.299, 0.587, 0.114)


class Preprocessor:
    """Callable: HxWx3 uint8 frame in ``src_color`` order -> batch-of-1 tensor for the model (3 channels, or
    one luminance channel for ``color="GRAY"``, normalised with the first mean/std)."""

    def __init__(self, spec: PreprocessSpec, src_color: str = "RGB") -> None:
        self.spec = spec
        self.grey = spec.color == "GRAY"
        self.swap = src_color != spec.color and not self.grey
        self._luma = np.asarray(LUMA[::-1] if src_color == "BGR" else LUMA, dtype=np.float32)
        std = np.asarray(spec.std, dtype=np.float32)
        self._mul = (spec.scale / std).astype(np.float32)
        self._add = (-np.asarray(spec.mean, dtype=np.float32) / std).astype(np.float32)
        h, w = spec.size
        self.dtype = np.dtype(spec.dtype)
        c = 1 if self.grey else 3
        self.output_shape: tuple[int, ...] = (1, c, h, w) if spec.layout == "NCHW" else (1, h, w, c)
        self._hwc = np.empty((h, w, 3), dtype=np.float32)
        self._chw = np.empty((3, h, w), dtype=np.float32)
        self._canvas = np.full((h, w, 3), spec.pad_value, dtype=np.uint8)
        self._placed: tuple[int, int, int, int] | None = None  # where the last frame went on the canvas

    def new_output(self) -> np.ndarray:
        """A buffer of the model input's shape and dtype, for ``out=``."""
        return np.empty(self.output_shape, dtype=self.dtype)

    def __call__(self, frame: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, LetterboxTransform]:
        """Pre-process one frame into ``out`` (a fresh array when None) and say how to map boxes back."""
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            raise InputFileError(f"expected an HxWx3 uint8 frame, got {frame.dtype}{list(frame.shape)}")
        fh, fw = frame.shape[:2]
        h, w = self.spec.size
        if fh == 0 or fw == 0:
            raise InputFileError(f"empty frame ({fw}x{fh})")
        if self.spec.resize == "letterbox":
            scale = min(h / fh, w / fw)
            nw, nh = round(fw * scale), round(fh * scale)
            if nw < 1 or nh < 1:
                raise InputFileError(
                    f"a {fw}x{fh} frame cannot be letterboxed into the model's {w}x{h} input: its picture would be {nw}x{nh} pixels",
                    hint="crop the frames to a less extreme aspect ratio, or convert with --no-letterbox",
                )
            px, py = (w - nw) // 2, (h - nh) // 2
            canvas = self._canvas
            if self._placed != (px, py, nw, nh):  # the padding only changes when the geometry does
                canvas[...] = self.spec.pad_value
                self._placed = (px, py, nw, nh)
            canvas[py : py + nh, px : px + nw] = _resize(frame, nw, nh)
            img, tf = canvas, LetterboxTransform(scale, px, py)
        else:
            img = _resize(frame, w, h)
            tf = LetterboxTransform(w / fw, 0, 0, scale_y=h / fh)
        if out is None:
            # a fresh array: the caller may keep it while the next frame is prepared
            out = self.new_output()
        elif out.shape != self.output_shape or out.dtype != self.dtype:
            raise ValueError(f"out must be {self.dtype}{list(self.output_shape)}, got {out.dtype}{list(out.shape)}")
        if self.grey:
            y = img.astype(np.float32) @ self._luma
            y = y * self._mul[0] + self._add[0]
            np.copyto(out[0], y[None] if self.spec.layout == "NCHW" else y[..., None], casting="unsafe")
        elif self.spec.layout == "NCHW":
            direct = self.dtype == np.float32  # else compute in float32, then cast once
            planes = out[0] if direct else self._chw
            for c in range(3):
                src = img[..., 2 - c if self.swap else c]
                np.multiply(src, self._mul[c], out=planes[c], casting="unsafe")
                planes[c] += self._add[c]
            if not direct:
                np.copyto(out[0], planes, casting="unsafe")
        else:
            if self.swap:
                img = img[..., ::-1]
            direct = self.dtype == np.float32  # straight into the output; else in float32, then cast once
            hwc = out[0] if direct else self._hwc
            np.multiply(img, self._mul, out=hwc, casting="unsafe")
            hwc += self._add
            if not direct:
                np.copyto(out[0], hwc, casting="unsafe")
        return out, tf


def read_image(path: Path) -> np.ndarray:
    """An image file as HxWx3 uint8 RGB."""
    try:
        from PIL import Image
    except ImportError:
        raise MissingDependencyError(
            "reading calibration images needs Pillow", hint="pip install 'edgekit-ml[convert]'"
        ) from None
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
        base = np.stack(
            [
                (xx / max(width - 1, 1)) * rng.uniform(0, 255),
                (yy / max(height - 1, 1)) * rng.uniform(0, 255),
                np.full_like(xx, rng.uniform(0, 255)),
            ],
            axis=-1,
        )
        noise = rng.normal(0, 40, size=(height, width, 3))
        yield np.clip(base + noise, 0, 255).astype(np.uint8)
