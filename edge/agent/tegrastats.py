"""Parse NVIDIA Jetson ``tegrastats`` lines, and keep the latest one from a running tegrastats.

Jetson boards expose GPU load, per-rail power and most temperatures only through
``tegrastats``; its line format changed between L4T releases (TX1/TX2, Nano, Xavier, Orin),
so the parser reads fields by pattern, not by position, and leaves out what a line lacks.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from typing import Any

_RAM = re.compile(r"\bRAM (\d+)/(\d+)MB")
_SWAP = re.compile(r"\bSWAP (\d+)/(\d+)MB")
_CPU = re.compile(r"\bCPU \[([^\]]*)\](?:@(\d+))?", re.IGNORECASE)
_CPU_CORE = re.compile(r"^(\d+)%(?:@(\d+))?$")
_GPU = re.compile(r"\bGR3D(?:_FREQ)? (\d+)%(?:@\[?(\d+)[^\s]*)?")
_EMC = re.compile(r"\bEMC(?:_FREQ)? (\d+)%(?:@(\d+))?")
_TEMP = re.compile(r"\b([A-Za-z][A-Za-z0-9_]*)@(-?\d+(?:\.\d+)?)C\b")
_POWER = re.compile(r"\b([A-Z][A-Z0-9_]*) (\d+)(?:mW)?/(\d+)(?:mW)?(?=\s|$)")
# sensors tegrastats prints but that carry no reading: -256 C means "off"; PMIC@100C is a constant placeholder
_NO_READING = -256.0
_PLACEHOLDERS = {"pmic"}
_NOT_POWER = {"RAM", "SWAP", "IRAM"}


def parse_tegrastats(line: str) -> dict[str, Any]:
    """One tegrastats line as a dict; keys appear only for what the line contains."""
    out: dict[str, Any] = {}
    if m := _RAM.search(line):
        out["ram_used_mb"], out["ram_total_mb"] = int(m[1]), int(m[2])
    if m := _SWAP.search(line):
        out["swap_used_mb"], out["swap_total_mb"] = int(m[1]), int(m[2])
    if m := _CPU.search(line):
        cores: list[dict[str, int] | None] = []
        for item in m[1].split(","):
            item = item.strip()
            core = _CPU_CORE.match(item)
            if core is None:  # "off": a core that is powered down
                cores.append(None)
                continue
            freq = core[2] or m[2]  # old format: one frequency for all cores after the bracket
            cores.append({"load_percent": int(core[1]), **({"freq_mhz": int(freq)} if freq else {})})
        out["cpu"] = cores
        online = [c["load_percent"] for c in cores if c is not None]
        if online:
            out["cpu_load_percent"] = round(sum(online) / len(online), 1)
    if m := _GPU.search(line):
        out["gpu_load_percent"] = int(m[1])
        if m[2]:
            out["gpu_freq_mhz"] = int(m[2])
    if m := _EMC.search(line):
        out["emc_load_percent"] = int(m[1])
        if m[2]:
            out["emc_freq_mhz"] = int(m[2])
    temps = {}
    for name, value in _TEMP.findall(line):
        v = float(value)
        if v <= _NO_READING or name.lower() in _PLACEHOLDERS:
            continue
        temps[name.lower()] = v
    if temps:
        out["temperatures_c"] = temps
        out["max_temp_c"] = max(temps.values())
    power = {name: {"now_mw": int(now), "avg_mw": int(avg)} for name, now, avg in _POWER.findall(line)
             if name not in _NOT_POWER}
    if power:
        out["power"] = power
    return out


class TegrastatsReader:
    """Runs ``tegrastats --interval MS`` and keeps its latest parsed line. Owns the subprocess."""

    def __init__(self, interval_ms: int = 1000, command: str = "tegrastats") -> None:
        exe = shutil.which(command)
        if exe is None:
            raise FileNotFoundError(command)
        self._latest: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._proc = subprocess.Popen([exe, "--interval", str(interval_ms)], stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self._thread = threading.Thread(target=self._read, name="edgekit-tegrastats", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            parsed = parse_tegrastats(line)
            if parsed:
                with self._lock:
                    self._latest = parsed

    def latest(self) -> dict[str, Any] | None:
        with self._lock:
            return self._latest

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._thread.join(timeout=2)
        if self._proc.stdout:
            self._proc.stdout.close()
