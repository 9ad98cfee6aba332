#!/usr/bin/env python3
"""The real-model conformance matrix (issue #13) as a markdown table, like Ultralytics' `benchmark`.

    python benchmarks/corpus_matrix.py [-n 50] [--model NAME]... [--target NAME]... [--json FILE] [--workdir DIR]

Every case of ``tests/pipeline/test_corpus.py``'s ``EXPECTED`` table (model x target x precision, real
pretrained models from ``examples/fetch_pretrained.py``), and the few the test leaves out for its
time budget (``EXTRA``), goes through ``edge.pipeline.convert`` as a user's would, without
``--accept-parity-failure``. A row says what happened (``pass``; ``fails:`` a clear one-line
``EdgeError``, its class and first words; ``bug:`` anything else, e.g. a runtime's own exception),
the model file's size in the bundle, the parity figures recorded in the manifest (the worst
output's cosine and SNR, and each task figure parity gated on; KL / top-1 for GGUF), the p50
latency from ``edge.bench`` (``run_benchmark`` on what ``edgekit bench`` feeds: the bundle's first
reference pair's input, ``-n`` iterations after 10 warm-up; for a GGUF, ms per generated token
from ``edge.llm.bench``) and the conversion's wall and CPU seconds. A bundle whose reference pairs fail the check a device runs
on first load is a ``bug:`` row. A status that disagrees with the test's entry is flagged
"(the test expects ...)": that test fails today.

The table goes to stdout, progress to stderr. Runs on the build host: intel-igpu runs on
OpenVINO's CPU fallback here and arm-xnnpack on x86 XNNPack, so their latency is this host's, not
the device's. The full matrix takes about as long as the test file (arm-xnnpack conversions run
onnx2tf, 30-60 s each on 2 cores).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

sys.path.insert(0, str(C.REPO))
from tests.pipeline.test_corpus import EXPECTED  # noqa: E402
from tests.support.corpus import CORPUS, CorpusModel  # noqa: E402

#: cases the test leaves out for its time budget (tests/pipeline/test_corpus.py's docstring), measured here too
EXTRA: tuple[tuple[str, str, str, str], ...] = (
    ("ppocr-det", "x86-cpu", "int8", "bench only"),
    ("ddddocr-det", "x86-cpu", "int8", "bench only"),
    ("smollm2-135m", "x86-cpu", "keep", "bench only"),
    ("smollm2-135m", "arm-xnnpack", "keep", "bench only"),
)


_ORDER = {name: i for i, name in enumerate(CORPUS)}  # rows grouped by model, the test's order within


def _model_bytes(bundle: Any) -> str:
    """The model's files in the bundle: the primary artifact and its siblings of the same stem
    (an IR's .bin), not the reference pairs or sidecars."""
    primary = Path(bundle.manifest["primary_artifact"])
    n = sum(
        a["bytes"]
        for a in bundle.manifest["artifacts"]
        if Path(a["path"]).parent == primary.parent and Path(a["path"]).stem == primary.stem
    )
    return f"{n / 1e6:.1f} MB"


def _parity_metric(parity: dict[str, Any]) -> str:
    """What the gate measured, in a few words: the worst output's cosine and SNR, and each task figure
    (classifier top-1, detector precision/recall, map IoU, sequence agreement); KL / top-1 for GGUF."""
    if parity.get("skipped"):
        return "gate skipped (shipped as is)"
    if "kl_mean" in parity:
        return f"KL {parity['kl_mean']:.4f}, top-1 {100 * parity['top1']:.1f}%"
    outs = parity.get("outputs") or []
    if not outs:
        return "—"
    if parity.get("unverified"):  # every reference constant across the samples (issue #23): the figures say nothing
        return f"unverified: constant reference on {parity.get('samples')} samples"

    def low(key: str) -> float | None:
        vals = [o[key] for o in outs if isinstance(o.get(key), (int, float))]
        return min(vals) if vals else None

    parts = []
    if (cos := low("cosine")) is not None:
        parts.append(f"cos {cos:.5f}")
    if (snr := low("snr_db")) is not None:
        parts.append(f"SNR {snr:.1f} dB")
    for o in outs:
        task = o.get("task")
        figs = {
            "top-1": o.get("top1") if task == "classifier" else None,
            "P": o.get("precision"),
            "R": o.get("recall"),
            "IoU": o.get("iou"),
            "seq": o.get("tokens"),
        }
        shown = " ".join(f"{k} {v:.3f}" for k, v in figs.items() if isinstance(v, (int, float)))
        if task and shown:
            parts.append(f"{task}: {shown}")
    return ", ".join(parts)


def _feeds(m: CorpusModel, bundle: Any) -> dict[str, np.ndarray] | None:
    """What ``edgekit bench`` feeds (``edge.bench.bundle_feeds``: the bundle's first reference pair's input,
    real shapes and values, Silero's sample rate 16000 included)."""
    from edge.bench import bundle_feeds

    return bundle_feeds(bundle)[0]


def _latency(m: CorpusModel, bundle: Any, iterations: int) -> str:
    try:
        if bundle.kind == "llm":
            from edge.llm.bench import run_llm_benchmark

            rep = run_llm_benchmark(lambda **o: bundle.open_runner(o), prompt_tokens=32, gen_tokens=32, repetitions=2)
            return f"{1000 / rep.gen_tps[0]:.1f} ms/token"
        from edge.bench import BenchOptions, run_benchmark

        coral = (bundle.manifest.get("target") or {}).get("name") == "coral-edgetpu"  # not compiled here: CPU int8
        opts = {"allow_cpu_fallback": True} if coral else None
        rep = run_benchmark(
            lambda: bundle.open_runner(opts), BenchOptions(iterations=iterations, warmup=10), feeds=_feeds(m, bundle)
        )
        return f"{rep.latency.p50_ms:.2f} ms"
    except Exception as e:  # noqa: BLE001 - the row says why there is no figure
        return f"n/a ({type(e).__name__}: {str(e).splitlines()[0][:80]})".replace("|", "\\|")


def _cpu_s() -> float:
    """CPU seconds of this process and the children it waited for (the tflite toolchain, llama.cpp
    tools): a figure that holds when other work shares the host, unlike the wall clock."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _status(err: BaseException | None) -> str:
    """ "pass", "fails: ..." (an EdgeError in one line, its hint left out) or "bug: ..." (anything else)."""
    if err is None:
        return "pass"
    from edge.errors import EdgeError

    lines = str(err).strip().splitlines() or [""]
    clear = isinstance(err, EdgeError) and len(lines) == 1
    text = err.message.strip().splitlines()[0] if isinstance(err, EdgeError) and err.message.strip() else lines[0]
    text = text if len(text) <= 110 else text[:107] + "..."
    return f"{'fails' if clear else 'bug'}: {type(err).__name__}: {text}".replace("|", "\\|")


def main() -> int:
    C.print_measured_on()  # the CPU's ISA class and the load, with every figure
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    C.add_common_args(p, iterations=50)
    p.add_argument("--model", action="append", choices=sorted(CORPUS), help="only this model (repeatable)")
    p.add_argument("--target", action="append", help="only this target (repeatable)")
    args = p.parse_args()
    C.json_to_stdout(args)
    from edge.pipeline import convert
    from edge.verify.refpairs import open_checked

    wanted = {m for m, *_ in (*EXPECTED, *EXTRA) if not args.model or m in args.model}
    missing = sorted(m for m in wanted if not CORPUS[m].path.is_file() and not CORPUS[m].optional)
    if missing:
        C.log(f"missing corpus models ({', '.join(missing)}): run python examples/fetch_pretrained.py")
        return 2
    skipped = sorted(m for m in wanted if not CORPUS[m].path.is_file())
    if skipped:  # optional (a licence that is not permissive): fetched only when named
        C.log(
            f"skipping optional models not fetched: {', '.join(skipped)} (python examples/fetch_pretrained.py --model NAME)"
        )
    host = C.host_info()
    rows: list[dict[str, Any]] = []
    with C.workdir(args.workdir) as wd:
        for name, target, precision, expected in sorted((*EXPECTED, *EXTRA), key=lambda c: _ORDER[c[0]]):
            if (args.model and name not in args.model) or (args.target and target not in args.target):
                continue
            if name in skipped:
                continue
            m = CORPUS[name]
            request = m.convert_request(target).replace(
                precision=precision,
                calib="random" if precision.startswith("int8") else None,
                allow_requantize=m.source_format == "gguf" and precision != "keep",
            )
            out = wd / f"{name}-{target}-{precision}"
            C.log(f"{name} -> {target} {precision} ...")
            t0, c0 = time.perf_counter(), _cpu_s()
            bundle, err = None, None
            try:
                bundle = convert(m.path, target, out, request, force=True)
            except Exception as e:  # noqa: BLE001 - a row per outcome, bugs included
                err = e
            convert_s, cpu_s = time.perf_counter() - t0, _cpu_s() - c0
            row: dict[str, Any] = {
                "model": name,
                "task": m.task,
                "target": target,
                "precision": precision,
                "expected": expected,
                "status": _status(err),
                "convert_s": round(convert_s, 1),
                "convert_cpu_s": round(cpu_s, 1),
                "size": "—",
                "parity": "—",
                "p50": "—",
            }
            if bundle is not None:
                parity = dict(bundle.manifest["parity"])
                row.update(
                    size=_model_bytes(bundle),
                    parity=_parity_metric(parity),
                    p50=_latency(m, bundle, args.iterations),
                    parity_report=parity,
                )
                if bundle.kind != "llm":  # what a device runs on first load, as the test checks it
                    opts = {"allow_cpu_fallback": True} if target == "coral-edgetpu" else None  # not compiled here
                    with open_checked(bundle, opts, mode=True) as runner:
                        check = dict(runner.info.details["reference_check"])
                    row["reference_check"] = check
                    if not check.get("passed"):
                        why = str(check.get("error") or check.get("failures")).splitlines()[0]
                        row["status"] = f"bug: reference check failed: {why[:90]}".replace("|", "\\|")
            C.log(f"  {row['status']} ({convert_s:.1f} s, {cpu_s:.1f} CPU s)")
            rows.append(row)

    print(C.host_line(host) + " (intel-igpu: OpenVINO's CPU fallback, arm-xnnpack: x86 XNNPack)\n")
    print("| model | task | target | precision | status | size | parity | p50 latency | convert s (CPU s) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        agrees = r["status"].split(":")[0] == r["expected"].split(":")[0]
        flag = (
            " (not in the test)"
            if r["expected"] == "bench only"
            else ""
            if agrees
            else f" (the test expects {r['expected'].split(':')[0]})"
        )
        print(
            f"| {r['model']} | {r['task']} | {r['target']} | {r['precision']} | {r['status']}{flag} | {r['size']} | "
            f"{r['parity']} | {r['p50']} | {r['convert_s']} ({r['convert_cpu_s']}) |"
        )
    C.dump_json(args.json, {"host": host, "iterations": args.iterations, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
