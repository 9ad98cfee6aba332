"""The gates a bundle passes before it ships: never a manifest's word.

``parity.passed`` and a benchmark's ``verdict`` are recomputed from the recorded figures against the
thresholds in code (``edge.verify.parity``, ``edge.llm.quality``), and a record that claims better than
its figures is refused as edited.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from edge.bundle.schema import (BenchmarkEvidence, LLMQualityEvidence, Manifest, ParityEvidence, SkippedParity,
                                device_class_of)
from edge.errors import BudgetError, DeployError
from edge.verify.parity import looks_like_classifier, output_failures, thresholds_for


@dataclass(frozen=True)
class ParityVerdict:
    """What the recorded parity figures say against this edgekit's thresholds."""

    state: Literal["pass", "fail", "skipped", "missing"]  # skipped: not run where built, with a reason
    failures: list[str] = field(default_factory=list)  # why it fails, from the figures
    edited: str | None = None  # the record claims a pass its figures do not support
    skipped: str | None = None


def parity_verdict(m: Manifest) -> ParityVerdict:
    """Pass/fail recomputed from the per-output figures against ``edge.verify.parity`` thresholds for the
    bundle's precision (``edge.llm.quality`` for GGUF quants). ``passed`` is only compared."""
    par = m.parity
    if par is None:
        return ParityVerdict("missing")
    if isinstance(par, SkippedParity):
        return ParityVerdict("skipped", skipped=par.skipped)
    failures: list[str] = []
    if isinstance(par, LLMQualityEvidence):
        from edge.llm.quality import thresholds as llm_thresholds

        max_kl, min_top1 = llm_thresholds(par.quant)
        gated = par.top1_decisive if par.top1_decisive is not None else par.top1
        if not par.kl_mean <= max_kl:
            failures.append(f"mean KL {par.kl_mean:.4g} > {max_kl}")
        if not gated >= min_top1:
            failures.append(f"top-1 agreement {gated:.1%} < {min_top1:.0%}")
    elif isinstance(par, ParityEvidence):
        # the compute precision may loosen the limits only to another precision's limits in code
        th = thresholds_for(m.precision, par.candidate.precision_used)
        figures = {o.name: o for o in par.outputs}
        for t in m.io.outputs:
            o = figures.get(t.name)
            if o is None:
                failures.append(f"{t.name}: no parity figures")
                continue
            if not (math.isfinite(o.max_abs) and math.isfinite(o.mean_abs)):
                failures.append(f"{o.name}: output missing, of another shape, or not finite")
            # a [N, C] output is judged by top-1 when it is a classifier; one that parity found not to be (a
            # regression, an embedding: issue #23) says why in its task note
            if o.top1 is None and looks_like_classifier(tuple(d if isinstance(d, int) else 0 for d in t.shape)) \
                    and not (o.task is None and o.task_note):
                failures.append(f"{o.name}: classifier-shaped output with neither a top-1 figure nor a reason")
            if o.degenerate and (o.ref_min is None or o.ref_max is None):
                failures.append(f"{o.name}: marked degenerate without the reference's range")
            # the one judgement edge.verify.parity made when it was built: whether the reference was degenerate
            # is recomputed from its recorded range, never taken from the flag
            failures += [f"{o.name}: {f}" for f in output_failures(o, th)]
            failures += [f"{o.name}: {f}" for f in o.failures if f"{o.name}: {f}" not in failures]
    if failures and par.passed:
        return ParityVerdict("fail", failures, edited=f"its parity record says passed, but its figures fail this "
                             f"edgekit's {m.precision} thresholds ({failures[0]})")
    # a record that says failed with passing figures is taken at its (more careful) word
    if failures or not par.passed:
        return ParityVerdict("fail", failures or ["the parity record says failed"])
    return ParityVerdict("pass")


def check_gates(m: Manifest, *, accept_parity_failure: bool = False, accept_budget_failure: bool = False) -> None:
    """Refuse to ship a bundle whose evidence fails: parity recomputed from its figures (an edited
    record is refused whatever is accepted), missing parity (unless accepted; skipped with a reason
    is fine), and an on-device benchmark over its budget (the verdict recomputed from p99)."""
    bid = m.bundle_id
    v = parity_verdict(m)
    if v.edited:
        raise DeployError(f"refusing to ship {bid}: {v.edited}; the manifest was edited or built with looser "
                          "thresholds", hint="rebuild it with `edgekit convert`")
    if v.state == "missing" and not accept_parity_failure:
        raise DeployError(f"refusing to ship {bid}: it has no parity record (neither run nor skipped with a reason)",
                          hint="rebuild it with `edgekit convert`, or pass --accept-parity-failure to ship it anyway")
    if v.state == "fail" and not accept_parity_failure:
        raise DeployError(f"refusing to ship {bid}: it failed parity ({'; '.join(v.failures[:3])})",
                          hint="pass --accept-parity-failure to ship it anyway")
    bench = m.benchmark
    if isinstance(bench, BenchmarkEvidence):
        p99, budget = bench.latency.p99_ms, bench.budget_ms
        verdict = "no budget" if budget is None else ("pass" if p99 <= budget else "fail")
        if bench.verdict != verdict and bench.verdict != "fail":
            raise DeployError(f"refusing to ship {bid}: its benchmark says {bench.verdict!r}, but p99 {p99:.2f} ms "
                              f"against a {budget} ms budget is {verdict!r}; the manifest was edited",
                              hint="benchmark it again with `edgekit bench --record`")
        # off the target's device class: a fallback device, or another machine (edge.bench.judge_device_class)
        dc = device_class_of(bench)  # the typed field, else runner.details in older manifests
        other_class = dc is not None and dc["same"] is False and bool(dc["reason"])
        if not bench.on_target_device and bench.runner.fallback is None and not other_class:
            raise DeployError(f"refusing to ship {bid}: its benchmark says it did not run on the target device "
                              "but names no fallback (runner.fallback) and no other device class "
                              "(benchmark.device_class); the manifest was edited",
                              hint="benchmark it again with `edgekit bench --record`")
        if "fail" in (verdict, bench.verdict) and bench.on_target_device and not accept_budget_failure:
            raise BudgetError(f"refusing to ship {bid}: p99 {p99:.2f} ms is over the {budget or 0:.2f} ms budget "
                              f"({bench.budget_source})", hint="pass --accept-budget-failure to ship it anyway")
