"""OpenVINO runner: the first available device of the profile's list, the precision read back.

Two OpenVINO behaviours this runner makes visible instead of silent:

* device choice: the profile lists devices in order of preference (``["GPU", "CPU"]``);
  the first one present in ``Core.available_devices`` is used and a fallback is recorded
  as a sentence in ``RunnerInfo.fallback``;
* compute precision: OpenVINO's CPU plugin computes in bf16 by default on CPUs with AMX
  (and f16 on GPUs), whatever the IR's weights are. ``inference_precision = "bundle"``
  pins f32 for fp32 bundles, and for fp16 bundles on a CPU (whose bf16 default is coarser than the
  f16 they are checked for), and leaves the device default otherwise (f16 on a GPU); what the
  compiled model actually uses is read back from ``INFERENCE_PRECISION_HINT``;
* hidden arithmetic: every precision-affecting property the compiled model applies
  (:data:`PRECISION_PROPERTIES`: DYNAMIC_QUANTIZATION_GROUP_SIZE, the KV cache precisions, ...) is read back
  into ``details["precision_properties"]``; an f32 computation sets DYNAMIC_QUANTIZATION_GROUP_SIZE to 0 (the
  CPU plugin's default 32 quantizes the activations of integer-weight MatMuls at run time);
* streams: ``num_streams`` (OpenVINO's NUM_STREAMS: parallel inference streams, each with its own threads)
  is passed as asked and read back; OpenVINO caps it at the CPUs (or threads) it has without saying so,
  which ``RunnerInfo.details["streams_note"]`` then says. Several streams only help with several requests in
  flight: :meth:`OpenVINORunner.run_concurrent` keeps the compiled model's ``OPTIMAL_NUMBER_OF_INFER_REQUESTS``
  (``details["optimal_requests"]``) in flight in an ``AsyncInferQueue``, as benchmark_app does.
* threads (CPU, ``num_threads`` 0): where nothing else shares the CPUs, the plugin's own (no INFERENCE_NUM_THREADS,
  no ENABLE_CPU_PINNING set: what ``compile_model(xml, "CPU")`` runs); where something does, the cores left,
  unpinned. With one core busy elsewhere on 2 cores, 1 thread and the plugin's 2 pinned had the same median
  (0.97-1.04x) but 2 pinned a p99 2-3x the median, 1 thread within 1.1-1.5x (issue #25); idle, 1 thread is
  1.5-1.7x slower. So the runner follows the load (``LoadFollower``): it compiles the model again when the plan
  changes (100-260 ms measured; at most 1% of the time), recorded in ``threads_policy.replans``.

``import openvino`` sends a usage event to Google Analytics by default (opt-out telemetry,
see :func:`disable_openvino_telemetry`); this module turns that off before importing it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # numpy is imported where the runner runs: a device's manifest check loads this module
    import numpy as np

from edge.backends.openvino.format import (
    MAX_STREAMS,
    OPENVINO_REQUIREMENT,
    TUNE_SPACE,
    OpenVINOOptions,
    disable_openvino_telemetry,
    ov_core,
    streams_over_threads,
)
from edge.backends.runner import Runner, RunnerInfo
from edge.backends.threads import (
    SHARED_THRESHOLD,
    CpuLoad,
    LoadFollower,
    RuntimeDefaults,
    ThreadPlan,
    plan_threads,
    policy_json,
    reserve_option,
    usable_cpus,
)
from edge.errors import EdgeError, HardwareUnavailableError
from edge.spec import TensorSpec, image_layout

#: compiled-model properties that change what the arithmetic computes: read back and reported, never assumed
PRECISION_PROPERTIES = (
    "INFERENCE_PRECISION_HINT",
    "EXECUTION_MODE_HINT",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE",
    "KV_CACHE_PRECISION",
    "KEY_CACHE_PRECISION",
    "VALUE_CACHE_PRECISION",
    "KEY_CACHE_GROUP_SIZE",
    "VALUE_CACHE_GROUP_SIZE",
    "ACTIVATIONS_SCALE_FACTOR",
    "CPU_DENORMALS_OPTIMIZATION",
    "CPU_SPARSE_WEIGHTS_DECOMPRESSION_RATE",
)


def parse_num_streams(value: Any) -> int | str:
    """``num_streams`` as the runner takes it: an integer >= 0 (0: not set, the performance hint decides) or
    "AUTO" (OpenVINO's throughput-oriented choice); :class:`EdgeError` otherwise."""
    if isinstance(value, str) and value.strip().upper() == "AUTO":
        return "AUTO"
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        n = -1
    else:
        try:
            n = int(value)
        except ValueError:
            n = -1
    if not 0 <= n <= MAX_STREAMS:
        raise EdgeError(
            f"runner 'openvino': num_streams must be an integer from 1 to {MAX_STREAMS} (0: the "
            f"performance hint's choice) or AUTO, got {value!r}"
        )
    return n


# devices that are not listed in available_devices but that OpenVINO resolves itself
_VIRTUAL_DEVICES = ("AUTO", "HETERO", "MULTI", "BATCH")
#: input arrays per input a runner keeps as ov.Tensor views (a video pipeline's pool of buffers fits)
BIND_CACHE = 8


def _text(value: Any) -> str | None:
    """A property value as plain text (an ov.Type by its name), None when the device did not report it."""
    if value is None:
        return None
    name = getattr(value, "get_type_name", None)
    return str(name() if callable(name) else value)[:64]


def _as_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v) for v in value]


def _match_device(wanted: str, available: list[str]) -> str | None:
    """The device name to compile on for ``wanted``, or None when it is not present.

    ``GPU`` matches ``GPU`` or ``GPU.0``/``GPU.1`` (OpenVINO resolves ``GPU`` to its first
    GPU); ``GPU.1`` matches only itself. AUTO/HETERO/MULTI/BATCH are virtual and pass through.
    """
    base = wanted.split(":", 1)[0].split(".", 1)[0].upper()
    if base in _VIRTUAL_DEVICES:
        return wanted
    for a in available:
        if a == wanted or ("." not in wanted and a.split(".", 1)[0] == wanted):
            return wanted
    return None


_NON_COMPUTE_LAYERS = frozenset(
    {"Input", "Output", "Const", "Reorder", "Reshape", "Parameter", "Result", "Constant", "Convert"}
)


def _compute_precisions(compiled: Any) -> dict[str, int] | None:
    """Runtime precision of the compute layers of the compiled graph, e.g. {"u8": 4, "i8": 1}.

    INFERENCE_PRECISION_HINT says what non-quantized layers compute in (an int8 bundle reads
    back "bf16" on AMX CPUs); the executable graph says what each layer really runs in.
    None when the device does not report it.
    """
    try:
        counts: dict[str, int] = {}
        for op in compiled.get_runtime_model().get_ordered_ops():
            info = op.get_rt_info()
            if "layerType" not in info or "runtimePrecision" not in info:
                continue
            if info["layerType"].astype(str) in _NON_COMPUTE_LAYERS:
                continue
            precision = info["runtimePrecision"].astype(str).lower()
            counts[precision] = counts.get(precision, 0) + 1
        return dict(sorted(counts.items())) or None
    except Exception:  # noqa: BLE001 - informational only
        return None


def _ir_name(compiled_port: Any, model_port: Any) -> str:
    """The compiled port's name as the IR gave it (when it still answers to that name)."""
    names = compiled_port.get_names()
    mine: str = model_port.get_any_name()
    return mine if mine in names else str(compiled_port.get_any_name())


def _spec(port: Any, name: str | None = None) -> TensorSpec:
    import numpy as np

    pshape = port.get_partial_shape()
    shape = tuple(int(d.get_length()) if d.is_static else str(d) for d in pshape)
    return TensorSpec(
        name or port.get_any_name(), shape, np.dtype(port.get_element_type().to_dtype()).name, image_layout(shape)
    )


class OpenVINORunner(Runner):
    name = "openvino"
    formats = ("openvino-ir",)
    requires = (OPENVINO_REQUIREMENT,)
    options_class = OpenVINOOptions
    tune_space = TUNE_SPACE  # what edgekit tune searches, declared in format.py
    fast_cpu_precision = "bf16"  # the CPU plugin's bf16 (AVX512-BF16, AMX), with inference_precision = "fast"

    def __init__(self, artifact: Path, *, options: Mapping[str, Any] | None = None, precision: str = "fp32") -> None:
        super().__init__(artifact, options=options, precision=precision)
        self._request: Any = None
        self._compiled: Any = None
        self._queue: Any = None
        #: per input: the arrays made ov.Tensor views of (their memory, shared; ``_bind``), and the one the
        #: request reads now
        self._bound: list[dict[int, tuple[np.ndarray, Any]]] = []
        self._current: list[np.ndarray | None] = []
        telemetry = disable_openvino_telemetry()
        import openvino as ov

        asked = _asked(self.typed_options, reserve_option(self.name, self._options))
        version = ov.get_version()
        core = ov_core()
        device, available, fallback = _choose_device(core, asked.wanted, version.split("-", 1)[0])
        xml = self.artifact
        if xml.is_dir():
            xml = xml / "model.xml"
        try:
            model = core.read_model(str(xml))
        except Exception as e:
            raise EdgeError(f"OpenVINO could not read {xml}: {type(e).__name__}: {str(e)[:300]}") from e
        cfg = _compile_config(core, device, asked, self.precision)
        opened_at = time.monotonic()
        try:
            compiled = core.compile_model(model, device, cfg.config)
        except Exception as e:
            raise EdgeError(f"OpenVINO could not compile {xml} for {device}: {type(e).__name__}: {str(e)[:300]}") from e
        self._reopen = _Reopen(core, model, device, asked, self.precision, cfg)
        self._follower = (
            LoadFollower.start(float(self.typed_options.load_recheck_s), cfg.plan, opened_at)
            if cfg.plan is not None
            else None
        )
        self._compiled = compiled
        self._request = compiled.create_infer_request()
        self._tensor = ov.Tensor
        # the names as the IR has them: compiling folds tensor names into one port (a graph output fed by an
        # Identity also answers to the Identity input's name) and get_any_name may then pick the folded one
        in_names = [_ir_name(c, m) for c, m in zip(compiled.inputs, model.inputs)]
        self._input_names = in_names
        self._bound = [{} for _ in in_names]
        self._current = [None] * len(in_names)
        self._output_ports = list(compiled.outputs)
        self._output_names = [_ir_name(c, m) for c, m in zip(self._output_ports, model.outputs)]
        self.inputs = tuple(_spec(p, n) for p, n in zip(compiled.inputs, in_names))
        self.outputs = tuple(_spec(p, n) for p, n in zip(self._output_ports, self._output_names))
        self.info = _read_back(
            compiled,
            core,
            device,
            asked,
            cfg,
            {
                "openvino_version": version,
                "device_preference": asked.wanted,
                "available_devices": available,
                "telemetry": telemetry,
            },
            fallback,
            self._follower,
        )

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        # The request reads each input array in place through an ov.Tensor made once per array (``_bind``):
        # wrapping the arrays on every call (``infer(feeds, share_inputs=True)``) cost 40% of runner.infer
        # on a small model (issue #30). The result holds copies of the outputs (share_outputs=False), so the
        # request's buffers can be reused by the next call.
        self.validate(feeds)
        follower = self._follower
        if follower is not None and follower.due():
            self._follow_load(follower)
        req, current = self._request, self._current
        for i, name in enumerate(self._input_names):
            a = feeds[name]
            if current[i] is a:  # the request reads this very array already
                continue
            hit = self._bound[i].get(id(a))
            if hit is not None and hit[0] is a:
                req.set_input_tensor(i, hit[1])
                current[i] = a
            elif not self._bind(i, a):  # an array OpenVINO cannot read in place: the per-call path
                self._current = [None] * len(current)
                return dict(zip(self._output_names, req.infer(feeds, share_inputs=True).values()))
        # OVDict.values() is in the compiled model's output order (indexing it by port costs ~2 us)
        return dict(zip(self._output_names, req.infer().values()))

    def _bind(self, i: int, a: np.ndarray) -> bool:
        """Set input ``i`` of the request to an ov.Tensor over ``a``'s own memory, remembered for the next calls
        with the same array (``BIND_CACHE`` arrays per input; they are kept alive while remembered, so an id is
        never another array's). False where ``a`` is not a C-contiguous array of the port's element type."""
        flags = getattr(a, "flags", None)  # a numpy array (numpy is not imported at this module's top)
        if flags is None or not flags.c_contiguous:
            return False
        try:
            t = self._tensor(a, shared_memory=True)
            self._request.set_input_tensor(i, t)
        except Exception:  # noqa: BLE001 - another element type or layout: infer(feeds) converts it
            return False
        cache = self._bound[i]
        if len(cache) >= BIND_CACHE:
            cache.clear()
        cache[id(a)] = (a, t)
        self._current[i] = a
        return True

    @property
    def requests(self) -> int:
        """The requests to keep in flight for throughput: the compiled model's OPTIMAL_NUMBER_OF_INFER_REQUESTS
        (1 under LATENCY; one per stream under THROUGHPUT), 1 when the device does not say."""
        return max(1, int(self.info.details.get("optimal_requests") or 1))

    def _async_queue(self, requests: int | None) -> tuple[Any, int]:
        import openvino as ov

        n = self.requests if requests is None else int(requests)
        if not 1 <= n <= 256:
            raise EdgeError(f"runner 'openvino': requests in flight must be from 1 to 256, got {requests!r}")
        if self._compiled is None:
            raise EdgeError("runner 'openvino' is closed")
        if self._queue is None or len(self._queue) != n:
            self._queue = ov.AsyncInferQueue(self._compiled, n)
        return self._queue, n

    def infer_concurrent(
        self, feeds_list: list[Mapping[str, np.ndarray]], requests: int | None = None
    ) -> list[dict[str, np.ndarray]]:
        """Every feeds of ``feeds_list`` inferred with up to ``requests`` (default :attr:`requests`) in flight in
        an ``AsyncInferQueue``; the outputs (copies) in the order of ``feeds_list``. The arrays are shared with
        the requests, not copied: they stay alive in ``feeds_list`` until every request is done."""
        for feeds in feeds_list:
            self.validate(feeds)
        queue, _ = self._async_queue(requests)
        got: list[Any] = [None] * len(feeds_list)
        n_out = len(self._output_ports)

        def done(request: Any, k: int) -> None:
            got[k] = [request.get_output_tensor(i).data.copy() for i in range(n_out)]

        queue.set_callback(done)
        try:
            for k, feeds in enumerate(feeds_list):
                queue.start_async(feeds, k, share_inputs=True)
            queue.wait_all()
        except Exception as e:
            queue.wait_all()
            raise EdgeError(f"OpenVINO inference failed: {type(e).__name__}: {str(e)[:300]}") from e
        missing = [k for k, g in enumerate(got) if g is None]
        if missing:
            raise EdgeError(f"OpenVINO returned no outputs for {len(missing)} of {len(got)} concurrent requests")
        return [dict(zip(self._output_names, g)) for g in got]

    def run_concurrent(
        self, feeds: Mapping[str, np.ndarray], count: int, requests: int | None = None
    ) -> tuple[float, list[int]]:
        """``count`` inferences of ``feeds`` with up to ``requests`` (default :attr:`requests`) in flight, as
        benchmark_app runs them (outputs left in the requests' buffers): the wall time in seconds from the
        first start to the last completion, and each request's latency in ns (from its start, once a request
        was idle, to its completion callback)."""
        import time

        self.validate(feeds)
        queue, _ = self._async_queue(requests)
        clock = time.perf_counter_ns
        lat: list[int] = []

        def done(request: Any, t0: int) -> None:
            lat.append(clock() - t0)

        queue.set_callback(done)
        idle, start_async = queue.get_idle_request_id, queue.start_async
        try:
            start = clock()
            for _ in range(int(count)):
                idle()  # blocks (without the GIL) until a request is free: its latency starts when it starts
                start_async(feeds, clock(), share_inputs=True)
            queue.wait_all()
            wall = (clock() - start) / 1e9
        except Exception as e:
            queue.wait_all()
            raise EdgeError(f"OpenVINO inference failed: {type(e).__name__}: {str(e)[:300]}") from e
        return wall, lat

    def _follow_load(self, follower: LoadFollower) -> None:
        """Between two inferences: the model compiled again with the plan the load calls for now, when
        ``LoadFollower`` says so (the cost recorded in ``threads_policy.replans``)."""
        current = self._reopen.cfg.plan
        plan = follower.look(current, self._reopen.plan_for)
        if plan is None:
            return
        started = time.monotonic()
        try:
            cfg, compiled = self._reopen.compile(plan)
            request = compiled.create_infer_request()
        except Exception as e:  # noqa: BLE001 - the compiled model it has still runs: never fail an inference
            follower.failed(plan, started, e)
            policy = {**self.info.details["threads_policy"], "replans": list(follower.replans)}
            self.info = replace(self.info, details={**self.info.details, "threads_policy": policy})
            return
        if self._queue is not None:
            self._queue.wait_all()
            self._queue = None
        self._compiled, self._request, self._reopen.cfg = compiled, request, cfg
        self._bound = [{} for _ in self._input_names]  # the new request reads none of them yet
        self._current = [None] * len(self._input_names)
        follower.rebuilt(plan, started)
        threads = compiled.get_property("INFERENCE_NUM_THREADS")
        policy = _threads_policy(compiled, plan, follower)
        self.info = replace(
            self.info,
            threads=int(threads) if threads else None,
            details={**self.info.details, "threads_policy": policy},
        )

    def close(self) -> None:
        self._follower = None
        if self._queue is not None:
            try:
                self._queue.wait_all()
            except Exception:  # noqa: BLE001 - closing: a failed request was reported by its caller
                pass
        self._queue = None
        self._request = None
        self._compiled = None
        self._bound, self._current = [], []
        super().close()


def optimization_capabilities(core: Any, device: str) -> list[str]:
    """The device's OPTIMIZATION_CAPABILITIES (``["BF16", "FP32", "INT8", ...]``); empty when it does not say."""
    try:
        return [str(c) for c in core.get_property(device, "OPTIMIZATION_CAPABILITIES")]
    except Exception:  # noqa: BLE001 - virtual devices do not report it
        return []


def fast_cpu_precision(capabilities: list[str] | tuple[str, ...]) -> str:
    """What ``inference_precision = "fast"`` computes in on a CPU: bf16 where the plugin lists BF16 (native bf16:
    AVX512-BF16 or AMX), f32 elsewhere. The bundle carries it only after its parity in bf16 passed (issue #25)."""
    return "bf16" if "BF16" in {c.upper() for c in capabilities} else "f32"


@dataclass(frozen=True)
class _Asked:
    """The runner options as the runner uses them (read and checked once: ``OpenVINOOptions``)."""

    wanted: list[str]
    hint: str
    precision: str
    threads: int
    streams: int | str
    dq: int | None
    reserve: float


def _asked(typed: OpenVINOOptions, reserve: float) -> _Asked:
    """The options normalised; the rules across options checked."""
    wanted = _as_list(typed.device)
    if not wanted:
        raise EdgeError("runner 'openvino': option device is empty", hint='e.g. device = ["GPU", "CPU"]')
    hint = typed.performance_hint.upper()
    threads = typed.num_threads
    streams_opt = parse_num_streams(typed.num_streams)
    if streams_opt == "AUTO" and hint == "LATENCY":
        # measured (OpenVINO 2026.4, CPU): LATENCY + NUM_STREAMS=AUTO compiles as THROUGHPUT
        raise EdgeError(
            "runner 'openvino': num_streams AUTO with performance_hint LATENCY: AUTO is the "
            "throughput streams choice, and OpenVINO switches the hint to THROUGHPUT for it",
            hint='use performance_hint = "THROUGHPUT" (its own choice of streams), or a number',
        )
    too_many = streams_over_threads(streams_opt, threads)
    if too_many:
        raise EdgeError(
            f"runner 'openvino': num_streams {streams_opt} with num_threads {threads}: {too_many}",
            hint="ask for at most as many streams as threads, or num_threads = 0",
        )
    return _Asked(
        wanted,
        hint,
        typed.inference_precision.lower(),
        threads,
        streams_opt,
        typed.dynamic_quantization_group_size,
        reserve,
    )


def _choose_device(core: Any, wanted: list[str], short_version: str) -> tuple[str, list[str], str | None]:
    """(the first wanted device present, the devices OpenVINO sees, the fallback sentence or None)."""
    available = list(core.available_devices)
    device = next((d for d in (_match_device(w, available) for w in wanted) if d is not None), None)
    if device is None:
        raise HardwareUnavailableError(
            f"none of the OpenVINO devices {', '.join(wanted)} is present on this host "
            f"(OpenVINO {short_version} sees: {', '.join(available) or 'none'})",
            hint="install the device's driver/plugin, or add CPU to the runner's device list",
        )
    fallback = None
    if device != wanted[0]:
        fallback = f"asked for OpenVINO device {wanted[0]}, which is not present (available: {', '.join(available) or 'none'}); using {device}"
    return device, available, fallback


@dataclass
class _Config:
    """What the model is compiled with, and what of the options the device could not take."""

    config: dict[Any, Any]
    supported: set[str]
    target_precision: str | None
    caps: list[str]
    plan: Any = None
    ignored: list[str] = field(default_factory=list)


def _target_precision(core: Any, device: str, asked: _Asked, bundle_precision: str) -> tuple[str | None, list[str]]:
    """(the inference precision to ask the device for, None: its default; the CPU's optimization capabilities
    when inference_precision is fast)."""
    precision_opt = asked.precision
    if precision_opt == "fast" and device == "CPU":
        caps = optimization_capabilities(core, device)
        return fast_cpu_precision(caps), caps
    if precision_opt not in ("bundle", "fast"):
        return precision_opt, []
    # fp32 bundles compute in f32; the others in the device's own default (bf16 on AMX CPUs,
    # f16 on GPUs). Forcing f16 on this host's Xeon (FP16 listed, no AMX-FP16) was measured
    # slower: MobileNetV2 fp16 bundle 4.06 ms f16 vs 1.72 ms bf16 vs 3.16 ms f32, and an
    # int8 bundle 19.3 ms with an f16 hint vs 1.64 ms without. bf16 costs accuracy (PP-OCR
    # classifier cosine 0.9985 vs 0.99997 in f16); parity gates it at the bf16 limits.
    if bundle_precision == "fp32":
        return "f32", []
    if bundle_precision == "fp16" and device == "CPU":
        # ... but not an fp16 bundle on a CPU (the iGPU profile's fallback): its bf16 default is coarser
        # than the f16 the bundle was checked for (MediaPipe's selfie segmentation: cosine 0.988 in bf16,
        # 1.000 in f32 on an AVX512-BF16 EPYC), and f16 on a CPU without AMX-FP16 was slower than f32
        # (above); f32 on the fp16 weights computes the same on every x86 CPU, so the build host's gate
        # and the device agree. bf16 stays one option away (inference_precision = "bf16"; edgekit tune).
        return "f32", []
    return None, []


@dataclass
class _Reopen:
    """What the model was compiled from, kept to compile it again with another thread plan (``LoadFollower``)."""

    core: Any
    model: Any
    device: str
    asked: _Asked
    bundle_precision: str
    cfg: _Config

    def plan_for(self, load: CpuLoad, shared_threshold: float) -> ThreadPlan:
        return _cpu_plan(self.asked, load, shared_threshold)

    def compile(self, plan: ThreadPlan) -> tuple[_Config, Any]:
        cfg = _compile_config(self.core, self.device, self.asked, self.bundle_precision, plan)
        return cfg, self.core.compile_model(self.model, self.device, cfg.config)


def _compile_config(
    core: Any, device: str, asked: _Asked, bundle_precision: str, plan: ThreadPlan | None = None
) -> _Config:
    """The compile properties for ``device`` from the options; those it lacks are recorded as ignored."""
    import openvino as ov
    import openvino.properties as props
    import openvino.properties.hint as hints

    try:
        supported = set(core.get_property(device, props.supported_properties))
    except Exception:  # noqa: BLE001 - virtual devices: pass everything, let compile decide
        supported = {"PERFORMANCE_HINT", "INFERENCE_PRECISION_HINT", "INFERENCE_NUM_THREADS"}
    target_precision, caps = _target_precision(core, device, asked, bundle_precision)
    c = _Config({hints.performance_mode: getattr(hints.PerformanceMode, asked.hint)}, supported, target_precision, caps)
    if target_precision is not None:
        if "INFERENCE_PRECISION_HINT" in supported:
            c.config[hints.inference_precision] = getattr(ov.Type, target_precision)
        else:
            c.ignored.append(f"inference_precision {target_precision} ({device} has no INFERENCE_PRECISION_HINT)")
    # f32 asked is f32 computed: the CPU plugin otherwise quantizes the activations of MatMuls with integer
    # weights at run time (groups of 32) while reporting f32 (an int8-weight encoder: cosine 0.996 vs 1.0)
    dq = asked.dq if asked.dq is not None else (0 if target_precision == "f32" else None)
    if dq is not None:
        if "DYNAMIC_QUANTIZATION_GROUP_SIZE" in supported:
            c.config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = dq
        elif asked.dq is not None:
            c.ignored.append(f"dynamic_quantization_group_size {dq} ({device} has no DYNAMIC_QUANTIZATION_GROUP_SIZE)")
    _threads_config(c, device, asked, plan)
    if asked.streams:
        if "NUM_STREAMS" in supported:
            c.config[props.num_streams] = props.streams.Num.AUTO if asked.streams == "AUTO" else asked.streams
        else:
            c.ignored.append(f"num_streams {asked.streams} ({device} has no NUM_STREAMS)")
    return c


def openvino_cpu_defaults() -> RuntimeDefaults:
    """What OpenVINO's CPU plugin picks given no thread count and no pinning: one thread per core of this process's
    affinity (it reads ``sched_getaffinity``: 1 under ``taskset -c 0``, measured), pinned, LATENCY's one stream.
    The count the compiled model really runs is read back (``INFERENCE_NUM_THREADS``) and recorded."""
    return RuntimeDefaults(usable_cpus(), False, "OpenVINO CPU plugin's own: a thread per core it may use, pinned")


def _cpu_plan(asked: _Asked, load: CpuLoad | None = None, shared_threshold: float = SHARED_THRESHOLD) -> ThreadPlan:
    """Edgekit's thread plan for the CPU plugin: its own defaults where the CPUs are not shared (issue #25)."""
    return plan_threads(
        asked.threads,
        None,
        reserve=asked.reserve,
        load=load,
        spin_option=False,
        defaults=openvino_cpu_defaults(),
        shared_threshold=shared_threshold,
    )


def _threads_config(c: _Config, device: str, asked: _Asked, plan: ThreadPlan | None = None) -> None:
    """Inference threads on a CPU: ``plan`` (default: edgekit's plan now); the plugin's own count and pinning where
    the plan took its defaults (nothing set), else the plan's count, unpinned where the CPUs are shared. On other
    devices the count asked for."""
    import openvino.properties as props

    threads, streams_opt = asked.threads, asked.streams
    if device == "CPU" and "INFERENCE_NUM_THREADS" in c.supported:
        c.plan = plan or _cpu_plan(asked)
        if c.plan.threads_from == "default":
            return  # nothing set: the plugin's own count and pinning, as compile_model(xml, "CPU") with no config
        # every stream needs a thread of its own: the automatic count never goes below the streams asked for
        n = max(c.plan.threads, streams_opt) if isinstance(streams_opt, int) and not threads else c.plan.threads
        c.config[props.inference_num_threads] = n
        if c.plan.shared and not threads and "ENABLE_CPU_PINNING" in c.supported:
            # pinned threads wait for their core while another process runs there; unpinned, the scheduler
            # moves them to whichever core is free
            c.config[props.hint.enable_cpu_pinning] = False
    elif threads > 0:
        if "INFERENCE_NUM_THREADS" in c.supported:
            c.config[props.inference_num_threads] = threads
        else:
            c.ignored.append(f"num_threads {threads} ({device} has no INFERENCE_NUM_THREADS)")


def _threads_policy(compiled: Any, plan: ThreadPlan, follower: LoadFollower | None) -> dict[str, Any]:
    """``details["threads_policy"]``: the plan, the thread count and pinning the compiled model reports."""
    policy = policy_json(plan, follower)
    try:
        threads, pinning = compiled.get_property("INFERENCE_NUM_THREADS"), compiled.get_property("ENABLE_CPU_PINNING")
    except Exception:  # noqa: BLE001 - a device that does not report them
        threads, pinning = None, None
    if plan.threads_from == "default" and threads:
        policy["threads"] = int(threads)  # the plugin's count as it runs it (physical cores with SMT)
    policy["cpu_pinning"] = pinning
    return policy


def _read_back(
    compiled: Any,
    core: Any,
    device: str,
    asked: _Asked,
    cfg: _Config,
    details: dict[str, Any],
    fallback: str | None,
    follower: LoadFollower | None = None,
) -> RunnerInfo:
    """What the compiled model really uses (device, precision, threads, streams, every precision property), with a
    note wherever it differs from what was asked."""
    import openvino.properties as props
    import openvino.properties.hint as hints

    def read(key: Any) -> Any:
        try:
            return compiled.get_property(key)
        except Exception:  # noqa: BLE001 - not every device reports every property
            return None

    used_devices = read(props.execution_devices)
    device_used = ",".join(used_devices) if used_devices else device
    precision_read = read(hints.inference_precision)
    precision_used = precision_read.get_type_name() if precision_read is not None else "unknown"
    threads_read = read(props.inference_num_threads)
    streams = read(props.num_streams)
    nireq = read(props.optimal_number_of_infer_requests)
    details.update(
        {
            "performance_hint": str(read(hints.performance_mode) or asked.hint),
            "num_streams": int(streams) if streams is not None else None,
            "num_streams_option": asked.streams,
            "optimal_requests": int(nireq) if nireq else None,
            "inference_precision_option": asked.precision,
            "compute_precisions": _compute_precisions(compiled),
            # every property that changes the arithmetic, as the compiled model applies it (issue #23)
            "precision_properties": {k: _text(read(k)) for k in PRECISION_PROPERTIES if k in cfg.supported},
        }
    )
    _notes(details, core, device, device_used, precision_used, streams, asked, cfg)
    if cfg.plan is not None:
        details["threads_policy"] = _threads_policy(compiled, cfg.plan, follower)
    if cfg.ignored:
        details["ignored_options"] = cfg.ignored
    return RunnerInfo(
        runtime=f"openvino {details['openvino_version'].split('-', 1)[0]}",
        device_requested=asked.wanted[0],
        device_used=device_used,
        precision_used=precision_used,
        threads=int(threads_read) if threads_read else None,
        fallback=fallback,
        details=details,
    )


def _notes(
    details: dict[str, Any],
    core: Any,
    device: str,
    device_used: str,
    precision_used: str,
    streams: Any,
    asked: _Asked,
    cfg: _Config,
) -> None:
    """Where the compiled model does not do what was asked: the precision, the streams; and the fast choice."""
    import openvino.properties as props

    target_precision = cfg.target_precision
    if target_precision is not None and precision_used not in (target_precision, "unknown"):
        # e.g. bf16 asked on a CPU without AVX512-BF16/AMX: OpenVINO computes f32 and says nothing
        try:
            caps = list(core.get_property(device, props.device.capabilities))
        except Exception:  # noqa: BLE001 - virtual devices do not report it
            caps = []
        details["precision_note"] = (
            f"asked for {target_precision}; {device_used} computes in {precision_used} "
            f"(device capabilities: {', '.join(map(str, caps)) or 'not reported'})"
        )
    streams_opt = asked.streams
    if (
        isinstance(streams_opt, int)
        and streams_opt
        and streams is not None
        and int(streams) != streams_opt
        and "NUM_STREAMS" in cfg.supported
    ):
        # e.g. 4 streams on 2 CPUs: OpenVINO runs 2 and says nothing
        details["streams_note"] = f"asked for {streams_opt} streams; {device_used} runs {int(streams)}"
    if asked.precision == "fast":
        details["fast_precision"] = {
            "capabilities": cfg.caps,
            "computes": target_precision or "the device default",
            "why": (
                "bf16 passed parity where the bundle was built: bf16 where the CPU plugin lists BF16, else f32"
                if device == "CPU"
                else f"the bf16 evidence is for CPUs; {device} computes as with bundle"
            ),
        }
