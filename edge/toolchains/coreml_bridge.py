"""ONNX -> PyTorch bridge for the Core ML converter, written in edgekit.

Runs inside the ``coreml`` toolchain environment (torch + onnx only; edgekit is not installed
there, so this module imports neither ``edge`` nor anything outside torch, numpy and onnx).

Why our own bridge: coremltools no longer reads ONNX; onnx2torch needs torchvision (which pulls
a CUDA torch of several GB) and failed on ReduceMean opset 18. The ops edge vision models use
are few; each is a line or two of ``torch.nn.functional``. The module it builds interprets the
ONNX graph node by node with static shapes, so ``torch.jit.trace`` records a plain graph that
coremltools converts op for op.

Supported: Conv, Relu, Clip, Add, Mul, GlobalAveragePool, Flatten, Gemm, MatMul, Reshape, Concat,
MaxPool, AveragePool, Sigmoid, HardSigmoid, Softmax, BatchNormalization (+ Constant, Identity,
which carry no computation). Anything else: one error listing every unsupported op.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from onnx import numpy_helper

SUPPORTED = (
    "Conv",
    "Relu",
    "Clip",
    "Add",
    "Mul",
    "GlobalAveragePool",
    "Flatten",
    "Gemm",
    "MatMul",
    "Reshape",
    "Concat",
    "MaxPool",
    "AveragePool",
    "Sigmoid",
    "HardSigmoid",
    "Softmax",
    "BatchNormalization",
)
STRUCTURAL = ("Constant", "Identity")


class UnsupportedOps(Exception):
    def __init__(self, ops: list[dict[str, str]]) -> None:
        names = sorted({o["op"] for o in ops})
        super().__init__(
            f"the ONNX->PyTorch bridge does not support {', '.join(names)} "
            f"(nodes: {', '.join(o['node'] for o in ops[:12])}{' ...' if len(ops) > 12 else ''}); "
            f"it supports {', '.join(SUPPORTED)}"
        )
        self.ops = ops


def unsupported_ops(model: Any) -> list[dict[str, str]]:
    bad = []
    for i, n in enumerate(model.graph.node):
        if n.domain not in ("", "ai.onnx") or n.op_type not in SUPPORTED + STRUCTURAL:
            bad.append(
                {
                    "op": n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}",
                    "node": n.name or f"#{i}",
                }
            )
    return bad


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _pads(pads: list[int], nd: int) -> tuple[list[int], bool]:
    """ONNX pads [b0, b1, ..., e0, e1, ...] -> (F.pad order, symmetric?)."""
    if not pads:
        return [0] * (2 * nd), True
    begin, end = pads[:nd], pads[nd:]
    torch_pad: list[int] = []
    for b, e in zip(reversed(begin), reversed(end)):
        torch_pad += [b, e]
    return torch_pad, begin == end


class OnnxModule(torch.nn.Module):  # type: ignore[misc]  # torch is in the toolchain's venv: Any to mypy here
    """An ONNX graph (static shapes) as a torch module: float initializers become buffers."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        bad = unsupported_ops(model)
        if bad:
            raise UnsupportedOps(bad)
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        self.input_names = [
            i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}
        ]
        self.output_names = [o.name for o in model.graph.output]
        self.consts: dict[str, np.ndarray] = {}  # every constant, as numpy (shapes, axes, ...)
        self._buffer_of: dict[str, str] = {}
        for t in model.graph.initializer:
            self._add_const(t.name, numpy_helper.to_array(t))
        self.nodes = []
        for n in model.graph.node:
            if n.op_type == "Constant":
                a = n.attribute[0]
                from onnx import helper

                v = helper.get_attribute_value(a)
                arr = numpy_helper.to_array(v) if a.name == "value" else np.asarray(v)
                self._add_const(n.output[0], arr)
                continue
            self.nodes.append((n.op_type, list(n.input), list(n.output), _attrs(n), n.name))

    def _add_const(self, name: str, arr: np.ndarray) -> None:
        self.consts[name] = arr
        if arr.dtype.kind == "f":
            key = f"c{len(self._buffer_of)}"
            self.register_buffer(key, torch.from_numpy(np.ascontiguousarray(arr.astype(np.float32))))
            self._buffer_of[name] = key

    def forward(self, *args: torch.Tensor) -> Any:
        env: dict[str, Any] = dict(zip(self.input_names, args))

        def get(name: str) -> Any:
            if name in env:
                return env[name]
            if name in self._buffer_of:
                return getattr(self, self._buffer_of[name])
            if name in self.consts:
                return torch.from_numpy(self.consts[name].copy())
            raise KeyError(f"tensor {name!r} is not produced before it is used")

        for op, ins, outs, at, _name in self.nodes:
            y = _OPS[op](self, get, ins, at)
            env[outs[0]] = y
        result = tuple(env[n] for n in self.output_names)
        return result[0] if len(result) == 1 else result

    def const(self, name: str) -> np.ndarray:
        if name not in self.consts:
            raise ValueError(f"{name!r} must be a constant for the bridge (static shapes only)")
        return self.consts[name]


Get = Callable[[str], Any]


def _conv(m: OnnxModule, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    x, w = get(ins[0]), get(ins[1])
    b = get(ins[2]) if len(ins) > 2 and ins[2] else None
    nd = w.dim() - 2
    if at.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
        raise ValueError(f"Conv auto_pad={at['auto_pad']!r} is not supported by the bridge (use explicit pads)")
    pad, sym = _pads(list(at.get("pads", [])), nd)
    stride, dil, groups = at.get("strides", [1] * nd), at.get("dilations", [1] * nd), at.get("group", 1)
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    if sym:
        return fn(x, w, b, stride, list(at.get("pads", [0] * 2 * nd))[:nd], dil, groups)
    return fn(F.pad(x, pad), w, b, stride, 0, dil, groups)


def _pool(kind: str) -> Callable[..., torch.Tensor]:
    def run(m: OnnxModule, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
        x = get(ins[0])
        k = list(at["kernel_shape"])
        nd = len(k)
        stride = list(at.get("strides", [1] * nd))
        pad, sym = _pads(list(at.get("pads", [])), nd)
        ceil = bool(at.get("ceil_mode", 0))
        if kind == "max":
            dil = list(at.get("dilations", [1] * nd))
            fn = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[nd]
            if sym:
                return fn(x, k, stride, list(at.get("pads", [0] * 2 * nd))[:nd], dil, ceil_mode=ceil)
            return fn(F.pad(x, pad, value=-math.inf), k, stride, 0, dil, ceil_mode=ceil)
        fn = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[nd]
        include = bool(at.get("count_include_pad", 0))
        if sym:
            return fn(x, k, stride, list(at.get("pads", [0] * 2 * nd))[:nd], ceil_mode=ceil, count_include_pad=include)
        if not include:
            raise ValueError("AveragePool with asymmetric pads and count_include_pad=0 is not supported by the bridge")
        return fn(F.pad(x, pad), k, stride, 0, ceil_mode=ceil, count_include_pad=True)

    return run


def _clip(m: OnnxModule, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    lo = at.get("min") if "min" in at else (float(m.const(ins[1])) if len(ins) > 1 and ins[1] else None)
    hi = at.get("max") if "max" in at else (float(m.const(ins[2])) if len(ins) > 2 and ins[2] else None)
    return torch.clamp(get(ins[0]), lo, hi)


def _flatten(m: OnnxModule, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    x = get(ins[0])
    axis = at.get("axis", 1)
    axis = axis + x.dim() if axis < 0 else axis
    lead = int(np.prod(x.shape[:axis])) if axis else 1
    return x.reshape(lead, -1)


def _gemm(m: OnnxModule, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
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


def _reshape(m: OnnxModule, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    x = get(ins[0])
    shape = [int(s) for s in m.const(ins[1]).reshape(-1)]
    if not at.get("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x.reshape(shape)


def _softmax(m: OnnxModule, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    x = get(ins[0])
    if m.opset >= 13:
        return torch.softmax(x, dim=at.get("axis", -1))
    axis = at.get("axis", 1)
    axis = axis + x.dim() if axis < 0 else axis
    flat = x.reshape(int(np.prod(x.shape[:axis])), -1)  # opset < 13: softmax over the flattened tail
    return torch.softmax(flat, dim=1).reshape(x.shape)


def _batchnorm(m: OnnxModule, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    x, scale, bias, mean, var = (get(n) for n in ins[:5])
    return F.batch_norm(x, mean, var, scale, bias, training=False, eps=at.get("epsilon", 1e-5))


def _hardsigmoid(m: OnnxModule, get: Get, ins: list[str], at: dict[str, Any]) -> torch.Tensor:
    alpha, beta = at.get("alpha", 0.2), at.get("beta", 0.5)
    if abs(alpha - 1 / 6) < 1e-6 and abs(beta - 0.5) < 1e-6:
        return F.hardsigmoid(get(ins[0]))  # one op in Core ML
    return torch.clamp(get(ins[0]) * alpha + beta, 0.0, 1.0)


_OPS: dict[str, Callable[..., Any]] = {
    "Conv": _conv,
    "Relu": lambda m, get, ins, at: torch.relu(get(ins[0])),
    "Sigmoid": lambda m, get, ins, at: torch.sigmoid(get(ins[0])),
    "Clip": _clip,
    "Add": lambda m, get, ins, at: get(ins[0]) + get(ins[1]),
    "Mul": lambda m, get, ins, at: get(ins[0]) * get(ins[1]),
    "GlobalAveragePool": lambda m, get, ins, at: get(ins[0]).mean(dim=tuple(range(2, get(ins[0]).dim())), keepdim=True),
    "Flatten": _flatten,
    "Gemm": _gemm,
    "MatMul": lambda m, get, ins, at: torch.matmul(get(ins[0]), get(ins[1])),
    "Reshape": _reshape,
    "Concat": lambda m, get, ins, at: torch.cat([get(n) for n in ins], dim=at["axis"]),
    "MaxPool": _pool("max"),
    "AveragePool": _pool("avg"),
    "HardSigmoid": _hardsigmoid,
    "Softmax": _softmax,
    "BatchNormalization": _batchnorm,
    "Identity": lambda m, get, ins, at: get(ins[0]),
}
assert set(_OPS) == set(SUPPORTED) | {"Identity"}
