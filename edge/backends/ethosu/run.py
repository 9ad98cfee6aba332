"""The ``ethos-u`` runner: a Vela-compiled TFLite on an Ethos-U that Linux exposes.

Where it runs: an Ethos-U65 beside a Cortex-A running Linux (NXP i.MX 93: ``/dev/ethosu0`` and the Ethos-U
LiteRT delegate ``libethosu_delegate.so`` of Arm's ethos-u-linux-driver-stack), through LiteRT with that
delegate. An Ethos-U55 behind a Cortex-M runs no Python: its bundle goes into firmware (``edgekit firmware
ethos-u``: TFLite Micro with the Ethos-U driver).

The capability check is exact: the device node exists and is a character device, and the delegate library is
a file. Anywhere else the runner refuses in one line, or, with ``allow_cpu_fallback``, runs the int8 model Vela
compiled (the sidecar's ``cpu_model``) on LiteRT's reference kernels, labelled a CPU fallback: that is the
build host's parity, never the NPU's.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from edge.backends.ethosu.format import CPU_MODEL, FORMAT
from edge.backends.options import DeviceOption
from edge.backends.runner import Runner, RunnerInfo
from edge.base.typedjson import spec
from edge.capabilities import Requirement
from edge.errors import HardwareUnavailableError, InputFileError

DEVICE_NODE = "/dev/ethosu0"
DELEGATE_LIBRARY = "/usr/lib/libethosu_delegate.so"
_LITERT = Requirement("python", "ai_edge_litert", install="pip install 'edgekit-ml[litert]'")
_INSTALL = (
    "an Ethos-U under Linux needs its kernel driver (/dev/ethosu0) and the Ethos-U LiteRT delegate "
    "(NXP i.MX 93 BSP: libethosu_delegate.so, or Arm's ethos-u-linux-driver-stack); a Cortex-M's Ethos-U55 "
    "runs the bundle in firmware: edgekit firmware ethos-u BUNDLE"
)


def npu_problem(device: str = DEVICE_NODE, library: str = DELEGATE_LIBRARY) -> str | None:
    """None when an Ethos-U is usable here, else what is missing (both checked)."""
    found = []
    try:
        if not stat.S_ISCHR(os.stat(device).st_mode):
            found.append(f"{device} is not a character device")
    except OSError:
        found.append(f"no {device} (the Ethos-U kernel driver)")
    if not os.path.isfile(library):
        found.append(f"no {library} (the Ethos-U LiteRT delegate)")
    return "; ".join(found) or None


@dataclass(frozen=True)
class EthosUOptions:
    allow_cpu_fallback: bool = spec(
        False,
        doc="run the int8 model Vela compiled on LiteRT's reference kernels where no Ethos-U is usable, reported "
        "as a CPU fallback",
    )


class EthosURunner(Runner):
    name = "ethos-u"
    formats = (FORMAT,)
    requires = (_LITERT,)
    options_class = EthosUOptions
    device_options = {
        "device": DeviceOption(
            f"the Ethos-U device node (default {DEVICE_NODE}): device configuration only", example="/dev/ethosuN"
        ),
        "delegate_library": DeviceOption(
            f"the Ethos-U LiteRT delegate (default {DELEGATE_LIBRARY}): device configuration only"
        ),
    }

    @staticmethod
    def device_problem() -> str | None:
        """What this host lacks to run on an Ethos-U (the default device node and delegate), or None."""
        return npu_problem()

    def __init__(self, artifact: Path, *, options: Mapping[str, Any] | None = None, precision: str = "int8") -> None:
        super().__init__(artifact, options={**dict(options or {})}, precision=precision)
        from edge.backends.litert.run import LiteRTRunner

        device = str(self._options.get("device", DEVICE_NODE))
        library = str(self._options.get("delegate_library", DELEGATE_LIBRARY))
        problem = npu_problem(device, library)
        fallback = None
        if problem is None:
            self._inner = LiteRTRunner(self.artifact, options={"external_delegate": library}, precision="int8")
            device_used = f"Ethos-U ({device})"
        elif bool(self._options.get("allow_cpu_fallback", False)):
            cpu = self.artifact.parent / CPU_MODEL
            if not cpu.is_file():
                raise InputFileError(f"{self.artifact.name}: no {CPU_MODEL} beside it to run without the NPU")
            self._inner = LiteRTRunner(cpu, options={"delegate": "reference"}, precision="int8")
            fallback = (
                f"CPU fallback: {problem}; running {CPU_MODEL} (the int8 model Vela compiled) on LiteRT's reference "
                "kernels"
            )
            device_used = "CPU (LiteRT reference kernels) [CPU fallback]"
        else:
            raise HardwareUnavailableError(f"runner 'ethos-u' cannot use an Ethos-U: {problem}", hint=_INSTALL)
        inner = self._inner.info
        self.inputs, self.outputs = self._inner.inputs, self._inner.outputs
        self.info = RunnerInfo(
            runtime=inner.runtime,
            device_requested="Ethos-U",
            device_used=device_used,
            precision_used="int8",
            threads=inner.threads,
            fallback=fallback,
            details={"model": self._inner.info.details.get("model"), "device": device, "delegate": library},
        )

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.validate(feeds)
        return self._inner.infer(feeds)

    def close(self) -> None:
        inner = getattr(self, "_inner", None)
        if inner is not None:
            inner.close()
        super().close()
