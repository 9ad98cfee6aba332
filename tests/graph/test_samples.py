"""edge.graph.samples: deterministic example ONNX models built with onnx + numpy."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from edge.graph.samples import build_mobilenet_v2, build_tiny_cnn, build_two_input_model  # noqa: E402

# Small MobileNetV2 variant: same graph structure, builds in well under a second.
SMALL_MNV2 = {"input_size": 64, "width_mult": 0.35, "num_classes": 10}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _dims(value_info) -> list[int | str]:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


@pytest.fixture(scope="module")
def mobilenet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_mobilenet_v2(tmp_path_factory.mktemp("mnv2") / "mobilenetv2.onnx")


BUILDERS = {
    "tiny_cnn": lambda p, seed: build_tiny_cnn(p, seed=seed),
    "tiny_cnn_dynamic": lambda p, seed: build_tiny_cnn(p, seed=seed, dynamic_batch=True),
    "two_input": lambda p, seed: build_two_input_model(p, seed=seed),
    "mobilenet_small": lambda p, seed: build_mobilenet_v2(p, seed=seed, **SMALL_MNV2),
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path, name: str) -> None:
    build = BUILDERS[name]
    a, b = build(tmp_path / "a.onnx", 0), build(tmp_path / "b.onnx", 0)
    c = build(tmp_path / "c.onnx", 1)
    assert a.read_bytes() == b.read_bytes()
    assert _sha(a) != _sha(c)


def test_default_mobilenet_is_reproducible(tmp_path: Path, mobilenet: Path) -> None:
    assert _sha(build_mobilenet_v2(tmp_path / "again.onnx")) == _sha(mobilenet)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_checker_full_check_passes(tmp_path: Path, name: str) -> None:
    path = BUILDERS[name](tmp_path / "m.onnx", 0)
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)


def test_builder_returns_path_and_creates_parents(tmp_path: Path) -> None:
    out = build_tiny_cnn(str(tmp_path / "deep" / "er" / "tiny.onnx"))
    assert isinstance(out, Path) and out.is_file()


def test_mobilenet_io_metadata_and_architecture(mobilenet: Path) -> None:
    model = onnx.load(str(mobilenet))
    graph = model.graph
    assert [(i.name, _dims(i)) for i in graph.input] == [("input", [1, 3, 224, 224])]
    assert [(o.name, _dims(o)) for o in graph.output] == [("logits", [1, 1000])]
    assert graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    props = {p.key: p.value for p in model.metadata_props}
    assert props["name"] == "mobilenetv2-edgekit-example"
    assert props["weights"] == "deterministic random, seed 0"
    assert model.opset_import[0].version == 17 and model.doc_string
    ops = [n.op_type for n in graph.node]
    # 52 convs (BatchNorm folded away), 35 ReLU6 as Clip, 10 residual adds: the reference layout.
    assert (ops.count("Conv"), ops.count("Clip"), ops.count("Add")) == (52, 35, 10)
    assert "BatchNormalization" not in ops
    assert ops[-3:] == ["GlobalAveragePool", "Flatten", "Gemm"]
    groups = [next(a.i for a in n.attribute if a.name == "group") for n in graph.node if n.op_type == "Conv"]
    assert sum(g > 1 for g in groups) == 17  # one depthwise conv per inverted-residual block
    # torchvision's mobilenet_v2 has 3,504,872 parameters; folding BN drops one per channel.
    n_params = sum(int(np.prod(t.dims)) for t in graph.initializer)
    assert n_params == 3_487_816 + 2  # + the two shared Clip bounds


def _picture_inputs(count: int) -> list[np.ndarray]:
    """The pipeline's generated frames (gradients plus noise), ImageNet-normalised NCHW."""
    from edge.preprocess import random_frames

    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    return [
        ((f / 255.0 - mean) / std).transpose(2, 0, 1)[None].astype(np.float32)
        for f in random_frames(count, 224, 224, seed=1234)
    ]


def test_mobilenet_logits_sane_and_argmax_varies(mobilenet: Path) -> None:
    session = _session(mobilenet)
    logits = np.concatenate([session.run(["logits"], {"input": x})[0] for x in _picture_inputs(32)])
    assert logits.shape == (32, 1000) and logits.dtype == np.float32
    assert np.isfinite(logits).all()
    assert 1.0 <= float(logits.std(axis=1).mean()) <= 10.0
    assert len(set(logits.argmax(axis=1).tolist())) >= 5
    # Out-of-distribution N(0, 1) inputs still give finite logits.
    noise = np.random.default_rng(1234).standard_normal((1, 3, 224, 224)).astype(np.float32)
    assert np.isfinite(session.run(["logits"], {"input": noise})[0]).all()


def test_mobilenet_relu6_saturates_sometimes(mobilenet: Path) -> None:
    model = onnx.load(str(mobilenet))
    clips = [n.output[0] for n in model.graph.node if n.op_type == "Clip"]
    model.graph.output.extend(onnx.helper.make_tensor_value_info(c, onnx.TensorProto.FLOAT, None) for c in clips)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = session.run(clips, {"input": _picture_inputs(1)[0]})
    saturated = sum(int((o >= 6.0).sum()) for o in outs) / sum(o.size for o in outs)
    assert 1e-4 < saturated < 0.05


def test_mobilenet_options(tmp_path: Path) -> None:
    path = build_mobilenet_v2(tmp_path / "m.onnx", opset=13, **SMALL_MNV2)
    session = _session(path)
    assert session.get_inputs()[0].shape == [1, 3, 64, 64]
    out = session.run(None, {"input": np.zeros((1, 3, 64, 64), np.float32)})[0]
    assert out.shape == (1, 10)
    assert onnx.load(str(path)).opset_import[0].version == 13


@pytest.mark.parametrize("kwargs", [{"num_classes": 0}, {"input_size": 16}, {"width_mult": 0.0}, {"opset": 9}])
def test_mobilenet_rejects_bad_arguments(tmp_path: Path, kwargs: dict) -> None:
    with pytest.raises(ValueError):
        build_mobilenet_v2(tmp_path / "m.onnx", **kwargs)


def test_tiny_cnn_static_runs(tmp_path: Path) -> None:
    path = build_tiny_cnn(tmp_path / "t.onnx", input_size=48, num_classes=5)
    graph = onnx.load(str(path)).graph
    assert [(i.name, _dims(i)) for i in graph.input] == [("input", [1, 3, 48, 48])]
    assert [(o.name, _dims(o)) for o in graph.output] == [("logits", [1, 5])]
    out = _session(path).run(None, {"input": np.ones((1, 3, 48, 48), np.float32)})
    assert len(out) == 1 and out[0].shape == (1, 5) and np.isfinite(out[0]).all()


def test_tiny_cnn_dynamic_batch_is_symbolic(tmp_path: Path) -> None:
    path = build_tiny_cnn(tmp_path / "t.onnx", dynamic_batch=True)
    graph = onnx.load(str(path)).graph
    batch = graph.input[0].type.tensor_type.shape.dim[0]
    assert batch.HasField("dim_param") and not batch.HasField("dim_value")
    assert batch.dim_param == "batch"
    assert _dims(graph.output[0]) == ["batch", 10]
    session = _session(path)
    assert session.get_inputs()[0].shape == ["batch", 3, 32, 32]
    x = np.random.default_rng(0).standard_normal((3, 3, 32, 32), np.float32)
    batched = session.run(None, {"input": x})[0]
    assert batched.shape == (3, 10)
    single = session.run(None, {"input": x[1:2]})[0]
    np.testing.assert_allclose(batched[1:2], single, rtol=1e-5, atol=1e-5)


def test_two_input_model_io(tmp_path: Path) -> None:
    path = build_two_input_model(tmp_path / "two.onnx")
    session = _session(path)
    assert [(i.name, i.shape) for i in session.get_inputs()] == [("image", [1, 3, 16, 16]), ("scale", [1, 4])]
    assert [(o.name, o.shape) for o in session.get_outputs()] == [("features", [1, 4]), ("embedding", [1, 8])]
    image = np.random.default_rng(0).standard_normal((1, 3, 16, 16), np.float32)
    ones = np.ones((1, 4), np.float32)
    features, embedding = session.run(None, {"image": image, "scale": ones})
    assert features.shape == (1, 4) and embedding.shape == (1, 8)
    # Both inputs matter: features scale linearly with "scale".
    doubled, _ = session.run(None, {"image": image, "scale": 2 * ones})
    np.testing.assert_allclose(doubled, 2 * features, rtol=1e-6)
    assert np.abs(features).sum() > 0
