"""Full-integer TFLite -> Ethos-U TFLite with Arm's Vela (``ethos-u-vela``, in the ``vela`` toolchain).

Vela compiles the ops an Ethos-U55/U65 runs into one ``ethos-u`` custom op (the NPU's command stream) and leaves
the others to the microcontroller's CPU (TFLM's kernels); it prints how many went where and writes a summary
of its performance model: cycles, inferences/s at the system's clock, SRAM and flash use. That summary is
recorded as Vela's ESTIMATE (``vela_estimate.json`` and the chain step's details), never as a measurement.

Vela's output runs only on the NPU: the bundle keeps the int8 model it compiled (``model.tflite``, the
sidecar's ``cpu_model``), whose parity on this host's LiteRT reference kernels gates the bundle (Vela's NPU
arithmetic is specified bit-exact to TFLite's int8 reference kernels; that claim is Arm's, checked only on
the device by the bundle's reference pairs).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from edge import toolchains
from edge.backends.converter import ConversionRequest, ConversionResult, Converter
from edge.backends.ethosu.format import (
    COMPILED_NAME,
    CPU_MODEL,
    ESTIMATE_LABEL,
    ESTIMATE_NAME,
    FORMAT,
    MEMORY_MODES,
    SYSTEMS,
    TOOLCHAIN,
    parse_summary,
)
from edge.base.typedjson import spec
from edge.errors import ConversionError, PrecisionError


def float_ops(path: Path) -> list[str]:
    """The op types of ``path`` that compute in float (QUANTIZE/DEQUANTIZE at the edges aside): a model with
    any is not full-integer, and no Ethos-U runs it."""
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    it = Interpreter(
        model_path=str(path), experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    )
    return sorted(
        {
            o["op_name"]
            for o in it._get_ops_details()
            if o["op_name"] not in ("QUANTIZE", "DEQUANTIZE")
            and any(t in (np.float32, np.float16) for t in o.get("result_types", []))
        }
    )


@dataclass(frozen=True)
class EthosUConvertOptions:
    """``tflite->ethos-u``'s options (Vela's settings), declared once (``edge.backends.options``). The accelerators and
    memory modes are :data:`~edge.backends.ethosu.format.SYSTEMS`' and ``MEMORY_MODES`` (a test keeps them in step)."""

    accelerator: Literal["ethos-u55-64", "ethos-u55-128", "ethos-u55-256", "ethos-u65-256", "ethos-u65-512"] = spec(
        "ethos-u55-128", doc=f"Vela's --accelerator-config: {', '.join(SYSTEMS)} (default ethos-u55-128)"
    )
    system_config: str | None = spec(
        None,
        pattern=r"^[A-Za-z0-9_]{1,64}$",
        doc="a system configuration of Vela's Arm/vela.ini (default: the accelerator's High_End one); "
        "sets the clock the estimate is at",
    )
    memory_mode: Literal["Shared_Sram", "Dedicated_Sram", "Sram_Only"] = spec(
        "Shared_Sram", doc=f"{', '.join(MEMORY_MODES)} (default Shared_Sram)"
    )
    optimise: Literal["Performance", "Size"] = spec("Performance", doc="Performance (default) or Size")
    timeout_s: float = spec(600.0, ge=1.0, le=7 * 86400, doc="stop Vela after this many seconds (default 600)")


class TFLiteToEthosU(Converter):
    name = "tflite->ethos-u"
    source_format = "tflite"
    target_format = FORMAT
    precisions = frozenset({"int8"})
    toolchain = TOOLCHAIN
    options_class = EthosUConvertOptions  # ``options`` (names and descriptions) derive from it

    def convert(self, request: ConversionRequest) -> ConversionResult:
        opts: EthosUConvertOptions = self.read_options(request.options)
        if request.precision != "int8":
            raise PrecisionError(f"an Ethos-U runs full-integer int8 models only, not {request.precision!r}")
        accel, mode, optimise = opts.accelerator, opts.memory_mode, opts.optimise
        system = opts.system_config or SYSTEMS[accel]
        st = toolchains.require(TOOLCHAIN, f"converter {self.name!r}")
        src = Path(request.source)
        floats = float_ops(src)
        if floats:
            raise ConversionError(
                f"{src.name} is not a full-integer model: {', '.join(floats)} compute in float, and an Ethos-U "
                "(nor TFLM's int8 kernels beside it) runs none of them",
                hint="bring the ONNX model (edgekit quantizes it to int8 with calibration data) or a full-integer "
                ".tflite; an op that stays float after int8 quantization needs an int8 form in the graph",
            )
        out = request.workdir
        model = out / CPU_MODEL
        if src.resolve() != model.resolve():
            shutil.copyfile(src, model)
        vela = st.venv / "bin" / "vela"
        config = _vela_ini(st.venv)
        work = out / "vela"
        work.mkdir(exist_ok=True)
        cmd = [
            str(vela),
            "--accelerator-config",
            accel,
            "--config",
            str(config),
            "--system-config",
            system,
            "--memory-mode",
            mode,
            "--optimise",
            optimise,
            "--output-dir",
            str(work),
            str(model),
        ]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=opts.timeout_s)
        except subprocess.TimeoutExpired:
            raise ConversionError(f"Vela did not finish within {opts.timeout_s:g} s on {src.name}") from None
        seconds = time.perf_counter() - t0
        compiled = work / f"{model.stem}_vela.tflite"
        summaries = sorted(work.glob(f"{model.stem}_summary_*.csv"))
        if proc.returncode != 0 or not compiled.is_file() or not summaries:
            tail = " | ".join(ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip())[-600:]
            raise ConversionError(f"Vela failed on {src.name} (exit {proc.returncode}): {tail}")
        estimate = parse_summary(summaries[0])
        placement = parse_placement(proc.stdout)
        estimate.update(placement)
        final = out / COMPILED_NAME
        shutil.move(str(compiled), final)
        shutil.rmtree(work)
        (out / ESTIMATE_NAME).write_text(json.dumps(estimate, indent=2) + "\n", encoding="utf-8")
        files = [final, model, out / ESTIMATE_NAME]
        io = _sidecar(src)
        if io is not None:
            for name in (model, final):
                side = name.with_suffix(".io.json")
                record = {**io, "cpu_model": CPU_MODEL} if name == final else io
                side.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
                files.append(side)
        return ConversionResult(
            artifact=final,
            format=self.target_format,
            files=files,
            tool_versions={"ethos-u-vela": st.packages.get("ethos-u-vela", "?")},
            details={"vela_estimate": estimate, "command": " ".join(cmd[1:-1]), "vela_seconds": round(seconds, 2)},
            notes=_estimate_notes(estimate, placement),
        )


def _estimate_notes(estimate: dict[str, Any], placement: dict[str, Any]) -> list[str]:
    """The conversion's notes: Vela's estimate (labelled) and the ops left to the microcontroller's CPU."""
    notes = [
        f"{ESTIMATE_LABEL} for {estimate['accelerator']} ({estimate['system_config']}, {estimate['memory_mode']}): "
        f"{estimate['inferences_per_second']:.1f} inferences/s at {estimate['clock_hz'] / 1e6:.0f} MHz, "
        f"{estimate['cycles_total']:,} cycles, SRAM {estimate['sram_bytes'] / 1024:.1f} KiB, "
        f"flash {(estimate['off_chip_flash_bytes'] + estimate['on_chip_flash_bytes']) / 1024:.1f} KiB, "
        f"DRAM {estimate['dram_bytes'] / 1024:.1f} KiB"
    ]
    if placement.get("cpu_ops"):
        notes.append(
            f"{placement['cpu_ops']} of {placement['cpu_ops'] + placement['npu_ops']} ops stay on the "
            f"microcontroller's CPU (TFLM kernels), outside Vela's cycle estimate: "
            + ", ".join(placement["cpu_op_types"])
        )
    return notes


def parse_placement(stdout: str) -> dict[str, Any]:
    """``CPU operators = 31 (47.0%)`` / ``NPU operators = 35`` and the op types of Vela's warnings."""
    cpu = re.search(r"CPU operators = (\d+)", stdout)
    npu = re.search(r"NPU operators = (\d+)", stdout)
    types = sorted(set(re.findall(r"Warning \(supported operators\) operator: (\w+)", stdout)) - {"None"})
    return {
        "cpu_ops": int(cpu.group(1)) if cpu else 0,
        "npu_ops": int(npu.group(1)) if npu else 0,
        "cpu_op_types": types,
    }


def _vela_ini(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python*/site-packages/ethosu/config_files/Arm/vela.ini"))
    if not found:
        raise ConversionError(f"Vela's Arm/vela.ini is not in {venv}", hint="edgekit toolchain install vela --force")
    return found[0]


def _sidecar(src: Path) -> dict[str, Any] | None:
    from edge.backends.litert.format import load_sidecar

    return load_sidecar(src)
