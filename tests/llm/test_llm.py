"""GGUF bundles end to end with the real llama.cpp: quantize, quality gate, runner, benchmark, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edge.backends.llamacpp.samples import LlamaShape, build_tiny_llama
from edge.errors import ConversionError, EdgeError, HardwareUnavailableError, InputFileError, ModelError, ParityError
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest
from tests.support.cli import assert_user_error, run_cli

pytest.importorskip("llama_cpp", reason="llama-cpp-python missing: pip install 'edgekit-ml[llm]'")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("llm") / "tiny-f16.gguf")


@pytest.mark.parametrize("quant", ["f16", "q8_0"])
def test_quantize_and_gate(tiny_gguf: Path, tmp_path: Path, quant: str) -> None:
    b = convert(tiny_gguf, "x86-cpu", tmp_path / "b", ConvertRequest(precision=quant))
    m = b.manifest
    assert b.kind == "llm" and m["format"] == "gguf" and m["precision"] == quant
    d = m["chain"][0]["details"]
    assert d["quant_type"] == quant and d["parameters"] == m["source"]["parameters"] > 1_000_000
    assert d["dominant_type"] == {"f16": "F16", "q8_0": "Q8_0"}[quant]
    assert d["bytes"] < d["source_bytes"] or quant == "f16"
    assert "llama-cpp-python" in m["chain"][0]["tool_versions"]
    gate = m["parity"]
    # the built-in text in the model's own tokens: 8 windows of 128 (tests/llm/test_llm_quality.py)
    assert gate["passed"] and gate["tokens"] == 1024 and gate["eval"]["origin"] == "built-in", gate
    assert 0 <= gate["kl_mean"] <= gate["thresholds"]["max_kl_mean"]


def test_failing_quant_stops_and_accepted_one_runs(tiny_gguf: Path, tmp_path: Path) -> None:
    # random weights amplify quantization error (docs/llm.md): q4_0 fails the gate here, on text as on
    # random ids (a random-weight model does not know text: measured q4_0 KL 0.17 / top-1 70% on both)
    with pytest.raises(ParityError, match="quality gate failed for q4_0"):
        convert(tiny_gguf, "x86-cpu", tmp_path / "q4", ConvertRequest(precision="q4_0"))
    assert not (tmp_path / "q4").exists()
    b = convert(tiny_gguf, "x86-cpu", tmp_path / "q4", ConvertRequest(precision="q4_k_m", accept_parity_failure=True))
    # q4_k_m fails the gate on this model too (docs/llm.md: q4 types fail on random weights), clearly on top-1
    # agreement (measured 77% on the built-in text, 75% on random ids, against the 85% floor; its mean KL
    # sits near the 0.10 limit, so it is not asserted either way). Accepting the failure keeps the bundle
    # and records it as accepted.
    gate = b.manifest["parity"]
    assert gate["quant"] == "q4_k_m" and gate["tokens"] == 1024
    assert gate["thresholds"] == {"max_kl_mean": 0.10, "min_top1": 0.85}
    assert gate["top1"] < gate["thresholds"]["min_top1"] and gate["kl_mean"] > 0, gate
    assert gate["passed"] is False and gate["accepted_failure"] is True, gate
    assert (tmp_path / "q4" / "manifest.json").is_file()
    # a quantized model through a multi-token prompt batch: the path that crashed on AMX. Run it in a
    # subprocess so a regression shows as a failed test, not a dead test runner.
    p = run_cli("bench", str(b.path), "--prompt-tokens", "64", "--gen-tokens", "8", "-r", "1", "--json")
    assert p.returncode == 0, (p.returncode, p.stderr[-500:])
    r = json.loads(p.stdout)
    assert r["runner"]["precision_used"] == "q4_k" and r["prompt_tps"]["mean"] > 0 and r["gen_tps"]["mean"] > 0


def test_runner_infer_generate_and_context(tiny_gguf: Path, tmp_path: Path) -> None:
    b = convert(tiny_gguf, "x86-cpu", tmp_path / "b", ConvertRequest(precision="q8_0"))
    with b.open_runner({"n_ctx": 128}) as r:
        y = r.infer({"tokens": np.arange(3, 40)})
        assert y["logits"].shape == (r.n_vocab,) and np.isfinite(y["logits"]).all()
        text = "".join(r.generate("the cat", max_tokens=8))
        assert isinstance(text, str) and text
        assert r.info.device_used == "CPU" and r.info.precision_used == "q8_0"
    with b.open_runner({"n_ctx": 100_000}) as r:  # past the trained context: the trained one, said (#26)
        assert r.info.details["n_ctx"] == 2048 and "trained context 2048: using 2048" in r.info.details["n_ctx_note"]


def test_a_profile_context_past_the_models_is_the_models_with_a_note(tmp_path: Path) -> None:
    """#26 item 16: the target's n_ctx (2048) exceeds this model's trained context (256): bench runs on 256 and
    says so, instead of failing."""
    short = build_tiny_llama(tmp_path / "short.gguf", LlamaShape(n_ctx=256))
    out = tmp_path / "b"
    assert run_cli("convert", str(short), "-t", "x86-cpu", "-p", "q8_0", "-o", str(out)).returncode == 0
    p = run_cli("bench", str(out), "--gen-tokens", "4", "-r", "1", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["runner"]["details"]["n_ctx"] <= 256
    assert "note: n_ctx 2048 is longer than model.gguf's trained context 256: using 256" in p.stderr, p.stderr


def test_gpu_targets_never_fall_back_silently(tiny_gguf: Path, tmp_path: Path) -> None:
    import llama_cpp

    if llama_cpp.llama_supports_gpu_offload():
        pytest.skip("hardware: GPU present: this llama.cpp build has a GPU backend")
    jetson = convert(tiny_gguf, "jetson-orin", tmp_path / "j", ConvertRequest(precision="q8_0"))
    with pytest.raises(HardwareUnavailableError, match="no GPU backend"):
        jetson.open_runner()
    mac = convert(tiny_gguf, "apple-ane", tmp_path / "m", ConvertRequest(precision="q8_0"))
    with mac.open_runner() as r:
        assert r.info.device_requested == "GPU" and r.info.device_used == "CPU" and "no GPU backend" in r.info.fallback


def test_bad_gguf_inputs(tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"NOPE" + b"\0" * 100)
    with pytest.raises(InputFileError, match="is not a GGUF file"):
        convert(junk, "x86-cpu", tmp_path / "o")
    narrow = build_tiny_llama(tmp_path / "narrow.gguf", LlamaShape(n_embd=48, n_head=2, n_head_kv=2, n_ff=96))
    with pytest.raises(ModelError, match=r"q4_0 needs row widths divisible by 32; not so for .*\(row width 48\)"):
        convert(narrow, "x86-cpu", tmp_path / "o", ConvertRequest(precision="q4_0"))
    with pytest.raises(EdgeError, match="does not allow LLM precision 'q3_k'"):
        convert(narrow, "x86-cpu", tmp_path / "o", ConvertRequest(precision="q3_k"))
    with pytest.raises(EdgeError, match="no \\[llm\\] section"):
        convert(narrow, "intel-igpu", tmp_path / "o")


def test_unknown_architecture_is_named(tmp_path: Path) -> None:
    src = build_tiny_llama(tmp_path / "t.gguf")
    data = (
        src.read_bytes()
        .replace(b"llama.", b"zzzzz.")
        .replace(b"\x05\x00\x00\x00\x00\x00\x00\x00llama", b"\x05\x00\x00\x00\x00\x00\x00\x00zzzzz")
    )
    odd = tmp_path / "odd.gguf"
    odd.write_bytes(data)
    with pytest.raises(ConversionError, match="zzzzz"):
        convert(odd, "x86-cpu", tmp_path / "o", ConvertRequest(precision="q8_0"))


def test_cli_errors_and_budget(tiny_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "b"
    assert run_cli("convert", str(tiny_gguf), "-t", "x86-cpu", "-p", "q8_0", "-o", str(out)).returncode == 0
    p = run_cli("bench", str(out), "--gen-tokens", "4", "-r", "1", "--min-tps", "1e12")
    assert p.returncode == 1 and "fail" in p.stdout
    p = run_cli("run", str(out), "--prompt", "the cat", "--max-tokens", "8", "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["pieces"] >= 1 and isinstance(r["text"], str) and r["runner"]["precision_used"] == "q8_0"
    assert_user_error(run_cli("run", str(out)), "is a language model: give --prompt")
    assert_user_error(
        run_cli("convert", str(tiny_gguf), "-t", "x86-cpu", "-p", "q4_0", "-o", str(tmp_path / "x")),
        "quality gate failed for q4_0",
    )
