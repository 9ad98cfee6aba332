"""Precision by evidence on CPUs (issue #25 item 2): OpenVINO's fast precision only where parity says so.

OpenVINO's CPU plugin computes in bf16 by default on CPUs that have it (AVX512-BF16, AMX: the plugin
lists ``BF16`` in ``OPTIMIZATION_CAPABILITIES``): 2-2.5x faster than f32 for YOLOv8n-320 on an
AVX512-BF16 EPYC, but coarser (MediaPipe's selfie segmentation fell to cosine 0.988). The runner
therefore pins f32 for fp32 and fp16 bundles (``inference_precision = "bundle"``).

Here, where the bundle is built and its f32 parity has passed, the same inputs are run once more with
``inference_precision = "fast"`` (bf16 on this CPU) against the same reference, at the bf16 limits of
``edge.verify.parity``. The result is kept in the manifest as evidence (``parity.precision_trials``);
only when it passed do the bundle's runner options say ``inference_precision = "fast"``, so a device
whose CPU lists BF16 computes in bf16 and every other CPU in f32. The device's reference-pair check
(``edge.verify.refpairs``) compares its own bf16 outputs with the reference on first load, at the same
bf16 limits. Where this host cannot compute bf16 nothing is tried and the bundle stays f32 everywhere:
no evidence, no bf16. An explicit ``inference_precision`` (profile, tuned overlay) is never changed.

The same idea for LiteRT's XNNPack in fp16 (:func:`skip_xnnpack_fp16`): fp16 compute pays only where the CPU
has fp16 arithmetic (ARM FEAT_FP16 ``asimdhp``, x86 AVX512-FP16/AMX-FP16); elsewhere (an x86 CPU with F16C
only converts) the trial is not run and the manifest says why (``parity.precision_trials_skipped``). Where the
CPU has it, ai-edge-litert's ``Interpreter`` (the runner's API) still cannot ask XNNPack for fp16 (FORCE_FP16 is
a ``CompiledModel`` CPU option only), and the record says that instead. onnxruntime's int8 setting
(``x64_quant_precision``) needs no trial: u8s8 and u8u8 compute the same where the runner picks u8s8 (VNNI/AMX).

Which runner has which trial is the runner's own declaration (``Runner.fast_cpu_precision``,
``Runner.fp16_trial_skip``, in its backend folder); this module names no runner.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from edge.backends.runner import RUNNERS, Runner
from edge.bundle.bundle import Bundle
from edge.capabilities import CpuIsa, cpu_isa
from edge.errors import EdgeError

#: bundle precisions whose OpenVINO CPU default the trial may change (int8 already runs in the device's default)
TRIAL_PRECISIONS = ("fp32", "fp16")


def _runner(name: str) -> type[Runner] | None:
    return RUNNERS.get(name) if name in RUNNERS else None


def fast_precision(runner: str) -> str | None:
    """The faster CPU precision ``runner`` declares (``Runner.fast_cpu_precision``: OpenVINO's bf16), if any."""
    cls = _runner(runner)
    return cls.fast_cpu_precision if cls is not None else None


def trial_wanted(runner: str, options: Mapping[str, Any], precision: str, parity_passed: bool | None) -> str | None:
    """None when the fast-precision (bf16) trial should run; else why not (a sentence for the build log)."""
    if fast_precision(runner) is None:
        return f"runner {runner} has no fast CPU precision to try"
    chosen = str(options.get("inference_precision", "bundle")).lower()
    if chosen != "bundle":
        return f"inference_precision = {chosen!r} was set explicitly"
    if precision not in TRIAL_PRECISIONS:
        return f"a {precision} bundle already computes in the device's default"
    if parity_passed is not True:
        return "the bundle's own parity did not pass"
    return None


def try_fast_precision(
    precision: str,
    stage: Path,
    manifest: dict[str, Any],
    inputs: list[dict[str, Any]],
    reference: list[dict[str, Any]],
    *,
    label: str,
    reference_label: str,
    parity_opts: Mapping[str, Any],
    say: Callable[[str], None],
) -> dict[str, Any] | None:
    """Run the bf16 trial on this host when it applies; record it in ``manifest`` and return it (None: not run)."""
    from edge.verify.parity import check_parity

    spec = manifest["runner"]
    options = dict(spec.get("options") or {})
    parity = manifest.get("parity") or {}
    compute = fast_precision(spec["name"])
    if compute is None or trial_wanted(spec["name"], options, precision, parity.get("passed")) is not None:
        return None
    trial_manifest = {**manifest, "runner": {**spec, "options": {**options, "inference_precision": "fast"}}}
    try:
        runner = Bundle(stage, trial_manifest).open_runner()
    except EdgeError as e:  # the f32 bundle passed: a failing trial only means no bf16
        say(f"{compute} trial not run: {e.message}")
        return None
    with runner:
        info = runner.info
        fast = info.details.get("fast_precision") or {}
        caps = [str(c) for c in fast.get("capabilities", [])]
        if info.device_used != "CPU" or info.precision_used != compute:
            say(
                f"{compute} trial not run: {info.device_used} computes in {info.precision_used} "
                f"(CPU capabilities: {', '.join(caps) or 'not reported'})"
            )
            return None
        say(f"checking parity in {compute} ({info.device_used}) on {len(inputs)} {label} inputs")
        report = check_parity(
            runner,
            inputs,
            reference,
            precision=precision,
            inputs=label,
            reference_label=reference_label,
            **dict(parity_opts),
        )
    data = report.to_json()
    trial = {
        "compute": compute,
        "passed": report.passed,
        "thresholds": data["thresholds"],
        "candidate": data["candidate"],
        "outputs": data["outputs"],
        "failures": report.failures()[:64],
        "capabilities": caps[:64],
    }
    parity.setdefault("precision_trials", []).append(trial)
    manifest["parity"] = parity
    if report.passed:
        options["inference_precision"] = "fast"
        manifest["runner"] = {**spec, "options": options}
        say(
            f"{compute} passed parity: the bundle computes in {compute} on CPUs that list {compute.upper()} "
            "(inference_precision fast)"
        )
    else:
        say(f"{compute} failed parity (" + "; ".join(report.failures()[:3]) + "): the bundle stays f32 on CPUs")
    return trial


def xnnpack_fp16_skip(runner: str, precision: str, isa: CpuIsa) -> str | None:
    """Why the CPU fp16 trial is not run for a ``runner`` bundle of ``precision`` on a CPU ``isa``, as the runner
    declares it (``Runner.fp16_trial_skip``: LiteRT's XNNPack); None when it does not apply (another runner, an int8
    bundle)."""
    cls = _runner(runner)
    return cls.fp16_trial_skip(precision, isa) if cls is not None else None


def skip_xnnpack_fp16(
    precision: str, manifest: dict[str, Any], say: Callable[[str], None], isa: CpuIsa | None = None
) -> str | None:
    """Record in ``manifest`` why the XNNPack fp16 trial is not run on this host, where it applies; the reason."""
    runner = manifest["runner"]["name"]
    why = xnnpack_fp16_skip(runner, precision, isa or cpu_isa())
    if why is None:
        return None
    parity = manifest.get("parity")
    if isinstance(parity, dict):  # a bundle with no parity record (skipped) carries no trial either
        parity.setdefault("precision_trials_skipped", []).append({"compute": "fp16", "runner": runner, "reason": why})
    say(f"fp16 trial not run: {why}")
    return why
