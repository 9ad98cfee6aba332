"""Issue #33 red team, readers: every file edgekit reads as a model or a profile is bounded.

Before: a TOML profile with 20,000 dotted-key parts (40 kB) parsed for minutes (tomllib is quadratic there; the
depth check counted brackets only); a FIFO as the model hung ``convert`` and ``--explain``; ``/dev/zero`` as the
model was read until memory ran out; an ONNX ``Loop`` with a trip count of 10^15 made parity run for ever;
``edgekit firmware c-array`` wrote fuzzed and truncated .tflite files that ``convert`` refuses (it checked the
identifier only). Each is now one line, exit 2, in seconds. The real console script runs in a subprocess, under a
2 GiB address-space limit and a timeout, so a regression fails instead of hanging or eating the host.
"""

from __future__ import annotations

import os
import resource
import subprocess
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from edge.errors import TargetError
from edge.targets import parse_profile
from tests.support import fuzz_models
from tests.support.cli import EDGEKIT, assert_user_error

LIMIT = 1 << 31


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", **(env or {})}
    return subprocess.run(
        [EDGEKIT, *args], capture_output=True, text=True, env=full, timeout=timeout, preexec_fn=_limited
    )


def test_a_toml_profile_with_20000_dotted_key_parts_is_refused_at_once(tmp_path: Path) -> None:
    f = tmp_path / "board.toml"
    f.write_text(".".join(["a"] * 20000) + " = 1\n")
    t = time.monotonic()
    with pytest.raises(TargetError, match="dotted key nested deeper than"):
        parse_profile(f)
    assert time.monotonic() - t < 10  # (minutes before; it is a bound, not a speed claim)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
@pytest.mark.parametrize("explain", [True, False], ids=["explain", "convert"])
def test_a_model_that_is_not_a_regular_file_is_refused(tmp_path: Path, kind: str, explain: bool) -> None:
    model = tmp_path / "model.onnx"
    if kind == "fifo":
        os.mkfifo(model)
    else:
        os.symlink("/dev/zero", model)
    args = ["convert", str(model), "-t", "x86-cpu"] + (["--explain"] if explain else ["-o", str(tmp_path / "o")])
    assert_user_error(_cli(*args), "is not a regular file")


def _endless_loop(path: Path) -> Path:
    """y = x + 1, 10^15 times: a valid model whose every run never ends."""
    body = h.make_graph(
        [h.make_node("Add", ["v_in", "one"], ["v_out"]), h.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [
            h.make_tensor_value_info("i", T.INT64, []),
            h.make_tensor_value_info("cond_in", T.BOOL, []),
            h.make_tensor_value_info("v_in", T.FLOAT, [1, 4]),
        ],
        [h.make_tensor_value_info("cond_out", T.BOOL, []), h.make_tensor_value_info("v_out", T.FLOAT, [1, 4])],
        [h.make_tensor("one", T.FLOAT, [1, 4], [1.0] * 4)],
    )
    g = h.make_graph(
        [h.make_node("Loop", ["trip", "cond", "x"], ["y"], body=body)],
        "loop",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 4])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 4])],
        [h.make_tensor("trip", T.INT64, [], [10**15]), h.make_tensor("cond", T.BOOL, [], [True])],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def test_parity_of_a_loop_that_never_ends_is_stopped(tmp_path: Path) -> None:
    model = _endless_loop(tmp_path / "loop.onnx")
    p = _cli("convert", str(model), "-t", "x86-cpu", "-o", str(tmp_path / "o"), env={"EDGEKIT_PARITY_TIMEOUT_S": "3"})
    assert_user_error(p, "ran longer than 3 s", "was stopped")
    assert not (tmp_path / "o").exists()


def _build(name: str, d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    return fuzz_models.ALL[name](d, np.random.default_rng(23))


def test_firmware_c_array_refuses_what_convert_refuses(tmp_path: Path) -> None:
    """Every malformed .tflite of the fuzz corpus that a flatbuffer reader can tell is damaged (indices, offsets,
    truncation, no subgraph, an unknown builtin). A huge dim and a string input are well-formed flatbuffers that
    convert refuses for what it would compute, not for their bytes: c-array writes them (a microcontroller build
    decides)."""
    from edge.backends.litert.firmware import write_c_array
    from edge.errors import InputFileError

    structural = [n for n in fuzz_models.TFLITE if n not in ("tflite_valid", "tflite_huge_dim", "tflite_string_input")]
    for name in structural:
        path = _build(name, tmp_path / name)
        with pytest.raises(InputFileError) as e:
            write_c_array(path, tmp_path / f"{name}.cc")
        assert "\n" not in str(e.value) and str(path) in str(e.value)
        assert not (tmp_path / f"{name}.cc").exists()
    valid = _build("tflite_valid", tmp_path / "valid")
    assert write_c_array(valid, tmp_path / "valid.cc").size == valid.stat().st_size
    p = _cli("firmware", "c-array", str(_build("tflite_truncated", tmp_path / "t")))
    assert_user_error(p)


def _constant_of_shape(path: Path) -> Path:
    """ConstantOfShape [2^33] (32 GiB of float zeros) summed into the output: a valid model no runtime here can run."""
    g = h.make_graph(
        [
            h.make_node("ConstantOfShape", ["shape"], ["big"], value=h.make_tensor("v", T.FLOAT, [1], [0.0])),
            h.make_node("ReduceSum", ["big"], ["s"], keepdims=0),
            h.make_node("Add", ["x", "s"], ["y"]),
        ],
        "cos",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 4])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 4])],
        [h.make_tensor("shape", T.INT64, [1], [2**33])],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


@pytest.mark.parametrize("explain", [True, False], ids=["explain", "convert"])
def test_a_model_its_own_runtime_cannot_run_is_one_line(tmp_path: Path, explain: bool) -> None:
    """Was ``internal error in convert: Fail: [ONNXRuntimeError] ... Failed to allocate memory``, exit 3."""
    model = _constant_of_shape(tmp_path / "cos.onnx")
    args = ["convert", str(model), "-t", "x86-cpu"] + (["--explain"] if explain else ["-o", str(tmp_path / "o")])
    assert_user_error(_cli(*args), "the source model fails in onnxruntime", "ConstantOfShape")
