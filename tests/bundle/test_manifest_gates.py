"""Gates read figures, not flags (issue 11, attack 4).

Flipping ``parity.passed`` to true in the manifest of a bundle that failed parity made ``deploy``
ship it. ``ship`` now recomputes pass/fail from the recorded per-output figures against the
thresholds in ``edge.verify.parity`` for the bundle's precision, and refuses a record that claims more
than its figures -- even with ``--accept-parity-failure``, which accepts a failure, not an edit.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from edge.backends.converter import CONVERTERS
from edge.bundle.bundle import Bundle
from edge.deploy import ship
from edge.errors import BudgetError, DeployError, ManifestError
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest
from edge.verify.gates import SKIP_NO_REFERENCE, check_gates, parity_verdict
from tests.pipeline.test_convert import BrokenConverter
from tests.test_targets import VALID


@pytest.fixture
def failed(models: dict[str, Path], tmp_path: Path) -> Iterator[Bundle]:
    """A bundle whose parity really failed (a converter that negates weights), kept with --accept-parity-failure."""
    CONVERTERS.register(BrokenConverter)
    d = tmp_path / "targets"
    d.mkdir()
    (d / "broken.toml").write_text(
        VALID.format(name="broken").replace('chain = ["onnx->onnx"]', 'chain = ["onnx->onnx-broken"]')
    )
    try:
        yield convert(
            models["tiny"], "broken", tmp_path / "b", ConvertRequest(targets_dir=[d], accept_parity_failure=True)
        )
    finally:
        CONVERTERS.unregister(BrokenConverter.name)


def _edit(b: Bundle, change: Any) -> Bundle:
    m = copy.deepcopy(b.manifest)
    change(m)
    (b.path / "manifest.json").write_text(json.dumps(m))
    return Bundle.open(b.path)


def _claim_pass(m: dict[str, Any]) -> None:
    """What an attacker edits: every flag, and the recorded limits too; the figures stay."""
    p = m["parity"]
    p.update(passed=True, accepted_failure=False, thresholds={"min_cosine": -1.0, "min_top1": 0.0})
    for o in p["outputs"]:
        o.update(passed=True, failures=[])


def test_flipping_passed_on_a_failed_bundle_is_refused(failed: Bundle, tmp_path: Path) -> None:
    assert failed.manifest["parity"]["passed"] is False
    with pytest.raises(DeployError, match="it failed parity"):
        ship(failed, tmp_path / "dev")
    flipped = _edit(failed, lambda m: m["parity"].update(passed=True))  # the one-field edit
    edited = _edit(failed, _claim_pass)  # and a thorough one: every flag and the recorded limits
    for b in (flipped, edited):
        assert b.manifest["parity"]["passed"] is True
        for accept in (False, True):  # accepting a failure is not accepting an edited record
            with pytest.raises(
                DeployError,
                match="its parity record says passed, but its figures fail this "
                "edgekit's fp32 thresholds \\(logits: mean cosine",
            ):
                ship(b, tmp_path / "dev", accept_parity_failure=accept)
    assert not (tmp_path / "dev" / "current").exists()


def test_hiding_a_figure_is_refused(failed: Bundle) -> None:
    def drop_top1(m: dict[str, Any]) -> None:
        _claim_pass(m)
        m["parity"]["outputs"][0].update(top1=None, cosine=1.0)  # a classifier's top-1 left out

    v = parity_verdict(_edit(failed, drop_top1).info)
    assert v.edited and "classifier-shaped output with neither a top-1 figure nor a reason" in v.edited
    rename = _edit(failed, lambda m: (_claim_pass(m), m["parity"]["outputs"][0].update(name="other")))
    assert "logits: no parity figures" in (parity_verdict(rename.info).edited or "")


def test_a_precision_cannot_borrow_looser_limits(failed: Bundle) -> None:
    def int8_figures(m: dict[str, Any]) -> None:
        _claim_pass(m)
        m["parity"]["outputs"][0].update(cosine=0.99, top1=0.95)  # passes int8, fails fp32

    assert parity_verdict(_edit(failed, int8_figures).info).edited
    with pytest.raises(ManifestError, match="field parity.precision: int8 differs"):
        _edit(failed, lambda m: (int8_figures(m), m["parity"].update(precision="int8")))


def test_missing_or_null_parity(failed: Bundle, tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="field parity.passed: must be true or false, got null"):
        _edit(failed, lambda m: m["parity"].update(passed=None))
    none = _edit(failed, lambda m: m.update(parity=None))
    with pytest.raises(DeployError, match="it has no parity record"):
        ship(none, tmp_path / "dev")
    skipped = _edit(failed, lambda m: m.update(parity={"passed": None, "skipped": "needs the device's accelerator"}))
    assert parity_verdict(skipped.info).state == "skipped"
    with pytest.raises(DeployError, match="is not a reason edgekit skips parity for"):  # #26: a closed set
        ship(skipped, tmp_path / "dev", accept_parity_failure=True)

    # skipped for a reason the code writes, and the evidence agrees (no reference outputs, so no pairs)
    def no_reference(fmt: str) -> Any:
        return lambda m: m.update(
            parity={"passed": None, "skipped": SKIP_NO_REFERENCE},
            reference_pairs=None,
            source={**m["source"], "format": fmt},
        )

    ship(_edit(failed, no_reference("edgetpu-tflite")), tmp_path / "dev")  # the device checks it on first load
    with pytest.raises(DeployError, match=r"its format \(onnx\) runs here"):  # issue #33: an ONNX source runs here
        ship(_edit(failed, no_reference("onnx")), tmp_path / "dev2")
    with pytest.raises(ManifestError, match="field parity.skipped: must be 1 to 1024 characters"):
        _edit(failed, lambda m: m.update(parity={"passed": None, "skipped": ""}))


def test_a_benchmark_verdict_is_recomputed(models: dict[str, Path], tmp_path: Path) -> None:
    from edge.bench import BenchOptions, run_benchmark

    b = convert(models["tiny"], "x86-cpu", tmp_path / "b")
    rep = run_benchmark(
        b.open_runner, BenchOptions(iterations=3, warmup=1, budget_ms=1e-6, bundle=b.id, target=b.target)
    )
    b.record("benchmark", {**rep.to_json(), "on_target_device": True})
    assert b.info.benchmark.verdict == "fail"  # type: ignore[union-attr]
    with pytest.raises(BudgetError, match="over the 0.00 ms budget"):
        check_gates(b.info)
    check_gates(b.info, accept_budget_failure=True)
    flipped = _edit(b, lambda m: m["benchmark"].update(verdict="pass"))
    with pytest.raises(DeployError, match="its benchmark says 'pass', but p99 .* is 'fail'; the manifest was edited"):
        check_gates(flipped.info, accept_budget_failure=True)
    elsewhere = _edit(b, lambda m: m["benchmark"].update(verdict="fail", on_target_device=False))
    with pytest.raises(DeployError, match="did not run on the target device but names no fallback"):
        check_gates(elsewhere.info)


def test_llm_quality_is_recomputed(tmp_path: Path) -> None:
    from edge.llm.quality import THRESHOLDS

    max_kl, min_top1 = THRESHOLDS["q4_k_m"]
    m = {
        "schema_version": 1,
        "edgekit_version": "0.1.0",
        "bundle_id": "tiny-llm-q4_k_m-0123456789",
        "kind": "llm",
        "target": {"name": "x86-cpu"},
        "precision": "q4_k_m",
        "format": "gguf",
        "primary_artifact": "model.gguf",
        "artifacts": [{"path": "model.gguf", "sha256": "0" * 64, "bytes": 1}],
        "io": {"inputs": [{"name": "tokens", "shape": ["n"], "dtype": "int32"}], "outputs": []},
        "runner": {"name": "llama.cpp", "options": {"n_ctx": 2048}},
        "parity": {
            "kind": "llm",
            "passed": True,
            "quant": "q4_k_m",
            "tokens": 256,
            "kl_mean": max_kl * 3,
            "kl_p99": 1.0,
            "kl_max": 2.0,
            "top1": min_top1 + 0.01,
            "reference": "source GGUF",
            "thresholds": {"max_kl_mean": 10.0, "min_top1": 0.0},
        },
    }
    v = parity_verdict(Bundle(tmp_path, m).info)
    assert v.state == "fail" and v.edited and "mean KL" in v.edited
    m["parity"].update(kl_mean=max_kl / 2)
    assert parity_verdict(Bundle(tmp_path, m).info).state == "pass"
