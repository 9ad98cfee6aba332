"""Offline runs of toolchain drivers: a network namespace where the host allows it, else an in-process guard.

A conversion is offline by design: a toolchain that downloads something (onnx2tf's calibration
images, a hub checkpoint) makes a bundle that cannot be rebuilt. Every driver run goes through
offline_popen(): where the kernel lets us (root, or unprivileged user namespaces), the driver
starts in a network namespace of its own (util-linux ``unshare --net``: only a loopback, down,
so every socket of any protocol, from the driver and from every process it starts, fails).
Elsewhere (macOS, containers without CAP_SYS_ADMIN, user namespaces disabled) only the
in-process guard (_offline/sitecustomize.py) applies, and the manifest says so. The guard is
loaded in both cases: it names the attempts (a namespace just makes them fail).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from edge.errors import EdgeError

_HERE = Path(__file__).resolve().parent
NETNS_ENV = "EDGEKIT_NETNS"  # "0": do not use a network namespace (the in-process guard only)
NAMESPACE = "network namespace (unshare -n)"
GUARD = "in-process socket guard"
ATTEMPTS_ENV = "EDGEKIT_OFFLINE_ATTEMPTS"
GUARD_DIR = _HERE / "_offline"
_DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens there (and the guard refuses it)
OFFLINE_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
    "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    **{k: _DEAD_PROXY for k in ("http_proxy", "https_proxy", "ftp_proxy", "all_proxy",
                                "HTTP_PROXY", "HTTPS_PROXY", "FTP_PROXY", "ALL_PROXY")},
    "no_proxy": "", "NO_PROXY": "",
}
# Runs inside the candidate namespace: succeeds only where it has no interface but the loopback.
_NETNS_PROBE = "import socket, sys; names = [n for _, n in socket.if_nameindex()]; sys.exit(0 if names == ['lo'] else 7)"


@dataclass(frozen=True)
class NetworkIsolation:
    """How this host can take the network away from a child process."""

    prefix: tuple[str, ...]  # argv put before the command ("unshare", "--net", "--"); empty: no namespace
    reason: str | None  # why there is no namespace (None when there is one)

    @property
    def enforced(self) -> str:
        return NAMESPACE if self.prefix else f"{GUARD} (namespace unavailable: {self.reason})"


@functools.lru_cache(maxsize=None)
def _probe_netns(unshare: str, python: str) -> NetworkIsolation:
    tries = [("--net",)] if os.geteuid() == 0 else []
    tries += [("--net", "--map-current-user"), ("--net", "--map-root-user")]  # user namespaces (no root)
    refused: list[str] = []
    for opts in tries:
        prefix = (unshare, *opts, "--")
        try:
            p = subprocess.run([*prefix, python, "-I", "-S", "-c", _NETNS_PROBE], stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=30)
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


def network_isolation() -> NetworkIsolation:
    """A network namespace where the kernel allows one, else why not (probed once per process)."""
    if os.environ.get(NETNS_ENV, "").strip() == "0":
        return NetworkIsolation((), f"disabled by {NETNS_ENV}=0")
    if not sys.platform.startswith("linux"):
        return NetworkIsolation((), f"network namespaces are Linux-only (this is {sys.platform})")
    unshare = shutil.which("unshare")
    if unshare is None:
        return NetworkIsolation((), "util-linux `unshare` is not on PATH")
    return _probe_netns(unshare, sys.executable)


def offline_popen(argv: list[str], *, env: Mapping[str, str], attempts_log: Path | None = None,
                  namespace: bool | None = None, guard: bool = True,
                  **popen: Any) -> tuple[subprocess.Popen[Any], dict[str, Any]]:
    """Start ``argv`` (a list; no shell) with no network; the process and what was enforced.

    ``namespace``: None uses a network namespace where :func:`network_isolation` finds one, True
    requires one (EdgeError where there is none), False never uses one. ``guard`` loads the
    in-process guard in every Python process of the run (attempts appended to ``attempts_log``).
    ``env`` always gets :data:`OFFLINE_ENV` (downloaders' offline switches, a dead proxy). The
    record (``{"enforced": ...}``) is what the manifest carries.
    """
    iso = network_isolation() if namespace is not False else NetworkIsolation((), "not requested")
    if namespace and not iso.prefix:
        raise EdgeError(f"no network namespace on this host: {iso.reason}")
    if not iso.prefix and not guard:
        raise EdgeError("offline_popen needs a network namespace or the in-process guard")
    run_env = {**env, **OFFLINE_ENV}
    if guard:
        run_env["PYTHONPATH"] = str(GUARD_DIR)
        run_env[ATTEMPTS_ENV] = str(attempts_log) if attempts_log is not None else ""
    record: dict[str, Any] = {"enforced": iso.enforced, "in_process_guard": guard, "env": sorted(OFFLINE_ENV)}
    if iso.prefix:
        record["namespace_command"] = " ".join(["unshare", *iso.prefix[1:-1]])
    proc = subprocess.Popen([*iso.prefix, *argv], env=run_env, **popen)
    return proc, record


def offline_attempts(attempts_log: Path | None) -> list[str]:
    """The attempts the in-process guard refused (one line each), in order."""
    if attempts_log is None:
        return []
    try:
        return [ln for ln in attempts_log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return []
