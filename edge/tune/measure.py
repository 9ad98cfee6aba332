"""Measuring ``edgekit tune``'s trials: open (and parity-check) a trial's runner, time interleaved repetitions
as ``bench`` times (only ``infer``), or run the video pipeline for ``e2e``; runners kept open between rungs.

A batched trial (``Config.batch`` N > 1, objective throughput) runs a bundle converted at batch N on its own
reference pairs (N distinct samples stacked), counts N items per inference (``fps`` is items per second), and
passes parity only when, besides its own check at batch N, each item of a batch matches the batch-1 reference
(:class:`_PerItem`: the batch-1 bundle's reference pairs, each sample placed at every position of a batch in turn).

The search itself (space, conversions, study, successive halving, the winner) is ``edge.tune.search``.
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from edge.errors import EdgeError
from edge.tune.config import OBJECTIVES, Config

#: runners open at once while interleaving (memory: each holds a compiled model)
MAX_OPEN = 16
#: repetitions of a short (not the last) rung of successive halving: few, with blocks of at least
#: SHORT_BLOCK inferences. Measured on the PP-OCR classifier's trials, 16 interleaved on a loaded 2-core host:
#: 6 repetitions of 2 calls (1 untimed first) ranked them against 5x40 with Spearman 0.60-0.70 and medians 1.8-4.7x
#: the warm ones; 2 repetitions of 6 calls (3 untimed first) with 0.91 and 0.99-1.5x, in less wall time
SHORT_REPS = 2
SHORT_BLOCK = 6
#: untimed inferences before each trial's timed block of a repetition: after the other trials' turns the
#: runtime's worker threads may sleep and its weights left the cache (seen in benchmarks/tune.py without it: the
#: PP-OCR classifier on OpenVINO, 0.48 ms median in 40-call blocks, measured 6 ms in 2-call blocks), which would
#: rank trials by wake-up time, not by latency
SETTLE = 3
#: runners kept open between rungs while the memory they added stays under this (MB)
KEEP_OPEN_MB = 1024.0


def _rss_mb() -> float:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    except (OSError, ValueError, IndexError):
        from edge.stats import peak_rss_mb

        return peak_rss_mb()


#: video frames per repetition of an ``e2e`` measurement, at least: dropping is a queue's behaviour, which a
#: handful of frames at the target rate does not show (the first frames find every queue empty)
MIN_E2E_FRAMES = 30
#: repetitions of a short ``e2e`` rung: each is ``frames / fps`` seconds of wall time whatever the configuration
E2E_SHORT_REPS = 2


def trial_score(objective: str, rep_scores: Sequence[float]) -> float:
    """Lower is better: the median of the repetitions' scores, whose unit the objective sets (``latency``: the
    repetition's median inference in ms; ``throughput``: minus its inferences per second; ``e2e``: its median
    frame time in ms, decode to post-processing, at the target rate in realtime pacing). For ``e2e`` the frames
    missed come first: :func:`rank_key`."""
    if objective not in OBJECTIVES:
        raise EdgeError(f"unknown objective {objective!r}", hint=f"choose one of {', '.join(OBJECTIVES)}")
    if objective == "e2e" and any(x < 0 for x in rep_scores):
        # a study written before e2e ran at the target rate stored minus the frame rate: not comparable
        raise EdgeError(
            "e2e repetition scores are frame times in ms (>= 0); got a negative one",
            hint="remove the study file written by an older edgekit to measure again",
        )
    return float(np.median(rep_scores))


def missed_share(rung: Mapping[str, Any]) -> float:
    """``e2e``: the median over repetitions of the share of frames missed at the target rate (dropped, or
    processed past their deadline); 0 for a rung without that record."""
    missed, frames = rung.get("rep_missed"), rung.get("rep_frames")
    if not isinstance(missed, list) or not isinstance(frames, list) or not missed or len(missed) != len(frames):
        return 0.0
    return float(np.median([m / max(1, f) for m, f in zip(missed, frames)]))


#: how the throughput objective is measured (in a study's header: a study measured otherwise does not compare)
THROUGHPUT_REQUESTS = "openvino: its optimal number in flight; the others: one"


def rank_key(objective: str, rung: Mapping[str, Any]) -> tuple[float, float]:
    """How a measured rung ranks, lower first: ``e2e`` by the share of frames missed at the target rate
    (a configuration that misses frames loses to one that does not), then by :func:`trial_score`; the other
    objectives by :func:`trial_score` alone."""
    score = trial_score(objective, rung["rep_scores"])
    return (missed_share(rung) if objective == "e2e" else 0.0, score)


def vs_anchor(objective: str, rep_scores: Sequence[float], anchor_scores: Sequence[float]) -> float:
    """A trial's figure relative to the anchor trial measured in the same chunk, lower is better and 1.0 for the
    anchor: the median over repetitions of its ratio to the anchor's in the same repetition (``latency``: median
    ms over the anchor's; ``throughput``: the anchor's items per second over its own). Trials measured in
    different chunks (under different background load) compare by this figure, not by their raw medians."""
    if objective not in ("latency", "throughput"):
        raise EdgeError(f"an anchor-relative figure is for latency or throughput, not {objective!r}")
    pairs = list(zip(rep_scores, anchor_scores))
    if not pairs or len(rep_scores) != len(anchor_scores) or any(a == 0 or t == 0 for t, a in pairs):
        raise EdgeError("an anchor-relative figure needs one nonzero score per repetition from both trials")
    # latency: t/a (ms over ms); throughput scores are minus items per second: a/t is the anchor's over the trial's
    return float(np.median([t / a if objective == "latency" else a / t for t, a in pairs]))


def _first_inputs(bundle: Any) -> dict[str, np.ndarray] | None:
    """The first reference sample's inputs of ``bundle`` (None: it has no reference pairs)."""
    from edge.verify.refpairs import load_reference_pairs

    entry = bundle.info.reference_pairs
    if entry is None or entry.file is None:
        return None
    return dict(load_reference_pairs(bundle.path, entry, bundle.io).inputs[0])


def open_trial_runner(
    rec: dict[str, Any],
    bundle: Any,
    cfg: Config,
    check: bool = True,
    single: Any = None,
    inputs: Mapping[str, np.ndarray] | None = None,
) -> tuple[Any, dict[str, np.ndarray]]:
    """Open ``cfg``'s runner on ``bundle``, warm it once, record its load time, memory and runtime; with ``check``
    the trial's own reference check too (:func:`_check`; ``single``: a batched trial's batch-1 bundle).
    ``inputs``: the bundle's first reference inputs when the caller has them (:func:`_first_inputs`; the trials
    of one bundle share them, read-only), else read here."""
    from edge.bench import random_feeds

    before = _rss_mb()
    t0 = time.perf_counter()
    runner = bundle.open_runner(dict(cfg.options))
    rec["load_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
    try:
        feeds = inputs if inputs is not None else _first_inputs(bundle)
        feeds = dict(feeds) if feeds is not None else random_feeds(runner)
        runner.infer(feeds)
        rec["memory_mb"] = round(max(0.0, _rss_mb() - before), 1)
        info = runner.info.to_json()
        rec["runtime"] = {k: info.get(k) for k in ("runtime", "device_used", "precision_used", "threads", "fallback")}
        if cfg.batch != 1:
            lead = {int(np.shape(v)[0]) if np.ndim(v) else 0 for v in feeds.values()}
            if lead != {cfg.batch}:
                raise EdgeError(
                    f"trial {cfg.id}: its bundle's inputs have first dimension {sorted(lead)}, not the "
                    f"batch {cfg.batch} it was converted for"
                )
        rec["batch"] = cfg.batch
        if check:
            _check(rec, bundle, runner, cfg, single)
    except BaseException:
        runner.close()
        raise
    return runner, feeds


def _check(rec: dict[str, Any], bundle: Any, runner: Any, cfg: Config | None = None, single: Any = None) -> None:
    """The trial's own reference check (its runner options on the bundle's reference pairs), unless done (in this
    run or the study); for a batched trial also the per-item check against ``single``, the batch-1 bundle."""
    from edge.verify.refpairs import check_reference_pairs, load_reference_pairs

    if rec.get("parity") is None or rec["parity"].get("trial") is None:
        _merge_parity(rec, check_reference_pairs(bundle, runner))
    n = cfg.batch if cfg is not None else 1
    if n != 1 and (rec["parity"].get("per_item") or {}).get("passed") is None:
        par = rec["parity"]
        entry = getattr(getattr(single, "info", None), "reference_pairs", None)
        if single is None or entry is None or entry.file is None:
            par["per_item"] = {
                "passed": None,
                "batch": n,
                "failures": [
                    "per-item check not run: no batch-1 bundle with reference pairs for this runner, precision and recipe"
                ],
            }
        else:
            inputs = list(load_reference_pairs(single.path, entry, single.io).inputs)
            got = check_reference_pairs(single, _PerItem(runner, n, inputs))
            par["per_item"] = {
                "passed": got.get("passed"),
                "batch": n,
                "samples": got.get("samples"),
                "failures": [f"per item at batch {n}: {f}" for f in (got.get("failures") or [])][:4],
            }
        combine_parity(par)


class _PerItem:
    """A batched runner seen as a batch-1 one, for the batch-1 bundle's reference check: each sample asked for is
    run inside a batch of ``n`` (the others: other reference samples), at position ``k % n`` for the k-th call, and
    its own item of the outputs returned."""

    def __init__(self, runner: Any, n: int, inputs: Sequence[Mapping[str, np.ndarray]]) -> None:
        self._runner, self._n, self._inputs, self._k = runner, n, list(inputs), 0
        self.info = runner.info

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        n, k, pool = self._n, self._k, self._inputs
        self._k += 1
        pos = k % n
        items = [pool[(k - pos + j) % len(pool)] if pool else feeds for j in range(n)]
        items[pos] = feeds
        batch = {name: np.concatenate([np.asarray(it[name]) for it in items], axis=0) for name in feeds}
        out = self._runner.infer(batch)
        return {name: v[pos : pos + 1] for name, v in out.items()}


def _merge_parity(rec: dict[str, Any], check: Mapping[str, Any]) -> None:
    """Record the trial's own reference check (its runner options on the bundle's reference pairs)."""
    par = rec.setdefault("parity", {})
    cos = [o.get("cosine") for o in check.get("outputs", []) if isinstance(o.get("cosine"), (int, float))]
    par["trial"] = {
        "passed": check.get("passed"),
        "samples": check.get("samples"),
        "failures": list(check.get("failures") or [])[:4],
    }
    par["error"] = round(max(1.0 - c for c in cos), 8) if cos else None
    combine_parity(par)


def combine_parity(par: dict[str, Any]) -> None:
    """A trial passes parity when the conversion's gate and its own reference check both passed (one that
    could not run does not count either way; neither ran: not verified)."""
    trial = (par.get("trial") or {}).get("passed")
    ran = [p for p in (par.get("conversion"), trial) if p is not None]
    par["passed"] = None if not ran else all(ran)
    per = par.get("per_item")
    if per is not None and per.get("passed") is not True and par["passed"] is not False:
        par["passed"] = per.get("passed")  # a batched trial whose items were not checked is not verified
    par["failures"] = (
        list(par.get("conversion_failures") or [])
        + list((par.get("trial") or {}).get("failures") or [])
        + list((per or {}).get("failures") or [] if (per or {}).get("passed") is not True else [])
    )


@dataclass(frozen=True)
class _SyncTiming:
    """One runner's timed block, one request at a time: each inference's milliseconds and the block's seconds."""

    ms: np.ndarray
    wall: float


def _time_one_at_a_time(runner: Any, feeds: dict[str, np.ndarray], iters: int) -> _SyncTiming:
    """``SETTLE`` untimed inferences (the runtime's threads wake from the other trials' turns), then ``iters``
    timed ones, one at a time."""
    clock = time.perf_counter_ns
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
    return _SyncTiming(ms=np.asarray(got, dtype=np.float64) / 1e6, wall=wall)


def _infer_result(
    objective: str, reps: int, iters: int, samples: list[float], rep_scores: list[float], *, batch: int, requests: int
) -> dict[str, Any]:
    """One runner's figures from its samples (milliseconds per inference) and its repetitions' scores."""
    a = np.asarray(samples)
    return {
        "reps": reps,
        "iters": iters,
        "rep_scores": [round(x, 5) for x in rep_scores],
        "p50_ms": round(float(np.percentile(a, 50)), 4),
        "p99_ms": round(float(np.percentile(a, 99)), 4),
        # throughput: the figure trials rank on (the median of the repetitions' items per second), so the
        # table's items/s and the choice agree; else inferences per second over every sample
        "fps": round(-float(np.median(rep_scores)), 2)
        if objective == "throughput"
        else round(1000.0 * batch / float(a.mean()), 2),
        "batch": batch,
        "requests": requests,
    }


def measure_infer(
    opened: Mapping[str, tuple[Any, dict[str, np.ndarray]]],
    objective: str,
    reps: int,
    iters: int,
    warmup: int,
    batches: Mapping[str, int] | None = None,
) -> dict[str, dict[str, Any]]:
    """Interleaved repetitions: in repetition r every runner runs ``iters`` timed inferences (after ``SETTLE``
    untimed ones), the order rotated by r, so drift and background load hit every trial alike. Only ``infer``
    is timed (as ``bench``). ``batches``: items per inference per trial (default 1): throughput and ``fps`` count
    items (objective throughput: ``fps`` is the median of the repetitions' items per second, what the trials rank
    on); ``p50_ms``/``p99_ms`` are per inference (of the whole batch).

    Objective throughput, a runner with ``run_concurrent`` (OpenVINO): its ``requests`` (the compiled model's
    optimal number of infer requests: one per stream) are kept in flight, as benchmark_app and a server run it, so
    the THROUGHPUT hint's streams show what they serve; its items per second are completed inferences x batch over
    the block's wall time, and its p50/p99 each request's latency (start to completion) with the others in flight.
    The other runners run one request at a time (onnxruntime's intra-op threads already take the cores for one
    request; LiteRT's interpreter serves one). ``requests`` in the result says which: 1, or how many were in flight.
    The latency objective is always one synchronous request at a time: a stream of frames."""
    names = list(opened)
    per = {n: int((batches or {}).get(n, 1)) for n in names}
    concurrent = {
        n: getattr(opened[n][0], "run_concurrent", None) if objective == "throughput" else None for n in names
    }
    in_flight = {n: int(getattr(opened[n][0], "requests", 1)) if concurrent[n] else 1 for n in names}
    for n in names:
        runner, feeds = opened[n]
        for _ in range(warmup):
            runner.infer(feeds)
    samples: dict[str, list[float]] = {n: [] for n in names}
    reps_out: dict[str, list[float]] = {n: [] for n in names}
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        for r in range(reps):
            rot = r % len(names)
            for n in names[rot:] + names[:rot]:
                runner, feeds = opened[n]
                run_in_flight = concurrent[n]
                if run_in_flight is not None:  # N requests in flight (untimed first: its queue, woken threads)
                    run_in_flight(feeds, max(SETTLE, 2 * in_flight[n]))
                    wall, lat = run_in_flight(feeds, iters)
                    samples[n] += (np.asarray(lat, dtype=np.float64) / 1e6).tolist()
                    reps_out[n].append(-iters * per[n] / wall)
                    continue
                timing = _time_one_at_a_time(runner, feeds, iters)
                ms, wall = timing.ms, timing.wall
                samples[n] += ms.tolist()
                reps_out[n].append(float(np.median(ms)) if objective == "latency" else -iters * per[n] / wall)
    finally:
        if was:
            gc.enable()
    return {
        n: _infer_result(objective, reps, iters, samples[n], reps_out[n], batch=per[n], requests=in_flight[n])
        for n in names
    }


def _measure_video(
    items: Sequence[tuple[str, Any, Config]],
    video: Path,
    reps: int,
    frames: int,
    budget_ms: float | None,
    pace_fps: float | None = None,
) -> dict[str, dict[str, Any]]:
    """``e2e``: the video pipeline (decode, pre-processing, inference, post-processing) over the first ``frames``
    frames of ``video`` as ``edgekit run --realtime`` runs it: frames fed at ``pace_fps`` (default: the video's
    own rate, else the budget's), a frame that would be late dropped. Each repetition runs every trial once, in
    rotated order. Per repetition: the median frame time (the score), and the frames missed at that rate
    (dropped for time, or processed late)."""
    from edge.video import PipelineOptions, open_source, run_pipeline

    runs: dict[str, list[Any]] = {n: [] for n, _, _ in items}
    for r in range(reps):
        rot = r % len(items)
        for n, bundle, cfg in list(items[rot:]) + list(items[:rot]):
            with open_source(video=str(video)) as source:
                rep = run_pipeline(
                    bundle,
                    source,
                    PipelineOptions(
                        realtime=True,
                        source_fps=pace_fps,
                        max_frames=frames,
                        runner_options=dict(cfg.options),
                        infer_workers=cfg.workers,
                        warmup=2,
                        budget_ms=budget_ms,
                        budget_source="tune" if budget_ms else "none",
                    ),
                )
            rep.raise_for_failure()
            runs[n].append(rep)
    out = {}
    for n, reports in runs.items():
        e2e = [x.e2e for x in reports if x.e2e is not None]
        # a repetition that processed nothing scores its whole length: it lost every frame
        scores = [
            round(x.e2e.p50_ms, 4) if x.e2e is not None else round(1000.0 * frames / (x.pace_fps or 1.0), 4)
            for x in reports
        ]
        missed = [int(x.deadline_misses) for x in reports]
        out[n] = {
            "reps": reps,
            "iters": frames,
            "rep_scores": scores,
            "rep_missed": missed,
            "rep_frames": [int(x.frames_in) for x in reports],
            "dropped": int(np.median([x.dropped_total for x in reports])),
            "late": int(np.median([x.late for x in reports])),
            "missed": int(np.median(missed)),
            "frames": int(np.median([x.frames_in for x in reports])),
            "pace_fps": round(reports[0].pace_fps, 3) if reports[0].pace_fps else None,
            "p50_ms": round(float(np.median([s.p50_ms for s in e2e])), 4) if e2e else None,
            "p99_ms": round(float(np.median([s.p99_ms for s in e2e])), 4) if e2e else None,
            "fps": round(float(np.median([x.effective_fps for x in reports])), 2),
        }
    return out


class Pool:
    """Runners kept open between rungs, so a survivor is not loaded (and warmed) again for each rung: on small
    models loading costs more than a short measurement. Bounded by the memory the open runners added."""

    def __init__(self, cap_mb: float = KEEP_OPEN_MB) -> None:
        self.open: dict[str, tuple[Any, dict[str, np.ndarray], float]] = {}
        self.cap_mb = cap_mb
        # per bundle: its first reference inputs, read once for all the trials (runner options) that share it
        self.inputs: dict[str, dict[str, np.ndarray] | None] = {}

    def get(
        self, rec: dict[str, Any], bundle: Any, cfg: Config, check: bool = True, single: Any = None
    ) -> tuple[Any, dict[str, np.ndarray]]:
        if cfg.id not in self.open:
            where = str(bundle.path)
            if where not in self.inputs:
                self.inputs[where] = _first_inputs(bundle)
            runner, feeds = open_trial_runner(rec, bundle, cfg, check=check, single=single, inputs=self.inputs[where])
            self.open[cfg.id] = (runner, feeds, float(rec.get("memory_mb") or 0.0))
        runner, feeds, _ = self.open[cfg.id]
        if check:  # opened unchecked for an earlier rung: checked now that it may be chosen
            try:
                _check(rec, bundle, runner, cfg, single)
            except BaseException:
                self.close([cfg.id])
                raise
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


@dataclass(frozen=True)
class Trials:
    """A tune's trials: records by config id, bundles by recipe key, each config's recipe key, and a batched
    trial's batch-1 bundle (its per-item reference) by config id."""

    recs: dict[str, dict[str, Any]]
    bundles: Mapping[str, Any]
    keys: Mapping[str, str]
    singles: Mapping[str, Any] = field(default_factory=dict)

    def bundle(self, cid: str) -> Any:
        return self.bundles[self.keys[cid]]


@dataclass(frozen=True)
class Rung:
    """One measurement of successive halving: its name, ``reps`` interleaved repetitions of ``iters`` timed
    inferences (``video``: frames, fed at ``pace_fps``) after ``warmup`` untimed ones. ``check=False``: the trials'
    own reference checks wait until they survive this rung."""

    name: str
    objective: str
    reps: int
    iters: int
    warmup: int
    video: Path | None = None
    budget_ms: float | None = None
    pace_fps: float | None = None
    check: bool = True


def measure_chunk(chunk: Sequence[Config], trials: Trials, rung: Rung, pool: Pool, anchor: Config | None = None) -> int:
    """Open (or take from ``pool``), check and measure one chunk of trials interleaved; how many were measured.
    ``rung.check=False``: the trials' own reference checks wait until they survive this rung (the conversion gate
    still holds: a trial that failed it is never chosen). ``trials.singles``: a batched trial's id -> its batch-1
    bundle (the per-item reference). ``anchor`` (latency and throughput): a trial measured in every chunk of a rung
    that needs several, interleaved with the chunk's own (its record is written only where it is one of
    ``chunk``); each trial's rung record gets ``vs_anchor`` (:func:`vs_anchor`) and ``anchor`` (its id and its
    raw figures in this chunk), which rank the rung when every trial in it has them (``edge.tune.ranking.ranked_trials``)."""
    recs, objective, video = trials.recs, rung.objective, rung.video
    members = list(chunk)
    if anchor is not None and video is None and all(c.id != anchor.id for c in chunk):
        members.append(anchor)  # measured as this chunk's reference
    own = {c.id for c in chunk}
    opened: dict[str, tuple[Any, dict[str, np.ndarray]]] = {}
    for c in members:
        rec = recs[c.id]
        try:
            opened[c.id] = pool.get(rec, trials.bundle(c.id), c, check=rung.check, single=trials.singles.get(c.id))
        except EdgeError as e:
            rec["status"] = f"failed to load: {str(e).splitlines()[0][:300]}"
            rec.setdefault("parity", {})["passed"] = None
    if not opened.keys() & own:
        return 0
    if video is None:
        got = measure_infer(opened, objective, rung.reps, rung.iters, rung.warmup, {c.id: c.batch for c in members})
    else:
        pool.close(opened)  # the pipeline opens its own runners
        items = [(cid, trials.bundle(cid), next(c for c in chunk if c.id == cid)) for cid in opened]
        got = _measure_video(items, video, rung.reps, rung.iters, rung.budget_ms, rung.pace_fps)
    ref = got.get(anchor.id) if anchor is not None else None
    if ref is not None:
        ref = dict(ref)  # (its raw figures, before its own record, when it is one of the chunk, gets vs_anchor)
    for cid, m in got.items():
        if cid not in own:
            continue
        if ref is not None and anchor is not None:
            m["vs_anchor"] = round(vs_anchor(objective, m["rep_scores"], ref["rep_scores"]), 5)
            m["anchor"] = {"id": anchor.id, "p50_ms": ref["p50_ms"], "rep_scores": ref["rep_scores"]}
        recs[cid]["rungs"][rung.name] = m
    # over the memory bound: the chunk's worst close first (the best are the likely survivors)
    pool.keep_within(sorted(got, key=lambda cid: rank_key(objective, got[cid]), reverse=True))
    return len(got.keys() & own)
