"""``edgekit finish``: an uncompiled coral-edgetpu bundle compiled later, where edgetpu_compiler is.

The real compiler (x86-64 Linux, Coral's apt repository) cannot be installed here, so these tests run
``tests/support/edgetpu_standin.py``: same command line, same output files and log format, a compiled model
whose operators are one ``edgetpu-custom-op``. What is checked is edgekit's side: the bundle opened
and verified, the compiler's output hashed into a new bundle (id, artifacts, chain), the signature
handling, nothing lost on failure -- and that the real LiteRT runner treats the result as a compiled
Edge TPU model (it asks for libedgetpu instead of refusing an uncompiled model; its CPU fallback
runs the int8 model beside it).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge import toolchains
from edge.bundle.bundle import MANIFEST, Bundle, bundle_id
from edge.errors import BundleError, ConversionError, HardwareUnavailableError, MissingDependencyError
from tests.support import edgetpu_standin
from tests.support.cli import assert_user_error, run_cli

pytest.importorskip("ai_edge_litert", reason="ai-edge-litert is not installed (pip install 'edgekit-ml[litert]')")

from edge.backends.litert.edgetpu import finish_bundle  # noqa: E402
from edge.backends.litert.format import read_tflite  # noqa: E402
from edge.pipeline.request import ConvertRequest


@pytest.fixture(scope="module")
def uncompiled(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A coral-edgetpu bundle converted where no edgetpu_compiler is on PATH (the int8 model, uncompiled)."""
    st = toolchains.status("tflite")
    if not st.usable:
        pytest.skip(f"needs the tflite toolchain: {st.problem}")
    from edge.pipeline import convert

    out = tmp_path_factory.mktemp("coral") / "uncompiled"
    with pytest.MonkeyPatch.context() as mp:  # whatever this host has: no compiler on PATH
        mp.setenv(
            "PATH",
            os.pathsep.join(
                d
                for d in os.environ.get("PATH", "").split(os.pathsep)
                if d and not (Path(d) / "edgetpu_compiler").exists()
            ),
        )
        b = convert(models["tiny"], "coral-edgetpu", out, ConvertRequest(precision="int8", calib="random"))
    assert b.info.primary_artifact == "model.tflite" and not read_tflite(b.artifact).edgetpu_compiled
    return out


@pytest.fixture
def compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in edgetpu_compiler, alone on PATH (a real one on this host must not be what runs)."""
    exe = edgetpu_standin.install(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{exe.parent}:/usr/bin:/bin")
    monkeypatch.setenv("EDGETPU_STANDIN_ARGS", str(tmp_path / "compiler-args.txt"))
    monkeypatch.delenv("EDGETPU_STANDIN_FAIL", raising=False)
    monkeypatch.delenv("EDGEKIT_SIGN_KEY", raising=False)
    monkeypatch.delenv("EDGEKIT_TRUST_DIR", raising=False)
    return exe


def copy(bundle: Path, dest: Path) -> Path:
    shutil.copytree(bundle, dest)
    return dest


def _libedgetpu_loads() -> bool:
    from tests.backends.test_litert import _libedgetpu_loads as loads

    return loads()


def _feed(b: Bundle) -> dict[str, np.ndarray]:
    t = b.io.inputs[0]
    return {t.name: np.random.default_rng(3).standard_normal(tuple(t.shape)).astype(np.float32)}


def test_finish_compiles_rehashes_and_the_runner_takes_it(uncompiled: Path, compiler: Path, tmp_path: Path) -> None:
    src = Bundle.open(uncompiled)
    src_manifest = (uncompiled / MANIFEST).read_bytes()
    with pytest.raises(HardwareUnavailableError, match="not compiled for the Edge TPU"):
        src.open_runner()

    r = finish_bundle(uncompiled, tmp_path / "finished")
    b = Bundle.open(tmp_path / "finished")  # verified: exactly its files, every hash
    m = b.info
    assert r.bundle.id == b.id != src.id and r.source_id == src.id
    assert m.primary_artifact == "model_edgetpu.tflite" and m.format == "edgetpu-tflite"
    assert read_tflite(b.artifact).edgetpu_compiled
    assert {a.path for a in m.artifacts} == {a.path for a in src.info.artifacts} | {
        "model_edgetpu.tflite",
        "model_edgetpu.io.json",
        "model_edgetpu.log",
    }
    assert {"model.tflite", "model.io.json"} <= {a.path for a in src.info.artifacts}
    # the int8 model is carried over unchanged; the id follows edge.bundle.bundle's rule over the new artifacts
    assert {a.path: a.sha256 for a in m.artifacts}["model.tflite"] == {a.path: a.sha256 for a in src.info.artifacts}[
        "model.tflite"
    ]
    assert b.id == bundle_id("tiny", "coral-edgetpu", "int8", [a.sha256 for a in m.artifacts], m.runner.options_dict)
    assert json.loads((b.path / "model_edgetpu.io.json").read_text())["cpu_model"] == "model.tflite"
    step = m.chain[-1]
    assert len(m.chain) == len(src.info.chain) + 1
    assert step.converter == "tflite->edgetpu" and step.output_format == "edgetpu-tflite"
    assert step.tool_versions == {"edgetpu_compiler": edgetpu_standin.VERSION}
    d: Any = step.details
    n_ops = sum(r_["count"] for r_ in d["ops"])
    assert d["edgetpu_compiled"] and d["finished_from"] == src.id and d["tpu_ops"] == n_ops > 0 and d["cpu_ops"] == 0
    assert d["command"].startswith(f"{compiler} -s -o {tmp_path / 'finished'} ")
    assert any(f"{n_ops} op(s) on the Edge TPU" in n for n in step.notes)
    assert any(n.startswith("not signed: the source bundle was not signed") for n in r.notes)
    assert m.version is None and m.benchmark is None
    # the source bundle is untouched
    assert (uncompiled / MANIFEST).read_bytes() == src_manifest and Bundle.open(uncompiled).id == src.id

    # the real runner: a compiled model now, so it asks for the Edge TPU instead of refusing the model
    if not _libedgetpu_loads():
        with pytest.raises(HardwareUnavailableError, match="libedgetpu.so.1 could not be loaded") as e:
            b.open_runner()
        assert "not compiled" not in str(e.value)
    with b.open_runner({"allow_cpu_fallback": True}) as fin, src.open_runner({"allow_cpu_fallback": True}) as old:
        assert fin.info.details["edgetpu_compiled"] is True
        if fin.info.fallback is not None:  # no Edge TPU here: the int8 model beside it runs on the CPU
            assert "running model.tflite on the CPU" in fin.info.fallback
            np.testing.assert_array_equal(fin.infer(_feed(b))["logits"], old.infer(_feed(src))["logits"])


def test_converting_where_the_compiler_is_gives_the_same_layout(
    models: dict[str, Path], uncompiled: Path, compiler: Path, tmp_path: Path
) -> None:
    from edge.pipeline import convert

    b = convert(models["tiny"], "coral-edgetpu", tmp_path / "direct", ConvertRequest(precision="int8", calib="random"))
    d: Any = b.info.chain[-1].details
    assert b.info.primary_artifact == "model_edgetpu.tflite" and d["edgetpu_compiled"] and d["tpu_ops"] > 0
    assert d["finish_with"] is None and d["compiler_version"] == edgetpu_standin.VERSION
    finished = finish_bundle(uncompiled, tmp_path / "finished").bundle
    assert {a.path for a in b.info.artifacts} == {a.path for a in finished.info.artifacts}


def test_the_converter_names_edgekit_finish(uncompiled: Path) -> None:
    step: Any = Bundle.open(uncompiled).info.chain[-1]
    assert step.details["finish_with"] == f"edgekit finish {uncompiled}"
    assert any(f"`edgekit finish {uncompiled}`" in n for n in step.notes)


def test_in_place_signature_dropped_or_renewed(
    uncompiled: Path, compiler: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edge.bundle.bundle import sign_bundle
    from edge.bundle.signing import generate_key
    from edge.bundle.trust import TrustStore

    monkeypatch.setenv("EDGEKIT_KEYS_DIR", str(tmp_path / "keys"))
    generate_key("builder")
    signed_src = copy(uncompiled, tmp_path / "a")
    sign_bundle(signed_src, "builder")
    r = finish_bundle(signed_src)  # in place, no key: the old signature covered the old manifest
    assert r.bundle.path == signed_src and not (signed_src / "manifest.sig").exists()
    assert any("signature covered its old manifest and was dropped" in n for n in r.notes)
    assert not list(tmp_path.glob(".a.*"))  # no staging or old directory left beside it

    b = copy(uncompiled, tmp_path / "b")
    r = finish_bundle(b, key="builder")
    assert r.signed is not None and (b / "manifest.sig").is_file() and r.bundle.info.version == r.signed.version
    trust = TrustStore(tmp_path / "trust")
    trust.add_key((tmp_path / "keys" / "builder.pub").read_bytes(), "builder")
    assert Bundle.open(b, trust=trust.root).info.primary_artifact == "model_edgetpu.tflite"


def test_refusals_leave_everything_as_it_was(
    uncompiled: Path, compiler: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, models: dict[str, Path]
) -> None:
    from edge.pipeline import convert

    b = copy(uncompiled, tmp_path / "b")
    before = {p.name: p.read_bytes() for p in b.iterdir()}
    monkeypatch.setenv("EDGETPU_STANDIN_FAIL", "1")
    with pytest.raises(
        ConversionError, match=r"edgetpu_compiler failed on model.tflite \(exit 1\).*Compilation failed"
    ):
        finish_bundle(b)
    monkeypatch.delenv("EDGETPU_STANDIN_FAIL")
    assert {p.name: p.read_bytes() for p in b.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["b", "bin", "compiler-args.txt"])  # no partial dirs

    with pytest.raises(
        MissingDependencyError, match=r"edgetpu_compiler is not on PATH.*coral.ai/docs/edgetpu/compiler"
    ):
        finish_bundle(b, compiler="no-such-edgetpu_compiler")
    with pytest.raises(BundleError, match="already exists"):
        finish_bundle(b, tmp_path / "bin")
    finished = finish_bundle(b, tmp_path / "done").bundle
    with pytest.raises(BundleError, match="is already compiled for the Edge TPU"):
        finish_bundle(finished.path)
    x86 = convert(models["tiny"], "x86-cpu", tmp_path / "x86")
    with pytest.raises(BundleError, match="is not an Edge TPU bundle .*target x86-cpu"):
        finish_bundle(x86.path)
    (b / "model.tflite").write_bytes(b"TFL3 tampered")
    with pytest.raises(BundleError, match="model.tflite: sha256 differs"):
        finish_bundle(b, tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_a_bundle_the_compiler_was_run_in_by_hand(uncompiled: Path, compiler: Path, tmp_path: Path) -> None:
    import subprocess

    b = copy(uncompiled, tmp_path / "b")
    subprocess.run([str(compiler), "-s", "-o", str(b), str(b / "model.tflite")], check=True, capture_output=True)
    with pytest.raises(BundleError, match="model_edgetpu.tflite: not listed in the manifest"):
        Bundle.open(b)  # what the old hint led to: unhashed files beside an unchanged manifest
    r = finish_bundle(b)
    assert any("ignored model_edgetpu.tflite, model_edgetpu.log" in n for n in r.notes)
    assert Bundle.open(b).info.primary_artifact == "model_edgetpu.tflite"


def test_cli(uncompiled: Path, compiler: Path, tmp_path: Path) -> None:
    env = {"PATH": f"{compiler.parent}:/usr/bin:/bin", "EDGEKIT_SIGN_KEY": "", "EDGEKIT_TRUST_DIR": ""}
    b = copy(uncompiled, tmp_path / "b")
    p = run_cli("finish", str(b), "-o", str(tmp_path / "out"), env=env)
    assert p.returncode == 0, p.stderr
    assert "note: not signed: the source bundle was not signed" in p.stdout
    assert f"finished {Bundle.open(uncompiled).id} → {Bundle.open(tmp_path / 'out').id}" in p.stdout
    assert_user_error(run_cli("finish", str(tmp_path / "out"), env=env), "already compiled for the Edge TPU")
    p = run_cli("finish", str(b), env={**env, "PATH": str(tmp_path / "nothing")})
    assert_user_error(p, "edgetpu_compiler is not on PATH", "apt-get install edgetpu-compiler")
    p = run_cli("finish", str(b), "--json", env=env)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["primary_artifact"] == "model_edgetpu.tflite" and out["tpu_ops"] > 0 and out["signed"] is None
