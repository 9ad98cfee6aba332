"""``edgekit doctor``."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from edge.capabilities import current_host
from edge.cli._common import JsonOut, TargetsDir, console, dirs, print_json, safe
from edge.doctor import doctor, emulation


def doctor_cmd(targets_dir: list[Path] | None = TargetsDir, as_json: bool = JsonOut) -> None:
    """Per target: can this host convert for it? run it? What is missing, and the install command."""
    health = doctor(dirs(targets_dir))
    host = current_host()
    if as_json:
        print_json({"host": host.describe(), "targets": [h.to_json() for h in health], "emulation": emulation()})
        return
    t = Table(title=safe(f"edgekit doctor: this host is {host.describe()}"))
    for col in ("target", "convert here", "run here", "what is missing"):
        t.add_column(col, overflow="fold")
    for h in health:
        missing = list(h.convert_problems) + ([h.run_problem] if h.run_problem else [])
        t.add_row(
            safe(h.target.name),
            "[green]yes[/]" if h.can_convert else "[red]no[/]",
            "[green]yes[/]" if h.can_run else "[yellow]no[/]",
            safe("\n".join(missing)) or "-",
        )
    console.print(t)
    for isa, e in emulation().items():
        console.print(
            f"{isa} (emulated, `edgekit verify --isa {isa}`): "
            + (f"[green]{safe(e['detail'])}[/]" if e["ready"] else f"[yellow]{safe(e['detail'])}[/]"),
            highlight=False,
        )
