"""Video-frame inference: sources, a pipelined runner that accounts for every frame, and its report.

    from edge.bundle.bundle import Bundle
    from edge.video import PipelineOptions, open_source, run_pipeline

    with open_source(video="clip.mp4") as source:
        report = run_pipeline(Bundle.open("build/det-cpu"), source, PipelineOptions(budget_ms=1000 / 60))
    print(report.verdict, report.effective_fps)

Decode, pre-processing, inference and post-processing run in their own threads joined by
bounded queues (the runtimes, OpenCV and numpy release the GIL in their heavy loops). OpenCV
is imported only by the sources that need it (``pip install 'edgekit-ml[video]'``).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_LAZY = {
    "PipelineError": "errors",
    "SourceError": "errors",
    "PipelineOptions": "job",
    "run_pipeline": "pipeline",
    "PostConfig": "postprocess",
    "make_postprocessor": "postprocess",
    "VideoReport": "report",
    "run_sequential": "sequential",
    "FrameSource": "sources",
    "open_agent_source": "sources",
    "open_source": "sources",
    "write_synthetic_clip": "sources",
}


def __getattr__(name: str) -> Any:  # PEP 562: importing edge.video.frames (the agent) pulls no numpy
    if name in _LAZY:
        return getattr(import_module(f"edge.video.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'edge.video' has no attribute {name!r}")


__all__ = [
    "FrameSource",
    "PipelineError",
    "PipelineOptions",
    "PostConfig",
    "SourceError",
    "VideoReport",
    "make_postprocessor",
    "open_agent_source",
    "open_source",
    "run_pipeline",
    "run_sequential",
    "write_synthetic_clip",
]
