"""Issue #33 red team: the qemu .deb is trusted only through a Debian InRelease signed by a key edgekit pins.

Before: ``toolchain install aarch64`` took the qemu-user .deb on the word of an unsigned ``Packages.xz`` (no
Release/InRelease check), so a mirror (or anyone between) could serve any qemu. Now the suite's InRelease is
verified with ``gpgv`` against the pinned keyring, and Packages.xz must have the sha256 it lists. A real HTTP
mirror on loopback, real gpg keys, a real .deb (dpkg-deb).
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import lzma
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Iterator

import pytest

from edge.errors import EdgeError
from edge.toolchains import aarch64

pytestmark = pytest.mark.skipif(
    not (shutil.which("gpg") and shutil.which("gpgv") and shutil.which("dpkg-deb")), reason="needs gpg, gpgv, dpkg-deb"
)


def _mirror(root: Path, signer_home: Path | None) -> None:
    """bookworm-backports with a qemu-user .deb, its Packages.xz, and an InRelease (signed by ``signer_home``'s key,
    or a forged clear-signed one when None)."""
    pkg = root / "build" / "usr" / "bin"
    pkg.mkdir(parents=True)
    (pkg / "qemu-aarch64").write_text("#!/bin/sh\necho planted qemu\n")
    (root / "build" / "DEBIAN").mkdir()
    (root / "build" / "DEBIAN" / "control").write_text(
        "Package: qemu-user\nVersion: 1:99\nArchitecture: amd64\nMaintainer: x <x@x>\nDescription: x\n"
    )
    deb = root / "pool" / "main" / "q" / "qemu" / "qemu-user_99_amd64.deb"
    deb.parent.mkdir(parents=True)
    subprocess.run(["dpkg-deb", "--build", str(root / "build"), str(deb)], check=True, capture_output=True)
    sha = hashlib.sha256(deb.read_bytes()).hexdigest()
    dists = root / "dists" / "bookworm-backports"
    (dists / "main" / "binary-amd64").mkdir(parents=True)
    index = lzma.compress(
        f"Package: qemu-user\nVersion: 1:99\nArchitecture: amd64\nFilename: {deb.relative_to(root)}\nSHA256: {sha}\n".encode()
    )
    (dists / "main" / "binary-amd64" / "Packages.xz").write_bytes(index)
    release = (
        "Suite: bookworm-backports\nSHA256:\n"
        f" {hashlib.sha256(index).hexdigest()} {len(index)} main/binary-amd64/Packages.xz\n"
    )
    if signer_home is None:
        (dists / "InRelease").write_text(
            "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\n" + release + "-----BEGIN PGP SIGNATURE-----\n\n"
            "iQIzBAEBCAAdFiEE\n=AAAA\n-----END PGP SIGNATURE-----\n"
        )
    else:
        (dists / "Release").write_text(release)
        subprocess.run(
            [
                "gpg",
                "--homedir",
                str(signer_home),
                "--batch",
                "--yes",
                "--clearsign",
                "-o",
                str(dists / "InRelease"),
                str(dists / "Release"),
            ],
            check=True,
            capture_output=True,
        )


def _key(home: Path) -> Path:
    home.mkdir(mode=0o700)
    subprocess.run(
        [
            "gpg",
            "--homedir",
            str(home),
            "--batch",
            "--passphrase",
            "",
            "--quick-gen-key",
            "Test Archive <t@t>",
            "ed25519",
            "sign",
            "never",
        ],
        check=True,
        capture_output=True,
    )
    ring = home.parent / f"{home.name}.gpg"
    ring.write_bytes(
        subprocess.run(["gpg", "--homedir", str(home), "--export"], check=True, capture_output=True).stdout
    )
    return ring


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    root = tmp_path / "mirror"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _install(url: str, tmp: Path, keyring: Path = aarch64.DEBIAN_KEYRING) -> dict[str, object]:
    dl, dest = tmp / "dl", tmp / "qemu-aarch64"
    dl.mkdir(exist_ok=True)
    with open(tmp / "install.log", "w") as log:
        return aarch64._qemu_from_backports(url, dl, dest, log, keyring)


def test_a_forged_inrelease_is_refused(serve: tuple[Path, str], tmp_path: Path) -> None:
    root, url = serve
    _mirror(root, None)
    with pytest.raises(EdgeError, match="not signed by a Debian archive key edgekit pins"):
        _install(url, tmp_path)
    assert not (tmp_path / "qemu-aarch64").exists()


def test_an_inrelease_signed_by_another_key_is_refused(serve: tuple[Path, str], tmp_path: Path) -> None:
    root, url = serve
    _key(tmp_path / "mallory")
    _mirror(root, tmp_path / "mallory")
    with pytest.raises(EdgeError, match="not signed by a Debian archive key edgekit pins"):
        _install(url, tmp_path)
    assert not (tmp_path / "qemu-aarch64").exists()


def test_a_signed_inrelease_vouches_only_for_its_own_index(serve: tuple[Path, str], tmp_path: Path) -> None:
    root, url = serve
    ring = _key(tmp_path / "archive")
    _mirror(root, tmp_path / "archive")
    rec = _install(url, tmp_path, ring)  # the pinned key's place taken by this test's archive key
    assert rec["source"] == "debian bookworm-backports qemu-user 1:99"
    (tmp_path / "qemu-aarch64").unlink()
    (root / "dists" / "bookworm-backports" / "main" / "binary-amd64" / "Packages.xz").write_bytes(lzma.compress(b"x"))
    with pytest.raises(EdgeError, match="is not the one its signed InRelease lists"):
        _install(url, tmp_path, ring)
