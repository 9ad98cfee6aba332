"""The ``edgekit`` typer app (``edge.cli`` imports it only once typer and rich are known to be installed).

One module per command group. Commands parse, call one library function, and render a rich
table or ``--json``. ``EdgeError`` becomes one line on stderr and exit code 2;
any other exception one line naming its log file, and exit code 3.
"""

from __future__ import annotations

from typing import NoReturn, Sequence

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
from edge.cli._common import command, err_console, one_line, quiet_exit_on_closed_stdout, safe, stdout_closed
from edge.errors import INTERNAL_ERROR, internal_error_line

app = typer.Typer(
    name="edgekit",
    help="Convert a model for an edge device, prove it computes the same thing, benchmark it "
    "against a frame budget, and ship a verified bundle.",
    no_args_is_help=True,
    # `edgekit --install-completion` (bash, zsh, fish, PowerShell); `-h` as well as `--help` everywhere
    add_completion=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    # plain help, as git's: wraps at any width without cutting a path or a URL (rich's boxed help put a
    # 20-column help text beside long option names at 80 columns and cut `ssh://user@host:po…`), and reads
    # `edgekit-ml[onnx]` in a help text as text, not markup
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"edgekit {edge.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: bool | None = typer.Option(
        None, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    verbose: int = typer.Option(
        0,
        "--verbose",
        "-v",
        count=True,
        show_default=False,
        help="Progress lines on stderr even when it is not a terminal, and the library's log at INFO (-vv: DEBUG).",
    ),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="No progress lines or spinners: results, warnings and errors only."
    ),
) -> None:
    """edgekit: models to edge devices, verified."""
    if verbose and quiet:
        raise typer.BadParameter("-v and -q together: choose one")
    ctx.obj = -1 if quiet else verbose  # read by edge.cli._common.verbosity()
    if verbose:
        import logging

        logging.basicConfig(
            level=logging.DEBUG if verbose > 1 else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
        )


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
    was_devnull = _stdout_is_devnull()
    try:
        rv = _dispatch(argv, usage_error, click_error, abort)
    except SystemExit as e:
        # click (help, --version) and rich (a table) meet a closed stdout with exit 1 after pointing stdout
        # elsewhere; the reader going away is no failure: 141, as a shell reports a SIGPIPE'd command
        if e.code == 1 and (type(sys.stdout).__name__ == "PacifyFlushWrapper" or _stdout_is_devnull() > was_devnull):
            quiet_exit_on_closed_stdout()
        raise
    except KeyboardInterrupt:
        raise
    except BrokenPipeError as e:  # a closed stdout outside a command (help, --version): quiet, like inside one
        if not stdout_closed():
            _internal(e)
        quiet_exit_on_closed_stdout()
    except Exception as e:  # noqa: BLE001 - outside any command (option parsing, a group): still one line, exit 3
        _internal(e)
    # standalone_mode=False returns a command's value, or the code of a typer.Exit it raised
    sys.exit(rv if isinstance(rv, int) and not isinstance(rv, bool) else 0)


def _stdout_is_devnull() -> bool:
    import os

    try:
        a, b = os.fstat(1), os.stat(os.devnull)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _internal(e: BaseException) -> NoReturn:
    import sys

    err_console.print(f"[bold red]error:[/] {safe(internal_error_line('edgekit', e))}", highlight=False, soft_wrap=True)
    sys.exit(INTERNAL_ERROR)


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
