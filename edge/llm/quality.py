"""The LLM quality gate: a quantized GGUF against its source on the same token sequences.

Per position: KL(P_source || P_quant) of the next-token distributions and top-1 agreement,
what llama.cpp's ``llama-perplexity --kl-divergence`` reports. Thresholds per quant type live
here only; a failing quant stops ``convert`` like a failing parity check.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

# (max mean KL in nats, min top-1 agreement). Measured on the tiny random-weight test model
# (README, "LLMs"); real models quantize with smaller KL than random ones at the same type.
THRESHOLDS: dict[str, tuple[float, float]] = {
    "f16": (0.001, 0.98),
    "q8_0": (0.01, 0.95),
    "q5_k_m": (0.05, 0.90),
    "q4_k_m": (0.10, 0.85),
    "q4_0": (0.20, 0.80),
}


@dataclass
class QualityReport:
    quant: str
    tokens: int
    kl_mean: float
    kl_p99: float
    kl_max: float
    top1: float
    max_kl: float
    min_top1: float

    @property
    def passed(self) -> bool:
        return self.kl_mean <= self.max_kl and self.top1 >= self.min_top1

    def failures(self) -> list[str]:
        out = []
        if self.kl_mean > self.max_kl:
            out.append(f"mean KL {self.kl_mean:.4g} > {self.max_kl}")
        if self.top1 < self.min_top1:
            out.append(f"top-1 agreement {self.top1:.1%} < {self.min_top1:.0%}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"kind": "llm", "passed": self.passed, "quant": self.quant, "tokens": self.tokens,
                "kl_mean": self.kl_mean, "kl_p99": self.kl_p99, "kl_max": self.kl_max, "top1": self.top1,
                "thresholds": {"max_kl_mean": self.max_kl, "min_top1": self.min_top1},
                "reference": "source GGUF in llama.cpp, same tokens"}


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def all_logits(path: Path, tokens: list[int], options: Mapping[str, Any]) -> np.ndarray:
    from edge.backends.llamacpp.run import LlamaCppRunner

    opts = {k: v for k, v in options.items() if k in LlamaCppRunner.options}
    opts["n_ctx"] = max(len(tokens) + 8, 64)
    opts["n_gpu_layers"] = 0  # the gate compares numerics on the build host's CPU
    opts.pop("require_gpu", None)
    with LlamaCppRunner(path, options=opts, logits_all=True) as r:
        r.llm.reset()
        r.llm.eval(tokens)
        return np.array(r.llm.scores[: len(tokens)], dtype=np.float32)


def compare_gguf(source: Path, quantized: Path, quant: str, tokens: list[int], options: Mapping[str, Any]) -> QualityReport:
    p = _log_softmax(all_logits(source, tokens, options))
    q = _log_softmax(all_logits(quantized, tokens, options))
    kl = (np.exp(p) * (p - q)).sum(axis=-1)
    top1 = float((p.argmax(-1) == q.argmax(-1)).mean())
    max_kl, min_top1 = THRESHOLDS.get(quant, THRESHOLDS["q4_0"])
    return QualityReport(quant, len(tokens), float(kl.mean()), float(np.percentile(kl, 99)), float(kl.max()),
                         top1, max_kl, min_top1)


def gate_tokens(n_vocab: int, count: int = 256, seed: int = 0) -> list[int]:
    """Deterministic token sequence (BOS first) for the gate; ids avoid the first control tokens."""
    rng = np.random.default_rng(seed)
    return [1] + [int(t) for t in rng.integers(3, n_vocab, size=count - 1)]
