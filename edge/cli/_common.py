"""What the command modules share: consoles, JSON output, common options."""

from __future__ import annotations

import functools
import json
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn, Sequence, TypeVar

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from edge.errors import INTERNAL_ERROR, USER_ERROR, EdgeError, internal_error_line, printable, thread_excepthook

TargetsDir = typer.Option(
    None,
    "--targets-dir",
    help="Extra directory of target profiles (repeatable); also read from EDGEKIT_TARGETS_PATH.",
    show_default=False,
)
FleetDb = typer.Option(
    "sqlite:///fleet.db", "--db", help="sqlite:///relative.db, sqlite:////absolute.db or postgresql://user@host/dbname."
)
JsonOut = typer.Option(False, "--json", help="Print machine-readable JSON instead of tables.")
Wide = typer.Option(
    False, "--wide", help="Every column, whatever the terminal's width (the table is made for 80 columns without it)."
)
AllowCpuFallback = typer.Option(
    False,
    "--allow-cpu-fallback",
    help="When the target's accelerator is missing (Edge TPU, TensorRT GPU), run on the CPU instead; every report then says CPU fallback.",
)


def safe(text: object) -> str:
    """``text`` ready for a rich markup string: control characters escaped (:func:`printable`) and
    ``[...]`` shown as written instead of read as markup."""
    return escape(printable(text))


class SafeConsole(Console):
    """A rich console that escapes control characters in every string it renders (prints, table cells,
    panels), so a hostile file name, id or reason never reaches the terminal raw, even where a renderer
    forgot :func:`safe`. Styles come from markup, never from control characters in the text. Emoji codes
    are never read (:func:`make_console`): ``:x:`` in a file's bytes stays ``:x:``. A closed stdout is a
    quiet exit (:func:`quiet_exit_on_closed_stdout`), not rich's exit 1."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        kwargs["emoji"] = False  # even where a caller asks for it: every string may carry data
        return super().render_str(printable(text), **kwargs)

    def on_broken_pipe(self) -> None:
        quiet_exit_on_closed_stdout()


def make_console(*, stderr: bool = False, width: int | None = None) -> SafeConsole:
    """The one way edgekit makes a console: emoji codes off (data such as ``root:x:0`` must print as
    written), markup read only in edgekit's own format strings, where data goes through :func:`safe`;
    data printed on its own goes through :func:`print_data` (no markup at all)."""
    return SafeConsole(stderr=stderr, emoji=False, width=width)


console = make_console()
err_console = make_console(stderr=True)

#: The exit code of a command whose reader went away (``edgekit ... | head``): a shell's 128 + SIGPIPE.
CLOSED_STDOUT = 141


def stdout_closed() -> bool:
    """True when stdout's reader has gone (a pipe whose read end is closed reports POLLERR)."""
    import select
    import sys

    try:
        fd = sys.__stdout__.fileno() if sys.__stdout__ is not None else 1
        poller = select.poll()
        poller.register(fd, 0)
        return any(ev & (select.POLLERR | select.POLLHUP) for _fd, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def quiet_exit_on_closed_stdout() -> NoReturn:
    """``edgekit ... | head``: the reader has what it wanted. Exit 141 without a word (no crash log, no
    "Exception ignored" at shutdown: stdout now points at /dev/null, so the final flush has somewhere to go)."""
    import os
    import sys

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.__stdout__.fileno() if sys.__stdout__ is not None else 1)
        os.close(devnull)
    except (OSError, ValueError):
        pass
    raise SystemExit(CLOSED_STDOUT)


def print_data(text: str, *, err: bool = False) -> None:
    """A line of data (a path, an id, a log line) on stdout (stderr with ``err``) exactly as it is: no markup,
    no emoji, no highlighting; control characters escaped."""
    (err_console if err else console).print(text, markup=False, emoji=False, highlight=False, soft_wrap=True)


def fallback_options(runner_name: str, allow: bool) -> dict[str, Any]:
    """Runner options for ``--allow-cpu-fallback`` (refused for runners that have no such choice)."""
    if not allow:
        return {}
    from edge.backends.runner import RUNNERS

    if "allow_cpu_fallback" not in RUNNERS.get(runner_name).options:
        raise EdgeError(
            f"runner {runner_name!r} has no CPU fallback to allow: it runs on the CPU already, or falls back on its own and reports it"
        )
    return {"allow_cpu_fallback": True}


def dirs(values: list[Path] | None) -> list[Path]:
    return list(values or [])


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def verbosity() -> int:
    """The global ``-v``/``-q`` of this command line (``edgekit -v convert ...``): -1 quiet, 0 normal, 1 or more
    verbose. Kept on the root click context's ``obj`` (set by the root callback), not in a module global."""
    ctx = current_context()
    root = ctx.find_root() if ctx is not None else None
    level = getattr(root, "obj", None) if root is not None else None
    return level if isinstance(level, int) and not isinstance(level, bool) else 0


def progress_wanted() -> bool:
    """Progress lines on stderr: at a terminal by default; never with ``-q``; always with ``-v`` (a CI log that
    wants to see where the time went)."""
    level = verbosity()
    return level > 0 or (level == 0 and err_console.is_terminal)


def progress(msg: str) -> None:
    """A progress line on stderr, for a person at a terminal only (or with ``-v``; never with ``-q``).

    Piped or logged, stderr carries warnings, notes and the one-line error alone, so that a script
    (or a CI log) reads a failure as exactly one line; ``--json`` is quiet either way.
    """
    if progress_wanted():
        err_console.print(msg, highlight=False)


@contextmanager
def steps(enabled: bool) -> Iterator[Callable[[str], None]]:
    """A spinner that shows the current step of a long operation, plus one line per step (at a terminal only,
    like :func:`progress`; quiet in --json mode). With ``-v`` away from a terminal: the step lines, no spinner."""
    if not enabled or not progress_wanted():
        yield lambda _msg: None
        return
    start = time.perf_counter()
    if not err_console.is_terminal:

        def line(msg: str) -> None:
            err_console.print(f"{time.perf_counter() - start:6.1f}s {safe(msg)}", highlight=False)

        yield line
        return
    with err_console.status("starting") as status:  # a spinner, plus one line per finished step

        def say(msg: str) -> None:
            status.update(msg)
            err_console.print(f"[dim]{time.perf_counter() - start:6.1f}s[/] {safe(msg)}", highlight=False)

        yield say


def print_table(
    title: str,
    columns: Sequence[tuple[str, dict[str, Any]]],
    rows: Sequence[Sequence[str]],
    *,
    narrow: set[str],
    wide: bool,
) -> None:
    """A table on stdout that reads at 80 columns. ``columns``: (header, rich column options); ``narrow``: the
    headers kept when every column does not fit the terminal at its natural width (a word is never cut, a
    column never squeezed to nothing); ``wide`` (``--wide``): every column at its natural width however wide the
    terminal is (the terminal wraps the lines; a pager or a file keeps them)."""

    def build(keep: list[int]) -> Table:
        t = Table(title=title, box=box.SIMPLE_HEAD)
        for i in keep:
            t.add_column(columns[i][0], **columns[i][1])
        for r in rows:
            t.add_row(*(r[i] for i in keep))
        return t

    full = build(list(range(len(columns))))
    need = console.measure(full, options=console.options.update(width=100_000)).maximum
    if need <= console.width or (not wide and narrow >= {header for header, _ in columns}):
        console.print(full)
    elif wide:
        make_console(width=need).print(full, crop=False)  # rich's print(width=) cannot pass the console's own width
    else:
        console.print(build([i for i, (header, _) in enumerate(columns) if header in narrow]))
        console.print("more columns: --wide", style="dim", highlight=False)


def fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


F = TypeVar("F", bound=Callable[..., Any])


def command(fn: F) -> F:
    """An ``EdgeError`` becomes one line on stderr and its exit code (``EdgeError.exit_code``: 2, or 1 for a
    verdict such as over budget). Any other exception is a bug in edgekit: one
    line too (``internal error in STEP: Type: message; details in FILE``), its traceback saved to that file
    (``edge.errors.save_traceback``), exit code 3. typer's and click's own exits pass through."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        previous = threading.excepthook  # a thread the command starts dies in one line too
        threading.excepthook = thread_excepthook(_print_error)
        try:
            return fn(*args, **kwargs)
        except EdgeError as e:
            err_console.print(f"[bold red]error:[/] {safe(one_line(str(e)))}", highlight=False, soft_wrap=True)
            raise typer.Exit(getattr(e, "exit_code", USER_ERROR)) from None
        except (typer.Exit, typer.Abort):
            raise
        except BrokenPipeError as e:
            if stdout_closed():
                quiet_exit_on_closed_stdout()
            internal_error(_step_name(fn), e)
        except Exception as e:  # noqa: BLE001 - the firewall: every bug becomes one line and a log file
            if type(e).__module__.split(".")[0] in ("click", "typer"):  # a usage error raised inside a command
                raise
            internal_error(_step_name(fn), e)
        finally:
            threading.excepthook = previous

    return wrapper  # type: ignore[return-value]


def _print_error(line: str) -> None:
    err_console.print(f"[bold red]error:[/] {safe(line)}", highlight=False, soft_wrap=True)


def internal_error(step: str, exc: BaseException) -> NoReturn:
    """Print :func:`edge.errors.internal_error_line` on stderr and exit with code 3."""
    err_console.print(f"[bold red]error:[/] {safe(internal_error_line(step, exc))}", highlight=False, soft_wrap=True)
    raise typer.Exit(INTERNAL_ERROR) from None


def current_context() -> Any:
    """The click context of the command running now, or None."""
    get_current_context: Callable[..., Any] | None
    # recent typer vendors click; older typer runs on the click package (the ignores: one of the two is absent)
    try:
        from typer._click.globals import get_current_context  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        try:
            from click import get_current_context  # type: ignore[no-redef, unused-ignore]
        except ImportError:
            get_current_context = None
    return get_current_context(silent=True) if get_current_context is not None else None


def _step_name(fn: Callable[..., Any]) -> str:
    """The command as typed (``fleet collect``), else the function's name without ``_cmd``."""
    ctx = current_context()
    path = str(getattr(ctx, "command_path", "") or "").split()
    return " ".join(path[1:]) if len(path) > 1 else fn.__name__.removesuffix("_cmd").replace("_", " ")


def one_line(text: str) -> str:
    """``text`` on one line: a message that quotes a tool's multi-line output (ssh, a compiler) keeps every
    line, joined with `` | ``; the hint is already part of ``str(EdgeError)``, in parentheses. Control
    characters are escaped (:func:`printable`)."""
    return printable(" | ".join(part.strip() for part in text.splitlines() if part.strip()))


def threads_line(runner: dict[str, Any]) -> str | None:
    """Why the runner runs on the threads it does (``edge.backends.threads``): for the run and bench tables."""
    policy = (runner.get("details") or {}).get("threads_policy")
    if not isinstance(policy, dict) or not policy.get("reason"):
        return None
    line = str(policy["reason"])
    replans = policy.get("replans")
    if isinstance(replans, list) and replans and isinstance(replans[-1], dict):
        line += f" [re-planned {len(replans)} time(s) as the load changed, last after {replans[-1].get('after_s')} s]"
    return safe(line)
