"""The Core ML bundle format, read by both sides: where the ``.mlpackage`` is, and the names its I/O has."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Mapping

from edge.base.typedjson import spec


def package_dir(artifact: Path) -> Path:
    """The ``.mlpackage`` directory for a bundle's primary artifact (its Manifest.json, or the package)."""
    artifact = Path(artifact)
    return artifact.parent if artifact.name == "Manifest.json" and artifact.parent.suffix == ".mlpackage" else artifact


#: the package's user-defined metadata key holding ``{bundle name: package name}`` as JSON, for the I/O coremltools
#: renamed (it makes every name an identifier: ``Identity:0`` -> ``Identity_0``); written by the toolchain's driver
#: (``edge/toolchains/coreml_driver.py``, which cannot import this module: the same string there)
IO_NAMES = "edgekit.io_names"


def renamed_io(metadata: Mapping[str, str]) -> dict[str, str]:
    """``{bundle name: package name}`` from a package's user-defined metadata (empty where nothing was renamed)."""
    raw = metadata.get(IO_NAMES)
    if not raw:
        return {}
    names = json.loads(raw)
    if not isinstance(names, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in names.items()):
        raise ValueError(f"{IO_NAMES} in the package's metadata is not a name map: {raw[:200]!r}")
    return names


# -- runner options (declared once: edge.backends.options) --------------------------------------

#: Core ML's compute units, as the runner option compute_units names them
COMPUTE_UNITS = ("CPU_AND_NE", "ALL", "CPU_AND_GPU", "CPU_ONLY")


@dataclass(frozen=True)
class CoreMLOptions:
    compute_units: Literal["CPU_AND_NE", "ALL", "CPU_AND_GPU", "CPU_ONLY"] = spec(
        "CPU_AND_NE", doc=f"{', '.join(COMPUTE_UNITS)} (default CPU_AND_NE)"
    )
