"""The LLM quality gate: a quantized GGUF against its source on the same token windows.

Per position: KL(P_source || P_quant) of the next-token distributions and top-1 agreement,
what llama.cpp's ``llama-perplexity --kl-divergence`` reports. The windows are natural text
tokenized by the model (``edge.llm.evaltext``). Thresholds per quant type live here only; a
failing quant stops ``convert`` like a failing parity check.

The same evaluation picks the bundle's reference samples for the device's check on first load
(``edge.verify.refpairs``): prefixes of the windows with the source's top-k next-token log-probabilities.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:
    from edge.llm.evaltext import EvalText

# (max mean KL in nats, min top-1 agreement) over the evaluated positions. Set on the tiny
# random-weight test model (docs/llm.md). Trained models, measured:
# - a 135M llama from its f16 source on 115 tokens of English prose (issue 13): q8_0 KL 0.0032 /
#   top-1 97.4%, q4_k_m KL 0.043 / 89.6% (on random ids: q8_0 top-1 87.9%, q4_k_m 65.6%);
# - SmolLM2-135M-Instruct, the only trained GGUF here, ships as Q4_1 (examples/models): requantized
#   to q8_0 against it on the built-in text (1,024 tokens), KL 0.0092 / top-1 93.0% (English 92.2%,
#   code 96.9%); from its Q4_1 weights widened to f16, q8_0 KL 0.0083 / 93.5% on the text and
#   0.0095 / 91.0% on random ids. The KL limit holds; 95% top-1 does not, and the flips sit at
#   near ties: where the source's top-1 leads by >= 0.1 nats (91% of positions) q8_0 agrees on
#   97.1%, below it on 58.8%. Its 4/5-bit requantizations (a second grid over the Q4_1 one, and
#   rows of 576 that k-quants cannot take) say nothing about quantizing an f16 source.
THRESHOLDS: dict[str, tuple[float, float]] = {
    "f16": (0.001, 0.98),
    "q8_0": (0.01, 0.95),
    "q5_k_m": (0.05, 0.90),
    "q4_k_m": (0.10, 0.85),
    "q4_0": (0.20, 0.80),
}
#: top-1 is gated where the source is decisive: its top choice leads the second by at least this many nats.
#: Below it the two candidates are near-equivalent continuations and a flip is rounding, not damage
#: (SmolLM2 q8_0: 91% of positions decisive, 97.1% agreement there, 58.8% at the near-ties).
DECISIVE_MARGIN = 0.1
#: with fewer decisive positions than this the gate falls back to top-1 over every position
MIN_DECISIVE = 32
#: next-token candidates a reference sample keeps (ids and log-probabilities)
TOP_K = 8
#: reference samples a bundle carries for the device
REFERENCE_SAMPLES = 8
#: a reference sample's position: the source's and the quant's top-1 agree with at least this
#: log-probability margin over their second choice (a device computing what the host computed
#: keeps the same top-1 there; one computing something else does not)
REFERENCE_MARGIN = 0.5


def thresholds(quant: str) -> tuple[float, float]:
    """(max mean KL, min top-1) for ``quant``; types without their own limits get q4_0's."""
    return THRESHOLDS.get(quant, THRESHOLDS["q4_0"])


@dataclass(frozen=True)
class TopKSample:
    """A token prefix and the reference's top-k next-token ids and log-probabilities after it."""

    tokens: np.ndarray  # int32 [n]
    top_ids: np.ndarray  # int32 [k], most likely first
    top_logprobs: np.ndarray  # float32 [k], log-softmax over the whole vocabulary
    window: int = -1  # where it was taken from: the window's index and the position in it (-1: unknown)
    position: int = -1


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
    eval: dict[str, Any] | None = None  # EvalText.to_json(): which text, how many windows
    by_text: list[dict[str, Any]] = field(default_factory=list)  # per text: windows, tokens, KL, top-1
    #: candidates for the bundle's reference pairs, and the quantized model's figures on them as this
    #: host computed it (not part of the record)
    reference_samples: list[TopKSample] = field(default_factory=list, repr=False)
    reference_note: str | None = None
    top1_decisive: float | None = None  # top-1 where the source leads by >= DECISIVE_MARGIN nats
    decisive_share: float | None = None  # the share of positions that are decisive
    source_type: str | None = None  # the source's file type (q4_1, f16...): a quantized one is requantized

    @property
    def gated_top1(self) -> float:
        """What the top-1 limit applies to: agreement where the source is decisive, when there are enough."""
        return self.top1_decisive if self.top1_decisive is not None else self.top1

    @property
    def passed(self) -> bool:
        return self.kl_mean <= self.max_kl and self.gated_top1 >= self.min_top1

    def failures(self) -> list[str]:
        out = []
        if self.kl_mean > self.max_kl:
            out.append(f"mean KL {self.kl_mean:.4g} > {self.max_kl}")
        if self.gated_top1 < self.min_top1:
            where = (
                f" where the source is decisive ({self.decisive_share:.0%} of positions; {self.top1:.1%} over all)"
                if self.top1_decisive is not None
                else ""
            )
            out.append(f"top-1 agreement {self.gated_top1:.1%}{where} < {self.min_top1:.0%}")
        if out and self.eval and self.eval.get("origin") == "random":
            out.append(f"evaluated on {self.eval['description']}")
        why = requantize_note(self.source_type, self.quant) if out else None
        if why:
            out.append(why)
        return out

    def to_json(self) -> dict[str, Any]:
        out = {
            "kind": "llm",
            "passed": self.passed,
            "quant": self.quant,
            "tokens": self.tokens,
            "kl_mean": self.kl_mean,
            "kl_p99": self.kl_p99,
            "kl_max": self.kl_max,
            "top1": self.top1,
            "thresholds": {"max_kl_mean": self.max_kl, "min_top1": self.min_top1},
            "top1_decisive": self.top1_decisive,
            "decisive_share": self.decisive_share,
            "reference": "source GGUF in llama.cpp (CPU), the same token windows",
        }
        if self.eval is not None:
            out["eval"] = {**self.eval, "texts": self.by_text}
        return out


def requantize_note(source_type: str | None, quant: str) -> str | None:
    """Why a failed gate on a requantized source is expected, and what to do instead; None for an
    unquantized source.

    A quantized source's weights already sit on a grid; requantizing puts them on a second one, so its
    rounding error adds to the first, and the gate compares with the quantized source only, so it sees the
    second error alone: the loss against the original weights is larger than it measures. SmolLM2-135M
    Q4_1 -> q4_k_m: decisive top-1 83.9 % < 85 % (its 576-wide rows also take k-quant fallback types).
    Lowering the limit would pass a double quantization off as a q4_k_m one."""
    from edge.backends.llamacpp.format import UNQUANTIZED_TYPES, quant_bits

    if not source_type or source_type.lower() in UNQUANTIZED_TYPES:
        return None
    bits = quant_bits(source_type)
    start = "an f16/bf16 GGUF of the model" + (" (or q8_0)" if bits is not None and bits < 8 else "")
    return (
        f"the source is already quantized ({source_type}{f', {bits}-bit' if bits else ''}): requantizing to "
        f"{quant} rounds its weights a second time and the errors compound (measured here against the "
        f"{source_type} file, not the original weights); quantize from {start}, or ship the {source_type} "
        "file as it is (--precision keep)"
    )


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    out: np.ndarray = x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
    return out


def window_logprobs(path: Path, windows: Sequence[Sequence[int]], options: Mapping[str, Any]) -> list[np.ndarray]:
    """Next-token log-probabilities [len(window), n_vocab] (float32) at every position of each
    window, each evaluated from a fresh context on the CPU."""
    from edge.backends.llamacpp.run import LlamaCppRunner

    opts = {k: v for k, v in options.items() if k in LlamaCppRunner.options}
    opts["n_ctx"] = max(max(len(w) for w in windows) + 8, 64)
    opts["n_gpu_layers"] = 0  # the gate compares numerics on the build host's CPU
    opts.pop("require_gpu", None)
    out = []
    with LlamaCppRunner(path, options=opts, logits_all=True) as r:
        for w in windows:
            r.llm.reset()
            r.llm.eval(list(w))
            out.append(log_softmax(np.asarray(r.llm.scores[: len(w)], dtype=np.float32)).astype(np.float32))
    return out


def all_logits(path: Path, tokens: list[int], options: Mapping[str, Any]) -> np.ndarray:
    """Log-probabilities at every position of one token sequence (see :func:`window_logprobs`)."""
    return window_logprobs(path, [tokens], options)[0]


def _margin(lp: np.ndarray) -> np.ndarray:
    top2 = np.partition(lp, -2, axis=-1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


def top_k(lp: np.ndarray, k: int = TOP_K) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` most likely ids of a log-probability row (most likely first) and their log-probabilities."""
    k = min(k, lp.shape[-1])
    ids = np.argpartition(-lp, k - 1)[:k]
    ids = ids[np.argsort(-lp[ids], kind="stable")]
    return ids.astype(np.int32), lp[ids].astype(np.float32)


def pick_reference(
    windows: Sequence[Sequence[int]],
    source: Sequence[np.ndarray],
    candidate: Sequence[np.ndarray] | None = None,
    *,
    count: int = REFERENCE_SAMPLES,
    k: int = TOP_K,
) -> list[TopKSample]:
    """``count`` reference samples spread over the windows, latest positions first: each a window's
    prefix and the source's top-k after it, at positions where the source and ``candidate`` (the
    quantized model as the host computed it; None: the source alone) agree on top-1 by
    :data:`REFERENCE_MARGIN`. Positions with less context are used only when too few qualify."""
    per_window: list[list[int]] = []
    for i, p in enumerate(source):
        ok = _margin(p) >= REFERENCE_MARGIN
        if candidate is not None:
            q = candidate[i]
            ok &= (p.argmax(-1) == q.argmax(-1)) & (_margin(q) >= REFERENCE_MARGIN)
        order = [j for j in range(len(p) - 1, -1, -1) if ok[j]]
        order += [j for j in range(len(p) - 1, -1, -1) if not ok[j]]  # the rest, only if needed
        per_window.append(order)
    picks: list[tuple[int, int]] = []
    for rank in range(max((len(o) for o in per_window), default=0)):
        picks += [(i, o[rank]) for i, o in enumerate(per_window) if rank < len(o)]
        if len(picks) >= count:
            break
    out = []
    for i, j in picks[:count]:
        ids, lps = top_k(source[i][j], k)
        out.append(TopKSample(np.asarray(windows[i][: j + 1], dtype=np.int32), ids, lps, i, j))
    return out


def topk_figures(sample: TopKSample, logits: np.ndarray) -> tuple[float, bool]:
    """(KL estimate, top-1 agrees) of a model's logits after ``sample.tokens`` against the reference's
    top-k: KL between the two distributions coarsened to the k ids plus one bucket for the rest of
    the vocabulary. Coarsening never raises a KL, so this is a lower bound of the full one."""
    q = log_softmax(np.asarray(logits, dtype=np.float64)[None])[0]
    ids = sample.top_ids.astype(np.int64)
    lp = sample.top_logprobs.astype(np.float64)
    lq = q[ids]
    p_rest = max(0.0, 1.0 - float(np.exp(lp).sum()))
    q_rest = max(1e-30, 1.0 - float(np.exp(lq).sum()))
    kl = float((np.exp(lp) * (lp - lq)).sum())
    if p_rest > 1e-12:
        kl += p_rest * (np.log(p_rest) - np.log(q_rest))
    return max(kl, 0.0), int(q.argmax()) == int(ids[0])


def compare_gguf(
    source: Path, quantized: Path, quant: str, text: EvalText | Sequence[int], options: Mapping[str, Any]
) -> QualityReport:
    """The gate's figures for ``quantized`` against ``source`` on ``text``'s windows (a plain token
    list: one window), with reference samples picked for the bundle."""
    from edge.llm.evaltext import EvalText, EvalWindow

    if not isinstance(text, EvalText):
        text = EvalText(
            "random", (EvalWindow("random", 0, tuple(int(t) for t in text)),), {}, "token ids given by the caller"
        )
    windows = [list(w.tokens) for w in text.windows]
    p = window_logprobs(source, windows, options)
    q = window_logprobs(quantized, windows, options)
    kl = [(np.exp(a.astype(np.float64)) * (a.astype(np.float64) - b)).sum(-1) for a, b in zip(p, q)]
    agree = [a.argmax(-1) == b.argmax(-1) for a, b in zip(p, q)]
    by_text = []
    for name in dict.fromkeys(w.text for w in text.windows):
        idx = [i for i, w in enumerate(text.windows) if w.text == name]
        kl_t, ag_t = np.concatenate([kl[i] for i in idx]), np.concatenate([agree[i] for i in idx])
        by_text.append(
            {
                "name": name,
                "sha256": text.sha256.get(name),
                "windows": len(idx),
                "tokens": int(kl_t.size),
                "kl_mean": float(kl_t.mean()),
                "top1": float(ag_t.mean()),
            }
        )
    all_kl, all_agree = np.concatenate(kl), np.concatenate(agree)
    lead = np.concatenate([np.diff(np.sort(a.astype(np.float64), axis=-1)[:, -2:], axis=-1)[:, 0] for a in p])
    decisive = lead >= DECISIVE_MARGIN
    top1_decisive = float(all_agree[decisive].mean()) if int(decisive.sum()) >= MIN_DECISIVE else None
    max_kl, min_top1 = thresholds(quant)
    try:
        from edge.backends.llamacpp.format import file_type_name, read_gguf

        source_type: str | None = file_type_name(read_gguf(source))
    except Exception:  # noqa: BLE001 - only the failure message's advice depends on it
        source_type = None
    samples = pick_reference(windows, p, q)
    host = [topk_figures(s, q[s.window][s.position]) for s in samples]
    note = (
        (
            f"the build host's {quant} on these samples: mean KL over the top-{TOP_K} "
            f"{np.mean([h[0] for h in host]):.4g}, top-1 {sum(h[1] for h in host)}/{len(host)}"
        )
        if host
        else None
    )
    return QualityReport(
        quant,
        int(all_kl.size),
        float(all_kl.mean()),
        float(np.percentile(all_kl, 99)),
        float(all_kl.max()),
        float(all_agree.mean()),
        max_kl,
        min_top1,
        text.to_json(),
        by_text,
        samples,
        note,
        top1_decisive,
        float(decisive.mean()),
        source_type,
    )


def reference_samples(model: Path, text: EvalText, options: Mapping[str, Any]) -> list[TopKSample]:
    """Reference samples computed by ``model`` itself (a GGUF shipped as it is)."""
    windows = [list(w.tokens) for w in text.windows]
    return pick_reference(windows, window_logprobs(model, windows, options))
