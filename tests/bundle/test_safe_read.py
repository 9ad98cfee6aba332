"""Issue #26 item 13: one safe reader for every JSON/TOML file edgekit loads (edge.base.typedjson).

Regular files only (a FIFO named *.toml must not hang ``edgekit targets``; a directory named *.toml is
refused), a size bound, a depth bound checked before parsing, and Python's integer-digit limit turned into
a one-line refusal. Real files, real FIFOs, the real ``edgekit`` console script.
"""

from __future__ import annotations

import os
import subprocess
import threading
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Iterator

import pytest

from edge.base.typedjson import UnreadableFile, read_json_file, read_toml_file
from edge.errors import EdgeError, TargetError
from edge.targets import load_targets, parse_profile
from edge.tune.study import load_study
from tests.support.cli import EDGEKIT, assert_user_error


def _edgekit(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", **(env or {})}
    return subprocess.run([EDGEKIT, *args], capture_output=True, text=True, env=full, timeout=60)  # a hang fails


@contextmanager
def fifo_watchdog(fifo: Path, after_s: float = 10.0) -> Iterator[None]:
    """Unblock a reader stuck on ``fifo`` after ``after_s`` (so a regression fails instead of hanging the run)."""
    done, stuck = threading.Event(), []

    def watch() -> None:
        if not done.wait(after_s):
            stuck.append(True)
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # the blocked reader now sees end of file
            os.close(fd)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join()
        assert not stuck, f"reading {fifo} blocked for {after_s} s"


HOSTILE_TOML = {
    "deep": "a = " + "[" * 5000 + "]" * 5000 + "\n",
    "digits": "schema_version = " + "9" * 10_000 + "\n",
    "inline_deep": "a = " + "{b = " * 3000 + "1" + "}" * 3000 + "\n",
}


@pytest.mark.parametrize("kind", ["fifo", "dir", *HOSTILE_TOML])
def test_hostile_targets_dir_entries_are_one_line_errors(tmp_path: Path, kind: str) -> None:
    f = tmp_path / "board.toml"
    if kind == "fifo":
        os.mkfifo(f)
    elif kind == "dir":
        f.mkdir()
    else:
        f.write_text(HOSTILE_TOML[kind])
    with pytest.raises(TargetError), fifo_watchdog(f) if kind == "fifo" else nullcontext():
        load_targets([tmp_path])
    p = _edgekit("targets", "--targets-dir", str(tmp_path))
    assert_user_error(p, "board.toml")


def test_a_valid_profile_still_parses_and_a_bad_one_names_its_problem(tmp_path: Path) -> None:
    f = tmp_path / "board.toml"
    f.write_text("this is [not toml")
    with pytest.raises(TargetError, match="not valid TOML"):
        parse_profile(f)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("[" * 5000 + "]" * 5000, "nested deeper"),
        ('{"study_version": 1, "trials": {}, "x": ' + "9" * 5000 + "}", "not valid JSON"),
        ('{"a": 1, "a": 2}', "duplicate key"),
    ],
)
def test_hostile_study_files_are_refused_in_one_line(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "study.json"
    f.write_text(text)
    with pytest.raises(EdgeError, match=needle) as e:
        load_study(f, {})
    assert "\n" not in str(e.value)


def test_a_study_fifo_or_directory_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "dir.json").mkdir()
    for name in ("fifo.json", "dir.json"):
        with pytest.raises(EdgeError, match="not a regular file"), fifo_watchdog(tmp_path / "fifo.json"):
            load_study(tmp_path / name, {})
    assert load_study(tmp_path / "missing.json", {}) == {}


def test_the_reader_bounds_size_and_follows_only_to_regular_files(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text("[" + "0," * 1000 + "0]")
    with pytest.raises(UnreadableFile, match="at most 100"):
        read_json_file(big, max_bytes=100)
    os.symlink(tmp_path / "gone.json", tmp_path / "dangling.json")
    with pytest.raises(UnreadableFile):
        read_json_file(tmp_path / "dangling.json", missing={})  # a dangling link is not "missing"
    assert read_json_file(tmp_path / "absent.json", missing={}) == {}
    with pytest.raises(UnreadableFile, match="not a regular file"):
        read_toml_file("/dev/zero")


@pytest.mark.parametrize("kind", ["symlink", "file"])
def test_toolchain_remove_when_its_directory_is_a_link_or_a_file(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "toolchains"
    root.mkdir()
    elsewhere = tmp_path / "precious"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("not edgekit's")
    if kind == "symlink":
        os.symlink(elsewhere, root / "tflite")
    else:
        (root / "tflite").write_text("junk")
    p = _edgekit("toolchain", "remove", "tflite", env={"EDGEKIT_TOOLCHAINS": str(root)})
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert not os.path.lexists(root / "tflite")
    assert (elsewhere / "keep.txt").read_text() == "not edgekit's"  # the link was removed, never followed
    st = _edgekit("toolchain", "list", env={"EDGEKIT_TOOLCHAINS": str(root)})
    assert "Traceback" not in st.stderr, st.stderr
