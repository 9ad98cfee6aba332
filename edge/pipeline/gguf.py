"""The GGUF path of the one pipeline: a language model is quantized with llama.cpp's own tool to the target's
quant (or the one asked for) and held to a quality gate on real text (KL and top-1 agreement against the source),
then staged, manifested and renamed into place like every other bundle."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from edge.backends.converter import ConversionRequest
from edge.base.typedjson import write_json_atomic
from edge.bundle.bundle import MANIFEST, Bundle, staging_dir
from edge.bundle.fields import fit_notes
from edge.bundle.manifest import ManifestSpec, new_manifest, record_gate
from edge.errors import MissingDependencyError, ModelError, PrecisionError, TargetError
from edge.pipeline.plan import KEEP, Step, conversion_problems
from edge.pipeline.request import ConvertRequest
from edge.pipeline.sources import GGUFSource
from edge.spec import IOSpec, TensorSpec
from edge.targets import ChainStep, TargetProfile
from edge.verify.gates import SKIP_SOURCE_AS_IS


def convert_llm(
    src: GGUFSource, profile: TargetProfile, output: Path, req: ConvertRequest, *, force: bool, say: Step
) -> Bundle:
    from edge.llm.evaltext import eval_windows

    quant, llm = _llm_quant(src, profile, req)
    say(f"reading {src.path} (gguf {src.source_type}, {src.info.architecture}, {src.info.parameters:,} parameters)")
    n_vocab = next((t.shape[1] for t in src.info.tensors if t.name == "token_embd.weight"), None)
    if n_vocab is None:
        from edge.backends.llamacpp.run import LlamaCppRunner

        with LlamaCppRunner(src.path, options={"n_ctx": 64}) as r:
            n_vocab = r.n_vocab
    text = eval_windows(src.path, int(n_vocab), eval_text=req.eval_text, context=src.info.context_length)
    with tempfile.TemporaryDirectory(prefix="edgekit-gguf-") as tmp, staging_dir(output, force=force) as stage:
        artifact = stage / "model.gguf"
        chain_record = _quantize_llm(src, quant, artifact, Path(tmp), say)
        report, pairs = _llm_gate(src, llm, quant, artifact, stage, text, say)
        own = src.source_type
        precision_out = own if quant == KEEP else quant
        manifest = new_manifest(
            ManifestSpec(
                source=src.path,
                profile=profile,
                precision=precision_out,
                stage=stage,
                primary=artifact,
                chain=chain_record,
                source_info={**src.describe(), "file_type": own},
                fmt="gguf",
                io=IOSpec(
                    (TensorSpec("tokens", ("n",), "int32"),), (TensorSpec("logits", (int(n_vocab),), "float32"),)
                ),
                runner=llm.runner,
                runner_options=llm.options,
                kind="llm",
            )
        )
        manifest["reference_pairs"] = pairs
        if report is None:
            manifest["parity"] = {
                "passed": None,
                "skipped": f"{SKIP_SOURCE_AS_IS}{own}): there is nothing to compare it against (quality gate skipped)",
            }
        else:
            record_gate(manifest, report, failed=f"quality gate failed for {quant}", accept=req.accept_parity_failure)
        write_json_atomic(stage / MANIFEST, manifest)
    return Bundle.open(output, trust=False)


def _llm_quant(src: GGUFSource, profile: TargetProfile, req: ConvertRequest) -> tuple[str, Any]:
    """(the llama.cpp quantization asked for (``KEEP``: ship the file as it is), the target's [llm] section);
    refused where the target runs no language model, it would requantize without ``allow_requantize``, or
    llama.cpp's quantizer is not here."""
    llm = profile.llm
    if llm is None:
        raise TargetError(
            f"{src.path.name} is a GGUF language model; target {profile.name!r} has no [llm] section: it does not run them",
            hint="targets with one: see `edgekit targets --json` (llm != null)",
        )
    own = src.source_type
    if req.precision in (None, KEEP):
        quant = KEEP if src.prequantized or req.precision == KEEP else llm.default_precision
    else:
        quant = llm.check_precision(profile.name, req.precision)
    if quant == own and src.prequantized:
        quant = KEEP
    if quant != KEEP and src.prequantized and not req.allow_requantize:
        raise PrecisionError(
            f"{src.path.name} is already quantized ({own}); requantizing it to {quant} loses "
            "quality twice, so llama.cpp refuses it unless asked",
            hint=f"ship it as it is with --precision {KEEP} (the default for a quantized GGUF), or "
            f"pass --allow-requantize to requantize (gated against the {own} source)",
        )
    steps = () if quant == KEEP else (ChainStep("gguf->gguf"),)
    missing = conversion_problems(profile, chain=steps)
    if missing:
        raise MissingDependencyError(f"cannot quantize GGUF for {profile.name} on this host: " + "; ".join(missing))
    return quant, llm


def _quantize_llm(src: GGUFSource, quant: str, artifact: Path, work: Path, say: Step) -> list[dict[str, Any]]:
    """``artifact``: the source as it is (``KEEP``), else quantized to ``quant`` by llama.cpp; the chain record."""
    from edge.backends.converter import CONVERTERS

    own = src.source_type
    if quant == KEEP:
        say(f"shipping {src.path.name} as it is ({own})")
        shutil.copyfile(src.path, artifact)
        return []
    conv = CONVERTERS.get("gguf->gguf")
    say(f"quantizing {own} to {quant} with llama.cpp" + (" (requantizing)" if src.prequantized else ""))
    result = conv().convert(
        ConversionRequest(
            source=src.path,
            workdir=work,
            precision=quant,
            io=IOSpec((), ()),
            options={"allow_requantize": bool(src.prequantized)},
        )
    )
    shutil.move(str(result.artifact), artifact)
    return [
        {
            "converter": conv.name,
            "precision": quant,
            "output_format": "gguf",
            "tool_versions": result.tool_versions,
            "details": result.details,
            "notes": fit_notes(result.notes),
        }
    ]


def _llm_gate(
    src: GGUFSource, llm: Any, quant: str, artifact: Path, stage: Path, text: Any, say: Step
) -> tuple[Any, dict[str, Any]]:
    """(the quality report, None when the source ships as it is; the reference pairs written for the device)."""
    from edge.backends.llamacpp.runtime import llama_cpp_version
    from edge.llm.quality import compare_gguf, reference_samples
    from edge.verify.refpairs import write_llm_reference_pairs

    own = src.source_type
    runtime = f"llama-cpp-python {llama_cpp_version()} on the build host's CPU"
    if quant == KEEP:
        say("checking that llama.cpp loads it")
        _check_loads(artifact)
        say(f"reference samples for the device: {own} itself on {text.describe()}")
        return None, write_llm_reference_pairs(
            stage,
            reference_samples(artifact, text, llm.options),
            precision=own,
            reference=f"the shipped {own} GGUF itself, {runtime}",
        )
    say(
        f"quality gate: KL and top-1 against the {own} source on {len(text.windows)} windows ({text.tokens} tokens) of {text.describe()}"
    )
    report = compare_gguf(src.path, artifact, quant, text, llm.options)
    return report, write_llm_reference_pairs(
        stage,
        report.reference_samples,
        precision=quant,
        reference=f"the {own} source GGUF, {runtime}; positions where the build host's {quant} agrees with it on top-1",
        note=report.reference_note,
    )


def _check_loads(path: Path) -> None:
    """llama.cpp loads the file and evaluates two tokens: a truncated or corrupt GGUF stops here."""
    from edge.backends.llamacpp.run import LlamaCppRunner

    try:
        with LlamaCppRunner(path, options={"n_ctx": 64}) as r:
            r.infer({"tokens": np.asarray([1, 2], dtype=np.int32)})
    except (ModelError, MissingDependencyError):
        raise
    except Exception as e:  # noqa: BLE001 - llama.cpp's own error: the file is unusable
        raise ModelError(f"llama.cpp could not run {path.name}: {type(e).__name__}: {str(e)[:200]}") from None
