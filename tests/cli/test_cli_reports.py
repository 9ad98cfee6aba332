"""Reports say the precision that runs (issue #33 item 6): an intel-igpu bundle whose bf16 trial passed and switched
the runner to bf16 (``inference_precision = "fast"``) was reported as "computing in f32" (the precision its own
parity was checked in). This host's CPU lists no BF16, so the trial's record is written as a CPU with BF16 writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edge.bundle.bundle import Bundle
from edge.cli.convert import render_bundle
from tests.support.cli import run_cli


@pytest.fixture(scope="module")
def igpu_bundle(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("igpu") / "b"
    p = run_cli("convert", str(models["tiny"]), "--target", "intel-igpu", "--precision", "fp32", "-o", str(out))
    assert p.returncode == 0, p.stderr
    return out


def _with_trial(src: Path, dst: Path, passed: bool) -> Path:
    import shutil

    shutil.copytree(src, dst)
    m = json.loads((dst / "manifest.json").read_text())
    par = m["parity"]
    cand = {**par["candidate"], "precision_used": "bf16"}
    trial = {
        "compute": "bf16",
        "passed": passed,
        "thresholds": par["thresholds"],
        "candidate": cand,
        "outputs": par["outputs"],
        "failures": [] if passed else ["logits: cosine 0.91 < 0.99"],
        "capabilities": ["BF16", "FP32"],
    }
    par["precision_trials"] = [trial]
    if passed:
        m["runner"]["options"]["inference_precision"] = "fast"
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst


def _report(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    render_bundle(Bundle.open(path, verify=False))
    out = capsys.readouterr().out
    return " ".join("".join(" " if "\u2500" <= ch <= "\u257f" else ch for ch in out).split())  # no box lines


def test_a_bundle_switched_to_bf16_says_bf16(
    igpu_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _report(_with_trial(igpu_bundle, tmp_path / "fast", passed=True), capsys)
    assert "computes in bf16 on CPUs that list BF16" in out, out
    assert "checked on CPU in f32" in out  # what the parity row measured, named as such


def test_a_failed_trial_keeps_f32_and_says_why(
    igpu_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _report(_with_trial(igpu_bundle, tmp_path / "slow", passed=False), capsys)
    assert "computes in f32 on CPU (bf16 failed parity, so it is not used: logits: cosine 0.91" in out, out


def test_no_trial_is_the_parity_precision(igpu_bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without a passed bf16 trial the bundle computes in its parity precision. Whether convert ran the trial is
    the host's (a CPU listing BF16: AVX512-BF16, AMX); the bundle without it is made here by dropping the trial."""
    import shutil

    out = _report(igpu_bundle, capsys)
    m = json.loads((igpu_bundle / "manifest.json").read_text())
    if any(t.get("passed") for t in m["parity"].get("precision_trials", [])):  # this host lists BF16
        assert "computes in bf16 on CPUs that list BF16 (inference_precision fast" in out, out
        dst = igpu_bundle.parent / "no-trial"
        shutil.copytree(igpu_bundle, dst, dirs_exist_ok=True)
        m["parity"]["precision_trials"] = []
        m["runner"]["options"].pop("inference_precision", None)
        (dst / "manifest.json").write_text(json.dumps(m))
        out = _report(dst, capsys)
    assert "computes in f32 on CPU" in out, out


def test_manifest_text_is_printed_as_written(
    igpu_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bundle's own text (an unsigned manifest anyone can edit) is data: no markup, no emoji codes."""
    import shutil

    dst = tmp_path / "hostile"
    shutil.copytree(igpu_bundle, dst)
    m = json.loads((dst / "manifest.json").read_text())
    m["parity"]["candidate"]["fallback"] = "[link=file:///etc/passwd]x[/link] [bold]:x:[/bold]"
    (dst / "manifest.json").write_text(json.dumps(m))
    out = _report(dst, capsys)
    assert "(fallback: [link=file:///etc/passwd]x[/link] [bold]:x:[/bold])" in out, out
