"""The fleet's certificates: a CA, device keys made on the device, client certificates signed from CSRs.

Two halves that never share a private key:

- the **device side** (:func:`make_device_key_and_csr`) makes the key where it will live,
  writes it there (mode 0600) and hands out only a certificate signing request;
- the **CA side** (:func:`sign_csr`) takes CSR bytes and nothing else, checks them (a valid
  self-signature, one common name of the allowed form, an accepted key type), and issues a
  certificate whose subject and extensions it chooses itself: nothing else in the CSR is copied.

:func:`provision` runs both halves on one machine for convenience (``edgekit fleet provision``);
``edgekit fleet csr`` and ``edgekit fleet sign-csr`` run them on two.

Identities: a device's certificate has CN = its device id (``[A-Za-z0-9._-]{1,64}``), which the
broker uses as the MQTT user name (Mosquitto ``use_identity_as_username``) and the ACL (see
``edge.fleet.acl``) binds to ``edgekit/<fleet>/<id>/...``. A collector's CN is ``collector:<name>``,
a form no device id can take, so no device certificate can ever carry a collector's rights.
Server (broker) certificates carry their host names as subjectAltName and are good only for
serverAuth, so they cannot log in as a client.

Keys are ECDSA P-256: every TLS stack a device may have (OpenSSL, mbedTLS, wolfSSL, BoringSSL)
speaks it, while Ed25519 certificates are still refused by many embedded stacks and brokers.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Sequence

from edge.errors import EdgeError, InputFileError, MissingDependencyError

DEVICE_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
COLLECTOR_PREFIX = "collector:"
CA_CERT, CA_KEY = "ca.crt", "ca.key"
MAX_CSR_BYTES = 16 * 1024
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*")


class PkiError(EdgeError):
    """A certificate, key or CSR that cannot be made, read or signed as asked."""


class Role(str, Enum):
    DEVICE = "device"
    COLLECTOR = "collector"
    SERVER = "server"


def _x509() -> Any:
    try:
        from cryptography import x509
    except ImportError:
        raise MissingDependencyError(
            "the fleet CA needs the cryptography package", hint="pip install 'edgekit-ml[fleet]'"
        ) from None
    return x509


def check_device_id(device_id: str) -> str:
    if not isinstance(device_id, str) or not DEVICE_ID.fullmatch(device_id):
        raise PkiError(
            f"device id {str(device_id)[:80]!r} is not 1 to 64 of A-Z a-z 0-9 . _ -",
            hint="the id becomes the broker user name and a topic level, so nothing else is allowed",
        )
    return device_id


def identity(name: str, role: Role | str = Role.DEVICE) -> str:
    """The certificate CN (and so the broker user name) for ``name`` in ``role``."""
    role = Role(role)
    if role is Role.DEVICE:
        return check_device_id(name)
    if role is Role.COLLECTOR:
        return COLLECTOR_PREFIX + check_device_id(name)
    if not _is_ip(name) and not _HOST.fullmatch(name):
        raise PkiError(f"server name {name[:80]!r} is neither a host name nor an IP address")
    return name


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _check_identity(cn: str, role: Role) -> None:
    if role is Role.DEVICE:
        check_device_id(cn)
    elif role is Role.COLLECTOR:
        if not cn.startswith(COLLECTOR_PREFIX):
            raise PkiError(f"a collector's CN must be {COLLECTOR_PREFIX}<name>, got {cn[:80]!r}")
        check_device_id(cn[len(COLLECTOR_PREFIX) :])
    else:
        identity(cn, role)


def _write_private(path: Path, data: bytes) -> None:
    """Create ``path`` with mode 0600 from the start (never readable by others, not even for a moment)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except OSError as e:
        raise PkiError(f"cannot write {path}: {e.strerror or e}") from None


def _write_public(path: Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    except OSError as e:
        raise PkiError(f"cannot write {path}: {e.strerror or e}") from None


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)


def _new_key() -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    pem: bytes = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return pem


def _pem(obj: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    pem: bytes = obj.public_bytes(serialization.Encoding.PEM)
    return pem


def _public_der(pub: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    der: bytes = pub.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return der


def _name(cn: str) -> Any:
    x509 = _x509()
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


# the CA ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CaFiles:
    directory: Path
    cert: Path
    key: Path


def ca_files(directory: str | os.PathLike[str]) -> CaFiles:
    d = Path(directory)
    return CaFiles(d, d / CA_CERT, d / CA_KEY)


def init_ca(directory: str | os.PathLike[str], *, name: str = "edgekit fleet CA", days: int = 3650) -> CaFiles:
    """A new fleet CA in ``directory``: ``ca.key`` (0600) and a self-signed ``ca.crt``. Never overwrites."""
    x509 = _x509()
    from cryptography.hazmat.primitives import hashes

    files = ca_files(directory)
    for f in (files.cert, files.key):
        if f.exists():
            raise PkiError(
                f"{f} already exists: a fleet CA is never overwritten",
                hint="every certificate it signed would stop working; use another --dir",
            )
    if not 1 <= days <= 36500:
        raise PkiError(f"--days {days}: use 1 to 36500")
    if not name or len(name) > 64:
        raise PkiError("the CA name must be 1 to 64 characters")
    key = _new_key()
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + _dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(files.key, _key_pem(key))
    _write_public(files.cert, _pem(cert))
    return files


def _load_ca(directory: str | os.PathLike[str]) -> tuple[Any, Any]:
    x509 = _x509()
    from cryptography.hazmat.primitives import serialization

    files = ca_files(directory)
    for what, f in (("certificate", files.cert), ("key", files.key)):
        if not f.is_file():
            raise InputFileError(
                f"no fleet CA {what} at {f}", hint="create the CA with `edgekit fleet ca init --dir DIR`"
            )
    try:
        cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
        key = serialization.load_pem_private_key(files.key.read_bytes(), password=None)
    except (ValueError, TypeError) as e:
        raise PkiError(f"the fleet CA in {files.directory} cannot be read: {e}") from None
    if _public_der(key.public_key()) != _public_der(cert.public_key()):
        raise PkiError(f"{files.key} is not the key of {files.cert}")
    return cert, key


# the device side ------------------------------------------------------------------------------
@dataclass(frozen=True)
class KeyAndCsr:
    key: Path  # stays where it was made
    csr: bytes  # PEM: the only thing that goes to the CA


def make_device_key_and_csr(name: str, out_dir: str | os.PathLike[str], *, role: Role | str = Role.DEVICE) -> KeyAndCsr:
    """On the device (or the collector's/broker's host): a new key written to ``out_dir/<name>.key``
    (0600, never overwritten), and a CSR for it. Only the CSR is to leave this machine."""
    x509 = _x509()
    from cryptography.hazmat.primitives import hashes

    role = Role(role)
    cn = identity(name, role)
    key_path = Path(out_dir) / f"{name}.key"
    if key_path.exists():
        raise PkiError(f"{key_path} already exists", hint="a key is never overwritten; use another --out")
    key = _new_key()
    csr = x509.CertificateSigningRequestBuilder().subject_name(_name(cn)).sign(key, hashes.SHA256())
    _write_private(key_path, _key_pem(key))
    return KeyAndCsr(key_path, _pem(csr))


# the CA side ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _CsrSubject:
    """What the CA takes from a checked CSR: its public key and its single common name."""

    key: Any
    cn: str


def _checked_csr(csr_pem: bytes) -> _CsrSubject:
    """Parse a CSR and check it: its size, a self-signature that verifies, an accepted key type (ECDSA P-256 or
    Ed25519) and a subject that is one CN and nothing else; any failure is a :class:`PkiError`."""
    x509 = _x509()
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519
    from cryptography.x509.oid import NameOID

    if len(csr_pem) > MAX_CSR_BYTES:
        raise PkiError(f"the CSR is {len(csr_pem)} bytes; at most {MAX_CSR_BYTES}")
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError:
        raise PkiError("not a PEM certificate signing request (-----BEGIN CERTIFICATE REQUEST-----)") from None
    try:  # a CSR changed after signing may not even hold a valid key: every way it fails is a refusal
        pub = csr.public_key()
        valid = csr.is_signature_valid
    except (ValueError, TypeError) as e:
        raise PkiError(f"the CSR cannot be verified: {str(e)[:120]}") from None
    if not valid:
        raise PkiError("the CSR's signature does not verify: it was not made with the key it carries")
    if not (
        isinstance(pub, ed25519.Ed25519PublicKey)
        or (isinstance(pub, ec.EllipticCurvePublicKey) and pub.curve.name == "secp256r1")
    ):
        raise PkiError(f"the CSR's key is {type(pub).__name__}: the fleet CA signs ECDSA P-256 or Ed25519 keys")
    if len(csr.subject) != 1:
        raise PkiError("the CSR's subject must be a single CN, nothing else")
    cns = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(cns) != 1 or not isinstance(cns[0].value, str):
        raise PkiError("the CSR's subject must be a single CN, nothing else")
    return _CsrSubject(key=pub, cn=cns[0].value)


def _leaf_key_usage() -> Any:
    """The keyUsage of every certificate the CA issues: digital signatures only."""
    x509 = _x509()
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


def sign_csr(
    csr_pem: bytes,
    ca_dir: str | os.PathLike[str],
    *,
    role: Role | str = Role.DEVICE,
    days: int = 365,
    sans: Sequence[str] = (),
) -> bytes:
    """The CA's half: check a CSR and return a certificate (PEM) for its key. Takes no private key but the CA's.

    The subject is the CSR's CN alone (re-checked for ``role``); extensions come from ``role``, never
    from the CSR. For a server, ``sans`` (default: the CN) become the subjectAltName.
    """
    x509 = _x509()
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID

    role = Role(role)
    if not 1 <= days <= 3650:
        raise PkiError(f"--days {days}: use 1 to 3650")
    csr = _checked_csr(csr_pem)
    pub, cn = csr.key, csr.cn
    _check_identity(cn, role)
    ca_cert, ca_key = _load_ca(ca_dir)
    now = _now()
    not_after = min(now + _dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    eku = ExtendedKeyUsageOID.SERVER_AUTH if role is Role.SERVER else ExtendedKeyUsageOID.CLIENT_AUTH
    b = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(pub)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_leaf_key_usage(), critical=True)
        .add_extension(x509.ExtendedKeyUsage([eku]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if role is Role.SERVER:
        names = []
        for n in sans or [cn]:
            identity(n, Role.SERVER)
            names.append(x509.IPAddress(ipaddress.ip_address(n)) if _is_ip(n) else x509.DNSName(n))
        b = b.add_extension(x509.SubjectAlternativeName(names), critical=False)
    elif sans:
        raise PkiError("subjectAltNames go on server certificates only")
    return _pem(b.sign(ca_key, hashes.SHA256()))


@dataclass(frozen=True)
class Provisioned:
    identity: str  # the certificate CN, the broker user name
    role: Role
    key: Path
    cert: Path
    ca_cert: Path  # a copy of the fleet CA certificate, to verify the broker with


def provision(
    name: str,
    ca_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    role: Role | str = Role.DEVICE,
    days: int = 365,
    sans: Sequence[str] = (),
) -> Provisioned:
    """Both halves on one machine: key + CSR into ``out_dir``, the CSR signed by the CA in ``ca_dir``.

    ``out_dir`` gets ``<name>.key`` (0600), ``<name>.crt`` and ``ca.crt``. The key is made in
    ``out_dir`` and only the CSR goes to :func:`sign_csr`, as it would between two machines.
    """
    role = Role(role)
    out = Path(out_dir)
    cert_path = out / f"{name}.crt"
    if cert_path.exists():
        raise PkiError(f"{cert_path} already exists", hint="use another --out")
    identity(name, role)
    if Path(ca_dir).resolve() == out.resolve():
        raise PkiError("--out is the CA's directory: a device's key does not belong next to the CA key")
    _load_ca(ca_dir)  # fail before a key is made
    made = make_device_key_and_csr(name, out, role=role)
    try:
        cert = sign_csr(made.csr, ca_dir, role=role, days=days, sans=sans)
    except BaseException:
        made.key.unlink(missing_ok=True)
        raise
    _write_public(cert_path, cert)
    ca_copy = out / CA_CERT
    _write_public(ca_copy, ca_files(ca_dir).cert.read_bytes())
    return Provisioned(identity(name, role), role, made.key, cert_path, ca_copy)


def certificate_identity(cert_pem: bytes) -> str:
    """The CN of a PEM certificate (what the broker takes as the user name)."""
    x509 = _x509()
    from cryptography.x509.oid import NameOID

    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        raise PkiError("not a PEM certificate (-----BEGIN CERTIFICATE-----)") from None
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(cns) != 1:
        raise PkiError("the certificate has no single CN")
    return str(cns[0].value)
