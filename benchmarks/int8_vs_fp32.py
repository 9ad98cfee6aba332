#!/usr/bin/env python3
"""int8 (and OpenVINO fp16) against fp32: latency, speedup and parity, per model and runtime.

Bundles built (all from the same calibration source, so every precision's parity report uses
the same inputs):

  onnxruntime  x86-cpu     fp32, int8 (static QDQ, U8 activations / S8 per-channel weights)
  openvino     intel-igpu  fp32, fp16 (f16 weights), int8 (NNCF); what each computes in is what the
                           runner reads back (OpenVINO's CPU default on AMX is bf16; edgekit's runner
                           asks for f16 where the CPU lists FP16), plus per-layer runtime precisions

on two models:

  mobilenetv2  the example MobileNetV2 224x224 (deterministic random weights), calib "random"
               (32 generated frames);
  ppocr-cls    the pretrained PP-OCR text-direction classifier (input x fixed to 1x3x48x192,
               "ppocr" pre-processing), calibrated on synthetic text lines generated here:
               PIL's default font, black-ish text on white/grey, 48x192 PNG, every second one
               rotated 180 degrees (file names 000_0.png, 001_180.png, ...).

Parity comes from each bundle's manifest: ``convert()`` checks parity on the first 32
calibration samples (sorted file names: 16 upright, 16 rotated here), i.e. on data the int8
recipes were also calibrated on. As an extra, not from the manifest, every bundle is also run
on held-out inputs (generated frames with another seed / another set of text lines) and its
top-1 agreement with the source model in onnxruntime fp32 is reported, plus, for the text
lines, accuracy against the known orientation.

Latency: per (model, runtime), all its bundles' runners are open at once and timed
interleaved in round-robin blocks (order rotated every round) on the same random input
(``edge.bench.random_feeds``, seed 0, as ``edgekit bench`` uses); each block starts with
``--settle`` untimed calls. Speedup = fp32 median /
median, with a 95% bootstrap interval over paired rounds.

    .venv/bin/python benchmarks/int8_vs_fp32.py                  # ~1.5-2.5 min
    .venv/bin/python benchmarks/int8_vs_fp32.py --models ppocr-cls -n 1000 --json int8.json
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

RUNTIMES = {  # runtime -> (target, precisions in table order)
    "onnxruntime": ("x86-cpu", ("fp32", "int8")),
    "openvino": ("intel-igpu", ("fp32", "fp16", "int8")),
}
PPOCR_SHAPE = (1, 3, 48, 192)
# output index 0 = upright ("0"), 1 = rotated ("180")


# -- synthetic text lines ------------------------------------------------------------------


def text_lines(directory: Path, count: int, seed: int) -> Path:
    """``count`` 192x48 PNG text lines (edge.graph.samples), deterministic for ``seed``; odd ones rotated 180°."""
    from edge.graph.samples import write_text_line_images

    if len(list(directory.glob("*.png"))) != count:
        for old in directory.glob("*.png"):
            old.unlink()
        write_text_line_images(directory, count, height=PPOCR_SHAPE[2], width=PPOCR_SHAPE[3], seed=seed)
    return directory


def heldout_inputs(
    model_name: str, bundle: Any, heldout_dir: Path | None, count: int
) -> tuple[list[dict[str, np.ndarray]], list[int] | None]:
    """Held-out samples (not used for calibration or parity) and, for text lines, their labels."""
    from edge.preprocess import Preprocessor, read_image
    from edge.verify.inputs import generated_samples

    pre = bundle.preprocess
    if model_name == "ppocr-cls":
        assert heldout_dir is not None and pre is not None
        prep = Preprocessor(pre)
        files = sorted(heldout_dir.glob("*.png"))
        return ([{pre.input: prep(read_image(f))[0]} for f in files], [int(f.name.startswith("rot180")) for f in files])
    return generated_samples(bundle.io, pre, count, seed=4321), None


# -- main ----------------------------------------------------------------------------------


def main() -> int:
    C.print_measured_on()  # the CPU's ISA class and the load, with every figure
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    C.add_common_args(p, iterations=300)
    p.add_argument("--block", type=int, default=10, help="consecutive iterations per bundle per round (default 10)")
    p.add_argument("--warmup", type=int, default=20, help="untimed calls per bundle first (default 20)")
    p.add_argument(
        "--settle",
        type=int,
        default=1,
        help="untimed calls at the start of every block, after switching bundles (default 1)",
    )
    p.add_argument("--models", choices=("mobilenetv2", "ppocr-cls", "both"), default="both")
    p.add_argument("--runtime", choices=("onnxruntime", "openvino", "both"), default="both")
    p.add_argument("--calib-images", type=int, default=64, help="synthetic text lines for calibration (default 64)")
    p.add_argument("--heldout", type=int, default=64, help="held-out inputs per model for the extra check (default 64)")
    p.add_argument("--verbose", "-v", action="store_true", help="show converter logging")
    args = p.parse_args()
    C.json_to_stdout(args)
    if not args.verbose:
        # onnxruntime's quantizer logs a WARNING per Conv bias on PP-OCR's retry path
        logging.getLogger().setLevel(logging.ERROR)

    from edge.bench import random_feeds
    from edge.verify.parity import reference_outputs

    info = C.host_info()
    models = ("mobilenetv2", "ppocr-cls") if args.models == "both" else (args.models,)
    runtimes = tuple(RUNTIMES) if args.runtime == "both" else (args.runtime,)
    results: dict[str, Any] = {"host": info, "args": {k: v for k, v in vars(args).items() if k != "json"}, "rows": []}
    started = time.perf_counter()
    with C.workdir(args.workdir) as wd:
        reuse = bool(args.workdir)
        for model_name in models:
            if model_name == "mobilenetv2":
                src = C.mobilenet_v2(wd)
                conv_kw: dict[str, Any] = {"calib": "random"}
                heldout_dir = None
                calib_desc = "random (32 generated frames, seed 0)"
            else:
                src = C.ppocr_cls()
                calib_dir = text_lines(wd / "textlines-calib", args.calib_images, seed=0)
                heldout_dir = text_lines(wd / "textlines-heldout", args.heldout, seed=1)
                conv_kw = {"calib": str(calib_dir), "input_shapes": {"x": PPOCR_SHAPE}, "preprocess": "ppocr"}
                calib_desc = f"{args.calib_images} synthetic text lines ({calib_dir})"
            C.log(f"{model_name}: {src}; calibration {calib_desc}")
            for rt in runtimes:
                target, precisions = RUNTIMES[rt]
                bundles = {
                    prec: C.convert_cached(
                        src, target, wd / f"{model_name}-{target}-{prec}", reuse=reuse, precision=prec, **conv_kw
                    )
                    for prec in precisions
                }
                runners = {prec: b.open_runner() for prec, b in bundles.items()}
                try:
                    feeds = random_feeds(runners["fp32"], seed=0)
                    C.log(
                        f"{model_name} / {rt}: timing {', '.join(precisions)}: {args.iterations} iterations each, "
                        f"blocks of {args.block}"
                    )
                    t = C.interleaved(
                        {prec: (r.infer, (feeds,)) for prec, r in runners.items()},
                        args.iterations,
                        block=args.block,
                        warmup=args.warmup,
                        settle=args.settle,
                    )
                    # extra: held-out agreement with the source in onnxruntime fp32
                    held, labels = heldout_inputs(model_name, bundles["fp32"], heldout_dir, args.heldout)
                    ref = reference_outputs(_static_source(src, bundles["fp32"], wd), held)
                    ref_top1 = np.array([_top1(o) for o in ref])
                    for prec in precisions:
                        b, r = bundles[prec], runners[prec]
                        cand_top1 = np.array([_top1(r.infer(s)) for s in held])
                        par = b.manifest.get("parity") or {}
                        out0 = (par.get("outputs") or [{}])[0]
                        row = {
                            "model": model_name,
                            "runtime": rt,
                            "target": target,
                            "precision": prec,
                            "bundle": b.id,
                            "source_sha256": b.manifest["source"]["sha256"],
                            "device_used": r.info.device_used,
                            "precision_used": r.info.precision_used,
                            "threads": r.info.threads,
                            "compute_precisions": r.info.details.get("compute_precisions"),
                            "latency_ms": C.summary(t[prec]),
                            "speedup_vs_fp32": float(np.median(t["fp32"]) / np.median(t[prec])),
                            "speedup_ci95": tuple(
                                1 + x / 100 for x in C.ratio_ci(t["fp32"], t[prec], 50, block=args.block)
                            ),
                            "parity": {
                                "passed": par.get("passed"),
                                "accepted_failure": par.get("accepted_failure"),
                                "inputs": par.get("inputs"),
                                "samples": par.get("samples"),
                                "thresholds": par.get("thresholds"),
                                "output": out0.get("name"),
                                "cosine": out0.get("cosine"),
                                "cosine_min": out0.get("cosine_min"),
                                "top1": out0.get("top1"),
                                "max_abs": out0.get("max_abs"),
                                "mean_abs": out0.get("mean_abs"),
                                "failures": out0.get("failures"),
                            },
                            "heldout": {
                                "inputs": (
                                    f"{len(held)} text lines ({heldout_dir})"
                                    if labels
                                    else f"{len(held)} generated frames (seed 4321)"
                                ),
                                "top1_agreement_with_source": float((cand_top1 == ref_top1).mean()),
                                "accuracy": float((cand_top1 == np.array(labels)).mean()) if labels else None,
                                "source_accuracy": float((ref_top1 == np.array(labels)).mean()) if labels else None,
                            },
                            "calibration": b.manifest.get("calibration"),
                            "chain": [
                                {k: s.get(k) for k in ("converter", "precision", "tool_versions", "details", "notes")}
                                for s in b.manifest.get("chain", [])
                            ],
                        }
                        results["rows"].append(row)
                finally:
                    for r in runners.values():
                        r.close()
    results["total_s"] = round(time.perf_counter() - started, 1)
    results["host"]["loadavg_1m_end"] = C.host_info().get("loadavg_1m")
    report(results, args)
    C.dump_json(args.json, results)
    return 0


def _top1(outputs: dict[str, np.ndarray]) -> int:
    return int(np.asarray(next(iter(outputs.values()))).reshape(-1).argmax())


def _static_source(src: Path, bundle: Any, wd: Path) -> Path:
    """The source with the bundle's static input shapes (what convert() used as the parity reference)."""
    from edge.graph.model import io_spec, load_onnx, make_static, resolve_static_inputs, save_onnx

    out = wd / f"{src.stem}.static.onnx"
    if not out.exists():
        m = load_onnx(src)
        shapes = {t.name: tuple(t.shape) for t in bundle.io.inputs}
        save_onnx(make_static(m, resolve_static_inputs(io_spec(m), shapes, src)), out)
    return out


def _recipe(row: dict[str, Any]) -> str:
    d = dict(row["chain"][0]["details"]) if row["chain"] else {}
    keep = {
        "onnxruntime": (
            "recipe",
            "activations",
            "weights",
            "per_channel",
            "calibrate_method",
            "calibration_samples",
            "pre_optimization",
            "optimization_level",
        ),
        "openvino": (
            "nncf_preset",
            "nncf_subset_size",
            "calibration_samples",
            "fake_quantize_ops",
            "compress_to_fp16",
            "weight_element_types",
        ),
    }[row["runtime"]]
    parts = [f"{k}={d[k]}" for k in keep if k in d]
    if d.get("retried_because"):
        parts.append("retried without pre-optimisation (quantizer produced an invalid model with it)")
    return ", ".join(parts)


def report(results: dict[str, Any], args: argparse.Namespace) -> None:
    rows = results["rows"]
    print(C.host_line(results["host"]))
    print(
        f"latency: {args.iterations} iterations per bundle, all bundles of a (model, runtime) interleaved in "
        f"round-robin blocks of {args.block} (+{args.settle} untimed settle call(s) each), {args.warmup} warm-up "
        "calls, same random input (seed 0)"
    )
    print()
    lat_rows = []
    for r in rows:
        lo, hi = r["speedup_ci95"]
        lat_rows.append(
            [
                r["model"],
                r["runtime"],
                r["precision"],
                r["device_used"],
                r["precision_used"],
                C.f(r["latency_ms"]["p50_ms"]),
                C.f(r["latency_ms"]["p90_ms"]),
                f"{r['speedup_vs_fp32']:.2f}x",
                f"{lo:.2f}-{hi:.2f}" if r["precision"] != "fp32" else "-",
            ]
        )
    print(
        C.table(
            ["model", "runtime", "bundle", "device", "computes in", "median ms", "p90 ms", "vs fp32", "95% CI"],
            lat_rows,
            title="LATENCY (speedup = fp32 median / median, same runtime)",
        )
    )
    print()
    acc_rows = []
    for r in rows:
        par, h = r["parity"], r["heldout"]
        verdict = {True: "pass", False: "FAIL", None: "-"}[par["passed"]]
        acc_rows.append(
            [
                r["model"],
                r["runtime"],
                r["precision"],
                verdict,
                C.f(par["cosine"], 6),
                C.f(par.get("cosine_min"), 6),
                C.f(par["top1"] * 100 if par["top1"] is not None else None, 1),
                f"{par['max_abs']:.3g}" if par["max_abs"] is not None else "-",
                C.f(h["top1_agreement_with_source"] * 100, 1),
                C.f(h["accuracy"] * 100, 1) if h["accuracy"] is not None else "-",
            ]
        )
    print(
        C.table(
            [
                "model",
                "runtime",
                "bundle",
                "parity",
                "cosine",
                "worst",
                "top-1 %",
                "max abs",
                "held-out top-1 %",
                "held-out acc %",
            ],
            acc_rows,
            title="PARITY (manifest: source in onnxruntime fp32 vs bundle on the first 32 calibration samples; "
            "cosine = mean over samples, worst = worst sample)",
        )
    )
    for m in dict.fromkeys(r["model"] for r in rows):
        r0 = next(r for r in rows if r["model"] == m)
        print(
            f"  {m}: parity inputs = {r0['parity']['samples']} x {r0['parity']['inputs']}; held-out = "
            f"{r0['heldout']['inputs']}"
            + (
                f"; source fp32 held-out accuracy {r0['heldout']['source_accuracy'] * 100:.1f}%"
                if r0["heldout"]["source_accuracy"] is not None
                else ""
            )
        )
    ths = {r["precision"]: r["parity"]["thresholds"] for r in rows if r["parity"]["thresholds"]}
    print(
        "  thresholds: "
        + "; ".join(f"{p} cosine >= {t['min_cosine']}, top-1 >= {t['min_top1']:.0%}" for p, t in ths.items())
    )
    print()
    print("RECIPES (manifest chain[0].details; OpenVINO: runtime precision of the compiled graph's compute layers)")
    for r in rows:
        layers = r.get("compute_precisions")
        extra = ("; layers " + " ".join(f"{k}:{v}" for k, v in layers.items())) if layers else ""
        print(f"  {r['model']:<12} {r['runtime']:<12} {r['precision']:<5} {_recipe(r)}{extra}")
    print()
    print(
        f"total {results['total_s']} s (conversion included); 1-min load average "
        f"{results['host'].get('loadavg_1m', float('nan')):.2f} at start, {results['host']['loadavg_1m_end']:.2f} at end"
    )


if __name__ == "__main__":
    sys.exit(main())
