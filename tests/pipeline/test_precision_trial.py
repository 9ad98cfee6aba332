"""Precision by evidence on CPUs (issue #25 item 2): OpenVINO computes in bf16 only where the bundle's parity
in bf16 passed where it was built. The decision is tested on every host; the bf16 path only where the CPU
plugin lists BF16 (CI may be AVX2-only: those skip with a "hardware:" reason). Nothing here times anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge.backends.openvino.format import ov_core
from edge.backends.openvino.run import OpenVINORunner, fast_cpu_precision, optimization_capabilities
from edge.bundle.bundle import Bundle
from edge.capabilities import cpu_isa, parse_cpuinfo
from edge.pipeline import convert
from edge.pipeline.precision_trial import skip_xnnpack_fp16, trial_wanted, try_fast_precision, xnnpack_fp16_skip
from edge.pipeline.request import ConvertRequest
from edge.verify.refpairs import check_reference_pairs

CAPS = optimization_capabilities(ov_core(), "CPU")
NEEDS_BF16 = pytest.mark.skipif(
    "BF16" not in CAPS,
    reason="hardware: this CPU's OpenVINO plugin does not list "
    f"BF16 in OPTIMIZATION_CAPABILITIES ({', '.join(CAPS) or 'none'})",
)


def test_fast_precision_follows_the_plugin_s_capabilities() -> None:
    assert fast_cpu_precision(["BF16", "WINOGRAD", "FP32", "INT8"]) == "bf16"
    assert fast_cpu_precision(["FP32", "FP16", "INT8", "BIN"]) == "f32"  # an AVX2-only or FP16-only CPU
    assert fast_cpu_precision([]) == "f32"


@pytest.mark.parametrize(
    ("runner", "options", "precision", "passed", "why"),
    [
        ("openvino", {}, "fp32", True, None),
        ("openvino", {"inference_precision": "bundle"}, "fp16", True, None),
        ("openvino", {"inference_precision": "f32"}, "fp32", True, "set explicitly"),  # a profile or tuned overlay
        ("openvino", {"inference_precision": "bf16"}, "fp32", True, "set explicitly"),
        ("openvino", {}, "int8", True, "device's default"),
        ("openvino", {}, "fp32", False, "did not pass"),
        ("openvino", {}, "fp32", None, "did not pass"),
        ("onnxruntime", {}, "fp32", True, "no fast CPU precision"),
    ],
)
def test_when_the_bf16_trial_runs(
    runner: str, options: dict, precision: str, passed: bool | None, why: str | None
) -> None:
    got = trial_wanted(runner, options, precision, passed)
    assert (got is None) if why is None else (got is not None and why in got)


def test_fast_option_reads_back_what_the_cpu_can(models: dict[str, Path]) -> None:
    """Any host: "fast" compiles to bf16 where the plugin lists BF16 and to f32 elsewhere, as read back."""
    with OpenVINORunner(models["tiny"], options={"inference_precision": "fast"}) as r:
        hint = r._compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        assert hint == r.info.precision_used == fast_cpu_precision(CAPS)
        assert r.info.details["fast_precision"]["capabilities"] == CAPS


def test_convert_records_the_trial_only_where_bf16_exists(models: dict[str, Path], tmp_path: Path) -> None:
    b = convert(models["tiny"], "intel-igpu", tmp_path / "b", ConvertRequest(precision="fp32", parity_samples=8))
    trials = b.manifest["parity"].get("precision_trials", [])
    option = b.info.runner.options_dict.get("inference_precision")
    if "BF16" not in CAPS:  # no evidence, no bf16: the bundle stays f32 on every CPU
        assert trials == [] and option == "bundle"
        return
    assert [t["compute"] for t in trials] == ["bf16"] and trials[0]["candidate"]["precision_used"] == "bf16"
    assert option == ("fast" if trials[0]["passed"] else "bundle")


@NEEDS_BF16
def test_bf16_that_passes_is_used_and_rechecked_by_the_reference_pairs(models: dict[str, Path], tmp_path: Path) -> None:
    b = convert(models["tiny"], "intel-igpu", tmp_path / "b", ConvertRequest(precision="fp32", parity_samples=8))
    assert b.manifest["parity"]["precision_trials"][0]["passed"] is True
    assert b.info.runner.options_dict["inference_precision"] == "fast"
    with b.open_runner() as r:
        assert r._compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name() == "bf16"
        check = check_reference_pairs(b, r)
    assert check["passed"] is True and check["runner"]["precision_used"] == "bf16"
    # the device's check is judged at the bf16 limits: not the fp32 ones
    assert check["thresholds"]["min_cosine"] == pytest.approx(0.995)


@NEEDS_BF16
def test_bf16_that_fails_parity_keeps_f32(models: dict[str, Path], tmp_path: Path) -> None:
    """A reference the bf16 outputs cannot meet (shifted at ~12 dB SNR, under bf16's 18 dB): the trial is
    recorded as failed and the runner options stay "bundle" (f32 on every CPU)."""
    b = convert(models["tiny"], "intel-igpu", tmp_path / "b", ConvertRequest(precision="fp32", parity_samples=8))
    manifest = {
        **b.manifest,
        "runner": {"name": "openvino", "options": {"device": ["CPU"]}},
        "parity": {**b.manifest["parity"], "precision_trials": []},
    }
    rng = np.random.default_rng(0)
    with OpenVINORunner(b.artifact, options={"inference_precision": "f32"}) as r:
        inputs = [{t.name: rng.random(t.shape, dtype=np.float32) for t in r.inputs} for _ in range(4)]
        ref = [r.infer(x) for x in inputs]
    off = [
        {k: v + 0.25 * np.abs(v).mean() * rng.standard_normal(v.shape).astype(np.float32) for k, v in o.items()}
        for o in ref
    ]
    said: list[str] = []
    trial = try_fast_precision(
        "fp32", b.path, manifest, inputs, off, label="test", reference_label="shifted", parity_opts={}, say=said.append
    )
    assert trial is not None and trial["passed"] is False and trial["failures"]
    assert "inference_precision" not in manifest["runner"]["options"]
    assert manifest["parity"]["precision_trials"] == [trial] and any("stays f32" in s for s in said)
    assert Bundle(b.path, manifest).info.parity is not None  # the manifest schema takes what was recorded


EPYC_F16C = parse_cpuinfo("model name\t: AMD EPYC 9R14\nflags\t\t: f16c avx2 avx512f avx512_vnni avx512_bf16\n")
SPR_FP16 = parse_cpuinfo("model name\t: Intel Xeon\nflags\t\t: f16c avx2 avx512f avx512_fp16 amx_fp16\n")
PI5 = parse_cpuinfo(
    "processor\t: 0\nFeatures\t: fp asimd fphp asimdhp asimddp\nCPU implementer\t: 0x41\nCPU part\t: 0xd0b\n"
)


def test_xnnpack_fp16_trial_is_skipped_with_the_cpu_s_reason() -> None:
    """fp16 compute only where the CPU has fp16 arithmetic; the reason says which CPU and what it lacks."""
    assert xnnpack_fp16_skip("openvino", "fp32", EPYC_F16C) is None  # not a LiteRT bundle
    assert xnnpack_fp16_skip("litert", "int8", EPYC_F16C) is None  # int8 computes in int8
    no_fp16 = xnnpack_fp16_skip("litert", "fp32", EPYC_F16C)
    assert no_fp16 is not None and "no fp16 arithmetic" in no_fp16 and "AMD EPYC 9R14" in no_fp16
    for isa in (SPR_FP16, PI5):  # fp16 arithmetic: the runner's API is what stops it, and it says so
        why = xnnpack_fp16_skip("litert", "fp16", isa)
        assert why is not None and "has fp16 arithmetic" in why and "CompiledModel" in why
    assert "not readable" in (xnnpack_fp16_skip("litert", "fp32", parse_cpuinfo("")) or "")


def test_the_skip_is_recorded_in_the_manifest() -> None:
    said: list[str] = []
    manifest = {"runner": {"name": "litert"}, "parity": {"passed": True}}
    why = skip_xnnpack_fp16("fp32", manifest, said.append, EPYC_F16C)
    assert manifest["parity"]["precision_trials_skipped"] == [{"compute": "fp16", "runner": "litert", "reason": why}]
    assert said == [f"fp16 trial not run: {why}"]
    untouched = {"runner": {"name": "onnxruntime"}, "parity": {"passed": True}}
    assert (
        skip_xnnpack_fp16("fp32", untouched, said.append, EPYC_F16C) is None
        and "precision_trials_skipped" not in untouched["parity"]
    )
    assert cpu_isa().native_fp16 in (True, False)  # this host's answer is read, whatever it is


def _figures(name: str, cosine: float, worst: float, snr_min: float) -> Any:
    from edge.bundle.evidence import OutputFigures

    return OutputFigures(
        name, 0.05, 0.004, cosine, worst, None, True, snr_db=snr_min + 6, snr_db_min=snr_min, ref_min=0.0, ref_max=1.0
    )


def test_a_device_computing_in_the_trials_precision_is_judged_beside_the_trial() -> None:
    """U^2-Net-p (rembg) for intel-igpu: parity passed in f32 (worst sample cosine 0.99977) and its bf16 trial at mean
    cosine 0.9972 over 32 samples (worst 0.9839), so the bundle computes in bf16 here. Its 2 stored pairs (8 MiB cap)
    measure 0.9949 in bf16, and the device's check judged them at bf16's 0.995 beside the f32 run's worst sample, which
    loosens nothing: the bundle refused itself on the host that built it. Beside the bf16 trial's worst it passes;
    a device computing in f32 is still judged beside the f32 run."""
    from types import SimpleNamespace

    from edge.bundle.evidence import PrecisionTrial, RunnerInfo
    from edge.verify.parity import output_failures, thresholds_for
    from edge.verify.refpairs import _built_outputs, pair_limits

    f32 = _figures("mask", 0.99996, 0.99977, 34.0)
    bf16 = _figures("mask", 0.99728, 0.98387, 16.5)
    runner = RunnerInfo(runtime="openvino 2026.4.1", device_requested="GPU", device_used="CPU", precision_used="bf16")
    trial = PrecisionTrial("bf16", True, thresholds_for("fp16", "bf16"), runner, (bf16,))
    bundle = SimpleNamespace(
        info=SimpleNamespace(
            parity=SimpleNamespace(
                outputs=(f32,),
                samples=32,
                kind="vision",
                passed=True,
                accepted_failure=False,
                precision_trials=(trial,),
            )
        )
    )
    on_pairs = _figures("mask", 0.994927, 0.990955, 20.0)  # what the device measured on the 2 pairs, in bf16
    th = thresholds_for("fp16", "bf16")
    built, n, passed = _built_outputs(bundle, "bf16")
    limits, notes = pair_limits(on_pairs, th, built["mask"], 2, n, passed)
    assert built["mask"] is bf16 and not output_failures(on_pairs, limits), (limits, notes)
    assert "0.983870" in " ".join(notes)  # the trial's worst sample, named
    assert _built_outputs(bundle, "f32")[0]["mask"] is f32  # f32 on this device: the f32 run's figures
    limits, _ = pair_limits(on_pairs, th, f32, 2, 32, True)  # what the check did before: nothing loosened
    assert limits.min_cosine == th.min_cosine and output_failures(on_pairs, limits)
