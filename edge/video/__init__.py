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

from edge.video.errors import PipelineError, SourceError
from edge.video.job import PipelineOptions
from edge.video.pipeline import run_pipeline
from edge.video.postprocess import PostConfig, make_postprocessor
from edge.video.report import VideoReport
from edge.video.sequential import run_sequential
from edge.video.sources import FrameSource, open_agent_source, open_source, write_synthetic_clip

__all__ = [
    "FrameSource", "PipelineError", "PipelineOptions", "PostConfig", "SourceError", "VideoReport",
    "make_postprocessor", "open_agent_source", "open_source", "run_pipeline", "run_sequential", "write_synthetic_clip",
]
