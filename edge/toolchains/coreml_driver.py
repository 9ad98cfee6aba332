"""ONNX or PyTorch -> Core ML ML Program inside the ``coreml`` toolchain environment (torch + coremltools + onnx).

Run by :class:`edge.backends.coreml.convert.OnnxToCoreML` (and ``TorchToCoreML``) as ``<toolchain>/venv/bin/python
coreml_driver.py job.json``. It must not import ``edge``; the bridge (``coreml_bridge.py``)
sits beside it and is imported from this directory.

Protocol: one JSON object per line on the original stdout (``stage`` | ``result`` | ``error``);
whatever the libraries print goes to ``convert.log`` in the work directory. The run is offline:
the parent starts this driver through ``edge.toolchains.offline_popen``, as it does the tflite one
(a network namespace where the host allows one, else an in-process socket guard).

Steps: every ONNX op checked against the bridge (all unsupported ops in one error) -> the
ONNX graph as a torch module -> outputs of that module on the parity samples (the parent
compares them with onnxruntime: that checks the bridge) -> ``torch.jit.trace`` (keeps the
positional I/O that coremltools renames to the ONNX names; ``torch.export`` loses them) ->
``ct.convert`` to an ML Program with inputs declared ``float32`` explicitly (with an iOS16+
deployment target they silently become fp16 otherwise) -> ``.mlpackage`` -> the checks that
work on Linux: the package loads as a spec, its I/O names/shapes/dtypes, the op inventory.

A job with ``torch`` (and ``torch_kind``: ``torchscript`` | ``exported_program``) instead of ``onnx``
loads the PyTorch model itself: its input names (TorchScript forward signature, or the
ExportedProgram's user inputs) must be the job's, its outputs on the parity samples are the
reference (``reference_outputs.npz``, named ``output_0``..: torch models carry no output names),
and the same ``ct.convert`` and checks follow. ``inspect_only`` reports the input names and stops.

Host proxy (both paths, after tracing): Core ML predicts only on macOS, so the module ``ct.convert`` receives
runs here in the bundle's precision on the same parity samples (``proxy_outputs.npz``): for fp16 a copy cast
with ``.half()`` and fed half inputs, so every weight and every intermediate is fp16 as in an fp16 ML Program
(``torch.autocast`` was measured too and not taken: it computes only conv/linear/matmul in fp16 and keeps
every other op and the activations between them fp32, so it would hide an fp16 overflow the package has; it
is also slower). Where torch's CPU has no fp16 kernel for an op, an ONNX source falls back to the fp32 traced
bridge and the label says so; a PyTorch source has no proxy then (its fp32 module is the reference itself).
"""

from __future__ import annotations

import json
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from driver_output import Events, redirect_output  # noqa: E402 - the drivers' shared output plumbing, beside this file

EVENTS = Events()
#: the package's user-defined metadata key holding {bundle name: package name} (edge.backends.coreml.format.IO_NAMES)
IO_NAMES = "edgekit.io_names"
#: ... and {bundle name: bundle shape} for the 0-d outputs Core ML holds as [1] / [1, 1] (format.IO_SHAPES)
IO_SHAPES = "edgekit.io_shapes"

# MIL ops known to keep a model (or that part of it) off the Neural Engine: community-measured
# (github.com/hollance/neural-engine, Apple's "Deploying Transformers on the ANE" notes). Core ML
# decides per op at load time; Xcode's performance report is the final word on a Mac.
ANE_UNFRIENDLY = {
    "gather": "gather with computed indices runs on the CPU",
    "gather_nd": "runs on the CPU",
    "scatter": "runs on the CPU",
    "scatter_nd": "runs on the CPU",
    "scatter_along_axis": "runs on the CPU",
    "non_zero": "data-dependent shape: CPU",
    "topk": "CPU",
    "argsort": "CPU",
    "cumsum": "CPU",
    "while_loop": "control flow: CPU",
    "cond": "control flow: CPU",
    "random_uniform": "CPU",
    "random_normal": "CPU",
    "random_bernoulli": "CPU",
    "random_categorical": "CPU",
    "lstm": "recurrent layers run on the CPU/GPU",
    "gru": "recurrent layers run on the CPU/GPU",
    "rnn": "recurrent layers run on the CPU/GPU",
    "einsum": "only some equations map to ANE matmuls",
    "pixel_shuffle": "often split off the ANE",
    "resize_nearest_neighbor": "non-integer scales leave the ANE",
    "layer_norm": "fine on recent ANEs, slow on A14/M1 over non-channel axes",
}


emit = EVENTS.emit


stage = EVENTS.stage


def op_inventory(spec: Any) -> dict[str, int]:
    counts: dict[str, int] = {}

    def walk(block: Any) -> None:
        for op in block.operations:
            counts[op.type] = counts.get(op.type, 0) + 1
            for b in op.blocks:
                walk(b)

    for fn in spec.mlProgram.functions.values():
        for block in fn.block_specializations.values():
            walk(block)
    return dict(sorted(counts.items()))


def describe(features: Any) -> list[dict[str, Any]]:
    import coremltools as ct  # noqa: F401 - proto types

    out = []
    for f in features:
        t = f.type.WhichOneof("Type")
        if t == "multiArrayType":
            arr = f.type.multiArrayType
            from coremltools.proto import FeatureTypes_pb2 as ft

            dtype = ft.ArrayFeatureType.ArrayDataType.Name(arr.dataType).lower()
            out.append(
                {
                    "name": f.name,
                    "shape": [int(d) for d in arr.shape],
                    "dtype": {"float32": "float32", "float16": "float16", "double": "float64", "int32": "int32"}.get(
                        dtype, dtype
                    ),
                }
            )
        else:
            out.append({"name": f.name, "type": t})
    return out


def bridge_onnx(job: dict[str, Any], work: Path, timings: dict[str, float]) -> tuple[Any, dict[str, Any]] | None:
    """ONNX source: the bridged module's outputs on the parity samples, then ``torch.jit.trace``."""
    import coreml_bridge as bridge
    import numpy as np
    import onnx
    import torch

    t0 = time.time()
    stage("checking ONNX ops against the bridge")
    model = onnx.load(job["onnx"])
    bad = bridge.unsupported_ops(model)
    if bad:
        emit("error", kind="unsupported_ops", message=str(bridge.UnsupportedOps(bad)), ops=bad)
        return None
    torch.set_grad_enabled(False)
    stage("folding shapes and constants (static input shapes)")
    module = bridge.OnnxModule(model, {t["name"]: t["shape"] for t in job["inputs"]}).eval()
    names = [t["name"] for t in job["inputs"]]
    stage("running the bridged torch module on the parity samples")
    samples = np.load(job["samples"])
    n = samples[names[0]].shape[0]
    outs: dict[str, list[Any]] = {o: [] for o in module.output_names}
    for i in range(n):
        y = module(*[torch.from_numpy(np.ascontiguousarray(samples[k][i])) for k in names])
        y = y if isinstance(y, tuple) else (y,)
        for name, v in zip(module.output_names, y):
            outs[name].append(v.numpy())
    arrays: dict[str, Any] = {k: np.stack(v) for k, v in outs.items()}  # numpy's stub reads **arrays as allow_pickle
    np.savez(work / "bridge_outputs.npz", **arrays)
    timings["bridge_s"] = round(time.time() - t0, 2)

    stage("torch.jit.trace")
    t0 = time.time()
    example = tuple(torch.from_numpy(np.ascontiguousarray(samples[k][0])) for k in names)
    traced = torch.jit.trace(module, example, check_trace=False)
    timings["trace_s"] = round(time.time() - t0, 2)

    stage(f"host proxy: the traced module in {job['precision']} on the parity samples")
    t0 = time.time()
    proxy = host_proxy(traced, job, samples, names, "the traced module", fallback=traced)
    timings["proxy_s"] = round(time.time() - t0, 2)
    return traced, {"bridge_outputs": str(work / "bridge_outputs.npz"), **save_proxy(proxy, module.output_names, work)}


def run_samples(fn: Any, samples: Any, names: list[str], dtype: Any = None) -> list[list[Any]]:
    """``fn`` on every parity sample (float inputs cast to ``dtype`` when given); per sample, its outputs as
    float32 numpy arrays in return order."""
    import numpy as np
    import torch

    outs = []
    for i in range(samples[names[0]].shape[0]):
        xs = [torch.from_numpy(np.ascontiguousarray(samples[k][i])) for k in names]
        if dtype is not None:
            xs = [x.to(dtype) if x.is_floating_point() else x for x in xs]
        y = fn(*xs)
        y = tuple(y) if isinstance(y, (tuple, list)) else (y,)
        if not all(isinstance(v, torch.Tensor) for v in y):
            raise TypeError(
                "the model must return a tensor or a tuple/list of tensors, got "
                + ", ".join(type(v).__name__ for v in y)
            )
        outs.append([v.detach().float().numpy() for v in y])
    return outs


_NO_HALF_KERNEL = re.compile(r'"([^"]+)" not implemented for \'Half\'')


def host_proxy(
    module: Any, job: dict[str, Any], samples: Any, names: list[str], what: str, fallback: Any = None
) -> dict[str, Any] | None:
    """The host's stand-in for the package's predictions: ``module`` (what ``ct.convert`` receives; a copy is
    cast, the module itself is left as it is) on the parity samples in the bundle's precision.

    ``fallback``: the fp32 module to run when torch's CPU cannot run ``module`` in fp16 (None: no proxy then).
    Returns {label, precision_used ("f16" | "f32"), fallback (why, or None), outputs (per sample)}, or None."""
    import copy

    import torch

    version = torch.__version__.split("+")[0]
    if job["precision"] != "fp16":
        return {
            "label": f"torch {version} CPU fp32 ({what})",
            "precision_used": "f32",
            "fallback": None,
            "outputs": run_samples(module, samples, names),
        }
    half = copy.deepcopy(module).half()
    try:
        return {
            "label": f"torch {version} CPU fp16 ({what}, cast to half)",
            "precision_used": "f16",
            "fallback": None,
            "outputs": run_samples(half, samples, names, torch.float16),
        }
    except RuntimeError as e:  # the fp32 run of the same module succeeded: this is fp16-specific
        found = _NO_HALF_KERNEL.search(str(e))
        lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()] or ["?"]
        # a TorchScript error starts "The following operation failed in the TorchScript interpreter." and ends with
        # what failed: the last line says why
        said = lines[-1] if "TorchScript interpreter" in lines[0] else lines[0]
        why = (
            f"torch CPU has no fp16 kernel for {found.group(1)}"
            if found
            else "the module does not run in fp16 on torch CPU: " + said[:300]
        )
    if fallback is None:
        return {"label": None, "precision_used": None, "fallback": why, "outputs": None}
    return {
        "label": f"torch {version} CPU fp32 bridge: {why}",
        "precision_used": "f32",
        "fallback": why,
        "outputs": run_samples(fallback, samples, names),
    }


def save_proxy(proxy: dict[str, Any] | None, out_names: list[str], work: Path) -> dict[str, Any]:
    """``proxy_outputs.npz`` (stacked per output name, like the other outputs files) and the event's record."""
    import numpy as np

    if proxy is None:
        return {}
    if proxy["outputs"] is None:
        return {"proxy": {k: v for k, v in proxy.items() if k != "outputs"}}
    arrays: dict[str, Any] = {k: np.stack([o[j] for o in proxy["outputs"]]) for j, k in enumerate(out_names)}
    np.savez(work / "proxy_outputs.npz", **arrays)
    return {"proxy": {**{k: v for k, v in proxy.items() if k != "outputs"}, "outputs": str(work / "proxy_outputs.npz")}}


class NotTorchModel(Exception):
    pass


def torch_inputs(path: str, kind: str) -> tuple[Any, list[str]]:
    """Load a TorchScript archive or a torch.export ExportedProgram; the model and its input names in order."""
    import torch

    try:
        if kind == "exported_program":
            ep = torch.export.load(path)
            return ep, [str(n) for n in ep.graph_signature.user_inputs]
        module = torch.jit.load(path, map_location="cpu")
    except Exception as e:
        load, what = (
            ("torch.export.load", "ExportedProgram")
            if kind == "exported_program"
            else ("torch.jit.load", "TorchScript")
        )
        raise NotTorchModel(
            f"{load} (torch {torch.__version__}) cannot read {Path(path).name}, a {what} archive "
            f"({type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''})"
        ) from e
    return module.eval(), [a.name for a in module.forward.schema.arguments[1:]]


def load_torch_source(job: dict[str, Any], work: Path, timings: dict[str, float]) -> tuple[Any, dict[str, Any]] | None:
    """PyTorch source (TorchScript or ExportedProgram): check the inputs, run it on the parity samples (the
    reference), name the outputs output_0.. (torch models carry no output names)."""
    import numpy as np
    import torch

    torch.set_grad_enabled(False)
    t0 = time.time()
    stage(f"loading the {job['torch_kind']}")
    model, names = torch_inputs(job["torch"], job["torch_kind"])
    if job.get("inspect_only"):
        emit("result", input_names=names)
        return None
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
        return None
    by_name = {t["name"]: t for t in job["inputs"]}
    job["inputs"] = [by_name[n] for n in names]  # the model's positional order
    run = model.module() if job["torch_kind"] == "exported_program" else model
    stage("running the PyTorch model on the parity samples (reference)")
    samples = np.load(job["samples"])
    outs = run_samples(run, samples, names)
    out_names = [f"output_{j}" for j in range(len(outs[0]))]
    arrays: dict[str, Any] = {k: np.stack([o[j] for o in outs]) for j, k in enumerate(out_names)}
    np.savez(work / "reference_outputs.npz", **arrays)
    job["outputs"] = [{"name": k, "shape": list(outs[0][j].shape)} for j, k in enumerate(out_names)]
    timings["reference_s"] = round(time.time() - t0, 2)
    if job["torch_kind"] == "exported_program":
        model = model.run_decompositions({})  # the ATen opset coremltools reads

    stage(f"host proxy: the model in {job['precision']} on the parity samples")
    t0 = time.time()
    proxy = None
    if job["precision"] == "fp16":  # in fp32 the module is the reference itself: nothing to compare
        what = "the TorchScript module" if job["torch_kind"] == "torchscript" else "the decomposed ExportedProgram"
        proxy = host_proxy(
            model.module() if job["torch_kind"] == "exported_program" else model, job, samples, names, what
        )
    timings["proxy_s"] = round(time.time() - t0, 2)
    return model, {
        "reference_outputs": str(work / "reference_outputs.npz"),
        "input_names": names,
        "outputs": job["outputs"],
        **save_proxy(proxy, out_names, work),
    }


def _convert_mlprogram(job: dict[str, Any], traced: Any, work: Path, timings: dict[str, float]) -> Path:
    """coremltools converts the traced model to an ML Program saved as ``model.mlpackage``; its path."""
    import numpy as np

    stage("coremltools: ML Program")
    t0 = time.time()
    import coremltools as ct

    precision = ct.precision.FLOAT16 if job["precision"] == "fp16" else ct.precision.FLOAT32
    target = getattr(ct.target, job["minimum_deployment_target"])
    mlmodel = ct.convert(
        traced,
        convert_to="mlprogram",
        compute_precision=precision,
        compute_units=getattr(ct.ComputeUnit, job["compute_units"]),
        minimum_deployment_target=target,
        inputs=[ct.TensorType(name=t["name"], shape=tuple(t["shape"]), dtype=np.float32) for t in job["inputs"]],
        outputs=[ct.TensorType(name=t["name"], dtype=np.float32) for t in job["outputs"]],
    )
    mlmodel.short_description = job.get("description", "")
    # coremltools makes every I/O name an identifier ('Identity:0' -> 'Identity_0', 'a/b.c' -> 'a_b_c'): the package
    # carries the bundle's names for the runner, which feeds and returns them (edge.backends.coreml.format.IO_NAMES)
    spec = mlmodel.get_spec()
    got = [f.name for f in spec.description.input] + [f.name for f in spec.description.output]
    want = [t["name"] for t in job["inputs"]] + [t["name"] for t in job["outputs"]]
    renamed = {w: g for w, g in zip(want, got) if w != g}
    if renamed:
        mlmodel.user_defined_metadata[IO_NAMES] = json.dumps(renamed)
    job["renamed_io"] = renamed
    # Core ML has no 0-d arrays: a scalar output (a MOS score) comes out [1] or [1, 1]; the runner gives it back 0-d
    got_shape = {f.name: [int(d) for d in f.type.multiArrayType.shape] for f in spec.description.output}
    scalars = [t["name"] for t in job["outputs"] if not t["shape"] and got_shape.get(renamed.get(t["name"], t["name"]))]
    reshaped: dict[str, list[int]] = {n: [] for n in scalars if all(d == 1 for d in got_shape[renamed.get(n, n)])}
    if reshaped:
        mlmodel.user_defined_metadata[IO_SHAPES] = json.dumps(reshaped)
    job["reshaped_io"] = reshaped
    out = work / "model.mlpackage"
    mlmodel.save(str(out))
    timings["convert_s"] = round(time.time() - t0, 2)
    return out


def _io_problems(job: dict[str, Any], ins: list[dict[str, Any]], outs_spec: list[dict[str, Any]]) -> list[str]:
    """Where the saved package's inputs/outputs differ from the job's (name, as the package renamed it; shape,
    float32, count)."""
    problems = []
    renamed, reshaped = job.get("renamed_io", {}), job.get("reshaped_io", {})
    for want, got in ((job["inputs"], ins), (job["outputs"], outs_spec)):
        for w, g in zip(want, got):
            if (
                renamed.get(w["name"], w["name"]) != g.get("name")
                or ([int(d) for d in w["shape"]] != g.get("shape") and w["name"] not in reshaped)
                or g.get("dtype") != "float32"
            ):
                problems.append(f"{w['name']} {w['shape']} float32 became {g}")
        if len(want) != len(got):
            problems.append(f"expected {len(want)} tensors, the package has {len(got)}")
    return problems


def main() -> int:
    job = json.loads(Path(sys.argv[1]).read_text())
    work = Path(job["workdir"])
    EVENTS.stream, log = redirect_output(work)  # noqa: F841 - the log kept open for the run
    timings: dict[str, float] = {}
    try:
        import numpy as np

        loaded = load_torch_source(job, work, timings) if "torch" in job else bridge_onnx(job, work, timings)
        if loaded is None:
            return 0 if job.get("inspect_only") else 1
        traced, extra = loaded
        import torch

        out = _convert_mlprogram(job, traced, work, timings)
        import coremltools as ct

        stage("checking the saved package (spec, I/O, op inventory)")
        spec = ct.utils.load_spec(str(out))
        ins, outs_spec = describe(spec.description.input), describe(spec.description.output)
        problems = _io_problems(job, ins, outs_spec)
        ops = op_inventory(spec)
        flagged = {op: ANE_UNFRIENDLY[op] for op in ops if op in ANE_UNFRIENDLY}
        emit(
            "result",
            artifact=str(out),
            io={"inputs": ins, "outputs": outs_spec},
            renamed_io=job.get("renamed_io", {}),
            reshaped_io=job.get("reshaped_io", {}),
            io_problems=problems,
            spec_version=int(spec.specificationVersion),
            ops=ops,
            ane_flagged=flagged,
            timings=timings,
            tool_versions={
                "torch": torch.__version__,
                "coremltools": ct.__version__,
                "numpy": np.__version__,
                **({"onnx": sys.modules["onnx"].__version__} if "onnx" in sys.modules else {}),
            },
            **extra,
        )
        return 0
    except Exception as e:  # noqa: BLE001 - reported to the parent as an event
        traceback.print_exc()
        kind = "unsupported_ops" if type(e).__name__ == "UnsupportedOps" else "conversion"
        if type(e).__name__ == "NotTorchModel":
            emit("error", kind="not_torch", message=str(e)[:1500])
            return 1
        emit("error", kind=kind, message=f"{type(e).__name__}: {str(e)[:1500]}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
