"""The declarative search space of ``edgekit tune``: runners, precisions, recipes and runner options per target.

Data first (Olive's ``OrtSessionParamsTuning`` is the model): :data:`SPACES` says, per runner, which
converter feeds it, which recipe knobs (convert options) and which runner options are worth trying.
:func:`build_space` expands it for one target on this host and prunes every combination that cannot
run or cannot mean anything here, each with its reason:

* runners: the target's own, plus, for a target whose accelerator is a plain CPU, every CPU runner for
  its architecture (:data:`CPU_RUNNERS`: x86-cpu is served by onnxruntime and OpenVINO's CPU plugin);
  a runner or converter this host lacks is pruned with what is missing;
* precisions: the target's precisions the runner's converter produces; bf16 only as OpenVINO's compute
  precision on an fp32 IR, and only where OpenVINO reports BF16 for the CPU; int8 only with calibration;
* threads: up to the CPUs this process may use; OpenVINO's THROUGHPUT hint only for the throughput
  objective (a single stream of frames runs one request at a time, which THROUGHPUT's streams split).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

OBJECTIVES = ("latency", "throughput", "e2e")
THREADS = (1, 2, 4, 8, 16)
WORKERS = (1, 2)  # video pipeline inference workers (objective e2e)


@dataclass(frozen=True)
class RunnerSpace:
    runner: str
    converter: str  # the one converter that takes an ONNX source to what the runner loads
    home: str  # the shipped target whose convert options this runner takes on a target with another chain
    options: Mapping[str, tuple[Any, ...]]  # runner option -> values tried (the first is the default)
    recipes: Mapping[str, Mapping[str, tuple[Any, ...]]] = field(default_factory=dict)  # precision -> convert knobs
    #: the runner option naming the thread count (THREADS are filtered to this host's CPUs)
    threads_option: str | None = None


SPACES: dict[str, RunnerSpace] = {
    "onnxruntime": RunnerSpace(
        "onnxruntime", "onnx->onnx", "x86-cpu",
        {"intra_op_num_threads": THREADS, "graph_optimization_level": ("all", "extended", "basic"),
         "execution_mode": ("sequential", "parallel"), "inter_op_num_threads": (0, 2),
         "allow_spinning": (True, False)},
        {"fp16": {"mixed_precision": ("auto", "off")}, "int8": {"mixed_precision": ("auto", "off")}},
        threads_option="intra_op_num_threads"),
    "openvino": RunnerSpace(
        "openvino", "onnx->openvino-ir", "intel-igpu",
        {"num_threads": THREADS, "performance_hint": ("LATENCY", "THROUGHPUT")},
        {"fp16": {"mixed_precision": ("auto", "off")}},
        threads_option="num_threads"),
    # XNNPack or LiteRT's builtin kernels (``none``): XNNPack is not faster for every graph (small or op-by-op
    # models pay its packing), and some ops stay outside it anyway
    "litert": RunnerSpace("litert", "onnx->tflite", "arm-xnnpack",
                          {"num_threads": THREADS, "delegate": ("xnnpack", "none")},
                          threads_option="num_threads"),
}
#: a target whose accelerator is a plain CPU ("CPU") is served by every CPU runner for its architecture;
#: a target that names a delegate or an accelerator (XNNPack, an iGPU) by its own runner only
CPU_RUNNERS = {"x86_64": ("onnxruntime", "openvino")}


@dataclass(frozen=True)
class Config:
    """One point of the space: what is converted (runner, precision, recipe) and how it runs (options, workers)."""

    runner: str
    precision: str  # as tuned: fp32, fp16, bf16 (OpenVINO compute precision on an fp32 IR), int8, int8-dynamic
    recipe: tuple[tuple[str, Any], ...] = ()  # convert options set by the search
    options: tuple[tuple[str, Any], ...] = ()  # runner options set by the search
    workers: int = 1

    @property
    def bundle_precision(self) -> str:
        return "fp32" if self.precision == "bf16" else self.precision

    @property
    def id(self) -> str:
        parts = [self.runner, self.precision]
        parts += [f"{k}={_word(v)}" for k, v in self.recipe]
        parts += [f"{k}={_word(v)}" for k, v in self.options if k != "inference_precision"]
        if self.workers != 1:
            parts.append(f"workers={self.workers}")
        return "/".join(parts)

    def label(self) -> str:
        """Short, for tables: 'openvino int8 threads=2 LATENCY'."""
        short = {"intra_op_num_threads": "threads", "num_threads": "threads", "graph_optimization_level": "graph",
                 "performance_hint": "hint", "mixed_precision": "mixed", "execution_mode": "mode",
                 "inter_op_num_threads": "inter", "allow_spinning": "spin"}
        bits = [f"{short.get(k, k)}={_word(v)}" for k, v in self.recipe + self.options if k != "inference_precision"]
        if self.workers != 1:
            bits.append(f"workers={self.workers}")
        return f"{self.runner} {self.precision} " + " ".join(bits)

    def to_json(self) -> dict[str, Any]:
        return {"runner": self.runner, "precision": self.precision, "recipe": dict(self.recipe),
                "options": dict(self.options), "workers": self.workers}


def _word(v: Any) -> str:
    return json.dumps(v) if isinstance(v, bool) else str(v)


@dataclass
class Space:
    configs: list[Config]
    pruned: list[str]  # "what: why", one per pruned combination group
    convert_options: dict[str, dict[str, Any]]  # runner -> its converter's base options on this target
    run_options: dict[str, dict[str, Any]]  # runner -> its base runner options on this target
    notes: list[str] = field(default_factory=list)
    #: the space was built for the video pipeline (objective e2e): an overlay then carries the inference workers
    video: bool = False

    def base_profile(self, profile: Any, cfg: Config) -> Any:
        """``profile`` set up to convert ``cfg`` (its runner, chain and recipe; the base runner options)."""
        from edge.tuned import apply_overlay

        return apply_overlay(profile, self.overlay(profile, cfg, tuned={}, with_knobs=False))

    def overlay(self, profile: Any, cfg: Config, *, tuned: Mapping[str, Any], with_knobs: bool = True) -> Any:
        from edge.tuned import TunedOverlay

        conv = SPACES[cfg.runner].converter
        run_opts = dict(self.run_options[cfg.runner])
        if with_knobs:
            run_opts.update(dict(cfg.options))
        return TunedOverlay(target=profile.name, precision=cfg.bundle_precision, runner=cfg.runner, chain=(conv,),
                            convert_options={conv: {**self.convert_options[cfg.runner], **dict(cfg.recipe)}},
                            run_options=run_opts, tuned=dict(tuned),
                            infer_workers=cfg.workers if (with_knobs and self.video) else None)


def option_conflict(runner: str, opts: Mapping[str, Any], cpus: int) -> str | None:
    """Why a combination of runner options cannot run or cannot differ from another one here ("what: why"),
    None when it is worth a trial. Olive's OrtSessionParamsTuning prunes the same way."""
    if runner != "onnxruntime":
        return None
    mode, inter = opts.get("execution_mode", "sequential"), opts.get("inter_op_num_threads", 0)
    intra, spin = opts.get("intra_op_num_threads", 0), opts.get("allow_spinning", True)
    if inter and mode != "parallel":
        return ("onnxruntime inter_op_num_threads with execution_mode=sequential: a sequential session runs one node "
                "at a time (no inter-op threads)")
    if mode == "parallel" and intra == 1:
        return ("onnxruntime execution_mode=parallel with intra_op_num_threads=1: one thread was asked for, and "
                "parallel mode adds an inter-op pool of its own")
    if inter > cpus:
        return f"onnxruntime inter_op_num_threads={inter}: more threads than the {cpus} CPUs this process may use"
    if spin is False and intra == 1 and mode == "sequential":
        return ("onnxruntime allow_spinning=false with one thread, sequential: there is no thread pool to spin, the "
                "same as allow_spinning=true")
    return None


def usable_cpus() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def runners_for(profile: Any) -> tuple[str, ...]:
    """The runners that serve ``profile``'s device class (the target's own first)."""
    found = [profile.runner]
    if profile.accelerator.strip().upper() == "CPU":
        for arch in profile.device_class.arch:
            found += [r for r in CPU_RUNNERS.get(arch, ()) if r not in found]
    return tuple(found)


def openvino_cpu_capabilities() -> list[str] | None:
    """What OpenVINO's CPU plugin reports it computes in (FP32, BF16, FP16, INT8...), None when it cannot say."""
    try:
        from edge.backends.openvino.format import ov_core

        import openvino.properties as props

        return [str(c) for c in ov_core().get_property("CPU", props.device.capabilities)]
    except Exception:  # noqa: BLE001 - no OpenVINO, no CPU plugin: bf16 is then pruned with this reason
        return None


def build_space(profile: Any, *, objective: str = "latency", calibrated: bool = False, video: bool = False,
                runners: Sequence[str] | None = None, precisions: Sequence[str] | None = None,
                threads: Sequence[int] | None = None, targets_dir: Iterable[Any] = (),
                bf16_capabilities: list[str] | None | str = "ask") -> Space:
    """Expand :data:`SPACES` for ``profile`` on this host; every pruned combination says why.

    ``runners``/``precisions``/``threads`` narrow the space (tests, a user who knows); naming one the target
    cannot use is an error, never silently dropped. ``bf16_capabilities``: OpenVINO CPU's reported
    capabilities (default: asked from OpenVINO)."""
    from edge.backends.converter import CONVERTERS
    from edge.backends.runner import RUNNERS
    from edge.capabilities import problems
    from edge.errors import EdgeError
    from edge.pipeline import conversion_problems
    from edge.targets import ChainStep, get_target

    if objective not in OBJECTIVES:
        raise EdgeError(f"unknown objective {objective!r}", hint=f"choose one of {', '.join(OBJECTIVES)}")
    serving = runners_for(profile)
    if runners:
        unknown = [r for r in runners if r not in serving]
        if unknown:
            raise EdgeError(f"runner(s) {', '.join(unknown)} do not serve {profile.name}'s device class "
                            f"({profile.device_class.describe()})", hint=f"choose from {', '.join(serving)}")
        serving = tuple(r for r in serving if r in runners)
    allowed_prec = tuple(profile.precisions) + (("bf16",) if "bf16" not in profile.precisions else ())
    if precisions:
        unknown = [p for p in precisions if p not in allowed_prec]
        if unknown:
            raise EdgeError(f"precision(s) {', '.join(unknown)} are not tunable for {profile.name}",
                            hint=f"choose from {', '.join(allowed_prec)}")
    cpus = usable_cpus()
    thread_values = tuple(threads) if threads else THREADS
    if any(not isinstance(t, int) or t < 1 for t in thread_values):
        raise EdgeError(f"threads must be integers >= 1, got {list(thread_values)}")
    space = Space([], [], {}, {}, video=video)
    for runner in serving:
        if runner not in SPACES:
            space.pruned.append(f"{runner}: edgekit tune has no search space for this runner")
            continue
        rs = SPACES[runner]
        try:
            missing = problems(RUNNERS.get(runner).requires)
        except EdgeError as e:
            missing = [str(e)]
        chain = (ChainStep(rs.converter),)
        missing += [m for m in conversion_problems(profile, chain=chain) if m not in missing]
        if missing:
            space.pruned.append(f"{runner}: cannot run or convert here: {'; '.join(missing)}")
            continue
        if runner == profile.runner and profile.chain and profile.chain[-1].converter == rs.converter:
            conv_opts = dict(profile.convert_options.get(rs.converter, {}))
            run_opts = dict(profile.runtime_options)
        else:  # another runner on this target: its home target's recipe, pinned to the target's device
            home = get_target(rs.home, targets_dir)
            conv_opts = dict(home.convert_options.get(rs.converter, {}))
            run_opts = dict(home.runtime_options)
            if runner == "openvino":
                run_opts["device"] = ["CPU"]
                space.notes.append(f"openvino on {profile.name}: the CPU plugin (device CPU), "
                                   f"{rs.home}'s conversion recipe")
        space.convert_options[runner], space.run_options[runner] = conv_opts, run_opts
        conv_precisions = CONVERTERS.get(rs.converter).precisions
        for prec in allowed_prec:
            if precisions and prec not in precisions:
                continue
            if prec == "bf16":
                if runner != "openvino":
                    space.pruned.append(f"{runner} bf16: {runner} has no bf16 compute precision to ask for "
                                        "(bf16 is tuned as OpenVINO's inference precision on an fp32 IR)")
                    continue
                caps = openvino_cpu_capabilities() if bf16_capabilities == "ask" else bf16_capabilities
                if not caps or "BF16" not in caps:
                    space.pruned.append(f"openvino bf16: OpenVINO's CPU plugin does not report BF16 on this host "
                                        f"(it reports {', '.join(caps) if caps else 'nothing'})")
                    continue
            elif prec not in conv_precisions:
                space.pruned.append(f"{runner} {prec}: converter {rs.converter} cannot produce it "
                                    f"(it produces {', '.join(sorted(conv_precisions))})")
                continue
            if prec == "int8" and not calibrated:
                space.pruned.append(f"{runner} int8: static int8 needs calibration data "
                                    "(pass --calib DIR, or --calib random for generated inputs)")
                continue
            knobs: list[tuple[str, tuple[Any, ...]]] = []
            recipe_knobs = list(rs.recipes.get(prec, {}).items())
            for name, values in rs.options.items():
                if name == rs.threads_option:
                    ok = tuple(t for t in thread_values if t <= cpus)
                    over = [t for t in thread_values if t > cpus]
                    if over:
                        space.pruned.append(f"{runner} {name}={','.join(map(str, over))}: more threads than the "
                                            f"{cpus} CPUs this process may use")
                    values = tuple(sorted(ok, reverse=True)) or (cpus,)  # all CPUs first: the default
                if name == "performance_hint" and objective != "throughput":
                    if "THROUGHPUT" in values:
                        space.pruned.append(f"{runner} performance_hint=THROUGHPUT: only for the throughput "
                                            f"objective (objective {objective} runs one request at a time, which "
                                            "THROUGHPUT's streams split the CPU for)")
                    values = ("LATENCY",)
                knobs.append((name, tuple(values)))
            base_opts = (("inference_precision", "bf16"),) if prec == "bf16" else ()
            for rvals in itertools.product(*[v for _, v in recipe_knobs]):
                recipe = tuple(zip([k for k, _ in recipe_knobs], rvals))
                for ovals in itertools.product(*[v for _, v in knobs]):
                    opts = base_opts + tuple(zip([k for k, _ in knobs], ovals))
                    conflict = option_conflict(runner, dict(opts), cpus)
                    if conflict is not None:
                        space.pruned.append(conflict)
                        continue
                    for w in (WORKERS if video else (1,)):
                        space.configs.append(Config(runner, prec, recipe, opts, w))
    space.pruned = list(dict.fromkeys(space.pruned))
    if not space.configs:
        raise EdgeError(f"nothing to tune for {profile.name} on this host: " + "; ".join(space.pruned))
    return space
