"""The litert runner on small .tflite models built here with LiteRT's own flatbuffer schema (no toolchain).

What is checked: the delegate actually applied and the ops it took; XNNPack refusing a model
(error, then the explicit CPU fallback); the thread count; the layout/quantization contract of
``model.io.json`` (callers feed the ONNX layout in float32); the Edge TPU refusing without
libedgetpu or without a compiled model, and the CPU fallback that every report then names;
non-TFLite files.
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pytest

pytest.importorskip("ai_edge_litert", reason="ai-edge-litert is not installed (pip install 'edgekit-ml[litert]')")

from ai_edge_litert import schema_py_generated as S  # noqa: E402

from edge.backends.litert.run import ALLOW_CPU_FALLBACK_ENV, EDGETPU_CUSTOM_OP, LiteRTRunner, read_tflite, usable_cpus  # noqa: E402
from edge.backends.runner import RUNNERS  # noqa: E402
from edge.errors import EdgeError, HardwareUnavailableError, InputFileError, ModelError  # noqa: E402

_TYPES = {
    np.float32: S.TensorType.FLOAT32,
    np.int8: S.TensorType.INT8,
    np.uint8: S.TensorType.UINT8,
    np.int32: S.TensorType.INT32,
}

Tensor = tuple[str, Sequence[int], Any, Any, Any]  # name, shape, dtype, constant data or None, (scale, zp) or None
Op = tuple[Any, list[int], list[int], Any]  # op name or ("custom", code), inputs, outputs, (options type, options)


def build_tflite(
    ops: list[Op], tensors: list[Tensor], inputs: list[int], outputs: list[int], signature: dict[str, Any] | None = None
) -> bytes:
    """A one-subgraph TFLite flatbuffer (what TensorFlow's converter writes, minus the converter)."""
    import flatbuffers

    m = S.ModelT()
    m.version = 3
    m.description = "edgekit test model"
    codes: list[Any] = []
    index: dict[Any, int] = {}
    for key, *_ in ops:
        if key in index:
            continue
        oc = S.OperatorCodeT()
        if isinstance(key, tuple):
            oc.builtinCode = oc.deprecatedBuiltinCode = S.BuiltinOperator.CUSTOM
            oc.customCode = key[1]
        else:
            code = getattr(S.BuiltinOperator, key)
            oc.builtinCode, oc.deprecatedBuiltinCode = code, min(code, 127)
        oc.version = 1
        index[key] = len(codes)
        codes.append(oc)
    m.operatorCodes = codes
    sg = S.SubGraphT()
    sg.tensors, buffers = [], [S.BufferT()]
    for name, shape, dtype, data, quant in tensors:
        t = S.TensorT()
        t.name, t.shape, t.type = name, list(shape), _TYPES[dtype]
        t.buffer = 0
        if data is not None:
            b = S.BufferT()
            b.data = np.frombuffer(np.asarray(data, dtype).tobytes(), np.uint8)
            t.buffer = len(buffers)
            buffers.append(b)
        if quant is not None:
            q = S.QuantizationParametersT()
            q.scale, q.zeroPoint = [float(quant[0])], [int(quant[1])]
            t.quantization = q
        sg.tensors.append(t)
    sg.inputs, sg.outputs, sg.operators = inputs, outputs, []
    for key, ins, outs, opts in ops:
        o = S.OperatorT()
        o.opcodeIndex, o.inputs, o.outputs = index[key], ins, outs
        if opts is not None:
            o.builtinOptionsType, o.builtinOptions = opts
        sg.operators.append(o)
    m.subgraphs, m.buffers = [sg], buffers
    if signature is not None:
        sd = S.SignatureDefT()
        sd.signatureKey, sd.subgraphIndex = "serving_default", 0

        def tmap(pairs: dict[str, int]) -> list[Any]:
            out = []
            for k, i in pairs.items():
                tm = S.TensorMapT()
                tm.name, tm.tensorIndex = k, i
                out.append(tm)
            return out

        sd.inputs, sd.outputs = tmap(signature["inputs"]), tmap(signature["outputs"])
        m.signatureDefs = [sd]
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def _add_opts() -> Any:
    return (S.BuiltinOptions.AddOptions, S.AddOptionsT())


def _mul_opts() -> Any:
    return (S.BuiltinOptions.MulOptions, S.MulOptionsT())


def add_model(path: Path, shape: Sequence[int] = (1, 4, 4, 3), const: float = 1.5) -> Path:
    """y = x + const (XNNPack takes it), NHWC-shaped; input 'x', output 'y' in a serving signature."""
    tensors: list[Tensor] = [
        ("x", shape, np.float32, None, None),
        ("c", (1,), np.float32, [const], None),
        ("y", shape, np.float32, None, None),
    ]
    path.write_bytes(
        build_tflite(
            [("ADD", [0, 1], [2], _add_opts())], tensors, [0], [2], signature={"inputs": {"x": 0}, "outputs": {"y": 2}}
        )
    )
    return path


def sign_model(path: Path, *, with_add: bool = False) -> Path:
    """SIGN, which XNNPack does not take (optionally behind an ADD it does take)."""
    tensors: list[Tensor] = [("x", (1, 8), np.float32, None, None), ("s", (1, 8), np.float32, None, None)]
    ops: list[Op] = [("SIGN", [0], [1], None)]
    if with_add:
        tensors += [("c", (1,), np.float32, [2.0], None), ("y", (1, 8), np.float32, None, None)]
        ops.append(("ADD", [1, 2], [3], _add_opts()))
    path.write_bytes(build_tflite(ops, tensors, [0], [3 if with_add else 1]))
    return path


def quantized_model(path: Path, dtype: Any = np.int8, *, custom_op: str | None = None) -> Path:
    """int8 (or uint8) in -> DEQUANTIZE -> x * 2 -> QUANTIZE -> int8 out: quantized I/O like a full-int8 model."""
    zp_in, zp_out = (-3, 5) if dtype is np.int8 else (125, 133)
    tensors: list[Tensor] = [
        ("x", (1, 6), dtype, None, (0.05, zp_in)),
        ("xf", (1, 6), np.float32, None, None),
        ("two", (1,), np.float32, [2.0], None),
        ("yf", (1, 6), np.float32, None, None),
        ("y", (1, 6), dtype, None, (0.1, zp_out)),
    ]
    ops: list[Op] = [("DEQUANTIZE", [0], [1], None), ("MUL", [1, 2], [3], _mul_opts()), ("QUANTIZE", [3], [4], None)]
    if custom_op is not None:  # an op only a delegate runs (stands for the Edge TPU's compiled partition)
        tensors.append(("z", (1, 6), dtype, None, (0.1, zp_out)))
        ops.append((("custom", custom_op), [4], [5], None))
    path.write_bytes(build_tflite(ops, tensors, [0], [5 if custom_op else 4]))
    return path


def write_io(model: Path, data: dict[str, Any]) -> None:
    model.with_suffix(".io.json").write_text(json.dumps({"schema": "edgekit.tflite-io/1", "cpu_model": None, **data}))


@pytest.fixture(autouse=True)
def _no_env_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOW_CPU_FALLBACK_ENV, raising=False)


def test_registered_and_options_match_the_profiles() -> None:
    assert RUNNERS.get("litert") is LiteRTRunner
    from edge.targets import get_target

    for name in ("arm-xnnpack", "coral-edgetpu"):
        assert set(get_target(name).runtime_options) <= set(LiteRTRunner.options)


def test_xnnpack_applied_and_recorded(tmp_path: Path) -> None:
    m = add_model(tmp_path / "add.tflite")
    with LiteRTRunner(m, options={"delegate": "xnnpack", "num_threads": 2}) as r:
        x = np.random.default_rng(0).standard_normal((1, 4, 4, 3)).astype(np.float32)
        np.testing.assert_allclose(r.infer({"x": x})["y"], x + 1.5, rtol=1e-6)
        assert r.info.device_used == "CPU (XNNPack)" and r.info.fallback is None
        assert r.info.details["delegate_applied"] == "XNNPack"
        assert (r.info.details["delegated_ops"], r.info.details["model_ops"]) == (1, 1)
        assert r.info.threads == 2 and r.info.precision_used == "f32"
        assert [t.name for t in r.inputs] == ["x"] and r.inputs[0].shape == (1, 4, 4, 3)


def test_num_threads_zero_means_the_thread_policy(tmp_path: Path) -> None:
    # LiteRT's own default (None) runs XNNPack on one thread; the runner never leaves it at that: 0 is the
    # policy's count (edge.backends.threads: the CPUs other processes leave, at least 1)
    with LiteRTRunner(add_model(tmp_path / "add.tflite")) as r:
        assert 1 <= r.info.threads == r.info.details["threads_policy"]["threads"] <= usable_cpus()
    with pytest.raises(EdgeError, match="option num_threads must be between 0 and 4096, got -1"):
        LiteRTRunner(tmp_path / "add.tflite", options={"num_threads": -1})


def test_no_delegate_runs_builtin_kernels(tmp_path: Path) -> None:
    with LiteRTRunner(add_model(tmp_path / "add.tflite"), options={"delegate": "none"}) as r:
        assert r.info.device_used == "CPU (builtin kernels)"
        assert r.info.details["delegated_ops"] == 0 and r.info.details["delegate_applied"] is None


def test_xnnpack_refusing_the_model_is_an_error_unless_fallback_is_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = sign_model(tmp_path / "sign.tflite")
    with pytest.raises(ModelError, match="XNNPack took none of the 1 ops of sign.tflite") as e:
        LiteRTRunner(m)
    assert "allow_cpu_fallback" in str(e.value)
    with LiteRTRunner(m, options={"allow_cpu_fallback": True}) as r:
        assert r.info.fallback.startswith("CPU fallback: XNNPack took none")
        assert "CPU fallback" in r.info.device_used
        np.testing.assert_array_equal(
            r.infer({"x": np.array([[-2, 0, 3, -1, 1, 0, 5, -5]], np.float32)})["s"], [[-1, 0, 1, -1, 1, 0, 1, -1]]
        )
    monkeypatch.setenv(ALLOW_CPU_FALLBACK_ENV, "1")  # the same from any command, e.g. `edgekit bench`
    with LiteRTRunner(m) as r:
        assert r.info.fallback is not None


def test_partial_delegation_names_the_ops_left_on_the_cpu(tmp_path: Path) -> None:
    with LiteRTRunner(sign_model(tmp_path / "mixed.tflite", with_add=True)) as r:
        d = r.info.details
        assert (d["delegated_ops"], d["model_ops"], d["ops_not_delegated"]) == (1, 2, {"SIGN": 1})
        assert r.info.fallback is None  # XNNPack runs part of it: reported, not a fallback


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_quantized_io_is_converted_from_and_to_float(tmp_path: Path, dtype: Any) -> None:
    with LiteRTRunner(quantized_model(tmp_path / "q.tflite", dtype)) as r:
        assert r.inputs[0].dtype == "float32" and r.outputs[0].dtype == "float32"
        x = np.array([[-1.0, -0.5, 0.0, 0.25, 1.0, 2.0]], np.float32)
        y = r.infer({"x": x})["y"]
        assert y.dtype == np.float32
        np.testing.assert_allclose(y, 2 * x, atol=0.1)  # input step 0.05, output step 0.1
        assert r.info.details["io"]["inputs"][0].endswith(
            f"quantize to {np.dtype(dtype).name} (scale 0.05, zero point {-3 if dtype is np.int8 else 125})"
        )
        native = r.infer_native({"x": np.full((1, 6), 7, dtype)})["y"]  # raw quantized in and out
        assert native.dtype == dtype


def test_io_json_layout_contract(tmp_path: Path) -> None:
    """With model.io.json the caller feeds NCHW (the ONNX layout) and gets NCHW back; the model is NHWC."""
    m = add_model(tmp_path / "model.tflite", shape=(1, 4, 5, 3))
    write_io(
        m,
        {
            "signature": "serving_default",
            "inputs": [
                {
                    "name": "input.1",
                    "shape": [1, 3, 4, 5],
                    "dtype": "float32",
                    "layout": "NCHW",
                    "tflite_name": "x",
                    "perm_onnx_to_tflite": [0, 2, 3, 1],
                }
            ],
            "outputs": [
                {
                    "name": "out",
                    "shape": [1, 3, 4, 5],
                    "dtype": "float32",
                    "layout": "NCHW",
                    "tflite_name": "y",
                    "perm_onnx_to_tflite": [0, 2, 3, 1],
                }
            ],
        },
    )
    with LiteRTRunner(m) as r:
        assert [(t.name, t.shape, t.layout) for t in r.inputs] == [("input.1", (1, 3, 4, 5), "NCHW")]
        assert [t.shape for t in r.native_inputs] == [(1, 4, 5, 3)]
        x = np.arange(60, dtype=np.float32).reshape(1, 3, 4, 5)
        y = r.infer({"input.1": x})["out"]
        np.testing.assert_array_equal(y, x + 1.5)
        assert y.flags.c_contiguous
        np.testing.assert_array_equal(
            r.infer_native({"input.1": x.transpose(0, 2, 3, 1).copy()})["out"], x.transpose(0, 2, 3, 1) + 1.5
        )
        assert "transpose [0, 2, 3, 1]" in r.info.details["io"]["inputs"][0]


def test_layout_and_quantization_together(tmp_path: Path) -> None:
    """The channels-last fast path quantizes exactly like the plain formula."""
    tensors: list[Tensor] = [
        ("x", (1, 4, 5, 3), np.int8, None, (0.02, -7)),
        ("y", (1, 4, 5, 3), np.float32, None, None),
    ]
    m = tmp_path / "model.tflite"
    m.write_bytes(build_tflite([("DEQUANTIZE", [0], [1], None)], tensors, [0], [1]))
    write_io(
        m,
        {
            "signature": None,
            "inputs": [
                {
                    "name": "img",
                    "shape": [1, 3, 4, 5],
                    "layout": "NCHW",
                    "tflite_name": "x",
                    "tflite_tensor": "x",
                    "perm_onnx_to_tflite": [0, 2, 3, 1],
                }
            ],
            "outputs": [
                {
                    "name": "o",
                    "shape": [1, 4, 5, 3],
                    "tflite_name": "y",
                    "tflite_tensor": "y",
                    "perm_onnx_to_tflite": [0, 1, 2, 3],
                }
            ],
        },
    )
    x = np.random.default_rng(1).uniform(-3, 3, (1, 3, 4, 5)).astype(np.float32)
    expect = np.clip(np.rint(x.transpose(0, 2, 3, 1) / 0.02) - 7, -128, 127).astype(np.int8)
    with LiteRTRunner(m, options={"delegate": "none"}) as r:
        y = r.infer({"img": x})["o"]
        np.testing.assert_array_equal(r._it.get_tensor(r._in[0].index), expect)
        np.testing.assert_allclose(y, (expect.astype(np.float32) + 7) * 0.02, rtol=1e-6)


def test_not_a_tflite_file_is_refused(tmp_path: Path, models: dict[str, Path]) -> None:
    for bad, what in ((models["tiny"], "ONNX"), (tmp_path / "notes.tflite", "text")):
        if what == "text":
            bad.write_text("this is not a model at all\n")
        with pytest.raises(InputFileError, match=f"is not a TFLite flatbuffer.*{what}"):
            LiteRTRunner(bad)
    with pytest.raises(InputFileError, match="does not exist"):
        LiteRTRunner(tmp_path / "missing.tflite")
    trunc = tmp_path / "trunc.tflite"
    trunc.write_bytes(add_model(tmp_path / "ok.tflite").read_bytes()[:40])
    with pytest.raises(InputFileError):
        LiteRTRunner(trunc)


def test_edgetpu_refuses_a_model_not_compiled_for_it(tmp_path: Path) -> None:
    m = quantized_model(tmp_path / "model.tflite", np.uint8)
    assert not read_tflite(m).edgetpu_compiled
    with pytest.raises(HardwareUnavailableError, match="not compiled for the Edge TPU") as e:
        LiteRTRunner(m, options={"delegate": "edgetpu"}, precision="int8")
    assert "edgekit finish BUNDLE" in str(e.value) and "allow_cpu_fallback" in str(e.value)
    with LiteRTRunner(m, options={"delegate": "edgetpu", "allow_cpu_fallback": True}, precision="int8") as r:
        assert r.info.fallback.startswith("CPU fallback: ") and "CPU fallback" in r.info.device_used
        assert r.info.device_requested == "Edge TPU"


def _libedgetpu_loads() -> bool:
    from ai_edge_litert.interpreter import load_delegate

    from edge.backends.litert.run import EDGETPU_LIBRARY

    try:
        ctypes.CDLL(EDGETPU_LIBRARY)
        load_delegate(EDGETPU_LIBRARY)
        return True
    except (ValueError, OSError, RuntimeError):
        return False


def test_edgetpu_delegate_missing(tmp_path: Path) -> None:
    if _libedgetpu_loads():
        pytest.skip(
            "hardware: Edge TPU present: libedgetpu loads on this host: the missing-delegate path cannot be shown here"
        )
    compiled = quantized_model(tmp_path / "model_edgetpu.tflite", np.uint8, custom_op=EDGETPU_CUSTOM_OP)
    assert read_tflite(compiled).edgetpu_compiled
    with pytest.raises(HardwareUnavailableError, match="libedgetpu.so.1 could not be loaded"):
        LiteRTRunner(compiled, options={"delegate": "edgetpu"}, precision="int8")
    # A compiled model cannot run on the CPU; the fallback needs the int8 model it was compiled from.
    with pytest.raises(HardwareUnavailableError, match="no CPU model"):
        LiteRTRunner(compiled, options={"delegate": "edgetpu", "allow_cpu_fallback": True})
    quantized_model(tmp_path / "model.tflite", np.uint8)
    io = {
        "signature": None,
        "inputs": [
            {"name": "x", "shape": [1, 6], "tflite_name": "x", "tflite_tensor": "x", "perm_onnx_to_tflite": [0, 1]}
        ],
        "outputs": [
            {"name": "y", "shape": [1, 6], "tflite_name": "y", "tflite_tensor": "y", "perm_onnx_to_tflite": [0, 1]}
        ],
    }
    write_io(compiled, {**io, "cpu_model": "model.tflite"})
    write_io(tmp_path / "model.tflite", io)
    with LiteRTRunner(compiled, options={"delegate": "edgetpu", "allow_cpu_fallback": True}) as r:
        assert "could not be loaded" in r.info.fallback and "running model.tflite on the CPU" in r.info.fallback
        np.testing.assert_allclose(r.infer({"x": np.ones((1, 6), np.float32)})["y"], 2.0, atol=0.1)
