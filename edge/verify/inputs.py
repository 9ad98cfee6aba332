"""Calibration and parity samples: a directory of .npy/.npz tensors or images, or generated ones.

Every file problem is collected and reported at once (file, expected, got).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from edge.errors import CalibrationError, EdgeError
from edge.preprocess import IMAGE_SUFFIXES, Preprocessor, read_image
from edge.spec import Calibration, IOSpec, PreprocessSpec, TensorSpec, image_channels, image_layout
from edge.verify import natural

#: the command-line flag that gives calibration data (convert, deploy, tune, fleet tune): every hint names it from here
CALIB_FLAG = "--calib"

RANDOM = "random"
TENSOR_SUFFIXES = frozenset({".npy", ".npz"})


#: input names that carry recurrent state: zeros are the state a stream starts from
_STATE = re.compile(r"(^|_)(state|states|h0|c0|hidden|cache|past|memory)(_|$|n$|\d)", re.I)
_SAMPLE_RATE = re.compile(r"(sr|sample_?rate|sampling_?rate|fs)", re.I)
_AUDIO = re.compile(r"audio|wav|pcm|speech|waveform|signal", re.I)
_IDS = re.compile(r"(^|_)(input_ids|ids|tokens?|token_ids)\Z", re.I)
#: an integer input named like raw bytes (a content-type classifier reads a file's bytes as 0..255 ids)
_BYTES = re.compile(r"(^|_)(bytes?|byte_ids|raw_bytes|byte_values)\Z", re.I)
_MASK = re.compile(r"mask", re.I)
_TYPES = re.compile(r"token_type|segment", re.I)
_POSITIONS = re.compile(r"position", re.I)
#: a 1-channel plane named like audio features: a spectrogram, not a picture
_SPECTRAL = re.compile(r"mel|spec|fbank|filterbank|mfcc|feat|audio|speech|wav|sound", re.I)
#: the smallest side of a plane generated as a picture or a spectrogram (below: a feature map, standard normal)
MIN_PLANE = 8
#: what a sample-rate input gets: the rate speech models are trained at
SAMPLE_RATE = 16000
#: token ids drawn for an id input: low ids are the common tokens of any vocabulary
MAX_TOKEN_ID = 1000


def _audio_length(t: TensorSpec, io: IOSpec) -> int | None:
    """The samples per window of an audio-shaped float input ([1, L] / [1, 1, L]), or None."""
    shape = [int(d) for d in t.shape]
    if not np.issubdtype(np.dtype(t.dtype), np.floating) or not shape or shape[0] != 1:
        return None
    if len(shape) == 2 or (len(shape) == 3 and shape[1] == 1):
        n = shape[-1]
        has_rate = any(_SAMPLE_RATE.fullmatch(x.name) for x in io.inputs)
        if n >= 64 and (has_rate or _AUDIO.search(t.name)) or (len(shape) == 3 and n >= 1024):
            return n
    return None


def _sample_rate(io: IOSpec) -> int:
    return SAMPLE_RATE


def describe_generated(io: IOSpec, pre: PreprocessSpec | None) -> dict[str, str]:
    """Per input, what :func:`generated_samples` feeds it (recorded in the manifest)."""
    out = {}
    for t in io.inputs:
        out[t.name] = _kind(t, io, pre)
    return out


def _kind(t: TensorSpec, io: IOSpec, pre: PreprocessSpec | None) -> str:
    if pre is not None and t.name == pre.input:
        return f"natural-image frames (1/f texture, shapes, text) through the {pre.preset} pre-processing"
    floating = np.issubdtype(np.dtype(t.dtype), np.floating)
    if floating and _audio_length(t, io):
        return f"speech-like audio at {_sample_rate(io)} Hz (voiced formants, fricatives, pauses)"
    plane = _plane(t)
    if plane is not None:
        return plane
    if _STATE.search(t.name):
        return "zeros (initial recurrent state)"
    if floating and t.quant is not None:
        lo, hi = t.quant_range or (0.0, 0.0)
        return f"uniform over the quantized input's levels {t.quant[2]}..{t.quant[3]} (floats {lo:.4g}..{hi:.4g})"
    if floating:
        return "standard normal"
    if _SAMPLE_RATE.fullmatch(t.name):
        return f"sample rate {SAMPLE_RATE}"
    if _MASK.search(t.name):
        return "ones (mask)"
    if _TYPES.search(t.name):
        return "zeros (token types)"
    if _POSITIONS.search(t.name):
        return "positions 0..n-1"
    if _IDS.search(t.name):
        return f"token ids in 1..{MAX_TOKEN_ID - 1}"
    if _BYTES.search(t.name) and t.shape and isinstance(t.shape[-1], int) and t.shape[-1] >= 16:
        return "file-like bytes in 0..255 (text, markup, source code, binary headers and data)"
    return "zeros"


def _plane(t: TensorSpec) -> str | None:
    """What an image-shaped input with no declared pre-processing gets: its own shape, layout and dtype,
    in a range its dtype makes plausible (no mean/std is guessed), or None when it is not image-shaped."""
    channels = image_channels(t)
    floating = np.issubdtype(np.dtype(t.dtype), np.floating)
    if channels is None or not (floating or t.dtype == "uint8"):
        return None
    layout = image_layout(t.shape)
    h, w = (int(t.shape[2]), int(t.shape[3])) if layout == "NCHW" else (int(t.shape[1]), int(t.shape[2]))
    if min(h, w) < MIN_PLANE:
        return None
    where = f"{channels} channel{'s' if channels > 1 else ''}, {layout}"
    if channels == 1 and floating and _SPECTRAL.search(t.name):
        return f"log-mel spectrogram of speech-like audio, standardised (time x frequency; {where})"
    span = "0..1" if floating else "0..255"
    grey = "grey " if channels == 1 else ""
    return f"{grey}natural-image frames in {span} ({where}; no pre-processing declared)"


def _plane_value(t: TensorSpec, kind: str, rng: np.random.Generator) -> np.ndarray:
    """One sample for :func:`_plane`'s kinds."""
    shape = tuple(int(d) for d in t.shape)
    nchw = image_layout(shape) == "NCHW"
    n, c, h, w = (shape[0], shape[1], shape[2], shape[3]) if nchw else (shape[0], shape[3], shape[1], shape[2])
    if kind.startswith("log-mel"):
        planes = np.stack([log_mel(h, w, SAMPLE_RATE, rng) for _ in range(n)])[:, None]  # N,1,T,F
    else:
        frames = np.stack(list(natural_frames(n, h, w, int(rng.integers(0, 2**31))))).astype(np.float32)  # N,H,W,3
        if c == 1:
            frames = frames @ np.asarray([0.299, 0.587, 0.114], np.float32)[:, None]
        planes = frames.transpose(0, 3, 1, 2)  # N,C,H,W
        if np.issubdtype(np.dtype(t.dtype), np.floating):
            planes = planes / 255.0
    out = planes if nchw else planes.transpose(0, 2, 3, 1)
    return np.ascontiguousarray(out).astype(t.dtype)


def log_mel(frames: int, bands: int, rate: int, rng: np.random.Generator) -> np.ndarray:
    """A ``frames`` x ``bands`` log-mel spectrogram (25 ms windows, 10 ms hop) of :func:`speech_like` audio,
    standardised to zero mean and unit variance: what keyword spotters and audio classifiers are fed."""
    win, hop = int(0.025 * rate), int(0.010 * rate)
    n_fft = 1 << (win - 1).bit_length()
    audio = speech_like(win + hop * (frames - 1), rate, rng).astype(np.float64)
    idx = np.arange(win)[None, :] + hop * np.arange(frames)[:, None]
    power = np.abs(np.fft.rfft(audio[idx] * np.hanning(win), n=n_fft)) ** 2

    def mel(f: float) -> float:
        return float(2595.0 * np.log10(1.0 + f / 700.0))

    edges = 700.0 * (10 ** (np.linspace(mel(20.0), mel(rate / 2), bands + 2) / 2595.0) - 1)
    bins = np.fft.rfftfreq(n_fft, 1.0 / rate)
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    fb = np.clip(np.minimum((bins - lo) / (mid - lo), (hi - bins) / (hi - mid)), 0, None)
    fb[np.arange(bands), np.abs(bins[None, :] - mid).argmin(axis=1)] += 1.0  # a low band narrower than a bin
    spec = np.log(power @ fb.T + 1e-6)
    result: np.ndarray = ((spec - spec.mean()) / (spec.std() + 1e-9)).astype(np.float32)
    return result


def _value(t: TensorSpec, kind: str, rng: np.random.Generator) -> np.ndarray:
    shape, dtype = tuple(int(d) for d in t.shape), np.dtype(t.dtype)
    if kind.startswith(("log-mel", "natural-image", "grey natural-image")):
        return _plane_value(t, kind, rng)
    if kind.startswith("speech-like"):
        n = shape[-1]
        return speech_like(n, SAMPLE_RATE, rng).reshape(shape).astype(dtype)
    if kind == "standard normal":
        return rng.standard_normal(shape).astype(dtype)
    if kind.startswith("uniform over the quantized") and t.quant is not None:
        # every integer level equally likely, as floats the runner quantizes back exactly: standard-normal floats
        # cast into an int8 input with zero point -128 sit on its lowest levels (microWakeWord: issue #23)
        scale, zp, qlo, qhi = t.quant
        return (scale * (rng.integers(qlo, qhi + 1, size=shape) - zp)).astype(dtype)
    if kind.startswith("sample rate"):
        return np.full(shape, SAMPLE_RATE, dtype=dtype)
    if kind.startswith("ones"):
        return np.ones(shape, dtype=dtype)
    if kind.startswith("positions"):
        result: np.ndarray = np.broadcast_to(np.arange(shape[-1] if shape else 1), shape).astype(dtype).copy()
        return result
    if kind.startswith("token ids"):
        return rng.integers(1, MAX_TOKEN_ID, size=shape).astype(dtype)
    if kind.startswith("file-like bytes"):
        rows = [file_like_bytes(shape[-1], rng) for _ in range(int(np.prod(shape[:-1])))]
        return np.asarray(rows, np.int64).reshape(shape).astype(dtype)
    return np.zeros(shape, dtype=dtype)


#: the first bytes of common binary formats (PNG, JPEG, ZIP, PDF, ELF, gzip, RIFF/WAVE, SQLite)
_MAGIC = (
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
    b"\xff\xd8\xff\xe0\x00\x10JFIF\x00",
    b"PK\x03\x04\x14\x00\x00\x00\x08\x00",
    b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n",
    b"\x7fELF\x02\x01\x01\x00",
    b"\x1f\x8b\x08\x00",
    b"RIFF\x24\x08\x00\x00WAVEfmt ",
    b"SQLite format 3\x00",
)
_WORDS = (
    "the data model input output value file line error return import def class for while if else true false "
    "null name type size time edge device model bundle target parity"
).split()


def file_like_bytes(n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` bytes that look like a file's: prose, JSON, HTML, Python source, or a binary format's header followed
    by structured data (small integers, repeats, zero runs) or compressed-looking noise. A byte-level classifier
    fed zeros (or uniform noise) sees one class every time, and parity then compares nothing."""
    kind = int(rng.integers(0, 6))
    words = [_WORDS[i] for i in rng.integers(0, len(_WORDS), size=n // 3 + 8)]
    if kind == 0:
        text = " ".join(words).capitalize() + ".\n"
    elif kind == 1:
        text = "{" + ", ".join(f'"{a}": {int(rng.integers(0, 999))}' for a in words) + "}\n"
    elif kind == 2:
        text = "<html><body>" + "".join(f'<p class="{a}">{b}</p>\n' for a, b in zip(words, words[1:])) + "</body>"
    elif kind == 3:
        text = "".join(f"def {a}_{b}(x):\n    return x.{a}\n\n" for a, b in zip(words, words[1:]))
    if kind <= 3:
        data = np.frombuffer(text.encode("ascii"), np.uint8)
    else:
        head = np.frombuffer(_MAGIC[int(rng.integers(0, len(_MAGIC)))], np.uint8)
        if kind == 4:  # structured: small little-endian integers, runs of zeros, repeated records
            body = rng.integers(0, 16, size=n).astype(np.uint8) * (rng.random(n) < 0.6)
        else:  # compressed or encrypted content
            body = rng.integers(0, 256, size=n).astype(np.uint8)
        data = np.concatenate([head, body])
    out: np.ndarray = np.resize(data, n).astype(np.int64)
    return out


def generated_samples(io: IOSpec, pre: PreprocessSpec | None, count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Deterministic inputs that look like the model's data, per input (:func:`describe_generated`):
    the image input gets natural-image frames (1/f texture, flat shapes with edges, lines of text)
    through the bundle's pre-processing; an audio-shaped input speech-like audio; a sample-rate input
    16000; recurrent state zeros; masks ones, token ids low ids; other floats standard normal.

    Uniform noise is not what a model sees: a DBNet text detector's probability map is ~1e-6 everywhere
    on it, and parity then measures rounding (issue 13)."""
    rng = np.random.default_rng(seed + 1)
    frames = None
    batch = 1
    if pre is not None:
        prep = Preprocessor(pre)
        batch = int(io.input(pre.input).shape[0])
        frames = (prep(f)[0] for f in natural_frames(count * batch, pre.size[0], pre.size[1], seed))
    kinds = {t.name: _kind(t, io, pre) for t in io.inputs}
    samples = []
    for _ in range(count):
        sample: dict[str, np.ndarray] = {}
        for t in io.inputs:
            if frames is not None and pre is not None and t.name == pre.input:
                sample[t.name] = np.concatenate([next(frames) for _ in range(batch)]) if batch > 1 else next(frames)
            else:
                sample[t.name] = _value(t, kinds[t.name], rng)
        samples.append(sample)
    return samples


def _pink(rng: np.random.Generator, h: int, w: int, alpha: float = 1.0) -> np.ndarray:
    """A field with a 1/f^alpha amplitude spectrum (natural images: alpha ~ 1), zero mean, unit std."""
    fy = np.fft.fftfreq(h)[:, None]
    fx = np.fft.rfftfreq(w)[None, :]
    f = np.sqrt(fx * fx + fy * fy)
    f[0, 0] = 1.0
    spec = (rng.standard_normal(f.shape) + 1j * rng.standard_normal(f.shape)) / f**alpha
    spec[0, 0] = 0.0
    x = np.fft.irfft2(spec, s=(h, w))
    result: np.ndarray = (x - x.mean()) / (x.std() + 1e-12)
    return result


def natural_frames(count: int, height: int, width: int, seed: int = 0) -> Iterator[np.ndarray]:
    """Deterministic HxWx3 uint8 RGB frames with natural-image statistics: a 1/f colour texture, flat
    shapes with hard edges, and dark text on light patches (a text line filling the frame when the frame
    is line-shaped, as an OCR recognizer sees it). Text needs Pillow; without it, stroke-like bars."""
    rng = np.random.default_rng(seed)
    line = height <= 64 and width >= 2 * height
    for i in range(count):
        lum = _pink(rng, height, width)
        base = rng.uniform(60, 200, 3)
        tint = rng.uniform(-0.3, 0.3, 3)
        img = (
            base
            + 45 * lum[..., None] * (1 + tint)
            + 12 * np.stack([_pink(rng, height, width, 1.5) for _ in range(3)], -1)
        )
        for _ in range(int(rng.integers(2, 7))):  # flat shapes: edges and corners
            _shape(img, rng)
        if line or i % 4 != 3:  # most frames carry text, as documents, signs and screens do
            _text(img, rng, line)
        img += rng.normal(0, 3, img.shape)
        yield np.clip(img, 0, 255).astype(np.uint8)


def _shape(img: np.ndarray, rng: np.random.Generator) -> None:
    h, w = img.shape[:2]
    cy, cx = rng.uniform(0, h), rng.uniform(0, w)
    ry, rx = rng.uniform(0.05, 0.3) * h, rng.uniform(0.05, 0.3) * w
    yy, xx = np.ogrid[0:h, 0:w]
    if rng.random() < 0.5:
        mask = (np.abs(yy - cy) < ry) & (np.abs(xx - cx) < rx)
    else:
        mask = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 < 1
    img[mask] = rng.uniform(0, 255, 3) + rng.normal(0, 4, (int(mask.sum()), 3))


def _text(img: np.ndarray, rng: np.random.Generator, line: bool) -> None:
    """Dark words on a light patch (or a whole light line), drawn where Pillow is installed."""
    import string

    h, w = img.shape[:2]
    alphabet = list(string.ascii_letters + string.digits)
    if line:
        y0, x0, ph, pw = 0, 0, h, w
    else:
        ph, pw = int(rng.uniform(0.25, 0.7) * h), int(rng.uniform(0.35, 0.9) * w)
        y0, x0 = int(rng.integers(0, max(1, h - ph))), int(rng.integers(0, max(1, w - pw)))
    paper = rng.uniform(185, 250)
    ink = rng.uniform(0, 60)
    patch = np.full((ph, pw), paper)
    size = max(8, int(ph * rng.uniform(0.45, 0.7))) if line else max(8, int(rng.uniform(0.025, 0.06) * min(h, w)))
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError:  # bars of glyph size instead of letters
        for y in range(size // 2, ph - size, int(size * 1.6)):
            x = size // 2
            while x < pw - size:
                gw = int(rng.integers(2, 5)) * size // 4
                patch[y : y + size, x : x + max(1, size // 6)] = ink
                patch[y + size // 2 : y + size // 2 + max(1, size // 8), x : x + gw] = ink
                x += gw + size // 2
        img[y0 : y0 + ph, x0 : x0 + pw] = patch[..., None]
        return
    canvas = Image.fromarray(patch.astype(np.uint8))
    draw = ImageDraw.Draw(canvas)
    font = ImageFont.load_default(size=size)
    y = int(rng.integers(0, max(1, ph // 6))) if not line else (ph - size) // 2 - size // 8
    while y + size <= ph or (line and y < ph // 2):
        words: list[str] = []
        x = int(rng.integers(1, max(2, size)))
        while True:
            word = "".join(rng.choice(alphabet, size=int(rng.integers(2, 9))))
            if draw.textlength(" ".join([*words, word]), font=font) > pw - x - 2:
                break
            words.append(word)
        draw.text((x, y), " ".join(words) or word[:2], fill=int(ink), font=font)
        if line:
            break
        y += int(size * rng.uniform(1.3, 1.8))
    img[y0 : y0 + ph, x0 : x0 + pw] = np.asarray(canvas, dtype=np.float64)[..., None]


def speech_like(n: int, rate: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` samples of a speech-like float signal in [-1, 1] at ``rate`` Hz: voiced stretches (a glottal
    pulse train at a gliding pitch through three moving formant resonators), fricative noise bursts and
    pauses, under a syllable-rate (~4 Hz) envelope, peaking around 0.3."""
    t = np.arange(n) / rate
    out = np.zeros(n)
    f0 = rng.uniform(90, 240) * (1 + 0.1 * np.sin(2 * np.pi * rng.uniform(0.5, 3) * t + rng.uniform(0, 6)))
    phase = np.cumsum(f0 / rate)
    pulses = np.diff(np.floor(phase), prepend=0.0)  # one impulse per pitch period
    voiced = pulses
    for lo, hi in ((300, 900), (900, 2400), (2400, 3200)):
        fc = rng.uniform(lo, min(hi, rate / 2 - 200))
        bw = rng.uniform(60, 160)
        voiced_f = _resonate(voiced, fc, bw, rate)
        out += voiced_f / (np.abs(voiced_f).max() + 1e-9) * rng.uniform(0.3, 1.0)
    syll = np.clip(np.sin(2 * np.pi * rng.uniform(3, 6) * t + rng.uniform(0, 6)), 0, None) ** 0.7
    out *= syll
    noise = rng.standard_normal(n)
    fric = _resonate(noise, min(rate / 2 - 500, rng.uniform(3500, 6000)), 1500, rate)
    gate = (np.sin(2 * np.pi * rng.uniform(1, 3) * t + rng.uniform(0, 6)) > 0.7).astype(float)
    out += 0.4 * fric / (np.abs(fric).max() + 1e-9) * gate
    if rng.random() < 0.3:  # a pause: near-silence with room noise
        a = int(rng.integers(0, n // 2))
        out[a : a + n // 3] *= 0.02
    out += 0.002 * noise
    result: np.ndarray = (out / (np.abs(out).max() + 1e-9) * rng.uniform(0.1, 0.5)).astype(np.float32)
    return result


def _resonate(x: np.ndarray, fc: float, bw: float, rate: int) -> np.ndarray:
    """A two-pole resonator (a formant) at ``fc`` Hz, bandwidth ``bw`` Hz."""
    r = math.exp(-math.pi * bw / rate)
    a1, a2 = -2 * r * math.cos(2 * math.pi * fc / rate), r * r
    y = np.zeros_like(x)
    y1 = y2 = 0.0
    for i, v in enumerate(x):  # n is a window (a few thousand samples): a loop is fast enough
        y0 = v - a1 * y1 - a2 * y2
        y[i] = y0
        y2, y1 = y1, y0
    return y


def load_calibration(
    source: str | os.PathLike[str], io: IOSpec, pre: PreprocessSpec | None, *, limit: int = 128, random_count: int = 32
) -> Calibration:
    """Read calibration samples for ``io``. ``source`` is a directory (or one file) of .npy/.npz tensors,
    images, .wav audio or .txt token ids, or the word ``random``."""
    if str(source) == RANDOM:
        return Calibration(RANDOM, "random", random_count, tuple(generated_samples(io, pre, random_count)))
    samples, kind = read_samples(source, io, pre, limit=limit, what="calibration")
    return Calibration(str(Path(source)), kind, len(samples), tuple(samples))  # type: ignore[arg-type]


def natural_samples(
    io: IOSpec, pre: PreprocessSpec | None, split: natural.Split, *, calibrating: bool
) -> tuple[list[dict[str, np.ndarray]], str | None]:
    """The shipped natural images of ``split`` (``edge.verify.natural``) through ``pre`` into the image input, the
    other inputs as :func:`generated_samples` feeds them; ([], why not) where they do not apply: no image input with
    pre-processing, no Pillow, or (``calibrating``) another float input that generated values would calibrate."""
    if pre is None:
        return [], "the model has no image input with pre-processing"
    why = natural.available()
    if why is not None:
        return [], why
    others = [t for t in io.inputs if t.name != pre.input]
    if calibrating and any(_kind(t, io, pre) == "standard normal" for t in others):
        return [], f"the model has {len(io.inputs)} inputs, and images feed one"
    prep = Preprocessor(pre)
    rng = np.random.default_rng(7)
    kinds = {t.name: _kind(t, io, pre) for t in others}
    batch = max(1, int(io.input(pre.input).shape[0]))
    frames = [prep(f)[0] for f in natural.frames(split)]
    return [
        {
            pre.input: np.concatenate(frames[i : i + batch]) if batch > 1 else frames[i],
            **{t.name: _value(t, kinds[t.name], rng) for t in others},
        }
        for i in range(0, len(frames) - batch + 1, batch)
    ], None


def default_calibration(io: IOSpec, pre: PreprocessSpec | None) -> tuple[Calibration | None, str | None]:
    """Calibration when the user gives none: edgekit's natural calibration images (recorded with their files,
    hashes and licences), or (None, why they do not apply)."""
    samples, why = natural_samples(io, pre, "calibration", calibrating=True)
    if not samples:
        return None, why or "the input's batch holds more images than edgekit ships"
    return (
        Calibration(
            natural.source_line("calibration"),
            natural.KIND,
            len(samples),
            tuple(samples),
            files=tuple(natural.record("calibration")),
        ),
        None,
    )


AUDIO_SUFFIXES = frozenset({".wav"})
TEXT_SUFFIXES = frozenset({".txt"})
DATA_SUFFIXES = TENSOR_SUFFIXES | IMAGE_SUFFIXES | AUDIO_SUFFIXES | TEXT_SUFFIXES


def read_samples(
    source: str | os.PathLike[str],
    io: IOSpec,
    pre: PreprocessSpec | None,
    *,
    limit: int = 128,
    what: str = "calibration",
) -> tuple[list[dict[str, np.ndarray]], str]:
    """Samples for ``io`` from a directory or one file, and their kind: .npy/.npz tensors (every input),
    images (the image input, through ``pre``), 16-bit PCM .wav (windows for an audio-shaped input) or .txt
    (one sequence of whitespace-separated token ids a line, for an integer input). Inputs a file does not
    feed (a sample rate, a recurrent state) get :func:`generated_samples`' values. Every bad file is
    reported at once."""
    files, where, kind = _data_files(Path(source), what)
    problems: list[str] = []
    samples: list[dict[str, np.ndarray]] = []
    if kind == "images":
        samples = _image_samples(files[:limit], io, pre, f"{what} images in {where}", problems)
    elif kind == "audio":
        samples = _audio_samples(files, io, f"{what} audio in {where}", limit, problems)
    elif kind == "text":
        samples = _text_samples(files, io, pre, f"{what} text in {where}", problems)
    else:
        for f in files:
            if len(samples) >= limit:
                break
            try:
                samples.extend(_tensor_samples(f, io))
            except CalibrationError as e:
                problems.append(e.message)
    if problems:
        raise CalibrationError(f"bad {what} data in {where}: " + "; ".join(problems))
    samples = samples[:limit]
    missing = [t for t in io.inputs if samples and t.name not in samples[0]]
    if missing:  # a sample rate, a state, a mask: what the files do not carry
        rng = np.random.default_rng(7)
        for s in samples:
            for t in missing:
                s[t.name] = _value(t, _kind(t, io, pre), rng)
    return samples, kind


def _data_files(d: Path, what: str) -> tuple[list[Path], Path, str]:
    """(the data files, where they are, their one kind: tensors, images, audio or text); refused when there are
    none, or of several kinds."""
    if d.is_file():
        files = [d]
    elif d.is_dir():
        files = sorted(p for p in d.iterdir() if p.is_file() and p.suffix.lower() in DATA_SUFFIXES)
    else:
        raise CalibrationError(
            f"{what} directory {d} does not exist",
            hint="pass a directory of .npy/.npz tensors, images, .wav or .txt files"
            + (f", or {CALIB_FLAG} random" if what == "calibration" else ""),
        )
    if not files:
        raise CalibrationError(f"{what} directory {d} holds no .npy, .npz or image files (nor .wav, .txt)")
    kinds = {
        (
            "tensors"
            if f.suffix.lower() in TENSOR_SUFFIXES
            else "images"
            if f.suffix.lower() in IMAGE_SUFFIXES
            else "audio"
            if f.suffix.lower() in AUDIO_SUFFIXES
            else "text"
            if f.suffix.lower() in TEXT_SUFFIXES
            else "?"
        )
        for f in files
    }
    if "?" in kinds:
        raise CalibrationError(f"{what} file {d.name}: not .npy, .npz, an image, .wav or .txt")
    if len(kinds) > 1:
        if kinds == {"images", "tensors"}:
            raise CalibrationError(f"{what} directory {d} mixes images and tensors; use one kind")
        raise CalibrationError(f"{what} directory {d} mixes {', '.join(sorted(kinds))}; use one kind")
    return files, d, kinds.pop()


def _image_samples(
    files: list[Path], io: IOSpec, pre: PreprocessSpec | None, label: str, problems: list[str]
) -> list[dict[str, np.ndarray]]:
    """Each image through ``pre`` into the image input (``label``: "calibration images in DIR")."""
    if pre is None:
        raise CalibrationError(
            f"{label}, but the model has no image input to pre-process (inputs: {', '.join(t.describe() for t in io.inputs)})",
            hint="give .npy/.npz tensors instead",
        )
    others = [t for t in io.inputs if t.name != pre.input]
    if others and label.startswith("calibration ") and any(_kind(t, io, pre) == "standard normal" for t in others):
        raise CalibrationError(
            f"{label}, but the model has {len(io.inputs)} inputs",
            hint="give one .npz per sample with an array per input name",
        )
    prep = Preprocessor(pre)
    samples: list[dict[str, np.ndarray]] = []
    for f in files:
        try:
            samples.append({pre.input: prep(read_image(f))[0]})
        except EdgeError as e:
            problems.append(e.message)
    return samples


def _audio_samples(
    files: list[Path], io: IOSpec, label: str, limit: int, problems: list[str]
) -> list[dict[str, np.ndarray]]:
    """Windows of each .wav at the audio input's length (the last one zero-padded)."""
    target = next(((t, n) for t in io.inputs if (n := _audio_length(t, io))), None)
    if target is None:
        raise CalibrationError(
            f"{label}, but no input looks like audio (inputs: {', '.join(t.describe() for t in io.inputs)})",
            hint="an audio input is float [1, L] with a sample-rate input beside it, or "
            "named audio/wav/pcm/speech/waveform; or give .npy/.npz tensors",
        )
    t, n = target
    samples: list[dict[str, np.ndarray]] = []
    for f in files:
        try:
            wave_ = read_wav(f, SAMPLE_RATE)
        except CalibrationError as e:
            problems.append(e.message)
            continue
        for start in range(0, max(1, len(wave_) - n + 1), n):
            chunk = np.zeros(n, np.float32)
            piece = wave_[start : start + n]
            chunk[: len(piece)] = piece
            samples.append({t.name: chunk.reshape(tuple(int(x) for x in t.shape)).astype(t.dtype)})
            if len(samples) >= limit:
                break
    return samples


def _text_samples(
    files: list[Path], io: IOSpec, pre: PreprocessSpec | None, label: str, problems: list[str]
) -> list[dict[str, np.ndarray]]:
    """One sample per non-empty line of token ids, into the one token-id input (cut or zero-padded)."""
    ints = [
        t
        for t in io.inputs
        if not np.issubdtype(np.dtype(t.dtype), np.floating) and _kind(t, io, pre).startswith("token ids")
    ]
    if len(ints) != 1:
        raise CalibrationError(
            f"{label}: one token-id input is needed, the model has {', '.join(t.describe() for t in io.inputs)}",
            hint="each .txt line is a sequence of token ids for the model's id input; or give .npz tensors",
        )
    t = ints[0]
    length = int(t.shape[-1])
    samples: list[dict[str, np.ndarray]] = []
    for f in files:
        for i, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                ids = [int(x) for x in line.replace(",", " ").split()]
            except ValueError:
                problems.append(f"{f.name}:{i}: not whitespace-separated token ids")
                continue
            row = np.zeros(length, np.int64)
            row[: min(length, len(ids))] = ids[:length]
            samples.append({t.name: row.reshape(tuple(int(x) for x in t.shape)).astype(t.dtype)})
    return samples


def read_wav(path: Path, rate: int) -> np.ndarray:
    """A PCM .wav as mono float32 in [-1, 1] at ``rate`` Hz (linear resampling)."""
    import wave

    try:
        with wave.open(str(path), "rb") as w:
            ch, width, sr, n = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            raw = w.readframes(n)
    except (wave.Error, EOFError, OSError) as e:
        raise CalibrationError(f"{path.name}: cannot be read as a PCM .wav ({e})") from None
    dtypes = {1: np.uint8, 2: np.int16, 4: np.int32}
    if width not in dtypes:
        raise CalibrationError(f"{path.name}: {8 * width}-bit samples; 8, 16 or 32-bit PCM is read")
    x = np.frombuffer(raw, dtype=dtypes[width]).astype(np.float64)
    x = (x - 128) / 128 if width == 1 else x / float(2 ** (8 * width - 1))
    x = x.reshape(-1, ch).mean(axis=1)
    if sr != rate and len(x) > 1:
        n_out = int(round(len(x) * rate / sr))
        x = np.interp(np.linspace(0, len(x) - 1, n_out), np.arange(len(x)), x)
    result: np.ndarray = x.astype(np.float32)
    return result


@dataclass(frozen=True)
class ParityInputs:
    """The inputs parity runs on, where they came from, and the calibration the converter gets (int8: with
    the parity samples held out, so the gate does not grade the quantizer on what it was tuned to)."""

    samples: list[dict[str, np.ndarray]]
    label: str  # ParityReport.inputs
    provenance: dict[str, Any]  # manifest parity.input_provenance
    calibration: Calibration | None


def _digest(sample: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(sample):
        a = np.ascontiguousarray(sample[k])
        h.update(k.encode() + str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
    return h.hexdigest()


def choose_parity_inputs(
    io: IOSpec,
    pre: PreprocessSpec | None,
    *,
    count: int,
    parity_data: str | os.PathLike[str] | None = None,
    calibration: Calibration | None = None,
    quantized: bool = False,
    seed: int = 1234,
) -> ParityInputs:
    """Parity inputs in order of preference: the user's ``parity_data``; their calibration data (for a
    ``quantized`` conversion, a quarter of it held out of calibration, at most ``count``); else generated
    to look like the model's data: edgekit's natural parity images (``edge.verify.natural``: disjoint by file from
    its natural calibration images) where the model has an image input, topped up to ``count`` with
    :func:`generated_samples`. With calibration,
    any calibration sample equal to a parity sample is dropped from calibration, so the two are disjoint
    by content, and the provenance says so."""
    generated = describe_generated(io, pre)
    user_cal = calibration is not None and calibration.kind not in (RANDOM, natural.KIND) and bool(calibration.samples)
    note = None
    if parity_data is not None:
        samples, kind = read_samples(parity_data, io, pre, limit=count, what="parity data")
        prov: dict[str, Any] = {"kind": "parity-data", "source": str(parity_data)}
        label = f"parity data ({kind})"
    elif user_cal and not quantized:
        assert calibration is not None
        samples = [dict(s) for s in calibration.samples[:count]]
        prov, label = {"kind": "calibration", "source": calibration.source}, f"calibration ({calibration.kind})"
    elif user_cal and len(calibration.samples) >= 2:  # type: ignore[union-attr]
        assert calibration is not None
        n = len(calibration.samples)
        k = min(count, max(n // 4, min(4, n // 2)))  # a quarter; at least 4 while half stays for calibration
        samples = [dict(s) for s in calibration.samples[n - k :]]
        calibration = dataclasses.replace(calibration, count=n - k, samples=tuple(calibration.samples[: n - k]))
        prov = {"kind": "calibration-held-out", "source": calibration.source}
        label = f"calibration ({calibration.kind})"  # the provenance says which were held out
        note = f"{k} of the {n} calibration samples held out of calibration for parity"
    else:
        samples, prov, label = [], {"kind": "generated"}, "generated"
        if user_cal:
            note = "one calibration sample cannot be split: parity runs on generated inputs"
        else:
            samples = natural_samples(io, pre, "parity", calibrating=False)[0][:count]
            if samples:
                prov = {"kind": natural.KIND, "source": natural.source_line("parity")}
                label = f"natural images ({len(samples)})"
    # the user's own data is not topped up with generated inputs: theirs may differ (a scale input in 0.5..1.5
    # where generated floats are standard normal), and the comparison would leave the calibrated range
    made = max(0, count - len(samples)) if prov["kind"] in ("generated", natural.KIND) else 0
    if made:
        samples += generated_samples(io, pre, made, seed=seed)
        if prov["kind"] != "generated":
            label = f"{label} + {made} generated"
    disjoint = None
    if quantized and calibration is not None and calibration.samples:
        seen = {_digest(s) for s in samples}
        kept = tuple(s for s in calibration.samples if _digest(s) not in seen)
        if len(kept) < len(calibration.samples):
            dropped = len(calibration.samples) - len(kept)
            note = (note + "; " if note else "") + f"{dropped} calibration sample(s) equal to parity samples dropped"
            calibration = dataclasses.replace(calibration, count=len(kept), samples=kept)
        disjoint = True
    prov.update(count=len(samples), generated_count=made, disjoint_from_calibration=disjoint)
    if made:
        prov["generated"] = generated
    if note:
        prov["note"] = note
    return ParityInputs(samples, label, prov, calibration)


def _tensor_samples(f: Path, io: IOSpec) -> list[dict[str, np.ndarray]]:
    try:
        data: Any = np.load(f, allow_pickle=False)
    except Exception as e:
        raise CalibrationError(f"{f.name}: cannot be read as numpy data ({e})") from None
    if isinstance(data, np.ndarray):
        if len(io.inputs) != 1:
            raise CalibrationError(
                f"{f.name}: a .npy holds one array but the model has inputs "
                f"{[t.name for t in io.inputs]}; use .npz with one array per input"
            )
        arrays = {io.inputs[0].name: data}
    else:
        with data:
            arrays = {k: data[k] for k in data.files}
        missing = [t.name for t in io.inputs if t.name not in arrays]
        extra = [k for k in arrays if k not in {t.name for t in io.inputs}]
        if missing or extra:
            raise CalibrationError(
                f"{f.name}: arrays {sorted(arrays)} do not match the inputs "
                f"{[t.name for t in io.inputs]}" + (f" (missing {missing})" if missing else "")
            )
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
        raise CalibrationError(
            f"{f.name}: input {t.name!r} dtype {a.dtype}, expected {t.dtype}", hint=f"save it with .astype('{t.dtype}')"
        )
    if a.shape == shape:
        return [a]
    if a.shape == shape[1:] and shape[0] == 1:
        return [a[None]]
    if shape[0] == 1 and a.ndim == len(shape) and a.shape[1:] == shape[1:]:
        return [a[i : i + 1] for i in range(a.shape[0])]
    raise CalibrationError(
        f"{f.name}: input {t.name!r} shape {list(a.shape)}, expected {list(shape)} (or {list(shape[1:])}, or a stack [N, ...])"
    )
