"""``edgekit firmware``: what goes onto devices and microcontrollers [``edge.backends.litert.firmware``]."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from edge.cli._common import JsonOut, command, console, print_json
from edge.errors import EdgeError

app = typer.Typer(
    help="Device-image helpers: a .tflite as a C array for TensorFlow Lite Micro; an Ethos-U bundle for its driver.",
    no_args_is_help=True,
)

_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": 1024**2, "mb": 1000**2, "mib": 1024**2}


def parse_bytes(text: str | None) -> int | None:
    """``"262144"``, ``"256K"``/``"256KiB"`` (1024), ``"256kB"`` (1000), ``"1M"``/``"1MiB"``."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise EdgeError(f"bad --max-bytes {text!r}", hint="a number of bytes, e.g. 262144, 256K, 256KiB, 256kB or 1M")
    return int(float(m.group(1)) * _UNITS[unit])


@app.command("c-array")
@command
def c_array_cmd(
    model: Path = typer.Argument(..., help="A .tflite model (e.g. the full-integer model of an int8 bundle)."),
    output: Path | None = typer.Option(
        None,
        "--output",
        "-o",
        help="The .cc (or .c) file to write; the header goes beside it. Default: <model>_data.cc here.",
        show_default=False,
    ),
    name: str | None = typer.Option(
        None, "--name", help="Array name (default: g_<file stem>_model_data).", show_default=False
    ),
    max_bytes: str | None = typer.Option(
        None, "--max-bytes", help="Flash budget: refuse a bigger model (bytes, or 256K, 1M).", show_default=False
    ),
    force: bool = typer.Option(True, "--force/--no-force", help="Overwrite existing output files."),
    as_json: bool = JsonOut,
) -> None:
    """Write MODEL as a 16-byte aligned `const unsigned char` array plus its length, for TensorFlow Lite Micro."""
    from edge.backends.litert.firmware import write_c_array

    out = output or Path(f"{model.stem}_data.cc")
    res = write_c_array(model, out, name=name, max_bytes=parse_bytes(max_bytes), force=force)
    data = {
        "source": str(res.source),
        "cc": str(res.cc),
        "header": str(res.header),
        "name": res.name,
        "bytes": res.size,
        "sha256": res.sha256,
        "max_bytes": res.max_bytes,
        "budget_used": res.budget_used,
    }
    if as_json:
        print_json(data)
        return
    budget = f", {res.budget_used:.0%} of the {res.max_bytes:,}-byte budget" if res.max_bytes else ""
    console.print(
        f"wrote {res.cc} and {res.header}: {res.name}[{res.size:,}] (16-byte aligned){budget}", highlight=False
    )


@app.command("ethos-u")
@command
def ethos_u_cmd(
    bundle: Path = typer.Argument(..., help="An Ethos-U bundle (edgekit convert -t ethos-u55 / ethos-u65)."),
    output: Path = typer.Option(Path("."), "--output", "-o", help="The directory to write into."),
    name: str | None = typer.Option(
        None, "--name", help="Array name (default: g_<bundle id>_model_data).", show_default=False
    ),
    as_json: bool = JsonOut,
) -> None:
    """Write an Ethos-U bundle's Vela-compiled model as a C array for TensorFlow Lite Micro with the Ethos-U
    driver, and a header with the tensor arena size and Vela's estimate (an estimate, not a measurement)."""
    from edge.backends.ethosu.firmware import write_firmware

    fw = write_firmware(bundle, output, name=name)
    data = {
        "cc": str(fw.model_cc),
        "header": str(fw.model_h),
        "ethosu_header": str(fw.ethosu_h),
        "name": fw.name,
        "bytes": fw.bytes,
        "arena_bytes": fw.arena_bytes,
        "ops": list(fw.ops),
        "estimate": fw.estimate,
    }
    if as_json:
        print_json(data)
        return
    e = fw.estimate
    console.print(
        f"wrote {fw.model_cc}, {fw.model_h} and {fw.ethosu_h}: {fw.name}[{fw.bytes:,}], arena {fw.arena_bytes:,} "
        f"bytes; {e['label']}: {e['inferences_per_second']:.1f} inferences/s at {e['clock_hz'] / 1e6:.0f} MHz",
        highlight=False,
    )
