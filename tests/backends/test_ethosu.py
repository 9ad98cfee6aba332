"""Arm Ethos-U55/U65 (issue #32): full-integer TFLite -> Vela-compiled TFLite in the vela toolchain, Vela's
estimate recorded as an estimate, host parity on the int8 model Vela compiled (a labelled CPU fallback), the
device runner behind an exact check, and the firmware C array with the arena size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edge import toolchains
from edge.backends.ethosu.format import COMPILED_NAME, CPU_MODEL, ESTIMATE_NAME
from edge.backends.ethosu.run import EthosURunner, npu_problem
from edge.doctor import doctor
from edge.errors import ConversionError, HardwareUnavailableError
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest
from tests.support.cli import run_cli
from tests.support.corpus import corpus_model


@pytest.fixture(scope="module")
def vela() -> None:
    st = toolchains.status("vela")
    if not st.usable:
        pytest.skip(f"the vela toolchain is not installed ({st.problem}): edgekit toolchain install vela")


@pytest.fixture(scope="module")
def u55_bundle(vela: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # micro-wakeword's full-integer TFLite: Vela compiles it in ~2 s (its variable ops stay on the CPU)
    out = tmp_path_factory.mktemp("u55") / "b"
    convert(corpus_model("micro-wakeword-okay-nabu"), "ethos-u55", out, ConvertRequest())
    return out


def test_bundle_carries_vela_output_the_int8_model_and_the_estimate(u55_bundle: Path) -> None:
    m = json.loads((u55_bundle / "manifest.json").read_text())
    assert m["format"] == "ethos-u-tflite" and m["primary_artifact"] == COMPILED_NAME
    names = {a["path"] for a in m["artifacts"]}
    assert {COMPILED_NAME, CPU_MODEL, ESTIMATE_NAME} <= names
    step = next(s for s in m["chain"] if s["converter"] == "tflite->ethos-u")
    est = step["details"]["vela_estimate"]
    assert "estimate" in est["label"] and "not a measurement" in est["label"]
    assert est["accelerator"] == "Ethos_U55_128" and est["clock_hz"] == 500e6
    assert est["inferences_per_second"] > 0 and est["cycles_total"] > 0 and est["sram_bytes"] > 0
    assert est["npu_ops"] > 0 and "VAR_HANDLE" in est["cpu_op_types"] and "None" not in est["cpu_op_types"]
    assert step["tool_versions"]["ethos-u-vela"] == "5.2.0"
    cand = m["parity"]["candidate"]
    assert "CPU fallback" in cand["device_used"] and "/dev/ethosu0" in cand["fallback"]


@pytest.mark.skipif(npu_problem() is None, reason="hardware: an Ethos-U is here: the refusal path is not reachable")
def test_runner_refuses_without_the_npu_and_doctor_says_what_is_missing(u55_bundle: Path) -> None:
    with pytest.raises(HardwareUnavailableError, match=r"/dev/ethosu0.*libethosu_delegate"):
        EthosURunner(u55_bundle / COMPILED_NAME)
    row = next(h for h in doctor() if h.target.name == "ethos-u65")
    assert row.can_convert or row.convert_problems
    assert row.run_problem is not None and "/dev/ethosu0" in row.run_problem


def test_firmware_writes_the_c_array_and_the_arena_size(u55_bundle: Path, tmp_path: Path) -> None:
    p = run_cli("firmware", "ethos-u", str(u55_bundle), "-o", str(tmp_path), "--json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    est = json.loads((u55_bundle / ESTIMATE_NAME).read_text())
    assert data["arena_bytes"] == est["arena_bytes"] > est["sram_bytes"]
    h = Path(data["ethosu_header"]).read_text()
    assert f"_ARENA_SIZE {est['arena_bytes']}" in h and "AddEthosU()" in h and "estimate" in h
    cc = Path(data["cc"]).read_text()
    assert "alignas(16)" in cc and f"_len = {(u55_bundle / COMPILED_NAME).stat().st_size}" in cc


def test_firmware_refuses_another_bundle_in_one_line(u55_bundle: Path, tmp_path: Path) -> None:
    b = convert(corpus_model("micro-wakeword-okay-nabu"), "arm-xnnpack", tmp_path / "x", ConvertRequest())
    p = run_cli("firmware", "ethos-u", str(b.path), "-o", str(tmp_path / "fw"))
    assert p.returncode == 2 and "not an Ethos-U one" in p.stderr


def test_a_float_model_is_refused_naming_its_float_ops(vela: None, tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match=r"not a full-integer model: .*CONV_2D.* compute in float"):
        convert(corpus_model("face-detection"), "ethos-u55", tmp_path / "b", ConvertRequest())
