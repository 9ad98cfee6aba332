"""Calibration and parity samples: a directory of .npy/.npz tensors or images, or generated ones.

Every file problem is collected and reported at once (file, expected, got).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from edge.errors import CalibrationError
from edge.preprocess import IMAGE_SUFFIXES, Preprocessor, random_frames, read_image
from edge.spec import Calibration, IOSpec, PreprocessSpec, TensorSpec

RANDOM = "random"
TENSOR_SUFFIXES = frozenset({".npy", ".npz"})


def generated_samples(io: IOSpec, pre: PreprocessSpec | None, count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Deterministic inputs: synthetic frames through the pre-processing for the image input,
    standard-normal floats (or zeros for integer tensors) for the others."""
    rng = np.random.default_rng(seed + 1)
    frames = None
    batch = 1
    if pre is not None:
        prep = Preprocessor(pre)
        batch = int(io.input(pre.input).shape[0])
        frames = (prep(f)[0] for f in random_frames(count * batch, pre.size[0], pre.size[1], seed))
    samples = []
    for _ in range(count):
        sample: dict[str, np.ndarray] = {}
        for t in io.inputs:
            if frames is not None and pre is not None and t.name == pre.input:
                sample[t.name] = np.concatenate([next(frames) for _ in range(batch)]) if batch > 1 else next(frames)
            elif np.issubdtype(np.dtype(t.dtype), np.floating):
                sample[t.name] = rng.standard_normal(t.shape).astype(t.dtype)
            else:
                sample[t.name] = np.zeros(t.shape, dtype=t.dtype)
        samples.append(sample)
    return samples


def load_calibration(source: str | os.PathLike[str], io: IOSpec, pre: PreprocessSpec | None,
                     *, limit: int = 128, random_count: int = 32) -> Calibration:
    """Read calibration samples for ``io``. ``source`` is a directory or the word ``random``."""
    if str(source) == RANDOM:
        return Calibration(RANDOM, "random", random_count, tuple(generated_samples(io, pre, random_count)))
    d = Path(source)
    if not d.is_dir():
        raise CalibrationError(f"calibration directory {d} does not exist",
                               hint="pass a directory of .npy/.npz tensors or images, or --calib random")
    files = sorted(p for p in d.iterdir() if p.is_file() and p.suffix.lower() in TENSOR_SUFFIXES | IMAGE_SUFFIXES)
    if not files:
        raise CalibrationError(f"calibration directory {d} holds no .npy, .npz or image files")
    images = [f for f in files if f.suffix.lower() in IMAGE_SUFFIXES]
    tensors = [f for f in files if f.suffix.lower() in TENSOR_SUFFIXES]
    if images and tensors:
        raise CalibrationError(f"calibration directory {d} mixes images and tensors; use one kind")
    problems: list[str] = []
    samples: list[dict[str, np.ndarray]] = []
    if images:
        if pre is None:
            raise CalibrationError(f"calibration images in {d}, but the model has no image input to pre-process "
                                   f"(inputs: {', '.join(t.describe() for t in io.inputs)})",
                                   hint="give .npy/.npz tensors instead")
        if len(io.inputs) > 1:
            raise CalibrationError(f"calibration images in {d}, but the model has {len(io.inputs)} inputs",
                                   hint="give one .npz per sample with an array per input name")
        prep = Preprocessor(pre)
        for f in images[:limit]:
            samples.append({pre.input: prep(read_image(f))[0]})
        kind = "images"
    else:
        for f in tensors:
            if len(samples) >= limit:
                break
            try:
                samples.extend(_tensor_samples(f, io))
            except CalibrationError as e:
                problems.append(e.message)
        kind = "tensors"
        if problems:
            raise CalibrationError(f"bad calibration data in {d}: " + "; ".join(problems))
    samples = samples[:limit]
    return Calibration(str(d), kind, len(samples), tuple(samples))


def _tensor_samples(f: Path, io: IOSpec) -> list[dict[str, np.ndarray]]:
    try:
        data: Any = np.load(f, allow_pickle=False)
    except Exception as e:
        raise CalibrationError(f"{f.name}: cannot be read as numpy data ({e})") from None
    if isinstance(data, np.ndarray):
        if len(io.inputs) != 1:
            raise CalibrationError(f"{f.name}: a .npy holds one array but the model has inputs "
                                   f"{[t.name for t in io.inputs]}; use .npz with one array per input")
        arrays = {io.inputs[0].name: data}
    else:
        with data:
            arrays = {k: data[k] for k in data.files}
        missing = [t.name for t in io.inputs if t.name not in arrays]
        extra = [k for k in arrays if k not in {t.name for t in io.inputs}]
        if missing or extra:
            raise CalibrationError(f"{f.name}: arrays {sorted(arrays)} do not match the inputs "
                                   f"{[t.name for t in io.inputs]}" + (f" (missing {missing})" if missing else ""))
    per_input = {t.name: _split(f, t, arrays[t.name]) for t in io.inputs}
    counts = {len(v) for v in per_input.values()}
    if len(counts) != 1:
        raise CalibrationError(f"{f.name}: inputs hold different sample counts {sorted(counts)}")
    n = counts.pop()
    return [{name: arrs[i] for name, arrs in per_input.items()} for i in range(n)]


def _split(f: Path, t: TensorSpec, a: np.ndarray) -> list[np.ndarray]:
    """A sample of the input's shape, the shape without its batch dim, or a stack of samples."""
    shape = tuple(int(x) for x in t.shape)
    if a.dtype != np.dtype(t.dtype):
        raise CalibrationError(f"{f.name}: input {t.name!r} dtype {a.dtype}, expected {t.dtype}",
                               hint=f"save it with .astype('{t.dtype}')")
    if a.shape == shape:
        return [a]
    if a.shape == shape[1:] and shape[0] == 1:
        return [a[None]]
    if shape[0] == 1 and a.ndim == len(shape) and a.shape[1:] == shape[1:]:
        return [a[i:i + 1] for i in range(a.shape[0])]
    raise CalibrationError(f"{f.name}: input {t.name!r} shape {list(a.shape)}, expected {list(shape)} "
                           f"(or {list(shape[1:])}, or a stack [N, ...])")
