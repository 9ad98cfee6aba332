#!/usr/bin/env python3
"""LLM benchmarks: edgekit's llama.cpp runner vs llama-cpp-python directly, and q4_k_m vs f16.

    python benchmarks/llm.py [--rounds 8] [--gen-tokens 64] [--json FILE] [--workdir DIR]

1. Runner overhead on generation tokens/s: ``runner.generate(prompt)`` against
   ``llm.create_completion(prompt, stream=True)`` on the same loaded model and settings,
   alternating call by call (A B, B A, ...). Tokens/s counts from the first streamed piece to
   the last, so prompt processing is excluded; EOS is masked so both sides generate the same
   number of tokens. Goal: <= 2% at the median.
2. q4_k_m against f16 of the same model: file size ratio, generation and prompt tokens/s
   ratio (edge.llm.bench, alternating f16 / q4_k_m runs), and the quality gate's KL and top-1.

The model is a llama-architecture GGUF with random weights built in code (~40M parameters),
large enough that per-token compute dominates Python overhead, small enough for 2 cores.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

from edge.pipeline.request import ConvertRequest


def _stream_tps(pieces: object) -> tuple[int, float]:
    n, first, last = 0, 0.0, 0.0
    for _ in pieces:  # type: ignore[attr-defined]
        now = time.perf_counter()
        if n == 0:
            first = now
        last = now
        n += 1
    return n, (n - 1) / (last - first) if n > 1 and last > first else float("nan")


def main() -> int:
    C.print_measured_on()  # the CPU's ISA class and the load, with every figure
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8, help="alternating rounds per side (default 8)")
    p.add_argument("--gen-tokens", type=int, default=64)
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--workdir", metavar="DIR")
    args = p.parse_args()
    from edge.backends.llamacpp.samples import LlamaShape, build_tiny_llama
    from edge.llm.bench import run_llm_benchmark
    from edge.pipeline import convert

    host = C.host_info()
    results: dict[str, object] = {"host": host}
    with C.workdir(args.workdir) as wd:
        src = wd / "llama40m-f16.gguf"
        if not src.exists():
            build_tiny_llama(src, LlamaShape(n_vocab=1024, n_embd=768, n_layer=6, n_head=12, n_head_kv=4, n_ff=2048))
        bundles = {
            q: convert(
                src, "x86-cpu", wd / f"llm-{q}", ConvertRequest(precision=q, accept_parity_failure=True), force=True
            )
            for q in ("f16", "q4_k_m")
        }
        C.log(
            f"model: {src.name} ({src.stat().st_size / 1e6:.1f} MB), bundles: {', '.join(b.id for b in bundles.values())}"
        )

        # 1. runner overhead, same Llama object, alternating
        prompt = "the cat sat on the mat and looked at the"
        with bundles["q4_k_m"].open_runner({"n_ctx": 512}) as runner:
            llm = runner.llm
            no_eos = {2: -1e9}

            def direct() -> object:
                return (
                    c["choices"][0]["text"]
                    for c in llm.create_completion(
                        prompt, max_tokens=args.gen_tokens, temperature=0.0, stream=True, logit_bias=no_eos
                    )
                )

            def edgekit() -> object:
                return runner.generate(prompt, max_tokens=args.gen_tokens, logit_bias=no_eos)

            for fn in (direct, edgekit):
                _stream_tps(fn())
            tps: dict[str, list[float]] = {"edgekit": [], "direct": []}
            counts: dict[str, set[int]] = {"edgekit": set(), "direct": set()}
            sides = [("edgekit", edgekit), ("direct", direct)]
            for r in range(args.rounds):
                for name, fn in sides if r % 2 == 0 else sides[::-1]:
                    n, v = _stream_tps(fn())
                    tps[name].append(v)
                    counts[name].add(n)
            info = runner.info.to_json()
        med = {k: float(np.median(v)) for k, v in tps.items()}
        overhead = (med["direct"] / med["edgekit"] - 1) * 100  # time per token, edgekit vs direct
        results["overhead"] = {
            "tps": tps,
            "median_tps": med,
            "overhead_pct": overhead,
            "runner": info,
            "pieces_per_call": {k: sorted(v) for k, v in counts.items()},
        }

        # 2. q4_k_m vs f16
        reps: dict[str, list[dict]] = {"f16": [], "q4_k_m": []}
        for r in range(3):
            for q in ("f16", "q4_k_m") if r % 2 == 0 else ("q4_k_m", "f16"):
                b = bundles[q]
                rep = run_llm_benchmark(
                    lambda _b=b, **o: _b.open_runner(o), prompt_tokens=128, gen_tokens=args.gen_tokens, repetitions=3
                )
                reps[q].append(rep.to_json())

        def med_of(q: str, key: str) -> float:
            return float(np.median([r[key]["mean"] for r in reps[q]]))

        sizes = {q: b.manifest["artifacts"][0]["bytes"] for q, b in bundles.items()}
        gate = bundles["q4_k_m"].manifest["parity"]
        results["q4_vs_f16"] = {"bytes": sizes, "runs": reps, "gate": gate}

    print(C.host_line(host))
    print(
        f"\n1. runner overhead (q4_k_m, {args.rounds} alternating rounds x {args.gen_tokens} tokens, "
        f"{info['runtime']}, {info['threads']} threads, AMX buffers {info['details']['amx_extra_buffers']})"
    )
    print(
        C.table(
            ["side", "median gen tok/s", "min", "max"],
            [[k, C.f(med[k], 1), C.f(min(tps[k]), 1), C.f(max(tps[k]), 1)] for k in ("edgekit", "direct")],
        )
    )
    print(
        f"   edgekit time per token vs direct at the median: {overhead:+.2f}%   goal <= 2%: "
        f"{'PASS' if overhead <= 2 else 'FAIL'}"
    )
    print(
        f"\n2. q4_k_m vs f16 (3 alternating runs of 3 repetitions each, 128 prompt + {args.gen_tokens} generated tokens)"
    )
    rows = []
    for q in ("f16", "q4_k_m"):
        rows.append(
            [
                q,
                f"{sizes[q] / 1e6:.1f}",
                C.f(med_of(q, "ttft_ms"), 2),
                C.f(med_of(q, "prompt_tps"), 0),
                C.f(med_of(q, "gen_tps"), 1),
            ]
        )
    print(C.table(["bundle", "MB", "ttft ms", "prompt tok/s", "gen tok/s"], rows))
    print(
        f"   size ratio q4_k_m/f16: {sizes['q4_k_m'] / sizes['f16']:.3f}; generation speed-up: "
        f"{med_of('q4_k_m', 'gen_tps') / med_of('f16', 'gen_tps'):.2f}x; prompt speed ratio: "
        f"{med_of('q4_k_m', 'prompt_tps') / med_of('f16', 'prompt_tps'):.2f}x"
    )
    print(
        f"   quality gate q4_k_m vs f16 source: mean KL {gate['kl_mean']:.4f} (p99 {gate['kl_p99']:.3f}), "
        f"top-1 {gate['top1']:.1%} on {gate['tokens']} tokens "
        f"({'pass' if gate['passed'] else 'FAIL: random weights amplify quantization error'})"
    )
    C.dump_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
