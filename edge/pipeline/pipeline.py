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
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from edge.bundle.bundle import MANIFEST, Bundle, staging_dir
from edge.bundle.typedjson import write_json_atomic
from edge.backends.converter import ConversionRequest
from edge.verify.inputs import RANDOM, choose_parity_inputs, load_calibration
from edge.verify.tasks import TASK_CHOICES
from edge.errors import CalibrationError, EdgeError, InputFileError, MissingDependencyError, ModelError, PrecisionError, TargetError
from edge.bundle.manifest import new_manifest, record_gate
from edge.pipeline.plan import KEEP, Plan, Step, conversion_problems, plan
from edge.pipeline.precision_trial import try_fast_precision
from edge.pipeline.sources import GGUFSource, OnnxSource, OpenVINOSource, Source, TFLiteSource, open_source
from edge.spec import IOSpec, TensorSpec, default_preprocess
from edge.targets import ChainStep, TargetProfile, get_target

#: what the bundle carries for the device to check on first load
REFERENCE_PAIRS = 16


def convert(model: str | os.PathLike[str], target: str | TargetProfile, output: str | os.PathLike[str], *,
            precision: str | None = None, calib: str | os.PathLike[str] | None = None,
            input_shapes: Mapping[str, Sequence[int]] | None = None, preprocess: str = "auto",
            letterbox: bool | None = None, targets_dir: Iterable[str | os.PathLike[str]] = (),
            accept_parity_failure: bool = False, parity_samples: int = 32, force: bool = False,
            allow_requantize: bool = False, on_step: Step | None = None,
            eval_text: str | os.PathLike[str] | None = None, parity_data: str | os.PathLike[str] | None = None,
            task: str = "auto", tuned: Any = None, freeze: Mapping[str, str] | None = None) -> Bundle:
    """Convert ``model`` (ONNX, TFLite, OpenVINO IR, TorchScript / torch.export, GGUF) for ``target``
    into a verified bundle at ``output``. ``eval_text``: a GGUF's quality gate evaluates this text file
    instead of the built-in multilingual text (``edge.llm.evaltext``). ``tuned``: an ``edgekit tune`` overlay
    (its file, or a ``edge.tune.overlay.TunedOverlay``) applied to the target: runner, chain, precision, options.
    ``freeze``: ONNX inputs fixed to values (``{"sr": "16000"}``; ``edge.graph.freeze``): they leave the bundle's inputs,
    and every If they decide (with the static shapes) is inlined, checked against the source first."""
    say = on_step or (lambda _msg: None)
    profile = target if isinstance(target, TargetProfile) else get_target(target, targets_dir)
    tuned_record = None
    if tuned is not None:
        from edge.tune.overlay import TunedOverlay, apply_tuned, read_overlay

        overlay = tuned if isinstance(tuned, TunedOverlay) else read_overlay(tuned)
        profile, precision = apply_tuned(profile, overlay, precision, say)
        tuned_record = overlay.manifest_record()  # the bundle says it came from a tuned overlay
    src = open_source(model)
    if freeze and not isinstance(src, OnnxSource):
        raise InputFileError(f"--freeze-input fixes inputs of an ONNX graph; {src.path.name} is {src.format}",
                             hint="leave out --freeze-input")
    if isinstance(src, GGUFSource):
        return _convert_llm(src, profile, Path(output), precision=precision, allow_requantize=allow_requantize,
                            accept_parity_failure=accept_parity_failure, force=force, say=say, eval_text=eval_text)
    if eval_text is not None:
        raise InputFileError(f"--eval-text is the text a GGUF language model's quality gate evaluates; "
                             f"{src.path.name} is {src.format}", hint="leave out --eval-text")
    if profile.chain == () and profile.llm is not None:
        raise TargetError(f"target {profile.name} runs GGUF language models only; {src.path.name} is {src.format}")
    own = src.own_precision() if isinstance(src, (TFLiteSource, OpenVINOSource, OnnxSource)) else None
    p = plan(profile, precision, source_format=src.format, source_precision=own, source_name=src.path.name)
    if isinstance(src, TFLiteSource) and p.steps and p.steps[0].converter.name == "tflite->edgetpu" \
            and not src.full_integer():
        floats = f"{own}, float ops: {', '.join(src.float_ops())}" if own == "int8-dynamic" else own
        raise PrecisionError(f"{src.path.name} is not a full-integer TFLite (it is {floats}); the Edge TPU runs "
                             "full-integer int8 models only, and edgekit cannot quantize a .tflite file: TensorFlow's "
                             "quantizer reads a SavedModel or Keras model, not a flatbuffer",
                             hint="bring the model's ONNX (edgekit quantizes it with your --calib images), or a "
                                  "full-integer int8 .tflite (TFLiteConverter with a representative dataset)")
    say(f"reading {src.path} ({src.format}; route: {p.route})")
    io = src.io(input_shapes or {})
    seen_io = io  # what the data readers and the input generator recognise inputs by (frozen ones included)
    if freeze:
        say("freezing " + ", ".join(f"{k}={v}" for k, v in freeze.items()) + " and inlining the Ifs that decides")
        src, io = src.frozen(freeze, io)
        say(f"{src.record.inlined_if} If node(s) inlined; checked against the source on onnxruntime "
            f"(max error {src.record.check['max_error_over_range']:.2g} of the output's range)")
    if src.format == "onnx" and p.steps:  # every node the first converter cannot express, before any work
        from edge.graph.opsupport import check_ops

        check_ops(src.model, p.steps[0].converter.name, source=src.path, target=profile.name)
    pre = None if preprocess == "none" else default_preprocess(io, preprocess, letterbox=letterbox)

    calibration = None
    if calib is not None:
        say(f"loading calibration data from {calib}")
        calibration = _without_frozen(load_calibration(calib, seen_io, pre), io)
    elif p.needs_calibration:
        raise CalibrationError(f"{p.precision} for {profile.name} needs calibration data",
                               hint=f"pass --calib DIR (.npy/.npz tensors or images), or --calib {RANDOM} "
                                    "to quantize on generated inputs (recorded as such in the manifest)")

    with tempfile.TemporaryDirectory(prefix="edgekit-convert-") as tmp, staging_dir(Path(output), force=force) as stage:
        work = Path(tmp)
        static = src.static_file(work, io)
        if task not in TASK_CHOICES:
            raise EdgeError(f"unknown --task {task!r}", hint=f"choose one of {', '.join(TASK_CHOICES)}")
        # the user's --parity-data, else their calibration data (int8: held out of calibration), else generated
        # inputs that look like the model's data; where they came from goes in the manifest
        chosen = choose_parity_inputs(seen_io, pre, count=parity_samples, parity_data=parity_data,
                                      calibration=calibration, quantized=p.precision == "int8")
        parity_inputs, label = _only_inputs(chosen.samples, io), chosen.label
        calibration = _without_frozen(chosen.calibration, io)
        parity_opts = {"task": task, "input_provenance": chosen.provenance}
        ref = src.reference(static, parity_inputs) if parity_inputs else None
        reference: list[dict[str, Any]] | None = None
        ref_label = ""
        if ref is not None:
            say(f"running the source model as the parity reference ({ref[1]})")
            reference, ref_label = ref
            io = _with_outputs(io, reference[0])

        current, chain_record = static, []
        converter_proxy = None  # what the last converter computed in place of a runtime that is not here
        torch_inputs = None
        for i, step in enumerate(p.steps):
            say(f"converting with {step.converter.name} ({step.precision})")
            last = i == len(p.steps) - 1
            out_dir = stage if last else work / f"step{i}"
            out_dir.mkdir(exist_ok=True)
            result = step.converter().convert(ConversionRequest(
                source=current, workdir=out_dir, precision=step.precision, io=io, preprocess=pre,
                calibration=calibration, options=step.options))
            converter_proxy = result.proxy if last else None
            if result.reference is not None and reference is None:  # a PyTorch source: the converter ran it
                torch_inputs = result.reference[0]
                parity_inputs, reference = [dict(s) for s in result.reference[0]], list(result.reference[1])
                ref_label = (result.details.get("torch_reference") or {}).get("runtime") or "the PyTorch model"
                order = (result.details.get("io_names") or {}).get("inputs") or [t.name for t in io.inputs]
                by_name = {t.name: t for t in io.inputs}
                io = _with_outputs(IOSpec(tuple(by_name[n] for n in order), ()), reference[0])
            chain_record.append({"converter": step.converter.name, "precision": step.precision,
                                 "output_format": result.format, "tool_versions": result.tool_versions,
                                 "details": result.details, "notes": result.notes})
            current = result.artifact
        fmt = None
        if p.ships_source:
            say(f"shipping {src.path.name} as it is ({p.precision})")
            current = _copy_source(src, static, stage)
            fmt = src.format
            if filecmp.cmp(static, current, shallow=False):  # the reference ran this very file: nothing converted
                parity_opts["shipped_as_is"] = True
        pairs = _write_reference_pairs(stage, parity_inputs, reference, p.precision, ref_label) \
            if reference is not None else None
        source_info = {**src.describe(), "route": p.route}
        manifest = new_manifest(
            source=src.path, profile=profile, precision=p.precision, stage=stage, primary=current, chain=chain_record,
            source_info=source_info, io=io, runner=profile.runner, runner_options=profile.runtime_options,
            calibration=calibration, preprocess=pre, frame_budget_ms=profile.frame_budget_ms, fmt=fmt)
        if pairs is not None:
            manifest["reference_pairs"] = pairs
        if tuned_record is not None:
            manifest["tuned"] = tuned_record
        def reference_on(feeds: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
            """The source's outputs on other feeds (a converter's proxy ran on its own inputs)."""
            if torch_inputs is not None:
                return reference if feeds is torch_inputs else None
            got = src.reference(static, feeds)
            return got[0] if got is not None else None

        if torch_inputs is not None:  # a PyTorch source: the converter chose and ran the inputs
            parity_opts["input_provenance"] = None
        _parity_gate(p, profile, stage, manifest, parity_inputs, reference, ref_label, label, accept_parity_failure,
                     chain_record, say, converter_proxy, reference_on, parity_opts)
        write_json_atomic(stage / MANIFEST, manifest)
    return Bundle.open(output, trust=False)  # just built here: unsigned until `edgekit sign`


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
    return IOSpec(io.inputs, tuple(TensorSpec(k, tuple(int(d) for d in v.shape), str(v.dtype)) for k, v in outputs.items()))


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


def _write_reference_pairs(stage: Path, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]],
                           precision: str, reference: str) -> dict[str, Any]:
    """A few of the parity inputs and the source's outputs on them, for the device's check on first load."""
    from edge.verify.refpairs import write_reference_pairs

    return write_reference_pairs(stage, inputs[:REFERENCE_PAIRS], outputs[:REFERENCE_PAIRS], precision=precision,
                                 reference=reference, samples=REFERENCE_PAIRS)


def _host_proxy(p: Plan, profile: TargetProfile) -> tuple[str, dict[str, Any], str] | None:
    """(runner, extra options, what it is) computing on this host what the device will compute, or None.

    A runner names its own proxy (``host_proxy``: TensorRT -> onnxruntime on the prepared ONNX); a
    runner with a CPU fallback for an accelerator that is not here (the Edge TPU) runs the same
    integer model on the CPU."""
    from edge.backends.runner import RUNNERS
    from edge.capabilities import current_host

    cls = RUNNERS.get(profile.runner)
    proxy = getattr(cls, "host_proxy", None)
    if proxy is not None and not _runner_problems(proxy[0]):
        return proxy
    if (profile.run_place.needs_device and "allow_cpu_fallback" in cls.options and not _runner_problems(profile.runner)
            and profile.run_place.allows(current_host())):
        return (profile.runner, {"allow_cpu_fallback": True},
                f"{profile.accelerator} is not on this host: the same {p.precision} model ran on {profile.runner}'s "
                "CPU fallback (the accelerator computes the same integer arithmetic); the device checks the bundle's "
                "reference pairs on first load")
    return None


def _runner_problems(name: str) -> list[str]:
    from edge.backends.runner import RUNNERS
    from edge.capabilities import problems

    return problems(RUNNERS.get(name).requires)


def _parity_gate(p: Plan, profile: TargetProfile, stage: Path, manifest: dict[str, Any], inputs: list[dict[str, Any]],
                 reference: list[dict[str, Any]] | None, ref_label: str, label: str, accept: bool,
                 chain_record: list[dict[str, Any]], say: Step, converter_proxy: Any = None,
                 reference_on: Any = None, parity_opts: Mapping[str, Any] | None = None) -> None:
    """The one gate: the bundle's runner, else a runner's host proxy, else what the converter computed in place
    of the runtime (``ConversionResult.proxy``), else unverified with the reason."""
    from edge.verify.parity import check_parity

    opts = dict(parity_opts or {})  # task, input_provenance
    if reference is None:
        manifest["parity"] = {"passed": None, "skipped": "no reference outputs: the source could not be run here"}
        return
    failed = f"parity failed for {profile.name} {p.precision}"
    if p.run_here is None:
        say(f"checking parity on {len(inputs)} {label} inputs")
        with Bundle(stage, manifest).open_runner() as runner:
            report = check_parity(runner, inputs, reference, precision=p.precision, inputs=label,
                                  reference_label=ref_label, **opts)
        record_gate(manifest, report, failed=failed, accept=accept)
        try_fast_precision(p.precision, stage, manifest, inputs, reference, label=label, reference_label=ref_label,
                           parity_opts=opts, say=say)
        return
    proxy = _host_proxy(p, profile)
    if proxy is not None:
        name, extra, what = proxy
        say(f"checking parity on {len(inputs)} {label} inputs with a host proxy ({name})")
        from edge.backends.runner import RUNNERS

        b = Bundle(stage, manifest)
        same = name == profile.runner
        runner_opts = {**b.info.runner.options_dict, **extra} if same else dict(extra)
        # another runtime loads the artifact as it is: an fp16/bf16 target precision (TensorRT builds fp16 from
        # the fp32 ONNX on the device) is fp32 arithmetic there; int8 QDQ is int8 in both
        as_loaded = p.precision if same or p.precision.startswith("int8") else "fp32"
        with RUNNERS.get(name)(b.artifact, options=runner_opts, precision=as_loaded) as runner:
            report = check_parity(runner, inputs, reference, precision=p.precision, inputs=label,
                                  reference_label=ref_label, host_proxy=f"host proxy: {what}", **opts)
        record_gate(manifest, report, failed=f"{failed} (host proxy: {name})", accept=accept)
        return
    if converter_proxy is not None and reference_on is not None:
        from edge.verify.parity import ParityReport, compare, thresholds_for

        cp = converter_proxy
        ref = reference_on(cp.inputs)
        if ref is not None:
            say(f"checking parity on {len(cp.inputs)} {cp.inputs_from} inputs against the converter's host proxy "
                f"({cp.label})")
            th = thresholds_for(p.precision, cp.precision_used)
            notes = [f"host proxy: {cp.label}; the converted package itself is checked on the device against the "
                     "bundle's reference pairs on first load"]
            if cp.fallback:
                notes.append(f"computed in {cp.precision_used}, not {p.precision}: {cp.fallback}")
            report = ParityReport(precision=p.precision, thresholds=th, samples=len(cp.inputs), inputs=cp.inputs_from,
                                  reference=ref_label, candidate=cp.info.to_json(),
                                  outputs=compare(ref, cp.outputs, th, task=opts.get("task", "auto")),
                                  host_notes=notes, task=opts.get("task", "auto"))
            record_gate(manifest, report, failed=f"{failed} (host proxy: {cp.label})", accept=accept)
            return
    bridge = next((s["details"].get("bridge_parity") for s in chain_record if isinstance(s.get("details"), dict)
                   and s["details"].get("bridge_parity")), None)
    why = f"runner cannot run on this host: {p.run_here}"
    if bridge is not None:
        why += ("; the converter's fp32 ONNX->PyTorch bridge matched the source (chain[].details.bridge_parity), "
                "the converted package is checked on the device (reference pairs)")
    manifest["parity"] = {"passed": None, "skipped": why, "reference": ref_label or None}


# -- GGUF language models ------------------------------------------------------------------------

def _convert_llm(src: GGUFSource, profile: TargetProfile, output: Path, *, precision: str | None,
                 allow_requantize: bool, accept_parity_failure: bool, force: bool, say: Step,
                 eval_text: str | os.PathLike[str] | None = None) -> Bundle:
    from edge.backends.converter import CONVERTERS
    from edge.llm.evaltext import eval_windows
    from edge.llm.llamacpp import llama_cpp_version
    from edge.llm.quality import compare_gguf, reference_samples
    from edge.verify.refpairs import write_llm_reference_pairs

    if profile.llm is None:
        raise TargetError(f"target {profile.name!r} has no [llm] section: it does not run GGUF language models",
                          hint="targets with one: see `edgekit targets --json` (llm != null)")
    llm = profile.llm
    own = src.source_type
    if precision in (None, KEEP):
        quant = KEEP if src.prequantized or precision == KEEP else llm.default_precision
    else:
        quant = llm.check_precision(profile.name, precision)
    if quant == own and src.prequantized:
        quant = KEEP
    if quant != KEEP and src.prequantized and not allow_requantize:
        raise PrecisionError(f"{src.path.name} is already quantized ({own}); requantizing it to {quant} loses "
                             "quality twice, so llama.cpp refuses it unless asked",
                             hint=f"ship it as it is with --precision {KEEP} (the default for a quantized GGUF), or "
                                  f"pass --allow-requantize to requantize (gated against the {own} source)")
    steps = () if quant == KEEP else (ChainStep("gguf->gguf"),)
    missing = conversion_problems(profile, chain=steps)
    if missing:
        raise MissingDependencyError(f"cannot quantize GGUF for {profile.name} on this host: " + "; ".join(missing))
    precision_out = own if quant == KEEP else quant
    say(f"reading {src.path} (gguf {own}, {src.info.architecture}, {src.info.parameters:,} parameters)")
    n_vocab = next((t.shape[1] for t in src.info.tensors if t.name == "token_embd.weight"), None)
    if n_vocab is None:
        from edge.backends.llamacpp.run import LlamaCppRunner

        with LlamaCppRunner(src.path, options={"n_ctx": 64}) as r:
            n_vocab = r.n_vocab
    text = eval_windows(src.path, int(n_vocab), eval_text=eval_text, context=src.info.context_length)
    with tempfile.TemporaryDirectory(prefix="edgekit-gguf-") as tmp, staging_dir(output, force=force) as stage:
        artifact = stage / "model.gguf"
        chain_record: list[dict[str, Any]] = []
        if quant == KEEP:
            say(f"shipping {src.path.name} as it is ({own})")
            shutil.copyfile(src.path, artifact)
        else:
            conv = CONVERTERS.get("gguf->gguf")
            say(f"quantizing {own} to {quant} with llama.cpp" + (" (requantizing)" if src.prequantized else ""))
            result = conv().convert(ConversionRequest(source=src.path, workdir=Path(tmp), precision=quant,
                                                      io=IOSpec((), ()),
                                                      options={"allow_requantize": bool(src.prequantized)}))
            shutil.move(str(result.artifact), artifact)
            chain_record.append({"converter": conv.name, "precision": quant, "output_format": "gguf",
                                 "tool_versions": result.tool_versions, "details": result.details,
                                 "notes": result.notes})
        runtime = f"llama-cpp-python {llama_cpp_version()} on the build host's CPU"
        report = None
        if quant == KEEP:
            say("checking that llama.cpp loads it")
            _check_loads(artifact)
            say(f"reference samples for the device: {own} itself on {text.describe()}")
            pairs = write_llm_reference_pairs(stage, reference_samples(artifact, text, llm.options),
                                              precision=precision_out,
                                              reference=f"the shipped {own} GGUF itself, {runtime}")
        else:
            say(f"quality gate: KL and top-1 against the {own} source on {len(text.windows)} windows "
                f"({text.tokens} tokens) of {text.describe()}")
            report = compare_gguf(src.path, artifact, quant, text, llm.options)
            pairs = write_llm_reference_pairs(
                stage, report.reference_samples, precision=precision_out,
                reference=f"the {own} source GGUF, {runtime}; positions where the build host's {quant} agrees "
                          "with it on top-1", note=report.reference_note)
        manifest = new_manifest(
            source=src.path, profile=profile, precision=precision_out, stage=stage, primary=artifact,
            chain=chain_record, source_info={**src.describe(), "file_type": own}, fmt="gguf",
            io=IOSpec((TensorSpec("tokens", ("n",), "int32"),), (TensorSpec("logits", (int(n_vocab),), "float32"),)),
            runner=llm.runner, runner_options=llm.options, kind="llm")
        manifest["reference_pairs"] = pairs
        if report is None:
            manifest["parity"] = {"passed": None, "skipped": f"the source ships as it is ({own}): there is nothing "
                                                             "to compare it against (quality gate skipped)"}
        else:
            record_gate(manifest, report, failed=f"quality gate failed for {quant}", accept=accept_parity_failure)
        write_json_atomic(stage / MANIFEST, manifest)
    return Bundle.open(output, trust=False)


def _check_loads(path: Path) -> None:
    """llama.cpp loads the file and evaluates two tokens: a truncated or corrupt GGUF stops here."""
    from edge.backends.llamacpp.run import LlamaCppRunner

    try:
        with LlamaCppRunner(path, options={"n_ctx": 64}) as r:
            r.infer({"tokens": np.asarray([1, 2], dtype=np.int32)})
    except (ModelError, MissingDependencyError):
        raise
    except Exception as e:  # noqa: BLE001 - llama.cpp's own error: the file is unusable
        raise ModelError(f"llama.cpp could not run {path.name}: {type(e).__name__}: {str(e)[:200]}") from None
