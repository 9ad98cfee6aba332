"""``edgekit doctor``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edge.capabilities import current_host
from edge.cli._common import JsonOut, TargetsDir, console, dirs, print_json, print_table, safe
from edge.doctor import doctor, emulation


def doctor_cmd(targets_dir: list[Path] | None = TargetsDir, as_json: bool = JsonOut) -> None:
    """Per target: can this host convert for it? run it? What is missing, and the install command."""
    health = doctor(dirs(targets_dir))
    host = current_host()
    if as_json:
        print_json({"host": host.describe(), "targets": [h.to_json() for h in health], "emulation": emulation()})
        return
    rows = []
    for h in health:
        missing = list(h.convert_problems) + ([h.run_problem] if h.run_problem else [])
        rows.append(
            [
                safe(h.target.name),
                "[green]yes[/]" if h.can_convert else "[red]no[/]",
                "[green]yes[/]" if h.can_run else "[yellow]no[/]",
                safe("\n".join(missing)) or "-",
            ]
        )
    # the name whole, yes/no columns narrow, the reasons wrap at word boundaries (a URL or path longer than the
    # column folds rather than being cut)
    columns: list[tuple[str, dict[str, Any]]] = [
        ("target", {"no_wrap": True}),
        ("converts", {"no_wrap": True}),
        ("runs", {"no_wrap": True}),
        ("what is missing", {"overflow": "fold"}),
    ]
    headers = {c for c, _ in columns}
    print_table(safe(f"edgekit doctor: this host is {host.describe()}"), columns, rows, narrow=headers, wide=False)
    for isa, e in emulation().items():
        console.print(
            f"{isa} (emulated, `edgekit verify --isa {isa}`): "
            + (f"[green]{safe(e['detail'])}[/]" if e["ready"] else f"[yellow]{safe(e['detail'])}[/]"),
            highlight=False,
        )
