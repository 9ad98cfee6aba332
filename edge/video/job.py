"""What one video run shares between its stages: options, the model and its pre/post-processing,
counters, per-stage samples, the JSONL sink, the first failure. Used by the pipelined runner
(``edge.video.pipeline``) and the sequential baseline (``edge.video.sequential``) alike, so
both count and report the same way.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Callable, Mapping, cast

import numpy as np

from edge.backends.threads import PIPELINE_STAGE_CPUS, plan_threads
from edge.bundle.bundle import Bundle
from edge.errors import EdgeError, ModelError
from edge.preprocess import LetterboxTransform, Preprocessor
from edge.video.errors import UnreadableFrame
from edge.video.postprocess import PostConfig, PostProcessor, make_postprocessor
from edge.video.report import STAGES, VideoReport, empty_drops, stage_stats, stats_ns
from edge.video.sources import FrameSource

log = logging.getLogger("edge.video")

Progress = Callable[[int, int, int, "int | None"], None]  # frames in, processed, dropped, expected total
clock = time.perf_counter_ns
# Latency samples kept per series: a camera can run for days, memory must not grow with it. The
# counters stay exact; the statistics then describe the most recent frames (~28 min at 60 fps).
STATS_WINDOW = 100_000


@dataclass(frozen=True)
class PipelineOptions:
    realtime: bool = False  # pace the source at its fps and drop what would be late
    source_fps: float | None = None  # pacing rate; default: the source's own (container, camera)
    budget_ms: float | None = None
    budget_source: str = "none"
    queue_size: int = 2
    #: parallel inference workers, each with its own runner (and a share of the cores); None: the bundle's own
    #: (an `edgekit tune --objective e2e` overlay records them in the manifest, tuned.infer_workers), else 1
    infer_workers: int | None = None
    #: threads the four stages run in: 4 (one each) or 2 (decode + pre-processing, inference + post-processing);
    #: None: 2 where one inference worker runs on 2 CPUs or fewer, else 4 (``edge.video.pipeline.stage_threads``)
    stage_threads: int | None = None
    max_frames: int | None = None
    duration_s: float | None = None
    warmup: int = 3  # untimed inferences before the first frame
    out: str | Path | None = None  # JSONL, one line per processed frame
    post: PostConfig = field(default_factory=PostConfig)
    runner_options: Mapping[str, Any] | None = None
    join_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.queue_size < 1:
            raise EdgeError(f"--queue-size must be >= 1, got {self.queue_size}")
        if self.infer_workers is not None and self.infer_workers < 1:
            raise EdgeError(f"--infer-workers must be >= 1, got {self.infer_workers}")
        if self.stage_threads not in (None, 2, 4):
            raise EdgeError(f"--stage-threads must be 2 or 4, got {self.stage_threads}")
        if self.max_frames is not None and self.max_frames < 1:
            raise EdgeError(f"--max-frames must be >= 1, got {self.max_frames}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise EdgeError(f"--duration must be > 0, got {self.duration_s}")
        if self.source_fps is not None and self.source_fps <= 0:
            raise EdgeError(f"--source-fps must be > 0, got {self.source_fps}")
        if self.warmup < 0:
            raise EdgeError(f"--warmup must be >= 0, got {self.warmup}")


class Item:
    __slots__ = (
        "index",
        "pts",
        "name",
        "capture",
        "deadline",
        "image",
        "hw",
        "tensor",
        "tf",
        "outputs",
        "times",
        "seq",
        "dropped",
    )

    def __init__(
        self, index: int, pts: float | None, name: str | None, image: np.ndarray, capture: int, deadline: int | None
    ) -> None:
        self.index, self.pts, self.name = index, pts, name
        self.image: np.ndarray | None = image  # the decoded frame, until it is pre-processed
        self.capture, self.deadline = capture, deadline
        self.hw: tuple[int, int] = (int(image.shape[0]), int(image.shape[1]))
        self.tensor: np.ndarray | None = None
        self.tf: LetterboxTransform | None = None
        self.outputs: dict[str, np.ndarray] | None = None
        self.times = [0, 0, 0, 0]  # ns per stage, in STAGES order
        self.seq = -1  # order in which inference workers took it: post-processing restores it
        self.dropped = False


class Job:
    """What one run shares between its stages: the model, the pre/post-processing, counters, the sink."""

    def __init__(self, bundle: Bundle, source: FrameSource, options: PipelineOptions, mode: str) -> None:
        spec = bundle.preprocess
        inputs = bundle.io.inputs
        described = ", ".join(t.describe() for t in inputs)
        if spec is None:
            raise ModelError(
                f"bundle {bundle.id} has no image input to feed frames to (inputs: {described})",
                hint="`edgekit run` needs a model whose input is an image tensor, [1, 3, H, W] or "
                "[1, H, W, 3], converted with a --preprocess preset",
            )
        if len(inputs) != 1:
            raise ModelError(
                f"bundle {bundle.id} has {len(inputs)} inputs ({described}); video frames can only feed a model with one image input"
            )
        self.pre = Preprocessor(spec, src_color="BGR")
        if tuple(inputs[0].shape) != self.pre.output_shape or inputs[0].dtype != str(self.pre.dtype):
            raise ModelError(
                f"bundle {bundle.id}: its pre-processing spec makes {self.pre.dtype}"
                f"{list(self.pre.output_shape)}, but the model takes {inputs[0].describe()}"
            )
        self.input_name = spec.input
        self.post: PostProcessor = make_postprocessor(bundle.io, options.post)
        self.bundle, self.source, self.options, self.mode = bundle, source, options, mode
        self.live = source.info.live
        self.realtime = mode in ("realtime", "live")
        self.pace_fps: float | None = None
        if mode == "realtime":
            self.pace_fps = (
                options.source_fps or source.info.fps or (1000.0 / options.budget_ms if options.budget_ms else None)
            )
            if self.pace_fps is None:
                raise EdgeError(
                    f"--realtime needs a frame rate: {source.info.name} has none",
                    hint="pass --source-fps N (or --fps N)",
                )
        self.budget_ns = int(options.budget_ms * 1e6) if options.budget_ms else None
        self.samples: dict[str, deque[int]] = {k: deque(maxlen=STATS_WINDOW) for k in STAGES}
        self.e2e: deque[int] = deque(maxlen=STATS_WINDOW)
        self.service: deque[int] = deque(maxlen=STATS_WINDOW)
        self.frames_in = self.processed = self.late = 0
        self.dropped = empty_drops()
        self.abandoned = 0  # frames still in a queue or a stage when the run stopped (set by the runner)
        self.source_ended = False  # the decoder reached the end of the source (not a limit, Ctrl-C or a failure)
        self.unreadable: list[str] = []  # "frame 3 (x.png)" for each frame the source could not decode
        self.failure: dict[str, Any] | None = None
        self.current: dict[str, int | None] = {}  # thread name -> frame index it is working on
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self.sink: IO[str] | None = None
        self.load_ms = 0.0
        self.runners: list[Any] = []
        self.infers: list[Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]] = []  # one per runner
        self.native_input = False  # frames pre-processed into the runner's own layout (``_native_feed``)

    # -- life cycle ------------------------------------------------------------------------

    def open(self) -> None:
        o = self.options
        if o.out is not None:
            out = Path(o.out)
            if out.is_dir():
                raise EdgeError(f"--out {out} is a directory; give a file name such as detections.jsonl")
            out.parent.mkdir(parents=True, exist_ok=True)
            self.sink = out.open("w", encoding="utf-8")
        workers = (o.infer_workers or bundle_workers(self.bundle)) if self.mode != "sequential" else 1
        # decode, pre- and post-processing run beside inference in the pipelined modes: the runners leave them room
        stages = 3 if self.mode != "sequential" else 0
        options = worker_runner_options(self.bundle, o.runner_options, workers, stages=stages)
        t0 = clock()
        for _ in range(workers):
            self.runners.append(self.bundle.open_runner(options))
        self.load_ms = (clock() - t0) / 1e6
        self.infers = [self._native_feed(r) or r.infer for r in self.runners]
        h, w = self.pre.spec.size  # a frame any pre-processing takes: bad frames fail in their stage, with their index
        x, tf = self.pre(np.full((h, w, 3), 114, np.uint8))
        for infer in self.infers:
            for _ in range(o.warmup):
                self.post(infer({self.input_name: x}), tf, (h, w))

    def _native_feed(self, runner: Any) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]] | None:
        """Where the runner takes its input in NHWC float32 itself (LiteRT: ``infer_from_native``) and the bundle's
        input is the same image in NCHW, pre-process straight into NHWC and feed that: the letterbox makes HWC
        pixels, so the NCHW planes and the runner's copy back to NHWC (0.16 ms a 320x320 frame) both go."""
        fn = getattr(runner, "infer_from_native", None)
        native = getattr(runner, "native_inputs", None)
        spec = self.pre.spec
        if fn is None or not native or len(native) != 1 or spec.layout != "NCHW" or self.pre.grey:
            return None
        n, c, h, w = self.pre.output_shape
        if native[0].name != self.input_name or tuple(native[0].shape) != (n, h, w, c) or native[0].dtype != "float32":
            return None
        if self.pre.dtype != np.float32:
            return None
        self.pre = Preprocessor(replace(spec, layout="NHWC"), src_color="BGR")
        self.native_input = True
        return cast(Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]], fn)

    def close(self) -> None:
        for runner in self.runners:
            runner.close()
        if self.sink is not None:
            self.sink.close()

    def fail(self, stage: str, exc: BaseException, thread: str | None = None) -> None:
        with self._lock:
            if self.failure is None:
                self.failure = {
                    "stage": stage,
                    "frame": self.current.get(thread or stage),
                    "error": exc.message if isinstance(exc, EdgeError) else f"{type(exc).__name__}: {exc}",
                    "type": type(exc).__name__,
                    "exception": exc,
                    "traceback": "".join(traceback.format_exception(exc)),
                }
        self.stop.set()

    # -- per frame -------------------------------------------------------------------------

    def item(self, index: int, frame: Any, capture: int) -> Item:
        deadline = capture + self.budget_ns if self.realtime and self.budget_ns else None
        return Item(index, frame.pts_s, frame.name, frame.image, capture, deadline)

    def finish(self, item: Item, done: int) -> None:
        """Account for a post-processed frame (``done``: when its result was ready)."""
        e2e = done - item.capture
        service = sum(item.times)
        self.e2e.append(e2e)
        self.service.append(service)
        self.processed += 1
        if self.budget_ns is not None and (e2e if self.realtime else service) > self.budget_ns:
            self.late += 1

    def write(self, item: Item, result: Mapping[str, Any], done: int) -> None:
        if self.sink is None:
            return
        line: dict[str, Any] = {"frame": item.index, "t": None if item.pts is None else round(item.pts, 4)}
        if item.name is not None:
            line["file"] = item.name
        line.update(result)
        line["latency_ms"] = round((done - item.capture) / 1e6, 3)
        self.sink.write(json.dumps(line, separators=(",", ":")) + "\n")

    def drop(self, item: Item, reason: str, pool: Any = None) -> None:
        if pool is not None and item.tensor is not None:
            pool.release(item.tensor)
            item.tensor = None
        self.count_drop(reason)

    def count_drop(self, reason: str) -> None:
        with self._lock:
            self.dropped[reason] += 1

    def unreadable_frame(self, e: UnreadableFrame) -> None:
        """A frame the source read but could not decode: counted (in and dropped), named, logged; the run goes on."""
        self.frames_in += 1
        self.count_drop("unreadable")
        if len(self.unreadable) < 1000:  # names for the report; the counter stays exact past that
            self.unreadable.append(f"frame {e.index} ({e.name})")
        log.warning("frame %d: %s; counted as dropped (unreadable), going on", e.index, e.message)

    def short_by(self) -> int:
        """Frames the source declared (up to --max-frames) but never delivered, when it ran out early."""
        declared = self.source.info.frame_count
        if not self.source_ended or declared is None:
            return 0
        m = self.options.max_frames
        return max(0, (declared if m is None else min(declared, m)) - self.frames_in)

    def report(
        self,
        t_start: int,
        t_end: int,
        *,
        interrupted: bool = False,
        hung: list[str] | None = None,
        threads: dict[str, list[str]] | None = None,
        waits: dict[str, dict[str, float]] | None = None,
    ) -> VideoReport:
        failure = error = None
        if self.failure is not None:
            failure = {k: v for k, v in self.failure.items() if k != "exception"}
            error = self.failure["exception"]
        return VideoReport(
            bundle=self.bundle.id,
            target=self.bundle.target,
            source=self.source.info.to_json(),
            mode=self.mode,
            pace_fps=self.pace_fps if self.mode == "realtime" else self.source.info.fps if self.live else None,
            budget_ms=self.options.budget_ms,
            budget_source=self.options.budget_source,
            frames_in=self.frames_in,
            processed=self.processed,
            dropped=dict(self.dropped),
            late=self.late,
            abandoned=self.abandoned,
            declared=self.source.info.frame_count,
            short_by=self.short_by(),
            unreadable=list(self.unreadable),
            stages=stage_stats(self.samples),
            e2e=stats_ns(self.e2e),
            service=stats_ns(self.service),
            duration_s=(t_end - t_start) / 1e9,
            load_ms=self.load_ms,
            runner=self.runners[0].info.to_json() if self.runners else {},
            infer_workers=len(self.runners) or self.options.infer_workers or 1,
            postprocess=self.post.describe(),
            queue_size=self.options.queue_size,
            output=str(self.options.out) if self.options.out is not None else None,
            failure=failure,
            error=error,
            interrupted=interrupted,
            hung_threads=hung or [],
            threads=threads or {},
            waits=waits or {},
            native_input=self.native_input,
        )


THREAD_OPTIONS = ("intra_op_num_threads", "num_threads")  # onnxruntime, OpenVINO


def bundle_workers(bundle: Bundle) -> int:
    """The inference workers ``bundle`` was tuned with (manifest ``tuned.infer_workers``, validated when the
    manifest was read), else 1."""
    tuned = bundle.info.tuned
    return int(tuned.infer_workers) if tuned is not None and tuned.infer_workers else 1


def worker_runner_options(
    bundle: Bundle, options: Mapping[str, Any] | None, workers: int, *, stages: int = 0
) -> dict[str, Any]:
    """Runner options for ``workers`` parallel runners beside ``stages`` other pipeline stages.

    The runners' own policy (``edge.backends.threads``) picks threads from the CPUs other processes leave;
    the stages are reserved for it (``reserve_cpus``, ``PIPELINE_STAGE_CPUS`` each). With several workers,
    the cores it would give one runner are shared out unless threads were set: one runner using every core
    is the lowest latency; on a small CPU, runners with a share of the cores each keep all of them busier
    (less time in the runtime's barriers between ops).
    """
    from edge.backends.runner import RUNNERS

    opts = dict(options or {})
    known = RUNNERS.get(bundle.info.runner.name).options
    manifest_opts = bundle.info.runner.options
    if stages and "reserve_cpus" in known and "reserve_cpus" not in opts and "reserve_cpus" not in manifest_opts:
        opts["reserve_cpus"] = round(stages * PIPELINE_STAGE_CPUS, 2)
    if workers > 1:
        free = plan_threads(0, None, reserve=float(opts.get("reserve_cpus", 0))).threads
        for key in THREAD_OPTIONS:
            if key in known and not opts.get(key) and not manifest_opts.get(key):
                opts[key] = max(1, free // workers)
    return opts


def expected_frames(job: Job) -> int | None:
    n = job.source.info.frame_count
    m = job.options.max_frames
    return m if n is None else (n if m is None else min(n, m))
