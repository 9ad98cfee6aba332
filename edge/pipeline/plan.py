"""The planner: which converters take a source of a given format to what the target's runner loads.

Checked end to end before any work starts: source format -> each converter's input/output format
-> the runner's ``formats``; every missing package, toolchain or place problem in one error.

How a chain is chosen for a source format F (the profile's ``[convert] chain`` is written for ONNX):

1. a step of the profile's chain reads F: the chain from that step on (a full-integer TFLite for
   coral-edgetpu goes straight to ``tflite->edgetpu``);
2. a registered converter reads F and writes the chain's final format (``torch->coreml``);
3. the runner loads F itself: no converter, the file ships as it is (a TFLite for arm-xnnpack, an
   OpenVINO IR for intel-igpu, a pre-quantized GGUF kept as it is);
4. a registered converter reads F and writes the chain's first input (``torch->onnx``), then the
   profile's chain;
5. otherwise refused, naming the formats on both sides.

A source that rule 1 or 3 would take but cannot be had that way goes through rule 4 where a converter
exists (``plan(..., full_integer=False)``): a float TFLite for coral-edgetpu, whose ``tflite->edgetpu``
takes full-integer models only, and a float TFLite asked int8 for arm-xnnpack, become ONNX with tf2onnx
(``tflite->onnx``) and take the profile's int8 chain; parity is still judged against the TFLite source.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import edge
from edge.backends.converter import CONVERTERS, Converter
from edge.backends.runner import RUNNERS
from edge.capabilities import Host, current_host
from edge.errors import EdgeError, MissingDependencyError, PrecisionError, TargetError, UnknownBackendError
from edge.targets import ChainStep, TargetProfile

Step = Callable[[str], None]

#: "ship the source's own precision": the default for sources that ship as they are
KEEP = "keep"


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
    source_format: str = "onnx"
    route: str = "the profile's chain"  # how the chain was chosen (rule of the module docstring)
    runner: str = ""

    @property
    def ships_source(self) -> bool:
        return not self.steps


def conversion_problems(
    target: TargetProfile, host: Host | None = None, chain: tuple[ChainStep, ...] | None = None
) -> list[str]:
    """Everything that stops this host from running ``target``'s converter chain (empty: it can)."""
    host = host or current_host()
    chain = target.chain if chain is None else chain
    found: list[str] = []
    if chain and not target.convert_place.allows(host):
        found.append(
            f"conversion for {target.name} runs on {'/'.join(target.convert_place.os)} "
            f"{'/'.join(target.convert_place.arch)}; this host is {host.os}/{host.arch}"
        )
    for s in chain:
        try:
            cls = CONVERTERS.get(s.converter)
        except UnknownBackendError:
            found.append(
                f"converter {s.converter!r} is not in edgekit {edge.__version__} (installed: {', '.join(CONVERTERS.names())})"
            )
            continue
        found += [f"{cls.name}: {p}" for p in cls.problems(host)]
    return found


def _converters() -> list[type[Converter]]:
    out = []
    for name in CONVERTERS.names():
        try:
            out.append(CONVERTERS.get(name))
        except EdgeError:
            continue
    return out


def resolve_chain(
    target: TargetProfile,
    source_format: str,
    *,
    runner: str | None = None,
    base: tuple[ChainStep, ...] | None = None,
    source_name: str | None = None,
) -> tuple[tuple[ChainStep, ...], str]:
    """The chain for a source of ``source_format`` (rules 1-5 of the module docstring) and which rule chose it.

    ``source_name`` (the file's name) makes a refusal name the file the user gave."""
    chain = target.chain if base is None else base
    runner = runner or target.runner
    if any(s.converter not in CONVERTERS for s in chain):
        return chain, "the profile's chain"  # the planner reports every unknown converter together
    if chain:
        for i, s in enumerate(chain):
            if CONVERTERS.get(s.converter).source_format == source_format:
                return chain[i:], "the profile's chain" if i == 0 else f"the profile's chain from {s.converter}"
        final = CONVERTERS.get(chain[-1].converter).target_format
        first = CONVERTERS.get(chain[0].converter).source_format
        for cls in _converters():
            if (
                cls.source_format == source_format
                and cls.target_format == final
                and final != first
                and cls.source_format != cls.target_format
            ):  # a same-format rewrite is chosen by plan()
                return (ChainStep(cls.name),), f"{cls.name} (reads {source_format}, writes {final})"
    try:
        formats = RUNNERS.get(runner).formats
    except UnknownBackendError:
        formats = ()
    if source_format in formats:
        return (), f"shipped as it is: runner {runner!r} loads {source_format}"
    if chain:
        first = CONVERTERS.get(chain[0].converter).source_format
        for cls in _converters():
            if cls.source_format == source_format and cls.target_format == first:
                return (ChainStep(cls.name, "fp32"),) + tuple(chain), f"{cls.name}, then the profile's chain"
    reads = ", ".join(sorted({CONVERTERS.get(s.converter).source_format for s in chain}))
    what = f"{source_name} ({source_format})" if source_name else f"{_a(source_format)} {source_format} source"
    raise TargetError(
        f"target {target.name} cannot take {what}: its converter chain reads {reads or '-'}, its runner "
        f"{runner!r} loads {', '.join(formats) or '-'}, and no installed converter turns {source_format} "
        "into either",
        hint=(CONVERTERS.get(chain[0].converter).brings if chain else "") or _bring_instead(source_format),
    )


def source_problem(target: TargetProfile, source_format: str, path: Path, source_name: str | None = None) -> None:
    """Raise the first converter's refusal of the file at ``path`` (``Converter.source_problem``: a TorchScript
    archive for a chain that lowers torch.export programs), before the plan checks what must be installed."""
    chain, _ = resolve_chain(target, source_format, source_name=source_name)
    if chain and chain[0].converter in CONVERTERS:
        refused = CONVERTERS.get(chain[0].converter).source_problem(path)
        if refused is not None:
            raise refused


def _through_chain_input(
    target: TargetProfile, source_format: str, chain: tuple[ChainStep, ...], route: str, why: str
) -> tuple[tuple[ChainStep, ...], str]:
    """Rule 4 in place of ``chain``: a converter from ``source_format`` to the profile's chain's first input,
    then the whole chain; ``chain`` and ``route`` unchanged where none exists (the caller's refusal follows)."""
    if not target.chain or any(s.converter not in CONVERTERS for s in target.chain):
        return chain, route
    first = CONVERTERS.get(target.chain[0].converter).source_format
    for cls in _converters():
        if cls.source_format == source_format and cls.target_format == first and first != source_format:
            return (ChainStep(cls.name, "fp32"),) + tuple(target.chain), f"{cls.name}, then the profile's chain ({why})"
    return chain, route


def _a(word: str) -> str:
    return "an" if word[:1].lower() in "aeio" else "a"


def _bring_instead(source_format: str) -> str:
    return {
        "tflite": "a TFLite source converts for ONNX chains through tflite->onnx (tf2onnx in the tflite toolchain), "
        "for OpenVINO through tflite->openvino-ir, and runs on LiteRT; otherwise bring the model's ONNX",
        "openvino-ir": "an OpenVINO IR runs on intel-igpu (OpenVINO, CPU fallback included); for other targets bring the model's ONNX",
        "edgetpu-tflite": "a model compiled for the Edge TPU runs only on coral-edgetpu",
        "torchscript": "install the torch toolchain (edgekit toolchain install torch) or torch.onnx.export the model",
    }.get(source_format, "bring the model as ONNX")


#: what an already-quantized source holds (edge.graph.quantized): kept, never quantized again
QUANTIZED = ("int8", "int8-dynamic")


def _keep_quantized(target: TargetProfile, precision: str | None, own: str, what: str) -> str:
    """The bundle precision for an already-quantized ONNX: its own. int8 asked is what it is (quantizing its
    Q/DQ graph again fails in onnxruntime's quantizer, ``KeyError: '..._scale'``, or rounds twice); a float
    precision cannot be had (the float weights are not in the file) and is refused in one line."""
    if precision not in (None, KEEP, *QUANTIZED):
        raise PrecisionError(
            f"{what} is already quantized ({own}); its float weights are not in the file, so edgekit cannot make it {precision}",
            hint=f"drop --precision (or pass --precision {KEEP}) to ship its own quantization, "
            f"recorded; for {precision}, bring the float model",
        )
    if own not in target.precisions:
        raise PrecisionError(
            f"{what} is already quantized ({own}); {target.name} does not run {own} models (it runs {', '.join(target.precisions)})",
            hint="bring the float model",
        )
    return own


def _planned_steps(
    target: TargetProfile, chain: Sequence[ChainStep], source_format: str, source_precision: str | None, precision: str
) -> tuple[list[PlannedStep], str]:
    """Each chain step checked (its precision, that it reads what the previous one writes, its options).

    Returns the planned steps and the format the chain ends in.
    """
    steps: list[PlannedStep] = []
    fmt = source_format
    for s in chain:
        cls = CONVERTERS.get(s.converter)
        # an already-quantized graph is converted as it is: its own Q/DQ and integer ops, never quantized again
        step_precision = (
            "fp32"
            if source_format == "onnx" and precision == source_precision and precision in QUANTIZED
            else s.precision or precision
        )
        if step_precision not in cls.precisions:
            raise PrecisionError(
                f"converter {cls.name!r} cannot produce {step_precision!r} (it supports {', '.join(sorted(cls.precisions))})"
            )
        if cls.source_format != fmt:
            raise EdgeError(
                f"target {target.name}: converter {cls.name!r} reads {cls.source_format}, but the previous step produces {fmt}"
            )
        fmt = cls.target_format
        options = dict(target.convert_options.get(s.converter, {}))
        if not options and s.converter not in target.convert_options and steps == [] and len(chain) == 1:
            # a converter standing in for the profile's chain (torch->coreml for onnx->coreml) takes the
            # options it shares with the step it replaces
            replaced = target.chain[-1].converter if target.chain else None
            options = {k: v for k, v in target.convert_options.get(replaced or "", {}).items() if k in cls.options}
        cls.check_options(options)
        steps.append(PlannedStep(cls, step_precision, options))
    return steps, fmt


def plan(
    target: TargetProfile,
    precision: str | None = None,
    *,
    source_format: str = "onnx",
    source_precision: str | None = None,
    source_name: str | None = None,
    full_integer: bool | None = None,
) -> Plan:
    """Resolve the chain for the source and check every requirement up front; all problems in one error.

    ``source_precision``: what the source already holds (a TFLite, an IR); when the chain is empty it
    is the bundle's precision and asking for another one is an error that says how to get it.
    ``source_name``: the file's name, for the messages. ``full_integer``: False for a source with float
    compute (a float TFLite): a first step that takes full-integer models only is replaced by rule 4.
    """
    chain, route = resolve_chain(target, source_format, source_name=source_name)
    if full_integer is False and chain and CONVERTERS.get(chain[0].converter).full_integer_only:
        chain, route = _through_chain_input(target, source_format, chain, route, "it is not full-integer")
    what = f"{source_name} ({source_format})" if source_name else f"{_a(source_format)} {source_format} source"
    own = source_precision or "fp32"
    if not chain and precision not in (None, KEEP, own):
        rewrite = next(
            (
                c
                for c in _converters()
                if c.source_format == c.target_format == source_format and precision in c.precisions
            ),
            None,
        )
        if rewrite is not None:  # e.g. tflite->tflite: an fp16-weight .tflite made fp32
            chain, route = (ChainStep(rewrite.name, precision),), f"{rewrite.name} ({own} source, {precision} asked)"
        else:  # e.g. int8 of a float TFLite for arm-xnnpack: tf2onnx, then the profile's chain quantizes
            chain, route = _through_chain_input(target, source_format, chain, route, f"{own} source, {precision} asked")
    if not chain:
        if precision not in (None, KEEP, own):
            raise PrecisionError(
                f"{what} ships to {target.name} as it is, in its own precision {own}; edgekit cannot make it {precision}",
                hint=f"drop --precision (or pass --precision {KEEP}); for {precision}, bring the model's ONNX instead",
            )
        precision = own
        if precision not in target.precisions and not precision.startswith("int8"):
            raise PrecisionError(
                f"{what} is {own}; {target.name} does not run {own} models (it runs {', '.join(target.precisions)})",
                hint="bring the model's ONNX instead",
            )
    elif source_precision in QUANTIZED and source_format == "onnx":
        precision = _keep_quantized(target, precision, source_precision, what)
    else:
        precision = target.check_precision(precision or target.default_precision)
    missing = conversion_problems(target, chain=chain)
    if missing:
        raise MissingDependencyError(f"cannot convert for {target.name} on this host: " + "; ".join(missing))
    steps, fmt = _planned_steps(target, chain, source_format, source_precision, precision)
    try:
        formats = RUNNERS.get(target.runner).formats
    except UnknownBackendError:
        formats = ()
    if formats and fmt not in formats:
        raise TargetError(
            f"target {target.name}: the chain ends in {fmt}, which runner {target.runner!r} does not load (it loads {', '.join(formats)})"
        )
    needs_calib = any(st.precision in st.converter.calibrated_precisions for st in steps)
    return Plan(
        target, precision, tuple(steps), needs_calib, runnable_here(target), source_format, route, target.runner
    )


def runnable_here(target: TargetProfile, host: Host | None = None, runner: str | None = None) -> str | None:
    """None when this host can run the target's runner (possibly on a fallback device), else every reason."""
    host = host or current_host()
    runner = runner or target.runner
    found: list[str] = []
    if not target.run_place.allows(host):
        found.append(
            f"{target.name} runs on {'/'.join(target.run_place.os)} {'/'.join(target.run_place.arch)}, this host is {host.os}/{host.arch}"
        )
    if target.run_place.needs_gpu and not host.nvidia_gpu:
        found.append("needs an NVIDIA GPU, this host has none")
    try:
        cls = RUNNERS.get(runner)
        if target.run_place.needs_device:
            # a runner that can check for its accelerator says exactly what is missing (and None when it is here)
            check = getattr(cls, "device_problem", None)
            why = check() if callable(check) else ""
            if why is not None:
                found.append(f"needs the device's accelerator ({target.accelerator})" + (f": {why}" if why else ""))
        found += cls.problems(host)
    except UnknownBackendError:
        found.append(f"runner {runner!r} is not in edgekit {edge.__version__}")
    return "; ".join(found) if found else None
