"""Deterministic, offline example ONNX models for demos, benchmarks and tests.

Each builder writes a self-contained ``.onnx`` file made with ``onnx.helper`` and numpy
only (no torch, no downloads). Weights come from ``numpy.random.default_rng(seed)`` and
BatchNorm statistics from a float64 numpy forward pass over a few calibration inputs
(N(0, 1) for the small test models, synthetic ImageNet-normalised pictures for MobileNetV2),
so the same arguments give byte-identical files (the float64 pass is rounded to float32 at
the end, which hides BLAS-kernel differences in practice). The weights are *random*:
realistic architecture, operator mix and activation ranges, meaningless predictions.

Random deep convnets are numerically fragile in a way trained ones are not: with
BatchNorm centring after every ReLU, a small perturbation grows by ~1.2x per layer
relative to the signal, and pooled features differ little between inputs compared with
their common mean, so low-precision rounding gets amplified into the logits. The
MobileNetV2 builder counters this (see the constants below): ReLU6 inputs are shifted so
most units are in the linear range, BatchNorm is calibrated on image-like inputs like
the ones the model is fed, and the classifier reads only the directions in which the
calibration inputs' pooled features actually differ. It is still more sensitive than a
trained network: int8 static quantization and bf16 keep top-1 in ~80-95 % of cases
(cosine ~0.92-0.99 for int8, ~0.99-0.9995 for bf16, depending on the seed).

Needs ``onnx`` (the ``edgekit-ml[onnx]`` extra); nothing imports this module at start-up.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "build_mobilenet_v2",
    "build_tiny_cnn",
    "build_two_input_model",
    "build_yolo_detector",
    "write_text_line_images",
]

_BN_EPS = 1e-5
# MobileNetV2 body (Sandler et al., 2018, table 2): expansion t, channels c, repeats n, stride s.
_MOBILENET_V2_SETTINGS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)
_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)
# BatchNorm gamma of the last conv of a residual branch: keeps the variance of the
# residual stream bounded (cf. zero-initialised residual gammas in ResNets).
_RESIDUAL_GAMMA = 0.5
# BatchNorm gamma and beta before ReLU6: pre-activations ~N(2, 1.5^2), so ~90 % of units
# are in the linear part (perturbation gain ~1.05 per layer instead of ~1.2 for centred
# inputs, which keeps the 35-layer stack out of the chaotic regime) and Clip(0, 6)
# saturates now and then (~0.5 % of values), as in trained MobileNets; a converter that
# drops the upper bound then shows up in parity checks.
_RELU6_GAMMA = 1.5
_RELU6_BETA = 2.0
_CALIBRATION_BATCH = 4
_LOGIT_STD = 3.0


def _make_divisible(value: float, divisor: int = 8) -> int:
    """Round a channel count as the reference MobileNetV2 does (multiple of ``divisor``)."""
    new_value = max(divisor, int(value + divisor / 2) // divisor * divisor)
    if new_value < 0.9 * value:  # never round down by more than 10 %
        new_value += divisor
    return new_value


def _synthetic_images(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """ImageNet-normalised synthetic photos-ish: colour gradients, blotches and pixel noise.

    Pixel values in [0, 1] (a random colour, a random linear gradient per channel, an 8x8
    grid of random blotches and per-pixel noise, clipped), then ``(x - mean) / std``.
    """
    n, c, h, w = shape
    yy, xx = np.mgrid[0:h, 0:w] / np.array([max(h - 1, 1), max(w - 1, 1)])[:, None, None] - 0.5
    mean = np.array(_IMAGENET_MEAN[:c])[:, None, None]
    std = np.array(_IMAGENET_STD[:c])[:, None, None]
    out = np.empty(shape)
    for i in range(n):
        colour = rng.uniform(0.2, 0.8, (c, 1, 1))
        slope_x, slope_y = rng.uniform(-0.5, 0.5, (2, c, 1, 1))
        blotches = np.kron(rng.standard_normal((c, 8, 8)), np.ones((h // 8 + 1, w // 8 + 1)))
        img = colour + slope_x * xx + slope_y * yy + 0.25 * blotches[:, :h, :w] + 0.15 * rng.standard_normal((c, h, w))
        out[i] = (np.clip(img, 0.0, 1.0) - mean) / std
    return out


def _conv2d(x: np.ndarray, w: np.ndarray, stride: int, groups: int) -> np.ndarray:
    """NCHW convolution with "same" padding (k // 2), for dense or depthwise weights."""
    n, c, h, wd = x.shape
    k = w.shape[-1]
    pad = k // 2
    ho, wo = (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad))) if pad else x
    out = np.zeros((n, w.shape[0], ho, wo))
    for i in range(k):
        for j in range(k):
            patch = xp[:, :, i : i + stride * ho : stride, j : j + stride * wo : stride]
            if groups == 1:
                out += np.matmul(w[:, :, i, j], patch.reshape(n, c, -1)).reshape(out.shape)
            else:  # depthwise: groups == in channels == out channels
                out += w[None, :, 0, i, j, None, None] * patch
    return out


class _GraphBuilder:
    """Accumulates nodes and initializers while running a float64 numpy forward pass.

    The forward pass over a small calibration batch (N(0, 1) inputs, or synthetic
    pictures with ``images``) supplies the BatchNorm statistics that get folded into each conv, as a trained network's running
    statistics would, so activations stay in a sane range at any depth. All random draws
    go through one generator, so a seed fixes the whole model.
    """

    def __init__(
        self,
        seed: int,
        opset: int,
        inputs: dict[str, tuple[int, ...]],
        *,
        images: bool = False,
        span_head: bool = False,
    ) -> None:
        if opset < 11:
            raise ValueError(f"opset {opset} is too old: these models need opset >= 11 (Clip)")
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.span_head = span_head
        self.values = {
            k: _synthetic_images(self.rng, shape) if images else self.rng.standard_normal(shape)
            for k, shape in inputs.items()
        }
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._counts: dict[str, int] = {}
        self._relu6_bounds: list[str] = []

    def _name(self, prefix: str) -> str:
        index = self._counts.get(prefix, 0)
        self._counts[prefix] = index + 1
        return f"{prefix}_{index}"

    def param(self, name: str, array: np.ndarray) -> str:
        """Add a float32 initializer and return its name."""
        self.initializers.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def node(self, op: str, inputs: list[str], output: str | None = None, **attrs: Any) -> str:
        """Append one node (named after its single output) and return the output name."""
        output = output or self._name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def conv(
        self,
        x: str,
        cin: int,
        cout: int,
        *,
        kernel: int = 1,
        stride: int = 1,
        groups: int = 1,
        act: str | None = None,
        gamma_scale: float = 1.0,
        beta_shift: float = 0.0,
    ) -> str:
        """Conv + folded BatchNorm (+ ``"relu"``, ``"relu6"`` or ``"silu"``); returns the output name.

        He-normal weights; BatchNorm uses the calibration batch's per-channel mean/var
        and random gamma (about ``gamma_scale``) and beta (about ``beta_shift``), folded
        into weight and bias.
        """
        w = self.rng.standard_normal((cout, cin // groups, kernel, kernel))
        w *= math.sqrt(2.0 / (cin // groups * kernel * kernel))
        z = _conv2d(self.values[x], w, stride, groups)
        gamma = gamma_scale * self.rng.uniform(0.75, 1.25, cout)
        beta = beta_shift + 0.1 * self.rng.standard_normal(cout)
        scale = gamma / np.sqrt(z.var(axis=(0, 2, 3)) + _BN_EPS)
        bias = beta - z.mean(axis=(0, 2, 3)) * scale
        y = z * scale[:, None, None] + bias[:, None, None]
        name = self._name("conv")
        weight = self.param(f"{name}.weight", w * scale[:, None, None, None])
        pad = kernel // 2
        out = self.node(
            "Conv",
            [x, weight, self.param(f"{name}.bias", bias)],
            output=name,
            kernel_shape=[kernel, kernel],
            strides=[stride, stride],
            pads=[pad] * 4,
            group=groups,
        )
        if act == "relu":
            out, y = self.node("Relu", [out]), np.maximum(y, 0.0)
        elif act == "relu6":
            if not self._relu6_bounds:  # one shared pair of scalar bounds
                self._relu6_bounds = [self.param("relu6.min", np.array(0.0)), self.param("relu6.max", np.array(6.0))]
            out, y = self.node("Clip", [out, *self._relu6_bounds]), np.clip(y, 0.0, 6.0)
        elif act == "silu":  # x * sigmoid(x), as YOLO-family detectors use
            out, y = self.node("Mul", [out, self.node("Sigmoid", [out])]), y / (1.0 + np.exp(-y))
        self.values[out] = y
        return out

    def add(self, a: str, b: str) -> str:
        out = self.node("Add", [a, b])
        self.values[out] = self.values[a] + self.values[b]
        return out

    def pool(self, x: str) -> str:
        """GlobalAveragePool -> Flatten to [N, C]."""
        out = self.node("Flatten", [self.node("GlobalAveragePool", [x])], axis=1)
        self.values[out] = self.values[x].mean(axis=(2, 3))
        return out

    def head(self, x: str, num_classes: int, output: str) -> str:
        """Pool + Gemm classifier, centred and scaled on the calibration batch.

        The bias cancels the mean pooled feature (otherwise every input gets the same
        argmax) and the weights are scaled so logits have std ``_LOGIT_STD``. Weights are
        isotropic random, or with ``span_head`` random combinations of the calibration
        inputs' centred pooled features: the classifier then reads only the directions in
        which inputs differ, not the rest of a feature space where rounding noise is about
        as large as the input-specific signal.
        """
        pooled = self.pool(x)
        features = self.values[pooled]
        mean = features.mean(axis=0)
        if self.span_head:
            w = self.rng.standard_normal((num_classes, features.shape[0])) @ (features - mean)
        else:
            w = self.rng.standard_normal((num_classes, mean.size)) / math.sqrt(mean.size)
        w *= _LOGIT_STD / max(float(np.std((features - mean) @ w.T)), 1e-12)
        weight = self.param("classifier.weight", w)
        bias = self.param("classifier.bias", -w @ mean)
        return self.node("Gemm", [pooled, weight, bias], output=output, transB=1)

    def model(
        self,
        name: str,
        inputs: list[onnx.ValueInfoProto],
        outputs: list[onnx.ValueInfoProto],
        *,
        doc: str,
        metadata: dict[str, str] | None = None,
    ) -> onnx.ModelProto:
        """Assemble the ModelProto (IR version: the oldest that supports the opset)."""
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.initializers)
        opset_ids = [helper.make_opsetid("", self.opset)]
        model = helper.make_model(
            graph,
            opset_imports=opset_ids,
            producer_name="edgekit.samples",
            doc_string=doc,
            ir_version=helper.find_min_ir_version_for(opset_ids),
        )
        helper.set_model_props(model, {"name": name, **(metadata or {})})
        return model


def _save(model: onnx.ModelProto, path: str | os.PathLike[str]) -> Path:
    onnx.checker.check_model(model, full_check=True)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(model.SerializeToString())
    return out


def _float_input(name: str, shape: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _inverted_residual(b: _GraphBuilder, x: str, cin: int, cout: int, *, expand: int, stride: int) -> str:
    """One MobileNetV2 inverted-residual block on ``x``: a 1x1 expansion (unless ``expand`` is 1), a 3x3 depthwise
    conv, a 1x1 linear projection, and a residual ``Add`` where stride is 1 and channels match."""
    residual = stride == 1 and cin == cout
    hidden, y = cin * expand, x
    if expand != 1:
        y = b.conv(y, cin, hidden, act="relu6", gamma_scale=_RELU6_GAMMA, beta_shift=_RELU6_BETA)
    y = b.conv(
        y,
        hidden,
        hidden,
        kernel=3,
        stride=stride,
        groups=hidden,
        act="relu6",
        gamma_scale=_RELU6_GAMMA,
        beta_shift=_RELU6_BETA,
    )
    y = b.conv(y, hidden, cout, gamma_scale=_RESIDUAL_GAMMA if residual else 1.0)
    return b.add(x, y) if residual else y


def build_mobilenet_v2(
    path: str | os.PathLike[str],
    *,
    num_classes: int = 1000,
    input_size: int = 224,
    width_mult: float = 1.0,
    seed: int = 0,
    opset: int = 17,
) -> Path:
    """Write a MobileNetV2 classifier with deterministic random weights to ``path``.

    The architecture follows the reference MobileNetV2 (torchvision layout): a 3x3/2
    stem, inverted-residual blocks (1x1 expand, 3x3 depthwise, 1x1 linear projection;
    expansion 6 except the first block) from the standard (t, c, n, s) table, residual
    ``Add`` where stride is 1 and channels match, a 1x1 conv to 1280 channels (scaled by
    ``width_mult`` when > 1), ``GlobalAveragePool``, ``Flatten`` and a ``Gemm``
    classifier. ReLU6 is ``Clip(0, 6)``; BatchNorm is folded into the conv weights/bias.

    Input ``"input"``: float32 ``[1, 3, input_size, input_size]``, NCHW, RGB,
    ImageNet-normalised (``(x / 255 - mean) / std``, mean 0.485/0.456/0.406,
    std 0.229/0.224/0.225). Output ``"logits"``: float32 ``[1, num_classes]``.

    Weights are He-normal from ``seed``; the folded BatchNorm statistics and the
    classifier come from a numpy forward pass over four synthetic ImageNet-normalised
    pictures (gradients, blotches, noise), so activations stay in range, ReLU6 saturates
    now and then, logits on picture-like inputs have std ~2-3 and different inputs get
    different argmax classes (see the module docstring for how the weights are kept
    tolerant of int8/fp16 rounding). Takes about a second at 224x224. Returns the path
    written; the same arguments give byte-identical files. Needs ``opset >= 11``.
    """
    if num_classes < 1 or input_size < 32 or width_mult <= 0:
        raise ValueError("need num_classes >= 1, input_size >= 32 and width_mult > 0")
    b = _GraphBuilder(
        seed, opset, {"input": (_CALIBRATION_BATCH, 3, input_size, input_size)}, images=True, span_head=True
    )
    cin = _make_divisible(32 * width_mult)
    last = _make_divisible(1280 * max(1.0, width_mult))
    x = b.conv("input", 3, cin, kernel=3, stride=2, act="relu6", gamma_scale=_RELU6_GAMMA, beta_shift=_RELU6_BETA)
    for t, c, n, s in _MOBILENET_V2_SETTINGS:
        cout = _make_divisible(c * width_mult)
        for i in range(n):
            stride = s if i == 0 else 1
            x, cin = _inverted_residual(b, x, cin, cout, expand=t, stride=stride), cout
    x = b.conv(x, cin, last, act="relu6", gamma_scale=_RELU6_GAMMA, beta_shift=_RELU6_BETA)
    b.head(x, num_classes, "logits")
    model = b.model(
        "mobilenetv2-edgekit-example",
        [_float_input("input", [1, 3, input_size, input_size])],
        [_float_input("logits", [1, num_classes])],
        doc=(
            f"MobileNetV2 (width {width_mult}, {input_size}x{input_size}, {num_classes} classes) "
            f"built by edge.graph.samples with deterministic random weights (seed {seed}); "
            "not trained. Input: NCHW float32 RGB, (x/255 - mean)/std with ImageNet "
            "mean/std. Output: raw logits."
        ),
        metadata={
            "weights": f"deterministic random, seed {seed}",
            "architecture": f"MobileNetV2 width_mult={width_mult}",
            "input_layout": "NCHW",
            "colour_order": "RGB",
            "scale": "1/255",
            "mean": ",".join(map(str, _IMAGENET_MEAN)),
            "std": ",".join(map(str, _IMAGENET_STD)),
        },
    )
    return _save(model, path)


def build_tiny_cnn(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    input_size: int = 32,
    num_classes: int = 10,
    dynamic_batch: bool = False,
    opset: int = 17,
) -> Path:
    """Write a small CNN (3x Conv+Relu, GlobalAveragePool, Flatten, Gemm) to ``path``.

    Input ``"input"``: float32 ``[1, 3, input_size, input_size]`` (batch is the symbolic
    dim ``"batch"`` when ``dynamic_batch``); output ``"logits"``: ``[batch, num_classes]``.
    Meant for fast unit tests (~26 kB, builds in a few ms). Needs ``opset >= 11``.
    """
    if num_classes < 1 or input_size < 4:
        raise ValueError("need num_classes >= 1 and input_size >= 4")
    b = _GraphBuilder(seed, opset, {"input": (_CALIBRATION_BATCH, 3, input_size, input_size)})
    x = b.conv("input", 3, 8, kernel=3, act="relu")
    x = b.conv(x, 8, 16, kernel=3, stride=2, act="relu")
    x = b.conv(x, 16, 32, kernel=3, stride=2, act="relu")
    b.head(x, num_classes, "logits")
    batch: int | str = "batch" if dynamic_batch else 1
    model = b.model(
        "tiny-cnn-edgekit-example",
        [_float_input("input", [batch, 3, input_size, input_size])],
        [_float_input("logits", [batch, num_classes])],
        doc=f"Tiny test CNN built by edge.graph.samples with deterministic random weights (seed {seed}).",
        metadata={"weights": f"deterministic random, seed {seed}"},
    )
    return _save(model, path)


def build_two_input_model(path: str | os.PathLike[str], *, seed: int = 0, opset: int = 17) -> Path:
    """Write a tiny two-input, two-output model to ``path`` (for multi-I/O tests).

    Inputs: ``"image"`` float32 ``[1, 3, 16, 16]`` and ``"scale"`` float32 ``[1, 4]``.
    Outputs: ``"features"`` ``[1, 4]`` = pooled conv features of ``image`` times ``scale``;
    ``"embedding"`` ``[1, 8]`` = a linear layer applied to ``features``.
    """
    b = _GraphBuilder(seed, opset, {"image": (_CALIBRATION_BATCH, 3, 16, 16)})
    pooled = b.pool(b.conv("image", 3, 4, kernel=3, stride=2, act="relu"))
    features = b.node("Mul", [pooled, "scale"], output="features")
    weight = b.param("embedding.weight", b.rng.standard_normal((8, 4)) / 2.0)
    bias = b.param("embedding.bias", 0.1 * b.rng.standard_normal(8))
    b.node("Gemm", [features, weight, bias], output="embedding", transB=1)
    model = b.model(
        "two-input-edgekit-example",
        [_float_input("image", [1, 3, 16, 16]), _float_input("scale", [1, 4])],
        [_float_input("features", [1, 4]), _float_input("embedding", [1, 8])],
        doc=f"Two-input/two-output test model built by edge.graph.samples (seed {seed}).",
        metadata={"weights": f"deterministic random, seed {seed}"},
    )
    return _save(model, path)


def write_text_line_images(
    directory: str | os.PathLike[str], count: int = 32, *, height: int = 48, width: int = 192, seed: int = 0
) -> list[Path]:
    """Synthetic text-line crops as PP-OCR's direction classifier sees them; odd indices rotated 180°.

    Dark random-letter words on a light background, filling the line at a random font size; file
    names say the orientation (``upright_NNN.png`` / ``rot180_NNN.png``). Calibration and test data
    for the pretrained classifier, made offline with Pillow's built-in font (the fp32 classifier
    gets about 90% of them right: short random words are sometimes ambiguous upside down).
    """
    import string

    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    alphabet = list(string.ascii_letters + string.digits)
    paths = []
    for i in range(count):
        bg, fg = int(rng.integers(170, 256)), int(rng.integers(0, 50))
        font = ImageFont.load_default(size=int(rng.integers(height * 5 // 12, height * 2 // 3 + 1)))
        img = Image.new("RGB", (width, height), (bg, bg, bg))
        draw = ImageDraw.Draw(img)
        words: list[str] = []
        while True:
            word = "".join(rng.choice(alphabet, size=int(rng.integers(2, 9))))
            if draw.textlength(" ".join([*words, word]), font=font) > width - 8:
                break
            words.append(word)
        text = " ".join(words) or word[:3]
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        x = int(rng.integers(2, int(max(3, width - 2 - (right - left)))))
        y = (height - (bottom - top)) // 2 - top + int(rng.integers(-3, 4))
        draw.text((x, y), text, fill=(fg, fg, fg), font=font)
        rotated = i % 2 == 1
        if rotated:
            img = img.rotate(180)
        p = out / f"{'rot180' if rotated else 'upright'}_{i:03d}.png"
        img.save(p)
        paths.append(p)
    return paths


# YOLO-style detector: strides of the three detection levels, and where its raw head outputs sit
# before decoding (per-channel mean, std of the folded-BatchNorm output), chosen so that on
# picture-like inputs about 1-2 % of the grid cells clear a 0.25 score, as with a trained
# detector: NMS then sees tens of candidates, not thousands.
_YOLO_STRIDES = (8, 16, 32)
_YOLO_XY = (0.5, 0.3)  # cell offset of the box centre, in strides
_YOLO_WH = (0.9, 0.5)  # log of the box size, in strides
_YOLO_OBJ = (-4.0, 1.5)  # objectness logit
_YOLO_CLS = (-2.5, 1.5)  # class logits


def _int64(b: _GraphBuilder, name: str, values: list[int]) -> str:
    """An int64 initializer (shapes, slice bounds)."""
    b.initializers.append(numpy_helper.from_array(np.asarray(values, np.int64), name))
    return name


def _cat(b: _GraphBuilder, parts: list[str], axis: int = 1) -> str:
    out = b.node("Concat", parts, axis=axis)
    b.values[out] = np.concatenate([b.values[p] for p in parts], axis=axis)
    return out


def _csp(b: _GraphBuilder, x: str, cin: int, cout: int, repeats: int) -> str:
    """CSP block (as YOLOv5's C3): two 1x1 halves, residual bottlenecks on one, concat, 1x1."""
    half = cout // 2
    a = b.conv(x, cin, half, act="silu")
    skip = b.conv(x, cin, half, act="silu")
    for _ in range(repeats):
        y = b.conv(b.conv(a, half, half, act="silu"), half, half, kernel=3, act="silu", gamma_scale=_RESIDUAL_GAMMA)
        a = b.add(a, y)
    return b.conv(_cat(b, [a, skip]), 2 * half, cout, act="silu")


def _sppf(b: _GraphBuilder, x: str, c: int) -> str:
    """Spatial pyramid pooling, fast: three chained 5x5 max-pools, concatenated."""
    y = b.conv(x, c, c // 2, act="silu")
    pooled = [y]
    for _ in range(3):
        prev = pooled[-1]
        out = b.node("MaxPool", [prev], kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2])
        padded = np.pad(b.values[prev], ((0, 0), (0, 0), (2, 2), (2, 2)), constant_values=-np.inf)
        windows = np.lib.stride_tricks.sliding_window_view(padded, (5, 5), axis=(2, 3))
        b.values[out] = windows.max(axis=(-2, -1))
        pooled.append(out)
    return b.conv(_cat(b, pooled), 2 * c, c, act="silu")


def _upsample(b: _GraphBuilder, x: str) -> str:
    scales = b.param(b._name("upsample.scales"), np.array([1.0, 1.0, 2.0, 2.0]))
    out = b.node(
        "Resize", [x, "", scales], mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"
    )
    b.values[out] = b.values[x].repeat(2, axis=2).repeat(2, axis=3)
    return out


def _decoupled_head(b: _GraphBuilder, x: str, cin: int, hidden: int, num_classes: int) -> str:
    """YOLOX-style head: shared 1x1 stem, then a classification and a regression branch.

    Returns [1, 5 + C, H, W] raw predictions: box centre offset (2), log size (2), objectness, classes.
    """
    stem = b.conv(x, cin, hidden, act="silu")
    cls = b.conv(stem, hidden, hidden, kernel=3, act="silu")
    reg = b.conv(stem, hidden, hidden, kernel=3, act="silu")
    parts = [
        b.conv(reg, hidden, 2, gamma_scale=_YOLO_XY[1], beta_shift=_YOLO_XY[0]),
        b.conv(reg, hidden, 2, gamma_scale=_YOLO_WH[1], beta_shift=_YOLO_WH[0]),
        b.conv(reg, hidden, 1, gamma_scale=_YOLO_OBJ[1], beta_shift=_YOLO_OBJ[0]),
        b.conv(cls, hidden, num_classes, gamma_scale=_YOLO_CLS[1], beta_shift=_YOLO_CLS[0]),
    ]
    return _cat(b, parts)


def _yolo_backbone(b: _GraphBuilder, w: int) -> list[tuple[str, int]]:
    """The CSP backbone, SPPF and top-down neck: the three levels (strides 8, 16, 32) and their channels."""
    x = b.conv("images", 3, w, kernel=3, stride=2, act="silu")
    x = _csp(b, b.conv(x, w, 2 * w, kernel=3, stride=2, act="silu"), 2 * w, 2 * w, 1)
    p3 = _csp(b, b.conv(x, 2 * w, 4 * w, kernel=3, stride=2, act="silu"), 4 * w, 4 * w, 2)
    p4 = _csp(b, b.conv(p3, 4 * w, 8 * w, kernel=3, stride=2, act="silu"), 8 * w, 8 * w, 2)
    p5 = _csp(b, b.conv(p4, 8 * w, 16 * w, kernel=3, stride=2, act="silu"), 16 * w, 16 * w, 1)
    p5 = _sppf(b, p5, 16 * w)
    lat5 = b.conv(p5, 16 * w, 8 * w, act="silu")
    n4 = _csp(b, _cat(b, [_upsample(b, lat5), p4]), 16 * w, 8 * w, 1)
    lat4 = b.conv(n4, 8 * w, 4 * w, act="silu")
    n3 = _csp(b, _cat(b, [_upsample(b, lat4), p3]), 8 * w, 4 * w, 1)
    return [(n3, 4 * w), (n4, 8 * w), (p5, 16 * w)]


def _yolo_decoded_head(
    b: _GraphBuilder, levels: list[tuple[str, int]], w: int, input_size: int, num_classes: int
) -> None:
    """A decoupled head per level, and the grid/stride decoding into ``output`` ([1, N, 5 + classes])."""
    k = 5 + num_classes
    flat, grids, strides = [], [], []
    for level, (feat, cin) in enumerate(levels):
        stride = _YOLO_STRIDES[level]
        side = input_size // stride
        raw = _decoupled_head(b, feat, cin, 4 * w, num_classes)
        flat.append(b.node("Reshape", [raw, _int64(b, f"head{level}.shape", [1, k, side * side])]))
        gy, gx = np.mgrid[0:side, 0:side]
        grids.append(np.stack([gx.ravel(), gy.ravel()], axis=-1))
        strides.append(np.full((side * side, 1), stride))
    pred = b.node("Transpose", [b.node("Concat", flat, axis=2)], perm=[0, 2, 1])  # [1, N, 5 + C]

    def part(start: int, end: int) -> str:  # pred[..., start:end]
        return b.node("Slice", [pred, *(_int64(b, b._name("slice"), [v]) for v in (start, end, 2))])

    grid = b.param("decode.grid", np.concatenate(grids)[None])
    stride_map = b.param("decode.stride", np.concatenate(strides)[None])
    xy = b.node("Mul", [b.node("Add", [part(0, 2), grid]), stride_map])
    wh = b.node("Mul", [b.node("Exp", [part(2, 4)]), stride_map])
    scores = b.node("Sigmoid", [part(4, k)])
    b.node("Concat", [xy, wh, scores], output="output", axis=2)


def build_yolo_detector(
    path: str | os.PathLike[str],
    *,
    input_size: int = 320,
    num_classes: int = 80,
    width: int = 16,
    seed: int = 0,
    opset: int = 17,
) -> Path:
    """Write a small YOLO-style object detector with deterministic random weights to ``path``.

    Architecture (YOLOv5/YOLOX family, scaled down): a SiLU conv backbone of stride-2 3x3
    convs and CSP blocks (channels ``width`` x 1, 2, 4, 8, 16) ending in SPPF; a top-down
    neck (nearest 2x ``Resize`` + ``Concat`` + CSP) giving three levels at strides 8, 16 and
    32; a decoupled head per level (1x1 stem, separate 3x3 classification and regression
    branches, 1x1 predictions for box, objectness and classes), as in YOLOX.

    Input ``"images"``: float32 ``[1, 3, input_size, input_size]``, NCHW, RGB, pixel / 255,
    letterboxed with grey 114 (the ``yolo`` pre-processing preset). Output ``"output"``:
    float32 ``[1, N, 5 + num_classes]`` with N = sum over strides of (input_size / stride)^2
    (2100 at 320): per grid cell ``cx, cy, w, h`` in input pixels, then objectness and
    per-class scores, both after a sigmoid. The grid/stride decoding (``xy = (raw + cell) *
    stride``, ``wh = exp(raw) * stride``) is part of the graph, as in YOLOX's export with
    ``decode_in_inference``: score = objectness x class score, then NMS.

    Weights are random (He-normal from ``seed``), BatchNorm folded from a numpy forward pass
    over four synthetic pictures; the last layers are calibrated so that about 1-2 % of the
    cells clear a 0.25 score on noisy picture-like inputs (~0.1-0.5 % on the smoother frames
    of ``edge.video.sources.SyntheticScene``: a few boxes a frame, as a trained detector
    gives). Detections are meaningless; timing, operator mix and the post-processing load are
    realistic. ``input_size`` must be a multiple of 32; about a second to build at 320, a few
    at 640. The same arguments give byte-identical files.
    """
    if input_size < 64 or input_size % 32 or num_classes < 1 or width < 4 or width % 2:
        raise ValueError("need input_size a multiple of 32 and >= 64, num_classes >= 1, an even width >= 4")
    b = _GraphBuilder(seed, opset, {"images": (_CALIBRATION_BATCH, 3, input_size, input_size)}, images=True)
    # calibrate on pixels in 0..1 (the yolo preset), not ImageNet-normalised ones
    b.values["images"] = (
        b.values["images"] * np.array(_IMAGENET_STD)[:, None, None] + np.array(_IMAGENET_MEAN)[:, None, None]
    )
    levels = _yolo_backbone(b, width)
    k = 5 + num_classes
    _yolo_decoded_head(b, levels, width, input_size, num_classes)
    n = sum((input_size // s) ** 2 for s in _YOLO_STRIDES)
    model = b.model(
        "yolo-detector-edgekit-example",
        [_float_input("images", [1, 3, input_size, input_size])],
        [_float_input("output", [1, n, k])],
        doc=(
            f"YOLO-style detector (CSP backbone, SPPF, top-down neck, decoupled YOLOX-style head; width {width}, "
            f"{input_size}x{input_size}, {num_classes} classes) built by edge.graph.samples with deterministic random "
            f"weights (seed {seed}); not trained. Input: NCHW float32 RGB, x/255, letterboxed (pad 114). "
            f"Output: [1, {n}, {k}] = cx, cy, w, h (input pixels), objectness, class scores (sigmoid)."
        ),
        metadata={
            "weights": f"deterministic random, seed {seed}",
            "architecture": f"YOLO-style CSP + decoupled head, width {width}",
            "input_layout": "NCHW",
            "colour_order": "RGB",
            "scale": "1/255",
            "resize": "letterbox, pad 114",
            "output_format": "yolo: cx,cy,w,h,objectness,classes (decoded, sigmoid)",
        },
    )
    return _save(model, path)
