"""A bundle checked on the device's instruction set: the tiny CNN through arm-xnnpack, run on emulated aarch64.

The CI subset of issue #22 (tiny model, few samples: emulation is 300-1000x slower than a device). The
corpus-wide figures come from benchmarks/corpus_aarch64.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edge import toolchains
from edge.bundle.bundle import SIGNATURE, Bundle
from edge.bundle.signing import generate_key
from edge.bundle.trust import TrustStore
from edge.errors import EdgeError
from edge.verify import isa
from tests.support.cli import assert_user_error, run_cli
from tests.support.emulation import emulator_or_skip


@pytest.fixture(scope="module")
def arm_bundle(tmp_path_factory: pytest.TempPathFactory, models: dict[str, Path]) -> tuple[Path, dict]:
    """`edgekit convert tiny.onnx -t arm-xnnpack`: with the toolchain installed it checks on aarch64 by default."""
    emulator_or_skip()
    if not toolchains.status("tflite").usable:
        pytest.skip(toolchains.status("tflite").problem or "toolchain 'tflite' is not usable")
    out = tmp_path_factory.mktemp("isa") / "tiny-arm"
    p = run_cli(
        "convert",
        str(models["tiny"]),
        "-t",
        "arm-xnnpack",
        "-o",
        str(out),
        "--json",
        env={"EDGEKIT_SIGN_KEY": "", "EDGEKIT_TRUST_DIR": ""},
    )
    assert p.returncode == 0, p.stderr
    return out, json.loads(p.stdout)


def test_convert_checks_on_emulated_aarch64(arm_bundle: tuple[Path, dict]) -> None:
    out, doc = arm_bundle
    assert doc["isa_check"].startswith("checked on aarch64 (emulated cortex-a76): pass"), doc["isa_check"]
    (ev,) = Bundle.open(out).info.verified_on  # the evidence is part of the (verified) manifest
    assert (ev.isa, ev.cpu, ev.emulated, ev.passed, ev.reference_check) == ("aarch64", "cortex-a76", True, True, True)
    assert ev.cpu_part == "0xd0b" and ev.runtime == "ai-edge-litert 2.3.0" and ev.emulator.startswith("qemu-aarch64 ")
    assert ev.device_used == "CPU (XNNPack)" and ev.versions["onnxruntime"] == "1.32.0"
    (o,) = ev.outputs
    # XNNPack's ARM kernels are not x86's: the figures differ a little, and stay far inside the limit
    assert o.name == "logits" and 0 <= o.max_abs_vs_host <= o.limit == isa.isa_limit("fp32", o.range)
    assert o.cosine is not None and o.cosine > 0.9999 and ev.samples >= 4


def test_verify_a_signed_bundle_signs_the_evidence_again(
    arm_bundle: tuple[Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, _ = arm_bundle
    b = tmp_path / "b"
    shutil.copytree(src, b)
    env = {"EDGEKIT_KEYS_DIR": str(tmp_path / "keys"), "EDGEKIT_TRUST_DIR": "", "EDGEKIT_SIGN_KEY": ""}
    monkeypatch.setenv("EDGEKIT_KEYS_DIR", env["EDGEKIT_KEYS_DIR"])
    generate_key("ci")
    assert run_cli("sign", str(b), "--key", "ci", env=env).returncode == 0
    p = run_cli("verify", str(b), "--isa", "aarch64", "--cpu", "neoverse-n1", "--key", "ci", "--json", env=env)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["label"] == "checked on aarch64 (emulated neoverse-n1)" and doc["cpu_part"] == "0xd0c"
    assert doc["resigned"]["key_id"]
    trust = TrustStore(tmp_path / "trust")
    trust.add_key((tmp_path / "keys" / "ci.pub").read_bytes(), "ci")
    signed = Bundle.open(b, trust=trust)  # the signature covers the new evidence
    assert [(e.cpu, e.passed) for e in signed.info.verified_on] == [("cortex-a76", True), ("neoverse-n1", True)]
    # without a key: the stale signature goes, and the user is told to sign again
    p = run_cli("verify", str(b), "--cpu", "cortex-a72", env=env)
    assert p.returncode == 0 and "sign it again" in p.stderr and not (b / SIGNATURE).exists()
    assert "checked on aarch64 (emulated cortex-a72): pass" in " ".join(p.stdout.split())


def test_a_difference_over_the_limit_fails(
    arm_bundle: tuple[Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, _ = arm_bundle
    b = tmp_path / "b"
    shutil.copytree(src, b)
    before = (b / "manifest.json").read_text()
    monkeypatch.setattr(isa, "FLOAT_LIMIT", 0.0)  # any ARM-vs-x86 difference at all is now over the limit
    monkeypatch.setattr(isa, "ABS_FLOOR", 0.0)
    ev = isa.verify_isa(b, record=False)
    assert ev["passed"] is False and ev["reference_check"] is True
    assert ev["failures"] and ev["failures"][0].startswith("logits: |aarch64 - x86| ")
    assert (b / "manifest.json").read_text() == before  # record=False leaves the manifest alone
    assert_user_error(run_cli("verify", str(b), "--cpu", "max"), "unknown emulated core 'max'")


def test_the_limit_is_relative_to_the_outputs_own_range() -> None:
    from types import SimpleNamespace

    import numpy as np

    out = SimpleNamespace(name="y")
    bundle = SimpleNamespace(io=SimpleNamespace(outputs=[out]), precision="fp32")
    ref = [{"y": np.array([100.0, 101.0], np.float32)}, {"y": np.array([100.5, 100.25], np.float32)}]
    arm = [{"y": r["y"] + np.float32(1e-3)} for r in ref]
    (o,) = isa.per_output(bundle, ref, arm, ref, {"outputs": []})  # type: ignore[arg-type]
    # values 100..101: the range is 1, not 101 (which would let a 1e-3 difference through at 2e-4 of the range)
    assert o["range"] == 1.0 and o["limit"] == isa.isa_limit("fp32", 1.0) and o["passed"] is False
    assert abs(o["max_abs_vs_host"] - 1e-3) < 1e-5
    assert isa.isa_limit("int8", 1.0) == isa.INT8_LIMIT and isa.isa_limit("fp32", 0.0) == isa.ABS_FLOOR


def test_a_coral_bundle_is_checked_on_its_cpu_int8_path(
    arm_bundle: tuple[Path, dict], models: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "coral"  # no edgetpu_compiler here: the bundle holds the CPU int8 .tflite until `finish`
    p = run_cli(
        "convert",
        str(models["tiny"]),
        "-t",
        "coral-edgetpu",
        "-p",
        "int8",
        "--calib",
        "random",
        "-o",
        str(out),
        "--json",
        env={"EDGEKIT_SIGN_KEY": "", "EDGEKIT_TRUST_DIR": ""},
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    if doc["manifest"]["primary_artifact"].endswith("_edgetpu.tflite"):  # compiled: only the accelerator runs it
        assert "compiled for the Edge TPU" in doc["isa_check"]
        return
    assert doc["isa_check"].startswith(
        "checked on aarch64 (emulated cortex-a76), CPU int8 path (XNNPack in place of the Edge TPU): pass"
    ), doc["isa_check"]
    (ev,) = Bundle.open(out).info.verified_on
    assert ev.device_used == "CPU (XNNPack)" and ev.outputs[0].limit == isa.isa_limit("int8", ev.outputs[0].range)
    assert Bundle.open(out).info.runner.options_dict["delegate"] == "edgetpu"  # the bundle itself is unchanged


@pytest.mark.corpus_full
def test_the_guest_says_each_sample_with_an_estimate(arm_bundle: tuple[Path, dict]) -> None:
    src, _ = arm_bundle
    said: list[str] = []
    ev = isa.verify_isa(src, record=False, on_step=said.append)
    n = ev["samples"]
    assert said[0].startswith("emulated aarch64 check: started in ") and said[0].endswith(f", {n} samples to run")
    samples = [m for m in said[1:] if m.startswith("emulated aarch64 check: sample ")]
    ks = [int(m.split(" ")[4]) for m in samples]  # every sample is reported; lines at most every SAY_EVERY_S
    assert ks[0] == 1 and ks[-1] == n and ks == sorted(set(ks)), said
    assert all(f"sample {k} of {n}, ~" in m for k, m in zip(ks, samples))
    assert all(m.endswith(" s left (emulation, not a speed figure)") for m in samples)


@pytest.mark.corpus_full
def test_the_guest_run_stops_in_one_line_at_its_bound(
    arm_bundle: tuple[Path, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    src, _ = arm_bundle
    monkeypatch.setattr(isa, "BOUND_FACTOR", 0.0)  # the bound is the start-up: past it once a sample is measured
    monkeypatch.setattr(isa, "BOUND_GRACE_S", 0.0)
    said: list[str] = []
    with pytest.raises(EdgeError) as e:
        isa.verify_isa(src, record=False, on_step=said.append)
    msg = str(e.value)
    assert msg.startswith("emulated aarch64 check stopped after ") and "\n" not in msg, msg
    assert " of 16 samples done (~" in msg and "--parity-samples" in msg and "--no-isa-check" in msg
    assert said[-1].startswith("emulated aarch64 check: sample ")
