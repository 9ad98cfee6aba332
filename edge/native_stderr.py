"""Catch what native code (LiteRT, OpenCV, FFmpeg) writes straight to file descriptor 2.

Such libraries log below Python's ``sys.stderr``; left alone, their lines turn a one-line user
error into several and interleave with edgekit's own output. Standard library only: runners and
video sources on a device use it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Redirect fd 2 into a temporary file for the block; the non-empty lines land in the yielded list.

    Where there is no descriptor 2 (an embedding host), nothing is caught and the list stays empty.
    """
    lines: list[str] = []
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield lines
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", "replace")
            lines.extend(line.strip() for line in text.splitlines() if line.strip())
