"""Process and system health from /proc, without psutil (the agent stays small).

Everything here returns ``None`` for what the platform does not expose (macOS, Windows,
a container without /proc), never raises for a missing file.
"""

from __future__ import annotations

import os
import platform
import socket
import time
from pathlib import Path
from typing import Any

PROC = Path("/proc")
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read(path: Path | str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def process_cpu_seconds(proc: Path = PROC) -> float | None:
    """utime + stime of this process in seconds (children not included)."""
    stat = _read(proc / "self" / "stat")
    if stat is None:
        try:
            t = os.times()
            return t.user + t.system
        except OSError:  # pragma: no cover
            return None
    # the command name (field 2) may contain spaces and parentheses: split after the last ')'
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # fields 14 and 15 of the full line


def system_cpu_ticks(proc: Path = PROC) -> tuple[int, int] | None:
    """(busy, total) jiffies over all CPUs since boot, from the first line of /proc/stat."""
    stat = _read(proc / "stat")
    if not stat:
        return None
    parts = stat.splitlines()[0].split()
    if parts[0] != "cpu":
        return None
    vals = [int(v) for v in parts[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    total = sum(vals[:8])  # guest time is already counted in user
    return total - idle, total


def rss_mb(proc: Path = PROC) -> float | None:
    status = _read(proc / "self" / "status")
    if status:
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return None


def meminfo_mb(proc: Path = PROC) -> dict[str, float]:
    out: dict[str, float] = {}
    text = _read(proc / "meminfo") or ""
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable") and rest.split():
            out[key] = int(rest.split()[0]) / 1024
    return out


def loadavg(proc: Path = PROC) -> float | None:
    text = _read(proc / "loadavg")
    return float(text.split()[0]) if text else None


def system_uptime_s(proc: Path = PROC) -> float | None:
    text = _read(proc / "uptime")
    return float(text.split()[0]) if text else None


class CpuMeter:
    """CPU % of this process and of the whole system between two ``sample()`` calls (100 = one core)."""

    def __init__(self, proc: Path = PROC) -> None:
        self._proc = proc
        self._t = time.monotonic()
        self._cpu = process_cpu_seconds(proc)
        self._sys = system_cpu_ticks(proc)

    def sample(self) -> dict[str, float | None]:
        t, cpu, sys_ = time.monotonic(), process_cpu_seconds(self._proc), system_cpu_ticks(self._proc)
        dt = t - self._t
        proc_pct = None
        if cpu is not None and self._cpu is not None and dt > 0:
            proc_pct = 100.0 * (cpu - self._cpu) / dt
        sys_pct = None
        if sys_ is not None and self._sys is not None and sys_[1] > self._sys[1]:
            sys_pct = 100.0 * (sys_[0] - self._sys[0]) / (sys_[1] - self._sys[1])
        self._t, self._cpu, self._sys = t, cpu, sys_
        return {"process_cpu_percent": _r(proc_pct), "system_cpu_percent": _r(sys_pct)}


def _r(v: float | None, nd: int = 2) -> float | None:
    return None if v is None else round(v, nd)


def device_model() -> str | None:
    """The board's own name where the firmware tells it (Raspberry Pi, Jetson, most ARM boards)."""
    for p in ("/proc/device-tree/model", "/sys/firmware/devicetree/base/model"):
        text = _read(p)
        if text:
            return text.strip("\x00\n ")
    text = _read("/sys/class/dmi/id/product_name")
    return text.strip() if text else None


def host_facts() -> dict[str, Any]:
    """What a fleet operator wants to know about the box, once per birth."""
    from edge.capabilities import cpu_isa, current_host

    h = current_host()
    mem = meminfo_mb()
    return {
        "hostname": socket.gethostname(),
        "os": h.os,
        "arch": h.arch,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "mem_total_mb": _r(mem.get("MemTotal"), 1),
        "model": device_model(),
        "cpu": cpu_isa().model,  # "ARM Cortex-A76" on a Raspberry Pi 5 (or under qemu -cpu cortex-a76)
        "nvidia_gpu": h.nvidia_gpu,
        "jetson": h.jetson,
    }


def process_and_system(meter: CpuMeter) -> dict[str, Any]:
    mem = meminfo_mb()
    cpu = meter.sample()
    return {
        "process": {"cpu_percent": cpu["process_cpu_percent"], "rss_mb": _r(rss_mb(), 1), "threads": _thread_count()},
        "system": {
            "cpu_percent": cpu["system_cpu_percent"],
            "load1": loadavg(),
            "mem_available_mb": _r(mem.get("MemAvailable"), 1),
            "uptime_s": _r(system_uptime_s(), 0),
        },
    }


def _thread_count() -> int | None:
    status = _read(PROC / "self" / "status")
    if status:
        for line in status.splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return None
