"""Issue #33 red team, gates on unsigned edits: an edit the rest of the evidence cannot justify is refused, and
the device judges its reference pairs with limits it derives itself.

Each edit below shipped before (real bundles of the tiny CNN on x86-cpu, real ``ship`` into a real device
store, the device's real reference check): a no-reference skip of an ONNX source (which runs here); a 1e9 ms
budget said to be the target profile's; a failing parity made "unverified" by a constant (1e9/1e9, inverted,
3e38) reference range; a failing top-1 dropped with a free-text ``task_note``; ``parity.samples = 2^20`` that
loosened the device's ``pair_limits`` so a swapped model passed; a ``verified_on`` that says ``passed: false``.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest

from edge.base.hashing import sha256_file
from edge.bench import BenchOptions, run_benchmark
from edge.bundle.bundle import Bundle
from edge.deploy import ship
from edge.errors import DeployError, EdgeError
from edge.graph.samples import build_tiny_cnn
from edge.pipeline import convert
from edge.verify.gates import SKIP_NO_REFERENCE, check_gates
from edge.verify.refpairs import check_reference_pairs


@pytest.fixture(scope="module")
def built(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return convert(models["tiny"], "x86-cpu", tmp_path_factory.mktemp("corroborate") / "b")


def _copy(built: Bundle, tmp_path: Path, change: Callable[[dict[str, Any], Path], None]) -> Bundle:
    d = tmp_path / "b"
    shutil.copytree(built.path, d)
    m = copy.deepcopy(built.manifest)
    change(m, d)
    (d / "manifest.json").write_text(json.dumps(m))
    return Bundle.open(d, trust=False)


def _refused(b: Bundle, tmp_path: Path, match: str, *, accept: bool = True) -> None:
    with pytest.raises(EdgeError, match=match) as e:
        ship(b, tmp_path / "dev", accept_parity_failure=accept)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "dev" / "current").exists()


def test_a_no_reference_skip_of_a_source_that_runs_here_is_refused(built: Bundle, tmp_path: Path) -> None:
    def edit(m: dict[str, Any], d: Path) -> None:
        m["parity"] = {"passed": None, "skipped": SKIP_NO_REFERENCE}
        m.pop("reference_pairs")
        m["artifacts"] = [a for a in m["artifacts"] if a["path"] != "reference.npz"]
        (d / "reference.npz").unlink()

    b = _copy(built, tmp_path, edit)
    _refused(b, tmp_path, r"its format \(onnx\) runs here in onnxruntime")


def _failing(m: dict[str, Any]) -> dict[str, Any]:
    """The tiny CNN's parity as a conversion that computes something else would record it (passed: false)."""
    o = m["parity"]["outputs"][0]
    span = o["ref_max"] - o["ref_min"]
    o.update(max_abs=60.0, mean_abs=20.0, cosine=0.5, cosine_min=0.2, snr_db=2.0, snr_db_min=0.5)  # top-1 still 1.0
    o.update(rel_max_abs=60.0 / span, passed=False, failures=["mean cosine 0.500000 < 0.99999"])
    m["parity"]["passed"] = False
    return o


@pytest.mark.parametrize("lo,hi", [(1e9, 1e9), (1e9, -1e9), (3e38, 3e38)], ids=["constant", "inverted", "3e38"])
def test_a_failing_parity_cannot_become_unverified_by_a_constant_range(
    built: Bundle, tmp_path: Path, lo: float, hi: float
) -> None:
    def edit(m: dict[str, Any], d: Path) -> None:
        o = _failing(m)
        o.update(ref_min=lo, ref_max=hi, rel_max_abs=None, degenerate=True, passed=True, failures=[])
        m["parity"]["passed"] = True

    b = _copy(built, tmp_path, edit)
    _refused(b, tmp_path, "the manifest was edited")


def test_the_honest_failing_parity_is_still_a_failure(built: Bundle, tmp_path: Path) -> None:
    b = _copy(built, tmp_path, lambda m, d: _failing(m))
    _refused(b, tmp_path, "it failed parity", accept=False)


@pytest.mark.parametrize(
    "note", ["regression output, fine", "a [1, 10] output is logits, landmarks or an embedding alike: raw figures only"]
)
def test_a_failing_top1_cannot_be_dropped_with_a_task_note(built: Bundle, tmp_path: Path, note: str) -> None:
    def edit(m: dict[str, Any], d: Path) -> None:
        o = m["parity"]["outputs"][0]
        o.update(top1=None, top5=None, task=None, task_note=note)

    b = _copy(built, tmp_path, edit)
    _refused(b, tmp_path, "no top-1 figure")


def test_a_failed_isa_verification_does_not_ship(built: Bundle, tmp_path: Path) -> None:
    evidence = {
        "isa": "aarch64",
        "cpu": "cortex-a76",
        "emulated": True,
        "label": "checked on aarch64 (emulated cortex-a76)",
        "runtime": "onnxruntime 1.22.0",
        "device_used": "CPU",
        "host_runtime": "onnxruntime 1.22.0",
        "samples": 16,
        "passed": False,
        "checked_utc": "2026-11-28T12:00:00Z",
        "failures": ["logits: mean cosine 0.41 < 0.99999"],
    }
    b = _copy(built, tmp_path, lambda m, d: m.update(verified_on=[evidence]))
    _refused(b, tmp_path, r"failed checked on aarch64 \(emulated cortex-a76\)", accept=False)
    said_passed = _copy(built, tmp_path / "p", lambda m, d: m.update(verified_on=[{**evidence, "passed": True}]))
    _refused(said_passed, tmp_path / "p", "says passed with failures", accept=False)


def test_a_budget_said_to_be_the_profiles_must_be_the_profiles(built: Bundle, tmp_path: Path) -> None:
    rep = run_benchmark(
        built.open_runner, BenchOptions(iterations=3, warmup=1, budget_ms=16.67, bundle=built.id, target=built.target)
    )
    bench = {**rep.to_json(), "on_target_device": True}
    bench["latency"] = {k: (v + 1000.0 if k.endswith("_ms") else v) for k, v in bench["latency"].items()}

    def edit(m: dict[str, Any], d: Path) -> None:
        m["benchmark"] = {**bench, "budget_ms": 1e9, "budget_source": "target profile", "verdict": "pass"}

    b = _copy(built, tmp_path, edit)
    with pytest.raises(DeployError, match=r"its source \(target profile\) is 16.67 ms for x86-cpu"):
        check_gates(b.info, accept_budget_failure=True)
    invented = _copy(
        built,
        tmp_path / "i",
        lambda m, d: m.update(benchmark={**bench, "budget_ms": 1e9, "budget_source": "ops said so"}),
    )
    with pytest.raises(DeployError, match="is not one edgekit writes"):
        check_gates(invented.info)
    user = _copy(
        built,
        tmp_path / "u",
        lambda m, d: m.update(benchmark={**bench, "budget_ms": 2000.0, "budget_source": "2000 ms"}),
    )
    check_gates(user.info)  # an explicit budget, labelled as one, is the user's choice


def test_a_huge_parity_sample_count_does_not_loosen_the_devices_check(built: Bundle, tmp_path: Path) -> None:
    other = build_tiny_cnn(tmp_path / "other.onnx", seed=7)

    def swap(m: dict[str, Any], d: Path) -> None:
        shutil.copy(other, d / "model.onnx")
        for a in m["artifacts"]:
            if a["path"] == "model.onnx":
                a.update(sha256=sha256_file(d / "model.onnx"), bytes=(d / "model.onnx").stat().st_size)
        m["parity"]["samples"] = 1 << 20
        o = m["parity"]["outputs"][0]  # figures a gate passes: means at the limit, worst samples anywhere
        o.update(top1=0.999, top5=0.999, cosine=0.99999, cosine_min=-1.0, snr_db=40.0, snr_db_min=-60.0)
        o.update(ref_min=-5e5, ref_max=5e5, max_abs=1e3, rel_max_abs=1e3 / 1e6)

    b = _copy(built, tmp_path, swap)
    check_gates(b.info)  # the record alone passes this edgekit's thresholds
    with b.open_runner() as r:
        res = check_reference_pairs(b, r)
    assert res["passed"] is False, res
    assert any("mean cosine" in f for f in res["failures"]), res["failures"]
