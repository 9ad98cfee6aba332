"""``convert`` for GGUF sources: quantize with llama.cpp, gate on KL/top-1, write a verified bundle."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from edge.manifest import new_manifest, record_gate
from edge.bundle import MANIFEST, Bundle, staging_dir, write_json_atomic
from edge.capabilities import problems
from edge.backends.converter import CONVERTERS, ConversionRequest
from edge.errors import MissingDependencyError, TargetError
from edge.llm.gguf_file import read_gguf
from edge.llm.quality import compare_gguf, gate_tokens
from edge.spec import IOSpec, TensorSpec
from edge.targets import TargetProfile

CONVERTER = "gguf->gguf"


def convert_gguf(model: str | os.PathLike[str], profile: TargetProfile, output: str | os.PathLike[str], *,
                 precision: str | None = None, accept_parity_failure: bool = False, force: bool = False,
                 gate_token_count: int = 256, on_step: Callable[[str], None] | None = None) -> Bundle:
    say = on_step or (lambda _m: None)
    if profile.llm is None:
        raise TargetError(f"target {profile.name!r} has no [llm] section: it does not run GGUF language models",
                          hint="targets with one: see `edgekit targets --json` (llm != null)")
    llm = profile.llm
    quant = llm.check_precision(profile.name, precision or llm.default_precision)
    conv = CONVERTERS.get(CONVERTER)
    missing = problems(conv.requires)
    if missing:
        raise MissingDependencyError("cannot quantize GGUF on this host: " + "; ".join(missing))
    src = Path(model)
    say(f"reading {src}")
    info = read_gguf(src)
    with tempfile.TemporaryDirectory(prefix="edgekit-gguf-") as tmp, staging_dir(Path(output), force=force) as stage:
        say(f"quantizing to {quant} with llama.cpp")
        result = conv().convert(ConversionRequest(source=src, workdir=Path(tmp), precision=quant,
                                                  io=IOSpec((), ()), options={}))
        artifact = stage / "model.gguf"
        shutil.move(str(result.artifact), artifact)
        say(f"quality gate: KL and top-1 against the source on {gate_token_count} tokens")
        from edge.backends.llamacpp.run import LlamaCppRunner

        n_vocab = next((t.shape[1] for t in info.tensors if t.name == "token_embd.weight"), None)
        if n_vocab is None:
            with LlamaCppRunner(src, options={"n_ctx": 64}) as r:
                n_vocab = r.n_vocab
        report = compare_gguf(src, artifact, quant, gate_tokens(int(n_vocab), gate_token_count), llm.options)
        manifest = new_manifest(
            source=src, profile=profile, precision=quant, stage=stage, primary=artifact,
            chain=[{"converter": CONVERTER, "precision": quant, "output_format": "gguf",
                    "tool_versions": result.tool_versions, "details": result.details, "notes": result.notes}],
            source_info={"format": "gguf", "architecture": info.architecture, "parameters": info.parameters,
                         "type": info.dominant_type, "bytes": src.stat().st_size},
            io=IOSpec((TensorSpec("tokens", ("n",), "int32"),), (TensorSpec("logits", (int(n_vocab),), "float32"),)),
            runner=llm.runner, runner_options=llm.options, kind="llm")
        record_gate(manifest, report, failed=f"quality gate failed for {quant}", accept=accept_parity_failure)
        write_json_atomic(stage / MANIFEST, manifest)
    return Bundle.open(output, trust=False)  # just built here: unsigned until `edgekit sign`


def is_gguf(path: str | os.PathLike[str]) -> bool:
    p = Path(path)
    if p.suffix.lower() == ".gguf":
        return True
    try:
        with open(p, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False
