"""Conventions a user of any CLI expects (issue #33 item 5): ``-h``, shell completion, global ``-v``/``-q``."""

from __future__ import annotations

import os
import pty
import subprocess
from pathlib import Path

from tests.support.cli import EDGEKIT, run_cli


def test_dash_h_is_help_everywhere() -> None:
    for args in (("-h",), ("convert", "-h"), ("fleet", "status", "-h"), ("toolchain", "install", "-h")):
        p = run_cli(*args)
        assert p.returncode == 0, (args, p.stderr)
        assert "Usage: edgekit" in p.stdout, (args, p.stdout)
    # a command's own -v (toolchain install --verbose) still works beside the global one
    assert "Print every line pip prints" in run_cli("toolchain", "install", "-h").stdout


def test_shell_completion_is_on() -> None:
    p = run_cli("--help")
    assert "--install-completion" in p.stdout and "--show-completion" in p.stdout
    # the script --show-completion prints once it has found the user's shell (from the process tree, which a test
    # run need not have): asked for by name
    p = run_cli(env={"_EDGEKIT_COMPLETE": "source_bash"})
    assert p.returncode == 0 and "_edgekit_completion" in p.stdout and "_EDGEKIT_COMPLETE" in p.stdout, p.stderr
    # what bash asks when the user presses TAB after `edgekit fleet st`
    p = run_cli(env={"_EDGEKIT_COMPLETE": "complete_bash", "COMP_WORDS": "edgekit fleet st", "COMP_CWORD": "2"})
    assert p.returncode == 0 and p.stdout.split() == ["status"], (p.stdout, p.stderr)


def _stderr_at_a_terminal(*args: str) -> str:
    """Run edgekit with stderr on a pseudo-terminal (progress shows there by default) and return what it wrote."""
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    p = subprocess.Popen([EDGEKIT, *args], stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not data:
            break
        chunks.append(data)
    p.communicate(timeout=300)
    os.close(master)
    return b"".join(chunks).decode(errors="replace")


def test_global_verbose_and_quiet(models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "b"
    base = ("convert", str(models["tiny"]), "--target", "x86-cpu", "--precision", "fp32")
    # piped: no progress by default (one line per failure for scripts) ...
    p = run_cli(*base, "-o", str(out / "1"))
    assert p.returncode == 0 and p.stderr == "", p.stderr
    # ... but -v asks for the steps, with their times, even in a log
    p = run_cli("-v", *base, "-o", str(out / "2"))
    assert p.returncode == 0, p.stderr
    assert "parity" in p.stderr and "s " in p.stderr, p.stderr
    # at a terminal progress shows by default, and -q silences it
    assert "parity" in _stderr_at_a_terminal(*base, "-o", str(out / "3"))
    assert "parity" not in _stderr_at_a_terminal("-q", *base, "-o", str(out / "4"))
    p = run_cli("-v", "-q", "targets")
    assert p.returncode == 2 and "choose one" in p.stderr
