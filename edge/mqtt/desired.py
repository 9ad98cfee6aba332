"""Desired and reported state of one device: the typed payloads of the rollout protocol.

    edgekit/<fleet>/<device>/desired    retained, written by whoever rolls out (never by the device)
    edgekit/<fleet>/<device>/reported   retained, written by the device

A desired state names one bundle by id, where to download it (``artifact_url``: ``http(s)://``, or
``file://`` under the agent's ``--artifact-root`` only), its sha256 and size, and a ``version``
that only goes up; ``replaces`` is the version it supersedes. The agent applies a desired state
only when its version is higher than every version it has accepted before (persisted in
``<store>/agent/desired.json``), so a late, duplicated or replayed message cannot move a device
backwards.

Nothing in a payload is trusted: every field is checked here into a frozen dataclass, and no
field may name a local path outside the artifact root, a library or a command. The bundle itself
is then verified (every listed sha256, the signature where a trust store exists) before install.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import unquote, urlparse

from edge.errors import EdgeError
from edge.mqtt.payloads import SCHEMA_VERSION, message

MAX_DESIRED_BYTES = 16 * 1024
MAX_URL = 2048
MAX_VERSION = 2**53
_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
_SHA = re.compile(r"[0-9a-f]{64}")
DESIRED_FIELDS = {
    "schema_version",
    "type",
    "fleet",
    "device",
    "ts",
    "rollout_id",
    "bundle_id",
    "version",
    "replaces",
    "artifact_url",
    "sha256",
    "size",
    "budget_ms",
    "watch_s",
}


class DesiredError(EdgeError):
    """A desired-state payload the agent refuses (it is logged and reported, never applied)."""


#: ``reported.state``: where the device is with the latest desired state
STATES = (
    "idle",
    "downloading",
    "verifying",
    "smoke-testing",
    "switching",
    "watching",
    "running",
    "rolled-back",
    "failed",
)
TERMINAL = ("running", "rolled-back", "failed")

#: ``reported.reason.code``: why an apply did not end in ``running`` (machine-readable; ``detail`` is for people)
REASONS = (
    "bad_artifact_url",
    "download_failed",
    "disk_full",
    "sha256_mismatch",
    "bad_archive",
    "bundle_invalid",
    "untrusted",
    "install_failed",
    "load_failed",
    "reference_pairs_failed",
    "fallback",
    "over_budget",
    "inference_error",
    "watch_p99_over_budget",
    "watch_fallback",
    "watch_inference_error",
    "watch_reference_drift",
    "timeout",
    "rollback_failed",
    "bundle_mismatch",
    "superseded",
    "interrupted",
    "invalid_desired",
)


def _id(obj: Mapping[str, Any], key: str) -> str:
    v = obj.get(key)
    if not isinstance(v, str) or not _ID.fullmatch(v) or v.startswith((".", "-")):
        raise DesiredError(
            f"desired.{key} must be an id ([A-Za-z0-9._-], 1-128, not starting with '.' or '-'), got {str(v)[:80]!r}"
        )
    return v


def _uint(obj: Mapping[str, Any], key: str, *, optional: bool = False) -> int | None:
    v = obj.get(key)
    if v is None and optional:
        return None
    if type(v) is not int or not 0 <= v < MAX_VERSION:
        raise DesiredError(f"desired.{key} must be an integer in [0, 2^53), got {str(v)[:40]!r}")
    return v


def _pos(obj: Mapping[str, Any], key: str) -> float | None:
    v = obj.get(key)
    if v is None:
        return None
    if type(v) not in (int, float) or not 0 < v < 1e7:
        raise DesiredError(f"desired.{key} must be a positive number, got {str(v)[:40]!r}")
    return float(v)


#: the artifact URL of a desired state whose bundle the device's own store holds (a fleet rollback to the
#: bundle it ran before, deployed by hand, no artifact registered anywhere): applied from the store, never
#: downloaded; a device that does not hold it fails the apply (``download_failed``)
HELD_URL = "store:held"


def check_artifact_url(url: Any, artifact_root: Path | None) -> str:
    """``http(s)://host/...`` (no credentials in it), ``file://`` naming a file under ``artifact_root``, or
    ``HELD_URL`` (the device's store holds the bundle)."""
    if url == HELD_URL:
        return HELD_URL
    try:
        return _check_artifact_url(url, artifact_root)
    except DesiredError:
        raise
    except ValueError as e:  # urllib's own parsing refused it (a bad percent-escape, a bad host)
        raise DesiredError(f"desired.artifact_url {str(url)[:200]!r} is not a valid URL: {e}") from None


def _check_artifact_url(url: Any, artifact_root: Path | None) -> str:
    if not isinstance(url, str) or not url or len(url) > MAX_URL:
        raise DesiredError(f"desired.artifact_url must be a URL of at most {MAX_URL} characters")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        raise DesiredError("desired.artifact_url contains whitespace or a control character")
    try:  # urlparse and .port raise ValueError on a bad IPv6 host or port: a refusal, never a traceback
        u = urlparse(url)
        host, _port = u.hostname, u.port
    except ValueError as e:
        raise DesiredError(f"desired.artifact_url {url[:200]!r} is not a valid URL: {e}") from None
    if u.scheme in ("http", "https"):
        if not host:
            raise DesiredError(f"desired.artifact_url {url[:200]!r} has no host")
        if u.username or u.password:
            raise DesiredError("desired.artifact_url carries credentials; use a presigned URL (query) instead")
        return url
    if u.scheme == "file":
        if artifact_root is None:
            raise DesiredError(
                "desired.artifact_url is a file:// URL, but this agent has no --artifact-root",
                hint="a payload may name a local file only under the artifact root the device configured",
            )
        if u.netloc not in ("", "localhost") or u.query or u.fragment:
            raise DesiredError(f"desired.artifact_url {url[:200]!r}: file:// URLs take a path only")
        root = artifact_root.resolve()
        path = unquote(u.path, errors="strict")  # not valid UTF-8 once unquoted: UnicodeDecodeError, a ValueError
        if "\x00" in path:
            raise DesiredError(f"desired.artifact_url {url[:200]!r} holds a NUL byte")
        p = Path(path)
        try:
            resolved = p.resolve(strict=False)
        except (OSError, RuntimeError, ValueError):
            raise DesiredError(f"desired.artifact_url {url[:200]!r} does not resolve") from None
        if not p.is_absolute() or not resolved.is_relative_to(root) or resolved == root:
            raise DesiredError(f"desired.artifact_url {url[:200]!r} is outside the artifact root {root}")
        return url
    raise DesiredError(f"desired.artifact_url scheme {u.scheme!r} is not supported", hint="use http(s):// or file://")


@dataclass(frozen=True)
class DesiredState:
    rollout_id: str
    bundle_id: str
    version: int
    replaces: int | None
    artifact_url: str
    sha256: str
    size: int | None = None
    budget_ms: float | None = None  # the rollout's latency budget; default: the agent's / the bundle's
    watch_s: float | None = None  # how long the new bundle is watched after the switch; default: the agent's

    @classmethod
    def parse(cls, payload: bytes, *, fleet: str, device: str, artifact_root: Path | None = None) -> DesiredState:
        if len(payload) > MAX_DESIRED_BYTES:
            raise DesiredError(f"desired payload is {len(payload)} bytes; at most {MAX_DESIRED_BYTES}")
        try:
            obj = json.loads(payload.decode("utf-8"), parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise DesiredError(f"desired payload is not JSON: {str(e)[:80]}") from None
        if not isinstance(obj, dict):
            raise DesiredError("desired payload is not a JSON object")
        return cls.from_json(obj, fleet=fleet, device=device, artifact_root=artifact_root)

    @classmethod
    def from_json(
        cls, obj: Mapping[str, Any], *, fleet: str, device: str, artifact_root: Path | None = None
    ) -> DesiredState:
        unknown = sorted(set(obj) - DESIRED_FIELDS)
        if unknown:
            raise DesiredError(f"desired payload has unknown fields: {', '.join(repr(k)[:40] for k in unknown[:10])}")
        if obj.get("schema_version") != SCHEMA_VERSION or obj.get("type") != "desired":
            raise DesiredError(f"desired payload must carry schema_version {SCHEMA_VERSION} and type 'desired'")
        if obj.get("fleet") != fleet or obj.get("device") != device:
            raise DesiredError("desired payload names another fleet or device than its topic")
        sha = obj.get("sha256")
        if not isinstance(sha, str) or not _SHA.fullmatch(sha):
            raise DesiredError("desired.sha256 must be 64 lower-case hex digits")
        version = _uint(obj, "version")
        replaces = _uint(obj, "replaces", optional=True)
        assert version is not None
        if replaces is not None and replaces >= version:
            raise DesiredError(f"desired.replaces ({replaces}) must be lower than desired.version ({version})")
        return cls(
            rollout_id=_id(obj, "rollout_id"),
            bundle_id=_id(obj, "bundle_id"),
            version=version,
            replaces=replaces,
            artifact_url=check_artifact_url(obj.get("artifact_url"), artifact_root),
            sha256=sha,
            size=_uint(obj, "size", optional=True),
            budget_ms=_pos(obj, "budget_ms"),
            watch_s=_pos(obj, "watch_s"),
        )

    def to_json(self, fleet: str, device: str) -> dict[str, Any]:
        body = {k: v for k, v in self.__dict__.items() if v is not None or k == "replaces"}
        msg = message("desired", fleet, device, 0, 0, body)
        for k in ("session", "seq"):  # desired is written by the rollout side, not a device session
            msg.pop(k)
        return msg


def salvage(payload: bytes) -> tuple[str | None, int | None, str | None]:
    """From a desired payload that was refused: its rollout_id, version and bundle_id where each is well formed
    (None where not), so the refusal can be reported against the rollout that sent it. Never raises."""
    try:
        obj = json.loads(payload[:MAX_DESIRED_BYTES].decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None, None, None
    if not isinstance(obj, dict):
        return None, None, None
    out: list[Any] = []
    for key, check in (("rollout_id", _id), ("version", _uint), ("bundle_id", _id)):
        try:
            out.append(check(obj, key))
        except DesiredError:
            out.append(None)
    return out[0], out[1], out[2]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


@dataclass(frozen=True)
class Reason:
    code: str
    detail: str
    step: str

    def __post_init__(self) -> None:
        if self.code not in REASONS:
            raise ValueError(f"unknown reason code {self.code!r}")

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "detail": self.detail[:2000], "step": self.step}


@dataclass(frozen=True)
class ReportedState:
    """What the device says about its desired state (retained on ``reported``)."""

    state: str
    bundle_running: str | None
    rollout_id: str | None = None
    desired_version: int | None = None
    desired_bundle: str | None = None
    reason: Reason | None = None
    reference_check: Mapping[str, Any] | None = None
    smoke: Mapping[str, Any] | None = None
    health: Mapping[str, Any] | None = None
    progress: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"unknown reported state {self.state!r}")

    def body(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "bundle_running": self.bundle_running,
            "rollout_id": self.rollout_id,
            "desired_version": self.desired_version,
            "desired_bundle": self.desired_bundle,
            "reason": self.reason.to_json() if self.reason else None,
            "reference_check": _slim_check(self.reference_check),
            "smoke": self.smoke,
            "health": self.health,
            "progress": self.progress,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ReportedState:
        """Read back a reported payload (tests, the rollout side); checks the closed sets."""
        r = obj.get("reason")
        return cls(
            state=obj["state"],
            bundle_running=obj.get("bundle_running"),
            rollout_id=obj.get("rollout_id"),
            desired_version=obj.get("desired_version"),
            desired_bundle=obj.get("desired_bundle"),
            reason=Reason(r["code"], r["detail"], r["step"]) if isinstance(r, dict) else None,
            reference_check=obj.get("reference_check"),
            smoke=obj.get("smoke"),
            health=obj.get("health"),
            progress=obj.get("progress"),
        )


def _slim_check(check: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The reference check without its per-output arrays (a retained message stays small)."""
    if check is None:
        return None
    keep = ("passed", "samples", "skipped", "error", "failures", "recorded", "checked_utc")
    return {k: check[k] for k in keep if k in check}
