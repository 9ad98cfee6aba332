"""The ``edgekit`` command: a thin typer layer over the ``edge`` library (the app: :mod:`edge.cli.root`).

The command line is the ``cli`` extra (typer, rich): a device that runs only the agent (``python -m edge.agent``)
or the library installs the core (numpy) and its runtime's extra, and never these. Without them, ``edgekit``
says in one line what to install instead of a traceback.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    import typer

#: what a bare ``edgekit`` (the core install: no typer or rich) prints, then exit 2
CLI_MISSING = "edgekit: the command line is not installed (the core install leaves out typer and rich); install it with: pip install 'edgekit-ml[cli]'"


def _cli_installed() -> bool:
    try:
        import rich.console  # noqa: F401
        import typer  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv: Sequence[str] | None = None) -> None:
    """The console script."""
    if not _cli_installed():
        sys.stderr.write(CLI_MISSING + "\n")
        sys.exit(2)
    from edge.cli.root import main as run

    run(argv)


def __getattr__(name: str) -> Any:
    """``from edge.cli import app``: the typer app, imported on first use."""
    if name == "app":
        from edge.cli.root import app

        return app
    raise AttributeError(f"module 'edge.cli' has no attribute {name!r}")


if TYPE_CHECKING:
    app: typer.Typer
