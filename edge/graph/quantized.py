"""Is an ONNX graph already quantized, and how (issue #23, class 5).

A quantized ONNX carries its own integer arithmetic: Q/DQ pairs around float ops (QDQ), integer operators
(QOperator: QLinearConv, QGemm ...), run-time activation quantization (dynamic: DynamicQuantizeLinear,
MatMulInteger ...), or int8 weights dequantized on load (weight-only). Its float weights are gone:
edgekit cannot make it fp32, and quantizing it again either breaks onnxruntime's quantizer
(``KeyError: '140_scale'``) or stacks a second rounding on the first. The pipeline reads this first and
keeps the file's own quantization as the bundle's precision (``edge.pipeline.plan``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

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
