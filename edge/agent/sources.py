"""Frame sources for the agent: what the bundle's runner is fed, and what a frame's latency covers.

``synthetic`` (default): random inputs of the runner's own shapes and dtypes (the same
generator as ``edgekit bench``), paced at ``fps``; a frame's latency is the inference alone.
``none``: the model is not run at all (health telemetry only; the runtime is never imported).
``app`` / ``app:SOCKET``: the application runs the model and reports its frames to the agent over a
Unix datagram socket (``edge.agent.appsocket``; default ``<store>/agent/app.sock``); the agent runs
no model either.
``video:FILE``, ``camera:N`` and ``images:DIR``: the application's workload through
``edge.video`` (its sources, the bundle's ``Preprocessor`` and the post-processor ``edgekit
run`` uses), from ``edge.video.open_agent_source``; a frame's latency is the application's:
decode, pre-processing, inference and post-processing. The contract::

    open_agent_source(kind: "video" | "camera" | "images", arg: str, *, bundle: Bundle, runner: Runner,
                      fps: float | None) -> source
    source.frames(stop: threading.Event) -> Iterator[AgentFrame]  # paced
    source.description: str; source.dropped: int (frames skipped); source.close()

An ``AgentFrame`` is ``(feeds, started_ns, finish)``: the runner's inputs, when the frame's
latency starts (``time.perf_counter_ns``), and what runs on the outputs (None: nothing).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

from edge.errors import EdgeError
from edge.video.frames import AgentFrame, paced  # noqa: F401 - AgentFrame: the sources' contract

SOURCE_KINDS = ("synthetic", "none", "app", "video", "camera", "images")
_ARG_EXAMPLE = {"video": "clip.mp4", "camera": "0", "images": "frames/"}


def parse_source(spec: str) -> tuple[str, str]:
    kind, _, arg = spec.partition(":")
    if kind not in SOURCE_KINDS:
        raise EdgeError(
            f"unknown frame source {spec!r}",
            hint="use synthetic, none, app[:SOCKET], video:FILE, camera:N or images:DIR",
        )
    if kind in _ARG_EXAMPLE:
        if not arg:
            raise EdgeError(f"frame source {spec!r} needs an argument", hint=f"e.g. {kind}:{_ARG_EXAMPLE[kind]}")
        if kind == "camera" and not arg.isdigit():
            raise EdgeError(f"frame source {spec!r}: the camera is a number (/dev/videoN)", hint="e.g. camera:0")
    elif arg and kind != "app":
        raise EdgeError(f"frame source {kind!r} takes no argument, got {spec!r}")
    return kind, arg


class SyntheticSource:
    """Random feeds for the runner's inputs, paced at ``fps``; late frames are skipped and counted."""

    def __init__(self, runner: Any, fps: float, *, seed: int = 0, pool: int = 4) -> None:
        from edge.bench import random_feeds

        if fps <= 0:
            raise EdgeError(f"--fps must be > 0, got {fps}")
        self.fps = fps
        self.description = f"synthetic at {fps:g} fps"
        self._feeds = [random_feeds(runner, seed=seed + i) for i in range(pool)]
        self.dropped = 0

    def frames(self, stop: threading.Event) -> Iterator[AgentFrame]:
        for i in paced(self.fps, stop, self):
            yield AgentFrame(self._feeds[i % len(self._feeds)], time.perf_counter_ns())

    def close(self) -> None:
        self._feeds = []


def open_source(spec: str, *, bundle: Any, runner: Any, fps: float) -> Any:
    kind, arg = parse_source(spec)
    if kind == "synthetic":
        return SyntheticSource(runner, fps)
    if kind in ("none", "app"):
        return None
    from edge.video.sources import open_agent_source  # OpenCV and the pre/post-processing only for these sources

    return open_agent_source(kind, arg, bundle=bundle, runner=runner, fps=fps)
