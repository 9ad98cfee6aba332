"""A toolchain package installed without its declared dependencies (``ToolchainSpec.no_deps``, sha256-checked) and
the ``pip check`` lines its declared pins produce (``accepted_conflicts``, word for word): what the ``rknn``
toolchain needs (rknn-toolkit2 declares torch<=2.4.0; it runs beside the CPU torch 2.13). Real installs of a tiny
spec whose one package is a wheel built here, declaring a dependency nobody installs (no network needed)."""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from edge import toolchains
from edge.errors import EdgeError

_NAME = "edgekit_nodeps_probe"
CONFLICT = "edgekit-nodeps-probe 0.1 requires edgekit-absent-dep, which is not installed."


def _wheel(d: Path) -> tuple[Path, str]:
    """A pure-Python wheel declaring ``Requires-Dist: edgekit-absent-dep>=1``; (path, sha256)."""
    files = {
        f"{_NAME}/__init__.py": b"VALUE = 1\n",
        f"{_NAME}-0.1.dist-info/METADATA": (
            b"Metadata-Version: 2.1\nName: edgekit-nodeps-probe\nVersion: 0.1\nRequires-Dist: edgekit-absent-dep>=1\n"
        ),
        f"{_NAME}-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [
        f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},{len(b)}"
        for n, b in files.items()
    ]
    files[f"{_NAME}-0.1.dist-info/RECORD"] = ("\n".join([*record, f"{_NAME}-0.1.dist-info/RECORD,,"]) + "\n").encode()
    path = d / f"{_NAME}-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n, b in files.items():
            z.writestr(n, b)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def _spec(tmp_path: Path, line: str, accepted: tuple[str, ...]) -> toolchains.ToolchainSpec:
    lock = tmp_path / "probe.lock"
    lock.write_text("# nothing pinned\n")
    return toolchains.ToolchainSpec(
        name="probe",
        purpose="test",
        requirements=("pip",),
        no_deps=(line,),
        accepted_conflicts=accepted,
        lock=str(lock),
        lock_platform="none",
        python_min=(3, 8),
        python_max=(3, 99),
        imports=(_NAME,),
        programs=(),
        versions=(),
        size_hint="a few MB",
    )


def test_a_no_deps_package_installs_hash_checked_and_its_declared_conflict_is_accepted_word_for_word(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel, sha = _wheel(tmp_path)
    monkeypatch.setenv(toolchains.ENV_VAR, str(tmp_path / "root"))
    monkeypatch.setitem(toolchains.TOOLCHAINS, "probe", _spec(tmp_path, f"{wheel} --hash=sha256:{sha}", (CONFLICT,)))
    steps: list[str] = []
    st = toolchains.install("probe", on_step=steps.append, use_reference_lock=False)
    assert st.usable, st.problem
    freeze = json.loads((st.path / toolchains.STATE_FILE).read_text())["freeze"]
    assert any(ln.startswith("edgekit-nodeps-probe") for ln in freeze), freeze  # in the lock hash too
    assert any(s == f"accepted, as the spec says: {CONFLICT}" for s in steps), steps
    assert any("sha256-checked" in s for s in steps), steps


def test_a_conflict_the_spec_does_not_accept_fails_the_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel, sha = _wheel(tmp_path)
    monkeypatch.setenv(toolchains.ENV_VAR, str(tmp_path / "root"))
    other = CONFLICT.replace("0.1", "0.2")  # any other wording is not the accepted line
    monkeypatch.setitem(toolchains.TOOLCHAINS, "probe", _spec(tmp_path, f"{wheel} --hash=sha256:{sha}", (other,)))
    with pytest.raises(EdgeError, match=r"pip check failed: edgekit-nodeps-probe 0\.1 requires edgekit-absent-dep"):
        toolchains.install("probe", use_reference_lock=False)
    assert not toolchains.status("probe").installed


@pytest.mark.corpus_full  # pip's own hash-checking mode; 5 s of CI's budget for a third venv
def test_a_wheel_whose_sha256_differs_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel, sha = _wheel(tmp_path)
    monkeypatch.setenv(toolchains.ENV_VAR, str(tmp_path / "root"))
    wrong = ("0" if sha[0] != "0" else "1") + sha[1:]
    monkeypatch.setitem(toolchains.TOOLCHAINS, "probe", _spec(tmp_path, f"{wheel} --hash=sha256:{wrong}", (CONFLICT,)))
    with pytest.raises(EdgeError, match="(?i)hash"):
        toolchains.install("probe", use_reference_lock=False)
    assert not toolchains.status("probe").installed
