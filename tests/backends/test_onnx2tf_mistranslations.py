"""onnx2tf mistranslations (issue #23, class 9) and where an onnx2tf conversion diverges (class 4).

A byte-level classifier built from 1-D convolutions as jax2tf exports them (Magika's pattern: Unsqueeze -> Conv 5x1 ->
a Slice that keeps everything -> Squeeze) converted for arm-xnnpack with outputs unrelated to the source; onnx2tf
applied the Slice's ``[:, :, :, :1]`` to the channels-last tensor. The rewrite before onnx2tf
(``edge.graph.lower.drop_noop_slice_axes``) takes the Slice out; parity then passes. Without it, the parity failure
names the Slice (onnx2tf's per-node check, ``edge.backends.litert.convert.locate_divergence``).

CI runs the rewrite's and the comparison's unit tests and one onnx2tf test (the converter without the rewrite, then
the check: two onnx2tf runs); the pipeline's end-to-end runs and Magika's are ``corpus_full``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from edge import toolchains
from edge.backends.converter import ConversionRequest
from edge.errors import ConversionError, ParityError
from edge.graph.lower import drop_noop_slice_axes
from edge.graph.model import io_spec, load_onnx
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest
from edge.toolchains.tflite_compare import compare_node_outputs
from tests.support.next_models import byte_conv1d_classifier

SHAPES = {"bytes": (1, 256)}


def _needs_onnx2tf() -> None:
    st = toolchains.status("tflite")
    if not st.usable:
        pytest.skip(f"needs the tflite toolchain: {st.problem}")


def _bytes(seed: int) -> dict[str, np.ndarray]:
    return {"bytes": np.random.default_rng(seed).integers(0, 256, (1, 256)).astype(np.int32)}


def _parity_bytes(d: Path) -> Path:
    """Six byte samples parity compares on: three of uniform bytes, three of ASCII text (an integer input named
    ``bytes`` may otherwise get one generated kind only)."""
    d.mkdir()
    text = np.frombuffer(((__doc__ or "") * 8).encode(), np.uint8).astype(np.int32)
    for i in range(3):
        np.save(d / f"uniform{i}.npy", _bytes(i)["bytes"])
        np.save(d / f"text{i}.npy", text[i * 300 : i * 300 + 256][None])
    return d


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_a_slice_that_keeps_a_whole_axis_by_its_length_loses_it(tmp_path: Path) -> None:
    """``ends`` 1 on a length-1 axis keeps it whole: only the axis lengths tell (before: only an end of INT32_MAX or
    more counted as "to the end", and the Slice stayed)."""
    src = onnx.load(str(byte_conv1d_classifier(tmp_path / "bytes.onnx")))
    kept, _ = drop_noop_slice_axes(onnx.load(str(tmp_path / "bytes.onnx")))
    assert [x.op_type for x in kept.graph.node].count("Slice") == 1  # without shapes: the length-1 axis is cut
    out, n = drop_noop_slice_axes(onnx.load(str(tmp_path / "bytes.onnx")), SHAPES)
    assert n == 1 and "Slice" not in [x.op_type for x in out.graph.node]
    onnx.checker.check_model(out, full_check=True)
    for seed in range(3):
        np.testing.assert_array_equal(_run(out, _bytes(seed)), _run(src, _bytes(seed)))

    # a Slice that cuts one axis keeps that one only: [:, 1:3, :, :1] of [1, 4, 5, 1]
    inits = [
        numpy_helper.from_array(np.array(v, np.int64), k)
        for k, v in (("s", [0, 1, 0, 0]), ("e", [9, 3, 10**9, 1]), ("a", [0, 1, 2, 3]))
    ]
    g = helper.make_graph(
        [helper.make_node("Slice", ["x", "s", "e", "a"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
        "cut",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 5, 1])],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [1, 2, 5, 1])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cut, n = drop_noop_slice_axes(onnx.ModelProto.FromString(m.SerializeToString()), {"x": (1, 4, 5, 1)})
    sl = next(x for x in cut.graph.node if x.op_type == "Slice")
    axes = next(numpy_helper.to_array(i) for i in cut.graph.initializer if i.name == sl.input[3])
    assert n == 1 and axes.tolist() == [1]
    x = {"x": np.arange(20, dtype=np.float32).reshape(1, 4, 5, 1)}
    np.testing.assert_array_equal(_run(cut, x), _run(m, x))


def _compare(pairs: dict[str, tuple[np.ndarray, np.ndarray]], consumers: dict[str, list[str]]) -> dict:
    order = [(t, f"n_{t}", "Op") for t in pairs]
    return compare_node_outputs(pairs, order, consumers, rel_tolerance=0.02, min_cosine=0.999, abs_floor=1e-4)


def test_the_per_node_comparison_undoes_layouts_and_skips_what_heals() -> None:
    """The comparison behind the onnx2tf check: channels-last and squeezed tensors are the same values; a tensor of
    another size diverges there; rounding noise below the floor does not; an ill-conditioned intermediate whose
    difference heals downstream is not where it diverges."""
    rng = np.random.default_rng(0)
    nchw = rng.standard_normal((1, 8, 6, 1)).astype(np.float32)
    fine = {
        "conv": (nchw, nchw.transpose(0, 2, 3, 1)),  # NHWC in TensorFlow
        "squeezed": (nchw[..., 0], nchw[..., 0].transpose(0, 2, 1)),  # NCW -> NWC
        "noise": (np.full((4,), 1e-7), np.full((4,), -1e-7)),  # cosine -1, but below the floor
    }
    assert _compare(fine, {})["divergence"] is None
    cut = {**fine, "sliced": (nchw, nchw.transpose(0, 2, 3, 1)[..., :1]), "out": (nchw, -nchw)}
    got = _compare(cut, {"sliced": ["out"]})
    assert got["divergence"]["tensor"] == "sliced" and got["divergence"]["cosine"] is None, got
    assert "[1, 6, 1, 1] where ONNX has [1, 8, 6, 1]" in got["divergence"]["note"]
    # an rsqrt of cancelled variance differs (40 %), the normalised tensor computed from it agrees: healed
    ill = {
        "rsqrt": (np.array([1000.0, 600.0]), np.array([600.0, 1000.0])),
        "normed": (nchw, nchw),
        "out": (nchw, -nchw),
    }
    got = _compare(ill, {"rsqrt": ["normed"], "normed": ["out"]})
    assert got["divergence"]["tensor"] == "out" and got["healed"] == 1, got


def test_the_check_refuses_what_would_not_fit_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bounded: the per-node check holds every activation about three times; on a host without the RAM for it,
    one line instead of an out-of-memory kill (the pipeline then reports the parity failure without a node)."""
    from edge.backends.litert import convert as litert
    from edge.backends.onnxruntime import convert as ort_convert

    src = byte_conv1d_classifier(tmp_path / "bytes.onnx")
    monkeypatch.setattr(ort_convert, "available_ram", lambda: 1 << 20)  # a 1 MiB host: the check needs ~0.8 MiB
    with pytest.raises(
        ConversionError, match=r"per-node check would hold about \d+ MiB of activations, more than 50% of the 1 MiB"
    ):
        litert.locate_divergence(src, tmp_path / "never-read.tflite", _bytes(0), io_spec(load_onnx(src)))


def test_without_the_rewrite_onnx2tf_diverges_at_the_slice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The converter without its rewrite (as before class 9's fix): the .tflite fails parity on LiteRT's CPU kernels,
    and onnx2tf's per-node check names the Slice that keeps everything, by the size TensorFlow gave it."""
    _needs_onnx2tf()
    from edge.backends.litert import convert as litert

    src = byte_conv1d_classifier(tmp_path / "bytes.onnx")
    monkeypatch.setattr(litert, "_lower_for_onnx2tf", lambda source, work, io: (None, {}))
    (tmp_path / "out").mkdir()
    req = ConversionRequest(source=src, workdir=tmp_path / "out", precision="fp32", io=io_spec(load_onnx(src)))
    result = litert.OnnxToTFLite().convert(req)
    assert result.details["cpu_parity"]["passed"] is False
    found = litert.locate_divergence(src, result.artifact, _bytes(7), req.io)
    assert found is not None and (found.node, found.op, found.tensor) == ("keep_all", "Slice", "sliced"), found
    assert found.cosine is None and "TensorFlow computes shape [1, 252, 1, 1] where ONNX has [1, 32, 252, 1]" in (
        found.note
    )


@pytest.mark.slow
@pytest.mark.corpus_full
def test_the_pipeline_names_the_slice_without_the_rewrite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The message and the manifest (``parity.first_divergence``), as for ONNX -> ONNX / IR chains."""
    _needs_onnx2tf()
    from edge.backends.litert import convert as litert

    monkeypatch.setattr(litert, "_lower_for_onnx2tf", lambda source, work, io: (None, {}))
    src = byte_conv1d_classifier(tmp_path / "bytes.onnx")
    data = _parity_bytes(tmp_path / "parity")
    with pytest.raises(ParityError, match=r"first diverging node: keep_all \(Slice\), output 'sliced'"):
        convert(src, "arm-xnnpack", tmp_path / "b", ConvertRequest(parity_data=data))
    b = convert(src, "arm-xnnpack", tmp_path / "kept", ConvertRequest(parity_data=data, accept_parity_failure=True))
    d = b.manifest["parity"]["first_divergence"]
    assert (d["node"], d["op"], d["cosine"]) == ("keep_all", "Slice", None) and "252" in d["note"], d


@pytest.mark.slow
def test_the_jax2tf_conv1d_classifier_converts_for_arm_xnnpack(tmp_path: Path) -> None:
    """Before the rewrite: parity failed (top-1 0 %); after it, the Slice is gone and parity passes."""
    _needs_onnx2tf()
    src = byte_conv1d_classifier(tmp_path / "bytes.onnx")
    b = convert(src, "arm-xnnpack", tmp_path / "b", ConvertRequest(parity_data=_parity_bytes(tmp_path / "parity")))
    parity = b.manifest["parity"]
    assert parity["passed"] is True and parity.get("accepted_failure") is not True, parity
    assert parity["input_provenance"]["count"] == 6 and parity["outputs"][0]["top1"] == 1.0
    assert b.manifest["chain"][0]["details"]["lowered"] == {"Slice": 1}


@pytest.mark.slow
@pytest.mark.corpus_full
def test_magika_without_the_rewrite_diverges_at_its_conv_slice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real model (tests/support/corpus.py): before the rewrite its arm-xnnpack conversion came out at cosine 0.00004 with
    no place named; onnx2tf's per-node check names the Slice after its Conv (the corpus case checks that it passes)."""
    _needs_onnx2tf()
    from edge.backends.litert import convert as litert
    from edge.pipeline.sources import OnnxSource
    from tests.support.corpus import corpus_model

    src = OnnxSource(corpus_model("magika"))
    m = load_onnx(src.static_file(tmp_path, src.io({"bytes": (1, 2048)})))
    m.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 1  # [N, 214] at N = 1
    static = tmp_path / "magika.static.onnx"
    onnx.save(m, str(static))
    io = io_spec(m)
    monkeypatch.setattr(litert, "_lower_for_onnx2tf", lambda source, work, io: (None, {}))
    (tmp_path / "out").mkdir()
    req = ConversionRequest(source=static, workdir=tmp_path / "out", precision="fp32", io=io)
    result = litert.OnnxToTFLite().convert(req)
    assert result.details["cpu_parity"]["passed"] is False
    sample = {"bytes": np.random.default_rng(3).integers(0, 257, (1, 2048)).astype(np.int32)}
    found = litert.locate_divergence(static, result.artifact, sample, req.io)
    assert found is not None and found.op == "Slice" and found.node.endswith("Conv_0/strided_slice_2"), found
    assert "[1, 508, 1, 1] where ONNX has [1, 512, 508, 1]" in found.note
