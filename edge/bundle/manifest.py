"""The bundle manifest every conversion path writes (ONNX, GGUF, PyTorch sources), and its gate.

One skeleton, so the fields a bundle promises (design.md: schema, versions, target, source and
artifact hashes, chain, precision, calibration, I/O, pre-processing, runner, parity, benchmark)
are the same whatever the source format. Its typed, validated form is
``edge.bundle.schema.Manifest``.
Its gates (``edge.verify.gates``) recompute every verdict from the figures recorded here.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

import edge
from edge.base.hashing import sha256_file
from edge.bundle.bundle import artifact_entries, bundle_id, bundle_name
from edge.bundle.schema import SCHEMA_VERSION, device_only_hint
from edge.capabilities import cpu_isa, current_host
from edge.errors import ParityError, TargetError


@dataclass(frozen=True)
class ManifestSpec:
    """What a conversion built, for :func:`new_manifest`: the source, the target, the staged artifacts and how
    they were made. ``fmt``: the bundle's format (default: the last chain step's output format); ``kind``: "llm"
    for a GGUF language model."""

    source: Path
    source_info: Mapping[str, Any]
    profile: Any
    precision: str
    stage: Path
    primary: Path
    chain: Sequence[Mapping[str, Any]]
    io: Any
    runner: str
    runner_options: Mapping[str, Any]
    calibration: Any = None
    preprocess: Any = None
    frame_budget_ms: float | None = None
    kind: str | None = None
    fmt: str | None = None


def new_manifest(spec: ManifestSpec) -> dict[str, Any]:
    """The manifest of the bundle staged in ``spec.stage`` (every file in it is an artifact); parity and
    benchmark start empty. Runner options naming a file, library or command are refused: those are
    the device's own configuration, never bundle data."""
    s = spec
    source, profile, runner, runner_options, stage = s.source, s.profile, s.runner, s.runner_options, s.stage
    carried = [k for k in runner_options if device_only_hint(runner, k) is not None]
    if carried:
        raise TargetError(
            f"target {profile.name}: runner option(s) {', '.join(carried)} name a file, library or command, which a bundle may not carry",
            hint=f"remove them from the profile's options; {device_only_hint(runner, carried[0])}",
        )
    artifacts = artifact_entries(stage, [f for f in stage.rglob("*") if f.is_file()])
    host = current_host()
    manifest: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "edgekit_version": edge.__version__,
        "bundle_id": bundle_id(
            source.stem, profile.name, s.precision, [a["sha256"] for a in artifacts], runner_options
        ),
        "name": bundle_name(source.stem, profile.name),
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if s.kind is not None:
        manifest["kind"] = s.kind
    manifest.update(
        {
            "target": {
                "name": profile.name,
                "title": profile.title,
                "accelerator": profile.accelerator,
                "frame_budget_ms": s.frame_budget_ms,
                "profile_sha256": sha256_file(profile.path) if profile.path else None,
            },
            "source": {"file": source.name, "sha256": sha256_file(source), **s.source_info},
            "precision": s.precision,
            "format": s.fmt or s.chain[-1]["output_format"],
            "primary_artifact": s.primary.relative_to(stage).as_posix(),
            "artifacts": artifacts,
            "chain": list(s.chain),
            "calibration": s.calibration.provenance() if s.calibration is not None else None,
            "io": s.io.to_json(),
            "preprocess": s.preprocess.to_json() if s.preprocess is not None else None,
            "runner": {"name": runner, "options": dict(runner_options)},
            "parity": None,
            "benchmark": None,
            "build_host": {
                "os": host.os,
                "arch": host.arch,
                "python": platform.python_version(),
                "cpu": cpu_isa().to_json(),
            },
        }
    )
    return manifest


def record_gate(manifest: dict[str, Any], report: Any, *, failed: str, accept: bool) -> None:
    """Put a parity/quality report in the manifest; stop with its numbers when it failed and
    ``accept`` (``--accept-parity-failure``) was not given. ``failed`` starts the error message."""
    data = report.to_json()
    data["accepted_failure"] = not report.passed and accept
    manifest["parity"] = data
    if not report.passed and not accept:
        raise ParityError(
            f"{failed}: " + "; ".join(report.failures()),
            report,
            hint="nothing was written; pass --accept-parity-failure to keep it anyway",
        )
