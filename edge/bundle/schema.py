"""The bundle manifest, typed: one frozen dataclass tree, read once from ``manifest.json`` and validated.

A manifest comes from wherever the bundle came from, so nothing in it is trusted before it passed
here: the file's size and nesting, every field's type, length, range and character set, ids,
artifact paths (relative, inside the bundle), runner options (known to the runner, typed, and
never a path, library or command: those are the device's own configuration), and that its
parts agree (primary artifact listed, evidence about this precision and kind). Every problem
is one :class:`~edge.errors.ManifestError` naming the file and the field.

The evidence the manifest carries (parity, reference pairs, benchmark, tune overlay, ISA check) is declared in
:mod:`edge.bundle.evidence`, the fields' character sets and precisions in :mod:`edge.bundle.fields`.
The same declarations give the published JSON Schema (``edge/bundle/manifest.schema.json``,
regenerate with ``python -m edge.bundle.schema``); a test keeps the two in step.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

from edge.backends.options import device_option
from edge.base.typedjson import (
    JSON,
    Invalid,
    Rule,
    join_path,
    json_schema,
    loads_strict,
    read,
    show_value,
    spec,
    to_json,
)

# the evidence a manifest carries, and the fields' vocabulary, live in their own modules; the names other code
# reads from here are re-exported (``X as X``)
from edge.bundle.evidence import Benchmark, IsaEvidence, LLMThresholds, Parity, ReferencePairs
from edge.bundle.evidence import BenchmarkEvidence as BenchmarkEvidence
from edge.bundle.evidence import LLMQualityEvidence as LLMQualityEvidence
from edge.bundle.evidence import OutputFigures as OutputFigures
from edge.bundle.evidence import ParityEvidence as ParityEvidence
from edge.bundle.evidence import RunnerInfo as RunnerInfo
from edge.bundle.evidence import SkippedParity as SkippedParity
from edge.bundle.evidence import TunedEvidence as TunedEvidence
from edge.bundle.fields import (
    CONVERTER,
    OPTION_KEY,
    OPTION_TEXT,
    REL_PATH,
    SHA256,
    TENSOR_NAME,
    TEXT,
    UTC_TIME,
    VERSION,
    DType,
    Precision,
)
from edge.bundle.fields import ID as ID
from edge.errors import ManifestError

SCHEMA_VERSION = 1
MAX_BYTES = 1 << 20  # a real manifest is a few kB; the toolchain's package list makes it ~10 kB
MAX_DEPTH = 32  # brackets deep; the deepest real field (chain[].details.toolchain.packages) is 6
SCHEMA_FILE = Path(__file__).with_name("manifest.schema.json")
SCHEMA_ID = "https://edgekit.dev/schemas/manifest-1.json"


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
    io_names: str | None = spec(None, **TEXT)
    route: str | None = spec(None, **TEXT)  # how the pipeline took it to the target (edge.pipeline.plan)
    precision: str | None = spec(None, pattern=ID)  # what a TFLite / IR / quantized ONNX source already holds
    quantized: str | None = spec(None, **TEXT)  # an already-quantized ONNX: scheme and ops (edge.graph.quantized)
    file_type: str | None = spec(None, pattern=ID)  # a GGUF source's llama.cpp file type
    weights: str | None = spec(None, pattern=r"^[^/\\\x00-\x1f\x7f]{1,256}$")  # an OpenVINO IR's .bin
    runtime: str | None = spec(None, max_len=256)  # the runtime that read it (OpenVINO version)
    ops: tuple[str, ...] = spec((), max_items=512, item=Rule(max_len=128))
    tensor_types: Mapping[str, int] | None = spec(None, max_items=64, item=Rule(ge=0))
    description: str | None = spec(None, **TEXT)
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
    notes: tuple[str, ...] = spec((), max_items=64, item=Rule(**TEXT))


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


def runner_device_options(runner: str) -> Mapping[str, Any]:
    """The options the runner registered as ``runner`` takes only from the device (``Runner.device_options``); {}
    when no such runner is installed here (its path-like option names are still refused)."""
    from edge.backends.runner import RUNNERS

    try:
        cls = RUNNERS.get(runner)
    except Exception:  # noqa: BLE001 - UnknownBackendError, or a plugin that fails to import
        return {}
    declared = getattr(cls, "device_options", None)
    return declared if isinstance(declared, Mapping) else {}


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


#: any runner's (plugins' too): option names that say they name a path, library or command
_PATHLIKE_OPTION = re.compile(r".*_(library|lib|path|paths|dir|file|cmd|command|args|binary|exe|executable|plugins?)$")


def device_only_hint(runner: str, key: str) -> str | None:
    """How to give ``key`` on the device when it names a file, library or command; None for an ordinary option.
    The runner declares its own (``Runner.device_options``, built-in or plugin); any runner's option named like a
    path, library or command is refused too."""
    known = runner_device_options(runner)
    if key in known:
        return device_option(known[key]).hint(key)
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
