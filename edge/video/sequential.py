"""The sequential baseline: read, pre-process, infer, post-process, repeat, in one thread.

Counted and reported exactly like the pipeline (same ``Job``), so the two compare directly.
"""

from __future__ import annotations

from edge.bundle.bundle import Bundle
from edge.errors import EdgeError
from edge.video.errors import UnreadableFrame
from edge.video.job import Job, PipelineOptions, Progress, clock, expected_frames
from edge.video.report import STAGES, VideoReport
from edge.video.sources import FrameSource


def run_sequential(
    bundle: Bundle, source: FrameSource, options: PipelineOptions | None = None, progress: Progress | None = None
) -> VideoReport:
    """The plain loop (read, pre-process, infer, post-process, repeat): the pipeline's baseline."""
    options = options or PipelineOptions()
    if options.realtime or source.info.live:
        raise EdgeError("the sequential loop runs offline only (no --realtime, no camera)")
    job = Job(bundle, source, options, "sequential")
    total = expected_frames(job)
    try:
        job.open()
        pre, post, infer, name = job.pre, job.post, job.infers[0], job.input_name
        buf = pre.new_output()
        stage = "decode"
        interrupted = False
        t_start = clock()
        try:
            i = 0
            while options.max_frames is None or i < options.max_frames:
                if options.duration_s is not None and clock() - t_start >= options.duration_s * 1e9:
                    break
                for k in STAGES:
                    job.current[k] = i  # the loop is every stage at once
                stage = "decode"
                t0 = clock()
                try:
                    frame = source.read()
                except UnreadableFrame as e:  # one corrupt image: counted and named, the loop goes on
                    job.unreadable_frame(e)
                    i += 1
                    continue
                t1 = clock()
                if frame is None:
                    job.source_ended = True
                    break
                item = job.item(i, frame, t1)
                job.frames_in += 1
                stage = "preprocess"
                x, tf = pre(frame.image, out=buf)
                t2 = clock()
                stage = "infer"
                outputs = infer({name: x})
                t3 = clock()
                stage = "postprocess"
                result = post(outputs, tf, item.hw)
                t4 = clock()
                item.times = [t1 - t0, t2 - t1, t3 - t2, t4 - t3]
                for k, v in zip(STAGES, item.times):
                    job.samples[k].append(v)
                job.finish(item, t4)
                job.write(item, result, t4)
                i += 1
                if progress is not None and i % 10 == 0:
                    progress(job.frames_in, job.processed, 0, total)
        except KeyboardInterrupt:
            interrupted = True
        except Exception as e:  # noqa: BLE001 - reported like a pipeline stage failure
            job.fail(stage, e)
        t_end = clock()
        if progress is not None:
            progress(job.frames_in, job.processed, 0, total)
        return job.report(t_start, t_end, interrupted=interrupted)
    finally:
        job.close()
