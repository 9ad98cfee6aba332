"""The evidence a manifest carries, typed: parity (vision and LLM), reference pairs, benchmarks, the tune overlay
and the instruction-set check, each a frozen dataclass of :mod:`edge.base.typedjson` fields.

The manifest tree (:mod:`edge.bundle.schema`) holds these; the gate (:mod:`edge.verify.gates`) reads them. The
writers are elsewhere (``edge.verify.parity``, ``edge.bench``, ``edge.tune``, ``edge.verify.isa``): these are
what a bundle may say, checked before anything reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Mapping

from edge.base.typedjson import JSON, Rule, Tagged, spec
from edge.bundle.fields import ID, MS, REL_PATH, SHA256, TENSOR_NAME, TEXT, UTC_TIME, VERSION, Precision


@dataclass(frozen=True)
class RunnerInfo:
    """What a runner reported about itself (``edge.backends.runner.RunnerInfo``)."""

    runtime: str = spec(max_len=256)
    device_requested: str = spec(max_len=256)
    device_used: str = spec(**TEXT)
    precision_used: str = spec(max_len=128)
    threads: int | None = spec(None, ge=0, le=1 << 16)
    fallback: str | None = spec(None, **TEXT)
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
    failures: tuple[str, ...] = spec((), max_items=64, item=Rule(**TEXT))
    # absent in bundles built before issue 13; the gate then judges cosine and top-1 only
    snr_db: float | None = spec(None, ge=-300.0, le=300.0)  # 300: no error at all
    snr_db_min: float | None = spec(None, ge=-300.0, le=300.0)
    rel_max_abs: float | None = spec(None, ge=0.0)  # None where the error is not finite
    ref_min: float | None = spec(None, ge=-3.5e38, le=3.5e38)  # the reference's range: the gate recomputes
    ref_max: float | None = spec(None, ge=-3.5e38, le=3.5e38)  # whether it was degenerate from these
    cosine_samples: int | None = spec(None, ge=0, le=1 << 20)  # 0: one cosine pooled over every sample
    degenerate: bool = False
    degenerate_note: str | None = spec(None, **TEXT)
    task: Literal["classifier", "multi-label", "detector", "prob-map", "segmentation", "sequence"] | None = None
    task_note: str | None = spec(None, **TEXT)
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
    source: str | None = spec(None, **TEXT)
    generated: Mapping[str, str] | None = spec(None, max_items=256, item=Rule(**TEXT))  # per input: what it was fed
    generated_count: int = spec(0, ge=0, le=1 << 20)
    disjoint_from_calibration: bool | None = None  # None: no calibration data was used
    note: str | None = spec(None, **TEXT)


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
    failures: tuple[str, ...] = spec((), max_items=64, item=Rule(**TEXT))


@dataclass(frozen=True)
class SkippedTrial:
    """A faster compute precision not tried where the bundle was built, and why (``edge.pipeline.precision_trial``):
    no evidence, so the bundle computes in its own precision everywhere."""

    compute: str = spec(pattern=ID)  # "fp16"
    runner: str = spec(pattern=ID)  # "litert"
    reason: str = spec(**TEXT)


@dataclass(frozen=True)
class Divergence:
    """The first source node whose output differs in the converted graph (``edge.graph.divergence``)."""

    node: str = spec(**TEXT)
    op: str = spec(max_len=128)
    tensor: str = spec(**TEXT)
    cosine: float | None = spec(**_COS)  # None: the converted tensor has another size (note)
    rel_err: float | None = spec(ge=0.0, finite=False)
    compared: int = spec(ge=0, le=1 << 20)
    note: str = spec("", **TEXT)  # what compared it; a size that differs


@dataclass(frozen=True)
class Fp16Range:
    """What rounding to fp16 did to one tensor in the fp16 proxy (``edge.verify.fp16proxy``)."""

    tensor: str = spec(pattern=TENSOR_NAME)
    node: str | None = spec(None, **TEXT)  # None: a graph input, or an output no node rounds
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
    not_modelled: str = spec(**TEXT)
    graph: str = spec(**TEXT)  # which ONNX ran (the bundle's prepared graph, or the source)
    tensors_rounded: int = spec(0, ge=0, le=1 << 24)
    subgraph_nodes_in_f32: int = spec(0, ge=0, le=1 << 24)
    ranges: tuple[Fp16Range, ...] = spec((), max_items=1024)  # per output
    overflowed_nodes: tuple[Fp16Range, ...] = spec((), max_items=16)  # in graph order: the first is the culprit
    overflowed_count: int = spec(0, ge=0, le=1 << 24)
    failures: tuple[str, ...] = spec((), max_items=64, item=Rule(**TEXT))


@dataclass(frozen=True)
class ParityEvidence:
    """A vision model's parity report (``edge.verify.parity.ParityReport``)."""

    passed: bool = spec()
    precision: Precision = spec()
    thresholds: Thresholds = spec()
    samples: int = spec(ge=0, le=1 << 20)
    inputs: str = spec(max_len=256)
    reference: str = spec(**TEXT)
    candidate: RunnerInfo = spec()
    outputs: tuple[OutputFigures, ...] = spec(min_items=1, max_items=1024)
    kind: Literal["vision"] = "vision"
    accepted_failure: bool = False
    host_notes: tuple[str, ...] = spec((), max_items=16, item=Rule(**TEXT))
    task: Literal["auto", "classifier", "multi-label", "detector", "prob-map", "segmentation", "sequence", "none"] = (
        "auto"
    )
    input_provenance: ParityInputs | None = None
    shipped_as_is: bool = False  # the bundle's file is the reference's byte for byte: parity exact by identity
    first_divergence: Divergence | None = None  # on a failure: where the converted graph starts to differ
    # every output's reference is degenerate: no failure, yet nothing verified (the gate recomputes it from the ranges)
    unverified: str | None = spec(None, **TEXT)
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
    description: str = spec(min_len=1, **TEXT)
    windows: int = spec(ge=1, le=4096)
    window_tokens: int = spec(ge=1, le=1 << 20)
    note: str | None = spec(None, **TEXT)
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
    reference: str = spec(**TEXT)
    accepted_failure: bool = False
    eval: LLMEvalText | None = None  # absent in bundles built before the gate evaluated text
    top1_decisive: float | None = spec(None, ge=0.0, le=1.0)  # top-1 where the source leads by >= 0.1 nats
    decisive_share: float | None = spec(None, ge=0.0, le=1.0)


@dataclass(frozen=True)
class SkippedParity:
    """Parity not run where the bundle was built (the runtime needs the device); says why."""

    passed: None = spec()
    skipped: str = spec(min_len=1, **TEXT)
    reference: str | None = spec(None, **TEXT)


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
    reference: str = spec(min_len=1, **TEXT)  # who computed the outputs
    # the build host's limits for the precision: parity's, or edge.llm.quality's in an llm bundle
    thresholds: Annotated[Thresholds | LLMThresholds, Tagged(_which_thresholds)] = spec()
    file: str | None = spec(None, pattern=REL_PATH, max_len=1024)
    note: str | None = spec(None, **TEXT)


@dataclass(frozen=True)
class Latency:
    count: int = spec(ge=0, le=1 << 40)
    p50_ms: float = spec(**MS)
    p90_ms: float = spec(**MS)
    p99_ms: float = spec(**MS)
    max_ms: float = spec(**MS)
    min_ms: float = spec(**MS)
    mean_ms: float = spec(**MS)
    std_ms: float = spec(**MS)


@dataclass(frozen=True)
class DeviceClassJudgement:
    """Whether a benchmark ran on the target's device class (``edge.targets.same_device_class``), and why:
    only then does its budget verdict gate a deploy. Older manifests carry it in ``runner.details.device_class``."""

    same: bool = spec()
    reason: str = spec(min_len=1, **TEXT)


@dataclass(frozen=True)
class Steadiness:
    """How the budget verdict's p99 was measured (``edge.tune.verdict``): in steady state after ``warmup_s`` of
    untimed inferences, at least ``measure_s`` timed per run; every run's p99 (a marginal miss is measured again and
    the median run decides: ``decided_by``); the load average (1, 5, 15 min) before and after, and the CPUs."""

    warmup_s: float = spec(ge=0.0, le=1e6)
    measure_s: float = spec(ge=0.0, le=1e6)
    runs_p99_ms: tuple[float, ...] = spec(min_items=1, max_items=16, item=Rule(**MS))
    spread: float = spec(ge=0.0, le=1e9)  # (max - min) / median of the runs' p99
    decided_by: str = spec(**TEXT)
    cpus: int = spec(ge=1, le=1 << 16)
    load_before: tuple[float, ...] | None = spec(None, max_items=3, item=Rule(ge=0.0, le=1e6))
    load_after: tuple[float, ...] | None = spec(None, max_items=3, item=Rule(ge=0.0, le=1e6))


@dataclass(frozen=True)
class BenchmarkEvidence:
    """A vision benchmark (``edge.bench.BenchReport``); the gate recomputes the verdict from p99 and budget."""

    load_ms: float = spec(**MS)
    first_inference_ms: float = spec(**MS)
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
    load_ms: float = spec(**MS)
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
    device_class: str | None = spec(None, **TEXT)
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
    failures: tuple[str, ...] = spec((), max_items=64, item=Rule(**TEXT))
    toolchain_lock_hash: str | None = spec(None, pattern=SHA256)
