"""``edge.tune`` / ``edgekit tune``: the space pruned per target, parity as a hard constraint, resume from a study,
the overlay round trip into convert, one-line refusals. Real conversions and runtimes on tiny models; structure
and constraints are asserted, never timings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edge.errors import EdgeError, TargetError
from edge.pipeline import convert
from edge.targets import get_target
from edge.tune import Schedule, choose, tune
from edge.tune_space import THREADS, build_space, usable_cpus
from edge.tuned import read_overlay
from tests.conftest import assert_user_error, run_cli
from tests.test_cli_errors import build_outlier_model

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
    assert bf16 and all(c.runner == "openvino" and dict(c.options)["inference_precision"] == "bf16"
                        and c.bundle_precision == "fp32" for c in bf16)
    assert {c.precision for c in calibrated.configs} >= {"fp32", "int8"}
    assert any(dict(c.options).get("performance_hint") == "THROUGHPUT" for c in calibrated.configs)
    # int8 recipe knob: the mixed-precision search on and off
    assert {dict(c.recipe).get("mixed_precision") for c in calibrated.configs
            if c.runner == "onnxruntime" and c.precision == "int8"} == {"auto", "off"}


def test_space_per_device_class() -> None:
    # a target naming its delegate or accelerator is served by its own runner only
    arm = build_space(get_target("arm-xnnpack"), calibrated=True)
    assert {c.runner for c in arm.configs} == {"litert"}
    igpu = build_space(get_target("intel-igpu"), calibrated=True)
    assert {c.runner for c in igpu.configs} == {"openvino"}
    assert igpu.run_options["openvino"]["device"] == ["GPU", "CPU"]  # the target's own preference is kept
    assert {c.precision for c in igpu.configs} <= {"fp32", "fp16", "int8", "bf16"}
    # e2e adds the video pipeline's inference workers
    video = build_space(get_target("x86-cpu"), objective="e2e", video=True, runners=["onnxruntime"],
                        precisions=["fp32"], threads=[1])
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
    return {"id": tid, "parity": {"passed": passed},
            "rungs": {"0:3x4": {"rep_scores": [score], "p99_ms": score}, **(
                {"1:5x40": {"rep_scores": [score], "p99_ms": score}} if tid != "short" else {})}}


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
    result = tune(model, "x86-cpu", out=d / "out", calib="random", runners=["onnxruntime"],
                  precisions=["fp32", "int8"], threads=[1], schedule=QUICK, parity_samples=8)
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
    data = r.to_json()
    assert set(data["pareto"]) <= {t["id"] for t in r.trials if t["parity"]["passed"] is True}
    assert data["winner"]["id"] == r.winner["id"]
    html = Path(r.html_path).read_text()
    assert "<svg" in html and "failed parity" in html and "<script" not in html
    assert Path(r.png_path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- resume -------------------------------------------------------------------------------------

def test_resume_from_study_skips_finished_trials(tmp_path: Path, models: dict[str, Path]) -> None:
    kw: dict[str, Any] = dict(out=tmp_path / "out", runners=["onnxruntime"], precisions=["fp32"], threads=[1],
                              schedule=QUICK, parity_samples=4, pictures=False)
    first = tune(models["tiny"], "x86-cpu", **kw)
    assert first.converted == 1 and first.measured >= len(first.trials)
    study = Path(first.study_path)
    again = tune(models["tiny"], "x86-cpu", **kw)
    assert again.converted == 0 and again.measured == 0  # every conversion cached, every measurement in the study
    assert again.winner["id"] == first.winner["id"]
    before = json.loads(study.read_text())
    dropped = sorted(before["trials"])[0]
    edited = {**before, "trials": {k: v for k, v in before["trials"].items() if k != dropped}}
    study.write_text(json.dumps(edited))
    third = tune(models["tiny"], "x86-cpu", **kw)
    assert third.converted == 0 and third.measured >= 1
    after = json.loads(study.read_text())["trials"]
    assert after[dropped]["rungs"]  # measured again
    for tid, rec in before["trials"].items():
        if tid != dropped:
            for rung, m in rec["rungs"].items():
                assert after[tid]["rungs"][rung] == m  # kept from the study, not measured again
    # a study made for another model (or target, objective, host) is refused, not mixed in
    with pytest.raises(EdgeError, match="was made for model_sha256"):
        tune(models["tiny_dynamic"], "x86-cpu", **{**kw, "out": tmp_path / "other"}, study=study)


# -- the overlay -----------------------------------------------------------------------------------

def test_overlay_round_trips_into_convert_and_cli(tmp_path: Path, models: dict[str, Path]) -> None:
    # OpenVINO on x86-cpu: the overlay changes the target's runner, chain and runner options
    r = tune(models["tiny"], "x86-cpu", out=tmp_path / "out", runners=["openvino"], precisions=["fp32"],
             threads=[1], schedule=QUICK, parity_samples=4, pictures=False)
    ov = read_overlay(r.overlay_path)
    assert (ov.target, ov.runner, ov.chain, ov.precision) == ("x86-cpu", "openvino", ("onnx->openvino-ir",), "fp32")
    assert ov.run_options["num_threads"] == 1 and ov.run_options["device"] == ["CPU"]
    assert ov.tuned["configuration"] == r.winner["id"] and isinstance(ov.tuned["same_device_class"], bool)
    b = convert(models["tiny"], "x86-cpu", tmp_path / "bundle", tuned=r.overlay_path, parity_samples=4)
    assert b.info.runner.name == "openvino" and b.precision == "fp32"
    assert b.info.runner.options_dict["num_threads"] == 1
    assert b.manifest["parity"]["passed"] is True
    p = run_cli("convert", str(models["tiny"]), "-t", "x86-cpu", "--tuned", r.overlay_path, "-o",
                str(tmp_path / "cli-bundle"), "--parity-samples", "4", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["manifest"]["runner"]["name"] == "openvino" and "openvino fp32" in out["tuned_applied"]
    # an overlay tuned for x86-cpu does not apply to another target; nor does a conflicting --precision
    with pytest.raises(TargetError, match="was tuned for target 'x86-cpu', not 'intel-igpu'"):
        convert(models["tiny"], "intel-igpu", tmp_path / "no", tuned=r.overlay_path)
    with pytest.raises(TargetError, match="conflicts with the tuned overlay's precision fp32"):
        convert(models["tiny"], "x86-cpu", tmp_path / "no", tuned=r.overlay_path, precision="fp16")
    assert not (tmp_path / "no").exists()


def test_bad_input_is_one_line(tmp_path: Path, models: dict[str, Path]) -> None:
    tiny = str(models["tiny"])
    assert_user_error(run_cli("tune", tiny, "-t", "x86-cpu", "--objective", "fastest", "--out", str(tmp_path / "o")),
                      "unknown objective 'fastest'")
    assert_user_error(run_cli("tune", tiny, "-t", "x86-cpu", "--objective", "e2e", "--out", str(tmp_path / "o")),
                      "--video")
    assert_user_error(run_cli("tune", tiny, "-t", "x86-cpu", "--runner", "litert", "--out", str(tmp_path / "o")),
                      "do not serve x86-cpu")
    assert_user_error(run_cli("tune", tiny, "-t", "x86-cpu", "--fps", "30", "--budget-ms", "10"),
                      "either --fps or --budget-ms")
    bad_study = tmp_path / "study.json"
    bad_study.write_text('{"study_version": 1, "trials": {"x": {"status": "measured", "rungs": {"0:1x1": '
                         '{"rep_scores": ["fast"]}}}}}')
    # the header is checked first; a study for this run with a bad record names the field
    p = run_cli("tune", tiny, "-t", "x86-cpu", "--study", str(bad_study), "--out", str(tmp_path / "o"))
    assert_user_error(p, "study file", "was made for")
    # overlays: every problem in one line, never a traceback
    bad = tmp_path / "bad.toml"
    bad.write_text('schema_version = 1\ntarget = "x86-cpu"\nprecision = "fp32"\nrunner = "openvino"\n'
                   'chain = ["onnx->openvino-ir"]\nsurprise = 1\n[run.options]\nnum_threads = "many"\n'
                   'plugin_library = "/tmp/evil.so"\n')
    assert_user_error(run_cli("convert", tiny, "-t", "x86-cpu", "--tuned", str(bad), "-o", str(tmp_path / "b")),
                      "invalid tuned overlay", "surprise: unknown key", "plugin_library")
    (tmp_path / "notoml.toml").write_text("target = [")
    assert_user_error(run_cli("deploy", tiny, "-t", "x86-cpu", "-d", str(tmp_path / "store"), "--tuned",
                              str(tmp_path / "notoml.toml")), "is not valid TOML")
    assert_user_error(run_cli("convert", tiny, "-t", "x86-cpu", "--tuned", str(tmp_path / "missing.toml")),
                      "does not exist")
    assert not (tmp_path / "b").exists() and not (tmp_path / "store").exists()


def test_e2e_objective_over_a_video(tmp_path: Path, models: dict[str, Path]) -> None:
    from edge.video import write_synthetic_clip

    clip = write_synthetic_clip(tmp_path / "clip.avi", frames=12, width=64, height=48, codec="MJPG")
    r = tune(models["tiny"], "x86-cpu", out=tmp_path / "out", objective="e2e", video=clip, runners=["onnxruntime"],
             precisions=["fp32"], threads=[1], schedule=Schedule(reps=2, iters=6, warmup=1), parity_samples=4,
             pictures=False)
    assert {t["workers"] for t in r.trials} == {1, 2}
    assert r.winner is not None and r.winner["result"]["fps"] > 0
    # e2e scores are the pipeline's frame rate (negative: lower is better), one per repetition
    assert all(s < 0 for t in r.trials if t["result"] for s in t["rungs"][t["result"]["rung"]]["rep_scores"])


def test_max_trials_and_time_budget_bound_the_search(tmp_path: Path, models: dict[str, Path]) -> None:
    kw: dict[str, Any] = dict(runners=["onnxruntime"], precisions=["fp32"], schedule=QUICK, parity_samples=4,
                              pictures=False)
    capped = tune(models["tiny"], "x86-cpu", out=tmp_path / "capped", max_trials=2, **kw)
    assert len(capped.trials) == 2 and any("--max-trials 2" in n for n in capped.notes)
    # the defaults (all CPUs, graph level all) come first
    assert dict(capped.trials[0]["options"])["graph_optimization_level"] == "all"
    out_of_time = tune(models["tiny"], "x86-cpu", out=tmp_path / "late", time_budget_s=1e-6, **kw)
    assert out_of_time.winner is None and out_of_time.overlay_path is None
    assert all(t["status"] == "not run (time budget)" for t in out_of_time.trials)
    assert out_of_time.converted == 0
