"""Temperatures and throttling, from whatever the platform exposes.

- Linux thermal zones: ``/sys/class/thermal/thermal_zone*/{type,temp}`` (millidegrees C).
- x86 CPU thermal throttling events: ``/sys/devices/system/cpu/cpu*/thermal_throttle/*_throttle_count``.
- Raspberry Pi: the firmware's throttled flags, from sysfs (``get_throttled``) or ``vcgencmd get_throttled``.
- Coral Edge TPU (PCIe/M.2): ``/sys/class/apex/apex_N/temp`` (millidegrees C).
- Jetson: ``tegrastats`` (GPU load, per-rail power, more temperatures), see ``edge.agent.tegrastats``.

Each source is probed once; a sample reads only what was found.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

SYS = Path("/sys")
# Raspberry Pi firmware bits (vcgencmd get_throttled), documented by the Raspberry Pi firmware
RPI_FLAGS = {
    0: "under_voltage",
    1: "arm_freq_capped",
    2: "throttled",
    3: "soft_temp_limit",
    16: "under_voltage_occurred",
    17: "arm_freq_capped_occurred",
    18: "throttled_occurred",
    19: "soft_temp_limit_occurred",
}


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def _milli_c(text: str | None) -> float | None:
    try:
        return round(int(text) / 1000.0, 2) if text is not None else None
    except ValueError:
        return None


def thermal_zones(sys_root: Path = SYS) -> dict[str, float]:
    zones: dict[str, float] = {}
    base = sys_root / "class" / "thermal"
    for z in sorted(base.glob("thermal_zone*"), key=lambda p: int(re.sub(r"\D", "", p.name) or 0)):
        t = _milli_c(_read(z / "temp"))
        if t is None:
            continue
        name = _read(z / "type") or z.name
        key, n = name, 1
        while key in zones:  # several zones of one type (e.g. "acpitz")
            n += 1
            key = f"{name}_{n}"
        zones[key] = t
    return zones


def cpu_throttle_count(sys_root: Path = SYS) -> int | None:
    files = list((sys_root / "devices" / "system" / "cpu").glob("cpu[0-9]*/thermal_throttle/*_throttle_count"))
    if not files:
        return None
    total = 0
    for f in files:
        try:
            total += int(_read(f) or 0)
        except ValueError:
            continue
    return total


def decode_rpi_throttled(value: int) -> dict[str, Any]:
    return {"raw": f"0x{value:x}", **{name: bool(value >> bit & 1) for bit, name in RPI_FLAGS.items()}}


def parse_vcgencmd_throttled(text: str) -> int | None:
    m = re.search(r"throttled=(0x[0-9a-fA-F]+|\d+)", text)
    return int(m[1], 0) if m else None


def rpi_throttled_sysfs(sys_root: Path = SYS) -> Path | None:
    p = sys_root / "devices" / "platform" / "soc" / "soc:firmware" / "get_throttled"
    return p if p.exists() else None


def coral_apex_temps(sys_root: Path = SYS) -> dict[str, float]:
    out = {}
    for d in sorted((sys_root / "class" / "apex").glob("apex_*")):
        t = _milli_c(_read(d / "temp"))
        if t is not None:
            out[d.name] = t
    return out


class ThermalProbe:
    """Probes once which sources exist, then samples them. Owns a tegrastats subprocess on Jetson."""

    def __init__(self, sys_root: Path = SYS, *, use_vcgencmd: bool = True, use_tegrastats: bool = True) -> None:
        self.sys_root = sys_root
        self._zones = (sys_root / "class" / "thermal").is_dir()
        self._throttle_sysfs = rpi_throttled_sysfs(sys_root)
        self._vcgencmd = shutil.which("vcgencmd") if use_vcgencmd and self._throttle_sysfs is None else None
        self._apex = (sys_root / "class" / "apex").is_dir()
        self._tegrastats = None
        if use_tegrastats and shutil.which("tegrastats") and Path("/etc/nv_tegra_release").exists():
            from edge.agent.tegrastats import TegrastatsReader

            try:
                self._tegrastats = TegrastatsReader()
            except OSError:
                self._tegrastats = None

    @property
    def sources(self) -> list[str]:
        found = []
        if self._zones:
            found.append("thermal_zones")
        if self._throttle_sysfs or self._vcgencmd:
            found.append("rpi_throttled")
        if self._apex:
            found.append("coral_apex")
        if self._tegrastats:
            found.append("tegrastats")
        return found

    def _rpi(self) -> dict[str, Any] | None:
        value = None
        if self._throttle_sysfs is not None:
            text = _read(self._throttle_sysfs)
            try:
                value = int(text, 16) if text else None
            except ValueError:
                value = None
        elif self._vcgencmd:
            try:
                p = subprocess.run([self._vcgencmd, "get_throttled"], capture_output=True, text=True, timeout=2)
                value = parse_vcgencmd_throttled(p.stdout)
            except (OSError, subprocess.TimeoutExpired):
                value = None
        return decode_rpi_throttled(value) if value is not None else None

    def sample(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        temps: list[float] = []
        if self._zones:
            zones = thermal_zones(self.sys_root)
            if zones:
                out["zones_c"] = zones
                temps += zones.values()
        count = cpu_throttle_count(self.sys_root)
        if count is not None:
            out["cpu_throttle_events"] = count
        rpi = self._rpi()
        if rpi is not None:
            out["rpi_throttled"] = rpi
        if self._apex:
            apex = coral_apex_temps(self.sys_root)
            if apex:
                out["coral_apex_c"] = apex
                temps += apex.values()
        if self._tegrastats is not None:
            jet = self._tegrastats.latest()
            if jet:
                out["jetson"] = jet
                temps += jet.get("temperatures_c", {}).values()
        out["max_c"] = max(temps) if temps else None
        throttled = None
        if rpi is not None:
            throttled = bool(rpi["throttled"] or rpi["arm_freq_capped"] or rpi["soft_temp_limit"])
        out["throttled_now"] = throttled
        return out

    def close(self) -> None:
        if self._tegrastats is not None:
            self._tegrastats.close()
            self._tegrastats = None
