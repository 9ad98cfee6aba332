"""Issue #26 item 9: an unsigned bundle cannot dodge the gates by editing its manifest.

Each edit below shipped a failing bundle before: parity replaced by a ``skipped`` record, ``io.outputs``
emptied, the benchmark's ``budget_ms`` nulled, the benchmark marked as from another device class. The gates
now recompute from evidence that must exist and be complete. Real bundles (the tiny CNN on x86-cpu), real
benchmarks, real ``ship`` into a real device store.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from edge.bench import BenchOptions, run_benchmark
from edge.bundle.bundle import Bundle
from edge.deploy import ship
from edge.errors import BudgetError, DeployError
from edge.pipeline import convert
from edge.verify.gates import SKIP_NO_REFERENCE, SKIP_RUNNER_NOT_HERE, check_gates


@pytest.fixture(scope="module")
def built(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return convert(models["tiny"], "x86-cpu", tmp_path_factory.mktemp("gates") / "b")


def _copy(built: Bundle, tmp_path: Path, change: Any) -> Bundle:
    import shutil

    d = tmp_path / "b"
    shutil.copytree(built.path, d)
    m = copy.deepcopy(built.manifest)
    change(m)
    (d / "manifest.json").write_text(json.dumps(m))
    return Bundle.open(d)


@pytest.mark.parametrize(
    "skipped",
    [
        "needs the device's accelerator",
        f"{SKIP_RUNNER_NOT_HERE}needs the device's accelerator (CPU)",
        SKIP_NO_REFERENCE,
    ],
)
def test_parity_replaced_by_a_skipped_record_is_refused(built: Bundle, tmp_path: Path, skipped: str) -> None:
    b = _copy(built, tmp_path, lambda m: m.update(parity={"passed": None, "skipped": skipped}))
    for accept in (False, True):  # accepting a parity failure is not accepting an edited record
        with pytest.raises(DeployError, match="parity evidence does not hold"):
            ship(b, tmp_path / "dev", accept_parity_failure=accept)
    assert not (tmp_path / "dev" / "current").exists()


def test_emptied_outputs_are_refused(built: Bundle, tmp_path: Path) -> None:
    emptied = _copy(built, tmp_path, lambda m: m["io"].update(outputs=[]))  # parity then compared nothing
    for accept in (False, True):
        with pytest.raises(DeployError, match="io.outputs is empty"):
            ship(emptied, tmp_path / "dev", accept_parity_failure=accept)


def test_renamed_outputs_must_be_the_models_own(built: Bundle, tmp_path: Path) -> None:
    def rename(m: dict[str, Any]) -> None:
        m["io"]["outputs"][0]["name"] = "renamed"
        m["parity"]["outputs"][0]["name"] = "renamed"

    b = _copy(built, tmp_path, rename)
    with pytest.raises(DeployError, match="the ONNX model's outputs are"):
        ship(b, tmp_path / "dev")


def _benchmarked(built: Bundle, tmp_path: Path, change: Any) -> Bundle:
    """A real benchmark recorded as a slow device would (p99 far over the x86-cpu budget), then edited."""
    rep = run_benchmark(
        built.open_runner, BenchOptions(iterations=3, warmup=1, budget_ms=16.67, bundle=built.id, target=built.target)
    )
    bench = {**rep.to_json(), "on_target_device": True}
    bench["latency"] = {
        k: (v * 1e5 if isinstance(v, float) and k.endswith("_ms") else v) for k, v in bench["latency"].items()
    }
    bench["verdict"] = "fail"

    def edit(m: dict[str, Any]) -> None:
        m["benchmark"] = copy.deepcopy(bench)
        change(m["benchmark"])

    return _copy(built, tmp_path, edit)


def test_a_nulled_budget_is_judged_against_the_profile(built: Bundle, tmp_path: Path) -> None:
    honest = _benchmarked(built, tmp_path / "h", lambda b: None)
    with pytest.raises(BudgetError):
        check_gates(honest.info)
    nulled = _benchmarked(built, tmp_path / "n", lambda b: b.update(budget_ms=None, verdict="no budget"))
    with pytest.raises(BudgetError, match="x86-cpu profile's frame budget"):
        ship(nulled, tmp_path / "dev")
    check_gates(nulled.info, accept_budget_failure=True)  # an operator may still accept it, knowingly


def test_another_device_class_claim_is_recomputed(built: Bundle, tmp_path: Path) -> None:
    def claim(reason: str) -> Any:
        return lambda b: b.update(on_target_device=False, device_class={"same": False, "reason": reason})

    this_class = _benchmarked(
        built,
        tmp_path / "a",
        claim("different device class: this host is linux/x86_64; x86-cpu's devices are linux x86_64"),
    )
    with pytest.raises(DeployError, match="it is one of x86-cpu's"):
        ship(this_class, tmp_path / "dev")
    invented = _benchmarked(built, tmp_path / "b", claim("benchmarked on a laptop"))
    with pytest.raises(DeployError, match="names no fallback"):
        ship(invented, tmp_path / "dev")
    fallback = _benchmarked(
        built, tmp_path / "c", claim("different device class: the runner used its fallback, not CPU (x)")
    )
    with pytest.raises(DeployError, match="runner.fallback is empty"):
        ship(fallback, tmp_path / "dev")
    elsewhere = _benchmarked(
        built,
        tmp_path / "d",
        claim("different device class: this host is linux/riscv64; x86-cpu's devices are linux x86_64"),
    )
    check_gates(elsewhere.info)  # a judgement the code could have made on another machine: indicative only


def test_the_honest_bundle_still_ships(built: Bundle, tmp_path: Path) -> None:
    ship(built, tmp_path / "dev")
    assert (tmp_path / "dev" / "current").exists()
