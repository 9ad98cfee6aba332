"""Issue #33 red team, toolchain trust: nothing planted beside the guest's code runs in the emulated guest.

Before: a ``sitecustomize.py`` anywhere on the guest's path (the red team planted one in the aarch64 root) ran before
``verify --isa``'s guest and could fake its result; a poisoned timestamp ``.pyc`` in the toolchain's shared pycache
(``PYTHONPYCACHEPREFIX``) ran in place of the module's source. Now the guest Python runs with ``-S`` and every run
compiles into a fresh, empty pycache. The real emulator runs; nothing is written into the shared root.

And ``verify --isa`` with the guest's ``edge`` link replaced by a directory was an internal error (IsADirectoryError);
it is now one line that refuses to run the guest on code edgekit did not put there.
"""

from __future__ import annotations

import importlib._bootstrap_external as bx
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edge.errors import EdgeError
from edge.toolchains import aarch64
from tests.support.emulation import emulator_or_skip


def test_a_planted_sitecustomize_does_not_run_in_the_guest(tmp_path: Path) -> None:
    em = emulator_or_skip()
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "sitecustomize.py").write_text("print('PLANTED RAN')\n")
    r = em.run("-c", "import sys; print('site' in sys.modules)", pythonpath=(planted,), timeout_s=300)
    assert r.returncode == 0, r.stderr
    assert "PLANTED RAN" not in r.stdout and r.stdout.strip().endswith("False"), r.stdout


def test_a_poisoned_pyc_in_the_shared_pycache_does_not_run(tmp_path: Path) -> None:
    em = emulator_or_skip()
    src = tmp_path / "mod" / "victim.py"
    src.parent.mkdir()
    src.write_text("WHO = 'source'\n")
    st = src.stat()
    code = compile("WHO = 'pyc'  # poisoned\n", str(src), "exec")
    # where the guest looked before: the toolchain's shared pycache, with a .pyc that matches mtime and size
    shared = em.path / "pycache"
    pyc = Path(
        subprocess.run(
            [sys.executable, "-c", f"import importlib.util as u; print(u.cache_from_source({str(src)!r}))"],
            env={**os.environ, "PYTHONPYCACHEPREFIX": str(shared)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    pyc.parent.mkdir(parents=True, exist_ok=True)
    pyc.write_bytes(bytes(bx._code_to_timestamp_pyc(code, int(st.st_mtime), st.st_size)))  # type: ignore[attr-defined]
    try:
        r = em.run("-c", "import victim; print(victim.WHO)", pythonpath=(src.parent,), timeout_s=300)
    finally:
        shutil.rmtree(shared / str(tmp_path).lstrip("/"), ignore_errors=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "source", r.stdout


def test_the_guests_edge_link_replaced_by_a_directory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edge import toolchains
    from edge.verify.isa import guest_pythonpath

    monkeypatch.setenv(toolchains.ENV_VAR, str(tmp_path))
    site = guest_pythonpath()
    assert (site / "edge").is_symlink()
    (site / "edge").unlink()
    (site / "edge").mkdir()
    (site / "edge" / "__init__.py").write_text("print('not edgekit')\n")
    with pytest.raises(EdgeError, match="is not the link to edgekit's package") as e:
        guest_pythonpath()
    assert "\n" not in str(e.value)
    assert aarch64.toolchain_dir() == tmp_path / "aarch64"
