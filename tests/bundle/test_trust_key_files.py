"""Issue #33 red team, trust keys: a key file is read non-blocking, bounded, and only when it is a regular file.

Before: a FIFO as ``trust/keys/*.pub`` hung ``ship`` (a blocking open); ``edgekit trust add /dev/zero`` grew to
23.6 GB (``read_bytes()[:65536]`` reads everything first); ``/dev/zero`` as a trusted key raised a raw
``MemoryError`` through ``ship()``. Each is now one line: the trust store is damaged, or the key is not a file.
The memory-hungry cases run in a subprocess under an address-space limit, so a regression fails, not the host.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from edge.bundle.bundle import sign_bundle
from edge.bundle.signing import generate_key
from edge.bundle.trust import TrustStore
from edge.deploy import ship
from edge.errors import SignatureError
from edge.pipeline import convert
from tests.support.cli import EDGEKIT, REPO, assert_user_error

pytest.importorskip("cryptography")
LIMIT = 1 << 31  # 2 GiB of address space: plenty for edgekit, far below what reading /dev/zero wants


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "PYTHONPATH": str(REPO), **env}
    return subprocess.run(argv, capture_output=True, text=True, env=full, timeout=120, preexec_fn=_limited)


@pytest.fixture(scope="module")
def built(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert(models["tiny"], "x86-cpu", tmp_path_factory.mktemp("keyfile-base") / "b").path


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EDGEKIT_KEYS_DIR", str(tmp_path / "keys"))
    monkeypatch.delenv("EDGEKIT_TRUST_DIR", raising=False)
    generate_key("k")
    s = tmp_path / "device"
    TrustStore(s / "trust").add_key((tmp_path / "keys" / "k.pub").read_bytes(), "k")
    return s


def signed(built: Path, tmp_path: Path) -> Path:
    d = tmp_path / "signed"
    shutil.copytree(built, d)
    sign_bundle(d, "k", version=1)
    return d


def test_a_fifo_as_a_trusted_key_refuses_without_hanging(built: Path, store: Path, tmp_path: Path) -> None:
    os.mkfifo(store / "trust" / "keys" / "planted.pub")
    bundle = signed(built, tmp_path)
    got: list[BaseException | None] = []

    def go() -> None:
        try:
            ship(bundle, store)
            got.append(None)
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            got.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(60)
    if t.is_alive():  # unblock the reader (a writer opens and closes the FIFO), then fail
        os.close(os.open(store / "trust" / "keys" / "planted.pub", os.O_WRONLY | os.O_NONBLOCK))
        t.join(10)
        pytest.fail("ship blocked on a FIFO in trust/keys")
    assert isinstance(got[0], SignatureError), got
    assert "is damaged" in str(got[0]) and "not a regular file" in str(got[0])
    assert "\n" not in str(got[0])
    assert not (store / "current").exists()


def test_dev_zero_as_a_trusted_key_is_one_line_not_memory_error(built: Path, store: Path, tmp_path: Path) -> None:
    os.symlink("/dev/zero", store / "trust" / "keys" / "zero.pub")
    bundle = signed(built, tmp_path)
    code = textwrap.dedent(f"""
        from edge.deploy import ship
        from edge.errors import SignatureError
        try:
            ship({str(bundle)!r}, {str(store)!r})
        except SignatureError as e:
            print("REFUSED", e)
    """)
    p = _run([sys.executable, "-c", code], {})
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith("REFUSED") and "is damaged" in p.stdout and "not a regular file" in p.stdout, p.stdout


@pytest.mark.parametrize("source", ["/dev/zero", "fifo"])
def test_trust_add_of_a_non_file_is_one_line(tmp_path: Path, source: str) -> None:
    if source == "fifo":
        source = str(tmp_path / "k.pub")
        os.mkfifo(source)
    p = _run([EDGEKIT, "trust", "add", source, "--trust-dir", str(tmp_path / "trust")], {})
    assert_user_error(p, "not a regular file")
    assert not (tmp_path / "trust" / "keys").exists() or not list((tmp_path / "trust" / "keys").iterdir())
