"""Graphs as they come: If/Loop/Scan subgraphs, recurrent state in and out, scalar int64 inputs, dynamic
dims inside subgraphs (issue 13, point 3).

Models are built here with onnx.helper (small, random weights); the real Silero VAD from
examples/models/ runs too when present (CI fetches it with examples/fetch_pretrained.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from edge.backends.converter import CONVERTERS
from edge.errors import ConversionError, EdgeError, ModelError
from edge.graph.model import (
    KEPT_DYNAMIC_KEY,
    describe_ort_error,
    io_spec,
    kept_dynamic,
    load_onnx,
    make_static,
    resolve_static_inputs,
    save_onnx,
    walk_nodes,
)
from edge.graph.opsupport import OpSupport, check_ops, targets_using
from edge.pipeline.request import ConvertRequest
from tests.support.cli import assert_user_error, run_cli

REPO = Path(__file__).resolve().parents[2]
SILERO = REPO / "examples" / "models" / "silero_vad.onnx"
H = 16  # hidden size of the in-code recurrent models
RNG = np.random.default_rng(13)


def _w(*shape: int, scale: float = 0.3) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _c(name: str, value: Any, dtype: Any = np.int64) -> onnx.NodeProto:
    return h.make_node("Constant", [], [name], value=nh.from_array(np.asarray(value, dtype)), name=f"const_{name}")


def _untyped(name: str, elem: int = T.FLOAT) -> onnx.ValueInfoProto:
    """A branch output with no shape: the rank is the branch's business (as exporters write them)."""
    vi = onnx.ValueInfoProto()
    vi.name = name
    vi.type.tensor_type.elem_type = elem
    return vi


def _model(graph: onnx.GraphProto, path: Path, opset: int = 17) -> Path:
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], producer_name="edgekit-tests")
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


def _vad_branch(tag: str, window: int) -> onnx.GraphProto:
    """One sample-rate branch, Silero-style: frames of ``window`` samples; an inner If squeezes the frame axis when
    there is one frame (then: rank 2, else: rank 3, as Silero's decoder does), then an LSTM carries the state."""
    p = f"{tag}_"
    squeeze = h.make_graph(
        [_c(p + "ax1", [1]), h.make_node("Squeeze", ["frames", p + "ax1"], [p + "sq"])],
        p + "squeeze",
        [],
        [_untyped(p + "sq")],
    )
    keep = h.make_graph([h.make_node("Identity", ["frames"], [p + "id"])], p + "keep", [], [_untyped(p + "id")])
    nodes = [
        _c(p + "fshape", [1, -1, window]),
        h.make_node("Reshape", ["input", p + "fshape"], ["frames"], name=p + "frames"),
        h.make_node("Shape", ["frames"], [p + "shape"]),
        _c(p + "one_idx", 1),
        h.make_node("Gather", [p + "shape", p + "one_idx"], [p + "nframes"]),
        _c(p + "one", 1),
        h.make_node("Equal", [p + "nframes", p + "one"], [p + "single"]),
        h.make_node("If", [p + "single"], [p + "x"], then_branch=squeeze, else_branch=keep, name=f"If_frames_{tag}"),
        _c(p + "ax0", [0]),
        h.make_node("Unsqueeze", [p + "x", p + "ax0"], [p + "seq"]),  # [1, 1, window]
        _c(p + "s0", [0]),
        _c(p + "s1", [1]),
        _c(p + "s2", [2]),
        h.make_node("Slice", ["state", p + "s0", p + "s1", p + "s0"], [p + "h0"]),
        h.make_node("Slice", ["state", p + "s1", p + "s2", p + "s0"], [p + "c0"]),
        h.make_node("Constant", [], [p + "W"], value=nh.from_array(_w(1, 4 * H, window, scale=0.05))),
        h.make_node("Constant", [], [p + "R"], value=nh.from_array(_w(1, 4 * H, H))),
        h.make_node("Constant", [], [p + "B"], value=nh.from_array(_w(1, 8 * H, scale=0.1))),
        h.make_node(
            "LSTM",
            [p + "seq", p + "W", p + "R", p + "B", "", p + "h0", p + "c0"],
            [p + "Y", p + "Yh", p + "Yc"],
            hidden_size=H,
            name=f"LSTM_{tag}",
        ),
        h.make_node("Concat", [p + "Yh", p + "Yc"], [p + "stateN"], axis=0),
        h.make_node("Squeeze", [p + "Yh", p + "ax0"], [p + "hid"]),
        h.make_node("Constant", [], [p + "Wo"], value=nh.from_array(_w(H, 1))),
        h.make_node("MatMul", [p + "hid", p + "Wo"], [p + "logit"]),
        h.make_node("Sigmoid", [p + "logit"], [p + "prob"]),
    ]
    return h.make_graph(
        nodes,
        tag,
        [],
        [
            h.make_tensor_value_info(p + "prob", T.FLOAT, ["b", 1]),
            h.make_tensor_value_info(p + "stateN", T.FLOAT, [2, "b", H]),
        ],
    )


def build_vad_like(path: Path) -> Path:
    """Silero VAD's shape of graph: ``input`` [?, ?], ``state`` [2, ?, H], ``sr`` int64 scalar; If(sr == 16000)
    picks a branch (512- or 256-sample frames) holding an inner different-rank If and an LSTM."""
    g = h.make_graph(
        [
            _c("k16000", 16000),
            h.make_node("Equal", ["sr", "k16000"], ["is16k"], name="Equal_sr"),
            h.make_node(
                "If",
                ["is16k"],
                ["output", "stateN"],
                then_branch=_vad_branch("k16", 512),
                else_branch=_vad_branch("k8", 256),
                name="If_sr",
            ),
        ],
        "vad_like",
        [
            h.make_tensor_value_info("input", T.FLOAT, [None, None]),
            h.make_tensor_value_info("state", T.FLOAT, [2, None, H]),
            h.make_tensor_value_info("sr", T.INT64, []),
        ],
        [
            h.make_tensor_value_info("output", T.FLOAT, [None, 1]),
            h.make_tensor_value_info("stateN", T.FLOAT, [None, None, None]),
        ],
    )
    return _model(g, path)


def build_loop(path: Path) -> Path:
    """A Loop with a constant trip count: y <- tanh(y @ W + x), every step's y also scanned out."""
    body = h.make_graph(
        [
            h.make_node("Identity", ["cond_in"], ["cond_out"]),
            h.make_node("Constant", [], ["Wl"], value=nh.from_array(_w(8, 8))),
            h.make_node("MatMul", ["y_in", "Wl"], ["yw"]),
            h.make_node("Add", ["yw", "x"], ["pre"]),
            h.make_node("Tanh", ["pre"], ["y_out"]),
            h.make_node("Identity", ["y_out"], ["y_scan"]),
        ],
        "loop_body",
        [
            h.make_tensor_value_info("iter", T.INT64, []),
            h.make_tensor_value_info("cond_in", T.BOOL, []),
            h.make_tensor_value_info("y_in", T.FLOAT, ["b", 8]),
        ],
        [
            h.make_tensor_value_info("cond_out", T.BOOL, []),
            h.make_tensor_value_info("y_out", T.FLOAT, ["b", 8]),
            h.make_tensor_value_info("y_scan", T.FLOAT, ["b", 8]),
        ],
    )
    g = h.make_graph(
        [
            _c("trips", 4),
            _c("true", True, np.bool_),
            h.make_node("Loop", ["trips", "true", "y0"], ["y_final", "y_steps"], body=body, name="Loop_steps"),
        ],
        "loop",
        [h.make_tensor_value_info("x", T.FLOAT, ["b", 8]), h.make_tensor_value_info("y0", T.FLOAT, ["b", 8])],
        [
            h.make_tensor_value_info("y_final", T.FLOAT, ["b", 8]),
            h.make_tensor_value_info("y_steps", T.FLOAT, [4, "b", 8]),
        ],
    )
    return _model(g, path)


def build_scan(path: Path) -> Path:
    """A Scan over a sequence with a recurrent state: s <- tanh(s @ W + x_t); the final state and every step out."""
    body = h.make_graph(
        [
            h.make_node("Constant", [], ["Ws"], value=nh.from_array(_w(4, 4))),
            h.make_node("MatMul", ["s_in", "Ws"], ["sw"]),
            h.make_node("Add", ["sw", "x_t"], ["pre"]),
            h.make_node("Tanh", ["pre"], ["s_out"]),
            h.make_node("Identity", ["s_out"], ["s_step"]),
        ],
        "scan_body",
        [h.make_tensor_value_info("s_in", T.FLOAT, [4]), h.make_tensor_value_info("x_t", T.FLOAT, [4])],
        [h.make_tensor_value_info("s_out", T.FLOAT, [4]), h.make_tensor_value_info("s_step", T.FLOAT, [4])],
    )
    g = h.make_graph(
        [h.make_node("Scan", ["s0", "seq"], ["s_final", "steps"], body=body, num_scan_inputs=1, name="Scan_seq")],
        "scan",
        [h.make_tensor_value_info("s0", T.FLOAT, [4]), h.make_tensor_value_info("seq", T.FLOAT, ["t", 4])],
        [h.make_tensor_value_info("s_final", T.FLOAT, [4]), h.make_tensor_value_info("steps", T.FLOAT, ["t", 4])],
    )
    return _model(g, path)


def build_lstm_state(path: Path) -> Path:
    """An LSTM with its state as inputs and outputs (streaming use): x [seq, 1, 8], h0/c0 [1, 1, H]."""
    g = h.make_graph(
        [
            h.make_node("Constant", [], ["W"], value=nh.from_array(_w(1, 4 * H, 8))),
            h.make_node("Constant", [], ["R"], value=nh.from_array(_w(1, 4 * H, H))),
            h.make_node("LSTM", ["x", "W", "R", "", "", "h0", "c0"], ["y", "hN", "cN"], hidden_size=H, name="LSTM_0"),
        ],
        "lstm_state",
        [
            h.make_tensor_value_info("x", T.FLOAT, ["seq", 1, 8]),
            h.make_tensor_value_info("h0", T.FLOAT, [1, 1, H]),
            h.make_tensor_value_info("c0", T.FLOAT, [1, 1, H]),
        ],
        [
            h.make_tensor_value_info("y", T.FLOAT, ["seq", 1, 1, H]),
            h.make_tensor_value_info("hN", T.FLOAT, [1, 1, H]),
            h.make_tensor_value_info("cN", T.FLOAT, [1, 1, H]),
        ],
    )
    return _model(g, path)


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("graphs")
    return {
        "vad_like": build_vad_like(d / "vad_like.onnx"),
        "loop": build_loop(d / "loop.onnx"),
        "scan": build_scan(d / "scan.onnx"),
        "lstm_state": build_lstm_state(d / "lstm_state.onnx"),
    }


SHAPES = {
    "vad_like": {"input": (1, 512), "state": (2, 1, H)},
    "loop": {"x": (1, 8), "y0": (1, 8)},
    "scan": {"seq": (6, 4)},
    "lstm_state": {"x": (5, 1, 8)},
}


def _feeds(name: str, path: Path, n: int = 8) -> list[dict[str, np.ndarray]]:
    """Plausible inputs: for the VAD-like model a 16 kHz window of a voiced sound, a zero state and sr = 16000;
    standard-normal floats for the others."""
    rng = np.random.default_rng(5)
    io = resolve_static_inputs(io_spec(load_onnx(path)), SHAPES[name], path)
    out = []
    for _ in range(n):
        s = {t.name: rng.standard_normal(t.shape).astype(t.dtype) for t in io.inputs}
        if name == "vad_like":
            t = np.arange(512) / 16000
            x = sum(np.sin(2 * np.pi * 140 * k * t + rng.random()) / k for k in range(1, 8)) * 0.3
            s.update(
                input=x.astype(np.float32)[None],
                state=np.zeros(io.input("state").shape, np.float32),
                sr=np.array(16000, np.int64),
            )
        out.append(s)
    return out


def _calib_dir(tmp: Path, name: str, path: Path) -> Path:
    d = tmp / f"{name}-data"
    d.mkdir(exist_ok=True)
    for i, s in enumerate(_feeds(name, path)):
        np.savez(d / f"{i:02d}.npz", **s)
    return d


# -- reading and fixing shapes ------------------------------------------------------------------


def test_scalar_and_int64_inputs_need_no_input_shape(graphs: dict[str, Path]) -> None:
    path = graphs["vad_like"]
    io = io_spec(load_onnx(path))
    sr = io.input("sr")
    assert sr.shape == () and sr.dtype == "int64" and sr.is_static
    fixed = resolve_static_inputs(io, SHAPES["vad_like"], path)
    assert fixed.input("sr").shape == () and fixed.input("state").shape == (2, 1, H)


def test_missing_dims_listed_at_once_with_the_flags_to_pass(graphs: dict[str, Path]) -> None:
    path = graphs["vad_like"]
    with pytest.raises(ModelError) as e:
        resolve_static_inputs(io_spec(load_onnx(path)), {}, path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg
    assert "input 'input' has dynamic dims ['?', '?']" in msg and "input 'state' has dynamic dims [2, '?', 16]" in msg
    assert f"--input-shape input=1,N --input-shape state=2,1,{H}" in msg and "'sr'" not in msg
    # a named dim another input fixes takes that value: the Loop's 'b'
    with pytest.raises(ModelError, match="--input-shape y0=3,8"):
        resolve_static_inputs(io_spec(load_onnx(graphs["loop"])), {"x": (3, 8)}, graphs["loop"])


def test_walk_nodes_reaches_every_subgraph(graphs: dict[str, Path]) -> None:
    found = {(label, n.op_type): where for n, label, where in walk_nodes(load_onnx(graphs["vad_like"]).graph)}
    assert found[("LSTM_k8", "LSTM")] == ("If_sr/else_branch",)
    assert found[("If_frames_k16", "If")] == ("If_sr/then_branch",)


def test_make_static_keeps_a_branch_breaking_dim_dynamic(graphs: dict[str, Path], tmp_path: Path) -> None:
    """Fixing the window to 512 lets onnxruntime fold the 8 kHz branch's inner If to a rank-4 LSTM input and
    refuse the graph (Silero's 'First input tensor must have rank 3'): that one dim stays dynamic."""
    import onnxruntime as ort

    path = graphs["vad_like"]
    model = load_onnx(path)
    static = make_static(model, resolve_static_inputs(io_spec(model), SHAPES["vad_like"], path), source=path)
    assert kept_dynamic(static) == {"input": [1]}
    dims = {i.name: [d.dim_value or "?" for d in i.type.tensor_type.shape.dim] for i in static.graph.input}
    assert dims == {"input": [1, "?"], "state": [2, 1, H], "sr": []}
    out = save_onnx(static, tmp_path / "static.onnx")
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = _feeds("vad_like", path, 1)[0]
    for a, b in zip(sess.run(None, feed), ref.run(None, feed)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["loop", "scan", "lstm_state"])
def test_make_static_fixes_every_dim_where_the_graph_allows(name: str, graphs: dict[str, Path]) -> None:
    path = graphs[name]
    model = load_onnx(path)
    io = resolve_static_inputs(io_spec(model), SHAPES[name], path)
    static = make_static(model, io, source=path)
    assert kept_dynamic(static) == {} and not any(p.key == KEPT_DYNAMIC_KEY for p in static.metadata_props)
    assert all(d.HasField("dim_value") for i in static.graph.input for d in i.type.tensor_type.shape.dim)


def test_a_model_onnxruntime_cannot_load_is_a_model_error(graphs: dict[str, Path]) -> None:
    model = load_onnx(graphs["lstm_state"])
    x = model.graph.input[0]
    del x.type.tensor_type.shape.dim[1]  # x [seq, 8]: an LSTM needs [seq, batch, features]
    io = resolve_static_inputs(io_spec(model), {"x": (5, 8)}, Path("lstm.onnx"))
    with pytest.raises(
        ModelError,
        match=r"^lstm\.onnx: onnxruntime cannot load the model as it is: node 'LSTM_0' "
        r"\(LSTM\): First input tensor must have rank 3",
    ):
        make_static(model, io, source="lstm.onnx")


def test_describe_ort_error_names_the_innermost_node() -> None:
    text = (
        "[ONNXRuntimeError] : 1 : FAIL : Node (If_0) Op (If) [TypeInferenceError] Graph attribute inferencing "
        "failed: Node (_if_then_branch_LSTM) Op (LSTM) [ShapeInferenceError] First input tensor must have rank 3"
    )
    assert describe_ort_error(text) == (
        "node '_if_then_branch_LSTM' (LSTM) inside node 'If_0' (If): First input tensor must have rank 3"
    )


def test_non_tensor_inputs_and_outputs_are_named(tmp_path: Path) -> None:
    seq = h.make_tensor_sequence_value_info("parts", T.FLOAT, None)
    g = h.make_graph(
        [h.make_node("SequenceConstruct", ["x"], ["parts"])],
        "seq",
        [h.make_tensor_value_info("x", T.FLOAT, [2])],
        [seq],
    )
    path = _model(g, tmp_path / "seq.onnx")
    with pytest.raises(ModelError, match=r"seq\.onnx: output 'parts' is a sequence, not a tensor"):
        io_spec(load_onnx(path), path)


# -- what each converter can express --------------------------------------------------------------


def support(converter: str) -> OpSupport | None:
    """What ``converter`` declares it cannot express (its own ``op_support``, from the registry)."""
    return CONVERTERS.get(converter).op_support()


def test_refusals_name_every_node_and_op_in_one_line(graphs: dict[str, Path]) -> None:
    path = graphs["vad_like"]
    for converter in ("onnx->tflite", "onnx->tensorrt-plan", "onnx->openvino-ir"):
        with pytest.raises(ConversionError) as e:
            check_ops(path, support(converter))
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith("vad_like.onnx: target")
        # (an LSTM given its state, which onnx2tf mistranslates, is unrolled first: edge.graph.lower; not counted)
        assert "cannot express 2 nodes (2 inside If/Loop/Scan subgraphs)" in msg, msg
        for tag in ("k8", "k16"):
            assert f"node 'If_frames_{tag}' (If: output 0: then rank 2, else rank 3)" in msg, msg
        assert "x86-cpu" in msg  # the way forward
    with pytest.raises(ConversionError) as e:
        check_ops(path, support("onnx->coreml"))
    assert "target apple-ane" in str(e.value)
    assert "cannot express 1 node: node 'If_sr' (If)" in str(e.value)  # control flow: one node, not its insides
    for name in ("loop", "scan", "lstm_state"):  # control flow and recurrence are fine where the tool has them
        for converter in ("onnx->tensorrt-plan", "onnx->openvino-ir", "onnx->onnx"):
            check_ops(graphs[name], support(converter))
    # onnx2tf 1.29.24 under TensorFlow 2.19 fails on each of these (measured): refused before TensorFlow starts
    check_ops(
        graphs["lstm_state"], support("onnx->tflite")
    )  # its LSTM (state given, no bias) is unrolled first: edge.graph.lower
    for name, node in (("loop", "'Loop_steps' (Loop)"), ("scan", "'Scan_seq' (Scan)")):
        with pytest.raises(ConversionError) as e:
            check_ops(graphs[name], support("onnx->tflite"))
        tflite_targets = ", ".join(
            targets_using("onnx->tflite")
        )  # every profile that takes this route, from the registry
        assert {"arm-xnnpack", "coral-edgetpu"} <= set(targets_using("onnx->tflite"))
        assert str(e.value).startswith(f"{name}.onnx: targets {tflite_targets} (onnx->tflite")
        assert f"cannot express 1 node: node {node}" in str(e.value)
    with pytest.raises(ConversionError, match=r"node 'Loop_steps' \(Loop\)"):
        check_ops(graphs["loop"], support("onnx->coreml"))
    with pytest.raises(ConversionError, match=r"target jetson-orin .*node 'x' \(com\.microsoft\.FusedMatMul\)"):
        bad = load_onnx(graphs["lstm_state"])
        bad.graph.node.append(h.make_node("FusedMatMul", ["y", "y"], ["z"], domain="com.microsoft", name="x"))
        check_ops(bad, support("onnx->tensorrt-plan"), target="jetson-orin")


def test_a_refusal_of_many_nodes_names_a_few_op_types_with_counts(tmp_path: Path) -> None:
    """Issue #34 class 5: a refusal listed every node (115 node names, 12 KB in one line for a speech model on
    apple-ane). Past three nodes it names the op types, most nodes first, each with its count and first node."""
    ops = ["Hardmax"] * 40 + ["Celu"] * 30 + ["Round"] * 20 + ["Sign"] * 10 + ["Selu"] * 6 + ["Shrink"] * 5
    ops += ["ThresholdedRelu"] * 4
    nodes = [h.make_node(op, [f"t{i}"], [f"t{i + 1}"], name=f"/encoder/layer.{i}/{op}_{i}") for i, op in enumerate(ops)]
    g = h.make_graph(
        nodes,
        "many",
        [h.make_tensor_value_info("t0", T.FLOAT, [1, 8])],
        [h.make_tensor_value_info(f"t{len(ops)}", T.FLOAT, [1, 8])],
    )
    path = _model(g, tmp_path / "many.onnx")
    with pytest.raises(ConversionError) as e:
        check_ops(path, support("onnx->coreml"), target="apple-ane")
    msg = e.value.message  # (str() adds the way forward, the hint, on a line of its own)
    assert "\n" not in msg and len(msg) < 500, (len(msg), msg)
    assert msg.startswith(
        "many.onnx: target apple-ane (onnx->coreml, edgekit's ONNX->PyTorch bridge) cannot express 115"
    )
    assert "Hardmax (40 nodes, first '/encoder/layer.0/Hardmax_0'), Celu (30 nodes, first " in msg, msg
    assert "Sign (10 nodes, first '/encoder/layer.90/Sign_90') and 3 more op types (15 nodes)" in msg, msg
    assert msg.count("/encoder/") == 4  # one node named per op type named, no node list
    assert "Celu, Hardmax, Round, Selu and 3 more: not among the ops" in msg, msg
    with pytest.raises(ConversionError) as e:  # three nodes or fewer: each named, as before
        check_ops(
            _model(
                h.make_graph(nodes[:1], "one", g.input, [h.make_tensor_value_info("t1", T.FLOAT, [1, 8])]),
                tmp_path / "one.onnx",
            ),
            support("onnx->coreml"),
        )
    assert "cannot express 1 node: node '/encoder/layer.0/Hardmax_0' (Hardmax)" in str(e.value)


def test_the_coreml_list_is_the_bridges_own() -> None:
    text = (REPO / "edge" / "toolchains" / "coreml_bridge.py").read_text()
    support_ = support("onnx->coreml")
    ops = support_.supported_only if support_ else None
    assert ops and {"Conv", "Gemm", "Constant", "Identity"} <= ops and "If" not in ops
    assert all(f'"{op}"' in text for op in ops)


def test_converters_refuse_before_their_toolchain(graphs: dict[str, Path], tmp_path: Path) -> None:
    """The converters check first: no toolchain, TensorFlow or torch is started for a graph they cannot take."""
    from edge.backends.converter import CONVERTERS, ConversionRequest

    path = graphs["vad_like"]
    model = load_onnx(path)
    io = resolve_static_inputs(io_spec(model), SHAPES["vad_like"], path)
    for name in ("onnx->tensorrt-plan", "onnx->coreml", "onnx->tflite"):
        conv = CONVERTERS.get(name)()
        try:
            conv.convert(ConversionRequest(source=path, workdir=tmp_path, precision="fp32", io=io))
        except ConversionError as e:
            assert "If_frames_k8" in str(e) or "If_sr" in str(e), str(e)
        except EdgeError as e:  # a missing toolchain/package is reported before the op check: still one line
            assert "\n" not in str(e)
        else:
            pytest.fail(f"{name} converted a graph it cannot express")


# -- through the pipeline: convert with parity ----------------------------------------------------


def _convert(
    model: Path,
    target: str,
    out: Path,
    shapes: dict[str, tuple[int, ...]],
    precision: str | None = None,
    calib: Path | None = None,
) -> dict[str, Any]:
    from edge.pipeline import convert

    b = convert(
        model, target, out, ConvertRequest(precision=precision, input_shapes=shapes, calib=calib, preprocess="none")
    )
    manifest = json.loads((Path(out) / "manifest.json").read_text())
    assert manifest["parity"]["passed"] is True, manifest["parity"]
    assert b is not None
    return manifest


@pytest.mark.parametrize("name", ["vad_like", "loop", "scan", "lstm_state"])
@pytest.mark.parametrize(
    "target,precision", [("x86-cpu", "fp32"), ("x86-cpu", None), ("intel-igpu", "fp32"), ("intel-igpu", None)]
)
def test_graphs_convert_with_parity(
    name: str, target: str, precision: str | None, graphs: dict[str, Path], tmp_path: Path
) -> None:
    calib = _calib_dir(tmp_path, name, graphs[name])
    if name == "vad_like" and target == "intel-igpu":
        # OpenVINO converts it, then its CPU plug-in refuses "If operation with dynamic rank": refused up front
        with pytest.raises(ConversionError) as e:
            _convert(graphs[name], target, tmp_path / "b", SHAPES[name], precision, calib)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith("vad_like.onnx: target intel-igpu (onnx->openvino-ir"), msg
        assert "node 'If_frames_k8' (If: output 0: then rank 2, else rank 3)" in msg
        return
    m = _convert(graphs[name], target, tmp_path / "b", SHAPES[name], precision, calib)
    for o in m["parity"]["outputs"]:
        assert o["passed"], o


def test_vad_like_converts_on_generated_inputs(graphs: dict[str, Path], tmp_path: Path) -> None:
    """Generated parity inputs feed a scalar int64 sample rate as 16000 (with 0 the 8 kHz branch would run on a
    16 kHz window and fail) and the recurrent state as zeros."""
    _convert(graphs["vad_like"], "x86-cpu", tmp_path / "b", SHAPES["vad_like"])


def test_cli_missing_shapes_is_one_line(graphs: dict[str, Path], tmp_path: Path) -> None:
    p = run_cli("convert", str(graphs["vad_like"]), "--target", "x86-cpu", "-o", str(tmp_path / "b"))
    assert_user_error(p, "vad_like.onnx", "--input-shape input=1,N --input-shape state=2,1,16")


# -- the real Silero VAD ---------------------------------------------------------------------------

needs_silero = pytest.mark.skipif(
    not SILERO.is_file(), reason=f"{SILERO.name} not fetched: run python examples/fetch_pretrained.py (CI does)"
)


@needs_silero
@pytest.mark.parametrize("precision", ["fp32", None])
def test_silero_vad_converts_for_x86_cpu(precision: str | None, tmp_path: Path) -> None:
    d = tmp_path / "vad-data"
    d.mkdir()
    rng = np.random.default_rng(3)
    t = np.arange(512) / 16000
    for i in range(16):  # a voiced sound (harmonics of 100-220 Hz) at 16 kHz, the state zero as at stream start
        f0 = 100 + 120 * rng.random()
        x = sum(np.sin(2 * np.pi * f0 * k * t + 6 * rng.random()) / k for k in range(1, 12)) * 0.3 * rng.random()
        np.savez(
            d / f"{i:02d}.npz",
            input=x.astype(np.float32)[None],
            state=np.zeros((2, 1, 128), np.float32),
            sr=np.array(16000, np.int64),
        )
    m = _convert(SILERO, "x86-cpu", tmp_path / "b", {"input": (1, 512), "state": (2, 1, 128)}, precision, d)
    assert {o["name"] for o in m["parity"]["outputs"]} == {"output", "stateN"}


@needs_silero
@pytest.mark.parametrize("target", ["intel-igpu", "arm-xnnpack", "jetson-orin", "apple-ane"])
def test_silero_vad_refused_with_the_nodes(target: str, tmp_path: Path) -> None:
    from edge.targets import get_target

    profile = get_target(target)
    with pytest.raises(ConversionError) as e:
        check_ops(SILERO, support(profile.chain[0].converter), target=target)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"silero_vad.onnx: target {target} ")
    assert ("(If" in msg or "If (" in msg) and "x86-cpu" in msg  # (past three nodes: "If (16 nodes, first ...")
