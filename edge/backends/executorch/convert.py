"""A PyTorch ``torch.export`` program -> ExecuTorch ``.pte`` with the XNNPack delegate (in the ``executorch``
toolchain), and ExecuTorch's own runtime on this host for parity.

The toolchain (``edgekit toolchain install executorch``: executorch 1.5.1 beside the CPU torch 2.13.0) is driven
by ``edge/toolchains/executorch_driver.py``: ``torch.export.load`` -> the program itself on the parity samples (the
reference) -> ``to_edge_transform_and_lower`` with ``XnnpackPartitioner`` -> ``to_executorch()`` -> ``model.pte``,
then ``executorch.runtime`` runs that very file on the same samples. Those outputs are the bundle's host proxy
(:class:`~edge.backends.converter.HostProxy`): ExecuTorch's x86 kernels on this host, labelled as such
(:data:`~edge.backends.executorch.format.HOST_RUNTIME_LABEL`); where the ``executorch`` runner itself runs here
(``pip install 'edgekit-ml[executorch]'``) it is the candidate instead. The device's aarch64 kernels are checked
by ``edgekit verify BUNDLE --isa aarch64``.

Only a ``torch.export`` program (``.pt2``, ``torch.export.save``) can be lowered: a TorchScript archive is refused
before any work (:meth:`TorchToExecuTorch.source_problem`), and so is an ONNX source (its chain reads PyTorch only:
no kept library turns ONNX back into a torch.export program faithfully).
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
from edge.backends.converter import ConversionRequest, ConversionResult, Converter, HostProxy
from edge.backends.executorch.format import ARTIFACT_NAME, BACKEND, FORMAT, HOST_RUNTIME_LABEL, TOOLCHAIN, write_io
from edge.backends.iosidecar import IO_SIDECAR
from edge.base.typedjson import spec
from edge.errors import ConversionError, ModelError
from edge.graph.torchfile import torch_kind
from edge.spec import TensorSpec
from edge.toolchains.state import ToolchainStatus

#: the parity samples the driver runs (calibration samples first, as the other converters' proxies do)
_PARITY_SAMPLES = 8
#: what to bring instead of a TorchScript archive or an ONNX file, in every refusal
BRING = (
    "bring the PyTorch model as a torch.export program: "
    "torch.export.save(torch.export.export(model.eval(), example_inputs), 'model.pt2')"
)


@dataclass(frozen=True)
class ExecuTorchConvertOptions:
    """torch->executorch's options, declared once (``edge.backends.options``)."""

    timeout_s: float = spec(900.0, ge=1, le=86400, doc="stop the toolchain after this many seconds (default 900)")


class TorchToExecuTorch(Converter):
    name = "torch->executorch"
    source_format = "torchscript"  # edgekit's format for PyTorch files (TorchScript and torch.export alike)
    target_format = FORMAT
    precisions = frozenset({"fp32"})
    toolchain = TOOLCHAIN
    options_class = ExecuTorchConvertOptions
    brings = BRING

    @classmethod
    def source_problem(cls, path: Path) -> ModelError | None:
        """A TorchScript archive cannot be lowered (ExecuTorch takes a torch.export program, and a scripted or traced
        module cannot be exported again): the one-line refusal, before the toolchain is needed."""
        if torch_kind(path) == "torchscript":
            return ModelError(
                f"{Path(path).name} is a TorchScript archive; ExecuTorch lowers a torch.export program, and a "
                "TorchScript module cannot be exported again",
                hint=BRING,
            )
        return None

    def convert(self, request: ConversionRequest) -> ConversionResult:
        opts: ExecuTorchConvertOptions = self.read_options(request.options)
        self.check_precision(request.precision)
        refused = self.source_problem(request.source)
        if refused is not None:
            raise refused
        st = toolchains.require(TOOLCHAIN, f"converter {self.name!r}")
        inputs, label = _parity_inputs(request)
        t_start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="edgekit-executorch-") as tmp:
            work = Path(tmp)
            job = _job(request, work, inputs)
            final, st = toolchains.run_driver(TOOLCHAIN, job, work, timeout_s=opts.timeout_s)
            if final["event"] == "error":
                _raise_driver_error(self.name, final, work, request.source)
            reference, got = (_per_sample(final[k], len(inputs)) for k in ("reference_outputs", "runtime_outputs"))
            artifact = request.workdir / ARTIFACT_NAME
            shutil.move(final["artifact"], artifact)
        names = list(final["input_names"])
        by_name = {t.name: t for t in request.io.inputs}
        outputs = tuple(TensorSpec(o["name"], tuple(o["shape"]), "float32") for o in final["outputs"])
        versions = final["tool_versions"]
        sidecar = write_io(
            request.workdir / IO_SIDECAR,
            tuple(by_name[n] for n in names),
            outputs,
            executorch=versions["executorch"],
            delegate=BACKEND,
        )
        proxy = HostProxy(
            label=f"{HOST_RUNTIME_LABEL}: executorch {versions['executorch']}",
            precision_used="f32",
            inputs=inputs,
            outputs=got,
            inputs_from=label,
            device_used="CPU (XNNPack delegate, x86-64)",
        )
        return ConversionResult(
            artifact=artifact,
            format=FORMAT,
            files=[artifact, sidecar],
            tool_versions={**versions, "toolchain": f"{TOOLCHAIN} (lock {(st.lock_hash or '?')[:12]})"},
            details=_details(final, st, inputs, label, t_start),
            notes=[
                "lowered with ExecuTorch's XnnpackPartitioner: "
                + _delegation_note(final["delegation"])
                + "; host parity ran the .pte on ExecuTorch's x86 runtime (edgekit verify --isa aarch64 runs it on "
                "the device's instruction set, emulated)",
                "input names are the torch.export program's user inputs; outputs are named output_0.. in its return "
                "order (torch models carry no output names)",
            ],
            reference=(inputs, reference),
            proxy=proxy,
        )


def _details(
    final: dict[str, Any], st: ToolchainStatus, inputs: list[Any], label: str, t_start: float
) -> dict[str, Any]:
    return {
        "recipe": "torch.export program -> to_edge_transform_and_lower(XnnpackPartitioner) -> to_executorch (fp32)",
        "delegation": final["delegation"],
        "pte_bytes": final["bytes"],
        "toolchain": st.manifest_record(),
        "host_runtime": {"label": HOST_RUNTIME_LABEL, "samples": len(inputs), "inputs": label},
        "torch_reference": {
            "runtime": f"torch {final['tool_versions']['torch']} CPU fp32 (the torch.export program's module)",
            "samples": len(inputs),
            "inputs": label,
        },
        "timings_s": {**final["timings"], "total": round(time.perf_counter() - t_start, 2)},
    }


def _delegation_note(d: dict[str, Any]) -> str:
    left = d.get("left_to_portable_kernels") or {}
    head = f"{d['delegated_nodes']} nodes in {d['delegated_subgraphs']} XNNPack subgraph(s)"
    if not left:
        return head + ", nothing left to the portable kernels"
    return head + "; left to ExecuTorch's portable kernels: " + ", ".join(f"{k} x{v}" for k, v in left.items())


def _per_sample(path: str, count: int) -> list[dict[str, Any]]:
    with np.load(path) as data:
        stacked = {k: data[k] for k in data.files}
    return [{k: v[i] for k, v in stacked.items()} for i in range(count)]


def _raise_driver_error(converter: str, final: dict[str, Any], work: Path, source: Path) -> None:
    log = toolchains.keep_log(work, TOOLCHAIN)
    kind = final.get("kind")
    raise (ModelError if kind in ("inputs", "load") else ConversionError)(
        f"{converter} failed on {source.name}: {final['message']}" + (f" (toolchain log: {log})" if log else ""),
        hint=(
            "pass --input-shape NAME=... for each of the model's inputs"
            if kind == "inputs"
            else BRING
            if kind == "load"
            else "an op ExecuTorch cannot lower: report it with the model, or choose another target"
        ),
    )


def _parity_inputs(request: ConversionRequest) -> tuple[list[dict[str, np.ndarray]], str]:
    """The inputs the reference and the runtime run: calibration samples, else the user's or generated ones."""
    from edge.verify.inputs import generated_samples

    if request.calibration is not None and request.calibration.samples:
        given = request.calibration.samples[:_PARITY_SAMPLES]
        return [{k: np.asarray(v, dtype=np.float32) for k, v in s.items()} for s in given], "calibration"
    return generated_samples(request.io, request.preprocess, _PARITY_SAMPLES, seed=1234), "generated"


def _job(request: ConversionRequest, work: Path, inputs: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    """The driver's job; the parity samples written beside it as .npz (stacked per input)."""
    names = [t.name for t in request.io.inputs]
    samples: dict[str, Any] = {n: np.stack([s[n] for s in inputs]) for n in names}  # savez types **arrays as bool
    np.savez(work / "samples.npz", **samples)
    return {
        "workdir": str(work),
        "torch": str(Path(request.source).resolve()),
        "inputs": [{"name": t.name, "shape": [int(d) for d in t.shape]} for t in request.io.inputs],
        "samples": str(work / "samples.npz"),
    }
