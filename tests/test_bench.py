from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge.bench import BenchOptions, run_benchmark
from edge.bundle.bundle import Bundle
from edge.errors import EdgeError
from edge.pipeline import convert
from edge.stats import LatencyStats, budget_from


def test_stats_match_numpy() -> None:
    x = np.random.default_rng(0).gamma(2.0, 3.0, size=1001)
    s = LatencyStats.from_ms(x)
    assert s.count == 1001
    assert s.p50_ms == pytest.approx(np.median(x)) and s.p99_ms == pytest.approx(np.percentile(x, 99))
    assert s.max_ms == x.max() and s.std_ms == pytest.approx(x.std(ddof=1))
    with pytest.raises(ValueError):
        LatencyStats.from_ms([])


def test_budget_from() -> None:
    assert budget_from(60, None, 33.3) == (pytest.approx(16.6667, rel=1e-4), "60 fps")
    assert budget_from(None, 10, 33.3) == (10, "10 ms")
    assert budget_from(None, None, 33.3) == (33.3, "target profile")
    assert budget_from(None, None, None) == (None, "none")
    with pytest.raises(EdgeError, match="not both"):
        budget_from(60, 10, None)
    with pytest.raises(EdgeError, match="> 0"):
        budget_from(0, None, None)


@pytest.fixture(scope="module")
def tiny_bundle(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return convert(models["tiny"], "x86-cpu", tmp_path_factory.mktemp("bench") / "b")


def test_iterations_and_verdicts(tiny_bundle: Bundle) -> None:
    r = run_benchmark(
        tiny_bundle.open_runner, BenchOptions(iterations=30, warmup=2, budget_ms=1e6, budget_source="test")
    )
    assert r.latency.count == 30 and r.verdict == "pass" and r.load_ms > 0 and r.peak_rss_mb > 10
    assert r.runner["device_used"] == "CPUExecutionProvider"
    j = r.to_json()
    assert j["verdict"] == "pass" and j["latency"]["p99_ms"] >= j["latency"]["p50_ms"]
    r = run_benchmark(tiny_bundle.open_runner, BenchOptions(iterations=5, warmup=0, budget_ms=1e-6))
    assert r.verdict == "fail"
    r = run_benchmark(tiny_bundle.open_runner, BenchOptions(iterations=5, warmup=0))
    assert r.verdict == "no budget"


def test_duration(tiny_bundle: Bundle) -> None:
    r = run_benchmark(tiny_bundle.open_runner, BenchOptions(duration_s=0.2, warmup=0))
    assert r.duration_s >= 0.2 and r.latency.count > 1
    with pytest.raises(EdgeError, match="not both"):
        run_benchmark(tiny_bundle.open_runner, BenchOptions(duration_s=0.2, iterations=3))


def test_bench_feeds_the_reference_pair_else_the_bundle_shapes(tiny_bundle: Bundle) -> None:
    """`edgekit bench` feeds an input the bundle was checked on (its first reference pair); without usable
    pairs, generated values at the bundle's own (static) input shapes, and the report says which."""
    from types import SimpleNamespace

    from edge.bench import bundle_feeds
    from edge.verify.refpairs import load_reference_pairs

    feeds, why = bundle_feeds(tiny_bundle)
    pair = load_reference_pairs(tiny_bundle.path, tiny_bundle.info.reference_pairs, tiny_bundle.io).inputs[0]
    assert feeds is not None and why.startswith("reference pair 0 of reference.npz")
    assert all(np.array_equal(feeds[k], pair[k]) for k in pair)
    r = run_benchmark(tiny_bundle.open_runner, BenchOptions(iterations=3, warmup=0), feeds=feeds, feeds_from=why)
    assert r.to_json()["runner"]["details"]["bench_inputs"] == why

    # a bundle without pairs (built before they were written, or too large to carry them)
    bare = SimpleNamespace(info=SimpleNamespace(reference_pairs=None), io=tiny_bundle.io, path=tiny_bundle.path)
    feeds, why = bundle_feeds(bare)
    assert feeds is not None and "no reference pairs" in why and "at the bundle's input shapes" in why
    assert {k: v.shape for k, v in feeds.items()} == {t.name: tuple(t.shape) for t in tiny_bundle.io.inputs}
