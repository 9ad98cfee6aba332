"""What the LLM quality gate evaluates: natural text, tokenized by the model's own tokenizer.

Random token ids are not text. On them a trained model's next-token distribution is flat and its
top-1 is a near tie at many positions, so quantization noise flips it where it would not on
text: a trained 135M llama quantized to q8_0 agreed with its f16 source on 87.9% of random-id
positions and on 97.4% of positions of English prose. llama.cpp's own
``llama-perplexity --kl-divergence`` evaluates text for this reason.

The text is the package's ``edge/llm/eval/*.txt`` (public-domain prose in English, German,
French and Spanish, and some Python; provenance in ``eval/SOURCES.md``) or the user's own file
(``--eval-text``). Each text is tokenized without special tokens and cut into windows of up to
``window_tokens`` tokens, the model's BOS first where it adds one; windows are taken round-robin
over the texts (every language is represented) up to ``max_windows``, each evaluated from a fresh
context. A model whose tokenizer cannot tokenize text (no vocabulary, or one that maps the text
to its unknown token) is evaluated on random ids, and the record says so and why.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from edge.errors import InputFileError, ModelError

#: the built-in texts, in the order windows are taken from them
BUILTIN_TEXTS = ("en", "de", "fr", "es", "code")
WINDOW_TOKENS = 128
MAX_WINDOWS = 8
#: a window shorter than this says little; a user's text must give at least one
MIN_WINDOW_TOKENS = 16
#: a tokenizer that maps more of the text than this to its unknown token cannot read it
MAX_UNKNOWN = 0.05
MAX_TEXT_BYTES = 4 << 20
RANDOM_WINDOWS = 2

Origin = Literal["built-in", "file", "random"]


@dataclass(frozen=True)
class EvalWindow:
    text: str  # the text's name: "en", ..., the user's file name, or "random"
    start: int  # offset of its first text token in that text's tokens
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class EvalText:
    """The token windows the gate evaluates, and where they came from."""

    origin: Origin
    windows: tuple[EvalWindow, ...]
    sha256: dict[str, str]  # text name -> sha256 of its UTF-8 bytes (none for random ids)
    note: str | None = None  # why random ids, when they are

    @property
    def tokens(self) -> int:
        return sum(len(w.tokens) for w in self.windows)

    def describe(self) -> str:
        if self.origin == "random":
            return f"random token ids: {self.note}"
        names = ", ".join(dict.fromkeys(w.text for w in self.windows))
        what = "built-in text (edge/llm/eval: " + names + ")" if self.origin == "built-in" else f"the file {names}"
        return f"{what} tokenized by the model's own tokenizer"

    def to_json(self) -> dict[str, Any]:
        return {
            "origin": self.origin,
            "description": self.describe(),
            "windows": len(self.windows),
            "window_tokens": max((len(w.tokens) for w in self.windows), default=0),
            "note": self.note,
        }


def builtin_texts() -> dict[str, str]:
    root = resources.files("edge.llm") / "eval"
    return {name: (root / f"{name}.txt").read_text(encoding="utf-8") for name in BUILTIN_TEXTS}


def read_eval_text(path: str | os.PathLike[str]) -> str:
    p = Path(path)
    if not p.is_file():
        raise InputFileError(f"evaluation text {p} does not exist or is not a file")
    size = p.stat().st_size
    if size > MAX_TEXT_BYTES:
        raise InputFileError(
            f"evaluation text {p} is {size:,} bytes; the gate reads at most {MAX_TEXT_BYTES:,}",
            hint=f"give a few kB: the gate evaluates at most {MAX_WINDOWS} windows of {WINDOW_TOKENS} tokens",
        )
    try:
        return p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(f"evaluation text {p} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def _windows(name: str, ids: list[int], bos: int | None, window: int) -> list[EvalWindow]:
    body = window - (bos is not None)
    out = []
    for start in range(0, len(ids), body):
        chunk = ids[start : start + body]
        if len(chunk) + (bos is not None) < MIN_WINDOW_TOKENS:
            break
        out.append(EvalWindow(name, start, tuple(([bos] if bos is not None else []) + chunk)))
    return out


def gate_tokens(n_vocab: int, count: int = 256, seed: int = 0) -> list[int]:
    """Deterministic random token sequence (BOS first): the fallback for a model that cannot
    tokenize text, and the benchmark's prompt; ids avoid the first control tokens."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [1] + [int(t) for t in rng.integers(3, n_vocab, size=count - 1)]


def random_windows(n_vocab: int, note: str, *, window: int = WINDOW_TOKENS, count: int = RANDOM_WINDOWS) -> EvalText:
    return EvalText(
        "random",
        tuple(EvalWindow("random", 0, tuple(gate_tokens(n_vocab, window, seed=i))) for i in range(count)),
        {},
        note,
    )


def eval_windows(
    model: Path,
    n_vocab: int,
    *,
    eval_text: str | os.PathLike[str] | None = None,
    context: int | None = None,
    window_tokens: int = WINDOW_TOKENS,
    max_windows: int = MAX_WINDOWS,
) -> EvalText:
    """The gate's windows for the GGUF at ``model``: ``eval_text`` (a file) or the built-in texts,
    tokenized by the model; random ids with the reason when the model cannot tokenize the
    built-in texts. A user's file the model cannot tokenize, or too short for one window, is an
    error: the user asked for that text."""
    from edge.backends.llamacpp.runtime import tokenize_texts

    window = max(MIN_WINDOW_TOKENS, min(window_tokens, (context or window_tokens + 8) - 8))
    if eval_text is not None:
        texts = {Path(eval_text).name: read_eval_text(eval_text)}
        origin: Origin = "file"
    else:
        texts = builtin_texts()
        origin = "built-in"
    try:
        tok = tokenize_texts(model, list(texts.values()))
        for name, ids, unk in zip(texts, tok.ids, tok.unknown):
            if ids and unk / len(ids) > MAX_UNKNOWN:
                raise ModelError(f"it maps {unk / len(ids):.0%} of the {name} text to its unknown token")
        top = max((max(ids) for ids in tok.ids if ids), default=-1)
        if top >= n_vocab:  # a larger output layer than vocabulary (padding) is common and harmless
            raise ModelError(f"it gives token id {top}, beyond the model's {n_vocab} outputs")
    except ModelError as e:
        if origin == "file":
            raise ModelError(
                f"cannot evaluate {model.name} on {Path(str(eval_text)).name}: the model's tokenizer could not tokenize text: {e}",
                hint="leave out --eval-text to evaluate on random token ids",
            ) from None
        return random_windows(n_vocab, f"the model's tokenizer could not tokenize text: {e}", window=window)
    per_text = [_windows(name, ids, tok.bos, window) for name, ids in zip(texts, tok.ids)]
    chosen: list[EvalWindow] = []
    for rank in range(max((len(w) for w in per_text), default=0)):  # round-robin: every text gets a turn
        chosen += [w[rank] for w in per_text if rank < len(w)]
    chosen = chosen[:max_windows]
    if not chosen:
        name = next(iter(texts))
        raise InputFileError(
            f"evaluation text {name} gives {len(tok.ids[0])} tokens with {model.name}'s tokenizer; "
            f"the gate needs at least {MIN_WINDOW_TOKENS}",
            hint="give a longer text",
        )
    digests = {name: hashlib.sha256(text.encode("utf-8")).hexdigest() for name, text in texts.items()}
    used = {w.text for w in chosen}
    return EvalText(origin, tuple(chosen), {k: v for k, v in digests.items() if k in used})
