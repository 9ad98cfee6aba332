"""llama.cpp runner for GGUF bundles: threads/context/GPU layers from the profile, backend used reported.

A GPU target whose llama.cpp build has no GPU backend runs on the CPU; that is recorded as a
fallback, and ``require_gpu = true`` in the profile turns it into an error instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from edge.backends.llamacpp.format import LlamaCppOptions, read_gguf
from edge.backends.llamacpp.runtime import amx_probe, llama_cpp_version, load_llama_cpp, open_llama
from edge.backends.runner import Runner, RunnerInfo
from edge.capabilities import Requirement
from edge.errors import EdgeError, HardwareUnavailableError
from edge.spec import TensorSpec

_QUANTIZED = ("Q", "IQ")


def fit_context(n_ctx: int, trained: int | None, name: str) -> tuple[int, str | None]:
    """The context to open: ``n_ctx``, or the model's trained context when ``n_ctx`` is longer (a profile's n_ctx
    serves every model of its class; a model trained on less cannot use more), with the note that says so."""
    if trained and n_ctx > trained:
        return int(trained), f"n_ctx {n_ctx} is longer than {name}'s trained context {trained}: using {trained}"
    return n_ctx, None


def context_note(artifact: Path, options: Mapping[str, Any]) -> str | None:
    """The note ``fit_context`` gives for a bundle's artifact and runner options (None when n_ctx fits)."""
    return fit_context(int(options.get("n_ctx", 2048)), read_gguf(artifact).context_length, artifact.name)[1]


class LlamaCppRunner(Runner):
    name = "llama.cpp"
    formats = ("gguf",)
    requires = (
        Requirement("python", "llama_cpp", install="pip install 'edgekit-ml[llm]'"),
        Requirement("python", "gguf", install="pip install 'edgekit-ml[llm]'"),
    )
    options_class = LlamaCppOptions

    def __init__(
        self,
        artifact: Path,
        *,
        options: Mapping[str, Any] | None = None,
        precision: str = "f16",
        logits_all: bool = False,
    ) -> None:
        super().__init__(artifact, options=options, precision=precision)
        llama_cpp = load_llama_cpp()
        opts = self._options
        info = read_gguf(self.artifact)
        n_ctx, ctx_note = fit_context(int(opts.get("n_ctx", 2048)), info.context_length, self.artifact.name)
        n_gpu_layers = int(opts.get("n_gpu_layers", 0))
        gpu_build = bool(llama_cpp.llama_supports_gpu_offload())
        fallback = None
        if n_gpu_layers != 0 and not gpu_build:
            msg = (
                f"profile asks for {n_gpu_layers if n_gpu_layers > 0 else 'all'} GPU layers, but this llama.cpp "
                f"build has no GPU backend; running on the CPU"
            )
            if opts.get("require_gpu", False):
                raise HardwareUnavailableError(
                    msg.replace("; running on the CPU", ""),
                    hint="install llama-cpp-python built with CUDA/Metal (CMAKE_ARGS=-DGGML_CUDA=on pip install llama-cpp-python)",
                )
            fallback, n_gpu_layers = msg, 0
        quantized = info.dominant_type.startswith(_QUANTIZED)
        probe = amx_probe() if quantized else {"ok": True, "reason": "not quantized"}
        use_extra_bufts = bool(probe["ok"])
        self.llm = open_llama(
            self.artifact,
            n_ctx=n_ctx,
            n_threads=int(opts.get("n_threads", 0)),
            n_batch=int(opts.get("n_batch", 512)),
            n_gpu_layers=n_gpu_layers,
            logits_all=logits_all,
            use_extra_bufts=use_extra_bufts,
        )
        self.n_vocab = int(self.llm.n_vocab())
        self.inputs = (TensorSpec("tokens", ("n",), "int32"),)
        self.outputs = (TensorSpec("logits", (self.n_vocab,), "float32"),)
        self.info = RunnerInfo(
            runtime=f"llama-cpp-python {llama_cpp_version()}",
            device_requested="GPU" if int(opts.get("n_gpu_layers", 0)) != 0 else "CPU",
            device_used="GPU" if n_gpu_layers != 0 else "CPU",
            precision_used=info.dominant_type.lower(),
            threads=int(self.llm.n_threads) if getattr(self.llm, "n_threads", None) else None,
            fallback=fallback,
            details={
                "n_ctx": n_ctx,
                **({"n_ctx_note": ctx_note} if ctx_note else {}),
                "n_gpu_layers": n_gpu_layers,
                "gpu_build": gpu_build,
                "architecture": info.architecture,
                "parameters": info.parameters,
                "amx_extra_buffers": use_extra_bufts,
                "amx_probe": probe.get("reason"),
            },
        )

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Evaluate ``tokens`` from a fresh context; returns the logits after the last one."""
        self.check_open()
        tokens = self._tokens(feeds)
        self.llm.reset()
        self.llm.eval(tokens)
        return {"logits": np.array(self.llm._ctx.get_logits_ith(-1)[: self.n_vocab], dtype=np.float32)}

    def _tokens(self, feeds: Mapping[str, np.ndarray]) -> list[int]:
        """``tokens``: a 1-D array of token ids of any integer dtype, 1 to n_ctx long, each below n_vocab."""
        unknown = [k for k in feeds if k != "tokens"]
        if "tokens" not in feeds or unknown:
            raise EdgeError(
                f"runner 'llama.cpp' takes one input, 'tokens' (1-D integer token ids); got "
                f"{', '.join(repr(k) for k in feeds) or 'no inputs'}: "
                + ("missing input 'tokens'" if "tokens" not in feeds else f"unknown input {unknown[0]!r}")
            )
        a = np.asarray(feeds["tokens"])
        if a.dtype.kind not in "iu":
            raise EdgeError(f"input 'tokens' has dtype {a.dtype}, expected integer token ids (int32)")
        if a.ndim != 1 or not 0 < a.shape[0] <= self.llm.n_ctx():
            raise EdgeError(
                f"input 'tokens' has shape {list(a.shape)}, expected [n] with 1 <= n <= n_ctx ({self.llm.n_ctx()})"
            )
        if a.min() < 0 or a.max() >= self.n_vocab:
            raise EdgeError(f"input 'tokens' has ids outside the vocabulary [0, {self.n_vocab})")
        tokens: list[int] = a.tolist()
        return tokens

    def tokenize(self, text: str) -> list[int]:
        self.check_open()
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=True))

    def generate(
        self,
        prompt: str,
        max_tokens: int = 64,
        *,
        temperature: float = 0.0,
        logit_bias: Mapping[int, float] | None = None,
    ) -> Iterator[str]:
        """Stream the completion of ``prompt`` piece by piece."""
        self.check_open()
        for chunk in self.llm.create_completion(
            prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            stream=True,
            logit_bias=dict(logit_bias) if logit_bias else None,
        ):
            yield chunk["choices"][0]["text"]

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.close()
            self.llm = None
        super().close()
