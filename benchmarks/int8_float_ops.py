#!/usr/bin/env python3
"""Which ops of an onnxruntime int8 (QDQ) bundle still compute in float, and why (issue #25 item 5).

An x86-cpu int8 bundle is a QDQ graph: QuantizeLinear/DequantizeLinear pairs around the ops the
quantizer covered. onnxruntime fuses ``DQ -> op -> Q`` into an int8 kernel (QLinearConv, QGemm,
QLinearAdd, ...) where it has one; every other op runs in float between a DequantizeLinear and a
QuantizeLinear (or with no QDQ at all). The analysis is the product's (``edge.graph.quantized``: every
int8 bundle's manifest carries it as ``chain[].details.int8_report``): the int8 graph as onnxruntime
optimises it on this host (``graph_optimization_level = all``, as the runner loads it), per op type

  int8 kernels     the fused QLinear*/QGemm/ConvInteger/MatMulInteger nodes
  int8 data        Reshape/Transpose/Split/MaxPool/Resize/Concat... moving int8 tensors (no arithmetic)
  float            with the reason: kept float by edgekit's mixed-precision search (``excluded``), no rule in
                   onnxruntime's quantizer (``quantizer``), quantized around but no int8 kernel or fusion in
                   the CPU provider (``no-kernel``: QDQ placement), or fed by float ops (``float-inputs``)
  Q / DQ           the boundaries between int8 and float (activations only)

and times the fp32 and int8 bundles' runners interleaved (speed-up = fp32 p50 / int8 p50).

    .venv/bin/python benchmarks/int8_float_ops.py --workdir /tmp/i8 --model yolov8n-320
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
from vs_runtime_defaults import CONV_NETS, MODELS  # noqa: E402

from edge.graph.quantized import FLOAT_REASONS, int8_report_of, optimized_onnx, placement_of, speedup_line  # noqa: E402


def main() -> int:
    C.print_measured_on()  # the CPU's ISA class and the load, with every figure
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
    kept = [k["node"] for s in b8.manifest.get("chain", []) for k in (s.get("details") or {}).get("kept_float", [])]
    placement = placement_of(b8.artifact, kept)  # what the bundle's manifest records (int8_report), recomputed here
    with tempfile.TemporaryDirectory() as tmp:
        f32_ops = Counter(
            n.op_type for n in optimized_onnx(bundles["fp32"].artifact, Path(tmp) / "f32.onnx").graph.node
        )
    rows = [[op, n, "int8 kernel"] for op, n in placement.int8_kernels.items()]
    rows += [[op, n, "int8 data (moves int8 tensors, no arithmetic)"] for op, n in placement.int8_data.items()]
    rows += [[f.op, f.count, f"float: {FLOAT_REASONS[f.reason]}"] for f in placement.float_ops]
    rows += [["QuantizeLinear", placement.quantize, "boundary"], ["DequantizeLinear", placement.dequantize, "boundary"]]
    print(
        C.table(
            ["op", "count", "computes in"],
            rows,
            title=f"{args.model} x86-cpu int8, onnxruntime's optimised graph: {placement.summary()}",
        )
    )
    print(
        f"fp32 bundle, optimised: {sum(f32_ops.values())} nodes: "
        + ", ".join(f"{op} {n}" for op, n in f32_ops.most_common(8))
    )
    speed = (int8_report_of(b8.manifest.get("chain", [])) or {}).get("speedup")
    if speed:
        print(speedup_line(speed))
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
