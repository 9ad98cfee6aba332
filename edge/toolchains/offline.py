"""Offline runs of toolchain drivers: a network namespace, else a seccomp filter; never the weak guard unasked.

A conversion is offline by design: a toolchain that downloads something (onnx2tf's calibration
images, a hub checkpoint) makes a bundle that cannot be rebuilt. Every driver run goes through
offline_popen(), which uses the first of these that holds on this host:

1. a network namespace of its own (util-linux ``unshare --net``; root, or unprivileged user namespaces):
   only a loopback, down, so every socket of any protocol, from the driver and every process it starts, fails;
2. a seccomp filter (``_offline/seccomp_exec.py``, Linux x86-64/aarch64, containers without CAP_SYS_ADMIN
   included): the kernel refuses ``socket()`` for every family but AF_UNIX/AF_NETLINK, in the driver and every
   process it starts (native code, ``python -I`` children, curl);
3. only the in-process guard (_offline/sitecustomize.py): Python sockets of processes that load it. Native
   code, ``python -I`` children and other programs bypass it, so a run that would rely on it alone is refused
   unless asked for with ``EDGEKIT_ALLOW_WEAK_OFFLINE=1``; it is then logged as a warning and the manifest's
   toolchain record says ``weak``.

The guard is loaded in every case: it names the attempts (the namespace or the filter makes them fail).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from edge.errors import EdgeError

_HERE = Path(__file__).resolve().parent
NETNS_ENV = "EDGEKIT_NETNS"  # "0": do not use a network namespace
SECCOMP_ENV = "EDGEKIT_SECCOMP"  # "0": do not use the seccomp filter
WEAK_ENV = "EDGEKIT_ALLOW_WEAK_OFFLINE"  # "1": run with the in-process guard alone where nothing else holds
NAMESPACE = "network namespace (unshare -n)"
SECCOMP = "seccomp filter (no network sockets)"
GUARD = "in-process socket guard"
WEAK = "in-process socket guard only: WEAK, native code, `python -I` children and non-Python programs can reach the network"
log = logging.getLogger("edge.toolchains")
ATTEMPTS_ENV = "EDGEKIT_OFFLINE_ATTEMPTS"
GUARD_DIR = _HERE / "_offline"
_DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens there (and the guard refuses it)
OFFLINE_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "PIP_NO_INDEX": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    **{
        k: _DEAD_PROXY
        for k in (
            "http_proxy",
            "https_proxy",
            "ftp_proxy",
            "all_proxy",
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "FTP_PROXY",
            "ALL_PROXY",
        )
    },
    "no_proxy": "",
    "NO_PROXY": "",
}
# Runs inside the candidate namespace: succeeds only where it has no interface but the loopback.
_NETNS_PROBE = (
    "import socket, sys; names = [n for _, n in socket.if_nameindex()]; sys.exit(0 if names == ['lo'] else 7)"
)


@dataclass(frozen=True)
class NetworkIsolation:
    """How this host can take the network away from a child process."""

    prefix: tuple[str, ...]  # argv put before the command ("unshare", "--net", "--"); empty: no namespace
    reason: str | None  # why there is no namespace (None when there is one)
    # argv of the seccomp launcher: alone where there is no namespace, and inside the namespace too, since a
    # process that may call setns() (root in the namespace) could otherwise join the parent's network (issue #33)
    seccomp: tuple[str, ...] = ()
    seccomp_reason: str | None = None  # why there is no seccomp filter (when none is used)

    @property
    def enforced(self) -> str:
        if self.prefix:
            return f"{NAMESPACE} + {SECCOMP}" if self.seccomp else NAMESPACE
        if self.seccomp:
            return f"{SECCOMP} (namespace unavailable: {self.reason})"
        return f"{WEAK} (namespace unavailable: {self.reason}; seccomp unavailable: {self.seccomp_reason})"

    @property
    def holds(self) -> bool:
        """Whether the kernel enforces it (namespace or seccomp), not only the in-process guard."""
        return bool(self.prefix or self.seccomp)


@functools.cache
def _probe_netns(unshare: str, python: str) -> NetworkIsolation:
    tries: list[tuple[str, ...]] = [("--net",)] if os.geteuid() == 0 else []
    tries += [("--net", "--map-current-user"), ("--net", "--map-root-user")]  # user namespaces (no root)
    refused: list[str] = []
    for opts in tries:
        prefix = (unshare, *opts, "--")
        try:
            p = subprocess.run(
                [*prefix, python, "-I", "-S", "-c", _NETNS_PROBE],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            refused.append(f"`unshare {' '.join(opts)}`: {type(e).__name__}: {e}")
            continue
        if p.returncode == 0:
            return NetworkIsolation(prefix, None)
        why = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
        if p.returncode == 7:
            why = "the new namespace still has interfaces other than the loopback"
        refused.append(f"`unshare {' '.join(opts)}`: {why[:200]}")
    return NetworkIsolation((), "; ".join(dict.fromkeys(refused)))


_SECCOMP_PROBE = (
    "import errno, socket, sys\ntry:\n    socket.socket()\nexcept PermissionError:\n    "
    "socket.socket(socket.AF_UNIX).close(); sys.exit(0)\nsys.exit(7)"
)


@functools.cache
def _probe_seccomp(python: str) -> tuple[tuple[str, ...], str | None]:
    prefix = (python, "-I", "-S", str(GUARD_DIR / "seccomp_exec.py"), "--")
    try:
        p = subprocess.run(
            [*prefix, python, "-I", "-S", "-c", _SECCOMP_PROBE],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return (), f"{type(e).__name__}: {e}"
    if p.returncode == 0:
        return prefix, None
    why = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
    return (), ("the filter did not stop a socket" if p.returncode == 7 else why[:200])


def seccomp_isolation() -> tuple[tuple[str, ...], str | None]:
    """The seccomp launcher's argv prefix where this host applies the filter, else (), why not."""
    if os.environ.get(SECCOMP_ENV, "").strip() == "0":
        return (), f"disabled by {SECCOMP_ENV}=0"
    if not sys.platform.startswith("linux"):
        return (), f"seccomp is Linux-only (this is {sys.platform})"
    import platform

    if platform.machine() not in ("x86_64", "aarch64"):
        return (), f"no filter written for {platform.machine()}"
    return _probe_seccomp(sys.executable)


def network_isolation() -> NetworkIsolation:
    """What a default :func:`offline_popen` uses: a network namespace where the kernel allows one, else the
    seccomp filter where it applies, else neither, with why not (probed once per process)."""
    iso = _namespace_isolation()
    sc, why = seccomp_isolation()
    return NetworkIsolation(iso.prefix, iso.reason, sc, why)


def _namespace_isolation() -> NetworkIsolation:
    if os.environ.get(NETNS_ENV, "").strip() == "0":
        return NetworkIsolation((), f"disabled by {NETNS_ENV}=0")
    if not sys.platform.startswith("linux"):
        return NetworkIsolation((), f"network namespaces are Linux-only (this is {sys.platform})")
    unshare = shutil.which("unshare")
    if unshare is None:
        return NetworkIsolation((), "util-linux `unshare` is not on PATH")
    return _probe_netns(unshare, sys.executable)


def offline_popen(
    argv: list[str],
    *,
    env: Mapping[str, str],
    attempts_log: Path | None = None,
    namespace: bool | None = None,
    seccomp: bool | None = None,
    guard: bool = True,
    **popen: Any,
) -> tuple[subprocess.Popen[Any], dict[str, Any]]:
    """Start ``argv`` (a list; no shell) with no network; the process and what was enforced.

    ``namespace``: None uses a network namespace where :func:`network_isolation` finds one, True
    requires one (EdgeError where there is none), False never uses one. ``seccomp``, likewise for the
    seccomp filter, used where there is no namespace. ``guard`` loads the in-process guard in every Python
    process of the run (attempts appended to ``attempts_log``). Neither namespace nor filter: refused, unless
    both were turned off by the caller (``namespace=False, seccomp=False``) or ``$EDGEKIT_ALLOW_WEAK_OFFLINE=1``
    (a warning; the record says ``weak``). ``env`` always gets :data:`OFFLINE_ENV` (downloaders' offline
    switches, a dead proxy). The record (``{"enforced": ...}``) is what the manifest carries.
    """
    iso = _namespace_isolation() if namespace is not False else NetworkIsolation((), "not requested")
    if namespace and not iso.prefix:
        raise EdgeError(f"no network namespace on this host: {iso.reason}")
    if iso.prefix and seccomp is not False:  # the filter inside the namespace: setns() back out finds no socket
        sc, why = seccomp_isolation()
        if seccomp and not sc:
            raise EdgeError(f"no seccomp filter on this host: {why}")
        iso = NetworkIsolation(iso.prefix, None, sc, why)
    if not iso.prefix:
        sc, why = seccomp_isolation() if seccomp is not False else ((), "not requested")
        if seccomp and not sc:
            raise EdgeError(f"no seccomp filter on this host: {why}")
        iso = NetworkIsolation((), iso.reason, sc, why)
    if not iso.holds and not guard:
        raise EdgeError("offline_popen needs a network namespace, the seccomp filter or the in-process guard")
    if not iso.holds:
        asked = namespace is False and seccomp is False
        if not asked and os.environ.get(WEAK_ENV, "").strip() != "1":
            raise EdgeError(
                f"cannot run a toolchain offline on this host: no network namespace ({iso.reason}) and "
                f"no seccomp filter ({iso.seccomp_reason}); the in-process socket guard alone is "
                "bypassed by native code, `python -I` children and curl",
                hint=f"set {WEAK_ENV}=1 to convert with the weak guard anyway (the manifest records it)",
            )
        log.warning(
            "toolchain run guarded by the in-process socket guard ONLY (WEAK: %s; %s)",
            "native code, `python -I` children and non-Python programs can reach the network",
            f"no namespace: {iso.reason}; no seccomp: {iso.seccomp_reason}",
        )
    run_env = {**env, **OFFLINE_ENV}
    if guard:
        run_env["PYTHONPATH"] = str(GUARD_DIR)
        run_env[ATTEMPTS_ENV] = str(attempts_log) if attempts_log is not None else ""
    record: dict[str, Any] = {
        "enforced": iso.enforced,
        "in_process_guard": guard,
        "env": sorted(OFFLINE_ENV),
        "weak": not iso.holds,
    }
    if iso.prefix:
        record["namespace_command"] = " ".join(["unshare", *iso.prefix[1:-1]])
    proc = subprocess.Popen([*iso.prefix, *iso.seccomp, *argv], env=run_env, **popen)
    return proc, record


def offline_attempts(attempts_log: Path | None) -> list[str]:
    """The attempts the in-process guard refused (one line each), in order."""
    if attempts_log is None:
        return []
    try:
        return [ln for ln in attempts_log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return []
