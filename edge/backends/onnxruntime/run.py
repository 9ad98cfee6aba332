"""ONNX Runtime runner: providers and threads from the profile, the providers actually used recorded.

onnxruntime lists execution providers as *available* that then fail to initialise (e.g.
onnxruntime-gpu's TensorRT/CUDA providers on a host without a GPU) and silently runs on the
CPU; the runner therefore reads ``session.get_providers()`` after creation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # numpy is imported where the runner runs: a device's manifest check loads this module
    import numpy as np

from edge.backends.onnxruntime.format import TUNE_SPACE, OnnxRuntimeOptions
from edge.backends.runner import Runner, RunnerInfo
from edge.backends.threads import (
    SHARED_THRESHOLD,
    CpuLoad,
    LoadFollower,
    RuntimeDefaults,
    ThreadPlan,
    physical_cores,
    plan_threads,
    policy_json,
    reserve_option,
)
from edge.capabilities import CpuIsa, Requirement, cpu_isa
from edge.errors import EdgeError, HardwareUnavailableError
from edge.spec import TensorSpec, image_layout

_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
_ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(int16)": "int16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(bool)": "bool",
}


class OnnxRuntimeRunner(Runner):
    name = "onnxruntime"
    formats = ("onnx",)
    requires = (Requirement("python", "onnxruntime", install="pip install 'edgekit-ml[onnx]'"),)
    options_class = OnnxRuntimeOptions
    tune_space = TUNE_SPACE  # what edgekit tune searches, declared in format.py

    def __init__(self, artifact: Path, *, options: Mapping[str, Any] | None = None, precision: str = "fp32") -> None:
        super().__init__(artifact, options=options, precision=precision)
        import onnxruntime as ort

        opts = self._options
        wanted = list(opts.get("providers", ["CPUExecutionProvider"]))
        available = ort.get_available_providers()
        usable = [p for p in wanted if p in available]
        if not usable:
            raise HardwareUnavailableError(
                f"none of the execution providers {wanted} is available in onnxruntime {ort.__version__} "
                f"(available: {', '.join(available)})",
                hint="install the onnxruntime build for that provider, e.g. onnxruntime-gpu or onnxruntime-openvino",
            )
        mode, inter, spinning = _threading(opts)
        level = opts.get("graph_optimization_level", "all")
        if level not in _LEVELS:
            raise EdgeError(f"graph_optimization_level must be one of {', '.join(_LEVELS)}, got {level!r}")
        quant_precision, quant_why = x64_quant_precision(opts.get("x64_quant_precision", "auto"), cpu_isa())
        self._spec = _SessionSpec(
            path=str(self.artifact),
            providers=usable,
            level=level,
            mode=mode,
            inter=inter,
            quant_precision=quant_precision,
            quant_why=quant_why,
            threads=_thread_option(opts),
            spinning=spinning,
            reserve=reserve_option(self.name, opts),
        )
        plan = self._spec.plan()
        opened_at = time.monotonic()
        self._session = self._spec.open(plan)
        self._follower = LoadFollower.start(float(self.typed_options.load_recheck_s), plan, opened_at)
        used = self._session.get_providers()
        fallback = None
        if used[0] != wanted[0]:
            fallback = f"asked for {wanted[0]}, onnxruntime is using {used[0]} (available in this build: {', '.join(available)})"
        self.inputs = tuple(_spec(a) for a in self._session.get_inputs())
        self.outputs = tuple(_spec(a) for a in self._session.get_outputs())
        self._output_names = [o.name for o in self.outputs]
        self.info = RunnerInfo(
            runtime=f"onnxruntime {ort.__version__}",
            device_requested=wanted[0],
            device_used=used[0],
            precision_used=_precision_used(self.precision),
            threads=plan.threads,
            fallback=fallback,
            details={
                "providers": used,
                "graph_optimization_level": level,
                "execution_mode": mode,
                "inter_op_num_threads": inter or None,
                "allow_spinning": plan.spinning,
                "threads_policy": policy_json(plan, self._follower),
                **_int8_kernel(self.precision, self._spec.quant_precision, self._spec.quant_why),
            },
        )

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.validate(feeds)
        follower = self._follower
        if follower is not None and follower.due():
            self._follow_load(follower)
        return dict(zip(self._output_names, self._session.run(self._output_names, feeds)))

    def _follow_load(self, follower: LoadFollower) -> None:
        """Between two inferences: the session re-created with the plan the load calls for now, when
        ``LoadFollower`` says so (the cost recorded in ``threads_policy.replans``)."""
        plan = follower.look(self._spec.current, lambda load, threshold: self._spec.plan(load, threshold))
        if plan is None:
            return
        started, current = time.monotonic(), self._spec.current
        try:
            self._session = self._spec.open(plan)
        except Exception as e:  # noqa: BLE001 - the session it has still runs: never fail an inference for this
            self._spec.current = current
            follower.failed(plan, started, e)
            self.info = replace(
                self.info, details={**self.info.details, "threads_policy": policy_json(current, follower)}
            )
            return
        follower.rebuilt(plan, started)
        details = {**self.info.details, "allow_spinning": plan.spinning, "threads_policy": policy_json(plan, follower)}
        self.info = replace(self.info, threads=plan.threads, details=details)

    def close(self) -> None:
        self._session = None
        self._follower = None
        super().close()


@dataclass
class _SessionSpec:
    """Everything a session of this runner is opened with but the thread plan, kept to open it again."""

    path: str
    providers: list[str]
    level: str
    mode: str
    inter: int
    quant_precision: bool
    quant_why: str
    threads: int  # 0: the policy's
    spinning: bool | None  # None: the policy's
    reserve: float
    current: ThreadPlan = field(init=False)

    def plan(self, load: CpuLoad | None = None, shared_threshold: float = SHARED_THRESHOLD) -> ThreadPlan:
        return plan_threads(
            self.threads,
            self.spinning,
            reserve=self.reserve,
            load=load,
            defaults=_ort_defaults(),
            shared_threshold=shared_threshold,
        )

    def open(self, plan: ThreadPlan) -> Any:
        """An ``InferenceSession`` with ``plan``'s threads and spin-wait (the runtime's own where the plan took
        its defaults: nothing set, as a plain session)."""
        import onnxruntime as ort

        try:
            session = ort.InferenceSession(
                self.path, self._options(plan, self.quant_precision), providers=self.providers
            )
        except Exception as e:
            # x64quantprecision rewrites U8S8 weights to U8; onnxruntime has no U8U8 kernel for some QOperator ops
            # (QGemm of an already-quantized model): such a graph runs with the rewrite off, recorded in details
            if not (self.quant_precision and "NOT_IMPLEMENTED" in str(e) and "com.microsoft.Q" in str(e)):
                raise EdgeError(f"onnxruntime could not load {self.path}: {type(e).__name__}: {str(e)[:300]}") from e
            self.quant_precision, self.quant_why = False, "no u8u8 kernel for an integer op of this graph: u8s8"
            session = ort.InferenceSession(self.path, self._options(plan, False), providers=self.providers)
        self.current = plan
        return session

    def _options(self, plan: ThreadPlan, x64_quant: bool) -> Any:
        # Measured on an AMD EPYC (Zen 2, AVX2 only): U8S8 QDQ models lost top-1 agreement (75%) and
        # accuracy that a VNNI Xeon kept, because vpmaddubsw saturates; hence u8u8 there. On a VNNI CPU
        # onnxruntime still rewrites every weight to U8 when asked (the U8S8 and U8U8 dispatch tables
        # differ there too): u8u8 was 1.3-1.8x slower than its exact u8s8 (x64_quant_precision, "auto").
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 3
        if plan.threads_from != "default":  # 0: onnxruntime's own count, and its thread affinities
            so.intra_op_num_threads = plan.threads
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVELS[self.level])
        so.add_session_config_entry("session.x64quantprecision", "1" if x64_quant else "0")
        so.execution_mode = (
            ort.ExecutionMode.ORT_PARALLEL if self.mode == "parallel" else ort.ExecutionMode.ORT_SEQUENTIAL
        )
        so.inter_op_num_threads = self.inter
        if plan.spinning_from != "default":  # unset: onnxruntime's own (on)
            spin = "1" if plan.spinning else "0"
            so.add_session_config_entry("session.intra_op.allow_spinning", spin)
            so.add_session_config_entry("session.inter_op.allow_spinning", spin)
        return so


def _ort_defaults() -> RuntimeDefaults | None:
    """onnxruntime's own choice for a session given no thread count and no spin-wait setting: one intra-op thread
    per physical core of the machine (its affinity mask is not consulted: measured, 1.32, under ``taskset -c 0``
    on 2 cores it still started 2), pinned, spin-wait on (onnxruntime's threading docs). None where the core count
    cannot be read: then the policy decides."""
    cores = physical_cores()
    if cores is None:
        return None
    return RuntimeDefaults(cores, True, "onnxruntime's own: one thread per physical core, pinned, spin-wait on")


def _thread_option(opts: Mapping[str, Any]) -> int:
    threads = opts.get("intra_op_num_threads", 0)
    if not isinstance(threads, int) or isinstance(threads, bool) or not 0 <= threads <= 4096:
        raise EdgeError(f"runner 'onnxruntime': intra_op_num_threads must be an integer 0..4096, got {threads!r}")
    return threads


def _threading(opts: Mapping[str, Any]) -> tuple[str, int, bool | None]:
    """(execution mode, inter-op threads, spinning) from the runner options, checked together."""
    mode = opts.get("execution_mode", "sequential")
    if mode not in ("sequential", "parallel"):
        raise EdgeError(f"runner 'onnxruntime': execution_mode must be sequential or parallel, got {mode!r}")
    inter = opts.get("inter_op_num_threads", 0)
    if not isinstance(inter, int) or isinstance(inter, bool) or not 0 <= inter <= 4096:
        raise EdgeError(f"runner 'onnxruntime': inter_op_num_threads must be an integer 0..4096, got {inter!r}")
    if inter and mode != "parallel":
        raise EdgeError(
            f"runner 'onnxruntime': inter_op_num_threads={inter} applies only with execution_mode "
            "parallel (a sequential session runs one node at a time)",
            hint='set execution_mode = "parallel", or leave inter_op_num_threads out',
        )
    spinning = opts.get("allow_spinning")  # None: the policy's (off)
    if spinning is not None and not isinstance(spinning, bool):
        raise EdgeError(f"runner 'onnxruntime': allow_spinning must be true or false, got {spinning!r}")
    return mode, inter, spinning


def _spec(arg: Any) -> TensorSpec:
    shape = tuple(d if isinstance(d, int) else str(d) for d in arg.shape)
    return TensorSpec(arg.name, shape, _ORT_TYPES.get(arg.type, arg.type), image_layout(shape))


def x64_quant_precision(option: Any, isa: CpuIsa) -> tuple[bool, str]:
    """(whether onnxruntime computes int8 u8u8 instead of u8s8: ``session.x64quantprecision``, why). ``option``:
    true, false or "auto" (the default): u8u8 only where u8s8 would saturate, i.e. an x86 CPU without an int8
    dot product (AVX2/AVX-512 without VNNI, or flags not readable: fail safe). With VNNI/AMX u8s8 accumulates
    in int32 and is exact, and onnxruntime's u8u8 rewrite only slows it down (bit-identical outputs)."""
    if isinstance(option, bool):
        return option, f"x64_quant_precision = {str(option).lower()} was set explicitly"
    if option != "auto":
        raise EdgeError(f"runner 'onnxruntime': x64_quant_precision must be true, false or \"auto\", got {option!r}")
    if isa.known and isa.int8_dot_product:
        dot = sorted(isa.flags & {"avx512_vnni", "avx_vnni", "amx_int8", "asimddp"})
        return False, f"auto: this CPU has an int8 dot product ({', '.join(dot)}): u8s8 is exact and faster"
    why = "flags not readable, computing the exact way" if not isa.known else "no int8 dot product (VNNI/AMX)"
    return True, f"auto: {why}: u8u8, as u8s8 pair sums saturate in int16"


def _int8_kernel(bundle_precision: str, quant_precision: bool, why: str) -> dict[str, Any]:
    """Which int8 arithmetic this CPU gets, so a parity figure can be read against the device's."""
    if not bundle_precision.startswith("int8"):
        return {}
    isa = cpu_isa()
    if not isa.known or "avx2" not in isa.flags:
        kernel = "this CPU's int8 kernels (no x86 AVX2 U8S8 path)"
    elif quant_precision:
        kernel = "u8u8 (x64_quant_precision: exact" + (
            ", slower than this CPU's u8s8 dot product)" if isa.int8_dot_product else ", slower than u8s8)"
        )
    elif isa.int8_dot_product:
        kernel = "u8s8, 32-bit dot product (VNNI/AMX): exact"
    else:
        kernel = "u8s8 with vpmaddubsw: int16 pair sums saturate (x64_quant_precision is off)"
    return {"x64_quant_precision": quant_precision, "x64_quant_precision_why": why, "int8_kernel": kernel}


def _precision_used(bundle_precision: str) -> str:
    # The CPU provider computes exactly what the graph says: fp16 graphs in fp16 (or fp32 with
    # inserted casts), QDQ graphs in int8 kernels where it fuses them, fp32 otherwise.
    return {"fp32": "f32", "fp16": "f16", "int8": "int8 (QDQ)", "int8-dynamic": "int8 (dynamic)"}.get(
        bundle_precision, bundle_precision
    )
