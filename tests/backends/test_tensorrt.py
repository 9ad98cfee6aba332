"""Jetson Orin / TensorRT: host-side preparation, engine-cache keys, CPU fallback labelling, deploy.

The on-device build (TensorRT + NVIDIA GPU) runs in the tests marked ``hardware``; they skip
here with what is missing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from edge.agent.tegrastats import parse_nvpmodel, parse_nvpmodel_conf, parse_tegrastats, read_nvpmodel
from edge.backends.converter import CONVERTERS, ConversionRequest
from edge.backends.onnxruntime.run import OnnxRuntimeRunner
from edge.backends.runner import RUNNERS
from edge.backends.tensorrt.convert import (
    BUILD_FILE,
    OnnxToTensorRTPlan,
    check_symmetric_qdq,
    compatibility_report,
    fold_graph,
)
from edge.backends.tensorrt.run import (
    FALLBACK_LABEL,
    TensorRTRunner,
    cache_decision,
    default_cache_dir,
    engine_key,
    engine_path,
    key_changes,
    missing_here,
    store_engine,
)
from edge.bench import BenchOptions, run_benchmark
from edge.bundle.bundle import Bundle
from edge.errors import ConversionError, HardwareUnavailableError, MissingDependencyError
from edge.graph.model import io_spec, load_onnx
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest
from edge.verify.parity import reference_outputs
from tests.support.cli import run_cli

TRT_MISSING = missing_here()
needs_trt = pytest.mark.skipif(
    bool(TRT_MISSING), reason="hardware: no NVIDIA GPU/TensorRT: TensorRT engine build needs: " + "; ".join(TRT_MISSING)
)


def test_registered() -> None:
    assert CONVERTERS.get("onnx->tensorrt-plan") is OnnxToTensorRTPlan
    assert RUNNERS.get("tensorrt") is TensorRTRunner


@pytest.fixture(scope="module")
def fp16_bundle(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return convert(models["tiny"], "jetson-orin", tmp_path_factory.mktemp("trt") / "b16")


@pytest.fixture(scope="module")
def int8_bundle(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return convert(
        models["tiny"],
        "jetson-orin",
        tmp_path_factory.mktemp("trt") / "b8",
        ConvertRequest(precision="int8", calib="random"),
    )


def test_fp16_bundle_is_fp32_onnx_plus_build_settings(fp16_bundle: Bundle) -> None:
    m = fp16_bundle.manifest
    assert m["format"] == "onnx" and {a["path"] for a in m["artifacts"]} == {"model.onnx", BUILD_FILE, "reference.npz"}
    build = json.loads((fp16_bundle.path / BUILD_FILE).read_text())
    assert build["precision"] == "fp16" and build["flags"] == ["FP16"] and build["workspace_mb"] == 1024
    assert build["dla_core"] == -1 and build["inputs"][0]["shape"] == [1, 3, 32, 32]
    model = load_onnx(fp16_bundle.artifact)
    # TensorRT makes the fp16 kernels itself: the ONNX stays fp32 (no Cast nodes, fp32 weights)
    assert all(i.data_type == 1 for i in model.graph.initializer)
    assert "Cast" not in {n.op_type for n in model.graph.node}
    details = m["chain"][0]["details"]
    assert details["simplify"]["nodes_after"] <= details["simplify"]["nodes_before"]
    compat = details["tensorrt_compat"]
    assert compat["unsupported_ops"] == [] and compat["dynamic_inputs"] == {} and compat["ops"]["Conv"] == 3
    if compat.get("polygraphy"):
        assert compat["lint"]["ran"] and compat["lint"]["failing_nodes"] == []
    # no engine on the host: parity ran onnxruntime on the prepared ONNX (what TensorRT builds from), named
    # as a host proxy computing fp32; the engine itself is checked on the device against the reference pairs
    par = m["parity"]
    assert par["passed"] is True and par["candidate"]["runtime"].startswith("onnxruntime")
    assert par["candidate"]["precision_used"] == "f32" and par["thresholds"]["min_cosine"] == 0.999
    assert any(n.startswith("host proxy: TensorRT is not on this host") for n in par["host_notes"])
    assert not list(fp16_bundle.path.glob("*.engine"))


def test_int8_is_symmetric_qdq_without_quantized_bias(int8_bundle: Bundle) -> None:
    check = check_symmetric_qdq(int8_bundle.artifact)
    assert check["qdq_nodes"] > 0 and check["asymmetric"] == [] and check["quantized_biases"] == []
    model = load_onnx(int8_bundle.artifact)
    assert not any(i.data_type == 6 for i in model.graph.initializer)  # no int32 biases
    q = int8_bundle.manifest["chain"][0]["details"]["quantization"]
    assert q["extra_options"] == {"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False}
    assert int8_bundle.manifest["calibration"] is not None
    build = json.loads((int8_bundle.path / BUILD_FILE).read_text())
    assert build["flags"] == ["INT8", "FP16"] and build["explicit_quantization"] is True


def test_unsupported_ops_are_reported_and_refused(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Unique", ["x"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n"])],
    )
    path = tmp_path / "u.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    rep = compatibility_report(path, lint=False)
    assert rep["unsupported_ops"] == ["Unique"] and rep["ops"] == {"Relu": 1, "Unique": 1}
    io = io_spec(load_onnx(path))
    with pytest.raises(ConversionError, match="Unique"):
        OnnxToTensorRTPlan().convert(ConversionRequest(path, tmp_path / "out", "fp16", io, options={"lint": False}))


def test_fold_without_graphsurgeon_uses_onnxruntime(
    models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "onnx_graphsurgeon", None)  # import fails
    rec = fold_graph(models["tiny"], tmp_path / "f.onnx")
    assert rec["graphsurgeon"] is False and "onnxruntime" in rec["tool"] and "not installed" in rec["why"]
    x = {"input": np.ones((1, 3, 32, 32), np.float32)}
    a, b = reference_outputs(models["tiny"], [x])[0], reference_outputs(tmp_path / "f.onnx", [x])[0]
    np.testing.assert_allclose(a["logits"], b["logits"], rtol=1e-5, atol=1e-5)


# -- engine cache keys ----------------------------------------------------------------------


def test_engine_key_parts_and_paths(tmp_path: Path) -> None:
    k = engine_key("10.3.0", "Orin  (nvgpu)", (8, 7), "fp16", "m-jetson-orin-fp16-abc")
    assert k.compute_capability == "8.7" and k.gpu_name == "Orin (nvgpu)"
    assert engine_key("10.3.0", "Orin (nvgpu)", "8.7", "fp16", "m-jetson-orin-fp16-abc") == k
    variants = [
        engine_key("8.6.2", "Orin (nvgpu)", "8.7", "fp16", k.bundle_id),
        engine_key("10.3.0", "NVIDIA H100", "8.7", "fp16", k.bundle_id),
        engine_key("10.3.0", "Orin (nvgpu)", "9.0", "fp16", k.bundle_id),
        engine_key("10.3.0", "Orin (nvgpu)", "8.7", "int8", k.bundle_id),
        engine_key("10.3.0", "Orin (nvgpu)", "8.7", "fp16", "other"),
    ]
    assert len({v.digest for v in variants} | {k.digest}) == 6
    assert engine_path(tmp_path, k).parent.name == k.bundle_id and engine_path(tmp_path, k).suffix == ".engine"
    assert key_changes(k.to_json(), variants[0]) == ["tensorrt_version: '10.3.0' -> '8.6.2'"]


def test_cache_build_reuse_and_rebuild_on_key_change(tmp_path: Path) -> None:
    k = engine_key("10.3.0", "Orin", "8.7", "fp16", "bundle-1")
    decision, why, path = cache_decision(tmp_path, k)
    assert decision == "build" and "no cached engine" in why
    store_engine(path, k, b"ENGINE", 12.5, {"flags": ["FP16"]})
    decision, why, again = cache_decision(tmp_path, k)
    assert decision == "reuse" and again == path and "12.5 s" in why
    newer = engine_key("10.4.0", "Orin", "8.7", "fp16", "bundle-1")
    decision, why, new_path = cache_decision(tmp_path, newer)
    assert decision == "build" and "tensorrt_version: '10.3.0' -> '10.4.0'" in why and new_path != path
    store_engine(new_path, newer, b"ENGINE2", 1.0, {})
    assert not path.exists() and new_path.exists()  # the stale engine of the same bundle is gone
    new_path.write_bytes(b"truncated")  # size no longer matches its record
    assert cache_decision(tmp_path, newer)[0] == "build"


def test_default_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGEKIT_ENGINE_CACHE", raising=False)
    art = tmp_path / "store" / "bundles" / "b1" / "model.onnx"
    art.parent.mkdir(parents=True)
    assert default_cache_dir(art) == (tmp_path / "store" / "engines").resolve()
    monkeypatch.setenv("EDGEKIT_ENGINE_CACHE", str(tmp_path / "c"))
    assert default_cache_dir(art) == tmp_path / "c"


# -- runner: clear error, or a labelled CPU fallback ---------------------------------------


@pytest.mark.skipif(not TRT_MISSING, reason="hardware: TensorRT + GPU present: this host has TensorRT and a GPU")
def test_runner_names_what_is_missing(fp16_bundle: Bundle) -> None:
    with pytest.raises((HardwareUnavailableError, MissingDependencyError)) as e:
        fp16_bundle.open_runner()
    msg = str(e.value)
    assert "runner 'tensorrt'" in msg and "allow_cpu_fallback" in msg
    assert ("'tensorrt'" in msg) or ("NVIDIA GPU" in msg)


@pytest.mark.skipif(not TRT_MISSING, reason="hardware: TensorRT + GPU present: no fallback happens")
def test_cpu_fallback_runs_and_says_so_everywhere(int8_bundle: Bundle) -> None:
    with int8_bundle.open_runner({"allow_cpu_fallback": True}) as r:
        assert FALLBACK_LABEL in r.info.device_used and FALLBACK_LABEL in r.info.fallback
        assert FALLBACK_LABEL in r.info.runtime and r.info.details["cpu_fallback"] is True
        x = {"input": np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)}
        y = r.infer(x)
        assert y["logits"].shape == (1, 10)
    # the same ONNX through edgekit's onnxruntime runner: the same kernels, including its int8 kernel choice
    # (u8u8 on an x86 CPU without an int8 dot product, where plain onnxruntime's u8s8 saturates and differs)
    with OnnxRuntimeRunner(
        int8_bundle.artifact, options={"providers": ["CPUExecutionProvider"]}, precision="int8"
    ) as ort_r:
        ref = ort_r.infer(x)["logits"]
    np.testing.assert_allclose(y["logits"], ref, rtol=1e-5, atol=1e-5)
    rep = run_benchmark(
        lambda: int8_bundle.open_runner({"allow_cpu_fallback": True}), BenchOptions(iterations=5, warmup=1)
    )
    assert FALLBACK_LABEL in rep.runner["fallback"] and FALLBACK_LABEL in rep.runner["device_used"]


def test_unknown_runner_option_is_refused(fp16_bundle: Bundle) -> None:
    with pytest.raises(Exception, match="does not take option"):
        fp16_bundle.open_runner({"allow_cpu_fallback": True, "workspace": 1})


@pytest.mark.hardware
@needs_trt
def test_engine_builds_once_then_is_reused(fp16_bundle: Bundle, tmp_path: Path) -> None:
    opts = {"engine_cache_dir": str(tmp_path / "engines")}
    with fp16_bundle.open_runner(opts) as r:
        assert r.info.details["engine_cache"] == "build" and r.info.details["build_s"] > 0
        x = {"input": np.ones((1, 3, 32, 32), np.float32)}
        y = r.infer(x)
    ref = reference_outputs(fp16_bundle.artifact, [x])[0]["logits"]
    np.testing.assert_allclose(y["logits"], ref, rtol=5e-2, atol=5e-2)
    with fp16_bundle.open_runner(opts) as r:
        assert r.info.details["engine_cache"] == "reuse" and r.info.fallback is None


# -- CLI: convert and deploy for the Orin from this host -----------------------------------


def test_cli_convert_and_deploy_jetson(models: dict[str, Path], tmp_path: Path) -> None:
    p = run_cli("convert", str(models["tiny"]), "--target", "jetson-orin", "-o", str(tmp_path / "b"))
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "b" / BUILD_FILE).is_file()
    p = run_cli(
        "deploy", str(models["tiny"]), "--target", "jetson-orin", "--device", str(tmp_path / "dev"), cwd=tmp_path
    )
    assert p.returncode == 0, p.stdout + p.stderr
    out = " ".join(p.stdout.split())
    assert "not benchmarked" in out and "shipped" in out
    current = tmp_path / "dev" / "current"
    assert current.is_symlink() and (current / BUILD_FILE).is_file() and (current / "model.onnx").is_file()
    Bundle.open(current)


# -- Jetson health: tegrastats across JetPack versions, nvpmodel ---------------------------

# Written from the documented tegrastats formats (L4T 32 / JetPack 4, L4T 35 / JetPack 5, L4T 36 / JetPack 6).
TEGRA = {
    "agx_xavier_jp4": "RAM 2718/15692MB (lfb 2948x4MB) SWAP 0/7846MB (cached 0MB) CPU [3%@1190,2%@1190,1%@1190,"
    "off,off,off,off,off] EMC_FREQ 1%@2133 GR3D_FREQ 0%@1377 APE 150 MTS fg 0% bg 0% "
    "AO@41.5C GPU@40C Tdiode@43.75C PMIC@100C AUX@40C CPU@41.5C thermal@40.75C Tboard@40C "
    "GPU 0/0 CPU 155/155 SOC 931/931 CV 0/0 VDDRQ 155/155 SYS5V 2132/2132",
    "orin_nano_jp5": "RAM 1913/7620MB (lfb 1x4MB) SWAP 0/3810MB (cached 0MB) CPU [2%@729,1%@729,0%@729,0%@729,"
    "off,off] EMC_FREQ 1%@2133 GR3D_FREQ 37%@[624] NVENC off NVDEC off NVJPG off NVJPG1 off "
    "VIC off OFA off APE 200 cpu@48.125C soc2@46.062C soc0@46.875C gpu@47.5C tj@48.125C "
    "soc1@46.187C VDD_IN 5079mW/5079mW VDD_CPU_GPU_CV 1074mW/1074mW VDD_SOC 1552mW/1552mW",
    "agx_orin_jp6": "11-04-2024 10:12:01 RAM 5120/62841MB (lfb 13x4MB) SWAP 0/31420MB (cached 0MB) CPU [12%@2201,"
    "8%@2201,5%@2201,4%@2201,0%@2201,0%@2201,1%@2201,0%@2201,3%@2201,2%@2201,0%@2201,0%@2201] "
    "EMC_FREQ 14%@3199 GR3D_FREQ 88%@[1300,1300] NVDEC 1164 NVDLA0 1600 NVDLA1 off "
    "VIC_FREQ 12%@729 APE 174 CV0@-256C CPU@55.2C Tboard@38C SOC2@51.9C Tdiode@41.25C "
    "SOC0@52.1C CV1@-256C GPU@58.7C tj@58.7C SOC1@51.5C CV2@-256C VDD_GPU_SOC 14321mW/12873mW "
    "VDD_CPU_CV 2386mW/2201mW VIN_SYS_5V0 5930mW/5873mW VDDQ_VDD2_1V8AO 1203mW/1187mW",
}


def test_tegrastats_gpu_emc_temps_rails_across_jetpacks() -> None:
    x = parse_tegrastats(TEGRA["agx_xavier_jp4"])
    assert x["gpu_load_percent"] == 0 and x["gpu_freq_mhz"] == 1377 and x["emc_freq_mhz"] == 2133
    assert x["power"]["SOC"] == {"now_mw": 931, "avg_mw": 931} and x["temperatures_c"]["gpu"] == 40.0
    assert "pmic" not in x["temperatures_c"] and x["engines"]["ape"] == {"freq_mhz": 150}
    n = parse_tegrastats(TEGRA["orin_nano_jp5"])
    assert n["gpu_load_percent"] == 37 and n["gpu_gpc_freq_mhz"] == [624] and n["gpu_freq_mhz"] == 624
    assert n["input_rail"] == "VDD_IN" and n["input_power_mw"] == 5079 and n["engines"]["nvenc"] is None
    a = parse_tegrastats(TEGRA["agx_orin_jp6"])
    assert a["gpu_load_percent"] == 88 and a["gpu_gpc_freq_mhz"] == [1300, 1300]
    assert a["emc_load_percent"] == 14 and a["emc_freq_mhz"] == 3199
    assert a["input_rail"] == "VIN_SYS_5V0" and a["power"]["VDD_GPU_SOC"] == {"now_mw": 14321, "avg_mw": 12873}
    assert a["temperatures_c"]["gpu"] == 58.7 and "cv0" not in a["temperatures_c"] and a["max_temp_c"] == 58.7
    assert a["engines"]["nvdla0"] == {"freq_mhz": 1600} and a["engines"]["nvdla1"] is None
    assert a["engines"]["vic"] == {"freq_mhz": 729, "load_percent": 12} and a["engines"]["nvdec"] == {"freq_mhz": 1164}


NVPMODEL_Q = {
    "jp4": "NV Power Mode: MODE_15W_6CORE\n2\n",
    "jp5_warn": "NVPM WARN: fan mode is not set!\nNV Power Mode: 15W\n0\n",
    "jp6": "NV Power Mode: MAXN\n0\n",
    "verbose": "NVPM VERB: Config file: /etc/nvpmodel.conf\nNVPM VERB: parsing done for /etc/nvpmodel.conf\n"
    "NVPM VERB: Current mode: NV Power Mode: 7W\n1\n",
}


def test_nvpmodel_power_mode(tmp_path: Path) -> None:
    assert parse_nvpmodel(NVPMODEL_Q["jp4"]) == {"mode_name": "MODE_15W_6CORE", "mode_id": 2}
    assert parse_nvpmodel(NVPMODEL_Q["jp5_warn"]) == {"mode_name": "15W", "mode_id": 0}
    assert parse_nvpmodel(NVPMODEL_Q["jp6"]) == {"mode_name": "MAXN", "mode_id": 0}
    assert parse_nvpmodel(NVPMODEL_Q["verbose"]) == {"mode_name": "7W", "mode_id": 1}
    assert parse_nvpmodel("command not found") == {}
    conf = "< POWER_MODEL ID=0 NAME=15W >\nCPU_ONLINE CORE_0 1\n< POWER_MODEL ID=1 NAME=7W >\n"
    assert parse_nvpmodel_conf(conf) == {0: "15W", 1: "7W"}
    (tmp_path / "status").write_text("pmode:0001 fmode:quiet\n")
    (tmp_path / "nvpmodel.conf").write_text(conf)
    got = read_nvpmodel(
        command="no-such-nvpmodel-binary",
        status_file=str(tmp_path / "status"),
        conf_file=str(tmp_path / "nvpmodel.conf"),
    )
    assert got == {"mode_id": 1, "mode_name": "7W", "source": str(tmp_path / "status")}
    assert read_nvpmodel(command="no-such-nvpmodel-binary", status_file=str(tmp_path / "none")) is None
