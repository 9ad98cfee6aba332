#!/usr/bin/env python3
"""What does edgekit's runner cost on top of calling the runtime directly?

On the example MobileNetV2 (224x224, deterministic random weights), in one process, on the
same input array, interleaved (round-robin blocks, order rotated every round):

  edgekit       ``runner.infer(feeds)`` of the bundle's runner;
  direct        the runtime used directly, in a session of its own:
                onnxruntime: an ``x86-cpu`` fp32 bundle; a plain ``onnxruntime.InferenceSession``
                  on its model.onnx with the same SessionOptions (intra-op threads, graph
                  optimisation level, providers; compared with the runner's session's own),
                  called as ``sess.run(None, feeds)``;
                openvino: an ``intel-igpu`` fp32 bundle (no GPU here: the runner falls back to
                  CPU); ``core.compile_model(model.xml, "CPU", config)`` with PERFORMANCE_HINT,
                  INFERENCE_PRECISION_HINT and INFERENCE_NUM_THREADS read back from the
                  runner's compiled model (every other property compared too), one reused
                  ``InferRequest.infer(feeds, share_inputs=True)`` (the flags the runner uses);
  same session  the runner's own session / InferRequest called directly, wrapper bypassed:
                isolates the wrapper from differences between two sessions of the same model.

Each of ``--trials`` trials opens a fresh runner and a fresh direct session (which one is
created first alternates) and times ``iterations / trials`` calls per side in two interleaved
runs, edgekit vs direct, then edgekit vs same session (apart, because edgekit and same
session share a session: in a three-way rotation whichever side more often follows its twin
would look faster). Every block starts with ``--settle`` untimed calls. Samples are pooled. Reported per runtime: median and p90 of each side; overhead = (edgekit / direct - 1)
* 100 at the median (95% bootstrap interval over paired rounds) and at p90; the median
paired difference; the per-trial overheads; edgekit vs same session; and the wrapper's own
cost measured on a no-op runtime (the runner's session/request swapped for a stub that
returns a precomputed result), which machine noise does not move. Goal: <= 2% at the median.

    .venv/bin/python benchmarks/runner_overhead.py                 # ~1 min on an idle 2-core host
    .venv/bin/python benchmarks/runner_overhead.py -n 1500 --block 1 --json overhead.json
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
_ORT_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


# -- direct sessions ---------------------------------------------------------------------


def direct_ort(bundle: Any, runner: Any, sess: Any = None) -> tuple[Any, dict[str, Any]]:
    """A plain InferenceSession with the SessionOptions the runner builds from the bundle's runner options
    (``sess``: one made earlier by this function, only checked against ``runner``)."""
    import onnxruntime as ort

    opts = bundle.manifest["runner"]["options"]
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = int(opts.get("intra_op_num_threads", 0))
    so.graph_optimization_level = getattr(
        ort.GraphOptimizationLevel, _ORT_LEVELS[opts.get("graph_optimization_level", "all")]
    )
    providers = [p for p in opts.get("providers", ["CPUExecutionProvider"]) if p in ort.get_available_providers()]
    if sess is None:
        sess = ort.InferenceSession(str(bundle.artifact), so, providers=providers)

    # Check against what the runner's session really holds (private attribute: benchmark only).
    check: dict[str, Any] = {"providers": sess.get_providers()}
    theirs = getattr(runner, "_session", None)
    mine_so = sess.get_session_options()
    fields = (
        "intra_op_num_threads",
        "inter_op_num_threads",
        "graph_optimization_level",
        "execution_mode",
        "enable_cpu_mem_arena",
        "enable_mem_pattern",
    )
    check["session_options"] = {k: str(getattr(mine_so, k)) for k in fields}
    if theirs is not None:
        their_so = theirs.get_session_options()
        diff = {
            k: (str(getattr(their_so, k)), str(getattr(mine_so, k)))
            for k in fields
            if str(getattr(their_so, k)) != str(getattr(mine_so, k))
        }
        if theirs.get_providers() != sess.get_providers():
            diff["providers"] = (theirs.get_providers(), sess.get_providers())
        check["differs_from_runner"] = diff
    return sess, check


_OV_KEYS_IGNORED = {"NETWORK_NAME", "LOADED_FROM_CACHE"}


def direct_openvino(bundle: Any, runner: Any, pre: Any = None) -> tuple[Any, Any, dict[str, Any]]:
    """compile_model(xml, "CPU", config read back from the runner's compiled model); one InferRequest.

    ``pre``: a (compiled, request, check) made earlier by this function (from another runner
    of the same bundle); only re-checked against ``runner``."""
    import openvino.properties as props
    import openvino.properties.hint as hints

    theirs = getattr(runner, "_compiled", None)
    if theirs is None:
        raise SystemExit("runner has no _compiled attribute: cannot read its configuration back")
    config = {
        hints.performance_mode: theirs.get_property(hints.performance_mode),
        hints.inference_precision: theirs.get_property(hints.inference_precision),
        props.inference_num_threads: theirs.get_property(props.inference_num_threads),
    }
    device = ",".join(theirs.get_property(props.execution_devices))
    if pre is not None:
        compiled, request = pre[0], pre[1]
    else:
        from edge.backends.openvino.format import ov_core

        core = ov_core()  # the process's one Core (edge.backends.openvino.format.ov_core says why)
        xml = bundle.artifact if bundle.artifact.suffix == ".xml" else bundle.artifact / "model.xml"
        compiled = core.compile_model(core.read_model(str(xml)), device, config)
        request = compiled.create_infer_request()

    def all_props(cm: Any) -> dict[str, str]:
        out = {}
        for k in cm.get_property(props.supported_properties):
            if k in _OV_KEYS_IGNORED:
                continue
            try:
                out[str(k)] = str(cm.get_property(k))
            except Exception:  # noqa: BLE001 - some keys are not readable
                pass
        return out

    mine_p, their_p = all_props(compiled), all_props(theirs)
    diff = {
        k: (their_p.get(k), mine_p.get(k))
        for k in sorted(set(mine_p) | set(their_p))
        if mine_p.get(k) != their_p.get(k)
    }
    check = {
        "device": device,
        "config": {str(k): str(v) for k, v in config.items()},
        "compiled_properties": {
            k: mine_p[k]
            for k in (
                "PERFORMANCE_HINT",
                "INFERENCE_PRECISION_HINT",
                "INFERENCE_NUM_THREADS",
                "NUM_STREAMS",
                "ENABLE_CPU_PINNING",
            )
            if k in mine_p
        },
        "differs_from_runner": diff,
    }
    return compiled, request, check


# -- wrapper cost on a no-op runtime ----------------------------------------------------


class _Stub:
    """Stands in for the runtime object: returns a precomputed result at once."""

    def __init__(self, result: Any) -> None:
        self.result = result

    def run(self, output_names: Any, feeds: Any) -> Any:  # onnxruntime.InferenceSession.run
        return self.result

    def infer(self, feeds: Any, share_inputs: bool = False) -> Any:  # openvino.InferRequest.infer
        return self.result


def wrapper_cost_us(
    runner: Any, attr: str, result: Any, direct_call: tuple[Any, tuple[Any, ...]], feeds: Any, n: int = 20000
) -> dict[str, float]:
    """Median per-call time of runner.infer vs the direct call, both on a stub runtime (µs)."""
    real = getattr(runner, attr)
    stub = _Stub(result)
    setattr(runner, attr, stub)
    try:
        fn, args = direct_call
        stub_fn = getattr(stub, fn)
        calls = {"edgekit": (runner.infer, (feeds,)), "direct": (stub_fn, args)}
        t = C.interleaved(calls, n, block=100, warmup=200)
    finally:
        setattr(runner, attr, real)
    e, d = float(np.median(t["edgekit"])) * 1e3, float(np.median(t["direct"])) * 1e3
    return {"edgekit_us": e, "direct_us": d, "extra_us": e - d}


# -- one comparison ----------------------------------------------------------------------


def measure(name: str, make_pair: Any, args: argparse.Namespace) -> dict[str, Any]:
    """``args.trials`` trials, each with a fresh runner and a fresh direct session (creation order
    alternating). Per trial two interleaved runs: edgekit vs direct, then edgekit vs same session
    (kept apart: edgekit and same session share one session, so interleaving all three would
    favour whichever side more often follows its twin). Samples pooled over trials."""
    per_trial = -(-args.iterations // args.trials)
    pooled: dict[str, list[np.ndarray]] = {}
    trials: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    t0 = time.perf_counter()
    for k in range(args.trials):
        with make_pair(runner_first=(k % 2 == 0)) as (calls, meta):
            if k == 0:
                C.log(
                    f"{name}: {args.trials} trial(s) x {per_trial} iterations per side: edgekit vs direct, then "
                    f"edgekit vs same session; blocks of {args.block} (+{args.settle} settle), {args.warmup} warm-up"
                )
                extra = meta
            a = C.interleaved(
                {"edgekit": calls["edgekit"], "direct": calls["direct"]},
                per_trial,
                block=args.block,
                warmup=args.warmup,
                settle=args.settle,
            )
            b = C.interleaved(
                {"edgekit": calls["edgekit"], "same session": calls["same session"]},
                per_trial,
                block=args.block,
                warmup=args.warmup,
                settle=args.settle,
            )
        t = {
            "edgekit": a["edgekit"],
            "direct": a["direct"],
            "edgekit (2nd run)": b["edgekit"],
            "same session": b["same session"],
        }
        for side, v in t.items():
            pooled.setdefault(side, []).append(v)
        trials.append(
            {
                "runner_created_first": k % 2 == 0,
                "median_ms": {side: float(np.median(v)) for side, v in t.items()},
                "overhead_median_pct": C.pct(np.median(a["edgekit"]), np.median(a["direct"])),
                "wrapper_only_median_pct": C.pct(np.median(b["edgekit"]), np.median(b["same session"])),
            }
        )
    wall = time.perf_counter() - t0
    t = {side: np.concatenate(v) for side, v in pooled.items()}
    e, d = t["edgekit"], t["direct"]
    e2, s_ = t["edgekit (2nd run)"], t["same session"]
    # ratio_ci resamples whole rounds; rounds never straddle trials when per_trial is a multiple of block
    res: dict[str, Any] = {
        "wall_s": round(wall, 2),
        "latency_ms": {k: C.summary(v) for k, v in t.items()},
        "overhead_median_pct": C.pct(np.median(e), np.median(d)),
        "overhead_median_ci95_pct": C.ratio_ci(e, d, 50, block=args.block),
        "overhead_p90_pct": C.pct(np.percentile(e, 90), np.percentile(d, 90)),
        "overhead_p90_ci95_pct": C.ratio_ci(e, d, 90, block=args.block),
        "paired_diff_median_us": float(np.median(e - d)) * 1e3,
        "wrapper_only_median_pct": C.pct(np.median(e2), np.median(s_)),
        "wrapper_only_median_ci95_pct": C.ratio_ci(e2, s_, 50, block=args.block),
        "wrapper_only_paired_diff_median_us": float(np.median(e2 - s_)) * 1e3,
        "trials": trials,
        "samples_ms": {k: np.round(v, 5) for k, v in t.items()} if args.samples else None,
        **extra,
    }
    return res


@contextlib.contextmanager
def ort_pair(bundle: Any, *, runner_first: bool) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    from edge.bench import random_feeds

    sess = None
    if not runner_first:
        sess = direct_ort(bundle, None)[0]
    with bundle.open_runner() as runner:
        sess, check = direct_ort(bundle, runner, sess)
        feeds = random_feeds(runner, seed=0)
        same = all(np.array_equal(a, c) for a, c in zip(runner.infer(feeds).values(), sess.run(None, feeds)))
        own = runner._session  # the runner's own session, called without the wrapper
        calls = {
            "edgekit": (runner.infer, (feeds,)),
            "direct": (sess.run, (None, feeds)),
            "same session": (own.run, (None, feeds)),
        }
        meta = {
            "bundle": bundle.id,
            "runner_info": runner.info.to_json(),
            "direct": check,
            "outputs_identical": same,
            "edgekit_call": "runner.infer(feeds)",
            "direct_call": "sess.run(None, feeds) on a separate InferenceSession",
            "same_session_call": "runner._session.run(None, feeds)",
            "wrapper_cost": wrapper_cost_us(runner, "_session", sess.run(None, feeds), ("run", (None, feeds)), feeds),
        }
        yield calls, meta


@contextlib.contextmanager
def openvino_pair(bundle: Any, *, runner_first: bool) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    from edge.bench import random_feeds

    pre = None
    if not runner_first:  # compile the direct model first: needs the runner's config, so read it from a probe
        with bundle.open_runner() as probe:
            pre = direct_openvino(bundle, probe)
    with bundle.open_runner() as runner:
        compiled, request, check = direct_openvino(bundle, runner, pre)
        feeds = random_feeds(runner, seed=0)
        mine = request.infer(feeds, share_inputs=True)
        same = all(np.array_equal(a, np.asarray(c)) for a, c in zip(runner.infer(feeds).values(), mine.values()))
        own = runner._request
        calls = {
            "edgekit": (runner.infer, (feeds,)),
            "direct": (request.infer, (feeds, True)),  # infer(inputs, share_inputs=True), as the runner calls it
            "same session": (own.infer, (feeds, True)),
        }
        meta = {
            "bundle": bundle.id,
            "runner_info": runner.info.to_json(),
            "direct": check,
            "outputs_identical": same,
            "edgekit_call": "runner.infer(feeds)",
            "direct_call": "request.infer(feeds, share_inputs=True) on a reused InferRequest of a separate compile_model",
            "same_session_call": "runner._request.infer(feeds, share_inputs=True)",
            "wrapper_cost": wrapper_cost_us(
                runner, "_request", request.infer(feeds, share_inputs=True), ("infer", (feeds, True)), feeds
            ),
        }
        yield calls, meta
        del request, compiled


def main() -> int:
    C.print_measured_on()  # the CPU's ISA class and the load, with every figure
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    C.add_common_args(p, iterations=600)
    p.add_argument(
        "--block",
        type=int,
        default=10,
        help="consecutive iterations per side before switching (default 10; 1 = alternate every call)",
    )
    p.add_argument(
        "--trials",
        type=int,
        default=3,
        help="fresh runner + direct session pairs, creation order alternating; iterations are "
        "split over them (default 3)",
    )
    p.add_argument("--warmup", type=int, default=30, help="untimed calls per side and trial first (default 30)")
    p.add_argument(
        "--settle",
        type=int,
        default=1,
        help="untimed calls at the start of every block, after switching sides (default 1)",
    )
    p.add_argument("--runtime", choices=("onnxruntime", "openvino", "both"), default="both")
    p.add_argument("--samples", action="store_true", help="put every raw sample into the JSON")
    args = p.parse_args()
    C.json_to_stdout(args)
    if args.iterations < 300:
        C.log(f"note: {args.iterations} iterations per side; 300 or more are recommended")
    if args.trials < 1 or args.block < 1:
        p.error("--trials and --block must be >= 1")

    info = C.host_info()
    results: dict[str, Any] = {
        "host": info,
        "args": {k: v for k, v in vars(args).items() if k != "json"},
        "goal_overhead_pct": GOAL_PCT,
        "runtimes": {},
    }
    started = time.perf_counter()
    with C.workdir(args.workdir) as wd:
        reuse = bool(args.workdir)
        model = C.mobilenet_v2(wd)
        from edge.base.hashing import sha256_file

        results["model"] = {"path": str(model), "sha256": sha256_file(model)}
        C.log(f"model: {model}")
        if args.runtime in ("onnxruntime", "both"):
            b = C.convert_cached(model, "x86-cpu", wd / "mnv2-x86-cpu-fp32", reuse=reuse, precision="fp32")
            results["runtimes"]["onnxruntime"] = measure(
                "onnxruntime", lambda runner_first: ort_pair(b, runner_first=runner_first), args
            )
        if args.runtime in ("openvino", "both"):
            b = C.convert_cached(model, "intel-igpu", wd / "mnv2-intel-igpu-fp32", reuse=reuse, precision="fp32")
            results["runtimes"]["openvino"] = measure(
                "openvino", lambda runner_first: openvino_pair(b, runner_first=runner_first), args
            )
    results["total_s"] = round(time.perf_counter() - started, 1)
    results["host"]["loadavg_1m_end"] = C.host_info().get("loadavg_1m")

    # -- print --------------------------------------------------------------------------
    print(C.host_line(info))
    per_trial = -(-args.iterations // args.trials)
    print(
        f"model: example MobileNetV2 224x224 fp32 (sha256 {results['model']['sha256'][:12]}); {args.trials} trial(s) "
        f"x {per_trial} iterations per side (fresh sessions each trial), interleaved in blocks of {args.block} "
        f"(order rotated every round, {args.settle} untimed settle call(s) per block), {args.warmup} warm-up calls, "
        "GC off while timing"
    )
    for rt, r in results["runtimes"].items():
        ri = r["runner_info"]
        print()
        print(f"== {rt}: bundle {r['bundle']}")
        print(
            f"   runner: {ri['runtime']} on {ri['device_used']}, {ri['precision_used']}, "
            f"threads {ri['threads'] if ri['threads'] is not None else 'runtime default'}"
            + (f" (fallback: {ri['fallback']})" if ri.get("fallback") else "")
        )
        print(f"   edgekit:      {r['edgekit_call']}")
        if rt == "onnxruntime":
            print(
                f"   direct:       {r['direct_call']}, SessionOptions {r['direct']['session_options']}, "
                f"providers {r['direct']['providers']}"
            )
        else:
            print(
                f"   direct:       {r['direct_call']}: compile_model(xml, {r['direct']['device']!r}, "
                f"{r['direct']['config']})"
            )
        print(f"   same session: {r['same_session_call']} (the runner's own session, wrapper bypassed)")
        diff = r["direct"].get("differs_from_runner")
        print(
            "   direct config vs runner's: "
            + ("identical" if diff == {} else f"DIFFERENT: {diff}")
            + f"; outputs identical: {r['outputs_identical']}"
        )
        rows = []
        for side, st in r["latency_ms"].items():
            rows.append(
                [
                    side,
                    C.f(st["p50_ms"]),
                    C.f(st["p90_ms"]),
                    C.f(st["p99_ms"]),
                    C.f(st["mean_ms"]),
                    C.f(st["min_ms"]),
                    st["count"],
                ]
            )
        print(C.table(["side", "median ms", "p90 ms", "p99 ms", "mean ms", "min ms", "n"], rows))
        lo, hi = r["overhead_median_ci95_pct"]
        plo, phi = r["overhead_p90_ci95_pct"]
        verdict = "PASS" if r["overhead_median_pct"] <= GOAL_PCT else "FAIL"
        print(
            f"   overhead vs direct at median: {C.signed(r['overhead_median_pct'])}  "
            f"(95% CI {C.signed(lo)} .. {C.signed(hi)})   goal <= {GOAL_PCT:g}%: {verdict}"
        )
        print(
            f"   overhead vs direct at p90:    {C.signed(r['overhead_p90_pct'])}  "
            f"(95% CI {C.signed(plo)} .. {C.signed(phi)})"
        )
        print(f"   paired difference edgekit - direct (same round), median: {r['paired_diff_median_us']:+.1f} us")
        print(
            "   per trial, overhead vs direct at median: "
            + ", ".join(
                f"{C.signed(t['overhead_median_pct'])} ({'runner' if t['runner_created_first'] else 'direct'}"
                " created first)"
                for t in r["trials"]
            )
        )
        wlo, whi = r["wrapper_only_median_ci95_pct"]
        print(
            f"   edgekit vs same session (separate interleaved run) at median: {C.signed(r['wrapper_only_median_pct'])}"
            f"  (95% CI {C.signed(wlo)} .. {C.signed(whi)}; paired median {r['wrapper_only_paired_diff_median_us']:+.1f} us)"
        )
        w = r["wrapper_cost"]
        print(
            f"   wrapper cost on a no-op runtime: {w['extra_us']:+.2f} us per call "
            f"({w['edgekit_us']:.2f} vs {w['direct_us']:.2f} us) = "
            f"{w['extra_us'] / (r['latency_ms']['direct']['p50_ms'] * 1e3) * 100:+.4f}% of the direct median"
        )
    print()
    print(
        f"total {results['total_s']} s; 1-min load average {info.get('loadavg_1m', float('nan')):.2f} at start, "
        f"{results['host']['loadavg_1m_end']:.2f} at end (a busy host moves the medians; the interleaved ratios "
        "much less)"
    )
    C.dump_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
