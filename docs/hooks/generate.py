"""mkdocs hook: pages generated at build time, so they cannot go stale.

* ``index.md``: the repository's README.md (the landing page), its ``docs/`` links made site-relative;
* ``cli.md``: the CLI reference, every command's ``--help`` read from the typer app itself;
* ``environment.md``: every ``EDGEKIT_*`` variable, from ``edge/envvars.py`` (a test keeps that in step with the code).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]


def _readme() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.sub(r"\]\(docs/([^)#]+)", r"](\1", text)


def _walk(cmd: Any, path: list[str], ctx: Any) -> list[str]:
    # typer >= 0.29 carries its own copy of click: build the command's own context class, duck-type groups
    sub = cmd.context_class(cmd, info_name=path[-1], parent=ctx, terminal_width=100, max_content_width=100)
    out = [f"{'#' * min(len(path) + 1, 4)} `{' '.join(path)}`", "", "```text", cmd.get_help(sub).rstrip(), "```", ""]
    if hasattr(cmd, "list_commands"):
        for name in sorted(cmd.list_commands(sub)):
            child = cmd.get_command(sub, name)
            if child is not None and not child.hidden:
                out += _walk(child, [*path, name], sub)
    return out


def _cli_reference() -> str:
    import typer.core

    from edge.cli import app

    typer.core.HAS_RICH = False  # plain text help (rich would print boxes to the terminal instead of returning it)
    root = typer.main.get_command(app)
    head = [
        "# CLI reference",
        "",
        "Generated from the typer app when the site is built (`docs/hooks/generate.py`), so it is what "
        "`edgekit ... --help` prints for this version. Every command is a thin layer over a library "
        "function; a user error is one line and exit code 2, an internal error one line and exit code 3.",
        "",
    ]
    return "\n".join(head + _walk(root, ["edgekit"], None))


def on_files(files: Files, config: Any) -> Files:
    from edge.envvars import markdown as environment

    for uri, content in (("index.md", _readme()), ("cli.md", _cli_reference()), ("environment.md", environment())):
        files.append(File.generated(config, uri, content=content))
    return files
