"""ONNX -> Core ML ML Program (``.mlpackage``), fp16 by default, for the Apple Neural Engine.

Runs in the ``torch`` toolchain environment (formerly ``coreml``: torch 2.13 CPU + coremltools 9.0 + onnx, see
:mod:`edge.toolchains`), driven by ``edge/toolchains/coreml_driver.py``. The bridge:
coremltools no longer reads ONNX, so the ONNX graph becomes a torch module with edgekit's own
ONNX->PyTorch bridge (``edge/toolchains/coreml_bridge.py``; onnx2torch needs torchvision, whose PyPI build links
the CUDA torch, and took 4 of the 16 ONNX corpus models where the bridge takes 11: issue #34), then ``torch.jit.trace``
(``torch.export`` loses the I/O names) and ``ct.convert`` to an ML Program with float32 inputs
declared explicitly (an iOS16+ target otherwise turns them fp16 silently).

What Linux can check is checked and recorded in the manifest: the bridge against onnxruntime
fp32 on the parity inputs (``details["bridge_parity"]``; a failure stops the conversion), the
saved package loads as a spec, its I/O names/shapes/dtypes match the bundle's, and its op
inventory with the ops known to keep a model off the Neural Engine flagged. Predictions need
macOS (the ``coreml`` runner); in their place the result carries a host proxy
(:class:`~edge.backends.converter.HostProxy`): the module ``ct.convert`` received, run by torch's CPU in the
bundle's precision (fp16: cast to half) on the converter's parity inputs, or the fp32 bridge where torch has
no fp16 kernel for an op, named as such (``details["host_proxy"]``).
"""

from __future__ import annotations

import ast
import functools
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from edge import toolchains
from edge.backends.converter import ConversionRequest, ConversionResult, Converter, HostProxy
from edge.base.typedjson import spec
from edge.capabilities import Requirement
from edge.errors import ConversionError, MissingDependencyError, ModelError, ParityError
from edge.graph.opsupport import CPU_WAY, OpSupport, check_ops
from edge.graph.torchfile import RELOAD_HINT

TOOLCHAIN = "torch"
DRIVER = "coreml"  # edge/toolchains/coreml_driver.py, one of the torch toolchain's drivers
from edge.backends.coreml.format import COMPUTE_UNITS  # noqa: E402 - where the runner reads it too

_ORT = Requirement(
    "python",
    "onnxruntime",
    install="pip install 'edgekit-ml[onnx]'",
    why="the bridged model is checked against the source in onnxruntime",
)
_PARITY_SAMPLES = 8


@dataclass
class _DriverRun:
    """One conversion in the torch toolchain: the job sent, the driver's final event, where the package went."""

    job: dict[str, Any]
    final: dict[str, Any]
    status: Any
    inputs: list[dict[str, np.ndarray]]
    label: str
    package: Path
    arrays: dict[str, np.ndarray]  # the driver's per-sample outputs (bridge or torch reference), stacked
    units: str
    t_start: float
    proxy: HostProxy | None  # the module ct.convert received, in the bundle's precision, on ``inputs``

    def notes(self, preprocess: Any) -> list[str]:
        notes = [
            f"Core ML predictions need macOS; the bundle is ready to copy to a Mac (compute units {self.units} at load)"
        ]
        if self.final["ane_flagged"]:
            notes.append(
                "ops that may keep the model off the Neural Engine: "
                + "; ".join(f"{k}: {v}" for k, v in self.final["ane_flagged"].items())
            )
        if preprocess is not None:
            notes.append(
                "pre-processing is not folded in: inputs stay float32 tensors (the same feeds as every "
                "other runtime), normalised by the caller as the manifest's preprocess spec says"
            )
        if self.final.get("renamed_io"):
            notes.append(
                "coremltools made these I/O names identifiers in the package: "
                + ", ".join(f"{k!r} -> {v!r}" for k, v in self.final["renamed_io"].items())
                + "; the package's metadata maps them back and the coreml runner feeds and returns the bundle's names"
            )
        if self.final.get("reshaped_io"):
            notes.append(
                "Core ML has no 0-d arrays: the package holds "
                + ", ".join(repr(k) for k in self.final["reshaped_io"])
                + " as [1, 1]; its metadata says so and the coreml runner returns the bundle's 0-d shape"
            )
        why = (self.final.get("proxy") or {}).get("fallback")
        if self.proxy is None and why:
            notes.append(f"no host proxy for the {self.job['precision']} package: {why}")
        elif self.proxy is not None and self.proxy.fallback:
            notes.append(f"the host proxy ran fp32, not {self.job['precision']}: {self.proxy.fallback}")
        return notes

    def details(self, recipe: str, **extra: Any) -> dict[str, Any]:
        final = self.final
        return {
            "recipe": recipe,
            "toolchain": self.status.manifest_record(),
            "compute_units": self.units,
            "minimum_deployment_target": self.job["minimum_deployment_target"],
            "spec_check": {
                "loads_as_spec": True,
                "specification_version": final["spec_version"],
                "io": final["io"],
                "io_matches_manifest": True,
            },
            "ops": final["ops"],
            "renamed_io": final.get("renamed_io", {}),
            "reshaped_io": final.get("reshaped_io", {}),
            "ane_flagged": final["ane_flagged"],
            **extra,
            "host_proxy": (
                {
                    "label": self.proxy.label,
                    "precision_used": self.proxy.precision_used,
                    "fallback": self.proxy.fallback,
                    "samples": len(self.proxy.inputs),
                }
                if self.proxy is not None
                else None
            ),
            "timings_s": {**final["timings"], "total": round(time.perf_counter() - self.t_start, 2)},
        }

    def result(self, details: dict[str, Any], notes: list[str], **kwargs: Any) -> ConversionResult:
        tool_versions = {
            **self.final["tool_versions"],
            "toolchain": f"{TOOLCHAIN} (lock {(self.status.lock_hash or '?')[:12]})",
        }
        files = [p for p in self.package.rglob("*") if p.is_file()]
        # A bundle's primary artifact is a file (hash-verified); an .mlpackage is a directory, so the primary
        # artifact is its own Manifest.json and the runner loads the package around it (package_dir()).
        return ConversionResult(
            artifact=self.package / "Manifest.json",
            format="mlpackage",
            files=files,
            tool_versions=tool_versions,
            details=details,
            notes=notes,
            proxy=self.proxy,
            **kwargs,
        )


@dataclass(frozen=True)
class CoreMLConvertOptions:
    """The Core ML converters' options (``onnx->coreml``, ``torch->coreml``), declared once (``edge.backends.options``)."""

    compute_units: Literal["CPU_AND_NE", "ALL", "CPU_AND_GPU", "CPU_ONLY"] = spec(
        "CPU_AND_NE", doc=f"compute units the model is converted for: {', '.join(COMPUTE_UNITS)} (default CPU_AND_NE)"
    )
    minimum_deployment_target: str = spec(
        "iOS16",
        pattern=r"^(iOS|macOS|tvOS|watchOS|visionOS)[0-9]{1,2}$",
        doc="coremltools target, e.g. iOS16 (default), macOS13, iOS17",
    )
    timeout_s: float = spec(900.0, ge=1.0, le=7 * 86400, doc="stop the toolchain after this many seconds (default 900)")


class _CoreMLConverter(Converter):
    """What both Core ML converters share: options, checks, the toolchain run and the result."""

    target_format = "mlpackage"
    precisions = frozenset({"fp32", "fp16"})
    toolchain = TOOLCHAIN
    options_class = CoreMLConvertOptions  # ``options`` (names and descriptions) derive from it

    def _drive(self, request: ConversionRequest, source_job: dict[str, Any], outputs_key: str) -> _DriverRun:
        from edge.verify.inputs import generated_samples

        opts: CoreMLConvertOptions = self.read_options(request.options)
        self.check_precision(request.precision)
        units = opts.compute_units
        toolchains.require(TOOLCHAIN, f"converter {self.name!r}")
        if request.calibration is not None and request.calibration.samples:
            inputs, label = [dict(s) for s in request.calibration.samples[:_PARITY_SAMPLES]], "calibration"
        else:
            inputs, label = generated_samples(request.io, request.preprocess, _PARITY_SAMPLES, seed=1234), "generated"
        names = [t.name for t in request.io.inputs]
        t_start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="edgekit-coreml-") as tmp:
            work = Path(tmp)
            arrays: dict[str, Any] = {
                n: np.stack([s[n] for s in inputs]) for n in names
            }  # numpy's savez stub takes **arrays as allow_pickle too
            np.savez(work / "samples.npz", **arrays)
            job: dict[str, Any] = {
                **source_job,
                "workdir": str(work),
                "precision": request.precision,
                "samples": str(work / "samples.npz"),
                "compute_units": units,
                "minimum_deployment_target": opts.minimum_deployment_target,
                "inputs": [{"name": t.name, "shape": [int(d) for d in t.shape]} for t in request.io.inputs],
                "description": f"edgekit {request.source.name}",
            }
            final, st = toolchains.run_driver(TOOLCHAIN, job, work, timeout_s=opts.timeout_s, driver=DRIVER)
            if final["event"] == "error":
                _raise_driver_error(self.name, final, work, request.source)
            with np.load(final[outputs_key]) as data:
                arrays = {k: data[k] for k in data.files}
            proxy = _load_proxy(final.get("proxy"), inputs, label)
            out = request.workdir / "model.mlpackage"
            shutil.move(final["artifact"], out)
        if final["io_problems"]:
            raise ConversionError(
                "the saved .mlpackage does not have the bundle's I/O: " + "; ".join(final["io_problems"])
            )
        return _DriverRun(job, final, st, inputs, label, out, arrays, units, t_start, proxy)


def _load_proxy(record: dict[str, Any] | None, inputs: list[dict[str, np.ndarray]], label: str) -> HostProxy | None:
    """The driver's host proxy (``proxy_outputs.npz``, stacked per output) as per-sample outputs on ``inputs``."""
    if not record or not record.get("outputs"):
        return None
    with np.load(record["outputs"]) as data:
        stacked = {k: data[k] for k in data.files}
    return HostProxy(
        label=record["label"],
        precision_used=record["precision_used"],
        inputs=inputs,
        outputs=[{k: v[i] for k, v in stacked.items()} for i in range(len(inputs))],
        inputs_from=label,
        fallback=record.get("fallback"),
    )


@functools.cache
def bridge_ops() -> frozenset[str]:
    """``SUPPORTED + STRUCTURAL`` of the Core ML bridge, read from its source (importing it needs torch)."""
    src = Path(toolchains.__file__).resolve().parent / "coreml_bridge.py"
    values: dict[str, tuple[str, ...]] = {}
    for node in ast.parse(src.read_text(encoding="utf-8")).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in ("SUPPORTED", "STRUCTURAL")
        ):
            values[node.targets[0].id] = tuple(ast.literal_eval(node.value))
    return frozenset(values.get("SUPPORTED", ()) + values.get("STRUCTURAL", ()))


class OnnxToCoreML(_CoreMLConverter):
    name = "onnx->coreml"
    source_format = "onnx"
    requires = (_ORT,)

    @classmethod
    def op_support(cls) -> OpSupport:
        """Every op outside the ONNX->PyTorch bridge's ``SUPPORTED`` list (``edge/toolchains/coreml_bridge.py``,
        read from its source: it imports torch): control flow and recurrent ops included."""
        return OpSupport(
            cls.name,
            "edgekit's ONNX->PyTorch bridge",
            supported_only=bridge_ops(),
            descend=False,
            way_forward="bring the PyTorch model (TorchScript or torch.export .pt2: coremltools converts control "
            f"flow and recurrent layers from it), or {CPU_WAY}",
        )

    def convert(self, request: ConversionRequest) -> ConversionResult:
        from edge.verify.parity import ParityReport, compare, reference_outputs, thresholds_for

        self.read_options(request.options)  # a bad option is refused before the op check
        check_ops(request.source, self.op_support())  # every op the bridge lacks, before the toolchain starts
        _refuse_non_float_inputs(request)
        run = self._drive(
            request,
            {
                "onnx": str(Path(request.source).resolve()),
                "outputs": [{"name": t.name, "shape": [int(d) for d in t.shape]} for t in request.io.outputs],
            },
            "bridge_outputs",
        )
        candidate = [{k: v[i] for k, v in run.arrays.items()} for i in range(len(run.inputs))]
        reference = reference_outputs(Path(request.source), run.inputs)
        th = thresholds_for("fp32", "f32")
        bridge = ParityReport(
            precision="fp32",
            thresholds=th,
            samples=len(run.inputs),
            inputs=run.label,
            reference="onnxruntime fp32 CPUExecutionProvider",
            candidate={
                "runtime": f"edgekit ONNX->PyTorch bridge (torch {run.final['tool_versions']['torch']})",
                "device_used": "CPU",
            },
            outputs=compare(reference, candidate, th),
        ).to_json()
        bridge.pop("accepted_failure", None)
        if not bridge["passed"]:
            raise ParityError(
                f"the ONNX->PyTorch bridge disagrees with onnxruntime on {request.source.name}: "
                + "; ".join(f"{o['name']}: {f}" for o in bridge["outputs"] for f in o["failures"]),
                bridge,
                hint="a bridge bug: report it with the model",
            )
        details = run.details(
            f"ONNX -> edgekit bridge -> torch.jit.trace -> ML Program ({request.precision})", bridge_parity=bridge
        )
        return run.result(details, run.notes(request.preprocess))


def _refuse_non_float_inputs(request: ConversionRequest) -> None:
    """The driver declares every package input float32 and the Core ML runner feeds float32 only: an integer input
    (token ids, bytes) would reach the package as floats. Refused in one line before the toolchain starts."""
    ints = [f"{t.name!r} ({t.dtype})" for t in request.io.inputs if t.dtype not in ("float32", "float16")]
    if ints:
        raise ConversionError(
            f"edgekit's Core ML path takes float32 inputs only (the package's inputs are "
            f"declared float32 and its runner feeds float32); this model's input{'s' if len(ints) > 1 else ''} "
            f"{', '.join(ints)} {'are' if len(ints) > 1 else 'is'} not",
            hint=f"choose x86-cpu, whose onnxruntime takes {'them as they are' if len(ints) > 1 else 'it as it is'}",
        )


def _raise_driver_error(converter: str, final: dict[str, Any], work: Path, source: Path) -> None:
    kind = final.get("kind")
    if kind == "unsupported_ops":
        raise ConversionError(
            final["message"],
            hint="replace these ops in the source model, or choose a target whose runtime has them (x86-cpu)",
        )
    if kind == "toolchain":
        raise MissingDependencyError(final["message"])
    if kind == "not_torch":
        raise ModelError(final["message"], hint=RELOAD_HINT)
    if kind == "inputs":
        raise ModelError(
            f"{source.name}: {final['message']}",
            hint="pass --input-shape NAME=1,3,224,224 for every input: "
            + " ".join(f"--input-shape {n}=..." for n in final.get("input_names", [])),
        )
    log = toolchains.keep_log(work, TOOLCHAIN)
    raise ConversionError(
        f"{converter} failed on {source.name}: {final['message']}" + (f" (toolchain log: {log})" if log else "")
    )


class TorchToCoreML(_CoreMLConverter):
    """A PyTorch source (TorchScript ``.pt``/``.ts``, or a ``torch.export`` ``.pt2``) straight to an ML Program.

    No bridge: the model itself runs in the toolchain on the parity samples (the reference kept for device
    parity), then the same ``ct.convert`` (float32 inputs declared explicitly) and spec checks as onnx->coreml.
    Input names come from the TorchScript forward signature (ExportedProgram: its user inputs) and must be
    the ``--input-shape`` names; outputs are named ``output_0``.. (torch models carry no output names).
    """

    name = "torch->coreml"
    source_format = "torchscript"

    # Input names are read once, by the source (edge.pipeline.sources via torch->onnx's inspect_only job).

    def convert(self, request: ConversionRequest) -> ConversionResult:
        from edge.graph.torchfile import torch_kind

        kind = torch_kind(request.source)
        run = self._drive(
            request,
            {"torch": str(Path(request.source).resolve()), "torch_kind": kind, "outputs": []},
            "reference_outputs",
        )
        ref, final = run.arrays, run.final
        reference = [{k: v[i] for k, v in ref.items()} for i in range(len(run.inputs))]
        source_of_names = "TorchScript forward signature" if kind == "torchscript" else "ExportedProgram user inputs"
        notes = run.notes(request.preprocess)
        notes.insert(
            1,
            f"input names come from the {source_of_names}; outputs are named output_0.. in the model's "
            "return order (torch models carry no output names)",
        )
        trace = "torch.jit.load" if kind == "torchscript" else "torch.export.load -> run_decompositions"
        details = run.details(
            f"PyTorch {kind} -> {trace} -> ML Program ({request.precision})",
            io_names={
                "inputs": list(final["input_names"]),
                "inputs_from": source_of_names,
                "outputs": [o["name"] for o in final["outputs"]],
                "outputs_from": "generated: torch models carry no output names (output_<i> in return order)",
            },
            torch_reference={
                "runtime": f"torch {final['tool_versions']['torch']} CPU fp32 ({kind})",
                "samples": len(run.inputs),
                "inputs": run.label,
                "seed": None if run.label == "calibration" else 1234,
                "outputs": [
                    {
                        "name": k,
                        "shape": list(v.shape[1:]),
                        "dtype": str(v.dtype),
                        "mean": float(v.mean()),
                        "std": float(v.std()),
                        "min": float(v.min()),
                        "max": float(v.max()),
                    }
                    for k, v in ref.items()
                ],
            },
        )
        return run.result(details, notes, reference=(run.inputs, reference))
