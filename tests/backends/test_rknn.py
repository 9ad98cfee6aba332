"""Rockchip RKNPU (issue #32): ONNX -> .rknn in the rknn toolchain (rknn-toolkit2), parity on the toolkit's
simulator labelled simulated, the device runner behind an exact check, and the one-line refusal without the
toolchain.

The toolchain (``edgekit toolchain install rknn``: 1.5 GB, 85-117 s to install here) is not in CI's install list,
so every test that needs it is ``corpus_full``; run them with ``pytest -m corpus_full tests/backends/test_rknn.py``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from edge import toolchains
from edge.backends.iosidecar import IO_SIDECAR
from edge.backends.rknn.format import ARTIFACT_NAME, SIMULATED_DEVICE, SIMULATOR_LABEL
from edge.backends.rknn.run import RKNNRunner, npu_problem
from edge.doctor import doctor
from edge.errors import HardwareUnavailableError
from edge.pipeline import convert
from tests.support.cli import assert_user_error, run_cli
from tests.support.corpus import CORPUS, corpus_model


@pytest.fixture(scope="module")
def rknn_toolchain() -> None:
    st = toolchains.status("rknn")
    if not st.usable:
        pytest.skip(f"the rknn toolchain is not installed ({st.problem}): edgekit toolchain install rknn")


def _convert(out: Path, precision: str) -> Path:
    request = dataclasses.replace(CORPUS["ppocr-cls"].convert_request("rockchip-rk3588"), precision=precision)
    return convert(corpus_model("ppocr-cls"), "rockchip-rk3588", out, request).path


@pytest.mark.corpus_full
@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_ppocr_cls_converts_and_passes_parity_on_the_simulator_labelled_simulated(
    rknn_toolchain: None, tmp_path: Path, precision: str
) -> None:
    b = _convert(tmp_path / "b", precision)
    m = json.loads((b / "manifest.json").read_text())
    assert m["format"] == "rknn" and m["primary_artifact"] == ARTIFACT_NAME
    assert {ARTIFACT_NAME, IO_SIDECAR} <= {a["path"] for a in m["artifacts"]}
    assert (b / ARTIFACT_NAME).read_bytes()[:4] == b"RKNN"
    step = next(s for s in m["chain"] if s["converter"] == "onnx->rknn")
    assert step["tool_versions"]["rknn-toolkit2"] == "2.5.0"
    assert step["details"]["platform"] == "rk3588" and step["details"]["simulator"]["label"] == SIMULATOR_LABEL
    assert step["details"]["toolchain"]["lock_hash"] == toolchains.status("rknn").lock_hash
    parity = m["parity"]
    assert parity["passed"] is True and parity["precision"] == precision, parity
    assert "simulated: not the NPU" in parity["candidate"]["runtime"]
    assert parity["candidate"]["device_used"] == SIMULATED_DEVICE
    assert any("simulated: not the NPU" in n for n in parity["host_notes"])
    out = parity["outputs"][0]
    assert out["cosine"] >= 0.98 and out["top1"] >= 0.8, out
    if precision == "int8":
        assert m["calibration"]["kind"] == "natural" and parity["inputs"] == "calibration"
    else:  # the NPU computes fp16: the source also ran with every tensor rounded to fp16, beside the simulator
        assert parity["fp16_proxy"]["passed"] is True and parity["fp16_proxy"]["label"] == "fp16 proxy"


@pytest.mark.skipif(npu_problem() is None, reason="hardware: a Rockchip NPU is here: the refusal path is not reachable")
def test_runner_refuses_without_the_npu_naming_driver_and_runtime(tmp_path: Path) -> None:
    with pytest.raises(HardwareUnavailableError) as err:
        RKNNRunner(tmp_path / ARTIFACT_NAME)
    msg = str(err.value)
    assert "/dev/rknpu" in msg and "/sys/kernel/debug/rknpu" in msg and "/usr/lib/librknnrt.so" in msg, msg
    assert "/sys/bus/platform/drivers/RKNPU" in msg, msg
    row = next(h for h in doctor() if h.target.name == "rockchip-rk3588")
    assert row.run_problem is not None and "/dev/rknpu" in row.run_problem and "librknnrt.so" in row.run_problem


def test_convert_without_the_toolchain_is_one_line_naming_the_install(tmp_path: Path, models: dict[str, Path]) -> None:
    env = {toolchains.ENV_VAR: str(tmp_path / "no-toolchains")}
    assert_user_error(
        run_cli("convert", str(models["tiny"]), "-t", "rockchip-rk3588", "-o", str(tmp_path / "b"), env=env),
        "toolchain 'rknn' is not installed",
        "edgekit toolchain install rknn",
    )
    assert not (tmp_path / "b").exists() and not (tmp_path / "no-toolchains" / "rknn").exists()


@pytest.mark.corpus_full
def test_a_toolkit_rule_that_fails_is_one_line_naming_the_rule_and_the_toolkits_workaround(
    rknn_toolchain: None, tmp_path: Path
) -> None:
    # PP-OCRv6 rec: rknn-toolkit2 2.5.0's attention-fusion rule raises IndexError on it (12 s to fail)
    m = CORPUS["ppocr-rec"]
    p = run_cli(
        "convert", str(corpus_model("ppocr-rec")), "-t", "rockchip-rk3588", *m.cli_args(), "-o", str(tmp_path / "b")
    )
    rule = "fuse_exmatmul_add_mul_exsoftmax13_exmatmul_to_sdpa"
    assert_user_error(p, f"graph rule {rule!r}", "IndexError", f'disable_rules = ["{rule}"]')


def test_an_npu_bound_to_the_rknpu_driver_counts_where_debugfs_is_roots(tmp_path: Path) -> None:
    # a non-root agent cannot see /sys/kernel/debug/rknpu; sysfs shows the RKNPU platform driver's bound device
    driver = tmp_path / "RKNPU"
    driver.mkdir()
    for name in ("bind", "unbind", "uevent"):
        (driver / name).write_text("")
    nodes = (str(tmp_path / "no-rknpu"),)
    lib = tmp_path / "librknnrt.so"
    assert "no RKNPU driver" in (npu_problem(nodes, str(lib), str(driver)) or "")  # the driver holds no NPU
    (tmp_path / "fdab0000.npu").mkdir()
    (driver / "fdab0000.npu").symlink_to(tmp_path / "fdab0000.npu")
    assert (
        npu_problem(nodes, str(lib), str(driver))
        == f"no {lib} (Rockchip's NPU runtime, which rknn-toolkit-lite2 loads from there)"
    )
    lib.write_bytes(b"\x7fELF")
    assert npu_problem(nodes, str(lib), str(driver)) is None
