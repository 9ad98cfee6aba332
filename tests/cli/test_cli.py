"""The console script as a user runs it: exit codes, one-line errors, JSON output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.support.cli import assert_user_error, run_cli


def test_targets_and_show_and_doctor() -> None:
    p = run_cli("targets", "--json")
    assert p.returncode == 0, p.stderr
    names = {t["name"] for t in json.loads(p.stdout)}
    assert {"x86-cpu", "intel-igpu", "jetson-orin", "apple-ane", "arm-xnnpack", "coral-edgetpu"} <= names
    p = run_cli("targets", "show", "intel-igpu", "--json")
    data = json.loads(p.stdout)
    assert data["run"]["options"]["device"] == ["GPU", "CPU"] and data["this_host"]["can_convert"] is True
    p = run_cli("targets", "show", "intel-igpu")
    assert p.returncode == 0 and "where" not in p.stderr and "convert chain" in p.stdout
    p = run_cli("doctor", "--json")
    health = {t["target"]: t for t in json.loads(p.stdout)["targets"]}
    assert health["x86-cpu"]["can_convert"] and health["x86-cpu"]["can_run"]
    assert not health["jetson-orin"]["can_run"] and "NVIDIA GPU" in health["jetson-orin"]["run_problem"]


def test_help_explains_itself() -> None:
    p = run_cli("convert", "--help")
    assert p.returncode == 0
    for opt in ("--target", "--precision", "--calib", "--input-shape", "--accept-parity-failure", "--json"):
        assert opt in p.stdout


def test_convert_bench_flow(models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    p = run_cli("convert", str(models["tiny"]), "--target", "intel-igpu", "-o", str(out), "--precision", "fp32")
    assert p.returncode == 0, p.stderr
    assert "pass" in p.stdout and "fallback" in p.stdout  # GPU asked, CPU used: said out loud
    # 0.1 fps = 10 s a frame: a budget no host misses, so the verdict must be pass (60 fps was luck on a busy host)
    p = run_cli("bench", str(out), "--iterations", "20", "--fps", "0.1", "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["latency"]["count"] == 20 and r["budget_source"] == "0.1 fps" and r["verdict"] == "pass"
    assert r["budget_ms"] == 10000
    # bf16 only where the build's bf16 parity trial passed on a CPU listing BF16 (edge.pipeline.precision_trial)
    fast = json.loads((out / "manifest.json").read_text())["runner"]["options"]["inference_precision"] == "fast"
    assert r["runner"]["device_used"] == "CPU" and r["runner"]["precision_used"] == ("bf16" if fast else "f32")
    policy = r["runner"]["details"]["threads_policy"]  # what edgekit chose and why (edge.backends.threads)
    # the CPU plugin's own threads where nothing shares the CPUs, the cores left where something does (issue #25)
    assert policy["threads_from"] == ("policy" if policy["shared"] else "default"), policy
    assert r["runner"]["threads"] == policy["threads"] >= 1
    p = run_cli("bench", str(out), "--iterations", "5", "--budget-ms", "0.000001")
    assert p.returncode == 1 and "fail" in p.stdout and "CPU(s) for this process" in p.stdout
    assert_user_error(
        run_cli("bench", str(out), "--allow-cpu-fallback"), "runner 'openvino' has no CPU fallback to allow"
    )


def test_deploy_and_rollback(models: dict[str, Path], tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    for prec in ("fp32", "fp16"):
        p = run_cli(
            "deploy",
            str(models["tiny"]),
            "--target",
            "x86-cpu",
            "--device",
            str(dev),
            "--precision",
            prec,
            "-n",
            "10",
            "--build-dir",
            str(tmp_path / prec),
            "--json",
        )
        assert p.returncode == 0, p.stderr
    p = run_cli("rollback", "--device", str(dev), "--json")
    assert p.returncode == 0 and "fp32" in json.loads(p.stdout)["current"]


def test_bad_input_is_one_line_exit_2(models: dict[str, Path], tmp_path: Path) -> None:
    out = str(tmp_path / "o")
    assert_user_error(
        run_cli("convert", str(tmp_path / "missing.onnx"), "-t", "x86-cpu", "-o", out), "missing.onnx does not exist"
    )
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"GIF89a not a model" * 20)
    assert_user_error(run_cli("convert", str(junk), "-t", "x86-cpu", "-o", out), "is not an ONNX model")
    assert_user_error(
        run_cli("convert", str(models["tiny_dynamic"]), "-t", "x86-cpu", "-o", out), "--input-shape input=1,3,32,32"
    )
    assert_user_error(run_cli("convert", str(models["tiny"]), "-t", "x86_cpu", "-o", out), "did you mean 'x86-cpu'")
    assert_user_error(
        run_cli("convert", str(models["tiny"]), "-t", "coral-edgetpu", "-o", out, "-p", "fp16"),
        "does not allow precision 'fp16'",
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_user_error(
        run_cli("convert", str(models["tiny"]), "-t", "x86-cpu", "-o", out, "-p", "int8", "--calib", str(empty)),
        "holds no .npy",
    )
    bad = tmp_path / "badcal"
    bad.mkdir()
    np.save(bad / "x.npy", np.zeros((1, 3, 8, 8), np.float32))
    assert_user_error(
        run_cli("convert", str(models["tiny"]), "-t", "x86-cpu", "-o", out, "-p", "int8", "--calib", str(bad)),
        "x.npy: input 'input' shape [1, 3, 8, 8], expected [1, 3, 32, 32]",
    )
    # no --calib: edgekit's natural images calibrate an image input; a second float input they cannot feed
    assert_user_error(
        run_cli("convert", str(models["two_input"]), "-t", "x86-cpu", "-o", out, "-p", "int8"),
        "needs calibration data (edgekit's natural images do not apply: the model has 2 inputs",
        "--calib random",
    )
    assert not (tmp_path / "o").exists()


def test_tampered_bundle_and_malformed_target(models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "b"
    assert run_cli("convert", str(models["tiny"]), "-t", "x86-cpu", "-o", str(out)).returncode == 0
    (out / "model.onnx").write_bytes(b"x")
    assert_user_error(run_cli("bench", str(out)), "model.onnx: sha256 differs")
    tdir = tmp_path / "targets"
    tdir.mkdir()
    (tdir / "mine.toml").write_text('schema_version = 1\nname = "mine"\nframe_budget_ms = "x"\n')
    assert_user_error(
        run_cli("targets", "--targets-dir", str(tdir)),
        f"invalid target profile {tdir / 'mine.toml'}",
        "frame_budget_ms: expected int/float",
        "title: missing",
    )


def test_missing_runtime_names_the_extra(models: dict[str, Path], tmp_path: Path) -> None:
    # Make openvino unimportable for this process only (sys.modules[...] = None is how Python marks a
    # module as absent), then run the real CLI entry point.
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['openvino'] = None; from edge.cli import main; "
        f"main(['convert', {str(models['tiny'])!r}, '-t', 'intel-igpu', '-o', {str(tmp_path / 'o')!r}])"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"COLUMNS": "200", "PATH": ""})
    assert_user_error(p, "openvino", "pip install 'edgekit-ml[openvino]'")
