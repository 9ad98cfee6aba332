"""File hashing shared by the bundle writer, the stores, the tuner and the device (a base helper, not a wing's)."""

from __future__ import annotations

import hashlib
import os


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """The sha256 hex digest of a file, read in ``chunk``-sized blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
