"""``model.io.json``: the I/O a bundle's model takes and gives, written beside a model file whose format does not
say it in a form edgekit reads without its runtime (RKNN, ExecuTorch). One writer and one bounded reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edge.base.typedjson import UnreadableFile, read_json_file
from edge.errors import InputFileError
from edge.spec import TensorSpec

IO_SIDECAR = "model.io.json"

Specs = tuple[TensorSpec, ...]


def write_io_sidecar(path: Path, schema: str, inputs: Specs, outputs: Specs, **extra: Any) -> Path:
    record = {
        "schema": schema,
        "inputs": [t.to_json() for t in inputs],
        "outputs": [t.to_json() for t in outputs],
        **extra,
    }
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return path


def read_io_sidecar(artifact: Path, schema: str, what: str) -> tuple[Specs, Specs, dict[str, Any]]:
    """(inputs, outputs, the whole record) of ``model.io.json`` beside ``artifact`` (``what``: its name in an
    error, e.g. "RKNN I/O sidecar"); a one-line InputFileError otherwise."""
    side = artifact.parent / IO_SIDECAR
    try:
        data = read_json_file(side, what=what, max_bytes=1 << 20, max_depth=8)
    except UnreadableFile as e:
        raise InputFileError(e.message) from None
    if not isinstance(data, dict) or data.get("schema") != schema:
        raise InputFileError(f"{side} is not an {what} ({schema})")
    try:
        specs = [
            tuple(
                TensorSpec(str(t["name"]), tuple(int(d) for d in t["shape"]), str(t["dtype"]), t.get("layout"))
                for t in data[key]
            )
            for key in ("inputs", "outputs")
        ]
    except (KeyError, TypeError, ValueError) as e:
        raise InputFileError(f"{side}: a tensor entry is malformed ({type(e).__name__}: {e})") from None
    return specs[0], specs[1], data
