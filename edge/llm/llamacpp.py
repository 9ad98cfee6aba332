"""The llama.cpp layer: lazy import, log capture, model loading, and the AMX probe.

AMX crash (found on this project's build host; see README "LLMs"): llama-cpp-python 0.3.36
compiled here with GCC 12 segfaults on the first prompt batch of every quantized model. gdb puts
the fault on the first instruction of ``ggml_backend_amx_mul_mat``, ``ldtilecfg 0xc0(%rsp)``;
the 64-byte tile configuration it loads has only its first 32 bytes zeroed (one ``vmovdqa
%ymm0`` store; the compiler dropped the rest of the zero-initialisation because the builtin's
64-byte read is not visible to it), so the row counts are stack garbage and LDTILECFG raises
#GP. The same config loads fine from a C test on this CPU, and the kernel grants AMX
(XCR0 bits 17/18, ARCH_REQ_XCOMP_PERM). Single-token batches never reach the AMX kernel
(``n_batch=1`` hid it) and ``use_extra_bufts=False`` keeps weights out of the AMX buffer type.

edgekit does not guess: ``amx_probe()`` runs a tiny quantized model through a prompt batch in a
subprocess once per llama.cpp library build (cached by the library's sha256). If it crashes,
quantized models load with ``use_extra_bufts=False`` and the runner says so; a fixed build keeps
AMX.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from edge.errors import MissingDependencyError

_LOAD_LOCK = threading.Lock()


def load_llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError:
        raise MissingDependencyError("llama.cpp bindings are not installed",
                                     hint="pip install 'edgekit-ml[llm]' (compiles llama.cpp: a few minutes)") from None
    return llama_cpp


def llama_cpp_version() -> str:
    return str(getattr(load_llama_cpp(), "__version__", "unknown"))


@dataclass
class _Log:
    lines: list[str] = field(default_factory=list)


@contextlib.contextmanager
def captured_log() -> Iterator[_Log]:
    """Collect llama.cpp's log lines (instead of printing them) for error messages."""
    llama_cpp = load_llama_cpp()
    log = _Log()

    @llama_cpp.llama_log_callback
    def _cb(level: int, text: bytes, user_data: Any) -> None:  # noqa: ARG001
        log.lines.append(text.decode("utf-8", "replace").rstrip("\n"))

    llama_cpp.llama_log_set(_cb, ctypes.c_void_p(0))
    try:
        yield log
    finally:
        from llama_cpp import _logger

        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))


def system_info() -> str:
    return load_llama_cpp().llama_print_system_info().decode("utf-8", "replace").strip()


def has_amx_build() -> bool:
    return "AMX_INT8 = 1" in system_info()


def _cpu_lib() -> Path | None:
    lib_dir = Path(load_llama_cpp().__file__).parent / "lib"
    libs = sorted(lib_dir.glob("libggml-cpu*.so*")) or sorted(lib_dir.glob("libllama*.so*"))
    return libs[0] if libs else None


_PROBE = r"""
import sys, ctypes, llama_cpp
src, dst = sys.argv[1], sys.argv[2]
p = llama_cpp.llama_model_quantize_default_params(); p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
assert llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p)) == 0
llm = llama_cpp.Llama(dst, n_ctx=64, n_batch=32, n_threads=1, verbose=False)
llm.eval(list(range(3, 35)))
print("ok")
"""


def amx_probe(cache_dir: Path | None = None) -> dict[str, Any]:
    """Does this llama.cpp build survive a quantized prompt batch with AMX buffers? Cached per build."""
    if not has_amx_build():
        return {"amx_build": False, "ok": True, "reason": "llama.cpp built without AMX"}
    lib = _cpu_lib()
    key = hashlib.sha256(lib.read_bytes()).hexdigest()[:16] if lib else "unknown"
    cache = (cache_dir or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "edgekit") / f"amx-probe-{key}.json"
    if cache.exists():
        try:
            return json.loads(cache.read_text())
        except (OSError, json.JSONDecodeError):
            pass
    from edge.llm.samples import build_tiny_llama

    with tempfile.TemporaryDirectory(prefix="edgekit-amx-") as tmp:
        src = build_tiny_llama(Path(tmp) / "probe-f16.gguf", n_layer=1, n_vocab=512)
        p = subprocess.run([sys.executable, "-c", _PROBE, str(src), str(Path(tmp) / "probe-q4_0.gguf")],
                           capture_output=True, text=True, timeout=120)
    ok = p.returncode == 0 and "ok" in p.stdout
    result = {"amx_build": True, "ok": ok, "library": str(lib), "library_sha256_16": key,
              "reason": "quantized prompt batch ran with AMX buffers" if ok else
              f"quantized prompt batch crashed with AMX buffers (exit {p.returncode}); "
              "loading quantized models with use_extra_bufts=False"}
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(result))
    except OSError:
        pass
    return result


def open_llama(path: Path, *, n_ctx: int, n_threads: int, n_batch: int, n_gpu_layers: int,
               logits_all: bool = False, use_extra_bufts: bool = True) -> Any:
    """``llama_cpp.Llama`` with control of ``use_extra_bufts``, which its constructor does not expose.

    The constructor fills its model params from ``llama_model_default_params()``; for the
    duration of one load (under a lock) that function returns params with the flag set.
    """
    llama_cpp = load_llama_cpp()
    from llama_cpp import llama as llama_mod

    # 0 = every CPU this process may use. llama-cpp-python's own default (cpu_count // 2) ran one
    # thread on this 2-vCPU host: 1,053 vs 1,816 prompt tokens/s for a 40M-parameter f16 model.
    if n_threads <= 0:
        n_threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    kwargs = dict(n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads, n_batch=n_batch,
                  n_gpu_layers=n_gpu_layers, logits_all=logits_all, verbose=False)
    if use_extra_bufts:
        return llama_cpp.Llama(str(path), **kwargs)
    low = llama_mod.llama_cpp
    original = low.llama_model_default_params

    def params() -> Any:
        p = original()
        p.use_extra_bufts = False
        return p

    with _LOAD_LOCK:
        low.llama_model_default_params = params
        try:
            return llama_cpp.Llama(str(path), **kwargs)
        finally:
            low.llama_model_default_params = original
