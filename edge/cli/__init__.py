"""The ``edgekit`` command: a thin typer layer over the ``edge`` library.

One module per command group. Commands parse, call one library function, and render a rich
table or ``--json``. ``EdgeError`` becomes one line on stderr and exit code 2;
any other exception one line naming its log file, and exit code 3.
"""

from __future__ import annotations

from typing import Sequence

import typer

import edge
from edge.cli import agent as _agent
from edge.cli import bench as _bench
from edge.cli import convert as _convert
from edge.cli import deploy as _deploy
from edge.cli import doctor as _doctor
from edge.cli import finish as _finish
from edge.cli import firmware as _firmware
from edge.cli import fleet as _fleet
from edge.cli import run as _run
from edge.cli import signing as _signing
from edge.cli import targets as _targets
from edge.cli import toolchain as _toolchain
from edge.cli import trust as _trust
from edge.cli import tune as _tune
from edge.cli import verify as _verify
from edge.cli._common import command, err_console, one_line, safe
from edge.errors import INTERNAL_ERROR, internal_error_line

app = typer.Typer(
    name="edgekit",
    help="Convert a model for an edge device, prove it computes the same thing, benchmark it "
    "against a frame budget, and ship a verified bundle.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"edgekit {edge.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool | None = typer.Option(
        None, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """edgekit: models to edge devices, verified."""


app.add_typer(_targets.app, name="targets")
app.command("doctor")(command(_doctor.doctor_cmd))
app.command("convert")(command(_convert.convert_cmd))
app.command("finish")(command(_finish.finish_cmd))
app.command("bench")(command(_bench.bench_cmd))
app.command("verify")(command(_verify.verify_cmd))
app.command("tune")(command(_tune.tune_cmd))
app.command("deploy")(command(_deploy.deploy_cmd))
app.command("rollback")(command(_deploy.rollback_cmd))
app.command("run")(command(_run.run_cmd))
app.command("agent")(command(_agent.agent_cmd))
app.add_typer(_fleet.app, name="fleet")
app.add_typer(_signing.app, name="keys")
app.command("sign")(command(_signing.sign_cmd))
app.add_typer(_trust.app, name="trust")
app.add_typer(_toolchain.app, name="toolchain")
app.add_typer(_firmware.app, name="firmware")


def _click_errors() -> tuple[type[BaseException], type[BaseException], type[BaseException]]:
    """(ClickException, UsageError, Abort) of the click typer runs on (recent typer vendors it)."""
    try:
        from typer._click import exceptions as ex  # type: ignore[import-not-found, unused-ignore]
    except ImportError:  # typer on the click package (the ignores: one of the two is absent)
        from click import exceptions as ex  # type: ignore[no-redef, unused-ignore]
    return ex.ClickException, ex.UsageError, typer.Abort


def main(argv: Sequence[str] | None = None) -> None:
    """The console script. A usage error (unknown option, missing argument, bad value) is one line on stderr
    and exit 2, like every other refusal, instead of click's boxed multi-line form."""
    import sys

    click_error, usage_error, abort = _click_errors()
    try:
        rv = _dispatch(argv, usage_error, click_error, abort)
    except (SystemExit, KeyboardInterrupt):
        raise
    except Exception as e:  # noqa: BLE001 - outside any command (option parsing, a group): still one line, exit 3
        err_console.print(
            f"[bold red]error:[/] {safe(internal_error_line('edgekit', e))}", highlight=False, soft_wrap=True
        )
        sys.exit(INTERNAL_ERROR)
    # standalone_mode=False returns a command's value, or the code of a typer.Exit it raised
    sys.exit(rv if isinstance(rv, int) and not isinstance(rv, bool) else 0)


def _dispatch(
    argv: Sequence[str] | None,
    usage_error: type[BaseException],
    click_error: type[BaseException],
    abort: type[BaseException],
) -> object:
    """Run the command line; click's own errors become one line and their exit code."""
    import sys

    from typer.main import get_command

    try:
        rv = get_command(app).main(
            args=list(argv) if argv is not None else None, prog_name="edgekit", standalone_mode=False
        )
    except usage_error as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # the help is already printed
            sys.exit(e.exit_code)  # type: ignore[attr-defined]
        ctx = getattr(e, "ctx", None)
        where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        err_console.print(
            f"[bold red]error:[/] {safe(one_line(e.format_message()))}{safe(where)}",  # type: ignore[attr-defined]
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(e.exit_code)  # type: ignore[attr-defined]
    except click_error as e:
        err_console.print(
            f"[bold red]error:[/] {safe(one_line(e.format_message()))}",  # type: ignore[attr-defined]
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(e.exit_code)  # type: ignore[attr-defined]
    except abort:
        err_console.print("Aborted.", highlight=False)
        sys.exit(1)
    return rv
