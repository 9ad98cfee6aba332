"""Issue #26 item 16: `deploy` keeps the earlier build when it refuses to ship, never replaces a directory that
is not a bundle, and over budget is exit 1 from `deploy` as from `bench` (a verdict, not a wrong input)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cli import run_cli


def _one_error_line(p: object, code: int, *needles: str) -> str:
    rc, err = p.returncode, p.stderr  # type: ignore[attr-defined]
    assert rc == code and "Traceback" not in err, (rc, err)
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and all(n in lines[0] for n in needles), err
    return lines[0]


def test_a_refused_deploy_keeps_the_earlier_build(models: dict[str, Path], tmp_path: Path) -> None:
    build, store = tmp_path / "built", tmp_path / "store"
    p = run_cli(
        "deploy", str(models["tiny"]), "-d", str(store), "--build-dir", str(build), "-n", "5", "--budget-ms", "100000"
    )
    assert p.returncode == 0, p.stderr
    first = json.loads((build / "manifest.json").read_text())
    # the same deploy, over budget: refused, exit 1 (as `edgekit bench` over budget)
    p = run_cli(
        "deploy",
        str(models["tiny"]),
        "-d",
        str(store),
        "--build-dir",
        str(build),
        "-n",
        "5",
        "--budget-ms",
        "0.000001",
        "--no-search",  # the refusal itself (the budget search: tests/tune/test_budget.py)
    )
    line = _one_error_line(p, 1, "refusing to ship", "over the", f"{build}.refused")
    assert json.loads((build / "manifest.json").read_text()) == first, line  # the earlier build, untouched
    refused = json.loads((tmp_path / "built.refused" / "manifest.json").read_text())
    assert refused["benchmark"]["verdict"] == "fail"
    assert not [x.name for x in tmp_path.iterdir() if x.name.startswith(".")]  # no staging left behind
    bundle = tmp_path / "built.refused"
    p = run_cli("bench", str(bundle), "-n", "5", "--budget-ms", "0.000001")
    assert p.returncode == 1, (p.returncode, p.stderr)  # the same verdict, the same code


def test_deploy_never_replaces_a_directory_that_is_not_a_bundle(models: dict[str, Path], tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("keep")
    p = run_cli("deploy", str(models["tiny"]), "-d", str(tmp_path / "store"), "--build-dir", str(mine), "-n", "5")
    _one_error_line(p, 2, "exists and is not an edgekit bundle")
    assert (mine / "keep.txt").read_text() == "keep" and sorted(x.name for x in mine.iterdir()) == ["keep.txt"]
