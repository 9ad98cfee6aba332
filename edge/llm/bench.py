"""LLM benchmark in llama-bench's terms: load time, time to first token, prompt-processing and
generation tokens/s (mean ± std over repetitions), peak RSS, and a verdict against --ttft-ms/--min-tps.

Each repetition evaluates a fresh deterministic prompt of ``prompt_tokens`` and then generates
``gen_tokens`` greedily, one decode per token, exactly as an application streaming tokens would.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from edge.errors import EdgeError
from edge.llm.evaltext import gate_tokens
from edge.stats import peak_rss_mb


@dataclass
class LLMBenchReport:
    bundle: str | None
    target: str | None
    load_ms: float
    prompt_tokens: int
    gen_tokens: int
    repetitions: int
    ttft_ms: tuple[float, float]  # mean, std
    prompt_tps: tuple[float, float]
    gen_tps: tuple[float, float]
    peak_rss_mb: float
    runner: dict[str, Any]
    ttft_budget_ms: float | None
    min_tps: float | None

    @property
    def verdict(self) -> str:
        if self.ttft_budget_ms is None and self.min_tps is None:
            return "no budget"
        ok = (self.ttft_budget_ms is None or self.ttft_ms[0] <= self.ttft_budget_ms) and (
            self.min_tps is None or self.gen_tps[0] >= self.min_tps
        )
        return "pass" if ok else "fail"

    def to_json(self) -> dict[str, Any]:
        def ms(v: tuple[float, float]) -> dict[str, float]:
            return {"mean": round(v[0], 3), "std": round(v[1], 3)}

        return {
            "kind": "llm",
            "bundle": self.bundle,
            "target": self.target,
            "load_ms": round(self.load_ms, 2),
            "prompt_tokens": self.prompt_tokens,
            "gen_tokens": self.gen_tokens,
            "repetitions": self.repetitions,
            "ttft_ms": ms(self.ttft_ms),
            "prompt_tps": ms(self.prompt_tps),
            "gen_tps": ms(self.gen_tps),
            "peak_rss_mb": round(self.peak_rss_mb, 1),
            "runner": self.runner,
            "ttft_budget_ms": self.ttft_budget_ms,
            "min_tps": self.min_tps,
            "verdict": self.verdict,
        }


def _mean_std(xs: list[float]) -> tuple[float, float]:
    a = np.asarray(xs, dtype=np.float64)
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else 0.0


def run_llm_benchmark(
    open_runner: Callable[..., Any],
    *,
    prompt_tokens: int = 128,
    gen_tokens: int = 64,
    repetitions: int = 3,
    ttft_ms: float | None = None,
    min_tps: float | None = None,
    bundle: str | None = None,
    target: str | None = None,
) -> LLMBenchReport:
    if prompt_tokens < 1 or gen_tokens < 1 or repetitions < 1:
        raise EdgeError("--prompt-tokens, --gen-tokens and --repetitions must be >= 1")
    t0 = time.perf_counter()
    runner = open_runner(n_ctx=prompt_tokens + gen_tokens + 8)
    load_ms = (time.perf_counter() - t0) * 1e3
    ttft, pp, tg = [], [], []
    with runner:
        llm, n_vocab = runner.llm, runner.n_vocab
        ctx = llm._ctx
        for rep in range(repetitions + 1):  # repetition 0 warms caches and is not counted
            prompt = gate_tokens(n_vocab, prompt_tokens, seed=100 + rep)
            llm.reset()
            start = time.perf_counter()
            llm.eval(prompt)
            prompt_done = time.perf_counter()
            tok = int(np.ctypeslib.as_array(ctx.get_logits_ith(-1), shape=(n_vocab,)).argmax())
            first = time.perf_counter()
            for _ in range(gen_tokens - 1):
                llm.eval([tok])
                tok = int(np.ctypeslib.as_array(ctx.get_logits_ith(-1), shape=(n_vocab,)).argmax())
            end = time.perf_counter()
            if rep == 0:
                continue
            ttft.append((first - start) * 1e3)
            pp.append(prompt_tokens / (prompt_done - start))
            tg.append((gen_tokens - 1) / (end - first) if gen_tokens > 1 else float("nan"))
        info = runner.info.to_json()
    return LLMBenchReport(
        bundle,
        target,
        load_ms,
        prompt_tokens,
        gen_tokens,
        repetitions,
        _mean_std(ttft),
        _mean_std(pp),
        _mean_std(tg),
        peak_rss_mb(),
        info,
        ttft_ms,
        min_tps,
    )
