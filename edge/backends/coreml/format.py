"""The Core ML bundle format, read by both sides: where the ``.mlpackage`` is, and the names its I/O has."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping

from edge.base.typedjson import spec


def package_dir(artifact: Path) -> Path:
    """The ``.mlpackage`` directory for a bundle's primary artifact (its Manifest.json, or the package)."""
    artifact = Path(artifact)
    return artifact.parent if artifact.name == "Manifest.json" and artifact.parent.suffix == ".mlpackage" else artifact


#: the package's user-defined metadata key holding ``{bundle name: package name}`` as JSON, for the I/O coremltools
#: renamed (it makes every name an identifier: ``Identity:0`` -> ``Identity_0``); written by the toolchain's driver
#: (``edge/toolchains/coreml_driver.py``, which cannot import this module: the same string there)
IO_NAMES = "edgekit.io_names"


#: ... and ``{bundle name: bundle shape}`` for the 0-d outputs Core ML holds as ``[1]`` or ``[1, 1]`` (it has no 0-d
#: arrays): the runner returns them in the bundle's shape
IO_SHAPES = "edgekit.io_shapes"


def _read_map(metadata: Mapping[str, str], key: str, value: type) -> dict[str, Any]:
    raw = metadata.get(key)
    if not raw:
        return {}
    found = json.loads(raw)
    if not isinstance(found, dict) or not all(isinstance(k, str) and isinstance(v, value) for k, v in found.items()):
        raise ValueError(f"{key} in the package's metadata is not a map of {value.__name__}: {raw[:200]!r}")
    return found


def renamed_io(metadata: Mapping[str, str]) -> dict[str, str]:
    """``{bundle name: package name}`` from a package's user-defined metadata (empty where nothing was renamed)."""
    return _read_map(metadata, IO_NAMES, str)


def reshaped_io(metadata: Mapping[str, str]) -> dict[str, tuple[int, ...]]:
    """``{bundle name: bundle shape}`` for the outputs the package holds in another shape of the same size."""
    return {k: tuple(int(d) for d in v) for k, v in _read_map(metadata, IO_SHAPES, list).items()}


# -- runner options (declared once: edge.backends.options) --------------------------------------

#: Core ML's compute units, as the runner option compute_units names them
COMPUTE_UNITS = ("CPU_AND_NE", "ALL", "CPU_AND_GPU", "CPU_ONLY")


@dataclass(frozen=True)
class CoreMLOptions:
    compute_units: Literal["CPU_AND_NE", "ALL", "CPU_AND_GPU", "CPU_ONLY"] = spec(
        "CPU_AND_NE", doc=f"{', '.join(COMPUTE_UNITS)} (default CPU_AND_NE)"
    )
