"""What an Ethos-U bundle holds, shared by its converter, runner and firmware writer.

An Ethos-U bundle holds ``model_vela.tflite`` (Vela's output: the NPU's command stream inside an
``ethos-u`` custom op, plus any op Vela left to the microcontroller's CPU), its I/O sidecar naming
``model.tflite`` as ``cpu_model`` (the full-integer model Vela compiled: what parity runs on a host, and
what TFLM runs without the NPU), and ``vela_estimate.json``: Vela's performance ESTIMATE for the configured
system (cycles, inferences/s at the configured clock, SRAM and flash use). An estimate from Vela's model of
the hardware, never a measurement.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

FORMAT = "ethos-u-tflite"
COMPILED_NAME = "model_vela.tflite"
CPU_MODEL = "model.tflite"
ESTIMATE_NAME = "vela_estimate.json"
TOOLCHAIN = "vela"
#: Vela's custom op: a model holding it runs only where an Ethos-U driver takes it
CUSTOM_OP = "ethos-u"
#: accelerator configuration -> the vela.ini system config its profile uses by default
SYSTEMS = {
    "ethos-u55-64": "Ethos_U55_High_End_Embedded",
    "ethos-u55-128": "Ethos_U55_High_End_Embedded",
    "ethos-u55-256": "Ethos_U55_High_End_Embedded",
    "ethos-u65-256": "Ethos_U65_High_End",
    "ethos-u65-512": "Ethos_U65_High_End",
}
MEMORY_MODES = ("Shared_Sram", "Dedicated_Sram", "Sram_Only")
#: what TFLM allocates in the arena beside the tensors Vela placed (interpreter, op data): an allowance,
#: confirm on the device with MicroInterpreter::arena_used_bytes()
ARENA_MARGIN = 16 * 1024
ESTIMATE_LABEL = "Vela's estimate (not a measurement)"


def parse_summary(path: Path) -> dict[str, Any]:
    """The figures of Vela's ``<net>_summary_<system>.csv`` that a user sizes a device by (first row)."""
    with path.open(newline="", encoding="utf-8") as f:
        row = next(csv.DictReader(f))

    def num(key: str) -> float:
        return float(row.get(key) or 0.0)

    sram = num("sram_memory_used") * 1024  # KiB in the CSV
    return {
        "label": ESTIMATE_LABEL,
        "accelerator": row.get("accelerator_configuration"),
        "system_config": row.get("system_config"),
        "memory_mode": row.get("memory_mode"),
        "clock_hz": num("core_clock"),
        "cycles_npu": int(num("cycles_npu")),
        "cycles_total": int(num("cycles_total")),
        "inference_time_s": num("inference_time"),
        "inferences_per_second": num("inferences_per_second"),
        "sram_bytes": int(sram),
        "off_chip_flash_bytes": int(num("off_chip_flash_memory_used") * 1024),
        "on_chip_flash_bytes": int(num("on_chip_flash_memory_used") * 1024),
        "dram_bytes": int(num("dram_memory_used") * 1024),
        "macs": int(num("nn_macs")),
        "arena_bytes": arena_size(int(sram)),
        "arena_note": f"Vela's SRAM use + {ARENA_MARGIN // 1024} KiB for TFLM's own allocations, 16-byte aligned: "
        "an allowance; confirm with MicroInterpreter::arena_used_bytes() on the device"
        + (
            "; Dedicated_Sram: the tensor arena sits in DRAM and the driver also needs Vela's SRAM figure as its "
            "fast-memory scratch (ethosu fast_memory)"
            if row.get("memory_mode") == "Dedicated_Sram"
            else ""
        ),
    }


def arena_size(sram_bytes: int) -> int:
    return (sram_bytes + ARENA_MARGIN + 15) // 16 * 16


def read_estimate(bundle_dir: Path) -> dict[str, Any] | None:
    p = bundle_dir / ESTIMATE_NAME
    if not p.is_file():
        return None
    data = json.loads(p.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else None
