"""PyTorch sources (TorchScript ``.pt``, ``torch.export`` ``.pt2``) -> Core ML for apple-ane, in the ``coreml`` toolchain.

torch lives only in the toolchain's environment, so the models are built there (a subprocess with the
toolchain's Python). Without the toolchain these tests skip saying so; ``CI=true``
makes them fail instead. The checks that need no toolchain (dispatch, wrong target, not a torch file) always run.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

from edge import toolchains
from edge.backends.converter import CONVERTERS, ConversionRequest
from edge.backends.coreml.convert import TorchToCoreML
from edge.backends.coreml.format import package_dir
from edge.bundle.bundle import Bundle
from edge.errors import ModelError
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest
from edge.pipeline.sources import is_torch_source
from edge.spec import IOSpec, TensorSpec


@pytest.fixture(scope="module")
def torch_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny.pt / tiny.pt2 / weights.pt (and the others of tests/support/torch_models.py), built in the torch toolchain."""
    import tests.support.torch_models as tm

    problem = tm.toolchain_problem()
    if problem:
        pytest.skip(problem)
    return tm.build(tmp_path_factory.mktemp("torch"))


def test_registered() -> None:
    assert CONVERTERS.get("torch->coreml") is TorchToCoreML
    assert TorchToCoreML.source_format == "torchscript" and TorchToCoreML.toolchain == "torch"


def test_dispatch_by_suffix_and_zip(tmp_path: Path, models: dict[str, Path]) -> None:
    assert is_torch_source(tmp_path / "m.pt") and is_torch_source(tmp_path / "m.ts") and is_torch_source("m.pt2")
    assert not is_torch_source(models["tiny"])
    ts = tmp_path / "model.bin"
    with zipfile.ZipFile(ts, "w") as z:
        z.writestr("model/code/__torch__.py", "")
        z.writestr("model/constants.pkl", "")
    assert is_torch_source(ts)


@pytest.mark.parametrize("target,precision", [("x86-cpu", "fp32"), ("intel-igpu", "fp16"), ("jetson-orin", "fp16")])
def test_other_targets_take_torch_through_onnx(torch_models: Path, tmp_path: Path, target: str, precision: str) -> None:
    """PyTorch sources for every target: torch->onnx in the toolchain, then the target's ONNX chain; the
    PyTorch model itself is the parity reference."""
    b = convert(
        torch_models / "tiny.pt2",
        target,
        tmp_path / "b",
        ConvertRequest(precision=precision, input_shapes={"image": (1, 3, 32, 32)}),
    )
    m = b.manifest
    assert [c["converter"] for c in m["chain"]][0] == "torch->onnx"
    assert m["source"]["format"] == "torch-exported-program" and "torch->onnx" in m["source"]["route"]
    assert m["parity"]["passed"] is True and m["parity"]["reference"].startswith("torch")
    assert m["reference_pairs"]["samples"] > 0
    if target == "jetson-orin":
        assert any("host proxy" in n for n in m["parity"]["host_notes"])


def test_not_a_torch_file(tmp_path: Path) -> None:
    (tmp_path / "m.pt").write_text("not a model")
    with pytest.raises(ModelError, match="not a TorchScript or ExportedProgram file"):
        convert(tmp_path / "m.pt", "apple-ane", tmp_path / "out", ConvertRequest(input_shapes={"x": (1, 3, 8, 8)}))
    assert not (tmp_path / "out").exists()


def test_torch_save_checkpoint_refused(torch_models: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="torch.save checkpoint") as e:
        convert(
            torch_models / "weights.pt",
            "apple-ane",
            tmp_path / "out",
            ConvertRequest(input_shapes={"image": (1, 3, 32, 32)}),
        )
    assert "torch.jit.save" in (e.value.hint or "")


def test_missing_input_shape_names_the_inputs(torch_models: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"--input-shape for every input \(image\)"):
        convert(torch_models / "tiny.pt", "apple-ane", tmp_path / "out")
    with pytest.raises(ModelError, match="the model's inputs are image; --input-shape gave x"):
        convert(
            torch_models / "tiny.pt", "apple-ane", tmp_path / "out", ConvertRequest(input_shapes={"x": (1, 3, 32, 32)})
        )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name,fmt", [("tiny.pt", "torchscript"), ("tiny.pt2", "torch-exported-program")])
def test_torch_to_mlpackage(torch_models: Path, tmp_path: Path, name: str, fmt: str) -> None:
    b = convert(
        torch_models / name, "apple-ane", tmp_path / "b", ConvertRequest(input_shapes={"image": (1, 3, 32, 32)})
    )
    m = Bundle.open(tmp_path / "b").manifest
    assert m["source"]["format"] == fmt and m["format"] == "mlpackage" and m["precision"] == "fp16"
    assert m["chain"][0]["converter"] == "torch->coreml"
    assert package_dir(b.artifact).name == "model.mlpackage"
    assert m["io"]["inputs"][0]["name"] == "image" and m["io"]["inputs"][0]["shape"] == [1, 3, 32, 32]
    assert [(o["name"], o["shape"]) for o in m["io"]["outputs"]] == [("output_0", [1, 10])]
    d = m["chain"][0]["details"]
    assert d["spec_check"]["loads_as_spec"] and d["spec_check"]["io_matches_manifest"]
    assert d["spec_check"]["io"]["inputs"] == [{"name": "image", "shape": [1, 3, 32, 32], "dtype": "float32"}]
    assert d["spec_check"]["io"]["outputs"] == [{"name": "output_0", "shape": [1, 10], "dtype": "float32"}]
    assert d["ops"]["conv"] == 1 and d["io_names"]["outputs"] == ["output_0"]
    assert d["torch_reference"]["outputs"][0]["shape"] == [1, 10] and d["torch_reference"]["samples"] == 8
    # Core ML predicts only on macOS: the gate ran the converter's host proxy (the traced module in fp16 on the CPU)
    assert m["parity"]["passed"] is True and m["parity"]["candidate"]["precision_used"] == "f16"
    assert m["parity"]["candidate"]["runtime"].startswith("host proxy: torch")
    assert any(n.startswith("host proxy: torch") for n in m["parity"]["host_notes"])
    assert m["parity"]["reference"].startswith("torch ")  # the PyTorch model itself, named with its version
    assert m["reference_pairs"]["samples"] > 0  # the Mac checks the package against them on first load
    json.dumps(m)
    # the saved package's spec loads in the toolchain (coremltools lives there only)
    st = toolchains.status("coreml")
    code = (
        "import sys, coremltools as ct; s = ct.utils.load_spec(sys.argv[1]); "
        "print([i.name for i in s.description.input], [o.name for o in s.description.output])"
    )
    out = subprocess.run(
        [str(toolchains._venv_python(st.venv)), "-c", code, str(package_dir(b.artifact))],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    assert "['image'] ['output_0']" in out


@pytest.mark.parametrize(
    "name,what", [("tiny.pt", "the TorchScript module"), ("tiny.pt2", "the decomposed ExportedProgram")]
)
def test_fp16_host_proxy_on_the_reference_inputs(torch_models: Path, tmp_path: Path, name: str, what: str) -> None:
    """The model itself cast to half, on the very inputs its fp32 outputs (the reference) were computed on."""
    from edge.verify.parity import compare, thresholds_for

    io = IOSpec((TensorSpec("image", (1, 3, 32, 32), "float32"),), ())
    result = CONVERTERS.get("torch->coreml")().convert(
        ConversionRequest(source=torch_models / name, workdir=tmp_path, precision="fp16", io=io)
    )
    proxy, reference = result.proxy, result.reference
    assert proxy is not None and reference is not None
    assert proxy.precision_used == "f16" and f"CPU fp16 ({what}, cast to half)" in proxy.label
    assert proxy.inputs is reference[0]  # the contract: a PyTorch source's reference is on the proxy's inputs
    [out] = compare(reference[1], proxy.outputs, thresholds_for("fp16", proxy.precision_used))
    assert out.name == "output_0" and out.passed and out.cosine >= 0.9999, out
    want = np.stack([r["output_0"] for r in reference[1]])
    assert out.max_abs > 1e-4 * np.abs(want).max(), "labelled fp16 but as exact as the fp32 reference"
