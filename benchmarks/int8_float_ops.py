#!/usr/bin/env python3
"""Which ops of an onnxruntime int8 (QDQ) bundle still compute in float, and why (issue #25 item 5).

An x86-cpu int8 bundle is a QDQ graph: QuantizeLinear/DequantizeLinear pairs around the ops the
quantizer covered. onnxruntime fuses ``DQ -> op -> Q`` into an int8 kernel (QLinearConv, QGemm,
QLinearAdd, ...) where it has one; every other op runs in float between a DequantizeLinear and a
QuantizeLinear (or with no QDQ at all). This script builds the bundle (or takes one), lets
onnxruntime optimise it as the runner does (``graph_optimization_level = all``) and writes the
optimised graph (``SessionOptions.optimized_model_filepath``), then lists per op type:

  int8 kernels     the fused QLinear*/QGemm/ConvInteger/MatMulInteger nodes
  int8 data        Reshape/Transpose/Split/MaxPool/Resize/Concat... moving int8 tensors (no arithmetic)
  float, in QDQ    float ops fed by a DequantizeLinear: quantized by the recipe, but onnxruntime has no
                   int8 kernel (or fusion) for them, so they run in float with a DQ/Q round trip
  float            other float ops: kept in float by the recipe (mixed precision ``nodes_to_exclude``,
                   the quantizer's op list); the bundle's mixed-precision search is printed too
  Q / DQ           the conversions themselves

and times the fp32 and int8 bundles' runners interleaved (speed-up = fp32 p50 / int8 p50).

    .venv/bin/python benchmarks/int8_float_ops.py --workdir /tmp/i8 --model yolov8n-320
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
from vs_runtime_defaults import CONV_NETS, MODELS  # noqa: E402

INT8_KERNELS = {
    "QLinearConv",
    "QGemm",
    "QLinearMatMul",
    "ConvInteger",
    "MatMulInteger",
    "QLinearAdd",
    "QLinearMul",
    "QLinearSigmoid",
    "QLinearLeakyRelu",
    "QLinearConcat",
    "QLinearAveragePool",
    "QLinearGlobalAveragePool",
    "QLinearSoftmax",
    "QLinearReduceMean",
    "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat",
    "QAttention",
    "QLinearWhere",
}
# moved as int8 without arithmetic: fine in a QDQ graph when both sides are quantized
DATA_MOVEMENT = {
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
}


def optimized_graph(artifact: Path, out: Path) -> Any:
    import onnx
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(out)
    so.log_severity_level = 3
    ort.InferenceSession(str(artifact), so, providers=["CPUExecutionProvider"])
    return onnx.load(str(out)).graph


def classify(graph: Any) -> tuple[Counter, Counter, Counter, Counter, Counter]:
    """(int8 kernels, int8 data movement, float ops fed by a DQ, other float ops, Q/DQ) by op type. A tensor is
    int8 when an int8 kernel or a QuantizeLinear made it, or a data-movement op moved an int8 tensor."""
    producer = {o: n for n in graph.node for o in n.output}
    int8: set[str] = set()
    kernels, moves, in_qdq, plain, qdq = Counter(), Counter(), Counter(), Counter(), Counter()
    for n in graph.node:  # topologically sorted, as ONNX requires
        op = n.op_type
        if op in ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"):
            qdq[op] += 1
            if op != "DequantizeLinear":
                int8.update(n.output)
        elif op in INT8_KERNELS:
            kernels[op] += 1
            int8.update(n.output)
        elif n.input and n.input[0] in int8 and (op in DATA_MOVEMENT or op.startswith("Nhwc")):
            moves[op] += 1
            int8.update(n.output)
        elif any(i in producer and producer[i].op_type == "DequantizeLinear" for i in n.input):
            in_qdq[op] += 1
        else:
            plain[op] += 1
    return kernels, moves, in_qdq, plain, qdq


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--model", default="yolov8n-320", choices=list(CONV_NETS))
    p.add_argument("-n", "--iterations", type=int, default=60)
    args = p.parse_args()
    work = Path(args.workdir)
    file, kw = CONV_NETS[args.model]
    bundles = {
        prec: C.convert_cached(
            MODELS / file,
            "x86-cpu",
            work / f"{args.model}-x86-cpu-{prec}",
            reuse=True,
            precision=prec,
            calib="random",
            parity_samples=8,
            **kw,
        )
        for prec in ("fp32", "int8")
    }
    b8 = bundles["int8"]
    with tempfile.TemporaryDirectory() as tmp:
        kernels, moves, in_qdq, excluded, qdq = classify(optimized_graph(b8.artifact, Path(tmp) / "opt.onnx"))
        f32_ops = Counter(n.op_type for n in optimized_graph(bundles["fp32"].artifact, Path(tmp) / "f32.onnx").node)
    kept = next(
        (
            s.get("details", {}).get("mixed_precision_search", {})
            for s in b8.manifest.get("chain", [])
            if isinstance(s.get("details"), dict)
        ),
        {},
    )
    rows = [[op, n, "int8 kernel"] for op, n in kernels.most_common()]
    rows += [[op, n, "int8 data (moves int8 tensors, no arithmetic)"] for op, n in moves.most_common()]
    rows += [
        [op, n, "float, between DQ and Q: no int8 kernel or fusion for it in onnxruntime's CPU provider"]
        for op, n in in_qdq.most_common()
    ]
    rows += [
        [op, n, "float, fed by float ops: inside a float island (GELU/hard-swish parts) or kept float by the recipe"]
        for op, n in excluded.most_common()
    ]
    rows += [[op, n, "conversion"] for op, n in qdq.most_common()]
    print(
        C.table(
            ["op", "count", "computes in"],
            rows,
            title=f"{args.model} x86-cpu int8, onnxruntime's optimised graph ({sum(kernels.values())} int8 "
            f"kernels, {sum(moves.values())} int8 moves, {sum(in_qdq.values()) + sum(excluded.values())} "
            "float ops)",
        )
    )
    print(
        f"fp32 bundle, optimised: {sum(f32_ops.values())} nodes: "
        + ", ".join(f"{op} {n}" for op, n in f32_ops.most_common(8))
    )
    if kept:
        print(f"mixed precision search: {kept}")
    from edge.bench import bundle_feeds

    feeds, _ = bundle_feeds(bundles["fp32"])
    runners = {k: b.open_runner() for k, b in bundles.items()}
    try:
        got = C.interleaved({k: (r.infer, (feeds,)) for k, r in runners.items()}, args.iterations, block=10, warmup=5)
    finally:
        for r in runners.values():
            r.close()
    f32, i8 = float(np.median(got["fp32"])), float(np.median(got["int8"]))
    print(f"p50 fp32 {f32:.2f} ms, int8 {i8:.2f} ms: int8 speed-up {f32 / i8:.2f}x ({C.host_line(C.host_info())})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
