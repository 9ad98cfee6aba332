"""The ``rknn`` runner: a ``.rknn`` on a Rockchip NPU, through rknn-toolkit-lite2 and ``librknnrt`` on the board.

Where it runs: an RK3588 / RK3576 / RK3566 / RK3568 board (Orange Pi 5, Radxa Rock 5, ...) under Linux on aarch64,
with the RKNPU kernel driver and Rockchip's user-space runtime ``librknnrt.so`` (rknn-toolkit-lite2 loads it), and
``pip install rknn-toolkit-lite2`` (aarch64 wheels only).

The capability check is exact and names everything missing at once: the NPU driver (``/dev/rknpu``, the
``rknpu`` debugfs directory an RKNPU driver of the DRM kind creates, or a device bound to the ``RKNPU`` platform
driver in sysfs: debugfs is root's, the agent's user reads sysfs), ``/usr/lib/librknnrt.so`` (where
rknn-toolkit-lite2 loads it from), the aarch64 CPU and rknn-toolkit-lite2. Anywhere else the runner refuses in one
line; a build host's parity came from rknn-toolkit2's simulator at conversion time (labelled simulated).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # numpy is imported where the runner runs: a device's manifest check loads this module
    import numpy as np

from edge.backends.rknn.format import FORMAT, RKNNOptions, read_io
from edge.backends.runner import Runner, RunnerInfo
from edge.capabilities import Requirement, problems
from edge.errors import EdgeError, HardwareUnavailableError

#: the RKNPU driver: a misc device node (rknpu driver built as a misc device), or the debugfs directory the
#: DRM-based driver creates (``/sys/kernel/debug/rknpu``; readable by root only)
DEVICE_NODES = ("/dev/rknpu", "/sys/kernel/debug/rknpu")
#: Rockchip's rknpu_drv.c registers its platform driver as "RKNPU"; an NPU it probed is a link in this directory
#: (``fdab0000.npu`` on an RK3588). World-readable, so the agent's own user sees it where debugfs is root's
DRIVER_DIR = "/sys/bus/platform/drivers/RKNPU"
#: where rknn-toolkit-lite2 2.5.0 loads Rockchip's runtime from: the path is in its compiled runtime module, whose
#: own error says "move it to directory /usr/lib/" (a librknnrt.so elsewhere on the loader's path is not used)
LIBRARY = "/usr/lib/librknnrt.so"
_LITE = Requirement(
    "python",
    "rknnlite",
    install="pip install rknn-toolkit-lite2 (aarch64 wheels; on the board)",
    why="loads the .rknn into librknnrt",
)
_ARCH = Requirement("arch", "aarch64", install="run on the Rockchip board (RK3588/RK3576/RK3566: aarch64)")
_INSTALL = (
    "a Rockchip NPU board needs its RKNPU kernel driver (/dev/rknpu or /sys/kernel/debug/rknpu: Rockchip's BSP "
    "kernels and Armbian/Joshua Riek's Ubuntu images have it), librknnrt.so from Rockchip's rknn-toolkit2 "
    "repository (rknpu2/runtime/Linux/librknn_api/aarch64) in /usr/lib, and pip install rknn-toolkit-lite2"
)


def _driver_bound(driver_dir: str) -> bool:
    """The RKNPU platform driver holds a device (a ``<address>.npu`` link beside bind/unbind/uevent)."""
    try:
        return any("." in e.name and e.is_symlink() for e in os.scandir(driver_dir))
    except OSError:
        return False


def npu_problem(
    nodes: tuple[str, ...] = DEVICE_NODES, library: str = LIBRARY, driver_dir: str = DRIVER_DIR
) -> str | None:
    """None when an RKNPU and its runtime library are here, else what is missing (both checked)."""
    found = []
    if not any(os.path.exists(n) for n in nodes) and not _driver_bound(driver_dir):
        found.append(f"no RKNPU driver ({' or '.join(nodes)}, or an NPU bound in {driver_dir})")
    if not os.path.isfile(library):
        found.append(f"no {library} (Rockchip's NPU runtime, which rknn-toolkit-lite2 loads from there)")
    return "; ".join(found) or None


class RKNNRunner(Runner):
    name = "rknn"
    formats = (FORMAT,)
    requires = (_ARCH, _LITE)
    options_class = RKNNOptions
    #: an fp16 .rknn computes in fp16 on the NPU: its parity also runs the fp16 proxy (every tensor rounded)
    computes_fp16 = True

    @staticmethod
    def device_problem() -> str | None:
        """What this host lacks to run on a Rockchip NPU (driver and runtime library), or None."""
        return npu_problem()

    def __init__(self, artifact: Path, *, options: Mapping[str, Any] | None = None, precision: str = "int8") -> None:
        missing = [p for p in (npu_problem(), *problems(self.requires)) if p]
        if missing:
            raise HardwareUnavailableError(
                f"runner 'rknn' cannot use a Rockchip NPU here: {'; '.join(missing)}", hint=_INSTALL
            )
        super().__init__(artifact, options=options, precision=precision)
        from rknnlite.api import RKNNLite

        self.inputs, self.outputs, record = read_io(self.artifact)
        core = str(self.typed_options.core_mask)
        lite = RKNNLite(verbose=False)
        self._lite: Any = lite
        if lite.load_rknn(str(self.artifact)) != 0:
            self.close()
            raise EdgeError(f"rknn-toolkit-lite2 could not load {self.artifact}")
        mask = getattr(RKNNLite, "NPU_CORE_AUTO" if core == "auto" else f"NPU_CORE_{core}")
        if lite.init_runtime(core_mask=mask) != 0:
            self.close()
            raise EdgeError(
                f"librknnrt could not start {self.artifact.name} (built for {record.get('platform', '?')}) on this "
                f"NPU with core_mask {core}",
                hint="a .rknn is built for one platform: convert for this board's (e.g. -t rockchip-rk3588)",
            )
        formats = ["nchw" if len(t.shape) == 4 else None for t in self.inputs]
        # rknn-toolkit-lite2 documents one string for every input; a list only where the inputs differ
        self._format: Any = formats[0] if len(set(formats)) == 1 else formats
        self.info = RunnerInfo(
            runtime=f"rknn-toolkit-lite2 {_lite_version()} (librknnrt)",
            device_requested="Rockchip NPU",
            device_used=f"Rockchip NPU ({record.get('platform', '?')}, cores {core})",
            precision_used="int8" if precision == "int8" else "f16",
            details={"platform": record.get("platform"), "core_mask": core, "library": LIBRARY},
        )

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        import numpy as np

        self.validate(feeds)
        outs = self._lite.inference(inputs=[feeds[t.name] for t in self.inputs], data_format=self._format)
        if outs is None or len(outs) != len(self.outputs):
            raise EdgeError(
                f"rknn-toolkit-lite2 returned {0 if outs is None else len(outs)} outputs, expected {len(self.outputs)}"
            )
        return {
            t.name: np.asarray(o, dtype=t.dtype).reshape(tuple(int(d) for d in t.shape))
            for t, o in zip(self.outputs, outs)
        }

    def close(self) -> None:
        lite = getattr(self, "_lite", None)
        if lite is not None:
            lite.release()
            self._lite = None
        super().close()


def _lite_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rknn-toolkit-lite2")
    except PackageNotFoundError:
        return "?"
