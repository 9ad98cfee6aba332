"""What a llama.cpp bundle takes, read by both sides: the runner's options."""

from __future__ import annotations

from dataclasses import dataclass

from edge.backends.options import THREADS
from edge.bundle.typedjson import spec


@dataclass(frozen=True)
class LlamaCppOptions:
    """llama.cpp's context options edgekit sets (declared once: ``edge.backends.options``)."""

    n_threads: int = spec(0, **THREADS, doc="CPU threads; 0 = every CPU this process may use")
    n_ctx: int = spec(2048, ge=1, le=1 << 24, doc="context length (tokens); past the model's trained context, the "
                      "trained context (with a note)")
    n_batch: int = spec(512, ge=1, le=1 << 20, doc="prompt batch size (default 512)")
    n_gpu_layers: int = spec(0, ge=-1, le=1 << 16, doc="layers offloaded to the GPU; -1 = all, 0 = CPU only")
    require_gpu: bool = spec(False, doc="fail instead of falling back to the CPU when n_gpu_layers != 0 and no GPU "
                             "backend exists")
