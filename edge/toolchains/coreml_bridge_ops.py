"""The ONNX ops of edgekit's ONNX->PyTorch bridge (``coreml_bridge.py``), each a few lines of torch.

Runs inside the torch toolchain (no ``edge`` import). Each op is ``fn(m, get, ins, at)``: ``m`` the
:class:`coreml_bridge.OnnxModule` (``m.const(name)`` reads a constant input: shapes, axes, pads, scales),
``get`` a tensor by name, ``ins`` the node's input names (``""`` for an absent optional input), ``at`` its
attributes; it returns a tensor, or a tuple for an op with several outputs (Split, GRU, LSTM).

Shape arithmetic (Shape, Gather on shapes, Concat of shapes, Range, ConstantOfShape ...) never reaches these
ops at trace time: the module folds every node whose inputs are constants or static shapes into a constant
first, so ``torch.jit.trace`` records tensor ops only and coremltools sees plain constants.
Only the forms torch and Core ML compute the same way are taken; any other raises ``ValueError`` naming the
op and the attribute, which the driver reports in one line.
"""

from __future__ import annotations

import math
from functools import reduce
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

Get = Callable[[str], Any]
Op = Callable[..., Any]

# ONNX TensorProto data types -> torch dtypes (the ones a graph computes with)
_DTYPES = {
    1: torch.float32,
    2: torch.uint8,
    3: torch.int8,
    5: torch.int16,
    6: torch.int32,
    7: torch.int64,
    9: torch.bool,
    10: torch.float16,
    11: torch.float64,
}


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _pads(pads: list[int], nd: int) -> tuple[list[int], bool]:
    """ONNX pads [b0, b1, ..., e0, e1, ...] -> (F.pad order, symmetric?)."""
    if not pads:
        return [0] * (2 * nd), True
    begin, end = pads[:nd], pads[nd:]
    torch_pad: list[int] = []
    for b, e in zip(reversed(begin), reversed(end)):
        torch_pad += [b, e]
    return torch_pad, begin == end


def _axes(m: Any, ins: list[str], at: dict[str, Any], index: int = 1) -> list[int] | None:
    """Axes given as an attribute (older opsets) or as a constant input (newer); None when absent."""
    if "axes" in at:
        return [int(a) for a in at["axes"]]
    if len(ins) > index and ins[index]:
        return [int(a) for a in m.const(ins[index]).reshape(-1)]
    return None


def _auto_pads(at: dict[str, Any], sizes: list[int], kernel: list[int], stride: list[int], dil: list[int]) -> list[int]:
    """The node's pads; for auto_pad SAME_UPPER/SAME_LOWER the ones ONNX computes from the static input size."""
    nd = len(kernel)
    auto = _s(at.get("auto_pad", "NOTSET"))
    if auto in ("NOTSET", "VALID"):
        return list(at.get("pads", [0] * 2 * nd)) if auto == "NOTSET" else [0] * 2 * nd
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise ValueError(f"auto_pad={auto!r} is not supported by the bridge")
    pads = [0] * (2 * nd)
    for i in range(nd):
        k = (kernel[i] - 1) * dil[i] + 1
        total = max((math.ceil(sizes[i] / stride[i]) - 1) * stride[i] + k - sizes[i], 0)
        small, big = total // 2, total - total // 2
        pads[i], pads[nd + i] = (small, big) if auto == "SAME_UPPER" else (big, small)
    return pads


def _conv(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    x, w = get(ins[0]), get(ins[1])
    b = get(ins[2]) if len(ins) > 2 and ins[2] else None
    nd = w.dim() - 2
    stride, dil, groups = list(at.get("strides", [1] * nd)), list(at.get("dilations", [1] * nd)), at.get("group", 1)
    pads = _auto_pads(at, m.dims(ins[0])[2:], m.dims(ins[1])[2:], stride, dil)
    pad, sym = _pads(pads, nd)
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    if sym:
        return fn(x, w, b, stride, (pads or [0] * 2 * nd)[:nd], dil, groups)
    return fn(F.pad(x, pad), w, b, stride, 0, dil, groups)


def _conv_transpose(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    x, w = get(ins[0]), get(ins[1])
    b = get(ins[2]) if len(ins) > 2 and ins[2] else None
    nd = w.dim() - 2
    if _s(at.get("auto_pad", "NOTSET")) not in ("NOTSET", "VALID") or "output_shape" in at:
        raise ValueError("ConvTranspose with auto_pad or output_shape is not supported by the bridge (give pads)")
    pads = list(at.get("pads", [0] * 2 * nd))
    if pads[:nd] != pads[nd:]:
        raise ValueError("ConvTranspose with asymmetric pads is not supported by the bridge")
    fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[nd]
    return fn(
        x,
        w,
        b,
        list(at.get("strides", [1] * nd)),
        pads[:nd],
        list(at.get("output_padding", [0] * nd)),
        at.get("group", 1),
        list(at.get("dilations", [1] * nd)),
    )


def _pool(kind: str) -> Op:
    def run(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
        x = get(ins[0])
        k = list(at["kernel_shape"])
        nd = len(k)
        stride, dil = list(at.get("strides", [1] * nd)), list(at.get("dilations", [1] * nd))
        pads = _auto_pads(at, m.dims(ins[0])[2:], k, stride, dil)
        pad, sym = _pads(pads, nd)
        ceil = bool(at.get("ceil_mode", 0))
        if kind == "max":
            fn = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[nd]
            if sym:
                return fn(x, k, stride, pads[:nd], dil, ceil_mode=ceil)
            return fn(F.pad(x, pad, value=-math.inf), k, stride, 0, dil, ceil_mode=ceil)
        fn = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[nd]
        include = bool(at.get("count_include_pad", 0))
        if sym:
            return fn(x, k, stride, pads[:nd], ceil_mode=ceil, count_include_pad=include)
        if not include:
            raise ValueError("AveragePool with asymmetric pads and count_include_pad=0 is not supported by the bridge")
        return fn(F.pad(x, pad), k, stride, 0, ceil_mode=ceil, count_include_pad=True)

    return run


def _clip(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    lo = at.get("min") if "min" in at else (float(m.const(ins[1])) if len(ins) > 1 and ins[1] else None)
    hi = at.get("max") if "max" in at else (float(m.const(ins[2])) if len(ins) > 2 and ins[2] else None)
    return torch.clamp(get(ins[0]), lo, hi)


def _flatten(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    x = get(ins[0])
    axis = at.get("axis", 1)
    axis = axis + x.dim() if axis < 0 else axis
    lead = int(np.prod(m.dims(ins[0])[:axis])) if axis else 1
    return x.reshape(lead, -1)


def _gemm(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    a, b = get(ins[0]), get(ins[1])
    if at.get("transA", 0):
        a = a.t()
    if at.get("transB", 0):
        b = b.t()
    y = torch.matmul(a, b)
    alpha, beta = at.get("alpha", 1.0), at.get("beta", 1.0)
    if alpha != 1.0:
        y = y * alpha
    if len(ins) > 2 and ins[2]:
        c = get(ins[2])
        y = y + (c * beta if beta != 1.0 else c)
    return y


def _reshape(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    x = get(ins[0])
    shape = [int(s) for s in m.const(ins[1]).reshape(-1)]
    if not at.get("allowzero", 0):
        shape = [m.dims(ins[0])[i] if s == 0 else s for i, s in enumerate(shape)]
    return x.reshape(shape)


def _softmax(log: bool) -> Op:
    def run(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
        x = get(ins[0])
        fn = torch.log_softmax if log else torch.softmax
        if m.opset >= 13:
            return fn(x, dim=at.get("axis", -1))
        axis = at.get("axis", 1)
        axis = axis + x.dim() if axis < 0 else axis
        flat = x.reshape(int(np.prod(m.dims(ins[0])[:axis])), -1)  # opset < 13: over the flattened tail
        return fn(flat, dim=1).reshape(m.dims(ins[0]))

    return run


def _batchnorm(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    x, scale, bias, mean, var = (get(n) for n in ins[:5])
    return F.batch_norm(x, mean, var, scale, bias, training=False, eps=at.get("epsilon", 1e-5))


def _layernorm(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    x = get(ins[0])
    axis = at.get("axis", -1)
    axis = axis + x.dim() if axis < 0 else axis
    bias = get(ins[2]) if len(ins) > 2 and ins[2] else None
    return F.layer_norm(x, m.dims(ins[0])[axis:], get(ins[1]), bias, eps=at.get("epsilon", 1e-5))


def _hardsigmoid(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    alpha, beta = at.get("alpha", 0.2), at.get("beta", 0.5)
    if abs(alpha - 1 / 6) < 1e-6 and abs(beta - 0.5) < 1e-6:
        return F.hardsigmoid(get(ins[0]))  # one op in Core ML
    return torch.clamp(get(ins[0]) * alpha + beta, 0.0, 1.0)


def _div(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    a, b = get(ins[0]), get(ins[1])
    if not a.is_floating_point() and not b.is_floating_point():
        return torch.div(a, b, rounding_mode="trunc")  # ONNX integer division truncates
    return a / b


def _reduce(fn: str) -> Op:
    def run(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
        x = get(ins[0])
        axes = _axes(m, ins, at)
        keep = bool(at.get("keepdims", 1))
        if not axes:
            if at.get("noop_with_empty_axes", 0):
                return x
            axes = list(range(x.dim()))
        dims = tuple(a + x.dim() if a < 0 else a for a in axes)
        if fn in ("amax", "amin"):
            return getattr(torch, fn)(x, dim=dims, keepdim=keep)
        if fn == "l2":
            return torch.sqrt(torch.sum(x * x, dim=dims, keepdim=keep))
        return getattr(torch, fn)(x, dim=dims, keepdim=keep)

    return run


def _shape(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    shape = m.dims(ins[0])
    start, end = at.get("start", 0), at.get("end", len(shape))
    return torch.tensor(shape[start:end], dtype=torch.int64)


def _transpose(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    x = get(ins[0])
    return x.permute(*[int(p) for p in at.get("perm", range(x.dim() - 1, -1, -1))])


def _squeeze(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    x = get(ins[0])
    axes = _axes(m, ins, at)
    if axes is None:
        axes = [i for i, d in enumerate(m.dims(ins[0])) if d == 1]
    drop = {a + x.dim() if a < 0 else a for a in axes}
    return x.reshape([d for i, d in enumerate(m.dims(ins[0])) if i not in drop])


def _unsqueeze(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    x = get(ins[0])
    axes = _axes(m, ins, at) or []
    rank = x.dim() + len(axes)
    shape = m.dims(ins[0])
    for a in sorted(a + rank if a < 0 else a for a in axes):
        shape.insert(a, 1)
    return x.reshape(shape)


def _slice(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    x = get(ins[0])
    if "starts" in at:  # opset < 10: attributes
        starts, ends = list(at["starts"]), list(at["ends"])
        axes, steps = list(at.get("axes", range(len(starts)))), [1] * len(starts)
    else:
        starts = [int(v) for v in m.const(ins[1]).reshape(-1)]
        ends = [int(v) for v in m.const(ins[2]).reshape(-1)]
        axes = _axes(m, ins, {}, 3) or list(range(len(starts)))
        steps = [int(v) for v in m.const(ins[4]).reshape(-1)] if len(ins) > 4 and ins[4] else [1] * len(starts)
    index: list[Any] = [slice(None)] * x.dim()
    flips = []
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = a + x.dim() if a < 0 else a
        n = m.dims(ins[0])[a]
        if st > 0:
            s, e = (max(0, min(v + n if v < 0 else v, n)) for v in (s, e))
            index[a] = slice(s, max(s, e), st)
        else:  # a negative step: torch slices forward only, so take the range and flip it
            s = max(-1, min(s + n if s < 0 else s, n - 1))
            e = max(-1, min(e + n if e < 0 else e, n - 1))
            picked = list(range(s, e, st))
            if not picked:
                index[a] = slice(0, 0)
                continue
            index[a] = slice(picked[-1], picked[0] + 1, -st)
            flips.append(a)
    y = x[tuple(index)]
    return y.flip(flips) if flips else y


def _gather(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    x, idx = get(ins[0]), get(ins[1])
    axis = at.get("axis", 0)
    axis = axis + x.dim() if axis < 0 else axis
    dims, idx_dims = m.dims(ins[0]), m.dims(ins[1])
    if ins[1] in m.consts:  # constant indices: made non-negative here, not in the traced graph
        idx = torch.from_numpy(np.where(m.const(ins[1]) < 0, m.const(ins[1]) + dims[axis], m.const(ins[1])))
    else:
        idx = torch.where(idx < 0, idx + dims[axis], idx)
    out = torch.index_select(x, axis, idx.long().reshape(-1))
    return out.reshape(dims[:axis] + idx_dims + dims[axis + 1 :])


def _gather_nd(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    if at.get("batch_dims", 0):
        raise ValueError("GatherND with batch_dims is not supported by the bridge")
    x, idx = get(ins[0]), get(ins[1]).long()
    return x[tuple(idx[..., j] for j in range(m.dims(ins[1])[-1]))]


def _split(m: Any, get: Get, ins: list[str], at: dict[str, Any], n_out: int) -> tuple[torch.Tensor, ...]:
    x = get(ins[0])
    axis = at.get("axis", 0)
    if "split" in at:
        sizes = [int(s) for s in at["split"]]
    elif len(ins) > 1 and ins[1]:
        sizes = [int(s) for s in m.const(ins[1]).reshape(-1)]
    else:
        n = m.dims(ins[0])[axis]
        each = -(-n // n_out)
        sizes = [each] * (n_out - 1) + [n - each * (n_out - 1)]
    return tuple(torch.split(x, sizes, dim=axis))


def _expand(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    x = get(ins[0])
    shape = np.broadcast_shapes(tuple(m.dims(ins[0])), tuple(int(s) for s in m.const(ins[1]).reshape(-1)))
    return x.expand(*shape)


def _tile(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    return get(ins[0]).repeat(*[int(r) for r in m.const(ins[1]).reshape(-1)])


def _pad(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    x = get(ins[0])
    pads = list(at["pads"]) if "pads" in at else [int(p) for p in m.const(ins[1]).reshape(-1)]
    value = at.get("value", 0.0)
    if len(ins) > 2 and ins[2]:
        value = float(m.const(ins[2]).reshape(-1)[0])
    if len(ins) > 3 and ins[3]:
        raise ValueError("Pad with an axes input is not supported by the bridge")
    mode = _s(at.get("mode", "constant"))
    nd = x.dim()
    torch_pad, _ = _pads(pads, nd)
    while len(torch_pad) > 2 and torch_pad[-2:] == [0, 0]:  # torch pads the last dims; drop the untouched leading ones
        torch_pad = torch_pad[:-2]
    if mode == "constant":
        return F.pad(x, torch_pad, value=value)
    if mode in ("reflect", "edge"):
        return F.pad(x, torch_pad, mode="reflect" if mode == "reflect" else "replicate")
    raise ValueError(f"Pad mode={mode!r} is not supported by the bridge")


def _cast(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    to = int(at["to"])
    if to not in _DTYPES:
        raise ValueError(f"Cast to ONNX type {to} is not supported by the bridge")
    ref = m.float_ref() if to == 1 else None
    if ref is not None:  # float32 as the weights are: a host proxy's .half() copy computes it in fp16, as Core ML does
        return get(ins[0]).type_as(ref)
    return get(ins[0]).to(_DTYPES[to])


def _constant_of_shape(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    from onnx import numpy_helper

    v = numpy_helper.to_array(at["value"]).reshape(-1) if "value" in at else np.zeros(1, np.float32)
    shape = [int(s) for s in m.const(ins[0]).reshape(-1)]
    return torch.from_numpy(np.full(shape, v[0], dtype=v.dtype))


def _range(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    start, limit, delta = (m.const(n).reshape(()) for n in ins[:3])
    return torch.from_numpy(np.arange(start, limit, delta).astype(start.dtype))


def _resize(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    x = get(ins[0])
    if "scales" in at:  # Upsample-7: an attribute
        scales_in, sizes_in = "", ""
    elif m.opset < 11:  # Upsample-9 / Resize-10: (X, scales)
        scales_in, sizes_in = ins[1] if len(ins) > 1 else "", ""
    else:
        scales_in = ins[2] if len(ins) > 2 else ""
        sizes_in = ins[3] if len(ins) > 3 else ""
    if sizes_in:
        size = [int(s) for s in m.const(sizes_in).reshape(-1)]
    elif "scales" in at:
        size = [int(math.floor(d * float(s))) for d, s in zip(m.dims(ins[0]), at["scales"])]
    elif scales_in and m.const(scales_in).size:
        size = [int(math.floor(d * float(s))) for d, s in zip(m.dims(ins[0]), m.const(scales_in).reshape(-1))]
    else:
        raise ValueError("Resize without scales or sizes")
    if size[:2] != m.dims(ins[0])[:2]:
        raise ValueError("Resize of the batch or channel axis is not supported by the bridge")
    mode = _s(at.get("mode", "nearest"))
    ctm = _s(at.get("coordinate_transformation_mode", "half_pixel" if m.opset >= 11 else "asymmetric"))
    if mode == "nearest":
        near = _s(at.get("nearest_mode", "round_prefer_floor"))
        if ctm == "asymmetric" and near == "floor":
            return F.interpolate(x, size=size[2:], mode="nearest")
        if ctm in ("half_pixel", "pytorch_half_pixel", "tf_half_pixel_for_nn") and near in (
            "round_prefer_ceil",
            "round_prefer_floor",
        ):
            return F.interpolate(x, size=size[2:], mode="nearest-exact")
        raise ValueError(f"Resize nearest with {ctm}/{near} is not supported by the bridge")
    if mode == "linear":
        kind = {3: "linear", 4: "bilinear", 5: "trilinear"}[x.dim()]
        if ctm == "align_corners":
            return F.interpolate(x, size=size[2:], mode=kind, align_corners=True)
        if ctm in ("half_pixel", "pytorch_half_pixel"):
            return F.interpolate(x, size=size[2:], mode=kind, align_corners=False)
    raise ValueError(f"Resize mode={mode!r} with {ctm} is not supported by the bridge")


#: per recurrent op: torch's module, gates a step (ONNX order -> torch order, as indices of ONNX's gate blocks)
_RNN = {
    "GRU": (torch.nn.GRU, 3, (1, 0, 2)),
    "LSTM": (torch.nn.LSTM, 4, (0, 2, 3, 1)),
}  # z r h -> r z n; i o f c -> i f g o


def _recurrent(m: Any, get: Get, ins: list[str], at: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    """ONNX GRU (linear_before_reset=1, the form torch exports) or LSTM as torch's own, which coremltools converts.
    Outputs: Y [steps, directions, batch, hidden], Y_h (and Y_c) [directions, batch, hidden]."""
    rnn = m.rnn_for(ins[1])
    x = get(ins[0])
    num_dir, hidden = 2 if _s(at.get("direction", "forward")) == "bidirectional" else 1, int(at["hidden_size"])
    seq, batch = m.dims(ins[0])[:2]

    def state(i: int) -> torch.Tensor:
        return get(ins[i]) if len(ins) > i and ins[i] else x.new_zeros(num_dir, batch, hidden)

    if isinstance(rnn, torch.nn.LSTM):
        y, (h, c) = rnn(x, (state(5), state(6)))
        return y.reshape(seq, batch, num_dir, hidden).permute(0, 2, 1, 3), h, c
    y, h = rnn(x, state(5))
    return y.reshape(seq, batch, num_dir, hidden).permute(0, 2, 1, 3), h


def rnn_module(m: Any, op: str, ins: list[str], at: dict[str, Any]) -> torch.nn.Module:
    """A torch GRU/LSTM holding an ONNX GRU's/LSTM's weights (gate blocks reordered to torch's)."""
    direction = _s(at.get("direction", "forward"))
    if direction == "reverse" or (op == "GRU" and int(at.get("linear_before_reset", 0)) != 1):
        raise ValueError(
            f"{op} direction={direction!r} linear_before_reset={int(at.get('linear_before_reset', 0))} is not "
            "supported by the bridge (torch's recurrent layers: forward or bidirectional; a GRU linear_before_reset=1)"
        )
    extra = [k for k in ("activations", "clip", "layout", "input_forget") if at.get(k)]
    if extra or (len(ins) > 4 and ins[4]) or (len(ins) > 7 and ins[7]):
        raise ValueError(f"{op} with {', '.join(extra) or 'sequence_lens or peepholes'} is not supported by the bridge")
    kind, gates, order = _RNN[op]
    w, r = m.const(ins[1]), m.const(ins[2])
    num_dir, hidden = w.shape[0], int(at["hidden_size"])
    b = m.const(ins[3]) if len(ins) > 3 and ins[3] else np.zeros((num_dir, 2 * gates * hidden), np.float32)
    rnn = kind(w.shape[2], hidden, bidirectional=num_dir == 2)

    def torch_order(a: np.ndarray) -> torch.Tensor:
        blocks = np.split(a, gates, axis=0)
        return torch.from_numpy(np.ascontiguousarray(np.concatenate([blocks[i] for i in order]).astype(np.float32)))

    with torch.no_grad():
        for d in range(num_dir):
            sfx = "_reverse" if d else ""
            getattr(rnn, f"weight_ih_l0{sfx}").copy_(torch_order(w[d]))
            getattr(rnn, f"weight_hh_l0{sfx}").copy_(torch_order(r[d]))
            getattr(rnn, f"bias_ih_l0{sfx}").copy_(torch_order(b[d][: gates * hidden]))
            getattr(rnn, f"bias_hh_l0{sfx}").copy_(torch_order(b[d][gates * hidden :]))
    return rnn.eval()


def _variadic(fn: Callable[[Any, Any], Any]) -> Op:
    return lambda m, get, ins, at: reduce(fn, [get(n) for n in ins])


def _unary(fn: Callable[[Any], Any]) -> Op:
    return lambda m, get, ins, at: fn(get(ins[0]))


def _binary(fn: Callable[[Any, Any], Any]) -> Op:
    return lambda m, get, ins, at: fn(get(ins[0]), get(ins[1]))


OPS: dict[str, Op] = {
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "Relu": _unary(torch.relu),
    "Sigmoid": _unary(torch.sigmoid),
    "Tanh": _unary(torch.tanh),
    "Exp": _unary(torch.exp),
    "Log": _unary(torch.log),
    "Sqrt": _unary(torch.sqrt),
    "Abs": _unary(torch.abs),
    "Neg": _unary(torch.neg),
    "Floor": _unary(torch.floor),
    "Ceil": _unary(torch.ceil),
    "Erf": _unary(torch.erf),
    "Sin": _unary(torch.sin),
    "Cos": _unary(torch.cos),
    "Reciprocal": _unary(torch.reciprocal),
    "Not": _unary(torch.logical_not),
    "IsNaN": _unary(torch.isnan),
    "Softplus": _unary(F.softplus),
    "HardSwish": _unary(F.hardswish),
    "LeakyRelu": lambda m, get, ins, at: F.leaky_relu(get(ins[0]), at.get("alpha", 0.01)),
    "Elu": lambda m, get, ins, at: F.elu(get(ins[0]), at.get("alpha", 1.0)),
    "PRelu": lambda m, get, ins, at: torch.where(get(ins[0]) >= 0, get(ins[0]), get(ins[0]) * get(ins[1])),
    "Clip": _clip,
    "Add": _binary(torch.add),
    "Sub": _binary(torch.sub),
    "Mul": _binary(torch.mul),
    "Div": _div,
    "Pow": _binary(torch.pow),
    "Max": _variadic(torch.maximum),
    "Min": _variadic(torch.minimum),
    "Sum": _variadic(torch.add),
    "Equal": _binary(torch.eq),
    "Less": _binary(torch.lt),
    "LessOrEqual": _binary(torch.le),
    "Greater": _binary(torch.gt),
    "GreaterOrEqual": _binary(torch.ge),
    "And": _binary(torch.logical_and),
    "Or": _binary(torch.logical_or),
    "Where": lambda m, get, ins, at: torch.where(get(ins[0]), get(ins[1]), get(ins[2])),
    "GlobalAveragePool": lambda m, get, ins, at: get(ins[0]).mean(dim=tuple(range(2, get(ins[0]).dim())), keepdim=True),
    "GlobalMaxPool": lambda m, get, ins, at: get(ins[0]).amax(dim=tuple(range(2, get(ins[0]).dim())), keepdim=True),
    "ReduceMean": _reduce("mean"),
    "ReduceSum": _reduce("sum"),
    "ReduceMax": _reduce("amax"),
    "ReduceMin": _reduce("amin"),
    "ReduceProd": _reduce("prod"),
    "ReduceL2": _reduce("l2"),
    "Flatten": _flatten,
    "Gemm": _gemm,
    "MatMul": _binary(torch.matmul),
    "Reshape": _reshape,
    "Concat": lambda m, get, ins, at: torch.cat([get(n) for n in ins if n], dim=at["axis"]),
    "MaxPool": _pool("max"),
    "AveragePool": _pool("avg"),
    "HardSigmoid": _hardsigmoid,
    "Softmax": _softmax(log=False),
    "LogSoftmax": _softmax(log=True),
    "BatchNormalization": _batchnorm,
    "LayerNormalization": _layernorm,
    "Shape": _shape,
    "Transpose": _transpose,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Slice": _slice,
    "Gather": _gather,
    "GatherND": _gather_nd,
    "Expand": _expand,
    "Tile": _tile,
    "Pad": _pad,
    "Cast": _cast,
    "ConstantOfShape": _constant_of_shape,
    "Range": _range,
    "Resize": _resize,
    "Upsample": _resize,
    "GRU": _recurrent,
    "LSTM": _recurrent,
    "Size": lambda m, get, ins, at: torch.tensor(int(np.prod(m.dims(ins[0]))), dtype=torch.int64),
    "Identity": lambda m, get, ins, at: get(ins[0]),
    "Dropout": lambda m, get, ins, at: get(ins[0]),
}
#: ops with several outputs: called with the number of outputs the node has
MULTI_OUTPUT = {"Split": _split}
