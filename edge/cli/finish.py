"""``edgekit finish BUNDLE``: compile an Edge TPU bundle built where ``edgetpu_compiler`` was missing."""

from __future__ import annotations

from pathlib import Path

import typer

from edge.cli._common import JsonOut, TargetsDir, console, print_json, safe, steps


def finish_cmd(
    bundle: Path = typer.Argument(
        ...,
        help="An uncompiled coral-edgetpu bundle (as `edgekit convert` leaves it on a host without edgetpu_compiler).",
    ),
    output: Path | None = typer.Option(
        None,
        "--output",
        "-o",
        help="Where the compiled bundle goes (default: replaces BUNDLE, once the new one is complete).",
        show_default=False,
    ),
    key: str | None = typer.Option(
        None,
        "--key",
        help="Sign the finished bundle with this key (a name in the keys "
        "directory, or a PEM path); default: $EDGEKIT_SIGN_KEY when set. Without one, "
        "the old signature is dropped.",
        show_default=False,
    ),
    compiler: str | None = typer.Option(
        None, "--compiler", help="edgetpu_compiler to run (default: on PATH).", show_default=False
    ),
    force: bool = typer.Option(False, "--force", help="Replace an existing --output."),
    targets_dir: list[Path] | None = TargetsDir,
    as_json: bool = JsonOut,
) -> None:
    """Compile BUNDLE's int8 model with edgetpu_compiler and write the re-hashed, compiled bundle."""
    from edge.backends.litert.edgetpu import finish_bundle

    with steps(not as_json) as say:
        say(f"compiling {bundle} for the Edge TPU")
        result = finish_bundle(bundle, output, key=key, compiler=compiler, force=force, targets_dir=targets_dir or ())
    if as_json:
        print_json(result.to_json())
        return
    from edge.cli.convert import render_bundle

    render_bundle(result.bundle)
    for n in result.notes:
        console.print(f"[yellow]note:[/] {safe(n)}", highlight=False)
    console.print(
        f"[green]finished[/] {safe(result.source_id)} → {safe(result.bundle.id)} at {safe(result.bundle.path)}",
        highlight=False,
    )
