"""No traceback from any fuzzed model (issue #23, class 3, "Done when").

Malformed and odd model files (``tests/support/fuzz_models.py``: truncated ONNX/TFLite/GGUF, random bytes behind
the right magic, a ModelProto without a graph, an op from an unknown domain, 0/negative/huge dims, no
inputs, no outputs, string tensors, a cycle, nested Ifs, external data outside the folder, TFLite buffers
and indices out of range...) and seeded byte-flip mutants of a valid ONNX and TFLite go through
``edgekit convert`` (``--explain`` too), ``bench`` and ``verify`` in-process (typer's CliRunner). Each
ends in exit 0 or in exit 2 with one line naming the file; never a traceback, never exit 1 or 3.

The default run takes every case on x86-cpu plus a few mutants (a few seconds); ``-m corpus_full`` adds
intel-igpu and arm-xnnpack, ``verify`` (emulated aarch64) and a hundred mutants per format.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from edge.cli import app
from edge.errors import save_traceback
from tests.support import fuzz_models

SEED = 23
FULL = pytest.mark.corpus_full
#: the default run's mutants per format; -m corpus_full runs MUTANTS_FULL
MUTANTS_CI, MUTANTS_FULL = 4, 100


def cli(*argv: str) -> Any:
    return CliRunner().invoke(app, list(argv), catch_exceptions=True)


def assert_clean(r: Any, path: Path, what: str) -> None:
    """Exit 0, or exit 2 with exactly one stderr line that names ``path``; never a traceback or exit 1/3."""
    assert r.exception is None or isinstance(r.exception, SystemExit), f"{what}: uncaught {r.exception!r}"
    assert "Traceback" not in r.output, f"{what}: {r.output}"
    assert r.exit_code in (0, 2), f"{what}: exit {r.exit_code}: {r.stderr.strip()}"
    if r.exit_code == 2:
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, f"{what}: want one line, got {lines}"
        assert path.name in lines[0], f"{what}: the line does not name {path.name}: {lines[0]}"


@pytest.fixture(autouse=True)
def crash_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEKIT_LOG_DIR", str(tmp_path / "crashes"))
    monkeypatch.setenv("COLUMNS", "300")


def build(name: str, d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    return fuzz_models.ALL[name](d, np.random.default_rng(SEED))


def convert_then_use(path: Path, target: str, out: Path, *, verify: bool) -> int:
    """convert --explain, convert; on success bench (and verify) the bundle. Returns convert's exit code."""
    assert_clean(cli("convert", str(path), "-t", target, "--explain"), path, f"convert --explain -t {target}")
    r = cli("convert", str(path), "-t", target, "-o", str(out))
    assert_clean(r, path, f"convert -t {target}")
    if r.exit_code == 0:
        assert_clean(cli("bench", str(out), "-n", "3", "--warmup", "1"), out, f"bench of the {target} bundle")
        if verify:
            assert_clean(cli("verify", str(out), "--no-record"), out, f"verify of the {target} bundle")
    return int(r.exit_code)


#: cases that are valid models: they must convert on x86-cpu (a harness that refuses everything passes nothing)
MUST_CONVERT = {"valid_conv", "onnx_no_inputs", "onnx_nested_subgraphs", "onnx_rank_zero", "tflite_valid"}


#: x86-cpu takes a valid .tflite through tf2onnx in its toolchain (seconds): that one under corpus_full
CASES = [
    pytest.param(n, t, marks=FULL) if (t != "x86-cpu" or n == "tflite_valid") else pytest.param(n, t)
    for n in sorted(fuzz_models.ALL)
    for t in ("x86-cpu", "intel-igpu", "arm-xnnpack")
]


@pytest.mark.parametrize("name, target", CASES)
def test_fuzzed_model_converts_or_is_refused_in_one_line(name: str, target: str, tmp_path: Path) -> None:
    path = build(name, tmp_path / "in")
    code = convert_then_use(path, target, tmp_path / f"{name}-bundle", verify=target == "arm-xnnpack")
    if target == "x86-cpu" and name in MUST_CONVERT:
        assert code == 0, f"{name} is a valid model and must convert on x86-cpu"
    assert not (tmp_path / "crashes").exists(), "an internal error was logged"


def test_a_junk_openvino_ir_says_why_not_where(tmp_path: Path) -> None:
    """OpenVINO's message starts with lines naming its own source files; the refusal keeps the reason."""
    path = build("xml_junk", tmp_path / "in")
    r = cli("convert", str(path), "-t", "intel-igpu", "--explain")
    assert_clean(r, path, "convert --explain")
    assert r.exit_code == 2 and "Unable to read the model" in r.stderr and "core.cpp" not in r.stderr, r.stderr


@pytest.mark.parametrize("name", ["onnx_truncated", "tflite_bogus_buffer_offset", "gguf_random_magic", "valid_conv"])
def test_bench_and_verify_given_a_model_file_instead_of_a_bundle(name: str, tmp_path: Path) -> None:
    path = build(name, tmp_path / "in")
    for cmd in ("bench", "verify", "run"):
        r = cli(cmd, str(path))
        assert_clean(r, path, cmd)
        assert r.exit_code == 2, f"{cmd} of a model file passed"


def _tamper(bundle: Path, data: bytes) -> None:
    """The bundle's primary artifact replaced by ``data``, its hash and size updated: hash-consistent, unsigned."""
    import hashlib

    m = json.loads((bundle / "manifest.json").read_text())
    art = next(a for a in m["artifacts"] if a["path"] == m["primary_artifact"])
    (bundle / art["path"]).write_bytes(data)
    art.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    (bundle / "manifest.json").write_text(json.dumps(m))


@pytest.fixture(scope="module")
def base_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("base")
    out = d / "bundle"
    r = cli("convert", str(fuzz_models.valid_conv(d, np.random.default_rng(SEED))), "-t", "x86-cpu", "-o", str(out))
    assert r.exit_code == 0, r.output
    return out


TAMPER = ["onnx_truncated", "onnx_random_bytes", "onnx_no_graph", "onnx_unknown_domain", "onnx_cycle"]


@pytest.mark.parametrize(
    "name", [*TAMPER[:2], *(pytest.param(n, marks=FULL) for n in TAMPER[2:] + ["onnx_external_outside", "valid_conv"])]
)
def test_a_bundle_carrying_a_fuzzed_model_is_refused_by_bench_run_and_verify(
    name: str, base_bundle: Path, tmp_path: Path
) -> None:
    """A hash-consistent bundle whose model is malformed (built by hand, or by another tool): the runner's
    refusal is one line, exit 2."""
    bundle = tmp_path / "tampered-bundle"
    shutil.copytree(base_bundle, bundle)
    _tamper(bundle, build(name, tmp_path / "in").read_bytes())
    for argv in (["bench", "-n", "3"], ["run", "--synthetic", "16x16", "--max-frames", "2"]):
        assert_clean(cli(argv[0], str(bundle), *argv[1:]), bundle, argv[0])
    if name != "valid_conv":
        r = cli("bench", str(bundle), "-n", "3")
        assert r.exit_code == 2, r.output


def _mutants(kind: str, count: int, d: Path) -> list[Path]:
    """``count`` seeded mutants of the valid ONNX or TFLite: 1 to 3 bytes overwritten each."""
    base = (fuzz_models.valid_conv if kind == "onnx" else fuzz_models.tflite_valid)(d, np.random.default_rng(SEED))
    data = base.read_bytes()
    out = []
    for i in range(count):
        rng = np.random.default_rng([SEED, i])
        m = bytearray(data)
        for _ in range(int(rng.integers(1, 4))):
            m[int(rng.integers(0, len(m)))] = int(rng.integers(0, 256))
        p = d / f"mutant{i:03d}{base.suffix}"
        p.write_bytes(bytes(m))
        out.append(p)
    return out


@pytest.mark.parametrize(
    "kind, count, explain_only",
    [
        ("onnx", MUTANTS_CI, False),
        ("tflite", MUTANTS_CI, True),  # LiteRT reads each one; a mutant that still converts takes seconds (tf2onnx)
        *(pytest.param(k, MUTANTS_FULL, False, marks=FULL) for k in ("onnx", "tflite")),
    ],
)
def test_byte_flipped_models(kind: str, count: int, explain_only: bool, tmp_path: Path) -> None:
    for p in _mutants(kind, count, tmp_path):
        if explain_only:
            assert_clean(cli("convert", str(p), "-t", "x86-cpu", "--explain"), p, "convert --explain")
        else:
            convert_then_use(p, "x86-cpu", tmp_path / f"out-{p.stem}", verify=False)
    assert not (tmp_path / "crashes").exists()


def test_two_internal_errors_in_one_second_get_two_logs(tmp_path: Path) -> None:
    """One process failing twice within a second (the agent, an in-process test run) kept only the first
    traceback: the second name existed, the fallback dir got it, the third was lost."""
    paths = [save_traceback("convert", RuntimeError(str(i))) for i in range(3)]
    assert all(p is not None and p.parent == tmp_path / "crashes" for p in paths), paths
    assert len({p for p in paths}) == 3
    assert [re.search(r"RuntimeError: (\d)", p.read_text()).group(1) for p in paths if p] == ["0", "1", "2"]  # type: ignore[union-attr]


#: the other commands that read a model file: deploy and tune (convert first), firmware c-array (a .tflite)
OTHER_COMMANDS = [n for n in sorted(fuzz_models.ALL) if n not in MUST_CONVERT]


@pytest.mark.parametrize(
    "name", [n if i % 4 == 0 else pytest.param(n, marks=FULL) for i, n in enumerate(OTHER_COMMANDS)]
)
def test_deploy_tune_and_c_array_refuse_fuzzed_models_in_one_line(name: str, tmp_path: Path) -> None:
    path = build(name, tmp_path / "in")
    r = cli("deploy", str(path), "-t", "x86-cpu", "-d", str(tmp_path / "device"))
    assert_clean(r, path, "deploy")
    r = cli("tune", str(path), "-t", "x86-cpu", "--out", str(tmp_path / "tuned"), "--max-trials", "1")
    assert_clean(r, path, "tune")
    if path.suffix == ".tflite":
        assert_clean(cli("firmware", "c-array", str(path), "-o", str(tmp_path / "m.cc")), path, "firmware c-array")
    assert not (tmp_path / "crashes").exists()
