"""``edge.tune.search`` / ``edgekit tune``: the space pruned per target, parity as a hard constraint, resume from a study,
the overlay round trip into convert, one-line refusals. Real conversions and runtimes on tiny models; structure
and constraints are asserted, never timings."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge.deploy import DeployOptions
from edge.errors import EdgeError, TargetError
from edge.pipeline import convert
from edge.pipeline.overlay import read_overlay
from edge.pipeline.request import ConvertRequest
from edge.targets import get_target
from edge.tune.ranking import choose, ranked_trials
from edge.tune.search import Schedule, TuneOptions, tune
from edge.tune.space import THREADS, build_space, usable_cpus
from tests.cli.test_cli_errors import build_outlier_model
from tests.support.cli import assert_user_error, run_cli

QUICK = Schedule(reps=2, iters=5, warmup=1)


# -- the space ------------------------------------------------------------------------------------


def test_x86_cpu_space_has_both_cpu_runners_and_prunes_with_reasons() -> None:
    profile = get_target("x86-cpu")
    space = build_space(profile, objective="latency", calibrated=False, bf16_capabilities=["FP32", "INT8"])
    runners = {c.runner for c in space.configs}
    assert runners == {"onnxruntime", "openvino"}
    pruned = "\n".join(space.pruned)
    # int8 without calibration data, bf16 where OpenVINO does not report it, THROUGHPUT for a latency objective
    assert "int8: static int8 needs calibration data" in pruned
    assert "openvino bf16: OpenVINO's CPU plugin does not report BF16" in pruned
    assert "onnxruntime bf16" in pruned
    assert "performance_hint=THROUGHPUT: only for the throughput objective" in pruned
    assert not any(c.precision in ("int8", "bf16") for c in space.configs)
    cpus = usable_cpus()
    if any(t > cpus for t in THREADS):
        assert f"more threads than the {cpus} CPUs" in pruned
    for c in space.configs:
        opts = dict(c.options)
        threads = opts.get("intra_op_num_threads", opts.get("num_threads"))
        assert 1 <= threads <= cpus, c.id
        if c.runner == "openvino":
            assert opts["performance_hint"] == "LATENCY"
            assert space.run_options["openvino"]["device"] == ["CPU"]  # OpenVINO's CPU plugin serves x86-cpu
    assert len({c.id for c in space.configs}) == len(space.configs)

    calibrated = build_space(profile, objective="throughput", calibrated=True, bf16_capabilities=["FP32", "BF16"])
    bf16 = [c for c in calibrated.configs if c.precision == "bf16"]
    assert bf16 and all(
        c.runner == "openvino" and dict(c.options)["inference_precision"] == "bf16" and c.bundle_precision == "fp32"
        for c in bf16
    )
    assert {c.precision for c in calibrated.configs} >= {"fp32", "int8"}
    assert any(dict(c.options).get("performance_hint") == "THROUGHPUT" for c in calibrated.configs)
    # int8 recipe knob: the mixed-precision search on and off
    assert {
        dict(c.recipe).get("mixed_precision")
        for c in calibrated.configs
        if c.runner == "onnxruntime" and c.precision == "int8"
    } == {"auto", "off"}


def test_space_per_device_class() -> None:
    # a target naming its delegate or accelerator is served by its own runner only
    arm = build_space(get_target("arm-xnnpack"), calibrated=True)
    assert {c.runner for c in arm.configs} == {"litert"}
    assert {dict(c.options)["delegate"] for c in arm.configs} == {"xnnpack", "none"}  # XNNPack or builtin kernels
    igpu = build_space(get_target("intel-igpu"), calibrated=True)
    assert {c.runner for c in igpu.configs} == {"openvino"}
    assert igpu.run_options["openvino"]["device"] == ["GPU", "CPU"]  # the target's own preference is kept
    assert {c.precision for c in igpu.configs} <= {"fp32", "fp16", "int8", "bf16"}
    # e2e adds the video pipeline's inference workers
    video = build_space(
        get_target("x86-cpu"), objective="e2e", video=True, runners=["onnxruntime"], precisions=["fp32"], threads=[1]
    )
    assert sorted(c.workers for c in video.configs if dict(c.options)["graph_optimization_level"] == "all") == [1, 2]


def test_space_refuses_what_the_target_cannot_use() -> None:
    x86 = get_target("x86-cpu")
    with pytest.raises(EdgeError, match="do not serve x86-cpu's device class"):
        build_space(x86, runners=["litert"])
    with pytest.raises(EdgeError, match="not tunable for x86-cpu"):
        build_space(x86, precisions=["q4_0"])
    with pytest.raises(EdgeError, match="unknown objective"):
        build_space(x86, objective="fastest")


# -- parity is a hard constraint -----------------------------------------------------------------


def _trial(tid: str, passed: bool | None, score: float) -> dict[str, Any]:
    return {
        "id": tid,
        "parity": {"passed": passed},
        "rungs": {
            "0:3x4": {"rep_scores": [score], "p99_ms": score},
            **({"1:5x40": {"rep_scores": [score], "p99_ms": score}} if tid != "short" else {}),
        },
    }


def test_choose_never_picks_a_trial_that_failed_or_skipped_parity() -> None:
    fast_fail, unverified, ok = _trial("fail", False, 0.1), _trial("unverified", None, 0.2), _trial("ok", True, 5.0)
    assert choose([fast_fail, unverified, ok])["id"] == "ok"
    assert choose([fast_fail, unverified]) is None
    # the deepest rung decides; a budget prefers the trials within it
    assert choose([_trial("short", True, 0.5), ok])["id"] == "ok"
    slow_in = _trial("in", True, 4.0)
    over = _trial("over", True, 3.0)
    over["rungs"]["1:5x40"]["p99_ms"] = 20.0
    assert choose([over, slow_in], budget_ms=10.0)["id"] == "in"
    # throughput: rep scores are negative frames per second
    assert choose([_trial("a", True, -100.0), _trial("b", True, -200.0)], objective="throughput")["id"] == "b"


@pytest.fixture(scope="module")
def outlier_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    d = tmp_path_factory.mktemp("outlier")
    model = build_outlier_model(d / "outlier.onnx")
    result = tune(
        model,
        "x86-cpu",
        ConvertRequest(calib="random", parity_samples=8),
        TuneOptions(out=d / "out", runners=["onnxruntime"], precisions=["fp32", "int8"], threads=[1], schedule=QUICK),
    )
    return d, result


def test_trial_failing_parity_is_reported_never_chosen(outlier_run: tuple[Path, Any]) -> None:
    _, r = outlier_run
    by_recipe: dict[str, list[dict[str, Any]]] = {}
    for t in r.trials:
        by_recipe.setdefault(f"{t['precision']}/{t['recipe'].get('mixed_precision')}", []).append(t)
    # fully quantized, the outlier channel's scale zeroes the others: the gate fails, every runner option alike
    off = by_recipe["int8/off"]
    assert off and all(t["parity"]["passed"] is False and t["status"] == "parity failed" for t in off)
    assert all(t["parity"]["failures"] for t in off)
    assert all(t["result"] is not None for t in off)  # measured (reported in the table) ...
    assert r.winner is not None and r.winner["parity"]["passed"] is True  # ... but never chosen
    assert r.winner["id"] not in {t["id"] for t in off}
    assert r.winner["status"] == "chosen" and sum(t["status"] == "chosen" for t in r.trials) == 1
    # int8 that passes (the mixed-precision search kept the outlier float) is measured and ranked by speed with
    # fp32 at the first rung: the winner is the fastest trial that passed, whichever precision it is (issue #25)
    first = min((k for t in r.trials for k in t["rungs"]), key=lambda k: int(k.partition(":")[0]))
    ranked = ranked_trials(r.trials, first, None, "latency")
    assert {t["precision"] for t in ranked} == {"fp32", "int8"}
    assert all(t["parity"]["passed"] is True for t in ranked) and not {t["id"] for t in off} & {t["id"] for t in ranked}
    data = r.to_json()
    assert set(data["pareto"]) <= {t["id"] for t in r.trials if t["parity"]["passed"] is True}
    assert data["winner"]["id"] == r.winner["id"]
    html = Path(r.html_path).read_text()
    assert "<svg" in html and "failed parity" in html and "<script" not in html
    assert Path(r.png_path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- resume -------------------------------------------------------------------------------------


def test_resume_from_study_skips_finished_trials(tmp_path: Path, models: dict[str, Path]) -> None:
    req = ConvertRequest(parity_samples=4)
    opts = TuneOptions(
        out=tmp_path / "out", runners=["onnxruntime"], precisions=["fp32"], threads=[1], schedule=QUICK, pictures=False
    )
    first = tune(models["tiny"], "x86-cpu", req, opts)
    assert first.converted == 1 and first.measured >= len(first.trials)
    study = Path(first.study_path)
    again = tune(models["tiny"], "x86-cpu", req, opts)
    assert again.converted == 0 and again.measured == 0  # every conversion cached, every measurement in the study
    assert again.winner["id"] == first.winner["id"]
    before = json.loads(study.read_text())
    dropped = sorted(before["trials"])[0]
    edited = {**before, "trials": {k: v for k, v in before["trials"].items() if k != dropped}}
    study.write_text(json.dumps(edited))
    third = tune(models["tiny"], "x86-cpu", req, opts)
    assert third.converted == 0 and third.measured >= 1
    after = json.loads(study.read_text())["trials"]
    assert after[dropped]["rungs"]  # measured again
    for tid, rec in before["trials"].items():
        if tid != dropped:
            for rung, m in rec["rungs"].items():
                assert after[tid]["rungs"][rung] == m  # kept from the study, not measured again
    # a study made for another model (or target, objective, host) is refused, not mixed in
    with pytest.raises(EdgeError, match="was made for model_sha256"):
        tune(models["tiny_dynamic"], "x86-cpu", req, dataclasses.replace(opts, out=tmp_path / "other", study=study))


# -- the overlay -----------------------------------------------------------------------------------


def test_overlay_round_trips_into_convert_and_cli(tmp_path: Path, models: dict[str, Path]) -> None:
    # OpenVINO on x86-cpu: the overlay changes the target's runner, chain and runner options
    r = tune(
        models["tiny"],
        "x86-cpu",
        ConvertRequest(parity_samples=4),
        TuneOptions(
            out=tmp_path / "out", runners=["openvino"], precisions=["fp32"], threads=[1], schedule=QUICK, pictures=False
        ),
    )
    ov = read_overlay(r.overlay_path)
    assert (ov.target, ov.runner, ov.chain, ov.precision) == ("x86-cpu", "openvino", ("onnx->openvino-ir",), "fp32")
    assert ov.run_options["num_threads"] == 1 and ov.run_options["device"] == ["CPU"]
    assert ov.tuned["configuration"] == r.winner["id"] and isinstance(ov.tuned["same_device_class"], bool)
    b = convert(models["tiny"], "x86-cpu", tmp_path / "bundle", ConvertRequest(tuned=r.overlay_path, parity_samples=4))
    assert b.info.runner.name == "openvino" and b.precision == "fp32"
    assert b.info.runner.options_dict["num_threads"] == 1
    assert b.manifest["parity"]["passed"] is True
    p = run_cli(
        "convert",
        str(models["tiny"]),
        "-t",
        "x86-cpu",
        "--tuned",
        r.overlay_path,
        "-o",
        str(tmp_path / "cli-bundle"),
        "--parity-samples",
        "4",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["manifest"]["runner"]["name"] == "openvino" and "openvino fp32" in out["tuned_applied"]
    # an overlay tuned for x86-cpu does not apply to another target; nor does a conflicting --precision
    with pytest.raises(TargetError, match="was tuned for target 'x86-cpu', not 'intel-igpu'"):
        convert(models["tiny"], "intel-igpu", tmp_path / "no", ConvertRequest(tuned=r.overlay_path))
    with pytest.raises(TargetError, match="conflicts with the tuned overlay's precision fp32"):
        convert(models["tiny"], "x86-cpu", tmp_path / "no", ConvertRequest(tuned=r.overlay_path, precision="fp16"))
    assert not (tmp_path / "no").exists()


def test_bad_input_is_one_line(tmp_path: Path, models: dict[str, Path]) -> None:
    tiny = str(models["tiny"])
    assert_user_error(
        run_cli("tune", tiny, "-t", "x86-cpu", "--objective", "fastest", "--out", str(tmp_path / "o")),
        "unknown objective 'fastest'",
    )
    assert_user_error(
        run_cli("tune", tiny, "-t", "x86-cpu", "--objective", "e2e", "--out", str(tmp_path / "o")), "--video"
    )
    assert_user_error(
        run_cli("tune", tiny, "-t", "x86-cpu", "--runner", "litert", "--out", str(tmp_path / "o")),
        "do not serve x86-cpu",
    )
    assert_user_error(
        run_cli("tune", tiny, "-t", "x86-cpu", "--fps", "30", "--budget-ms", "10"), "either --fps or --budget-ms"
    )
    bad_study = tmp_path / "study.json"
    bad_study.write_text(
        '{"study_version": 1, "trials": {"x": {"status": "measured", "rungs": {"0:1x1": {"rep_scores": ["fast"]}}}}}'
    )
    # the header is checked first; a study for this run with a bad record names the field
    p = run_cli("tune", tiny, "-t", "x86-cpu", "--study", str(bad_study), "--out", str(tmp_path / "o"))
    assert_user_error(p, "study file", "was made for")
    # overlays: every problem in one line, never a traceback
    bad = tmp_path / "bad.toml"
    bad.write_text(
        'schema_version = 1\ntarget = "x86-cpu"\nprecision = "fp32"\nrunner = "openvino"\n'
        'chain = ["onnx->openvino-ir"]\nsurprise = 1\n[run.options]\nnum_threads = "many"\n'
        'plugin_library = "/tmp/evil.so"\n[video]\ninfer_workers = 0\n'
    )
    assert_user_error(
        run_cli("convert", tiny, "-t", "x86-cpu", "--tuned", str(bad), "-o", str(tmp_path / "b")),
        "invalid tuned overlay",
        "surprise: unknown key",
        "plugin_library",
        "video.infer_workers: expected an integer from 1 to 64, got 0",
    )
    (tmp_path / "notoml.toml").write_text("target = [")
    assert_user_error(
        run_cli(
            "deploy", tiny, "-t", "x86-cpu", "-d", str(tmp_path / "store"), "--tuned", str(tmp_path / "notoml.toml")
        ),
        "is not valid TOML",
    )
    assert_user_error(
        run_cli("convert", tiny, "-t", "x86-cpu", "--tuned", str(tmp_path / "missing.toml")), "does not exist"
    )
    assert not (tmp_path / "b").exists() and not (tmp_path / "store").exists()


def test_e2e_objective_runs_at_the_target_rate_and_counts_missed_frames(
    tmp_path: Path, models: dict[str, Path]
) -> None:
    import dataclasses

    from edge.bundle.bundle import Bundle
    from edge.video import PipelineOptions, open_source, run_pipeline, write_synthetic_clip

    clip = write_synthetic_clip(tmp_path / "clip.avi", frames=12, width=64, height=48, codec="MJPG")
    req = ConvertRequest(parity_samples=4)
    opts = TuneOptions(
        objective="e2e",
        video=clip,
        runners=["onnxruntime"],
        precisions=["fp32"],
        threads=[1],
        schedule=Schedule(reps=2, iters=6, warmup=1),
        pictures=False,
    )
    r = tune(models["tiny"], "x86-cpu", req, dataclasses.replace(opts, out=tmp_path / "out", fps=30))
    assert {t["workers"] for t in r.trials} == {1, 2}
    assert r.winner is not None
    for t in r.trials:
        if not t["result"]:
            continue
        for name, m in t["rungs"].items():
            # realtime at the target rate: every repetition fed its frames (a short rung at least 30: the whole
            # 12-frame clip) at 30 fps, and says what it missed
            assert m["pace_fps"] == pytest.approx(30.0) and m["rep_frames"] == [min(m["iters"], 12)] * m["reps"]
            assert m["iters"] >= 30 or name == t["result"]["rung"]
            assert len(m["rep_missed"]) == m["reps"] and all(0 <= x <= 12 for x in m["rep_missed"])
            assert all(s > 0 for s in m["rep_scores"])  # the repetition's median frame time (ms)
    assert "frames missed at 30 fps" in r.summary()
    # the video pipeline's inference workers are part of the overlay, and applied by what runs the bundle
    ov = read_overlay(r.overlay_path)
    assert ov.infer_workers == r.winner["workers"] and "inference worker" in ov.describe()
    two = dataclasses.replace(ov, infer_workers=2, path=None)
    b = convert(models["tiny"], "x86-cpu", tmp_path / "b2", ConvertRequest(tuned=two, parity_samples=4))
    assert b.manifest["tuned"]["infer_workers"] == 2 and Bundle.open(b.path).info.tuned.infer_workers == 2
    with open_source(video=str(clip)) as src:
        assert run_pipeline(b, src, PipelineOptions(max_frames=4)).infer_workers == 2  # the bundle's own
    with open_source(video=str(clip)) as src:
        assert run_pipeline(b, src, PipelineOptions(max_frames=4, infer_workers=1)).infer_workers == 1  # asked for
    p = run_cli("run", str(b.path), "--video", str(clip), "--max-frames", "4", "--budget-ms", "1000", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["infer_workers"] == 2
    plain = convert(models["tiny"], "x86-cpu", tmp_path / "plain", ConvertRequest(parity_samples=4))
    with open_source(video=str(clip)) as src:
        assert run_pipeline(plain, src, PipelineOptions(max_frames=4)).infer_workers == 1
    # far above what the pipeline can hold (20000 fps: 50 us a frame, decode to post-processing; at 2000 fps an
    # idle host sometimes kept up) frames are missed and counted; a study made at another rate is refused
    fast = tune(models["tiny"], "x86-cpu", req, dataclasses.replace(opts, out=tmp_path / "fast", fps=20000))
    assert all(t["result"]["missed"] > 0 for t in fast.trials if t["result"])
    with pytest.raises(EdgeError, match="was made for e2e_pace"):
        tune(
            models["tiny"],
            "x86-cpu",
            req,
            dataclasses.replace(opts, out=tmp_path / "fast", study=r.study_path, fps=20000),
        )


def test_e2e_ranks_missed_frames_before_latency() -> None:
    from edge.tune.measure import rank_key

    def e2e(tid: str, p50: float, missed: int) -> dict[str, Any]:
        return {
            "id": tid,
            "parity": {"passed": True},
            "rungs": {"0:2x30": {"rep_scores": [p50, p50], "rep_missed": [missed, missed], "rep_frames": [30, 30]}},
        }

    fast_but_drops, holds = e2e("drops", 5.0, 3), e2e("holds", 12.0, 0)
    assert choose([fast_but_drops, holds], objective="e2e")["id"] == "holds"
    assert choose([fast_but_drops, holds, e2e("holds-faster", 9.0, 0)], objective="e2e")["id"] == "holds-faster"
    assert choose([e2e("a", 5.0, 6), e2e("b", 4.0, 9)], objective="e2e")["id"] == "a"  # fewer missed first
    assert rank_key("latency", holds["rungs"]["0:2x30"]) == (0.0, 12.0)
    with pytest.raises(EdgeError, match="unknown objective"):
        rank_key("fastest", holds["rungs"]["0:2x30"])


def test_successive_halving_rungs_finalists_and_deferred_checks(tmp_path: Path, models: dict[str, Path]) -> None:
    from edge.tune.measure import SHORT_BLOCK, SHORT_REPS
    from edge.tune.report import pareto_front, row

    # short rungs: few repetitions of warm blocks; the finalists: the sweep's samples in short blocks
    # the first of several short rungs: one warm block per trial (FIRST_RUNG)
    assert Schedule().rungs(136) == [
        (1, SHORT_BLOCK),
        (SHORT_REPS, SHORT_BLOCK),
        (SHORT_REPS, 11),
        (SHORT_REPS, 33),
        (20, 10),
    ]
    assert Schedule().rungs(9) == [(SHORT_REPS, 33), (20, 10)]  # a single short rung keeps its repetitions
    assert Schedule().rungs(3) == [(5, 40)] and Schedule().final(halving=False) == (5, 40)
    assert Schedule(reps=2, iters=5).rungs(21, "e2e") == [(2, 30), (2, 30), (2, 5)]  # e2e: at least 30 frames
    r = tune(
        models["tiny"],
        "x86-cpu",
        ConvertRequest(parity_samples=4),
        TuneOptions(
            out=tmp_path / "out",
            runners=["onnxruntime"],
            precisions=["fp32"],
            threads=[1, 2],
            schedule=QUICK,
            pictures=False,
        ),
    )
    n = len(r.trials)
    rungs = QUICK.rungs(n)
    assert n >= 10 and len(rungs) >= 2, (n, rungs)
    first, last = f"0:{rungs[0][0]}x{rungs[0][1]}", f"{len(rungs) - 1}:{rungs[-1][0]}x{rungs[-1][1]}"
    assert all(first in t["rungs"] for t in r.trials)  # every trial measured once
    finalists = [t for t in r.trials if last in t["rungs"]]
    assert len(finalists) == QUICK.eta  # at least eta finalists
    survivors = [t for t in r.trials if len(t["rungs"]) > 1]
    dropped = [t for t in r.trials if t["status"] == f"eliminated at {first}"]
    assert dropped and len(survivors) + len(dropped) == n
    # a trial's own reference check runs once it survives the first rung; one eliminated there shows the gate
    assert all(t["parity"]["trial"]["passed"] is True for t in survivors)
    assert all(t["parity"].get("trial") is None and t["parity"]["passed"] is True for t in dropped)
    assert all(row(t)["parity"] == "pass (gate)" for t in dropped)
    assert {t["id"] for t in pareto_front(r.trials)} <= {t["id"] for t in survivors}
    assert r.winner in finalists and r.winner["parity"]["trial"]["passed"] is True


def test_anchor_relative_ranking_across_chunks() -> None:
    from edge.tune.measure import vs_anchor

    # latency: the median over repetitions of ms over the anchor's ms in the same repetition
    assert vs_anchor("latency", [2.0, 3.0, 9.0], [1.0, 2.0, 3.0]) == 2.0
    assert vs_anchor("throughput", [-50.0, -60.0], [-100.0, -120.0]) == 2.0  # half the anchor's items per second
    with pytest.raises(EdgeError, match="one nonzero score per repetition"):
        vs_anchor("latency", [1.0], [1.0, 2.0])

    def rec(tid: str, p50: float, rel: float | None, anchor: str = "A") -> dict[str, Any]:
        m: dict[str, Any] = {"rep_scores": [p50], "p50_ms": p50, "p99_ms": p50}
        if rel is not None:
            m.update(vs_anchor=rel, anchor={"id": anchor, "p50_ms": p50 / rel})
        return {"id": tid, "parity": {"passed": True}, "rungs": {"0:5x40": m}}

    # b's chunk ran under load: raw it looks slower, against the anchor measured beside it it is faster
    a, b = rec("a", 1.0, 1.0), rec("b", 1.5, 0.9)
    assert choose([a, b])["id"] == "b"
    assert choose([rec("a", 1.0, None), rec("b", 1.5, None)])["id"] == "a"  # one chunk: raw figures
    # records measured against different anchors (or without one) do not compare relatively: raw figures
    assert choose([a, rec("b", 1.5, 0.9, anchor="other")])["id"] == "a"
    assert choose([a, rec("b", 1.5, None)])["id"] == "a"


def test_study_refuses_a_bad_anchor_record(tmp_path: Path) -> None:
    from edge.tune.study import load_study, save_study

    header = {"model_sha256": "x"}
    good = {"status": "measured", "rungs": {"0:2x5": {"rep_scores": [1.0], "vs_anchor": 0.5, "anchor": {"id": "a"}}}}
    path = tmp_path / "study.json"
    save_study(path, header, {"t": good})
    assert load_study(path, header)["t"]["rungs"]["0:2x5"]["vs_anchor"] == 0.5
    for bad in (float("nan"), 0, "1", True):
        save_study(path, header, {"t": {**good, "rungs": {"0:2x5": {**good["rungs"]["0:2x5"], "vs_anchor": bad}}}})
        with pytest.raises(EdgeError, match="vs_anchor must be a finite number > 0"):
            load_study(path, header)


def test_several_chunks_share_an_anchor(
    tmp_path: Path, models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import edge.tune.search

    monkeypatch.setattr(edge.tune.search, "MAX_OPEN", 4)  # 3 trials and the anchor per chunk
    r = tune(
        models["tiny"],
        "x86-cpu",
        ConvertRequest(parity_samples=4),
        TuneOptions(
            out=tmp_path / "sweep",
            runners=["onnxruntime"],
            precisions=["fp32"],
            threads=[1, 2],
            schedule=QUICK,
            pictures=False,
            strategy="exhaustive",
        ),
    )
    n = len(r.trials)
    assert n > 6
    rung = "0:2x5"
    first = r.trials[0]  # the first trial (the space's defaults) is the anchor
    anchored = [t["rungs"][rung] for t in r.trials]
    assert {m["anchor"]["id"] for m in anchored} == {first["id"]} and first["rungs"][rung]["vs_anchor"] == 1.0
    # measured again in every chunk: the anchor figures beside the other chunks' trials are not its own record's
    assert len({tuple(m["anchor"]["rep_scores"]) for m in anchored}) == -(-n // 3)  # one per chunk
    for m in anchored:
        ratios = [t / a for t, a in zip(m["rep_scores"], m["anchor"]["rep_scores"])]
        assert m["vs_anchor"] == pytest.approx(float(np.median(ratios)), rel=1e-3)
    ok = [t for t in r.trials if t["parity"]["passed"] is True]
    assert r.winner["id"] == min(ok, key=lambda t: t["result"]["vs_anchor"])["id"]  # ranked relative to the anchor
    assert r.winner["result"]["p50_ms"] > 0 and r.winner["result"]["anchor"]["id"] == first["id"]  # raw kept too
    assert any("anchor" in note and "raw figures" in note for note in r.to_json()["notes"])
    # successive halving: the first rung (several chunks) has the anchor; the finalists fit one chunk, raw figures
    h = tune(
        models["tiny"],
        "x86-cpu",
        ConvertRequest(parity_samples=4),
        TuneOptions(
            out=tmp_path / "halving",
            runners=["onnxruntime"],
            precisions=["fp32"],
            threads=[1, 2],
            schedule=QUICK,
            pictures=False,
            cache=tmp_path / "sweep" / "cache",
        ),
    )
    rungs = QUICK.rungs(n)
    first_rung, last = f"0:{rungs[0][0]}x{rungs[0][1]}", f"{len(rungs) - 1}:{rungs[-1][0]}x{rungs[-1][1]}"
    assert all("vs_anchor" in t["rungs"][first_rung] for t in h.trials)
    assert all("vs_anchor" not in t["rungs"][last] for t in h.trials if last in t["rungs"])
    assert h.winner["rungs"][last]


def test_max_trials_and_time_budget_bound_the_search(tmp_path: Path, models: dict[str, Path]) -> None:
    req = ConvertRequest(parity_samples=4)
    opts = TuneOptions(runners=["onnxruntime"], precisions=["fp32"], schedule=QUICK, pictures=False)
    capped = tune(models["tiny"], "x86-cpu", req, dataclasses.replace(opts, out=tmp_path / "capped", max_trials=2))
    assert len(capped.trials) == 2 and any("--max-trials 2" in n for n in capped.notes)
    # the defaults (all CPUs, graph level all) come first
    assert dict(capped.trials[0]["options"])["graph_optimization_level"] == "all"
    out_of_time = tune(
        models["tiny"], "x86-cpu", req, dataclasses.replace(opts, out=tmp_path / "late", time_budget_s=1e-6)
    )
    assert out_of_time.winner is None and out_of_time.overlay_path is None
    assert all(t["status"] == "not run (time budget)" for t in out_of_time.trials)
    assert out_of_time.converted == 0


# -- deploy --tune, and the bundle's record of the overlay ----------------------------------------


def test_deploy_tune_is_one_command_and_the_bundle_records_the_overlay(tmp_path: Path, models: dict[str, Path]) -> None:
    from edge.bundle.bundle import Bundle
    from edge.capabilities import cpu_isa
    from edge.deploy import DeviceStore, deploy
    from edge.tune.search import TuneOptions

    opts = TuneOptions(runners=("openvino",), precisions=("fp32",), threads=(1,), schedule=QUICK, pictures=False)
    r = deploy(
        models["tiny"],
        "x86-cpu",
        tmp_path / "dev",
        ConvertRequest(parity_samples=4),
        DeployOptions(build_dir=tmp_path / "b", bench_iterations=5, budget_ms=1000, tune=opts),  # the flow, not a p99
    )
    t = r.tune
    assert (
        t is not None
        and t["summary"].startswith("tune x86-cpu (latency, halving): ")
        and "chosen openvino fp32" in t["summary"]
    )
    assert r.notes[0] == t["summary"]  # the tune table's summary line, then what its overlay applied
    ov = read_overlay(t["overlay"])
    assert Path(t["overlay"]).parent == tmp_path / "b-tune" and r.tuned_applied == ov.describe() == t["applied"]
    assert any(n.startswith("tuned overlay ") and ov.describe() in n for n in r.notes)
    # converted, parity-checked, benchmarked and shipped with the winner's runner and options
    assert r.bundle.info.runner.name == "openvino" and r.bundle.info.runner.options_dict["num_threads"] == 1
    assert r.bundle.manifest["parity"]["passed"] is True and r.benchmark is not None
    assert (
        r.benchmark["runner"]["runtime"].startswith("OpenVINO")
        or "openvino" in r.benchmark["runner"]["runtime"].lower()
    )
    shipped = Bundle.open(tmp_path / "dev" / "bundles" / r.bundle.id)
    assert DeviceStore(tmp_path / "dev").current == r.bundle.id
    rec = shipped.manifest["tuned"]
    isa = cpu_isa()
    assert rec["overlay_sha256"] == ov.content_sha256() and len(rec["overlay_sha256"]) == 64
    assert rec["configuration"] == t["winner"] and rec["objective"] == "latency"
    assert rec["tuned_on"]["cpu"] == isa.model and rec["tuned_on"]["isa"] == sorted(isa.flags)
    assert rec["same_device_class"] is t["device_class"]["same"] and rec["device_class"] == t["device_class"]["reason"]
    tuned_info = shipped.info.tuned  # typed
    assert tuned_info is not None and tuned_info.overlay_sha256 == rec["overlay_sha256"]
    # the benchmark's device-class judgement is a typed field now
    assert shipped.info.benchmark.device_class is not None
    assert shipped.manifest["benchmark"]["device_class"]["same"] is r.budget_gates
    js = r.to_json()
    assert js["tune"]["winner"] == t["winner"] and js["tuned_applied"] == ov.describe()
    # --tuned with the same overlay records the same hash; a bundle converted without one records nothing
    again = convert(models["tiny"], "x86-cpu", tmp_path / "again", ConvertRequest(tuned=t["overlay"], parity_samples=4))
    assert again.manifest["tuned"]["overlay_sha256"] == rec["overlay_sha256"]
    plain = convert(models["tiny"], "x86-cpu", tmp_path / "plain", ConvertRequest(parity_samples=4))
    assert "tuned" not in plain.manifest and plain.info.tuned is None


def test_deploy_tune_refusals(tmp_path: Path, models: dict[str, Path]) -> None:
    from edge.deploy import DeviceStore, deploy
    from edge.tune.search import TuneOptions

    tiny = str(models["tiny"])
    with pytest.raises(EdgeError, match="either --tune .* or --tuned FILE"):
        deploy(tiny, "x86-cpu", tmp_path / "d1", ConvertRequest(tuned=tmp_path / "x.toml"), DeployOptions(tune=True))
    # nothing passed (here: out of time before the first conversion): nothing is converted or shipped
    late = TuneOptions(runners=("onnxruntime",), precisions=("fp32",), threads=(1,), time_budget_s=1e-6, pictures=False)
    with pytest.raises(EdgeError, match="deploy --tune: nothing to deploy: tune x86-cpu .*none chosen"):
        deploy(tiny, "x86-cpu", tmp_path / "d2", options=DeployOptions(build_dir=tmp_path / "b2", tune=late))
    assert not (tmp_path / "b2").exists() and DeviceStore(tmp_path / "d2").current is None
    assert_user_error(
        run_cli("deploy", tiny, "-t", "x86-cpu", "-d", str(tmp_path / "d3"), "--objective", "e2e"),
        "--objective tune(s) the model: give it with --tune",
    )
    assert_user_error(
        run_cli(
            "deploy",
            tiny,
            "-t",
            "x86-cpu",
            "-d",
            str(tmp_path / "d4"),
            "--tune",
            "--objective",
            "e2e",
            "--build-dir",
            str(tmp_path / "b4"),
        ),
        "--video",
    )
    # the CLI: one command, the tune's summary and the overlay applied in --json; the deploy's --parity-data and
    # --task gate every trial of the tune as they gate the deploy's own conversion
    import numpy as np

    from edge.bundle.bundle import Bundle

    pd = tmp_path / "parity-data"
    pd.mkdir()
    for i in range(4):
        np.save(pd / f"{i}.npy", np.random.default_rng(i).random((1, 3, 32, 32), dtype=np.float32))
    p = run_cli(
        "deploy",
        tiny,
        "-t",
        "x86-cpu",
        "-d",
        str(tmp_path / "d5"),
        "--build-dir",
        str(tmp_path / "b5"),
        "--tune",
        "--max-trials",
        "2",
        "-n",
        "5",
        "--budget-ms",
        "1000",  # what is checked is the tune's flow, not a loaded host's p99
        "--parity-data",
        str(pd),
        "--task",
        "none",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["tune"]["summary"].startswith("tune x86-cpu (latency, halving): 2 configurations")
    assert out["notes"][0] == out["tune"]["summary"] and out["tuned_applied"] == out["tune"]["applied"]
    assert DeviceStore(tmp_path / "d5").current == out["bundle_id"]
    trials = json.loads(Path(out["tune"]["study"]).read_text())["trials"]
    gated = [Bundle.open(t["bundle"], trust=False).manifest["parity"] for t in trials.values()]
    assert len(gated) == 2 and gated[0]["passed"] is True
    for par in [*gated, out["parity"]]:
        assert par["task"] == "none" and par["samples"] == 4
        assert par["input_provenance"]["kind"] == "parity-data" and par["input_provenance"]["source"] == str(pd)


def test_overlay_manifest_record_keeps_only_valid_values() -> None:
    from edge.base.typedjson import read
    from edge.bundle.schema import TunedEvidence
    from edge.pipeline.overlay import TunedOverlay

    base = dict(
        target="x86-cpu",
        precision="fp32",
        runner="onnxruntime",
        chain=("onnx->onnx",),
        convert_options={"onnx->onnx": {}},
        run_options={"intra_op_num_threads": 1},
    )
    bare = TunedOverlay(**base).manifest_record()
    assert set(bare) == {"overlay_sha256"}
    hostile = TunedOverlay(
        **base,
        tuned={
            "objective": "fastest",
            "configuration": "x" * 600,
            "cpu": "evil\x1b[2J",
            "measured_on": "linux/x86_64",
            "isa": ["avx2", "../../etc"],
            "cpus": 0,
            "same_device_class": "yes",
            "device_class": "different device class: ...",
        },
    )
    rec = hostile.manifest_record()
    read(TunedEvidence, rec)  # what is recorded passes the manifest's rules
    assert set(rec) == {"overlay_sha256", "device_class"}  # the rest is left out, never carried
    assert rec["overlay_sha256"] != bare["overlay_sha256"]  # the [tuned] table is part of the content
    # the hash is of the content: the same overlay read back from its TOML has the same hash
    from edge.pipeline.overlay import overlay_from_dict, overlay_toml

    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover
        import tomli as tomllib  # type: ignore[no-redef]
    good = TunedOverlay(
        **base,
        tuned={
            "objective": "latency",
            "configuration": "onnxruntime/fp32",
            "measured_on": "linux/x86_64",
            "cpu": "AMD EPYC",
            "isa": ["avx2"],
            "cpus": 2,
            "same_device_class": True,
            "device_class": "same device class: ...",
        },
    )
    back = overlay_from_dict(tomllib.loads(overlay_toml(good)))
    assert back.content_sha256() == good.content_sha256()
    assert back.manifest_record()["tuned_on"] == {
        "os": "linux",
        "arch": "x86_64",
        "cpu": "AMD EPYC",
        "isa": ["avx2"],
        "cpus": 2,
    }


# -- onnxruntime execution mode, inter-op threads and spinning --------------------------------------


def test_onnxruntime_execution_mode_and_spinning_run_and_are_recorded(tmp_path: Path, models: dict[str, Path]) -> None:
    import numpy as np

    from edge.backends.onnxruntime.run import OnnxRuntimeRunner
    from edge.base.typedjson import Invalid
    from edge.bench import bundle_feeds
    from edge.bundle.schema import RunnerSpec, check_runner

    b = convert(models["tiny"], "x86-cpu", tmp_path / "b", ConvertRequest(parity_samples=4))
    feeds, _ = bundle_feeds(b)
    with b.open_runner() as r:
        want = r.infer(feeds)
        d = r.info.details
        # spin-wait off where the CPUs are shared, onnxruntime's own (on) where not (edge.backends.threads, #25)
        shared = d["threads_policy"]["shared"]
        assert (d["execution_mode"], d["inter_op_num_threads"], d["allow_spinning"]) == ("sequential", None, not shared)
    opts = {"execution_mode": "parallel", "inter_op_num_threads": 2, "allow_spinning": False}
    with b.open_runner(opts) as r:
        got = r.infer(feeds)
        d = r.info.details
        assert (d["execution_mode"], d["inter_op_num_threads"], d["allow_spinning"]) == ("parallel", 2, False)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
    check_runner(RunnerSpec("onnxruntime", opts))
    # what cannot mean anything is refused, by the runner and by the manifest's option rules alike
    # read through OnnxRuntimeOptions (its invalid() rule, the words the manifest check uses too)
    with pytest.raises(EdgeError, match='option inter_op_num_threads applies only with execution_mode "parallel"'):
        OnnxRuntimeRunner(b.path / b.info.primary_artifact, options={"inter_op_num_threads": 2})
    with pytest.raises(EdgeError, match='option execution_mode must be one of "sequential", "parallel", got "fast"'):
        OnnxRuntimeRunner(b.path / b.info.primary_artifact, options={"execution_mode": "fast"})
    with pytest.raises(Invalid, match="applies only with execution_mode"):
        check_runner(RunnerSpec("onnxruntime", {"inter_op_num_threads": 2}))
    with pytest.raises(Invalid, match="allow_spinning"):
        check_runner(RunnerSpec("onnxruntime", {"allow_spinning": "yes"}))
    with pytest.raises(Invalid, match="execution_mode"):
        check_runner(RunnerSpec("onnxruntime", {"execution_mode": "ORT_PARALLEL"}))


def test_onnxruntime_space_prunes_mode_and_spinning() -> None:
    space = build_space(get_target("x86-cpu"), runners=["onnxruntime"], precisions=["fp32"], threads=[1, 2])
    cpus = usable_cpus()
    opts = [dict(c.options) for c in space.configs]
    assert opts[0] == {
        "intra_op_num_threads": min(2, cpus),
        "graph_optimization_level": "all",
        "execution_mode": "sequential",
        "inter_op_num_threads": 0,
        "allow_spinning": True,
    }  # defaults first
    for o in opts:
        assert not (o["execution_mode"] == "parallel" and o["intra_op_num_threads"] == 1)
        assert o["inter_op_num_threads"] == 0 or o["execution_mode"] == "parallel"
        assert o["inter_op_num_threads"] <= cpus
        if o["intra_op_num_threads"] == 1:
            assert o["allow_spinning"] is True and o["execution_mode"] == "sequential"
    pruned = "\n".join(space.pruned)
    assert "execution_mode=parallel with intra_op_num_threads=1" in pruned
    assert "inter_op_num_threads with execution_mode=sequential" in pruned
    assert "allow_spinning=false with one thread, sequential" in pruned
    if cpus >= 2:  # the multi-threaded configurations try both modes and spinning
        multi = [o for o in opts if o["intra_op_num_threads"] == 2]
        assert {(o["execution_mode"], o["allow_spinning"]) for o in multi} == {
            ("sequential", True),
            ("sequential", False),
            ("parallel", True),
            ("parallel", False),
        }
    assert len({c.id for c in space.configs}) == len(space.configs)
    # every configuration's options pass the manifest's rules (what an overlay of it would carry)
    from edge.bundle.schema import RunnerSpec, check_runner

    for c in space.configs:
        check_runner(RunnerSpec("onnxruntime", {**space.run_options["onnxruntime"], **dict(c.options)}))
