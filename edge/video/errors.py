"""Errors of the video path: a source that cannot deliver frames, a pipeline stage that failed."""

from __future__ import annotations

from edge.errors import EdgeError, InputFileError


class SourceError(InputFileError):
    """A video file, camera or image directory that cannot be opened or read."""


class UnreadableFrame(SourceError):
    """One frame of a source cannot be decoded (a corrupt image in a directory). The source has moved
    past it: the next ``read`` goes on with the frame after, and the runners count this one as dropped."""

    def __init__(self, index: int, name: str, message: str) -> None:
        self.index, self.name = index, name
        super().__init__(message)


class PipelineError(EdgeError):
    """A stage of the video pipeline failed; names the stage and the frame it was working on."""

    def __init__(self, stage: str, frame: int | None, cause: BaseException) -> None:
        self.stage = stage
        self.frame = frame
        self.cause = cause
        where = f"on frame {frame}" if frame is not None else "before its first frame"
        detail = cause.message if isinstance(cause, EdgeError) else f"{type(cause).__name__}: {cause}"
        hint = cause.hint if isinstance(cause, EdgeError) else None
        super().__init__(f"the pipeline stopped: stage '{stage}' failed {where}: {detail}", hint=hint)
