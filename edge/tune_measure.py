"""Measuring ``edgekit tune``'s trials: open (and parity-check) a trial's runner, time interleaved repetitions
as ``bench`` times (only ``infer``), or run the video pipeline for ``e2e``; runners kept open between rungs.

The search itself (space, conversions, study, successive halving, the winner) is ``edge.tune``.
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from edge.errors import EdgeError
from edge.tune_space import Config

#: runners open at once while interleaving (memory: each holds a compiled model)
MAX_OPEN = 16
#: repetitions of a short (not the last) rung of successive halving
SHORT_REPS = 6
#: untimed inferences before each trial's timed block of a repetition: after the other trials' turns the
#: runtime's worker threads may sleep and its weights left the cache (seen in benchmarks/tune.py without it: the
#: PP-OCR classifier on OpenVINO, 0.48 ms median in 40-call blocks, measured 6 ms in 2-call blocks), which would
#: rank trials by wake-up time, not by latency
SETTLE = 1
#: runners kept open between rungs while the memory they added stays under this (MB)
KEEP_OPEN_MB = 1024.0


def _rss_mb() -> float:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    except (OSError, ValueError, IndexError):
        from edge.bench import peak_rss_mb

        return peak_rss_mb()


def _score(objective: str, rep_scores: Sequence[float]) -> float:
    """Lower is better: latency in ms; throughput and e2e as negative frames per second."""
    return float(np.median(rep_scores))


def _open(rec: dict[str, Any], bundle: Any, cfg: Config) -> tuple[Any, dict[str, np.ndarray]]:
    from edge.refpairs import check_reference_pairs, load_reference_pairs
    from edge.bench import random_feeds

    before = _rss_mb()
    t0 = time.perf_counter()
    runner = bundle.open_runner(dict(cfg.options))
    rec["load_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
    try:
        entry = bundle.info.reference_pairs
        feeds = None
        if entry is not None and entry.file is not None:
            feeds = load_reference_pairs(bundle.path, entry, bundle.io).inputs[0]
        feeds = dict(feeds) if feeds is not None else random_feeds(runner)
        runner.infer(feeds)
        rec["memory_mb"] = round(max(0.0, _rss_mb() - before), 1)
        info = runner.info.to_json()
        rec["runtime"] = {k: info.get(k) for k in ("runtime", "device_used", "precision_used", "threads", "fallback")}
        if rec.get("parity") is None or rec["parity"].get("trial") is None:
            check = check_reference_pairs(bundle, runner)
            _merge_parity(rec, check)
    except BaseException:
        runner.close()
        raise
    return runner, feeds


def _merge_parity(rec: dict[str, Any], check: Mapping[str, Any]) -> None:
    """Record the trial's own reference check (its runner options on the bundle's reference pairs)."""
    par = rec.setdefault("parity", {})
    cos = [o.get("cosine") for o in check.get("outputs", []) if isinstance(o.get("cosine"), (int, float))]
    par["trial"] = {"passed": check.get("passed"), "samples": check.get("samples"),
                    "failures": list(check.get("failures") or [])[:4]}
    par["error"] = round(max(1.0 - c for c in cos), 8) if cos else None
    _combine_parity(par)


def _combine_parity(par: dict[str, Any]) -> None:
    """A trial passes parity when the conversion's gate and its own reference check both passed (one that
    could not run does not count either way; neither ran: not verified)."""
    trial = (par.get("trial") or {}).get("passed")
    ran = [p for p in (par.get("conversion"), trial) if p is not None]
    par["passed"] = None if not ran else all(ran)
    par["failures"] = list(par.get("conversion_failures") or []) + list((par.get("trial") or {}).get("failures") or [])


def _measure_infer(opened: Mapping[str, tuple[Any, dict[str, np.ndarray]]], objective: str, reps: int, iters: int,
                   warmup: int) -> dict[str, dict[str, Any]]:
    """Interleaved repetitions: in repetition r every runner runs ``iters`` timed inferences (after ``SETTLE``
    untimed ones), the order rotated by r, so drift and background load hit every trial alike. Only ``infer``
    is timed (as ``bench``)."""
    names = list(opened)
    for n in names:
        runner, feeds = opened[n]
        for _ in range(warmup):
            runner.infer(feeds)
    samples: dict[str, list[float]] = {n: [] for n in names}
    reps_out: dict[str, list[float]] = {n: [] for n in names}
    clock = time.perf_counter_ns
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        for r in range(reps):
            rot = r % len(names)
            for n in names[rot:] + names[:rot]:
                runner, feeds = opened[n]
                infer = runner.infer
                for _ in range(SETTLE):  # untimed: the runtime's threads wake from the other trials' turns
                    infer(feeds)
                got = []
                start = clock()
                for _ in range(iters):
                    t = clock()
                    infer(feeds)
                    got.append(clock() - t)
                wall = (clock() - start) / 1e9
                ms = np.asarray(got, dtype=np.float64) / 1e6
                samples[n] += ms.tolist()
                reps_out[n].append(float(np.median(ms)) if objective == "latency" else -iters / wall)
    finally:
        if was:
            gc.enable()
    out = {}
    for n in names:
        a = np.asarray(samples[n])
        out[n] = {"reps": reps, "iters": iters, "rep_scores": [round(x, 5) for x in reps_out[n]],
                  "p50_ms": round(float(np.percentile(a, 50)), 4), "p99_ms": round(float(np.percentile(a, 99)), 4),
                  "fps": round(1000.0 / float(a.mean()), 2)}
    return out


def _measure_video(items: Sequence[tuple[str, Any, Config]], video: Path, reps: int, frames: int,
                   budget_ms: float | None) -> dict[str, dict[str, Any]]:
    """``e2e``: the video pipeline (decode, pre-processing, inference, post-processing) over the first ``frames``
    frames of ``video``, as fast as it goes; each repetition runs every trial once, in rotated order."""
    from edge.video import PipelineOptions, open_source, run_pipeline

    runs: dict[str, list[Any]] = {n: [] for n, _, _ in items}
    for r in range(reps):
        rot = r % len(items)
        for n, bundle, cfg in list(items[rot:]) + list(items[:rot]):
            with open_source(video=str(video)) as source:
                rep = run_pipeline(bundle, source, PipelineOptions(
                    max_frames=frames, runner_options=dict(cfg.options), infer_workers=cfg.workers, warmup=2,
                    budget_ms=budget_ms))
            rep.raise_for_failure()
            runs[n].append(rep)
    out = {}
    for n, reports in runs.items():
        e2e = [x.e2e for x in reports if x.e2e is not None]
        out[n] = {"reps": reps, "iters": frames, "rep_scores": [round(-x.effective_fps, 3) for x in reports],
                  "p50_ms": round(float(np.median([s.p50_ms for s in e2e])), 4) if e2e else None,
                  "p99_ms": round(float(np.median([s.p99_ms for s in e2e])), 4) if e2e else None,
                  "fps": round(float(np.median([x.effective_fps for x in reports])), 2)}
    return out


class _Pool:
    """Runners kept open between rungs, so a survivor is not loaded (and warmed) again for each rung: on small
    models loading costs more than a short measurement. Bounded by the memory the open runners added."""

    def __init__(self, cap_mb: float = KEEP_OPEN_MB) -> None:
        self.open: dict[str, tuple[Any, dict[str, np.ndarray], float]] = {}
        self.cap_mb = cap_mb

    def get(self, rec: dict[str, Any], bundle: Any, cfg: Config) -> tuple[Any, dict[str, np.ndarray]]:
        if cfg.id not in self.open:
            runner, feeds = _open(rec, bundle, cfg)
            self.open[cfg.id] = (runner, feeds, float(rec.get("memory_mb") or 0.0))
        runner, feeds, _ = self.open[cfg.id]
        return runner, feeds

    def close(self, ids: Iterable[str]) -> None:
        for i in list(ids):
            entry = self.open.pop(i, None)
            if entry is not None:
                entry[0].close()

    def keep_within(self, worst_first: Sequence[str]) -> None:
        """Close runners, worst first, until the open ones hold at most ``cap_mb``."""
        for i in worst_first:
            if sum(m for _, _, m in self.open.values()) <= self.cap_mb:
                return
            self.close([i])

    def close_all(self) -> None:
        self.close(list(self.open))


def _measure_chunk(chunk: Sequence[Config], recs: dict[str, dict[str, Any]], bundles: Mapping[str, Any],
                   keys: Mapping[str, str], name: str, objective: str, reps: int, iters: int, warmup: int,
                   video: Path | None, budget_ms: float | None, pool: _Pool) -> int:
    """Open (or take from ``pool``), check and measure one chunk of trials interleaved; how many were measured."""
    opened: dict[str, tuple[Any, dict[str, np.ndarray]]] = {}
    for c in chunk:
        rec = recs[c.id]
        try:
            opened[c.id] = pool.get(rec, bundles[keys[c.id]], c)
        except EdgeError as e:
            rec["status"] = f"failed to load: {str(e).splitlines()[0][:300]}"
            rec.setdefault("parity", {})["passed"] = None
    if not opened:
        return 0
    if video is None:
        got = _measure_infer(opened, objective, reps, iters, warmup)
    else:
        pool.close(opened)  # the pipeline opens its own runners
        items = [(cid, bundles[keys[cid]], next(c for c in chunk if c.id == cid)) for cid in opened]
        got = _measure_video(items, video, reps, iters, budget_ms)
    for cid, m in got.items():
        recs[cid]["rungs"][name] = m
    # over the memory bound: the chunk's worst close first (the best are the likely survivors)
    pool.keep_within(sorted(got, key=lambda cid: -_score(objective, got[cid]["rep_scores"])))
    return len(got)
