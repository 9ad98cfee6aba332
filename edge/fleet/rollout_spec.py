"""What a rollout is: its spec (waves, watch, timeouts, groups), its abort criteria and how a cohort's devices
are judged by them, and the bundle with its artifact (checked before anything is published).

The criteria (``--abort-if``, AWS IoT Jobs ``abortConfig`` style): a per-device condition and how many devices
may meet it: ``p99>budget``, ``p99>1.2*budget``, ``p99>20`` (ms), ``fps<0.95*target``, ``fallback``,
``parity<threshold`` (any device: abort) or with ``@N`` (more than N devices) or ``@P%`` (more than P% of the
devices that finished, once ``min_devices`` have); counters ``errors>1%``, ``failed>2``, ``rolled_back>0``,
``timed_out>10%`` compare the count itself. A device is judged on its reported state for the rollout's version
(smoke test and watch figures, reason code, reference check) and, for ``fps`` and a running device, on its
latest telemetry from the new bundle.
"""

from __future__ import annotations

import math
import re
import tempfile
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence
from urllib.parse import urlparse

from edge.errors import EdgeError
from edge.mqtt.desired import DesiredError, check_artifact_url
from edge.mqtt.topics import check_part


class RolloutError(EdgeError):
    """A rollout that cannot be started or changed as asked."""


# -- the spec ----------------------------------------------------------------------------------

_NUM = r"\d+(?:\.\d+)?"
_THRESH = rf"(?:\s*@\s*(?P<thresh>{_NUM}%?))?"
_CRIT = [
    ("p99", re.compile(rf"^p99\s*>\s*(?:(?P<abs>{_NUM})(?!\s*\*)|(?:(?P<k>{_NUM})\s*\*\s*)?budget){_THRESH}$")),
    ("fps", re.compile(rf"^fps\s*<\s*(?:(?P<abs>{_NUM})(?!\s*\*)|(?:(?P<k>{_NUM})\s*\*\s*)?target){_THRESH}$")),
    ("fallback", re.compile(rf"^fallback{_THRESH}$")),
    ("parity", re.compile(rf"^parity\s*<\s*threshold{_THRESH}$")),
    ("counter", re.compile(rf"^(?P<name>errors|failed|rolled_back|timed_out)\s*>\s*(?P<thresh>{_NUM}%?)$")),
]
CRITERIA_HELP = (
    "p99>budget | p99>K*budget | p99>MS | fps<K*target | fps<FPS | fallback | parity<threshold, "
    "each optionally @N (more than N devices) or @P% (more than P% of finished devices); "
    "errors|failed|rolled_back|timed_out >N or >P%"
)
# With no --abort-if, one failed device (it refused or could not install or run the bundle) stops its cohort:
# a canary exists to catch exactly that. ``--abort-if none`` says the operator wants no criterion at all.
DEFAULT_ABORT_IF = ("failed>0",)
NO_CRITERIA = "none"
INFERENCE_ERRORS = ("inference_error", "watch_inference_error", "load_failed")
NOT_ERRORS = ("superseded", "interrupted")


@dataclass(frozen=True)
class Criterion:
    text: str
    metric: str  # p99 fps fallback parity errors failed rolled_back timed_out
    factor: float | None = None  # p99 > factor*budget, fps < factor*target
    absolute: float | None = None  # p99 > absolute ms, fps < absolute
    count: int | None = 0  # breach when more than `count` devices meet it...
    percent: float | None = None  # ...or more than `percent` % of the finished devices

    @classmethod
    def parse(cls, text: str) -> Criterion:
        t = text.strip().lower().replace(" ", "")
        for metric, rx in _CRIT:
            m = rx.fullmatch(t)
            if m is None:
                continue
            g = m.groupdict()
            if metric == "counter":
                metric = g["name"]
            count, percent = _thresh(g.get("thresh"), text)
            factor = absolute = None
            if metric in ("p99", "fps"):
                if g.get("abs") is not None:
                    absolute = float(g["abs"])
                else:
                    factor = float(g["k"]) if g.get("k") else 1.0
                if (absolute is not None and absolute <= 0) or (factor is not None and factor <= 0):
                    raise RolloutError(f"--abort-if {text!r}: the limit must be positive")
            return cls(text=text.strip(), metric=metric, factor=factor, absolute=absolute, count=count, percent=percent)
        raise RolloutError(f"malformed --abort-if {text[:80]!r}", hint=f"one of: {CRITERIA_HELP}")


def _thresh(v: str | None, text: str) -> tuple[int | None, float | None]:
    if v is None:
        return 0, None
    if v.endswith("%"):
        p = float(v[:-1])
        if not 0 <= p < 100:
            raise RolloutError(f"--abort-if {text!r}: a percentage is in [0, 100)")
        return None, p
    if "." in v:
        raise RolloutError(f"--abort-if {text!r}: a device count is a whole number")
    return int(v), None


def parse_percent(v: str, what: str) -> float:
    s = v.strip()
    m = re.fullmatch(rf"({_NUM})%", s)
    if m is None:
        raise RolloutError(f"{what} {v[:40]!r} is not a percentage like 5%")
    p = float(m.group(1))
    if not 0 < p <= 100:
        raise RolloutError(f"{what} {v!r} is not in (0%, 100%]")
    return p / 100.0


def parse_waves(v: str) -> list[float]:
    waves = [parse_percent(x, "--waves entry") for x in v.split(",") if x.strip()]
    if not waves:
        raise RolloutError("--waves is empty", hint="e.g. --waves 25%,50%,100%")
    if any(b <= a for a, b in zip(waves, waves[1:])):
        raise RolloutError(f"--waves {v!r} must increase")
    if waves[-1] != 1.0:
        raise RolloutError(f"--waves {v!r} must end at 100%")
    return waves


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(v: str | float, what: str) -> float:
    if isinstance(v, (int, float)):
        s = float(v)
    else:
        m = re.fullmatch(rf"\s*({_NUM})\s*(ms|s|m|h)?\s*", v)
        if m is None:
            raise RolloutError(f"{what} {v[:40]!r} is not a duration like 30s, 10m or 1h")
        s = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if not 0 <= s <= 7 * 86400:
        raise RolloutError(f"{what} {v!r} is not between 0 and 7 days")
    return s


def parse_group(v: str) -> tuple[str, str]:
    key, sep, value = v.partition("=")
    if not sep or not key.strip() or not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", key.strip()):
        raise RolloutError(
            f"--group {v[:80]!r} is not label=value",
            hint="e.g. --group host.model=rpi5 or --group device=cam-*; the label is a field of the device's birth message",
        )
    return key.strip(), value.strip()


def _criteria(texts: Sequence[str]) -> tuple[str, ...]:
    """--abort-if as given; none given: ``DEFAULT_ABORT_IF``; ``none`` alone: no criterion."""
    if not texts:
        return DEFAULT_ABORT_IF
    if any(t.strip().lower() == NO_CRITERIA for t in texts):
        if len(texts) > 1:
            raise RolloutError(
                "--abort-if none cannot be combined with other criteria",
                hint="give either 'none' (no abort criterion) or the criteria you want",
            )
        return ()
    return tuple(Criterion.parse(a).text for a in texts)


@dataclass(frozen=True)
class RolloutFlags:
    """A rollout as the CLI words it (``5%``, ``25%,50%,100%``, ``10m``, ``p99>1.5x``, ``site=lab-*``):
    :meth:`RolloutSpec.parse` reads it into a checked :class:`RolloutSpec`."""

    fleet: str
    canary: str = "5%"
    waves: str = "25%,50%,100%"
    watch: str | float = "10m"
    device_timeout: str | float = "15m"
    abort_if: Sequence[str] = ()
    min_devices: int = 1
    targets: Sequence[str] = ()
    groups: Sequence[str] = ()
    budget_ms: float | None = None
    device_watch: str | float | None = None
    success_rate: str | None = None


@dataclass(frozen=True)
class RolloutSpec:
    fleet: str
    canary: float = 0.05
    waves: tuple[float, ...] = (0.25, 0.5, 1.0)
    watch_s: float = 600.0  # each wave is watched at least this long
    device_timeout_s: float = 900.0  # a device that has not answered by then is timed out (never blocks a wave)
    abort_if: tuple[str, ...] = DEFAULT_ABORT_IF
    min_devices: int = 1  # percentage criteria apply once this many devices of the cohort finished
    targets: tuple[str, ...] = ()  # only these target classes (default: every bundle's)
    groups: tuple[tuple[str, str], ...] = ()  # birth field=glob, all must match
    budget_ms: float | None = None  # the rollout's latency budget, given to the devices
    device_watch_s: float | None = None  # the device's own watch window after the switch (default: the agent's)
    success_rate: float | None = None  # a wave goes on only if this share of its answered devices runs the bundle

    def __post_init__(self) -> None:
        check_part(self.fleet, "fleet")
        for c in self.abort_if:
            Criterion.parse(c)
        if self.min_devices < 1:
            raise RolloutError("--min-devices must be at least 1")
        if self.device_timeout_s <= 0:
            raise RolloutError("--device-timeout must be positive")
        if self.budget_ms is not None and not 0 < self.budget_ms < 1e7:
            raise RolloutError("--budget-ms must be positive")
        if self.device_watch_s is not None and not 0 < self.device_watch_s < 1e7:
            raise RolloutError("--device-watch must be positive")
        if self.success_rate is not None and not 0 < self.success_rate <= 1:
            raise RolloutError("--success-rate must be in (0%, 100%]")

    @classmethod
    def parse(cls, flags: RolloutFlags) -> RolloutSpec:
        """The spec the CLI's words ask for (percentages, durations, criteria, groups), each checked."""
        f = flags
        return cls(
            fleet=f.fleet,
            canary=parse_percent(f.canary, "--canary"),
            waves=tuple(parse_waves(f.waves)),
            watch_s=parse_duration(f.watch, "--watch"),
            device_timeout_s=parse_duration(f.device_timeout, "--device-timeout"),
            abort_if=_criteria(f.abort_if),
            min_devices=f.min_devices,
            targets=tuple(f.targets),
            groups=tuple(parse_group(g) for g in f.groups),
            budget_ms=f.budget_ms,
            device_watch_s=None if f.device_watch is None else parse_duration(f.device_watch, "--device-watch"),
            success_rate=None if f.success_rate is None else parse_percent(f.success_rate, "--success-rate"),
        )

    @property
    def criteria(self) -> list[Criterion]:
        return [Criterion.parse(c) for c in self.abort_if]

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["groups"] = [list(g) for g in self.groups]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RolloutSpec:
        return cls(
            **{
                **d,
                "waves": tuple(d["waves"]),
                "abort_if": tuple(d["abort_if"]),
                "targets": tuple(d["targets"]),
                "groups": tuple(tuple(g) for g in d["groups"]),
            }
        )


# -- the bundle and its artifact -----------------------------------------------------------------


@dataclass(frozen=True)
class RolloutBundle:
    bundle_id: str
    target: str
    url: str
    sha256: str
    size: int

    @property
    def artifact(self) -> dict[str, Any]:
        return {"url": self.url, "sha256": self.sha256, "size": self.size}

    @classmethod
    def prepare(cls, bundle_dir: str | Path, url: str, *, check: bool = True, timeout_s: float = 10.0) -> RolloutBundle:
        """Open the bundle (verified), pack it as the devices will download it (sha256, size), and check
        that ``url`` answers with that many bytes before anything is published."""
        from edge.bundle.archive import pack_bundle
        from edge.bundle.bundle import Bundle

        p = Path(bundle_dir)
        if not (p / "manifest.json").is_file():
            raise RolloutError(
                f"{p} is not a bundle (no manifest.json)", hint="give the directory `edgekit convert` wrote"
            )
        b = Bundle.open(p, trust=False)
        try:
            check_artifact_url(url, Path("/"))
        except DesiredError as e:
            raise RolloutError(f"--artifact-url: {e.message}") from None
        with tempfile.TemporaryDirectory(prefix="edgekit-rollout-") as tmp:
            tar = Path(tmp) / f"{b.id}.tar"
            sha = pack_bundle(p, tar)
            size = tar.stat().st_size
        if check:
            check_url(url, size, timeout_s=timeout_s)
        return cls(bundle_id=b.id, target=str(b.target), url=url, sha256=sha, size=size)


def check_url(url: str, size: int | None, *, timeout_s: float = 10.0) -> None:
    """The artifact URL answers (HEAD, else a one-byte GET) and, when it says, with ``size`` bytes."""
    u = urlparse(url)
    if u.scheme == "file":
        return  # a path on the devices (under their --artifact-root), not on this host
    length: int | None = None
    try:
        req = urllib.request.Request(url, method="HEAD")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                cl = r.headers.get("Content-Length")
                length = int(cl) if cl and cl.isdigit() else None
        except urllib.error.HTTPError as e:
            if e.code not in (403, 405, 501):  # a presigned GET URL refuses HEAD: ask for one byte instead
                raise
            req = urllib.request.Request(url, headers={"Range": "bytes=0-0"})
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                cr = r.headers.get("Content-Range", "")
                length = int(cr.rsplit("/", 1)[1]) if "/" in cr and cr.rsplit("/", 1)[1].isdigit() else None
    except urllib.error.HTTPError as e:
        raise RolloutError(
            f"artifact URL {url[:200]} answers HTTP {e.code}",
            hint="upload the packed bundle (`edgekit fleet rollout pack`) there first",
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        why = getattr(e, "reason", e)
        raise RolloutError(f"artifact URL {url[:200]} is unreachable: {why}") from None
    if size is not None and length is not None and length != size:
        raise RolloutError(
            f"artifact URL {url[:200]} serves {length} bytes; the packed bundle is {size} bytes",
            hint="upload the archive `edgekit fleet rollout pack` writes",
        )


# -- per-device conditions -------------------------------------------------------------------------


def _num(obj: Any, *path: str) -> float | None:
    for p in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(p)
    return float(obj) if type(obj) in (int, float) and math.isfinite(obj) else None


def breaches(
    c: Criterion,
    row: Mapping[str, Any],
    report: Mapping[str, Any] | None,
    telemetry: Mapping[str, Any] | None,
    bundle_id: str,
) -> str | None:
    """Why device ``row`` meets criterion ``c`` (a short text), or None. ``report``: its reported state for
    this rollout's version; ``telemetry``: its latest telemetry (used when it is from the new bundle)."""
    rep = report or {}
    state = row["state"]
    code = (rep.get("reason") or {}).get("code") if isinstance(rep.get("reason"), dict) else None
    if c.metric == "timed_out":
        return "timed out" if state == "timed-out" else None
    if c.metric == "failed":
        return f"failed ({code})" if state == "failed" else None
    if c.metric == "rolled_back":
        return f"rolled back ({code})" if state == "rolled-back" else None
    if c.metric == "errors":
        if state == "failed" and code not in NOT_ERRORS:
            return f"failed ({code})"
        if code in INFERENCE_ERRORS or (_num(rep, "health", "errors") or 0) > 0:
            return f"inference errors ({code or 'health'})"
        return None
    if c.metric == "fallback":
        given = rep.get("smoke")
        smoke = given if isinstance(given, dict) else {}
        if code in ("fallback", "watch_fallback") or smoke.get("fallback"):
            return f"fallback ({code or smoke.get('fallback')})"
        return None
    if c.metric == "parity":
        given_rc, given_health = rep.get("reference_check"), rep.get("health")
        rc = given_rc if isinstance(given_rc, dict) else {}
        health = given_health if isinstance(given_health, dict) else {}
        if (
            code in ("reference_pairs_failed", "watch_reference_drift")
            or rc.get("passed") is False
            or health.get("reference_passed") is False
        ):
            return f"reference pairs failed ({code or 'reference_check'})"
        return None
    tel = telemetry if telemetry is not None and telemetry.get("bundle_id") == bundle_id else None
    if c.metric == "p99":
        seen = [
            (_num(rep, "smoke", "p99_ms"), _num(rep, "smoke", "budget_ms"), "smoke test"),
            (_num(rep, "health", "p99_ms"), _num(rep, "health", "budget_ms"), "watch"),
        ]
        if tel is not None and state == "running":
            seen.append(
                (_num(tel, "inference", "latency_ms", "p99_ms"), _num(tel, "inference", "budget_ms"), "telemetry")
            )
        numbers = False
        for p99, budget, where in seen:
            if p99 is None:
                continue
            limit = c.absolute if c.absolute is not None else (None if budget is None else (c.factor or 1) * budget)
            if limit is None:
                continue
            numbers = True
            if p99 > limit:
                return f"{where} p99 {p99:.3g} ms > {limit:.3g} ms"
        if not numbers and code in ("over_budget", "watch_p99_over_budget"):
            return f"over budget ({code})"
        return None
    if c.metric == "fps":
        if tel is None or state != "running" or not (_num(tel, "inference", "frames") or 0) > 0:
            return None
        fps, target = _num(tel, "inference", "fps"), _num(tel, "inference", "target_fps")
        limit = c.absolute if c.absolute is not None else (None if target is None else (c.factor or 1) * target)
        if fps is not None and limit is not None and fps < limit:
            return f"fps {fps:.3g} < {limit:.3g}"
        return None
    raise AssertionError(c.metric)  # pragma: no cover - the parser knows no other metric


def evaluate(
    c: Criterion,
    rows: Sequence[Mapping[str, Any]],
    reports: Mapping[str, Mapping[str, Any] | None],
    telemetry: Mapping[str, Mapping[str, Any] | None],
    bundle_id: str,
    min_devices: int,
) -> str | None:
    """The abort reason when the cohort's devices (``rows``) breach ``c``, else None."""
    finished = [r for r in rows if r["state"] not in ("assigned", "skipped")]
    bad = []
    for r in rows:
        if r["state"] == "skipped":
            continue
        why = breaches(c, r, reports.get(r["device"]), telemetry.get(r["device"]), bundle_id)
        if why is not None:
            bad.append((r["device"], why))
    if not bad:
        return None
    examples = "; ".join(f"{d}: {w}" for d, w in bad[:5]) + (f"; +{len(bad) - 5} more" if len(bad) > 5 else "")
    if c.percent is None:
        if len(bad) <= (c.count or 0):
            return None
        return f"{c.text}: {len(bad)} device(s) ({examples})"
    total = max(len(finished), len(bad))
    if total < min_devices or 100.0 * len(bad) / total <= c.percent:
        return None
    return f"{c.text}: {len(bad)} of {total} finished device(s), {100.0 * len(bad) / total:.1f}% ({examples})"
