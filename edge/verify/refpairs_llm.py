"""A language model's reference pairs (a GGUF bundle, kind "llm"): written on the build host from the quality gate's
samples, checked on the device through its llama.cpp runner (:func:`check_llm`, called by
:func:`edge.verify.refpairs.check_reference_pairs`). Same file as a vision bundle's (:mod:`edge.verify.refpairs_file`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from edge.errors import BundleError
from edge.verify.refpairs_file import (
    MAX_SAMPLES,
    REBUILD_HINT,
    ReferencePairs,
    entry_field,
    finite_or_none,
    load_reference_pairs,
    write_reference_pairs,
)

# -- language models (GGUF) ----------------------------------------------------------------------
#
# An llm bundle's pairs are token prefixes (input "tokens") with the reference's top-k next-token
# ids and log-probabilities after each (outputs "top_ids", "top_logprobs"; edge.llm.quality picks
# them from the build host's gate). The device runs each prefix through its llama.cpp runner
# (``infer`` gives the logits after the last token) and gates top-1 agreement and a KL estimate
# over the top-k (plus one bucket for the rest of the vocabulary) against edge.llm.quality's
# limits for the bundle's quant type.

LLM_OUTPUTS = ("top_ids", "top_logprobs")
_MAX_TOP_K = 64


def _llm_io() -> Any:
    from edge.spec import IOSpec, TensorSpec

    return IOSpec(
        (TensorSpec("tokens", ("n",), "int32"),),
        (TensorSpec("top_ids", ("k",), "int32"), TensorSpec("top_logprobs", ("k",), "float32")),
    )


def write_llm_reference_pairs(
    stage: Path, samples: Sequence[Any], *, precision: str, reference: str, note: str | None = None
) -> dict[str, Any]:
    """Write ``stage/reference.npz`` from ``samples`` (``edge.llm.quality.TopKSample``) for a GGUF
    bundle of quant type ``precision``; return the manifest's ``reference_pairs`` entry."""
    from edge.llm.quality import thresholds

    if not samples:
        raise ValueError("no reference samples given")
    max_kl, min_top1 = thresholds(precision)
    entry = write_reference_pairs(
        stage,
        [{"tokens": np.asarray(s.tokens, dtype=np.int32)} for s in samples],
        [
            {"top_ids": np.asarray(s.top_ids, dtype=np.int32), "top_logprobs": np.asarray(s.top_logprobs, np.float32)}
            for s in samples
        ],
        precision=precision,
        reference=reference,
        samples=min(len(samples), MAX_SAMPLES),
        thresholds={"max_kl_mean": max_kl, "min_top1": min_top1},
    )
    if note:
        entry["note"] = note if entry.get("note") is None else f"{entry['note']}; {note}"
    return entry


def _llm_problems(pairs: ReferencePairs, n_vocab: int) -> list[str]:
    """What makes the stored samples meaningless as a reference (a crafted or damaged file)."""
    problems = []
    for s, (i, o) in enumerate(zip(pairs.inputs, pairs.outputs)):
        tokens, ids, lps = i["tokens"], o["top_ids"], o["top_logprobs"]
        if tokens.ndim != 1 or tokens.size == 0 or tokens.min() < 0 or tokens.max() >= n_vocab:
            problems.append(f"sample {s}: tokens are not 1..n ids below the vocabulary size {n_vocab}")
        if ids.ndim != 1 or not 1 <= ids.size <= _MAX_TOP_K or ids.shape != lps.shape:
            problems.append(f"sample {s}: top_ids and top_logprobs are not two lists of 1-{_MAX_TOP_K} entries")
            continue
        if ids.min() < 0 or ids.max() >= n_vocab or len(set(ids.tolist())) != ids.size:
            problems.append(f"sample {s}: top_ids are not distinct ids below {n_vocab}")
        if (
            not np.isfinite(lps).all()
            or lps.max() > 1e-3
            or (np.diff(lps) > 1e-6).any()
            or float(np.exp(lps.astype(np.float64)).sum()) > 1.001
        ):
            problems.append(f"sample {s}: top_logprobs are not descending log-probabilities summing to at most 1")
    return problems


def check_llm(bundle: Any, runner: Any, entry: Any, result: dict[str, Any]) -> dict[str, Any]:
    """``result`` (a check record begun by :func:`edge.verify.refpairs.check_reference_pairs`) completed with the
    llm bundle's pairs run through ``runner``: top-1 agreement and the KL estimate against the quant's limits."""
    from edge.llm.quality import TopKSample, thresholds, topk_figures

    pairs = load_reference_pairs(bundle.path, entry, _llm_io())
    n_vocab = bundle.io.outputs[0].shape[0] if bundle.io.outputs else None
    if not isinstance(n_vocab, int):
        raise BundleError(f"bundle {bundle.path}: its io.outputs does not give the vocabulary size", hint=REBUILD_HINT)
    problems = _llm_problems(pairs, n_vocab)
    if problems:
        raise BundleError(f"{pairs.file}: reference pairs unusable: " + "; ".join(problems[:10]), hint=REBUILD_HINT)
    code_kl, code_top1 = thresholds(bundle.precision)
    kept = entry_field(entry, "thresholds")
    kl_b, top1_b = entry_field(kept, "max_kl_mean"), entry_field(kept, "min_top1")
    max_kl = min(code_kl, float(kl_b)) if isinstance(kl_b, (int, float)) else code_kl
    min_top1 = max(code_top1, float(top1_b)) if isinstance(top1_b, (int, float)) else code_top1
    n_ctx = (runner.info.details or {}).get("n_ctx")
    samples = [TopKSample(i["tokens"], o["top_ids"], o["top_logprobs"]) for i, o in zip(pairs.inputs, pairs.outputs)]
    fit = [s for s in samples if not isinstance(n_ctx, int) or s.tokens.size <= n_ctx]
    th = {"max_kl_mean": max_kl, "min_top1": min_top1}
    if not fit:
        return {
            **result,
            "skipped": f"every reference prefix is longer than this runner's context (n_ctx {n_ctx})",
            "thresholds": th,
        }
    figures = [topk_figures(s, runner.infer({"tokens": s.tokens})["logits"]) for s in fit]
    kls = [kl for kl, _ in figures]
    kl_mean, top1 = float(np.mean(kls)), float(np.mean([agree for _, agree in figures]))
    failures = []
    if not kl_mean <= max_kl:
        failures.append(f"mean KL over the reference's top-{samples[0].top_ids.size} {kl_mean:.4g} > {max_kl}")
    if not top1 >= min_top1:
        failures.append(f"top-1 agreement {top1:.1%} < {min_top1:.0%}")
    out = {
        "name": "logits",
        "kl_topk_mean": finite_or_none(kl_mean),
        "kl_topk_max": finite_or_none(float(max(kls))),
        "top1": top1,
        "passed": not failures,
        "failures": failures,
    }
    if len(fit) < len(samples):
        out["note"] = f"{len(samples) - len(fit)} of {len(samples)} prefixes are longer than n_ctx {n_ctx}: not run"
    result.update(
        passed=not failures,
        samples=len(fit),
        thresholds=th,
        reference=entry.reference,
        outputs=[out],
        failures=[f"logits: {f}" for f in failures],
    )
    return result
