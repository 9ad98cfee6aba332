"""LiteRT runner (``ai_edge_litert``): XNNPack on CPUs, the Edge TPU through libedgetpu.

What it makes explicit rather than silent (ai-edge-litert 2.3):

* threads: ``Interpreter(num_threads=None)`` runs XNNPack on one thread (measured here:
  5.2 ms against 2.8 ms with 2 threads for MobileNetV2), so the runner always passes a count:
  the profile's ``num_threads``, where 0 means edgekit's choice (``edge.backends.threads``: the CPUs
  other processes and ``reserve_cpus`` leave, recorded in ``details["threads_policy"]``); an XNNPack
  interpreter is created again on another count when the load changes while it runs (``load_recheck_s``);
* the delegate actually applied: XNNPack is LiteRT's default delegate and is applied
  silently, or silently not (a model it cannot take runs on the builtin kernels with one log
  line). The runner reads the execution plan after loading (``DELEGATE`` nodes and the ops
  they replaced) and records it; when XNNPack took none of the model, loading fails unless
  ``allow_cpu_fallback``;
* XNNPack's flags: of them, ai-edge-litert 2.3's Interpreter takes only
  ``experimental_default_delegate_latest_features`` (an XNNPack delegate created with
  ENABLE_LATEST_OPERATORS), the runner option ``xnnpack_latest_features``; it is applied with an op
  resolver that has no default delegate, so the execution plan's XNNPack partition is that delegate's.
  FP16 inference, dynamic-range fully-connected and the weight cache are XNNPack flags only the
  CompiledModel API's ``CpuOptions(xnnpack_flags=...)`` sets; no XNNPack delegate plugin library and no
  environment variable for them ships with the package;
* the Edge TPU: ``libedgetpu.so.1`` is loaded as a delegate; when it is missing (or the model
  was not compiled for the Edge TPU) loading fails unless ``allow_cpu_fallback``, and then
  every report says "CPU fallback". Which library is loaded is the device's choice only:
  ``$EDGEKIT_EDGETPU_LIBRARY`` or the ``edgetpu_library`` option given by the device's own
  configuration (agent ``--runner-option``), an absolute path to a regular file. A bundle
  never names it: a manifest carrying ``edgetpu_library`` is refused when the bundle is opened;
* I/O: with the bundle's ``model.io.json`` the runner takes and returns what the ONNX model
  took and returned (NCHW float32): it transposes to the TFLite layout and quantizes int8/uint8
  inputs with their scale and zero point, and the reverse for outputs. A bare ``.tflite``
  keeps its own layout; quantized I/O is still converted from and to float32.

LiteRT's stderr messages while loading (e.g. "Created TensorFlow Lite XNNPACK delegate for
CPU.") are captured and kept in ``info.details["runtime_log"]``.
"""

from __future__ import annotations

import ctypes
import os
import stat
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from edge.backends.litert.format import (
    ALLOW_CPU_FALLBACK_ENV,
    EDGETPU_CUSTOM_OP,
    TUNE_SPACE,
    LiteRTOptions,
    load_sidecar,
    read_tflite,
)
from edge.backends.options import DeviceOption
from edge.backends.runner import Runner, RunnerInfo
from edge.backends.threads import (  # noqa: F401 - usable_cpus re-exported
    SHARED_THRESHOLD,
    CpuLoad,
    LoadFollower,
    ThreadPlan,
    plan_threads,
    policy_json,
    reserve_option,
    usable_cpus,
)
from edge.capabilities import CpuIsa, Requirement, env_flag
from edge.errors import EdgeError, HardwareUnavailableError, InputFileError, ModelError
from edge.native_stderr import captured_stderr
from edge.spec import TensorSpec, image_layout

LITERT_REQUIREMENT = Requirement("python", "ai_edge_litert", install="pip install 'edgekit-ml[litert]'")
EDGETPU_LIBRARY = {"linux": "libedgetpu.so.1", "darwin": "libedgetpu.1.dylib", "win32": "edgetpu.dll"}.get(
    sys.platform, "libedgetpu.so.1"
)
#: the device's Edge TPU delegate library when it is not the system's libedgetpu (absolute path)
EDGETPU_LIBRARY_ENV = "EDGEKIT_EDGETPU_LIBRARY"
EDGETPU_INSTALL = (
    "install the Edge TPU runtime (Debian/Ubuntu: add Coral's apt repository and `apt-get install "
    "libedgetpu1-std`), plug the accelerator in, and install firmware_helpers/99-coral-edgetpu.rules "
    "for USB access"
)


# -- the file itself ---------------------------------------------------------------------


# -- I/O plans ---------------------------------------------------------------------------


@dataclass
class _InputPlan:
    name: str
    index: int
    perm: tuple[int, ...] | None
    scale: float  # 1 / the tensor's scale; 0: not quantized
    zero_point: int
    qmin: int
    qmax: int
    dtype: np.dtype
    buf: np.ndarray | None  # float32 scratch for quantized inputs (source layout when channels_last)
    # NCHW -> NHWC with few channels, as (N, C, H*W) -> (N, H*W, C): copied one channel at a time, which
    # reads contiguously (a 1x3x224x224 float32 input: 41 us against 164 us for np.copyto of the transpose).
    channels_last: tuple[int, int, int] | None = None


@dataclass
class _OutputPlan:
    name: str
    index: int
    perm: tuple[int, ...] | None  # TFLite layout -> ONNX layout
    scale: float
    zero_point: int


def _quant(details: Mapping[str, Any]) -> tuple[float, int]:
    scale, zp = details.get("quantization", (0.0, 0))
    return float(scale), int(zp)


def edgetpu_library(option: Any = None) -> str:
    """The Edge TPU delegate library to load: the device's own choice -- the ``edgetpu_library``
    option (given by the device's configuration, never a manifest) or ``$EDGEKIT_EDGETPU_LIBRARY``
    -- which must be an absolute path to an existing regular file; else the system's libedgetpu,
    by its soname."""
    for value, source in (
        (option, "runner option edgetpu_library"),
        (os.environ.get(EDGETPU_LIBRARY_ENV), f"${EDGETPU_LIBRARY_ENV}"),
    ):
        if value is None or value == "":
            continue
        if not isinstance(value, str) or not os.path.isabs(value):
            raise EdgeError(
                f"{source} must be an absolute path to the Edge TPU library, got {str(value)[:120]!r}",
                hint=f"e.g. /usr/lib/x86_64-linux-gnu/{EDGETPU_LIBRARY}; leave it unset for the system's",
            )
        try:
            regular = stat.S_ISREG(os.stat(value).st_mode)
        except OSError:
            regular = False
        if not regular:
            raise EdgeError(
                f"{source} is {value}, which is not an existing regular file",
                hint="point it at the installed libedgetpu, or leave it unset for the system's",
            )
        return value
    return EDGETPU_LIBRARY


#: bundle precisions whose LiteRT CPU run could compute in fp16 instead of f32
FP16_TRIAL_PRECISIONS = ("fp32", "fp16")


class LiteRTRunner(Runner):
    name = "litert"
    formats = ("tflite", "edgetpu-tflite")
    requires = (LITERT_REQUIREMENT,)
    options_class = LiteRTOptions
    tune_space = TUNE_SPACE  # what edgekit tune searches, declared in format.py
    device_options = {
        "edgetpu_library": DeviceOption(
            f"the Edge TPU delegate library (default {EDGETPU_LIBRARY}): device configuration only "
            f"(agent --runner-option, or ${EDGETPU_LIBRARY_ENV}), an absolute path; refused in a "
            "bundle's manifest",
            env=EDGETPU_LIBRARY_ENV,
        ),
        "external_delegate": DeviceOption(
            "an absolute path: a LiteRT delegate library loaded for the model in place of "
            "the delegate option (a vendor NPU's, e.g. the Ethos-U delegate of edge.backends.ethosu); device "
            "configuration only"
        ),
    }

    @classmethod
    def fp16_trial_skip(cls, precision: str, isa: CpuIsa) -> str | None:
        """XNNPack in fp16 pays only where the CPU has fp16 arithmetic (ARM FEAT_FP16 ``asimdhp``, x86
        AVX512-FP16/AMX-FP16); where it has it, ai-edge-litert's ``Interpreter`` (this runner's API) still cannot ask
        XNNPack for fp16 (FORCE_FP16 is a ``CompiledModel`` CPU option only). None for an int8 bundle."""
        if precision not in FP16_TRIAL_PRECISIONS:
            return None
        if not isa.known:
            return "this host's CPU flags are not readable: no fp16 arithmetic to rely on"
        if not isa.native_fp16:
            return (
                f"this CPU has no fp16 arithmetic ({isa.describe()}: no asimdhp, avx512_fp16 or amx_fp16): XNNPack "
                "would compute f32 around conversions, no faster"
            )
        return (
            f"this CPU has fp16 arithmetic ({isa.describe()}), but ai-edge-litert's Interpreter, the runner's API, "
            "cannot ask XNNPack for fp16 (FORCE_FP16 is a CompiledModel CPU option only): not tried"
        )

    def __init__(self, artifact: Path, *, options: Mapping[str, Any] | None = None, precision: str = "fp32") -> None:
        super().__init__(artifact, options=options, precision=precision)
        self._it: Any = None
        self._following: _Following | None = None
        import ai_edge_litert
        from ai_edge_litert.interpreter import OpResolverType

        typed: LiteRTOptions = self.typed_options
        delegate = typed.delegate.lower()
        latest = typed.xnnpack_latest_features  # with delegate xnnpack only: LiteRTOptions.invalid()
        plan_for = partial(_plan, typed.num_threads, reserve_option(self.name, self._options))
        opened_at = time.monotonic()
        cpu_plan = plan_for()
        path = self.artifact
        if path.is_dir():
            path = path / "model.tflite"
        info = read_tflite(path)
        ld = _Loading(
            path=path,
            info=info,
            version=getattr(ai_edge_litert, "__version__", "?"),
            threads=cpu_plan.threads,
            latest=latest,
            delegate=delegate,
            allow_fallback=typed.allow_cpu_fallback or env_flag(ALLOW_CPU_FALLBACK_ENV),
            details={"delegate_requested": delegate, "model": path.name, "edgetpu_compiled": info.edgetpu_compiled},
        )
        sidecar = load_sidecar(path)
        if latest:
            ld.details["xnnpack_latest_features"] = True
        external = self._options.get("external_delegate")
        if external:
            self._it, device_used, precision_used = self._open_external(ld, str(external))
        elif delegate == "edgetpu":
            self._it, device_used, precision_used = self._open_edgetpu(ld, sidecar, typed)
        elif delegate == "xnnpack":
            # with latest features the XNNPack delegate is the interpreter's explicit one: the resolver then carries
            # no default delegate, so the execution plan's DELEGATE nodes are that delegate's (none would mean the
            # flag did not reach the interpreter)
            resolver = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES if latest else OpResolverType.AUTO
            self._it = ld.interpreter(path, resolver)
            device_used, precision_used = "CPU (XNNPack)", _precision_of(self._it)
            follower = LoadFollower.start(float(typed.load_recheck_s), cpu_plan, opened_at)
            if follower is not None:
                self._following = _Following(follower, cpu_plan, plan_for, ld, resolver, sidecar)
        else:
            self._it = ld.interpreter(
                path,
                OpResolverType.BUILTIN_REF
                if delegate == "reference"
                else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
            )
            device_used = "CPU (reference kernels)" if delegate == "reference" else "CPU (builtin kernels)"
            precision_used = _precision_of(self._it)
            ld.details["delegate_applied"] = None
        device_used = _check_delegation(self._it, ld, device_used)
        self._model_file = ld.load_path
        self._setup_io(sidecar, ld.load_path)
        ld.details.update(
            threads_requested=self._options.get("num_threads", 0),
            threads_policy=policy_json(cpu_plan, self._following.follower if self._following else None),
            io=self._io_summary(sidecar),
            runtime_log=ld.runtime_log[-20:],
        )
        self.info = RunnerInfo(
            runtime=f"ai-edge-litert {ld.version}",
            device_requested=_DEVICE_REQUESTED[delegate],
            device_used=device_used,
            precision_used=precision_used,
            threads=ld.threads,
            fallback=ld.fallback,
            details=ld.details,
        )

    def _open_external(self, ld: _Loading, library: str) -> tuple[Any, str, str]:
        """The interpreter with a vendor's delegate library (``external_delegate``): loaded or one line."""
        from ai_edge_litert.interpreter import OpResolverType, load_delegate

        if not os.path.isabs(library) or not os.path.isfile(library):
            raise HardwareUnavailableError(f"runner 'litert': delegate library {library} is not a file")
        try:
            with captured_stderr() as lines:
                d = load_delegate(library)
        except (ValueError, OSError) as e:
            raise HardwareUnavailableError(
                f"runner 'litert': delegate {library} did not load: {str(e)[:200]} {' '.join(lines)[-200:]}"
            ) from None
        ld.details["delegate_applied"] = library
        it = ld.interpreter(ld.path, OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES, [d])
        return it, f"external delegate ({Path(library).name})", _precision_of(it)

    def _open_edgetpu(
        self, ld: _Loading, sidecar: Mapping[str, Any] | None, typed: LiteRTOptions
    ) -> tuple[Any, str, str]:
        """The interpreter on the Edge TPU delegate; else, where allowed, on the CPU (the bundle's CPU model when
        the file is compiled for the Edge TPU), recorded as the fallback."""
        from ai_edge_litert.interpreter import OpResolverType

        lib = edgetpu_library(self._options.get("edgetpu_library"))
        tpu, problem, fix = _load_edgetpu(ld, lib, typed.edgetpu_device)
        if tpu is not None:
            ld.details["delegate_applied"] = f"Edge TPU ({lib})"
            return ld.interpreter(ld.path, OpResolverType.AUTO, [tpu]), "Edge TPU", "int8 (Edge TPU)"
        if not ld.allow_fallback:
            raise HardwareUnavailableError(
                f"runner 'litert' cannot use the Edge TPU: {problem}",
                hint=f"{fix}; or allow the CPU fallback (runner option allow_cpu_fallback, "
                f"or {ALLOW_CPU_FALLBACK_ENV}=1), reported as such",
            )
        path = ld.path
        if ld.info.edgetpu_compiled:
            cpu_model = (sidecar or {}).get("cpu_model")
            if cpu_model and (
                not isinstance(cpu_model, str) or Path(cpu_model).name != cpu_model or cpu_model.startswith(".")
            ):
                raise InputFileError(
                    f"{path.with_suffix('.io.json')}: cpu_model must name a file next to the model, got {str(cpu_model)[:80]!r}"
                )
            if not cpu_model or not (path.parent / cpu_model).is_file():
                raise HardwareUnavailableError(
                    f"runner 'litert' cannot use the Edge TPU ({problem}) and {path.name} cannot run on "
                    "the CPU (edgetpu-custom-op), and no CPU model is next to it",
                    hint=EDGETPU_INSTALL,
                )
            ld.load_path = path.parent / cpu_model
        ld.fallback = f"CPU fallback: {problem}; running {ld.load_path.name} on the CPU (XNNPack)"
        it = ld.interpreter(ld.load_path, OpResolverType.AUTO)
        ld.details["delegate_applied"] = None
        return it, "CPU (XNNPack) [CPU fallback]", _precision_of(it)

    # -- I/O -----------------------------------------------------------------------------

    def _setup_io(self, sidecar: Mapping[str, Any] | None, model: Path) -> None:
        it = self._it
        sigs = it.get_signature_list()
        key = (sidecar or {}).get("signature") or (next(iter(sigs)) if sigs else None)
        if key is not None and key in sigs:
            r = it.get_signature_runner(key)
            tin, tout = r.get_input_details(), r.get_output_details()
            del r
        else:
            tin = {d["name"]: d for d in it.get_input_details()}
            tout = {d["name"]: d for d in it.get_output_details()}
        in_order = [d["index"] for d in it.get_input_details()]
        out_order = [d["index"] for d in it.get_output_details()]
        by_tensor = {d["name"]: d for d in list(tin.values()) + list(tout.values())}

        def find(entry: Mapping[str, Any], table: Mapping[str, Any]) -> Mapping[str, Any]:
            d: Mapping[str, Any] | None = table.get(entry["tflite_name"]) or by_tensor.get(
                entry.get("tflite_tensor") or ""
            )
            if d is None:
                raise ModelError(
                    f"{model.name} has no tensor {entry['tflite_name']!r} named in its io.json (it has {sorted(table)})"
                )
            return d

        self._in: list[_InputPlan] = []
        self._out: list[_OutputPlan] = []
        inputs, outputs = [], []
        if sidecar is not None:
            ins = [
                (e["name"], find(e, tin), e["perm_onnx_to_tflite"], e["shape"], e.get("layout"))
                for e in sidecar["inputs"]
            ]
            outs = [
                (e["name"], find(e, tout), e["perm_onnx_to_tflite"], e["shape"], e.get("layout"))
                for e in sidecar["outputs"]
            ]
        else:
            ins = [
                (n, d, None, None, None) for n, d in sorted(tin.items(), key=lambda kv: in_order.index(kv[1]["index"]))
            ]
            outs = [
                (n, d, None, None, None)
                for n, d in sorted(tout.items(), key=lambda kv: out_order.index(kv[1]["index"]))
            ]
        for name, d, perm, shape, layout in ins:
            in_plan, spec = _input_plan(name, d, perm, shape, layout)
            self._in.append(in_plan)
            inputs.append(spec)
        for name, d, perm, shape, layout in outs:
            out_plan, spec = _output_plan(name, d, perm, shape, layout)
            self._out.append(out_plan)
            outputs.append(spec)
        self.inputs, self.outputs = tuple(inputs), tuple(outputs)
        self._tensor_fns = [it.tensor(p.index) for p in self._in]
        self._native_inputs = {
            p.name: (p.index, tuple(int(x) for x in d["shape"]), np.dtype(d["dtype"]))
            for p, (_, d, *_r) in zip(self._in, ins)
        }

    def _io_summary(self, sidecar: Mapping[str, Any] | None) -> dict[str, Any]:
        def one(p: Any, spec: TensorSpec, tensor: Mapping[str, Any]) -> str:
            parts = []
            if p.perm is not None:
                parts.append(f"transpose {list(p.perm)}")
            if p.scale:
                scale = 1.0 / p.scale if isinstance(p, _InputPlan) else p.scale
                parts.append(
                    f"{'quantize to' if isinstance(p, _InputPlan) else 'dequantize from'} "
                    f"{tensor['dtype']} (scale {scale:.6g}, zero point {p.zero_point})"
                )
            return f"{spec.describe()} <-> {list(tensor['shape'])} {tensor['dtype']}" + (
                f": {', '.join(parts)}" if parts else ""
            )

        it = self._it
        by_index = {d["index"]: d for d in it.get_input_details() + it.get_output_details()}

        def tensor(idx: int) -> dict[str, Any]:
            d = by_index[idx]
            return {"shape": [int(x) for x in d["shape"]], "dtype": np.dtype(d["dtype"]).name}

        return {
            "source": "model.io.json" if sidecar else "the .tflite itself (no io.json beside it)",
            "inputs": [one(p, s, tensor(p.index)) for p, s in zip(self._in, self.inputs)],
            "outputs": [one(p, s, tensor(p.index)) for p, s in zip(self._out, self.outputs)],
        }

    # -- inference -----------------------------------------------------------------------

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.validate(feeds)
        if self._following is not None and self._following.follower.due():
            self._follow_load(self._following)
        it = self._it
        for p, fn in zip(self._in, self._tensor_fns):
            x = feeds[p.name]
            cl = p.channels_last
            if cl is not None:
                x = x.reshape(cl[0], cl[1], cl[2])  # (N, C, spatial): a view of an NCHW array
            elif p.perm is not None:
                x = x.transpose(p.perm)
            if p.buf is not None:  # quantize: q = clip(rint(x / scale) + zero_point), in the source layout
                b = p.buf
                np.multiply(x, p.scale, out=b)
                np.rint(b, out=b)
                np.add(b, p.zero_point, out=b)
                np.clip(b, p.qmin, p.qmax, out=b)
                x = b
            if cl is not None:
                dst = fn().reshape(cl[0], cl[2], cl[1])  # (N, spatial, C): the NHWC tensor
                for c in range(cl[1]):
                    np.copyto(dst[:, :, c], x[:, c], casting="unsafe")
                del dst  # invoke() refuses to run while a view of its tensors is alive
            elif p.buf is not None or p.perm is not None:
                np.copyto(fn(), x, casting="unsafe" if p.buf is not None else "same_kind")
            else:
                it.set_tensor(p.index, x)
        it.invoke()
        return self._outputs()

    def _outputs(self) -> dict[str, np.ndarray]:
        """The outputs as ``outputs`` describes them (dequantized, in the source's layout), copies."""
        it = self._it
        out: dict[str, np.ndarray] = {}
        for q in self._out:
            y = it.get_tensor(q.index)
            if q.scale:
                y = (y.astype(np.float32) - np.float32(q.zero_point)) * np.float32(q.scale)
            if q.perm is not None:
                y = np.ascontiguousarray(y.transpose(q.perm))
            out[q.name] = y
        return out

    def infer_native(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run on arrays already in the .tflite's own layout and dtype (keyed by the same names); raw outputs.

        For pipelines that produce NHWC (or quantized) frames themselves and want no conversion; LiteRT's
        own ``set_tensor`` checks their shapes and dtypes."""
        self.check_open()
        if self._following is not None and self._following.follower.due():
            self._follow_load(self._following)
        it = self._it
        for name, (index, _shape, _dtype) in self._native_inputs.items():
            it.set_tensor(index, feeds[name])
        it.invoke()
        return {q.name: it.get_tensor(q.index) for q in self._out}

    def infer_from_native(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Inputs in the .tflite's own layout and dtype (:attr:`native_inputs`), outputs as :meth:`infer` gives
        them: for a video pipeline that pre-processes straight into NHWC (no NCHW -> NHWC copy a frame)."""
        self.check_open()
        if self._following is not None and self._following.follower.due():
            self._follow_load(self._following)
        it = self._it
        for name, (index, _shape, _dtype) in self._native_inputs.items():
            it.set_tensor(index, feeds[name])
        it.invoke()
        return self._outputs()

    @property
    def native_inputs(self) -> tuple[TensorSpec, ...]:
        return tuple(TensorSpec(n, s, d.name, image_layout(s)) for n, (_i, s, d) in self._native_inputs.items())

    def _follow_load(self, f: _Following) -> None:
        """Between two inferences: the interpreter created again with the thread count the load calls for now,
        when ``LoadFollower`` says so (the cost recorded in ``threads_policy.replans``)."""
        plan = f.follower.look(f.plan, f.plan_for)
        if plan is None:
            return
        started, before = time.monotonic(), f.loading.threads
        f.loading.threads = plan.threads
        try:
            it = f.loading.interpreter(f.loading.load_path, f.resolver)
        except Exception as e:  # noqa: BLE001 - the interpreter it has still runs: never fail an inference for this
            f.loading.threads = before
            f.follower.failed(plan, started, e)
            self.info = replace(
                self.info, details={**self.info.details, "threads_policy": policy_json(f.plan, f.follower)}
            )
            return
        self._it = it
        self._setup_io(f.sidecar, f.loading.load_path)  # the I/O plans hold the old interpreter's tensors
        f.plan = plan
        f.follower.rebuilt(plan, started)
        details = {**self.info.details, "threads_policy": policy_json(plan, f.follower)}
        self.info = replace(self.info, threads=plan.threads, details=details)

    def close(self) -> None:
        self._tensor_fns = []
        self._it = None
        self._following = None
        super().close()


def _plan(threads: int, reserve: float, load: CpuLoad | None = None, threshold: float = SHARED_THRESHOLD) -> ThreadPlan:
    return plan_threads(threads, None, reserve=reserve, load=load, spin_option=False, shared_threshold=threshold)


@dataclass
class _Following:
    """What re-creating the XNNPack interpreter for a new thread count takes."""

    follower: LoadFollower
    plan: ThreadPlan
    plan_for: Any  # (load, shared threshold) -> ThreadPlan
    loading: _Loading
    resolver: Any
    sidecar: Mapping[str, Any] | None


def delegation(it: Any) -> dict[str, Any]:
    """Which ops of the model a delegate took: ``DELEGATE`` nodes and the model nodes behind them.

    The interpreter lists every node: the model's own and, appended, one ``DELEGATE`` node per
    partition a delegate took. A model node belongs to a partition when it lies between the
    partition's inputs and outputs (walking back from its outputs).
    """
    ops = it._get_ops_details()
    model_nodes = [o for o in ops if o["op_name"] != "DELEGATE"]
    partitions = [o for o in ops if o["op_name"] == "DELEGATE"]
    producer = {int(t): o for o in model_nodes for t in o["outputs"]}
    taken: set[int] = set()
    for part in partitions:
        stop = {int(t) for t in part["inputs"]}
        stack = [int(t) for t in part["outputs"]]
        seen: set[int] = set()
        while stack:
            t = stack.pop()
            if t in seen or t in stop or t not in producer:
                continue
            seen.add(t)
            node = producer[t]
            if node["index"] not in taken:
                taken.add(node["index"])
                stack.extend(int(x) for x in node["inputs"] if int(x) >= 0)
    left = Counter(o["op_name"] for o in model_nodes if o["index"] not in taken)
    return {
        "model_ops": len(model_nodes),
        "delegated_ops": len(taken),
        "delegate_partitions": len(partitions),
        "ops_not_delegated": dict(sorted(left.items())),
    }


def _precision_of(it: Any) -> str:
    """What the CPU computes in, from the model's tensors: int8 activations, dynamic-range, fp16 weights, f32."""
    ops = it._get_ops_details()
    names = {o["op_name"] for o in ops}
    types: set[Any] = set()
    for o in ops:
        types.update(o.get("operand_types", []))
        types.update(o.get("result_types", []))
    if {np.int8, np.uint8} & types and names & {"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"}:
        conv = [o for o in ops if o["op_name"] in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")]
        if conv and all(o["result_types"] and o["result_types"][0] in (np.int8, np.uint8) for o in conv):
            return "int8"
        return "f32 with int8 weights (dynamic range)"
    if np.float16 in types:
        return "f32 (fp16 weights)"
    return "f32"


_DEVICE_REQUESTED = {
    "xnnpack": "CPU (XNNPack)",
    "edgetpu": "Edge TPU",
    "none": "CPU (builtin kernels)",
    "reference": "CPU (reference kernels)",
}


@dataclass
class _Loading:
    """One LiteRT model being opened: what it is, how, and what the runtime said (its stderr lines)."""

    path: Path
    info: Any
    version: str
    threads: int
    latest: bool
    delegate: str
    allow_fallback: bool
    details: dict[str, Any]
    runtime_log: list[str] = field(default_factory=list)
    fallback: str | None = None
    load_path: Path = Path()

    def __post_init__(self) -> None:
        self.load_path = self.path

    def interpreter(self, model: Path, resolver: Any, delegates: list[Any] | None = None) -> Any:
        """An allocated interpreter for ``model``; a model only the Edge TPU runs, or one LiteRT cannot load, is
        one line."""
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        no_default = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        it = None
        with captured_stderr() as lines:
            try:
                it = Interpreter(
                    model_path=str(model),
                    num_threads=self.threads,
                    experimental_delegates=delegates,
                    experimental_op_resolver_type=resolver,
                    experimental_default_delegate_latest_features=self.latest and resolver is no_default,
                )
                it.allocate_tensors()
            except (ValueError, RuntimeError) as e:
                err = str(e)
                if "edgetpu-custom-op" in err or EDGETPU_CUSTOM_OP in self.info.custom_ops and not delegates:
                    raise ModelError(
                        f"{model} is compiled for the Edge TPU (edgetpu-custom-op) and cannot run without the Edge TPU delegate",
                        hint=EDGETPU_INSTALL,
                    ) from None
                dynamic = _dynamic_inputs(it)
                why = err.splitlines()[0][:300] if err else type(e).__name__
                raise ModelError(
                    f"LiteRT {self.version} could not load {model}: "
                    + (f"{why.rstrip('.')}; {dynamic}" if dynamic else why),
                    hint="convert it with --input-shape NAME=... at the size the model runs at: the bundle holds that "
                    "input static"
                    if dynamic
                    else None,
                ) from None
            finally:
                self.runtime_log.extend(lines)
        return it


def _dynamic_inputs(it: Any) -> str:
    """The inputs whose shape the file leaves dynamic (``shape_signature`` -1) and the shape LiteRT read them at
    (openWakeWord's melspectrogram: [1, -1] read as [1, 1], too short for its STFT convolution), or ''."""
    if it is None:
        return ""
    try:
        details = it.get_input_details()
    except Exception:  # noqa: BLE001 - only for the message
        return ""
    found = [
        f"input {d['name']!r} is dynamic in the file (shape_signature {[int(x) for x in d['shape_signature']]}) and"
        f" was read at {[int(x) for x in d['shape']]}"
        for d in details
        if len(d.get("shape_signature", ())) and min(int(x) for x in d["shape_signature"]) < 0
    ]
    return "; ".join(found)


def _load_edgetpu(ld: _Loading, lib: str, dev: str) -> tuple[Any, str | None, str]:
    """(the Edge TPU delegate, or None; why not; what to do about it)."""
    from ai_edge_litert.interpreter import load_delegate

    if not ld.info.edgetpu_compiled:
        return (
            None,
            (
                f"{ld.path.name} is not compiled for the Edge TPU (no {EDGETPU_CUSTOM_OP}: edgetpu_compiler "
                "was not run on it), so the Edge TPU would run none of it"
            ),
            (
                "compile the bundle with `edgekit finish BUNDLE` on an x86-64 Linux host that has edgetpu_compiler (or convert there)"
            ),
        )
    try:
        # dlopen first: load_delegate() on a missing library, or one without the delegate
        # entry points, leaves a half-made Delegate whose __del__ raises (ai-edge-litert 2.3)
        if not hasattr(ctypes.CDLL(lib), "tflite_plugin_create_delegate"):
            raise ValueError("not a TFLite delegate library: no tflite_plugin_create_delegate")
        with captured_stderr() as lines:
            tpu = load_delegate(lib, {"device": dev} if dev else {})
        ld.runtime_log.extend(lines)
        return tpu, None, EDGETPU_INSTALL
    except (ValueError, OSError, RuntimeError) as e:
        return (
            None,
            (
                f"the Edge TPU delegate {lib} could not be loaded"
                + (f" for device {dev!r}" if dev else "")
                + f" ({str(e).splitlines()[0][:200] if str(e) else type(e).__name__}); "
                "libedgetpu is not installed or no Edge TPU is attached"
            ),
            EDGETPU_INSTALL,
        )


def _check_delegation(it: Any, ld: _Loading, device_used: str) -> str:
    """The delegation plan into ``ld.details``; XNNPack that took no op is refused unless the CPU fallback is
    allowed (then recorded as it). The device used."""
    plan = delegation(it)
    ld.details.update(plan)
    if ld.delegate == "xnnpack":
        if plan["delegated_ops"] == 0:
            why = "; ".join(ln for ln in ld.runtime_log if "XNNPACK" in ln.upper() or "delegate" in ln.lower())[:300]
            problem = (
                f"XNNPack took none of the {plan['model_ops']} ops of {ld.path.name}"
                + (f" ({why})" if why else "")
                + "; LiteRT would run it on its builtin kernels"
            )
            if not ld.allow_fallback:
                raise ModelError(
                    f"runner 'litert': {problem}",
                    hint=f"to run it without XNNPack anyway, allow the CPU fallback (runner option "
                    f'allow_cpu_fallback, or {ALLOW_CPU_FALLBACK_ENV}=1), or use delegate = "none"',
                )
            ld.fallback = f"CPU fallback: {problem}"
            ld.details["delegate_applied"] = None
            return "CPU (builtin kernels) [CPU fallback]"
        ld.details["delegate_applied"] = "XNNPack (latest operators)" if ld.latest else "XNNPack"
    elif ld.delegate == "edgetpu" and ld.fallback is None:
        ld.details["edgetpu_ops"] = plan["delegated_ops"]
    return device_used


def _input_plan(
    name: str, d: Mapping[str, Any], perm: Any, shape: Any, layout: str | None
) -> tuple[_InputPlan, TensorSpec]:
    """How one input is fed (layout permutation, quantization, a channels-last fast path) and the spec its
    caller sees (the ONNX shape where the sidecar gives it, float32 for a quantized input)."""
    native = tuple(int(x) for x in d["shape"])
    identity = perm is None or list(perm) == list(range(len(perm)))
    scale, zp = _quant(d)
    dtype = np.dtype(d["dtype"])
    perm_t = None if identity else tuple(int(i) for i in perm)
    cl = None
    r = len(native)
    if perm_t is not None and r >= 3 and perm_t == (0, *range(2, r), 1) and native[-1] <= 16:
        cl = (native[0], native[-1], int(np.prod(native[1:-1])))
    if scale and dtype.kind in "iu":
        info = np.iinfo(dtype)
        buf = np.empty((cl[0], cl[1], cl[2]) if cl else native, np.float32)
        plan = _InputPlan(name, d["index"], perm_t, 1.0 / scale, zp, info.min, info.max, dtype, buf, cl)
        caller_dtype = "float32"
    else:
        plan = _InputPlan(name, d["index"], perm_t, 0.0, 0, 0, 0, dtype, None, cl)
        caller_dtype = dtype.name
    caller_shape = tuple(shape) if shape is not None else native
    quant = (float(scale), zp, plan.qmin, plan.qmax) if plan.scale else None
    return plan, TensorSpec(name, caller_shape, caller_dtype, layout or image_layout(caller_shape), quant=quant)


def _output_plan(
    name: str, d: Mapping[str, Any], perm: Any, shape: Any, layout: str | None
) -> tuple[_OutputPlan, TensorSpec]:
    """How one output is read back (inverse permutation, dequantization) and the spec its caller sees."""
    native = tuple(int(x) for x in d["shape"])
    identity = perm is None or list(perm) == list(range(len(perm)))
    inv = None if identity else tuple(int(i) for i in np.argsort(perm))
    scale, zp = _quant(d)
    dtype = np.dtype(d["dtype"])
    quantized = bool(scale) and dtype.kind in "iu"
    plan = _OutputPlan(name, d["index"], inv, scale if quantized else 0.0, zp)
    caller_shape = tuple(shape) if shape is not None else native
    return plan, TensorSpec(
        name, caller_shape, "float32" if quantized else dtype.name, layout or image_layout(caller_shape)
    )
