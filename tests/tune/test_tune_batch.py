"""``edgekit tune``: batch as a space dimension (objective throughput) and LiteRT's XNNPack flag.

Batch: a model whose first input dimension is a batch (dynamic, or 1 in a batch-agnostic graph) gets batched
trials, converted at that batch, fed N stacked samples, counted N items per inference and checked per item
against the batch-1 reference; a model whose batch cannot change is pruned with onnxruntime's reason. LiteRT:
``xnnpack_latest_features`` reaches the interpreter (the execution plan's XNNPack partition comes from it) and
its trials are still parity-checked. Real conversions and runtimes on tiny models built here; no timings asserted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnx
import pytest
import tomllib
from onnx import TensorProto, helper, numpy_helper

from edge.errors import EdgeError
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest
from edge.targets import get_target
from edge.tune.measure import open_trial_runner
from edge.tune.search import Schedule, TuneOptions, tune
from edge.tune.space import BATCHES, MAX_BATCH_BYTES, BatchPlan, Config, Extent, batch_plan, build_space

QUICK = Schedule(reps=2, iters=5, warmup=1)


def _save(path: Path, nodes: list[Any], x_shape: Sequence[Any], y_shape: Sequence[Any], inits: list[Any] = ()) -> Path:
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, list(x_shape))
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, list(y_shape))
    model = helper.make_model(
        helper.make_graph(nodes, path.stem, [x], [y], list(inits)), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    onnx.save(model, path)
    return path


def conv_model(path: Path, batch: Any = 1) -> Path:
    """conv 3x3 -> relu -> global average pool -> flatten: batch-agnostic, its input batch fixed at 1 (as the
    example MobileNetV2's) or symbolic."""
    w = (np.random.default_rng(0).standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["input", "W"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Flatten", ["g"], ["output"]),
    ]
    return _save(path, nodes, [batch, 3, 16, 16], [batch, 8], [numpy_helper.from_array(w, "W")])


def fixed_reshape_model(path: Path) -> Path:
    """A Reshape to a constant [1, 48]: the graph itself fixes the batch at 1."""
    shape = numpy_helper.from_array(np.array([1, 48], np.int64), "shape")
    return _save(path, [helper.make_node("Reshape", ["input", "shape"], ["output"])], [1, 3, 4, 4], [1, 48], [shape])


def mixing_model(path: Path) -> Path:
    """y = x + mean over the batch: at batch 1 that is 2x, in a batch each item depends on the others."""
    nodes = [
        helper.make_node("ReduceMean", ["input"], ["m"], axes=[0], keepdims=1),
        helper.make_node("Add", ["input", "m"], ["output"]),
    ]
    return _save(path, nodes, ["N", 3, 4, 4], ["N", 3, 4, 4])


# -- the plan and the space --------------------------------------------------------------------------


def test_batch_plan_accepts_a_batch_dimension(tmp_path: Path) -> None:
    for name, batch in (("static1", 1), ("dynamic", "N")):
        plan = batch_plan(conv_model(tmp_path / f"{name}.onnx", batch), tmp_path / "plans")
        assert plan.problem is None, plan.problem
        assert plan.batches == BATCHES and plan.shapes == {"input": (1, 3, 16, 16)}
        assert plan.input_shapes(4) == {"input": [4, 3, 16, 16]}
        variant = onnx.load(str(plan.model))
        assert variant.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "edgekit_batch"


def test_batch_plan_prunes_a_model_whose_batch_cannot_change(tmp_path: Path) -> None:
    fixed = batch_plan(fixed_reshape_model(tmp_path / "reshape.onnx"), tmp_path / "plans")
    assert fixed.problem is not None and "onnxruntime cannot run reshape.onnx at batch 2" in fixed.problem
    assert fixed.model is None and fixed.batches == (1,)
    mixing = batch_plan(mixing_model(tmp_path / "mixing.onnx"), tmp_path / "plans", {"input": [1, 3, 4, 4]})
    assert mixing.problem is not None and "mixes items across the batch" in mixing.problem
    three = _save(tmp_path / "three.onnx", [helper.make_node("Relu", ["input"], ["output"])], [3, 4], [3, 4])
    assert "fixed first dimension 3" in (batch_plan(three, tmp_path / "plans").problem or "")
    # big inputs: the batches whose input would pass the cap are kept, the others pruned with the size
    big = _save(
        tmp_path / "big.onnx", [helper.make_node("Relu", ["input"], ["output"])], [1, 4, 1024, 1024], [1, 4, 1024, 1024]
    )
    capped = batch_plan(big, tmp_path / "plans")
    assert capped.problem is None and capped.batches == tuple(b for b in BATCHES if b * 16 << 20 <= MAX_BATCH_BYTES)
    assert capped.batches != BATCHES and any("MB cap" in p for p in capped.pruned)


def test_space_batches_only_for_throughput() -> None:
    x86 = get_target("x86-cpu")
    plan = BatchPlan(batches=(1, 2, 4), shapes={"input": (1, 3, 16, 16)}, model=Path("unused.onnx"))
    narrow: dict[str, Any] = dict(runners=["onnxruntime"], precisions=["fp32"], threads=[1])
    lat = build_space(x86, objective="latency", extent=Extent(batch=plan), **narrow)
    assert {c.batch for c in lat.configs} == {1}
    assert any("only for the throughput objective" in p for p in lat.pruned)
    thr = build_space(x86, objective="throughput", extent=Extent(batch=plan), **narrow)
    assert {c.batch for c in thr.configs} == {1, 2, 4} and thr.batch is plan
    assert len({c.id for c in thr.configs}) == len(thr.configs)
    by_batch = {n: sorted(c.options for c in thr.configs if c.batch == n) for n in (1, 2, 4)}
    assert by_batch[1] == by_batch[2] == by_batch[4]  # every option combination at every batch
    b2 = next(c for c in thr.configs if c.batch == 2)
    assert b2.id.endswith("/batch=2") and "batch=2" in b2.label() and b2.to_json()["batch"] == 2
    refused = build_space(
        x86, objective="throughput", extent=Extent(batch=BatchPlan(problem="the graph fixes its batch")), **narrow
    )
    assert {c.batch for c in refused.configs} == {1}
    assert "batch > 1: the graph fixes its batch" in refused.pruned


# -- batched trials ------------------------------------------------------------------------------------


def test_batched_trials_on_onnxruntime(tmp_path: Path) -> None:
    model = conv_model(tmp_path / "conv.onnx", 1)  # batch fixed at 1 in the ONNX, batch-agnostic graph
    r = tune(
        model,
        "x86-cpu",
        ConvertRequest(parity_samples=4),
        TuneOptions(
            out=tmp_path / "out",
            objective="throughput",
            runners=["onnxruntime"],
            precisions=["fp32"],
            threads=[1],
            batches=[1, 2],
            schedule=QUICK,
            pictures=False,
            strategy="exhaustive",
        ),
    )
    assert not any(p.startswith("batch") for p in r.pruned)
    batched = [t for t in r.trials if t["batch"] == 2]
    singles = [t for t in r.trials if t["batch"] == 1]
    assert batched and len(batched) == len(singles)
    # converted at batch 2 (a recipe of its own: another cache key, another bundle), fed 2 stacked samples
    assert {t["recipe_key"] for t in batched}.isdisjoint({t["recipe_key"] for t in singles})
    from edge.bundle.bundle import Bundle

    b = Bundle.open(batched[0]["bundle"], trust=False)
    assert list(b.io.inputs[0].shape) == [2, 3, 16, 16]
    for t in r.trials:  # items/s is the figure trials rank on: the median of the repetitions' items per second
        rung = t["rungs"][t["result"]["rung"]]
        assert t["result"]["fps"] == pytest.approx(-float(np.median(rung["rep_scores"])), rel=1e-4, abs=0.02)
    for t in batched:
        assert t["result"]["batch"] == 2
        per = t["parity"]["per_item"]
        assert per["passed"] is True and per["batch"] == 2 and per["samples"] == 4, t["parity"]
        assert t["parity"]["trial"]["passed"] is True and t["parity"]["passed"] is True
    assert all(t["result"]["batch"] == 1 and "per_item" not in t["parity"] for t in singles)
    ov = tomllib.loads(Path(r.overlay_path).read_text())
    assert ov["tuned"]["batch"] == r.winner["batch"]
    assert ov["tuned"]["fps"] == r.winner["result"]["fps"]  # items per second
    assert r.to_json()["trials"][0]["batch"] in (1, 2)


def test_per_item_check_fails_a_batch_that_mixes_items(tmp_path: Path) -> None:
    """The batch-2 bundle of a graph that mixes items passes its own gate (its reference mixes them too); the
    per-item check against batch 1 fails it, so it is never chosen."""
    model = mixing_model(tmp_path / "mixing.onnx")
    one = convert(
        model,
        "x86-cpu",
        tmp_path / "b1",
        ConvertRequest(input_shapes={"input": [1, 3, 4, 4]}, parity_samples=4),
        force=True,
    )
    two = convert(
        model,
        "x86-cpu",
        tmp_path / "b2",
        ConvertRequest(input_shapes={"input": [2, 3, 4, 4]}, parity_samples=4),
        force=True,
    )
    assert two.manifest["parity"]["passed"] is True
    rec: dict[str, Any] = {}
    runner, feeds = open_trial_runner(rec, two, Config("onnxruntime", "fp32", batch=2), single=one)
    runner.close()
    assert feeds["input"].shape == (2, 3, 4, 4)
    par = rec["parity"]
    assert par["trial"]["passed"] is True
    assert par["per_item"]["passed"] is False and par["passed"] is False
    assert any(f.startswith("per item at batch 2") for f in par["failures"])
    # without a batch-1 bundle to check against, a batched trial is not verified (never chosen either)
    rec = {}
    open_trial_runner(rec, two, Config("onnxruntime", "fp32", batch=2), single=None)[0].close()
    assert rec["parity"]["passed"] is None and "per-item check not run" in rec["parity"]["failures"][-1]


def test_tune_refuses_bad_batches(tmp_path: Path) -> None:
    with pytest.raises(EdgeError, match="batches must be integers from 1 to 64"):
        tune(
            conv_model(tmp_path / "c.onnx"),
            "x86-cpu",
            options=TuneOptions(out=tmp_path / "o", objective="throughput", batches=[0]),
        )


# -- LiteRT: XNNPack's latest-features delegate ----------------------------------------------------------

litert = pytest.importorskip("ai_edge_litert", reason="ai-edge-litert is not installed")


def test_latest_features_reach_the_interpreter(tmp_path: Path) -> None:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from edge.backends.litert.run import LiteRTRunner, delegation
    from tests.backends.test_litert import add_model

    path = add_model(tmp_path / "add.tflite")
    # what the runner relies on: with no default delegate in the resolver, XNNPack is there only by the flag
    for flag, taken in ((False, 0), (True, 1)):
        it = Interpreter(
            model_path=str(path),
            num_threads=1,
            experimental_default_delegate_latest_features=flag,
            experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
        )
        it.allocate_tensors()
        assert delegation(it)["delegated_ops"] == taken
    r = LiteRTRunner(path, options={"xnnpack_latest_features": True, "num_threads": 1})
    d = r.info.details
    assert d["delegate_applied"] == "XNNPack (latest operators)" and d["xnnpack_latest_features"] is True
    assert d["delegated_ops"] == d["model_ops"] == 1
    x = np.arange(48, dtype=np.float32).reshape(1, 4, 4, 3)
    np.testing.assert_allclose(r.infer({"x": x})["y"], x + 1.5)
    r.close()
    plain = LiteRTRunner(path, options={"num_threads": 1})
    assert plain.info.details["delegate_applied"] == "XNNPack" and "xnnpack_latest_features" not in plain.info.details
    plain.close()
    for bad, msg in (
        ({"delegate": "none", "xnnpack_latest_features": True}, "delegate xnnpack only"),
        ({"xnnpack_latest_features": "yes"}, "must be true or false"),
    ):
        with pytest.raises(EdgeError, match=msg):
            LiteRTRunner(path, options=bad)


def test_latest_features_in_manifest_rules_and_space() -> None:
    from edge.base.typedjson import Invalid
    from edge.bundle.schema import RunnerSpec, check_runner

    check_runner(RunnerSpec("litert", {"xnnpack_latest_features": True}), where="runner")
    with pytest.raises(Invalid, match="xnnpack_latest_features"):
        check_runner(RunnerSpec("litert", {"xnnpack_latest_features": "yes"}), where="runner")
    space = build_space(get_target("arm-xnnpack"), threads=[1], precisions=["fp32"])
    combos = {(dict(c.options)["delegate"], dict(c.options)["xnnpack_latest_features"]) for c in space.configs}
    assert combos == {("xnnpack", False), ("xnnpack", True), ("none", False)}
    assert any(p.startswith("litert xnnpack_latest_features with delegate=none") for p in space.pruned)


def test_litert_trials_keep_parity_with_latest_features_and_batch(tmp_path: Path) -> None:
    """onnx2tf is a static-shape converter: the batched trial is converted at batch 2 (its own recipe)."""
    r = tune(
        conv_model(tmp_path / "conv.onnx", 1),
        "arm-xnnpack",
        ConvertRequest(parity_samples=4),
        TuneOptions(
            out=tmp_path / "out",
            objective="throughput",
            precisions=["fp32"],
            threads=[1],
            batches=[1, 2],
            schedule=QUICK,
            pictures=False,
            strategy="exhaustive",
        ),
    )
    latest = [t for t in r.trials if t["options"].get("xnnpack_latest_features")]
    assert {t["batch"] for t in latest} == {1, 2}
    for t in latest:
        assert t["parity"]["trial"]["passed"] is True and t["parity"]["passed"] is True, t["parity"]
        assert t["runtime"]["device_used"] == "CPU (XNNPack)"
    two = [t for t in r.trials if t["batch"] == 2]
    assert two and all(t["parity"]["per_item"]["passed"] is True for t in two)


def test_cli_shows_batch_rows_as_items_per_second(tmp_path: Path) -> None:
    from tests.support.cli import assert_user_error, run_cli

    model = str(conv_model(tmp_path / "conv.onnx", 1))
    p = run_cli(
        "tune",
        model,
        "-t",
        "x86-cpu",
        "--objective",
        "throughput",
        "--runner",
        "onnxruntime",
        "-p",
        "fp32",
        "--batch",
        "1",
        "--batch",
        "2",
        "--max-trials",
        "2",
        "--out",
        str(tmp_path / "o"),
    )
    assert p.returncode == 0, p.stderr
    assert "items/s" in p.stdout and "batch=2" in p.stdout, p.stdout
    assert_user_error(
        run_cli(
            "tune", model, "-t", "x86-cpu", "--objective", "throughput", "--batch", "0", "--out", str(tmp_path / "o2")
        ),
        "batches must be integers from 1 to 64",
    )
