"""Reading an ONNX source model: validation, I/O spec, and fixing dynamic dimensions.

Graphs come as exporters leave them: If/Loop/Scan subgraphs, several inputs (scalars, int64,
recurrent state), dynamic dims inside subgraphs, If branches whose outputs differ in rank.
``make_static`` therefore only rewrites the *top-level* input dims and checks the result the way
the runtime will read it: onnxruntime, with its default graph optimisations, must still load it.
Where a static dim breaks the graph (constant folding with a fixed length can make a branch that
is never taken at run time ill-typed: Silero VAD's 8 kHz branch with a 16 kHz window), that dim
stays dynamic in the file; the bundle's I/O spec keeps the static shape the device feeds.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from edge.errors import InputFileError, MissingDependencyError, ModelError
from edge.spec import IOSpec, TensorSpec, image_layout

log = logging.getLogger(__name__)

#: ``TensorSpec.shape`` of an input whose rank the model does not declare
UNKNOWN_RANK: tuple[str, ...] = ("...",)
#: metadata key in a static model: the input dims left dynamic because fixing them breaks the graph
KEPT_DYNAMIC_KEY = "edgekit.dynamic_dims_kept"
_PROTOBUF_LIMIT = 1_900_000_000  # protobuf's 2 GB limit, with room for the envelope


def _onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise MissingDependencyError(
            "the 'onnx' package is needed to read ONNX models", hint="pip install 'edgekit-ml[onnx]'"
        ) from None
    return onnx


def load_onnx(path: str | os.PathLike[str]) -> Any:
    """Load and check an ONNX model, with errors that name the file."""
    onnx = _onnx()
    p = Path(path)
    if not p.exists():
        raise InputFileError(f"model file {p} does not exist")
    if p.is_dir():
        raise InputFileError(f"model path {p} is a directory, expected an .onnx file")
    try:
        model = onnx.load(str(p), load_external_data=True)
    except Exception as e:  # protobuf raises DecodeError, RuntimeWarning, ...
        raise InputFileError(f"{p} is not an ONNX model ({type(e).__name__}: {str(e)[:200]})") from None
    if not model.graph.node and not model.graph.output:
        raise InputFileError(f"{p} is not an ONNX model (no graph found)")
    try:
        onnx.checker.check_model(model)
    except Exception as e:
        raise ModelError(f"{p} fails the ONNX checker: {str(e).splitlines()[0][:300]}") from None
    return model


def opset_of(model: Any) -> int:
    """The model's default-domain opset."""
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


# -- walking the graph, subgraphs included -------------------------------------------------------


def subgraphs(node: Any) -> list[tuple[str, Any]]:
    """``(attribute name, GraphProto)`` for each graph a node holds (If branches, Loop/Scan bodies)."""
    from onnx import AttributeProto

    out = []
    for a in node.attribute:
        if a.type == AttributeProto.GRAPH:
            out.append((a.name, a.g))
        elif a.type == AttributeProto.GRAPHS:
            out.extend((f"{a.name}[{i}]", g) for i, g in enumerate(a.graphs))
    return out


def node_label(node: Any, index: int) -> str:
    """A node's name, or ``#index`` for an unnamed one (exporters leave many unnamed)."""
    return node.name or f"#{index}"


def walk_nodes(graph: Any, where: tuple[str, ...] = ()) -> Iterator[tuple[Any, str, tuple[str, ...]]]:
    """Every node with its label and the chain of enclosing ``node/attribute`` it sits in, depth first."""
    for i, n in enumerate(graph.node):
        label = node_label(n, i)
        yield n, label, where
        for attr, g in subgraphs(n):
            yield from walk_nodes(g, (*where, f"{label}/{attr}"))


# -- I/O -----------------------------------------------------------------------------------------


def _dims(value_info: Any) -> tuple[int | str, ...]:
    t = value_info.type.tensor_type
    if not t.HasField("shape"):
        return UNKNOWN_RANK
    dims: list[int | str] = []
    for d in t.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param or "?")
    return tuple(dims)


def _np_dtype(elem_type: int) -> str:
    from onnx.helper import tensor_dtype_to_np_dtype

    return str(tensor_dtype_to_np_dtype(elem_type))


def _tensor_problem(vi: Any, kind: str) -> str | None:
    """Why an input/output cannot be a plain numeric tensor edgekit feeds or compares, or None."""
    from onnx import TensorProto

    which = vi.type.WhichOneof("value")
    if which != "tensor_type":
        what = {
            "sequence_type": "a sequence",
            "map_type": "a map",
            "optional_type": "an optional",
            "sparse_tensor_type": "a sparse tensor",
        }.get(which or "", f"a {which or 'typeless'} value")
        return f"{kind} {vi.name!r} is {what}, not a tensor"
    et = vi.type.tensor_type.elem_type
    if et in (TensorProto.UNDEFINED, TensorProto.STRING):
        return f"{kind} {vi.name!r} holds {'strings' if et == TensorProto.STRING else 'no element type'}"
    try:
        _np_dtype(et)
    except (KeyError, ValueError, TypeError):
        known = et in TensorProto.DataType.values()  # a corrupt file may hold any number here
        name = TensorProto.DataType.Name(et) if known else f"{et} (not an ONNX element type)"
        return f"{kind} {vi.name!r} has element type {name}, which numpy cannot hold"
    return None


def io_spec(model: Any, source: str | os.PathLike[str] | None = None) -> IOSpec:
    """The model's graph inputs (initializers aside) and outputs; every non-tensor I/O reported at once."""
    initializers = {i.name for i in model.graph.initializer}
    ins = [vi for vi in model.graph.input if vi.name not in initializers]
    problems = [p for vi in ins if (p := _tensor_problem(vi, "input"))]
    problems += [p for vi in model.graph.output if (p := _tensor_problem(vi, "output"))]
    if problems:
        where = f"{Path(source).name}: " if source else ""
        raise ModelError(
            where + "; ".join(problems),
            hint="edgekit converts models whose inputs and outputs are numeric tensors: export the "
            "model without the sequence/map/string ends (e.g. skl2onnx zipmap=False), or cut them "
            "off with onnx.utils.extract_model",
        )
    inputs = []
    for vi in ins:
        shape = _dims(vi)
        inputs.append(
            TensorSpec(
                vi.name,
                shape,
                _np_dtype(vi.type.tensor_type.elem_type),
                None if shape == UNKNOWN_RANK else image_layout(shape),
            )
        )
    outputs = tuple(
        TensorSpec(vi.name, _dims(vi), _np_dtype(vi.type.tensor_type.elem_type)) for vi in model.graph.output
    )
    return IOSpec(tuple(inputs), outputs)


def parse_input_shapes(items: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``["images=1,3,320,320", ...]`` -> ``{"images": (1, 3, 320, 320)}``."""
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            shape = tuple(int(x) for x in dims.replace("x", ",").split(","))
            if any(d <= 0 for d in shape):
                raise ValueError
        except ValueError:
            raise ModelError(f"bad --input-shape {item!r}", hint="use NAME=1,3,320,320 (positive integers)") from None
        shapes[name] = shape
    return shapes


def _suggest(t: TensorSpec, known: Mapping[str, int]) -> tuple[str, bool]:
    """The ``--input-shape`` value to propose for ``t`` and whether every dim in it is certain.

    The first dynamic dim of an input is its batch (1); a named dim another input already fixes takes
    that value; any other dynamic dim (a length, a size) is the user's to choose: ``N``."""
    if t.shape == UNKNOWN_RANK:
        return "N,...", False
    parts, exact, first = [], True, True
    for d in t.shape:
        if isinstance(d, int) and d > 0:
            parts.append(str(d))
            continue
        if isinstance(d, str) and d in known:
            parts.append(str(known[d]))
        elif first:
            parts.append("1")
        else:
            parts.append("N")
            exact = False
        first = False
    return ",".join(parts), exact


def resolve_static_inputs(io: IOSpec, shapes: Mapping[str, tuple[int, ...]], model_path: Path) -> IOSpec:
    """Apply user shapes; every input left dynamic (or any mismatch) is reported in one error.

    Scalars (shape ``[]``) and inputs whose dims are all fixed (int64 sample rates, state tensors
    with a fixed size) need no ``--input-shape``."""
    names = [t.name for t in io.inputs]
    problems = [
        f"--input-shape names {n!r}, which is not an input (inputs: {', '.join(names)})"
        for n in shapes
        if n not in names
    ]
    # values of named dims the user fixed on one input, for the same name on another (batch, seq_len, ...)
    known: dict[str, int] = {}
    for t in io.inputs:
        if t.name in shapes and t.shape != UNKNOWN_RANK and len(shapes[t.name]) == len(t.shape):
            known.update({d: v for d, v in zip(t.shape, shapes[t.name]) if isinstance(d, str) and d != "?"})
    fixed, missing = [], []
    for t in io.inputs:
        if t.name in shapes:
            s = tuple(int(v) for v in shapes[t.name])
            if t.shape != UNKNOWN_RANK:
                if len(s) != len(t.shape):
                    problems.append(
                        f"input {t.name!r} has rank {len(t.shape)} {list(t.shape)}, --input-shape gives {list(s)}"
                    )
                    continue
                clash = [i for i, d in enumerate(t.shape) if isinstance(d, int) and d > 0 and d != s[i]]
                if clash:
                    problems.append(f"input {t.name!r} has fixed dims {list(t.shape)}, --input-shape gives {list(s)}")
                    continue
            fixed.append(TensorSpec(t.name, s, t.dtype, image_layout(s)))
        elif not t.is_static:
            missing.append(t)
        else:
            fixed.append(t)
    if missing:
        suggestions = [(t, *_suggest(t, known)) for t in missing]
        listed = ", ".join(
            f"input {t.name!r} has "
            + (f"dynamic dims {list(t.shape)}" if t.shape != UNKNOWN_RANK else "no declared rank")
            + f" ({t.dtype})"
            for t in missing
        )
        command = " ".join(f"--input-shape {t.name}={s}" for t, s, _ in suggestions)
        guess = (
            ""
            if all(ok for _, _, ok in suggestions)
            else " (N: the size the device will feed, which the graph does not say; a first dynamic dim is the batch)"
        )
        problems.append(f"{listed}: pass {command}{guess}")
    if problems:
        raise ModelError(f"{model_path}: " + "; ".join(problems))
    return IOSpec(tuple(fixed), io.outputs)


# -- static shapes -------------------------------------------------------------------------------


def copy_model(model: Any) -> Any:
    m = type(model)()
    m.CopyFrom(model)
    return m


def set_input_dims(model: Any, dims: Mapping[str, Mapping[int, int] | tuple[int, ...]]) -> Any:
    """Copy of ``model`` with top-level input dims set: a full shape (rank included) or ``{index: value}``.
    Nothing inside the graph is touched: subgraphs keep their own (often dynamic) annotations."""
    m = copy_model(model)
    for vi in m.graph.input:
        want = dims.get(vi.name)
        if want is None:
            continue
        shape = vi.type.tensor_type.shape
        if isinstance(want, tuple):
            del shape.dim[:]
            for v in want:
                shape.dim.add().dim_value = int(v)
            continue
        for i, v in want.items():
            d = shape.dim[i]
            d.Clear()
            d.dim_value = int(v)
    return m


_ORT_NODE = re.compile(r"Node \(([^)]*)\) Op \(([^)]*)\)")


def describe_ort_error(message: str) -> str:
    """onnxruntime's load error as one line: the innermost node and op it names, and the reason."""
    text = " ".join(str(message).split())
    nodes = _ORT_NODE.findall(text)
    reason = text.rsplit("]", 1)[-1].strip() if "]" in text else text
    reason = reason.split("Graph attribute inferencing failed:")[-1].strip()
    reason = _ORT_NODE.sub("", reason).strip(" :") or text[:200]
    if not nodes:
        return reason[:300]
    (name, op), outer = nodes[-1], nodes[:-1]
    inside = "".join(f" inside node {n!r} ({o})" for n, o in reversed(outer))
    return f"node {name!r} ({op}){inside}: {reason[:240]}"


class _OrtLoader:
    """Loads a model in onnxruntime the way a runner does (default graph optimisations) and says why it fails."""

    def __init__(self) -> None:
        import onnxruntime as ort

        self.ort = ort
        self.options = ort.SessionOptions()
        self.options.log_severity_level = 3
        self.options.intra_op_num_threads = 1
        self.options.inter_op_num_threads = 1

    def problem(self, model: Any) -> str | None:
        try:
            self.ort.InferenceSession(model.SerializeToString(), self.options, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - onnxruntime's Fail/InvalidGraph/...: the reason is the answer
            return describe_ort_error(str(e))
        return None


def _loader(model: Any) -> _OrtLoader | None:
    if model.ByteSize() > _PROTOBUF_LIMIT:
        log.info("model over 2 GB: the static graph is not re-checked in onnxruntime")
        return None
    try:
        return _OrtLoader()
    except ImportError:
        return None


def infer_shapes(model: Any) -> Any:
    """ONNX shape inference, best effort: it never fails the conversion (runtimes infer again)."""
    onnx = _onnx()
    m = copy_model(model)
    del m.graph.value_info[:]  # stale intermediate shapes of the dynamic graph
    try:
        return onnx.shape_inference.infer_shapes(m, strict_mode=False)
    except Exception:  # noqa: BLE001 - e.g. an inference bug inside a subgraph: the runtime does its own
        return m


def make_static(model: Any, io: IOSpec, *, source: str | os.PathLike[str] | None = None) -> Any:
    """Copy of ``model`` whose graph inputs carry ``io``'s static shapes, still loadable by onnxruntime.

    1. every input dim fixed, shapes re-inferred by ONNX (best effort); else
    2. every input dim fixed, no inferred annotations (ONNX's inference can disagree with onnxruntime's
       in If branches); else
    3. dims fixed one by one, each kept only if onnxruntime still loads the graph; the dims left
       dynamic are recorded in the model's metadata (``KEPT_DYNAMIC_KEY``, see :func:`kept_dynamic`).

    A model onnxruntime cannot load even as it came is a :class:`ModelError` naming the node and op."""
    name = Path(source).name if source else "the model"
    spec = {t.name: t for t in io.inputs}
    declared = {t.name: t.shape for t in io_spec(model, source).inputs}
    full = {n: tuple(int(d) for d in t.shape) for n, t in spec.items() if n in declared}
    fixed = set_input_dims(model, full)
    inferred = infer_shapes(fixed)
    loader = _loader(model)
    if loader is None or loader.problem(inferred) is None:
        return inferred
    if loader.problem(fixed) is None:
        log.info("%s: ONNX's shape annotations break onnxruntime's inference: the static graph keeps none", name)
        return fixed
    own = loader.problem(model)
    if own is not None:
        raise ModelError(
            f"{name}: onnxruntime cannot load the model as it is: {own}",
            hint="check the file with onnxruntime; re-export it with a newer exporter or opset",
        )
    current = model
    kept: dict[str, list[int]] = {}
    # rank-unknown inputs get their whole shape at once; the others one dim at a time
    for n, shape in full.items():
        d0 = declared[n]
        steps: list[Mapping[int, int] | tuple[int, ...]] = (
            [shape]
            if d0 == UNKNOWN_RANK
            else [{i: v} for i, v in enumerate(shape) if not (isinstance(di := d0[i], int) and di > 0)]
        )
        for step in steps:
            trial = set_input_dims(current, {n: step})
            if loader.problem(trial) is None:
                current = trial
            else:
                kept.setdefault(n, []).extend(range(len(shape)) if isinstance(step, tuple) else step.keys())
    if kept:
        entry = current.metadata_props.add()
        entry.key, entry.value = KEPT_DYNAMIC_KEY, json.dumps({k: sorted(v) for k, v in kept.items()})
        log.info(
            "%s: input dims %s stay dynamic in the graph (fixing them breaks onnxruntime's inference); the device feeds %s",
            name,
            kept,
            {n: list(full[n]) for n in kept},
        )
    return current


def kept_dynamic(model: Any) -> dict[str, list[int]]:
    """Input dims :func:`make_static` left dynamic in the graph (input name -> dim indices); {} when none."""
    for p in model.metadata_props:
        if p.key == KEPT_DYNAMIC_KEY:
            return {k: list(v) for k, v in json.loads(p.value).items()}
    return {}


def save_onnx(model: Any, path: Path) -> Path:
    onnx = _onnx()
    path.parent.mkdir(parents=True, exist_ok=True)
    if model.ByteSize() > _PROTOBUF_LIMIT:
        onnx.save_model(model, str(path), save_as_external_data=True, location=path.name + ".data")
    else:
        onnx.save_model(model, str(path))
    return path
