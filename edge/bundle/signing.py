"""Signed bundles: Ed25519 keys, the canonical manifest bytes, a detached ``manifest.sig``.

What is signed is the manifest, and only it: it carries every artifact's sha256 and size (so the
signature covers the files through their hashes), the target, the parity and benchmark evidence the
gates recompute from, and the bundle's ``name`` and ``version`` (a number that only goes up per name,
TUF's defence against rollback and freeze). Signing never touches an artifact: it may rewrite the
manifest once (adding ``name``/``version``), then signs the final manifest.

**Canonical bytes** (:func:`canonical_bytes`, the one definition): the manifest as parsed from
``manifest.json``, re-serialised by Python's ``json.dumps`` with ``sort_keys=True``,
``separators=(",", ":")`` (no whitespace), ``ensure_ascii=False``, encoded as UTF-8. Floats are
written by Python's shortest round-trip repr, an infinite figure as ``Infinity`` (the reader
refuses NaN and duplicate keys, so one file has one canonical form). The file on disk may be
pretty-printed however it likes: the signature is over the canonical bytes, not the file.

**manifest.sig**: ``{"algorithm": "ed25519", "key_id": KEYID, "signature": BASE64}`` where
KEYID is the first 16 hex digits of the sha256 of the 32-byte raw public key.

Keys live in a keys directory (``$EDGEKIT_KEYS_DIR``, else ``~/.config/edgekit/keys``): ``NAME.pem``
(PKCS#8, mode 0600) and ``NAME.pub`` (SubjectPublicKeyInfo PEM, what devices trust). Devices check
signatures against a trust store: ``edge.bundle.trust``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from edge.base.typedjson import UnreadableFile, read_bounded
from edge.errors import SignatureError

KEYS_DIR_ENV = "EDGEKIT_KEYS_DIR"
SIGN_KEY_ENV = "EDGEKIT_SIGN_KEY"
ALGORITHM = "ed25519"
SIGNATURE_FILE = "manifest.sig"
SIG_MAX_BYTES = 4096
KEY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
KEY_ID = re.compile(r"[0-9a-f]{16}")
KEY_MAX_BYTES = 1 << 16  # an Ed25519 PEM is ~120 bytes; anything past this is not a key
SIGNER_VERSIONS = "versions.json"  # in the keys dir: the last version this signer gave each name


def read_key_file(path: str | os.PathLike[str], what: str = "key") -> bytes:
    """The bytes of a key file: a regular file (opened non-blocking, so a FIFO never hangs) of at most
    :data:`KEY_MAX_BYTES`, read with a bound (``/dev/zero`` is refused, never read into memory)."""
    try:
        return read_bounded(path, max_bytes=KEY_MAX_BYTES, what=what)
    except UnreadableFile as e:
        raise SignatureError(e.message, hint=e.hint or "name a PEM key file") from None


def canonical_bytes(manifest: Mapping[str, Any]) -> bytes:
    """The bytes a signature covers (see the module docstring)."""
    return json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def crypto() -> Any:
    """The ``cryptography`` primitives signing and verifying need, or a one-line install hint."""
    from edge.base.crypto import ed25519

    return ed25519("signing and checking bundle signatures", "sign")


def raw_public(public_key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)  # type: ignore[no-any-return]


def key_id(public_key: Any) -> str:
    """First 16 hex digits of sha256(raw 32-byte Ed25519 public key)."""
    return hashlib.sha256(raw_public(public_key)).hexdigest()[:16]


def public_pem(public_key: Any) -> str:
    from cryptography.hazmat.primitives import serialization

    pem: bytes = public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return pem.decode("ascii")


def load_public_pem(data: bytes, where: str) -> Any:
    """An Ed25519 public key from PEM bytes; anything else is a :class:`SignatureError` naming ``where``."""
    ed25519 = crypto()
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError):
        raise SignatureError(
            f"{where} is not a PEM public key", hint="export one with `edgekit keys export NAME`"
        ) from None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise SignatureError(f"{where} is not an Ed25519 public key", hint="make one with `edgekit keys generate NAME`")
    return key


# -- the signer's keys ---------------------------------------------------------------------------


def keys_dir(directory: str | os.PathLike[str] | None = None) -> Path:
    if directory is not None:
        return Path(directory)
    env = os.environ.get(KEYS_DIR_ENV)
    return Path(env) if env else Path.home() / ".config" / "edgekit" / "keys"


def check_key_name(name: str) -> str:
    if not isinstance(name, str) or not KEY_NAME.fullmatch(name):
        raise SignatureError(
            f"key name {str(name)[:80]!r} is not 1 to 64 of A-Z a-z 0-9 . _ - (not starting with '.' or '-')"
        )
    return name


@dataclass(frozen=True)
class KeyInfo:
    name: str
    key_id: str
    private_path: Path
    public_path: Path

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key_id": self.key_id,
            "private_key": str(self.private_path),
            "public_key": str(self.public_path),
        }


def generate_key(name: str, directory: str | os.PathLike[str] | None = None) -> KeyInfo:
    """A new Ed25519 key ``NAME`` in the keys dir: ``NAME.pem`` (0600, never overwritten) and ``NAME.pub``."""
    ed25519 = crypto()
    from cryptography.hazmat.primitives import serialization

    check_key_name(name)
    d = keys_dir(directory)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    priv, pub = d / f"{name}.pem", d / f"{name}.pub"
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    try:  # O_EXCL: a key is never replaced by accident (it would orphan every device that trusts it)
        fd = os.open(priv, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise SignatureError(
            f"key {name!r} already exists in {d}",
            hint="choose another name; to retire a key, revoke it on devices and delete its files",
        ) from None
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(priv, 0o600)  # whatever the umask
    pub.write_text(public_pem(key.public_key()), encoding="ascii")
    return KeyInfo(name, key_id(key.public_key()), priv, pub)


def _read_private(path: Path) -> Any:
    ed25519 = crypto()
    from cryptography.hazmat.primitives import serialization

    data = read_key_file(path, "signing key")
    mode = path.stat().st_mode & 0o077
    if mode:
        raise SignatureError(
            f"signing key {path} is readable by others (mode {oct(path.stat().st_mode & 0o777)})",
            hint=f"chmod 600 {path}",
        )
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise SignatureError(f"{path} is not an unencrypted PEM private key ({str(e).splitlines()[0][:80]})") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise SignatureError(f"{path} is not an Ed25519 key", hint="make one with `edgekit keys generate NAME`")
    return key


def load_signing_key(key: str, directory: str | os.PathLike[str] | None = None) -> tuple[Any, str]:
    """The private key named ``key`` in the keys dir (or a path to a PEM file), and a label for messages."""
    p = Path(key)
    if ("/" in key or key.endswith(".pem")) and p.is_file():
        return _read_private(p), str(p)
    check_key_name(key)
    path = keys_dir(directory) / f"{key}.pem"
    if not path.is_file():
        raise SignatureError(
            f"no signing key {key!r} in {keys_dir(directory)}",
            hint=f"make one with `edgekit keys generate {key}`, or set ${KEYS_DIR_ENV}",
        )
    return _read_private(path), key


def list_keys(directory: str | os.PathLike[str] | None = None) -> list[KeyInfo]:
    d = keys_dir(directory)
    out = []
    for pub in sorted(d.glob("*.pub")) if d.is_dir() else []:
        name = pub.stem
        out.append(
            KeyInfo(name, key_id(load_public_pem(read_key_file(pub, "public key"), str(pub))), d / f"{name}.pem", pub)
        )
    return out


def export_public_key(name: str, directory: str | os.PathLike[str] | None = None) -> str:
    """The public key of ``name`` as PEM (derived from the private key when its .pub is missing)."""
    check_key_name(name)
    d = keys_dir(directory)
    pub = d / f"{name}.pub"
    if pub.is_file():
        return public_pem(load_public_pem(read_key_file(pub, "public key"), str(pub)))
    key, _ = load_signing_key(name, directory)
    return public_pem(key.public_key())


# -- signatures ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Signature:
    key_id: str
    signature: bytes
    algorithm: str = ALGORITHM

    def to_json(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "key_id": self.key_id,
            "signature": base64.b64encode(self.signature).decode("ascii"),
        }

    @classmethod
    def read(cls, path: Path) -> Signature | None:
        """The signature in ``path``; None when there is none. A malformed one is a :class:`SignatureError`."""
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return None
        except OSError as e:
            raise SignatureError(f"{path} cannot be read: {e.strerror or e}") from None
        with os.fdopen(fd, "rb") as f:
            data = f.read(SIG_MAX_BYTES + 1)

        def bad(why: str) -> SignatureError:
            return SignatureError(
                f"{path} is not a signature edgekit writes: {why}", hint="sign the bundle again with `edgekit sign`"
            )

        if len(data) > SIG_MAX_BYTES:
            raise bad(f"larger than {SIG_MAX_BYTES} bytes")
        try:
            raw = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise bad("not JSON") from None
        if not isinstance(raw, dict) or set(raw) != {"algorithm", "key_id", "signature"}:
            raise bad("want exactly the fields algorithm, key_id, signature")
        if raw["algorithm"] != ALGORITHM:
            raise bad(f"algorithm {str(raw['algorithm'])[:40]!r}; only {ALGORITHM!r} is accepted")
        if not isinstance(raw["key_id"], str) or not KEY_ID.fullmatch(raw["key_id"]):
            raise bad("key_id is not 16 hex digits")
        try:
            sig = base64.b64decode(raw["signature"], validate=True) if isinstance(raw["signature"], str) else b""
        except binascii.Error:
            sig = b""
        if len(sig) != 64:
            raise bad("signature is not 64 bytes of base64")
        return cls(raw["key_id"], sig)


def verify_signature(raw_manifest: Mapping[str, Any], sig: Signature, public_key: Any) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        public_key.verify(sig.signature, canonical_bytes(raw_manifest))
    except InvalidSignature:
        return False
    return True


def configured_sign_key(explicit: str | None) -> str | None:
    """``--sign-key``, else ``$EDGEKIT_SIGN_KEY`` (empty means none)."""
    return explicit or os.environ.get(SIGN_KEY_ENV) or None
