"""Where a toolchain driver's output goes, shared by every ``*_driver.py`` (coreml, executorch, rknn, tflite,
torch_onnx): its JSON event stream and the log that takes everything else.

The drivers run standalone in their toolchain's Python, where edgekit is not installed, so this module imports
the standard library only; each driver loads it from its own directory (as ``tflite_driver`` loads
``tflite_compare``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import IO, Any


def redirect_output(work: Path) -> tuple[IO[str], IO[Any]]:
    """Events keep the original stdout; everything else printed goes to ``work/convert.log``.

    File descriptors 1 and 2 themselves are pointed at the log, so what C/C++ libraries write there (TensorFlow's
    logging, rknn-toolkit2) lands in it too, and the events stream stays one JSON object per line.
    Returns ``(events, log)``: the driver writes its events to the first and keeps both open for the run.
    """
    events = os.fdopen(os.dup(1), "w", buffering=1)
    log = open(work / "convert.log", "ab", buffering=0)  # noqa: SIM115 - open for the whole run
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    return events, log


class Events:
    """A driver's JSON events, one object per line with the seconds since the driver started: ``stream`` is set to
    the first of :func:`redirect_output`'s pair when the driver has its work directory."""

    def __init__(self) -> None:
        self.stream: Any = None
        self.start = time.time()

    def emit(self, event: str, **data: Any) -> None:
        self.stream.write(json.dumps({"event": event, "elapsed_s": round(time.time() - self.start, 2), **data}) + "\n")
        self.stream.flush()

    def stage(self, name: str) -> None:
        self.emit("stage", stage=name)
