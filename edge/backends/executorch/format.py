"""What an ExecuTorch bundle holds, shared by its converter and its runner.

An ExecuTorch bundle holds ``model.pte`` (the ExecuTorch program: a flatbuffer whose ``forward`` method runs the
XNNPack-delegated subgraphs and ExecuTorch's portable/optimized kernels for whatever XNNPack did not take) and
``model.io.json``: the I/O the runner presents (a ``.pte`` carries shapes and dtypes but no tensor names: the inputs
are the torch.export program's user inputs in order, the outputs ``output_0``.. in its return order), the ExecuTorch
version that wrote it (a ``.pte`` is read by the runtime of the same release line) and what the delegate took.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge.base.typedjson import UnreadableFile, read_json_file
from edge.errors import InputFileError
from edge.spec import TensorSpec

FORMAT = "pte"
ARTIFACT_NAME = "model.pte"
IO_SIDECAR = "model.io.json"
IO_SCHEMA = "edgekit-executorch-io/1"
TOOLCHAIN = "executorch"
METHOD = "forward"
#: the delegate the converter lowers to; the runtime's backend registry must hold it
BACKEND = "XnnpackBackend"
#: how host parity on the toolchain's runtime is named in the manifest and every report
HOST_RUNTIME_LABEL = (
    "ExecuTorch runtime on this x86-64 host (XNNPack delegate; x86 kernels, not the device's aarch64 ones)"
)


@dataclass(frozen=True)
class ExecuTorchOptions:
    """The executorch runner takes no options: the .pte holds its delegate, and ExecuTorch's thread pool sizes
    itself to the device's cores."""


def write_io(path: Path, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...], **extra: Any) -> Path:
    record = {
        "schema": IO_SCHEMA,
        "method": METHOD,
        "inputs": [t.to_json() for t in inputs],
        "outputs": [t.to_json() for t in outputs],
        **extra,
    }
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return path


def read_io(artifact: Path) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...], dict[str, Any]]:
    """(inputs, outputs, the whole record) of ``model.io.json`` beside ``artifact``; a one-line error otherwise."""
    side = artifact.parent / IO_SIDECAR
    try:
        data = read_json_file(side, what="ExecuTorch I/O sidecar", max_bytes=1 << 20, max_depth=8)
    except UnreadableFile as e:
        raise InputFileError(e.message) from None
    if not isinstance(data, dict) or data.get("schema") != IO_SCHEMA:
        raise InputFileError(f"{side} is not an ExecuTorch I/O sidecar ({IO_SCHEMA})")
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
