"""What a llama.cpp bundle is, read by both sides: the runner's options, and the GGUF file itself (its header,
tensors and quantization types, read without loading the model)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge.backends.options import THREADS
from edge.base.typedjson import spec
from edge.errors import InputFileError, MissingDependencyError, ModelError


@dataclass(frozen=True)
class LlamaCppOptions:
    """llama.cpp's context options edgekit sets (declared once: ``edge.backends.options``)."""

    n_threads: int = spec(0, **THREADS, doc="CPU threads; 0 = every CPU this process may use")
    n_ctx: int = spec(
        2048,
        ge=1,
        le=1 << 24,
        doc="context length (tokens); past the model's trained context, the trained context (with a note)",
    )
    n_batch: int = spec(512, ge=1, le=1 << 20, doc="prompt batch size (default 512)")
    n_gpu_layers: int = spec(0, ge=-1, le=1 << 16, doc="layers offloaded to the GPU; -1 = all, 0 = CPU only")
    require_gpu: bool = spec(
        False, doc="fail instead of falling back to the CPU when n_gpu_layers != 0 and no GPU backend exists"
    )


# -- the GGUF file ------------------------------------------------------------------------------------
# Reading GGUF headers: what a file is before llama.cpp touches it (errors name the file and tensor).

GGUF_MAGIC = b"GGUF"
# llama.cpp quantization types edgekit offers: name -> (ggml block type, block size along a row)
QUANT_TYPES: dict[str, tuple[str, int]] = {
    "f16": ("F16", 1),
    "q8_0": ("Q8_0", 32),
    "q4_0": ("Q4_0", 32),
    "q5_k_m": ("Q5_K", 256),
    "q4_k_m": ("Q4_K", 256),
}
K_QUANTS = frozenset({"q5_k_m", "q4_k_m"})


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # GGUF order: shape[0] is the row width (contiguous dimension)
    type: str
    n_elements: int


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    architecture: str
    name: str
    file_type: int | None
    context_length: int | None
    tensors: tuple[GGUFTensor, ...]

    @property
    def parameters(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def dominant_type(self) -> str:
        sizes: dict[str, int] = {}
        for t in self.tensors:
            sizes[t.type] = sizes.get(t.type, 0) + t.n_elements
        return max(sizes, key=sizes.__getitem__) if sizes else "?"


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return None
    part = f.parts[f.data[0]]
    if f.types and f.types[0].name == "STRING":
        return bytes(part).decode("utf-8", "replace")
    return part.tolist()[0] if hasattr(part, "tolist") else part


def read_gguf(path: str | os.PathLike[str]) -> GGUFInfo:
    p = Path(path)
    if not p.is_file():
        raise InputFileError(f"model file {p} does not exist")
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise InputFileError(f"{p} is not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
    try:
        import gguf
    except ImportError:
        raise MissingDependencyError(
            "reading GGUF files needs the 'gguf' package", hint="pip install 'edgekit-ml[llm]'"
        ) from None
    try:
        r = gguf.GGUFReader(str(p))
    except Exception as e:
        raise InputFileError(f"{p} is not a readable GGUF file: {type(e).__name__}: {str(e)[:200]}") from None
    arch = _field(r, "general.architecture")
    if not arch:
        raise ModelError(f"{p} has no general.architecture key")
    tensors = tuple(
        GGUFTensor(t.name, tuple(int(d) for d in t.shape), t.tensor_type.name, int(t.n_elements)) for t in r.tensors
    )
    return GGUFInfo(
        p,
        str(arch),
        str(_field(r, "general.name") or p.stem),
        _field(r, "general.file_type"),
        _field(r, f"{arch}.context_length"),
        tensors,
    )


#: file types holding the model's weights unquantized
UNQUANTIZED_TYPES = ("f32", "f16", "bf16")


def file_type_name(info: GGUFInfo) -> str:
    """llama.cpp's file type as edgekit names precisions (q4_k_m, q4_1, f16...): ``general.file_type``,
    else the dominant tensor type."""
    if info.file_type is not None:
        try:
            import gguf

            name = gguf.LlamaFileType(int(info.file_type)).name
            if name != "GUESSED":
                return name.removeprefix("MOSTLY_").removeprefix("ALL_").lower()
        except (ImportError, ValueError):
            pass
    return info.dominant_type.lower()


def quant_bits(file_type: str) -> int | None:
    """The nominal bits per weight of a quantized file type (q4_1: 4, q5_k_m: 5, iq3_xs: 3), else None."""
    m = re.match(r"^i?q(\d)", file_type.lower())
    return int(m.group(1)) if m else None


def check_quantizable(info: GGUFInfo, quant: str) -> list[str]:
    """Problems quantizing to ``quant``; k-quants fall back per tensor in llama.cpp, the others fail.

    Returns notes for tensors llama.cpp will quantize differently (k-quant fallback); raises for
    tensors the type cannot take, naming each.
    """
    if quant not in QUANT_TYPES:
        raise ModelError(f"unknown GGUF quantization {quant!r}; known: {', '.join(QUANT_TYPES)}")
    _, block = QUANT_TYPES[quant]
    odd = [t for t in info.tensors if len(t.shape) >= 2 and t.shape[0] % block]
    if not odd:
        return []
    listed = ", ".join(f"{t.name} (row width {t.shape[0]})" for t in odd[:8]) + (" ..." if len(odd) > 8 else "")
    if quant in K_QUANTS:
        return [
            f"{len(odd)} tensor(s) have row widths not divisible by {block}; llama.cpp quantizes them with a fallback type: {listed}"
        ]
    raise ModelError(
        f"{info.path}: {quant} needs row widths divisible by {block}; not so for {listed}",
        hint="choose a k-quant (q4_k_m, q5_k_m), which falls back per tensor, or f16",
    )
