"""Reading an ONNX source model: validation, I/O spec, and fixing dynamic dimensions."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from edge.errors import InputFileError, MissingDependencyError, ModelError
from edge.spec import IOSpec, TensorSpec, image_layout


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise MissingDependencyError("the 'onnx' package is needed to read ONNX models",
                                     hint="pip install 'edgekit-ml[onnx]'") from None
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


def _dims(value_info: Any) -> tuple[int | str, ...]:
    dims: list[int | str] = []
    for d in value_info.type.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param or "?")
    return tuple(dims)


def _np_dtype(elem_type: int) -> str:
    from onnx.helper import tensor_dtype_to_np_dtype

    return str(tensor_dtype_to_np_dtype(elem_type))


def io_spec(model: Any) -> IOSpec:
    initializers = {i.name for i in model.graph.initializer}
    inputs = []
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        shape = _dims(vi)
        inputs.append(TensorSpec(vi.name, shape, _np_dtype(vi.type.tensor_type.elem_type), image_layout(shape)))
    outputs = tuple(TensorSpec(vi.name, _dims(vi), _np_dtype(vi.type.tensor_type.elem_type)) for vi in model.graph.output)
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


def resolve_static_inputs(io: IOSpec, shapes: Mapping[str, tuple[int, ...]], model_path: Path) -> IOSpec:
    """Apply user shapes; every input left dynamic (or any mismatch) is reported in one error."""
    names = [t.name for t in io.inputs]
    problems = [f"--input-shape names {n!r}, which is not an input (inputs: {', '.join(names)})"
                for n in shapes if n not in names]
    fixed = []
    for t in io.inputs:
        if t.name in shapes:
            s = shapes[t.name]
            if len(s) != len(t.shape):
                problems.append(f"input {t.name!r} has rank {len(t.shape)} {list(t.shape)}, --input-shape gives {list(s)}")
                continue
            clash = [i for i, d in enumerate(t.shape) if isinstance(d, int) and d > 0 and d != s[i]]
            if clash:
                problems.append(f"input {t.name!r} has fixed dims {list(t.shape)}, --input-shape gives {list(s)}")
                continue
            fixed.append(TensorSpec(t.name, s, t.dtype, image_layout(s)))
        elif not t.is_static:
            example = ",".join(str(d) if isinstance(d, int) and d > 0 else ("1" if i == 0 else "N") for i, d in enumerate(t.shape))
            problems.append(f"input {t.name!r} has dynamic dims {list(t.shape)}: pass --input-shape {t.name}={example}")
        else:
            fixed.append(t)
    if problems:
        raise ModelError(f"{model_path}: " + "; ".join(problems))
    return IOSpec(tuple(fixed), io.outputs)


def make_static(model: Any, io: IOSpec) -> Any:
    """Copy of ``model`` whose graph inputs carry ``io``'s static shapes (outputs re-inferred)."""
    onnx = _onnx()
    m = onnx.ModelProto()
    m.CopyFrom(model)
    by_name = {t.name: t for t in io.inputs}
    for vi in m.graph.input:
        t = by_name.get(vi.name)
        if t is None:
            continue
        dims = vi.type.tensor_type.shape.dim
        for d, v in zip(dims, t.shape):
            d.Clear()
            d.dim_value = int(v)
    # Drop stale intermediate shapes and let shape inference redo them for the static input.
    del m.graph.value_info[:]
    try:
        m = onnx.shape_inference.infer_shapes(m, strict_mode=False)
    except Exception:  # shape inference is best-effort: runtimes infer again
        pass
    return m


def save_onnx(model: Any, path: Path) -> Path:
    onnx = _onnx()
    path.parent.mkdir(parents=True, exist_ok=True)
    if model.ByteSize() > 1_900_000_000:  # protobuf's 2 GB limit
        onnx.save_model(model, str(path), save_as_external_data=True, location=path.name + ".data")
    else:
        onnx.save_model(model, str(path))
    return path
