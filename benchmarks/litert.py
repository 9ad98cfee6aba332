#!/usr/bin/env python3
"""LiteRT + XNNPack (fp32, fp16, int8) against onnxruntime fp32, and the litert runner's overhead.

On the example MobileNetV2 (224x224, deterministic random weights), in one run:

1. Latency and parity. Bundles: ``x86-cpu`` fp32 (onnxruntime) and ``arm-xnnpack`` fp32, fp16,
   int8 (LiteRT with XNNPack, converted by onnx2tf + TensorFlow in the ``tflite`` toolchain; all
   with ``calib="random"``, 32 generated frames, so every parity report uses the same inputs).
   int8 is built twice: with the profile's I/O type and with the other one (float32 I/O, where
   the QUANTIZE/DEQUANTIZE ops run inside the graph on XNNPack, vs int8 I/O, where the runner
   quantizes in numpy), to show what the choice costs. All runners are open at once and timed
   interleaved in round-robin blocks on the same NCHW float32 input (``random_feeds``, seed 0).
   One more side: the fp32 model in a plain ``Interpreter(num_threads=None)`` (LiteRT's
   default), fed NHWC directly: what a caller who does not pass a thread count gets.
   Speed-up vs onnxruntime fp32 = its median / the side's median (95% bootstrap interval).
   Parity (mean and worst cosine, top-1, max abs) comes from each bundle's manifest.
2. Runner overhead vs the LiteRT interpreter called directly (fp32 and int8 bundles), ``--trials``
   fresh runner + interpreter pairs (creation order alternating), three interleaved runs each:
     edgekit           ``runner.infer(feeds)``: NCHW float32 in, float32 out (the runner transposes
                       to NHWC and, for int8 I/O, quantizes/dequantizes);
     edgekit native    ``runner.infer_native(feeds_native)``: the model's own layout, no conversion;
     direct            a separate ``Interpreter`` of the same .tflite with the runner's thread count:
                       ``set_tensor(i, x_native)``, ``invoke()``, ``get_tensor(o)``, fed the input
                       already in the model's own layout and dtype;
     same interpreter  the same three calls on the runner's own interpreter (wrapper bypassed),
                       which removes interpreter-to-interpreter differences (a few percent here).
   Runs: edgekit vs direct (everything), edgekit vs same interpreter (the conversion + wrapper),
   edgekit native vs same interpreter (the wrapper alone); plus the wrapper cost on a no-op
   interpreter (20,000 calls), which machine noise does not move. Goal: <= 2% at the median.

    .venv/bin/python benchmarks/litert.py                    # ~4-8 min (three MobileNetV2 conversions)
    .venv/bin/python benchmarks/litert.py --workdir /tmp/lb  # keep the bundles; a second run reuses them

Needs the ``tflite`` toolchain (``edgekit toolchain install tflite``) and ``ai-edge-litert``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

GOAL_PCT = 2.0


def _native(runner: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The caller's NCHW float feeds in the model's own layout and dtype (what a direct caller would pass)."""
    out = {}
    for p in runner._in:
        x = feeds[p.name]
        if p.perm is not None:
            x = x.transpose(p.perm)
        if p.buf is not None:
            x = np.clip(np.rint(x * p.scale) + p.zero_point, p.qmin, p.qmax).astype(p.dtype)
        out[p.name] = np.ascontiguousarray(x)
    return out


def direct_interpreter(model: Path, threads: int | None, *, delegate: str = "xnnpack") -> Any:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    resolver = OpResolverType.AUTO if delegate == "xnnpack" else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    it = Interpreter(model_path=str(model), num_threads=threads, experimental_op_resolver_type=resolver)
    it.allocate_tensors()
    return it


def direct_call(it: Any, index: int, x: np.ndarray, out_index: int) -> np.ndarray:
    it.set_tensor(index, x)
    it.invoke()
    return it.get_tensor(out_index)


# -- part 1 ------------------------------------------------------------------------------


def latency(bundles: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    from edge.bench import random_feeds

    with contextlib.ExitStack() as stack:
        runners = {k: stack.enter_context(b.open_runner()) for k, b in bundles.items()}
        feeds = random_feeds(runners["onnxruntime fp32"], seed=0)
        calls = {k: (r.infer, (feeds,)) for k, r in runners.items()}
        fp32 = runners["litert fp32"]
        it = direct_interpreter(fp32._model_file, None)
        nat = _native(fp32, feeds)
        ((name, x),) = nat.items()
        idx = next(p.index for p in fp32._in if p.name == name)
        out_idx = it.get_output_details()[0]["index"]
        calls["litert fp32, num_threads=None (direct)"] = (direct_call, (it, idx, x, out_idx))
        C.log(f"part 1: {len(calls)} sides x {args.iterations} iterations, interleaved in blocks of {args.block}")
        t = C.interleaved(calls, args.iterations, block=args.block, warmup=args.warmup, settle=args.settle)
        ref = t["onnxruntime fp32"]
        rows = {}
        for k, v in t.items():
            r = runners.get(k)
            m = bundles[k].manifest if k in bundles else None
            lo, hi = C.ratio_ci(ref, v, 50, block=args.block)
            rows[k] = {
                "latency_ms": C.summary(v),
                "speedup_vs_ort_fp32": float(np.median(ref) / np.median(v)),
                "speedup_ci95": (1 + lo / 100, 1 + hi / 100),
                "runner": r.info.to_json()
                if r is not None
                else {"threads": "None (LiteRT default)", "device_used": "CPU (XNNPack)", "precision_used": "f32"},
                "parity": m["parity"] if m else None,
                "recipe": m["chain"][0]["details"].get("recipe") if m else None,
                "io_dtype": m["chain"][0]["details"].get("io_dtype") if m else None,
                "conversion_s": m["chain"][0]["details"].get("timings_s", {}).get("total") if m else None,
            }
        del it
    return rows


# -- part 2 ------------------------------------------------------------------------------


class _StubInterpreter:
    """Stands in for the LiteRT interpreter: every call returns at once."""

    def __init__(self, real: Any, outputs: dict[int, np.ndarray]) -> None:
        self._outputs = outputs
        self._fns = {}

    def set_tensor(self, index: int, value: Any) -> None:
        pass

    def invoke(self) -> None:
        pass

    def get_tensor(self, index: int) -> np.ndarray:
        return self._outputs[index]


def wrapper_cost_us(runner: Any, feeds_native: dict[str, np.ndarray], n: int = 20000) -> dict[str, float]:
    """runner.infer_native vs the three direct calls, both on a no-op interpreter (us per call)."""
    real = runner._it
    outs = {q.index: real.get_tensor(q.index) for q in runner._out}
    stub = _StubInterpreter(real, outs)
    ((name, x),) = feeds_native.items()
    idx = next(p.index for p in runner._in if p.name == name)
    out_idx = runner._out[0].index
    runner._it = stub
    try:
        t = C.interleaved(
            {"edgekit": (runner.infer_native, (feeds_native,)), "direct": (direct_call, (stub, idx, x, out_idx))},
            n,
            block=100,
            warmup=200,
        )
    finally:
        runner._it = real
    e, d = float(np.median(t["edgekit"])) * 1e3, float(np.median(t["direct"])) * 1e3
    return {"edgekit_us": e, "direct_us": d, "extra_us": e - d}


@contextlib.contextmanager
def pair(bundle: Any, *, runner_first: bool) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    from edge.bench import random_feeds

    pre = None
    if not runner_first:
        with bundle.open_runner() as probe:
            pre = direct_interpreter(probe._model_file, probe.info.threads)
    with bundle.open_runner() as runner:
        it = pre or direct_interpreter(runner._model_file, runner.info.threads)
        feeds = random_feeds(runner, seed=0)
        nat = _native(runner, feeds)
        ((name, x),) = nat.items()
        idx = next(p.index for p in runner._in if p.name == name)
        out_idx = it.get_output_details()[0]["index"]
        same = np.array_equal(runner.infer_native(nat)[runner._out[0].name], direct_call(it, idx, x, out_idx))
        own = runner._it  # the runner's own interpreter, called directly (wrapper and conversion bypassed)
        calls = {
            "edgekit": (runner.infer, (feeds,)),
            "direct": (direct_call, (it, idx, x, out_idx)),
            "edgekit native": (runner.infer_native, (nat,)),
            "same interpreter": (direct_call, (own, idx, x, out_idx)),
        }
        meta = {
            "runner_info": runner.info.to_json(),
            "outputs_identical": same,
            "conversion": runner.info.details["io"]["inputs"],
            "wrapper_cost": wrapper_cost_us(runner, nat),
        }
        yield calls, meta
        del it


def overhead(name: str, bundle: Any, args: argparse.Namespace) -> dict[str, Any]:
    per_trial = -(-args.overhead_iterations // args.trials)
    pooled: dict[str, list[np.ndarray]] = {}
    trials, meta = [], {}
    for k in range(args.trials):
        with pair(bundle, runner_first=(k % 2 == 0)) as (calls, m):
            meta = meta or m
            # three runs, apart: edgekit and "same interpreter" share an interpreter (see runner_overhead.py)
            runs = {
                name: C.interleaved(
                    {a: calls[a], b: calls[b]}, per_trial, block=args.block, warmup=args.warmup, settle=args.settle
                )
                for name, (a, b) in COMPARISONS.items()
            }
        for name, (a, b) in COMPARISONS.items():
            pooled.setdefault(f"{name}: {a}", []).append(runs[name][a])
            pooled.setdefault(f"{name}: {b}", []).append(runs[name][b])
        trials.append(
            {
                "runner_created_first": k % 2 == 0,
                **{
                    name: C.pct(np.median(runs[name][a]), np.median(runs[name][b]))
                    for name, (a, b) in COMPARISONS.items()
                },
            }
        )
    t = {side: np.concatenate(v) for side, v in pooled.items()}
    out: dict[str, Any] = {"latency_ms": {k: C.summary(v) for k, v in t.items()}, "trials": trials, **meta}
    for name, (a, b) in COMPARISONS.items():
        ea, eb = t[f"{name}: {a}"], t[f"{name}: {b}"]
        out[name] = {
            "sides": [a, b],
            "median_pct": C.pct(np.median(ea), np.median(eb)),
            "median_ci95_pct": C.ratio_ci(ea, eb, 50, block=args.block),
            "paired_diff_median_us": float(np.median(ea - eb)) * 1e3,
        }
    return out


# name -> (edgekit side, reference side)
COMPARISONS = {
    "vs direct": ("edgekit", "direct"),  # NCHW float in vs native in, separate interpreter: everything
    "vs same interpreter": ("edgekit", "same interpreter"),  # the runner's layout/dtype conversion + wrapper
    "native vs same interpreter": ("edgekit native", "same interpreter"),  # the wrapper alone
}


# -- main --------------------------------------------------------------------------------


def main() -> int:
    C.print_measured_on()  # the CPU's ISA class and the load, with every figure
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    C.add_common_args(p, iterations=300)
    p.add_argument("--overhead-iterations", type=int, default=600, help="part 2: iterations per side (default 600)")
    p.add_argument("--trials", type=int, default=3, help="part 2: fresh runner + interpreter pairs (default 3)")
    p.add_argument("--block", type=int, default=10, help="iterations per side before switching (default 10)")
    p.add_argument("--warmup", type=int, default=20, help="untimed calls per side first (default 20)")
    p.add_argument("--settle", type=int, default=1, help="untimed calls at the start of every block (default 1)")
    p.add_argument("--skip-overhead", action="store_true", help="part 1 only")
    args = p.parse_args()
    C.json_to_stdout(args)
    from edge import toolchains
    from edge.targets import get_target

    st = toolchains.status("tflite")
    if not st.usable:
        p.error(st.problem or "the tflite toolchain is not usable")
    info = C.host_info()
    with contextlib.suppress(Exception):
        import ai_edge_litert

        info["ai_edge_litert"] = ai_edge_litert.__version__
    results: dict[str, Any] = {
        "host": info,
        "args": {k: v for k, v in vars(args).items() if k != "json"},
        "toolchain": {
            "lock_hash": st.lock_hash,
            "onnx2tf": st.packages.get("onnx2tf"),
            "tensorflow": st.packages.get("tensorflow"),
        },
        "goal_overhead_pct": GOAL_PCT,
    }
    started = time.perf_counter()
    profile = get_target("arm-xnnpack")
    io_profile = profile.convert_options.get("onnx->tflite", {}).get("io_dtype", "int8")
    io_other = "int8" if io_profile == "float32" else "float32"
    with C.workdir(args.workdir) as wd:
        reuse = bool(args.workdir)
        model = C.mobilenet_v2(wd)
        from edge.base.hashing import sha256_file

        results["model"] = {"path": str(model), "sha256": sha256_file(model)}
        bundles = {
            "onnxruntime fp32": C.convert_cached(
                model, "x86-cpu", wd / "mnv2-x86-cpu-fp32", reuse=reuse, precision="fp32", calib="random"
            )
        }
        for prec in ("fp32", "fp16", "int8"):
            bundles[f"litert {prec}"] = C.convert_cached(
                model, "arm-xnnpack", wd / f"mnv2-arm-{prec}", reuse=reuse, precision=prec, calib="random"
            )
        # the same int8 recipe with the other I/O type: a profile copy with only io_dtype changed
        import dataclasses

        other = dataclasses.replace(
            profile,
            convert_options={"onnx->tflite": {**profile.convert_options.get("onnx->tflite", {}), "io_dtype": io_other}},
        )
        bundles[f"litert int8, {io_other} I/O"] = C.convert_cached(
            model, other, wd / f"mnv2-arm-int8-{io_other}io", reuse=reuse, precision="int8", calib="random"
        )
        results["latency"] = latency(bundles, args)
        if not args.skip_overhead:
            results["overhead"] = {k: overhead(k, bundles[k], args) for k in ("litert fp32", "litert int8")}
    results["total_s"] = round(time.perf_counter() - started, 1)
    results["host"]["loadavg_1m_end"] = C.host_info().get("loadavg_1m")
    report(results, args, io_profile)
    C.dump_json(args.json, results)
    return 0


def report(results: dict[str, Any], args: argparse.Namespace, io_profile: str) -> None:
    info = results["host"]
    print(C.host_line(info) + f", ai-edge-litert {info.get('ai_edge_litert', '?')}")
    tc = results["toolchain"]
    print(
        f"model: example MobileNetV2 224x224 (sha256 {results['model']['sha256'][:12]}); converted with onnx2tf "
        f"{tc['onnx2tf']} + tensorflow {tc['tensorflow']} (toolchain lock {tc['lock_hash'][:12]}); arm-xnnpack int8 "
        f"I/O in the profile: {io_profile}"
    )
    print(
        f"part 1: {args.iterations} iterations per side, all sides interleaved in blocks of {args.block} "
        f"({args.settle} settle call(s) per block), {args.warmup} warm-up; same NCHW float32 input (seed 0)"
    )
    rows = []
    for k, r in results["latency"].items():
        lat, ri, par = r["latency_ms"], r["runner"], r["parity"]
        lo, hi = r["speedup_ci95"]
        if par and not par.get("skipped"):
            o = par["outputs"][0]
            pstr = (
                f"{o['cosine']:.4f} / {o['cosine_min']:.4f}",
                f"{o['top1']:.1%}" if o["top1"] is not None else "-",
                f"{o['max_abs']:.3g}",
                "pass" if par["passed"] else "FAIL",
            )
        else:
            pstr = ("-", "-", "-", "-")
        delegated = ri.get("details", {}).get("delegated_ops") if isinstance(ri.get("details"), dict) else None
        model_ops = ri.get("details", {}).get("model_ops") if isinstance(ri.get("details"), dict) else None
        dev = ri["device_used"] + (f" {delegated}/{model_ops} ops" if delegated is not None else "")
        rows.append(
            [
                k,
                dev,
                ri["precision_used"],
                ri["threads"],
                C.f(lat["p50_ms"]),
                C.f(lat["p90_ms"]),
                f"{r['speedup_vs_ort_fp32']:.2f}x",
                f"{lo:.2f}..{hi:.2f}",
                *pstr,
            ]
        )
    print(
        C.table(
            [
                "side",
                "device (delegated ops)",
                "computes in",
                "threads",
                "median ms",
                "p90 ms",
                "vs ORT fp32",
                "95% CI",
                "cosine mean / worst",
                "top-1",
                "max abs",
                "parity",
            ],
            rows,
        )
    )
    print(
        "   parity: each bundle's manifest (32 generated frames = the calibration samples, onnxruntime fp32 reference)"
    )
    for k, r in results.get("overhead", {}).items():
        print()
        ri = r["runner_info"]
        print(
            f"== part 2, {k}: runner vs the interpreter called directly ({ri['runtime']}, {ri['device_used']}, "
            f"{ri['threads']} threads); outputs identical: {r['outputs_identical']}"
        )
        print(f"   runner's conversion: {'; '.join(r['conversion'])}")
        rows = [
            [side, C.f(st["p50_ms"]), C.f(st["p90_ms"]), C.f(st["min_ms"]), st["count"]]
            for side, st in r["latency_ms"].items()
        ]
        print(C.table(["run: side", "median ms", "p90 ms", "min ms", "n"], rows))
        labels = {
            "vs direct": "infer(NCHW float) vs a separate interpreter fed native input",
            "vs same interpreter": "infer(NCHW float) vs its own interpreter fed native input",
            "native vs same interpreter": "infer_native(native) vs its own interpreter fed native input",
        }
        for name, label in labels.items():
            c = r[name]
            lo, hi = c["median_ci95_pct"]
            print(
                f"   {label:<62} {C.signed(c['median_pct']):>7} at the median (95% CI {C.signed(lo)} .. "
                f"{C.signed(hi)}; paired {c['paired_diff_median_us']:+.1f} us)  goal <= {GOAL_PCT:g}%: "
                f"{'PASS' if c['median_pct'] <= GOAL_PCT else 'FAIL'}"
            )
        print(
            "   per trial (vs direct / vs same / native vs same): "
            + ", ".join(
                f"{C.signed(t['vs direct'])} / {C.signed(t['vs same interpreter'])} / "
                f"{C.signed(t['native vs same interpreter'])}"
                for t in r["trials"]
            )
        )
        w = r["wrapper_cost"]
        print(
            f"   wrapper cost on a no-op interpreter: {w['extra_us']:+.2f} us per call ({w['edgekit_us']:.2f} vs "
            f"{w['direct_us']:.2f} us)"
        )
    print()
    print(
        f"total {results['total_s']} s; 1-min load average {info.get('loadavg_1m', float('nan')):.2f} at start, "
        f"{results['host']['loadavg_1m_end']:.2f} at end"
    )


if __name__ == "__main__":
    sys.exit(main())
