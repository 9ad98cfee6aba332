"""Frame sources for the agent: what the bundle's runner is fed.

``synthetic`` (default): random inputs of the runner's own shapes and dtypes (the same
generator as ``edgekit bench``), paced at ``fps``. ``none``: the model is not run at all
(health telemetry only; the runtime is never imported). ``video:PATH`` and ``camera:N`` come
from the video pipeline: the agent calls ``edge.video.open_agent_source`` and refuses them
with a clear message while that does not exist. Its contract::

    open_agent_source(kind: "video" | "camera", arg: str, *, bundle: Bundle, runner: Runner,
                      fps: float | None) -> source
    source.frames(stop: threading.Event) -> Iterator[dict[str, np.ndarray]]  # feeds for runner.infer, paced
    source.description: str; source.dropped: int (frames skipped); source.close()
"""

from __future__ import annotations

import importlib.util
import threading
import time
from typing import Any, Iterator, Mapping

from edge.errors import EdgeError

SOURCE_KINDS = ("synthetic", "none", "video", "camera")


def parse_source(spec: str) -> tuple[str, str]:
    kind, _, arg = spec.partition(":")
    if kind not in SOURCE_KINDS:
        raise EdgeError(f"unknown frame source {spec!r}", hint="use synthetic, none, video:PATH or camera:N")
    if kind in ("video", "camera"):
        if not arg:
            raise EdgeError(f"frame source {spec!r} needs an argument", hint=f"e.g. {kind}:{'clip.mp4' if kind == 'video' else '0'}")
        if _video_hook() is None:
            raise EdgeError(f"the {kind} source is not available in this edgekit yet (the agent takes frames from "
                            "the video pipeline's edge.video.open_agent_source, which this install lacks)",
                            hint="use --source synthetic to run the model on generated frames")
    elif arg:
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

    def frames(self, stop: threading.Event) -> Iterator[Mapping[str, Any]]:
        period = 1.0 / self.fps
        due = time.monotonic()
        i = 0
        while not stop.is_set():
            now = time.monotonic()
            if now < due:
                if stop.wait(due - now):
                    return
            elif now - due > period:  # fell behind by more than a frame: skip, as a camera would
                missed = int((now - due) / period)
                self.dropped += missed
                due += missed * period
            yield self._feeds[i % len(self._feeds)]
            i += 1
            due += period

    def close(self) -> None:
        self._feeds = []


def _video_hook() -> Any:
    if importlib.util.find_spec("edge.video") is None:
        return None
    try:
        import edge.video
    except ImportError:
        return None
    return getattr(edge.video, "open_agent_source", None)


def open_source(spec: str, *, bundle: Any, runner: Any, fps: float) -> Any:
    kind, arg = parse_source(spec)
    if kind == "synthetic":
        return SyntheticSource(runner, fps)
    if kind == "none":
        return None
    return _video_hook()(kind, arg, bundle=bundle, runner=runner, fps=fps)
