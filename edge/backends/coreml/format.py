"""The Core ML bundle format, read by both sides: where the ``.mlpackage`` is."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edge.base.typedjson import spec


def package_dir(artifact: Path) -> Path:
    """The ``.mlpackage`` directory for a bundle's primary artifact (its Manifest.json, or the package)."""
    artifact = Path(artifact)
    return artifact.parent if artifact.name == "Manifest.json" and artifact.parent.suffix == ".mlpackage" else artifact


# -- runner options (declared once: edge.backends.options) --------------------------------------

#: Core ML's compute units, as the runner option compute_units names them
COMPUTE_UNITS = ("CPU_AND_NE", "ALL", "CPU_AND_GPU", "CPU_ONLY")


@dataclass(frozen=True)
class CoreMLOptions:
    compute_units: Literal["CPU_AND_NE", "ALL", "CPU_AND_GPU", "CPU_ONLY"] = spec(
        "CPU_AND_NE", doc=f"{', '.join(COMPUTE_UNITS)} (default CPU_AND_NE)"
    )
