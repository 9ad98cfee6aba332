"""PyTorch -> ONNX: a TorchScript (``torch.jit.save``: ``.pt``/``.ts``) or ``torch.export`` (``.pt2``) source as an
fp32 ONNX graph, the input of every ONNX target's chain (precision is those steps' work).

Runs in the ``torch`` toolchain environment (torch 2.13 CPU + onnx; see :mod:`edge.toolchains`), driven by
``edge/toolchains/torch_onnx_driver.py``: the model is loaded there, run on the parity inputs (the bundle's
parity reference, as for ``torch->coreml``), exported with torch's TorchScript-based exporter (the driver's
docstring says why not the dynamo one), and the file is checked with ``onnx.checker`` (full check) and its
I/O compared with the request and the reference before it is handed on.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge import toolchains
from edge.backends.converter import ConversionRequest, ConversionResult, Converter
from edge.base.typedjson import spec
from edge.errors import ConversionError, MissingDependencyError, ModelError
from edge.graph.torchfile import RELOAD_HINT

TOOLCHAIN = "torch"
DRIVER = "torch_onnx"  # edge/toolchains/torch_onnx_driver.py
#: what every runtime edgekit targets reads (TensorRT 8.6, OpenVINO, onnx2tf, onnxruntime), and the quantizer
#: needs >= 13 (per-channel DequantizeLinear); 20 is the newest the TorchScript-based exporter writes
DEFAULT_OPSET = 17
OPSETS = range(13, 21)
PARITY_SAMPLES = 8
PARITY_SEED = 1234  # generated parity inputs: the same as torch->coreml's
EXPORTER = "torch.onnx.export, TorchScript-based exporter (dynamo=False)"


def parity_inputs(request: ConversionRequest) -> tuple[list[dict[str, np.ndarray]], str]:
    """The inputs the PyTorch model runs on for the reference: the user's calibration samples first, else
    inputs generated to match the pre-processing (the same rule and seed as torch->coreml)."""
    from edge.verify.inputs import generated_samples

    if request.calibration is not None and request.calibration.samples:
        return [dict(s) for s in request.calibration.samples[:PARITY_SAMPLES]], "calibration"
    return generated_samples(request.io, request.preprocess, PARITY_SAMPLES, seed=PARITY_SEED), "generated"


def _raise_driver_error(converter: str, final: dict[str, Any], work: Path, source: Path) -> None:
    kind = final.get("kind")
    if kind == "not_torch":
        raise ModelError(final["message"], hint=RELOAD_HINT)
    if kind == "inputs":
        raise ModelError(
            f"{source.name}: {final['message']}",
            hint="pass --input-shape NAME=1,3,224,224 for every input: "
            + " ".join(f"--input-shape {n}=..." for n in final.get("input_names", [])),
        )
    if kind == "arguments":  # forward()'s non-tensor arguments, or state it keeps between calls
        raise ModelError(f"{source.name}: {final['message']}", hint=final.get("hint") or None)
    if kind == "toolchain":
        raise MissingDependencyError(final["message"])
    log = toolchains.keep_log(work, TOOLCHAIN)
    where = f" (toolchain log: {log})" if log else ""
    if kind == "unsupported_op":
        raise ConversionError(
            f"{converter}: torch.onnx.export cannot export {source.name}: {final['message']}{where}",
            hint=f"try another opset (converter option opset, {OPSETS[0]}-{OPSETS[-1]}), or replace the op in the model before saving it",
        )
    raise ConversionError(f"{converter} failed on {source.name}: {final['message']}{where}")


@dataclass(frozen=True)
class TorchToOnnxOptions:
    """``torch->onnx``'s options, declared once (``edge.backends.options``)."""

    opset: int = spec(
        DEFAULT_OPSET,
        ge=OPSETS[0],
        le=OPSETS[-1],
        doc=f"ONNX opset to export ({OPSETS[0]}-{OPSETS[-1]}; default {DEFAULT_OPSET})",
    )
    timeout_s: float = spec(900.0, ge=1.0, le=7 * 86400, doc="stop the toolchain after this many seconds (default 900)")


class TorchToOnnx(Converter):
    """A PyTorch source to an fp32 ONNX graph, with the PyTorch model's outputs as the parity reference.

    Inputs: ``request.io.inputs`` names and static shapes (``--input-shape``), the model's forward-signature
    names (ExportedProgram: its user inputs), in any order; the ONNX graph takes them in the model's order.
    Outputs are named ``output_0``.. in the model's return order (torch models carry no output names).
    """

    name = "torch->onnx"
    source_format = "torchscript"  # TorchScript and ExportedProgram files alike (edge.pipeline.sources.TORCH_FORMAT)
    target_format = "onnx"
    precisions = frozenset({"fp32"})
    toolchain = TOOLCHAIN
    options_class = TorchToOnnxOptions  # ``options`` (names and descriptions) derive from it
    takes_freeze = True  # forward()'s int/float/bool arguments: passed to the model, constants in the graph

    @classmethod
    def input_names(cls, source: Path, timeout_s: float = 300) -> list[str]:
        """The model's input names in order, read in the toolchain (TorchScript signature / ExportedProgram)."""
        from edge.graph.torchfile import torch_kind

        kind = torch_kind(source)
        toolchains.require(TOOLCHAIN, f"converter {cls.name!r}")
        with tempfile.TemporaryDirectory(prefix="edgekit-torch-onnx-") as tmp:
            job = {"torch": str(Path(source).resolve()), "torch_kind": kind, "workdir": tmp, "inspect_only": True}
            final, _ = toolchains.run_driver(TOOLCHAIN, job, Path(tmp), timeout_s=timeout_s, driver=DRIVER)
            if final["event"] == "error":
                _raise_driver_error(cls.name, final, Path(tmp), Path(source))
            return list(final["input_names"])

    def _check_input_shapes(self, request: ConversionRequest, source: Path) -> None:
        """Every input needs a static shape from the request: a PyTorch model carries none (the error lists the
        model's input names, read by the toolchain)."""
        if not request.io.inputs:
            names = self.input_names(source)
            raise ModelError(
                f"{source}: a PyTorch model carries no input shapes; pass --input-shape for every input "
                f"({', '.join(names) or 'none found'})",
                hint=" ".join(f"--input-shape {n}=1,3,224,224" for n in names) or None,
            )
        bad = [f"{t.name}={list(t.shape)}" for t in request.io.inputs if not t.is_static]
        if bad:
            raise ModelError(f"{source}: --input-shape needs positive static dims: {', '.join(bad)}")

    def convert(self, request: ConversionRequest) -> ConversionResult:
        from edge.graph.torchfile import torch_kind

        opts: TorchToOnnxOptions = self.read_options(request.options)
        self.check_precision(request.precision)
        opset, timeout_s = opts.opset, opts.timeout_s
        source = Path(request.source)
        kind = torch_kind(source)  # a torch.save checkpoint or a non-zip file stops here, saying what to do
        self._check_input_shapes(request, source)
        st = toolchains.require(TOOLCHAIN, f"converter {self.name!r}")
        inputs, label = parity_inputs(request)
        t_start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="edgekit-torch-onnx-") as tmp:
            work = Path(tmp)
            job = _driver_job(request, work, source, kind, opset, inputs)
            final, st = toolchains.run_driver(TOOLCHAIN, job, work, timeout_s=timeout_s, driver=DRIVER)
            if final["event"] == "error":
                _raise_driver_error(self.name, final, work, source)
            if final["io_problems"]:
                raise ConversionError(
                    f"{self.name}: the exported ONNX graph does not have the model's I/O: "
                    + "; ".join(final["io_problems"]),
                    hint="a model whose output shape depends on the input values cannot be exported with static shapes",
                )
            with np.load(final["reference_outputs"]) as data:
                ref = {k: data[k] for k in data.files}
            files = _move_files(final, work, request.workdir)
        artifact = request.workdir / "model.onnx"
        reference = [{k: v[i] for k, v in ref.items()} for i in range(len(inputs))]
        source_of_names = "TorchScript forward signature" if kind == "torchscript" else "ExportedProgram user inputs"
        load = "torch.jit.load" if kind == "torchscript" else "torch.export.load -> module()"
        notes = _notes(final, source_of_names)
        details = {
            "recipe": f"PyTorch {kind} -> {load} -> {EXPORTER}, opset {final['opset']} (fp32)",
            "toolchain": st.manifest_record(),
            "exporter": EXPORTER,
            "opset": final["opset"],
            "onnx_check": {
                "checker": "onnx.checker.check_model(full_check=True)",
                "passed": True,
                "ir_version": final["ir_version"],
                "producer": final["producer"],
                "io": final["io"],
                "io_matches_request": True,
            },
            "ops": final["ops"],
            "export_warnings": final["export_warnings"],
            "io_names": {
                "inputs": list(final["input_names"]),
                "inputs_from": source_of_names,
                "outputs": [o["name"] for o in final["outputs"]],
                "outputs_from": "generated: torch models carry no output names (output_<i> in return order)",
            },
            "torch_reference": _torch_reference(final, ref, kind, len(inputs), label),
            "frozen": final.get("frozen") or [],  # --freeze-input: the arguments given a value, and the value
            "timings_s": {**final["timings"], "total": round(time.perf_counter() - t_start, 2)},
        }
        tool_versions = {**final["tool_versions"], "toolchain": f"{TOOLCHAIN} (lock {(st.lock_hash or '?')[:12]})"}
        return ConversionResult(
            artifact=artifact,
            format="onnx",
            files=files,
            tool_versions=tool_versions,
            details=details,
            notes=notes,
            reference=(inputs, reference),
        )


def _driver_job(
    request: ConversionRequest, work: Path, source: Path, kind: str, opset: int, inputs: list[dict[str, Any]]
) -> dict[str, Any]:
    """The export driver's job: writes the parity samples to ``samples.npz`` in ``work`` and returns the job."""
    names = [t.name for t in request.io.inputs]
    arrays: dict[str, Any] = {
        n: np.stack([s[n] for s in inputs]) for n in names
    }  # numpy's savez stub takes **arrays as allow_pickle too
    np.savez(work / "samples.npz", **arrays)
    job = {
        "torch": str(source.resolve()),
        "torch_kind": kind,
        "workdir": str(work),
        "opset": opset,
        "samples": str(work / "samples.npz"),
        "inputs": [{"name": t.name, "shape": [int(d) for d in t.shape], "dtype": t.dtype} for t in request.io.inputs],
        "freeze": dict(request.freeze),
    }
    return job


def _move_files(final: dict[str, Any], work: Path, workdir: Path) -> list[Path]:
    """Move the exported files out of the toolchain's work directory into the request's, keeping their layout."""
    files = []
    for f in final["files"]:  # model.onnx, plus external data files for models over 2 GB
        dest = workdir / Path(f).relative_to(work / "onnx")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(f, dest)
        files.append(dest)
    return files


def _notes(final: dict[str, Any], source_of_names: str) -> list[str]:
    """Where the I/O names come from, and what the exporter warned."""
    notes = [
        (
            f"input names come from the {source_of_names}; outputs are named output_0.. in the model's return "
            "order (torch models carry no output names)"
        )
    ]
    if final["export_warnings"]:
        notes.append("torch.onnx.export warned: " + " | ".join(final["export_warnings"]))
    return notes


def _torch_reference(final: dict[str, Any], ref: dict[str, Any], kind: str, samples: int, label: str) -> dict[str, Any]:
    """The ``torch_reference`` detail: the torch run the parity reference came from and its outputs' statistics."""
    return {
        "runtime": f"torch {final['tool_versions']['torch']} CPU fp32 ({kind})",
        "samples": samples,
        "inputs": label,
        "seed": None if label == "calibration" else PARITY_SEED,
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
    }
