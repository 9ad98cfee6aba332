"""The gates a bundle passes before it ships: never a manifest's word.

``parity.passed`` and a benchmark's ``verdict`` are recomputed from the recorded figures against the
thresholds in code (``edge.verify.parity``, ``edge.llm.quality``), and a record that claims better than
its figures is refused as edited.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from edge.bundle.schema import (
    BenchmarkEvidence,
    LLMQualityEvidence,
    Manifest,
    ParityEvidence,
    SkippedParity,
    device_class_of,
)
from edge.errors import BudgetError, DeployError, EdgeError, TargetError
from edge.verify.corroborate import budget_problem, isa_problem, no_reference_problem, range_problem, task_note_problem
from edge.verify.parity import (
    degenerate_reason,
    looks_like_classifier,
    output_failures,
    thresholds_for,
    unverified_reason,
)

#: why parity may be skipped: the only reasons the pipeline writes (a closed set; edge.pipeline uses these)
SKIP_NO_REFERENCE = "no reference outputs: the source could not be run here"
SKIP_RUNNER_NOT_HERE = "runner cannot run on this host: "  # + why (edge.pipeline.plan.runnable_here)
SKIP_SOURCE_AS_IS = "the source ships as it is ("  # + the GGUF file type: an LLM bundle with no requantization
#: the device-class judgements edge.targets.same_device_class / edge.bench.judge_device_class write
_OTHER_HOST = re.compile(
    r"different device class: this host is ([a-z0-9_]+)/([a-z0-9_]+)(, NVIDIA Jetson)?; "
    r"(\S+)'s devices are .+",
    re.S,
)
_FALLBACK = "different device class: the runner used its fallback"
_UNKNOWN = "device class unknown: target profile "

#: this host's answer to "can the bundle's runner run here?": None when it can, else why not (edge.deploy passes
#: edge.pipeline.plan.runnable_here for the bundle's target)
HostCheck = Callable[[Manifest], "str | None"]


@dataclass(frozen=True)
class ParityVerdict:
    """What the recorded parity figures say against this edgekit's thresholds."""

    # skipped: not run where built, with a reason; unverified: run, nothing failed, but no output's reference
    # discriminates (each is constant across the samples): ``skipped`` holds the reason, and it ships as a skipped one
    state: Literal["pass", "fail", "skipped", "missing", "unverified"]
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
        if not m.io.outputs:  # nothing compared: the evidence is incomplete whatever the record says
            failures.append("io.outputs is empty: no output is compared")
        for t in m.io.outputs:
            o = figures.get(t.name)
            if o is None:
                failures.append(f"{t.name}: no parity figures")
                continue
            if not (math.isfinite(o.max_abs) and math.isfinite(o.mean_abs)):
                failures.append(f"{o.name}: output missing, of another shape, or not finite")
            # a [N, C] output is judged by top-1 when it is a classifier; one that parity found not to be (a
            # regression, an embedding: issue #23) says why in its task note
            if o.top1 is None and looks_like_classifier(tuple(d if isinstance(d, int) else 0 for d in t.shape)):
                if not (o.task in (None, "multi-label") and o.task_note):
                    failures.append(f"{o.name}: classifier-shaped output with neither a top-1 figure nor a reason")
                elif (why := task_note_problem(o, None)) is not None:
                    failures.append(f"{o.name}: no top-1 figure, and {why}")
            if (why := range_problem(o)) is not None:
                failures.append(f"{o.name}: {why}")
            if o.degenerate and (o.ref_min is None or o.ref_max is None):
                failures.append(f"{o.name}: marked degenerate without the reference's range")
            # the one judgement edge.verify.parity made when it was built: whether the reference was degenerate
            # is recomputed from its recorded range, never taken from the flag
            failures += [f"{o.name}: {f}" for f in output_failures(o, th)]
            failures += [f"{o.name}: {f}" for f in o.failures if f"{o.name}: {f}" not in failures]
        failures += _fp16_proxy_failures(par)
        listed = {t.name for t in m.io.outputs}
        failures += [
            f"{name}: parity figures for an output io.outputs does not list" for name in figures if name not in listed
        ]
    if failures and par.passed:
        return ParityVerdict(
            "fail",
            failures,
            edited=f"its parity record says passed, but its figures fail this edgekit's {m.precision} thresholds ({failures[0]})",
        )
    # a record that says failed with passing figures is taken at its (more careful) word
    if failures or not par.passed:
        return ParityVerdict("fail", failures or ["the parity record says failed"])
    if isinstance(par, ParityEvidence):  # recomputed from the recorded ranges, never taken from the record's word
        why = unverified_reason([degenerate_reason(o.ref_min, o.ref_max, par.samples) for o in par.outputs])
        if why is not None:
            return ParityVerdict("unverified", skipped=why)
    return ParityVerdict("pass")


def _fp16_proxy_failures(par: ParityEvidence) -> list[str]:
    """The fp16 proxy's figures (a device that computes in fp16) against fp16's thresholds, recomputed."""
    fp = par.fp16_proxy
    if fp is None:
        return []
    th = thresholds_for("fp16")
    found = [f"fp16 proxy: {o.name}: {f}" for o in fp.outputs for f in output_failures(o, th)]
    found += [f"fp16 proxy: {o.name}: output not finite" for o in fp.outputs if not math.isfinite(o.max_abs)]
    if not found and not fp.passed:
        found = [f"fp16 proxy: {f}" for f in fp.failures] or ["fp16 proxy: the record says failed"]
    return found


def skip_problem(m: Manifest, host_check: HostCheck | None) -> str | None:
    """Why a skipped parity record is not one this edgekit could have written for this bundle (None: it could):
    the reason must be one of the closed set the pipeline writes, and agree with the rest of the evidence."""
    par = m.parity
    if not isinstance(par, SkippedParity):
        return None
    why = par.skipped
    if why == SKIP_NO_REFERENCE:
        if m.reference_pairs is not None and m.reference_pairs.samples > 0:
            return "it says the source could not be run, yet the bundle holds the source's reference outputs"
        return no_reference_problem(m)
    if why.startswith(SKIP_RUNNER_NOT_HERE):
        here = host_check(m) if host_check is not None else "not checked"
        if here is None:
            return f"it says the runner cannot run on this host, but {m.runner.name} for {m.target.name} runs here: its parity can be checked"
        return None
    if why.startswith(SKIP_SOURCE_AS_IS):
        return None if m.kind == "llm" else "only a GGUF language model ships its source as it is"
    return f"{why[:80]!r} is not a reason edgekit skips parity for"


def output_problem(m: Manifest, bundle_dir: Path | None) -> str | None:
    """The ONNX artifact's real outputs against ``io.outputs`` (what parity compared): an output left out of the
    manifest would escape the gate. None when they agree or the artifact is not ONNX."""
    if bundle_dir is None or not m.primary_artifact.endswith(".onnx"):
        return None
    try:
        import onnx

        graph = onnx.load(str(Path(bundle_dir) / m.primary_artifact), load_external_data=False).graph
    except ImportError:  # pragma: no cover - onnx comes with every build host
        return None
    except Exception as e:  # noqa: BLE001 - a model onnx cannot read fails the gate, it is not a crash
        return f"its ONNX artifact cannot be read ({type(e).__name__})"
    real = [o.name for o in graph.output]
    listed = [t.name for t in m.io.outputs]
    if sorted(real) != sorted(listed):
        return f"io.outputs lists {listed[:8]}, the ONNX model's outputs are {real[:8]}"
    return None


def pairs_task_problem(m: Manifest, bundle_dir: Path | None) -> str | None:
    """A classifier-shaped output whose top-1 parity dropped (a task note) while the bundle's own reference
    outputs say it is a classifier (every row a distribution). None when there is nothing to hold against it."""
    par, entry = m.parity, m.reference_pairs
    if bundle_dir is None or not isinstance(par, ParityEvidence) or entry is None or entry.file is None:
        return None
    shapes = {t.name: tuple(d if isinstance(d, int) else 0 for d in t.shape) for t in m.io.outputs}
    dropped = [
        o for o in par.outputs if o.top1 is None and o.task_note and looks_like_classifier(shapes.get(o.name, ()))
    ]
    if not dropped:
        return None
    from edge.verify.refpairs import load_reference_pairs

    try:
        pairs = load_reference_pairs(bundle_dir, entry, m.io.to_spec())
    except EdgeError:
        return None  # the device's own check refuses a damaged pairs file
    for o in dropped:
        why = task_note_problem(o, [p[o.name] for p in pairs.outputs if o.name in p])
        if why is not None:
            return f"{o.name}: no top-1 figure, and {why}"
    return None


def _profile_of(m: Manifest) -> Any:
    from edge.targets import get_target

    try:
        return get_target(m.target.name)
    except TargetError:
        return None


def device_class_problem(m: Manifest, bench: BenchmarkEvidence) -> str | None:
    """Why a benchmark's "another device class" claim cannot be this edgekit's judgement (None: it can be): the
    reason must be one the code writes and agree with the recorded runner and the target's own device class."""
    dc = device_class_of(bench)
    if bench.on_target_device:
        return None
    if bench.runner.fallback:
        return None  # the runner said it fell back: off the target's accelerator whatever the host
    reason = dc["reason"] if dc is not None else ""
    if reason.startswith(_FALLBACK):
        return "its device class says the runner used its fallback, and runner.fallback is empty"
    if reason.startswith(_UNKNOWN):
        return None
    hit = _OTHER_HOST.fullmatch(reason)
    if hit is None:
        return "names no fallback (runner.fallback) and no other device class (benchmark.device_class)"
    os_name, arch, jetson, target = hit.group(1), hit.group(2), bool(hit.group(3)), hit.group(4)
    if target != m.target.name:
        return f"its device class was judged for target {target}, the bundle is for {m.target.name}"
    profile = _profile_of(m)
    if profile is not None:
        cls = profile.device_class
        if os_name in cls.os and arch in cls.arch and (cls.platform != "jetson" or jetson):
            return f"its device class says {os_name}/{arch} is another device class, and it is one of {m.target.name}'s ({cls.describe()})"
    return None


def _budget(m: Manifest, bench: BenchmarkEvidence) -> tuple[float | None, str]:
    """The budget the benchmark is judged against: its own, else the target's frame budget (a record whose
    budget was nulled is judged against the profile's, never against none)."""
    if bench.budget_ms is not None:
        return bench.budget_ms, bench.budget_source
    profile = _profile_of(m)
    frame = profile.frame_budget_ms if profile is not None else m.target.frame_budget_ms
    return frame, f"the {m.target.name} profile's frame budget (the record names none)"


def check_gates(
    m: Manifest,
    *,
    accept_parity_failure: bool = False,
    accept_budget_failure: bool = False,
    bundle_dir: Path | None = None,
    host_check: HostCheck | None = None,
) -> None:
    """Refuse to ship a bundle whose evidence fails or is incomplete: parity recomputed from its figures over
    every output (an edited record is refused whatever is accepted; with ``bundle_dir`` the ONNX artifact's own
    outputs must be the ones compared), missing parity (unless accepted), a skipped parity whose reason is not
    one the code writes or that the evidence contradicts (``host_check``: can this host run the runner?), and
    an on-device benchmark over its budget (the verdict recomputed from p99; a nulled budget is the
    profile's; a claim of another device class recomputed from the recorded facts)."""
    bid = m.bundle_id
    v = parity_verdict(m)
    if v.edited:
        raise DeployError(
            f"refusing to ship {bid}: {v.edited}; the manifest was edited or built with looser thresholds",
            hint="rebuild it with `edgekit convert`",
        )
    for problem in (skip_problem(m, host_check), output_problem(m, bundle_dir), pairs_task_problem(m, bundle_dir)):
        if problem is not None:
            raise DeployError(
                f"refusing to ship {bid}: its parity evidence does not hold: {problem}; the manifest was edited",
                hint="rebuild it with `edgekit convert`",
            )
    if v.state == "missing" and not accept_parity_failure:
        raise DeployError(
            f"refusing to ship {bid}: it has no parity record (neither run nor skipped with a reason)",
            hint="rebuild it with `edgekit convert`, or pass --accept-parity-failure to ship it anyway",
        )
    if v.state == "fail" and not accept_parity_failure:
        raise DeployError(
            f"refusing to ship {bid}: it failed parity ({'; '.join(v.failures[:3])})",
            hint="pass --accept-parity-failure to ship it anyway",
        )
    isa = isa_problem(m)
    if isa is not None and not accept_parity_failure:
        raise DeployError(f"refusing to ship {bid}: {isa}", hint="pass --accept-parity-failure to ship it anyway")
    if isinstance(m.benchmark, BenchmarkEvidence):
        _check_benchmark(m, m.benchmark, accept_budget_failure)


def _check_benchmark(m: Manifest, bench: BenchmarkEvidence, accept_budget_failure: bool) -> None:
    bid = m.bundle_id
    p99 = bench.latency.p99_ms
    recorded = "no budget" if bench.budget_ms is None else ("pass" if p99 <= bench.budget_ms else "fail")
    if bench.verdict != recorded and bench.verdict != "fail":
        raise DeployError(
            f"refusing to ship {bid}: its benchmark says {bench.verdict!r}, but p99 {p99:.2f} ms "
            f"against a {bench.budget_ms} ms budget is {recorded!r}; the manifest was edited",
            hint="benchmark it again with `edgekit bench --record`",
        )
    profile = _profile_of(m)
    frame = profile.frame_budget_ms if profile is not None else None
    budget_wrong = budget_problem(bench.budget_ms, bench.budget_source, frame, m.target.name)
    if budget_wrong is not None:
        raise DeployError(
            f"refusing to ship {bid}: its benchmark's budget does not hold: {budget_wrong}; the manifest was edited",
            hint="benchmark it again with `edgekit bench --record`",
        )
    problem = device_class_problem(m, bench)
    if problem is not None:
        raise DeployError(
            f"refusing to ship {bid}: its benchmark says it did not run on the target device but {problem}; the manifest was edited",
            hint="benchmark it again with `edgekit bench --record`",
        )
    budget, source = _budget(m, bench)
    verdict = "no budget" if budget is None else ("pass" if p99 <= budget else "fail")
    if "fail" in (verdict, bench.verdict) and bench.on_target_device and not accept_budget_failure:
        raise BudgetError(
            f"refusing to ship {bid}: p99 {p99:.2f} ms is over the {budget or 0:.2f} ms budget ({source})",
            hint="pass --accept-budget-failure to ship it anyway",
        )
