"""deploy's budget search: when the default configuration misses the frame budget on the device class deploy
judges, look for one that meets it -- with the tuner (``edge.tune.search.tune``), not a second search.

What is tried (``plan``): the precisions this CPU runs fast (int8 where the ISA has an int8 path: AVX2,
AVX-VNNI/AVX512-VNNI, AMX, ARM dot product; bf16 only with AVX512-BF16 or AMX-BF16, as OpenVINO's compute precision;
fp16 only where the ISA computes in fp16: AVX512-FP16, AMX-FP16, ARM FP16) beside the target's default, on the
runners that serve the target's device class, with the thread count and spin-wait varied and every other option at
its default (``TuneOptions.vary``). Every candidate goes through the same parity gate as the deploy (the tuner
converts each with this deploy's request; one that fails parity is never chosen), under a time cap; the winner is the
fastest whose p99 meets the budget. An explicit ``--precision`` keeps the search to that precision; a ``--tuned``
overlay or ``--tune`` is the user's own choice, and ``--no-search`` turns it off.

The manifest's ``budget_search`` records why the search ran, every candidate measured (runner, precision, options,
p50/p99, parity, status) and what was chosen and why; a refusal lists what was tried.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from edge.backends.runner import RUNNERS
from edge.backends.threads import usable_cpus
from edge.capabilities import CpuIsa, cpu_isa
from edge.errors import EdgeError
from edge.pipeline.request import ConvertRequest
from edge.tune.config import runner_space

#: seconds the search may take by default (checked between conversions and measurements: a conversion under way
#: finishes)
SEARCH_TIME_S = 300.0


def budget_vary() -> tuple[str, ...]:
    """The runner options the search varies: each runner's thread count and what it declares besides
    (``TuneSpace.budget_vary``: onnxruntime's spin-wait); the rest stay at their defaults."""
    found: list[str] = []
    for name in RUNNERS.names():
        rs = runner_space(name)
        if rs is not None:
            found += [o for o in ((rs.threads_option or ""), *rs.budget_vary) if o and o not in found]
    return tuple(found)


_INT8_PATHS = {"avx2", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp"}


@dataclass(frozen=True)
class BudgetPlan:
    precisions: tuple[str, ...]
    skipped: tuple[str, ...]  # "precision: why not", one per precision left out


def plan(profile: Any, req: ConvertRequest, isa: CpuIsa | None = None) -> BudgetPlan:
    """The precisions worth a candidate on this CPU for ``profile`` (the request's own when it names one)."""
    if req.precision:
        return BudgetPlan((req.precision,), (f"other precisions: --precision {req.precision} was given",))
    cpu = isa if isa is not None else cpu_isa()
    allowed = tuple(profile.precisions)
    out = [profile.default_precision]
    skipped = []
    if "int8" in allowed and "int8" not in out:
        if not cpu.known or cpu.flags & _INT8_PATHS:
            out.append("int8")
        else:
            skipped.append("int8: the CPU has no int8 path (AVX2, VNNI, AMX, ARM dot product)")
    if cpu.native_bf16:
        out.append("bf16")
    else:
        skipped.append("bf16: the CPU has no bf16 arithmetic (AVX512-BF16, AMX-BF16)")
    if "fp16" in allowed and "fp16" not in out:
        if cpu.native_fp16:
            out.append("fp16")
        else:
            skipped.append("fp16: the CPU has no fp16 arithmetic (AVX512-FP16, AMX-FP16, ARM FP16); F16C only converts")
    return BudgetPlan(tuple(out), tuple(skipped))


def not_searched(model: str | os.PathLike[str], req: ConvertRequest, tuned: bool, enabled: bool) -> str | None:
    """Why the search does not run (None: it may)."""
    if not enabled:
        return "--no-search was given"
    if tuned:
        return "a tune overlay (--tuned or --tune) is the user's own choice of configuration"
    if Path(model).suffix.lower() != ".onnx":
        return "the search tunes ONNX sources (edgekit tune); this source is not one"
    return None


#: candidates after the chosen one that deploy may convert and verdict when the chosen one misses the budget in its
#: own steady-state verdict (the search's short measurement and the verdict's 2 s can disagree on a loaded host)
ALTERNATES = 3


def search_ranked(
    model: str | os.PathLike[str],
    profile: Any,
    req: ConvertRequest,
    out: Path,
    budget_ms: float,
    default_p99_ms: float,
    time_s: float = SEARCH_TIME_S,
    say: Callable[[str], None] | None = None,
) -> tuple[list[Any], dict[str, Any]]:
    """(the overlays of the chosen candidate and up to :data:`ALTERNATES` next ones within ``budget_ms``, best
    first, each different once its threads are left to the runner's policy; empty: none; the manifest's
    ``budget_search``)."""
    from edge.pipeline.overlay import read_overlay
    from edge.tune.search import Schedule, TuneOptions, tune

    tell = say or (lambda _m: None)
    p = plan(profile, req)
    tell(
        f"the default configuration's p99 {default_p99_ms:.2f} ms misses the {budget_ms:.2f} ms budget: searching "
        f"precisions {', '.join(p.precisions)} x threads x spin-wait (at most {time_s:g} s, each through the parity gate)"
    )
    t0 = time.perf_counter()
    opts = TuneOptions(
        objective="latency",
        strategy="exhaustive",
        time_budget_s=time_s,
        out=out,
        precisions=p.precisions,
        budget_ms=budget_ms,
        batches=(1,),
        vary=budget_vary(),
        pictures=False,
        # the tuner's own default (5 interleaved blocks of 40): 3x30's p99 (90 samples) chose ORT fp32 threads=1 at
        # 14.14 ms for MobileNetV2 whose 2 s steady-state verdict then said 28.76 ms (load 2.3)
        schedule=Schedule(),
        alternates=ALTERNATES,
    )
    record: dict[str, Any] = {
        "reason": f"the default configuration's p99 {default_p99_ms:.3f} ms is over the {budget_ms:.3f} ms budget",
        "budget_ms": round(budget_ms, 4),
        "time_cap_s": time_s,
        "precisions": list(p.precisions),
        "skipped": list(p.skipped),
        "isa": sorted(cpu_isa().flags),
    }
    try:
        result = tune(model, profile, req.replace(precision=None), opts, on_step=tell)
    except EdgeError as e:
        record.update(
            wall_s=round(time.perf_counter() - t0, 2), candidates=[], chosen=None, why=f"not run: {e.message}"
        )
        return [], record
    cands = [_candidate(t, budget_ms) for t in result.trials]
    record.update(wall_s=round(time.perf_counter() - t0, 2), candidates=cands, pruned=list(result.pruned))
    chosen, why = _choice(result.winner, result.overlay_path, cands, budget_ms, time_s)
    record.update(chosen=chosen, why=why)
    if chosen is None or result.overlay_path is None:
        return [], record
    overlay, left = adaptive_threads(read_overlay(result.overlay_path), usable_cpus())
    if left:
        record["left_to_policy"] = left
        record["why"] = (
            f"{why}; {', '.join(left)} left to the runner's load-aware policy (what it takes on an idle host; with "
            "cores busy elsewhere it takes fewer threads and no spin-wait)"
        )
        overlay = _rewrite(result.overlay_path, overlay, f"edgekit deploy's budget search: {chosen}; {record['why']}")
    ranked, seen = [overlay], {overlay.describe()}
    for path in result.alternate_paths:  # parity passed (the tuner's ranking never takes another)
        alt, _ = adaptive_threads(read_overlay(path), usable_cpus())
        p99 = alt.tuned.get("p99_ms")
        if alt.describe() in seen or not isinstance(p99, (int, float)) or p99 > budget_ms:
            continue  # the same configuration once its threads are the policy's, or over the budget
        seen.add(alt.describe())
        ranked.append(_rewrite(path, alt, "edgekit deploy's budget search: an alternate, should the chosen one miss"))
    return ranked, record


def _rewrite(path: str, overlay: Any, comment: str) -> Any:
    """``overlay`` written over ``path`` (what the bundle records then matches the file), read back."""
    from edge.pipeline.overlay import read_overlay, write_overlay

    write_overlay(path, overlay, [comment])
    return read_overlay(path)


def adaptive_threads(overlay: Any, cpus: int) -> tuple[Any, list[str]]:
    """The chosen configuration with its thread count and spin-wait left to the runner's load-aware policy
    (``edge.backends.threads.plan_threads``) where they are what that policy takes on an idle host: every CPU
    here, spin-wait on. Pinned, a bundle the search chose with the host idle ran 2 threads beside a busy core
    (YOLOv8n-320 OpenVINO int8 on a 2-CPU EPYC: steady p99 17.18 ms against 16.67; at 60 fps 181 of 600 frames
    late); left to the policy, it takes one thread and no spin-wait there. A count under every CPU stays as
    chosen. (the overlay, what was left to the policy)."""
    import dataclasses

    rs = runner_space(overlay.runner)
    if rs is None:
        return overlay, []
    opts, left = dict(overlay.run_options), []
    t = rs.threads_option
    if t and opts.get(t) == cpus:
        del opts[t]
        left.append(f"{t} (the search's {cpus}: every CPU here)")
    for o in rs.budget_vary:
        if opts.get(o) is True:
            del opts[o]
            left.append(f"{o} (on in the search)")
    return (dataclasses.replace(overlay, run_options=opts), left) if left else (overlay, [])


def _choice(
    w: dict[str, Any] | None, overlay: Any, cands: list[dict[str, Any]], budget_ms: float, time_s: float
) -> tuple[str | None, str]:
    """(the label the search chose, or None; why): the tuner's winner when it passed parity and met the budget."""
    res = (w or {}).get("result") or {}
    if w is None or overlay is None:
        measured = [c for c in cands if c["p99_ms"] is not None]
        why = (
            "no candidate that passed parity was measured"
            if measured or any(c["parity"] is True for c in cands)
            else f"no candidate converted within the {time_s:g} s cap passed parity"
            if cands
            else "nothing was tried"
        )
        return None, why
    if not isinstance(res.get("p99_ms"), (int, float)) or res["p99_ms"] > budget_ms:
        return None, (
            f"no candidate that passed parity met the budget (the tuner's best, {w['label']}: p50 "
            f"{res.get('p50_ms', 0):.2f} ms, p99 {res.get('p99_ms', 0):.2f} ms)"
        )
    within = [c for c in cands if c["within_budget"]]
    return str(w["label"]), (
        f"the fastest (the tuner's ranking: median latency) of the {len(within)} candidate(s) that passed parity "
        "and met the budget "
        f"(p50 {res.get('p50_ms', 0):.2f} ms, p99 {res['p99_ms']:.2f} ms in the search's short measurement); deploy's "
        "steady-state verdict on the bundle converted with it decides"
    )


def _candidate(t: dict[str, Any], budget_ms: float) -> dict[str, Any]:
    res = t.get("result") or {}
    passed = (t.get("parity") or {}).get("passed")
    p99 = res.get("p99_ms")
    return {
        "label": t.get("label"),
        "runner": t.get("runner"),
        "precision": t.get("precision"),
        "options": {k: v for k, v in (t.get("options") or {}).items() if k != "inference_precision"},
        "p50_ms": round(res["p50_ms"], 3) if isinstance(res.get("p50_ms"), (int, float)) else None,
        "p99_ms": round(p99, 3) if isinstance(p99, (int, float)) else None,
        "parity": passed,
        "within_budget": bool(passed is True and isinstance(p99, (int, float)) and p99 <= budget_ms),
        "status": str(t.get("status", ""))[:300],
    }


def tried_line(record: dict[str, Any]) -> str:
    """What the search tried, one line, for a refusal."""
    cands = record.get("candidates") or []
    if not cands:
        return f"budget search: {record.get('why')}"
    shown = "; ".join(
        f"{c['label']}: "
        + (
            "parity failed"
            if c["parity"] is False
            else f"p99 {c['p99_ms']:.2f} ms"
            if c["p99_ms"] is not None
            else c["status"] or "not measured"
        )
        for c in cands[:12]
    )
    more = f" (+{len(cands) - 12} more)" if len(cands) > 12 else ""
    return f"budget search ({record.get('wall_s')} s of {record.get('time_cap_s')} s) tried {shown}{more}: {record.get('why')}"
