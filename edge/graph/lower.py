"""Rewrite ONNX ops a converter mistranslates into plain ops that compute the same.

* :func:`lower_lstm`: an ``LSTM`` given its recurrent state (``initial_h``/``initial_c``: a streaming model's
  h0/c0, e.g. Silero VAD's decoder), or without a bias, becomes its gate equations unrolled over the (static) sequence: per step
  ``MatMul``/``Add`` for the gates, ``Sigmoid``/``Tanh``/``Mul`` for the cell, ``Slice``/``Reshape``/``Concat``
  for the plumbing. onnx2tf 1.29.24 fails on such an LSTM (``edge.graph.opsupport``); the unrolled form is what a
  TFLite LSTM computes anyway (TFLite runs a stateful LSTM step as ops). Only the forms ONNX defines by default
  are lowered: one direction (forward or reverse), activations Sigmoid/Tanh/Tanh, no peepholes, no clip, no
  ``sequence_lens``, ``layout`` 0, constant weights; parity checks the result like any conversion.
"""

from __future__ import annotations

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
    return node.op_type == "LSTM" and (_given(node, 5) or _given(node, 6) or not _given(node, 3)) \
        and lstm_lowerable(node) is None


def _evaluate(model: Any, names: list[str], shapes: dict[str, tuple[int, ...]], *,
              shape_only: bool = False) -> dict[str, np.ndarray]:
    """The values of ``names`` that are computed from constants only (never from input data), by onnxruntime;
    ``shape_only``: tensors whose *shape* is (their values are then only good for the shape). The graph's inputs
    are fed zeros of ``shapes``; {} when one of them has none."""
    from onnx.helper import tensor_dtype_to_np_dtype

    from edge.graph.freeze import static_analysis, probe

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
    import onnx
    from onnx import helper, numpy_helper

    g = model.graph
    inits = {i.name: i for i in g.initializer}
    consts = {n.output[0]: n for n in g.node if n.op_type == "Constant"}

    def const(name: str) -> np.ndarray | None:
        if name in inits:
            return numpy_helper.to_array(inits[name])
        if name in consts:
            return numpy_helper.to_array(_attrs(consts[name])["value"])
        return None

    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    shapes: dict[str, tuple[int, ...]] = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info):
        t = vi.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") and d.dim_value > 0 for d in t.shape.dim):
            shapes[vi.name] = tuple(int(d.dim_value) for d in t.shape.dim)

    # weights computed from constants (a PyTorch export reorders its gates with Slice/Concat): evaluated once
    todo = [n for n in g.node if n.op_type == "LSTM" and (needs_lowering(n) or not only_stateful)
            and lstm_lowerable(n) is None]
    wanted = [i for n in todo for i in list(n.input)[1:4] if i and const(i) is None]
    computed = _evaluate(model, wanted, shapes) if wanted else {}

    producers = {o: n for n in g.node for o in n.output if o}

    def unsqueezed(name: str) -> str | None:
        """The input of the Unsqueeze(axis 0) that makes ``name``, or None."""
        q = producers.get(name)
        if q is None or q.op_type != "Unsqueeze":
            return None
        axes = _attrs(q).get("axes")
        if axes is None and len(q.input) > 1:
            axes = const(q.input[1])
        return q.input[0] if axes is not None and [int(a) for a in np.ravel(axes)] == [0] else None

    # shapes ONNX's inference gave up on upstream (the inputs, the states' sources): onnxruntime computes them,
    # for every LSTM in one run, when they are static
    unknown = [x for n in todo for x in [n.input[0], *(unsqueezed(n.input[i]) for i in (5, 6) if _given(n, i))]
               if x and x not in shapes]
    shapes.update({k: tuple(v.shape) for k, v in _evaluate(model, unknown, shapes, shape_only=True).items()}
                  if unknown else {})

    lowering = {id(n) for n in todo}
    new_nodes, new_inits, count = [], [], 0
    for k, n in enumerate(g.node):
        if id(n) not in lowering:
            new_nodes.append(n)
            continue
        label = n.name or f"LSTM_{k}"
        W, R = const(n.input[1]), const(n.input[2])
        B = const(n.input[3]) if _given(n, 3) else None
        W = W if W is not None else computed.get(n.input[1])
        R = R if R is not None else computed.get(n.input[2])
        B = B if B is not None or not _given(n, 3) else computed.get(n.input[3])
        if W is None or R is None or (_given(n, 3) and B is None):
            raise ConversionError(f"node {label!r} (LSTM): its weights are computed, not constants; edgekit lowers "
                                  "an LSTM with constant W, R, B only")
        xs = shapes.get(n.input[0])
        if xs is None or len(xs) != 3:
            raise ConversionError(f"node {label!r} (LSTM): its input's shape is not static here, so its steps "
                                  "cannot be unrolled", hint="pass --input-shape for every dynamic input")
        steps, batch, _ = xs
        if steps > MAX_STEPS:
            raise ConversionError(f"node {label!r} (LSTM): {steps} steps; edgekit unrolls at most {MAX_STEPS}")
        H = int(_attrs(n)["hidden_size"]) if "hidden_size" in _attrs(n) else int(R.shape[-1])
        reverse = (_attrs(n).get("direction", b"forward") in (b"reverse", "reverse"))
        p = f"{label}/lowered"
        bias = (B[0][:4 * H] + B[0][4 * H:]) if B is not None else np.zeros(4 * H, W.dtype)

        # this LSTM's helpers, its prefix bound now (they are called in this iteration only)
        def init(name: str, arr: np.ndarray, p: str = p) -> str:
            new_inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), f"{p}/{name}"))
            return f"{p}/{name}"

        def node(op: str, ins: list[str], name: str, p: str = p, **kw: Any) -> str:
            out = f"{p}/{name}"
            new_nodes.append(helper.make_node(op, ins, [out], name=out, **kw))
            return out

        wt, rt, bb = init("Wt", W[0].T.astype(W.dtype)), init("Rt", R[0].T.astype(R.dtype)), init("B", bias)
        bh = init("shape_bh", np.array([batch, H], np.int64))

        def _state_2d(name: str, batch: int, hidden: int, tag: str, bh: str = bh) -> str:
            """The [B, H] state: an Unsqueeze(axis 0) of a [B, H] tensor is skipped (onnx2tf reads the rank-3
            tensor as NCW and slices Silero VAD's state along the wrong axis), else a Reshape."""
            src = unsqueezed(name)
            if src is not None and shapes.get(src) == (batch, hidden):
                return src
            return node("Reshape", [name, bh], tag)

        bi = init("shape_bi", np.array([batch, -1], np.int64))
        one = init("shape_1bh", np.array([1, batch, H], np.int64))
        ax0, ax1 = init("axis0", np.array([0], np.int64)), init("axis1", np.array([1], np.int64))
        gate = [init(f"g{j}", np.array([j * H], np.int64)) for j in range(5)]
        zeros = ""  # read only where a state is not given, and then set here
        if not (_given(n, 5) and _given(n, 6)):
            zeros = init("zeros", np.zeros((batch, H), W.dtype))
        h = _state_2d(n.input[5], batch, H, "h_init") if _given(n, 5) else zeros
        c = _state_2d(n.input[6], batch, H, "c_init") if _given(n, 6) else zeros
        order = range(steps - 1, -1, -1) if reverse else range(steps)
        x_rows = node("Reshape", [n.input[0], init("shape_rows", np.array([steps, -1], np.int64))], "x_rows") \
            if steps > 1 else ""
        ys: dict[int, str] = {}
        for t in order:
            if steps == 1:
                xt = node("Reshape", [n.input[0], bi], f"x{t}")
            else:  # rows of a rank-2 [S, B*I]: onnx2tf moves a rank-3 tensor's axes (NCW -> NWC) under a Slice
                s0, s1 = init(f"t{t}", np.array([t], np.int64)), init(f"t{t}e", np.array([t + 1], np.int64))
                xt = node("Reshape", [node("Slice", [x_rows, s0, s1, ax0], f"x{t}_slice"), bi], f"x{t}")
            # h's product first: onnx-simplifier fuses MatMul + Add into a Gemm at the MatMul's place, which must
            # then come after the Add's other input
            gh = node("MatMul", [h, rt], f"gh{t}")
            gx = node("MatMul", [xt, wt], f"gx{t}")
            gs = node("Add", [node("Add", [gx, gh], f"gxh{t}"), bb], f"gates{t}")
            part = [node("Slice", [gs, gate[j], gate[j + 1], ax1], f"gate{t}_{j}") for j in range(4)]
            i_, o_, f_ = (node("Sigmoid", [part[j]], f"{nm}{t}") for j, nm in ((0, "i"), (1, "o"), (2, "f")))
            cc = node("Tanh", [part[3]], f"cc{t}")
            c = node("Add", [node("Mul", [f_, c], f"fc{t}"), node("Mul", [i_, cc], f"ic{t}")], f"c{t}")
            h = node("Mul", [o_, node("Tanh", [c], f"tc{t}")], f"h{t}")
            ys[t] = h
        outs = list(n.output) + [""] * (3 - len(n.output))
        if outs[0]:  # [S, B*H] rows, then one Reshape: onnx2tf reads a rank-4 Concat's axis as NHWC and moves it
            flat = init("shape_1x", np.array([1, batch * H], np.int64))
            parts = [node("Reshape", [ys[t], flat], f"y{t}") for t in range(steps)]
            rows = node("Concat", parts, "Y_rows", axis=0)
            new_nodes.append(helper.make_node("Reshape", [rows, init("shape_Y", np.array([steps, 1, batch, H],
                                                                                          np.int64))],
                                              [outs[0]], name=f"{p}/Y"))
        if outs[1]:
            new_nodes.append(helper.make_node("Reshape", [h, one], [outs[1]], name=f"{p}/Y_h"))
        if outs[2]:
            new_nodes.append(helper.make_node("Reshape", [c, one], [outs[2]], name=f"{p}/Y_c"))
        count += 1
    if count:
        _replace_nodes(g, new_nodes, new_inits)
    return model, count


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


def drop_noop_slice_axes(model: Any) -> tuple[Any, int]:
    """Slices with constant parameters lose the axes they do not cut (start 0, end "to the end", step 1), and a Slice
    that cuts nothing goes (its readers read its input). onnx2tf
    mistranslates a full-rank Slice of a channels-last rank-3 tensor (Silero VAD's STFT halves: the imaginary
    half came out [1, 0, 258]); the same Slice on its one real axis it takes. Same values by definition."""
    from onnx import helper, numpy_helper

    g = model.graph
    values = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    values.update({n.output[0]: numpy_helper.to_array(_attrs(n)["value"]) for n in g.node
                   if n.op_type == "Constant" and "value" in _attrs(n)})
    new, inits, count = [], [], 0
    alias: dict[str, str] = {}
    outputs = {o.name for o in g.output}
    for n in g.node:
        for k, i in enumerate(n.input):
            if i in alias:
                n.input[k] = alias[i]
        if n.op_type == "Slice" and n.output[0] in outputs:
            new.append(n)
            continue
        if n.op_type != "Slice" or len(n.input) < 4 or not all(i in values for i in n.input[1:4]) \
                or (len(n.input) > 4 and n.input[4] and n.input[4] not in values):
            new.append(n)
            continue
        starts, ends, axes = (np.ravel(values[i]).astype(np.int64) for i in n.input[1:4])
        steps = np.ravel(values[n.input[4]]).astype(np.int64) if len(n.input) > 4 and n.input[4] \
            else np.ones_like(starts)
        cut = [k for k in range(len(axes)) if not (starts[k] == 0 and ends[k] >= 2 ** 31 - 1 and steps[k] == 1)]
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

