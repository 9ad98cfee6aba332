"""Fault injection: a writer killed with SIGKILL at every step of install/rollback never leaves a bad store.

A subprocess deploys A, B (into a template, copied for each kill point), then C (or rolls back),
and is killed just before one step (the store's ``on_step`` option) or at a random moment. After
every kill: ``current`` is a complete, verified bundle; ``previous`` as readers see it (no lock, no
repair) and ``rollback`` (the next writer, which repairs first) go to the bundle deployed before
``current`` — B after C's switch, A before it, never skipping B; history agrees; no staging
leftover survives the next run.
"""

from __future__ import annotations

import random
import shutil
import signal
from pathlib import Path
from typing import Iterator

import pytest

from edge.bundle.bundle import Bundle
from edge.pipeline import convert
from edge.store import INSTALL_STEPS, SWITCH_STEPS, DeviceStore
from tests.support.store_bundles import KillServer, clone_bundle

ROUNDS = 20


@pytest.fixture(scope="module")
def abc(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Bundle]:
    d = tmp_path_factory.mktemp("crash-src")
    base = convert(models["tiny"], "x86-cpu", d / "base")
    return {n: clone_bundle(base, d, n) for n in "ABC"}


@pytest.fixture(scope="module")
def killer(abc: dict[str, Bundle]) -> Iterator[KillServer]:
    k = KillServer(abc["A"].path)
    yield k
    k.close()


def _check_after_kill(root: Path, switched_to: str, before: str, deployed: list[str]) -> str:
    """Invariants right after a writer switching ``before`` -> ``switched_to`` was killed, then a repairing
    rollback; ``deployed`` is the order of operations (the killed one last). Returns the id current named."""
    cur = Bundle.open(root / "current")  # a complete bundle, every sha256 verified
    assert cur.id in (switched_to, before), cur.id
    assert (root / "current").resolve().parent == (root / "bundles").resolve()
    store = DeviceStore(root)
    expected_prev = {"C": "B", "B": "A"}[cur.id] if deployed[-1] != "rollback" else ("C" if cur.id == "B" else "B")
    assert store.current == cur.id
    assert store.previous == expected_prev  # what readers see before any repair
    assert [e["current"] for e in store.history()] == deployed[:-1] + ([switched_to] if cur.id == switched_to else [])
    assert store.rollback() == expected_prev  # the repairing writer agrees
    assert (store.current, store.previous) == (expected_prev, cur.id)
    assert not [p.name for p in (root / "bundles").iterdir() if p.name.startswith(".")]
    assert not (root / ".intent").exists()
    Bundle.open(root / "current")
    return cur.id


def test_deploy_killed_at_every_step_for_20_rounds(abc: dict[str, Bundle], killer: KillServer, tmp_path: Path) -> None:
    rng = random.Random(11)
    killed_at: dict[str, int] = {}
    outcomes = {"C": 0, "B": 0}
    for r in range(ROUNDS):
        # The writer subprocess deploys A then B into a template once a round (odd rounds: C, A, B — C
        # is then already on the device, as on a redeploy); each kill point starts from a copy of it.
        order = ["C", "A", "B"] if r % 2 else ["A", "B"]
        template = tmp_path / f"r{r}-template"
        assert killer.run(template, str(abc[order[-1]].path), "-", [abc[n].path for n in order[:-1]]) == 0
        plan: list[tuple[str, float | None]] = [(s, None) for s in INSTALL_STEPS] + [("-", rng.uniform(0, 0.02))]
        for step, after_s in plan:
            root = tmp_path / f"r{r}-{step}"
            shutil.copytree(template, root, symlinks=True)
            if killer.run(root, str(abc["C"].path), step, [], kill_after_s=after_s) == -signal.SIGKILL:
                killed_at[step] = killed_at.get(step, 0) + 1
            outcomes[_check_after_kill(root, "C", "B", [*order, "C"])] += 1
            DeviceStore(root).install(abc["C"])  # and the store takes the next deploy
            assert DeviceStore(root).current == "C"
    # every step of a fresh install was hit in every even round, the switch steps in every round
    for s in INSTALL_STEPS:
        want = ROUNDS if s not in ("stage", "copy", "fsync", "verify", "rename") else ROUNDS // 2
        assert killed_at.get(s, 0) == want, (s, killed_at)
    assert outcomes["C"] and outcomes["B"]  # both sides of the commit point were exercised


def test_rollback_killed_at_every_step(abc: dict[str, Bundle], killer: KillServer, tmp_path: Path) -> None:
    template = tmp_path / "template"
    assert killer.run(template, str(abc["C"].path), "-", [abc["A"].path, abc["B"].path]) == 0
    for r in range(5):
        for step in ("recover", *SWITCH_STEPS):
            root = tmp_path / f"r{r}-{step}"
            shutil.copytree(template, root, symlinks=True)
            assert killer.run(root, "rollback", step, []) == -signal.SIGKILL
            _check_after_kill(root, "B", "C", ["A", "B", "C", "rollback"])
