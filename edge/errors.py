"""One error hierarchy. Each error says what is wrong and what to do next.

The CLI prints ``str(err)`` on one line and exits with code 2 (:data:`USER_ERROR`). Anything that is
not an ``EdgeError`` is a bug: it too becomes one line (:func:`internal_error_line`: the step, the
exception, the log file its traceback was saved to) and exit code 3 (:data:`INTERNAL_ERROR`), so a
script tells "you gave me something wrong" from "edgekit has a bug" and no traceback reaches a user.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

#: exit codes: a measured verdict refused the work (over budget: as `edgekit bench`); the user's input was
#: refused; edgekit failed unexpectedly (a bug)
VERDICT_FAILED = 1
USER_ERROR = 2
INTERNAL_ERROR = 3
#: crash logs kept in the log directory (the oldest go first)
KEEP_CRASH_LOGS = 50


class EdgeError(Exception):
    """Base of every error edgekit raises on purpose. The CLI prints it as one line and exits ``exit_code``:
    2 (the input or the setup is wrong) unless a subclass says otherwise."""

    exit_code = USER_ERROR

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message} ({hint})")


class InputFileError(EdgeError):
    """A file given by the user is missing, unreadable or not what it claims to be."""


class ModelError(EdgeError):
    """The source model cannot be used as it is (dynamic shapes, bad graph, ...)."""


class TargetError(EdgeError):
    """Unknown target name, or a target profile that fails validation."""


class PrecisionError(EdgeError):
    """A precision the target or converter does not allow."""


class MissingDependencyError(EdgeError):
    """A package, binary or platform a step needs is not present on this host."""


class UnknownBackendError(EdgeError):
    """A converter or runner name that no installed plugin provides."""


class CalibrationError(EdgeError):
    """Calibration data missing, empty, or of the wrong shape/dtype."""


class ConversionError(EdgeError):
    """A converter failed on a model it should handle."""


class ParityError(EdgeError):
    """The converted model does not compute the same thing as the source."""

    def __init__(self, message: str, report: object | None = None, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.report = report


class BudgetError(EdgeError):
    """The benchmark's p99 latency is over the frame budget. A measured verdict, not a wrong input: exit 1, the
    code ``edgekit bench`` gives for the same verdict, so a script reads "over budget" the same from both."""

    exit_code = VERDICT_FAILED


class BundleError(EdgeError):
    """A bundle is missing, malformed, or its artifacts do not match their hashes."""


class ManifestError(BundleError):
    """A manifest.json that is not a valid manifest: the message names the file and the field."""


class SignatureError(BundleError):
    """A bundle the trust store does not vouch for: unsigned, bad signature, unknown, revoked or expired
    key, an older version than seen, or another target class; or a signing key that cannot be used."""


class DeployError(EdgeError):
    """Shipping to a device store failed or was refused."""


class HardwareUnavailableError(MissingDependencyError):
    """The step needs hardware (GPU, NPU, OS) this host does not have."""


# What a terminal acts on instead of showing: C0 controls (ESC starts CSI/OSC sequences that recolour, retitle,
# or on some terminals write files), DEL, the C1 range (0x9b is a one-byte CSI), Unicode line separators and
# the bidi overrides that make a file name read backwards. Newline stays: callers that need one line split on it.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: object) -> str:
    """``text`` with every control character shown as an escape (``\\x1b``), never sent to the terminal raw.

    Every user-controlled string the CLI prints (file names, ids, reasons, error messages) and every log line
    the agent and the collector write to a terminal pass here."""
    return _UNPRINTABLE.sub(
        lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}", str(text)
    )


def did_you_mean(name: str, choices: list[str]) -> str:
    """'did you mean 'x86-cpu'? ' for a near miss among ``choices``, else ''."""
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    return f"did you mean {close[0]!r}? " if close else ""


def crash_log_dir() -> Path:
    """Where tracebacks of internal errors go: ``$EDGEKIT_LOG_DIR``, else ``$XDG_STATE_HOME/edgekit/crashes``
    (``~/.local/state/edgekit/crashes``)."""
    env = os.environ.get("EDGEKIT_LOG_DIR", "").strip()
    if env:
        return Path(env).expanduser()
    state = os.environ.get("XDG_STATE_HOME", "").strip()
    return (Path(state) if state else Path.home() / ".local" / "state") / "edgekit" / "crashes"


#: the crash logs edgekit writes (:func:`_new_log`): rotation deletes these and nothing else in the directory
_OWN_LOG = re.compile(r"[0-9]{8}T[0-9]{6}Z-[0-9]+-[\w-]{1,44}\.log")
#: a password in a URL (``postgresql://user:secret@host``) or a ``password=`` pair (a DSN, a query string)
_SECRET_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/\s:@'\"]*:)[^@/\s'\"]*@")
_SECRET_PAIR = re.compile(r"((?:password|passwd|pwd|secret|token)=)[^&\s'\",]*", re.I)


def redact(text: str) -> str:
    """``text`` with the passwords of URLs and ``password=`` pairs replaced by ``***`` (a crash log keeps the
    command line: ``--db postgresql://edge:secret@db/fleet`` must not leave its password in a file)."""
    return _SECRET_PAIR.sub(r"\1***", _SECRET_URL.sub(r"\1***@", text))


def save_traceback(step: str, exc: BaseException) -> Path | None:
    """Write ``exc``'s traceback (with the command line, passwords redacted, and versions) to a new file under
    :func:`crash_log_dir` (mode 0600; at most :data:`KEEP_CRASH_LOGS` of edgekit's own logs kept) and return its
    path; None when no file could be written. The temp-dir fallback is used only when it is a real directory
    (not a link) owned by this user and closed to others: a planted one is never written to or rotated."""
    version = getattr(sys.modules.get("edge"), "__version__", "?")  # the package is loaded: no import needed
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    word = "".join(c if c.isalnum() else "-" for c in step)[:40] or "edgekit"
    text = redact(
        f"edgekit {version} internal error in {step}\n"
        f"time: {stamp}\ncommand: {sys.argv!r}\npython: {sys.version.split()[0]} on {sys.platform}\n\n"
        + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    )
    fallback = Path(tempfile.gettempdir()) / f"edgekit-crashes-{getattr(os, 'getuid', lambda: 0)()}"
    for d, shared in ((crash_log_dir(), False), (fallback, True)):
        try:
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
            if shared:
                _own_private_dir(d)
            path, fd = _new_log(d, f"{stamp}-{os.getpid()}-{word}")
            with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
                f.write(text)
        except OSError:
            continue
        _rotate(d)
        return path
    return None


def _new_log(d: Path, stem: str) -> tuple[Path, int]:
    """A new file ``STEM.log`` (``STEM-2.log``... when one process fails twice in a second: the agent, a test
    run in-process), created exclusively with mode 0600 (never through a link); OSError when none can be."""
    for n in range(1, 100):
        path = d / (f"{stem}.log" if n == 1 else f"{stem}-{n}.log")
        try:
            return path, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except FileExistsError:
            continue
    raise FileExistsError(f"{d / stem}.log and 98 more exist")


def _own_private_dir(d: Path) -> None:
    """OSError unless ``d`` is a directory (not a symbolic link) owned by this user that no one else may write."""
    st = os.lstat(d)
    uid = getattr(os, "getuid", lambda: st.st_uid)()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o022:
        raise PermissionError(f"{d} is not a private directory of this user")


def _rotate(d: Path) -> None:
    """Keep the newest :data:`KEEP_CRASH_LOGS` of edgekit's own crash logs in ``d``: regular files with the names
    :func:`_new_log` gives; another program's ``*.log``, a directory or a link is never counted or deleted."""
    own = []
    try:
        with os.scandir(d) as it:
            for e in it:
                if _OWN_LOG.fullmatch(e.name) and e.is_file(follow_symlinks=False):
                    try:
                        own.append((e.stat(follow_symlinks=False).st_mtime, e.name))
                    except OSError:
                        continue
    except OSError:
        return
    for _, name in sorted(own)[:-KEEP_CRASH_LOGS]:
        try:
            os.unlink(d / name)
        except OSError:
            continue


#: (step, exception type) -> the crash log of its first occurrence in this process (:func:`daemon_error_line`)
_FIRST_LOG: dict[tuple[str, str], Path | None] = {}


def daemon_error_line(step: str, exc: BaseException) -> str:
    """One line for a long-running process's log (the agent's threads, the MQTT loops): an EdgeError's message;
    any other exception :func:`internal_error_line`, its traceback saved the first time STEP fails with that
    type in this process (a loop that trips over one bug a thousand times writes one file, not a thousand)."""
    if isinstance(exc, EdgeError):
        return f"{step}: " + " | ".join(part.strip() for part in str(exc).splitlines() if part.strip())
    key = (step, type(exc).__name__)
    if key not in _FIRST_LOG:
        _FIRST_LOG[key] = save_traceback(step, exc)
    return _internal_line(step, exc, _FIRST_LOG[key])


def thread_excepthook(say: Callable[[str], None]) -> Callable[[threading.ExceptHookArgs], None]:
    """A ``threading.excepthook`` for a command's run: a thread that dies of an uncaught exception is one line
    through ``say`` (:func:`daemon_error_line`, step ``thread NAME``) instead of Python's traceback on stderr."""

    def hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit or args.exc_value is None:
            return
        name = args.thread.name if args.thread is not None else "?"
        say(daemon_error_line(f"thread {name}", args.exc_value))

    return hook


def internal_error_line(step: str, exc: BaseException) -> str:
    """``internal error in STEP: Type: message; details in FILE``, the traceback saved (:func:`save_traceback`).
    The message is cut to one line of at most 300 characters; control characters are the caller's to escape."""
    return _internal_line(step, exc, save_traceback(step, exc))


def _internal_line(step: str, exc: BaseException, path: Path | None) -> str:
    message = " | ".join(part.strip() for part in str(exc).splitlines() if part.strip())
    message = message if len(message) <= 300 else message[:297] + "..."
    where = f"details in {path}" if path is not None else "the traceback could not be saved (no writable log directory)"
    return f"internal error in {step}: {type(exc).__name__}: {message or '(no message)'}; {where}"
