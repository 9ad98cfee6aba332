"""The ``executorch`` runner: a ``.pte`` through ExecuTorch's C++ runtime with the XNNPack delegate, on an aarch64
board (Raspberry Pi 5, Graviton, Rockchip's Cortex-A cores) or an x86-64 host, without torch.

It loads edgekit's small C interface (``edge.backends.executorch.native``: built on the device against the
``executorch`` wheel's own headers and ``libexecutorch*.so``) with ctypes and hands it numpy buffers. What a device
installs: ``pip install --no-deps 'executorch==1.5.1'`` (the aarch64 wheel: 17.8 MB, 63 MB unpacked; its declared
dependencies are the export side's) and a C++ compiler once, for ``python -m edge.backends.executorch.native build``
(``install-device.sh --runtime executorch`` does both). Not torch: executorch's own Python runtime
(``executorch.runtime``) links libtorch, and PyPI's aarch64 torch is a CUDA build (docs/executorch.md).

The capability check is exact and names what is missing: the ``executorch`` package and its runtime libraries,
edgekit's interface built for this executorch version, source and machine, and, once loaded, the XNNPack backend
in the runtime's registry. Everything is loaded inside ``__init__``: the agent on another device never touches it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # numpy is imported where the runner runs: a device's manifest check loads this module
    import numpy as np

from edge.backends.executorch import native
from edge.backends.executorch.format import BACKEND, FORMAT, METHOD, ExecuTorchOptions, read_io
from edge.backends.runner import Runner, RunnerInfo
from edge.capabilities import Requirement
from edge.errors import EdgeError, MissingDependencyError

_INSTALL = (
    "pip install --no-deps 'executorch==1.5.1', then "
    f"{native.BUILD_COMMAND} (needs a C++ compiler once; install-device.sh --runtime executorch does both)"
)
_OS = Requirement("os", "linux", install="run on Linux (the executorch wheel's runtime libraries are Linux .so files)")
_ERR = 1024


def runtime_problem() -> str | None:
    """None when ExecuTorch's runtime and edgekit's interface to it are usable here, else what is missing."""
    return native.library_problem(native.executorch_dir())


class ExecuTorchRunner(Runner):
    name = "executorch"
    formats = (FORMAT,)
    requires = (_OS,)
    options_class = ExecuTorchOptions

    @classmethod
    def problems(cls, host: Any = None) -> list[str]:
        found = super().problems(host)
        missing = runtime_problem()
        return [*found, missing] if missing else found

    def __init__(self, artifact: Path, *, options: Mapping[str, Any] | None = None, precision: str = "fp32") -> None:
        missing = self.problems()
        if missing:
            raise MissingDependencyError(f"runner 'executorch' cannot run here: {'; '.join(missing)}", hint=_INSTALL)
        super().__init__(artifact, options=options, precision=precision)
        self.inputs, self.outputs, record = read_io(self.artifact)
        et_dir = native.executorch_dir()
        if et_dir is None:  # runtime_problem() said it is here: it went away since
            raise MissingDependencyError("the executorch package is not installed", hint=_INSTALL)
        self._lib = load_interface(native.native_dir(et_dir) / native.LIB_NAME)
        if not self._lib.ek_et_has_backend(BACKEND.encode()):
            raise MissingDependencyError(
                f"the executorch runtime at {et_dir} has no {BACKEND}",
                hint="install the executorch wheel from PyPI: its runtime links the XNNPack delegate",
            )
        self._handle = _open(self._lib, self.artifact, record.get("executorch"), native.executorch_version(et_dir))
        counts = (self._lib.ek_et_num_inputs(self._handle), self._lib.ek_et_num_outputs(self._handle))
        if counts != (len(self.inputs), len(self.outputs)):
            self.close()
            raise EdgeError(
                f"{self.artifact.name} has {counts[0]} inputs and {counts[1]} outputs; its I/O sidecar names "
                f"{len(self.inputs)} and {len(self.outputs)}"
            )
        self.info = RunnerInfo(
            runtime=f"executorch {native.executorch_version(et_dir)} (C++ runtime, edgekit's interface)",
            device_requested="CPU (XNNPack delegate)",
            device_used="CPU (XNNPack delegate)",
            precision_used="f32",
            details={"delegate": BACKEND, "written_by": record.get("executorch")},
        )

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        import ctypes

        import numpy as np

        self.validate(feeds)
        ins = [np.ascontiguousarray(feeds[t.name], dtype=np.float32) for t in self.inputs]
        outs = {t.name: np.empty(tuple(int(d) for d in t.shape), dtype=np.float32) for t in self.outputs}
        dims = [int(d) for a in ins for d in a.shape]
        err = ctypes.create_string_buffer(_ERR)
        code = self._lib.ek_et_run(
            self._handle,
            len(ins),
            (ctypes.c_void_p * len(ins))(*(a.ctypes.data for a in ins)),
            (ctypes.c_int * len(ins))(*(a.ndim for a in ins)),
            (ctypes.c_int64 * max(len(dims), 1))(*dims),
            len(outs),
            (ctypes.c_void_p * len(outs))(*(a.ctypes.data for a in outs.values())),
            (ctypes.c_int64 * len(outs))(*(a.size for a in outs.values())),
            err,
            _ERR,
        )
        if code != 0:
            raise EdgeError(f"ExecuTorch could not run {self.artifact.name}: {err.value.decode(errors='replace')}")
        return outs

    def close(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle:
            self._lib.ek_et_close(handle)
            self._handle = None
        super().close()


def load_interface(path: Path) -> Any:
    """The interface library with its C signatures declared."""
    import ctypes

    lib = ctypes.CDLL(str(path))
    p, i, i64, s = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p
    lib.ek_et_has_backend.argtypes, lib.ek_et_has_backend.restype = [s], i
    lib.ek_et_open.argtypes, lib.ek_et_open.restype = [s, s, s, ctypes.c_size_t], p
    for f in (lib.ek_et_num_inputs, lib.ek_et_num_outputs):
        f.argtypes, f.restype = [p], i
    lib.ek_et_run.argtypes = [p, i, ctypes.POINTER(p), ctypes.POINTER(i), i64, i, ctypes.POINTER(p), i64, s]
    lib.ek_et_run.argtypes += [ctypes.c_size_t]
    lib.ek_et_run.restype = i
    lib.ek_et_close.argtypes, lib.ek_et_close.restype = [p], None
    return lib


def _open(lib: Any, artifact: Path, written_by: Any, runtime: str | None) -> Any:
    import ctypes

    err = ctypes.create_string_buffer(_ERR)
    handle = lib.ek_et_open(str(artifact).encode(), METHOD.encode(), err, _ERR)
    if not handle:
        raise EdgeError(
            f"ExecuTorch could not load {artifact.name} (written by executorch {written_by or '?'}; this runtime is "
            f"{runtime or '?'}): {err.value.decode(errors='replace')}",
            hint="convert again with the executorch toolchain of the runtime's release",
        )
    return handle
