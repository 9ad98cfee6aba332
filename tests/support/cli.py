"""The console script as a user runs it, and the checks every CLI test makes of what it printed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
EDGEKIT = shutil.which("edgekit", path=str(Path(sys.executable).parent)) or "edgekit"


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real console script in a subprocess: exit codes and stderr exactly as a user sees them."""
    full_env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", **(env or {})}
    return subprocess.run([EDGEKIT, *args], capture_output=True, text=True, cwd=cwd, env=full_env, timeout=300)


def wait_for(cond: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll ``cond`` until it returns something truthy (returned), or fail after ``timeout`` s.

    Tests wait on the condition they need, never on a fixed sleep: a loaded 2-core host is slow."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def assert_user_error(p: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit code 2, exactly one non-empty line on stderr naming the problem (every needle in it), no traceback."""
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"want exactly one line on stderr, got {len(lines)}:\n{p.stderr}"
    for n in needles:
        assert n in lines[0], f"{n!r} not in stderr: {p.stderr}"
