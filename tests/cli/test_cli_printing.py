"""What the CLI prints is safe and whole (issue #26 items 11 and 16): control characters in user-controlled
text are escaped, ``[extra]`` is not eaten as rich markup, target names are never cut."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.cli import assert_user_error, run_cli

RAW_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
HOSTILE = "x\x1b]0;owned\x07\x1b[31mred\x9b2J\u202egnp.onnx"


def test_error_lines_escape_terminal_sequences_in_file_names(tmp_path: Path) -> None:
    p = run_cli("bench", str(tmp_path / HOSTILE))
    assert_user_error(p, "does not exist")
    assert not RAW_CONTROLS.search(p.stderr), repr(p.stderr)
    assert "\\x1b]0;owned\\x07\\x1b[31mred\\x9b2J\\u202egnp.onnx" in p.stderr  # shown, escaped, not hidden


def _profile(d: Path, name: str, title: str) -> None:
    src = (Path(__file__).parents[2] / "targets" / "x86-cpu.toml").read_text()
    src = src.replace('name = "x86-cpu"', f'name = "{name}"').replace(
        'title = "x86-64 CPU (ONNX Runtime)"', f'title = "{title}"'
    )
    (d / f"{name}.toml").write_text(src)


def test_targets_table_shows_long_names_whole_and_escapes_profile_text(tmp_path: Path) -> None:
    name = "customer-site-7-line-b-inspection-camera-x86-cpu-fp32-2026"
    _profile(tmp_path, name, "evil \\u001b[2J\\u001b]0;owned\\u0007 title [bold]not markup[/]")
    p = run_cli("targets", "--targets-dir", str(tmp_path), env={"COLUMNS": "80"})
    assert p.returncode == 0, p.stderr
    assert name in p.stdout, p.stdout  # whole, on one line, even at 80 columns
    assert not RAW_CONTROLS.search(p.stdout), repr(p.stdout)
    p = run_cli("targets", "show", name, "--targets-dir", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert not RAW_CONTROLS.search(p.stdout) and "\\x1b[2J" in p.stdout and "[bold]not markup[/]" in p.stdout


def test_install_hints_keep_their_extra_in_brackets() -> None:
    wide = {"COLUMNS": "250"}
    for args in (("doctor",), ("targets", "show", "apple-ane")):
        p = run_cli(*args, env=wide)
        assert p.returncode == 0, p.stderr
        assert "pip install 'edgekit-ml[coreml]'" in p.stdout, p.stdout
        assert "pip install 'edgekit-ml'" not in p.stdout


def test_log_lines_escape_terminal_sequences() -> None:
    """The agent's and the collector's log lines (``setup_logging``) escape what a device or a file name holds."""
    import subprocess
    import sys

    code = (
        "import logging; from edge.agent.main import setup_logging; setup_logging('info'); "
        f"logging.getLogger('edge.fleet').warning('rejected %s', {HOSTILE!r})"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "rejected x\\x1b]0;owned" in p.stderr, p.stderr
    assert not RAW_CONTROLS.search(p.stderr), repr(p.stderr)


def test_data_never_reads_as_emoji_codes(tmp_path: Path) -> None:
    """``:x:`` in a file's first bytes is printed as written (rich read it as an emoji: ``b'root❌0'``)."""
    f = tmp_path / "passwd"
    f.write_text("root:x:0:0:root:/root:/bin/bash\n")
    p = run_cli("convert", str(f), "--target", "x86-cpu")
    assert_user_error(p, "b'root:x:0")
    assert "❌" not in p.stderr


def test_a_closed_stdout_is_a_quiet_exit_141(tmp_path: Path) -> None:
    """``edgekit ... | head``: the reader left early. Exit 141 (a shell's SIGPIPE), nothing on stderr, no crash log
    (was: exit 3 with 'internal error ... BrokenPipeError' and a log for --json, exit 1 for a table)."""
    import os
    import subprocess

    from tests.support.cli import EDGEKIT

    logs = tmp_path / "logs"
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "EDGEKIT_LOG_DIR": str(logs)}
    for args in (["targets", "--json"], ["targets"], ["doctor"], ["--help"], ["--version"]):
        r, w = os.pipe()
        os.close(r)  # the reader is gone before edgekit writes a byte
        p = subprocess.Popen([EDGEKIT, *args], stdout=w, stderr=subprocess.PIPE, env=env)
        os.close(w)
        _, err = p.communicate(timeout=120)
        assert p.returncode == 141, (args, p.returncode, err)
        assert err == b"", (args, err)
    assert not logs.exists() or not any(logs.iterdir()), list(logs.iterdir())
