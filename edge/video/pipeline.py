"""The pipelined video runner: decode, pre-process, infer, post-process in four threads, or two on a small host.

    source ─▶ [decode] ─q─▶ [preprocess] ─q─▶ [infer] ─q─▶ [postprocess] ─▶ JSONL      (four threads)
    source ─▶ [decode + preprocess] ─q─▶ [infer + postprocess] ─▶ JSONL                  (two threads)

Two threads (``PipelineOptions.stage_threads``; by default where one inference worker runs on 2 CPUs or
fewer): the stages beside inference take about a millisecond a frame, and on a small host a thread of
their own buys little parallelism, only hand-overs (each queue between two threads is a wake-up that waits
for a CPU the inference may hold). Each thread's waits (for input, to hand on) are in the report.

Queues are bounded (``queue_size``), and model inputs are written into a fixed pool of
``queue_size + 2`` buffers, so memory stays flat whatever the source. Offline, a full queue
blocks its producer (back-pressure) and every frame is processed. In realtime mode the
source is paced at its fps and the pipeline never blocks it: a frame that finds a full
queue replaces the oldest one, and a frame that would be late (past its deadline when
inference could start, or due to miss it by the recent median inference and post-processing
times) is dropped before inference; every drop is counted with its reason (see
``edge.video.report``).

Stopping: the end of the source travels down as a sentinel; a stage that raises records
its name and frame index and sets a stop event that every blocking get/put polls (every
50 ms), so all threads leave promptly; they are joined with a timeout and any thread still
alive is named in the report. Frames that were read but are still in a queue or a stage
when the threads end (Ctrl-C, a failing stage) are counted as ``abandoned``: each stage keeps
the frame it holds in ``held`` until it has handed it on, and after the join the runner counts
those, the frames left in the queues and the ones post-processing held back for ordering.
OpenCV, numpy and the runtimes release the GIL in their heavy loops, so the stages overlap on
several cores.
"""

from __future__ import annotations

import queue
import threading
import time
from itertools import islice
from typing import Any, Callable, cast

import numpy as np

from edge.backends.threads import usable_cpus
from edge.bundle.bundle import Bundle
from edge.preprocess import LetterboxTransform
from edge.video.errors import UnreadableFrame
from edge.video.job import Item, Job, PipelineOptions, Progress, clock, expected_frames
from edge.video.report import VideoReport
from edge.video.sources import FrameSource

_END = object()  # end-of-stream sentinel
_POLL_S = 0.05
_RECENT = 15  # frames whose median stage times predict whether a frame would be late
SMALL_HOST_CPUS = 2  # at most this many CPUs: the stages run in two threads


class _Pool:
    """A fixed set of model-input buffers: the pre-processor writes into one, inference gives it back."""

    def __init__(self, size: int, make: Callable[[], np.ndarray]) -> None:
        self._free: queue.Queue[np.ndarray] = queue.Queue()
        for _ in range(size):
            self._free.put(make())

    def acquire(self, stop: threading.Event) -> np.ndarray | None:
        try:
            return self._free.get_nowait()
        except queue.Empty:
            pass
        while True:
            try:
                return self._free.get(timeout=_POLL_S)
            except queue.Empty:
                if stop.is_set():
                    return None

    def release(self, buf: np.ndarray) -> None:
        self._free.put(buf)


def stage_threads(options: PipelineOptions, workers: int, cpus: int | None = None) -> int:
    """Threads the stages run in: ``options.stage_threads`` when given, else 2 where one inference worker
    runs on 2 CPUs or fewer (``usable_cpus``), else 4. Several workers always get the four-thread layout
    (post-processing restores their order)."""
    if workers > 1:
        return 4
    if options.stage_threads is not None:
        return options.stage_threads
    return 2 if (cpus if cpus is not None else usable_cpus()) <= SMALL_HOST_CPUS else 4


class _Pipeline:
    def __init__(self, job: Job) -> None:
        self.job = job
        n = job.options.queue_size
        self.workers = len(job.runners)
        self.compact = stage_threads(job.options, self.workers) == 2
        fps = job.pace_fps or (job.source.info.fps if job.live else None)
        self.interval_ns = int(1e9 / fps) if fps else 0  # between two captures (0: unknown)
        self.waits: dict[str, list[int]] = {}  # thread name -> [ns waiting for input, ns waiting to hand on]
        self.doing: dict[str, str] = {}  # thread name -> the stage it is in (a thread may run two)
        self.q: list[queue.Queue[Any]] = [queue.Queue(maxsize=n) for _ in range(3)]  # ->pre, ->infer, ->post
        self.pool = _Pool(n + 1 + self.workers, job.pre.new_output)
        self.t_start = 0
        self._take_lock = threading.Lock()
        self._next_seq = 0
        self.held: dict[str, Item | None] = {}  # thread name -> the frame it has taken and not yet handed on
        self.pending: dict[int, Item] = {}  # post-processing: frames waiting for an earlier one, by seq

    def _waited(self, me: str, which: int, since: int) -> None:
        w = self.waits.get(me)
        if w is None:
            w = self.waits[me] = [0, 0]
        w[which] += clock() - since

    def _get(self, q: queue.Queue[Any], me: str = "") -> Any:
        try:
            return q.get_nowait()
        except queue.Empty:
            pass
        t = clock()
        try:
            while True:
                try:
                    return q.get(timeout=_POLL_S)
                except queue.Empty:
                    if self.job.stop.is_set():
                        return None
        finally:
            if me:
                self._waited(me, 0, t)

    def _put(self, q: queue.Queue[Any], item: Any, me: str = "") -> bool:
        try:
            q.put_nowait(item)
            return True
        except queue.Full:
            pass
        t = clock()
        try:
            while not self.job.stop.is_set():
                try:
                    q.put(item, timeout=_POLL_S)
                    return True
                except queue.Full:
                    continue
            return False
        finally:
            if me:
                self._waited(me, 1, t)

    def _offer(self, q: queue.Queue[Any], item: Item) -> None:
        """Realtime hand-over: never wait; a full queue loses its oldest frame to this newer one."""
        while True:
            try:
                q.put_nowait(item)
                return
            except queue.Full:
                try:
                    old = q.get_nowait()
                except queue.Empty:
                    continue
                self.job.drop(old, "busy", self.pool)

    def _forward(self, q: queue.Queue[Any], item: Item, me: str) -> bool:
        if self.job.realtime:
            self._offer(q, item)
            return True
        return self._put(q, item, me)

    # -- stages (each runs in its own thread; ``me`` is the thread's name) -----------------

    def decode(self, me: str) -> None:
        job, o, src = self.job, self.job.options, self.job.source
        paced = job.mode == "realtime"
        interval = int(1e9 / job.pace_fps) if paced and job.pace_fps else 0
        limit_ns = int(o.duration_s * 1e9) if o.duration_s is not None else None
        i = 0
        while not job.stop.is_set():
            if (o.max_frames is not None and i >= o.max_frames) or (
                limit_ns is not None and clock() - self.t_start >= limit_ns
            ):
                break
            job.current[me] = i
            capture = 0
            if paced:
                capture = self.t_start + i * interval
                now = clock()
                if now < capture:
                    if job.stop.wait((capture - now) / 1e9):
                        return
                    self._waited(me, 0, now)  # waiting for the source's next frame
                elif now >= capture + interval:  # the next frame is already due: this one is gone
                    if not src.skip():
                        job.source_ended = True
                        break
                    job.frames_in += 1
                    job.count_drop("behind")
                    i += 1
                    continue
            t = clock()
            try:
                frame = src.read()
            except UnreadableFrame as e:  # one corrupt image: count it, name it, go on with the next
                job.unreadable_frame(e)
                i += 1
                continue
            done = clock()
            if frame is None:
                job.source_ended = True
                break
            job.samples["decode"].append(done - t)
            item = job.item(i, frame, capture if paced else done)
            item.times[0] = done - t
            job.frames_in += 1
            self.held[me] = item
            if self.compact:  # this thread pre-processes it too
                self.doing[me] = "preprocess"
                if not self._prepare(item, me):
                    return
                self.doing[me] = "decode"
            elif not self._forward(self.q[0], item, me):
                return
            self.held[me] = None
            i += 1
        self._put(self.q[1 if self.compact else 0], _END)

    def preprocess(self, me: str) -> None:
        while (item := self._get(self.q[0], me)) is not None:
            if item is _END:
                self._put(self.q[1], _END)
                return
            self.job.current[me] = item.index
            self.held[me] = item
            if not self._prepare(item, me):
                return
            self.held[me] = None

    def _prepare(self, item: Item, me: str) -> bool:
        """Pre-process ``item`` into a pool buffer and hand it to inference; False when the run stops."""
        job = self.job
        t = clock()
        buf = self.pool.acquire(job.stop)
        if buf is None:
            return False
        self._waited(me, 1, t)
        t = clock()
        item.tensor, item.tf = job.pre(cast(np.ndarray, item.image), out=buf)
        item.times[1] = dt = clock() - t
        job.samples["preprocess"].append(dt)
        item.image = None
        return self._forward(self.q[1], item, me)

    def _take(self, me: str) -> Any:
        """The next frame for an inference worker, numbered in the order taken (= frame order)."""
        with self._take_lock:
            item = self._get(self.q[1], me)
            if item is _END:
                self.q[1].put(_END)  # leave it for the other workers
            elif item is not None:
                item.seq = self._next_seq
                self._next_seq += 1
            return item

    def _would_be_late(self, deadline: int, next_due: int | None = None) -> bool:
        """Past its deadline already, or the recent median inference + post-processing time says it will be
        and the next frame is already due (``next_due``, its capture time; None: unknown, taken as due).

        The prediction only drops a frame when a fresh one would make it (the recent medians of all
        four stages fit the budget): when even fresh frames miss, dropping on a prediction would
        drop them all, so they are processed and counted late instead. Nor does it drop a frame before the
        next one is captured: that drop frees inference for no other frame, it idles until the next one
        comes, and a median says the frame is late as often as it is wrong. With one core busy, the
        pipeline delivered 51-55% of its bound by such drops (issue #30).
        """
        now = clock()
        if now > deadline:
            return True
        if next_due is not None and now < next_due:
            return False
        samples = self.job.samples
        if any(len(v) < _RECENT for v in samples.values()):
            return False
        median = {k: sorted(islice(reversed(v), _RECENT))[_RECENT // 2] for k, v in samples.items()}
        remaining = median["infer"] + median["postprocess"]
        fresh = median["decode"] + median["preprocess"] + remaining
        return fresh < (self.job.budget_ns or 0) and now + remaining > deadline

    def infer(self, me: str, runner: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]) -> None:
        job = self.job
        infer, name = runner, job.input_name
        try:
            while (item := self._take(me)) is not None and item is not _END:
                job.current[me] = item.index
                self.held[me] = item
                if item.deadline is not None and self._would_be_late(item.deadline, item.capture + self.interval_ns):
                    job.drop(item, "late", self.pool)
                    item.dropped = True  # post-processing still hears of it, to keep the order
                else:
                    t = clock()
                    item.outputs = infer({name: item.tensor})
                    item.times[2] = dt = clock() - t
                    job.samples["infer"].append(dt)
                    self.pool.release(item.tensor)
                    item.tensor = None
                if self.compact:  # one worker: this thread post-processes, in frame order already
                    if not item.dropped:
                        self.doing[me] = "postprocess"
                        self._post_one(item, me)
                        self.doing[me] = "infer"
                elif not self._put(self.q[2], item, me):
                    return
                self.held[me] = None
        finally:
            if not self.compact:
                self._put(self.q[2], _END)  # one per worker

    def postprocess(self, me: str) -> None:
        job = self.job
        pending = self.pending
        next_seq, ended = 0, 0
        while ended < self.workers and (item := self._get(self.q[2], me)) is not None:
            if item is _END:
                ended += 1
                continue
            pending[item.seq] = item
            while next_seq in pending:  # workers finish out of order; results go out in frame order
                item = pending.pop(next_seq)
                next_seq += 1
                if item.dropped:
                    continue
                job.current[me] = item.index
                self.held[me] = item
                self._post_one(item, me)
                self.held[me] = None

    def _post_one(self, item: Item, me: str) -> None:
        job = self.job
        t = clock()
        # both set by then: tf by the pre-processing, outputs by inference
        result = job.post(cast(dict[str, Any], item.outputs), cast(LetterboxTransform, item.tf), item.hw)
        done = clock()
        item.times[3] = done - t
        job.samples["postprocess"].append(done - t)
        item.outputs = None
        job.finish(item, done)
        self.held[me] = None
        job.write(item, result, done)

    def count_abandoned(self) -> int:
        """Frames read but neither processed nor dropped: still held by a stage, queued, or waiting in
        post-processing for an earlier frame. Exact once every thread has ended."""
        left: list[Any] = [*self.held.values(), *self.pending.values()]
        for q in self.q:
            while True:
                try:
                    left.append(q.get_nowait())
                except queue.Empty:
                    break
        return sum(1 for x in left if isinstance(x, Item) and not x.dropped)

    # -- driver ----------------------------------------------------------------------------

    def run(self, progress: Progress | None) -> VideoReport:
        job = self.job
        bodies: list[tuple[str, str, Callable[..., None], tuple[Any, ...]]] = [("decode", "decode", self.decode, ())]
        if not self.compact:
            bodies.append(("preprocess", "preprocess", self.preprocess, ()))
        bodies += [
            ("infer", "infer" if self.workers == 1 else f"infer-{k}", self.infer, (r,))
            for k, r in enumerate(job.infers)
        ]
        if not self.compact:
            bodies.append(("postprocess", "postprocess", self.postprocess, ()))
        threads = []
        for stage, name, body, args in bodies:
            self.doing[name] = stage

            def target(
                stage: str = stage, name: str = name, body: Callable[..., None] = body, args: tuple[Any, ...] = args
            ) -> None:
                try:
                    body(name, *args)
                except BaseException as e:  # noqa: BLE001 - recorded with its stage and frame; the report carries it
                    job.fail(self.doing.get(name, stage), e, name)

            threads.append(threading.Thread(target=target, name=f"edgekit-video-{name}", daemon=True))
        total = expected_frames(job)
        interrupted = False
        self.t_start = clock()
        for t in threads:
            t.start()
        try:
            while any(t.is_alive() for t in threads):
                threads[-1].join(0.1)
                if progress is not None:
                    progress(job.frames_in, job.processed, sum(job.dropped.values()), total)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            job.stop.set()
            deadline = time.monotonic() + job.options.join_timeout_s
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
        t_end = clock()
        job.abandoned = self.count_abandoned()
        if progress is not None:
            progress(job.frames_in, job.processed, sum(job.dropped.values()), total)
        layout = {
            name: (["decode", "preprocess"] if self.compact and stage == "decode" else [])
            or (["infer", "postprocess"] if self.compact and stage == "infer" else [stage])
            for stage, name, _b, _a in bodies
        }
        waits = {name: {"input_ms": w[0] / 1e6, "output_ms": w[1] / 1e6} for name, w in self.waits.items()}
        return job.report(
            self.t_start,
            t_end,
            interrupted=interrupted,
            hung=[t.name for t in threads if t.is_alive()],
            threads=layout,
            waits=waits,
        )


def run_pipeline(
    bundle: Bundle, source: FrameSource, options: PipelineOptions | None = None, progress: Progress | None = None
) -> VideoReport:
    """Run ``bundle`` on every frame of ``source`` through the pipelined stages; the report accounts for each.

    A failing stage does not raise: the report's ``failure`` names the stage and frame, and
    ``report.raise_for_failure()`` raises it as a :class:`~edge.video.errors.PipelineError`.
    Ctrl-C ends the run cleanly with ``interrupted`` set.
    """
    options = options or PipelineOptions()
    mode = "live" if source.info.live else "realtime" if options.realtime else "offline"
    job = Job(bundle, source, options, mode)
    try:
        job.open()
        return _Pipeline(job).run(progress)
    finally:
        job.close()
