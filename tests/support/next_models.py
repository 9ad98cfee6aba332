"""Models edgekit had not met (issue #23), built in code with onnx.helper: each reproduces a class of fault
that a real pretrained model of that kind hit (a 1-channel OCR recogniser, a keyword spotter, an SSD anchor
detector, a landmark regressor, a text encoder, an already-quantized file). Weights are seeded; every test
asserts what the pipeline concluded, not a threshold tuned to the weights."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _save(
    path: Path,
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    inits: list[onnx.TensorProto],
) -> Path:
    g = helper.make_graph(nodes, path.stem.replace("-", "_"), inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


def one_channel_net(path: Path, shape: Sequence[int], *, name: str = "x", classes: int = 8) -> Path:
    """Conv -> ReLU -> global pool -> [1, classes] logits over a 1-channel input: ``[1,1,H,W]`` (a grey text line)
    or ``[1,T,F,1]`` (a spectrogram, transposed to NCHW inside, as TF exports are)."""
    rng = np.random.default_rng(0)
    nhwc = shape[-1] == 1 and shape[1] != 1
    w = numpy_helper.from_array((rng.standard_normal((classes, 1, 3, 3)) * 0.3).astype(np.float32), "W")
    x = name
    nodes = []
    if nhwc:
        nodes.append(helper.make_node("Transpose", [name], ["xt"], perm=[0, 3, 1, 2]))
        x = "xt"
    nodes += [
        helper.make_node("Conv", [x, "W"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Flatten", ["g"], ["logits"]),
    ]
    return _save(
        path,
        nodes,
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])],
        [w],
    )


def _conv_trunk(
    rng: np.random.Generator, x: str, cin: int, cout: int, name: str, stride: int = 2
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], str]:
    w = numpy_helper.from_array(
        (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(9 * cin)).astype(np.float32), f"{name}_w"
    )
    nodes = [
        helper.make_node("Conv", [x, w.name], [f"{name}_c"], pads=[1, 1, 1, 1], strides=[stride, stride]),
        helper.make_node("Relu", [f"{name}_c"], [f"{name}_r"]),
    ]
    return nodes, [w], f"{name}_r"


def anchor_detector(path: Path, side: int = 192) -> Path:
    """A palm-detector-like SSD head: ``[1, 3, side, side]`` -> regressors ``[1, 2016, 18]`` (box + 7 keypoints)
    and classificators ``[1, 2016, 1]`` over 2016 anchors (2 per cell on 24x24, 6 per cell on 12x12: MediaPipe's
    palm detection). 2016 = 21 * 96, so by its row count alone it is also a YOLO head."""
    rng = np.random.default_rng(1)
    nodes, inits, x = _conv_trunk(rng, "image", 3, 8, "s1", 4)  # 48
    n2, i2, x = _conv_trunk(rng, x, 8, 16, "s2")  # 24
    n3, i3, y = _conv_trunk(rng, x, 16, 16, "s3")  # 12
    nodes, inits = nodes + n2 + n3, inits + i2 + i3
    outs = {}
    for what, per in (("reg", 18), ("cls", 1)):
        parts = []
        for src, cells, anchors in ((x, 24, 2), (y, 12, 6)):
            w = numpy_helper.from_array(
                (rng.standard_normal((anchors * per, 16, 1, 1)) * 0.2).astype(np.float32), f"{what}{cells}_w"
            )
            inits.append(w)
            shape = numpy_helper.from_array(np.array([1, cells * cells * anchors, per], np.int64), f"{what}{cells}_s")
            inits.append(shape)
            nodes += [
                helper.make_node("Conv", [src, w.name], [f"{what}{cells}_c"]),
                helper.make_node("Transpose", [f"{what}{cells}_c"], [f"{what}{cells}_t"], perm=[0, 2, 3, 1]),
                helper.make_node("Reshape", [f"{what}{cells}_t", shape.name], [f"{what}{cells}_r"]),
            ]
            parts.append(f"{what}{cells}_r")
        outs[what] = parts
    nodes += [
        helper.make_node("Concat", outs["reg"], ["regressors"], axis=1),
        helper.make_node("Concat", outs["cls"], ["classificators"], axis=1),
    ]
    return _save(
        path,
        nodes,
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, side, side])],
        [
            helper.make_tensor_value_info("regressors", TensorProto.FLOAT, [1, 2016, 18]),
            helper.make_tensor_value_info("classificators", TensorProto.FLOAT, [1, 2016, 1]),
        ],
        inits,
    )


def regressor(path: Path, values: int = 10, *, output: str = "Identity", softmax: bool = False) -> Path:
    """``[1, 3, 64, 64]`` -> ``[1, values]``: five (x, y) landmarks (or, ``softmax``, a ``values``-class
    classifier's probabilities) after a small conv trunk and a dense layer."""
    rng = np.random.default_rng(2)
    nodes, inits, x = _conv_trunk(rng, "image", 3, 8, "s1", 4)
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["g"]))
    nodes.append(helper.make_node("Flatten", ["g"], ["f"]))
    w = numpy_helper.from_array((rng.standard_normal((8, values)) * 2).astype(np.float32), "dense_w")
    b = numpy_helper.from_array(np.linspace(0.2, 0.8, values).astype(np.float32), "dense_b")
    inits += [w, b]
    nodes.append(helper.make_node("Gemm", ["f", "dense_w", "dense_b"], ["z" if softmax else output]))
    if softmax:
        nodes.append(helper.make_node("Softmax", ["z"], [output], axis=1))
    return _save(
        path,
        nodes,
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 64, 64])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, [1, values])],
        inits,
    )


def text_encoder(
    path: Path, seq: int = 16, hidden: int = 32, vocab: int = 1000, output: str = "last_hidden_state"
) -> Path:
    """A transformer-encoder-shaped model: token ids ``[1, seq]`` -> embeddings -> one dense + GELU-ish layer with
    layer norm -> hidden states ``[1, seq, hidden]`` (not per-step class scores)."""
    rng = np.random.default_rng(3)
    emb = numpy_helper.from_array(rng.standard_normal((vocab, hidden)).astype(np.float32), "emb")
    w = numpy_helper.from_array((rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32), "w")
    gamma = numpy_helper.from_array(np.ones(hidden, np.float32), "gamma")
    beta = numpy_helper.from_array(np.zeros(hidden, np.float32), "beta")
    nodes = [
        helper.make_node("Gather", ["emb", "input_ids"], ["e"]),
        helper.make_node("MatMul", ["e", "w"], ["m"]),
        helper.make_node("Tanh", ["m"], ["t"]),
        helper.make_node("Add", ["t", "e"], ["a"]),
        helper.make_node("LayerNormalization", ["a", "gamma", "beta"], [output], axis=-1),
    ]
    return _save(
        path,
        nodes,
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, [1, seq, hidden])],
        [emb, w, gamma, beta],
    )


def quantized(path: Path, scheme: str, tmp: Path) -> Path:
    """An already-quantized ONNX made by onnxruntime.quantization from :func:`regressor` (QDQ, QOperator: static
    int8 on four seeded calibration images) or :func:`text_encoder` (dynamic: MatMulInteger)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    if scheme == "dynamic":
        quantize_dynamic(str(text_encoder(tmp / "float_encoder.onnx")), str(path), weight_type=QuantType.QInt8)
        return path

    class Images(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            rng = np.random.default_rng(4)
            self.it = iter([{"image": rng.random((1, 3, 64, 64), dtype=np.float32)} for _ in range(4)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.it, None)

    fmt = QuantFormat.QDQ if scheme == "QDQ" else QuantFormat.QOperator
    quantize_static(
        str(regressor(tmp / "float_classifier.onnx", output="logits")), str(path), Images(), quant_format=fmt
    )
    return path


def int8_weight_encoder(path: Path, hidden: int = 256, layers: int = 3, *, cast_mul: bool = False) -> Path:
    """``[1, 16, hidden]`` through ``layers`` MatMul + Tanh whose weights are int8 initializers dequantized by
    DequantizeLinear (weight-only quantization, as exported text encoders ship): float arithmetic on exact
    weights, where OpenVINO's CPU plugin by default quantizes the MatMul activations at run time. ``cast_mul``:
    dequantized by Cast + Mul instead (all-MiniLM-L6-v2 int8's form, which onnxruntime's constant folding folds)."""
    rng = np.random.default_rng(7)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        inits += [
            numpy_helper.from_array(rng.integers(-127, 128, (hidden, hidden)).astype(np.int8), f"w{i}"),
            numpy_helper.from_array(np.float32(0.01), f"s{i}"),
        ]
        nodes += (
            [
                helper.make_node("Cast", [f"w{i}"], [f"wc{i}"], to=TensorProto.FLOAT),
                helper.make_node("Mul", [f"wc{i}", f"s{i}"], [f"wf{i}"]),
            ]
            if cast_mul
            else [helper.make_node("DequantizeLinear", [f"w{i}", f"s{i}"], [f"wf{i}"])]
        )
        nodes += [helper.make_node("MatMul", [x, f"wf{i}"], [f"m{i}"]), helper.make_node("Tanh", [f"m{i}"], [f"t{i}"])]
        x = f"t{i}"
    nodes.append(helper.make_node("Identity", [x], ["hidden_states"]))
    return _save(
        path,
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, hidden])],
        [helper.make_tensor_value_info("hidden_states", TensorProto.FLOAT, [1, 16, hidden])],
        inits,
    )


def byte_conv1d_classifier(path: Path, length: int = 256, *, noop_slice: bool = True) -> Path:
    """A byte-level classifier as jax2tf/tf2onnx export a 1-D convolution (issue #23, class 9; Magika's pattern): byte
    ids ``[1, length]`` -> a fixed sinusoidal embedding ``[1, L, 16]`` -> Unsqueeze(3) -> Transpose to NCHW
    ``[1, 16, L, 1]`` -> Conv (kernel 5x1) -> ``noop_slice``: the ``[:, :, :, :1]`` Slice jax2tf adds, which keeps
    everything -> Squeeze(3) -> bias -> ReLU -> max over time -> dense -> softmax ``[1, 8]``. Structured weights (a
    cosine basis over time times sign patterns over channels), so each class responds to byte patterns and the
    probabilities change from input to input (a mistranslation shows in the cosine)."""
    c, f, k, classes = 16, 32, 5, 8
    j = np.arange(c // 2) + 1
    phase = 2 * np.pi * np.outer(np.arange(256), j) / 256
    table = np.concatenate([np.sin(phase), np.cos(phase)], 1).astype(np.float32)
    t = np.arange(k)
    over_time = np.stack([np.cos(np.pi * (t + 0.5) * (i % k) / k) for i in range(f)])
    over_channels = np.stack([np.where((np.arange(c) * (i + 1) // 3) % 2 == 0, 1.0, -1.0) for i in range(f)]) / c
    w = (over_time[:, None, :] * over_channels[:, :, None]).astype(np.float32)[..., None]  # [F, C, k, 1]
    dense = np.stack([np.cos(np.arange(f) * (i + 1) * 0.37) for i in range(classes)], 1).astype(np.float32)
    inits = [
        numpy_helper.from_array(table, "table"),
        numpy_helper.from_array(w, "W"),
        numpy_helper.from_array(np.linspace(-0.2, 0.2, f, dtype=np.float32)[:, None], "bias"),
        numpy_helper.from_array(dense, "dense"),
        numpy_helper.from_array(np.array([3], np.int64), "axis3"),
    ]
    nodes = [
        helper.make_node("Gather", ["table", "bytes"], ["emb"], axis=0, name="embed"),
        helper.make_node("Unsqueeze", ["emb", "axis3"], ["emb4"], name="expand"),
        helper.make_node("Transpose", ["emb4"], ["nchw"], perm=[0, 2, 1, 3], name="to_nchw"),
        helper.make_node("Conv", ["nchw", "W"], ["conv"], kernel_shape=[k, 1], name="conv1d"),
    ]
    x = "conv"
    if noop_slice:
        inits += [
            numpy_helper.from_array(np.zeros(4, np.int64), "starts"),
            numpy_helper.from_array(np.array([2**31 - 1] * 3 + [1], np.int64), "ends"),
            numpy_helper.from_array(np.arange(4, dtype=np.int64), "axes"),
        ]
        nodes.append(helper.make_node("Slice", ["conv", "starts", "ends", "axes"], ["sliced"], name="keep_all"))
        x = "sliced"
    nodes += [
        helper.make_node("Squeeze", [x, "axis3"], ["ncl"], name="to_ncl"),
        helper.make_node("Add", ["ncl", "bias"], ["biased"], name="bias_add"),
        helper.make_node("Relu", ["biased"], ["act"], name="relu"),
        helper.make_node("ReduceMax", ["act"], ["pooled"], axes=[2], keepdims=0, name="max_over_time"),
        helper.make_node("MatMul", ["pooled", "dense"], ["logits"], name="classify"),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="softmax"),
    ]
    return _save(
        path,
        nodes,
        [helper.make_tensor_value_info("bytes", TensorProto.INT32, [1, length])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, classes])],
        inits,
    )


def multi_label_tagger(
    path: Path, classes: int = 3000, *, output: str = "predictions_sigmoid", near_one: bool = False
) -> Path:
    """An image tagger (issue #34, class 3a): ``[1, 3, 64, 64]`` -> ``[1, classes]`` independent sigmoid
    probabilities, most near 0 and dozens saturated at 1.0 (thousands of tags, many present at once), as a
    WD14-style tagger gives. Its best class is a tie among the saturated ones. ``near_one``: the 60 tags sit at
    0.9999992-0.99999996 instead (logits 14-17), where another kernel's rounding reorders them."""
    rng = np.random.default_rng(3)
    nodes, inits, x = _conv_trunk(rng, "image", 3, 8, "s1", 4)
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["g"]))
    nodes.append(helper.make_node("Flatten", ["g"], ["f"]))
    w = (rng.standard_normal((8, classes)) * 3).astype(np.float32)
    b = np.full(classes, -6.0, np.float32)
    tags = rng.choice(classes, 60, replace=False)
    b[tags] = rng.uniform(14.0, 17.0, 60) if near_one else 40.0  # saturated tags: sigmoid 1.0 (or 1 - 1e-7)
    b[rng.choice(classes, 30, replace=False)] = 0.0  # tags near the 0.5 threshold
    inits += [numpy_helper.from_array(w, "dense_w"), numpy_helper.from_array(b, "dense_b")]
    nodes += [
        helper.make_node("Gemm", ["f", "dense_w", "dense_b"], ["z"]),
        helper.make_node("Sigmoid", ["z"], [output]),
    ]
    return _save(
        path,
        nodes,
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 64, 64])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, [1, classes])],
        inits,
    )


def step_decoder(path: Path, steps: int = 500, vocab: int = 50, boxes: int = 8) -> Path:
    """A table-structure recogniser's autoregressive head as exported (SLANet's pattern, issue #34 class 3c):
    ``[1, 3, 64, 64]`` -> ``structure_probs`` ``[1, steps, vocab]`` (a softmax over structure tokens per step)
    and ``loc_preds`` ``[1, steps, boxes]`` (a sigmoid cell box per step). Two outputs sharing their rows, as an
    SSD anchor head's do, but no anchor table decodes them."""
    rng = np.random.default_rng(4)
    nodes, inits, x = _conv_trunk(rng, "image", 3, 8, "s1", 4)
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["g"]))
    nodes.append(helper.make_node("Flatten", ["g"], ["f"]))
    for name, width, act in (("structure_probs", vocab, "Softmax"), ("loc_preds", boxes, "Sigmoid")):
        w = numpy_helper.from_array((rng.standard_normal((8, steps * width)) * 3).astype(np.float32), f"{name}_w")
        s = numpy_helper.from_array(np.array([1, steps, width], np.int64), f"{name}_s")
        inits += [w, s]
        nodes += [
            helper.make_node("MatMul", ["f", w.name], [f"{name}_m"]),
            helper.make_node("Reshape", [f"{name}_m", s.name], [f"{name}_r"]),
            helper.make_node(act, [f"{name}_r"], [name], **({"axis": -1} if act == "Softmax" else {})),
        ]
    return _save(
        path,
        nodes,
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 64, 64])],
        [
            helper.make_tensor_value_info("structure_probs", TensorProto.FLOAT, [1, steps, vocab]),
            helper.make_tensor_value_info("loc_preds", TensorProto.FLOAT, [1, steps, boxes]),
        ],
        inits,
    )
