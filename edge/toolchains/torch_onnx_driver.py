"""PyTorch (TorchScript or torch.export ExportedProgram) -> ONNX inside the ``torch`` toolchain environment.

Run by :class:`edge.backends.onnxruntime.from_torch.TorchToOnnx` as ``<toolchain>/venv/bin/python
torch_onnx_driver.py job.json``. It must not import ``edge``; the PyTorch loader it shares with the Core ML
driver (``coreml_driver.torch_inputs``: the same input names for both torch converters) sits beside it.

Protocol: one JSON object per line on the original stdout (``stage`` | ``result`` | ``error``); whatever the
libraries print goes to ``convert.log`` in the work directory. The run is offline (``edge.toolchains.offline_popen``).

Job: ``torch`` (path), ``torch_kind`` (``torchscript`` | ``exported_program``), ``workdir``, ``inputs``
(``[{name, shape, dtype}]``, the ``--input-shape`` tensors), ``samples`` (an ``.npz``: one stacked array per
input), ``opset``, ``freeze`` (``{name: text}``, ``--freeze-input``: values of forward()'s int, float and bool
arguments; ``torch_args.py``); ``inspect_only`` reports the model's argument names and stops.

Steps: load (torch.jit.load / torch.export.load) -> forward()'s arguments: the tensors must be the job's inputs
(its forward signature / the ExportedProgram's user inputs), taken in the model's order, every other argument
gets its value (``--freeze-input``, the export's constant, its default), and a model that assigns its own
attributes in forward() (state between calls) is refused -> the model on the parity samples
(``reference_outputs.npz``, outputs named ``output_0``..: torch models carry no output names) ->
``torch.onnx.export`` -> ``onnx.checker`` (full check: strict shape inference) -> the saved graph's I/O
(names, static shapes, dtypes) against the job's and the reference's -> op inventory.

The exporter is torch's TorchScript-based one (``dynamo=False``). The dynamo exporter needs onnxscript and
onnx_ir, which the toolchain does not carry; it would also have to turn a TorchScript archive back into an
ExportedProgram first (torch's TS->EP converter, experimental), while the TorchScript-based exporter reads a
ScriptModule's graph as it is and traces an ExportedProgram's ``module()`` (a straight-line graph, nothing
lost). It is deprecated upstream but ships in the pinned torch 2.13, and it exports opsets up to 20.
``training=PRESERVE``: an ExportedProgram's module refuses ``.train()``, and a TorchScript model is put in
eval mode when it is loaded, so nothing is left in training mode.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch_args  # noqa: E402 - forward()'s arguments: tensors, and the values of the others
from coreml_driver import NotTorchModel, torch_inputs  # noqa: E402 - the shared PyTorch loader
from driver_output import Events, redirect_output  # noqa: E402 - the drivers' shared output plumbing

EVENTS = Events()
# what the TorchScript-based exporter always says about itself: not news about this model
_EXPORTER_NOISE = (
    "legacy TorchScript-based ONNX export",
    "The feature will be removed",
    "no signature found for",
    "It is recommended that constant folding be turned off",
)
# an ExportedProgram's module() checks its inputs against the export's shape guards (torch._assert in
# torch/__init__.py, torch/export/, torch/_export/): with static shapes the tracer folds them to constants
_GUARD_FILES = (f"torch{os.sep}__init__.py", f"torch{os.sep}export{os.sep}", f"torch{os.sep}_export{os.sep}")
_NUMPY_OF_ONNX = {
    1: "float32",
    2: "uint8",
    3: "int8",
    5: "int16",
    6: "int32",
    7: "int64",
    9: "bool",
    10: "float16",
    11: "float64",
    12: "uint32",
    13: "uint64",
    16: "bfloat16",
}


emit = EVENTS.emit


stage = EVENTS.stage


def describe(values: Any) -> list[dict[str, Any]]:
    """Name, shape (ints; a symbolic dim by its name) and numpy dtype of graph inputs/outputs."""
    out = []
    for v in values:
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
        out.append({"name": v.name, "shape": dims, "dtype": _NUMPY_OF_ONNX.get(t.elem_type, f"onnx:{t.elem_type}")})
    return out


def io_problems(want: list[dict[str, Any]], got: list[dict[str, Any]], what: str) -> list[str]:
    problems = [
        f"{w['name']} {list(w['shape'])} {w['dtype']} became {g['name']} {g['shape']} {g['dtype']}"
        for w, g in zip(want, got)
        if (w["name"], [int(d) for d in w["shape"]], w["dtype"]) != (g["name"], g["shape"], g["dtype"])
    ]
    if len(want) != len(got):
        problems.append(
            f"expected {len(want)} {what} ({', '.join(w['name'] for w in want)}), the ONNX graph has "
            f"{len(got)} ({', '.join(g['name'] for g in got)})"
        )
    return problems


def _reference(module: Any, samples: Any, names: list[str], work: Path) -> tuple[list[str], Path, list[dict[str, Any]]]:
    """The PyTorch model on every parity sample: (its output names, the npz of its outputs, their specs)."""
    import numpy as np
    import torch

    n = samples[names[0]].shape[0]
    outs: list[list[Any]] = []
    for i in range(n):
        y = module(*[torch.from_numpy(np.ascontiguousarray(samples[k][i])) for k in names])
        y = tuple(y) if isinstance(y, (tuple, list)) else (y,)
        if not y or not all(isinstance(v, torch.Tensor) for v in y):
            raise TypeError(
                "the model must return a tensor or a tuple/list of tensors, got "
                + (", ".join(type(v).__name__ for v in y) or "nothing")
            )
        # bfloat16 has no numpy dtype; every other dtype is kept: it is the exported graph's output dtype
        outs.append([(v.float() if v.dtype == torch.bfloat16 else v).detach().numpy() for v in y])
    out_names = [f"output_{j}" for j in range(len(outs[0]))]
    reference = work / "reference_outputs.npz"
    arrays: dict[str, Any] = {k: np.stack([o[j] for o in outs]) for j, k in enumerate(out_names)}  # see np.savez's stub
    np.savez(reference, **arrays)
    outputs = [
        {"name": k, "shape": list(outs[0][j].shape), "dtype": str(outs[0][j].dtype)} for j, k in enumerate(out_names)
    ]
    return out_names, reference, outputs


def _export_warnings(caught: list[Any], kind: str) -> list[str]:
    """The exporter's warnings worth reporting: its own noise and torch.export's guard chatter left out, once each."""
    said: list[str] = []
    for w in caught:
        text = " ".join(str(w.message).split())[:400]
        guard = (
            kind == "exported_program"
            and str(w.filename).endswith(_GUARD_FILES[0])
            or any(g in str(w.filename) for g in _GUARD_FILES[1:])
        )
        if not guard and not any(s in text for s in _EXPORTER_NOISE) and text not in said:
            said.append(text)
    return said


def _op_counts(graph: Any) -> dict[str, int]:
    """Op type (domain-qualified outside the default one) -> how many, subgraphs included."""
    ops: dict[str, int] = {}

    def walk(g: Any) -> None:
        for node in g.node:
            key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
            ops[key] = ops.get(key, 0) + 1
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    walk(sub)

    walk(graph)
    return ops


def _inputs_match(job: dict[str, Any], names: list[str]) -> bool:
    """Whether the job names exactly the model's inputs; when not, the ``inputs`` error event is emitted."""
    given = [t["name"] for t in job["inputs"]]
    if sorted(given) != sorted(names):
        emit(
            "error",
            kind="inputs",
            input_names=names,
            message=(
                f"the model's inputs are {', '.join(names) or '(none)'}; --input-shape gave {', '.join(given) or 'none'}"
            ),
        )
        return False
    return True


def _bind(job: dict[str, Any], model: Any, args: list[dict[str, Any]]) -> Any:
    """forward()'s tensors and the values of its other arguments (``torch_args.bind``); None when the model cannot be
    fed as the job asks or keeps state between calls: the ``arguments`` error event, every problem in one line."""
    b = torch_args.bind(args, [t["name"] for t in job["inputs"]], dict(job.get("freeze") or {}))
    state = torch_args.state_written(model, job["torch_kind"])
    if state:
        b.problems.append(
            f"forward() assigns the attributes {', '.join(state)}: state kept between calls, which an exported graph "
            "does not keep (every run would start from the values saved with it)"
        )
        b.hints.append("save the model's stateless step: the state as an input and returned as an output")
    if b.problems:
        emit("error", kind="arguments", message="; ".join(b.problems), hint="; ".join(b.hints), input_names=b.tensors)
        return None
    return b


def _export(
    job: dict[str, Any],
    module: Any,
    samples: Any,
    io_names: tuple[list[str], list[str]],
    work: Path,
    timings: dict[str, float],
) -> tuple[Path, Path, list[str]]:
    """torch.onnx.export (TorchScript-based) on the first sample into ``work/onnx/model.onnx``.

    Returns the output directory, the artifact, and the export's warnings worth reporting; records ``export_s``.
    """
    import numpy as np
    import torch

    names, out_names = io_names
    stage(f"torch.onnx.export (TorchScript-based exporter, opset {job['opset']})")
    t0 = time.time()
    out_dir = work / "onnx"
    out_dir.mkdir()
    artifact = out_dir / "model.onnx"
    example = tuple(torch.from_numpy(np.ascontiguousarray(samples[k][0])) for k in names)
    if job["torch_kind"] == "torchscript" and not isinstance(module, torch.jit.ScriptModule):
        # a TorchScript model bound to its --freeze-input values: traced, so they are constants in the graph (the
        # exporter traces a plain module without the ScriptModule inside it); the model's own graph is kept
        module = torch.jit.trace(module, example, check_trace=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.onnx.export(
            module,
            example,
            str(artifact),
            dynamo=False,
            input_names=names,
            output_names=out_names,
            opset_version=int(job["opset"]),
            training=torch.onnx.TrainingMode.PRESERVE,
            do_constant_folding=True,
            export_params=True,
        )
    said = _export_warnings(caught, job["torch_kind"])
    timings["export_s"] = round(time.time() - t0, 2)
    return out_dir, artifact, said


def run(job: dict[str, Any], work: Path) -> int:
    import numpy as np
    import onnx
    import torch

    timings: dict[str, float] = {}
    torch.set_grad_enabled(False)
    t0 = time.time()
    kind = job["torch_kind"]
    stage(f"loading the {kind}")
    model, _ = torch_inputs(job["torch"], kind)
    args = torch_args.signature(model, kind)
    if job.get("inspect_only"):
        emit("result", input_names=[a["name"] for a in args])
        return 0
    bound = _bind(job, model, args)
    if bound is None or not _inputs_match(job, bound.tensors):
        return 1
    names = bound.tensors
    by_name = {t["name"]: t for t in job["inputs"]}
    inputs = [by_name[n] for n in names]  # the model's positional order
    module = model.module() if kind == "exported_program" else model
    if bound.values:
        module = torch_args.bound(module, [a["name"] for a in args], bound.values)
    timings["load_s"] = round(time.time() - t0, 2)

    stage("running the PyTorch model on the parity samples (reference)")
    t0 = time.time()
    samples = np.load(job["samples"])
    out_names, reference, outputs = _reference(module, samples, names, work)
    timings["reference_s"] = round(time.time() - t0, 2)

    out_dir, artifact, said = _export(job, module, samples, (names, out_names), work, timings)

    stage("onnx.checker (full check) and the saved graph's I/O")
    t0 = time.time()
    onnx.checker.check_model(str(artifact), full_check=True)  # by path: works with external data too
    proto = onnx.load(str(artifact), load_external_data=False)
    ins, outs_graph = describe(proto.graph.input), describe(proto.graph.output)
    initializers = {i.name for i in proto.graph.initializer}
    ins = [i for i in ins if i["name"] not in initializers]
    problems = io_problems([{**t, "dtype": t.get("dtype", "float32")} for t in inputs], ins, "inputs")
    problems += io_problems(outputs, outs_graph, "outputs")
    ops = _op_counts(proto.graph)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    timings["check_s"] = round(time.time() - t0, 2)
    emit(
        "result",
        artifact=str(artifact),
        files=sorted(str(p) for p in out_dir.rglob("*") if p.is_file()),
        opset=opset,
        ir_version=int(proto.ir_version),
        producer=f"{proto.producer_name} {proto.producer_version}".strip(),
        io={"inputs": ins, "outputs": outs_graph},
        io_problems=problems,
        ops=dict(sorted(ops.items())),
        input_names=names,
        frozen=bound.frozen,
        outputs=outputs,
        reference_outputs=str(reference),
        export_warnings=said,
        timings=timings,
        tool_versions={"torch": torch.__version__, "onnx": onnx.__version__, "numpy": np.__version__},
    )
    return 0


def main() -> int:
    job = json.loads(Path(sys.argv[1]).read_text())
    work = Path(job["workdir"])
    EVENTS.stream, log = redirect_output(work)  # noqa: F841 - the log kept open for the run
    try:
        return run(job, work)
    except NotTorchModel as e:
        emit("error", kind="not_torch", message=str(e)[:1500])
        return 1
    except Exception as e:  # noqa: BLE001 - reported to the parent as an event
        traceback.print_exc()
        emit(
            "error",
            kind="unsupported_op" if type(e).__name__ == "UnsupportedOperatorError" else "conversion",
            message=f"{type(e).__name__}: {str(e).strip()[:1500]}",
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
