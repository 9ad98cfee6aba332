"""Issue #33 red team, crash logs: rotation deletes only edgekit's own logs, the temp-dir fallback refuses a
planted link or a directory not its own, and a crash log never keeps a password from the command line.

Before: rotation deleted every ``*.log`` in ``EDGEKIT_LOG_DIR`` (another program's too); a directory named ``*.log``
made rotation raise, so the log went to the fallback as well and the cap was never held (70 logs for 50); a symlink
planted at ``$TMPDIR/edgekit-crashes-UID`` was followed and the victim's logs rotated away; ``--db
postgresql://user:password@...`` stayed in the log's ``command:`` line.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

from edge.errors import KEEP_CRASH_LOGS, save_traceback


def _boom() -> BaseException:
    try:
        raise RuntimeError("boom")
    except RuntimeError as e:
        return e


def _fill(d: Path, n: int, pid: int = 1) -> list[Path]:
    """``n`` old crash logs with the names edgekit gives them, oldest first."""
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        p = d / f"20250101T0000{i % 60:02d}Z-{pid}-{i}-convert.log"
        p.write_text("old")
        os.utime(p, (1e9 + i, 1e9 + i))
        out.append(p)
    return out


@pytest.fixture
def logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "logs"
    monkeypatch.setenv("EDGEKIT_LOG_DIR", str(d))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    return d


def test_rotation_spares_other_programs_logs_and_directories(logs: Path) -> None:
    _fill(logs, KEEP_CRASH_LOGS + 10)
    theirs = logs / "nginx-access.log"
    theirs.write_text("not edgekit's")
    os.utime(theirs, (1.0, 1.0))  # the oldest file here
    (logs / "archive.log").mkdir()
    (logs / "archive.log" / "kept").write_text("x")
    path = save_traceback("convert", _boom())
    assert path is not None and path.parent == logs
    assert theirs.read_text() == "not edgekit's"
    assert (logs / "archive.log" / "kept").exists()
    own = [p for p in logs.iterdir() if p.is_file() and p != theirs]
    assert len(own) == KEEP_CRASH_LOGS and path in own
    assert not any((Path(tempfile.gettempdir())).iterdir()), "the log went to the fallback as well"


def test_the_fallback_refuses_a_planted_symlink(logs: Path, tmp_path: Path) -> None:
    logs.parent.mkdir(exist_ok=True)
    logs.write_text("a file where the directory should be")  # the configured directory cannot be used
    victim = tmp_path / "victim"
    theirs = _fill(victim, KEEP_CRASH_LOGS + 5)
    os.symlink(victim, Path(tempfile.gettempdir()) / f"edgekit-crashes-{os.getuid()}")
    assert save_traceback("convert", _boom()) is None
    assert all(p.exists() for p in theirs) and len(list(victim.iterdir())) == len(theirs)


@pytest.mark.parametrize("how", ["other-owner", "world-writable"])
def test_the_fallback_refuses_a_directory_not_its_own(logs: Path, tmp_path: Path, how: str) -> None:
    logs.parent.mkdir(exist_ok=True)
    logs.write_text("")
    planted = Path(tempfile.gettempdir()) / f"edgekit-crashes-{os.getuid()}"
    theirs = _fill(planted, KEEP_CRASH_LOGS + 5)
    if how == "other-owner":
        if os.getuid() != 0:
            pytest.skip("hardware: chown to another user needs root")
        os.chown(planted, 4242, 4242)
    else:
        planted.chmod(0o777)
    assert save_traceback("convert", _boom()) is None
    assert all(p.exists() for p in theirs)


def test_the_fallback_still_works_when_it_is_our_own(logs: Path) -> None:
    logs.parent.mkdir(exist_ok=True)
    logs.write_text("")
    path = save_traceback("convert", _boom())
    assert path is not None and path.parent.name == f"edgekit-crashes-{os.getuid()}"
    assert path.parent.stat().st_mode & 0o777 == 0o700


def test_a_password_on_the_command_line_is_redacted(logs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "edgekit",
            "fleet",
            "status",
            "--db",
            "postgresql://edge:s3cr3t-pw@db.example:5432/fleet",
            "--dsn=password=hunter2",
        ],
    )
    path = save_traceback("fleet status", _boom())
    assert path is not None
    text = path.read_text()
    assert "s3cr3t-pw" not in text and "hunter2" not in text
    assert "postgresql://edge:***@db.example:5432/fleet" in text and "password=***" in text
    assert time.time() - path.stat().st_mtime < 60
