"""ExecuTorch (issue #32): a torch.export program -> ``.pte`` with the XNNPack delegate in the ``executorch``
toolchain, parity on ExecuTorch's own x86 runtime, the device runner behind an exact check, and the one-line
refusals (TorchScript, ONNX) that need no toolchain.

The toolchain (``edgekit toolchain install executorch``: 1.5 GB, 60-105 s to install here) is not in CI's install
list, so every test that needs it is ``corpus_full``; run them with
``pytest -m corpus_full tests/backends/test_executorch.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from edge import toolchains
from edge.backends.executorch import native
from edge.backends.executorch.format import ARTIFACT_NAME, HOST_RUNTIME_LABEL
from edge.backends.executorch.run import ExecuTorchRunner
from edge.bundle.bundle import Bundle
from edge.doctor import doctor
from edge.errors import MissingDependencyError
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest
from edge.targets import get_target
from edge.verify.isa import check_after_convert
from tests.support.cli import assert_user_error, run_cli


def test_toolchain_pins_executorch_beside_the_cpu_torch_and_locks_the_set() -> None:
    spec = toolchains.get_spec("executorch")
    assert spec.install_command == "edgekit toolchain install executorch"
    lock = toolchains.lock_lines(spec.lock_text.splitlines())
    assert all(ln.count("==") == 1 for ln in lock)
    # executorch declares no torch: its runtime links libtorch, so the CPU wheel is pinned beside it
    assert "torch==2.13.0+cpu" in lock and "executorch==1.5.1" in lock
    for req in spec.requirements:  # every top-level pin agrees with the lock (torch's local +cpu label aside)
        name, version = req.split("==")
        assert any(ln.lower().split("+")[0] == f"{name.lower()}=={version}" for ln in lock), req


# -- no toolchain needed: the refusals, the runner's check, the profile ------------------------------------------


def _torchscript_layout(path: Path) -> Path:
    """A zip laid out as torch.jit.save writes one (what edgekit reads to tell TorchScript from torch.export)."""
    with zipfile.ZipFile(path, "w") as z:
        for name in ("m/code/__torch__/m.py", "m/constants.pkl", "m/data.pkl", "m/version"):
            z.writestr(name, b"0")
    return path


def test_a_torchscript_source_is_refused_in_one_line_before_the_toolchain_is_asked_for(tmp_path: Path) -> None:
    src = _torchscript_layout(tmp_path / "model.pt")
    env = {toolchains.ENV_VAR: str(tmp_path / "no-toolchains")}
    p = run_cli("convert", str(src), "-t", "executorch-xnnpack", "-o", str(tmp_path / "b"), env=env)
    assert_user_error(p, "model.pt is a TorchScript archive", "cannot be exported again", "torch.export.save(")
    assert not (tmp_path / "b").exists()


def test_an_onnx_source_is_refused_in_one_line_naming_what_to_bring(tmp_path: Path, models: dict[str, Path]) -> None:
    p = run_cli("convert", str(models["tiny"]), "-t", "executorch-xnnpack", "-o", str(tmp_path / "b"))
    assert_user_error(p, "target executorch-xnnpack cannot take", "(onnx)", "torch.export.save(torch.export.export(")


def test_the_runner_names_what_is_missing_and_doctor_says_the_same(tmp_path: Path) -> None:
    if native.executorch_dir() is not None:
        pytest.skip("hardware: executorch is installed in edgekit's own environment here")
    problems = ExecuTorchRunner.problems()
    assert problems == ["the executorch package is not installed"], problems
    with pytest.raises(MissingDependencyError, match="executorch==1.5.1.*edge.backends.executorch.native build"):
        ExecuTorchRunner(tmp_path / ARTIFACT_NAME)
    row = next(h for h in doctor() if h.target.name == "executorch-xnnpack")
    assert row.run_problem is not None and "the executorch package is not installed" in row.run_problem


def test_the_interface_must_be_built_for_this_executorch_source_and_machine(tmp_path: Path) -> None:
    et = tmp_path / "site" / "executorch"
    (et / "lib").mkdir(parents=True)
    assert "lacks its runtime libraries" in (native.library_problem(et) or "")
    for n in native.LIBS:
        (et / "lib" / f"lib{n}.so").write_bytes(b"\x7fELF")
    (tmp_path / "site" / "executorch-1.5.1.dist-info").mkdir()
    assert native.BUILD_COMMAND in (native.library_problem(et) or "") and "not built" in (
        native.library_problem(et) or ""
    )
    out = native.native_dir(et)
    out.mkdir()
    (out / native.LIB_NAME).write_bytes(b"\x7fELF")
    stamp = {"executorch": "1.4.0", "source_sha256": native.source_sha256(), "machine": "aarch64"}
    (out / native.STAMP).write_text(json.dumps(stamp))
    assert "built for another executorch" in (native.library_problem(et, machine="aarch64") or "")
    (out / native.STAMP).write_text(json.dumps({**stamp, "executorch": "1.5.1"}))
    assert native.library_problem(et, machine="aarch64") is None
    assert "another machine" in (native.library_problem(et, machine="x86_64") or "")


def test_the_profile_targets_aarch64_devices_and_takes_pytorch_only() -> None:
    t = get_target("executorch-xnnpack")
    assert t.runner == "executorch" and [s.converter for s in t.chain] == ["torch->executorch"]
    assert t.device_class.arch == ("aarch64",) and t.precisions == ("fp32",)


# -- with the executorch toolchain (corpus_full: CI does not install it) -------------------------------------------

_EXPORT = """
import sys, torch
class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 5)
    def forward(self, image):
        y = torch.relu(self.bn(self.conv(image))).mean((2, 3))
        return torch.softmax(self.head(y), -1), y
torch.manual_seed(0)
m = Tiny().eval()
with torch.no_grad():
    m.bn.running_mean.uniform_(-0.5, 0.5); m.bn.running_var.uniform_(0.5, 2.0)
torch.export.save(torch.export.export(m, (torch.randn(1, 3, 32, 32),)), sys.argv[1])
"""


@pytest.fixture(scope="module")
def tiny_pt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny real PyTorch model (conv, batch norm, relu, mean, linear, softmax; two outputs) exported with the
    toolchain's own torch."""
    st = toolchains.status("executorch")
    if not st.usable:
        pytest.skip(f"the executorch toolchain is not installed ({st.problem}): edgekit toolchain install executorch")
    out = tmp_path_factory.mktemp("et") / "tiny.pt2"
    subprocess.run([str(st.venv / "bin" / "python"), "-c", _EXPORT, str(out)], check=True, timeout=300)
    return out


@pytest.mark.corpus_full
def test_a_torch_export_program_lowers_to_a_pte_with_xnnpack_and_passes_parity_on_the_x86_runtime(
    tiny_pt2: Path, tmp_path: Path
) -> None:
    request = ConvertRequest(input_shapes={"image": (1, 3, 32, 32)})
    b = convert(tiny_pt2, "executorch-xnnpack", tmp_path / "b", request).path
    m = json.loads((b / "manifest.json").read_text())
    assert m["format"] == "pte" and m["primary_artifact"] == ARTIFACT_NAME
    assert (b / ARTIFACT_NAME).read_bytes()[4:8] == b"ET12"  # the ExecuTorch program flatbuffer's identifier
    step = next(s for s in m["chain"] if s["converter"] == "torch->executorch")
    assert step["tool_versions"]["executorch"] == "1.5.1" and step["tool_versions"]["torch"] == "2.13.0+cpu"
    d = step["details"]["delegation"]
    assert d["delegated_subgraphs"] >= 1 and d["delegated_nodes"] >= 4, d
    assert step["details"]["toolchain"]["lock_hash"] == toolchains.status("executorch").lock_hash
    parity = m["parity"]
    assert parity["passed"] is True, parity
    assert HOST_RUNTIME_LABEL in parity["candidate"]["runtime"]
    assert [o["name"] for o in parity["outputs"]] == ["output_0", "output_1"]
    assert all(o["cosine"] > 0.9999 for o in parity["outputs"]), parity["outputs"]


@pytest.mark.corpus_full
def test_the_runner_runs_the_bundle_through_the_native_interface_without_torch(tiny_pt2: Path, tmp_path: Path) -> None:
    request = ConvertRequest(input_shapes={"image": (1, 3, 32, 32)})
    b = convert(tiny_pt2, "executorch-xnnpack", tmp_path / "b", request).path
    py = str(toolchains.status("executorch").venv / "bin" / "python")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([py, "-m", "edge.backends.executorch.native", "build"], check=True, env=env, timeout=300)
    check = (
        "import sys, json; from edge.bundle.bundle import Bundle; from edge.verify.refpairs import "
        "check_reference_pairs; b = Bundle.open(sys.argv[1])\n"
        "with b.open_runner() as r: print(json.dumps([r.info.runtime, check_reference_pairs(b, r)['passed'], "
        "'torch' in sys.modules]))"
    )
    out = subprocess.run([py, "-c", check, str(b)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    runtime, passed, torch_loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert runtime.startswith("executorch 1.5.1 (C++ runtime") and passed is True and torch_loaded is False


def test_the_emulators_executorch_runtime_is_a_toolchain_of_its_own_named_when_missing(tmp_path: Path) -> None:
    env = {toolchains.ENV_VAR: str(tmp_path / "no-toolchains")}
    spec = toolchains.get_spec("aarch64-executorch")
    assert spec.kind == "emulator-addon" and spec.requirements == ("executorch==1.5.1",)
    p = run_cli("toolchain", "show", "aarch64-executorch", "--json", env=env)
    assert p.returncode == 0, p.stderr
    shown = json.loads(p.stdout)
    assert shown["usable"] is False and "edgekit toolchain install aarch64-executorch" in shown["problem"]
    p = run_cli("toolchain", "install", "aarch64-executorch", env=env)
    last = p.stderr.strip().splitlines()[-1]  # after the line saying what it installs
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "cannot be installed on this host" in last and "toolchain 'aarch64' is not installed" in last, last
    assert "toolchain 'executorch' is not installed" in last, last


@pytest.mark.corpus_full
def test_an_executorch_bundle_passes_the_emulated_aarch64_check(tiny_pt2: Path, tmp_path: Path) -> None:
    if not toolchains.status("aarch64-executorch").usable:
        pytest.skip("the aarch64-executorch toolchain is not installed: edgekit toolchain install aarch64-executorch")
    request = ConvertRequest(input_shapes={"image": (1, 3, 32, 32)})
    b = convert(tiny_pt2, "executorch-xnnpack", tmp_path / "b", request).path
    line, evidence = check_after_convert(Bundle.open(b), get_target("executorch-xnnpack"))  # what convert runs
    assert line.startswith("checked on aarch64 (emulated cortex-a76): pass"), line
    (done,) = json.loads((b / "manifest.json").read_text())["verified_on"]
    assert done == evidence
    assert done["emulated"] is True and done["passed"] is True and done["cpu"] == "cortex-a76", done
    assert done["runtime"].startswith("executorch 1.5.1 (C++ runtime") and done["host_runtime"] == done["runtime"]
    assert all(o["max_abs_vs_host"] <= o["limit"] for o in done["outputs"]), done["outputs"]
    p = run_cli("verify", str(b), "--isa", "aarch64", "--cpu", "cortex-a72")
    assert p.returncode == 0 and "checked on aarch64 (emulated cortex-a72): pass" in p.stdout, (p.stdout, p.stderr)
