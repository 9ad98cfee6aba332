from __future__ import annotations

import os
from pathlib import Path

import pytest

from edge.bundle.bundle import Bundle
from edge.deploy import DeployOptions, DeviceStore, SshStore, deploy, rollback, ship
from edge.errors import BudgetError, DeployError
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest


def test_deploy_ships_and_switches(models: dict[str, Path], tmp_path: Path) -> None:
    store = tmp_path / "cam-01"
    r1 = deploy(
        models["tiny"], "x86-cpu", store, options=DeployOptions(build_dir=tmp_path / "build1", bench_iterations=20)
    )
    assert r1.benchmark is not None and r1.benchmark["on_target_device"] is True
    s = DeviceStore(store)
    assert s.current == r1.bundle.id and s.previous is None
    shipped = Bundle.open(store / "bundles" / r1.bundle.id)
    bench = shipped.manifest["benchmark"]  # steady state: at least the 20 asked for, at least 2 s (edge.tune.verdict)
    assert bench["latency"]["count"] >= 20 and bench["steadiness"]["decided_by"], bench
    r2 = deploy(
        models["tiny"],
        "x86-cpu",
        store,
        ConvertRequest(precision="fp16"),
        DeployOptions(build_dir=tmp_path / "build2", bench_iterations=5),
    )
    assert s.current == r2.bundle.id and s.previous == r1.bundle.id
    assert os.readlink(store / "current") == f"bundles/{r2.bundle.id}"
    assert rollback(store) == r1.bundle.id
    assert s.current == r1.bundle.id and s.previous == r2.bundle.id
    assert [h["action"] for h in s.history()] == ["deploy", "deploy", "rollback"]


def test_deploy_to_openvino_target_notes_the_fallback(models: dict[str, Path], tmp_path: Path) -> None:
    r = deploy(
        models["tiny"],
        "intel-igpu",
        tmp_path / "dev",
        options=DeployOptions(build_dir=tmp_path / "b", bench_iterations=5, budget_ms=1e-6),
    )  # over budget, but measured on a fallback device: indicative, not a gate
    assert r.benchmark is not None and r.benchmark["on_target_device"] is False
    assert any("fallback" in n for n in r.notes)
    assert DeviceStore(tmp_path / "dev").current == r.bundle.id


def test_budget_failure_refused_unless_accepted(models: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(BudgetError, match="over the 0.00 ms budget"):
        deploy(
            models["tiny"],
            "x86-cpu",
            tmp_path / "dev",
            options=DeployOptions(build_dir=tmp_path / "b", bench_iterations=5, budget_ms=1e-6, budget_search=False),
        )
    assert not (tmp_path / "dev" / "current").exists()
    r = deploy(
        models["tiny"],
        "x86-cpu",
        tmp_path / "dev",
        options=DeployOptions(build_dir=tmp_path / "b", bench_iterations=5, budget_ms=1e-6, accept_budget_failure=True),
    )
    assert DeviceStore(tmp_path / "dev").current == r.bundle.id


def test_refuses_failed_parity_and_tampered_bundles(models: dict[str, Path], tmp_path: Path) -> None:
    b = convert(models["tiny"], "x86-cpu", tmp_path / "b")
    b.record("parity", {**b.manifest["parity"], "passed": False})
    with pytest.raises(DeployError, match="failed parity"):
        ship(b, tmp_path / "dev")
    ship(b, tmp_path / "dev", accept_parity_failure=True)
    b.artifact.write_bytes(b"tampered")
    with pytest.raises(Exception, match="sha256 differs"):
        ship(Bundle(b.path, b.manifest), tmp_path / "dev2")
    assert not (tmp_path / "dev2").exists()


def test_rollback_without_previous(tmp_path: Path) -> None:
    with pytest.raises(DeployError, match="no previous bundle"):
        rollback(tmp_path)


def test_ssh_urls_are_validated() -> None:
    with pytest.raises(DeployError, match="bad device URL"):
        SshStore("ssh://hostonly")
    with pytest.raises(DeployError, match="unsupported device address"):
        rollback("ftp://x/y")
