"""The agent's real workload (video:/camera:/images: through edge.video) and its lean entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from edge.agent.agent import Agent, AgentConfig
from edge.bundle.bundle import Bundle
from edge.deploy import DeviceStore
from edge.mqtt.client import BrokerConfig
from edge.mqtt.netloop import Backoff
from edge.pipeline import convert
from tests.support.cli import REPO, wait_for


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory, models: dict[str, Path]) -> Bundle:
    return convert(models["tiny"], "x86-cpu", tmp_path_factory.mktemp("src") / "tiny")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cv2 = pytest.importorskip("cv2", reason="OpenCV is not installed (pip install 'edgekit-ml[video]')")
    import numpy as np

    d = tmp_path_factory.mktemp("frames")
    rng = np.random.default_rng(0)
    for i in range(4):
        cv2.imwrite(str(d / f"{i:03d}.png"), rng.integers(0, 255, (48, 64, 3), dtype=np.uint8))
    return d


def test_images_source_feeds_preprocessed_frames_and_post_processes(tiny: Bundle, images: Path) -> None:
    from edge.video import open_agent_source

    src = open_agent_source("images", str(images), bundle=tiny, fps=200.0)
    stop = threading.Event()
    got = []
    with tiny.open_runner() as runner:
        for frame in src.frames(stop):
            assert set(frame.feeds) == {"input"} and frame.feeds["input"].shape == (1, 3, 32, 32)
            assert frame.finish is not None and frame.started_ns <= time.perf_counter_ns()
            got.append(frame.finish(runner.infer(frame.feeds)))
            if len(got) == 6:
                stop.set()
    src.close()
    assert all("top_k" in r for r in got)  # the post-processor `edgekit run` picks for a classifier
    assert src.restarts == 1  # 4 images, 6 frames: the directory starts over


def test_video_source_loops_the_file(tmp_path: Path, tiny: Bundle) -> None:
    pytest.importorskip("cv2", reason="OpenCV is not installed (pip install 'edgekit-ml[video]')")
    from edge.video import open_agent_source, write_synthetic_clip

    clip = write_synthetic_clip(tmp_path / "clip.mp4", frames=5, width=64, height=48, fps=30)
    src = open_agent_source("video", str(clip), bundle=tiny, fps=500.0)
    stop = threading.Event()
    n = 0
    for _ in src.frames(stop):
        n += 1
        if n == 12:
            stop.set()
    src.close()
    assert src.restarts >= 2 and "video" in src.description


def test_missing_video_file_is_one_clear_error(tiny: Bundle) -> None:
    pytest.importorskip("cv2", reason="OpenCV is not installed (pip install 'edgekit-ml[video]')")
    from edge.errors import EdgeError
    from edge.video import open_agent_source

    with pytest.raises(EdgeError, match="nope.mp4"):
        open_agent_source("video", "/nonexistent/nope.mp4", bundle=tiny, fps=30.0)


def test_agent_reports_the_applications_latency_on_images(
    tmp_path: Path, broker: Any, tiny: Bundle, images: Path
) -> None:
    store = tmp_path / "store"
    DeviceStore(store).install(tiny)
    cfg = AgentConfig(
        fleet="lab",
        device_id="cam-01",
        broker=BrokerConfig.from_url(broker.url),
        store=store,
        source=f"images:{images}",
        fps=50.0,
        interval_s=0.5,
        backoff=Backoff(0.05, 0.5),
        runner_options={"intra_op_num_threads": 1},
        desired=False,
        poll_current_s=0,
    )
    agent = Agent(cfg).start()
    try:
        assert agent.state == "running" and agent._source_desc.startswith("images ")
        wait_for(lambda: agent.worker is not None and agent.worker.total > 10, 20, "frames through the workload")
        assert agent.worker.error is None
        assert agent.worker.source.restarts >= 1
        body = agent.birth_body()
        assert body["agent"]["source"].startswith("images ")
    finally:
        agent.stop(5)


# -- the lean entry point ----------------------------------------------------------------------------


def _py(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, env=env, cwd=REPO, **kw)


def test_lean_entry_point_imports_no_cli_and_no_numpy() -> None:
    out = _py(
        "-c",
        "import sys, edge.agent.main, edge.agent.agent, edge.agent.apply, edge.agent.download; "
        "print([m for m in ('typer', 'rich', 'click', 'numpy', 'edge.cli') if m in sys.modules])",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_lean_entry_point_user_errors_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    base = ["-m", "edge.agent", "--broker", "mqtt://127.0.0.1:9", "--store", str(tmp_path / "store")]
    for args, needle in (
        (["--device-id", "cam/01"], "contains '/'"),
        (["--device-id", "cam-01", "--source", "webcam"], "unknown frame source"),
        (["--device-id", "cam-01", "--broker", "tcp://x"], "bad broker address"),
    ):
        p = _py(*base, *args)
        assert p.returncode == 2, p.stderr
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and needle in lines[0] and "Traceback" not in p.stderr


def test_lean_entry_point_runs_and_stops(tmp_path: Path, broker: Any) -> None:
    store = tmp_path / "store"
    store.mkdir()
    p = _py(
        "-m",
        "edge.agent",
        "--device-id",
        "cam-01",
        "--fleet",
        "lab",
        "--broker",
        broker.url,
        "--store",
        str(store),
        "--source",
        "none",
        "--interval",
        "0.5",
        "--duration",
        "1.5",
        "--json",
        "--log-level",
        "warning",
    )
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["device"] == "cam-01" and summary["births"] >= 1 and summary["outbox_flushed"] in (True, False)
