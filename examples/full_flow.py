#!/usr/bin/env python3
"""The whole edgekit flow on the example MobileNetV2, through the Python API.

    python examples/full_flow.py            # writes under examples/out/

build the model -> convert for x86-cpu (fp32, int8) and intel-igpu (fp16) -> parity (inside
convert) -> benchmark against a 60 fps budget -> deploy to a local device store -> roll back.
Everything runs offline on this host; the intel-igpu bundle runs on OpenVINO's CPU fallback
here, and every report says so.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from edge.bench import BenchOptions, run_benchmark
from edge.deploy import DeployOptions, DeviceStore, deploy, rollback
from edge.graph.samples import build_mobilenet_v2
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out")
    ap.add_argument("--iterations", type=int, default=100)
    args = ap.parse_args()
    out: Path = args.out
    model = build_mobilenet_v2(out / "mobilenetv2.onnx")
    print(f"model: {model}")

    for target, precision in (("x86-cpu", "fp32"), ("x86-cpu", "int8"), ("intel-igpu", "fp16")):
        calib = "random" if precision == "int8" else None
        # The example's weights are random: low-precision parity on it is far worse than on a trained
        # net (examples/models/README.md), so the int8/fp16 bundles are kept with the failure recorded.
        b = convert(
            model,
            target,
            out / "build" / f"mnv2-{target}-{precision}",
            ConvertRequest(precision=precision, calib=calib, accept_parity_failure=True),
            force=True,
            on_step=lambda m: print(f"  {m}"),
        )
        par = b.manifest["parity"]
        o = par["outputs"][0]
        print(
            f"{b.id}: parity {'pass' if par['passed'] else 'FAIL (kept)'} cosine {o['cosine']:.5f} "
            f"top-1 {o['top1']:.0%} on {par['candidate']['device_used']} ({par['candidate']['precision_used']})"
        )
        r = run_benchmark(
            b.open_runner, BenchOptions(iterations=args.iterations, budget_ms=1000 / 60, budget_source="60 fps")
        )
        print(f"  bench: p50 {r.latency.p50_ms:.2f} ms p99 {r.latency.p99_ms:.2f} ms -> {r.verdict}")

    store = out / "devices" / "cam-01"
    # deploy() refuses a bundle whose p99 misses the budget (BudgetError); a busy or slow host can
    # miss 60 fps with this model, so the example ships anyway and prints the verdict it recorded.
    first = deploy(
        model,
        "x86-cpu",
        store,
        options=DeployOptions(
            build_dir=out / "build" / "deploy-fp32", bench_iterations=args.iterations, accept_budget_failure=True
        ),
    )
    second = deploy(
        model,
        "intel-igpu",
        store,
        ConvertRequest(precision="fp32"),
        DeployOptions(
            build_dir=out / "build" / "deploy-igpu", bench_iterations=args.iterations, accept_budget_failure=True
        ),
    )
    for d in (first, second):
        bench = d.benchmark or {}
        print(f"deployed {d.bundle.id}: benchmark verdict {bench.get('verdict', 'not run')}; notes: {d.notes}")
    print(f"rollback -> {rollback(store)}; current = {DeviceStore(store).current}")


if __name__ == "__main__":
    main()
