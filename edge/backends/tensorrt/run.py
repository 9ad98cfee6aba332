"""TensorRT runner: builds the engine on the device at first load, caches it, reuses it.

Why the ``tensorrt`` Python API and not onnxruntime's TensorRT execution provider:

* the EP partitions the graph and hands what TensorRT rejects to the CUDA or CPU provider
  without an error -- the silent fallback this runner exists to rule out; with the builder API
  an unsupported layer is a build error naming it;
* precision flags, explicit-quantization int8, DLA core + GPU fallback and the workspace pool
  are set exactly as ``trt_build.json`` says, and the build is timed and reported;
* the engine cache is ours, keyed by what invalidates an engine (TensorRT version, GPU name,
  compute capability, precision, bundle id), not by the EP's model hash; and
* on Jetson, TensorRT's Python bindings come with JetPack, while onnxruntime-gpu needs a
  JetPack-matched build from a separate index.

Inference uses polygraphy's ``TrtRunner`` (device buffers through its ctypes CUDA wrapper), so
the device needs ``tensorrt`` (JetPack) + ``polygraphy`` only -- no pycuda, no torch.

Where TensorRT or the GPU is missing, loading raises an error naming what is missing. With
``allow_cpu_fallback = true`` the same ONNX runs in onnxruntime on the CPU and ``info`` says
"CPU fallback" (``device_used`` and ``fallback``), so every bench/parity/agent report shows it.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # numpy is imported where the runner runs: a device's manifest check loads this module
    import numpy as np

    from edge.backends.onnxruntime.run import OnnxRuntimeRunner

from edge.backends.options import DeviceOption
from edge.backends.runner import Runner, RunnerInfo
from edge.backends.tensorrt.format import CACHE_ENV, TensorRTOptions
from edge.base.typedjson import UnreadableFile, read_json_file
from edge.capabilities import Requirement, current_host, problems
from edge.errors import EdgeError, HardwareUnavailableError
from edge.spec import TensorSpec

CACHE_SCHEMA = "edgekit.trt-engine/1"
FALLBACK_LABEL = "CPU fallback"
KEY_PARTS = ("tensorrt_version", "gpu_name", "compute_capability", "precision", "bundle_id")

_TRT = Requirement(
    "python",
    "tensorrt",
    install="it comes with JetPack (python3-libnvinfer); on x86: pip install tensorrt --extra-index-url https://pypi.nvidia.com",
)
_POLY = Requirement(
    "python",
    "polygraphy",
    install="pip install 'edgekit-ml[tensorrt]'",
    why="device buffers and execution go through polygraphy's TrtRunner",
)
_GPU = Requirement(
    "nvidia-gpu",
    "gpu",
    install="run it on the Jetson, or set allow_cpu_fallback = true to run the ONNX in onnxruntime on the CPU (labelled CPU fallback)",
)


# -- the engine cache: pure functions -------------------------------------------------------


@dataclass(frozen=True)
class EngineKey:
    tensorrt_version: str
    gpu_name: str
    compute_capability: str  # "8.7"
    precision: str
    bundle_id: str

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:20]

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def engine_key(
    tensorrt_version: str, gpu_name: str, compute_capability: str | tuple[int, int], precision: str, bundle_id: str
) -> EngineKey:
    cc = (
        compute_capability
        if isinstance(compute_capability, str)
        else f"{compute_capability[0]}.{compute_capability[1]}"
    )
    return EngineKey(str(tensorrt_version), " ".join(str(gpu_name).split()), cc, precision, bundle_id)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80]


def engine_path(cache_dir: Path, key: EngineKey) -> Path:
    """``<cache>/<bundle id>/<key digest>.engine`` (its key beside it as ``.json``)."""
    return Path(cache_dir) / _safe(key.bundle_id) / f"{key.digest}.engine"


def key_changes(old: Mapping[str, Any], new: EngineKey) -> list[str]:
    """Which key parts differ, as "part: old -> new"."""
    return [f"{p}: {old.get(p)!r} -> {getattr(new, p)!r}" for p in KEY_PARTS if old.get(p) != getattr(new, p)]


def cache_decision(cache_dir: Path, key: EngineKey) -> tuple[str, str, Path]:
    """("reuse" | "build", why, engine path). Reads only the cache's JSON records."""
    path = engine_path(cache_dir, key)
    meta = path.with_suffix(".json")
    if path.is_file() and meta.is_file():
        try:
            rec = read_json_file(meta, what="engine cache record", max_bytes=1 << 20, max_depth=16)
        except UnreadableFile:
            return "build", f"cache record {meta} is unreadable", path
        if (
            isinstance(rec, dict)
            and rec.get("schema") == CACHE_SCHEMA
            and rec.get("key") == key.to_json()
            and rec.get("size") == path.stat().st_size
        ):
            return "reuse", f"cached engine built {rec.get('built_utc', '?')} in {rec.get('build_s', '?')} s", path
        return "build", "cached engine does not match its record", path
    others = sorted(Path(cache_dir, _safe(key.bundle_id)).glob("*.json")) if Path(cache_dir).is_dir() else []
    for other in others:
        try:
            rec = read_json_file(other, what="engine cache record", max_bytes=1 << 20, max_depth=16)
        except UnreadableFile:
            continue
        old = rec.get("key", {}) if isinstance(rec, dict) else {}
        if not isinstance(old, dict):
            continue
        changed = key_changes(old, key)
        if changed:
            return "build", "key changed since the cached engine: " + "; ".join(changed), path
    return "build", "no cached engine for this bundle", path


def store_engine(path: Path, key: EngineKey, data: bytes, build_s: float, settings: Mapping[str, Any]) -> None:
    """Write the engine and its record atomically; stale engines of the same bundle are removed."""
    from datetime import datetime, timezone

    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.glob("*.engine"):
        if old != path:
            old.unlink(missing_ok=True)
            old.with_suffix(".json").unlink(missing_ok=True)
    tmp = path.with_suffix(f".engine.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    rec = {
        "schema": CACHE_SCHEMA,
        "key": key.to_json(),
        "size": len(data),
        "build_s": round(build_s, 2),
        "built_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "settings": dict(settings),
    }
    meta_tmp = path.with_suffix(f".json.tmp-{os.getpid()}")
    meta_tmp.write_text(json.dumps(rec, indent=2) + "\n", encoding="utf-8")
    os.replace(meta_tmp, path.with_suffix(".json"))


def default_cache_dir(artifact: Path) -> Path:
    """Inside a device store (``<store>/bundles/<id>/``): ``<store>/engines``; else $EDGEKIT_ENGINE_CACHE
    or ``<user cache>/edgekit/tensorrt-engines``. Never inside the bundle (its files are hash-verified)."""
    env = os.environ.get(CACHE_ENV, "").strip()
    if env:
        return Path(env).expanduser()
    bundle_dir = Path(artifact).resolve().parent
    if bundle_dir.parent.name == "bundles":
        return bundle_dir.parent.parent / "engines"
    cache = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(cache) if cache else Path.home() / ".cache") / "edgekit" / "tensorrt-engines"


def bundle_id_of(artifact: Path) -> str:
    """The bundle id from the manifest beside the artifact (the artifact's sha256 when there is none)."""
    manifest = Path(artifact).parent / "manifest.json"
    try:
        return str(read_json_file(manifest, what="manifest", max_bytes=16 << 20, max_depth=64)["bundle_id"])
    except (UnreadableFile, KeyError, TypeError):
        h = hashlib.sha256(Path(artifact).read_bytes()).hexdigest()
        return f"sha256-{h[:16]}"


# -- the GPU, without CUDA Python packages --------------------------------------------------


def gpu_identity(device: int = 0) -> tuple[str, str]:
    """(GPU name, compute capability "M.m") through the CUDA driver API (libcuda, any JetPack/driver)."""
    lib = None
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        raise HardwareUnavailableError("the CUDA driver library (libcuda) is not loadable: no NVIDIA driver here")
    if lib.cuInit(0) != 0:
        raise HardwareUnavailableError("cuInit failed: the NVIDIA driver found no usable GPU")
    dev = ctypes.c_int()
    if lib.cuDeviceGet(ctypes.byref(dev), device) != 0:
        raise HardwareUnavailableError(f"no CUDA device {device}")
    buf = ctypes.create_string_buffer(256)
    lib.cuDeviceGetName(buf, 256, dev)
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)  # ..._MINOR
    return buf.value.decode(errors="replace").strip(), f"{major.value}.{minor.value}"


def _short(r: Requirement) -> str:
    return "no NVIDIA GPU" if r.kind == "nvidia-gpu" else f"Python package {r.name!r} not installed"


# -- the runner -----------------------------------------------------------------------------


class TensorRTRunner(Runner):
    name = "tensorrt"
    formats = ("onnx",)
    host_proxy = (
        "onnxruntime",
        {},
        "TensorRT is not on this host: onnxruntime ran the prepared ONNX (folded; int8: "
        "symmetric QDQ), exactly what TensorRT will be given; the engine itself (its fp16/int8 kernels) "
        "is checked on the device against the bundle's reference pairs on first load",
    )
    requires = (_TRT, _POLY, _GPU)
    computes_fp16 = True
    _trt: Any  # polygraphy's TrtRunner; None on the CPU fallback and once closed
    _ort: OnnxRuntimeRunner | None  # the CPU fallback (onnxruntime on the prepared ONNX)
    options_class = TensorRTOptions
    device_options = {
        "engine_cache_dir": DeviceOption(
            "where built engines are cached (default: <device store>/engines, "
            f"${CACHE_ENV} or ~/.cache/edgekit/tensorrt-engines)",
            env=CACHE_ENV,
        )
    }

    def __init__(self, artifact: Path, *, options: Mapping[str, Any] | None = None, precision: str = "fp32") -> None:
        opts = dict(options or {})
        host = current_host()
        missing = [_short(r) for r in self.requires if r.problem(host)]
        if missing and bool(opts.get("allow_cpu_fallback", False)):
            self._init_fallback(Path(artifact), opts, precision, missing)
            return
        super().__init__(artifact, options=opts, precision=precision)  # raises naming what is missing
        self._init_tensorrt()

    # CPU fallback: same ONNX, onnxruntime CPU, labelled everywhere
    def _init_fallback(self, artifact: Path, opts: dict[str, Any], precision: str, missing: list[str]) -> None:
        from edge.backends.onnxruntime.run import OnnxRuntimeRunner

        unknown = [k for k in opts if k not in self.options]
        if unknown:
            raise EdgeError(
                f"runner {self.name!r} does not take option(s) {', '.join(unknown)}; it takes: {', '.join(self.options)}"
            )
        self.artifact, self.precision, self._options = artifact, precision, opts
        self._ort = OnnxRuntimeRunner(artifact, options={"providers": ["CPUExecutionProvider"]}, precision=precision)
        self.inputs, self.outputs = self._ort.inputs, self._ort.outputs
        self._trt = None
        ort_info = self._ort.info
        computes = "int8 (QDQ, onnxruntime CPU kernels)" if precision == "int8" else "f32"
        self.info = RunnerInfo(
            runtime=f"{ort_info.runtime} ({FALLBACK_LABEL})",
            device_requested="TensorRT GPU",
            device_used=f"CPU ({FALLBACK_LABEL}: onnxruntime CPUExecutionProvider)",
            precision_used=computes,
            threads=ort_info.threads,
            fallback=f"{FALLBACK_LABEL}: TensorRT cannot run here ({'; '.join(missing)}); running the same ONNX in "
            "onnxruntime on the CPU because allow_cpu_fallback = true. Latency and accuracy are not "
            "TensorRT's.",
            details={"cpu_fallback": True, "missing": missing, "providers": ort_info.details.get("providers")},
        )

    def _init_tensorrt(self) -> None:
        import tensorrt as trt
        from polygraphy.backend.trt import TrtRunner

        from edge.backends.tensorrt.format import read_build_settings

        settings = read_build_settings(self.artifact.parent)
        gpu, cc = gpu_identity(int(self._options.get("device", 0)))
        key = engine_key(trt.__version__, gpu, cc, settings["precision"], bundle_id_of(self.artifact))
        cache = Path(self._options.get("engine_cache_dir") or default_cache_dir(self.artifact))
        decision, why, path = cache_decision(cache, key)
        if bool(self._options.get("rebuild", False)):
            decision, why = "build", "rebuild requested"
        logger = trt.Logger(trt.Logger.WARNING)
        build_s = None
        t0 = time.perf_counter()
        if decision == "build":
            data = build_engine(trt, logger, self.artifact, settings)
            build_s = time.perf_counter() - t0
            store_engine(path, key, data, build_s, settings)
        else:
            data = path.read_bytes()
        engine = trt.Runtime(logger).deserialize_cuda_engine(data)
        if engine is None:
            raise EdgeError(
                f"TensorRT {trt.__version__} could not deserialize {path}", hint="load again with rebuild = true"
            )
        load_s = time.perf_counter() - t0
        self._trt = TrtRunner(engine)
        self._trt.activate()
        self._ort = None
        self.inputs = tuple(TensorSpec(t["name"], tuple(t["shape"]), t["dtype"]) for t in settings["inputs"])
        self.outputs = tuple(TensorSpec(t["name"], tuple(t["shape"]), t["dtype"]) for t in settings["outputs"])
        dla = int(settings.get("dla_core", -1))
        self.info = RunnerInfo(
            runtime=f"TensorRT {trt.__version__}",
            device_requested="TensorRT GPU" + (f" + DLA{dla}" if dla >= 0 else ""),
            device_used=f"{gpu} (sm {cc})" + (f" + DLA{dla}" if dla >= 0 else ""),
            precision_used={"fp32": "f32 (TF32 allowed)", "fp16": "f16", "int8": "int8 (explicit QDQ) + f16"}.get(
                settings["precision"], settings["precision"]
            ),
            details={
                "engine": str(path),
                "engine_cache": decision,
                "engine_cache_reason": why,
                "build_s": round(build_s, 2) if build_s is not None else None,
                "load_s": round(load_s, 3),
                "key": key.to_json(),
                "flags": settings.get("flags"),
                "workspace_mb": settings.get("workspace_mb"),
            },
        )

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.validate(feeds)  # errors name this runner, also in the CPU fallback
        if self._ort is not None:
            return self._ort.infer(feeds)
        out = self._trt.infer(feed_dict=dict(feeds), copy_outputs_to_host=True)
        import numpy as np

        return {t.name: np.asarray(out[t.name]) for t in self.outputs}

    def close(self) -> None:
        if getattr(self, "_trt", None) is not None:
            self._trt.deactivate()
            self._trt = None
        ort = getattr(self, "_ort", None)
        if ort is not None:
            ort.close()
            self._ort = None
        super().close()


def build_engine(trt: Any, logger: Any, onnx_path: Path, settings: Mapping[str, Any]) -> bytes:
    """Parse the ONNX and build a serialized engine as ``trt_build.json`` says; parser errors listed."""
    builder = trt.Builder(logger)
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH") and int(trt.__version__.split(".")[0]) < 10:
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errs = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise EdgeError(f"TensorRT's ONNX parser rejected {onnx_path}: " + " | ".join(errs)[:1500])
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(settings.get("workspace_mb", 1024)) << 20)
    for flag in settings.get("flags", []):
        if flag == "FP16" and not builder.platform_has_fast_fp16:
            continue
        config.set_flag(getattr(trt.BuilderFlag, flag))
    dla = int(settings.get("dla_core", -1))
    if dla >= 0:
        if builder.num_DLA_cores <= dla:
            raise HardwareUnavailableError(
                f"trt_build.json asks for DLA core {dla}; this device has {builder.num_DLA_cores}"
            )
        config.default_device_type = trt.DeviceType.DLA
        config.DLA_core = dla
        if settings.get("gpu_fallback", True):
            config.set_flag(trt.BuilderFlag.GPU_FALLBACK)
    data = builder.build_serialized_network(network, config)
    if data is None:
        raise EdgeError(f"TensorRT {trt.__version__} failed to build an engine from {onnx_path} (see its log above)")
    return bytes(data)


def missing_here() -> list[str]:
    """What this host lacks for the TensorRT path (empty: it can build and run engines)."""
    return problems(TensorRTRunner.requires, current_host())


__all__ = [
    "TensorRTRunner",
    "EngineKey",
    "engine_key",
    "engine_path",
    "cache_decision",
    "key_changes",
    "store_engine",
    "default_cache_dir",
    "bundle_id_of",
    "gpu_identity",
    "build_engine",
    "missing_here",
    "FALLBACK_LABEL",
]
