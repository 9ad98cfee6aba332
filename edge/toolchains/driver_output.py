"""Where a toolchain driver's output goes, shared by every ``*_driver.py`` (coreml, rknn, tflite, torch_onnx).

The drivers run standalone in their toolchain's Python, where edgekit is not installed, so this module imports
the standard library only; each driver loads it from its own directory (as ``tflite_driver`` loads
``tflite_compare``).
"""

from __future__ import annotations

import os
import sys
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
