"""``edgekit verify BUNDLE --isa aarch64``: the bundle's reference pairs on a device instruction set [``edge.verify.isa``]."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import typer
from rich.markup import escape

from edge.cli._common import JsonOut, console, dirs, err_console, print_json, steps
from edge.errors import EdgeError
from edge.toolchains import aarch64

_CPU_HELP = "The emulated core: " + ", ".join(f"{k} ({v})" for k, v in aarch64.CPUS.items()) + "."

NoIsaCheck = typer.Option(
    False,
    "--no-isa-check",
    help="Do not run the bundle's reference pairs on the device ISA "
    "under emulation (done by default for aarch64 devices when `edgekit toolchain install "
    "aarch64` was run).",
)


def verify_cmd(
    bundle: Path = typer.Argument(..., help="Bundle directory."),
    isa: str = typer.Option(
        aarch64.ISA,
        "--isa",
        help="The device instruction set to check on (emulated: `edgekit toolchain install aarch64`).",
    ),
    cpu: str = typer.Option(aarch64.DEFAULT_CPU, "--cpu", help=_CPU_HELP),
    key: str | None = typer.Option(
        None,
        "--key",
        "-k",
        help="Sign the bundle again with this key after recording (recording removes a signature: it covered the old manifest).",
        show_default=False,
    ),
    no_record: bool = typer.Option(False, "--no-record", help="Check only; leave the manifest as it is."),
    as_json: bool = JsonOut,
) -> None:
    """Run BUNDLE's reference pairs on the device ISA under emulation and record the result (`verified_on`).

    Numerics only: an emulated run says nothing about speed."""
    from edge.bundle.bundle import SIGNATURE
    from edge.verify.isa import describe, verify_isa

    signed = (bundle / SIGNATURE).is_file()
    with steps(not as_json) as say:
        evidence = verify_isa(bundle, isa=isa, cpu=cpu, record=not no_record, on_step=say)
    resigned = None
    if signed and not no_record and key:
        from edge.bundle.bundle import sign_bundle

        resigned = sign_bundle(bundle, key)
    if as_json:
        print_json({**evidence, "resigned": resigned.to_json() if resigned else None})
    else:
        console.print(escape(describe(evidence)), highlight=False)
        for o in evidence["outputs"]:
            console.print(
                f"  {escape(o['name'])}: |{isa} - x86| {o['max_abs_vs_host']:.3g} (limit {o['limit']:.3g} "
                f"= range {o['range']:.4g} x {o['limit'] / max(o['range'], 1e-30):.0e}); vs reference: "
                f"cosine {o['cosine'] if o['cosine'] is not None else '-'}, max abs {o['max_abs']}",
                highlight=False,
            )
    if signed and not no_record and not key:
        err_console.print(
            f"{bundle}: its signature covered the manifest before this evidence and was removed; "
            "sign it again: edgekit sign " + escape(str(bundle)),
            highlight=False,
        )
    if not evidence["passed"]:
        raise EdgeError(
            f"{evidence['label']}: failed: {'; '.join(evidence['failures'])[:400]}",
            hint="the bundle computes differently on the device ISA: see the figures above",
        )


def isa_check(
    bundle: Any,
    target: str,
    targets_dir: list[Path] | None,
    *,
    enabled: bool,
    accept_failure: bool,
    say: Callable[[str], None],
) -> str:
    """``convert``'s and ``deploy``'s ISA check (``edge.verify.isa.check_after_convert``): its report line."""
    from edge.targets import get_target
    from edge.verify.isa import check_after_convert, isa_for

    profile = get_target(target, dirs(targets_dir))
    isa, _ = isa_for(bundle, profile)
    if isa is not None and enabled and aarch64.status().usable:
        say(f"running the reference pairs on {isa} (emulated {aarch64.DEFAULT_CPU}; numerics only, not a speed figure)")
    line, _ = check_after_convert(bundle, profile, enabled=enabled, accept_failure=accept_failure, on_step=say)
    return line
