"""How a bundle travels to a device: one uncompressed tar of the bundle directory's files.

``pack_bundle`` (build host, the rollout side) writes the bundle's files (manifest, signature,
every listed artifact) at the top level of the tar, in a fixed order with fixed metadata, so the
same bundle always packs to the same bytes and the same sha256. ``unpack_bundle`` (device) takes
only regular files and directories with plain relative names -- no links, devices, absolute
paths, ``..`` or names starting with '.' or '-' -- within a size and member bound, into a fresh
staging directory; the caller then opens it with ``Bundle.open`` (every listed sha256, exactly
the listed files, the signature where a trust store exists) before anything is installed.
"""

from __future__ import annotations

import hashlib
import io
import os
import secrets
import shutil
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any

from edge.errors import EdgeError

MAX_MEMBERS = 4096
MAX_UNPACKED = 8 << 30


class ArchiveError(EdgeError):
    """A bundle archive the device refuses to unpack."""


def pack_bundle(bundle_dir: str | os.PathLike[str], out: str | os.PathLike[str]) -> str:
    """Write ``out`` (a tar of the bundle directory's files); returns its sha256."""
    from edge.bundle.bundle import Bundle

    b = Bundle.open(bundle_dir, trust=False)  # verified: what is packed is what the manifest lists
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{secrets.token_hex(4)}")
    with open(tmp, "wb") as f:
        _write_tar(Path(b.path), f)
    os.replace(tmp, out)
    h = hashlib.sha256()
    with open(out, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def archive_sha256(bundle_dir: str | os.PathLike[str]) -> str:
    """The sha256 ``pack_bundle`` would give this bundle directory, computed without writing the archive:
    the device uses it to tell that a bundle already in its store is the artifact a desired state names."""
    sink = _HashSink()
    _write_tar(Path(bundle_dir), sink)
    return sink.h.hexdigest()


class _HashSink:
    """A write-only file that hashes what tarfile writes to it."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.n = 0

    def write(self, data: bytes) -> int:
        self.h.update(data)
        self.n += len(data)
        return len(data)

    def tell(self) -> int:
        return self.n


def _write_tar(root: Path, f: Any) -> None:
    """The bundle directory's files as one tar, in a fixed order with fixed metadata (same bundle, same bytes)."""
    names = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            p = root / name
            info = tar.gettarinfo(str(p), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            info.mode = 0o755 if info.isdir() else 0o644
            if info.isdir():
                tar.addfile(info)
            elif info.isfile():
                with open(p, "rb") as src:
                    tar.addfile(info, src)
            else:
                raise ArchiveError(f"{p} is neither a file nor a directory; a bundle holds only those")


def _safe_name(name: str) -> str:
    p = PurePosixPath(name)
    if (
        not name
        or p.is_absolute()
        or any(part in ("", ".", "..") for part in p.parts)
        or "\\" in name
        or any(part.startswith((".", "-")) for part in p.parts)
        or any(ord(c) < 0x20 for c in name)
    ):
        raise ArchiveError(f"bundle archive member {name[:200]!r} is not a plain relative name")
    return str(p)


def unpack_bundle(
    archive: str | os.PathLike[str], staging: str | os.PathLike[str], *, sha256: str | None = None
) -> Path:
    """Unpack ``archive`` into a new directory under ``staging``; returns it (the caller removes it).

    With ``sha256`` the archive's bytes are hashed first, from the same open file that is then unpacked, and
    nothing is written unless they match. Only regular files and directories with plain names are taken, each
    name once (no duplicate, no file under a file's name, no file where a directory was); sparse members are
    refused, so what is unpacked is bytes the archive holds: at most its own size."""
    staging = Path(staging)
    try:
        f = open(archive, "rb")  # noqa: SIM115 - closed below, after the tar read from it
    except OSError as e:
        raise ArchiveError(f"cannot read the bundle archive: {e.strerror or e}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if sha256 is not None:
            got = _hash(f)
            if got != sha256:
                raise ArchiveError(
                    f"bundle archive has sha256 {got[:16]}..., {sha256[:16]}... was expected; nothing unpacked"
                )
            f.seek(0)
        staging.mkdir(parents=True, exist_ok=True)
        dest = staging / f"unpack-{secrets.token_hex(6)}"
        dest.mkdir()
        try:
            _unpack(f, dest, min(size, MAX_UNPACKED))
        except (tarfile.TarError, EOFError, io.UnsupportedOperation) as e:
            shutil.rmtree(dest, ignore_errors=True)
            raise ArchiveError(f"bundle archive is damaged: {e}") from None
        except OSError as e:  # a name clash the checks missed, a full disk: a refusal, never a traceback
            shutil.rmtree(dest, ignore_errors=True)
            raise ArchiveError(f"cannot unpack the bundle archive: {type(e).__name__}: {e.strerror or e}") from None
        except BaseException:
            shutil.rmtree(dest, ignore_errors=True)
            raise
    return dest


def _hash(f: Any) -> str:
    h = hashlib.sha256()
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
    return h.hexdigest()


def _unpack(f: Any, dest: Path, most: int) -> None:
    """The members of the tar open on ``f`` into ``dest``: ``most`` bytes at most in all."""
    try:
        tar = tarfile.open(fileobj=f, mode="r:")
    except tarfile.TarError as e:
        raise ArchiveError(f"bundle archive is not a tar file: {e}") from None
    seen: dict[str, bool] = {}  # name -> is a directory
    with tar:
        total = 0
        for n, m in enumerate(tar):
            if n >= MAX_MEMBERS:
                raise ArchiveError(f"bundle archive has more than {MAX_MEMBERS} members")
            name = _safe_name(m.name)
            _check_member(m, name, seen)
            out = dest / name
            if m.isdir():
                out.mkdir(parents=True, exist_ok=True)
                continue
            total += m.size
            if total > most:
                raise ArchiveError(
                    f"bundle archive unpacks to more than {most} bytes (its own size, or the {MAX_UNPACKED >> 30} GiB bound)"
                )
            out.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(m)
            if src is None:  # pragma: no cover - regular members always have data
                raise ArchiveError(f"bundle archive member {name!r} has no data")
            with src, open(out, "xb") as o:
                shutil.copyfileobj(src, o, 1 << 20)
                if o.tell() != m.size:
                    raise ArchiveError(f"bundle archive member {name!r} is cut short")


def _check_member(m: tarfile.TarInfo, name: str, seen: dict[str, bool]) -> None:
    """A regular file or a directory, not sparse, whose name clashes with no member before it."""
    if m.isdir():
        kind = True
    elif (
        m.type in (tarfile.REGTYPE, tarfile.AREGTYPE)
        and not m.issparse()
        and not any(k.startswith("GNU.sparse") for k in m.pax_headers)
    ):
        kind = False
    else:
        what = (
            "sparse"
            if m.issparse()
            or m.type == tarfile.GNUTYPE_SPARSE
            or any(k.startswith("GNU.sparse") for k in m.pax_headers)
            else "a link, a device or a special member"
        )
        raise ArchiveError(f"bundle archive member {name!r} is {what}; a bundle holds regular files only")
    if name in seen and not (kind and seen[name]):
        raise ArchiveError(f"bundle archive holds {name!r} twice")
    parts = name.split("/")
    for i in range(1, len(parts)):
        parent = "/".join(parts[:i])
        if seen.get(parent) is False:
            raise ArchiveError(f"bundle archive member {name!r} lies under the file {parent!r}")
        seen[parent] = True  # a directory from now on, named or not
    seen[name] = kind
