"""The bundle manifest, typed: one frozen dataclass tree, read once from ``manifest.json`` and validated.

A manifest comes from wherever the bundle came from, so nothing in it is trusted before it passed
here: the file's size and nesting, every field's type, length, range and character set, ids,
artifact paths (relative, inside the bundle), runner options (known to the runner, typed, and
never a path, library or command: those are the device's own configuration), and that its
parts agree (primary artifact listed, evidence about this precision and kind). Every problem
is one :class:`~edge.errors.ManifestError` naming the file and the field.

The same declarations give the published JSON Schema (``edge/bundle/manifest.schema.json``,
regenerate with ``python -m edge.bundle.schema``); a test keeps the two in step.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Mapping

from edge.base.typedjson import (
    JSON,
    Invalid,
    Rule,
    Tagged,
    join_path,
    json_schema,
    loads_strict,
    read,
    show_value,
    spec,
    to_json,
)
from edge.errors import ManifestError

SCHEMA_VERSION = 1
MAX_BYTES = 1 << 20  # a real manifest is a few kB; the toolchain's package list makes it ~10 kB
MAX_DEPTH = 32  # brackets deep; the deepest real field (chain[].details.toolchain.packages) is 6
SCHEMA_FILE = Path(__file__).with_name("manifest.schema.json")
SCHEMA_ID = "https://edgekit.dev/schemas/manifest-1.json"

#: bundle, target, runner and format ids: a name, never a path (no '/', no leading '.' or '-')
ID = r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$"
CONVERTER = r"^[A-Za-z0-9_][A-Za-z0-9._+>-]{0,63}$"  # "onnx->tflite"
SHA256 = r"^[0-9a-f]{64}$"
_SEG = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}"
#: a file inside the bundle: relative, '/'-separated, no '.', '..' or empty parts, no leading '.' or '-'
REL_PATH = rf"^{_SEG}(/{_SEG}){{0,15}}$"
TENSOR_NAME = r"^[^\x00-\x1f\x7f]{1,256}$"
#: a runner option's text value: a word, never a path or a command line (no '/', no space)
OPTION_TEXT = r"^[A-Za-z0-9_.:,+-]{0,64}$"
OPTION_KEY = r"^[a-z][a-z0-9_]{0,63}$"
VERSION = r"^[A-Za-z0-9_.+-]{1,64}$"
UTC_TIME = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]{5,15}(Z|[+-][0-9]{2}:[0-9]{2})?$"

Precision = Literal[
    "fp32",
    "fp16",
    "bf16",
    "int8",
    "int8-dynamic",
    "f16",
    "q8_0",
    "q5_k_m",
    "q4_k_m",
    "q4_0",
    # GGUF files shipped as they came (--precision keep): llama.cpp's file types
    "f32",
    "q4_1",
    "q5_0",
    "q5_1",
    "q2_k",
    "q2_k_s",
    "q3_k_s",
    "q3_k_m",
    "q3_k_l",
    "q4_k_s",
    "q5_k_s",
    "q6_k",
    "iq1_s",
    "iq1_m",
    "iq2_xxs",
    "iq2_xs",
    "iq2_s",
    "iq2_m",
    "iq3_xxs",
    "iq3_xs",
    "iq3_s",
    "iq3_m",
    "iq4_nl",
    "iq4_xs",
    "tq1_0",
    "tq2_0",
    "mxfp4_moe",
    "nvfp4",
    "q1_0",
]
DType = Literal[
    "float32",
    "float16",
    "float64",
    "bfloat16",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "bool",
]
_TEXT: dict[str, Any] = dict(max_len=1024)
_MS: dict[str, Any] = dict(ge=0.0, le=1e9)


# -- the tree -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TargetInfo:
    """The target profile the bundle was built for."""

    name: str = spec(pattern=ID)
    title: str = spec("", max_len=256)
    accelerator: str = spec("", max_len=256)
    frame_budget_ms: float | None = spec(None, ge=1e-9, le=1e7)
    profile_sha256: str | None = spec(None, pattern=SHA256)


@dataclass(frozen=True)
class FrozenInput:
    """A source input edgekit fixed to a value (``--freeze-input``): it is gone from the bundle's inputs."""

    name: str = spec(pattern=TENSOR_NAME)
    dtype: DType = spec()
    value: tuple[float, ...] = spec(min_items=1, max_items=4096, item=Rule(ge=-1e300, le=1e300))
    shape: tuple[int, ...] = spec((), max_items=1, item=Rule(ge=1, le=4096))


@dataclass(frozen=True)
class StaticInput:
    """A TFLite source input dynamic in the file (``shape_signature`` -1) that edgekit made static at the
    ``--input-shape`` given: the bundle's .tflite holds that shape, so the device runner resizes nothing."""

    name: str = spec(pattern=TENSOR_NAME)
    shape: tuple[int, ...] = spec(min_items=1, max_items=8, item=Rule(ge=1, le=1 << 28))
    shape_signature: tuple[int, ...] = spec(min_items=1, max_items=8, item=Rule(ge=-1, le=1 << 28))


@dataclass(frozen=True)
class FrozenCheck:
    """The frozen graph against the source on onnxruntime (``edge.graph.freeze``)."""

    samples: int = spec(ge=1, le=1 << 20)
    inputs: str = spec(max_len=128)
    max_error_over_range: float = spec(ge=0.0, le=1.0)


@dataclass(frozen=True)
class Frozen:
    """Inputs frozen to values, and the If nodes that then decided nothing at run time, inlined."""

    inputs: tuple[FrozenInput, ...] = spec(min_items=1, max_items=64)
    inlined_if: int = spec(0, ge=0, le=1 << 20)
    kept_if: tuple[str, ...] = spec((), max_items=32, item=Rule(pattern=TENSOR_NAME))
    check: FrozenCheck | None = None


@dataclass(frozen=True)
class SourceInfo:
    """The source model: its file name (never opened from here), hash, format and what its adapter read."""

    file: str = spec(pattern=r"^[^/\\\x00-\x1f\x7f]{1,256}$")
    sha256: str = spec(pattern=SHA256)
    format: str = spec(pattern=ID)
    opset: int | None = spec(None, ge=1, le=1000)
    producer: str | None = spec(None, max_len=256)
    architecture: str | None = spec(None, max_len=128)
    parameters: int | None = spec(None, ge=0)
    type: str | None = spec(None, max_len=64)
    bytes: int | None = spec(None, ge=0)
    io_names: str | None = spec(None, **_TEXT)
    route: str | None = spec(None, **_TEXT)  # how the pipeline took it to the target (edge.pipeline.plan)
    precision: str | None = spec(None, pattern=ID)  # what a TFLite / IR / quantized ONNX source already holds
    quantized: str | None = spec(None, **_TEXT)  # an already-quantized ONNX: scheme and ops (edge.graph.quantized)
    file_type: str | None = spec(None, pattern=ID)  # a GGUF source's llama.cpp file type
    weights: str | None = spec(None, pattern=r"^[^/\\\x00-\x1f\x7f]{1,256}$")  # an OpenVINO IR's .bin
    runtime: str | None = spec(None, max_len=256)  # the runtime that read it (OpenVINO version)
    ops: tuple[str, ...] = spec((), max_items=512, item=Rule(max_len=128))
    tensor_types: Mapping[str, int] | None = spec(None, max_items=64, item=Rule(ge=0))
    description: str | None = spec(None, **_TEXT)
    frozen: Frozen | None = None  # --freeze-input: what was fixed, and the If nodes inlined
    inputs_made_static: tuple[StaticInput, ...] = spec((), max_items=64)  # a TFLite's dynamic inputs, --input-shape


@dataclass(frozen=True)
class Artifact:
    """One file of the bundle, with its size and sha256."""

    path: str = spec(pattern=REL_PATH, max_len=1024)
    sha256: str = spec(pattern=SHA256)
    bytes: int = spec(ge=0, le=1 << 40)


@dataclass(frozen=True)
class ChainStep:
    """One conversion step as it ran: converter, precision, tool versions, what it did."""

    converter: str = spec(pattern=CONVERTER)
    precision: Precision | None = spec()
    output_format: str = spec(pattern=ID)
    tool_versions: Mapping[str, str | None] = spec(max_items=256, item=Rule(max_len=256))
    details: JSON = JSON(None)
    notes: tuple[str, ...] = spec((), max_items=64, item=Rule(**_TEXT))


@dataclass(frozen=True)
class Tensor:
    name: str = spec(pattern=TENSOR_NAME)
    shape: tuple[int | str, ...] = spec(max_items=16, item=Rule(ge=-1, le=1 << 31, max_len=64, pattern=TENSOR_NAME))
    dtype: DType = "float32"
    layout: Literal["NCHW", "NHWC"] | None = None

    def to_spec(self) -> Any:
        from edge.spec import TensorSpec

        return TensorSpec(self.name, self.shape, self.dtype, self.layout)


@dataclass(frozen=True)
class IO:
    inputs: tuple[Tensor, ...] = spec(max_items=256)
    outputs: tuple[Tensor, ...] = spec(max_items=256)

    def to_spec(self) -> Any:
        from edge.spec import IOSpec

        return IOSpec(tuple(t.to_spec() for t in self.inputs), tuple(t.to_spec() for t in self.outputs))


_3F = Rule(ge=-1e6, le=1e6)


@dataclass(frozen=True)
class Preprocess:
    """How a frame becomes the image input (``edge.spec.PreprocessSpec``)."""

    input: str = spec(pattern=TENSOR_NAME)
    size: tuple[int, int] = spec(item=Rule(ge=1, le=65536))
    layout: Literal["NCHW", "NHWC"] = "NCHW"
    color: Literal["RGB", "BGR", "GRAY"] = "RGB"
    scale: float = spec(1.0 / 255.0, ge=-1e6, le=1e6)
    mean: tuple[float, float, float] = spec((0.485, 0.456, 0.406), item=_3F)
    std: tuple[float, float, float] = spec((0.229, 0.224, 0.225), item=Rule(ge=1e-9, le=1e6))
    resize: Literal["resize", "letterbox"] = "resize"
    pad_value: int = spec(114, ge=0, le=255)
    dtype: DType = "float32"
    preset: str = spec("imagenet", pattern=ID)

    def to_spec(self) -> Any:
        from edge.spec import PreprocessSpec

        return PreprocessSpec(
            input=self.input,
            size=self.size,
            layout=self.layout,
            color=self.color,
            scale=self.scale,
            mean=self.mean,
            std=self.std,
            resize=self.resize,
            pad_value=self.pad_value,
            dtype=self.dtype,
            preset=self.preset,
        )


OptionValue = bool | int | float | str | tuple[bool | int | float | str, ...]
_OPTION_VALUE = Rule(pattern=OPTION_TEXT, max_len=64, max_items=16, item=Rule(pattern=OPTION_TEXT, max_len=64))


@dataclass(frozen=True)
class RunnerSpec:
    """The runner and its options. Options are words and numbers the runner declares; a path,
    library or command is the device's own configuration and is refused here."""

    name: str = spec(pattern=ID)
    options: Mapping[str, OptionValue] = spec(
        max_items=32, key=Rule(pattern=OPTION_KEY, min_len=1, max_len=64), item=_OPTION_VALUE
    )

    @staticmethod
    def __schema_extra__(schema_of: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
        return {
            "allOf": [
                {
                    "if": {"properties": {"name": {"const": name}}, "required": ["name"]},
                    "then": {"properties": {"options": schema_of(cls)}},
                }
                for name, cls in sorted(builtin_runner_options().items())
            ]
        }

    @property
    def options_dict(self) -> dict[str, Any]:
        options: dict[str, Any] = to_json(self.options)
        return options


@dataclass(frozen=True)
class RunnerInfo:
    """What a runner reported about itself (``edge.backends.runner.RunnerInfo``)."""

    runtime: str = spec(max_len=256)
    device_requested: str = spec(max_len=256)
    device_used: str = spec(**_TEXT)
    precision_used: str = spec(max_len=128)
    threads: int | None = spec(None, ge=0, le=1 << 16)
    fallback: str | None = spec(None, **_TEXT)
    details: JSON = JSON(None)


_UNIT: dict[str, Any] = dict(ge=0.0, le=1.0)


@dataclass(frozen=True)
class Thresholds:
    """A precision's parity limits (``edge.verify.parity.Thresholds``); None: not gated."""

    min_cosine: float = spec(ge=-1.0, le=1.0)
    min_top1: float = spec(ge=0.0, le=1.0)
    min_snr_db: float | None = spec(None, ge=-1000.0, le=1000.0)
    max_rel_err: float | None = spec(None, ge=0.0, le=1e6)
    degenerate_atol: float | None = spec(None, ge=0.0, le=1e6)
    min_top5: float | None = spec(None, **_UNIT)
    min_detection: float | None = spec(None, **_UNIT)
    min_iou: float | None = spec(None, **_UNIT)
    min_sequence: float | None = spec(None, **_UNIT)


_COS: dict[str, Any] = dict(ge=-1.001, le=1.001)  # float rounding puts a perfect match a hair above 1


@dataclass(frozen=True)
class OutputFigures:
    """One output's parity figures; the gate recomputes pass/fail from these."""

    name: str = spec(pattern=TENSOR_NAME)
    max_abs: float = spec(ge=0.0, finite=False)  # inf: output missing or of another shape
    mean_abs: float = spec(ge=0.0, finite=False)
    cosine: float = spec(**_COS)
    cosine_min: float = spec(**_COS)
    top1: float | None = spec(ge=0.0, le=1.0)
    passed: bool = spec()
    failures: tuple[str, ...] = spec((), max_items=64, item=Rule(**_TEXT))
    # absent in bundles built before issue 13; the gate then judges cosine and top-1 only
    snr_db: float | None = spec(None, ge=-300.0, le=300.0)  # 300: no error at all
    snr_db_min: float | None = spec(None, ge=-300.0, le=300.0)
    rel_max_abs: float | None = spec(None, ge=0.0)  # None where the error is not finite
    ref_min: float | None = spec(None, ge=-3.5e38, le=3.5e38)  # the reference's range: the gate recomputes
    ref_max: float | None = spec(None, ge=-3.5e38, le=3.5e38)  # whether it was degenerate from these
    cosine_samples: int | None = spec(None, ge=0, le=1 << 20)  # 0: one cosine pooled over every sample
    degenerate: bool = False
    degenerate_note: str | None = spec(None, **_TEXT)
    task: Literal["classifier", "detector", "prob-map", "segmentation", "sequence"] | None = None
    task_note: str | None = spec(None, **_TEXT)
    task_degenerate: bool = False
    top5: float | None = spec(None, **_UNIT)
    precision: float | None = spec(None, **_UNIT)
    recall: float | None = spec(None, **_UNIT)
    iou: float | None = spec(None, **_UNIT)
    sequence: float | None = spec(None, **_UNIT)
    tokens: float | None = spec(None, **_UNIT)


@dataclass(frozen=True)
class ParityInputs:
    """Where the parity inputs came from, in order of preference: the user's --parity-data, their --calib
    data (held out from calibration for int8), or edgekit's natural images (``edge.verify.natural``, kind "natural":
    topped up with generated inputs, ``generated_count``), or generated to look like the model's data."""

    kind: Literal["parity-data", "calibration", "calibration-held-out", "generated", "mixed", "natural"] = spec()
    count: int = spec(ge=0, le=1 << 20)
    source: str | None = spec(None, **_TEXT)
    generated: Mapping[str, str] | None = spec(None, max_items=256, item=Rule(**_TEXT))  # per input: what it was fed
    generated_count: int = spec(0, ge=0, le=1 << 20)
    disjoint_from_calibration: bool | None = None  # None: no calibration data was used
    note: str | None = spec(None, **_TEXT)


@dataclass(frozen=True)
class PrecisionTrial:
    """The bundle's parity in a runtime's faster compute precision (OpenVINO's bf16 on a CPU whose plugin lists
    BF16), measured where it was built (``edge.pipeline.precision_trial``). The bundle's runner options say
    ``inference_precision = "fast"`` only when it passed; the device's reference-pair check re-checks it."""

    compute: str = spec(pattern=ID)  # "bf16"
    passed: bool = spec()
    thresholds: Thresholds = spec()
    candidate: RunnerInfo = spec()
    outputs: tuple[OutputFigures, ...] = spec(min_items=1, max_items=1024)
    capabilities: tuple[str, ...] = spec((), max_items=64, item=Rule(pattern=ID))  # OPTIMIZATION_CAPABILITIES
    failures: tuple[str, ...] = spec((), max_items=64, item=Rule(**_TEXT))


@dataclass(frozen=True)
class SkippedTrial:
    """A faster compute precision not tried where the bundle was built, and why (``edge.pipeline.precision_trial``):
    no evidence, so the bundle computes in its own precision everywhere."""

    compute: str = spec(pattern=ID)  # "fp16"
    runner: str = spec(pattern=ID)  # "litert"
    reason: str = spec(**_TEXT)


@dataclass(frozen=True)
class Divergence:
    """The first source node whose output differs in the converted graph (``edge.graph.divergence``)."""

    node: str = spec(**_TEXT)
    op: str = spec(max_len=128)
    tensor: str = spec(**_TEXT)
    cosine: float | None = spec(**_COS)  # None: the converted tensor has another size (note)
    rel_err: float | None = spec(ge=0.0, finite=False)
    compared: int = spec(ge=0, le=1 << 20)
    note: str = spec("", **_TEXT)  # what compared it; a size that differs


@dataclass(frozen=True)
class Fp16Range:
    """What rounding to fp16 did to one tensor in the fp16 proxy (``edge.verify.fp16proxy``)."""

    tensor: str = spec(pattern=TENSOR_NAME)
    node: str | None = spec(None, **_TEXT)  # None: a graph input, or an output no node rounds
    op: str | None = spec(None, max_len=128)
    overflow: int = spec(0, ge=0, le=1 << 62)  # finite values above 65,504: inf in fp16
    underflow: int = spec(0, ge=0, le=1 << 62)  # non-zero values that round to 0 in fp16
    max_abs: float | None = spec(None, ge=0.0)


@dataclass(frozen=True)
class Fp16ProxyEvidence:
    """Parity of the graph with every intermediate tensor rounded to fp16, for a device that computes in fp16
    (``edge.verify.fp16proxy``): labelled a proxy, with what it does not model."""

    label: Literal["fp16 proxy"] = spec()
    passed: bool = spec()
    thresholds: Thresholds = spec()
    samples: int = spec(ge=0, le=1 << 20)
    outputs: tuple[OutputFigures, ...] = spec(min_items=1, max_items=1024)
    not_modelled: str = spec(**_TEXT)
    graph: str = spec(**_TEXT)  # which ONNX ran (the bundle's prepared graph, or the source)
    tensors_rounded: int = spec(0, ge=0, le=1 << 24)
    subgraph_nodes_in_f32: int = spec(0, ge=0, le=1 << 24)
    ranges: tuple[Fp16Range, ...] = spec((), max_items=1024)  # per output
    overflowed_nodes: tuple[Fp16Range, ...] = spec((), max_items=16)  # in graph order: the first is the culprit
    overflowed_count: int = spec(0, ge=0, le=1 << 24)
    failures: tuple[str, ...] = spec((), max_items=64, item=Rule(**_TEXT))


@dataclass(frozen=True)
class ParityEvidence:
    """A vision model's parity report (``edge.verify.parity.ParityReport``)."""

    passed: bool = spec()
    precision: Precision = spec()
    thresholds: Thresholds = spec()
    samples: int = spec(ge=0, le=1 << 20)
    inputs: str = spec(max_len=256)
    reference: str = spec(**_TEXT)
    candidate: RunnerInfo = spec()
    outputs: tuple[OutputFigures, ...] = spec(min_items=1, max_items=1024)
    kind: Literal["vision"] = "vision"
    accepted_failure: bool = False
    host_notes: tuple[str, ...] = spec((), max_items=16, item=Rule(**_TEXT))
    task: Literal["auto", "classifier", "detector", "prob-map", "segmentation", "sequence", "none"] = "auto"
    input_provenance: ParityInputs | None = None
    shipped_as_is: bool = False  # the bundle's file is the reference's byte for byte: parity exact by identity
    first_divergence: Divergence | None = None  # on a failure: where the converted graph starts to differ
    # every output's reference is degenerate: no failure, yet nothing verified (the gate recomputes it from the ranges)
    unverified: str | None = spec(None, **_TEXT)
    precision_trials: tuple[PrecisionTrial, ...] = spec((), max_items=8)
    precision_trials_skipped: tuple[SkippedTrial, ...] = spec((), max_items=8)
    #: a device that computes in fp16: the graph with every intermediate rounded to fp16 (absent: not such a device)
    fp16_proxy: Fp16ProxyEvidence | None = None


@dataclass(frozen=True)
class LLMThresholds:
    max_kl_mean: float = spec(ge=0.0, le=1e6)
    min_top1: float = spec(ge=0.0, le=1.0)


@dataclass(frozen=True)
class LLMTextFigures:
    """The gate's figures on one evaluation text."""

    name: str = spec(pattern=TENSOR_NAME)  # "en", ..., the user's file name, or "random"
    windows: int = spec(ge=1, le=4096)
    tokens: int = spec(ge=1, le=1 << 24)
    kl_mean: float = spec(ge=0.0, finite=False)
    top1: float = spec(ge=0.0, le=1.0)
    sha256: str | None = spec(None, pattern=r"^[0-9a-f]{64}$")  # None for random ids


@dataclass(frozen=True)
class LLMEvalText:
    """What the LLM gate evaluated (``edge.llm.evaltext``): text tokenized by the model, or random ids
    with the reason."""

    origin: Literal["built-in", "file", "random"] = spec()
    description: str = spec(min_len=1, **_TEXT)
    windows: int = spec(ge=1, le=4096)
    window_tokens: int = spec(ge=1, le=1 << 20)
    note: str | None = spec(None, **_TEXT)
    texts: tuple[LLMTextFigures, ...] = spec((), max_items=64)


@dataclass(frozen=True)
class LLMQualityEvidence:
    """A GGUF quant's quality gate (``edge.llm.quality.QualityReport``)."""

    kind: Literal["llm"] = spec()
    passed: bool = spec()
    quant: Precision = spec()
    tokens: int = spec(ge=0, le=1 << 24)
    kl_mean: float = spec(ge=0.0, finite=False)
    kl_p99: float = spec(ge=0.0, finite=False)
    kl_max: float = spec(ge=0.0, finite=False)
    top1: float = spec(ge=0.0, le=1.0)
    thresholds: LLMThresholds = spec()
    reference: str = spec(**_TEXT)
    accepted_failure: bool = False
    eval: LLMEvalText | None = None  # absent in bundles built before the gate evaluated text
    top1_decisive: float | None = spec(None, ge=0.0, le=1.0)  # top-1 where the source leads by >= 0.1 nats
    decisive_share: float | None = spec(None, ge=0.0, le=1.0)


@dataclass(frozen=True)
class SkippedParity:
    """Parity not run where the bundle was built (the runtime needs the device); says why."""

    passed: None = spec()
    skipped: str = spec(min_len=1, **_TEXT)
    reference: str | None = spec(None, **_TEXT)


def _which_parity(raw: Any) -> type:
    if isinstance(raw, dict) and "skipped" in raw:
        return SkippedParity
    if isinstance(raw, dict) and raw.get("kind") == "llm":
        return LLMQualityEvidence
    return ParityEvidence


Parity = Annotated[ParityEvidence | LLMQualityEvidence | SkippedParity, Tagged(_which_parity)]


def _which_thresholds(raw: Any) -> type:
    return LLMThresholds if isinstance(raw, dict) and "max_kl_mean" in raw else Thresholds


@dataclass(frozen=True)
class ReferencePairs:
    """A few source inputs with the source's outputs, in a bundle file (``edge.verify.refpairs``): the device
    runs them through its runner on first load and compares. ``file`` is None (``samples`` 0) when
    none could be stored; ``note`` says why, or what was cut to keep the file small."""

    samples: int = spec(ge=0, le=64)
    reference: str = spec(min_len=1, **_TEXT)  # who computed the outputs
    # the build host's limits for the precision: parity's, or edge.llm.quality's in an llm bundle
    thresholds: Annotated[Thresholds | LLMThresholds, Tagged(_which_thresholds)] = spec()
    file: str | None = spec(None, pattern=REL_PATH, max_len=1024)
    note: str | None = spec(None, **_TEXT)


@dataclass(frozen=True)
class Latency:
    count: int = spec(ge=0, le=1 << 40)
    p50_ms: float = spec(**_MS)
    p90_ms: float = spec(**_MS)
    p99_ms: float = spec(**_MS)
    max_ms: float = spec(**_MS)
    min_ms: float = spec(**_MS)
    mean_ms: float = spec(**_MS)
    std_ms: float = spec(**_MS)


@dataclass(frozen=True)
class DeviceClassJudgement:
    """Whether a benchmark ran on the target's device class (``edge.targets.same_device_class``), and why:
    only then does its budget verdict gate a deploy. Older manifests carry it in ``runner.details.device_class``."""

    same: bool = spec()
    reason: str = spec(min_len=1, **_TEXT)


@dataclass(frozen=True)
class Steadiness:
    """How the budget verdict's p99 was measured (``edge.tune.verdict``): in steady state after ``warmup_s`` of
    untimed inferences, at least ``measure_s`` timed per run; every run's p99 (a marginal miss is measured again and
    the median run decides: ``decided_by``); the load average (1, 5, 15 min) before and after, and the CPUs."""

    warmup_s: float = spec(ge=0.0, le=1e6)
    measure_s: float = spec(ge=0.0, le=1e6)
    runs_p99_ms: tuple[float, ...] = spec(min_items=1, max_items=16, item=Rule(**_MS))
    spread: float = spec(ge=0.0, le=1e9)  # (max - min) / median of the runs' p99
    decided_by: str = spec(**_TEXT)
    cpus: int = spec(ge=1, le=1 << 16)
    load_before: tuple[float, ...] | None = spec(None, max_items=3, item=Rule(ge=0.0, le=1e6))
    load_after: tuple[float, ...] | None = spec(None, max_items=3, item=Rule(ge=0.0, le=1e6))


@dataclass(frozen=True)
class BenchmarkEvidence:
    """A vision benchmark (``edge.bench.BenchReport``); the gate recomputes the verdict from p99 and budget."""

    load_ms: float = spec(**_MS)
    first_inference_ms: float = spec(**_MS)
    warmup: int = spec(ge=0, le=1 << 30)
    latency: Latency = spec()
    duration_s: float = spec(ge=0.0, le=1e9)
    throughput_fps: float = spec(ge=0.0, le=1e9)
    peak_rss_mb: float = spec(ge=0.0, le=1e9)
    runner: RunnerInfo = spec()
    budget_ms: float | None = spec(ge=1e-9, le=1e9)
    budget_source: str = spec(max_len=256)
    verdict: Literal["pass", "fail", "no budget"] = spec()
    on_target_device: bool = spec()
    bundle: str | None = spec(None, pattern=ID)
    target: str | None = spec(None, pattern=ID)
    kind: Literal["vision"] = "vision"
    device_class: DeviceClassJudgement | None = None
    steadiness: Steadiness | None = None


@dataclass(frozen=True)
class MeanStd:
    mean: float = spec(ge=0.0, le=1e12)
    std: float = spec(ge=0.0, le=1e12)


@dataclass(frozen=True)
class LLMBenchmarkEvidence:
    """An LLM benchmark (``edge.llm.bench``)."""

    kind: Literal["llm"] = spec()
    load_ms: float = spec(**_MS)
    prompt_tokens: int = spec(ge=0, le=1 << 24)
    gen_tokens: int = spec(ge=0, le=1 << 24)
    repetitions: int = spec(ge=0, le=1 << 20)
    ttft_ms: MeanStd = spec()
    prompt_tps: MeanStd = spec()
    gen_tps: MeanStd = spec()
    peak_rss_mb: float = spec(ge=0.0, le=1e9)
    runner: JSON = JSON(None)
    ttft_budget_ms: float | None = spec(None, ge=1e-9, le=1e9)
    min_tps: float | None = spec(None, ge=0.0, le=1e9)
    verdict: Literal["pass", "fail", "no budget"] = "no budget"
    bundle: str | None = spec(None, pattern=ID)
    target: str | None = spec(None, pattern=ID)


def _which_benchmark(raw: Any) -> type:
    return LLMBenchmarkEvidence if isinstance(raw, dict) and raw.get("kind") == "llm" else BenchmarkEvidence


Benchmark = Annotated[BenchmarkEvidence | LLMBenchmarkEvidence, Tagged(_which_benchmark)]


@dataclass(frozen=True)
class TunedHost:
    """The host ``edgekit tune`` measured on."""

    os: str = spec(pattern=ID)
    arch: str = spec(pattern=ID)
    cpu: str = spec(max_len=256, pattern=r"^[^\x00-\x1f\x7f]*$")
    #: the ISA flags edgekit reads (edge.capabilities.ISA_FLAGS present on the CPU); empty when unknown
    isa: tuple[str, ...] = spec((), max_items=64, item=Rule(pattern=r"^[a-z0-9_]{1,32}$"))
    cpus: int | None = spec(None, ge=1, le=1 << 16)


@dataclass(frozen=True)
class TunedEvidence:
    """The bundle was converted with an ``edgekit tune`` overlay (``convert``/``deploy --tuned``, ``deploy --tune``)."""

    #: sha256 of the overlay's content (``edge.pipeline.overlay.TunedOverlay.content_sha256``: its canonical JSON)
    overlay_sha256: str = spec(pattern=SHA256)
    #: the tune trial the overlay is (runner/precision/options), None for an overlay without a [tuned] table
    configuration: str | None = spec(None, min_len=1, max_len=512, pattern=r"^[^\x00-\x1f\x7f]*$")
    objective: Literal["latency", "throughput", "e2e"] | None = None
    tuned_on: TunedHost | None = None
    #: whether the tuning host is the target's device class, and why (None: the overlay does not say)
    same_device_class: bool | None = None
    device_class: str | None = spec(None, **_TEXT)
    created_utc: str | None = spec(None, pattern=UTC_TIME)
    #: the video pipeline's inference workers the overlay was tuned with (``--objective e2e``); ``edgekit run`` and
    #: the agent's video pipeline use it unless told otherwise (None: not tuned, one worker)
    infer_workers: int | None = spec(None, ge=1, le=64)


@dataclass(frozen=True)
class IsaOutput:
    """One output of a bundle run on another instruction set (``edge.verify.isa``): the largest difference from the
    build host's own runtime on the same inputs, the limit it was held to (from the output's range), and the
    figures against the reference outputs the bundle carries."""

    name: str = spec(pattern=TENSOR_NAME)
    max_abs_vs_host: float = spec(ge=0.0, le=3.5e38)
    range: float = spec(ge=0.0, le=3.5e38)  # of the reference outputs: what the limit is relative to
    limit: float = spec(ge=0.0, le=3.5e38)
    passed: bool = spec()
    cosine: float | None = spec(None, ge=-1.0001, le=1.0001)  # against the reference outputs
    max_abs: float | None = spec(None, ge=0.0, le=3.5e38)  # against the reference outputs
    snr_db: float | None = spec(None, ge=-1e4, le=1e4)


@dataclass(frozen=True)
class IsaEvidence:
    """The bundle's reference pairs run on a device's instruction set (``edgekit verify --isa aarch64``). Under
    emulation (``emulated``: qemu user mode, the real aarch64 runtime wheels) it proves numerics on that ISA, never
    speed. ``passed``: every output within its limit against the build host and the bundle's own reference check
    passed there."""

    isa: Literal["aarch64"] = spec()
    cpu: str = spec(pattern=ID)  # the (emulated) core: cortex-a72, cortex-a76, neoverse-n1
    emulated: bool = spec()
    label: str = spec(min_len=1, max_len=256)  # "checked on aarch64 (emulated cortex-a76)"
    runtime: str = spec(min_len=1, max_len=256)  # what ran there: "ai-edge-litert 2.3.0"
    device_used: str = spec(max_len=256)
    host_runtime: str = spec(max_len=256)  # what the differences are against: the build host's runtime
    samples: int = spec(ge=0, le=64)
    passed: bool = spec()
    checked_utc: str = spec(pattern=UTC_TIME)
    emulator: str | None = spec(None, max_len=256)  # "qemu-aarch64 10.0.2"
    cpu_part: str | None = spec(None, pattern=r"^0x[0-9a-fA-F]{1,8}$")  # what /proc/cpuinfo said there
    versions: Mapping[str, str] | None = spec(None, max_items=16, item=Rule(pattern=VERSION))
    reference_check: bool | None = None  # the bundle's own reference check (edge.verify.refpairs) there
    outputs: tuple[IsaOutput, ...] = spec((), max_items=64)
    failures: tuple[str, ...] = spec((), max_items=64, item=Rule(**_TEXT))
    toolchain_lock_hash: str | None = spec(None, pattern=SHA256)


@dataclass(frozen=True)
class Manifest:
    """A bundle's manifest.json (schema 1)."""

    schema_version: Literal[1] = spec()
    edgekit_version: str = spec(pattern=VERSION)
    bundle_id: str = spec(pattern=ID)
    target: TargetInfo = spec()
    precision: Precision = spec()
    format: str = spec(pattern=ID)
    primary_artifact: str = spec(pattern=REL_PATH, max_len=1024)
    artifacts: tuple[Artifact, ...] = spec(min_items=1, max_items=4096)
    io: IO = spec()
    runner: RunnerSpec = spec()
    created_utc: str | None = spec(None, pattern=UTC_TIME)
    kind: Literal["vision", "llm"] = "vision"
    #: the series this bundle belongs to (default: source stem + target): ``version`` goes up within it
    name: str | None = spec(None, pattern=ID)
    #: set when the bundle is signed; a device refuses a lower one than it has seen for ``name`` (TUF's
    #: rollback/freeze defence). Default: seconds since the epoch, so signers need no shared counter.
    version: int | None = spec(None, ge=1, le=(1 << 53) - 1)
    source: SourceInfo | None = None
    chain: tuple[ChainStep, ...] = spec((), max_items=32)
    calibration: JSON = JSON(None)
    preprocess: Preprocess | None = None
    parity: Parity | None = None
    #: reference input/output pairs the device checks on first load (absent in older bundles)
    reference_pairs: ReferencePairs | None = None
    benchmark: Benchmark | None = None
    build_host: JSON = JSON(None)
    #: the tune overlay the bundle was converted with (absent: none, or an older bundle)
    tuned: TunedEvidence | None = None
    #: deploy's budget search (``edge.tune.budget``): why it ran, every candidate measured, what it chose and why
    budget_search: JSON = JSON(None)
    #: the reference pairs run on a device instruction set (``edgekit verify --isa``), one per ISA and core
    verified_on: tuple[IsaEvidence, ...] = spec((), max_items=8)


# -- runner options ------------------------------------------------------------------------
# Each runner declares its options once, as a dataclass in its backend's format.py (edge.backends.options):
# the runner's class names it (options_class), built-in or plugin; the manifest's checks and schema read it
# from there.


def runner_options_class(runner: str) -> type | None:
    """The typed options of the runner registered as ``runner`` (a plugin's too); None when it declares none
    (its options then get the generic checks of RunnerSpec only) or when no such runner is installed."""
    from edge.backends.runner import RUNNERS

    try:
        cls = RUNNERS.get(runner)
    except Exception:  # noqa: BLE001 - UnknownBackendError, or a plugin that fails to import
        return None
    declared = getattr(cls, "options_class", None)
    return declared if isinstance(declared, type) else None


def builtin_runner_options() -> dict[str, type]:
    """Runner name -> its typed options, for edgekit's own runners (the published schema describes these)."""
    from edge.backends.runner import RUNNERS

    out: dict[str, type] = {}
    for name in RUNNERS.names():
        cls = RUNNERS.get(name)
        declared = getattr(cls, "options_class", None)
        if cls.__module__.startswith("edge.") and isinstance(declared, type):
            out[name] = declared
    return out


#: options a runner takes only from the device (its CLI, environment, agent config): each names a
#: library to load, a file or a directory to write. In a manifest they are refused.
DEVICE_ONLY_OPTIONS: dict[str, dict[str, str]] = {
    "litert": {
        "edgetpu_library": "set EDGEKIT_EDGETPU_LIBRARY on the device, or the agent's --runner-option edgetpu_library=/abs/path",
        "external_delegate": "give it on the device: the agent's --runner-option external_delegate=/abs/path",
    },
    "ethos-u": {
        "device": "give it on the device: the agent's --runner-option device=/dev/ethosuN",
        "delegate_library": "give it on the device: the agent's --runner-option delegate_library=/abs/path",
    },
    "tensorrt": {
        "engine_cache_dir": "set EDGEKIT_ENGINE_CACHE on the device, or the agent's --runner-option engine_cache_dir=/abs/path"
    },
}
#: any runner's (plugins' too): option names that say they name a path, library or command
_PATHLIKE_OPTION = re.compile(r".*_(library|lib|path|paths|dir|file|cmd|command|args|binary|exe|executable|plugins?)$")


def device_only_hint(runner: str, key: str) -> str | None:
    """How to give ``key`` on the device when it names a file, library or command; None for an ordinary option."""
    known = DEVICE_ONLY_OPTIONS.get(runner, {})
    if key in known:
        return known[key]
    if _PATHLIKE_OPTION.fullmatch(key):
        return "give it in the device's own configuration (agent --runner-option, environment)"
    return None


# -- reading and checking --------------------------------------------------------------------


def load_manifest(path: str | os.PathLike[str]) -> tuple[Manifest, dict[str, Any]]:
    """The typed manifest in file ``path`` and the JSON it was read from; :class:`ManifestError` otherwise."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise ManifestError(f"{p} cannot be read: {e.strerror or e}") from None
    if len(data) > MAX_BYTES:
        raise ManifestError(
            f"{p} is larger than {MAX_BYTES // 1024} KiB: not a manifest edgekit writes",
            hint="rebuild the bundle with `edgekit convert`",
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ManifestError(f"{p} is not valid JSON: not UTF-8 text (byte {e.start})") from None
    try:
        raw = loads_strict(text, max_depth=MAX_DEPTH)
    except Invalid as e:  # "not valid JSON: ...", nesting, NaN, a duplicate key
        raise ManifestError(
            f"{p} is {e.problem}" if e.problem.startswith("not valid JSON") else f"{p}: {e.problem}",
            hint="rebuild the bundle with `edgekit convert`",
        ) from None
    return parse_manifest(raw, str(p)), raw


def parse_manifest(raw: Any, source: str) -> Manifest:
    """``raw`` (parsed JSON) as a checked :class:`Manifest`; ``source`` names the file in errors."""
    try:
        if (
            isinstance(raw, dict)
            and "schema_version" in raw
            and raw["schema_version"] != SCHEMA_VERSION
            and type(raw["schema_version"]) is int
        ):
            raise ManifestError(
                f"{source} has schema {show_value(raw['schema_version'])}; this edgekit reads {SCHEMA_VERSION}",
                hint="upgrade edgekit-ml",
            )
        runner = raw.get("runner") if isinstance(raw, dict) else None
        if isinstance(runner, dict) and isinstance(runner.get("name"), str) and isinstance(runner.get("options"), dict):
            refuse_device_options(runner["name"], runner["options"])  # said first, whatever else is wrong there
        m: Manifest = read(Manifest, raw)
        check(m)
    except Invalid as e:
        raise ManifestError(
            f"{source}: field {e.where}: {e.problem}" if e.where else f"{source}: {e.problem}",
            hint="rebuild the bundle with `edgekit convert`; do not edit manifests by hand",
        ) from None
    return m


def check(m: Manifest) -> None:
    """What the types alone cannot say: the parts of one manifest agree. Raises :class:`Invalid`."""
    paths = [a.path for a in m.artifacts]
    seen: set[str] = set()
    for i, p in enumerate(paths):
        if p in seen:
            raise Invalid(f"artifacts[{i}].path", f"{json.dumps(p)} is listed twice")
        if p in ("manifest.json", "manifest.sig"):
            raise Invalid(f"artifacts[{i}].path", f"{p} is the bundle's own metadata, not an artifact")
        seen.add(p)
    dirs = {"/".join(p.split("/")[:k]) for p in paths for k in range(1, p.count("/") + 1)}
    clash = sorted(dirs & seen)
    if clash:
        raise Invalid("artifacts", f"{json.dumps(clash[0])} is listed as a file and used as a directory")
    if m.primary_artifact not in seen:
        raise Invalid("primary_artifact", f"{json.dumps(m.primary_artifact)} is not one of the artifacts")
    if m.preprocess is not None and m.preprocess.input not in {t.name for t in m.io.inputs}:
        raise Invalid("preprocess.input", f"{json.dumps(m.preprocess.input)} is not an input in io.inputs")
    par = m.parity
    if isinstance(par, ParityEvidence):
        if m.kind != "vision":
            raise Invalid("parity.kind", f"a vision parity report in a {m.kind} bundle")
        if par.precision != m.precision:
            raise Invalid("parity.precision", f"{par.precision} differs from the bundle's precision {m.precision}")
    elif isinstance(par, LLMQualityEvidence):
        if m.kind != "llm":
            raise Invalid("parity.kind", "an LLM quality report in a vision bundle")
        if par.quant != m.precision:
            raise Invalid("parity.quant", f"{par.quant} differs from the bundle's precision {m.precision}")
    ref = m.reference_pairs
    if ref is not None:
        if (ref.file is None) != (ref.samples == 0):
            raise Invalid("reference_pairs.file", "a file goes with samples > 0, and no file with samples 0")
        if ref.file is not None and ref.file not in seen:
            raise Invalid("reference_pairs.file", f"{json.dumps(ref.file)} is not one of the artifacts")
        if ref.file is not None and ref.file == m.primary_artifact:
            raise Invalid("reference_pairs.file", "is the primary artifact")
        if isinstance(ref.thresholds, LLMThresholds) != (m.kind == "llm"):
            raise Invalid(
                "reference_pairs.thresholds",
                f"{'an LLM' if m.kind == 'vision' else 'a tensor'} reference's limits in a {m.kind} bundle",
            )
    check_runner(m.runner)


def refuse_device_options(runner: str, options: Any, where: str = "runner") -> None:
    """:class:`Invalid` for an option naming a file, library or command: the device's to give, never a bundle's."""
    for key in options:
        hint = device_only_hint(runner, key) if isinstance(key, str) else None
        if hint is not None:
            raise Invalid(
                join_path(f"{where}.options", key),
                f"names a file, library or command, which only the device's own configuration may do, never a bundle ({hint})",
            )


def check_runner(r: RunnerSpec, where: str = "runner") -> None:
    """The runner is installed, takes every option named, and each option is of its declared type;
    options naming a path, library or command are refused (they are the device's to give)."""
    refuse_device_options(r.name, r.options, where)
    from edge.backends.runner import RUNNERS

    try:
        cls = RUNNERS.get(r.name)
    except Exception as e:  # UnknownBackendError, or a plugin that fails to import: refused either way
        raise Invalid(
            f"{where}.name", f"no usable runner {json.dumps(r.name)} here ({str(e).split(';')[0][:120]})"
        ) from None
    declared = getattr(cls, "options", {}) or {}
    unknown = [k for k in r.options if k not in declared]
    if unknown:
        raise Invalid(
            join_path(f"{where}.options", unknown[0]),
            f"runner {r.name!r} takes no such option; it takes: "
            f"{', '.join(k for k in declared if device_only_hint(r.name, k) is None) or 'none'}",
        )
    typed = getattr(cls, "options_class", None)
    if isinstance(typed, type):
        opts = read(typed, to_json(r.options), f"{where}.options")
        bad = opts.invalid() if hasattr(opts, "invalid") else None  # the options' own rule across fields
        if bad is not None:
            raise Invalid(f"{where}.options.{bad[0]}", bad[1])


def device_class_of(benchmark: Any) -> dict[str, Any] | None:
    """A recorded benchmark's device-class judgement ({"same", "reason"}): its ``device_class`` field (a typed
    ``BenchmarkEvidence`` or its JSON), else where older manifests kept it (``runner.details.device_class``)."""
    if benchmark is None:
        return None
    if isinstance(benchmark, Mapping):
        dc = benchmark.get("device_class")
        runner = benchmark.get("runner")
        details = runner.get("details") if isinstance(runner, Mapping) else None
    else:
        typed = getattr(benchmark, "device_class", None)
        dc = {"same": typed.same, "reason": typed.reason} if typed is not None else None
        details = getattr(getattr(benchmark, "runner", None), "details", None)
    if not isinstance(dc, Mapping) and isinstance(details, Mapping):
        dc = details.get("device_class")
    if isinstance(dc, Mapping) and isinstance(dc.get("same"), bool) and isinstance(dc.get("reason"), str):
        return {"same": dc["same"], "reason": dc["reason"]}
    return None


# -- the published schema ----------------------------------------------------------------------


def manifest_json_schema() -> dict[str, Any]:
    return json_schema(Manifest, schema_id=SCHEMA_ID, title="edgekit bundle manifest (schema_version 1)")


def published_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    return schema


def write_schema(path: Path = SCHEMA_FILE) -> None:
    path.write_text(json.dumps(manifest_json_schema(), indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":  # python -m edge.bundle.schema: regenerate edge/bundle/manifest.schema.json
    write_schema()
    print(f"wrote {SCHEMA_FILE}")
