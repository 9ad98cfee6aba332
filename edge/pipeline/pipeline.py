"""``convert``: any source model -> a verified bundle for a target. The one conversion pipeline.

source adapter (what the file is, its I/O, its reference runtime) -> plan (every missing piece
reported before work starts) -> calibration -> the planned converter chain (possibly none: the
source ships as it is) -> reference pairs for the device -> manifest -> one parity gate -> bundle
renamed into place. GGUF language models take the same route with llama.cpp's quality gate.

Parity runs where this host can: the bundle's own runner; else a host proxy that computes what
the device will be given (TensorRT: onnxruntime on the prepared ONNX; an accelerator that is not
here: the runner's CPU fallback on the same int8 model), named as such in the report; else it is
recorded as unverified with the reason, and the device checks the bundle's reference pairs on
first load.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from edge.backends.converter import ConversionRequest
from edge.base.typedjson import write_json_atomic
from edge.bundle.bundle import MANIFEST, Bundle, staging_dir
from edge.bundle.fields import fit_notes
from edge.bundle.manifest import ManifestSpec, new_manifest, record_gate
from edge.errors import CalibrationError, ConversionError, InputFileError, ParityError, PrecisionError, TargetError
from edge.pipeline.declared import request_preprocess
from edge.pipeline.gguf import convert_llm
from edge.pipeline.plan import Plan, Step, plan, source_problem
from edge.pipeline.precision_trial import skip_xnnpack_fp16, try_fast_precision
from edge.pipeline.request import ConvertRequest
from edge.pipeline.sources import GGUFSource, OnnxSource, OpenVINOSource, Source, TFLiteSource, TorchSource, open_source
from edge.spec import IOSpec, TensorSpec
from edge.targets import TargetProfile, get_target
from edge.verify.gates import SKIP_NO_REFERENCE, SKIP_RUNNER_NOT_HERE
from edge.verify.inputs import CALIB_FLAG, RANDOM, choose_parity_inputs, default_calibration, load_calibration

#: what the bundle carries for the device to check on first load
REFERENCE_PAIRS = 16


def convert(
    model: str | os.PathLike[str],
    target: str | TargetProfile,
    output: str | os.PathLike[str],
    request: ConvertRequest | None = None,
    *,
    force: bool = False,
    on_step: Step | None = None,
) -> Bundle:
    """Convert ``model`` (ONNX, TFLite, OpenVINO IR, TorchScript / torch.export, GGUF) for ``target``
    into a verified bundle at ``output``, as ``request`` (``edge.pipeline.request.ConvertRequest``) asks.
    ``request.eval_text``: a GGUF's quality gate evaluates this text file instead of the built-in multilingual
    text (``edge.llm.evaltext``). ``request.tuned``: an ``edgekit tune`` overlay applied to the target: runner,
    chain, precision, options. ``request.freeze``: ONNX inputs fixed to values (``edge.graph.freeze``): they
    leave the bundle's inputs, and every If they decide (with the static shapes) is inlined, checked against the
    source first. ``force``: replace an existing bundle at ``output``."""
    say = on_step or (lambda _msg: None)
    req = request if request is not None else ConvertRequest()
    profile = target if isinstance(target, TargetProfile) else get_target(target, req.targets_dir)
    profile, req, tuned_record = _apply_tuned(profile, req, say)
    src = open_source(model)
    _check_source(src, profile, req)
    if isinstance(src, GGUFSource):
        return convert_llm(src, profile, Path(output), req, force=force, say=say)
    job = _prepare(src, profile, req, say)
    with tempfile.TemporaryDirectory(prefix="edgekit-convert-") as tmp, staging_dir(Path(output), force=force) as stage:
        work = Path(tmp)
        static = job.src.static_file(work, job.io)
        job.static = static
        _choose_parity_inputs(job, static)
        current = _run_chain(job, static, work, stage)
        fmt = None
        if job.plan.ships_source:
            say(f"shipping {job.src.path.name} as it is ({job.plan.precision})")
            current = _copy_source(job.src, static, stage)
            fmt = job.src.format
            job.shipped_as_is = filecmp.cmp(static, current, shallow=False)  # the reference ran this very file
        manifest = _manifest(job, stage, current, fmt)
        if tuned_record is not None:
            manifest["tuned"] = tuned_record
        _parity_gate(job, stage, manifest, _reference_on(job, static))
        write_json_atomic(stage / MANIFEST, manifest)
    return Bundle.open(output, trust=False)  # just built here: unsigned until `edgekit sign`


@dataclass
class _Job:
    """One ONNX-family conversion's state, filled in step by step (``convert`` reads top to bottom)."""

    src: Source
    profile: TargetProfile
    plan: Plan
    request: ConvertRequest
    say: Step
    io: IOSpec
    seen_io: IOSpec  # what the data readers and the input generator recognise inputs by (frozen ones included)
    pre: Any = None
    calibration: Any = None
    parity_inputs: list[dict[str, Any]] = field(default_factory=list)
    label: str = ""  # where the parity inputs came from
    provenance: Any = None
    reference: list[dict[str, Any]] | None = None  # the source's outputs on parity_inputs
    ref_label: str = ""
    chain_record: list[dict[str, Any]] = field(default_factory=list)
    converter_proxy: Any = None  # what the last converter computed in place of a runtime that is not here
    torch_inputs: Any = None  # a PyTorch source: the inputs the converter chose and ran the model on
    shipped_as_is: bool = False  # the bundle's file is byte for byte the file the reference ran: nothing converted
    static: Path | None = None  # the source file the reference ran (static shapes)

    @property
    def parity_opts(self) -> dict[str, Any]:
        # a PyTorch source: the converter chose and ran the inputs
        opts = {
            "task": self.request.task,
            "input_provenance": None if self.torch_inputs is not None else self.provenance,
        }
        if self.shipped_as_is:
            opts["shipped_as_is"] = True
        return opts


def _apply_tuned(
    profile: TargetProfile, req: ConvertRequest, say: Step
) -> tuple[TargetProfile, ConvertRequest, dict[str, Any] | None]:
    """The target with ``req.tuned`` applied, the request at the precision it resolves, and the manifest's record."""
    if req.tuned is None:
        return profile, req, None
    from edge.pipeline.overlay import TunedOverlay, apply_tuned, read_overlay

    overlay = req.tuned if isinstance(req.tuned, TunedOverlay) else read_overlay(req.tuned)
    profile, precision = apply_tuned(profile, overlay, req.precision, say)
    return profile, req.replace(precision=precision), overlay.manifest_record()  # the bundle says it was tuned


def _check_source(src: Source, profile: TargetProfile, req: ConvertRequest) -> None:
    """Options that do not apply to this source, and targets that cannot take it, refused before any work."""
    if req.freeze and not isinstance(src, (OnnxSource, TorchSource)):
        raise InputFileError(
            f"--freeze-input fixes inputs of an ONNX graph, or a PyTorch model's int, float and bool arguments; "
            f"{src.path.name} is {src.format}",
            hint="leave out --freeze-input",
        )
    if isinstance(src, GGUFSource):
        return
    if req.eval_text is not None:
        raise InputFileError(
            f"--eval-text is the text a GGUF language model's quality gate evaluates; {src.path.name} is {src.format}",
            hint="leave out --eval-text",
        )
    if profile.chain == () and profile.llm is not None:
        raise TargetError(f"target {profile.name} runs GGUF language models only; {src.path.name} is {src.format}")
    if isinstance(src, TorchSource):  # a TorchScript archive for a chain that lowers torch.export programs only
        source_problem(profile, src.format, src.path, src.path.name)


def _prepare(src: Source, profile: TargetProfile, req: ConvertRequest, say: Step) -> _Job:
    """Plan, I/O (frozen inputs applied), the ops the first converter cannot express, pre-processing and
    calibration: every refusal before any conversion work."""
    # a TFLite's dynamic inputs are made static at --input-shape first: LiteRT reads its precision at that shape
    early_io = src.checked_io(req.input_shapes) if isinstance(src, TFLiteSource) else None
    own = src.own_precision() if isinstance(src, (TFLiteSource, OpenVINOSource, OnnxSource)) else None
    full = src.full_integer() if isinstance(src, TFLiteSource) else None  # a float TFLite: through ONNX where needed
    p = plan(
        profile,
        req.precision,
        source_format=src.format,
        source_precision=own,
        source_name=src.path.name,
        full_integer=full,
    )
    needs = p.steps[0].converter.full_integer_only if p.steps else None  # what runs full-integer models only
    if isinstance(src, TFLiteSource) and needs and not src.full_integer():
        floats = f"{own}, float ops: {', '.join(src.float_ops())}" if own == "int8-dynamic" else own
        raise PrecisionError(
            f"{src.path.name} is not a full-integer TFLite (it is {floats}); {needs} runs "
            "full-integer int8 models only, and edgekit cannot quantize a .tflite file: TensorFlow's "
            "quantizer reads a SavedModel or Keras model, not a flatbuffer",
            hint="bring the model's ONNX (edgekit quantizes it with your --calib images), or a "
            "full-integer int8 .tflite (TFLiteConverter with a representative dataset)",
        )
    first = p.steps[0].converter if p.steps else None
    if req.freeze and isinstance(src, TorchSource) and not (first is not None and first.takes_freeze):
        raise InputFileError(
            f"--freeze-input gives {src.path.name}'s arguments their values in torch->onnx; {profile.name} "
            f"converts it with {first.name if first else 'nothing'}, which cannot",
            hint="a target whose chain starts with torch->onnx takes it, or save the model with the value fixed",
        )
    say(f"reading {src.path} ({src.format}; route: {p.route})")
    io = early_io if early_io is not None else src.checked_io(req.input_shapes)
    job = _Job(src=src, profile=profile, plan=p, request=req, say=say, io=io, seen_io=io)
    if req.freeze and isinstance(src, OnnxSource):  # another source with --freeze-input: _check_source refused it
        say("freezing " + ", ".join(f"{k}={v}" for k, v in req.freeze.items()) + " and inlining the Ifs that decides")
        frozen, job.io = src.frozen(req.freeze, io)
        job.src = frozen
        say(
            f"{frozen.record.inlined_if} If node(s) inlined; checked against the source on onnxruntime "
            f"(max error {frozen.record.check['max_error_over_range']:.2g} of the output's range)"
        )
    if (
        isinstance(job.src, OnnxSource) and job.src.format == "onnx" and p.steps
    ):  # every node the first converter cannot express, before any work
        from edge.graph.opsupport import check_ops

        check_ops(job.src.model, p.steps[0].converter.op_support(), source=job.src.path, target=profile.name)
    job.pre = request_preprocess(job.src, job.io, req)
    if req.calib is not None:
        say(f"loading calibration data from {req.calib}")
        job.calibration = _without_frozen(load_calibration(req.calib, job.seen_io, job.pre), job.io)
    elif p.needs_calibration:
        job.calibration, why = default_calibration(job.seen_io, job.pre)
        if job.calibration is None:
            raise CalibrationError(
                f"{p.precision} for {profile.name} needs calibration data (edgekit's natural images do not apply: {why})",
                hint=f"pass {CALIB_FLAG} DIR (.npy/.npz tensors, images, .wav or .txt), or {CALIB_FLAG} {RANDOM} "
                "to quantize on generated inputs (recorded as such in the manifest)",
            )
        say(f"calibrating on {job.calibration.source} (no {CALIB_FLAG} given)")
        job.calibration = _without_frozen(job.calibration, job.io)
    return job


def _choose_parity_inputs(job: _Job, static: Path) -> None:
    """The user's --parity-data, else their calibration data (int8: held out of calibration), else generated
    inputs that look like the model's data (where they came from goes in the manifest); the source's outputs
    on them, when it runs here."""
    req = job.request
    chosen = choose_parity_inputs(
        job.seen_io,
        job.pre,
        count=req.parity_samples,
        parity_data=req.parity_data,
        calibration=job.calibration,
        quantized=job.plan.precision == "int8",
    )
    job.parity_inputs, job.label = _only_inputs(chosen.samples, job.io), chosen.label
    job.calibration = _without_frozen(chosen.calibration, job.io)
    job.provenance = chosen.provenance
    ref = job.src.reference(static, job.parity_inputs) if job.parity_inputs else None
    if ref is not None:
        job.say(f"running the source model as the parity reference ({ref[1]})")
        job.reference, job.ref_label = ref
        job.io = _with_outputs(job.io, job.reference[0])


def _run_chain(job: _Job, static: Path, work: Path, stage: Path) -> Path:
    """The planned converters in turn (the last one writes into ``stage``); the artifact the chain ends with."""
    current = static
    for i, step in enumerate(job.plan.steps):
        job.say(f"converting with {step.converter.name} ({step.precision})")
        last = i == len(job.plan.steps) - 1
        out_dir = stage if last else work / f"step{i}"
        out_dir.mkdir(exist_ok=True)
        request = ConversionRequest(
            source=current,
            workdir=out_dir,
            precision=step.precision,
            io=job.io,
            preprocess=job.pre,
            calibration=job.calibration,
            options=step.options,
            # a PyTorch source's --freeze-input: its first converter passes the values to the model (an ONNX
            # source's were frozen in the graph before the chain)
            freeze=dict(job.request.freeze or {}) if i == 0 and isinstance(job.src, TorchSource) else {},
        )
        try:
            result = step.converter().convert(request)
        except ConversionError as e:  # a step's file is edgekit's (source.static.onnx, step0/...): name the user's
            if type(e) is not ConversionError or job.src.path.name in e.message:
                raise
            raise ConversionError(f"{job.src.path.name}: {e.message}", hint=e.hint) from None
        job.converter_proxy = result.proxy if last else None
        if result.reference is not None and job.reference is None:  # a PyTorch source: the converter ran it
            _take_torch_reference(job, result)
        job.chain_record.append(
            {
                "converter": step.converter.name,
                "precision": step.precision,
                "output_format": result.format,
                "tool_versions": result.tool_versions,
                "details": result.details,
                "notes": fit_notes(result.notes),
            }
        )
        current = result.artifact
        if last:
            _note_growth(job, result.files)
    return current


#: a bundle's model files more than this many times its source's bytes get a note saying so, and why
GROWTH_NOTED = 2.0


def _note_growth(job: _Job, files: list[Path]) -> None:
    """A bundle much bigger than its source surprises on a device's download (issue #23: MiniLM-L6 int8, 23 MB -> 90
    MB on arm-xnnpack, onnx2tf making its int8 weights f32): the last step's notes say how much, and why when it is
    known (a weight-only int8 source whose float target dequantizes its weights)."""
    src_bytes = job.src.path.stat().st_size + sum(f.stat().st_size for f in _source_side_files(job.src))
    out_bytes = sum(f.stat().st_size for f in files if f.is_file() and f.suffix != ".json")
    if src_bytes <= 0 or out_bytes <= GROWTH_NOTED * src_bytes:
        return
    int8_weights = isinstance(job.src, OnnxSource) and any(
        t.data_type in (2, 3)
        for t in job.src.model.graph.initializer  # TensorProto UINT8, INT8
    )
    why = (
        f"the source's int8 weights are float constants in the {job.plan.precision} model (compute is "
        f"{job.plan.precision} either way; the download is bigger)"
        if int8_weights and job.plan.precision in ("fp32", "fp16")
        else "the converter wrote bigger weights than the source holds"
    )
    job.chain_record[-1]["notes"] = [
        *job.chain_record[-1]["notes"],
        f"the bundle's model is {out_bytes / 1e6:.1f} MB from a {src_bytes / 1e6:.1f} MB source "
        f"({out_bytes / src_bytes:.1f}x): {why}",
    ]


def _source_side_files(src: Source) -> list[Path]:
    """The files a source's weights live in beside it: an ONNX's external data, an OpenVINO IR's .bin."""
    if isinstance(src, OpenVINOSource):
        return [src.bin]
    if not isinstance(src, OnnxSource):
        return []
    import onnx

    names = {
        e.value
        for t in onnx.load(str(src.path), load_external_data=False).graph.initializer
        if t.data_location == 1  # TensorProto.EXTERNAL
        for e in t.external_data
        if e.key == "location"
    }
    found = [src.path.parent / n for n in names]
    return [f for f in found if f.is_file() and f.resolve().parent == src.path.parent.resolve()]


def _take_torch_reference(job: _Job, result: Any) -> None:
    """A PyTorch source: the converter chose the inputs and ran the model on them; those are parity's reference."""
    job.torch_inputs = result.reference[0]
    job.parity_inputs, job.reference = [dict(s) for s in result.reference[0]], list(result.reference[1])
    job.ref_label = (result.details.get("torch_reference") or {}).get("runtime") or "the PyTorch model"
    if isinstance(job.src, TorchSource) and result.details.get("frozen"):  # --freeze-input, as the manifest says
        job.src.frozen = list(result.details["frozen"])
    order = (result.details.get("io_names") or {}).get("inputs") or [t.name for t in job.io.inputs]
    by_name = {t.name: t for t in job.io.inputs}
    job.io = _with_outputs(IOSpec(tuple(by_name[n] for n in order), ()), job.reference[0])


def _manifest(job: _Job, stage: Path, primary: Path, fmt: str | None) -> dict[str, Any]:
    """The staged bundle's manifest, with the reference pairs the device checks on first load."""
    profile = job.profile
    pairs = None
    if job.reference is not None:  # written first: new_manifest lists every file in the stage
        pairs = _write_reference_pairs(stage, job.parity_inputs, job.reference, job.plan.precision, job.ref_label)
    manifest = new_manifest(
        ManifestSpec(
            source=job.src.path,
            profile=profile,
            precision=job.plan.precision,
            stage=stage,
            primary=primary,
            chain=job.chain_record,
            source_info={**job.src.describe(), "route": job.plan.route},
            io=_bundle_io(job),
            runner=profile.runner,
            runner_options=profile.runtime_options,
            calibration=job.calibration,
            preprocess=job.pre,
            frame_budget_ms=profile.frame_budget_ms,
            fmt=fmt,
        )
    )
    if pairs is not None:
        manifest["reference_pairs"] = pairs
    return manifest


def _reference_on(job: _Job, static: Path) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]] | None]:
    def reference_on(feeds: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """The source's outputs on other feeds (a converter's proxy ran on its own inputs)."""
        if job.torch_inputs is not None:
            return job.reference if feeds is job.torch_inputs else None
        got = job.src.reference(static, feeds)
        return got[0] if got is not None else None

    return reference_on


def _only_inputs(samples: list[dict[str, Any]], io: IOSpec) -> list[dict[str, Any]]:
    """``samples`` without the inputs ``io`` lacks (those --freeze-input fixed)."""
    names = {t.name for t in io.inputs}
    return [{k: v for k, v in s.items() if k in names} for s in samples]


def _without_frozen(calibration: Any, io: IOSpec) -> Any:
    if calibration is None or not calibration.samples:
        return calibration
    import dataclasses

    return dataclasses.replace(calibration, samples=tuple(_only_inputs([dict(s) for s in calibration.samples], io)))


def _with_outputs(io: IOSpec, outputs: Mapping[str, Any]) -> IOSpec:
    return IOSpec(
        io.inputs, tuple(TensorSpec(k, tuple(int(d) for d in v.shape), str(v.dtype)) for k, v in outputs.items())
    )


def _bundle_io(job: _Job) -> IOSpec:
    """The bundle's I/O spec: ``job.io`` (the converters' static shapes, an output's from the first reference
    sample), with every output dim the reference samples disagree on kept dynamic, named as the source graph names
    it (else ``?``). A step-by-step decoder stops at its end token (SLANet-plus: [1, 25, 50] on one input, [1, 44,
    50] on the next): the first sample's length is not the output's, and the bundle's reference check refused the
    others (issue #34)."""
    if not job.reference or len(job.reference) < 2:
        return job.io
    declared = {t.name: t.shape for t in job.seen_io.outputs}
    outputs = []
    for t in job.io.outputs:
        shapes = [tuple(r[t.name].shape) for r in job.reference if t.name in r]
        dims = list(t.shape)
        if shapes and len({len(s) for s in shapes}) == 1 and len(shapes[0]) == len(dims):
            names = declared.get(t.name) or ()
            for i in range(len(dims)):
                if len({s[i] for s in shapes}) > 1:
                    dims[i] = names[i] if i < len(names) and isinstance(names[i], str) and names[i] else "?"
        outputs.append(replace(t, shape=tuple(dims)))
    return IOSpec(job.io.inputs, tuple(outputs))


def _copy_source(src: Source, static: Path, stage: Path) -> Path:
    if isinstance(src, OpenVINOSource):
        import openvino as ov

        from edge.backends.openvino.format import ov_core

        model = ov_core().read_model(str(static))
        out = stage / "model.xml"
        ov.save_model(model, str(out), compress_to_fp16=False)  # weights as the source holds them
        return out
    out = stage / ("model" + static.suffix)
    shutil.copyfile(static, out)
    if isinstance(src, TFLiteSource):
        from edge.backends.litert.format import sidecar_path

        side = sidecar_path(static)
        if side.is_file():  # edgekit's I/O sidecar (ONNX names and layout): the source's I/O as it was read
            shutil.copyfile(side, sidecar_path(out))
    return out


def _write_reference_pairs(
    stage: Path, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]], precision: str, reference: str
) -> dict[str, Any]:
    """A few of the parity inputs and the source's outputs on them, for the device's check on first load."""
    from edge.verify.refpairs import write_reference_pairs

    return write_reference_pairs(
        stage,
        inputs[:REFERENCE_PAIRS],
        outputs[:REFERENCE_PAIRS],
        precision=precision,
        reference=reference,
        samples=REFERENCE_PAIRS,
    )


def _host_proxy(p: Plan, profile: TargetProfile) -> tuple[str, dict[str, Any], str] | None:
    """(runner, extra options, what it is) computing on this host what the device will compute, or None.

    A runner names its own proxy (``host_proxy``: TensorRT -> onnxruntime on the prepared ONNX); a
    runner with a CPU fallback for an accelerator that is not here (the Edge TPU) runs the same
    integer model on the CPU."""
    from edge.backends.runner import RUNNERS
    from edge.capabilities import current_host

    cls = RUNNERS.get(profile.runner)
    proxy: tuple[str, dict[str, Any], str] | None = getattr(cls, "host_proxy", None)
    if proxy is not None and not _runner_problems(proxy[0]):
        return proxy
    if (
        profile.run_place.needs_device
        and "allow_cpu_fallback" in cls.options
        and not _runner_problems(profile.runner)
        and profile.run_place.allows(current_host())
    ):
        return (
            profile.runner,
            {"allow_cpu_fallback": True},
            f"{profile.accelerator} is not on this host: the same {p.precision} model ran on {profile.runner}'s "
            "CPU fallback (the accelerator computes the same integer arithmetic); the device checks the bundle's "
            "reference pairs on first load",
        )
    return None


def _runner_problems(name: str) -> list[str]:
    from edge.backends.runner import RUNNERS

    return RUNNERS.get(name).problems()


def _parity_gate(
    job: _Job,
    stage: Path,
    manifest: dict[str, Any],
    reference_on: Callable[[list[dict[str, Any]]], list[dict[str, Any]] | None],
) -> None:
    """The one gate: the bundle's runner, else a runner's host proxy, else what the converter computed in place
    of the runtime (``ConversionResult.proxy``), else unverified with the reason."""
    reference = job.reference
    if reference is None:
        manifest["parity"] = {"passed": None, "skipped": SKIP_NO_REFERENCE}
        return
    if job.plan.run_here is None:
        _gate_on_runner(job, stage, manifest, reference)
        _fp16_proxy_gate(job, stage, manifest, reference)
        return
    proxy = _host_proxy(job.plan, job.profile)
    if proxy is not None:
        _gate_on_host_proxy(job, stage, manifest, proxy, reference)
        _fp16_proxy_gate(job, stage, manifest, reference)
        return
    if job.converter_proxy is not None and _gate_on_converter_proxy(job, manifest, reference_on):
        _fp16_proxy_gate(job, stage, manifest, reference)
        return
    bridge = next(
        (
            s["details"].get("bridge_parity")
            for s in job.chain_record
            if isinstance(s.get("details"), dict) and s["details"].get("bridge_parity")
        ),
        None,
    )
    why = f"{SKIP_RUNNER_NOT_HERE}{job.plan.run_here}"
    if bridge is not None:
        why += (
            "; the converter's fp32 ONNX->PyTorch bridge matched the source (chain[].details.bridge_parity), "
            "the converted package is checked on the device (reference pairs)"
        )
    manifest["parity"] = {"passed": None, "skipped": why, "reference": job.ref_label or None}


def _fp16_proxy_gate(job: _Job, stage: Path, manifest: dict[str, Any], reference: list[dict[str, Any]]) -> None:
    """A device that computes in fp16 (``Runner.computes_fp16``) at precision fp16: the graph also runs with
    every intermediate rounded to fp16 (``edge.verify.fp16proxy``), beside the f32 figure; a failure stops the
    conversion like parity's. The bundle's prepared ONNX where it ships one, else the ONNX source."""
    from edge.backends.runner import RUNNERS
    from edge.verify.fp16proxy import LABEL, run_fp16_proxy

    if job.plan.precision != "fp16" or not getattr(RUNNERS.get(job.profile.runner), "computes_fp16", False):
        return
    artifact = Bundle(stage, manifest).artifact
    graph = artifact if artifact.suffix == ".onnx" else job.static
    if graph is None or graph.suffix != ".onnx" or not isinstance(manifest.get("parity"), dict):
        return
    job.say(f"checking parity on {len(job.parity_inputs)} {job.label} inputs with every tensor rounded ({LABEL})")
    report = run_fp16_proxy(graph, job.parity_inputs, reference, task=job.request.task)
    data = report.to_json()
    data["graph"] = "the bundle's prepared ONNX" if graph == artifact else f"the source ONNX ({job.src.path.name})"
    manifest["parity"]["fp16_proxy"] = data
    if not report.passed:
        manifest["parity"]["passed"] = False
        manifest["parity"]["accepted_failure"] = job.request.accept_parity_failure
        if not job.request.accept_parity_failure:
            raise ParityError(
                f"{_failed(job)} ({LABEL}): " + "; ".join(report.failures),
                report,
                hint="nothing was written; pass --accept-parity-failure to keep it anyway",
            )


def _failed(job: _Job) -> str:
    return f"parity failed for {job.profile.name} {job.plan.precision}"


def _gate_on_runner(job: _Job, stage: Path, manifest: dict[str, Any], reference: list[dict[str, Any]]) -> None:
    from edge.verify.parity import check_parity

    job.say(f"checking parity on {len(job.parity_inputs)} {job.label} inputs")
    with Bundle(stage, manifest).open_runner() as runner:
        report = check_parity(
            runner,
            job.parity_inputs,
            reference,
            precision=job.plan.precision,
            inputs=job.label,
            reference_label=job.ref_label,
            **job.parity_opts,
        )
    if not report.passed:
        _locate_divergence(job, stage, manifest, report)
    record_gate(manifest, report, failed=_failed(job), accept=job.request.accept_parity_failure)
    try_fast_precision(
        job.plan.precision,
        stage,
        manifest,
        job.parity_inputs,
        reference,
        label=job.label,
        reference_label=job.ref_label,
        parity_opts=job.parity_opts,
        say=job.say,
    )
    skip_xnnpack_fp16(job.plan.precision, manifest, job.say)


def _locate_divergence(job: _Job, stage: Path, manifest: dict[str, Any], report: Any) -> None:
    """Name the first source node whose output differs, in the failure message and the manifest's parity record:
    ONNX -> ONNX / IR by the bundle graph's tensor names (edge.graph.divergence), ONNX -> TFLite by onnx2tf's
    per-node check (edge.backends.litert.convert.locate_divergence: a second onnx2tf run, on failure only)."""
    artifact = Bundle(stage, manifest).artifact
    if job.static is None or job.src.format != "onnx" or artifact.suffix not in (".onnx", ".xml", ".tflite"):
        return
    from edge.backends.litert.format import sidecar_path
    from edge.graph.divergence import first_divergence

    if artifact.suffix == ".tflite" and not sidecar_path(artifact).is_file():
        return
    try:
        if artifact.suffix == ".tflite":
            from edge.backends.litert.convert import locate_divergence

            job.say("locating where onnx2tf's translation diverges (onnx2tf's per-node check)")
            found = locate_divergence(job.static, artifact, job.parity_inputs[0], job.io)
        else:
            found = first_divergence(job.static, artifact, job.parity_inputs)
    except Exception as e:  # noqa: BLE001 - a diagnosis that fails must not hide the parity failure itself
        job.say(f"could not locate where the outputs diverge: {type(e).__name__}: {str(e)[:200]}")
        return
    if found is not None:
        report.first_divergence = found


def _gate_on_host_proxy(
    job: _Job,
    stage: Path,
    manifest: dict[str, Any],
    proxy: tuple[str, dict[str, Any], str],
    reference: list[dict[str, Any]],
) -> None:
    """Parity on a runner of this host that computes what the device will (``_host_proxy``)."""
    from edge.backends.runner import RUNNERS
    from edge.verify.parity import check_parity

    name, extra, what = proxy
    p = job.plan
    job.say(f"checking parity on {len(job.parity_inputs)} {job.label} inputs with a host proxy ({name})")
    b = Bundle(stage, manifest)
    same = name == job.profile.runner
    runner_opts = {**b.info.runner.options_dict, **extra} if same else dict(extra)
    # another runtime loads the artifact as it is: an fp16/bf16 target precision (TensorRT builds fp16 from
    # the fp32 ONNX on the device) is fp32 arithmetic there; int8 QDQ is int8 in both
    as_loaded = p.precision if same or p.precision.startswith("int8") else "fp32"
    with RUNNERS.get(name)(b.artifact, options=runner_opts, precision=as_loaded) as runner:
        report = check_parity(
            runner,
            job.parity_inputs,
            reference,
            precision=p.precision,
            inputs=job.label,
            reference_label=job.ref_label,
            host_proxy=f"host proxy: {what}",
            **job.parity_opts,
        )
    if not report.passed:
        _locate_divergence(job, stage, manifest, report)
    record_gate(
        manifest, report, failed=f"{_failed(job)} (host proxy: {name})", accept=job.request.accept_parity_failure
    )


def _gate_on_converter_proxy(
    job: _Job, manifest: dict[str, Any], reference_on: Callable[[list[dict[str, Any]]], list[dict[str, Any]] | None]
) -> bool:
    """Parity against what the last converter computed in place of the runtime; False when the source's
    outputs on its inputs are not to be had."""
    from edge.verify.parity import ParityReport, compare, thresholds_for

    cp = job.converter_proxy
    ref = reference_on(cp.inputs)
    if ref is None:
        return False
    p, task = job.plan, job.request.task
    job.say(
        f"checking parity on {len(cp.inputs)} {cp.inputs_from} inputs against the converter's host proxy ({cp.label})"
    )
    th = thresholds_for(p.precision, cp.precision_used)
    notes = [
        f"host proxy: {cp.label}; the converted package itself is checked on the device against the bundle's reference pairs on first load"
    ]
    if cp.fallback:
        notes.append(f"computed in {cp.precision_used}, not {p.precision}: {cp.fallback}")
    report = ParityReport(
        precision=p.precision,
        thresholds=th,
        samples=len(cp.inputs),
        inputs=cp.inputs_from,
        reference=job.ref_label,
        candidate=cp.info.to_json(),
        outputs=compare(ref, cp.outputs, th, task=task),
        host_notes=notes,
        task=task,
    )
    record_gate(
        manifest, report, failed=f"{_failed(job)} (host proxy: {cp.label})", accept=job.request.accept_parity_failure
    )
    return True
