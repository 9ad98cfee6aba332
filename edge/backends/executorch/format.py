"""What an ExecuTorch bundle holds, shared by its converter and its runner.

An ExecuTorch bundle holds ``model.pte`` (the ExecuTorch program: a flatbuffer whose ``forward`` method runs the
XNNPack-delegated subgraphs and ExecuTorch's portable/optimized kernels for whatever XNNPack did not take) and
``model.io.json``: the I/O the runner presents (a ``.pte`` carries shapes and dtypes but no tensor names: the inputs
are the torch.export program's user inputs in order, the outputs ``output_0``.. in its return order), the ExecuTorch
version that wrote it (a ``.pte`` is read by the runtime of the same release line) and what the delegate took.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge.backends.iosidecar import read_io_sidecar, write_io_sidecar
from edge.spec import TensorSpec

FORMAT = "pte"
ARTIFACT_NAME = "model.pte"
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
    return write_io_sidecar(path, IO_SCHEMA, inputs, outputs, method=METHOD, **extra)


def read_io(artifact: Path) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...], dict[str, Any]]:
    """(inputs, outputs, the whole record) of ``model.io.json`` beside ``artifact``; a one-line error otherwise."""
    return read_io_sidecar(artifact, IO_SCHEMA, "ExecuTorch I/O sidecar")
