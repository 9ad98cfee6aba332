"""What an RKNN bundle holds, shared by its converter and its runner.

An RKNN bundle holds ``model.rknn`` (rknn-toolkit2's compiled model for one Rockchip NPU: the platform is baked in,
an RK3588 model does not load on an RK3566) and ``model.io.json``: the I/O the device runner presents (the same
float32 tensors, names and shapes as the ONNX source; the NPU's own layout and quantization stay inside the model),
the platform and the precision. The parity a build host can give is the toolkit's SIMULATOR of the NPU, never a
measurement on it: :data:`SIMULATOR_LABEL` says so wherever its figures are reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from edge.backends.iosidecar import read_io_sidecar, write_io_sidecar
from edge.base.typedjson import spec
from edge.spec import TensorSpec

FORMAT = "rknn"
ARTIFACT_NAME = "model.rknn"
IO_SCHEMA = "edgekit-rknn-io/1"
TOOLCHAIN = "rknn"
#: rknn-toolkit2 2.5.0's target platforms with an NPU that runs a ``.rknn`` built here
PLATFORMS = ("rk3588", "rk3576", "rk3566", "rk3568", "rk3562", "rv1103", "rv1106", "rv1103b", "rv1106b", "rk2118")
#: how the toolkit's simulator is named in the manifest and every report
SIMULATOR_LABEL = "rknn-toolkit2 simulator on this x86-64 host (simulated: not the NPU)"
#: the parity candidate's device, as reports print it ("checked on ...")
SIMULATED_DEVICE = "RKNN simulator (simulated NPU, on this host's CPU)"
#: rknn-toolkit-lite2's ``init_runtime(core_mask=...)`` (RK3588 has three NPU cores, RK3576 two; others one)
CORE_MASKS = ("auto", "0", "1", "2", "0_1", "0_1_2")


@dataclass(frozen=True)
class RKNNOptions:
    core_mask: Literal["auto", "0", "1", "2", "0_1", "0_1_2"] = spec(
        "auto",
        doc="the NPU cores rknn-toolkit-lite2 runs the model on: auto (the driver picks an idle core), one core "
        "(0, 1, 2) or several (0_1, 0_1_2: RK3588 only)",
    )


def write_io(path: Path, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...], **extra: Any) -> Path:
    return write_io_sidecar(path, IO_SCHEMA, inputs, outputs, **extra)


def read_io(artifact: Path) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...], dict[str, Any]]:
    """(inputs, outputs, the whole record) of ``model.io.json`` beside ``artifact``; a one-line error otherwise."""
    return read_io_sidecar(artifact, IO_SCHEMA, "RKNN I/O sidecar")
