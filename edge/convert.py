"""``convert``: source model -> verified bundle for a target.

plan (every missing piece reported before work starts) -> static source -> calibration ->
converter chain -> parity against onnxruntime fp32 -> bundle renamed into place.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import edge
from edge.bundle import MANIFEST, Bundle, staging_dir, write_json_atomic
from edge.manifest import new_manifest, record_gate
from edge.calib import RANDOM, generated_samples, load_calibration
from edge.capabilities import Host, current_host, problems
from edge.backends.converter import CONVERTERS, ConversionRequest, Converter
from edge.errors import CalibrationError, EdgeError, MissingDependencyError, PrecisionError, UnknownBackendError
from edge.onnxmodel import io_spec, load_onnx, make_static, opset_of, resolve_static_inputs, save_onnx
from edge.parity import check_parity
from edge.backends.runner import RUNNERS
from edge.spec import IOSpec, TensorSpec, default_preprocess
from edge.targets import TargetProfile, get_target

Step = Callable[[str], None]


@dataclass(frozen=True)
class PlannedStep:
    converter: type[Converter]
    precision: str
    options: Mapping[str, Any]


@dataclass(frozen=True)
class Plan:
    target: TargetProfile
    precision: str
    steps: tuple[PlannedStep, ...]
    needs_calibration: bool
    run_here: str | None  # None when this host can run the runner, else why not


def conversion_problems(target: TargetProfile, host: Host | None = None) -> list[str]:
    """Everything that stops this host from running ``target``'s converter chain (empty: it can)."""
    host = host or current_host()
    found: list[str] = []
    if not target.convert_place.allows(host):
        found.append(f"conversion for {target.name} runs on {'/'.join(target.convert_place.os)} "
                     f"{'/'.join(target.convert_place.arch)}; this host is {host.os}/{host.arch}")
    for s in target.chain:
        try:
            cls = CONVERTERS.get(s.converter)
        except UnknownBackendError:
            found.append(f"converter {s.converter!r} is not in edgekit {edge.__version__} "
                         f"(installed: {', '.join(CONVERTERS.names())})")
            continue
        found += [f"{cls.name}: {p}" for p in cls.problems(host)]
    return found


def plan(target: TargetProfile, precision: str | None = None, *, source_format: str = "onnx") -> Plan:
    """Resolve the chain and check every requirement up front; all problems in one error."""
    precision = target.check_precision(precision or target.default_precision)
    missing = conversion_problems(target)
    if missing:
        raise MissingDependencyError(f"cannot convert for {target.name} on this host: " + "; ".join(missing))
    steps: list[PlannedStep] = []
    fmt = source_format
    for s in target.chain:
        cls = CONVERTERS.get(s.converter)
        step_precision = s.precision or precision
        if step_precision not in cls.precisions:
            raise PrecisionError(f"converter {cls.name!r} cannot produce {step_precision!r} "
                                 f"(it supports {', '.join(sorted(cls.precisions))})")
        if cls.source_format != fmt:
            raise EdgeError(f"target {target.name}: converter {cls.name!r} reads {cls.source_format}, "
                            f"but the previous step produces {fmt}")
        fmt = cls.target_format
        options = target.convert_options.get(s.converter, {})
        cls.check_options(options)
        steps.append(PlannedStep(cls, step_precision, options))
    needs_calib = any(st.precision in st.converter.calibrated_precisions for st in steps)
    return Plan(target, precision, tuple(steps), needs_calib, runnable_here(target))


def runnable_here(target: TargetProfile, host: Host | None = None) -> str | None:
    """None when this host can run the target's runner (possibly on a fallback device), else every reason."""
    host = host or current_host()
    found: list[str] = []
    if not target.run_place.allows(host):
        found.append(f"{target.name} runs on {'/'.join(target.run_place.os)} {'/'.join(target.run_place.arch)}, "
                     f"this host is {host.os}/{host.arch}")
    if target.run_place.needs_gpu and not host.nvidia_gpu:
        found.append("needs an NVIDIA GPU, this host has none")
    if target.run_place.needs_device:
        found.append(f"needs the device's accelerator ({target.accelerator})")
    try:
        found += problems(RUNNERS.get(target.runner).requires, host)
    except UnknownBackendError:
        found.append(f"runner {target.runner!r} is not in edgekit {edge.__version__}")
    return "; ".join(found) if found else None


def convert(model: str | os.PathLike[str], target: str | TargetProfile, output: str | os.PathLike[str], *,
            precision: str | None = None, calib: str | os.PathLike[str] | None = None,
            input_shapes: Mapping[str, Sequence[int]] | None = None, preprocess: str = "imagenet",
            letterbox: bool | None = None, targets_dir: Iterable[str | os.PathLike[str]] = (),
            accept_parity_failure: bool = False, parity_samples: int = 32, force: bool = False,
            on_step: Step | None = None) -> Bundle:
    """Convert ``model`` for ``target`` into a verified bundle at ``output``."""
    say = on_step or (lambda _msg: None)
    profile = target if isinstance(target, TargetProfile) else get_target(target, targets_dir)
    from edge.llm.convert import convert_gguf, is_gguf

    if is_gguf(model):
        return convert_gguf(model, profile, output, precision=precision, accept_parity_failure=accept_parity_failure,
                            force=force, on_step=on_step)
    from edge.torch_source import convert_torch, is_torch_source

    if is_torch_source(model):
        return convert_torch(model, profile, output, precision=precision, calib=calib, input_shapes=input_shapes,
                             preprocess=preprocess, letterbox=letterbox, accept_parity_failure=accept_parity_failure,
                             force=force, on_step=on_step)
    p = plan(profile, precision)
    src = Path(model)
    say(f"reading {src}")
    onnx_model = load_onnx(src)
    io = resolve_static_inputs(io_spec(onnx_model), {k: tuple(v) for k, v in (input_shapes or {}).items()}, src)
    pre = None if preprocess == "none" else default_preprocess(io, preprocess, letterbox=letterbox)

    calibration = None
    if calib is not None:
        say(f"loading calibration data from {calib}")
        calibration = load_calibration(calib, io, pre)
    elif p.needs_calibration:
        raise CalibrationError(f"{p.precision} for {profile.name} needs calibration data",
                               hint=f"pass --calib DIR (.npy/.npz tensors or images), or --calib {RANDOM} "
                                    "to quantize on generated inputs (recorded as such in the manifest)")

    with tempfile.TemporaryDirectory(prefix="edgekit-convert-") as tmp, staging_dir(Path(output), force=force) as stage:
        work = Path(tmp)
        static_src = save_onnx(make_static(onnx_model, io), work / "source.static.onnx")
        if calibration is not None and calibration.samples:
            parity_inputs, label = [dict(s) for s in calibration.samples[:parity_samples]], f"calibration ({calibration.kind})"
        else:
            parity_inputs, label = generated_samples(io, pre, parity_samples, seed=1234), "generated"
        from edge.parity import reference_outputs

        say("running the source model in onnxruntime fp32 (reference)")
        reference = reference_outputs(static_src, parity_inputs)
        io = IOSpec(io.inputs, tuple(TensorSpec(t.name, tuple(reference[0][t.name].shape), str(reference[0][t.name].dtype))
                                     for t in io.outputs))

        current, chain_record = static_src, []
        for i, step in enumerate(p.steps):
            say(f"converting with {step.converter.name} ({step.precision})")
            last = i == len(p.steps) - 1
            out_dir = stage if last else work / f"step{i}"
            out_dir.mkdir(exist_ok=True)
            result = step.converter().convert(ConversionRequest(
                source=current, workdir=out_dir, precision=step.precision, io=io, preprocess=pre,
                calibration=calibration, options=step.options))
            chain_record.append({"converter": step.converter.name, "precision": step.precision,
                                 "output_format": result.format, "tool_versions": result.tool_versions,
                                 "details": result.details, "notes": result.notes})
            current = result.artifact
        manifest = new_manifest(
            source=src, profile=profile, precision=p.precision, stage=stage, primary=current, chain=chain_record,
            source_info={"format": "onnx", "opset": opset_of(onnx_model),
                         "producer": f"{onnx_model.producer_name} {onnx_model.producer_version}".strip()},
            io=io, runner=profile.runner, runner_options=profile.runtime_options, calibration=calibration,
            preprocess=pre, frame_budget_ms=profile.frame_budget_ms)
        if p.run_here is None:
            say(f"checking parity on {len(parity_inputs)} {label} inputs")
            with Bundle(stage, manifest).open_runner() as runner:
                report = check_parity(static_src, runner, parity_inputs, p.precision, label, reference)
            record_gate(manifest, report, failed=f"parity failed for {profile.name} {p.precision}",
                        accept=accept_parity_failure)
        else:
            manifest["parity"] = {"passed": None, "skipped": f"runner cannot run on this host: {p.run_here}"}
        write_json_atomic(stage / MANIFEST, manifest)
    return Bundle.open(output, trust=False)  # just built here: unsigned until `edgekit sign`
