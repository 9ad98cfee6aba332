from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edge.errors import InputFileError, ModelError
from edge.graph.model import io_spec, load_onnx, make_static, parse_input_shapes, resolve_static_inputs, save_onnx


def test_missing_and_not_onnx(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="does not exist"):
        load_onnx(tmp_path / "nope.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\x01 definitely not a protobuf model \xff" * 10)
    with pytest.raises(InputFileError, match=f"{bad} is not an ONNX model"):
        load_onnx(bad)
    with pytest.raises(InputFileError, match="is a directory"):
        load_onnx(tmp_path)


def test_io_spec(models: dict[str, Path]) -> None:
    io = io_spec(load_onnx(models["two_input"]))
    assert [t.name for t in io.inputs] == ["image", "scale"]
    assert io.inputs[0].layout == "NCHW" and io.inputs[1].layout is None
    assert [t.name for t in io.outputs] == ["features", "embedding"]


def test_dynamic_dims_need_an_input_shape(models: dict[str, Path]) -> None:
    path = models["tiny_dynamic"]
    io = io_spec(load_onnx(path))
    assert not io.inputs[0].is_static
    with pytest.raises(ModelError, match=r"input 'input' has dynamic dims .*--input-shape input=1,3,32,32"):
        resolve_static_inputs(io, {}, path)
    with pytest.raises(ModelError, match="fixed dims"):
        resolve_static_inputs(io, {"input": (1, 3, 64, 64)}, path)
    with pytest.raises(ModelError, match="not an input"):
        resolve_static_inputs(io, {"input": (2, 3, 32, 32), "nope": (1,)}, path)
    fixed = resolve_static_inputs(io, {"input": (2, 3, 32, 32)}, path)
    assert fixed.inputs[0].shape == (2, 3, 32, 32)


def test_make_static_runs_with_the_fixed_shape(models: dict[str, Path], tmp_path: Path) -> None:
    model = load_onnx(models["tiny_dynamic"])
    io = resolve_static_inputs(io_spec(model), {"input": (4, 3, 32, 32)}, models["tiny_dynamic"])
    out = save_onnx(make_static(model, io), tmp_path / "static.onnx")
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert sess.get_inputs()[0].shape == [4, 3, 32, 32]
    y = sess.run(None, {"input": np.zeros((4, 3, 32, 32), np.float32)})[0]
    assert y.shape == (4, 10)


@pytest.mark.parametrize("bad", ["input", "input=", "=1,2", "input=1,a", "input=1,0,3"])
def test_parse_input_shape_rejects(bad: str) -> None:
    with pytest.raises(ModelError, match="bad --input-shape"):
        parse_input_shapes([bad])


def test_parse_input_shape() -> None:
    assert parse_input_shapes(["a=1,3,8,8", "b=1x4"]) == {"a": (1, 3, 8, 8), "b": (1, 4)}
