"""A device's trust store: which keys may sign its bundles, which are revoked, what it has seen.

A directory (a device store's ``trust/``, or ``$EDGEKIT_TRUST_DIR``)::

    keys/<key-id>.pub     trusted Ed25519 public keys (PEM); several at once, for rotation
    keys/<key-id>.json    optional: {"not_after": "2027-01-01T00:00:00+00:00"} -- the key's expiry
    revoked.json          {"revoked": [key-id, ...]}: refused even if its .pub is still there
    device.json           optional: {"targets": ["x86-cpu"]}: the target class(es) this device runs
    versions.json         {name: {"version": N, "bundle_id": ID, "allowed": [ID, ...]}}: the highest
                          version admitted per bundle name; ``allowed`` are older bundles an operator
                          rolled back to on this device (cleared by the next newer deploy)

Where a trust store exists, :meth:`TrustStore.check` refuses a bundle that is unsigned, signed by a
key it does not hold, revoked or expired, whose signature does not match the canonical manifest,
that has no version or a lower one than seen for its name (or reuses the seen version for other
content), or that is built for another target class. Key ids come from the key files' contents, not
their names. Without a trust store nothing is checked (and callers say so at info level).

The trust store is only as safe as its directory: keep it writable by root (or the deploying user)
alone; a store whose ``trust/`` anyone can write vouches for anything.
"""

from __future__ import annotations

import fcntl
import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from edge.base.typedjson import UnreadableFile, read_json_file, write_json_atomic
from edge.bundle.signing import (
    KEY_ID,
    SIGNATURE_FILE,
    Signature,
    key_id,
    load_public_pem,
    read_key_file,
    verify_signature,
)
from edge.errors import SignatureError

log = logging.getLogger("edge.bundle.trust")
TRUST_DIR_ENV = "EDGEKIT_TRUST_DIR"
STORE_TRUST = "trust"  # a device store's own trust store: <store>/trust
KEYS, REVOKED, VERSIONS, DEVICE = "keys", "revoked.json", "versions.json", "device.json"
MAX_FILE = 1 << 20


@dataclass(frozen=True)
class TrustedKey:
    key_id: str
    public_key: Any
    path: Path
    not_after: datetime | None
    revoked: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "key_id": self.key_id,
            "path": str(self.path),
            "revoked": self.revoked,
            "not_after": self.not_after.isoformat() if self.not_after else None,
            "expired": self.expired(),
        }

    def expired(self, now: datetime | None = None) -> bool:
        return self.not_after is not None and (now or datetime.now(timezone.utc)) > self.not_after


@dataclass(frozen=True)
class Admitted:
    """What a check found: who signed, and the bundle's place in its series."""

    key_id: str
    name: str
    version: int


def parse_time(text: str, where: str) -> datetime:
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (ValueError, TypeError, AttributeError):
        raise SignatureError(
            f"{where}: {str(text)[:60]!r} is not an ISO 8601 time", hint="e.g. 2027-01-01T00:00:00+00:00"
        ) from None
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


class TrustStore:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"TrustStore({str(self.root)!r})"

    # reading ------------------------------------------------------------------------------------
    def _json(self, name: str, default: Any) -> Any:
        """``name`` read strictly; ``default`` only when nothing at all is there. A link (dangling or not), a
        directory, a FIFO, a file too big or not JSON: the store is damaged and refuses everything (fail closed)."""
        f = self.root / name
        if not os.path.lexists(f):
            return default
        try:
            if f.is_symlink():
                raise UnreadableFile(f"{name} is a symbolic link")
            return read_json_file(f, what=name, max_bytes=MAX_FILE, max_depth=8)
        except UnreadableFile as e:
            raise damaged(self.root, f"{name} is not a readable JSON file ({e.message})") from None

    def revoked(self) -> set[str]:
        data = self._json(REVOKED, {"revoked": []})
        ids = data.get("revoked") if isinstance(data, dict) else None
        if not isinstance(ids, list) or not all(isinstance(i, str) and KEY_ID.fullmatch(i) for i in ids):
            raise damaged(self.root, f'{REVOKED} is not {{"revoked": [16-hex-digit key ids]}}')
        return set(ids)

    def targets(self) -> tuple[str, ...] | None:
        data = self._json(DEVICE, {})
        if not isinstance(data, dict):
            raise damaged(self.root, f"{DEVICE} is not an object")
        t = data.get("targets")
        if t is None:
            return None
        if not isinstance(t, list) or not all(isinstance(x, str) for x in t):
            raise damaged(self.root, f"{DEVICE} targets is not a list of names")
        return tuple(t)

    def versions(self) -> dict[str, Any]:
        """``versions.json``, every entry checked: a wrong-typed one would silently turn anti-rollback off."""
        data = self._json(VERSIONS, {})
        if not isinstance(data, dict):
            raise damaged(self.root, f"{VERSIONS} is not an object")
        for name, seen in data.items():
            ok = (
                isinstance(seen, dict)
                and set(seen) <= {"version", "bundle_id", "allowed"}
                and type(seen.get("version")) is int
                and seen["version"] >= 0
                and isinstance(seen.get("bundle_id"), (str, type(None)))
                and isinstance(seen.get("allowed", []), list)
                and all(isinstance(x, str) for x in seen.get("allowed", []))
            )
            if not ok:
                raise damaged(
                    self.root,
                    f'{VERSIONS} entry {str(name)[:60]!r} is not {{"version": N, "bundle_id": ID, "allowed": [ID, ...]}}',
                )
        return data

    def keys(self) -> dict[str, TrustedKey]:
        revoked = self.revoked()
        out: dict[str, TrustedKey] = {}
        d = self.root / KEYS
        for pub in sorted(d.glob("*.pub")) if d.is_dir() else []:
            try:
                data = read_key_file(pub, "trusted key")
            except SignatureError as e:  # a FIFO, a device, a directory, too big: damaged, refuse everything
                raise damaged(self.root, e.message) from None
            key = load_public_pem(data, str(pub))
            kid = key_id(key)
            meta = self._json(f"{KEYS}/{kid}.json", {})
            na = meta.get("not_after") if isinstance(meta, dict) else ...
            if na is ... or not isinstance(na, (str, type(None))):
                raise damaged(self.root, f'{KEYS}/{kid}.json is not {{"not_after": ISO-8601 time}}')
            out[kid] = TrustedKey(kid, key, pub, parse_time(na, str(d / f"{kid}.json")) if na else None, kid in revoked)
        return out

    # the check ----------------------------------------------------------------------------------
    def check(self, bundle: Any, *, older_ok: bool = False) -> Admitted:
        """Refuse ``bundle`` (an opened :class:`~edge.bundle.bundle.Bundle`) unless this store vouches for it.
        ``older_ok``: an operator's rollback on the device may go below the highest version seen."""
        bid = bundle.id
        where = f"bundle {bid}"
        sig = Signature.read(Path(bundle.path) / SIGNATURE_FILE)
        if sig is None:
            raise SignatureError(
                f"refusing unsigned {where}: the trust store {self.root} requires a signature",
                hint="sign it with `edgekit sign BUNDLE --key NAME`",
            )
        if sig.key_id in self.revoked():
            raise SignatureError(
                f"refusing {where}: it is signed by key {sig.key_id}, which is revoked",
                hint="sign it again with a current key",
            )
        keys = self.keys()
        key = keys.get(sig.key_id)
        if key is None:
            raise SignatureError(
                f"refusing {where}: it is signed by key {sig.key_id}, which the trust store {self.root} does not hold",
                hint="add the signer's public key with `edgekit trust add KEY.pub`, or sign with a trusted key",
            )
        if key.expired():
            raise SignatureError(
                f"refusing {where}: key {sig.key_id} expired at {key.not_after.isoformat()}",  # type: ignore[union-attr]
                hint="sign it again with a current key",
            )
        if not verify_signature(bundle.manifest, sig, key.public_key):
            raise SignatureError(
                f"refusing {where}: its signature does not match its manifest (edited after signing, or signed by another key)",
                hint="sign it again with `edgekit sign`",
            )
        info = bundle.info
        if info.version is None or info.name is None:
            raise SignatureError(
                f"refusing {where}: its signed manifest has no name and version",
                hint="sign it with this edgekit's `edgekit sign`",
            )
        targets = self.targets()
        if targets is not None and info.target.name not in targets:
            raise SignatureError(
                f"refusing {where}: it is built for target {info.target.name}, this device runs {', '.join(targets)}",
                hint="convert it for this device's target",
            )
        seen = self.versions().get(info.name)  # every entry checked: a damaged file refuses, never skips
        if seen is not None:
            top, top_id = seen["version"], seen.get("bundle_id")
            allowed = seen.get("allowed", [])
            if info.version < top and bid not in allowed and not older_ok:
                raise SignatureError(
                    f"refusing {where}: version {info.version} of {info.name} is older than "
                    f"version {top} already seen here (a rollback or freeze attempt?)",
                    hint="ship a newer signed version; to go back on purpose, use `edgekit rollback` on the device",
                )
            if info.version == top and top_id not in (None, bid):
                raise SignatureError(
                    f"refusing {where}: version {top} of {info.name} was already seen here as bundle {top_id}",
                    hint="sign the new bundle with a higher --version",
                )
        return Admitted(sig.key_id, info.name, info.version)

    # writing ------------------------------------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _write(self, name: str, data: Any) -> None:

        write_json_atomic(self.root / name, data)

    def record(self, admitted: Admitted, bundle_id: str) -> None:
        """Remember that version ``admitted.version`` of ``admitted.name`` was admitted (deployed)."""
        with self._locked():
            versions = self.versions()
            seen = versions.get(admitted.name)
            top = seen.get("version") if isinstance(seen, dict) else None
            if not isinstance(top, int) or admitted.version > top:
                versions[admitted.name] = {"version": admitted.version, "bundle_id": bundle_id, "allowed": []}
                self._write(VERSIONS, versions)

    def allow(self, admitted: Admitted, bundle_id: str) -> None:
        """An operator's rollback to an older bundle: admit exactly that one below the highest version."""
        with self._locked():
            versions = self.versions()
            seen = versions.get(admitted.name)
            if isinstance(seen, dict) and isinstance(seen.get("version"), int) and admitted.version < seen["version"]:
                allowed = [x for x in seen.get("allowed", []) if isinstance(x, str)]
                if bundle_id not in allowed:
                    versions[admitted.name] = {**seen, "allowed": [*allowed, bundle_id]}
                    self._write(VERSIONS, versions)

    def add_key(self, pem: bytes, source: str, *, not_after: str | None = None) -> TrustedKey:
        key = load_public_pem(pem, source)
        kid = key_id(key)
        expiry = parse_time(not_after, "--expires") if not_after else None
        with self._locked():
            (self.root / KEYS).mkdir(parents=True, exist_ok=True)
            from edge.bundle.signing import public_pem

            (self.root / KEYS / f"{kid}.pub").write_text(public_pem(key), encoding="ascii")
            meta = self.root / KEYS / f"{kid}.json"
            if expiry is not None:
                self._write(f"{KEYS}/{kid}.json", {"not_after": expiry.isoformat()})
            else:
                meta.unlink(missing_ok=True)
        return self.keys()[kid]

    def revoke(self, kid: str) -> None:
        if not isinstance(kid, str) or not KEY_ID.fullmatch(kid):
            raise SignatureError(f"{str(kid)[:40]!r} is not a key id (16 hex digits, see `edgekit trust list`)")
        with self._locked():
            ids = self.revoked()
            if kid not in ids:
                self._write(REVOKED, {"revoked": sorted(ids | {kid})})

    def set_targets(self, targets: list[str]) -> None:
        with self._locked():
            self._write(DEVICE, {"targets": list(targets)})


def resolve_trust(
    explicit: TrustStore | str | os.PathLike[str] | None = None, store_root: str | os.PathLike[str] | None = None
) -> TrustStore | None:
    """The trust store that applies: ``explicit``, else ``$EDGEKIT_TRUST_DIR``, else a local device
    store's ``trust/`` when it exists; None when there is none (nothing is checked)."""
    if isinstance(explicit, TrustStore):
        return explicit
    if explicit is not None:
        p = Path(explicit)
        if not p.is_dir():
            raise SignatureError(f"trust store {p} does not exist", hint="create it with `edgekit trust add KEY.pub`")
        return TrustStore(p)
    env = os.environ.get(TRUST_DIR_ENV)
    if env:
        if not Path(env).is_dir():
            raise SignatureError(
                f"${TRUST_DIR_ENV} names {env}, which is not a directory",
                hint="create it with `edgekit trust add KEY.pub --trust-dir DIR`, or unset it",
            )
        return TrustStore(env)
    if store_root is not None:
        own = Path(store_root) / STORE_TRUST
        if own.is_dir():
            return TrustStore(own)
        if os.path.lexists(own):  # a file, a dangling link, a FIFO: damaged, never "no trust store"
            raise damaged(own, "it is not a directory")
    return None


def damaged(root: Path, problem: str) -> SignatureError:
    """The one-line refusal of a trust store that exists but cannot be read: it refuses every bundle."""
    return SignatureError(
        f"trust store {root} is damaged: {problem}; every bundle is refused until it is repaired",
        hint="restore it, or remove it and add the keys again with `edgekit trust add KEY.pub`",
    )


def no_trust_note(where: str) -> str:
    return (
        f"{where} has no trust store: bundle signatures are not checked (add one with "
        f"`edgekit trust add KEY.pub --store DIR`, or set ${TRUST_DIR_ENV})"
    )
