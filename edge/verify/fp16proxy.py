"""The fp16 proxy: the source ONNX run on this host with every intermediate tensor rounded to fp16.

A device that computes in fp16 (TensorRT on a Jetson, the Apple Neural Engine) stores every activation in
fp16: a value above 65,504 becomes inf, one below 2^-25 becomes 0. The host's parity runs the graph in f32
and cannot see either. This proxy inserts a Cast(fp16) -> Cast(fp32) pair after every float tensor (graph
inputs, initializers and every node's outputs) and runs the result in onnxruntime with its graph optimizations
off (so no fusion removes a pair); the fp32 value before each rounding is exposed too, so every node whose
output overflows or underflows is named.

What it does NOT model: accumulation precision (a kernel may accumulate a convolution or a reduction in fp32,
or in fp16, inside one op: here every op computes in f32 between roundings), fused kernels (a fused LayerNorm,
attention or conv+activation keeps its intermediates out of fp16 storage), layers a builder keeps in fp32
(TensorRT's precision choices, Core ML's per-op fallbacks), subnormal flushing, int8, and nodes inside
control-flow subgraphs (If/Loop/Scan: left in f32, counted). It is labelled "fp16 proxy" wherever it appears.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

LABEL = "fp16 proxy"
FP16_MAX = 65504.0
#: below half the smallest fp16 subnormal (2^-24) a value rounds to zero
FP16_ZERO_BELOW = 2.0**-25
NOT_MODELLED = (
    "every float tensor rounded to fp16 between ops computed in f32 (onnxruntime, optimizations off); "
    "not modelled: accumulation precision inside a kernel, fused kernels (LayerNorm, attention, conv+activation), "
    "layers the device's builder keeps in fp32, subnormal flushing, control-flow subgraphs"
)
_RAW = "__edgekit_f32"
_HALF = "__edgekit_f16"
_ROUNDED = "__edgekit_rounded"


@dataclass(frozen=True)
class Rounded:
    """One float tensor the proxy rounds: the node that produced it (None: a graph input or an initializer)."""

    tensor: str
    node: str | None
    op: str | None


@dataclass
class TensorRange:
    """What rounding to fp16 did to one tensor over every sample."""

    tensor: str
    node: str | None
    op: str | None
    overflow: int = 0  # finite values above 65,504 in magnitude: inf in fp16
    underflow: int = 0  # non-zero values that round to 0 in fp16
    max_abs: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "tensor": self.tensor,
            "node": self.node,
            "op": self.op,
            "overflow": self.overflow,
            "underflow": self.underflow,
            "max_abs": _finite(self.max_abs),
        }

    def describe(self) -> str:
        where = f"node {self.node!r} ({self.op})" if self.node is not None else f"input/weight {self.tensor!r}"
        return f"{where}: {self.overflow} values above 65504 (max |x| {self.max_abs:.4g})"


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


@dataclass
class Fp16ProxyReport:
    """The proxy's parity against the f32 reference, with fp16 overflow/underflow per output and per node."""

    passed: bool
    thresholds: Any
    samples: int
    outputs: list[Any]  # edge.verify.parity.OutputParity
    per_output: list[TensorRange]
    overflowed: list[TensorRange]  # nodes (in graph order) whose output overflowed: the first is the culprit
    rounded: int  # float tensors rounded
    subgraph_nodes: int  # nodes inside control-flow subgraphs, left in f32
    failures: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {
            "label": LABEL,
            "passed": self.passed,
            "thresholds": self.thresholds.to_json(),
            "samples": self.samples,
            "tensors_rounded": self.rounded,
            "subgraph_nodes_in_f32": self.subgraph_nodes,
            "not_modelled": NOT_MODELLED,
            "outputs": [
                {**{k: v for k, v in asdict(o).items() if k != "failures"}, "passed": o.passed, "failures": o.failures}
                for o in self.outputs
            ],
            "ranges": [r.to_json() for r in self.per_output],
            "overflowed_nodes": [r.to_json() for r in self.overflowed[:16]],
            "overflowed_count": len(self.overflowed),
            "failures": self.failures,
        }

    def summary(self) -> str:
        cos = ", ".join(f"{o.name} cosine {o.cosine:.6f}" for o in self.outputs)
        over = f"; overflow first at {self.overflowed[0].describe()}" if self.overflowed else ""
        return f"{LABEL}: {cos}{over}"


def fp16_rounded_model(model: Any) -> tuple[Any, list[Rounded], int]:
    """``model`` (an onnx ModelProto) with a Cast(fp16) -> Cast(fp32) pair after every float tensor of the main
    graph, each tensor's unrounded value exposed as an extra graph output; (the model, what is rounded, the
    number of nodes inside subgraphs, not rounded)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    try:
        typed = onnx.shape_inference.infer_shapes(m, strict_mode=False)
    except Exception:  # noqa: BLE001 - a graph shape inference cannot read: types from what it declares only
        typed = m
    g = m.graph
    floats = {
        vi.name: vi
        for vi in [*typed.graph.value_info, *typed.graph.input, *typed.graph.output]
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT
    }
    # weights are stored in fp16 on the device: round them in place
    for i, init in enumerate(g.initializer):
        if init.data_type == TensorProto.FLOAT:
            arr = numpy_helper.to_array(init)
            g.initializer[i].CopyFrom(numpy_helper.from_array(arr.astype(np.float16).astype(np.float32), init.name))
    rounded: list[Rounded] = []

    def pair(name: str, node: str | None, op: str | None) -> tuple[str, list[Any]]:
        """The rounded value keeps ``name``; returns the name the unrounded value now has and the two Casts."""
        raw = f"{name}{_RAW}"
        rounded.append(Rounded(name, node, op))
        casts = [
            helper.make_node("Cast", [raw], [f"{name}{_HALF}"], to=TensorProto.FLOAT16, name=f"{name}{_HALF}_cast"),
            helper.make_node("Cast", [f"{name}{_HALF}"], [name], to=TensorProto.FLOAT, name=f"{name}{_RAW}_cast"),
        ]
        return raw, casts

    nodes: list[Any] = []
    inits = {i.name for i in g.initializer}
    fed = {}  # a float graph input -> its rounded copy, which every node reads instead
    for inp in g.input:
        if inp.type.tensor_type.elem_type == TensorProto.FLOAT and inp.name not in inits:
            fed[inp.name] = f"{inp.name}{_ROUNDED}"
            nodes.append(helper.make_node("Cast", [inp.name], [f"{inp.name}{_HALF}"], to=TensorProto.FLOAT16))
            nodes.append(helper.make_node("Cast", [f"{inp.name}{_HALF}"], [fed[inp.name]], to=TensorProto.FLOAT))
    for node in g.node:
        for k, name in enumerate(node.input):
            if name in fed:
                node.input[k] = fed[name]
    subgraph_nodes = 0
    for node in g.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                subgraph_nodes += len(a.g.node)
            elif a.type == onnx.AttributeProto.GRAPHS:
                subgraph_nodes += sum(len(s.node) for s in a.graphs)
        after: list[Any] = []
        for k, out in enumerate(node.output):
            if out and out in floats:
                raw, casts = pair(out, node.name or f"#{len(nodes)}", node.op_type)
                node.output[k] = raw
                after.extend(casts)
        kept = onnx.NodeProto()
        kept.CopyFrom(node)
        nodes.append(kept)
        nodes.extend(after)
    del g.node[:]
    g.node.extend(nodes)
    for r in rounded:
        exposed = onnx.ValueInfoProto()
        exposed.CopyFrom(floats[r.tensor])
        exposed.name = f"{r.tensor}{_RAW}"
        g.output.append(exposed)
    del g.value_info[:]
    return m, rounded, subgraph_nodes


def run_fp16_proxy(
    source_onnx: Path,
    samples: Sequence[Mapping[str, np.ndarray]],
    reference: Sequence[Mapping[str, np.ndarray]],
    *,
    task: str | Mapping[str, str] = "auto",
) -> Fp16ProxyReport:
    """The fp16 proxy of ``source_onnx`` on ``samples`` against ``reference`` (the f32 source's outputs on
    them), with fp16's parity thresholds; fails where an output differs beyond them or is not finite, naming
    the first node (in graph order) whose output overflowed fp16."""
    import onnx
    import onnxruntime as ort

    from edge.verify.parity import compare, thresholds_for

    proxy, rounded, in_subgraphs = fp16_rounded_model(onnx.load(str(source_onnx)))
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(proxy.SerializeToString(), so, providers=["CPUExecutionProvider"])
    out_names = [n for n in reference[0]]
    ranges = {r.tensor: TensorRange(r.tensor, r.node, r.op) for r in rounded}
    cands: list[dict[str, np.ndarray]] = []
    for s in samples:
        raw_names = [f"{r.tensor}{_RAW}" for r in rounded]
        got = sess.run([*out_names, *raw_names], dict(s))
        cands.append(dict(zip(out_names, got[: len(out_names)])))
        for r, v in zip(rounded, got[len(out_names) :]):
            _tally(ranges[r.tensor], np.asarray(v))
    th = thresholds_for("fp16")
    outputs = compare(list(reference), cands, th, task=task)
    overflowed = [ranges[r.tensor] for r in rounded if ranges[r.tensor].overflow]
    failures = [f"{o.name}: {f}" for o in outputs for f in o.failures]
    for name in out_names:
        bad = sum(int(np.count_nonzero(~np.isfinite(np.asarray(c[name], dtype=np.float64)))) for c in cands)
        if bad and not any(f.startswith(f"{name}: ") for f in failures):
            failures.append(f"{name}: {bad} values not finite in fp16")
    if failures and overflowed:
        failures.append(f"fp16 overflow first at {overflowed[0].describe()}")
    per_output = [ranges.get(n) or TensorRange(n, None, None) for n in out_names]
    return Fp16ProxyReport(
        passed=not failures,
        thresholds=th,
        samples=len(samples),
        outputs=outputs,
        per_output=per_output,
        overflowed=overflowed,
        rounded=len(rounded),
        subgraph_nodes=in_subgraphs,
        failures=failures,
    )


def _tally(r: TensorRange, v: np.ndarray) -> None:
    if v.size == 0:
        return
    a = np.abs(v.astype(np.float64, copy=False))
    finite = np.isfinite(a)
    r.overflow += int(np.count_nonzero(finite & (a > FP16_MAX)))
    r.underflow += int(np.count_nonzero((a > 0) & (a < FP16_ZERO_BELOW)))
    if finite.any():
        r.max_abs = max(r.max_abs, float(a[finite].max()))
