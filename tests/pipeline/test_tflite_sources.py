"""TFLite sources on every host-runnable target (issue #13): OpenVINO's TFLite frontend (intel-igpu), tf2onnx in
the tflite toolchain (x86-cpu), flatbuffer rewrites for LiteRT (fp16 weights -> fp32; MediaPipe's
Convolution2DTransposeBias lowered to the builtin TRANSPOSE_CONV).

The corpus models are MediaPipe's BlazeFace (fp16 weights) and selfie segmentation (fp16 weights + the custom op);
the lowering is proven exact on tiny models built here against a numpy port of MediaPipe's kernel, and on the
real selfie model's own transposed convolution.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from edge import toolchains
from edge.backends.converter import ConversionRequest
from edge.errors import ConversionError
from edge.pipeline.request import ConvertRequest
from edge.spec import IOSpec, TensorSpec

MODELS = Path(__file__).resolve().parents[2] / "examples" / "models"
FACE = MODELS / "face_detection_short_range.tflite"
SELFIE = MODELS / "selfie_segmentation.tflite"


def _interpreter(model: Path | bytes, *, reference: bool = True, preserve: bool = False):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    kw = {"model_content": model} if isinstance(model, bytes) else {"model_path": str(model)}
    if reference:
        kw["experimental_op_resolver_type"] = OpResolverType.BUILTIN_REF
    it = Interpreter(**kw, experimental_preserve_all_tensors=preserve)
    it.allocate_tensors()
    return it


def _run(model: Path | bytes, x: np.ndarray, **kw) -> list[np.ndarray]:
    it = _interpreter(model, **kw)
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


def mediapipe_transpose_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, padding: int, sw: int, sh: int) -> np.ndarray:
    """A numpy port of MediaPipe's TransposeConvBias (transpose_conv_bias.cc): NHWC input, OHWI weights."""
    n, ih, iw, _ = x.shape
    o, fh, fw, _ = w.shape
    ph = max(0, fh - (ih - 1) % sh - 1) if padding == 1 else 0
    pw = max(0, fw - (iw - 1) % sw - 1) if padding == 1 else 0
    oh, ow = sh * (ih - 1) + fh - ph, sw * (iw - 1) + fw - pw
    out = np.broadcast_to(b.astype(np.float64), (n, oh, ow, o)).copy()
    for iy in range(ih):
        for ix in range(iw):
            for fy in range(fh):
                for fx in range(fw):
                    oy, ox = iy * sh - ph // 2 + fy, ix * sw - pw // 2 + fx
                    if 0 <= oy < oh and 0 <= ox < ow:
                        out[:, oy, ox, :] += x[:, iy, ix, :].astype(np.float64) @ w[:, fy, fx, :].T.astype(np.float64)
    return out.astype(np.float32)


def _tiny_custom(
    custom: str, x_shape: tuple[int, ...], w: np.ndarray, b: np.ndarray, options: bytes, out_shape: tuple[int, ...]
) -> bytes:
    """A one-op TFLite: ``custom``(input, weights const, bias const) -> output, built with the flatbuffer schema."""
    import ai_edge_litert.schema_py_generated as s

    from edge.backends.litert.rewrite import save

    m = s.ModelT()
    m.version, m.description = 3, b"edgekit test"
    m.buffers = [s.BufferT()]
    g = s.SubGraphT()
    g.tensors = []

    def tensor(name: str, shape: tuple[int, ...], data: np.ndarray | None = None) -> int:
        t = s.TensorT()
        t.name, t.shape, t.type = name.encode(), np.asarray(shape, dtype=np.int32), 0
        t.buffer = 0
        if data is not None:
            buf = s.BufferT()
            buf.data = np.frombuffer(np.ascontiguousarray(data, dtype="<f4").tobytes(), dtype=np.uint8)
            m.buffers.append(buf)
            t.buffer = len(m.buffers) - 1
        g.tensors.append(t)
        return len(g.tensors) - 1

    xi, wi, bi = tensor("x", x_shape), tensor("w", w.shape, w), tensor("b", b.shape, b)
    yi = tensor("y", out_shape)
    oc = s.OperatorCodeT()
    oc.builtinCode = oc.deprecatedBuiltinCode = s.BuiltinOperator.CUSTOM
    oc.customCode, oc.version = custom.encode(), 1
    m.operatorCodes = [oc]
    op = s.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = (
        0,
        np.asarray([xi, wi, bi], dtype=np.int32),
        np.asarray([yi], dtype=np.int32),
    )
    op.customOptions = np.frombuffer(options, dtype=np.uint8)
    g.operators = [op]
    g.inputs, g.outputs = np.asarray([xi], dtype=np.int32), np.asarray([yi], dtype=np.int32)
    m.subgraphs = [g]
    return save(m)


# (input NHWC, weights OHWI, padding 1 SAME / 2 VALID, stride w, stride h)
_CASES = [
    ((1, 5, 7, 3), (4, 3, 3, 3), 1, 2, 2),  # SAME, odd sizes: MediaPipe pads (and offsets by pad // 2)
    ((1, 4, 4, 6), (2, 2, 2, 6), 1, 2, 2),  # selfie's shape of op: kernel = stride, no padding
    ((2, 3, 5, 2), (3, 2, 2, 2), 2, 2, 2),  # VALID, batch 2
    ((1, 6, 5, 4), (5, 3, 3, 4), 1, 1, 1),  # stride 1: output = input size
    ((1, 4, 6, 3), (2, 3, 4, 3), 1, 3, 2),  # different strides per axis, non-square kernel, odd padding
    ((1, 4, 5, 3), (2, 2, 2, 3), 1, 1, 1),  # odd total padding 1 on both axes: the offset rounds down
]


@pytest.mark.parametrize("x_shape,w_shape,padding,sw,sh", _CASES)
def test_mediapipe_transpose_conv_lowering_is_exact(x_shape, w_shape, padding, sw, sh) -> None:
    from edge.backends.litert.rewrite import rewrite, transpose_conv_output_shape

    rng = np.random.default_rng(sum(x_shape) + 7 * sum(w_shape))
    w = rng.normal(size=w_shape).astype(np.float32)
    b = rng.normal(size=(w_shape[0],)).astype(np.float32)
    x = rng.normal(size=x_shape).astype(np.float32)
    out_shape = transpose_conv_output_shape(x_shape, w_shape, padding, sw, sh)
    data = _tiny_custom("Convolution2DTransposeBias", x_shape, w, b, struct.pack("<iii", padding, sw, sh), out_shape)
    with pytest.raises(Exception, match="Convolution2DTransposeBias"):  # stock LiteRT cannot run the source
        _interpreter(data)
    lowered, record = rewrite(data)
    assert record.lowered == {"Convolution2DTransposeBias": 1}
    want = mediapipe_transpose_conv(x, w, b, padding, sw, sh)
    assert want.shape == out_shape
    it = _interpreter(lowered)
    assert [o["op_name"] for o in it._get_ops_details()] == ["TRANSPOSE_CONV"]
    for reference in (True, False):  # LiteRT's reference kernel and its default (XNNPack) path
        got = _run(lowered, x, reference=reference)[0]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_lowering_on_the_real_selfie_model() -> None:
    """The selfie model's own transposed convolution, lowered, computes MediaPipe's kernel on its real inputs."""
    from edge.backends.litert.rewrite import rewrite

    lowered, record = rewrite(SELFIE.read_bytes())
    assert record.lowered == {"Convolution2DTransposeBias": 1}
    it = _interpreter(lowered, preserve=True)
    x = np.random.default_rng(3).uniform(0, 1, it.get_input_details()[0]["shape"]).astype(np.float32)
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    (op,) = [o for o in it._get_ops_details() if o["op_name"] == "TRANSPOSE_CONV"]
    shape_t, w_t, x_t, b_t = (int(i) for i in op["inputs"])
    padding, sw, sh = 1, 2, 2  # the model's custom_options (read back from the source below)
    import ai_edge_litert.schema_py_generated as s

    src = s.ModelT.InitFromPackedBuf(bytearray(SELFIE.read_bytes()), 0)
    (custom,) = [o for o in src.subgraphs[0].operators if src.operatorCodes[o.opcodeIndex].customCode]
    assert struct.unpack("<iii", bytes(custom.customOptions)[:12]) == (padding, sw, sh)
    want = mediapipe_transpose_conv(it.get_tensor(x_t), it.get_tensor(w_t), it.get_tensor(b_t), padding, sw, sh)
    got = it.get_tensor(int(op["outputs"][0]))
    assert list(it.get_tensor(shape_t)) == list(want.shape) == [1, 256, 256, 1]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_lowering_refuses_options_it_cannot_read() -> None:
    from edge.backends.litert.rewrite import rewrite

    w, b = np.ones((1, 2, 2, 1), np.float32), np.zeros((1,), np.float32)
    data = _tiny_custom("Convolution2DTransposeBias", (1, 2, 2, 1), w, b, struct.pack("<iii", 7, 2, 2), (1, 4, 4, 1))
    with pytest.raises(ConversionError) as e:
        rewrite(data)
    assert "padding 7" in str(e.value) and "\n" not in str(e.value)


def test_fp16_weights_become_fp32_exactly() -> None:
    from edge.backends.litert.rewrite import has_fp16_weights, load, rewrite

    data = FACE.read_bytes()
    assert has_fp16_weights(load(data))
    fp32, record = rewrite(data, fp32=True)
    assert record.dequantized == 74 and not record.lowered
    assert not has_fp16_weights(load(fp32))
    it = _interpreter(fp32)
    ops = {o["op_name"] for o in it._get_ops_details()}
    assert "DEQUANTIZE" not in ops and "CONV_2D" in ops
    x = np.random.default_rng(0).uniform(-1, 1, (1, 128, 128, 3)).astype(np.float32)
    for a, b in zip(_run(data, x), _run(fp32, x)):  # the same arithmetic on the same f32 values: bit for bit
        np.testing.assert_array_equal(a, b)


def _request(src: Path, workdir: Path, precision: str, io: IOSpec | None = None) -> ConversionRequest:
    workdir.mkdir(parents=True, exist_ok=True)
    return ConversionRequest(source=src, workdir=workdir, precision=precision, io=io or IOSpec((), ()))


def test_tflite_to_tflite(tmp_path: Path) -> None:
    from edge.backends.litert.from_tflite import TFLiteToTFLite
    from edge.backends.litert.rewrite import has_fp16_weights, load

    r = TFLiteToTFLite().convert(_request(SELFIE, tmp_path / "a", "fp32"))
    assert r.details["lowered_custom_ops"] == {"Convolution2DTransposeBias": 1}
    assert r.details["fp16_weights_dequantized"] == 110 and not has_fp16_weights(load(r.artifact.read_bytes()))
    keep = TFLiteToTFLite().convert(_request(SELFIE, tmp_path / "b", "fp16"))
    assert keep.details["fp16_weights_dequantized"] == 0 and has_fp16_weights(load(keep.artifact.read_bytes()))
    x = np.random.default_rng(1).uniform(0, 1, (1, 256, 256, 3)).astype(np.float32)
    np.testing.assert_array_equal(_run(r.artifact, x)[0], _run(keep.artifact, x)[0])
    with pytest.raises(ConversionError, match="holds no f16 weights"):
        TFLiteToTFLite().convert(_request(r.artifact, tmp_path / "c", "fp16"))


def _unknown_custom_op_model() -> bytes:
    w, b = np.ones((1, 2, 2, 1), np.float32), np.zeros((1,), np.float32)
    return _tiny_custom("MaxUnpooling2D", (1, 2, 2, 1), w, b, b"", (1, 4, 4, 1))


def test_openvino_refuses_an_op_it_cannot_translate_naming_it(tmp_path: Path) -> None:
    from edge.backends.openvino.from_tflite import TFLiteToOpenVINO

    src = tmp_path / "unpool.tflite"
    src.write_bytes(_unknown_custom_op_model())
    with pytest.raises(ConversionError) as e:
        TFLiteToOpenVINO().convert(_request(src, tmp_path / "out", "fp32"))
    msg = str(e.value)
    assert "no translator for op MaxUnpooling2D" in msg and "\n" not in msg


def test_openvino_converts_the_lowered_selfie(tmp_path: Path) -> None:
    """intel-igpu from the selfie model: the custom op is lowered before OpenVINO's frontend reads the file."""
    import openvino as ov

    from edge.backends.litert.from_tflite import prepare_tflite
    from edge.backends.openvino.from_tflite import TFLiteToOpenVINO

    r = TFLiteToOpenVINO().convert(_request(SELFIE, tmp_path / "ir", "fp32"))
    assert r.details["tflite_rewrite"]["lowered_custom_ops"] == {"Convolution2DTransposeBias": 1}
    assert set(r.details["weight_element_types"]) == {"f32"}  # f16 weights folded: an fp32 IR
    lowered, _ = prepare_tflite(SELFIE, tmp_path)
    x = np.clip(np.kron(np.random.default_rng(2).uniform(0, 1, (1, 8, 8, 3)), np.ones((1, 32, 32, 1))), 0, 1)
    x = x.astype(np.float32)
    want = _run(lowered, x)[0]
    compiled = ov.Core().compile_model(str(r.artifact), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    got = compiled(x)[0]
    assert want.max() > 0.05  # the mask carries signal on this input
    np.testing.assert_allclose(got, want, atol=1e-3)


@pytest.mark.parametrize("precision,weights", [("fp32", {"f32"}), ("fp16", {"f16"})])
def test_face_detection_for_intel_igpu(tmp_path: Path, precision: str, weights: set[str]) -> None:
    from edge.pipeline import convert

    b = convert(FACE, "intel-igpu", tmp_path / "b", ConvertRequest(precision=precision))
    m = b.manifest
    assert [c["converter"] for c in m["chain"]] == ["tflite->openvino-ir"]
    assert set(m["chain"][0]["details"]["weight_element_types"]) == weights
    if precision == "fp32":
        assert m["chain"][0]["details"]["f16_weights_folded_to_f32"] == 74
    assert m["parity"]["passed"] is True and not m["parity"].get("accepted_failure")
    assert "LiteRT" in m["parity"]["reference"] or "litert" in m["parity"]["reference"].lower()
    assert {o["name"] for o in m["parity"]["outputs"]} == {"regressors", "classificators"}


def _needs_tf2onnx() -> None:
    st = toolchains.status("tflite")
    if not st.usable:
        pytest.skip(f"needs the tflite toolchain with tf2onnx: {st.problem}")


def test_face_detection_for_x86_cpu_through_tf2onnx(tmp_path: Path) -> None:
    _needs_tf2onnx()
    from edge.pipeline import convert

    b = convert(FACE, "x86-cpu", tmp_path / "b", ConvertRequest(precision="fp32"))
    m = b.manifest
    assert [c["converter"] for c in m["chain"]] == ["tflite->onnx", "onnx->onnx"]
    assert m["chain"][0]["tool_versions"]["tf2onnx"] == "1.17.0"
    assert m["parity"]["passed"] is True and not m["parity"].get("accepted_failure")
    for o in m["parity"]["outputs"]:
        assert o["cosine"] > 0.99999, o


def test_tf2onnx_refuses_an_op_it_cannot_translate_naming_it(tmp_path: Path) -> None:
    _needs_tf2onnx()
    from edge.backends.onnxruntime.from_tflite import TFLiteToOnnx

    src = tmp_path / "unpool.tflite"
    src.write_bytes(_unknown_custom_op_model())
    io = IOSpec((TensorSpec("x", (1, 2, 2, 1), "float32"),), (TensorSpec("y", (1, 4, 4, 1), "float32"),))
    with pytest.raises(ConversionError) as e:
        TFLiteToOnnx().convert(_request(src, tmp_path / "out", "fp32", io))
    msg = str(e.value)
    assert "tf2onnx cannot translate op MaxUnpooling2D (a custom op)" in msg and "\n" not in msg
    assert "a custom op needs its own lowering" in (e.value.hint or "") and "arm-xnnpack" not in msg


def _fully_connected_flattening() -> tuple[bytes, np.ndarray, np.ndarray]:
    """One FULLY_CONNECTED with a bias on a [1, 1, 1, 4] input, ``keep_num_dims`` false: what onnx2tf writes after a
    global MEAN that keeps its dims (a classifier's head)."""
    import ai_edge_litert.schema_py_generated as s

    from edge.backends.litert.rewrite import load, save

    rng = np.random.default_rng(3)
    w, b = rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=(3,)).astype(np.float32) * 10
    m = load(_tiny_custom("Unused", (1, 1, 1, 4), w, b, b"", (1, 3)))
    oc = m.operatorCodes[0]
    oc.builtinCode = oc.deprecatedBuiltinCode = s.BuiltinOperator.FULLY_CONNECTED
    oc.customCode = None
    op = m.subgraphs[0].operators[0]
    op.customOptions = None
    op.builtinOptionsType = s.BuiltinOptions.FullyConnectedOptions
    op.builtinOptions = s.FullyConnectedOptionsT()
    op.builtinOptions.keepNumDims = False
    return save(m), w, b


def test_tf2onnx_keeps_the_bias_of_a_flattening_fully_connected(tmp_path: Path) -> None:
    """tf2onnx 1.17.0 dropped this bias (its handler rewires the op through a Reshape and then adds the bias only for
    an op of 3 inputs): an onnx2tf-made classifier came out of tflite->onnx off by its head's bias (cosine 0.81 on
    x86-cpu). edge/toolchains/tf2onnx_fixes.py adds the lost Add."""
    _needs_tf2onnx()
    from edge.backends.onnxruntime.from_tflite import TFLiteToOnnx

    data, w, b = _fully_connected_flattening()
    src = tmp_path / "fc.tflite"
    src.write_bytes(data)
    x = np.random.default_rng(4).normal(size=(1, 1, 1, 4)).astype(np.float32)
    want = _run(data, x)[0]
    np.testing.assert_allclose(want, x.reshape(1, 4) @ w.T + b, rtol=1e-5, atol=1e-5)  # LiteRT: the bias is there
    io = IOSpec((TensorSpec("x", (1, 1, 1, 4), "float32"),), (TensorSpec("y", (1, 3), "float32"),))
    r = TFLiteToOnnx().convert(_request(src, tmp_path / "out", "fp32", io))
    import onnxruntime as ort

    sess = ort.InferenceSession(str(r.artifact), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_tf2onnx_converts_the_lowered_selfie(tmp_path: Path) -> None:
    """x86-cpu from the selfie model: the custom op is lowered before tf2onnx reads the file."""
    _needs_tf2onnx()
    import onnxruntime as ort

    from edge.backends.litert.from_tflite import prepare_tflite
    from edge.backends.onnxruntime.from_tflite import TFLiteToOnnx

    io = IOSpec(
        (TensorSpec("input_1", (1, 256, 256, 3), "float32"),),
        (TensorSpec("activation_10", (1, 256, 256, 1), "float32"),),
    )
    r = TFLiteToOnnx().convert(_request(SELFIE, tmp_path / "onnx", "fp32", io))
    assert r.details["tflite_rewrite"]["lowered_custom_ops"] == {"Convolution2DTransposeBias": 1}
    lowered, _ = prepare_tflite(SELFIE, tmp_path)
    x = np.clip(np.kron(np.random.default_rng(4).uniform(0, 1, (1, 8, 8, 3)), np.ones((1, 32, 32, 1))), 0, 1)
    x = x.astype(np.float32)
    want = _run(lowered, x)[0]
    got = ort.InferenceSession(str(r.artifact), providers=["CPUExecutionProvider"]).run(None, {"input_1": x})[0]
    assert want.max() > 0.05
    np.testing.assert_allclose(got, want, atol=1e-3)


# -- the pipeline, once plan.py picks tflite->tflite and the TFLite source adapter lowers MediaPipe's ops ------------


def _rewrite_routed() -> None:
    from edge.backends.converter import CONVERTERS

    if "tflite->tflite" not in CONVERTERS:
        pytest.skip(
            "tflite->tflite is not registered (its entry point comes with the plan.py change that keeps "
            "rule 2 from routing every TFLite source through it)"
        )


def _source_lowers() -> None:
    from edge.pipeline.sources import Source, TFLiteSource

    if TFLiteSource.static_file is Source.static_file:
        pytest.skip("the TFLite source adapter does not lower MediaPipe's custom ops yet")


def test_face_detection_fp32_for_arm_xnnpack(tmp_path: Path) -> None:
    _rewrite_routed()
    from edge.backends.litert.rewrite import has_fp16_weights, load
    from edge.pipeline import convert

    b = convert(FACE, "arm-xnnpack", tmp_path / "b", ConvertRequest(precision="fp32"))
    m = b.manifest
    assert m["precision"] == "fp32" and [c["converter"] for c in m["chain"]] == ["tflite->tflite"]
    assert m["chain"][0]["details"]["fp16_weights_dequantized"] == 74
    assert not has_fp16_weights(load(b.artifact.read_bytes()))
    assert m["parity"]["passed"] is True and not m["parity"].get("accepted_failure")
    for o in m["parity"]["outputs"]:
        assert o["cosine"] > 0.999999, o


@pytest.mark.parametrize(
    "target,precision,chain",
    [
        ("arm-xnnpack", "keep", []),  # shipped as its lowered copy, f16 weights kept
        ("arm-xnnpack", "fp32", ["tflite->tflite"]),
        ("intel-igpu", "fp32", ["tflite->openvino-ir"]),
        ("x86-cpu", "fp32", ["tflite->onnx", "onnx->onnx"]),
    ],
)
def test_selfie_segmentation_converts(tmp_path: Path, target: str, precision: str, chain: list[str]) -> None:
    _source_lowers()
    if precision == "fp32" and target == "arm-xnnpack":
        _rewrite_routed()
    if target == "x86-cpu":
        _needs_tf2onnx()
    from edge.backends.litert.rewrite import custom_ops, load
    from edge.pipeline import convert

    b = convert(SELFIE, target, tmp_path / "b", ConvertRequest(precision=precision))
    m = b.manifest
    assert [c["converter"] for c in m["chain"]] == chain
    assert "Convolution2DTransposeBias lowered to builtins" in m["parity"]["reference"]
    assert m["parity"]["passed"] is True and not m["parity"].get("accepted_failure")
    if b.artifact.suffix == ".tflite":
        assert custom_ops(load(b.artifact.read_bytes())) == []
