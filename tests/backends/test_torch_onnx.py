"""torch->onnx: PyTorch sources (TorchScript ``.pt``, ``torch.export`` ``.pt2``) as fp32 ONNX, in the torch toolchain.

The converter is called directly (``CONVERTERS.get("torch->onnx")().convert(...)``); the exported graph runs in
onnxruntime on this host and must match ``result.reference`` (the PyTorch model's outputs on the parity inputs).
torch lives only in the toolchain, so the models are built there (tests/support/torch_models.py). Without the toolchain
those tests skip saying so; ``CI=true`` makes them fail instead. Checks that need no toolchain always run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge.backends.converter import CONVERTERS, ConversionRequest, ConversionResult
from edge.backends.coreml.convert import TorchToCoreML
from edge.backends.onnxruntime.from_torch import DEFAULT_OPSET, PARITY_SAMPLES, PARITY_SEED, TorchToOnnx
from edge.errors import ConversionError, ModelError, PrecisionError
from edge.spec import Calibration, IOSpec, TensorSpec
from tests.support import torch_models

IMAGE = TensorSpec("image", (1, 3, 32, 32), "float32", "NCHW")
AUDIO = TensorSpec("audio", (1, 64), "float32")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    problem = torch_models.toolchain_problem()
    if problem:
        pytest.skip(problem)
    return torch_models.build(tmp_path_factory.mktemp("torch"))


def _convert(source: Path, workdir: Path, *inputs: TensorSpec, **kwargs: Any) -> ConversionResult:
    workdir.mkdir(parents=True, exist_ok=True)
    return CONVERTERS.get("torch->onnx")().convert(
        ConversionRequest(
            source=source,
            workdir=workdir,
            precision=kwargs.pop("precision", "fp32"),
            io=IOSpec(tuple(inputs), ()),
            **kwargs,
        )
    )


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _assert_onnxruntime_matches_reference(result: ConversionResult) -> list[str]:
    """Every output of every parity sample: onnxruntime on the exported graph vs the PyTorch reference."""
    import onnxruntime as ort

    inputs, reference = result.reference  # type: ignore[misc]
    sess = ort.InferenceSession(str(result.artifact), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    assert len(inputs) == len(reference) == PARITY_SAMPLES
    for feeds, want in zip(inputs, reference):
        got = dict(zip(names, sess.run(None, feeds)))
        assert sorted(got) == sorted(want)
        for k, v in want.items():
            assert got[k].shape == v.shape and got[k].dtype == v.dtype, (k, got[k].shape, v.shape)
            assert _cosine(got[k], v) > 0.99999, (k, _cosine(got[k], v))
            np.testing.assert_allclose(got[k], v, rtol=1e-4, atol=1e-5)
    return names


# -- no toolchain needed -------------------------------------------------------------------------


def test_registered_beside_torch_to_coreml() -> None:
    assert CONVERTERS.get("torch->onnx") is TorchToOnnx
    assert TorchToOnnx.source_format == TorchToCoreML.source_format == "torchscript"
    assert TorchToOnnx.target_format == "onnx" and TorchToOnnx.precisions == frozenset({"fp32"})
    assert TorchToOnnx.toolchain == TorchToCoreML.toolchain == "torch"
    assert set(TorchToOnnx.options) == {"opset", "timeout_s"}


def test_refusals_before_any_work(tmp_path: Path) -> None:
    missing = tmp_path / "never-read.pt"
    with pytest.raises(PrecisionError, match="does not produce precision 'fp16'"):
        _convert(missing, tmp_path / "w", IMAGE, precision="fp16")
    with pytest.raises(ConversionError, match="option opset must be between 13 and 20, got 21"):
        _convert(missing, tmp_path / "w", IMAGE, options={"opset": 21})
    with pytest.raises(ConversionError, match="does not take option.*'opst'.*did you mean 'opset'"):
        _convert(missing, tmp_path / "w", IMAGE, options={"opst": 17})
    (tmp_path / "m.pt").write_text("not a model")
    with pytest.raises(ModelError, match="not a TorchScript or ExportedProgram file"):
        _convert(tmp_path / "m.pt", tmp_path / "w", IMAGE)
    assert not any((tmp_path / "w").iterdir())


# -- in the toolchain ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,kind", [("tiny.pt", "torchscript"), ("tiny.pt2", "exported_program"), ("tvstyle.pt", "torchscript")]
)
def test_torch_to_onnx_matches_the_reference(built: Path, tmp_path: Path, name: str, kind: str) -> None:
    import onnx

    r = _convert(built / name, tmp_path, IMAGE)
    assert r.format == "onnx" and r.artifact == tmp_path / "model.onnx" and r.files == [r.artifact]
    assert _assert_onnxruntime_matches_reference(r) == ["output_0"]
    m = onnx.load(str(r.artifact))
    onnx.checker.check_model(m, full_check=True)
    assert [i.name for i in m.graph.input] == ["image"] and [o.name for o in m.graph.output] == ["output_0"]
    assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim] == [1, 3, 32, 32]
    assert next(o.version for o in m.opset_import if o.domain == "") == DEFAULT_OPSET
    d = r.details
    assert d["opset"] == DEFAULT_OPSET and d["onnx_check"]["passed"] and "dynamo=False" in d["exporter"]
    assert d["onnx_check"]["io"]["outputs"] == [{"name": "output_0", "shape": [1, 10], "dtype": "float32"}]
    assert d["ops"]["Conv"] == 1 and d["ops"]["Gemm"] == 1 and d["export_warnings"] == []
    assert d["recipe"].startswith(f"PyTorch {kind} -> ")
    assert d["io_names"]["inputs"] == ["image"] and d["io_names"]["outputs"] == ["output_0"]
    assert d["toolchain"]["name"] == "torch" and d["toolchain"]["lock_hash"]
    assert d["toolchain"]["offline"]["attempts"] == []  # the export reached for nothing
    assert d["toolchain"]["packages"]["torch"].startswith("2.13.0")
    tr = d["torch_reference"]
    assert tr["samples"] == PARITY_SAMPLES and tr["inputs"] == "generated" and tr["seed"] == PARITY_SEED
    assert f"({kind})" in tr["runtime"] and tr["outputs"][0]["shape"] == [1, 10]
    assert r.tool_versions["torch"].startswith("2.13.0") and r.tool_versions["toolchain"].startswith("torch (lock ")
    # the reference inputs are the generated parity inputs torch->coreml uses too
    from edge.verify.inputs import generated_samples

    want = generated_samples(IOSpec((IMAGE,), ()), None, PARITY_SAMPLES, seed=PARITY_SEED)
    np.testing.assert_array_equal(r.reference[0][3]["image"], want[3]["image"])  # type: ignore[index]


@pytest.mark.parametrize("name", ["pair.pt", "pair.pt2"])
def test_two_inputs_two_outputs_calibration_and_opset(built: Path, tmp_path: Path, name: str) -> None:
    """Inputs given out of order come back in the model's order; calibration samples are the parity inputs."""
    import onnx

    scale, image = TensorSpec("scale", (1, 4), "float32"), TensorSpec("image", (1, 3, 16, 16), "float32", "NCHW")
    rng = np.random.default_rng(7)
    samples = tuple(
        {
            "image": rng.standard_normal((1, 3, 16, 16)).astype(np.float32),
            "scale": rng.uniform(0.5, 1.5, (1, 4)).astype(np.float32),
        }
        for _ in range(10)
    )
    r = _convert(
        built / name,
        tmp_path,
        scale,
        image,
        options={"opset": 13},
        calibration=Calibration("calib-dir", "tensors", len(samples), samples),
    )
    assert sorted(_assert_onnxruntime_matches_reference(r)) == ["output_0", "output_1"]
    m = onnx.load(str(r.artifact))
    assert [i.name for i in m.graph.input] == ["image", "scale"]
    assert next(o.version for o in m.opset_import if o.domain == "") == 13 and r.details["opset"] == 13
    assert r.details["io_names"]["inputs"] == ["image", "scale"]
    assert [(o["name"], o["shape"]) for o in r.details["onnx_check"]["io"]["outputs"]] == [
        ("output_0", [1, 4, 16, 16]),
        ("output_1", [1, 4]),
    ]
    tr = r.details["torch_reference"]
    assert tr["inputs"] == "calibration" and tr["seed"] is None and tr["samples"] == PARITY_SAMPLES
    np.testing.assert_array_equal(r.reference[0][5]["scale"], samples[5]["scale"])  # type: ignore[index]
    probs = np.stack([o["output_1"] for o in r.reference[1]])  # type: ignore[index]
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0, rtol=1e-5)
    assert "Resize" in r.details["ops"] and "MaxPool" in r.details["ops"]
    assert "Dropout" not in r.details["ops"]  # eval mode: nothing random in the graph


def test_torch_save_checkpoint_refused(built: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="torch.save checkpoint") as e:
        _convert(built / "weights.pt", tmp_path, IMAGE)
    assert "torch.jit.save" in (e.value.hint or "") and "torch.export.save" in (e.value.hint or "")
    assert list(tmp_path.iterdir()) == []


def test_torch_package_refused_with_its_own_reason(built: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"packaged.pt is a torch.package archive") as e:
        _convert(built / "packaged.pt", tmp_path, IMAGE)
    assert "torch.export.save" not in e.value.message and "PackageImporter" in (e.value.hint or "")
    assert list(tmp_path.iterdir()) == []


def test_missing_or_wrong_input_shape_names_the_inputs(built: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"no input shapes; pass --input-shape for every input \(image\)") as e:
        _convert(built / "tiny.pt2", tmp_path)
    assert e.value.hint == "--input-shape image=1,3,224,224"
    with pytest.raises(ModelError, match=r"the model's inputs are image, scale; --input-shape gave image") as e:
        _convert(built / "pair.pt", tmp_path, TensorSpec("image", (1, 3, 16, 16), "float32"))
    assert e.value.message.endswith("gave image") and "--input-shape scale=" in (e.value.hint or "")
    with pytest.raises(ModelError, match=r"needs positive static dims: image=\['N', 3, 32, 32\]"):
        _convert(built / "tiny.pt", tmp_path, TensorSpec("image", ("N", 3, 32, 32), "float32"))
    assert list(tmp_path.iterdir()) == []


def test_an_op_onnx_cannot_express_is_named(built: Path, tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match=r"cannot export fft.pt: .*'aten::fft_rfft'.*opset version 17") as e:
        _convert(built / "fft.pt", tmp_path, TensorSpec("signal", (1, 16), "float32"))
    assert "opset" in (e.value.hint or "")
    assert list(tmp_path.iterdir()) == []


# -- forward()'s arguments that are not tensors (issue #34: Silero VAD's TorchScript, forward(x, sr: int)) ----------


def test_an_int_argument_without_a_value_is_one_line_naming_it_its_type_and_the_flag(
    built: Path, tmp_path: Path
) -> None:
    """Given a tensor (--input-shape sr=1), the model's own check failed inside it ("Supported sampling rates"), the
    TorchScript traceback in the message; now one line names the argument, its type and the flag (without
    --input-shape sr as well: test_freeze_input_problems_and_state_between_calls_are_one_line)."""
    with pytest.raises(ModelError) as e:
        _convert(built / "rate.pt", tmp_path, AUDIO, TensorSpec("sr", (1,), "float32"))
    assert str(e.value) == (
        "rate.pt: forward() argument sr is a Python int, not a tensor: give it a value with --freeze-input sr=VALUE "
        "(not --input-shape) (--freeze-input sr=VALUE)"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["rate.pt", "rate.pt2"])
def test_freeze_input_gives_an_int_argument_its_value(built: Path, tmp_path: Path, name: str) -> None:
    """--freeze-input sr=16000: the value is passed to the model and is a constant of the exported graph, whose one
    input is the audio; the record says what was given."""
    import onnx

    r = _convert(built / name, tmp_path / "16k", AUDIO, freeze={"sr": "16000"})
    assert _assert_onnxruntime_matches_reference(r) == ["output_0"]
    assert [i.name for i in onnx.load(str(r.artifact)).graph.input] == ["audio"]
    assert r.details["frozen"] == [{"name": "sr", "dtype": "int64", "value": [16000.0]}]
    assert r.details["io_names"]["inputs"] == ["audio"]
    if name == "rate.pt":  # the value decides the branch: 8 kHz is another convolution
        r8 = _convert(built / name, tmp_path / "8k", AUDIO, freeze={"sr": "8000"})
        _assert_onnxruntime_matches_reference(r8)
        assert not np.allclose(r8.reference[1][0]["output_0"], r.reference[1][0]["output_0"])  # type: ignore[index]
    else:  # torch.export fixed sr when it exported the program: used as it is, and only that value is taken
        assert _convert(built / name, tmp_path / "fixed", AUDIO).details["frozen"] == []
        with pytest.raises(ModelError, match=r"--freeze-input sr=8000: the program was exported with sr=16000"):
            _convert(built / name, tmp_path / "8k", AUDIO, freeze={"sr": "8000"})


def test_freeze_input_problems_and_state_between_calls_are_one_line(built: Path, tmp_path: Path) -> None:
    """Every problem at once: a model that assigns its own attributes in forward() keeps state an exported graph
    does not (Silero's _state, _context), beside an int argument left without a value."""
    with pytest.raises(ModelError) as e:
        _convert(built / "stateful.pt", tmp_path, AUDIO)
    assert "forward() argument sr is a Python int" in e.value.message and "\n" not in str(e.value)
    assert "forward() assigns the attributes calls: state kept between calls" in e.value.message
    with pytest.raises(ModelError) as e:
        _convert(built / "rate.pt", tmp_path, AUDIO, freeze={"sr": "16k", "audio": "1", "rate": "2"})
    assert e.value.message == (
        "rate.pt: --freeze-input audio: forward() argument audio is a tensor; --freeze-input gives a PyTorch model's "
        "int, float and bool arguments a value (a tensor takes --input-shape); --freeze-input sr=16k: sr is a Python "
        "int: give one number; --freeze-input rate: forward() has no such argument (it takes audio, sr)"
    )
    assert list(tmp_path.iterdir()) == []


def test_convert_a_torchscript_with_an_int_argument_for_x86_cpu(built: Path, tmp_path: Path) -> None:
    """Through the pipeline (edgekit convert rate.pt -t x86-cpu --input-shape audio=1,64 --freeze-input sr=16000):
    parity passes, the bundle takes the audio only and its manifest records sr; a target whose chain cannot take
    the value (Core ML's torch->coreml) is refused before any work."""
    from edge.errors import InputFileError
    from edge.pipeline import convert
    from edge.pipeline.request import ConvertRequest

    req = ConvertRequest(input_shapes={"audio": (1, 64)}, freeze={"sr": "16000"}, preprocess="none")
    b = convert(built / "rate.pt", "x86-cpu", tmp_path / "b", req)
    m = b.manifest
    assert m["parity"]["passed"] is True and [t["name"] for t in m["io"]["inputs"]] == ["audio"]
    frozen = b.info.source.frozen  # the typed manifest reads it
    assert frozen is not None and frozen.inlined_if == 0 and frozen.check is None
    assert [(f.name, f.dtype, f.value, f.shape) for f in frozen.inputs] == [("sr", "int64", (16000.0,), ())]
    with pytest.raises(InputFileError, match=r"apple-ane converts it with torch->coreml, which cannot"):
        convert(built / "rate.pt", "apple-ane", tmp_path / "c", req)
    assert not (tmp_path / "c").exists()
