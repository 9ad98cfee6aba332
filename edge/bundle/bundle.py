"""Bundles: a directory holding the artifact(s) and ``manifest.json``.

A bundle is written into a staging directory beside its destination and renamed into place,
so a crash never leaves half a bundle. Opening a bundle reads its manifest once into the typed
:class:`~edge.bundle.schema.Manifest` (validated: a malformed one is a ``ManifestError``),
and verifying it checks that the directory holds exactly the listed files -- nothing else, no
symlinks -- each with its recorded size and sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from edge.base.hashing import sha256_file
from edge.base.typedjson import Invalid, UnreadableFile, loads_strict, read_json_file, to_json, write_json_atomic
from edge.bundle.schema import MAX_DEPTH, SCHEMA_VERSION, Manifest, load_manifest, parse_manifest  # noqa: F401 - SCHEMA_VERSION re-exported
from edge.bundle.signing import (
    SIGNATURE_FILE,
    SIGNER_VERSIONS,
    Signature,
    canonical_bytes,
    key_id,
    keys_dir,
    load_signing_key,
)
from edge.errors import BundleError, ManifestError, SignatureError
from edge.spec import IOSpec, PreprocessSpec

MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"  # a detached signature over the manifest: the one other file a bundle may hold


def bundle_id(
    stem: str, target: str, precision: str, artifact_hashes: list[str], runner_options: Mapping[str, Any]
) -> str:
    h = hashlib.sha256(
        json.dumps(
            [target, precision, sorted(artifact_hashes), dict(runner_options)], sort_keys=True, default=str
        ).encode()
    ).hexdigest()

    def word(s: str, n: int) -> str:  # ids are [A-Za-z0-9._-] and never start with '-' or '.'
        return "".join(c if c.isascii() and (c.isalnum() or c in "-_") else "_" for c in s)[:n].lstrip("-") or "x"

    return f"{word(stem, 40)}-{word(target, 48)}-{word(precision, 16)}-{h[:10]}"


def bundle_name(stem: str, target: str) -> str:
    """The series a bundle belongs to, for its signed ``version``: source stem + target (precision and
    options are not part of it, so an fp16 rebuild of a model supersedes its fp32 bundle on a device)."""

    def word(s: str, n: int) -> str:
        return "".join(c if c.isascii() and (c.isalnum() or c in "-_") else "_" for c in s)[:n].lstrip("-") or "x"

    return f"{word(stem, 60)}-{word(target, 64)}"


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
    return [
        {"path": f.relative_to(directory).as_posix(), "sha256": sha256_file(f), "bytes": f.stat().st_size}
        for f in sorted(files)
    ]


class Bundle:
    """An opened (and, by default, verified) bundle directory.

    ``info`` is the typed, validated manifest: code reads it. ``manifest`` is the same manifest as
    the plain JSON it was read from, kept for readers of string keys that are not converted yet
    (edge/deploy.py, edge/agent/agent.py) and for tests; edits to it count only once passed to
    ``Bundle(path, manifest)`` or ``record``, which validate them.
    """

    def __init__(self, path: str | os.PathLike[str], manifest: Mapping[str, Any] | Manifest) -> None:
        self.path = Path(path)
        where = str(self.path / MANIFEST)
        self.info: Manifest
        self.manifest: dict[str, Any]
        if isinstance(manifest, Manifest):
            self.info, self.manifest = manifest, to_json(manifest)
            return
        try:  # what a writer in this process built: the JSON it becomes, under the same checks as a file
            raw = loads_strict(json.dumps(manifest, default=str), max_depth=MAX_DEPTH)
        except (Invalid, ValueError, TypeError, RecursionError) as e:
            raise ManifestError(f"{where}: {getattr(e, 'problem', None) or type(e).__name__}") from None
        self.info = parse_manifest(raw, where)
        self.manifest = raw

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, verify: bool = True, trust: Any = None) -> Bundle:
        """Open (and by default verify) the bundle at ``path``. ``trust``: a trust store (``TrustStore`` or
        its directory) that must vouch for the bundle (``edge.bundle.trust``: signature, key, version, target);
        None: ``$EDGEKIT_TRUST_DIR`` when set, else no check; False: no check (a signer, a store's own
        staging, which checks with its own trust store)."""
        p = Path(path)
        if p.name == MANIFEST and not p.is_dir():
            p = p.parent
        mf = p / MANIFEST
        if not p.exists():
            raise BundleError(f"bundle {p} does not exist")
        if mf.is_symlink():
            raise ManifestError(f"{mf} is a symlink: a bundle holds its manifest itself")
        if not mf.is_file():
            raise BundleError(f"{p} is not a bundle: no {MANIFEST}", hint="create one with `edgekit convert`")
        info, raw = load_manifest(mf)
        b = cls(p, info)
        b.manifest = raw
        if verify:
            b.verify()
        if trust is not False:
            from edge.bundle.trust import resolve_trust

            store = resolve_trust(trust) if trust is not None or os.environ.get("EDGEKIT_TRUST_DIR") else None
            if store is not None:
                if not verify:
                    b.verify()  # a signature vouches for the hashes; the files must match them
                store.check(b)
        return b

    def verify(self) -> None:
        """The directory holds exactly the listed files (plus the manifest and its signature), each a
        regular file with its recorded size and sha256; no other file, directory or symlink. Every
        problem is reported together."""
        listed = {a.path: a for a in self.info.artifacts}
        dirs = {"/".join(p.split("/")[:k]) for p in listed for k in range(1, p.count("/") + 1)}
        problems: list[str] = []
        found: set[str] = set()
        root = self.path
        for dirpath, dirnames, filenames in os.walk(root, onerror=lambda e: problems.append(f"unreadable: {e}")):
            rel_dir = Path(dirpath).relative_to(root).as_posix()
            keep = []
            for name in sorted(dirnames + filenames):
                rel = name if rel_dir == "." else f"{rel_dir}/{name}"
                try:
                    mode = os.lstat(os.path.join(dirpath, name)).st_mode
                except OSError as e:
                    problems.append(f"{rel}: unreadable ({e.strerror})")
                    continue
                if stat.S_ISLNK(mode):
                    problems.append(f"{rel}: a symlink (a bundle holds only its listed files)")
                elif stat.S_ISDIR(mode):
                    if rel in dirs:
                        keep.append(name)
                    else:
                        problems.append(f"{rel}/: not listed in the manifest")
                elif not stat.S_ISREG(mode):
                    problems.append(f"{rel}: not a regular file")
                elif rel in listed:
                    found.add(rel)
                    a = listed[rel]
                    f = root / rel
                    if f.stat().st_size != a.bytes or sha256_file(f) != a.sha256:
                        problems.append(f"{rel}: sha256 differs from the manifest (altered or corrupt)")
                elif rel_dir != "." or name not in (MANIFEST, SIGNATURE):
                    problems.append(f"{rel}: not listed in the manifest")
            dirnames[:] = [d for d in dirnames if d in keep]
        problems += [
            f"{p}: missing" for p in listed if p not in found and not any(q.startswith(p + ":") for q in problems)
        ]
        if problems:
            more = f"; and {len(problems) - 10} more" if len(problems) > 10 else ""
            raise BundleError(
                f"bundle {self.path} failed verification: " + "; ".join(problems[:10]) + more,
                hint="rebuild it with `edgekit convert`; do not add, remove or edit bundle files by hand",
            )

    @property
    def id(self) -> str:
        return self.info.bundle_id

    @property
    def target(self) -> str:
        return self.info.target.name

    @property
    def precision(self) -> str:
        return self.info.precision

    @property
    def artifact(self) -> Path:
        return self.path / self.info.primary_artifact

    @property
    def io(self) -> IOSpec:
        return self.info.io.to_spec()  # type: ignore[no-any-return]

    @property
    def preprocess(self) -> PreprocessSpec | None:
        pre = self.info.preprocess
        return pre.to_spec() if pre is not None else None

    @property
    def frame_budget_ms(self) -> float | None:
        return self.info.target.frame_budget_ms

    def open_runner(self, options: Mapping[str, Any] | None = None) -> Any:
        """A runner for this bundle with the manifest's runner options; ``options`` (the caller's: CLI,
        agent config) override keys and may add the device-only ones (a library path, a cache dir).
        Opening runs no reference check: ``edge.verify.refpairs.open_checked`` does, for the callers
        that want one (the agent, ``edgekit run``/``bench``)."""
        from edge.backends.runner import RUNNERS

        spec = self.info.runner
        cls = RUNNERS.get(spec.name)
        opts = {**spec.options_dict, **(options or {})}
        return cls(self.artifact, options=opts, precision=self.precision)

    @property
    def kind(self) -> str:
        """ "vision" (tensor in, tensor out) or "llm" (GGUF language model)."""
        return self.info.kind

    def record(self, key: str, value: Any) -> None:
        """Add a report (e.g. the deploy-time benchmark) to the manifest; artifacts are untouched, a
        signature is removed (it covered the old manifest). The result is validated first: a malformed
        report is a ``ManifestError`` and nothing is written."""
        updated = Bundle(self.path, {**self.manifest, key: value})
        (self.path / SIGNATURE).unlink(missing_ok=True)  # it signed the old manifest: sign again after recording
        write_json_atomic(self.path / MANIFEST, updated.manifest)
        self.info, self.manifest = updated.info, updated.manifest


@dataclass(frozen=True)
class SignResult:
    bundle_id: str
    name: str
    version: int
    key_id: str
    signature_path: Path

    def to_json(self) -> dict[str, Any]:
        return {
            "bundle_id": self.bundle_id,
            "name": self.name,
            "version": self.version,
            "key_id": self.key_id,
            "signature": str(self.signature_path),
        }


def _next_version(d: Path, name: str, wanted: int | None) -> int:
    """``wanted``, else seconds since the epoch -- raised past what this signer last gave ``name``, so two
    signings in one second still go up. Recorded in the keys dir."""
    f = d / SIGNER_VERSIONS
    try:
        seen = read_json_file(f, what="signer versions", max_bytes=1 << 20, max_depth=4, missing={})
    except UnreadableFile:
        seen = {}
    seen = seen if isinstance(seen, dict) else {}
    given = seen.get(name)
    last = given if isinstance(given, int) else 0
    version = wanted if wanted is not None else max(int(time.time()), last + 1)
    if d.is_dir():
        write_json_atomic(f, {**seen, name: max(version, last)})
    return version


def sign_bundle(
    bundle: str | os.PathLike[str],
    key: str,
    *,
    version: int | None = None,
    directory: str | os.PathLike[str] | None = None,
) -> SignResult:
    """Sign the bundle at ``bundle`` with ``key`` (a name in the keys dir, or a PEM path).

    The bundle is verified first (exactly its files, every hash). Its manifest gets ``name`` (when it
    has none) and ``version`` (``version``, else the next one for its name: see :func:`_next_version`),
    is rewritten through the validated writer, and ``manifest.sig`` is written over its canonical bytes.
    Artifacts are never touched.
    """
    private, _ = load_signing_key(key, directory)
    if version is not None and not (isinstance(version, int) and 1 <= version < (1 << 53)):
        raise SignatureError(f"--version must be an integer from 1 to 2^53-1, got {version!r}")
    b = Bundle.open(bundle, trust=False)
    info = b.info
    name = info.name or bundle_name(Path(info.source.file).stem if info.source else info.bundle_id, info.target.name)
    sig_path = b.path / SIGNATURE_FILE
    sig_path.unlink(missing_ok=True)  # a signature over the old manifest must not outlive it
    v = _next_version(keys_dir(directory), name, version)
    b.record("name", name)
    b.record("version", v)
    _, raw = load_manifest(b.path / "manifest.json")  # what a device will read, not what we meant to write
    pub = private.public_key()
    sig = Signature(key_id(pub), private.sign(canonical_bytes(raw)))
    write_json_atomic(sig_path, sig.to_json())
    return SignResult(b.id, name, v, sig.key_id, sig_path)
