"""A PyTorch model's ``forward()`` arguments, and the values edgekit gives those that are not tensors.

Loaded by ``torch_onnx_driver.py`` from its own directory, in the ``torch`` toolchain's Python: the standard
library and torch only (edgekit is not installed there).

edgekit feeds a model tensors. A TorchScript ``forward(x, sr: int)`` takes ``sr`` as a Python int (Silero VAD's
sample rate); fed a tensor, the model's own checks fail deep inside it. Such an argument is given a value with
``--freeze-input sr=16000``: the value is passed to every call of the model (the parity reference) and is baked
into the exported graph (the export traces a module that passes it, so it is a constant there). A
``torch.export`` program already holds its scalar arguments as the constants it was exported with
(``ConstantArgument``): they are passed as they are, and ``--freeze-input`` may only repeat them.

A model that writes its own attributes in ``forward()`` (TorchScript ``prim::SetAttr``; an ExportedProgram's
mutated buffers) keeps state between calls; an exported graph starts every run from the values saved with it,
so such a model is refused, naming the attributes, before anything is exported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

#: Python argument types --freeze-input gives a value, and the dtype the manifest records it as
SCALAR_DTYPES = {"int": "int64", "float": "float64", "bool": "bool"}
_TRUE, _FALSE = ("1", "true"), ("0", "false")


@dataclass
class Binding:
    """How ``forward()``'s arguments are fed: the tensors (in the model's order), the values of the others."""

    tensors: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)  # argument -> the Python value passed on every call
    frozen: list[dict[str, Any]] = field(default_factory=list)  # those set by --freeze-input, as the manifest says
    problems: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)


def signature(model: Any, kind: str) -> list[dict[str, Any]]:
    """``forward()``'s arguments in order: ``name``, ``type`` (``Tensor``, ``int``, ``float``, ``bool``, or
    TorchScript's spelling of another type), ``default`` (a TorchScript default) or ``fixed`` (the constant an
    ExportedProgram was exported with)."""
    if kind == "exported_program":
        from torch.export.graph_signature import ConstantArgument, InputKind, TensorArgument

        args: list[dict[str, Any]] = []
        for spec in model.graph_signature.input_specs:
            if spec.kind != InputKind.USER_INPUT:
                continue
            a = spec.arg
            if isinstance(a, TensorArgument):
                args.append({"name": a.name, "type": "Tensor"})
            elif isinstance(a, ConstantArgument):
                args.append({"name": a.name, "type": type(a.value).__name__, "fixed": a.value})
            else:  # a SymInt/SymFloat/SymBool input: a dynamic scalar
                args.append({"name": a.name, "type": type(a).__name__.removesuffix("Argument").lower()})
        return args
    return [
        {"name": a.name, "type": str(a.type), **({"default": a.default_value} if a.has_default_value() else {})}
        for a in model.forward.schema.arguments[1:]
    ]


def state_written(model: Any, kind: str) -> list[str]:
    """The attributes (buffers) ``forward()`` assigns: state the model keeps between calls."""
    if kind == "exported_program":
        return sorted(set(model.graph_signature.buffers_to_mutate.values()))
    import torch

    graph = model.forward.graph.copy()
    torch._C._jit_pass_inline(graph)  # the submodules' methods too
    return sorted({n.s("name") for n in graph.findAllNodes("prim::SetAttr")})


def _parse(name: str, typ: str, text: str) -> tuple[Any, str | None]:
    """``text`` as a value of ``typ``; (None, the problem) when it is not one."""
    t = text.strip()
    if typ == "bool":
        if t.lower() in _TRUE + _FALSE:
            return t.lower() in _TRUE, None
        return None, f"--freeze-input {name}={text}: {name} is a Python bool: give true, false, 1 or 0"
    try:
        v = float(t)
    except ValueError:
        return None, f"--freeze-input {name}={text}: {name} is a Python {typ}: give one number"
    if not math.isfinite(v):
        return None, f"--freeze-input {name}={text}: the value must be finite"
    if typ == "int":
        if v != int(v):
            return None, f"--freeze-input {name}={text}: {name} is a Python int, not a fraction"
        return int(t) if t.lstrip("+-").isdigit() else int(v), None
    return v, None


def _scalar(arg: dict[str, Any], given: set[str], freeze: dict[str, str], b: Binding) -> None:
    """One argument that is not a tensor: its value from --freeze-input, the export, or its default."""
    name, typ = arg["name"], arg["type"]
    has_value = name in freeze or "fixed" in arg or "default" in arg
    if name in given and has_value:  # --input-shape sr=1 would feed the int a tensor
        b.problems.append(f"--input-shape {name}: forward() argument {name} is a Python {typ}, not a tensor")
    if name in freeze:
        if typ not in SCALAR_DTYPES:
            b.problems.append(
                f"--freeze-input {name}: forward() argument {name} is {typ}; --freeze-input gives int, float and "
                "bool arguments a value"
            )
            return
        value, problem = _parse(name, typ, freeze[name])
        if problem is None and "fixed" in arg and value != arg["fixed"]:
            problem = (
                f"--freeze-input {name}={freeze[name]}: the program was exported with {name}={arg['fixed']} "
                "(torch.export fixes Python scalars); export it again with the value you want"
            )
        if problem is not None:
            b.problems.append(problem)
            return
        b.values[name] = value
        b.frozen.append({"name": name, "dtype": SCALAR_DTYPES[typ], "value": [float(value)]})
    elif "fixed" in arg or "default" in arg:
        b.values[name] = arg.get("fixed", arg.get("default"))
    elif typ in SCALAR_DTYPES:
        b.problems.append(
            f"forward() argument {name} is a Python {typ}, not a tensor: give it a value with "
            f"--freeze-input {name}=VALUE" + (" (not --input-shape)" if name in given else "")
        )
        b.hints.append(f"--freeze-input {name}=VALUE")
    else:
        b.problems.append(
            f"forward() argument {name} is {typ}: edgekit feeds tensors, and gives int, float and bool "
            "arguments a value with --freeze-input"
        )


def bind(args: list[dict[str, Any]], given: list[str], freeze: dict[str, str]) -> Binding:
    """Which arguments are tensors (``given`` names those ``--input-shape`` shaped), and the values of the others.

    Every problem is collected (``problems``, one clause each) rather than the first; the tensor names are not
    compared with ``given`` here (the driver's ``inputs`` error does that)."""
    b = Binding()
    names = [a["name"] for a in args]
    for a in args:
        if a["type"] == "Tensor":
            b.tensors.append(a["name"])
            if a["name"] in freeze:
                b.problems.append(
                    f"--freeze-input {a['name']}: forward() argument {a['name']} is a tensor; --freeze-input gives "
                    "a PyTorch model's int, float and bool arguments a value (a tensor takes --input-shape)"
                )
        else:
            _scalar(a, set(given), freeze, b)
    unknown = [k for k in freeze if k not in names]
    if unknown:
        b.problems.append(
            f"--freeze-input {', '.join(unknown)}: forward() has no such argument (it takes {', '.join(names) or 'none'})"
        )
    return b


def bound(model: Any, order: list[str], values: dict[str, Any]) -> Any:
    """``model`` as a module that takes only its tensor arguments (in ``order`` without ``values``' names) and
    passes ``values`` for the others: traced for the export, those values are constants in the graph."""
    import torch

    class Bound(torch.nn.Module):  # type: ignore[misc]  # torch is not in edgekit's environment
        def __init__(self) -> None:
            super().__init__()
            self.inner = model
            self.training = False  # not .eval(): an ExportedProgram's module refuses train()/eval()

        def forward(self, *tensors: Any) -> Any:
            it = iter(tensors)
            return self.inner(*[values[n] if n in values else next(it) for n in order])

    return Bound()
