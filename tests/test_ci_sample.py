"""CI's sample list names real tests: a renamed or removed test must leave tests/support/ci_sample.py with it
(else the list silently stops deselecting it, or deselects nothing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.ci_sample import OUTSIDE_CI

ROOT = Path(__file__).resolve().parents[1]


def test_every_entry_names_a_collected_test() -> None:
    files = sorted({n.split("::", 1)[0] for n in OUTSIDE_CI})
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "corpus_full", "-p", "no:cacheprovider", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    collected = {line.strip() for line in p.stdout.splitlines() if "::" in line}
    missing = sorted(set(OUTSIDE_CI) - collected)
    assert not missing, f"tests/support/ci_sample.py names tests that are not collected (as corpus_full): {missing}"
    assert all(secs > 0 and why for secs, why in OUTSIDE_CI.values())
