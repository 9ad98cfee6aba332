"""Core ML runner: ``MLModel.predict`` with the profile's compute units. macOS only.

Elsewhere loading raises "Core ML predictions need macOS; the bundle is ready to copy to a
Mac" (the bundle's package was already checked as a spec on the build host). Core ML decides
per op where it runs (Neural Engine, GPU or CPU) within the compute units given; ``info`` says
which units were allowed, not a device Core ML does not report.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # numpy is imported where the runner runs: a device's manifest check loads this module
    import numpy as np

from edge.backends.coreml.format import COMPUTE_UNITS, CoreMLOptions, renamed_io, reshaped_io
from edge.backends.runner import Runner, RunnerInfo
from edge.capabilities import Requirement
from edge.errors import EdgeError
from edge.spec import TensorSpec, image_layout

NEEDS_MACOS = "Core ML predictions need macOS; the bundle is ready to copy to a Mac"


class CoreMLRunner(Runner):
    name = "coreml"
    formats = ("mlpackage",)
    requires = (
        Requirement("os", "darwin", install=NEEDS_MACOS),
        Requirement("python", "coremltools", install="pip install 'edgekit-ml[coreml]'"),
    )
    options_class = CoreMLOptions
    computes_fp16 = True

    def __init__(self, artifact: Path, *, options: Mapping[str, Any] | None = None, precision: str = "fp16") -> None:
        # raises HardwareUnavailableError off macOS, naming every unmet requirement (NEEDS_MACOS included)
        super().__init__(artifact, options=options, precision=precision)
        import coremltools as ct

        from edge.backends.coreml.format import package_dir

        units = str(self._options.get("compute_units", "CPU_AND_NE"))
        if units not in COMPUTE_UNITS:
            raise EdgeError(f"compute_units must be one of {', '.join(COMPUTE_UNITS)}, got {units!r}")
        try:
            self._model = ct.models.MLModel(
                str(package_dir(self.artifact)), compute_units=getattr(ct.ComputeUnit, units)
            )
        except Exception as e:
            raise EdgeError(f"Core ML could not load {self.artifact}: {type(e).__name__}: {str(e)[:300]}") from e
        desc = self._model.get_spec().description
        # the bundle's names where coremltools renamed them (Identity:0 -> Identity_0): fed and returned as such
        meta = self._model.user_defined_metadata
        self._package_name = renamed_io(meta)
        bundle_name = {v: k for k, v in self._package_name.items()}
        shapes = reshaped_io(meta)  # 0-d outputs the package holds as [1, 1]: returned 0-d, as the bundle has them
        self.inputs = tuple(_spec(f, bundle_name.get(f.name, f.name), shapes) for f in desc.input)
        self.outputs = tuple(_spec(f, bundle_name.get(f.name, f.name), shapes) for f in desc.output)
        self.info = RunnerInfo(
            runtime=f"coremltools {ct.__version__} (Core ML)",
            device_requested=units,
            device_used=f"Core ML with compute units {units} (placement per op is Core ML's)",
            precision_used={"fp16": "f16", "fp32": "f32"}.get(precision, precision),
            details={"compute_units": units},
        )

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.validate(feeds)
        out = self._model.predict({self._package_name.get(k, k): v for k, v in feeds.items()})
        import numpy as np

        return {
            t.name: np.asarray(out[self._package_name.get(t.name, t.name)], dtype=np.float32).reshape(t.shape)
            for t in self.outputs
        }

    def close(self) -> None:
        self._model = None
        super().close()


def _spec(f: Any, name: str, shapes: Mapping[str, tuple[int, ...]]) -> TensorSpec:
    shape = shapes.get(name, tuple(int(d) for d in f.type.multiArrayType.shape))
    return TensorSpec(name, shape, "float32", image_layout(shape))
