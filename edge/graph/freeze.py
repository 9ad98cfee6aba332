"""Freeze ONNX inputs to values and inline the ``If`` nodes that then decide nothing at run time.

    edgekit convert silero_vad.onnx --target intel-igpu --freeze-input sr=16000 \
        --input-shape input=1,512 --input-shape state=2,1,128

Models exported from TorchScript often carry control flow that depends only on an input that is a
setting (a sample rate, a mode flag) and on tensor shapes: Silero VAD has 16 nested ``If`` nodes chosen
by ``sr`` and by the ranks of its inputs. Runtimes that need static ranks (OpenVINO's ONNX frontend)
or have no control flow at all (TFLite via onnx2tf) cannot take such a graph; with the setting fixed
and the shapes static, every one of those conditions is a constant. This is what OpenVINO's
``convert_model(input=...)`` value freezing and Silero's own OpenVINO export do.

What :func:`freeze_inputs` does, and what it guarantees:

1. each named input becomes an initializer holding the value (dtype and shape from the graph's
   declaration: a scalar input takes one number, a 1-D input a comma list; anything else is refused);
2. with every other input at its static shape, repeatedly: ONNX shape inference, then each ``If`` whose
   condition is computable from constants, frozen values and the shapes/sizes of tensors whose shape
   inference gives fully static shapes (never from input *data*) is evaluated (onnxruntime, on the
   condition alone) and replaced by the nodes of the branch taken; until no such ``If`` is left;
3. the result is checked against the original model on onnxruntime (the original fed the frozen values,
   the frozen one not), on inputs drawn from a standard normal: outputs must agree to rounding
   (:data:`CHECK_RTOL` of each output's range), or it is refused naming the output.

An ``If`` whose condition reads input data stays as it is (said in the record); a target that cannot
express it then refuses, naming it, as before.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from edge.errors import InputFileError, ModelError
from edge.spec import IOSpec

#: rounds of inlining (each round takes every If decidable then: nested Ifs surface one level per round)
MAX_ROUNDS = 64
#: outputs of the frozen and the original model may differ by this fraction of the original output's range
#: (inlining changes no arithmetic; onnxruntime's graph fusions may order a reduction differently)
CHECK_RTOL = 1e-4
CHECK_SAMPLES = 4
#: ops whose output depends on their input's shape only
_SHAPE_ONLY = {"Shape", "Size"}
#: ops whose output is not a function of their inputs
_NONDETERMINISTIC = {
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
    "Dropout",
}


@dataclass
class FreezeRecord:
    """What was frozen and what it changed, for the manifest (``source.frozen``)."""

    inputs: dict[str, dict[str, Any]]
    inlined_if: int = 0
    kept_if: list[str] = field(default_factory=list)  # If nodes whose condition reads input data
    check: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """As the manifest's ``source.frozen`` (``edge.bundle.schema.Frozen``)."""
        inputs = [
            {"name": n, "dtype": v["dtype"], "shape": v["shape"], "value": [float(x) for x in np.ravel(v["value"])]}
            for n, v in self.inputs.items()
        ]
        out: dict[str, Any] = {"inputs": inputs, "inlined_if": self.inlined_if, "check": self.check or None}
        if self.kept_if:
            out["kept_if"] = self.kept_if[:32]
        return out


def parse_freeze(items: Sequence[str]) -> dict[str, str]:
    """``["sr=16000", "mode=1,0"]`` -> ``{"sr": "16000", "mode": "1,0"}``; malformed items are one error."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise InputFileError(
                f"--freeze-input {item!r}: expected NAME=VALUE (e.g. sr=16000, or a comma list for a 1-D input)"
            )
        if name in out:
            raise InputFileError(f"--freeze-input names {name!r} twice")
        out[name] = value
    return out


def _value(name: str, text: str, vi: Any, where: str) -> np.ndarray:
    from onnx.helper import tensor_dtype_to_np_dtype

    t = vi.type.tensor_type
    dtype = np.dtype(tensor_dtype_to_np_dtype(t.elem_type))
    if dtype.kind not in "biuf":
        raise ModelError(f"{where}: --freeze-input {name}: the input holds {dtype}; only numbers can be frozen")
    rank = len(t.shape.dim) if t.HasField("shape") else None
    parts = [p.strip() for p in text.split(",")]
    try:
        nums = [float(p) for p in parts]
    except ValueError:
        raise InputFileError(
            f"--freeze-input {name}={text}: {text!r} is not a number or a comma list of numbers"
        ) from None
    if not all(np.isfinite(nums)):
        raise InputFileError(f"--freeze-input {name}={text}: the value must be finite")
    if dtype.kind in "iub" and any(v != int(v) for v in nums):
        raise InputFileError(f"--freeze-input {name}={text}: input {name!r} holds {dtype}, not fractions")
    if rank == 0 or (rank is None and len(nums) == 1):
        if len(nums) != 1:
            raise InputFileError(f"--freeze-input {name}={text}: input {name!r} is a scalar: give one number")
        arr = np.array(nums[0]).astype(dtype)
    elif rank == 1:
        d = t.shape.dim[0]
        if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != len(nums):
            raise InputFileError(
                f"--freeze-input {name}={text}: input {name!r} holds {d.dim_value} values, {len(nums)} given"
            )
        arr = np.array(nums).astype(dtype)
    else:
        raise InputFileError(
            f"--freeze-input {name}: input {name!r} has rank {rank}; only scalars and 1-D inputs can be frozen from the command line"
        )
    if dtype.kind in "iu" and not np.array_equal(arr.astype(np.float64), np.array(nums).reshape(arr.shape)):
        raise InputFileError(f"--freeze-input {name}={text}: out of range for {dtype}")
    return arr


#: ops whose output shape is a function of their input shapes (and attributes) only
_SHAPE_FROM_SHAPES = frozenset(
    """
    Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh AveragePool BatchNormalization BitShift Cast
    CastLike Ceil Celu Clip Concat Conv ConvInteger ConvTranspose Cos Cosh CumSum DepthToSpace DequantizeLinear
    Div DynamicQuantizeLinear Einsum Elu Equal Erf Exp Flatten Floor GRU Gather GatherElements GatherND Gelu Gemm
    GlobalAveragePool GlobalLpPool GlobalMaxPool Greater GreaterOrEqual GroupNormalization HardSigmoid HardSwish
    Hardmax Identity InstanceNormalization IsInf IsNaN LRN LSTM LayerNormalization LeakyRelu Less LessOrEqual Log
    LogSoftmax LpNormalization MatMul MatMulInteger Max MaxPool Mean Min Mish Mod Mul Neg Not Or PRelu Pow
    QLinearConv QLinearMatMul QuantizeLinear RNN Reciprocal Relu Round ScatterElements ScatterND Selu Shrink
    Sigmoid Sign Sin Sinh Softmax Softplus Softsign SpaceToDepth Sqrt Sub Sum Tan Tanh ThresholdedRelu Transpose
    Trilu Where Xor ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd
    ReduceSum ReduceSumSquare
""".split()
)
#: ops whose output shape also depends on the *values* of these inputs (by index)
_SHAPE_FROM_VALUES: dict[str, tuple[int, ...]] = {
    "Reshape": (1,),
    "Pad": (1, 3),
    "Slice": (1, 2, 3, 4),
    "Expand": (1,),
    "ConstantOfShape": (0,),
    "Tile": (1,),
    "Range": (0, 1, 2),
    "Resize": (1, 2, 3),
    "Upsample": (1,),
    "TopK": (1,),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "Split": (1,),
    "OneHot": (1,),
    "CenterCropPad": (1,),
    "ReduceL1": (1,),
    "ReduceL2": (1,),
    "ReduceLogSum": (1,),
    "ReduceLogSumExp": (1,),
    "ReduceMax": (1,),
    "ReduceMean": (1,),
    "ReduceMin": (1,),
    "ReduceProd": (1,),
    "ReduceSum": (1,),
    "ReduceSumSquare": (1,),
}


def static_analysis(graph: Any) -> tuple[dict[str, bool], dict[str, bool]]:
    """(value known, shape known) per tensor of ``graph`` with every input at a static shape, in one pass over
    the (topologically ordered) nodes. A value is known when it is computed from constants, frozen values and
    known shapes only, never from input data; a shape is known when it follows from known shapes and known
    values (an op outside the tables above: only when all its inputs are known values)."""
    consts = {i.name for i in graph.initializer}
    value = {n: True for n in consts}
    shape = {n: True for n in consts}
    for vi in graph.input:
        if vi.name not in consts:
            value[vi.name], shape[vi.name] = False, True
    for n in graph.node:
        ins = [i for i in n.input if i]

        def vs(i: str) -> bool:
            return value.get(i, False)

        def ss(i: str) -> bool:
            return shape.get(i, False)

        control = any(a.type in (5, 10) for a in n.attribute)  # GRAPH / GRAPHS: If, Loop, Scan
        if control or n.op_type in _NONDETERMINISTIC:
            v = s = False
        elif n.op_type in _SHAPE_ONLY:
            v = s = ss(n.input[0])
        else:
            v = all(vs(i) for i in ins)
            pos = list(n.input)
            if v:
                s = True
            elif not all(ss(i) for i in ins):
                s = False
            elif n.op_type in _SHAPE_FROM_VALUES:
                s = all(vs(pos[k]) for k in _SHAPE_FROM_VALUES[n.op_type] if k < len(pos) and pos[k])
            else:
                s = n.op_type in _SHAPE_FROM_SHAPES
        for o in n.output:
            if o:
                value[o], shape[o] = v, s
    return value, shape


def probe(model: Any, names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The values of the tensors ``names`` of ``model`` on ``feeds``, by onnxruntime (``_RunError`` when it
    cannot run them: the message is onnxruntime's, one line). Also ``edge.graph.lower``'s evaluator."""
    import onnx
    import onnxruntime as ort

    from edge.graph.model import copy_model, describe_ort_error

    m = copy_model(model)
    del m.graph.output[:]
    m.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)  # no type: onnxruntime takes the node's
    so = ort.SessionOptions()
    so.log_severity_level = 3
    # no graph optimisation: onnxruntime 1.23 itself inlines constant-condition Ifs and fails on nested ones
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    try:
        out: list[np.ndarray] = sess.run(list(names), dict(feeds))
        return out
    except Exception as e:  # noqa: BLE001 - onnxruntime ran more of the graph than asked, and it failed
        raise _RunError(describe_ort_error(str(e))) from None


def _conditions(model: Any, names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[bool]:
    return [bool(np.asarray(v).reshape(-1)[0]) for v in probe(model, names, feeds)]


class _RunError(Exception):
    """The graph does not run with the frozen values at these shapes (the message: onnxruntime's, one line)."""


def _zeros(io: IOSpec) -> dict[str, np.ndarray]:
    return {t.name: np.zeros(tuple(int(d) for d in t.shape), dtype=t.dtype) for t in io.inputs}


def _normal(io: IOSpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for t in io.inputs:
        shape = tuple(int(d) for d in t.shape)
        if np.dtype(t.dtype).kind == "f":
            out[t.name] = rng.standard_normal(shape).astype(t.dtype)
        elif np.dtype(t.dtype).kind == "b":
            out[t.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            out[t.name] = rng.integers(0, 2, shape).astype(t.dtype)
    return out


def _inline_round(model: Any, feeds: Mapping[str, np.ndarray]) -> tuple[int, list[str]]:
    """Inline every If of the top graph decidable now; returns (how many, labels of the undecidable)."""
    import onnx

    g = model.graph
    ifs = [n for n in g.node if n.op_type == "If"]
    if not ifs:
        return 0, []
    known, _shapes = static_analysis(g)
    ready = [n for n in ifs if known.get(n.input[0], False)]
    kept = [n.name or n.output[0] for n in ifs if n not in ready]
    if not ready:
        return 0, kept
    taken = dict(zip((id(n) for n in ready), _conditions(model, [n.input[0] for n in ready], feeds)))
    used = {n.name for n in g.node if n.name}
    new = []

    def unique(name: str) -> str:
        base, k = name, 1
        while name in used:
            k += 1
            name = f"{base}_{k}"
        used.add(name)
        return name

    for n in g.node:
        if id(n) not in taken:
            new.append(n)
            continue
        side = "then" if taken[id(n)] else "else"
        label = n.name or n.output[0]
        branch = next(a.g for a in n.attribute if a.name == f"{side}_branch")
        g.initializer.extend(branch.initializer)
        for b in branch.node:
            if b.name:  # node names are unique in a graph (onnxruntime checks): a branch's may repeat outside it
                b.name = unique(b.name if b.name not in used else f"{label}/{b.name}")
            new.append(b)
        for o_branch, o_if in zip(branch.output, n.output):
            if o_if:
                new.append(
                    onnx.helper.make_node("Identity", [o_branch.name], [o_if], name=unique(f"{label}/{side}:{o_if}"))
                )
    del g.node[:]
    g.node.extend(new)
    return len(ready), kept


def freeze_inputs(
    model: Any, values: Mapping[str, str], io: IOSpec, *, source: str | os.PathLike[str] | None = None
) -> tuple[Any, IOSpec, FreezeRecord]:
    """``model`` with ``values`` frozen and the Ifs they (with ``io``'s static shapes) decide inlined; the
    I/O without the frozen inputs; what was done. ``io``: the model's inputs at static shapes (frozen ones
    included or not). Checked against ``model`` on onnxruntime (see the module docstring)."""
    from edge.graph.model import copy_model, infer_shapes, set_input_dims

    where = Path(source).name if source else "the model"
    g = model.graph
    initializers = {i.name for i in g.initializer}
    declared = {vi.name: vi for vi in g.input if vi.name not in initializers}
    unknown = [n for n in values if n not in declared]
    if unknown:
        raise InputFileError(
            f"--freeze-input {', '.join(unknown)}: {where} has no such input",
            hint=f"its inputs: {', '.join(declared) or '-'}",
        )
    arrays = {n: _value(n, v, declared[n], where) for n, v in values.items()}
    rest = IOSpec(tuple(t for t in io.inputs if t.name not in arrays), io.outputs)
    if not rest.inputs:
        raise InputFileError(f"--freeze-input: that freezes every input of {where}; the model would compute a constant")
    not_static = [t.name for t in rest.inputs if not t.is_static]
    if not_static:
        raise InputFileError(
            f"--freeze-input needs every other input of {where} at a static shape; {', '.join(not_static)} is not",
            hint="add --input-shape NAME=D0,D1,...",
        )

    from onnx import numpy_helper

    frozen = copy_model(model)
    kept_inputs = [vi for vi in frozen.graph.input if vi.name not in arrays]
    del frozen.graph.input[:]
    frozen.graph.input.extend(kept_inputs)
    for n, arr in arrays.items():
        frozen.graph.initializer.append(numpy_helper.from_array(arr, n))
    # the conditions are evaluated on the graph as declared, fed inputs of the static shapes: fixing the dims first
    # can make a branch that is not taken invalid for onnxruntime's load-time inference (a Squeeze of a dim that is
    # then 2), and ONNX's inferred annotations crashed onnxruntime 1.23 (SIGSEGV) on Silero's Ifs
    feeds = _zeros(rest)
    inlined = 0
    kept: list[str] = []
    for _ in range(MAX_ROUNDS):
        try:
            k, kept = _inline_round(frozen, feeds)
        except _RunError as e:
            raise _does_not_run(where, arrays, str(e)) from None
        inlined += k
        if k == 0:
            break
    frozen = infer_shapes(set_input_dims(frozen, {t.name: tuple(int(d) for d in t.shape) for t in rest.inputs}))
    record = FreezeRecord(
        inputs={n: {"value": a.tolist(), "dtype": str(a.dtype), "shape": list(a.shape)} for n, a in arrays.items()},
        inlined_if=inlined,
        kept_if=kept,
    )
    record.check = _check(model, frozen, io, rest, arrays, where)
    return frozen, rest, record


def _does_not_run(where: str, arrays: Mapping[str, np.ndarray], why: str) -> ModelError:
    shown = ", ".join(f"{k}={v.tolist()}" for k, v in arrays.items())
    return ModelError(
        f"{where} does not run with {shown} at these input shapes: {why}",
        hint="check the value and the --input-shape the model expects with it",
    )


def _check(
    original: Any, frozen: Any, io: IOSpec, rest: IOSpec, arrays: Mapping[str, np.ndarray], where: str
) -> dict[str, Any]:
    import onnxruntime as ort

    from edge.graph.model import describe_ort_error, make_static

    so = ort.SessionOptions()
    so.log_severity_level = 3
    full = IOSpec(
        tuple(t for t in io.inputs if t.name not in arrays)
        + tuple(type(rest.inputs[0])(n, tuple(a.shape), str(a.dtype)) for n, a in arrays.items()),
        io.outputs,
    )
    try:
        ref = ort.InferenceSession(
            make_static(original, full).SerializeToString(), so, providers=["CPUExecutionProvider"]
        )
        got = ort.InferenceSession(frozen.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime's load error is the message
        raise ModelError(
            f"{where}: the model with its inputs frozen does not load in onnxruntime: {describe_ort_error(str(e))}"
        ) from None
    names = [o.name for o in ref.get_outputs()]
    rng = np.random.default_rng(0)
    worst: dict[str, float] = {}
    for _ in range(CHECK_SAMPLES):
        x = _normal(rest, rng)
        try:
            a = ref.run(names, {**x, **arrays})
        except Exception as e:  # noqa: BLE001 - onnxruntime's run error is the message
            raise _does_not_run(where, arrays, describe_ort_error(str(e))) from None
        b = got.run(names, x)
        for name, u, v in zip(names, a, b):
            u, v = np.asarray(u, np.float64), np.asarray(v, np.float64)
            if u.shape != v.shape:
                raise ModelError(
                    f"{where}: freezing changed output {name!r}'s shape {list(u.shape)} -> {list(v.shape)}"
                )
            span = float(np.ptp(u)) if u.size else 0.0
            err = float(np.max(np.abs(u - v))) if u.size else 0.0
            rel = err / span if span > 0 else (0.0 if err == 0 else np.inf)
            worst[name] = max(worst.get(name, 0.0), rel)
    bad = {n: r for n, r in worst.items() if not r <= CHECK_RTOL}
    if bad:
        raise ModelError(
            f"{where}: with its inputs frozen the model computes something else: "
            + ", ".join(f"output {n!r} differs by {r:.3g} of its range" for n, r in bad.items()),
            hint="report it: inlining an If changes no arithmetic",
        )
    return {"samples": CHECK_SAMPLES, "inputs": "standard normal", "max_error_over_range": max(worst.values())}
