"""Download an artifact with resume, a free-disk check, a deadline, and its sha256 verified.

HTTP(S) through urllib with ``Range: bytes=<have>-``: a 206 appends to the partial file, a 200
(a server without ranges) starts it again, a 416 means the partial file already holds everything.
The partial file (``<dir>/<sha256>.part``) survives a cut connection and a restart of the agent,
so an interrupted download continues where it stopped. ``file://`` URLs (already checked to lie
under the agent's artifact root) are copied the same way. Nothing is installed from here: the
caller gets a complete file whose sha256 is the one asked for, or a ``DownloadError``.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable
from urllib.parse import unquote, urlparse

from edge.errors import EdgeError

CHUNK = 1 << 16
POLL_S = 1.0
DISK_MARGIN = 16 << 20  # free space kept beyond the artifact: the unpacked copy needs room too (x2 below)


MAX_DOWNLOAD = 8 << 30  # the cap when a desired state declares no size (a tune trial always declares one)


class DownloadError(EdgeError):
    def __init__(self, code: str, message: str, hint: str | None = None, *, discard: bool = False) -> None:
        super().__init__(message, hint=hint)
        self.code = code  # a edge.mqtt.desired.REASONS code
        self.discard = discard  # what was written is refused: the partial file is deleted, never resumed


@dataclass(frozen=True)
class DownloadOptions:
    timeout_s: float = 600.0  # the whole download, retries included
    read_timeout_s: float = 30.0  # a server silent this long fails an attempt; the next resumes
    attempts: int = 5
    retry_delay_s: float = 0.5
    max_bytes: int = MAX_DOWNLOAD  # the most written when the desired state declares no size


Progress = Callable[[int, int | None], None]  # bytes held, total when known


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_free(directory: Path, need: int) -> None:
    free = shutil.disk_usage(directory).free
    want = 2 * need + DISK_MARGIN  # the archive, then the bundle unpacked from it
    if free < want:
        raise DownloadError(
            "disk_full",
            f"not enough free disk in {directory}: {free >> 20} MiB free, "
            f"{want >> 20} MiB needed for a {need >> 20} MiB artifact and its unpacked copy",
            hint="free space on the device, or remove old bundles from its store",
        )


def fetch(
    url: str,
    dest_dir: Path,
    sha256: str,
    *,
    size: int | None = None,
    options: DownloadOptions = DownloadOptions(),
    stop: threading.Event | None = None,
    progress: Progress | None = None,
) -> Path:
    """The artifact at ``url`` as ``dest_dir/<sha256>``, complete and verified (resuming ``<sha256>.part``)."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    done = dest_dir / sha256
    if done.is_file() and _sha256(done) == sha256:
        return done  # downloaded once per device
    part = dest_dir / f"{sha256}.part"
    limit = size if size is not None else options.max_bytes
    if _size(part) > limit:  # left by an older agent: never resumed past what may be written
        part.unlink(missing_ok=True)
    disk_bound = False
    if size is not None:
        check_free(dest_dir, max(0, size - _size(part)))
    else:  # no declared size: never more than the disk holds with its unpacked copy (an endless body ends here)
        room = _size(part) + max(0, (shutil.disk_usage(dest_dir).free - DISK_MARGIN) // 2)
        if room < limit:
            limit = room
            disk_bound = True
            if _size(part) >= limit:
                check_free(dest_dir, 1)  # nothing more fits: disk_full before any request
    try:
        return _fetch(url, part, done, sha256, size, limit, options, stop, progress)
    except DownloadError as e:
        if e.discard:
            part.unlink(missing_ok=True)
        if isinstance(e, TooBig) and disk_bound:
            raise DownloadError(
                "disk_full",
                f"artifact {_show(url)} declares no size and is over {limit} bytes, all the free disk in {dest_dir} "
                "holds beside its unpacked copy; refused and deleted",
                hint="free space on the device, or declare the artifact's size in the desired state",
            ) from None
        raise


def _fetch(
    url: str,
    part: Path,
    done: Path,
    sha256: str,
    size: int | None,
    limit: int,
    options: DownloadOptions,
    stop: threading.Event | None,
    progress: Progress | None,
) -> Path:
    deadline = time.monotonic() + options.timeout_s
    import http.client  # here, not at the top: urllib/http cost the agent ~1 MB it needs only to download
    import urllib.error

    last: str = "no attempt made"
    attempt = 0  # failed attempts in a row; a cut after progress is not one (the next attempt resumes)
    held, last_progress = _size(part), time.monotonic()
    while attempt < options.attempts:
        if stop is not None and stop.is_set():
            raise DownloadError("download_failed", "download stopped")
        if time.monotonic() >= deadline:
            raise DownloadError("timeout", f"download of {_show(url)} took over {options.timeout_s:g} s ({last})")
        try:
            total = _attempt(url, part, size, limit, options, deadline, stop, progress)
        except DownloadError:
            raise
        except (OSError, urllib.error.URLError, TimeoutError, http.client.HTTPException) as e:
            last = f"{type(e).__name__}: {getattr(e, 'reason', None) or e}"
            now_held = _size(part)
            if now_held > held:
                held, last_progress, attempt = now_held, time.monotonic(), 0
                continue
            if _is_timeout(e) and time.monotonic() - last_progress < options.read_timeout_s:
                continue  # a quiet second: look at `stop` again and resume (nothing held back is lost)
            attempt += 1
            last_progress = time.monotonic()
            if stop is not None and stop.wait(
                min(options.retry_delay_s * (2**attempt), max(0.0, deadline - time.monotonic()))
            ):
                raise DownloadError("download_failed", "download stopped") from None
            continue
        if size is not None and total != size:
            raise DownloadError(
                "sha256_mismatch",
                f"artifact {_show(url)} is {total} bytes, the desired state says {size}",
                discard=True,
            )
        got = _sha256(part)
        if got != sha256:
            part.unlink(missing_ok=True)  # a corrupt artifact is never resumed or installed
            raise DownloadError(
                "sha256_mismatch",
                f"artifact {_show(url)} has sha256 {got[:16]}..., the desired state says {sha256[:16]}...; refused before install",
            )
        os.replace(part, done)
        return done
    raise DownloadError("download_failed", f"cannot download {_show(url)} after {options.attempts} attempts: {last}")


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _is_timeout(e: BaseException) -> bool:
    return isinstance(e, TimeoutError) or isinstance(getattr(e, "reason", None), TimeoutError)


def _show(url: str) -> str:
    u = urlparse(url)
    return f"{u.scheme}://{u.netloc}{u.path}"[:200]  # never the query: a presigned URL's signature stays out of logs


class TooBig(DownloadError):
    """The artifact is longer than what may be written (its declared size, else the cap or the free disk)."""


def _too_big(url: str, total: int, limit: int, size: int | None) -> DownloadError:
    said = f"the desired state says {size}" if size is not None else f"at most {limit} are downloaded"
    return TooBig(
        "download_failed", f"artifact {_show(url)} is over {total - 1} bytes, {said}; refused and deleted", discard=True
    )


def _attempt(
    url: str,
    part: Path,
    size: int | None,
    limit: int,
    options: DownloadOptions,
    deadline: float,
    stop: threading.Event | None,
    progress: Progress | None,
) -> int:
    have = _size(part)
    total: int | None  # the artifact's size, where the source says it
    u = urlparse(url)
    if u.scheme == "file":
        src = Path(unquote(u.path))
        if not src.is_file():
            raise DownloadError("download_failed", f"artifact {_show(url)} does not exist")
        total = src.stat().st_size
        if total > limit:
            raise _too_big(url, total + 1, limit, size)
        if size is None:
            check_free(part.parent, max(0, total - have))
        with open(src, "rb") as i, open(part, "ab" if have <= total else "wb") as o:
            i.seek(have if have <= total else 0)
            _copy(i, o, have if have <= total else 0, total, deadline, stop, progress, limit=(url, limit, size))
        return part.stat().st_size
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        # reads wait at most POLL_S, so a cancelled download stops within about a second; a quiet server is
        # given read_timeout_s in all (fetch resumes after each quiet second) before it counts as a failure
        resp = urllib.request.urlopen(req, timeout=min(POLL_S, options.read_timeout_s))  # noqa: S310
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # the partial file already holds the whole artifact
            return have
        if 400 <= e.code < 500:
            raise DownloadError("download_failed", f"artifact {_show(url)}: HTTP {e.code} {e.reason}") from None
        raise
    with resp:
        if resp.status == 206:
            rng = resp.headers.get("Content-Range", "")
            if not rng.startswith(f"bytes {have}-"):
                raise OSError(f"server answered range {rng!r} to bytes={have}-")
            total = int(rng.rsplit("/", 1)[1]) if rng.rsplit("/", 1)[-1].isdigit() else None
            mode = "ab"
        else:  # 200: the whole file again
            have, mode = 0, "wb"
            length = resp.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
        if total is not None and total > limit:  # said before a byte of the body is written
            raise _too_big(url, total + 1, limit, size)
        if total is not None and size is None:
            check_free(part.parent, max(0, total - have))
        with open(part, mode) as o:
            _copy(resp, o, have, total, deadline, stop, progress, limit=(url, limit, size))  # type: ignore[arg-type]
    got = part.stat().st_size
    if total is not None and got < total:
        raise OSError(f"connection ended at {got} of {total} bytes")
    return got


def _copy(
    src: BinaryIO,
    out: BinaryIO,
    have: int,
    total: int | None,
    deadline: float,
    stop: threading.Event | None,
    progress: Progress | None,
    *,
    limit: tuple[str, int, int | None],
) -> None:
    """Copy until the end of ``src``; a body longer than ``limit`` (the declared size, else the cap) is refused
    at the first byte past it (an endless body writes no more than the limit)."""
    url, most, size = limit
    try:
        while True:
            if stop is not None and stop.is_set():
                raise DownloadError("download_failed", "download stopped")
            if time.monotonic() > deadline:
                raise DownloadError("timeout", "download deadline passed")
            chunk = src.read(CHUNK)
            if not chunk:
                break
            if have + len(chunk) > most:
                raise _too_big(url, have + len(chunk), most, size)
            out.write(chunk)
            have += len(chunk)
            if progress is not None:
                progress(have, total)
        out.flush()
        os.fsync(out.fileno())
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):  # another writer took the room meanwhile
            raise DownloadError(
                "disk_full", f"the disk filled while downloading {_show(url)}: {e.strerror}", discard=True
            ) from None
        raise


PART_KEEP_S = 24 * 3600  # a partial download younger than this is kept at start, to be resumed
_ARTIFACT = re.compile(r"[0-9a-f]{64}(\.part)?")


def clean_work_dirs(agent_dir: Path, *, now: float | None = None) -> dict[str, int]:
    """At agent start: what an earlier run left behind and nothing will use. ``staging/`` (``unpack-*`` of an
    abandoned verify) and ``tune/`` (trial bundles) are emptied; in ``downloads/`` every complete archive goes
    (its bundle was installed or refused; the store keeps installed bundles), and so does every partial one
    but the newest, when it is younger than a day (a restart mid-download resumes it). Returns what was removed."""
    removed = {"staging": 0, "tune": 0, "downloads": 0}
    for sub in ("staging", "tune"):
        for p in _entries(agent_dir / sub):
            _remove(p)
            removed[sub] += 1
    parts = []
    for p in _entries(agent_dir / "downloads"):
        if p.is_file() and not p.is_symlink() and _ARTIFACT.fullmatch(p.name) and p.name.endswith(".part"):
            parts.append((p.stat().st_mtime, p))
            continue
        _remove(p)
        removed["downloads"] += 1
    parts.sort(reverse=True)
    now = time.time() if now is None else now
    for i, (mtime, p) in enumerate(parts):
        if i > 0 or now - mtime > PART_KEEP_S:
            _remove(p)
            removed["downloads"] += 1
    return removed


def discard_download(dest_dir: Path, sha256: str) -> None:
    """The archive and partial file of ``sha256``, once its apply ended: the store holds what it needs."""
    for p in (dest_dir / sha256, dest_dir / f"{sha256}.part"):
        p.unlink(missing_ok=True)


def _entries(d: Path) -> list[Path]:
    try:
        return list(d.iterdir()) if d.is_dir() and not d.is_symlink() else []
    except OSError:
        return []


def _remove(p: Path) -> None:
    try:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    except OSError:
        pass
