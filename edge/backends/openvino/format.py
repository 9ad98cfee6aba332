"""What an OpenVINO bundle needs, read by both sides: the runtime requirement and the telemetry switch."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from edge.backends.options import RESERVE_CPUS_DOC, THREAD_SEARCH, THREADS, search_values
from edge.backends.tuning import TuneSpace
from edge.base.typedjson import Rule, spec
from edge.capabilities import Requirement, env_flag

OPENVINO_REQUIREMENT = Requirement("python", "openvino", install="pip install 'edgekit-ml[openvino]'")


#: set to 1 to leave OpenVINO's / NNCF's own telemetry as the user configured it
TELEMETRY_ENV = "EDGEKIT_OPENVINO_TELEMETRY"


_telemetry_state: str | None = None


def disable_openvino_telemetry() -> str:
    """Stop OpenVINO and NNCF from sending usage telemetry from this process; say what was done.

    What happens without it (openvino 2026.4, openvino-telemetry 2025.2, nncf 3.4): ``import
    openvino`` initialises the ``openvino_telemetry.Telemetry`` singleton with
    ``enable_opt_in_dialog=False`` (consent is assumed when ``~/intel/openvino_telemetry``
    does not exist), writes a client id to ``~/intel/openvino_ga_cid`` and sends an
    "import" event to Google Analytics from a forked helper process (3 s timeout);
    ``ov.convert_model`` and ``nncf.quantize`` send more events through the same
    singleton. There is no environment variable for it: the documented switch is
    ``opt_in_out --opt_out``, which writes ``0`` into ``~/intel/openvino_telemetry`` for
    every OpenVINO tool of the user, so edgekit does not do that. Instead it makes the
    consent check of this process answer "declined" (``OptInChecker.check``) before
    OpenVINO is imported, and clears the consent of an already created singleton.
    ``disable_in_ci`` (``CI=true``) would also work but changes other tools' behaviour.

    Set ``EDGEKIT_OPENVINO_TELEMETRY=1`` to leave telemetry as OpenVINO configures it.
    Idempotent and cheap; call it before ``import openvino`` / ``import nncf``.
    """
    global _telemetry_state
    if _telemetry_state is not None:
        return _telemetry_state
    if env_flag(TELEMETRY_ENV):
        _telemetry_state = f"left as configured by OpenVINO ({TELEMETRY_ENV}=1)"
        return _telemetry_state
    try:
        from openvino_telemetry import Telemetry
        from openvino_telemetry.utils import opt_in_checker
    except ImportError:
        _telemetry_state = "off (openvino-telemetry is not installed)"
        return _telemetry_state
    try:
        declined = opt_in_checker.ConsentCheckResult.DECLINED

        def _declined(self: Any, *args: Any, **kwargs: Any) -> Any:
            return declined

        opt_in_checker.OptInChecker.check = _declined  # every later Telemetry.init() declines
        existing = getattr(Telemetry, "_SingletonMetaClass__single_instance", None)
        if existing is not None:  # openvino was imported before edgekit could intervene
            existing.consent = False
        _telemetry_state = "off for this process (edgekit declined consent)"
    except Exception as e:  # noqa: BLE001 - an unknown openvino-telemetry layout must not break inference
        _telemetry_state = f"could not be turned off ({type(e).__name__}: {e})"
    return _telemetry_state


_core: Any = None
_core_lock = threading.Lock()


def ov_core() -> Any:
    """The process's one ``openvino.Core``: every runner, converter and source adapter uses it.

    Why one (openvino 2026.4, Linux): each CPU plugin instance — one per ``Core`` that touches the
    CPU device — replaces the calling thread's alternate signal stack with a new mmap'd one and, when
    it is destroyed, restores the stack it replaced only if its own is still current, then unmaps
    its own (``SigAltStackSetup``, src/plugins/intel_cpu). Two Cores destroyed in the order they
    were made (Python's garbage collector decides that order) leave the thread's alternate stack
    pointing at unmapped memory: the next signal handler in that thread (Ctrl-C, SIGTERM to the
    agent, the faulthandler) runs there and the process dies with SIGSEGV or corrupts whatever was
    mapped there since. Measured in this repository: 3 of 11 whole test-suite runs died at exit
    (rc 139) before edgekit kept one Core; the core dumps showed a signal frame on an unmapped
    stack. One Core made once and never destroyed has nothing to restore out of order.
    """
    global _core
    if _core is None:
        with _core_lock:
            if _core is None:
                disable_openvino_telemetry()
                import openvino as ov

                _core = ov.Core()
    return _core


# -- runner options (declared once: edge.backends.options) --------------------------------------

#: the most streams asked for (OpenVINO caps them at its CPUs anyway; more is a typo)
MAX_STREAMS = 1024


def streams_over_threads(streams: int | str, threads: int) -> str | None:
    """Why ``num_streams`` cannot run on ``num_threads`` (None: it can): every stream runs on threads of its own.
    The runner refuses it and the tuner's space prunes it, with these words."""
    if isinstance(streams, int) and threads and streams > threads:
        return f"every stream runs on threads of its own, so {threads} thread(s) hold at most {threads} stream(s)"
    return None


@dataclass(frozen=True)
class OpenVINOOptions:
    device: str | tuple[str, ...] = spec(
        "CPU",
        pattern=r"^[A-Za-z0-9_.:,-]{1,64}$",
        min_items=1,
        max_items=8,
        item=Rule(pattern=r"^[A-Za-z0-9_.:-]{1,64}$"),
        doc="OpenVINO devices in order of preference, e.g. [GPU, CPU] (default [CPU]); the first one present is used "
        "and a fallback is recorded",
    )
    performance_hint: Literal[
        "LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT", "latency", "throughput", "cumulative_throughput"
    ] = spec("LATENCY", search=("LATENCY", "THROUGHPUT"), doc="LATENCY (default), THROUGHPUT or CUMULATIVE_THROUGHPUT")
    inference_precision: Literal["bundle", "fast", "f32", "f16", "bf16", "BUNDLE", "FAST", "F32", "F16", "BF16"] = spec(
        "bundle",
        doc="bundle (default: f32 for fp32 bundles and for fp16 bundles on a CPU, the device's default "
        "otherwise); fast (written by edgekit convert only when the bundle passed parity in bf16 on a CPU: "
        "bf16 on a CPU whose plugin lists BF16, f32 on other CPUs, as bundle elsewhere); or force f32, f16 "
        "or bf16",
    )
    num_threads: int = spec(
        0,
        **THREADS,
        search=THREAD_SEARCH,
        doc="CPU inference threads; 0 (default) = edgekit's choice: the CPU plugin's own count and pinning where "
        "nothing else shares the CPUs, else the CPUs other processes and reserve_cpus leave, unpinned "
        "(edge.backends.threads), followed while it runs (load_recheck_s)",
    )
    reserve_cpus: float = spec(0.0, ge=0, le=4096, doc=RESERVE_CPUS_DOC)
    load_recheck_s: float = spec(
        2.0,
        ge=0,
        le=3600,
        doc="seconds between two looks at the CPU load while the runner runs, where threads are edgekit's choice "
        "(CPU): when the choice changes (the device turned busy or idle), the model is compiled again with it "
        "(bounded: at most 1% of the time); 0 = decide once, when opened",
    )
    # 0: the performance hint's choice; AUTO: OpenVINO's throughput choice (refused with LATENCY by the runner)
    num_streams: int | Literal["AUTO", "auto"] = spec(
        0,
        search=(0, 1, 2),  # the hint's own choice (0: not set), then 1 and 2 streams (objective throughput)
        ge=0,
        le=MAX_STREAMS,
        doc="parallel inference streams (NUM_STREAMS), an integer or AUTO; 0 = the "
        "performance hint's choice (LATENCY: 1; THROUGHPUT: several). Not with LATENCY and AUTO (OpenVINO then "
        "switches to THROUGHPUT), nor above num_threads",
    )
    dynamic_quantization_group_size: int | None = spec(
        None,
        ge=0,
        le=1 << 20,
        doc="CPU: DYNAMIC_QUANTIZATION_GROUP_SIZE, the group of activations a MatMul with "
        "integer weights quantizes at run time; 0 = off. Default: 0 where the bundle computes in f32 (fp32 means "
        "fp32), the plugin's own (32) otherwise; an edgekit tune overlay may set it",
    )


# -- what edgekit tune searches (edge.backends.tuning) ------------------------------------------


def tune_conflict(opts: Mapping[str, Any], cpus: int) -> str | None:
    """num_streams under LATENCY, and more streams than threads: the runner's own rule and words."""
    streams, threads = opts.get("num_streams", 0), opts.get("num_threads", 0)
    if streams and str(opts.get("performance_hint", "LATENCY")).upper() == "LATENCY":
        # measured (OpenVINO 2026.4, CPU): LATENCY + NUM_STREAMS=2 reads back LATENCY with 2 streams and 2
        # optimal requests; tests/tune/test_tune_streams.py checks it against the installed OpenVINO
        return (
            "openvino num_streams with performance_hint=LATENCY: LATENCY runs one stream (num_streams=1 "
            "changes nothing) and OpenVINO lets a larger NUM_STREAMS override the hint (it reads back that "
            "many streams under LATENCY), the trial performance_hint=THROUGHPUT with that num_streams"
        )
    too_many = streams_over_threads(streams, threads)
    if too_many:
        return f"openvino num_streams={streams} with num_threads={threads}: {too_many} (the runner refuses it)"
    return None


def cpu_capabilities() -> list[str] | None:
    """What OpenVINO's CPU plugin reports it computes in (FP32, BF16, FP16, INT8...), None when it cannot say."""
    try:
        import openvino.properties as props

        return [str(c) for c in ov_core().get_property("CPU", props.device.capabilities)]
    except Exception:  # noqa: BLE001 - no OpenVINO, no CPU plugin: bf16 is then pruned with this reason
        return None


#: streams tried for the throughput objective, after the hint's own choice (0: option not set)
STREAMS: tuple[int, ...] = search_values(OpenVINOOptions)["num_streams"]
TUNE_SPACE = TuneSpace(
    OpenVINOOptions,
    "onnx->openvino-ir",
    "intel-igpu",
    threads_option="num_threads",
    recipes={"fp16": {"mixed_precision": ("auto", "off")}},
    cpu_archs=("x86_64",),
    elsewhere={"device": ["CPU"]},  # pinned to the target's CPU: its home target names its iGPU
    throughput_only={
        "performance_hint": (
            "LATENCY",
            "performance_hint=THROUGHPUT: only for the throughput objective (objective {objective} runs one request "
            "at a time, which THROUGHPUT's streams split the CPU for)",
        ),
        "num_streams": (
            0,
            "num_streams: only for the throughput objective (objective {objective} runs one request at a time; a "
            "stream serves one request)",
        ),
    },
    cpu_capped={"num_streams": "more streams than the {cpus} CPUs this process may use (OpenVINO caps them)"},
    unset={"num_streams": 0},  # the hint's own choice
    labels={"num_threads": "threads", "performance_hint": "hint", "mixed_precision": "mixed", "num_streams": "streams"},
    elsewhere_note="the CPU plugin (device CPU)",
    conflict=tune_conflict,
    compute_precisions={"bf16": {"inference_precision": "bf16"}},  # bf16 compute on an fp32 IR
    compute_capabilities=cpu_capabilities,
    capability_source="OpenVINO's CPU plugin",
)
