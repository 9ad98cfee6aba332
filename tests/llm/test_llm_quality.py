"""The LLM quality gate on real text (issue 13) and llm bundles' reference pairs checked on load (issue 12).

The gate evaluates the package's public-domain text tokenized by each model's own tokenizer; a model
whose tokenizer cannot tokenize text is evaluated on random ids, and the record says so. A bundle
carries token prefixes with the source's top-k next-token log-probabilities; the device's llama.cpp
runner reproduces them on first load. Perturbed references are re-hashed, so verification passes
and only the check can catch them.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from edge.backends.llamacpp.samples import build_tiny_llama
from edge.base.typedjson import write_json_atomic
from edge.bundle.bundle import MANIFEST, SIGNATURE, Bundle, artifact_entries
from edge.errors import EdgeError, InputFileError, ModelError
from edge.llm.evaltext import BUILTIN_TEXTS, MAX_WINDOWS, WINDOW_TOKENS, builtin_texts, eval_windows
from edge.llm.quality import THRESHOLDS, TopKSample, log_softmax, top_k, topk_figures
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest
from edge.verify.refpairs import (
    REFERENCE_FILE,
    check_bundle,
    check_on_load,
    check_reference_pairs,
    describe,
    open_checked,
    write_reference_pairs,
)
from tests.support.cli import assert_user_error, run_cli

pytest.importorskip("llama_cpp", reason="llama-cpp-python missing: pip install 'edgekit-ml[llm]'")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("llmq") / "tiny-f16.gguf")


@pytest.fixture(scope="module")
def q8(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return convert(tiny, "x86-cpu", tmp_path_factory.mktemp("q8") / "b", ConvertRequest(precision="q8_0"))


# -- the text -----------------------------------------------------------------------------------------


def test_builtin_texts_ship_with_their_provenance() -> None:
    texts = builtin_texts()
    assert tuple(texts) == BUILTIN_TEXTS == ("en", "de", "fr", "es", "code")
    assert all(1000 <= len(t.encode()) <= 4000 for t in texts.values()), {k: len(v) for k, v in texts.items()}
    # each is the language it says: letters only that language uses
    assert "Träumen" in texts["de"] and "mœurs" in texts["fr"] and "año" in texts["es"] and "def " in texts["code"]
    sources = (resources.files("edge.llm") / "eval" / "SOURCES.md").read_text(encoding="utf-8")
    for name in BUILTIN_TEXTS:
        assert f"{name}.txt" in sources
    for work, ebook in (
        ("Pride and Prejudice", "#1342"),
        ("Die Verwandlung", "#22367"),
        ("Candide", "#4650"),
        ("Don Quijote", "#2000"),
    ):
        assert work in sources and ebook in sources
    assert sources.count("public domain") >= 4 and "Apache-2.0" in sources


def test_windows_are_the_text_in_the_models_own_tokens(tiny: Path) -> None:
    import llama_cpp

    text = eval_windows(tiny, 1024)
    assert text.origin == "built-in" and text.note is None and len(text.windows) == MAX_WINDOWS
    # round-robin: every text is evaluated, in order, before any gets a second window
    assert [w.text for w in text.windows[:5]] == list(BUILTIN_TEXTS)
    assert all(len(w.tokens) == WINDOW_TOKENS and w.tokens[0] == 1 for w in text.windows)  # BOS first
    assert text.tokens == MAX_WINDOWS * WINDOW_TOKENS
    assert set(text.sha256) == set(BUILTIN_TEXTS)
    assert text.sha256["de"] == hashlib.sha256(builtin_texts()["de"].encode()).hexdigest()
    # llama.cpp reads the windows back as the text (the tiny vocabulary spells spaces as U+2581)
    vocab = llama_cpp.Llama(str(tiny), vocab_only=True, verbose=False)
    try:
        for w in text.windows[:5]:
            back = vocab.detokenize(list(w.tokens[1:])).decode("utf-8", "replace").replace("\u2581", " ").strip()
            assert back[:60].rsplit(" ", 1)[0] in builtin_texts()[w.text], (w.text, back[:80])
        second = text.windows[5]  # English again, where its first window ended
        assert second.text == "en" and second.start == WINDOW_TOKENS - 1
    finally:
        vocab.close()


def test_gate_records_the_text_and_figures_per_text(q8: Bundle) -> None:
    gate = q8.manifest["parity"]
    ev = gate["eval"]
    assert ev["origin"] == "built-in" and ev["windows"] == MAX_WINDOWS and ev["window_tokens"] == WINDOW_TOKENS
    assert "tokenized by the model's own tokenizer" in ev["description"] and ev["note"] is None
    assert [t["name"] for t in ev["texts"]] == list(BUILTIN_TEXTS)
    assert sum(t["tokens"] for t in ev["texts"]) == gate["tokens"] == MAX_WINDOWS * WINDOW_TOKENS
    assert all(len(t["sha256"]) == 64 and 0 <= t["kl_mean"] <= 0.01 and t["top1"] >= 0.9 for t in ev["texts"]), ev
    assert gate["passed"] and gate["kl_mean"] <= 0.01 and gate["top1"] >= 0.95, gate
    assert q8.info.parity.eval.texts[0].name == "en"  # the typed manifest reads it


def test_user_eval_text(tiny: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine.txt"
    mine.write_text("The quick brown fox jumps over the lazy dog near the riverbank. " * 40, encoding="utf-8")
    out = tmp_path / "b"
    p = run_cli("convert", str(tiny), "-t", "x86-cpu", "-p", "q8_0", "-o", str(out), "--eval-text", str(mine), "--json")
    assert p.returncode == 0, p.stderr[-800:]
    gate = Bundle.open(out, trust=False).manifest["parity"]
    ev = gate["eval"]
    assert ev["origin"] == "file" and "the file mine.txt" in ev["description"], ev
    assert [t["name"] for t in ev["texts"]] == ["mine.txt"] and ev["windows"] == ev["texts"][0]["windows"] >= 2
    assert ev["texts"][0]["sha256"] == hashlib.sha256(mine.read_bytes()).hexdigest()
    # errors name the file and stop before any work
    assert_user_error(
        run_cli(
            "convert",
            str(tiny),
            "-t",
            "x86-cpu",
            "-p",
            "q8_0",
            "-o",
            str(tmp_path / "x"),
            "--eval-text",
            str(tmp_path / "absent.txt"),
        ),
        "absent.txt",
        "does not exist",
    )
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("Gr\xfc\xdfe aus K\xf6ln, ".encode("latin-1") * 20)
    with pytest.raises(InputFileError, match="latin1.txt is not UTF-8"):
        convert(tiny, "x86-cpu", tmp_path / "x", ConvertRequest(precision="q8_0", eval_text=latin1))
    short = tmp_path / "short.txt"
    short.write_text("hi", encoding="utf-8")
    with pytest.raises(InputFileError, match="short.txt gives .* tokens .* at least 16"):
        convert(tiny, "x86-cpu", tmp_path / "x", ConvertRequest(precision="q8_0", eval_text=short))
    assert not (tmp_path / "x").exists()


def test_model_without_a_usable_tokenizer_is_gated_on_random_ids_and_says_so(tmp_path: Path) -> None:
    none = build_tiny_llama(tmp_path / "none.gguf", vocab="none")
    b = convert(none, "x86-cpu", tmp_path / "b", ConvertRequest(precision="q8_0"))
    gate = b.manifest["parity"]
    ev = gate["eval"]
    assert ev["origin"] == "random" and gate["tokens"] == 256, gate
    assert ev["description"].startswith("random token ids: the model's tokenizer could not tokenize text: "), ev
    assert "no tokenizer" in ev["note"] and [t["name"] for t in ev["texts"]] == ["random"]
    # its reference pairs come from the random windows and pass on this host
    with b.open_runner() as r:
        assert check_reference_pairs(b, r)["passed"] is True
    # a vocabulary that crashes llama.cpp's tokenizer (no byte tokens) ends a subprocess, not convert
    dummy = build_tiny_llama(tmp_path / "dummy.gguf", vocab="dummy")
    text = eval_windows(dummy, 1024)
    assert text.origin == "random" and "crashed" in text.note, text.note
    # the user's own text on such a model is an error: the user asked for that text
    mine = tmp_path / "mine.txt"
    mine.write_text("plain words " * 50, encoding="utf-8")
    with pytest.raises(ModelError, match="none.gguf on mine.txt: the model's tokenizer could not tokenize text"):
        convert(none, "x86-cpu", tmp_path / "x", ConvertRequest(precision="q8_0", eval_text=mine))


def test_eval_text_is_for_gguf_only(models: dict[str, Path], tmp_path: Path) -> None:
    mine = tmp_path / "mine.txt"
    mine.write_text("plain words " * 50, encoding="utf-8")
    onnx = models["tiny"]
    with pytest.raises(EdgeError, match="--eval-text"):
        convert(onnx, "x86-cpu", tmp_path / "x", ConvertRequest(precision="fp32", eval_text=mine))


# -- the KL estimate the device uses --------------------------------------------------------------------


def test_topk_kl_estimate_is_a_lower_bound_that_sees_a_wrong_model() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        ref = rng.standard_normal(512) * 3
        ids, lps = top_k(log_softmax(ref[None])[0], 8)
        sample = TopKSample(np.arange(4, dtype=np.int32), ids, lps)
        assert list(ids) == list(np.argsort(-ref)[:8]) and (np.diff(lps) <= 0).all()
        kl, agree = topk_figures(sample, ref)
        assert agree and kl < 1e-9
        near = ref + rng.standard_normal(512) * 0.3
        p, q = log_softmax(ref[None])[0], log_softmax(near[None])[0]
        full = float((np.exp(p) * (p - q)).sum())
        est, _ = topk_figures(sample, near)
        assert 0 <= est <= full + 1e-9
        wrong = rng.permutation(ref)
        est_wrong, _ = topk_figures(sample, wrong)
        assert est_wrong > 10 * max(est, 1e-3)


# -- reference pairs: written by convert, checked by the device's runner ------------------------------


def rebuild(
    src: Bundle,
    dest: Path,
    edit: Callable[[dict[str, np.ndarray]], None] | None = None,
    manifest_edit: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """A copy of ``src`` whose reference.npz arrays ``edit`` changed, re-hashed so it verifies."""
    shutil.copytree(src.path, dest)
    (dest / SIGNATURE).unlink(missing_ok=True)
    manifest = json.loads((dest / MANIFEST).read_text())
    if edit is not None:
        with np.load(dest / REFERENCE_FILE, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        edit(arrays)
        (dest / REFERENCE_FILE).unlink()
        with open(dest / REFERENCE_FILE, "xb") as f:
            np.savez(f, **arrays)
    if manifest_edit is not None:
        manifest_edit(manifest)
    manifest["artifacts"] = artifact_entries(dest, [f for f in dest.rglob("*") if f.is_file() and f.name != MANIFEST])
    write_json_atomic(dest / MANIFEST, manifest)
    return dest


def outputs_of(arrays: dict[str, np.ndarray]) -> list[str]:
    return sorted(k for k in arrays if k.startswith("o"))


def test_reference_pairs_are_written_and_pass_where_the_bundle_runs(q8: Bundle) -> None:
    entry = q8.manifest["reference_pairs"]
    assert entry["file"] == REFERENCE_FILE and entry["samples"] == 8
    assert entry["thresholds"] == {"max_kl_mean": THRESHOLDS["q8_0"][0], "min_top1": THRESHOLDS["q8_0"][1]}
    assert "f16 source" in entry["reference"] and REFERENCE_FILE in {a["path"] for a in q8.manifest["artifacts"]}
    # what the host's quantized model gave on the samples, to read the device's figures against
    assert entry["note"].startswith("the build host's q8_0 on these samples: mean KL over the top-8 "), entry
    assert entry["note"].endswith("top-1 8/8"), entry
    assert (q8.path / REFERENCE_FILE).stat().st_size < 64 << 10  # small: token prefixes and top-8 per sample
    with open_checked(q8, mode=True) as r:
        check = r.info.details["reference_check"]
    assert check["passed"] is True and check["samples"] == 8 and check["failures"] == [], check
    out = check["outputs"][0]
    assert out["name"] == "logits" and out["top1"] == 1.0 and 0 <= out["kl_topk_mean"] <= THRESHOLDS["q8_0"][0], out
    assert check["thresholds"] == entry["thresholds"]


def test_perturbed_top_ids_fail_the_check(q8: Bundle, tmp_path: Path) -> None:
    def roll(arrays: dict[str, np.ndarray]) -> None:  # the second most likely token claimed as the first
        for k in outputs_of(arrays):
            if k.endswith("_0"):
                arrays[k] = np.roll(arrays[k], 1)

    bad = Bundle.open(rebuild(q8, tmp_path / "bad", roll), trust=False)
    bad.verify()  # hashes match: verification cannot see it
    with bad.open_runner() as r:
        check = check_on_load(bad, r, mode=True)
    assert check["passed"] is False and check["outputs"][0]["top1"] == 0.0, check
    assert any("top-1 agreement 0.0% < 95%" in f for f in check["failures"]), check["failures"]
    assert "reference check failed" in (describe(check) or "")
    # what `edgekit run`/`bench` and the agent call: a runner of its own, the same verdict
    again = check_bundle(bad, mode=True)
    assert again["passed"] is False and again["runner"]["runtime"].startswith("llama-cpp-python"), again


def test_perturbed_probabilities_fail_on_kl_alone(q8: Bundle, tmp_path: Path) -> None:
    def flatten(arrays: dict[str, np.ndarray]) -> None:  # same ids, but the reference claims a flat top-8
        for k in outputs_of(arrays):
            if k.endswith("_1"):
                arrays[k] = np.full_like(arrays[k], np.log(1 / arrays[k].size) - 1e-4)

    bad = Bundle.open(rebuild(q8, tmp_path / "flat", flatten), trust=False)
    with bad.open_runner() as r:
        check = check_reference_pairs(bad, r)
    assert check["passed"] is False and check["outputs"][0]["top1"] == 1.0, check
    assert [f for f in check["failures"] if "mean KL over the reference's top-8" in f], check["failures"]


def test_crafted_reference_is_a_failed_check_not_a_crash(q8: Bundle, tmp_path: Path) -> None:
    def positive(arrays: dict[str, np.ndarray]) -> None:
        arrays["o0_1"] = np.abs(arrays["o0_1"]) + 1.0  # "log-probabilities" above 0
        arrays["o1_0"] = np.full_like(arrays["o1_0"], 10**6)  # ids outside the vocabulary

    bad = Bundle.open(rebuild(q8, tmp_path / "crafted", positive), trust=False)
    with bad.open_runner() as r:
        check = check_on_load(bad, r, mode=True)
    assert check["passed"] is False and "reference pairs unusable" in check["error"], check
    assert "sample 0: top_logprobs" in check["error"] and "sample 1: top_ids" in check["error"], check["error"]


def test_manifest_refuses_tensor_limits_on_llm_pairs(q8: Bundle, tmp_path: Path) -> None:
    def vision_limits(m: dict[str, Any]) -> None:
        m["reference_pairs"]["thresholds"] = {"min_cosine": 0.99, "min_top1": 0.9}

    with pytest.raises(EdgeError, match="reference_pairs.thresholds"):
        Bundle.open(rebuild(q8, tmp_path / "vis", manifest_edit=vision_limits), trust=False)


def test_shipped_gguf_carries_pairs_from_itself(tiny: Path, tmp_path: Path) -> None:
    q4 = convert(tiny, "x86-cpu", tmp_path / "q4", ConvertRequest(precision="q4_0", accept_parity_failure=True))
    src = Path(shutil.copyfile(q4.artifact, tmp_path / "tiny-q4_0.gguf"))
    b = convert(src, "x86-cpu", tmp_path / "keep")
    m = b.manifest
    assert m["chain"] == [] and m["parity"]["passed"] is None
    entry = m["reference_pairs"]
    assert entry["samples"] == 8 and "the shipped q4_0 GGUF itself" in entry["reference"], entry
    assert entry["thresholds"] == {"max_kl_mean": THRESHOLDS["q4_0"][0], "min_top1": THRESHOLDS["q4_0"][1]}
    with open_checked(b, mode=True) as r:
        check = r.info.details["reference_check"]
    # the device computes what the host did on the same file: the same top-1 everywhere, KL ~0
    assert check["passed"] is True and check["outputs"][0]["top1"] == 1.0, check
    assert check["outputs"][0]["kl_topk_mean"] < 1e-3, check


def test_write_reference_pairs_keeps_given_limits(tmp_path: Path) -> None:
    entry = write_reference_pairs(
        tmp_path,
        [{"tokens": np.arange(1, 5, dtype=np.int32)}],
        [{"top_ids": np.arange(8, dtype=np.int32), "top_logprobs": np.log(np.full(8, 0.1, np.float32))}],
        precision="q8_0",
        reference="test",
        samples=1,
        thresholds={"max_kl_mean": 0.01, "min_top1": 0.95},
    )
    assert entry["thresholds"] == {"max_kl_mean": 0.01, "min_top1": 0.95} and entry["samples"] == 1


def test_a_real_tokenizer_reads_the_text(tmp_path: Path) -> None:
    """SmolLM2-135M's own GPT-2-style BPE (examples/models, fetched by examples/fetch_pretrained.py):
    the windows are its tokens of the text, without a BOS since the model adds none."""
    import llama_cpp

    from tests.support.cli import REPO

    smol = REPO / "examples" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not smol.is_file():
        pytest.skip(f"{smol} missing: python examples/fetch_pretrained.py --model smollm2-135m")
    text = eval_windows(smol, 49152, context=8192)
    assert text.origin == "built-in" and len(text.windows) == MAX_WINDOWS and text.note is None
    vocab = llama_cpp.Llama(str(smol), vocab_only=True, verbose=False)
    try:
        for w in text.windows[:5]:
            assert len(w.tokens) == WINDOW_TOKENS and w.start == 0 and w.tokens[0] != vocab.token_bos()
            back = vocab.detokenize(list(w.tokens)).decode("utf-8")
            assert builtin_texts()[w.text].startswith(back), (w.text, back[:80])
    finally:
        vocab.close()
