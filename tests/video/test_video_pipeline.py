"""The pipelined runner on real bundles and real video files: every frame accounted for, clean stops."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np
import pytest

from edge.bundle.bundle import Bundle
from edge.errors import EdgeError, ModelError
from edge.graph.samples import build_yolo_detector
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest
from edge.preprocess import Preprocessor
from edge.video import PipelineError, PipelineOptions, open_source, run_pipeline, run_sequential
from edge.video.sources import ImageDirSource, write_synthetic_clip

SMALL_DET = {"input_size": 128, "width": 8, "num_classes": 6}


def _video_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("edgekit-video-")]


@pytest.fixture(autouse=True)
def no_threads_left() -> object:
    yield
    assert _video_threads() == [], "pipeline threads outlived their run"


@pytest.fixture(scope="module")
def det_bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    d = tmp_path_factory.mktemp("det")
    model = build_yolo_detector(d / "det.onnx", **SMALL_DET)
    return convert(model, "x86-cpu", d / "det-cpu", ConvertRequest(preprocess="yolo", parity_samples=4))


@pytest.fixture(scope="module")
def cls_bundle(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return convert(
        models["tiny"], "x86-cpu", tmp_path_factory.mktemp("cls") / "tiny-cpu", ConvertRequest(parity_samples=4)
    )


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_clip(tmp_path_factory.mktemp("clip") / "clip.mp4", frames=30, width=160, height=120, fps=30)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_yolo_detector_builder(tmp_path: Path) -> None:
    a = build_yolo_detector(tmp_path / "a.onnx", **SMALL_DET)
    b = build_yolo_detector(tmp_path / "b.onnx", **SMALL_DET)
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()
    with pytest.raises(ValueError, match="multiple of 32"):
        build_yolo_detector(tmp_path / "c.onnx", input_size=100)


@pytest.mark.parametrize("threads", [4, 2])
def test_offline_detector_every_frame_in_order(det_bundle: Bundle, clip: Path, tmp_path: Path, threads: int) -> None:
    out = tmp_path / "det.jsonl"
    options = PipelineOptions(budget_ms=1000.0, budget_source="test", out=out, stage_threads=threads)
    with open_source(video=clip) as src:
        r = run_pipeline(det_bundle, src, options)
    assert (r.frames_in, r.processed, r.dropped_total, r.late, r.failure, r.hung_threads) == (30, 30, 0, 0, None, [])
    assert len(r.threads) == threads and sorted(s for v in r.threads.values() for s in v) == sorted(r.stages)
    assert set(r.waits) <= set(r.threads) and all(w["input_ms"] >= 0 for w in r.waits.values())
    assert r.mode == "offline" and r.verdict == "pass" and r.postprocess.startswith("detect")
    assert all(s is not None and s.count == 30 for s in r.stages.values())
    assert r.e2e is not None and r.e2e.count == 30 and r.effective_fps > 0 and r.bound_fps and r.bottleneck
    lines = _lines(out)
    assert [x["frame"] for x in lines] == list(range(30))
    assert lines[3]["t"] == pytest.approx(0.1, abs=1e-3) and lines[0]["latency_ms"] > 0
    boxes = [d["box"] for x in lines for d in x["detections"]]
    assert boxes, "the example detector finds some (meaningless) boxes"
    assert all(0 <= x1 <= x2 <= 160 and 0 <= y1 <= y2 <= 120 for x1, y1, x2, y2 in boxes)  # in the source frame
    j = r.to_json()
    assert j["frames"] == {
        "in": 30,
        "processed": 30,
        "dropped": 0,
        "dropped_by_reason": {"behind": 0, "busy": 0, "late": 0, "unreadable": 0},
        "abandoned": 0,
        "late": 0,
        "deadline_misses": 0,
        "declared": 30,
        "short_by": 0,
        "unreadable": [],
    }
    assert set(j["stages"]) == {"decode", "preprocess", "infer", "postprocess"} and json.dumps(j)


def test_pipeline_sequential_and_parallel_workers_give_the_same_results(
    det_bundle: Bundle, clip: Path, tmp_path: Path
) -> None:
    results = {}
    for name, run, workers in (("seq", run_sequential, 1), ("pipe", run_pipeline, 1), ("pipe2", run_pipeline, 2)):
        out = tmp_path / f"{name}.jsonl"
        with open_source(video=clip) as src:
            r = run(det_bundle, src, PipelineOptions(out=out, infer_workers=workers, queue_size=1))
        assert r.processed == 30 and r.infer_workers == workers and r.verdict == "no budget"
        results[name] = [{k: v for k, v in x.items() if k != "latency_ms"} for x in _lines(out)]
        policy = r.runner["details"]["threads_policy"]
        if workers == 1:  # the runner's own policy: the sequential loop reserves nothing, the pipeline its 3 stages
            assert policy["reserve"] == (0.0 if name == "seq" else 0.15)
            # not shared (idle, no reserve): onnxruntime's own defaults; shared: the policy's count
            assert policy["threads_from"] == ("policy" if policy["shared"] else "default"), policy
            assert policy["shared"] or name == "seq"
    assert results["seq"] == results["pipe"] == results["pipe2"]
    # two workers share the cores the thread policy leaves beside the pipeline's stages (edge.backends.threads)
    assert 1 <= r.runner["threads"] <= max(1, (os.cpu_count() or 1) // 2)
    assert r.runner["details"]["threads_policy"]["threads_from"] == "option"  # set for the workers by edge.video
    assert r.runner["details"]["threads_policy"]["reserve"] == 0.15  # decode, pre and post: 0.05 core each


def test_classifier_on_an_image_directory(cls_bundle: Bundle, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for i in range(4):
        cv2.imwrite(str(tmp_path / f"img{i}.png"), rng.integers(0, 256, (40 + i, 50, 3), dtype=np.uint8))
    out = tmp_path / "top.jsonl"
    with open_source(images=tmp_path) as src:
        r = run_pipeline(cls_bundle, src, PipelineOptions(out=out))
    lines = _lines(out)
    assert r.processed == 4 and [x["file"] for x in lines] == [f"img{i}.png" for i in range(4)]
    assert all(len(x["top_k"]) == 5 and x["t"] is None for x in lines)
    assert lines[0]["top_k"][0]["score"] >= lines[0]["top_k"][1]["score"]


def test_realtime_paces_at_the_source_rate(cls_bundle: Bundle) -> None:
    with open_source(synthetic="64x48", frames=20, fps=100) as src:
        t0 = time.perf_counter()
        r = run_pipeline(cls_bundle, src, PipelineOptions(realtime=True, budget_ms=1000.0))
        took = time.perf_counter() - t0
    assert r.mode == "realtime" and r.pace_fps == 100
    assert r.frames_in == 20 and r.processed + r.dropped_total == 20
    assert took >= 0.19 and r.duration_s >= 0.19  # 20 frames at 100 fps
    assert r.effective_fps <= 110


def test_realtime_drops_what_would_be_late_and_counts_it(det_bundle: Bundle) -> None:
    # a frame every 0.2 ms: far more than the pipeline can take, so most are dropped
    with open_source(synthetic="160x120", frames=400) as src:
        r = run_pipeline(det_bundle, src, PipelineOptions(realtime=True, source_fps=5000, budget_ms=20.0))
    assert r.frames_in == 400 and r.failure is None
    assert r.processed + r.dropped_total == 400  # every frame accounted for
    assert r.dropped_total > 100 and r.processed > 0
    assert r.deadline_misses == r.dropped_total + r.late
    assert r.verdict == "fail" and r.limit
    assert "does not hold 50 fps" in r.summary()


class _DiskFailsAt3(ImageDirSource):
    """An image directory whose storage fails (I/O error) on the fourth read: not one bad file but a dead source."""

    def read(self):  # type: ignore[no-untyped-def]
        if self._index == 3:
            raise OSError(5, "Input/output error", "03.png")
        return super().read()


def test_a_failing_decode_stage_stops_everything_with_frame_and_stage(cls_bundle: Bundle, tmp_path: Path) -> None:
    for i in range(6):
        cv2.imwrite(str(tmp_path / f"{i:02d}.png"), np.full((40, 40, 3), i * 20, np.uint8))
    with _DiskFailsAt3(tmp_path) as src:
        t0 = time.perf_counter()
        r = run_pipeline(cls_bundle, src, PipelineOptions(queue_size=1))
    assert time.perf_counter() - t0 < 60  # stops, does not hang (the bound only catches a hang)
    assert r.failure is not None and (r.failure["stage"], r.failure["frame"]) == ("decode", 3)
    assert "Input/output error" in r.failure["error"] and r.hung_threads == [] and r.verdict == "incomplete"
    assert r.processed <= 3
    with pytest.raises(PipelineError, match="stage 'decode' failed on frame 3: .*Input/output error") as e:
        r.raise_for_failure()
    assert isinstance(e.value, EdgeError) and e.value.stage == "decode" and e.value.frame == 3


@pytest.mark.parametrize("workers", [2, 1])  # 1: decode and pre-processing share a thread on a small host
def test_a_frame_that_cannot_be_letterboxed_stops_the_preprocess_stage(
    det_bundle: Bundle, tmp_path: Path, workers: int
) -> None:
    for i in range(5):
        cv2.imwrite(str(tmp_path / f"{i:02d}.png"), np.full((60, 80, 3), 100, np.uint8))
    cv2.imwrite(str(tmp_path / "02.png"), np.full((1, 400, 3), 100, np.uint8))  # 400x1: 0.3 px tall at 128
    out = tmp_path / "out.jsonl"
    with open_source(images=tmp_path) as src:
        r = run_pipeline(
            det_bundle, src, PipelineOptions(out=out, queue_size=1, infer_workers=workers, stage_threads=2)
        )
    assert r.failure is not None and (r.failure["stage"], r.failure["frame"]) == ("preprocess", 2)
    assert "cannot be letterboxed" in r.failure["error"] and r.hung_threads == []
    assert [x["frame"] for x in _lines(out)] == list(range(r.processed))
    assert "Traceback" in r.failure["traceback"]


def test_ctrl_c_ends_the_run_cleanly(cls_bundle: Bundle) -> None:
    # A shell starts background jobs with SIGINT ignored and Python then installs no KeyboardInterrupt
    # handler: under `cmd &` (nohup, some CI runners) the SIGINT below would do nothing. Ctrl-C is what is
    # tested, so the test installs Python's default handler for its duration.
    old_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    sent = []

    def progress(frames_in: int, processed: int, dropped: int, total: int | None) -> None:
        if processed >= 3 and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)

    try:
        with open_source(synthetic="64x48", frames=100000) as src:
            r = run_pipeline(cls_bundle, src, PipelineOptions(realtime=True, source_fps=200), progress)
    finally:
        signal.signal(signal.SIGINT, old_handler)
    assert sent and r.interrupted and r.failure is None and r.hung_threads == []
    # each counter is kept where it happens: frames_in by the decoder, processed by post-processing, dropped
    # where a frame is dropped, abandoned from the queues and stages after the threads ended
    assert 3 <= r.processed < 100000 and r.frames_in == r.processed + r.dropped_total + r.abandoned, r.to_json()
    assert r.to_json()["frames"]["abandoned"] == r.abandoned


@pytest.mark.parametrize(("threads", "in_flight"), [(4, 7), (2, 3)])
def test_frames_left_in_queues_at_a_stop_are_counted_abandoned(
    cls_bundle: Bundle, threads: int, in_flight: int
) -> None:
    # Post-processing blocks on its first frame until every stage and queue behind it is full, then fails:
    # the run stops with 7 frames in flight in four threads (queue_size 1: post-processing's own, one in each
    # of the three queues, one held by each of decode, pre-processing and inference), 3 in two (inference +
    # post-processing's own, one in the queue, one held by decode + pre-processing). None was processed or
    # dropped, so all must come back as abandoned, counted from where they were, not derived from the others.
    from edge.video.job import Job
    from edge.video.pipeline import _Pipeline

    release = threading.Event()
    with open_source(synthetic="64x48", frames=50) as src:
        job = Job(cls_bundle, src, PipelineOptions(queue_size=1, warmup=0, stage_threads=threads), "offline")
        job.open()
        try:

            class StuckPost:
                describe = job.post.describe

                def __call__(self, *args: object) -> object:
                    assert release.wait(60), "the test never released post-processing"
                    raise RuntimeError("post-processing gave up")

            job.post = StuckPost()  # type: ignore[assignment]
            pipe = _Pipeline(job)

            def release_when_full() -> None:
                deadline = time.monotonic() + 60
                queues = pipe.q if threads == 4 else pipe.q[1:2]
                while (
                    not (job.frames_in == in_flight and all(q.full() for q in queues)) and time.monotonic() < deadline
                ):
                    time.sleep(0.01)
                release.set()

            helper = threading.Thread(target=release_when_full)
            helper.start()
            r = pipe.run(None)
            helper.join(60)
        finally:
            job.close()
    assert r.failure is not None and r.failure["stage"] == "postprocess" and r.hung_threads == []
    assert len(r.threads) == threads
    assert (r.frames_in, r.processed, r.dropped_total, r.abandoned) == (in_flight, 0, 0, in_flight), r.to_json()


def test_bundles_that_video_frames_cannot_feed(models: dict[str, Path], tmp_path: Path) -> None:
    two = convert(models["two_input"], "x86-cpu", tmp_path / "two", ConvertRequest(parity_samples=2))
    no_pre = convert(models["tiny"], "x86-cpu", tmp_path / "nopre", ConvertRequest(preprocess="none", parity_samples=2))
    with open_source(synthetic="64x48", frames=2) as src:
        with pytest.raises(ModelError, match="2 inputs .*only feed a model with one image input"):
            run_pipeline(two, src)
        with pytest.raises(ModelError, match="no image input to feed frames to"):
            run_pipeline(no_pre, src)


def test_option_checks(cls_bundle: Bundle, tmp_path: Path) -> None:
    for bad in ({"queue_size": 0}, {"infer_workers": 0}, {"max_frames": 0}, {"duration_s": 0}, {"source_fps": -1}):
        with pytest.raises(EdgeError):
            PipelineOptions(**bad)  # type: ignore[arg-type]
    (tmp_path / "img.png").write_bytes(cv2.imencode(".png", np.zeros((8, 8, 3), np.uint8))[1].tobytes())
    with open_source(images=tmp_path) as src:
        with pytest.raises(EdgeError, match="--realtime needs a frame rate"):
            run_pipeline(cls_bundle, src, PipelineOptions(realtime=True))
        with pytest.raises(EdgeError, match="is a directory"):
            run_pipeline(cls_bundle, src, PipelineOptions(out=tmp_path))
        with pytest.raises(EdgeError, match="offline only"):
            run_sequential(cls_bundle, src, PipelineOptions(realtime=True, source_fps=10))


def test_would_be_late_predicts_from_recent_stage_times(cls_bundle: Bundle, monkeypatch: pytest.MonkeyPatch) -> None:
    from edge.video import pipeline
    from edge.video.job import Job

    ms = 1_000_000
    now = 10**12
    monkeypatch.setattr(pipeline, "clock", lambda: now)  # a clock that stands still: exact boundaries, no timing luck
    with open_source(synthetic="64x48", frames=1) as src:
        job = Job(cls_bundle, src, PipelineOptions(realtime=True, source_fps=30, budget_ms=10.0), "realtime")
        pipe = pipeline._Pipeline(job)
        assert pipe._would_be_late(now - 1)  # already past its deadline
        assert not pipe._would_be_late(now)
        assert not pipe._would_be_late(now + ms)  # no history yet: no prediction
        for stage, t in (("decode", 1), ("preprocess", 1), ("infer", 4), ("postprocess", 1)):
            job.samples[stage].extend([t * ms] * 15)
        assert pipe._would_be_late(now + 3 * ms)  # 5 ms of infer + post expected, 3 ms left
        # ... but not before the next frame is captured: the drop would free inference for no frame
        assert not pipe._would_be_late(now + 3 * ms, next_due=now + 1)
        assert pipe._would_be_late(now + 3 * ms, next_due=now)  # the next one is due: make way for it
        assert pipe._would_be_late(now - 1, next_due=now + ms)  # past its deadline: dropped all the same
        assert pipe._would_be_late(now + 5 * ms - 1)  # the boundary: 1 ns short
        assert not pipe._would_be_late(now + 5 * ms)  # exactly enough
        assert not pipe._would_be_late(now + 8 * ms)
        job.samples["infer"].extend([8 * ms] * 15)  # 1 + 1 + 8 + 1 ms: now even a fresh frame misses 10 ms,
        assert not pipe._would_be_late(now + 3 * ms)  # so process it late rather than drop every frame
        assert pipe._would_be_late(now - 1)


@pytest.mark.corpus_full  # a TFLite conversion: 30 s to 4 min on 2 shared cores
def test_a_litert_bundle_is_fed_nhwc_frames_as_it_takes_them(clip: Path, tmp_path: Path) -> None:
    # the letterbox makes HWC pixels and the .tflite takes NHWC: the pipeline pre-processes straight into its
    # layout (no NCHW planes, no copy back to NHWC in the runner) and the results are those of the NCHW path
    from edge.toolchains import status

    pytest.importorskip("ai_edge_litert", reason="ai-edge-litert is not installed (pip install 'edgekit-ml[litert]')")
    if not status("tflite").usable:
        pytest.skip(f"needs the tflite toolchain: {status('tflite').problem}")
    model = build_yolo_detector(tmp_path / "det.onnx", **SMALL_DET)
    b = convert(model, "arm-xnnpack", tmp_path / "det-tfl", ConvertRequest(preprocess="yolo", parity_samples=2))
    out = tmp_path / "det.jsonl"
    with open_source(video=clip) as src:
        r = run_pipeline(b, src, PipelineOptions(out=out, max_frames=5))
    assert r.native_input and r.processed == 5 and r.failure is None, r.to_json()
    frame = np.random.default_rng(0).integers(0, 255, (120, 160, 3), dtype=np.uint8)
    spec = b.preprocess
    assert spec is not None and spec.layout == "NCHW"
    nchw, _ = Preprocessor(spec, src_color="BGR")(frame)
    nhwc, _ = Preprocessor(replace(spec, layout="NHWC"), src_color="BGR")(frame)
    with b.open_runner() as runner:
        want, got = runner.infer({spec.input: nchw}), runner.infer_from_native({spec.input: nhwc})
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)
