"""deploy: the budget gates only on the target's own device class; a bundle unverified here says so.

A benchmark gates a deploy's budget only when this host is one of the target's devices
(``edge.targets.same_device_class``); arm-xnnpack runs on this x86 host (LiteRT), but that does not
time a Raspberry Pi. A bundle whose parity could not run here ships with "unverified on this host".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edge import toolchains
from edge.bundle.bundle import Bundle
from edge.capabilities import current_host
from edge.deploy import DeployOptions, DeviceStore, deploy, ship
from edge.errors import BudgetError
from edge.pipeline.request import ConvertRequest
from tests.support.cli import REPO, run_cli

X86_LINUX = current_host().os == "linux" and current_host().arch == "x86_64"
needs_x86 = pytest.mark.skipif(
    not X86_LINUX,
    reason=f"hardware: not an x86-64 Linux host: this host is "
    f"{current_host().os}/{current_host().arch}, where these targets' classes differ",
)


def _toolchain(name: str) -> None:
    st = toolchains.status(name)
    if not st.usable:
        pytest.skip(f"needs the {name} toolchain: {st.problem}")


@needs_x86
def test_arm_xnnpack_benchmarked_on_x86_does_not_gate(models: dict[str, Path], tmp_path: Path) -> None:
    _toolchain("tflite")
    r = deploy(
        models["tiny"],
        "arm-xnnpack",
        tmp_path / "pi",
        options=DeployOptions(build_dir=tmp_path / "b", bench_iterations=5, budget_ms=1e-6),
    )  # far over budget: it would be refused if it gated
    assert r.budget_gates is False and r.device_class is not None
    assert r.device_class.startswith("different device class: this host is linux/x86_64; arm-xnnpack's devices are")
    assert any(
        n.startswith("the budget verdict is indicative and does not gate this deploy: different device class")
        for n in r.notes
    )
    assert r.unverified is None and DeviceStore(tmp_path / "pi").current == r.bundle.id
    bench = Bundle.open(tmp_path / "pi" / "bundles" / r.bundle.id).manifest["benchmark"]  # the shipped record
    assert bench["verdict"] == "fail" and bench["on_target_device"] is False and bench["runner"]["fallback"] is None
    assert bench["device_class"] == {"same": False, "reason": r.device_class}  # the typed field
    assert "device_class" not in bench["runner"]["details"]
    ship(r.bundle.path, tmp_path / "pi2")  # the gate reads the record the same way: indicative, not edited
    # a manifest from before the typed field kept the judgement in runner.details: still read, still gates alike
    from edge.bundle.schema import device_class_of, parse_manifest
    from edge.errors import DeployError
    from edge.verify.gates import check_gates

    old = json.loads(json.dumps(Bundle.open(r.bundle.path).manifest))
    old["benchmark"]["runner"]["details"]["device_class"] = old["benchmark"].pop("device_class")
    m = parse_manifest(old, "old manifest")
    assert m.benchmark.device_class is None
    assert device_class_of(m.benchmark) == {"same": False, "reason": r.device_class}
    check_gates(m)
    del old["benchmark"]["runner"]["details"]["device_class"]  # off-target with no reason at all: edited
    with pytest.raises(DeployError, match=r"names no fallback .* \(benchmark.device_class\)"):
        check_gates(parse_manifest(old, "old manifest"))


@needs_x86
def test_x86_cpu_benchmarked_here_gates(models: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(BudgetError, match="over the 0.00 ms budget"):
        deploy(
            models["tiny"],
            "x86-cpu",
            tmp_path / "dev",
            options=DeployOptions(build_dir=tmp_path / "b", bench_iterations=5, budget_ms=1e-6, budget_search=False),
        )
    r = deploy(
        models["tiny"],
        "x86-cpu",
        tmp_path / "dev",
        options=DeployOptions(build_dir=tmp_path / "b", bench_iterations=5, budget_ms=1e-6, accept_budget_failure=True),
    )
    assert r.budget_gates is True and r.device_class.startswith("same device class: this host (linux/x86_64)")
    assert r.benchmark is not None and r.benchmark["on_target_device"] is True
    assert any(n.startswith("the budget verdict gates this deploy: same device class") for n in r.notes)
    p = run_cli(
        "deploy",
        str(models["tiny"]),
        "-t",
        "x86-cpu",
        "-d",
        str(tmp_path / "dev2"),
        "--build-dir",
        str(tmp_path / "b2"),
        "-n",
        "5",
    )
    assert p.returncode == 0, p.stderr
    assert "note: the budget verdict gates this deploy: same device class" in p.stdout
    assert "unverified on this host" not in p.stdout


def test_a_bundle_unverified_here_says_so(models: dict[str, Path], tmp_path: Path) -> None:
    # a device class this host is not, whose runner has no host proxy: parity cannot run here at all
    # (apple-ane now gates on the converter's fp16 host proxy, jetson/coral on theirs)
    if current_host().os == "darwin":
        pytest.skip("hardware: macOS: the 'elsewhere' profile below runs here")
    targets = tmp_path / "targets"
    targets.mkdir()
    text = (REPO / "targets" / "x86-cpu.toml").read_text().replace('name = "x86-cpu"', 'name = "elsewhere"', 1)
    run = text.index("[run]")
    text = text[:run] + text[run:].replace('os = ["linux", "darwin", "windows"]', 'os = ["darwin"]', 1)
    (targets / "elsewhere.toml").write_text(text)
    r = deploy(
        models["tiny"],
        "elsewhere",
        tmp_path / "mac",
        ConvertRequest(targets_dir=[targets]),
        DeployOptions(build_dir=tmp_path / "b", bench_iterations=5),
    )
    assert r.unverified is not None and r.unverified.startswith("runner cannot run on this host: ")
    assert r.unverified == r.bundle.manifest["parity"]["skipped"]
    assert r.benchmark is None and r.budget_gates is None
    assert any(n.startswith("not benchmarked: the target's runner cannot run on this host") for n in r.notes)
    assert r.to_json()["unverified"] == r.unverified
    p = run_cli(
        "deploy",
        str(models["tiny"]),
        "-t",
        "elsewhere",
        "-d",
        str(tmp_path / "mac2"),
        "--build-dir",
        str(tmp_path / "b2"),
        "-n",
        "5",
        "--targets-dir",
        str(targets),
    )
    assert p.returncode == 0, p.stderr
    assert "unverified on this host: runner cannot run on this host: elsewhere runs on darwin" in " ".join(
        p.stdout.split()
    )  # rich may wrap the long reason
