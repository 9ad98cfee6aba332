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


#: CPU features that change what quantized/bf16 kernels compute, or how fast (Linux /proc/cpuinfo names).
ISA_FLAGS = (
    "avx2",
    "avx512f",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "amx_fp16",  # x86-64
    "asimddp",
    "asimdhp",
    "i8mm",
    "bf16",
    "sve",  # aarch64: dot product, fp16 arithmetic, int8 matmul, bf16, SVE
)


@dataclass(frozen=True)
class CpuIsa:
    """The build/run host's CPU as the int8 and bf16 kernels see it."""

    model: str
    flags: frozenset[str]  # the subset of ISA_FLAGS present; empty when unknown
    known: bool  # False where the OS does not expose CPU flags to us (non-Linux)

    @property
    def int8_dot_product(self) -> bool:
        """A u8*s8 dot product that accumulates in 32 bits (VNNI, AMX, ARM SDOT/UDOT).

        Without it, x86 int8 kernels multiply with ``vpmaddubsw``, whose int16 pair sums
        saturate: U8S8 int8 models can compute something else than on a VNNI CPU.
        """
        return bool(self.flags & {"avx512_vnni", "avx_vnni", "amx_int8", "asimddp"})

    @property
    def native_fp16(self) -> bool:
        """fp16 arithmetic in the vector unit (AVX512-FP16, AMX-FP16, ARM's FEAT_FP16 ``asimdhp``); F16C only
        converts, so XNNPack's fp16 on such an x86 CPU would compute in f32 around conversions."""
        return bool(self.flags & {"avx512_fp16", "amx_fp16", "asimdhp"})

    @property
    def native_bf16(self) -> bool:
        return bool(self.flags & {"avx512_bf16", "amx_bf16", "bf16"})

    @property
    def isa_class(self) -> str:
        """The class of CPU a measurement stands for, from the fastest kernels the runtimes can pick on it:
        one of :data:`ISA_CLASSES`. Two hosts of one class run the same kernels (the speed per core still
        differs); a figure measured on one class says little about another (AMX runs bf16 and int8 2-3x
        faster than AVX2 does fp32)."""
        f = self.flags
        if not self.known:
            return "unknown"
        if f & {"amx_tile", "amx_int8", "amx_bf16", "amx_fp16"}:
            return "AMX"
        if "avx512_vnni" in f:
            return "AVX-512 VNNI"
        if "avx512f" in f:
            return "AVX-512"
        if "avx_vnni" in f:
            return "AVX2 + AVX-VNNI"
        if "avx2" in f:
            return "AVX2-only"
        if "i8mm" in f:
            return "ARM i8mm"
        if "asimddp" in f:
            return "ARM dot product"
        if f & {"asimdhp", "bf16", "sve"}:
            return "ARM (no dot product)"
        return "baseline (no AVX2, no ARM dot product)"

    def describe(self) -> str:
        if not self.known:
            return f"{self.model} (CPU flags unknown on this OS)"
        return f"{self.model} ({', '.join(sorted(self.flags)) or 'none of ' + '/'.join(ISA_FLAGS[:3])})"

    def to_json(self) -> dict[str, object]:
        return {
            "model": self.model,
            "flags": sorted(self.flags),
            "known": self.known,
            "int8_dot_product": self.int8_dot_product,
            "native_bf16": self.native_bf16,
            "isa_class": self.isa_class,
        }


#: what :attr:`CpuIsa.isa_class` answers, fastest kernels first (x86-64, then aarch64)
ISA_CLASSES = (
    "AMX",
    "AVX-512 VNNI",
    "AVX-512",
    "AVX2 + AVX-VNNI",
    "AVX2-only",
    "ARM i8mm",
    "ARM dot product",
    "ARM (no dot product)",
    "baseline (no AVX2, no ARM dot product)",
    "unknown",
)


def measured_on(isa: CpuIsa | None = None) -> str:
    """One line that travels with every measurement: when, the CPU and its ISA class, the CPUs this process may
    use, and the load (``uptime``'s three load averages) -- a figure without them cannot be compared with one
    from another machine, or from the same machine under other load."""
    import time

    isa = isa or cpu_isa()
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except (AttributeError, OSError):
        load = "unknown"
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return f"{when}: {isa.model} [{isa.isa_class}], {cpus} CPUs, load average {load}"


#: ARM Ltd. (implementer 0x41) core part numbers as aarch64 Linux's /proc/cpuinfo gives them ("CPU part"), which
#: carries no model name there: the Raspberry Pi 3/4/5 cores, Graviton's Neoverse, the Jetson Orin's A78AE
ARM_PARTS = {
    "0xd03": "Cortex-A53",
    "0xd04": "Cortex-A35",
    "0xd05": "Cortex-A55",
    "0xd07": "Cortex-A57",
    "0xd08": "Cortex-A72",
    "0xd09": "Cortex-A73",
    "0xd0a": "Cortex-A75",
    "0xd0b": "Cortex-A76",
    "0xd0c": "Neoverse-N1",
    "0xd0d": "Cortex-A77",
    "0xd40": "Neoverse-V1",
    "0xd41": "Cortex-A78",
    "0xd42": "Cortex-A78AE",
    "0xd46": "Cortex-A510",
    "0xd47": "Cortex-A710",
    "0xd49": "Neoverse-N2",
    "0xd4f": "Neoverse-V2",
}


def parse_cpuinfo(text: str) -> CpuIsa:
    """The first processor block of a /proc/cpuinfo text (x86 "flags", ARM "Features"; an ARM Ltd. core is named
    from its "CPU implementer"/"CPU part": aarch64 Linux gives no model name, or a generic "ARMv8 Processor")."""
    model, flags = "", frozenset[str]()
    arm: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model", "hardware") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = frozenset(value.split()) & frozenset(ISA_FLAGS)
        elif key in ("cpu implementer", "cpu part"):
            arm.setdefault(key, value.strip().lower())
    if arm.get("cpu implementer") == "0x41" and arm.get("cpu part") in ARM_PARTS:  # over "ARMv8 Processor rev 1"
        model = f"ARM {ARM_PARTS[arm['cpu part']]}"
    return CpuIsa(model=model or platform.processor() or platform.machine(), flags=flags, known=bool(text))


@functools.lru_cache(maxsize=1)
def cpu_isa() -> CpuIsa:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    return parse_cpuinfo(text)


def pip_extra(extra: str) -> str:
    return f"install it with: pip install 'edgekit-ml[{extra}]'"


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
