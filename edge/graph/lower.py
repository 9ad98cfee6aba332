"""Rewrite ONNX ops a converter mistranslates into plain ops that compute the same.

* :func:`lower_lstm`: an ``LSTM`` given its recurrent state (``initial_h``/``initial_c``: a streaming model's
  h0/c0, e.g. Silero VAD's decoder), or without a bias, becomes its gate equations unrolled over the (static) sequence: per step
  ``MatMul``/``Add`` for the gates, ``Sigmoid``/``Tanh``/``Mul`` for the cell, ``Slice``/``Reshape``/``Concat``
  for the plumbing. onnx2tf 1.29.24 fails on such an LSTM (``edge.graph.opsupport``); the unrolled form is what a
  TFLite LSTM computes anyway (TFLite runs a stateful LSTM step as ops). Only the forms ONNX defines by default
  are lowered: one direction (forward or reverse), activations Sigmoid/Tanh/Tanh, no peepholes, no clip, no
  ``sequence_lens``, ``layout`` 0, constant weights; parity checks the result like any conversion.
* :func:`drop_noop_slice_axes`: the axes a ``Slice`` keeps whole go from it, and a ``Slice`` that keeps everything
  goes (issue #23, class 9: onnx2tf applies such a Slice's axes to the channels-last tensor unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edge.errors import ConversionError

_DEFAULT_ACTS = ("Sigmoid", "Tanh", "Tanh")
#: the unrolled graph grows with the sequence: longer ones are left to the converter (and its refusal)
MAX_STEPS = 64


def _replace_nodes(graph: Any, nodes: list[Any], initializers: list[Any]) -> None:
    """``graph``'s nodes become ``nodes`` (in order) and ``initializers`` are added."""
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(initializers)


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _given(node: Any, i: int) -> bool:
    return len(node.input) > i and node.input[i] != ""


def lstm_lowerable(node: Any) -> str | None:
    """Why :func:`lower_lstm` cannot lower ``node`` (an LSTM) from its attributes and inputs alone, or None."""
    a = _attrs(node)
    acts = tuple(x.decode() if isinstance(x, bytes) else str(x) for x in a.get("activations", _DEFAULT_ACTS))
    direction = a.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else str(direction)
    if direction not in ("forward", "reverse"):
        return f"direction {direction}"
    if acts != _DEFAULT_ACTS:
        return f"activations {', '.join(acts)}"
    if "clip" in a:
        return "clip"
    if a.get("input_forget", 0):
        return "input_forget"
    if a.get("layout", 0):
        return "layout 1"
    if _given(node, 4):
        return "sequence_lens"
    if _given(node, 7):
        return "peepholes"
    return None


def needs_lowering(node: Any) -> bool:
    """An LSTM onnx2tf mistranslates (given its state, or without a bias) that :func:`lower_lstm` can lower."""
    return (
        node.op_type == "LSTM"
        and (_given(node, 5) or _given(node, 6) or not _given(node, 3))
        and lstm_lowerable(node) is None
    )


def _evaluate(
    model: Any, names: list[str], shapes: dict[str, tuple[int, ...]], *, shape_only: bool = False
) -> dict[str, np.ndarray]:
    """The values of ``names`` that are computed from constants only (never from input data), by onnxruntime;
    ``shape_only``: tensors whose *shape* is (their values are then only good for the shape). The graph's inputs
    are fed zeros of ``shapes``; {} when one of them has none."""
    from onnx.helper import tensor_dtype_to_np_dtype

    from edge.graph.freeze import probe, static_analysis

    known_value, known_shape = static_analysis(model.graph)
    known = known_shape if shape_only else known_value
    names = [n for n in names if known.get(n, False)]
    if not names:
        return {}
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        if vi.name not in shapes:
            return {}
        feeds[vi.name] = np.zeros(shapes[vi.name], tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
    return dict(zip(names, probe(model, names, feeds)))


def lower_lstm(model: Any, *, only_stateful: bool = True) -> tuple[Any, int]:
    """``model`` with its (stateful, when ``only_stateful``) LSTMs unrolled into plain ops; how many."""
    lw = _LSTMLowering(model, only_stateful)
    lowering = {id(n) for n in lw.todo}
    count = 0
    for k, n in enumerate(model.graph.node):
        if id(n) not in lowering:
            lw.new_nodes.append(n)
            continue
        lw.lower(n, n.name or f"LSTM_{k}")
        count += 1
    if count:
        _replace_nodes(model.graph, lw.new_nodes, lw.new_inits)
    return model, count


class _LSTMLowering:
    """One graph's LSTMs being unrolled: its constants and static shapes, and the nodes and initializers that
    replace them (each LSTM's under the prefix ``<name>/lowered``)."""

    def __init__(self, model: Any, only_stateful: bool) -> None:
        import onnx

        g = model.graph
        self.inits = {i.name: i for i in g.initializer}
        self.consts = {n.output[0]: n for n in g.node if n.op_type == "Constant"}
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        self.shapes: dict[str, tuple[int, ...]] = {}
        for vi in list(inferred.graph.input) + list(inferred.graph.value_info):
            t = vi.type.tensor_type
            if t.HasField("shape") and all(d.HasField("dim_value") and d.dim_value > 0 for d in t.shape.dim):
                self.shapes[vi.name] = tuple(int(d.dim_value) for d in t.shape.dim)
        # weights computed from constants (a PyTorch export reorders its gates with Slice/Concat): evaluated once
        self.todo = [
            n
            for n in g.node
            if n.op_type == "LSTM" and (needs_lowering(n) or not only_stateful) and lstm_lowerable(n) is None
        ]
        wanted = [i for n in self.todo for i in list(n.input)[1:4] if i and self.const(i) is None]
        self.computed = _evaluate(model, wanted, self.shapes) if wanted else {}
        self.producers = {o: n for n in g.node for o in n.output if o}
        # shapes ONNX's inference gave up on upstream (the inputs, the states' sources): onnxruntime computes them,
        # for every LSTM in one run, when they are static
        unknown = [
            x
            for n in self.todo
            for x in [n.input[0], *(self.unsqueezed(n.input[i]) for i in (5, 6) if _given(n, i))]
            if x and x not in self.shapes
        ]
        if unknown:
            self.shapes.update(
                {k: tuple(v.shape) for k, v in _evaluate(model, unknown, self.shapes, shape_only=True).items()}
            )
        self.new_nodes: list[Any] = []
        self.new_inits: list[Any] = []

    def const(self, name: str) -> np.ndarray | None:
        from onnx import numpy_helper

        if name in self.inits:
            return numpy_helper.to_array(self.inits[name])
        if name in self.consts:
            return numpy_helper.to_array(_attrs(self.consts[name])["value"])
        return None

    def unsqueezed(self, name: str) -> str | None:
        """The input of the Unsqueeze(axis 0) that makes ``name``, or None."""
        q = self.producers.get(name)
        if q is None or q.op_type != "Unsqueeze":
            return None
        axes = _attrs(q).get("axes")
        if axes is None and len(q.input) > 1:
            axes = self.const(q.input[1])
        return q.input[0] if axes is not None and [int(a) for a in np.ravel(axes)] == [0] else None

    def init(self, p: str, name: str, arr: np.ndarray) -> str:
        from onnx import numpy_helper

        self.new_inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), f"{p}/{name}"))
        return f"{p}/{name}"

    def node(self, p: str, op: str, ins: list[str], name: str, **kw: Any) -> str:
        from onnx import helper

        out = f"{p}/{name}"
        self.new_nodes.append(helper.make_node(op, ins, [out], name=out, **kw))
        return out

    def weights(self, n: Any, label: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(W, R, B): constants, or computed from constants; refused otherwise."""
        W, R = self.const(n.input[1]), self.const(n.input[2])
        B = self.const(n.input[3]) if _given(n, 3) else None
        W = W if W is not None else self.computed.get(n.input[1])
        R = R if R is not None else self.computed.get(n.input[2])
        B = B if B is not None or not _given(n, 3) else self.computed.get(n.input[3])
        if W is None or R is None or (_given(n, 3) and B is None):
            raise ConversionError(
                f"node {label!r} (LSTM): its weights are computed, not constants; edgekit lowers an LSTM with constant W, R, B only"
            )
        return W, R, B

    def steps_batch(self, n: Any, label: str) -> tuple[int, int]:
        xs = self.shapes.get(n.input[0])
        if xs is None or len(xs) != 3:
            raise ConversionError(
                f"node {label!r} (LSTM): its input's shape is not static here, so its steps cannot be unrolled",
                hint="pass --input-shape for every dynamic input",
            )
        steps, batch, _ = xs
        if steps > MAX_STEPS:
            raise ConversionError(f"node {label!r} (LSTM): {steps} steps; edgekit unrolls at most {MAX_STEPS}")
        return steps, batch

    def state_2d(self, p: str, name: str, batch: int, hidden: int, tag: str, bh: str) -> str:
        """The [B, H] state: an Unsqueeze(axis 0) of a [B, H] tensor is skipped (onnx2tf reads the rank-3
        tensor as NCW and slices Silero VAD's state along the wrong axis), else a Reshape."""
        src = self.unsqueezed(name)
        if src is not None and self.shapes.get(src) == (batch, hidden):
            return src
        return self.node(p, "Reshape", [name, bh], tag)

    def lower(self, n: Any, label: str) -> None:
        """One LSTM unrolled: its steps, each a cell of plain ops, then its outputs."""
        W, R, B = self.weights(n, label)
        steps, batch = self.steps_batch(n, label)
        H = int(_attrs(n)["hidden_size"]) if "hidden_size" in _attrs(n) else int(R.shape[-1])
        reverse = _attrs(n).get("direction", b"forward") in (b"reverse", "reverse")
        p = f"{label}/lowered"
        bias = (B[0][: 4 * H] + B[0][4 * H :]) if B is not None else np.zeros(4 * H, W.dtype)
        cell = _Cell(
            self.init(p, "Wt", W[0].T.astype(W.dtype)),
            self.init(p, "Rt", R[0].T.astype(R.dtype)),
            self.init(p, "B", bias),
            [],
            "",
        )
        bh = self.init(p, "shape_bh", np.array([batch, H], np.int64))
        bi = self.init(p, "shape_bi", np.array([batch, -1], np.int64))
        one = self.init(p, "shape_1bh", np.array([1, batch, H], np.int64))
        ax0, cell.ax1 = self.init(p, "axis0", np.array([0], np.int64)), self.init(p, "axis1", np.array([1], np.int64))
        cell.gate = [self.init(p, f"g{j}", np.array([j * H], np.int64)) for j in range(5)]
        zeros = ""  # read only where a state is not given, and then set here
        if not (_given(n, 5) and _given(n, 6)):
            zeros = self.init(p, "zeros", np.zeros((batch, H), W.dtype))
        h = self.state_2d(p, n.input[5], batch, H, "h_init", bh) if _given(n, 5) else zeros
        c = self.state_2d(p, n.input[6], batch, H, "c_init", bh) if _given(n, 6) else zeros
        order = range(steps - 1, -1, -1) if reverse else range(steps)
        x_rows = (
            self.node(p, "Reshape", [n.input[0], self.init(p, "shape_rows", np.array([steps, -1], np.int64))], "x_rows")
            if steps > 1
            else ""
        )
        ys: dict[int, str] = {}
        for t in order:
            if steps == 1:
                xt = self.node(p, "Reshape", [n.input[0], bi], f"x{t}")
            else:  # rows of a rank-2 [S, B*I]: onnx2tf moves a rank-3 tensor's axes (NCW -> NWC) under a Slice
                s0 = self.init(p, f"t{t}", np.array([t], np.int64))
                s1 = self.init(p, f"t{t}e", np.array([t + 1], np.int64))
                xt = self.node(p, "Reshape", [self.node(p, "Slice", [x_rows, s0, s1, ax0], f"x{t}_slice"), bi], f"x{t}")
            h, c = self.step(p, t, xt, h, c, cell)
            ys[t] = h
        self.outputs(n, p, ys, (h, c), (steps, batch, H), one)

    def step(self, p: str, t: int, xt: str, h: str, c: str, cell: _Cell) -> tuple[str, str]:
        """One LSTM cell at step ``t``: (h, c) after it."""
        node = self.node
        # h's product first: onnx-simplifier fuses MatMul + Add into a Gemm at the MatMul's place, which must
        # then come after the Add's other input
        gh = node(p, "MatMul", [h, cell.rt], f"gh{t}")
        gx = node(p, "MatMul", [xt, cell.wt], f"gx{t}")
        gs = node(p, "Add", [node(p, "Add", [gx, gh], f"gxh{t}"), cell.bb], f"gates{t}")
        part = [node(p, "Slice", [gs, cell.gate[j], cell.gate[j + 1], cell.ax1], f"gate{t}_{j}") for j in range(4)]
        i_, o_, f_ = (node(p, "Sigmoid", [part[j]], f"{nm}{t}") for j, nm in ((0, "i"), (1, "o"), (2, "f")))
        cc = node(p, "Tanh", [part[3]], f"cc{t}")
        c = node(p, "Add", [node(p, "Mul", [f_, c], f"fc{t}"), node(p, "Mul", [i_, cc], f"ic{t}")], f"c{t}")
        h = node(p, "Mul", [o_, node(p, "Tanh", [c], f"tc{t}")], f"h{t}")
        return h, c

    def outputs(
        self, n: Any, p: str, ys: dict[int, str], hc: tuple[str, str], sizes: tuple[int, int, int], one: str
    ) -> None:
        """The LSTM's outputs (Y, Y_h, Y_c), each produced under its own name."""
        from onnx import helper

        (h, c), (steps, batch, H) = hc, sizes
        outs = list(n.output) + [""] * (3 - len(n.output))
        if outs[0]:  # [S, B*H] rows, then one Reshape: onnx2tf reads a rank-4 Concat's axis as NHWC and moves it
            flat = self.init(p, "shape_1x", np.array([1, batch * H], np.int64))
            parts = [self.node(p, "Reshape", [ys[t], flat], f"y{t}") for t in range(steps)]
            rows = self.node(p, "Concat", parts, "Y_rows", axis=0)
            self.new_nodes.append(
                helper.make_node(
                    "Reshape",
                    [rows, self.init(p, "shape_Y", np.array([steps, 1, batch, H], np.int64))],
                    [outs[0]],
                    name=f"{p}/Y",
                )
            )
        if outs[1]:
            self.new_nodes.append(helper.make_node("Reshape", [h, one], [outs[1]], name=f"{p}/Y_h"))
        if outs[2]:
            self.new_nodes.append(helper.make_node("Reshape", [c, one], [outs[2]], name=f"{p}/Y_c"))


@dataclass
class _Cell:
    """One LSTM's weights and gate constants, as the unrolled cells read them."""

    wt: str
    rt: str
    bb: str
    gate: list[str]
    ax1: str


def squeeze_to_reshape(model: Any) -> tuple[Any, int]:
    """Every Squeeze/Unsqueeze whose output shape is static becomes a Reshape to that shape (the same values).
    onnx2tf moves rank-3 tensors to channels-last and then squeezes the wrong axis (Silero VAD's encoder output
    [1, 128, 1] -> [1, 128] came out [1, 128, 0]); a Reshape it transposes back first, correctly."""
    from onnx import helper, numpy_helper

    g = model.graph
    shapes: dict[str, tuple[int, ...]] = {}
    for vi in g.input:
        t = vi.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") and d.dim_value > 0 for d in t.shape.dim):
            shapes[vi.name] = tuple(int(d.dim_value) for d in t.shape.dim)
    names = [n.output[0] for n in g.node if n.op_type in ("Squeeze", "Unsqueeze")]
    got = _evaluate(model, names, shapes, shape_only=True) if names else {}
    new, inits, count = [], [], 0
    for n in g.node:
        if n.op_type in ("Squeeze", "Unsqueeze") and n.output[0] in got:
            shape = np.array(got[n.output[0]].shape, np.int64)
            name = f"{n.name or n.output[0]}/as_reshape"
            inits.append(numpy_helper.from_array(shape, f"{name}/shape"))
            new.append(helper.make_node("Reshape", [n.input[0], f"{name}/shape"], [n.output[0]], name=name))
            count += 1
        else:
            new.append(n)
    if count:
        _replace_nodes(g, new, inits)
    return model, count


#: a Slice end at or past this reaches the end of any axis ONNX can describe (INT32_MAX, INT64_MAX ...)
_TO_THE_END = 2**31 - 1


def _noop_axis(start: int, end: int, step: int, dim: int | None) -> bool:
    """Whether a Slice keeps the whole axis: step 1 from its first element to its last, by ONNX's clamping when the
    axis length ``dim`` is known (an end of 1 on a length-1 axis, or 10**9 on any), else only start 0, end "to the end"."""
    if step != 1:
        return False
    if dim is None:
        return start == 0 and end >= _TO_THE_END
    lo = start + dim if start < 0 else start
    hi = end + dim if end < 0 else end
    return min(max(lo, 0), dim) == 0 and min(max(hi, 0), dim) == dim


def _slice_params(n: Any, values: dict[str, np.ndarray]) -> tuple[np.ndarray, ...] | None:
    """A Slice's (starts, ends, axes, steps) when they are all constants, else None."""
    if (
        len(n.input) < 4
        or not all(i in values for i in n.input[1:4])
        or (len(n.input) > 4 and n.input[4] and n.input[4] not in values)
    ):
        return None
    starts, ends, axes = (np.ravel(values[i]).astype(np.int64) for i in n.input[1:4])
    steps = np.ravel(values[n.input[4]]).astype(np.int64) if len(n.input) > 4 and n.input[4] else np.ones_like(starts)
    return starts, ends, axes, steps


def _slice_input_shapes(model: Any, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The shape of each Slice's input that follows from the input ``shapes`` alone; {} where onnxruntime cannot
    tell (the rewrite then goes by the parameters only)."""
    data = [n.input[0] for n in model.graph.node if n.op_type == "Slice"]
    try:
        found = _evaluate(model, data, shapes, shape_only=True) if data else {}
    except Exception:  # noqa: BLE001 - an optional refinement: a graph onnxruntime cannot probe keeps its Slices
        return {}
    return {k: tuple(v.shape) for k, v in found.items()}


def drop_noop_slice_axes(model: Any, shapes: dict[str, tuple[int, ...]] | None = None) -> tuple[Any, int]:
    """Slices with constant parameters lose the axes they do not cut (:func:`_noop_axis`: with the graph's input
    ``shapes`` given, the axis lengths of each Slice's input decide), and a Slice that cuts nothing goes (its readers
    read its input). Same values by definition. onnx2tf 1.29.24 mistranslates such axes on a tensor it moved to
    channels-last: a full-rank Slice of a rank-3 tensor (Silero VAD's STFT halves: the imaginary half came out
    [1, 0, 258]), and the no-op Slice jax2tf puts after a 1-D convolution run as a 2-D one (Magika: ``[:, :, :, :1]``
    of an NCHW ``[1, 512, 508, 1]`` was applied to the channels of the NHWC ``[1, 508, 1, 512]``, and the bias add
    broadcast the ``[1, 1, 508]`` left over back to full size: cosine 0.00004). The same Slice on its real axes, or
    none, it takes."""
    from onnx import helper, numpy_helper

    g = model.graph
    values = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    values.update(
        {
            n.output[0]: numpy_helper.to_array(_attrs(n)["value"])
            for n in g.node
            if n.op_type == "Constant" and "value" in _attrs(n)
        }
    )
    dims = _slice_input_shapes(model, shapes) if shapes else {}
    new, inits, count = [], [], 0
    alias: dict[str, str] = {}
    outputs = {o.name for o in g.output}
    for n in g.node:
        for k, i in enumerate(n.input):
            if i in alias:
                n.input[k] = alias[i]
        params = _slice_params(n, values) if n.op_type == "Slice" and n.output[0] not in outputs else None
        if params is None:
            new.append(n)
            continue
        starts, ends, axes, steps = params
        shape = dims.get(n.input[0])
        cut = [
            k
            for k in range(len(axes))
            if not _noop_axis(int(starts[k]), int(ends[k]), int(steps[k]), None if shape is None else shape[axes[k]])
        ]
        if not cut:  # cuts nothing: its readers read its input (onnx2tf lost the layout behind such a Slice)
            alias[n.output[0]] = alias.get(n.input[0], n.input[0])
            count += 1
            continue
        if len(cut) == len(axes):
            new.append(n)
            continue
        name = f"{n.name or n.output[0]}/cut"
        parts = []
        for tag, arr in (("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps)):
            inits.append(numpy_helper.from_array(arr[cut], f"{name}/{tag}"))
            parts.append(f"{name}/{tag}")
        new.append(helper.make_node("Slice", [n.input[0], *parts], list(n.output), name=name))
        count += 1
    if count:
        _replace_nodes(g, new, inits)
    return model, count


def fold_constants(model: Any, shapes: dict[str, tuple[int, ...]]) -> tuple[Any, int]:
    """Every tensor computed from constants only (never from input data; ``edge.graph.freeze``'s analysis) becomes an
    initializer holding its value (onnxruntime computes it once), and the nodes that only fed them go."""
    from onnx import numpy_helper

    from edge.graph.freeze import static_analysis

    g = model.graph
    known, _ = static_analysis(g)
    inits = {i.name for i in g.initializer}
    names = [o for n in g.node if n.op_type != "Constant" for o in n.output if o and known.get(o) and o not in inits]
    values = _evaluate(model, names, shapes) if names else {}
    # Constant nodes too (onnx2tf reads an initializer's value when it maps a Slice's axes to channels-last, and
    # takes a Constant node's output as a tensor: Silero's STFT halves were cut on the wrong axis)
    for n in g.node:
        if n.op_type == "Constant" and "value" in _attrs(n):
            values[n.output[0]] = numpy_helper.to_array(_attrs(n)["value"])
    if not values:
        return model, 0
    kept = [n for n in g.node if not all((o in values) for o in n.output if o)]
    for name, v in values.items():
        g.initializer.append(numpy_helper.from_array(np.asarray(v), name))
    used = {i for n in kept for i in n.input} | {o.name for o in g.output}
    kept = [n for n in kept if n.op_type != "Constant" or n.output[0] in used]
    del g.node[:]
    g.node.extend(kept)
    live = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(live)
    return model, len(values)


def fold_weight_dequantize(model: Any) -> tuple[Any, int]:
    """Every DequantizeLinear of constants (int8 weights with their scale: tf2onnx's translation of a dynamic-range
    TFLite) becomes the float32 initializer it computes, for a graph that is quantized again from float: onnx2tf's
    full-integer model of the unfolded graph computed unrelated outputs (the tiny CNN's dynamic-range TFLite for
    coral-edgetpu: cosine 0.756 to onnxruntime on the same ONNX). Returns the model and how many were folded."""
    from onnx import numpy_helper

    g = model.graph
    inits = {i.name: i for i in g.initializer}
    kept, count = [], 0
    for n in g.node:
        attrs = {a.name: a for a in n.attribute}
        if n.op_type != "DequantizeLinear" or "block_size" in attrs or not all(i in inits for i in n.input if i):
            kept.append(n)
            continue
        x = numpy_helper.to_array(inits[n.input[0]]).astype(np.float32)
        scale = numpy_helper.to_array(inits[n.input[1]]).astype(np.float32)
        has_zp = len(n.input) > 2 and n.input[2]
        zp = numpy_helper.to_array(inits[n.input[2]]).astype(np.float32) if has_zp else np.zeros_like(scale)
        if scale.ndim == 1 and x.ndim > 0:  # per-axis: broadcast along ``axis``
            shape = [1] * x.ndim
            shape[attrs["axis"].i % x.ndim if "axis" in attrs else 1] = -1
            scale, zp = scale.reshape(shape), zp.reshape(shape)
        g.initializer.append(numpy_helper.from_array(((x - zp) * scale).astype(np.float32), n.output[0]))
        count += 1
    if count:
        del g.node[:]
        g.node.extend(kept)
        used = {i for n in kept for i in n.input} | {o.name for o in g.output}
        live = [i for i in g.initializer if i.name in used]
        del g.initializer[:]
        g.initializer.extend(live)
    return model, count
