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
from pathlib import Path
from typing import Any

_RAM = re.compile(r"\bRAM (\d+)/(\d+)MB")
_SWAP = re.compile(r"\bSWAP (\d+)/(\d+)MB")
_CPU = re.compile(r"\bCPU \[([^\]]*)\](?:@(\d+))?", re.IGNORECASE)
_CPU_CORE = re.compile(r"(\d+)%(?:@(\d+))?")
_GPU = re.compile(r"\bGR3D(?:_FREQ)? (\d+)%(?:@\[?(\d+)[^\s]*)?")
_EMC = re.compile(r"\bEMC(?:_FREQ)? (\d+)%(?:@(\d+))?")
_TEMP = re.compile(r"\b([A-Za-z][A-Za-z0-9_]*)@(-?\d+(?:\.\d+)?)C\b")
_POWER = re.compile(r"\b([A-Z][A-Z0-9_]*) (\d+)(?:mW)?/(\d+)(?:mW)?(?=\s|$)")
# sensors tegrastats prints but that carry no reading: -256 C means "off"; PMIC@100C is a constant placeholder
_NO_READING = -256.0
_PLACEHOLDERS = {"pmic"}
_NOT_POWER = {"RAM", "SWAP", "IRAM"}
_GPC = re.compile(r"\bGR3D(?:_FREQ)? \d+%@\[([\d,]+)\]")
# hardware engines: "NVENC off", "NVDEC 1164", "VIC_FREQ 0%@115", "NVDLA0 off", "APE 174", "MSENC 1164"
_ENGINE = re.compile(
    r"\b(NVENC\d?|NVDEC\d?|MSENC|NVJPG\d?|VIC(?:_FREQ)?|OFA|NVDLA\d|PVA\d(?:_FREQ)?|APE)"
    r" (off|(?:(\d+)%@)?(\d+))(?=\s|$)"
)
# the board's input rail, by generation: Nano/TX (POM_5V_IN), Xavier/Orin NX+Nano (VDD_IN), AGX Orin (VIN_SYS_5V0)
_INPUT_RAILS = ("VDD_IN", "POM_5V_IN", "VIN_SYS_5V0", "VIN")


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
            core = _CPU_CORE.fullmatch(item)
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
    if m := _GPC.search(line):  # Orin: one frequency per GPC
        out["gpu_gpc_freq_mhz"] = [int(f) for f in m[1].split(",") if f]
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
    power = {
        name: {"now_mw": int(now), "avg_mw": int(avg)}
        for name, now, avg in _POWER.findall(line)
        if name not in _NOT_POWER
    }
    if power:
        out["power"] = power
        rail = next((r for r in _INPUT_RAILS if r in power), None)
        if rail is not None:
            out["input_power_mw"], out["input_rail"] = power[rail]["now_mw"], rail
    engines: dict[str, Any] = {}
    for name, value, load, freq in _ENGINE.findall(line):
        key = name.lower().removesuffix("_freq")
        engines[key] = (
            None if value == "off" else {"freq_mhz": int(freq), **({"load_percent": int(load)} if load else {})}
        )
    if engines:
        out["engines"] = engines  # None: powered off
    return out


# -- nvpmodel: the power mode ---------------------------------------------------------------

_NVP_NAME = re.compile(r"NV Power Mode:\s*(.+?)\s*$", re.MULTILINE)
_NVP_CONF = re.compile(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)\s*>")
_NVP_STATUS = re.compile(r"pmode:(\d+)")
NVPMODEL_STATUS = "/var/lib/nvpmodel/status"
NVPMODEL_CONF = "/etc/nvpmodel.conf"


def parse_nvpmodel(text: str) -> dict[str, Any]:
    """``nvpmodel -q`` output (JetPack 4-6): {"mode_name", "mode_id"}; warnings and verbose lines ignored."""
    out: dict[str, Any] = {}
    if m := _NVP_NAME.search(text):
        out["mode_name"] = m[1]
        rest = text[m.end() :].split()
        if rest and rest[0].isdigit():
            out["mode_id"] = int(rest[0])
    if "mode_id" not in out and (m := re.search(r"POWER_MODEL: ID=(\d+) NAME=(\S+)", text)):
        out["mode_id"] = int(m[1])
        out.setdefault("mode_name", m[2])
    return out


def parse_nvpmodel_conf(text: str) -> dict[int, str]:
    """Mode id -> name from ``/etc/nvpmodel.conf`` (``< POWER_MODEL ID=0 NAME=MAXN >``)."""
    return {int(i): name for i, name in _NVP_CONF.findall(text)}


def read_nvpmodel(
    command: str = "nvpmodel", status_file: str = NVPMODEL_STATUS, conf_file: str = NVPMODEL_CONF
) -> dict[str, Any] | None:
    """The current power mode: ``nvpmodel -q``, else the status file + conf (no root needed); None off Jetson."""
    exe = shutil.which(command)
    if exe is not None:
        try:
            p = subprocess.run([exe, "-q"], capture_output=True, text=True, timeout=5, check=False)
            parsed = parse_nvpmodel(p.stdout + "\n" + p.stderr)
            if parsed:
                return {**parsed, "source": "nvpmodel -q"}
        except (OSError, subprocess.TimeoutExpired):
            pass
    try:
        status = Path(status_file).read_text(encoding="utf-8")
    except OSError:
        return None
    m = _NVP_STATUS.search(status)
    if m is None:
        return None
    out: dict[str, Any] = {"mode_id": int(m[1]), "source": status_file}
    try:
        names = parse_nvpmodel_conf(Path(conf_file).read_text(encoding="utf-8"))
    except OSError:
        names = {}
    if out["mode_id"] in names:
        out["mode_name"] = names[out["mode_id"]]
    return out


class TegrastatsReader:
    """Runs ``tegrastats --interval MS`` and keeps its latest parsed line. Owns the subprocess."""

    def __init__(self, interval_ms: int = 1000, command: str = "tegrastats") -> None:
        exe = shutil.which(command)
        if exe is None:
            raise FileNotFoundError(command)
        self._latest: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            [exe, "--interval", str(interval_ms)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
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
