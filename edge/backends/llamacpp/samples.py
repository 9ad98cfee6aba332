"""Tiny llama-architecture GGUF files built in code with the ``gguf`` package (no download).

Random weights, real architecture: token embedding, ``n_layer`` blocks of RMSNorm + attention
(RoPE, optional grouped-query heads) + SwiGLU FFN, output norm and head, and a small
SentencePiece-style vocabulary with byte fallback so llama.cpp can tokenize any text. Widths are
multiples of 256 by default so every k-quant applies without fallback.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge.errors import MissingDependencyError

_LETTERS = "etaoinshrdlucmfwypvbgkqjxz"


def _vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256  # unknown, control, control, byte
    pieces: list[str] = []
    for a in _LETTERS:
        pieces.append("▁" + a)
        pieces.append(a)
    for a in _LETTERS:
        for b in _LETTERS:
            pieces.append("▁" + a + b)
            pieces.append(a + b)
    if n_vocab - len(tokens) > len(pieces):
        raise ValueError(f"n_vocab {n_vocab} too large for the built-in piece list")
    pieces = pieces[: n_vocab - len(tokens)]
    tokens += pieces
    types += [1] * len(pieces)
    scores = [0.0] * 259 + [-float(i) / 10 for i in range(len(pieces))]
    return tokens, scores, types


def _dummy_vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """Placeholder pieces no text contains, no byte fallback: every character of a text is <unk>."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<dummy{i}>" for i in range(n_vocab - 3)]
    return tokens, [0.0] * n_vocab, [2, 3, 3] + [1] * (n_vocab - 3)


@dataclass(frozen=True)
class LlamaShape:
    """A tiny llama's architecture: vocabulary, width, layers, heads (query and key/value), FFN width, context."""

    n_vocab: int = 1024
    n_embd: int = 256
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 512
    n_ctx: int = 2048


def build_tiny_llama(
    path: str | os.PathLike[str],
    shape: LlamaShape = LlamaShape(),
    *,
    seed: int = 0,
    dtype: str = "f16",
    logit_gain: float = 4.0,
    vocab: str = "letters",
) -> Path:
    """Write a tiny llama GGUF of ``shape`` (``dtype`` f16 or f32 weights; norms are always f32). ``vocab``
    "letters": letter pieces with byte fallback (tokenizes any text); "dummy": placeholder pieces
    without byte tokens (llama.cpp's tokenizer throws on the first character it lacks); "none": no
    tokenizer at all (``tokenizer.ggml.model`` none), like a model converted without one."""
    n_vocab, n_embd, n_layer, n_ctx = shape.n_vocab, shape.n_embd, shape.n_layer, shape.n_ctx
    n_head, n_head_kv, n_ff = shape.n_head, shape.n_head_kv, shape.n_ff
    try:
        import gguf
    except ImportError:
        raise MissingDependencyError(
            "building GGUF files needs the 'gguf' package", hint="pip install 'edgekit-ml[llm]'"
        ) from None
    if dtype not in ("f16", "f32"):
        raise ValueError(f"dtype must be f16 or f32, got {dtype!r}")
    if vocab not in ("letters", "dummy", "none"):
        raise ValueError(f"vocab must be letters, dummy or none, got {vocab!r}")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    wdt = np.float16 if dtype == "f16" else np.float32
    head_dim = n_embd // n_head

    def w(rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
        m: np.ndarray = (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(wdt)
        return m

    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name("edgekit-tiny-llama")
    writer.add_description(f"random weights, seed {seed}; for mechanics and timing, not text")
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32)
    if vocab == "none":
        writer.add_tokenizer_model("none")
        writer.add_vocab_size(n_vocab)
    else:
        tokens, scores, types = _vocab(n_vocab) if vocab == "letters" else _dummy_vocab(n_vocab)
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_unk_token_id(0)

    writer.add_tensor("token_embd.weight", (rng.standard_normal((n_vocab, n_embd)) * 0.5).astype(wdt))
    for i in range(n_layer):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(p + "attn_q.weight", w(n_embd, n_embd))
        writer.add_tensor(p + "attn_k.weight", w(n_head_kv * head_dim, n_embd))
        writer.add_tensor(p + "attn_v.weight", w(n_head_kv * head_dim, n_embd))
        writer.add_tensor(p + "attn_output.weight", w(n_embd, n_embd, 0.5))
        writer.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(p + "ffn_gate.weight", w(n_ff, n_embd))
        writer.add_tensor(p + "ffn_up.weight", w(n_ff, n_embd))
        writer.add_tensor(p + "ffn_down.weight", w(n_embd, n_ff, 0.5))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("output.weight", w(n_vocab, n_embd, logit_gain))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
