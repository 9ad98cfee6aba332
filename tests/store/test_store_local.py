"""The local device store: hostile ids refused, damage reported in one line, a lock, leftovers cleaned."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from edge.bundle.bundle import Bundle
from edge.deploy import ship
from edge.errors import DeployError, EdgeError
from edge.pipeline import convert
from edge.store import DeviceStore, open_store, rollback
from tests.support.cli import assert_user_error, run_cli
from tests.support.store_bundles import clone_bundle as clone
from tests.support.store_bundles import clone_dir


@pytest.fixture(scope="module")
def base(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return convert(models["tiny"], "x86-cpu", tmp_path_factory.mktemp("store-base") / "b")


def _tree(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


HOSTILE_IDS = [
    "./../../..",
    "..",
    ".",
    "../escaped",
    "a/b",
    ".partial-x",
    ".hidden",
    "-oProxyCommand=x",
    "",
    "x$(id>PWNED)",
    "x" * 129,
    "é",
    "a b",
    "a\nb",
]


def hostile(base: Bundle, bundle_id: str) -> SimpleNamespace:
    """A bundle-shaped object whose id was never validated: the manifest refuses such ids since the typed
    manifest, so this stands for any caller that skipped it — the store must refuse on its own."""
    return SimpleNamespace(id=bundle_id, path=base.path, manifest=base.manifest, info=base.info)


@pytest.mark.parametrize("bad_id", HOSTILE_IDS)
def test_hostile_bundle_ids_are_refused_before_anything_is_written(base: Bundle, tmp_path: Path, bad_id: str) -> None:
    """Attack 3: bundles/<id> must never resolve outside the store (and attack 1's id is refused here too)."""
    deep = tmp_path / "d1" / "d2" / "d3" / "store"  # ./../../.. from bundles/ would be tmp_path/d1
    before = _tree(tmp_path)
    with pytest.raises(DeployError, match="refusing bundle id"):
        DeviceStore(deep).install(hostile(base, bad_id))
    assert _tree(tmp_path) == before  # nothing written: not the store, not outside it
    with pytest.raises(EdgeError, match="bundle_id|refusing bundle id"):  # through ship: the manifest refuses it first
        ship(clone_dir(base, tmp_path / "src", bad_id), deep)
    assert not (tmp_path / "d1").exists()


def test_deploys_switch_and_rollback_goes_to_the_one_before(base: Bundle, tmp_path: Path) -> None:
    a, b, c = (clone(base, tmp_path / "src", n) for n in "ABC")
    s = DeviceStore(tmp_path / "dev")
    for x in (a, b, c):
        assert s.install(x) == tmp_path / "dev" / "bundles" / x.id
    assert (s.current, s.previous) == ("C", "B")
    assert os.readlink(tmp_path / "dev" / "current") == "bundles/C"
    assert rollback(tmp_path / "dev") == "B" and (s.current, s.previous) == ("B", "C")
    s.install(b)  # already current: recorded, nothing moves
    assert (s.current, s.previous) == ("B", "C")
    h = s.history()
    assert [(e["action"], e["current"], e["replaced"]) for e in h] == [
        ("deploy", "A", None),
        ("deploy", "B", "A"),
        ("deploy", "C", "B"),
        ("rollback", "B", "C"),
        ("deploy", "B", "B"),
    ]
    assert h[-1]["note"] == "already current" and len({e["txn"] for e in h}) == 5
    assert sorted(p.name for p in (tmp_path / "dev").iterdir()) == [
        ".lock",
        "bundles",
        "current",
        "history.jsonl",
        "previous",
    ]


def test_leftovers_of_killed_writers_are_removed_on_the_next_run(base: Bundle, tmp_path: Path) -> None:
    a, b = clone(base, tmp_path / "src", "A"), clone(base, tmp_path / "src", "B")
    s = DeviceStore(tmp_path / "dev")
    s.install(a)
    bundles = tmp_path / "dev" / "bundles"
    (bundles / ".partial-0123abcd").mkdir()
    (bundles / ".partial-0123abcd" / "model.onnx").write_bytes(b"half")
    (bundles / ".A.partial-xyz").mkdir()  # the staging name older edgekit used
    os.symlink("bundles/A", tmp_path / "dev" / ".current.tmp")
    s.install(b)
    assert sorted(p.name for p in bundles.iterdir()) == ["A", "B"]
    assert not (tmp_path / "dev" / ".current.tmp").is_symlink()


def test_a_damaged_existing_bundle_is_replaced_not_trusted(base: Bundle, tmp_path: Path) -> None:
    a = clone(base, tmp_path / "src", "A")
    s = DeviceStore(tmp_path / "dev")
    s.install(a)
    (tmp_path / "dev" / "bundles" / "A" / a.manifest["primary_artifact"]).write_bytes(b"rotten")
    s.install(a)
    Bundle.open(tmp_path / "dev" / "bundles" / "A")  # verifies again
    assert sorted(p.name for p in (tmp_path / "dev" / "bundles").iterdir()) == ["A"]


def test_a_bundle_holding_a_symlink_is_refused(base: Bundle, tmp_path: Path) -> None:
    a = clone(base, tmp_path / "src", "A")
    os.symlink("/etc/passwd", a.path / "extra")
    with pytest.raises(DeployError, match="extra is not a regular file"):
        DeviceStore(tmp_path / "dev").install(a)
    assert not (tmp_path / "dev" / "bundles" / "A").exists()


CONCURRENT = """
import sys
from edge.bundle.bundle import Bundle
from edge.store import DeviceStore
DeviceStore(sys.argv[1]).install(Bundle.open(sys.argv[2]))
"""


def test_two_concurrent_deploys_both_succeed(base: Bundle, tmp_path: Path) -> None:
    """Same bundle twice at once (was: OSError Directory not empty), and two different bundles at once."""
    a, b = clone(base, tmp_path / "src", "A"), clone(base, tmp_path / "src", "B")
    for round_ in range(4):
        store = tmp_path / f"same-{round_}"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", CONCURRENT, str(store), str(a.path)], stderr=subprocess.PIPE, text=True
            )
            for _ in range(2)
        ]
        errs = [p.communicate(timeout=120)[1] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], errs
        h = DeviceStore(store).history()
        assert [e.get("note") for e in h] == [None, "already current"]
        assert sorted(p.name for p in (store / "bundles").iterdir()) == ["A"]
    store = tmp_path / "two"
    procs = [
        subprocess.Popen([sys.executable, "-c", CONCURRENT, str(store), str(x.path)], stderr=subprocess.PIPE, text=True)
        for x in (a, b)
    ]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    s = DeviceStore(store)
    assert {s.current, s.previous} == {"A", "B"}
    assert [e["current"] for e in s.history()] == [s.previous, s.current]


def test_a_held_lock_makes_a_writer_wait_then_report_busy(base: Bundle, tmp_path: Path) -> None:
    a = clone(base, tmp_path / "src", "A")
    (tmp_path / "dev").mkdir()
    with open(tmp_path / "dev" / ".lock", "w") as held:
        held.write("4242\n")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(DeployError, match=r"is busy: another deploy or rollback \(pid 4242\)"):
            DeviceStore(tmp_path / "dev", lock_timeout=0.3).install(a)
    DeviceStore(tmp_path / "dev", lock_timeout=0.3).install(a)  # released: goes through
    assert DeviceStore(tmp_path / "dev").current == "A"


def _damage_current_dir(d: Path) -> None:
    os.unlink(d / "current")
    (d / "current").mkdir()


def _damage_current_outside(d: Path) -> None:
    os.unlink(d / "current")
    os.symlink("/etc", d / "current")


def _damage_previous_file(d: Path) -> None:
    os.unlink(d / "previous")
    (d / "previous").write_text("bundles/A")


def _damage_bundles_file(d: Path) -> None:
    os.rename(d / "bundles", d / "moved")
    (d / "bundles").write_text("x")


def _damage_history_dir(d: Path) -> None:
    os.unlink(d / "history.jsonl")
    (d / "history.jsonl").mkdir()


def _damage_intent(d: Path) -> None:
    (d / ".intent").write_text("not an intent\n")


def _damage_lock_dir(d: Path) -> None:
    os.unlink(d / ".lock")
    (d / ".lock").mkdir()


@pytest.mark.parametrize(
    "damage, needle",
    [
        (_damage_current_dir, "'current' is a directory"),
        (_damage_current_outside, "'current' points to '/etc'"),
        (_damage_previous_file, "'previous' is a file"),
        (_damage_bundles_file, "'bundles' is not a directory"),
        (_damage_history_dir, "'history.jsonl' is not a file"),
        (_damage_intent, "'.intent' is not an intent record"),
        (_damage_lock_dir, "'.lock' is not a file"),
    ],
)
def test_a_damaged_store_is_one_line_not_a_traceback(base: Bundle, tmp_path: Path, damage, needle: str) -> None:
    a, b = clone(base, tmp_path / "src", "A"), clone(base, tmp_path / "src", "B")
    dev = tmp_path / "dev"
    s = DeviceStore(dev)
    s.install(a)
    s.install(b)
    damage(dev)
    with pytest.raises(DeployError, match="is damaged: " + needle.replace("(", r"\(")):
        s.install(a)
    with pytest.raises(DeployError, match="is damaged"):
        s.rollback()
    p = run_cli("rollback", "--device", str(dev))
    assert_user_error(p, "is damaged", needle)


def test_rollback_refusals_are_one_line(tmp_path: Path) -> None:
    assert_user_error(run_cli("rollback", "--device", str(tmp_path / "nowhere")), "does not exist")
    (tmp_path / "empty").mkdir()
    assert_user_error(run_cli("rollback", "--device", str(tmp_path / "empty")), "no previous bundle")
    (tmp_path / "afile").write_text("x")
    assert_user_error(run_cli("rollback", "--device", str(tmp_path / "afile")), "does not exist")


def test_a_torn_history_line_is_skipped_and_not_glued_to_the_next(base: Bundle, tmp_path: Path) -> None:
    a, b = clone(base, tmp_path / "src", "A"), clone(base, tmp_path / "src", "B")
    s = DeviceStore(tmp_path / "dev")
    s.install(a)
    with open(tmp_path / "dev" / "history.jsonl", "a") as h:
        h.write('{"time": "2026-01-01T00:00:00+00:00", "act')  # a power cut mid-line
    s.install(b)
    assert [e["current"] for e in s.history()] == ["A", "B"]
    assert json.loads((tmp_path / "dev" / "history.jsonl").read_text().splitlines()[-1])["current"] == "B"


def test_open_store_refuses_unknown_schemes_and_files(base: Bundle, tmp_path: Path) -> None:
    with pytest.raises(DeployError, match="unsupported device address"):
        open_store("ftp://x/y")
    (tmp_path / "f").write_text("x")
    with pytest.raises(DeployError, match="is not a directory"):
        DeviceStore(tmp_path / "f").state()
    with pytest.raises(DeployError, match="is not a directory"):
        DeviceStore(tmp_path / "f").install(clone(base, tmp_path / "src", "A"))
