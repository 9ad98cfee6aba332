"""Declared capabilities: what a converter or runner needs, checked before any work starts.

A backend lists ``Requirement`` objects; ``doctor`` and the planner ask each for its
``problem()`` on this host. Nothing here imports a runtime: packages are looked up with
``importlib.util.find_spec``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal

from edge.errors import HardwareUnavailableError, MissingDependencyError

_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64", "armv8": "aarch64"}


@dataclass(frozen=True)
class Host:
    os: str  # "linux", "darwin", "windows"
    arch: str  # "x86_64", "aarch64", ...
    nvidia_gpu: bool
    jetson: bool

    def describe(self) -> str:
        extra = ", NVIDIA GPU" if self.nvidia_gpu else ", no NVIDIA GPU"
        return f"{self.os}/{self.arch}{extra}" + (", Jetson" if self.jetson else "")


def normalize_arch(arch: str) -> str:
    a = arch.lower()
    return _ARCH_ALIASES.get(a, a)


@functools.lru_cache(maxsize=1)
def current_host() -> Host:
    os_name = {"linux": "linux", "darwin": "darwin", "win32": "windows"}.get(sys.platform, sys.platform)
    jetson = Path("/etc/nv_tegra_release").exists()
    nvidia = jetson or Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None
    return Host(os=os_name, arch=normalize_arch(platform.machine()), nvidia_gpu=nvidia, jetson=jetson)


RequirementKind = Literal["python", "binary", "os", "arch", "nvidia-gpu"]


@dataclass(frozen=True)
class Requirement:
    """One thing a step needs. ``install`` is the next step a user takes when it is missing."""

    kind: RequirementKind
    name: str  # import name, binary name, os name(s) joined by "|", arch(s) joined by "|"
    install: str = ""
    why: str = ""

    def problem(self, host: Host | None = None) -> str | None:
        """None when satisfied on ``host``, else one line saying what is missing and how to get it."""
        host = host or current_host()
        ok: bool
        if self.kind == "python":
            ok = _has_module(self.name)
            what = f"Python package providing '{self.name}' is not installed"
        elif self.kind == "binary":
            ok = shutil.which(self.name) is not None
            what = f"program '{self.name}' is not on PATH"
        elif self.kind == "os":
            allowed = self.name.split("|")
            ok = host.os in allowed
            what = f"needs OS {' or '.join(allowed)}; this host is {host.os}"
        elif self.kind == "arch":
            allowed = [normalize_arch(a) for a in self.name.split("|")]
            ok = host.arch in allowed
            what = f"needs CPU architecture {' or '.join(allowed)}; this host is {host.arch}"
        elif self.kind == "nvidia-gpu":
            ok = host.nvidia_gpu
            what = "needs an NVIDIA GPU; none found (no /proc/driver/nvidia, no nvidia-smi)"
        else:  # pragma: no cover - closed set
            raise ValueError(self.kind)
        if ok:
            return None
        parts = [what]
        if self.why:
            parts.append(self.why)
        if self.install:
            parts.append(self.install)
        return "; ".join(parts)


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def problems(reqs: Iterable[Requirement], host: Host | None = None) -> list[str]:
    return [p for r in reqs if (p := r.problem(host)) is not None]


def require(reqs: Iterable[Requirement], what: str, host: Host | None = None) -> None:
    """Raise one error listing every unmet requirement of ``what`` (not just the first)."""
    reqs = list(reqs)
    found = problems(reqs, host)
    if not found:
        return
    hardware = any(r.kind in ("os", "arch", "nvidia-gpu") and r.problem(host) for r in reqs)
    cls = HardwareUnavailableError if hardware else MissingDependencyError
    raise cls(f"{what}: " + "; ".join(found))


def pip_extra(extra: str) -> str:
    return f"install it with: pip install 'edgekit-ml[{extra}]'"


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
