"""GGUF -> GGUF quantization through llama.cpp's own quantizer (``llama_model_quantize``).

Default quantize params with ``ftype`` set, exactly as ``llama-quantize`` does. The header is
read first so a bad file, an unknown architecture or a tensor the type cannot take fails with
its name before llama.cpp starts.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge.backends.converter import ConversionRequest, ConversionResult, Converter
from edge.backends.llamacpp.format import check_quantizable, read_gguf
from edge.backends.llamacpp.runtime import captured_log, llama_cpp_version, load_llama_cpp
from edge.base.typedjson import spec
from edge.capabilities import Requirement
from edge.errors import ConversionError

# llama.cpp's llama_ftype values (include/llama.h)
FTYPES = {
    "f16": "LLAMA_FTYPE_MOSTLY_F16",
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
}


@dataclass(frozen=True)
class GGUFQuantizeOptions:
    """``gguf->gguf``'s options, declared once (``edge.backends.options``)."""

    threads: int = spec(0, ge=0, le=4096, doc="quantizer threads; 0 = llama.cpp's default")
    allow_requantize: bool = spec(
        False,
        doc="requantize a source that is already quantized (llama.cpp's allow_requantize; "
        "the pipeline sets it only with --allow-requantize)",
    )


class GGUFQuantize(Converter):
    name = "gguf->gguf"
    source_format = "gguf"
    target_format = "gguf"
    precisions = frozenset(FTYPES)
    requires = (
        Requirement("python", "llama_cpp", install="pip install 'edgekit-ml[llm]'"),
        Requirement("python", "gguf", install="pip install 'edgekit-ml[llm]'"),
    )
    options_class = GGUFQuantizeOptions  # ``options`` (names and descriptions) derive from it

    def convert(self, request: ConversionRequest) -> ConversionResult:
        opts: GGUFQuantizeOptions = self.read_options(request.options)
        info = read_gguf(request.source)
        notes = check_quantizable(info, request.precision)
        llama_cpp = load_llama_cpp()
        out = request.workdir / "model.gguf"
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, FTYPES[request.precision])
        params.nthread = opts.threads
        params.allow_requantize = opts.allow_requantize
        with captured_log() as log:
            rc = llama_cpp.llama_model_quantize(str(request.source).encode(), str(out).encode(), ctypes.byref(params))
        if rc != 0 or not out.exists():
            tail = " | ".join(line for line in log.lines[-6:] if line.strip())
            raise ConversionError(
                f"llama.cpp could not quantize {request.source} ({info.architecture}, "
                f"{info.dominant_type}) to {request.precision}: return code {rc}"
                + (f"; llama.cpp said: {tail}" if tail else ""),
                hint="check that llama.cpp knows the architecture and the file is complete",
            )
        q = read_gguf(out)
        details: dict[str, Any] = {
            "quant_type": request.precision,
            "architecture": info.architecture,
            "parameters": info.parameters,
            "source_bytes": Path(request.source).stat().st_size,
            "bytes": out.stat().st_size,
            "source_type": info.dominant_type,
            "dominant_type": q.dominant_type,
            "tensor_types": _type_counts(q),
        }
        details["size_ratio"] = round(details["bytes"] / details["source_bytes"], 4)
        return ConversionResult(
            artifact=out,
            format="gguf",
            files=[out],
            details=details,
            notes=notes,
            tool_versions={"llama-cpp-python": llama_cpp_version(), "llama.cpp": _system_info(llama_cpp)},
        )


def _type_counts(info: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in info.tensors:
        counts[t.type] = counts.get(t.type, 0) + 1
    return counts


def _system_info(llama_cpp: Any) -> str:
    try:
        info: bytes = llama_cpp.llama_print_system_info()
        return info.decode()[:200]
    except Exception:  # noqa: BLE001 - informational only
        return "unknown"
