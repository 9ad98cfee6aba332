"""The converter contract.

A converter turns one artifact format into another. It declares, as class data, the
formats, the precisions it supports, what it needs on the host and the options it reads,
so the planner and ``doctor`` can answer before any work starts. Its heavy SDK is imported
inside ``convert``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping

from edge.backends.options import option_docs, read_options
from edge.backends.registry import Registry
from edge.backends.runner import RunnerInfo
from edge.capabilities import Host, Requirement, problems
from edge.errors import ConversionError, EdgeError, PrecisionError, did_you_mean
from edge.graph.opsupport import OpSupport
from edge.spec import Calibration, IOSpec, PreprocessSpec


@dataclass(frozen=True)
class ConversionRequest:
    source: Path  # the input artifact of this step
    workdir: Path  # an empty directory the converter writes into
    precision: str
    io: IOSpec  # static I/O of the source
    preprocess: PreprocessSpec | None = None
    calibration: Calibration | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    #: --freeze-input values the converter bakes into the graph it writes (a PyTorch source's int, float and bool
    #: arguments: ``{"sr": "16000"}``); given only to a converter that declares ``takes_freeze``
    freeze: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class HostProxy:
    """What a converter computed on this host in place of the bundle's own runtime, for a target whose runtime
    cannot run here (Core ML off macOS): the candidate for the parity gate when no runner can be opened.

    ``inputs`` are the exact feeds the proxy ran on (the converter's parity samples, not the pipeline's), so the
    reference must be computed on them: ``outputs[i]`` answers ``inputs[i]``. ``precision_used`` is in
    :class:`RunnerInfo`'s vocabulary ("f16", "f32"): an fp16 bundle whose proxy could only run fp32 says so
    here and in ``fallback``, never in the label alone.
    """

    label: str  # who computed them and how, e.g. "torch 2.13.0 CPU fp16 (the traced module, cast to half)"
    precision_used: str  # what the arithmetic was actually in: "f16" | "f32"
    inputs: list[dict[str, Any]]  # the parity inputs, as fed (name -> array)
    outputs: list[dict[str, Any]]  # per input, in the same order: output name -> array
    inputs_from: str  # "generated" | "calibration": what the inputs are, for the report
    fallback: str | None = None  # why it did not compute in the bundle's precision
    #: what computed them, as reports print it ("checked on ..."): a vendor's simulator names itself here
    device_used: str = "CPU"

    @property
    def info(self) -> RunnerInfo:
        """The parity report's candidate: names the proxy and its precision, like a runner's ``info``."""
        return RunnerInfo(
            runtime=f"host proxy: {self.label}",
            device_requested="CPU",
            device_used=self.device_used,
            precision_used=self.precision_used,
            fallback=self.fallback,
        )


@dataclass
class ConversionResult:
    artifact: Path  # the primary artifact (what the next step or the runner loads)
    format: str
    files: list[Path]  # every file produced, the primary one included
    tool_versions: dict[str, str]
    details: dict[str, Any] = field(default_factory=dict)  # the recipe actually applied
    notes: list[str] = field(default_factory=list)
    #: when the converter ran the source model itself (a PyTorch source): the inputs and its outputs on them,
    #: the parity reference for the bundle
    reference: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None
    #: when the bundle's runtime cannot run on this host, the converter's own stand-in for it (see
    #: :class:`HostProxy`). Its ``inputs`` are the converter's: for an ONNX source the reference is the source
    #: in onnxruntime on ``proxy.inputs`` (not on the pipeline's parity inputs); for a PyTorch source they are
    #: ``reference[0]`` itself, so ``reference[1]`` is the reference
    proxy: HostProxy | None = None


class Converter(ABC):
    name: ClassVar[str]
    source_format: ClassVar[str]
    target_format: ClassVar[str]
    precisions: ClassVar[frozenset[str]]
    requires: ClassVar[tuple[Requirement, ...]] = ()
    #: option name -> one-line description; anything else in the profile is an error. Derived from
    #: ``options_class`` where a converter declares one
    options: ClassVar[Mapping[str, str]] = {}
    #: the converter's options declared once, typed (a frozen dataclass of ``spec`` fields, as a runner's are:
    #: ``edge.backends.options``): ``options`` comes from it and :meth:`read_options` checks a request against it
    options_class: ClassVar[type | None] = None
    #: precisions that need calibration samples
    calibrated_precisions: ClassVar[frozenset[str]] = frozenset()
    #: what runs full-integer int8 models only, for the message (the Edge TPU): a TFLite source that is not
    #: full-integer goes through tflite->onnx and the profile's int8 chain (edge.pipeline.plan), and is refused
    #: before any work where no such chain exists; None: any TFLite is taken
    full_integer_only: ClassVar[str | None] = None
    #: the toolchain environment (edge.toolchains) the converter runs in, if any; a missing one is
    #: reported like a missing package, before any work
    toolchain: ClassVar[str | None] = None
    #: whether it gives a source's non-tensor arguments the --freeze-input values (``ConversionRequest.freeze``)
    takes_freeze: ClassVar[bool] = False
    #: what a user should bring to a target whose chain starts with this converter, when the source they gave cannot
    #: be taken (the planner's refusal names it); empty: the planner's generic advice for the source's format
    brings: ClassVar[str] = ""

    @classmethod
    def source_problem(cls, path: Path) -> EdgeError | None:
        """Why this converter cannot take the source file at ``path`` although its format is the one it reads (a
        TorchScript archive for a converter that lowers torch.export programs only): checked before the plan's
        requirements, so the user hears it before being told to install a toolchain. None: no such limit."""
        return None

    @classmethod
    def op_support(cls) -> OpSupport | None:
        """The ONNX ops this converter cannot express, declared in its own backend folder and checked before any
        heavy work (``edge.graph.opsupport.check_ops``); None: no declared limits (the default)."""
        return None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = cls.__dict__.get("options_class")
        if declared is not None:
            cls.options = option_docs(declared)

    @classmethod
    def read_options(cls, options: Mapping[str, Any]) -> Any:
        """``options`` read into ``options_class`` (unknown names, wrong types, out-of-range values refused in one
        line naming the converter and the option; defaults filled in)."""
        if cls.options_class is None:
            raise ConversionError(f"converter {cls.name!r} declares no typed options")
        cls.check_options(options)  # unknown names first, with "did you mean"
        try:
            return read_options(cls.name, cls.options_class, options, kind="converter")
        except EdgeError as e:
            raise ConversionError(e.message, hint=e.hint) from None

    @classmethod
    def problems(cls, host: Host | None = None) -> list[str]:
        found = problems(cls.requires, host)
        if cls.toolchain is not None:
            from edge import toolchains

            found += toolchains.problems(cls.toolchain)
        return found

    def check_precision(self, precision: str) -> None:
        if precision not in self.precisions:
            raise PrecisionError(
                f"converter {self.name!r} does not produce precision {precision!r}",
                hint=f"choose one of {', '.join(sorted(self.precisions))}",
            )

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        bad = [k for k in options if k not in cls.options]
        if bad:
            raise ConversionError(
                f"converter {cls.name!r} does not take option(s) "
                + ", ".join(f"{k!r} ({did_you_mean(k, list(cls.options))}".rstrip("? ") + ")" for k in bad)
                + f"; it takes: {', '.join(cls.options) or 'none'}"
            )

    @abstractmethod
    def convert(self, request: ConversionRequest) -> ConversionResult: ...


CONVERTERS: Registry[Converter] = Registry("edgekit.converters", "converter")
