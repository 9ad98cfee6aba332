"""``convert`` for GGUF sources: quantize with llama.cpp, gate on KL/top-1, write a verified bundle."""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import edge
from edge.bundle import MANIFEST, SCHEMA_VERSION, Bundle, artifact_entries, bundle_id, staging_dir, write_json_atomic
from edge.capabilities import current_host, problems
from edge.converters.base import CONVERTERS, ConversionRequest
from edge.errors import MissingDependencyError, ParityError, TargetError
from edge.llm.gguf_file import read_gguf
from edge.llm.quality import compare_gguf, gate_tokens
from edge.onnxmodel import sha256_file
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
        from edge.runners.llamacpp import LlamaCppRunner

        n_vocab = next((t.shape[1] for t in info.tensors if t.name == "token_embd.weight"), None)
        if n_vocab is None:
            with LlamaCppRunner(src, options={"n_ctx": 64}) as r:
                n_vocab = r.n_vocab
        report = compare_gguf(src, artifact, quant, gate_tokens(int(n_vocab), gate_token_count), llm.options)
        gate = report.to_json()
        gate["accepted_failure"] = not report.passed and accept_parity_failure
        if not report.passed and not accept_parity_failure:
            raise ParityError(f"quality gate failed for {quant}: " + "; ".join(report.failures()), report,
                              hint="nothing was written; pass --accept-parity-failure to keep it anyway")
        artifacts = artifact_entries(stage, [artifact])
        options = dict(llm.options)
        manifest: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "edgekit_version": edge.__version__,
            "bundle_id": bundle_id(src.stem, profile.name, quant, [a["sha256"] for a in artifacts], options),
            "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "kind": "llm",
            "target": {"name": profile.name, "title": profile.title, "accelerator": profile.accelerator,
                       "frame_budget_ms": None, "profile_sha256": sha256_file(profile.path) if profile.path else None},
            "source": {"file": src.name, "sha256": sha256_file(src), "format": "gguf", "architecture": info.architecture,
                       "parameters": info.parameters, "type": info.dominant_type, "bytes": src.stat().st_size},
            "precision": quant,
            "format": "gguf",
            "primary_artifact": "model.gguf",
            "artifacts": artifacts,
            "chain": [{"converter": CONVERTER, "precision": quant, "output_format": "gguf",
                       "tool_versions": result.tool_versions, "details": result.details, "notes": result.notes}],
            "calibration": None,
            "io": IOSpec((TensorSpec("tokens", ("n",), "int32"),),
                         (TensorSpec("logits", (int(n_vocab),), "float32"),)).to_json(),
            "preprocess": None,
            "runner": {"name": llm.runner, "options": options},
            "parity": gate,
            "benchmark": None,
            "build_host": {"os": current_host().os, "arch": current_host().arch, "python": platform.python_version()},
        }
        write_json_atomic(stage / MANIFEST, manifest)
    return Bundle.open(output)


def is_gguf(path: str | os.PathLike[str]) -> bool:
    p = Path(path)
    if p.suffix.lower() == ".gguf":
        return True
    try:
        with open(p, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False
