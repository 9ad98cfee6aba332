"""`edgekit run` as a user runs it (real console script, real files), and the report's verdict rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from edge.graph.samples import build_yolo_detector
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest
from edge.stats import LatencyStats
from edge.video.report import VideoReport
from edge.video.sources import write_synthetic_clip
from tests.support.cli import assert_user_error, run_cli


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, models: dict[str, Path]) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cli")
    det = build_yolo_detector(d / "det.onnx", input_size=128, width=8, num_classes=6)
    convert(det, "x86-cpu", d / "det-cpu", ConvertRequest(preprocess="yolo", parity_samples=4))
    convert(models["two_input"], "x86-cpu", d / "two-cpu", ConvertRequest(parity_samples=2))
    write_synthetic_clip(d / "clip.mp4", frames=20, width=160, height=120, fps=30)
    bad = d / "bad"
    bad.mkdir()
    cv2.imwrite(str(bad / "0.png"), np.zeros((30, 40, 3), np.uint8))
    (bad / "1.png").write_bytes(b"not a png")
    return {"det": d / "det-cpu", "two": d / "two-cpu", "clip": d / "clip.mp4", "bad": bad, "dir": d}


def test_run_json_and_jsonl(files: dict[str, Path]) -> None:
    out = files["dir"] / "detections.jsonl"
    # 10 s a frame: no host misses it (offline: 0.1 fps throughput and a p99 service time under 10 s),
    # so the verdict must be pass and the exit code 0
    p = run_cli(
        "run", str(files["det"]), "--video", str(files["clip"]), "--budget-ms", "10000", "--out", str(out), "--json"
    )
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    r = json.loads(p.stdout)
    assert r["frames"]["in"] == r["frames"]["processed"] == 20 and r["mode"] == "offline"
    assert r["frames"]["dropped"] == r["frames"]["abandoned"] == r["frames"]["late"] == 0
    assert r["budget_ms"] == 10000 and r["budget_source"] == "10000 ms"
    assert r["verdict"] == "pass" and r["limit"] is None and r["stages"]["infer"]["count"] == 20
    assert r["summary"].startswith("holds 0.1 fps (10000.00 ms a frame) in real time on this host"), r["summary"]
    # a budget no host can hold: verdict fail and exit code 1 (the `edgekit bench` convention)
    p = run_cli("run", str(files["det"]), "--video", str(files["clip"]), "--budget-ms", "0.000001", "--json")
    assert p.returncode == 1, (p.stdout[-2000:], p.stderr[-2000:])
    r = json.loads(p.stdout)
    assert r["verdict"] == "fail" and r["limit"] and r["summary"].startswith("does not hold"), r["summary"]
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["frame"] for x in lines] == list(range(20)) and all("detections" in x for x in lines)


def test_run_table_realtime(files: dict[str, Path]) -> None:
    # fed at 5 fps (200 ms between frames) with a 10 s budget: a frame is dropped only if the decoder falls
    # 200 ms behind or two workers stay busy for 200 ms, which not even a loaded host does; so it passes
    p = run_cli(
        "run",
        str(files["det"]),
        "--video",
        str(files["clip"]),
        "--realtime",
        "--source-fps",
        "5",
        "--budget-ms",
        "10000",
        "--infer-workers",
        "2",
    )
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-2000:])
    for needle in (
        "realtime: fed at 5 fps",
        "2 inference workers",
        "frames",
        "in 20, processed 20, dropped 0",
        "per stage",
        "postprocess",
        "threads (waiting)",
        "host",
        "0 deadline misses of 20 frames",
        "pass: holds 0.1 fps (10000.00 ms a frame) in real time on this host",
    ):
        assert needle in p.stdout, (needle, p.stdout)
    verdict = next(line for line in p.stdout.splitlines() if " verdict " in line)
    assert "pass: holds" in verdict and "fail" not in verdict, verdict


def test_missing_camera_video_and_source_errors(files: dict[str, Path]) -> None:
    if any(Path("/dev").glob("video*")):
        pytest.skip(
            "hardware: camera present: this host has a camera device; the missing-camera error needs a host without one"
        )
    assert_user_error(
        run_cli("run", str(files["det"]), "--camera", "0"), "camera 0 does not exist", "there is no /dev/video0"
    )
    assert_user_error(run_cli("run", str(files["det"]), "--video", str(files["dir"] / "nope.mp4")), "does not exist")
    assert_user_error(run_cli("run", str(files["det"])), "give exactly one source")


def test_unreadable_image_and_unusable_bundle(files: dict[str, Path]) -> None:
    # an image that does not decode is one dropped frame (named), not the end of the run; half the
    # source lost makes the verdict "incomplete", exit code 1
    p = run_cli("run", str(files["det"]), "--images", str(files["bad"]), "--json")
    assert p.returncode == 1 and "Traceback" not in p.stderr, (p.returncode, p.stderr)
    r = json.loads(p.stdout)
    assert r["failure"] is None and r["verdict"] == "incomplete", r
    assert r["frames"]["in"] == 2 and r["frames"]["processed"] == 1 and r["frames"]["dropped"] == 1
    assert r["frames"]["dropped_by_reason"]["unreadable"] == 1 and r["frames"]["unreadable"] == ["frame 1 (1.png)"]
    assert "1.png" in p.stderr and "unreadable" in p.stderr  # logged as it happens
    assert_user_error(
        run_cli("run", str(files["two"]), "--synthetic", "64x48", "-n", "3"), "only feed a model with one image input"
    )


# -- verdict rules (no model needed) -------------------------------------------------------


def _stats(p50: float, p99: float | None = None) -> LatencyStats:
    p99 = p99 if p99 is not None else p50
    return LatencyStats(count=100, p50_ms=p50, p90_ms=p50, p99_ms=p99, max_ms=p99, min_ms=p50, mean_ms=p50, std_ms=0.1)


def _report(**kw: Any) -> VideoReport:
    base: dict[str, Any] = dict(
        bundle="b",
        target="x86-cpu",
        source={},
        mode="offline",
        pace_fps=None,
        budget_ms=1000 / 60,
        budget_source="60 fps",
        frames_in=100,
        processed=100,
        dropped={"behind": 0, "busy": 0, "late": 0},
        late=0,
        stages={"decode": _stats(1), "preprocess": _stats(1), "infer": _stats(8), "postprocess": _stats(0.5)},
        e2e=_stats(12, 14),
        service=_stats(10.5, 12),
        duration_s=1.0,
        load_ms=5,
        runner={},
        postprocess="detect",
        queue_size=2,
        cpus=2,
        load_avg=None,
    )
    base.update(kw)
    return VideoReport(**base)


def test_offline_verdicts() -> None:
    r = _report(processed=100, duration_s=1.0)  # 100 fps, service p99 12 ms
    assert r.verdict == "pass" and r.limit is None and r.bottleneck == "infer"
    assert r.bound_fps == pytest.approx(125) and r.pct_of_bound == pytest.approx(80)
    assert r.summary().startswith("holds 60 fps (16.67 ms a frame) in real time on this host (predicted")
    slow = _report(
        duration_s=2.0,
        stages={"decode": _stats(1), "preprocess": _stats(1), "infer": _stats(20), "postprocess": _stats(1)},
    )
    assert slow.verdict == "fail"
    assert slow.limit == "stage infer: median 20.00 ms a frame (50.0 fps), too slow for 60 fps"
    cpu = _report(duration_s=2.0)  # 50 fps although no stage is over 16.67 ms
    assert cpu.limit.startswith("CPU: no stage alone is too slow for 60 fps")
    assert "10.50 ms of work a frame on 2 CPU(s)" in cpu.limit
    lat = _report(service=_stats(15, 30))
    assert lat.verdict == "fail" and lat.limit.startswith("latency: service p99 30.00 ms")
    two = _report(infer_workers=2)
    assert two.bound_fps == pytest.approx(250) and two.bottleneck == "infer"  # 2 workers / 8 ms each
    seq = _report(mode="sequential")
    assert seq.bound_fps == pytest.approx(1000 / 10.5)
    assert _report(budget_ms=None).verdict == "no budget"
    assert _report(failure={"stage": "infer", "frame": 4, "error": "boom"}).verdict == "incomplete"


def test_realtime_verdicts() -> None:
    ok = _report(mode="realtime", pace_fps=60, late=1)
    assert ok.verdict == "pass" and ok.deadline_misses == 1  # 1% of the frames may miss (the p99 rule)
    dropped = _report(mode="realtime", pace_fps=60, processed=90, dropped={"behind": 0, "busy": 8, "late": 2})
    assert dropped.verdict == "fail" and dropped.deadline_misses == 10 and dropped.limit.startswith("CPU")
    late = _report(mode="realtime", pace_fps=60, late=5, e2e=_stats(15, 20))
    assert late.limit.startswith("latency: end-to-end p99 20.00 ms")
    flood = _report(mode="realtime", pace_fps=500, processed=50, dropped={"behind": 0, "busy": 50, "late": 0})
    assert flood.limit == "stage infer: median 8.00 ms a frame (125.0 fps), too slow for 500 fps"
    slow_source = _report(mode="realtime", pace_fps=30)
    assert "below the target" in slow_source.summary() and "--source-fps 60" in slow_source.summary()
    j = dropped.to_json()
    assert j["frames"]["dropped"] == 10 and j["frames"]["dropped_by_reason"]["busy"] == 8 and json.dumps(j)


def test_bound_counts_the_stages_that_share_a_thread_and_the_pace() -> None:
    two = {"decode": ["decode", "preprocess"], "infer": ["infer", "postprocess"]}
    r = _report(threads=two)  # infer 8 + post 0.5 ms in one thread: 117.6 fps, not infer's 125
    assert r.bound_fps == pytest.approx(1000 / 8.5) and r.bottleneck == "infer"
    assert _report(threads=two, stages={**r.stages, "decode": _stats(9)}).bottleneck == "decode"
    slow = _report(threads=two, mode="realtime", pace_fps=150, dropped={"behind": 0, "busy": 30, "late": 0})
    assert slow.limit == "thread infer+postprocess: median 8.50 ms a frame (117.6 fps), too slow for 150 fps"
    # frames cannot be delivered faster than the source paces them: the bound is at most the pace
    paced = _report(mode="realtime", pace_fps=60, processed=60, duration_s=1.0)
    assert paced.bound_fps == pytest.approx(60) and paced.pct_of_bound == pytest.approx(100)
    assert _report(mode="realtime", pace_fps=200).bound_fps == pytest.approx(125)
    assert _report().to_json()["threads"] == {} and _report(waits={"infer": {"input_ms": 1.0, "output_ms": 0.0}})
