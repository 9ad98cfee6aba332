"""Bundles: a directory holding the artifact(s) and ``manifest.json``.

A bundle is written into a staging directory beside its destination and renamed into place,
so a crash never leaves half a bundle. Opening a bundle verifies every artifact's sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

from edge.errors import BundleError
from edge.onnxmodel import sha256_file
from edge.spec import IOSpec, PreprocessSpec

MANIFEST = "manifest.json"
SCHEMA_VERSION = 1


def bundle_id(stem: str, target: str, precision: str, artifact_hashes: list[str], runner_options: Mapping[str, Any]) -> str:
    h = hashlib.sha256(json.dumps([target, precision, sorted(artifact_hashes), dict(runner_options)],
                                  sort_keys=True, default=str).encode()).hexdigest()
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in stem)[:40]
    return f"{safe}-{target}-{precision}-{h[:10]}"


def write_json_atomic(path: Path, data: Any) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=False, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def staging_dir(dest: Path, *, force: bool) -> Iterator[Path]:
    """Yield an empty directory beside ``dest``; on success it becomes ``dest``, on error it is removed.

    With ``force`` an existing ``dest`` is replaced only after the new one is complete.
    """
    dest = Path(dest)
    if dest.exists() and not force:
        raise BundleError(f"{dest} already exists", hint="pass --force to replace it, or choose another -o")
    made = [p for p in (dest.parent, *dest.parent.parents) if not p.exists()]  # innermost first
    dest.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        for p in made:  # a refused conversion leaves no empty build/ behind either
            try:
                p.rmdir()
            except OSError:  # something else was put there meanwhile: keep it
                break
        raise
    old = None
    if dest.exists():
        old = dest.parent / f".{dest.name}.old-{os.getpid()}"
        os.replace(dest, old)
    os.replace(stage, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def artifact_entries(directory: Path, files: list[Path]) -> list[dict[str, Any]]:
    return [{"path": f.relative_to(directory).as_posix(), "sha256": sha256_file(f), "bytes": f.stat().st_size}
            for f in sorted(files)]


class Bundle:
    """An opened (and, by default, verified) bundle directory."""

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        self.path = path
        self.manifest = manifest

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, verify: bool = True) -> "Bundle":
        p = Path(path)
        if p.is_file() and p.name == MANIFEST:
            p = p.parent
        mf = p / MANIFEST
        if not p.exists():
            raise BundleError(f"bundle {p} does not exist")
        if not mf.is_file():
            raise BundleError(f"{p} is not a bundle: no {MANIFEST}", hint="create one with `edgekit convert`")
        try:
            manifest = json.loads(mf.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BundleError(f"{mf} is not valid JSON: {e}") from None
        missing = [k for k in ("schema_version", "bundle_id", "artifacts", "primary_artifact", "runner", "io")
                   if k not in manifest]
        if missing:
            raise BundleError(f"{mf} lacks {', '.join(missing)}")
        if manifest["schema_version"] != SCHEMA_VERSION:
            raise BundleError(f"{mf} has schema {manifest['schema_version']}; this edgekit reads {SCHEMA_VERSION}",
                              hint="upgrade edgekit-ml")
        b = cls(p, manifest)
        if verify:
            b.verify()
        return b

    def verify(self) -> None:
        """Every artifact present with its recorded sha256; all problems reported together."""
        problems = []
        root = self.path.resolve()
        for a in self.manifest["artifacts"]:
            f = (self.path / a["path"]).resolve()
            if root not in f.parents:
                problems.append(f"{a['path']}: path escapes the bundle")
            elif not f.is_file():
                problems.append(f"{a['path']}: missing")
            elif f.stat().st_size != a["bytes"] or sha256_file(f) != a["sha256"]:
                problems.append(f"{a['path']}: sha256 differs from the manifest (altered or corrupt)")
        if self.manifest["primary_artifact"] not in {a["path"] for a in self.manifest["artifacts"]}:
            problems.append(f"primary artifact {self.manifest['primary_artifact']} is not listed")
        if problems:
            raise BundleError(f"bundle {self.path} failed verification: " + "; ".join(problems),
                              hint="rebuild it with `edgekit convert`; do not edit bundle files by hand")

    @property
    def id(self) -> str:
        return str(self.manifest["bundle_id"])

    @property
    def target(self) -> str:
        return str(self.manifest.get("target", {}).get("name", "?"))

    @property
    def precision(self) -> str:
        return str(self.manifest.get("precision", "fp32"))

    @property
    def artifact(self) -> Path:
        return self.path / self.manifest["primary_artifact"]

    @property
    def io(self) -> IOSpec:
        return IOSpec.from_json(self.manifest["io"])

    @property
    def preprocess(self) -> PreprocessSpec | None:
        pre = self.manifest.get("preprocess")
        return PreprocessSpec.from_json(pre) if pre else None

    def open_runner(self, options: Mapping[str, Any] | None = None) -> Any:
        """A runner for this bundle with the profile's runtime options (``options`` override keys)."""
        from edge.runners.base import RUNNERS

        spec = self.manifest["runner"]
        cls = RUNNERS.get(spec["name"])
        opts = {**spec.get("options", {}), **(options or {})}
        return cls(self.artifact, options=opts, precision=self.precision)

    @property
    def kind(self) -> str:
        """"vision" (tensor in, tensor out) or "llm" (GGUF language model)."""
        return str(self.manifest.get("kind", "vision"))

    def record(self, key: str, value: Any) -> None:
        """Add a report (e.g. the deploy-time benchmark) to the manifest; artifacts are untouched."""
        self.manifest[key] = value
        write_json_atomic(self.path / MANIFEST, self.manifest)
