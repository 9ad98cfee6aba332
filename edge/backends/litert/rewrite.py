"""Rewrites of a TFLite flatbuffer that keep what it computes: read by the TFLite-source converters.

Pure flatbuffers (the object API of ``ai_edge_litert.schema_py_generated``): no TensorFlow.

* :func:`lower_mediapipe_ops`: MediaPipe's custom op ``Convolution2DTransposeBias`` (its selfie segmentation,
  hair segmentation, ... decoders) becomes the builtin ``TRANSPOSE_CONV`` version 3, whose 4th input is the bias.
  MediaPipe's kernel (mediapipe/util/tflite/operations/transpose_conv_bias.cc) reads its ``custom_options`` as a
  ``TfLiteTransposeConvParams``: three little-endian int32, ``padding`` (TfLitePadding: 1 SAME, 2 VALID),
  ``stride_width``, ``stride_height``; weights OHWI, bias [O], no activation, float32 only. It computes its output
  size as ``stride * (in - 1) + filter - pad`` with ``pad = max(0, filter - (in - 1) % stride - 1)`` under SAME
  (0 under VALID) and offsets by ``pad // 2``; the builtin, given that output size, derives the same total
  padding and offset (``ComputePaddingWithOffset``), so the lowering is exact (tests/pipeline/test_tflite_sources.py
  checks it against numpy).
* :func:`dequantize_fp16_weights`: every ``DEQUANTIZE`` whose input is a float16 constant becomes an f32 constant
  holding the same values (each f16 is exactly an f32): an "fp16-weight" model becomes an fp32 one that computes
  the same, with f32 weights in the file.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from edge.errors import ConversionError

MEDIAPIPE_TRANSPOSE_CONV = "Convolution2DTransposeBias"
#: custom ops edgekit can lower to builtins
LOWERABLE = frozenset({MEDIAPIPE_TRANSPOSE_CONV})

_TFLITE_FLOAT32, _TFLITE_FLOAT16, _TFLITE_INT32 = 0, 1, 2


def _schema() -> Any:
    from ai_edge_litert import schema_py_generated as schema

    return schema


@dataclass
class Rewrite:
    """What a rewrite did, for the manifest."""

    lowered: dict[str, int] = field(default_factory=dict)  # custom op -> how many became builtins
    dequantized: int = 0  # f16 constants + DEQUANTIZE folded into f32 constants
    densified: int = 0  # sparse constants + DENSIFY folded into dense constants
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"lowered_custom_ops": dict(self.lowered), "fp16_weights_dequantized": self.dequantized}
        if self.densified:
            out["sparse_weights_densified"] = self.densified
        return out


def load(data: bytes) -> Any:
    return _schema().ModelT.InitFromPackedBuf(bytearray(data), 0)


def save(model: Any) -> bytes:
    import flatbuffers

    b = flatbuffers.Builder(max(1024, 1 << 20))
    b.Finish(model.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def _opcode(model: Any, builtin: int, version: int) -> int:
    """Index of the operator code (builtin, version), added when missing."""
    schema = _schema()
    for i, oc in enumerate(model.operatorCodes):
        code = max(oc.builtinCode, oc.deprecatedBuiltinCode)
        if code == builtin and not oc.customCode:
            oc.version = max(oc.version, version)
            return i
    oc = schema.OperatorCodeT()
    oc.builtinCode = builtin
    oc.deprecatedBuiltinCode = min(builtin, 127)
    oc.version = version
    model.operatorCodes.append(oc)
    return len(model.operatorCodes) - 1


def _custom_name(model: Any, op: Any) -> str | None:
    oc = model.operatorCodes[op.opcodeIndex]
    if oc.customCode:
        return oc.customCode.decode(errors="replace") if isinstance(oc.customCode, bytes) else str(oc.customCode)
    return None


def _const_tensor(model: Any, graph: Any, name: str, value: np.ndarray, ttype: int) -> int:
    schema = _schema()
    buf = schema.BufferT()
    buf.data = np.frombuffer(np.ascontiguousarray(value).tobytes(), dtype=np.uint8)
    model.buffers.append(buf)
    t = schema.TensorT()
    t.shape = np.asarray(value.shape, dtype=np.int32)
    t.type = ttype
    t.buffer = len(model.buffers) - 1
    t.name = name.encode()
    graph.tensors.append(t)
    return len(graph.tensors) - 1


def transpose_conv_output_shape(
    in_shape: tuple[int, ...], filter_shape: tuple[int, ...], padding: int, stride_w: int, stride_h: int
) -> tuple[int, int, int, int]:
    """MediaPipe's Prepare(): the output size of Convolution2DTransposeBias (NHWC input, OHWI filter)."""
    n, ih, iw, _ = in_shape
    o, fh, fw, _ = filter_shape
    ph = max(0, fh - (ih - 1) % stride_h - 1) if padding == 1 else 0
    pw = max(0, fw - (iw - 1) % stride_w - 1) if padding == 1 else 0
    return n, stride_h * (ih - 1) + fh - ph, stride_w * (iw - 1) + fw - pw, o


def lower_mediapipe_ops(model: Any, record: Rewrite) -> None:
    """Convolution2DTransposeBias -> TRANSPOSE_CONV v3 (output_shape, weights, input, bias), in place."""
    schema = _schema()
    bad: list[str] = []
    for g in model.subgraphs:
        for k, op in enumerate(g.operators or []):
            if _custom_name(model, op) != MEDIAPIPE_TRANSPOSE_CONV:
                continue
            where = f"{MEDIAPIPE_TRANSPOSE_CONV} op {k} (output {g.tensors[op.outputs[0]].name!r})"
            raw = bytes(np.asarray(op.customOptions, dtype=np.uint8)) if op.customOptions is not None else b""
            if len(op.inputs) != 3 or len(op.outputs) != 1 or len(raw) < 12:
                bad.append(f"{where}: {len(op.inputs)} inputs, {len(raw)} option bytes (want 3 and 12)")
                continue
            padding, stride_w, stride_h = struct.unpack("<iii", raw[:12])
            x, w, bias = (g.tensors[i] for i in op.inputs)
            types = {x.type, w.type, bias.type, g.tensors[op.outputs[0]].type}
            if (
                padding not in (1, 2)
                or stride_w < 1
                or stride_h < 1
                or types != {_TFLITE_FLOAT32}
                or len(x.shape) != 4
                or len(w.shape) != 4
            ):
                bad.append(f"{where}: padding {padding}, strides {stride_w}x{stride_h}, float32 4-D only")
                continue
            shape = transpose_conv_output_shape(
                tuple(int(d) for d in x.shape), tuple(int(d) for d in w.shape), padding, stride_w, stride_h
            )
            declared = tuple(int(d) for d in g.tensors[op.outputs[0]].shape)
            if declared and declared != shape:
                bad.append(f"{where}: output declared {list(declared)}, MediaPipe's kernel makes {list(shape)}")
                continue
            shape_t = _const_tensor(
                model,
                g,
                f"{g.tensors[op.outputs[0]].name.decode(errors='replace')}/output_shape",
                np.asarray(shape, dtype=np.int32),
                _TFLITE_INT32,
            )
            opts = schema.TransposeConvOptionsT()
            opts.padding = schema.Padding.SAME if padding == 1 else schema.Padding.VALID
            opts.strideW, opts.strideH = stride_w, stride_h
            opts.fusedActivationFunction = schema.ActivationFunctionType.NONE
            op.opcodeIndex = _opcode(model, schema.BuiltinOperator.TRANSPOSE_CONV, 3)  # v3: the bias input
            op.inputs = np.asarray([shape_t, op.inputs[1], op.inputs[0], op.inputs[2]], dtype=np.int32)
            op.builtinOptionsType = schema.BuiltinOptions.TransposeConvOptions
            op.builtinOptions = opts
            op.customOptions = None
            record.lowered[MEDIAPIPE_TRANSPOSE_CONV] = record.lowered.get(MEDIAPIPE_TRANSPOSE_CONV, 0) + 1
    if bad:
        raise ConversionError(f"cannot lower MediaPipe's {MEDIAPIPE_TRANSPOSE_CONV}: " + "; ".join(bad))


def dequantize_fp16_weights(model: Any, record: Rewrite) -> None:
    """DEQUANTIZE(f16 constant) -> the f32 constant it computes, in place; unused tensors are dropped."""
    schema = _schema()
    deq = schema.BuiltinOperator.DEQUANTIZE
    for g in model.subgraphs:
        keep_ops = []
        for op in g.operators or []:
            oc = model.operatorCodes[op.opcodeIndex]
            if max(oc.builtinCode, oc.deprecatedBuiltinCode) == deq and len(op.inputs) == 1:
                src, dst = g.tensors[op.inputs[0]], g.tensors[op.outputs[0]]
                data = model.buffers[src.buffer].data if src.buffer else None
                if src.type == _TFLITE_FLOAT16 and data is not None and len(data) and dst.type == _TFLITE_FLOAT32:
                    values = np.frombuffer(bytes(np.asarray(data, dtype=np.uint8)), dtype="<f2").astype("<f4")
                    buf = schema.BufferT()
                    buf.data = np.frombuffer(values.tobytes(), dtype=np.uint8)
                    model.buffers.append(buf)
                    dst.buffer = len(model.buffers) - 1
                    record.dequantized += 1
                    continue
            keep_ops.append(op)
        g.operators = keep_ops
        _drop_unused_tensors(model, g)


#: TFLite tensor types a sparse constant may hold -> numpy dtype
_SPARSE_DTYPES = {0: "<f4", 1: "<f2", 9: "i1", 3: "u1"}
#: ops holding state between calls (resource variables): no frontend but LiteRT's own translates them
RESOURCE_OPS = frozenset({"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "CALL_ONCE"})


def densify_sparse_weights(model: Any, record: Rewrite) -> None:
    """DENSIFY(sparse constant) -> the dense constant it computes, in place (TFLite's sparsity format: per
    traversal level DENSE or SPARSE_CSR metadata, blocks mapped onto original dimensions; the values in traversal
    order). Unused tensors are dropped; a sparse tensor of a type or layout not read here is left as it was."""
    schema = _schema()
    dens = schema.BuiltinOperator.DENSIFY
    for g in model.subgraphs:
        keep_ops = []
        for op in g.operators or []:
            oc = model.operatorCodes[op.opcodeIndex]
            if max(oc.builtinCode, oc.deprecatedBuiltinCode) == dens and len(op.inputs) == 1:
                src, dst = g.tensors[op.inputs[0]], g.tensors[op.outputs[0]]
                data = model.buffers[src.buffer].data if src.buffer else None
                if src.sparsity is not None and data is not None and src.type in _SPARSE_DTYPES:
                    dense = sparse_to_dense(src, bytes(np.asarray(data, dtype=np.uint8)))
                    buf = schema.BufferT()
                    buf.data = np.frombuffer(dense.tobytes(), dtype=np.uint8)
                    model.buffers.append(buf)
                    dst.buffer = len(model.buffers) - 1
                    record.densified += 1
                    continue
            keep_ops.append(op)
        g.operators = keep_ops
        _drop_unused_tensors(model, g)


def sparse_to_dense(tensor: Any, data: bytes) -> np.ndarray:
    """The dense array of a sparse TFLite constant (TFLite's FormatConverter::SparseToDense, level by level)."""
    sp = tensor.sparsity
    shape = tuple(int(d) for d in tensor.shape)
    order = [int(i) for i in sp.traversalOrder]
    block_map = [int(i) for i in (sp.blockMap if sp.blockMap is not None else [])]
    levels = sp.dimMetadata
    rank = len(shape)
    prev = np.zeros(1, dtype=np.int64)
    cols: list[np.ndarray] = []
    for md in levels:
        if md.format == 0:  # DENSE
            n = int(md.denseSize)
            cols = [c.repeat(n) for c in cols] + [np.tile(np.arange(n), len(prev))]
            prev = (prev[:, None] * n + np.arange(n)).ravel()
        else:  # SPARSE_CSR: segments[prev] .. segments[prev + 1] index into indices
            seg = np.asarray(md.arraySegments.values, dtype=np.int64)
            ind = np.asarray(md.arrayIndices.values, dtype=np.int64)
            starts, counts = seg[prev], seg[prev + 1] - seg[prev]
            nxt = np.repeat(starts - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts) + np.arange(counts.sum())
            cols = [c.repeat(counts) for c in cols] + [ind[nxt]]
            prev = nxt
    values = np.frombuffer(data, dtype=_SPARSE_DTYPES[int(tensor.type)])
    if len(values) < len(prev):
        raise ConversionError(f"sparse tensor {tensor.name!r}: {len(values)} values for {len(prev)} positions")
    orig = [np.zeros(len(prev), dtype=np.int64) for _ in range(rank)]
    for level, col in enumerate(cols):
        d = order[level]
        if d < rank:
            orig[d] = col
        else:  # a block level: within the block of its original dimension
            b = d - rank
            size = int(levels[order.index(d)].denseSize)
            orig[block_map[b]] = orig[block_map[b]] * size + col
    dense = np.zeros(shape, dtype=values.dtype)
    dense[tuple(orig)] = values[: len(prev)]
    return dense


def resource_ops(model: Any) -> list[str]:
    """The resource-variable ops a model uses (state between calls)."""
    names = {
        name
        for name, code in vars(_schema().BuiltinOperator).items()
        if name in RESOURCE_OPS
        for oc in model.operatorCodes
        if max(oc.builtinCode, oc.deprecatedBuiltinCode) == code
    }
    return sorted(names)


def _drop_unused_tensors(model: Any, g: Any) -> None:
    used: set[int] = set(int(i) for i in (g.inputs if g.inputs is not None else [])) | set(
        int(i) for i in (g.outputs if g.outputs is not None else [])
    )
    for op in g.operators or []:
        for seq in (op.inputs, op.outputs, op.intermediates):
            if seq is not None:
                used |= {int(i) for i in seq if i >= 0}
    if len(used) == len(g.tensors):
        return
    order = sorted(used)
    remap = {old: new for new, old in enumerate(order)}
    for old, t in enumerate(g.tensors):
        if old not in remap and t.buffer:  # the buffer stays (indices are shared), emptied
            if sum(1 for u in order if g.tensors[u].buffer == t.buffer) == 0:
                model.buffers[t.buffer].data = None
    g.tensors = [g.tensors[i] for i in order]

    def fix(seq: Any) -> Any:
        return None if seq is None else np.asarray([remap[int(i)] if i >= 0 else -1 for i in seq], dtype=np.int32)

    g.inputs, g.outputs = fix(g.inputs), fix(g.outputs)
    for op in g.operators or []:
        op.inputs, op.outputs, op.intermediates = fix(op.inputs), fix(op.outputs), fix(op.intermediates)
    for sig in model.signatureDefs or []:
        if sig.subgraphIndex == model.subgraphs.index(g):
            for tm in (sig.inputs or []) + (sig.outputs or []):
                tm.tensorIndex = remap[int(tm.tensorIndex)]


def has_fp16_weights(model: Any) -> bool:
    return any(t.type == _TFLITE_FLOAT16 and t.buffer for g in model.subgraphs for t in g.tensors)


def custom_ops(model: Any) -> list[str]:
    return sorted({n for g in model.subgraphs for op in (g.operators or []) if (n := _custom_name(model, op))})


def rewrite(data: bytes, *, lower: bool = True, fp32: bool = False, densify: bool = False) -> tuple[bytes, Rewrite]:
    """``data`` with MediaPipe's custom ops lowered (``lower``), f16 weights made f32 (``fp32``) and sparse
    weights made dense (``densify``)."""
    record = Rewrite()
    model = load(data)
    if lower:
        lower_mediapipe_ops(model, record)
    if fp32:
        dequantize_fp16_weights(model, record)
    if densify:
        densify_sparse_weights(model, record)
    if not record.lowered and not record.dequantized and not record.densified:
        return data, record
    return save(model), record


def _input_names(model: Any) -> dict[int, str]:
    """Subgraph 0's input tensor index -> the name the bundle and ``--input-shape`` use: the first
    SignatureDef's (as LiteRT's signature runner reads it), else the tensor's own."""
    g = model.subgraphs[0]
    names = {int(i): _text(g.tensors[int(i)].name) for i in (g.inputs if g.inputs is not None else [])}
    sigs = [s for s in (model.signatureDefs or []) if int(s.subgraphIndex) == 0]
    for tm in (sigs[0].inputs or []) if sigs else []:
        if int(tm.tensorIndex) in names:
            names[int(tm.tensorIndex)] = _text(tm.name)
    return names


def _text(b: Any) -> str:
    return b.decode("utf-8", "replace") if isinstance(b, (bytes, bytearray)) else str(b or "")


def dynamic_inputs(data: bytes) -> dict[str, list[int]]:
    """The inputs whose ``shape_signature`` leaves a dim dynamic (-1), by name, with that signature
    (openWakeWord's melspectrogram: ``{"input": [-1, -1]}``); empty for a static model."""
    model = load(data)
    g = model.subgraphs[0]
    found: dict[str, list[int]] = {}
    for i, name in _input_names(model).items():
        sig = g.tensors[i].shapeSignature
        if sig is not None and len(sig) and min(int(d) for d in sig) < 0:
            found[name] = [int(d) for d in sig]
    return found


def fix_input_shapes(data: bytes, shapes: Mapping[str, Sequence[int]]) -> bytes:
    """``data`` with each named dynamic input made static at its shape: the tensor's ``shape`` set and its
    ``shape_signature`` dropped. LiteRT then computes every other shape at allocation, as
    ``Interpreter.resize_tensor_input`` before ``allocate_tensors`` does (measured identical, issue #23), and
    tf2onnx and OpenVINO's TFLite frontend read a static input. The caller checks ``shapes`` fit."""
    model = load(data)
    g = model.subgraphs[0]
    by_name = {name: i for i, name in _input_names(model).items()}
    for name, shape in shapes.items():
        t = g.tensors[by_name[name]]
        t.shape = np.asarray([int(d) for d in shape], dtype=np.int32)
        t.shapeSignature = None
    return save(model)
