"""The Core ML bundle format, read by both sides: where the ``.mlpackage`` is."""

from __future__ import annotations

from pathlib import Path


def package_dir(artifact: Path) -> Path:
    """The ``.mlpackage`` directory for a bundle's primary artifact (its Manifest.json, or the package)."""
    artifact = Path(artifact)
    return artifact.parent if artifact.name == "Manifest.json" and artifact.parent.suffix == ".mlpackage" else artifact
