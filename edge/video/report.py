"""What a video run measured, and the verdict: does this pipeline hold the target fps on this host?

Per-stage and end-to-end statistics use :class:`edge.stats.LatencyStats`, the code behind
``edgekit bench``. Counting, per frame the source produced:

* **processed**: went through every stage;
* **dropped**, by reason: ``behind`` (the decoder was a whole frame interval behind the
  source clock, so the frame was skipped, as a camera overwrites a frame nobody read),
  ``busy`` (a newer frame replaced it in a full queue), ``late`` (when inference could start
  it was past its deadline, capture + budget, or would miss it by the recent median inference
  + post-processing time): realtime and live runs only; and in any run ``unreadable`` (the
  source could not decode it: a corrupt image in a directory; named in the notes);
* **abandoned**: read from the source but neither processed nor dropped because the run stopped
  (Ctrl-C, a failing stage) while the frame sat in a queue or a stage; counted from the queues
  and the stages after the threads end, so processed + dropped + abandoned = frames in;
* **late**: processed, but its latency exceeded the budget: end-to-end (capture ->
  post-processed) in realtime and live runs; in offline runs, which feed frames as fast as
  the pipeline takes them so that queueing time says nothing about a real-time deadline,
  the service latency (the sum of the frame's stage times).

Frames the source declared (a container's frame count, the number of images) are compared with
what it delivered: a file that ends early (truncated) is reported with both numbers.

Deadline misses = dropped for time (not ``unreadable``) + late. Verdict with a budget: a realtime or live run holds when
at most 1% of the frames miss their deadline (the p99 rule of ``bench``); an offline run
holds when its throughput reaches the target fps and the p99 service latency is within the
budget (a prediction: ``--realtime`` measures it).

Counters are exact however long a run lasts; the latency statistics describe its last
100,000 frames (``edge.video.job.STATS_WINDOW``), so a camera can run for days in flat memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, cast

import numpy as np

from edge.stats import LatencyStats
from edge.video.errors import PipelineError

STAGES = ("decode", "preprocess", "infer", "postprocess")
DROP_REASONS = ("behind", "busy", "late", "unreadable")
TIME_DROPS = ("behind", "busy", "late")  # drops that are deadline misses; `unreadable` is the source's fault
MISS_TOLERANCE = 0.01  # share of frames allowed to miss: the p99 rule of `edgekit bench`
NAMES_SHOWN = 5  # unreadable frames named in the notes


def stats_ns(samples: Iterable[int] | np.ndarray) -> LatencyStats | None:
    a = np.asarray(samples, dtype=np.float64)
    return LatencyStats.from_ms(a / 1e6) if a.size else None


@dataclass
class VideoReport:
    bundle: str
    target: str
    source: dict[str, Any]
    mode: str  # "offline", "realtime", "live" (camera) or "sequential" (no pipelining)
    pace_fps: float | None  # the rate frames were fed at (realtime/live), None when as fast as possible
    budget_ms: float | None
    budget_source: str
    frames_in: int
    processed: int
    dropped: dict[str, int]
    late: int
    stages: dict[str, LatencyStats | None]
    e2e: LatencyStats | None
    service: LatencyStats | None
    duration_s: float
    load_ms: float
    runner: dict[str, Any]
    postprocess: str
    queue_size: int
    infer_workers: int = 1
    abandoned: int = 0  # in a queue or a stage when the run stopped: neither processed nor dropped
    declared: int | None = None  # frames the source said it holds (container header, images), None if unknown
    short_by: int = 0  # the source ran out this many frames before what it declared (capped by --max-frames)
    unreadable: list[str] = field(default_factory=list)  # the frames dropped as unreadable: "frame 3 (x.png)"
    output: str | None = None
    failure: dict[str, Any] | None = None
    interrupted: bool = False
    hung_threads: list[str] = field(default_factory=list)
    #: thread name -> the stages it ran, in order ({} = one thread per stage, the sequential loop's one thread)
    threads: dict[str, list[str]] = field(default_factory=dict)
    #: thread name -> {"input_ms": blocked waiting for a frame (or the source's pace), "output_ms": waiting to hand
    #: one on (a full queue, offline; no free input buffer)}, summed over the run
    waits: dict[str, dict[str, float]] = field(default_factory=dict)
    native_input: bool = False  # frames pre-processed into the runner's own input layout (LiteRT's NHWC)
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    load_avg: float | None = field(default_factory=lambda: os.getloadavg()[0] if hasattr(os, "getloadavg") else None)
    error: BaseException | None = field(default=None, repr=False, compare=False)  # the failing stage's exception

    def raise_for_failure(self) -> None:
        """Raise :class:`PipelineError` (an ``EdgeError``: stage, frame, cause) when a stage failed."""
        if self.failure is None:
            return
        cause = self.error or RuntimeError(self.failure["error"])
        raise PipelineError(self.failure["stage"], self.failure["frame"], cause) from cause

    # -- derived -------------------------------------------------------------------------

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    @property
    def deadline_misses(self) -> int:
        return sum(self.dropped.get(k, 0) for k in TIME_DROPS) + self.late

    @property
    def frames_lost(self) -> int:
        """Frames the run was meant to cover that never went through the pipeline: the source's
        shortfall plus the unreadable ones. A shortfall of one frame is not counted: containers
        without a frame count in their header give one estimated from duration x fps, which can be
        a frame off."""
        return (self.short_by if self.short_by > 1 else 0) + self.dropped.get("unreadable", 0)

    @property
    def source_incomplete(self) -> bool:
        """More of the source was lost than the 1% of frames the p99 rule lets miss."""
        return self.frames_lost > MISS_TOLERANCE * (self.frames_in + self.short_by)

    def notes(self) -> list[str]:
        """What the reader must know beyond the numbers: frames the source declared but never delivered."""
        out = []
        expected = self.frames_in + self.short_by
        asked = "" if expected == self.declared else f" (of the {expected} this run asked for)"
        if self.short_by == 1:
            out.append(
                f"the source declared {self.declared} frames and delivered {self.frames_in}{asked}: its frame count is probably an estimate"
            )
        elif self.short_by:
            out.append(
                f"the source declared {self.declared} frames but only {self.frames_in}{asked} could be "
                f"decoded: the file is truncated or corrupt; the figures cover those {self.frames_in}"
            )
        n = self.dropped.get("unreadable", 0)
        if n:
            names = ", ".join(self.unreadable[:NAMES_SHOWN]) + (
                f" and {n - NAMES_SHOWN} more" if n > NAMES_SHOWN else ""
            )
            out.append(f"{n} of {self.frames_in} frames could not be decoded and were dropped (unreadable): {names}")
        return out

    @property
    def effective_fps(self) -> float:
        return self.processed / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def target_fps(self) -> float | None:
        return 1000.0 / self.budget_ms if self.budget_ms else None

    def _thread_of(self, stage: str) -> list[str]:
        """The stages that run in ``stage``'s thread, in order (just ``[stage]`` with a thread per stage)."""
        return next((v for v in self.threads.values() if stage in v and len(v) > 1), [stage])

    def capacity_fps(self, stage: str) -> float | None:
        """Frames a second ``stage`` can pass: its workers / the median time of its thread (its own, or the
        sum of the stages that share its thread)."""
        s = self.stages.get(stage)
        if s is None or s.p50_ms <= 0:
            return None
        ms = sum(t.p50_ms for k in self._thread_of(stage) if (t := self.stages.get(k)) is not None)
        return 1000.0 * (self.infer_workers if stage == "infer" else 1) / ms

    @property
    def bottleneck(self) -> str | None:
        """The stage with the least capacity (for one worker per stage: the largest median time); of two
        stages that share a thread, the one with the larger median."""
        caps = {k: c for k in self.stages if (c := self.capacity_fps(k)) is not None}
        if not caps:
            return None
        least = min(caps.values())
        tied = [k for k, c in caps.items() if c == least]
        return max(tied, key=lambda k: cast(LatencyStats, self.stages[k]).p50_ms)

    @property
    def bound_fps(self) -> float | None:
        """The most these stages allow: pipelined, the slowest thread's capacity, and in realtime no more
        than the source's pace (frames cannot be delivered faster than they arrive); sequential, 1 / the
        sum of the stage medians."""
        if self.mode == "sequential":
            total = sum(s.p50_ms for s in self.stages.values() if s is not None)
            return 1000.0 / total if total > 0 else None
        b = self.bottleneck
        cap = self.capacity_fps(b) if b else None
        if cap is not None and self.mode == "realtime" and self.pace_fps:
            return min(cap, self.pace_fps)
        return cap

    @property
    def pct_of_bound(self) -> float | None:
        bound = self.bound_fps
        return 100.0 * self.effective_fps / bound if bound else None

    @property
    def verdict(self) -> str:
        # A source that lost frames (a truncated clip, corrupt images) makes the run "incomplete", not
        # "pass": the timings are real, but they answer the question for a shorter input than the one
        # asked about, and a gate (a script checking the exit code) must not pass a 60 fps check on a
        # clip that silently lost half its frames. Not "fail" either: nothing says the pipeline is slow.
        if self.failure is not None or self.frames_in == 0 or self.source_incomplete:
            return "incomplete"
        if self.budget_ms is None:
            return "no budget"
        if self.mode in ("realtime", "live"):
            ok = self.frames_in > 0 and self.deadline_misses <= MISS_TOLERANCE * self.frames_in
        else:
            target = self.target_fps or 0.0
            ok = self.service is not None and self.effective_fps >= target and self.service.p99_ms <= self.budget_ms
        return "pass" if ok else "fail"

    @property
    def limit(self) -> str | None:
        """Why the target is not held (None when it is, or there is no budget)."""
        if self.verdict != "fail" or self.budget_ms is None:
            return None
        b = self.bottleneck
        bs = self.stages.get(b) if b else None
        interval = self.budget_ms
        throughput_short = (
            self.dropped.get("behind", 0) + self.dropped.get("busy", 0) > 0
            if self.mode in ("realtime", "live")
            else self.effective_fps < (self.target_fps or 0)
        )
        if throughput_short and b and bs is not None:
            cap = self.capacity_fps(b) or 0.0
            work = sum(s.p50_ms for s in self.stages.values() if s is not None)
            if self.mode == "sequential":
                return (
                    f"the loop: {work:.2f} ms a frame for all stages in turn (largest: {b} {bs.p50_ms:.2f} ms), "
                    f"over the {interval:.2f} ms frame interval"
                )
            # frames arrive at the target rate, or faster when the source is paced above it
            rate = max(self.target_fps or 0.0, self.pace_fps or 0.0 if self.mode == "realtime" else 0.0)
            if cap < rate:
                workers = f", {self.infer_workers} workers" if b == "infer" and self.infer_workers > 1 else ""
                group = self._thread_of(b)
                if len(group) > 1:  # stages sharing a thread: their medians add up
                    ms = sum(t.p50_ms for k in group if (t := self.stages.get(k)) is not None)
                    return (
                        f"thread {'+'.join(group)}: median {ms:.2f} ms a frame ({cap:.1f} fps{workers}), "
                        f"too slow for {rate:.4g} fps"
                    )
                return f"stage {b}: median {bs.p50_ms:.2f} ms a frame ({cap:.1f} fps{workers}), too slow for {rate:.4g} fps"
            load = f" (load average {self.load_avg:.2f} at the end)" if self.load_avg is not None else ""
            return (
                f"CPU: no stage alone is too slow for {rate:.4g} fps (slowest: {b} {bs.p50_ms:.2f} ms), "
                f"but together they need {work:.2f} ms of work a frame on {self.cpus} CPU(s){load}"
            )
        lat = self.e2e if self.mode in ("realtime", "live") else self.service
        worst = max(
            ((k, v) for k, v in self.stages.items() if v is not None), key=lambda kv: kv[1].p99_ms, default=None
        )
        if lat is not None and worst is not None:
            which = "end-to-end" if lat is self.e2e else "service"
            return (
                f"latency: {which} p99 {lat.p99_ms:.2f} ms over the {interval:.2f} ms budget; "
                f"largest stage p99: {worst[0]} {worst[1].p99_ms:.2f} ms"
            )
        return "no frame was processed"

    def summary(self) -> str:
        """One line: the verdict in words."""
        if self.failure is not None:
            f = self.failure
            return f"stopped: stage {f['stage']} failed on frame {f['frame']}: {f['error']}"
        if self.source_incomplete:
            return (
                f"{self.frames_lost} of the {self.frames_in + self.short_by} frames the source declared never "
                "went through the pipeline (see the notes): no verdict on a partial input"
            )
        if self.budget_ms is None:
            return "no budget: pass --fps or --budget-ms for a verdict"
        target = f"{self.target_fps:.4g} fps ({self.budget_ms:.2f} ms a frame)"
        how = {
            "offline": " (predicted from an offline run; --realtime measures it)",
            "sequential": " (sequential loop, no pipelining)",
        }.get(self.mode, "")
        if self.mode == "realtime" and self.pace_fps and self.target_fps and self.pace_fps < 0.99 * self.target_fps:
            how = (
                f" (frames arrived at the source's {self.pace_fps:.4g} fps, below the target: this tests "
                f"latency only; --source-fps {self.target_fps:.4g} tests the rate)"
            )
        if self.verdict == "pass":
            return f"holds {target} in real time on this host{how}"
        return f"does not hold {target} on this host{how}: {self.limit}"

    def to_json(self) -> dict[str, Any]:
        def st(s: LatencyStats | None) -> dict[str, Any] | None:
            return s.to_json() if s is not None else None

        def r2(v: float | None) -> float | None:
            return round(v, 2) if v is not None else None

        return {
            "bundle": self.bundle,
            "target": self.target,
            "source": self.source,
            "mode": self.mode,
            "pace_fps": self.pace_fps,
            "budget_ms": self.budget_ms,
            "budget_source": self.budget_source,
            "target_fps": r2(self.target_fps),
            "frames": {
                "in": self.frames_in,
                "processed": self.processed,
                "dropped": self.dropped_total,
                "dropped_by_reason": dict(self.dropped),
                "abandoned": self.abandoned,
                "late": self.late,
                "deadline_misses": self.deadline_misses,
                "declared": self.declared,
                "short_by": self.short_by,
                "unreadable": list(self.unreadable),
            },
            "notes": self.notes(),
            "stages": {k: st(v) for k, v in self.stages.items()},
            "e2e": st(self.e2e),
            "service": st(self.service),
            "duration_s": round(self.duration_s, 3),
            "effective_fps": r2(self.effective_fps),
            "bottleneck": self.bottleneck,
            "bound_fps": r2(self.bound_fps),
            "pct_of_bound": r2(self.pct_of_bound),
            "verdict": self.verdict,
            "limit": self.limit,
            "summary": self.summary(),
            "load_ms": round(self.load_ms, 1),
            "runner": self.runner,
            "postprocess": self.postprocess,
            "queue_size": self.queue_size,
            "infer_workers": self.infer_workers,
            "output": self.output,
            "failure": self.failure,
            "interrupted": self.interrupted,
            "hung_threads": self.hung_threads,
            "threads": self.threads,
            "native_input": self.native_input,
            "waits": {k: {n: round(v, 1) for n, v in w.items()} for k, w in self.waits.items()},
            "cpus": self.cpus,
            "load_avg": None if self.load_avg is None else round(self.load_avg, 2),
        }


def empty_drops() -> dict[str, int]:
    return {k: 0 for k in DROP_REASONS}


def stage_stats(samples: Mapping[str, Iterable[int]]) -> dict[str, LatencyStats | None]:
    return {k: stats_ns(samples.get(k, ())) for k in STAGES}
