"""``edgekit targets`` and ``edgekit targets show NAME``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from edge.cli._common import JsonOut, TargetsDir, Wide, command, console, dirs, print_json, print_table, safe
from edge.pipeline import conversion_problems, runnable_here
from edge.targets import builtin_dir, get_target, load_targets

app = typer.Typer(help="List device profiles, or show one.", invoke_without_command=True, no_args_is_help=False)


@app.callback()
@command
def list_targets(
    ctx: typer.Context, targets_dir: list[Path] | None = TargetsDir, as_json: bool = JsonOut, wide: bool = Wide
) -> None:
    """Table of device profiles: runtime, precisions (default in bold), frame budget; --wide adds the device, the
    converter chain and where the profile comes from."""
    if ctx.invoked_subcommand is not None:
        return
    profiles = load_targets(dirs(targets_dir))
    if as_json:
        print_json([p.to_json() for p in profiles.values()])
        return
    columns: list[tuple[str, dict[str, Any]]] = [
        # a name is what the user types next: always whole
        ("target", {"no_wrap": True, "min_width": max((len(n) for n in profiles), default=6)}),
        ("device", {}),
        ("runtime", {"no_wrap": True}),
        ("converter chain", {"no_wrap": True}),
        ("precisions", {"min_width": len("int8-dynamic,")}),
        ("budget ms", {"justify": "right", "no_wrap": True}),
        ("source", {"overflow": "fold"}),
    ]
    rows = []
    for p in profiles.values():
        precs = ", ".join(f"[bold]{safe(x)}[/]" if x == p.default_precision else safe(x) for x in p.precisions)
        src = "built-in" if p.path and p.path.parent.resolve() == builtin_dir().resolve() else str(p.path)
        chain = " → ".join(s.converter for s in p.chain)
        rows.append(
            [safe(p.name), safe(p.title), safe(p.runner), safe(chain), precs, f"{p.frame_budget_ms:g}", safe(src)]
        )
    print_table("edgekit targets", columns, rows, narrow={"target", "runtime", "precisions", "budget ms"}, wide=wide)


@app.command("show")
@command
def show(
    name: str = typer.Argument(..., help="Target name, e.g. intel-igpu."),
    targets_dir: list[Path] | None = TargetsDir,
    as_json: bool = JsonOut,
) -> None:
    """One profile: hardware, what it converts to, runtime options, where each step runs, and this host's answer."""
    p = get_target(name, dirs(targets_dir))
    conv, run = conversion_problems(p), runnable_here(p)
    if as_json:
        print_json(
            {
                **p.to_json(),
                "this_host": {
                    "can_convert": not conv,
                    "convert_problems": conv,
                    "can_run": run is None,
                    "run_problem": run,
                },
            }
        )
        return
    t = Table(title=safe(f"{p.name}: {p.title}"), show_header=False)
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")
    rows: list[tuple[str, str]] = [
        ("hardware", p.hardware),
        ("accelerator", p.accelerator),
        ("precisions", ", ".join(p.precisions) + f" (default {p.default_precision})"),
        ("frame budget", f"{p.frame_budget_ms:g} ms ({1000 / p.frame_budget_ms:.0f} fps)"),
        ("convert chain", " → ".join(s.converter + (f" [{s.precision}]" if s.precision else "") for s in p.chain)),
        ("convert runs on", f"{'/'.join(p.convert_place.os)} on {'/'.join(p.convert_place.arch)} (build host)"),
    ]
    rows += [
        (f"  {conv_name} options", ", ".join(f"{k}={v}" for k, v in opts.items()))
        for conv_name, opts in p.convert_options.items()
    ]
    where = f"{'/'.join(p.run_place.os)} on {'/'.join(p.run_place.arch)}"
    if p.run_place.needs_gpu:
        where += ", needs an NVIDIA GPU"
    if p.run_place.needs_device:
        where += ", needs the device's accelerator attached"
    rows += [
        ("runner", p.runner),
        ("runs on", where),
        ("runtime options", ", ".join(f"{k}={v}" for k, v in p.runtime_options.items()) or "-"),
    ]
    for label, value in rows:
        t.add_row(safe(label), safe(value))
    t.add_row("this host converts", "yes" if not conv else "[red]no[/]: " + safe("; ".join(conv)))
    t.add_row("this host runs", "yes" if run is None else "[yellow]no[/]: " + safe(run))
    if p.notes:
        t.add_row("notes", safe(p.notes))
    t.add_row("profile file", safe(str(p.path)))
    console.print(t)
