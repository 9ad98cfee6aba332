"""Benchmark a bundle: load time, first inference, warm-up, then N iterations or T seconds.

Only ``runner.infer`` is inside the timed region. p99 decides the budget verdict.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from edge.backends.runner import Runner
from edge.bundle.schema import device_class_of  # noqa: F401 - re-exported: where callers look for it
from edge.errors import BundleError, EdgeError, TargetError
from edge.stats import LatencyStats, peak_rss_mb


@dataclass
class BenchReport:
    bundle: str | None
    target: str | None
    load_ms: float
    first_inference_ms: float
    warmup: int
    latency: LatencyStats
    duration_s: float
    throughput_fps: float
    peak_rss_mb: float
    runner: dict[str, Any]
    budget_ms: float | None
    budget_source: str
    on_target_device: bool  # False when the host ran it on a fallback device or another machine class
    #: {"same": bool, "reason": str} once :func:`judge_device_class` judged it (the manifest's typed field)
    device_class: dict[str, Any] | None = None

    @property
    def verdict(self) -> str:
        if self.budget_ms is None:
            return "no budget"
        return "pass" if self.latency.p99_ms <= self.budget_ms else "fail"

    def to_json(self) -> dict[str, Any]:
        return {
            "bundle": self.bundle,
            "target": self.target,
            "load_ms": round(self.load_ms, 3),
            "first_inference_ms": round(self.first_inference_ms, 3),
            "warmup": self.warmup,
            "latency": self.latency.to_json(),
            "duration_s": round(self.duration_s, 3),
            "throughput_fps": round(self.throughput_fps, 2),
            "peak_rss_mb": round(self.peak_rss_mb, 1),
            "runner": self.runner,
            "budget_ms": self.budget_ms,
            "budget_source": self.budget_source,
            "verdict": self.verdict,
            "on_target_device": self.on_target_device,
            **({"device_class": dict(self.device_class)} if self.device_class is not None else {}),
        }


_RANDOM = "standard-normal floats, zeros for other types"


def bundle_feeds(bundle: Any) -> tuple[dict[str, np.ndarray] | None, str]:
    """What a benchmark of ``bundle`` feeds: its first reference pair's inputs (``edge.verify.refpairs``), i.e. an
    input the model was built and checked on, with its real shapes and values (a scalar like Silero VAD's
    sample rate gets its real value, where a zero would run another branch or be refused), and where they
    came from in words. Without usable pairs: generated at the shapes of the bundle's I/O spec (static once
    built, even where the model file keeps a dim dynamic, as Silero's does inside its If branches), or
    ``(None, why)`` where the spec is not static either: the caller generates feeds from the runner
    (:func:`random_feeds`)."""
    from edge.verify.refpairs import load_reference_pairs

    entry = getattr(getattr(bundle, "info", None), "reference_pairs", None)
    why = "the bundle carries no reference pairs"
    if entry is not None and getattr(entry, "file", None) and getattr(entry, "samples", 0):
        try:
            pairs = load_reference_pairs(bundle.path, entry, bundle.io)
        except BundleError as e:
            why = f"reference pairs unusable: {e.message}"
        else:
            return dict(pairs.inputs[0]), f"reference pair 0 of {entry.file} (an input the bundle was checked on)"
    specs = list(getattr(getattr(bundle, "io", None), "inputs", ()) or ())
    if specs and all(t.is_static for t in specs):
        return _random(specs), f"{_RANDOM} at the bundle's input shapes ({why})"
    return None, f"{_RANDOM} ({why})"


def _random(specs: Any, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for t in specs:
        if not t.is_static:
            raise EdgeError(
                f"input {t.name!r} has dynamic shape {list(t.shape)}; benchmark needs static shapes",
                hint="rebuild the bundle with --input-shape NAME=DIMS",
            )
        dt = np.dtype(t.dtype)
        feeds[t.name] = (
            rng.standard_normal(t.shape).astype(dt) if np.issubdtype(dt, np.floating) else np.zeros(t.shape, dtype=dt)
        )
    return feeds


def random_feeds(runner: Runner, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal floats (zeros for other types) at the runner's input shapes."""
    return _random(runner.inputs, seed)


@dataclass(frozen=True)
class BenchOptions:
    """How a benchmark runs and what it is labelled: ``iterations`` (default 200) or ``duration_s``, after
    ``warmup`` untimed ones; the budget the verdict is against and where it came from; the bundle and target
    it measured, and whether this is the target's device (``judge_device_class`` decides that later)."""

    iterations: int | None = None
    duration_s: float | None = None
    warmup: int = 10
    budget_ms: float | None = None
    budget_source: str = "none"
    bundle: str | None = None
    target: str | None = None
    on_target_device: bool = True


def run_benchmark(
    open_runner: Callable[[], Runner],
    options: BenchOptions | None = None,
    *,
    feeds: Mapping[str, np.ndarray] | None = None,
    feeds_from: str | None = None,
    progress: Callable[[int, int | None], None] | None = None,
) -> BenchReport:
    """Open a runner (timed as load), then measure as ``options`` say. ``feeds``: the input (default
    :func:`random_feeds`); ``feeds_from``: where it came from, recorded in the runner's details."""
    o = options if options is not None else BenchOptions()
    iterations, duration_s, warmup = o.iterations, o.duration_s, o.warmup
    if iterations is not None and duration_s is not None:
        raise EdgeError("give either --iterations or --duration, not both")
    if iterations is None and duration_s is None:
        iterations = 200
    if (iterations is not None and iterations < 1) or (duration_s is not None and duration_s <= 0) or warmup < 0:
        raise EdgeError("--iterations and --duration must be positive, --warmup >= 0")
    t0 = time.perf_counter()
    runner = open_runner()
    load_ms = (time.perf_counter() - t0) * 1e3
    with runner:
        x = dict(feeds) if feeds is not None else random_feeds(runner)
        infer = runner.infer
        t0 = time.perf_counter()
        infer(x)
        first_ms = (time.perf_counter() - t0) * 1e3
        for _ in range(warmup):
            infer(x)
        clock = time.perf_counter_ns
        samples: list[int] = []
        start = clock()
        deadline = start + int(duration_s * 1e9) if duration_s is not None else None
        n = 0
        while True:
            t = clock()
            infer(x)
            samples.append(clock() - t)
            n += 1
            if progress is not None and n % 10 == 0:
                progress(n, iterations)
            if iterations is not None and n >= iterations:
                break
            if deadline is not None and clock() >= deadline:
                break
        wall = (clock() - start) / 1e9
        info = runner.info.to_json()
        details = info.get("details")
        info["details"] = {
            **(details if isinstance(details, Mapping) else {}),
            "bench_inputs": feeds_from or ("the caller's feeds" if feeds is not None else _RANDOM),
        }
    lat = LatencyStats.from_ms(np.asarray(samples, dtype=np.float64) / 1e6)
    return BenchReport(
        bundle=o.bundle,
        target=o.target,
        load_ms=load_ms,
        first_inference_ms=first_ms,
        warmup=warmup,
        latency=lat,
        duration_s=wall,
        throughput_fps=n / wall if wall > 0 else float("nan"),
        peak_rss_mb=peak_rss_mb(),
        runner=info,
        budget_ms=o.budget_ms,
        # a budget given with no source is the caller's own: labelled as --budget-ms labels it (the gates hold a
        # budget to the source it names: edge.verify.corroborate.budget_problem)
        budget_source=f"{o.budget_ms:g} ms"
        if o.budget_ms is not None and o.budget_source == "none"
        else o.budget_source,
        on_target_device=o.on_target_device,
    )


def judge_device_class(report: BenchReport, target: Any, targets_dir: Any = ()) -> tuple[bool, str]:
    """Set ``report.on_target_device``: whether this host and the runner's device are ``target``'s device
    class (``edge.targets.same_device_class``; ``target``: a profile or its name). Only then does the
    budget verdict gate a deploy; otherwise it is indicative. The judgement and its reason are recorded in
    ``report.device_class`` (the manifest's ``benchmark.device_class``; manifests before it carried them in
    ``runner.details.device_class``, which :func:`device_class_of` still reads)."""
    from edge.capabilities import current_host
    from edge.targets import get_target, same_device_class

    try:
        profile = get_target(target, targets_dir) if isinstance(target, str) else target
    except TargetError:
        same, why = False, f"device class unknown: target profile {target!r} is not on this host's search path"
    else:
        same, why = same_device_class(profile, current_host(), report.runner)
    report.on_target_device = same
    report.device_class = {"same": same, "reason": why}
    return same, why
