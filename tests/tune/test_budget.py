"""deploy's budget search (edge.tune.budget; issue #30): the precisions by the CPU's ISA, the tuner's search with
threads and spin-wait varied, every candidate through the parity gate, the refusal listing what was tried."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edge.capabilities import CpuIsa
from edge.deploy import DeployOptions, deploy
from edge.errors import BudgetError
from edge.pipeline.request import ConvertRequest
from edge.targets import get_target
from edge.tune import budget as bs
from edge.tune.verdict import VerdictOptions

QUICK = VerdictOptions(warmup_s=0.2, measure_s=0.2, min_iterations=20)


def _isa(*flags: str) -> CpuIsa:
    return CpuIsa("test cpu", frozenset(flags), True)


def test_precisions_follow_the_isa_and_an_explicit_precision() -> None:
    x86 = get_target("x86-cpu")
    amd = bs.plan(x86, ConvertRequest(), _isa("avx2"))  # AVX2 only (AMD EPYC Milan)
    assert amd.precisions == ("fp32", "int8")
    assert any(s.startswith("bf16:") for s in amd.skipped) and any(s.startswith("fp16:") for s in amd.skipped)
    amx = bs.plan(x86, ConvertRequest(), _isa("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8"))
    assert amx.precisions == ("fp32", "int8", "bf16")
    spr = bs.plan(x86, ConvertRequest(), _isa("avx2", "avx512_fp16", "amx_bf16", "amx_int8"))
    assert spr.precisions == ("fp32", "int8", "bf16", "fp16")
    assert bs.plan(x86, ConvertRequest(), _isa()).precisions == ("fp32",)  # no int8 path at all
    assert bs.plan(x86, ConvertRequest(precision="fp16"), _isa("avx2")).precisions == ("fp16",)  # as given


def test_every_cpu_and_spin_wait_are_left_to_the_runners_policy() -> None:
    """A search on an idle host picks every CPU (and spin-wait): pinned, the bundle ran 2 threads beside a busy
    core (YOLOv8n OpenVINO int8, 2 CPUs: steady p99 17.18 ms vs 16.67, 181 of 600 frames late at 60 fps). What the
    runner's load-aware policy takes on an idle host is left to it; fewer threads than every CPU stay as chosen."""
    from edge.pipeline.overlay import TunedOverlay

    def ov(runner: str, **run: object) -> TunedOverlay:
        return TunedOverlay("x86-cpu", "int8", runner, ("onnx->openvino-ir",), {}, run)

    got, left = bs.adaptive_threads(ov("openvino", device=["CPU"], num_threads=2, performance_hint="LATENCY"), 2)
    assert dict(got.run_options) == {"device": ["CPU"], "performance_hint": "LATENCY"}
    assert left == ["num_threads (the search's 2: every CPU here)"]
    kept, left = bs.adaptive_threads(ov("openvino", num_threads=1), 2)  # one of two: the search's own choice
    assert dict(kept.run_options) == {"num_threads": 1} and left == []
    assert dict(bs.adaptive_threads(ov("openvino", num_threads=2), 4)[0].run_options) == {"num_threads": 2}
    ort, left = bs.adaptive_threads(ov("onnxruntime", intra_op_num_threads=2, allow_spinning=True), 2)
    assert dict(ort.run_options) == {} and len(left) == 2
    off, _ = bs.adaptive_threads(ov("onnxruntime", intra_op_num_threads=1, allow_spinning=False), 2)
    assert dict(off.run_options) == {"intra_op_num_threads": 1, "allow_spinning": False}


def test_search_measures_every_candidate_through_parity(models: dict[str, Path], tmp_path: Path) -> None:
    ranked, rec = bs.search_ranked(
        models["tiny"], get_target("x86-cpu"), ConvertRequest(), tmp_path / "s", 1e6, 2e6, time_s=240
    )
    overlay = ranked[0] if ranked else None
    # the chosen one first, then up to ALTERNATES others for deploy to verdict should it miss: each a different
    # configuration once its threads are the runner's policy's, each within the budget in the search
    assert 2 <= len(ranked) <= 1 + bs.ALTERNATES
    assert len({o.describe() for o in ranked}) == len(ranked)
    assert all(isinstance(o.tuned.get("p99_ms"), float) and o.tuned["p99_ms"] <= 1e6 for o in ranked)
    cands = rec["candidates"]
    assert overlay is not None and rec["chosen"] and "fastest" in rec["why"]
    assert {c["precision"] for c in cands} >= {"fp32"} and all(c["parity"] is not None for c in cands)
    # threads and spin-wait vary, other options stay at their defaults
    assert {k for c in cands for k in c["options"]} <= {
        "intra_op_num_threads",
        "allow_spinning",
        "num_threads",
        "graph_optimization_level",
        "execution_mode",
        "inter_op_num_threads",
        "performance_hint",
    }
    assert {c["options"].get("graph_optimization_level") for c in cands if c["runner"] == "onnxruntime"} == {"all"}
    chosen = next(c for c in cands if c["label"] == rec["chosen"])
    assert chosen["within_budget"] and chosen["parity"] is True


def test_deploy_refuses_listing_what_was_tried(models: dict[str, Path], tmp_path: Path) -> None:
    opts = DeployOptions(build_dir=tmp_path / "b", budget_ms=1e-4, verdict=QUICK, search_time_s=120)
    with pytest.raises(BudgetError, match=r"budget search .* tried .*onnxruntime fp32.*: no candidate") as e:
        deploy(models["tiny"], "x86-cpu", tmp_path / "dev", options=opts)
    assert "--accept-budget-failure" in str(e.value)
    refused = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert refused["budget_search"]["chosen"] is None and refused["budget_search"]["candidates"]
    assert not (tmp_path / "dev" / "current").exists()


def test_no_search_refuses_at_once(models: dict[str, Path], tmp_path: Path) -> None:
    opts = DeployOptions(build_dir=tmp_path / "b", budget_ms=1e-4, verdict=QUICK, budget_search=False)
    with pytest.raises(BudgetError) as e:
        deploy(models["tiny"], "x86-cpu", tmp_path / "dev", options=opts)
    assert "budget search" not in str(e.value)
    assert "budget_search" not in json.loads((tmp_path / "b" / "manifest.json").read_text())


def test_what_was_converted_is_measured_past_the_time_cap(models: dict[str, Path], tmp_path: Path) -> None:
    """A cap reached while converting (a loaded host: 4 conversions took the budget search's whole 300 s) still
    measures what was converted once: otherwise nothing could be chosen."""
    from edge.tune.search import TuneOptions, tune

    opts = TuneOptions(
        runners=("onnxruntime",),
        precisions=("fp32",),
        threads=(1, 2),
        time_budget_s=0.25,
        pictures=False,
        out=tmp_path / "t",
    )
    result = tune(models["tiny"], "x86-cpu", ConvertRequest(), opts)
    assert result.converted == 1 and result.measured >= 2 and result.winner is not None


def test_a_cached_conversion_under_the_older_auto_rule_is_not_reused() -> None:
    """``--preprocess auto`` now takes what the model file declares (edge.pipeline.declared): a tuner cache written
    under the older rule (auto = ImageNet for every float 3-channel input) must miss, not hand back a bundle with
    another pre-processing. An explicit preset keys as itself."""
    from edge.pipeline.request import ConvertRequest
    from edge.tune.cache import source_key

    auto = source_key(ConvertRequest())["preprocess"]
    assert auto not in ("auto", "imagenet") and auto.startswith("auto/")
    assert source_key(ConvertRequest(preprocess="imagenet"))["preprocess"] == "imagenet"
