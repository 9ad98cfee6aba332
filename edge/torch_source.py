"""``convert`` for PyTorch sources: a TorchScript (``torch.jit.save``) or ``torch.export.save`` (``.pt2``) file.

Only targets with a converter reading ``torchscript`` into their final format take them (apple-ane:
``torch->coreml``); the others need ONNX. Torch files carry no static input shapes, so every input
needs ``--input-shape`` (the names are read from the model in the converter's toolchain when they
are missing); outputs are named ``output_0``... The reference for parity is the PyTorch model
itself, run in the toolchain on the parity inputs.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from edge.manifest import new_manifest, record_gate
from edge.bundle import (
    MANIFEST,
    Bundle,
    staging_dir,
    write_json_atomic,
)
from edge.capabilities import current_host
from edge.backends.converter import CONVERTERS, ConversionRequest, Converter
from edge.errors import (
    MissingDependencyError,
    ModelError,
    PrecisionError,
    TargetError,
)
from edge.spec import IOSpec, TensorSpec, default_preprocess, image_layout
from edge.targets import TargetProfile

SOURCE_FORMAT = "torchscript"  # the converters' source format (TorchScript and ExportedProgram files alike)
TORCH_SUFFIXES = (".pt", ".ts", ".pt2")
NOT_HERE = "PyTorch sources convert for apple-ane only; export to ONNX for other targets"


def _zip_names(path: Path) -> list[str] | None:
    try:
        with zipfile.ZipFile(path) as z:
            return z.namelist()
    except (OSError, zipfile.BadZipFile):
        return None


def _is_exported_program(names: Sequence[str]) -> bool:
    return any(n.endswith(("/archive_format", "serialized_exported_program.json")) or "/models/" in n for n in names)


def _is_torchscript(names: Sequence[str]) -> bool:
    return any("/code/" in n for n in names) and any(n.endswith("/constants.pkl") for n in names)


def is_torch_source(path: str | os.PathLike[str]) -> bool:
    """A ``.pt``/``.ts``/``.pt2`` file, or any zip archive written by torch.jit.save / torch.export.save."""
    p = Path(path)
    if p.suffix.lower() in TORCH_SUFFIXES:
        return True
    if not p.is_file():
        return False
    try:
        with open(p, "rb") as f:
            if f.read(4) != b"PK\x03\x04":
                return False
    except OSError:
        return False
    names = _zip_names(p)
    return bool(names) and (_is_torchscript(names) or _is_exported_program(names))


def torch_kind(path: str | os.PathLike[str]) -> str:
    """``torchscript`` or ``exported_program``; a ModelError for anything else (with what to do instead)."""
    p = Path(path)
    if not p.is_file():
        raise ModelError(f"{p}: no such file")
    names = _zip_names(p)
    if names is None:
        raise ModelError(f"{p.name} is not a TorchScript or ExportedProgram file (not a zip archive)",
                         hint="save the model with torch.jit.save (after torch.jit.trace/script) or torch.export.save")
    if _is_exported_program(names):
        return "exported_program"
    if _is_torchscript(names):
        return "torchscript"
    raise ModelError(f"{p.name} is not TorchScript: it looks like a torch.save checkpoint (weights/pickled module, "
                     "no graph)", hint="load it in PyTorch, then torch.jit.save(torch.jit.trace(model, example)) "
                                       "or torch.export.save(torch.export.export(model, example))")


def torch_converter(profile: TargetProfile) -> type[Converter]:
    """The converter reading PyTorch sources into ``profile``'s final format; TargetError when it has none."""
    final = CONVERTERS.get(profile.chain[-1].converter).target_format if profile.chain else None
    for name in CONVERTERS.names():
        cls = CONVERTERS.get(name)
        if cls.source_format == SOURCE_FORMAT and cls.target_format == final:
            return cls
    raise TargetError(f"{NOT_HERE} ({profile.name} needs {final or 'its own format'})",
                      hint="torch.onnx.export(model, example, 'model.onnx'), then edgekit convert model.onnx")


def convert_torch(model: str | os.PathLike[str], profile: TargetProfile, output: str | os.PathLike[str], *,
                  precision: str | None = None, calib: str | os.PathLike[str] | None = None,
                  input_shapes: Mapping[str, Sequence[int]] | None = None, preprocess: str = "imagenet",
                  letterbox: bool | None = None, accept_parity_failure: bool = False, force: bool = False,
                  on_step: Callable[[str], None] | None = None) -> Bundle:
    from edge.convert import runnable_here

    say = on_step or (lambda _m: None)
    src = Path(model)
    conv = torch_converter(profile)
    kind = torch_kind(src)
    precision = profile.check_precision(precision or profile.default_precision)
    if precision not in conv.precisions:
        raise PrecisionError(f"converter {conv.name!r} cannot produce {precision!r} "
                             f"(it supports {', '.join(sorted(conv.precisions))})")
    host = current_host()
    missing = [] if profile.convert_place.allows(host) else [
        f"conversion for {profile.name} runs on {'/'.join(profile.convert_place.os)}; this host is {host.os}/{host.arch}"]
    missing += [f"{conv.name}: {p}" for p in conv.problems(host)]
    if missing:
        raise MissingDependencyError(f"cannot convert for {profile.name} on this host: " + "; ".join(missing))
    options = dict(profile.convert_options.get(conv.name)
                   or {k: v for k, v in profile.convert_options.get(profile.chain[-1].converter, {}).items()
                       if k in conv.options})
    conv.check_options(options)
    shapes = {k: tuple(int(d) for d in v) for k, v in (input_shapes or {}).items()}
    if not shapes:
        say(f"reading the input names of {src.name}")
        names = conv.input_names(src)  # type: ignore[attr-defined]
        raise ModelError(f"{src}: a PyTorch model carries no input shapes; pass --input-shape for every input "
                         f"({', '.join(names) or 'none found'})",
                         hint=" ".join(f"--input-shape {n}=1,3,224,224" for n in names) or None)
    bad = [f"{k}={list(v)}" for k, v in shapes.items() if not v or any(d <= 0 for d in v)]
    if bad:
        raise ModelError(f"{src}: --input-shape needs positive dims: {', '.join(bad)}")
    io = IOSpec(tuple(TensorSpec(k, v, "float32", image_layout(v)) for k, v in shapes.items()), ())
    pre = None if preprocess == "none" else default_preprocess(io, preprocess, letterbox=letterbox)
    calibration = None
    if calib is not None:
        from edge.calib import load_calibration

        say(f"loading calibration data from {calib}")
        calibration = load_calibration(calib, io, pre)
    run_here = runnable_here(profile)
    with staging_dir(Path(output), force=force) as stage:
        say(f"converting with {conv.name} ({precision}); the PyTorch model runs as the reference")
        result = conv().convert(ConversionRequest(source=src, workdir=stage, precision=precision, io=io,
                                                  preprocess=pre, calibration=calibration, options=options))
        assert result.reference is not None
        parity_inputs, reference = result.reference
        by_name = {t.name: t for t in io.inputs}
        order = result.details["io_names"]["inputs"]
        io = IOSpec(tuple(by_name[n] for n in order),
                    tuple(TensorSpec(k, tuple(int(d) for d in v.shape), str(v.dtype)) for k, v in reference[0].items()))
        chain_record = [{"converter": conv.name, "precision": precision, "output_format": result.format,
                         "tool_versions": result.tool_versions, "details": result.details, "notes": result.notes}]
        manifest = new_manifest(
            source=src, profile=profile, precision=precision, stage=stage, primary=result.artifact, chain=chain_record,
            source_info={"format": "torchscript" if kind == "torchscript" else "torch-exported-program",
                         "io_names": "inputs from the model's signature (--input-shape names); outputs output_0.. "
                                     "(torch models carry no output names)"},
            io=io, runner=profile.runner, runner_options=profile.runtime_options, calibration=calibration,
            preprocess=pre, frame_budget_ms=profile.frame_budget_ms)
        label = "calibration" if calibration is not None and calibration.samples else "generated"
        if run_here is None:
            from edge.parity import ParityReport, compare, thresholds_for

            say(f"checking parity on {len(parity_inputs)} {label} inputs against the PyTorch model")
            with Bundle(stage, manifest).open_runner() as runner:
                cand = [runner.infer(s) for s in parity_inputs]
                report = ParityReport(precision=precision, thresholds=thresholds_for(precision, runner.info.precision_used),
                                      samples=len(parity_inputs), inputs=label,
                                      reference=result.details["torch_reference"]["runtime"],
                                      candidate=runner.info.to_json(),
                                      outputs=compare(reference, cand, thresholds_for(precision, runner.info.precision_used)))
            record_gate(manifest, report, failed=f"parity failed for {profile.name} {precision}",
                        accept=accept_parity_failure)
        else:
            manifest["parity"] = {"passed": None, "skipped": f"runner cannot run on this host: {run_here}",
                                  "reference": "the PyTorch model on the parity inputs: summary in "
                                               "chain[0].details.torch_reference"}
        write_json_atomic(stage / MANIFEST, manifest)
    return Bundle.open(output, trust=False)  # just built here: unsigned until `edgekit sign`
