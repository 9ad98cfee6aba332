"""A device's identity key (Ed25519): it signs the device's births and deaths, and the collector pins the first key
it sees for a device id (trust on first use, as ssh's known_hosts does; ``edge.fleet.device_keys``).

On a broker without the ACL anyone may publish on a device's topics; a signed birth or death can only come from
the holder of the device's key. Telemetry and state stay unsigned (tens of thousands a second; the collector's
sequence rules guard a live session, and only the session of a verified birth moves a pinned device's row).

**The key**: ``<store>/agent/device-key.pem`` (PKCS#8 PEM, mode 0600, made at the agent's first start, never
overwritten) and ``device-key.pub`` beside it (SubjectPublicKeyInfo PEM: what ``edgekit fleet trust-key`` takes).

**What is signed**: the message as the agent encodes it (``edge.mqtt.payloads.encode``: compact JSON, its envelope
names the kind, fleet, device, session, stream position and time, a birth or death its connection), with the
device's public key in it (``"key"``: the raw 32 bytes in base64). The signature goes on as the object's last
member, written at a fixed length::

    B = {"schema_version":1,"type":"birth",...,"key":"<44 chars>"}
    payload = B[:-1] + ',"sig":"' + base64(sign(CONTEXT + B)) + '"}'

so the signed bytes are exactly the payload without that suffix (and its closing brace back): no canonical
re-encoding on the collector, whose parser (orjson or json) may write numbers differently. ``CONTEXT`` keeps these
signatures apart from anything else the key might sign. A payload is parsed into :class:`Signed` (fixed lengths,
strict base64) or refused; nothing else is read from it before the JSON parse has checked the envelope.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from edge.base.crypto import ed25519 as load_ed25519
from edge.base.typedjson import UnreadableFile, read_bounded
from edge.errors import EdgeError, MissingDependencyError
from edge.mqtt.payloads import encode

log = logging.getLogger("edge.mqtt")

CONTEXT = b"edgekit-mqtt-v1 device message\n"
KEY_FILE = "device-key.pem"
PUBLIC_FILE = "device-key.pub"
KEY_FIELD, SIG_FIELD = "key", "sig"
KEY_BYTES, SIG_BYTES = 32, 64
KEY_TEXT_LEN, SIG_TEXT_LEN = 44, 88  # standard base64 with padding
_SIG_HEAD = b',"sig":"'
SUFFIX_LEN = len(_SIG_HEAD) + SIG_TEXT_LEN + 2  # ,"sig":"<88>"}
KEY_FILE_MAX_BYTES = 4096  # an Ed25519 PEM is ~120 bytes


class IdentityError(EdgeError):
    """The device's identity key cannot be read or made."""


class KeyNotMade(IdentityError):
    """There is no device key and none could be written (a full or read-only disk): the agent runs unsigned."""


class BadSignedMessage(ValueError):
    """A payload that says it is signed and is not in the signed form (the collector refuses it as malformed)."""


def _crypto() -> Any:
    return load_ed25519("the device identity key (signed births and deaths)", "mqtt")


def key_text(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def key_id(raw: bytes) -> str:
    """First 16 hex digits of the sha256 of the raw public key (as bundle signing keys are named)."""
    return hashlib.sha256(raw).hexdigest()[:16]


def _strict_b64(text: Any, length: int, size: int, what: str) -> bytes:
    if type(text) is not str or len(text) != length:
        raise BadSignedMessage(f"{what} must be {length} characters of base64")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise BadSignedMessage(f"{what} is not base64") from None
    if len(raw) != size or base64.b64encode(raw).decode("ascii") != text:  # one text per value
        raise BadSignedMessage(f"{what} is not the canonical base64 of {size} bytes")
    return raw


def parse_key_text(text: Any) -> bytes:
    """The 32 raw bytes of a key written as ``key_text``; ``BadSignedMessage`` otherwise."""
    return _strict_b64(text, KEY_TEXT_LEN, KEY_BYTES, "key")


@dataclass(frozen=True)
class Signed:
    """A signed birth or death, checked for form (not yet for its signature: that needs the device's pinned key)."""

    key: bytes  # the public key the message names (32 bytes)
    signature: bytes  # 64 bytes
    body: bytes  # what the signature covers (after CONTEXT)

    def verifies_with(self, key: bytes) -> bool:
        """Whether ``key`` (32 raw bytes) made this signature. False when cryptography is missing (fail closed)."""
        try:
            ed25519 = _crypto()
            from cryptography.exceptions import InvalidSignature
        except MissingDependencyError:
            return False
        try:
            ed25519.Ed25519PublicKey.from_public_bytes(key).verify(self.signature, CONTEXT + self.body)
        except (InvalidSignature, ValueError):
            return False
        return True


def signed_part(payload: bytes, obj: Mapping[str, Any]) -> Signed | None:
    """The signature of a parsed birth or death (``obj`` is ``payload`` parsed): None when it carries neither a key
    nor a signature; ``BadSignedMessage`` when it carries either and is not exactly in the signed form."""
    if KEY_FIELD not in obj and SIG_FIELD not in obj:
        return None
    key = parse_key_text(obj.get(KEY_FIELD))
    head = len(payload) - SUFFIX_LEN
    if head < 2 or payload[head : head + len(_SIG_HEAD)] != _SIG_HEAD or payload[-2:] != b'"}':
        raise BadSignedMessage('the signature must be the last member, written as ,"sig":"<88 characters>"}')
    text = payload[head + len(_SIG_HEAD) : -2].decode("ascii", "replace")
    body = payload[:head] + b"}"
    # one sig member, the last (a string holds a quote only escaped, so the bytes '"sig":' are a member's name)
    if obj.get(SIG_FIELD) != text or b'"sig":' in body:
        raise BadSignedMessage("the payload has a sig member besides the one it ends with")
    return Signed(key, _strict_b64(text, SIG_TEXT_LEN, SIG_BYTES, "sig"), body)


class DeviceIdentity:
    """A device's private identity key: signs its births and deaths (``sign``)."""

    def __init__(self, private_key: Any) -> None:
        from cryptography.hazmat.primitives import serialization

        self._key = private_key
        self.public = private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.key_text, self.key_id = key_text(self.public), key_id(self.public)

    @classmethod
    def generate(cls) -> DeviceIdentity:
        """A new key in memory (the fleet simulator's devices, tests)."""
        return cls(_crypto().Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(cls, directory: Path) -> DeviceIdentity:
        """The key in ``directory/device-key.pem``, made (mode 0600, never overwritten) when there is none. A key
        file that is there and cannot be used stops the agent: a new key would be refused by every collector that
        pinned the old one."""
        _crypto()
        path = directory / KEY_FILE
        if not path.exists() and not path.is_symlink():
            made = cls._create(directory, path)
            if made is not None:
                return made
        return cls._read(path)

    @classmethod
    def _create(cls, directory: Path, path: Path) -> DeviceIdentity | None:
        """A new key written whole or not at all: into a temporary file, fsynced, then linked as ``path`` (which
        never replaces a key another process made first: None then, read that one). A full or read-only disk raises
        :class:`KeyNotMade` and leaves nothing behind (a half-written key file would stop every later start)."""
        from cryptography.hazmat.primitives import serialization

        key = _crypto().Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        tmp = directory / f".{KEY_FILE}.{os.getpid()}.tmp"
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(pem)
                    f.flush()
                    os.fsync(f.fileno())
                os.chmod(tmp, 0o600)  # whatever the umask
                os.link(tmp, path)  # no-replace: a key made meanwhile by another process wins
            finally:
                tmp.unlink(missing_ok=True)
        except FileExistsError:
            if path.exists():
                return None
            raise KeyNotMade(f"cannot write the device key {path}: a stale temporary file is in the way") from None
        except OSError as e:
            raise KeyNotMade(f"cannot write the device key {path}: {e.strerror or e}") from None
        me = cls(key)
        try:
            write_public(directory / PUBLIC_FILE, me.public)
        except OSError as e:  # the private key is made; the public copy is a convenience, written next start
            log.warning("device key %s made, its public copy not written: %s", path, e.strerror or e)
        return me

    @classmethod
    def _read(cls, path: Path) -> DeviceIdentity:
        from cryptography.hazmat.primitives import serialization

        hint = (
            f"restore it; or delete {path} (a new key is made at the next start) and run "
            "`edgekit fleet forget-key DEVICE` (or trust-key) where the collector's database is"
        )
        try:
            data = read_bounded(path, max_bytes=KEY_FILE_MAX_BYTES, what="device key")
            if os.stat(path).st_mode & 0o077:
                raise IdentityError(
                    f"device key {path} is readable by others (mode {oct(os.stat(path).st_mode & 0o777)})",
                    hint=f"chmod 600 {path}",
                )
            key = serialization.load_pem_private_key(data, password=None)
        except UnreadableFile as e:
            raise IdentityError(e.message, hint=hint) from None
        except (ValueError, TypeError) as e:
            raise IdentityError(f"device key {path} is not a PEM private key ({str(e)[:80]})", hint=hint) from None
        if not isinstance(key, _crypto().Ed25519PrivateKey):
            raise IdentityError(f"device key {path} is not an Ed25519 key", hint=hint)
        return cls(key)

    def sign(self, obj: Mapping[str, Any]) -> bytes:
        """``obj`` (a birth or death, ``edge.mqtt.payloads.message``) with this key in it, encoded and signed."""
        body = encode({**obj, KEY_FIELD: self.key_text})
        sig = self._key.sign(CONTEXT + body)
        return body[:-1] + _SIG_HEAD + base64.b64encode(sig) + b'"}'


def write_public(path: Path, raw: bytes) -> None:
    from cryptography.hazmat.primitives import serialization

    pub = _crypto().Ed25519PublicKey.from_public_bytes(raw)
    pem = pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    path.write_bytes(pem)


def read_public(path: Path) -> bytes:
    """The 32 raw bytes of a device's public key from a file: ``device-key.pub`` (PEM) or one line of its base64
    (``fleet status --json`` prints it); anything else is an ``IdentityError``."""
    ed25519 = _crypto()
    from cryptography.hazmat.primitives import serialization

    try:
        data = read_bounded(path, max_bytes=KEY_FILE_MAX_BYTES, what="device public key")
    except UnreadableFile as e:
        raise IdentityError(e.message, hint=e.hint) from None
    text = data.strip()
    if text.startswith(b"-----BEGIN"):
        try:
            key = serialization.load_pem_public_key(data)
        except (ValueError, TypeError):
            raise IdentityError(f"{path} is not a PEM public key") from None
        if not isinstance(key, ed25519.Ed25519PublicKey):
            raise IdentityError(f"{path} is not an Ed25519 public key")
        return bytes(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))
    try:
        return parse_key_text(text.decode("ascii", "replace"))
    except BadSignedMessage:
        raise IdentityError(
            f"{path} is neither a PEM public key nor a base64 Ed25519 key",
            hint="give the device's <store>/agent/device-key.pub",
        ) from None
