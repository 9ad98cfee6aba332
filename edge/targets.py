"""Target profiles: one TOML file per device, validated on load.

Search order: directories given explicitly (``--targets-dir``), then ``EDGEKIT_TARGETS_PATH``
(``os.pathsep``-separated), then the profiles shipped inside the package. A user profile
with the same name as a shipped one replaces it; ``TargetProfile.path`` says which file won.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from edge.base.typedjson import UnreadableFile, read_toml_file
from edge.capabilities import Host, Requirement, normalize_arch
from edge.errors import PrecisionError, TargetError, did_you_mean

SCHEMA_VERSION = 1
MAX_PROFILE_BYTES = 1 << 20  # a profile is a few KB
ARCHS = ("x86_64", "aarch64", "armv7l", "riscv64")  # what run.device_arch may name (after aliases: amd64, arm64)
PLATFORMS = {
    "jetson": "NVIDIA Jetson"
}  # run.device_platform: the host must be one (Host.jetson: /etc/nv_tegra_release)
PRECISIONS = ("fp32", "fp16", "bf16", "int8", "int8-dynamic", "f16", "q8_0", "q5_k_m", "q4_k_m", "q4_0")
ENV_VAR = "EDGEKIT_TARGETS_PATH"


@dataclass(frozen=True)
class ChainStep:
    converter: str
    precision: str | None = None  # pinned precision for this step; None = the requested one


@dataclass(frozen=True)
class StepPlace:
    """Where a step may run: OS and architecture lists, and whether it needs a GPU / the device."""

    os: tuple[str, ...]
    arch: tuple[str, ...]
    needs_gpu: bool = False
    needs_device: bool = False

    def requirements(self) -> list[Requirement]:
        reqs = [Requirement("os", "|".join(self.os)), Requirement("arch", "|".join(self.arch))]
        if self.needs_gpu:
            reqs.append(Requirement("nvidia-gpu", "gpu"))
        return reqs

    def allows(self, host: Host) -> bool:
        return host.os in self.os and host.arch in {normalize_arch(a) for a in self.arch}


@dataclass(frozen=True)
class DeviceClass:
    """The machines a target's devices are (``[run] device_arch``, ``device_os``, ``device_platform``,
    ``accelerator``): a benchmark stands for the target only when it ran on one of them, on the accelerator.
    ``run.os``/``run.arch`` say where the runner can run at all (an x86 build host runs arm-xnnpack's
    LiteRT); this says where its timings mean something for the device."""

    arch: tuple[str, ...]
    os: tuple[str, ...]
    platform: str | None = None  # a key of PLATFORMS: the host must be that platform, not just its arch
    accelerator: str = ""

    def describe(self) -> str:
        where = f"{'/'.join(self.os)} {'/'.join(self.arch)}"
        if self.platform:
            where = f"{PLATFORMS[self.platform]} ({where})"
        return f"{where}, {self.accelerator}" if self.accelerator else where


def same_device_class(profile: TargetProfile, host: Host, runner_info: Any) -> tuple[bool, str]:
    """Whether a benchmark run on ``host`` with a runner that reported ``runner_info`` (a ``RunnerInfo``
    or its JSON) measured ``profile``'s device class, and why: the host's OS, CPU architecture and
    platform must be the device class's, and the runner must have used the target's accelerator (no
    fallback). Only then does its latency say anything about the device's budget."""
    dc = profile.device_class
    fallback = (
        runner_info.get("fallback") if isinstance(runner_info, Mapping) else getattr(runner_info, "fallback", None)
    )
    here = f"{host.os}/{host.arch}" + (f", {PLATFORMS['jetson']}" if host.jetson else "")
    if host.os not in dc.os or host.arch not in dc.arch or (dc.platform == "jetson" and not host.jetson):
        return False, f"different device class: this host is {here}; {profile.name}'s devices are {dc.describe()}"
    if fallback:
        accelerator = dc.accelerator or "the target's accelerator"
        return False, f"different device class: the runner used its fallback, not {accelerator} ({fallback})"
    return True, f"same device class: this host ({here}) is one of {profile.name}'s devices ({dc.describe()})"


@dataclass(frozen=True)
class LLMProfile:
    """How the target runs GGUF language models (llama.cpp), beside its vision chain."""

    runner: str
    precisions: tuple[str, ...]
    default_precision: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def check_precision(self, target: str, precision: str) -> str:
        return _check_allowed(target, "LLM ", precision, self.precisions)


@dataclass(frozen=True)
class TargetProfile:
    name: str
    title: str
    hardware: str
    runner: str
    default_precision: str
    precisions: tuple[str, ...]
    frame_budget_ms: float
    chain: tuple[ChainStep, ...]
    convert_place: StepPlace
    run_place: StepPlace
    accelerator: str
    device_class: DeviceClass
    runtime_options: Mapping[str, Any] = field(default_factory=dict)
    convert_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    notes: str = ""
    path: Path | None = None
    llm: LLMProfile | None = None

    def check_precision(self, precision: str) -> str:
        return _check_allowed(self.name, "", precision, self.precisions)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "hardware": self.hardware,
            "runner": self.runner,
            "accelerator": self.accelerator,
            "default_precision": self.default_precision,
            "precisions": list(self.precisions),
            "frame_budget_ms": self.frame_budget_ms,
            "chain": [{"converter": s.converter, "precision": s.precision} for s in self.chain],
            "convert": {
                "os": list(self.convert_place.os),
                "arch": list(self.convert_place.arch),
                "options": {k: dict(v) for k, v in self.convert_options.items()},
            },
            "run": {
                "os": list(self.run_place.os),
                "arch": list(self.run_place.arch),
                "needs_gpu": self.run_place.needs_gpu,
                "needs_device": self.run_place.needs_device,
                "device_arch": list(self.device_class.arch),
                "device_os": list(self.device_class.os),
                "device_platform": self.device_class.platform,
                "options": dict(self.runtime_options),
            },
            "notes": self.notes,
            "llm": None
            if self.llm is None
            else {
                "runner": self.llm.runner,
                "precisions": list(self.llm.precisions),
                "default_precision": self.llm.default_precision,
                "options": dict(self.llm.options),
            },
            "path": str(self.path) if self.path else None,
        }


# --- validation -------------------------------------------------------------------------

_TOP = {
    "schema_version": int,
    "name": str,
    "title": str,
    "hardware": str,
    "default_precision": str,
    "precisions": list,
    "frame_budget_ms": (int, float),
    "notes": str,
    "convert": dict,
    "run": dict,
    "llm": dict,
}
_REQUIRED_TOP = (
    "schema_version",
    "name",
    "title",
    "hardware",
    "default_precision",
    "precisions",
    "frame_budget_ms",
    "convert",
    "run",
)
_CONVERT = {"chain": list, "os": list, "arch": list, "options": dict}
_RUN = {
    "runner": str,
    "accelerator": str,
    "os": list,
    "arch": list,
    "needs_gpu": bool,
    "needs_device": bool,
    "device_arch": list,
    "device_os": list,
    "device_platform": str,
    "options": dict,
}
_LLM = {"runner": str, "precisions": list, "default_precision": str, "options": dict}


class _Problems:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.items: list[str] = []

    def add(self, key: str, problem: str) -> None:
        self.items.append(f"{key}: {problem}")

    def check_table(
        self, table: Mapping[str, Any], schema: Mapping[str, Any], prefix: str, required: Sequence[str] = ()
    ) -> None:
        for key, value in table.items():
            full = f"{prefix}{key}"
            if key not in schema:
                self.add(full, f"unknown key; {did_you_mean(key, list(schema))}allowed: {', '.join(schema)}")
                continue
            expected = schema[key]
            if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
                names = expected.__name__ if isinstance(expected, type) else "/".join(t.__name__ for t in expected)
                self.add(full, f"expected {names}, got {type(value).__name__} {value!r}")
        for key in required:
            if key not in table:
                self.add(f"{prefix}{key}", "missing")

    def raise_if_any(self) -> None:
        if self.items:
            raise TargetError(f"invalid target profile {self.path}: " + "; ".join(self.items))


def _str_list(p: _Problems, value: Any, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or not value:
        p.add(key, f"expected a non-empty list of strings, got {value!r}")
        return ()
    return tuple(value)


def _precisions(p: _Problems, table: Mapping[str, Any], prefix: str) -> tuple[str, ...]:
    """``precisions`` and ``default_precision`` of a profile table, every problem recorded."""
    precisions = _str_list(p, table["precisions"], f"{prefix}precisions")
    for prec in precisions:
        if prec not in PRECISIONS:
            p.add(
                f"{prefix}precisions",
                f"unknown precision {prec!r}; {did_you_mean(prec, list(PRECISIONS))}known: {', '.join(PRECISIONS)}",
            )
    if precisions and table["default_precision"] not in precisions:
        p.add(
            f"{prefix}default_precision",
            f"{table['default_precision']!r} is not in {prefix}precisions {list(precisions)}",
        )
    return precisions


def _check_allowed(target: str, kind: str, precision: str, allowed: tuple[str, ...]) -> str:
    if precision not in allowed:
        raise PrecisionError(
            f"target {target!r} does not allow {kind}precision {precision!r}; "
            f"{did_you_mean(precision, list(allowed))}allowed: {', '.join(allowed)}"
        )
    return precision


def _chain(p: _Problems, conv: Mapping[str, Any]) -> list[ChainStep]:
    """``[convert] chain``: each step a converter name or ``{converter, precision}``; at least one."""
    chain: list[ChainStep] = []
    for i, step in enumerate(conv.get("chain", [])):
        key = f"convert.chain[{i}]"
        if isinstance(step, str):
            chain.append(ChainStep(step))
        elif (
            isinstance(step, dict)
            and isinstance(step.get("converter"), str)
            and set(step) <= {"converter", "precision"}
        ):
            chain.append(ChainStep(step["converter"], step.get("precision")))
        else:
            p.add(key, f"expected a converter name or {{converter = ..., precision = ...}}, got {step!r}")
    if not chain:
        p.add("convert.chain", "must name at least one converter")
    return chain


def _check_options(p: _Problems, options: Mapping[str, Any], chain: Sequence[ChainStep]) -> None:
    """``[convert.options.<converter>]``: a table each, only for converters in the chain."""
    for conv_name, opts in options.items():
        if not isinstance(opts, dict):
            p.add(f"convert.options.{conv_name}", f"expected a table of options, got {opts!r}")
        elif conv_name not in {s.converter for s in chain}:
            p.add(f"convert.options.{conv_name}", "options for a converter that is not in convert.chain")


def _read_profile(path: Path) -> dict[str, Any]:
    """The profile's TOML, read safely; a missing or unreadable file is a TargetError."""
    if not path.exists() and not path.is_symlink():
        raise TargetError(f"target profile {path} does not exist")
    try:  # a regular file only (a FIFO or a directory named *.toml is refused, never read), bounded in size,
        raw = read_toml_file(path, what="target profile", max_bytes=MAX_PROFILE_BYTES)  # depth and digits
    except UnreadableFile as e:
        raise TargetError(e.message, hint=e.hint or "fix or remove the file") from None
    return raw


def parse_profile(path: Path) -> TargetProfile:
    """Read and validate one profile; every problem in the file is reported at once."""
    raw = _read_profile(path)

    p = _Problems(path)
    p.check_table(raw, _TOP, "", _REQUIRED_TOP)
    conv = raw.get("convert", {}) if isinstance(raw.get("convert"), dict) else {}
    run = raw.get("run", {}) if isinstance(raw.get("run"), dict) else {}
    p.check_table(conv, _CONVERT, "convert.", ("chain", "os", "arch"))
    p.check_table(run, _RUN, "run.", ("runner", "os", "arch"))
    llm_raw = raw.get("llm") if isinstance(raw.get("llm"), dict) else None
    if llm_raw is not None:
        p.check_table(llm_raw, _LLM, "llm.", ("precisions", "default_precision"))
    p.raise_if_any()

    if raw["schema_version"] != SCHEMA_VERSION:
        p.add("schema_version", f"this edgekit reads schema {SCHEMA_VERSION}, the file has {raw['schema_version']}")
    if raw["name"] != path.stem:
        p.add("name", f"{raw['name']!r} must match the file name {path.stem!r}")
    precisions = _precisions(p, raw, "")
    if not raw["frame_budget_ms"] > 0:
        p.add("frame_budget_ms", f"must be > 0, got {raw['frame_budget_ms']}")

    chain = _chain(p, conv)
    options = conv.get("options", {})
    _check_options(p, options, chain)
    convert_place = StepPlace(
        _str_list(p, conv.get("os"), "convert.os"), _str_list(p, conv.get("arch"), "convert.arch")
    )
    run_place = StepPlace(
        _str_list(p, run.get("os"), "run.os"),
        _str_list(p, run.get("arch"), "run.arch"),
        needs_gpu=bool(run.get("needs_gpu", False)),
        needs_device=bool(run.get("needs_device", False)),
    )
    device_class = _device_class(p, run, run_place)
    llm = None
    if llm_raw is not None:
        llm = LLMProfile(
            llm_raw.get("runner", "llama.cpp"),
            _precisions(p, llm_raw, "llm."),
            llm_raw["default_precision"],
            dict(llm_raw.get("options", {})),
        )
    p.raise_if_any()
    return TargetProfile(
        name=raw["name"],
        title=raw["title"],
        hardware=raw["hardware"],
        runner=run["runner"],
        default_precision=raw["default_precision"],
        precisions=precisions,
        frame_budget_ms=float(raw["frame_budget_ms"]),
        chain=tuple(chain),
        convert_place=convert_place,
        run_place=run_place,
        accelerator=run.get("accelerator", ""),
        device_class=device_class,
        runtime_options=dict(run.get("options", {})),
        convert_options=dict(options),
        notes=raw.get("notes", ""),
        path=path,
        llm=llm,
    )


def _device_class(p: _Problems, run: Mapping[str, Any], run_place: StepPlace) -> DeviceClass:
    """``[run] device_arch`` (default: run.arch), ``device_os`` (default: run.os), ``device_platform``: every
    problem recorded. A device class must be one the runner runs on: its arches and OSes are within run.arch and
    run.os. A profile without ``device_arch`` (written before it existed) counts every run architecture as its
    device class, as edgekit did then; the built-in profiles name theirs."""
    given = run["device_arch"] if "device_arch" in run else list(run_place.arch)
    archs = tuple(normalize_arch(a) for a in _str_list(p, given, "run.device_arch"))
    for a in archs:
        if a not in ARCHS:
            p.add(
                "run.device_arch",
                f"unknown architecture {a!r}; {did_you_mean(a, list(ARCHS))}known: {', '.join(ARCHS)}",
            )
    run_archs = {normalize_arch(a) for a in run_place.arch}
    elsewhere = [a for a in archs if a in ARCHS and a not in run_archs]
    if run_place.arch and elsewhere:
        p.add(
            "run.device_arch",
            f"{elsewhere} not in run.arch {list(run_place.arch)}: the runner must run on the target's own devices",
        )
    oses = _str_list(p, run["device_os"], "run.device_os") if "device_os" in run else run_place.os
    if run_place.os and [o for o in oses if o not in run_place.os]:
        p.add("run.device_os", f"{[o for o in oses if o not in run_place.os]} not in run.os {list(run_place.os)}")
    platform = run.get("device_platform")
    if platform is not None and platform not in PLATFORMS:
        p.add(
            "run.device_platform",
            f"unknown platform {platform!r}; {did_you_mean(platform, list(PLATFORMS))}known: {', '.join(PLATFORMS)}",
        )
    return DeviceClass(archs, tuple(oses), platform, run.get("accelerator", ""))


def builtin_dir() -> Path:
    """Shipped profiles: ``edge/targets`` in a wheel, ``<repo>/targets`` in a source checkout."""
    here = Path(__file__).resolve().parent
    inside = here / "targets"
    return inside if inside.is_dir() else here.parent / "targets"


def search_path(extra_dirs: Iterable[str | os.PathLike[str]] = ()) -> list[Path]:
    dirs = [Path(d) for d in extra_dirs]
    env = os.environ.get(ENV_VAR, "")
    dirs += [Path(d) for d in env.split(os.pathsep) if d]
    for d in dirs:
        if not d.is_dir():
            raise TargetError(f"targets directory {d} does not exist", hint=f"check --targets-dir / {ENV_VAR}")
    return dirs + [builtin_dir()]


def load_targets(extra_dirs: Iterable[str | os.PathLike[str]] = ()) -> dict[str, TargetProfile]:
    """All profiles on the search path, earlier directories winning over later ones."""
    found: dict[str, TargetProfile] = {}
    for d in search_path(extra_dirs):
        for f in sorted(d.glob("*.toml")):
            if f.stem not in found:
                found[f.stem] = parse_profile(f)
    return dict(sorted(found.items()))


_QAIRT = (
    "LiteRT's Qualcomm NPU compiler plugin (in ai-edge-litert 2.3) links QAIRT's libQnnHtp/libQnnIr/libQnnLpai/"
    "libQnnSaver/libQnnSystem.so, which ai-edge-litert-sdk-qualcomm downloads from Qualcomm's site when it is "
    "built, not from a package registry: no offline install, so no Snapdragon/Hexagon NPU target"
)
_NEUROPILOT = (
    "LiteRT's MediaTek NPU compiler plugin (in ai-edge-litert 2.3) needs NeuroPilot's libneuron_adapter.so, which "
    "ai-edge-litert-sdk-mediatek downloads from MediaTek's storage when it is built, not from a package registry: "
    "no offline install, so no Dimensity NPU target"
)
#: names a user may try that are not targets, and why (one line; docs/targets.md "Runtimes that are not targets")
NOT_TARGETS: dict[str, str] = {
    **dict.fromkeys(("qualcomm-npu", "qualcomm", "snapdragon", "hexagon", "qnn", "snpe", "qairt"), _QAIRT),
    **dict.fromkeys(("mediatek-npu", "mediatek", "dimensity", "neuropilot", "apu"), _NEUROPILOT),
    **dict.fromkeys(
        ("nnapi", "android-nnapi"),
        "Android NNAPI is deprecated since Android 15 and runs only inside an Android app: convert for "
        "arm-xnnpack (LiteRT) and let the app choose its delegate",
    ),
    **dict.fromkeys(
        ("tfjs", "tensorflow-js", "tensorflowjs"),
        "TensorFlow.js runs in a browser or Node.js, outside the device agent: no runner here to verify a bundle with",
    ),
    **dict.fromkeys(
        ("tvm", "iree", "mlir"),
        "a compiler stack, not a device: TVM/IREE compile for a CPU/GPU that an existing target already covers, "
        "with their own tuning; not wrapped",
    ),
}


def get_target(name: str, extra_dirs: Iterable[str | os.PathLike[str]] = ()) -> TargetProfile:
    dirs = search_path(extra_dirs)
    for d in dirs:
        f = d / f"{name}.toml"
        if f.is_file():
            return parse_profile(f)
    names = sorted({f.stem for d in dirs for f in d.glob("*.toml")})
    if name.lower() in NOT_TARGETS:
        raise TargetError(
            f"{name!r} is not a target: {NOT_TARGETS[name.lower()]}",
            hint="docs/targets.md, 'Runtimes that are not targets'; known targets: " + ", ".join(names),
        )
    raise TargetError(
        f"unknown target {name!r}; {did_you_mean(name, names)}known targets: {', '.join(names)}",
        hint="add your own with --targets-dir or " + ENV_VAR,
    )
