"""``edgekit convert``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import typer
from rich.markup import escape
from rich.table import Table

from edge.bundle.bundle import Bundle
from edge.cli._common import JsonOut, TargetsDir, console, dirs, print_json, safe, steps
from edge.cli.signing import SignKey, sign_if_configured
from edge.cli.verify import NoIsaCheck, isa_check
from edge.graph.freeze import parse_freeze
from edge.graph.model import parse_input_shapes
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest
from edge.spec import PRESETS
from edge.verify.inputs import CALIB_FLAG

InputShape = typer.Option(
    None, "--input-shape", help="Fix a dynamic input: NAME=1,3,320,320 (repeatable).", show_default=False
)
FreezeInput = typer.Option(
    None,
    "--freeze-input",
    help="Fix an ONNX input to a value, NAME=VALUE (a comma list for "
    "a 1-D input; repeatable), e.g. sr=16000: it leaves the bundle's inputs, and every If "
    "node it decides (with static shapes) is inlined, checked against the source. For "
    "graphs whose control flow a target cannot express (OpenVINO, TFLite). For a PyTorch "
    "source: the value of a forward() argument that is an int, float or bool.",
    show_default=False,
)
Precision = typer.Option(
    None,
    "--precision",
    "-p",
    help="fp32, fp16, int8, int8-dynamic; for .gguf: f16, q8_0, "
    "q5_k_m, q4_k_m, q4_0 (the target says which it allows; default: the target's), or keep: "
    "ship the source's own precision (the default for a quantized .gguf, and the only choice "
    "for a .tflite or OpenVINO IR the target runs as it is).",
    show_default=False,
)
AllowRequantize = typer.Option(
    False,
    "--allow-requantize",
    help="Requantize an already quantized .gguf to --precision (llama.cpp's flag; quality is gated against the quantized source).",
)
Calib = typer.Option(
    None,
    CALIB_FLAG,
    help="Calibration data for int8: a directory of .npy/.npz tensors or images, "
    "or 'random' to quantize on generated inputs (recorded as such). Default for an image input: "
    "edgekit's shipped natural photographs (public domain/CC0, recorded in the manifest).",
    show_default=False,
)
Preprocess = typer.Option(
    "auto",
    "--preprocess",
    help=f"Pre-processing preset for an image input: "
    f"{', '.join(PRESETS)}, or none. auto: what the file declares (a .tflite's metadata, an Ultralytics "
    "export's task), else imagenet for a 3-channel image input (raw for uint8), none for a 1-channel one "
    "(grey picture or spectrogram: name a preset to declare it).",
)
Letterbox = typer.Option(
    None,
    "--letterbox/--no-letterbox",
    help="Letterbox instead of plain resize (default: per preset).",
    show_default=False,
)
EvalText = typer.Option(
    None,
    "--eval-text",
    help="For .gguf: a UTF-8 text file the quality gate evaluates (tokenized "
    "by the model) instead of the built-in public-domain prose in four languages and code.",
    show_default=False,
)
Tuned = typer.Option(
    None,
    "--tuned",
    help="Apply a profile overlay from `edgekit tune` (OUT/tuned.toml): its "
    "runner, chain, precision and options; what it applies is printed.",
    show_default=False,
)
ParityData = typer.Option(
    None,
    "--parity-data",
    help="Inputs parity compares on (preferred over --calib, edgekit's natural photographs and "
    "generated inputs): a directory or file of images, .npy/.npz tensors, .wav audio or .txt "
    "token ids. For int8 keep it apart from --calib (samples equal to one are dropped from "
    "calibration).",
    show_default=False,
)
Task = typer.Option(
    "auto",
    "--task",
    help="How parity judges the outputs beside the raw figures: auto (from the "
    "output shapes, recorded), classifier (tie-aware top-1/top-5), multi-label (independent sigmoid "
    "scores: IoU of the label sets at 0.5), detector (YOLOv5/v8/X heads: precision/"
    "recall of decoded boxes), prob-map (IoU of maps thresholded at 0.3), segmentation, sequence "
    "(CTC/token greedy decode), or none.",
)
AcceptParity = typer.Option(
    False, "--accept-parity-failure", help="Keep a bundle that fails parity (recorded in the manifest)."
)


def convert_request(
    precision: str | None,
    calib: str | None,
    input_shape: list[str] | None,
    preprocess: str,
    letterbox: bool | None,
    freeze_input: list[str] | None,
    targets_dir: list[Path] | None,
) -> ConvertRequest:
    """The request the convert options shared by convert, deploy and tune ask for (the rest: ``.replace``)."""
    return ConvertRequest(
        precision=precision,
        calib=calib,
        input_shapes=parse_input_shapes(input_shape or []),
        preprocess=preprocess,
        letterbox=letterbox,
        freeze=parse_freeze(freeze_input) if freeze_input else None,
        targets_dir=dirs(targets_dir),
    )


def compute_line(par: Any, options: Mapping[str, Any]) -> str:
    """The precision the bundle computes in where it runs: a passed faster-precision trial that the runner options
    switched on (OpenVINO bf16 on CPUs that list BF16) wins over the precision its own parity was checked in."""
    cand = par.candidate
    chosen = str(options.get("inference_precision", "")).lower()
    passed = [tr for tr in par.precision_trials if tr.passed]
    if chosen == "fast" and passed:
        tr = passed[-1]
        worst = min((o.cosine_min for o in tr.outputs), default=float("nan"))
        return (
            f"{tr.compute} on CPUs that list {tr.compute.upper()} (inference_precision fast: its own parity passed, "
            f"worst cosine {worst:.6f}); {cand.precision_used} on {cand.device_used} elsewhere"
        )
    line = f"{cand.precision_used} on {cand.device_used}"
    failed = [tr for tr in par.precision_trials if not tr.passed]
    if failed:
        line += (
            f" ({failed[-1].compute} failed parity, so it is not used: "
            + safe("; ".join(failed[-1].failures[:2]))
            + ")"
        )
    for sk in par.precision_trials_skipped:
        line += f" ({sk.compute} not tried: {safe(sk.reason)})"
    return line


def render_bundle(bundle: Any) -> None:
    from edge.bundle.schema import LLMQualityEvidence, ParityEvidence, SkippedParity

    m = bundle.info
    t = Table(title=f"bundle {bundle.id}", show_header=False)
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    t.add_row("path", safe(bundle.path))
    t.add_row("target", f"{m.target.name} ({m.target.title})")
    cal = m.calibration if isinstance(m.calibration, Mapping) else {}
    t.add_row(
        "precision",
        m.precision + (f", calibration: {cal.get('kind')} {cal.get('source')} ({cal.get('count')})" if cal else ""),
    )
    t.add_row(
        "chain",
        " → ".join(f"{c.converter} ({', '.join(f'{k} {v}' for k, v in c.tool_versions.items())})" for c in m.chain)
        or "none: the source ships as it is",
    )
    for note in (n for c in m.chain for n in c.notes):
        t.add_row("[yellow]note[/]", safe(note))
    for a in m.artifacts:
        t.add_row("artifact", f"{safe(a.path)}  {a.bytes / 1e6:.2f} MB  sha256 {a.sha256[:16]}…")
    if bundle.kind != "llm":
        io = bundle.io
        t.add_row("inputs", "; ".join(x.describe() for x in io.inputs))
        t.add_row("outputs", "; ".join(x.describe() for x in io.outputs))
    fz = m.source.frozen if m.source is not None else None
    if fz is not None:
        vals = ", ".join(f"{f.name}={','.join(f'{v:g}' for v in f.value)}" for f in fz.inputs)
        t.add_row(
            "frozen",
            f"{vals} ({fz.inlined_if} If inlined"
            + (f"; {len(fz.kept_if)} If read input data and stay" if fz.kept_if else "")
            + ")",
        )
    par = m.parity
    if isinstance(par, LLMQualityEvidence):
        d = m.chain[0].details if m.chain and isinstance(m.chain[0].details, Mapping) else {}
        try:
            t.add_row(
                "quantization",
                f"{d['quant_type']} ({d['dominant_type']}), {d['parameters']:,} parameters, "
                f"{d['source_bytes'] / 1e6:.1f} MB -> {d['bytes'] / 1e6:.1f} MB ({d['size_ratio']:.0%})",
            )
        except (KeyError, TypeError, ValueError):  # free-form converter details: shown when they are the usual
            pass
        verdict = "[green]pass[/]" if par.passed else "[red]FAIL (accepted)[/]"
        th = par.thresholds
        t.add_row(
            "quality gate",
            f"{verdict}: mean KL {par.kl_mean:.4g} (p99 {par.kl_p99:.3g}, limit "
            f"{th.max_kl_mean}), top-1 {par.top1:.1%} (min {th.min_top1:.0%}) "
            f"on {par.tokens} tokens vs the source",
        )
    elif isinstance(par, SkippedParity):
        t.add_row("parity", f"[yellow]not run[/]: {safe(par.skipped)}")
    elif isinstance(par, ParityEvidence):
        verdict = "[green]pass[/]" if par.passed else "[red]FAIL (accepted)[/]"
        if par.passed and par.unverified:
            verdict = f"[yellow]unverified[/] ({safe(par.unverified)})"
        cand = par.candidate
        t.add_row(
            "parity",
            f"{verdict} on {par.samples} {par.inputs} inputs, checked on {cand.device_used} in {cand.precision_used}"
            + (f" [yellow](fallback: {safe(cand.fallback)})[/]" if cand.fallback else ""),
        )
        t.add_row("computes in", compute_line(par, bundle.info.runner.options_dict))
        prov = par.input_provenance
        if prov is not None and prov.disjoint_from_calibration is not None:
            t.add_row(
                "  inputs", "disjoint from the calibration samples" + (f" ({safe(prov.note)})" if prov.note else "")
            )
        for o in par.outputs:
            top1 = f", top-1 {o.top1:.1%}" if o.top1 is not None else ""
            snr = f", SNR {o.snr_db:.1f} dB" if o.snr_db is not None else ""
            t.add_row(
                f"  {o.name}",
                f"cosine {o.cosine:.6f} (worst {o.cosine_min:.6f}){snr}, max abs {o.max_abs:.4g}"
                + (f" ({o.rel_max_abs:.2%} of range)" if o.rel_max_abs is not None else "")
                + f", mean abs {o.mean_abs:.4g}{top1}",
            )
            if o.task is not None:
                figs = {
                    "top-1": o.top1 if o.task == "classifier" else None,
                    "top-5": o.top5,
                    "precision": o.precision,
                    "recall": o.recall,
                    "IoU": o.iou,
                    "sequences": o.sequence,
                    "tokens": o.tokens,
                }
                shown = ", ".join(f"{k} {v:.1%}" for k, v in figs.items() if v is not None) or "not judged"
                t.add_row(
                    f"  {o.name} ({o.task})",
                    shown + (f" [yellow]({safe(o.task_note)})[/]" if o.task_degenerate and o.task_note else ""),
                )
            if o.degenerate:
                t.add_row(
                    f"  {o.name}",
                    f"[yellow]degenerate reference[/]: {safe(o.degenerate_note or '')}; gated on absolute "
                    "error only (give --parity-data with real inputs)",
                )
    console.print(t)


def render_explanation(found: dict[str, Any]) -> None:
    """``--explain`` as a table: one row per conclusion, its evidence beside it."""
    t = Table(title=f"what edgekit concludes about {safe(found['model'])} ({found['format']})", show_lines=True)
    t.add_column("tensor")
    t.add_column("conclusion")
    t.add_column("evidence")
    if found.get("quantized"):
        t.add_row("(model)", "already quantized: its own precision is kept", safe(found["quantized"]))
    for i in found.get("inputs", []):
        layout = f" {i['layout']}" if i["layout"] else ""  # a feature or audio input has none (was "[1, 43844, 1] ;")
        what = f"{i['dtype']}{i['shape']}{layout}; pre-processing {i['preprocess'] or 'none'}"
        t.add_row(f"in {safe(i['name'])}", safe(f"{what}; fed {i['generator']}"), safe(i["evidence"]))
    for o in found.get("outputs", []):
        t.add_row(
            f"out {safe(o['name'])}", safe(f"task {o['task'] or 'none'}: {o.get('metric', '')}"), safe(o["evidence"])
        )
    if found.get("note"):
        t.add_row("(model)", safe(found["note"]), "")
    console.print(t)


def convert_cmd(
    model: Path = typer.Argument(
        ...,
        help="Source model: .onnx; .tflite; OpenVINO IR .xml (+ .bin); TorchScript "
        "/ torch.export .pt, .ts, .pt2 (needs --input-shape); or .gguf (language model).",
    ),
    target: str = typer.Option(
        ..., "--target", "-t", help="Target profile, e.g. x86-cpu, intel-igpu (see `edgekit targets`)."
    ),
    output: Path | None = typer.Option(
        None,
        "--output",
        "-o",
        help="Bundle directory (default: build/<model>-<target>-<precision>).",
        show_default=False,
    ),
    precision: str | None = Precision,
    calib: str | None = Calib,
    input_shape: list[str] | None = InputShape,
    preprocess: str = Preprocess,
    letterbox: bool | None = Letterbox,
    freeze_input: list[str] | None = FreezeInput,
    accept_parity_failure: bool = AcceptParity,
    allow_requantize: bool = AllowRequantize,
    parity_samples: int = typer.Option(
        32, "--parity-samples", help="Inputs compared against the source model in its reference runtime."
    ),
    force: bool = typer.Option(False, "--force", help="Replace an existing bundle at --output."),
    eval_text: Path | None = EvalText,
    parity_data: Path | None = ParityData,
    task: str = Task,
    sign_key: str | None = SignKey,
    tuned: Path | None = Tuned,
    targets_dir: list[Path] | None = TargetsDir,
    as_json: bool = JsonOut,
    no_isa_check: bool = NoIsaCheck,
    explain: bool = typer.Option(
        False,
        "--explain",
        help="Say what edgekit concludes about the model (per input: "
        "kind, layout, pre-processing, generated inputs; per output: task and metric; each "
        "with its evidence) and stop, converting nothing.",
    ),
) -> None:
    """Convert MODEL for a target into a verified bundle (artifacts + manifest.json), checking parity."""
    if explain:
        from edge.pipeline.explain import explain as explain_model

        request = convert_request(precision, calib, input_shape, preprocess, letterbox, freeze_input, targets_dir)
        found = explain_model(model, request.replace(task=task))
        print_json(found) if as_json else render_explanation(found)
        return
    overlay = None
    if tuned is not None:  # read (and refused) before any work; convert applies it
        from edge.pipeline.overlay import read_overlay

        overlay = read_overlay(tuned)
    request = convert_request(precision, calib, input_shape, preprocess, letterbox, freeze_input, targets_dir).replace(
        accept_parity_failure=accept_parity_failure,
        parity_samples=parity_samples,
        allow_requantize=allow_requantize,
        eval_text=eval_text,
        parity_data=parity_data,
        task=task,
        tuned=overlay,
    )
    if output is None:
        from edge.pipeline.overlay import resolve_precision
        from edge.targets import get_target

        profile = get_target(target, dirs(targets_dir))
        if model.suffix.lower() in (".gguf", ".tflite", ".xml"):
            default = "keep"
        else:
            default = profile.default_precision
        shown = resolve_precision(overlay, precision) if overlay is not None else precision
        output = Path("build") / f"{model.stem}-{target}-{shown or default}"
    with steps(not as_json) as say:
        bundle = convert(model, target, output, request, force=force, on_step=say)
        isa_line = isa_check(
            bundle, target, targets_dir, enabled=not no_isa_check, accept_failure=accept_parity_failure, say=say
        )
        bundle = sign_if_configured(Bundle.open(bundle.path, trust=False), sign_key, say)
    if as_json:
        print_json(
            {
                "bundle": str(bundle.path),
                "manifest": bundle.manifest,
                "isa_check": isa_line,
                **({"tuned_applied": overlay.describe()} if overlay is not None else {}),
            }
        )
    else:
        render_bundle(bundle)
        if isa_line:
            console.print(escape(isa_line), highlight=False)
        if overlay is not None:
            console.print(f"tuned overlay {safe(tuned)} applied: {safe(overlay.describe())}", highlight=False)
