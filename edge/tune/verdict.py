"""The budget verdict measured as the device runs: in steady state, with the load it ran under, a marginal miss
measured again before it refuses.

p99 stays the criterion. What changes is how it is measured (issue #30: 200 iterations on a shared 2-core host
gave p99 28-32 ms run to run):

* steady state: the runner is opened once (the load time is recorded), warmed for at least ``warmup_s`` of
  untimed inferences, then timed for at least ``measure_s`` and ``min_iterations``;
* a miss within ``marginal`` of the budget (p99 <= budget x 1.25 by default) is measured ``repeats`` more
  times on the same warm runner and the median of those runs decides: the report's latency is that run's, so the
  gate (``edge.verify.gates``), which recomputes the verdict from p99, reads the same figure. Every run's p99 is
  recorded; a miss past the margin, or a median that still misses, fails: a real miss is never hidden;
* the load average before and after, the CPUs and how steady the runs were go in the manifest's
  ``benchmark.steadiness``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from edge.backends.runner import Runner
from edge.bench import BenchOptions, BenchReport, random_feeds, run_benchmark


@dataclass(frozen=True)
class VerdictOptions:
    """``warmup_s``/``measure_s``: seconds of untimed and timed inferences per measurement (at least
    ``min_iterations`` timed); ``marginal``: a p99 over the budget by at most this fraction of it is measured
    ``repeats`` more times and their median decides."""

    warmup_s: float = 1.0
    measure_s: float = 2.0
    min_iterations: int = 50
    marginal: float = 0.25
    repeats: int = 3


class _Warm:
    """An open runner handed to ``run_benchmark`` again and again: its ``with`` does not close it (the verdict
    closes it once, after the last measurement)."""

    def __init__(self, runner: Runner) -> None:
        self._runner = runner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)

    def __enter__(self) -> _Warm:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not on every platform
        return None


def measure_verdict(
    open_runner: Callable[[], Runner],
    bench: BenchOptions,
    options: VerdictOptions | None = None,
    *,
    feeds: Mapping[str, np.ndarray] | None = None,
    feeds_from: str | None = None,
    say: Callable[[str], None] | None = None,
) -> tuple[BenchReport, dict[str, Any]]:
    """(the report whose p99 decides, its steadiness record); see the module docstring. ``bench``: the budget and
    labels (its iteration count is the minimum timed, with ``options.min_iterations``)."""
    from edge.backends.threads import usable_cpus

    o = options if options is not None else VerdictOptions()
    tell = say or (lambda _m: None)
    load_before = load_average()
    t0 = time.perf_counter()
    runner = open_runner()
    load_ms = (time.perf_counter() - t0) * 1e3
    try:
        x = dict(feeds) if feeds is not None else random_feeds(runner)
        t0 = time.perf_counter()
        runner.infer(x)
        first_ms = (time.perf_counter() - t0) * 1e3
        warmed, t_warm = 0, time.perf_counter()
        while time.perf_counter() - t_warm < o.warmup_s or warmed < 1:
            runner.infer(x)
            warmed += 1
        per_s = (time.perf_counter() - t_warm) / warmed
        # at least measure_s of timed inferences at the warm rate, and at least the iterations asked for
        timed = max(o.min_iterations, bench.iterations or 0, math.ceil(o.measure_s / max(per_s, 1e-9)))

        def once() -> BenchReport:
            return run_benchmark(
                lambda: _Warm(runner),  # type: ignore[arg-type, return-value]
                dataclasses.replace(bench, iterations=timed, duration_s=None, warmup=0),
                feeds=x,
                feeds_from=feeds_from,
            )

        runs = [once()]
        budget = bench.budget_ms
        first_p99 = runs[0].latency.p99_ms
        decided = "one steady-state measurement"
        chosen = runs[0]
        if budget is not None and budget < first_p99 <= budget * (1 + o.marginal):
            tell(
                f"p99 {first_p99:.2f} ms is within {o.marginal:.0%} over the {budget:.2f} ms budget: "
                f"measuring {o.repeats} more times, the median decides"
            )
            again = [once() for _ in range(o.repeats)]
            runs += again
            chosen = sorted(again, key=lambda r: r.latency.p99_ms)[len(again) // 2]
            decided = (
                f"a marginal miss (p99 {first_p99:.2f} ms, within {o.marginal:.0%} of the budget) measured "
                f"{o.repeats} more times: the median run decides"
            )
    finally:
        runner.close()
    p99s = [round(r.latency.p99_ms, 3) for r in runs]
    med = statistics.median(p99s)
    report = dataclasses.replace(chosen, load_ms=load_ms, first_inference_ms=first_ms, warmup=warmed)
    steadiness = {
        "warmup_s": round(o.warmup_s, 3),
        "measure_s": round(o.measure_s, 3),
        "runs_p99_ms": p99s,
        "spread": round((max(p99s) - min(p99s)) / med, 4) if med > 0 else 0.0,
        "decided_by": decided,
        "load_before": load_before,
        "load_after": load_average(),
        "cpus": usable_cpus(),
    }
    return report, steadiness
