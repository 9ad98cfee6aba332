"""``edgekit toolchain``: list, install, show and remove toolchain environments [``edge.toolchains``]."""

from __future__ import annotations

import time

import typer
from rich.table import Table

from edge import toolchains
from edge.cli._common import JsonOut, command, console, err_console, print_json, safe

app = typer.Typer(
    help="Toolchain environments: heavy converter stacks (TensorFlow + onnx2tf) in virtual "
    "environments of their own, created only by `edgekit toolchain install`.",
    no_args_is_help=True,
)

Name = typer.Argument(..., help=f"Toolchain name ({', '.join(toolchains.TOOLCHAINS)}).")


@app.command("list")
@command
def list_cmd(as_json: bool = JsonOut) -> None:
    """Every toolchain: installed or not, usable, lock hash, where it lives."""
    rows = toolchains.list_status()
    if as_json:
        print_json(
            [
                {
                    **{k: v for k, v in st.to_json().items() if k != "packages"},
                    "purpose": toolchains.get_spec(st.name).purpose,
                }
                for st in rows
            ]
        )
        return
    t = Table(title=f"edgekit toolchains ({toolchains.state.root()})")
    for col in ("toolchain", "for", "installed", "lock hash", "python", "state"):
        t.add_column(col, overflow="fold")
    for st in rows:
        spec = toolchains.get_spec(st.name)
        state = "[green]ready[/]" if st.usable else f"[yellow]{safe(st.problem or '')}[/]"
        lock = "-" if not st.lock_hash else st.lock_hash[:16] + ("" if st.matches_reference else " (not the reference)")
        t.add_row(st.name, spec.purpose, "yes" if st.installed else "no", lock, st.python or "-", state)
    console.print(t)


@app.command("install")
@command
def install_cmd(
    name: str = Name,
    force: bool = typer.Option(False, "--force", help="Remove and recreate it even if it is installed."),
    no_reference_lock: bool = typer.Option(
        False,
        "--no-reference-lock",
        help="Resolve from the top-level pins only, ignoring the reference lock (to refresh the lock).",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Print every line pip prints."),
    as_json: bool = JsonOut,
) -> None:
    """Create the toolchain's virtual environment and install its pinned packages (minutes, GBs: see `list`)."""
    spec = toolchains.get_spec(name)
    start = time.perf_counter()
    if as_json:
        st = toolchains.install(name, force=force, use_reference_lock=False if no_reference_lock else None)
        print_json(st.to_json())
        return
    err_console.print(
        f"installing toolchain [bold]{spec.name}[/] ({safe(spec.purpose)}; {spec.size_hint})", highlight=False
    )
    with err_console.status("starting") as status:

        def step(msg: str) -> None:
            status.update(safe(msg))
            err_console.print(f"[dim]{time.perf_counter() - start:6.1f}s[/] {safe(msg)}", highlight=False)

        def output(line: str) -> None:
            if verbose:
                err_console.print(f"[dim]{safe(line)}[/]", highlight=False)
            elif line.startswith(("Collecting", "Installing collected", "Successfully installed")):
                status.update(f"pip: {safe(line[:100])}")

        st = toolchains.install(
            name, force=force, on_step=step, on_output=output, use_reference_lock=False if no_reference_lock else None
        )
    console.print(
        f"toolchain [bold]{safe(st.name)}[/]: {safe(st.path)}\nlock hash {st.lock_hash}"
        + ("" if st.matches_reference else "  [yellow](differs from the reference lock)[/]"),
        highlight=False,
    )


@app.command("show")
@command
def show_cmd(name: str = Name, as_json: bool = JsonOut) -> None:
    """One toolchain: its pins, where it is, its lock hash and every package installed."""
    spec = toolchains.get_spec(name)
    st = toolchains.status(name)
    if as_json:
        print_json({**st.to_json(), "requirements": list(spec.requirements), "lock_platform": spec.lock_platform})
        return
    t = Table(title=f"toolchain {spec.name}", show_header=False)
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    t.add_row("for", spec.purpose)
    t.add_row("pins", ", ".join(spec.requirements))
    t.add_row("reference lock", f"{spec.lock} ({spec.lock_platform})")
    t.add_row("path", str(st.path))
    t.add_row("state", "[green]ready[/]" if st.usable else f"[yellow]{safe(st.problem or '')}[/]")
    if st.installed:
        t.add_row("lock hash", f"{st.lock_hash}" + ("" if st.matches_reference else " (not the reference lock)"))
        t.add_row("python", st.python or "?")
        t.add_row("installed", f"{st.created_utc} in {st.install_seconds} s")
        t.add_row("packages", ", ".join(f"{k} {v}" for k, v in st.packages.items()))
    console.print(t)


@app.command("lock")
@command
def lock_cmd(name: str = Name) -> None:
    """Print the installed package set in lock-file form (to refresh edge/toolchains/NAME.lock)."""
    st = toolchains.require(name, f"toolchain {name!r}")
    for k, v in st.packages.items():
        typer.echo(f"{k}=={v}")


@app.command("remove")
@command
def remove_cmd(name: str = Name) -> None:
    """Delete the toolchain's environment."""
    toolchains.get_spec(name)
    d = toolchains.toolchain_dir(name)
    console.print(
        f"removed {d}" if toolchains.remove(name) else f"{d} does not exist; nothing to remove", highlight=False
    )
