"""Is an ONNX graph already quantized, and how (issue #23, class 5).

A quantized ONNX carries its own integer arithmetic: Q/DQ pairs around float ops (QDQ), integer operators
(QOperator: QLinearConv, QGemm ...), run-time activation quantization (dynamic: DynamicQuantizeLinear,
MatMulInteger ...), or int8 weights dequantized on load (weight-only). Its float weights are gone:
edgekit cannot make it fp32, and quantizing it again either breaks onnxruntime's quantizer
(``KeyError: '140_scale'``) or stacks a second rounding on the first. The pipeline reads this first and
keeps the file's own quantization as the bundle's precision (``edge.pipeline.plan``).
"""

from __future__ import annotations

import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

#: integer operators: the activations between them are integers (static quantization)
QOPERATOR = frozenset(
    {
        "QLinearConv",
        "QLinearMatMul",
        "QLinearAdd",
        "QLinearMul",
        "QLinearSigmoid",
        "QLinearLeakyRelu",
        "QLinearAveragePool",
        "QLinearGlobalAveragePool",
        "QLinearConcat",
        "QLinearSoftmax",
        "QLinearReduceMean",
        "QLinearWhere",
        "QLinearConvTranspose",
        "QGemm",
        "QAttention",
        "QEmbedLayerNormalization",
        "QOrderedMatMul",
        "QOrderedAttention",
    }
)
#: activations quantized at run time
DYNAMIC = frozenset(
    {
        "DynamicQuantizeLinear",
        "DynamicQuantizeMatMul",
        "DynamicQuantizeLSTM",
        "MatMulInteger",
        "ConvInteger",
        "MatMulIntegerToFloat",
        "GatherBlockQuantized",
    }
)
#: low-bit weights unpacked inside one op
WEIGHT_ONLY = frozenset({"MatMulNBits", "MatMulBnb4", "MatMulFpQ4"})
_INT = {2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 21: "uint4", 22: "int4"}  # onnx.TensorProto data types


@dataclass(frozen=True)
class Quantization:
    """How a graph is quantized: ``scheme`` (QDQ, QOperator, dynamic, weight-only), the precision edgekit records
    for it (``int8``: activations are integers; ``int8-dynamic``: activations quantized at run time; ``fp32``:
    weight-only, float arithmetic on integer weights dequantized exactly, converted like any float graph) and the
    counts of the ops that say so."""

    scheme: str
    precision: str
    ops: dict[str, int]

    def describe(self) -> str:
        counted = ", ".join(f"{n} {op}" for op, n in sorted(self.ops.items(), key=lambda kv: (-kv[1], kv[0]))[:4])
        return f"{self.scheme}: {counted}"

    def to_json(self) -> dict[str, Any]:
        return {"scheme": self.scheme, "precision": self.precision, "ops": dict(self.ops)}


def quantization_of(model: Any) -> Quantization | None:
    """The quantization an ``onnx.ModelProto`` already carries, or None for a float graph. QDQ counts only where
    an activation is quantized (a QuantizeLinear whose input is not an initializer); DequantizeLinear of integer
    initializers alone is weight-only."""
    graph = model.graph
    ops = Counter(n.op_type for n in graph.node)
    for fn in getattr(model, "functions", ()):
        ops.update(n.op_type for n in fn.node)
    inits = {t.name for t in graph.initializer}
    found = {
        op: ops[op]
        for op in sorted(QOPERATOR | DYNAMIC | WEIGHT_ONLY | {"QuantizeLinear", "DequantizeLinear"})
        if ops.get(op)
    }
    if any(op in QOPERATOR for op in found):
        return Quantization("QOperator", "int8", found)
    activations = [n for n in graph.node if n.op_type == "QuantizeLinear" and n.input and n.input[0] not in inits]
    if activations:
        return Quantization("QDQ", "int8", found)
    if any(op in DYNAMIC for op in found):
        return Quantization("dynamic", "int8-dynamic", found)
    int_weights = {t.name for t in graph.initializer if t.data_type in _INT}
    dq_weights = [n for n in graph.node if n.op_type == "DequantizeLinear" and n.input and n.input[0] in int_weights]
    if dq_weights or any(op in WEIGHT_ONLY for op in found):  # float arithmetic on exactly dequantized weights
        return Quantization("weight-only", "fp32", found)
    return None


# -- what an int8 graph computes in float, and why (issue #25 item 5) --------------------------------------

#: integer kernels onnxruntime's CPU provider fuses ``DequantizeLinear -> op -> QuantizeLinear`` into
INT8_KERNELS = QOPERATOR | frozenset({"ConvInteger", "MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"})
#: ops that move an int8 tensor without arithmetic: int8 in, int8 out when their input is int8
DATA_MOVEMENT = frozenset(
    {
        "Reshape",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Flatten",
        "Slice",
        "Split",
        "Gather",
        "MaxPool",
        "Resize",
        "Concat",
        "Identity",
        "SpaceToDepth",
        "DepthToSpace",
    }
)
#: shape arithmetic (int64) and onnxruntime's NCHWc layout reorders: no float compute
_SHAPE_OPS = frozenset({"Shape", "Size", "Constant", "ConstantOfShape", "Range", "ReorderInput", "ReorderOutput"})
_CONVERSIONS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})

#: why an op of an int8 graph computes in float
FLOAT_REASONS = {
    "excluded": "kept in float for accuracy by edgekit's mixed-precision search (nodes_to_exclude)",
    "quantizer": "not quantized: onnxruntime's quantizer has no rule for this op type",
    "no-kernel": "QDQ placement: the recipe quantized around it, but onnxruntime's CPU provider has no int8 "
    "kernel or fusion for it, so it computes in float between a DequantizeLinear and a QuantizeLinear",
    "float-inputs": "fed by float tensors only: next to ops that stayed in float, or the graph's float input",
    "nncf": "not quantized by NNCF: no FakeQuantize on its inputs in the IR",
    "cpu-plugin": "quantized in the IR (a FakeQuantize feeds it), but OpenVINO's CPU plugin computes it in float",
}
_MAX_ROWS = 64


@dataclass(frozen=True)
class FloatOps:
    """``count`` ops of type ``op`` that compute in float in an int8 graph, for ``reason`` (a FLOAT_REASONS key)."""

    op: str
    count: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "count": self.count, "reason": self.reason, "why": FLOAT_REASONS[self.reason]}


@dataclass(frozen=True)
class Int8Placement:
    """What an int8 (QDQ) graph computes in int8 and in float once onnxruntime has optimised it as the runner does:
    its int8 kernels and int8 data moves by op type, the ops left in float with the reason, and the quantize /
    dequantize boundaries between them (activations only: weights dequantized once on load are not counted)."""

    int8_kernels: dict[str, int]
    int8_data: dict[str, int]
    float_ops: tuple[FloatOps, ...]
    quantize: int
    dequantize: int
    nodes: int

    @property
    def boundaries(self) -> int:
        return self.quantize + self.dequantize

    @property
    def float_count(self) -> int:
        return sum(f.count for f in self.float_ops)

    def summary(self) -> str:
        """One line for the convert report."""
        if not self.float_ops:
            floats = "no op stays in float"
        else:
            worst = ", ".join(f"{f.op} {f.count} ({f.reason})" for f in self.float_ops[:5])
            more = f", {len(self.float_ops) - 5} more op types" if len(self.float_ops) > 5 else ""
            n = self.float_count
            floats = f"{n} op{' stays' if n == 1 else 's stay'} in float: {worst}{more}"
        return (
            f"int8: {sum(self.int8_kernels.values())} int8 kernels, {floats}; "
            f"{self.boundaries} quantize/dequantize boundaries ({self.quantize} Q, {self.dequantize} DQ)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "int8_kernels": dict(self.int8_kernels),
            "int8_data": dict(self.int8_data),
            "float_ops": [f.to_json() for f in self.float_ops[:_MAX_ROWS]],
            "float_op_count": self.float_count,
            "quantize": self.quantize,
            "dequantize": self.dequantize,
            "boundaries": self.boundaries,
            "nodes": self.nodes,
        }


def quantizer_op_types() -> frozenset[str]:
    """The op types onnxruntime's static quantizer quantizes by default (its QLinear and QDQ registries)."""
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    return frozenset(QLinearOpsRegistry) | frozenset(QDQRegistry)


def _is_kept(node: Any, kept: frozenset[str]) -> bool:
    """Whether ``node`` is (or was fused from) a node edgekit kept float: onnxruntime renames what it rewrites, a
    fusion to "<node>/QuickGeluFusion/", an NCHWc convolution to "<its output>_nchwc"; ``kept`` holds the kept
    nodes' names and output tensors."""
    name = node.name
    return (
        name in kept
        or name.split("/", 1)[0] in kept
        or name.removesuffix("_nchwc") in kept
        or any(o in kept for o in node.output)
    )


def _float_reason(node: Any, producer: Mapping[str, Any], kept: frozenset[str], quantizable: frozenset[str]) -> str:
    if kept and _is_kept(node, kept):
        return "excluded"
    fed_by_dq = any(i in producer and producer[i].op_type == "DequantizeLinear" for i in node.input)
    if node.op_type not in quantizable and not node.op_type.startswith(("QuickGelu", "Fused")):
        return "quantizer"
    return "no-kernel" if fed_by_dq else "float-inputs"


def int8_placement(
    graph: Any, *, kept_float: Iterable[str] = (), quantizable: frozenset[str] = frozenset()
) -> Int8Placement:
    """Sort the nodes of an optimised int8 ``onnx.GraphProto`` (topologically sorted, as ONNX requires). A tensor is
    int8 when an int8 kernel or a QuantizeLinear made it, or a data-movement op moved an int8 tensor; every other
    op with arithmetic computes in float. ``kept_float``: the node names edgekit excluded from quantization;
    ``quantizable``: the quantizer's op types (:func:`quantizer_op_types`)."""
    producer = {o: n for n in graph.node for o in n.output}
    inits = {t.name for t in graph.initializer}
    kept = frozenset(kept_float)
    int8: set[str] = set()
    kernels: Counter[str] = Counter()
    moves: Counter[str] = Counter()
    floats: Counter[tuple[str, str]] = Counter()
    q = dq = 0
    for n in graph.node:
        op = n.op_type
        if op in _CONVERSIONS:
            if op == "DequantizeLinear":
                dq += bool(n.input) and n.input[0] not in inits  # a weight dequantized once on load: no boundary
            else:
                q += 1
                int8.update(n.output)
        elif op in INT8_KERNELS:
            kernels[op] += 1
            int8.update(n.output)
        elif n.input and n.input[0] in int8 and (op in DATA_MOVEMENT or op.startswith("Nhwc")):
            moves[op] += 1
            int8.update(n.output)
        elif op not in _SHAPE_OPS:
            floats[(op, _float_reason(n, producer, kept, quantizable))] += 1
    rows = tuple(FloatOps(op, c, why) for (op, why), c in sorted(floats.items(), key=lambda kv: (-kv[1], kv[0])))
    return Int8Placement(dict(kernels.most_common()), dict(moves.most_common()), rows, q, dq, len(graph.node))


def optimized_onnx(artifact: Path, out: Path) -> Any:
    """``artifact`` as onnxruntime's CPU provider optimises it on this host (``graph_optimization_level`` all, as the
    runner loads it), written to ``out`` and loaded back (an ``onnx.ModelProto``)."""
    import onnx
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(out)
    so.log_severity_level = 3
    ort.InferenceSession(str(artifact), so, providers=["CPUExecutionProvider"])
    return onnx.load(str(out))


def placement_of(artifact: Path, kept_float: Iterable[str] = ()) -> Int8Placement:
    """:func:`int8_placement` of an int8 ONNX file as onnxruntime optimises it on this host; ``kept_float``: the
    node names edgekit excluded from quantization (their output tensors are matched too: onnxruntime renames)."""
    import onnx

    kept = set(kept_float)
    if kept:
        kept |= {o for n in onnx.load(str(artifact)).graph.node if n.name in kept for o in n.output}
    with tempfile.TemporaryDirectory(prefix="edgekit-q8-") as tmp:
        model = optimized_onnx(artifact, Path(tmp) / "optimized.onnx")
    return int8_placement(model.graph, kept_float=kept, quantizable=quantizer_op_types())


def int8_report_of(chain: Iterable[Any]) -> dict[str, Any] | None:
    """The int8 report a manifest's chain carries (``details.int8_report`` of its onnxruntime step), or None."""
    for step in chain:
        details = step.get("details") if isinstance(step, Mapping) else getattr(step, "details", None)
        report = details.get("int8_report") if isinstance(details, Mapping) else None
        if isinstance(report, Mapping):
            return dict(report)
    return None


def speedup_line(speed: Mapping[str, Any]) -> str:
    """One line for a measured int8 vs fp32 speed-up (convert and bench reports)."""
    ratio, threads = float(speed["ratio"]), speed["threads"]
    verdict = (
        "pays" if ratio >= 1.1 else "does not pay (fp32 is as fast or faster here)" if ratio <= 1.0 else "pays little"
    )
    return (
        f"int8 vs fp32 measured at build: {ratio:.2f}x (p50 {speed['fp32_p50_ms']:.3g} ms fp32, "
        f"{speed['int8_p50_ms']:.3g} ms int8, {threads} thread{'s' if threads != 1 else ''}, {speed['int8_kernel']}, "
        f"load {speed['load']:.2f}): int8 {verdict}"
    )


#: OpenVINO CPU runtime layers that compute nothing (layout, constants, ports)
_OV_NON_COMPUTE = frozenset(
    {"Input", "Output", "Const", "Reorder", "Reshape", "Parameter", "Result", "Constant", "Convert"}
)
_OV_INT8 = frozenset({"u8", "i8"})


def openvino_int8_placement(xml: Path, core: Any) -> Int8Placement:
    """What an int8 (NNCF) IR computes in int8 and in float in OpenVINO's CPU plugin on this host, compiled with
    f32 for the layers left in float (bf16 CPUs compute those in bf16 by default): int8 layers by runtime layer
    type, float layers by the IR op types fused into them, with the reason (``nncf``: no FakeQuantize feeds it;
    ``cpu-plugin``: quantized in the IR but computed in float), and the boundaries: float layers that write int8
    (quantize) and int8 layers that write float (dequantize)."""
    model = core.read_model(str(xml))
    kinds = {op.get_friendly_name(): op.get_type_name() for op in model.get_ordered_ops()}
    fq_fed = {
        op.get_friendly_name()
        for op in model.get_ordered_ops()
        if any(i.get_source_output().get_node().get_type_name() == "FakeQuantize" for i in op.inputs())
    }
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    kernels: Counter[str] = Counter()
    floats: Counter[tuple[str, str]] = Counter()
    q = dq = nodes = 0
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        layer = info["layerType"].astype(str) if "layerType" in info else ""
        nodes += 1
        if not layer or layer in _OV_NON_COMPUTE or "runtimePrecision" not in info:
            continue
        runtime = info["runtimePrecision"].astype(str).lower()
        out = set(info["outputPrecisions"].astype(str).lower().split(",")) if "outputPrecisions" in info else set()
        names = (
            [n for n in info["originalLayersNames"].astype(str).split(",") if n]
            if "originalLayersNames" in info
            else []
        )
        if runtime in _OV_INT8:
            kernels[layer] += 1
            dq += bool(out - _OV_INT8)
            continue
        q += bool(out & _OV_INT8)
        computed = [n for n in names if kinds.get(n, "FakeQuantize") != "FakeQuantize"]
        for name in computed:  # a fused subgraph: the IR ops it computes, each with its own reason
            floats[(kinds[name], "cpu-plugin" if name in fq_fed else "nncf")] += 1
    rows = tuple(FloatOps(op, c, why) for (op, why), c in sorted(floats.items(), key=lambda kv: (-kv[1], kv[0])))
    return Int8Placement(dict(kernels.most_common()), {}, rows, q, dq, nodes)
