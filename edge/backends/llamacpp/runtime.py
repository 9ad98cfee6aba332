"""The llama.cpp layer: lazy import, log capture, model loading, and the AMX probe.

AMX crash (found on this project's build host; see docs/llm.md): llama-cpp-python 0.3.36
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

from edge.base.typedjson import UnreadableFile, read_json_file
from edge.errors import MissingDependencyError, ModelError

_LOAD_LOCK = threading.Lock()


def load_llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError:
        raise MissingDependencyError(
            "llama.cpp bindings are not installed",
            hint="pip install 'edgekit-ml[llm]' (compiles llama.cpp: a few minutes)",
        ) from None
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

    def _line(level: int, text: bytes, user_data: Any) -> None:  # noqa: ARG001
        log.lines.append(text.decode("utf-8", "replace").rstrip("\n"))

    _cb = llama_cpp.llama_log_callback(_line)  # the C callback: held here while llama.cpp may call it

    llama_cpp.llama_log_set(_cb, ctypes.c_void_p(0))
    try:
        yield log
    finally:
        from llama_cpp import _logger

        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))


def system_info() -> str:
    info: bytes = load_llama_cpp().llama_print_system_info()
    return info.decode("utf-8", "replace").strip()


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
    cache = (
        cache_dir or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "edgekit"
    ) / f"amx-probe-{key}.json"
    if cache.exists():
        try:
            cached = read_json_file(cache, what="AMX probe cache", max_bytes=1 << 20, max_depth=8)
            if isinstance(cached, dict):
                return cached
        except UnreadableFile:
            pass
    from edge.backends.llamacpp.samples import LlamaShape, build_tiny_llama

    with tempfile.TemporaryDirectory(prefix="edgekit-amx-") as tmp:
        src = build_tiny_llama(Path(tmp) / "probe-f16.gguf", LlamaShape(n_layer=1, n_vocab=512))
        p = subprocess.run(
            [sys.executable, "-c", _PROBE, str(src), str(Path(tmp) / "probe-q4_0.gguf")],
            capture_output=True,
            text=True,
            timeout=120,
        )
    ok = p.returncode == 0 and "ok" in p.stdout
    result = {
        "amx_build": True,
        "ok": ok,
        "library": str(lib),
        "library_sha256_16": key,
        "reason": "quantized prompt batch ran with AMX buffers"
        if ok
        else f"quantized prompt batch crashed with AMX buffers (exit {p.returncode}); loading quantized models with use_extra_bufts=False",
    }
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(result))
    except OSError:
        pass
    return result


def open_llama(
    path: Path,
    *,
    n_ctx: int,
    n_threads: int,
    n_batch: int,
    n_gpu_layers: int,
    logits_all: bool = False,
    use_extra_bufts: bool = True,
) -> Any:
    """``llama_cpp.Llama`` with control of ``use_extra_bufts``, which its constructor does not expose.

    The constructor fills its model params from ``llama_model_default_params()``; for the
    duration of one load (under a lock) that function returns params with the flag set.
    """
    llama_cpp = load_llama_cpp()
    import llama_cpp.llama_cpp as low  # the ctypes bindings llama_cpp.Llama calls (llama_cpp.llama's llama_cpp)

    # 0 = every CPU this process may use. llama-cpp-python's own default (cpu_count // 2) ran one
    # thread on this 2-vCPU host: 1,053 vs 1,816 prompt tokens/s for a 40M-parameter f16 model.
    if n_threads <= 0:
        n_threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    kwargs = dict(
        n_ctx=n_ctx,
        n_threads=n_threads,
        n_threads_batch=n_threads,
        n_batch=n_batch,
        n_gpu_layers=n_gpu_layers,
        logits_all=logits_all,
        verbose=False,
    )
    if use_extra_bufts:
        return llama_cpp.Llama(str(path), **kwargs)
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


@dataclass(frozen=True)
class Tokenized:
    """Texts tokenized by a model's own tokenizer (no special tokens added)."""

    ids: list[list[int]]
    unknown: list[int]  # per text: how many of its tokens are the tokenizer's unknown token
    n_vocab: int
    bos: int | None  # the id to start a window with, None where the model adds no BOS


_TOKENIZE = r"""
import json, sys
from pathlib import Path
from dataclasses import asdict
from edge.errors import ModelError
from edge.backends.llamacpp.runtime import tokenize_in_process
args = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
try:
    out = {"ok": asdict(tokenize_in_process(Path(args["path"]), args["texts"]))}
except ModelError as e:
    out = {"error": str(e)}
Path(sys.argv[2]).write_text(json.dumps(out), encoding="utf-8")
"""


def tokenize_texts(path: Path, texts: list[str], *, timeout: float = 300) -> Tokenized:
    """Tokenize ``texts`` with the tokenizer in the GGUF at ``path`` (its vocabulary only), in a
    subprocess: llama.cpp ends the process on some vocabularies (an SPM vocabulary without byte
    tokens throws ``std::out_of_range`` on a character it lacks), and that must not end ``convert``.
    Every problem, a crash included, is a :class:`ModelError` saying why the tokenizer is unusable."""
    with tempfile.TemporaryDirectory(prefix="edgekit-tok-") as tmp:
        args, result = Path(tmp) / "args.json", Path(tmp) / "result.json"
        args.write_text(json.dumps({"path": str(Path(path).resolve()), "texts": list(texts)}), encoding="utf-8")
        root = str(Path(__file__).resolve().parents[2])  # the directory holding the edge package
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        try:
            p = subprocess.run(
                [sys.executable, "-c", _TOKENIZE, str(args), str(result)],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise ModelError(f"llama.cpp's tokenizer did not finish on the text in {timeout:.0f} s") from None
        if p.returncode != 0 or not result.is_file():
            said = next(
                (line.strip() for line in reversed(p.stderr.splitlines()) if line.strip() and not line.startswith("[")),
                "",
            )
            raise ModelError(
                f"llama.cpp's tokenizer crashed on the text (exit {p.returncode}"
                + (f": {said[:200]}" if said else "")
                + ")"
            )
        try:
            out = read_json_file(result, what="tokenizer result", max_bytes=256 << 20, max_depth=8)
        except UnreadableFile as e:
            raise ModelError(f"llama.cpp's tokenizer gave no readable result: {e.message}") from None
        if not isinstance(out, dict):
            raise ModelError("llama.cpp's tokenizer gave no readable result")
    if "error" in out:
        raise ModelError(out["error"])
    return Tokenized(**out["ok"])


def tokenize_in_process(path: Path, texts: list[str]) -> Tokenized:
    """:func:`tokenize_texts` in this process (what its subprocess runs): a vocabulary of type none is
    refused before llama.cpp is asked, since tokenizing with it aborts."""
    llama_cpp = load_llama_cpp()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    with captured_log() as log:
        model = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), params)
    if not model:
        tail = " | ".join(line for line in log.lines[-4:] if line.strip())
        raise ModelError(
            f"llama.cpp could not load the vocabulary of {Path(path).name}"
            + (f" (llama.cpp said: {tail})" if tail else "")
        )
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        if not vocab or llama_cpp.llama_vocab_type(vocab) == llama_cpp.LLAMA_VOCAB_TYPE_NONE:
            raise ModelError(f"{Path(path).name} has no tokenizer (tokenizer.ggml.model is none)")
        n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab))
        bos = int(llama_cpp.llama_vocab_bos(vocab))
        add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab)) and 0 <= bos < n_vocab
        ids: list[list[int]] = []
        unknown: list[int] = []
        for text in texts:
            data = text.encode("utf-8")
            cap = len(data) + 16
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, cap, False, False)
            if n < 0:  # more tokens than bytes: a tokenizer this odd is asked once more with the size it gave
                cap = -n
                buf = (llama_cpp.llama_token * cap)()
                n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, cap, False, False)
            if n < 0:
                raise ModelError(f"{Path(path).name}'s tokenizer failed on the text (llama_tokenize returned {n})")
            got = [int(t) for t in buf[:n]]
            bad = [t for t in got if not 0 <= t < n_vocab]
            if bad:
                raise ModelError(f"{Path(path).name}'s tokenizer returned ids outside its vocabulary ({bad[0]})")
            unknown.append(
                sum(1 for t in got if llama_cpp.llama_vocab_get_attr(vocab, t) & llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN)
            )
            ids.append(got)
        return Tokenized(ids, unknown, n_vocab, bos if add_bos else None)
    finally:
        llama_cpp.llama_model_free(model)
