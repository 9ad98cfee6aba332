"""What every toolchain shares: where toolchains live, their state file, lock hashing and the status record.

Kept apart from ``edge.toolchains`` (which re-exports it) so that a toolchain of another kind
(``edge.toolchains.aarch64``: an emulator, not a venv) uses the same pieces without importing the package
that dispatches to it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from edge.errors import EdgeError

ENV_VAR = "EDGEKIT_TOOLCHAINS"
STATE_FILE = "toolchain.json"

Output = Callable[[str], None]


def root() -> Path:
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(cache) if cache else Path.home() / ".cache") / "edgekit" / "toolchains"


INSTALLERS = ("pip", "setuptools")  # come with the Python build, not with the spec: left out of locks


def lock_lines(freeze_lines: Iterable[str]) -> list[str]:
    """``pip freeze --all`` lines that describe the environment: sorted, without pip/setuptools."""
    out = [ln.strip() for ln in freeze_lines if ln.strip() and not ln.startswith("#")]
    return sorted(ln for ln in out if ln.split("==")[0].lower() not in INSTALLERS)


def lock_hash(freeze_lines: Iterable[str]) -> str:
    lines = lock_lines(freeze_lines)
    return hashlib.sha256(("\n".join(lines) + "\n").encode()).hexdigest()


@dataclass
class ToolchainStatus:
    name: str
    path: Path
    installed: bool
    problem: str | None = None  # why it is not usable (None when it is)
    python: str | None = None
    lock_hash: str | None = None
    reference_lock: bool | None = None  # installed with the reference lock as constraints
    matches_reference: bool | None = None  # freeze equals the reference lock exactly
    packages: dict[str, str] = field(default_factory=dict)
    created_utc: str | None = None
    install_seconds: float | None = None
    offline: dict[str, Any] | None = None  # set on the status run_driver returns: what kept that run offline

    @property
    def usable(self) -> bool:
        return self.installed and self.problem is None

    @property
    def venv(self) -> Path:
        return self.path / "venv"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = str(self.path)
        d["usable"] = self.usable
        if d["offline"] is None:
            del d["offline"]
        return d

    def manifest_record(self) -> dict[str, Any]:
        """What a converter writes into the manifest: enough to rebuild the environment exactly."""
        record = {
            "name": self.name,
            "lock_hash": self.lock_hash,
            "python": self.python,
            "reference_lock": self.reference_lock,
            "matches_reference": self.matches_reference,
            "packages": self.packages,
        }
        if self.offline is not None:
            record["offline"] = self.offline
        return record


def run_logged(cmd: list[str], log: Any, on_output: Output | None, *, env: Mapping[str, str] | None = None) -> str:
    """Run ``cmd`` (an install step), streaming its output lines to ``log`` and ``on_output``; the output on success."""
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        env=dict(env) if env is not None else None,
    )
    lines: list[str] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            lines.append(line)
            log.write(line)
            if on_output is not None:
                on_output(line.rstrip("\n"))
        rc = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    out = "".join(lines)
    if rc != 0:
        tail = " | ".join(ln.strip() for ln in lines[-8:] if ln.strip())
        raise EdgeError(
            f"`{' '.join(cmd[:4])} ...` failed with exit code {rc}: {tail[-1200:]}", hint=f"full log: {log.name}"
        )
    return out


def others_can_write(paths: Iterable[Path]) -> tuple[Path, str] | None:
    """Why a toolchain's files are not the user's own (None: they are): a path on its import or run path owned by
    another user than this one or root, or writable by group or others. Everything a toolchain records about
    itself (``toolchain.json``: hashes, fingerprints) sits in its own directory, so it vouches for nothing against
    whoever can write there: like ssh's StrictModes, edgekit then refuses to run it (a shared ``$EDGEKIT_TOOLCHAINS``
    made with umask 002, a cache another account can write). A symlink's own mode means nothing: its owner counts."""
    import stat

    uid = getattr(os, "getuid", lambda: 0)()
    for p in paths:
        try:
            st = p.lstat()
        except OSError:
            continue  # a missing piece is the caller's own problem to report
        if st.st_uid not in (uid, 0):
            return p, f"{p} belongs to another user (uid {st.st_uid})"
        writable = 0 if stat.S_ISLNK(st.st_mode) else st.st_mode & 0o022
        if writable & 0o020 and _private_group(st.st_gid, uid):
            writable &= ~0o020  # umask 002 with a group of one's own (Debian/Ubuntu users): as ssh's Debian patch does
        if writable:
            who = "group and others" if writable == 0o022 else "group" if writable & 0o020 else "others"
            return p, f"{p} is writable by {who} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _private_group(gid: int, uid: int) -> bool:
    """The user's own primary group with no other member (a user private group)."""
    try:
        import grp
        import pwd

        user = pwd.getpwuid(uid)
        members = set(grp.getgrgid(gid).gr_mem)
    except (ImportError, KeyError):
        return False
    return gid == user.pw_gid and members <= {user.pw_name}


def guarded_paths(toolchain: Path, *inner: Path) -> list[Path]:
    """The toolchain's directory and each directory above it up to the toolchains root, its state file, and the
    ``inner`` paths (what runs: the interpreter, its bin and site-packages directories, the emulator)."""
    top = root()
    chain, p = [toolchain], toolchain
    while p != top and p.parent != p and top in p.parents:
        p = p.parent
        chain.append(p)
    return [*chain, toolchain / STATE_FILE, *inner]


def permission_problem(toolchain: Path, *inner: Path, again: str) -> str | None:
    """``others_can_write`` over ``guarded_paths`` as the status line a toolchain reports, or None."""
    found = others_can_write(guarded_paths(toolchain, *inner))
    if found is None:
        return None
    path, why = found
    fix = f"chmod -R go-w {toolchain}" if path == toolchain or toolchain in path.parents else f"chmod go-w {path}"
    return f"toolchain at {toolchain} is not safe to run: {why}; its own records cannot vouch for it (fix with: {fix}, or {again})"
