"""The application reports its own inference to the agent over a local socket (no MQTT client in the app).

An application that runs the model itself (edgekit's Python API, or anything that can write to a Unix
socket) sends small JSON datagrams to the agent's Unix datagram socket (``--source app`` or
``app:PATH``; default ``<store>/agent/app.sock``); the agent folds them into its telemetry window, as
the source ``app``: frames, fps, latency percentiles, budget misses, dropped frames, inference errors.

One datagram, at most ``MAX_DATAGRAM`` bytes, is one JSON object::

    {"v": 1, "latency_ms": 8.2}                              one frame
    {"v": 1, "latency_ms": [8.2, 7.9, 9.1], "dropped": 1}    several frames (at most MAX_SAMPLES_PER_REPORT)
    {"v": 1, "errors": 1}                                    an inference that failed
    {"v": 1, "latency_ms": 8.2, "bundle": "<bundle id>"}     the bundle that ran them (optional)

**Following a switch.** The agent switches bundles by moving the store's ``current`` link (a rollout, a
rollback, ``edgekit deploy``). The application learns it from ``AppReporter.current_bundle()`` (a
``readlink`` of ``<store>/current``, cheap enough to call once a second or every N frames), reloads its
model from ``<store>/bundles/<id>`` when it differs from the one it runs, and sets ``reporter.bundle`` to
the id it now runs: its reports then carry that id. During a rollout's watch the agent judges the new
bundle only on reports naming it (or naming no bundle): frames the application still ran on the old
model after the switch do not count for or against the new one, and an application that reports frames
before the switch and none on the new bundle during the watch (it crashed, or never reloaded) fails it.

Nothing in a datagram is trusted: a datagram that is too large, not JSON, of another version, with an
unknown field, or a value of the wrong type or out of range is dropped whole and counted by reason
(``AppSocket.refused``), logged at most once per reason per minute, and never stops the agent. Who
may write is the socket file's permissions (0660: the agent's user and group).

On the application's side, ``AppReporter`` (or ``edge.agent.report(...)``) never blocks and never raises
for a missing or busy agent: what cannot be sent is counted (``lost``) and dropped.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import socket
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Sequence

from edge.errors import EdgeError
from edge.mqtt.ratelog import RateLimitedLog

log = logging.getLogger("edge.agent.app")

VERSION = 1
MAX_DATAGRAM = 16 * 1024
MAX_SAMPLES_PER_REPORT = 1000
MAX_SAMPLES_PER_WINDOW = 100_000  # past this, samples are counted in `overflow`, not kept
MAX_LATENCY_MS = 1e7
MAX_COUNT = 1_000_000
FIELDS = {"v", "latency_ms", "errors", "dropped", "bundle"}
REFUSALS = ("oversized", "malformed", "version", "unknown_field", "bad_value")
ENV_SOCKET = "EDGEKIT_APP_SOCKET"
ENV_STORE = "EDGEKIT_STORE"
_UNIX_PATH_MAX = 107  # sun_path is 108 bytes on Linux, NUL included
_BUNDLE_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


class Refused(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class AppReport:
    """One checked datagram."""

    latency_ms: tuple[float, ...] = ()
    errors: int = 0
    dropped: int = 0
    bundle: str | None = None  # the bundle the application ran them on, when it says

    @classmethod
    def parse(cls, data: bytes) -> AppReport:
        if len(data) > MAX_DATAGRAM:
            raise Refused("oversized", f"{len(data)} bytes, at most {MAX_DATAGRAM}")
        try:
            obj = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise Refused("malformed", f"not JSON: {str(e)[:80]}") from None
        if not isinstance(obj, dict):
            raise Refused("malformed", f"a JSON {type(obj).__name__}, not an object")
        if obj.get("v") != VERSION or type(obj.get("v")) is not int:
            raise Refused("version", f"v must be {VERSION}, got {str(obj.get('v'))[:20]!r}")
        unknown = sorted(set(obj) - FIELDS)
        if unknown:
            raise Refused("unknown_field", ", ".join(repr(k)[:40] for k in unknown[:5]))
        lat = obj.get("latency_ms", [])
        lat = [lat] if not isinstance(lat, list) else lat
        if len(lat) > MAX_SAMPLES_PER_REPORT:
            raise Refused("bad_value", f"{len(lat)} latencies in one report, at most {MAX_SAMPLES_PER_REPORT}")
        for v in lat:
            if type(v) not in (int, float) or not 0 <= v < MAX_LATENCY_MS:  # NaN fails both comparisons
                raise Refused("bad_value", f"latency_ms {str(v)[:20]!r} is not a number in [0, {MAX_LATENCY_MS:g})")
        bundle = obj.get("bundle")
        if bundle is not None and (not isinstance(bundle, str) or not _BUNDLE_ID.fullmatch(bundle)):
            raise Refused("bad_value", f"bundle {str(bundle)[:40]!r} is not a bundle id")
        return cls(tuple(float(v) for v in lat), _count(obj, "errors"), _count(obj, "dropped"), bundle)

    def encode(self) -> bytes:
        body: dict[str, Any] = {"v": VERSION}
        if self.latency_ms:
            body["latency_ms"] = list(self.latency_ms) if len(self.latency_ms) != 1 else self.latency_ms[0]
        if self.errors:
            body["errors"] = self.errors
        if self.dropped:
            body["dropped"] = self.dropped
        if self.bundle is not None:
            body["bundle"] = self.bundle
        return json.dumps(body, separators=(",", ":")).encode()


def _count(obj: dict[str, Any], key: str) -> int:
    v = obj.get(key, 0)
    if type(v) is not int or not 0 <= v <= MAX_COUNT:
        raise Refused("bad_value", f"{key} {str(v)[:20]!r} is not an integer in [0, {MAX_COUNT}]")
    return v


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def latency_json(samples: Sequence[float]) -> dict[str, Any]:
    """``edge.stats.LatencyStats.to_json()`` of the samples, without numpy (the lean agent never imports it):
    the same keys, percentiles by linear interpolation (numpy's default), sample standard deviation."""
    a = sorted(samples)
    n = len(a)

    def pct(q: float) -> float:
        pos = q / 100 * (n - 1)
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        return a[lo] + (a[hi] - a[lo]) * (pos - lo)

    mean = math.fsum(a) / n
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in a) / (n - 1)) if n > 1 else 0.0
    return {
        k: round(v, 4) if isinstance(v, float) else v
        for k, v in {
            "count": n,
            "p50_ms": pct(50),
            "p90_ms": pct(90),
            "p99_ms": pct(99),
            "max_ms": a[-1],
            "min_ms": a[0],
            "mean_ms": mean,
            "std_ms": std,
        }.items()
    }


@dataclass
class AppWindow:
    """What the application reported since the last telemetry message."""

    samples: list[float] = field(default_factory=list)
    errors: int = 0
    dropped: int = 0
    reports: int = 0
    overflow: int = 0  # samples past MAX_SAMPLES_PER_WINDOW (counted as frames, not in the percentiles)

    @property
    def frames(self) -> int:
        return len(self.samples) + self.overflow


def _fold(w: AppWindow, r: AppReport) -> None:
    room = MAX_SAMPLES_PER_WINDOW - len(w.samples)
    w.samples.extend(r.latency_ms[: max(0, room)])
    w.overflow += max(0, len(r.latency_ms) - max(0, room))
    w.errors += r.errors
    w.dropped += r.dropped
    w.reports += 1


class AppSocket:
    """The agent's end: a Unix datagram socket at ``path`` read by a thread, reports accumulated per window."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._window = AppWindow()
        self._health = AppWindow()  # a rollout's watch window (edge.agent.apply), apart from telemetry's
        self._health_bundle: str | None = None  # only reports naming this bundle (or none) go to _health
        self.last_report: float | None = None  # time.monotonic() of the latest accepted report
        self.refused = {r: 0 for r in REFUSALS}
        self.received = 0
        self._ratelog = RateLimitedLog(log, interval_s=60.0)
        self._stop = threading.Event()
        self._sock = self._bind(self.path)
        self._thread = threading.Thread(target=self._run, name="edgekit-appsocket", daemon=True)

    @staticmethod
    def _bind(path: Path) -> socket.socket:
        if len(os.fsencode(str(path))) > _UNIX_PATH_MAX:
            raise EdgeError(
                f"app socket path {str(path)[:80]}... is longer than {_UNIX_PATH_MAX} bytes",
                hint="give a shorter one: --source app:/run/edgekit/app.sock",
            )
        try:
            st = path.lstat()
        except FileNotFoundError:
            st = None
        if st is not None:
            if not stat.S_ISSOCK(st.st_mode):  # never remove a file that is not a socket
                raise EdgeError(f"app socket path {path} exists and is not a socket", hint="give another path")
            path.unlink()  # a socket left by an agent that stopped: nobody reads it
        path.parent.mkdir(parents=True, exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            old = os.umask(0o117)  # created 0660: the agent's user and group may write, nobody else
            try:
                sock.bind(str(path))
            finally:
                os.umask(old)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            sock.settimeout(0.2)  # the thread looks at its stop flag this often
        except OSError as e:
            sock.close()
            raise EdgeError(f"cannot open the app socket {path}: {e.strerror or e}") from None
        return sock

    def start(self) -> AppSocket:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._sock.recv(MAX_DATAGRAM + 1)  # one byte more: an oversized datagram is seen as one
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                time.sleep(0.1)
                continue
            self.handle(data)

    def handle(self, data: bytes) -> bool:
        """One datagram: folded into the window, or refused and counted (never raises)."""
        try:
            r = AppReport.parse(data)
        except Refused as e:
            with self._lock:
                self.refused[e.reason] += 1
                n = self.refused[e.reason]
            self._ratelog.warning(e.reason, "app socket: refused datagram #%d (%s): %s", n, e.reason, e.detail)
            return False
        with self._lock:
            _fold(self._window, r)
            if r.bundle is None or r.bundle == self._health_bundle:
                _fold(self._health, r)
            self.received += 1
            self.last_report = time.monotonic()
        return True

    def take_window(self) -> AppWindow:
        with self._lock:
            w, self._window = self._window, AppWindow()
        return w

    def watch(self, bundle_id: str | None) -> None:
        """Start a rollout's watch window: from now on, reports naming ``bundle_id`` (or no bundle) count."""
        with self._lock:
            self._health_bundle, self._health = bundle_id, AppWindow()

    def take_health(self) -> AppWindow:
        """The watch window's reports since the last call."""
        with self._lock:
            w, self._health = self._health, AppWindow()
        return w

    def counters(self) -> dict[str, Any]:
        with self._lock:
            return {"received": self.received, "refused": dict(self.refused)}

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2.0)
        self._sock.close()
        try:
            if stat.S_ISSOCK(self.path.lstat().st_mode):
                self.path.unlink()
        except OSError:
            pass


class AppReporter:
    """The application's end. ``frame(ms)`` buffers (sent every ``batch`` frames or ``max_delay_s``);
    ``report(...)`` sends at once. Never blocks, never raises for a missing or busy agent: counts ``lost``.

    ``bundle``: the id of the bundle the application runs, sent with every report (set ``reporter.bundle``
    after a reload). ``store``: the agent's device store, for ``current_bundle()``; default
    ``$EDGEKIT_STORE``, else the store the default socket path ``<store>/agent/app.sock`` lies in."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        batch: int = 100,
        max_delay_s: float = 1.0,
        bundle: str | None = None,
        store: str | os.PathLike[str] | None = None,
    ) -> None:
        path = path if path is not None else os.environ.get(ENV_SOCKET)
        if not path:
            raise EdgeError(
                "no app socket to report to",
                hint=f"pass its path, or set {ENV_SOCKET} (the agent's --source app:PATH; default <store>/agent/app.sock)",
            )
        if not 1 <= batch <= MAX_SAMPLES_PER_REPORT:
            raise ValueError(f"batch must be between 1 and {MAX_SAMPLES_PER_REPORT}")
        self.path = str(path)
        if store is None and os.environ.get(ENV_STORE):
            store = os.environ[ENV_STORE]
        if store is None and Path(self.path).parent.name == "agent":
            store = Path(self.path).parent.parent
        self.store = Path(store) if store is not None else None
        if bundle is not None and not _BUNDLE_ID.fullmatch(bundle):
            raise ValueError(f"bundle {bundle!r} is not a bundle id")
        self.bundle = bundle
        self.batch, self.max_delay_s = batch, max_delay_s
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        self._lock = threading.Lock()
        self._buf: list[float] = []
        self._errors = 0
        self._first = 0.0
        self.sent = 0  # datagrams
        self.lost = 0  # datagrams the agent did not take (not running, its queue full)

    def frame(self, latency_ms: float | None = None, *, error: bool = False) -> None:
        """One frame: its latency, or ``error=True`` for an inference that failed."""
        if latency_ms is not None:
            _check_latency(latency_ms)
        with self._lock:
            if not self._buf and not self._errors:
                self._first = time.monotonic()
            if latency_ms is not None:
                self._buf.append(float(latency_ms))
            self._errors += bool(error)
            due = len(self._buf) >= self.batch or time.monotonic() - self._first >= self.max_delay_s
        if due:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            buf, errors, self._buf, self._errors = self._buf, self._errors, [], 0
        if buf or errors:
            self._send(AppReport(tuple(buf), errors, 0, self.bundle))

    def report(self, *, latency_ms: float | Sequence[float] | None = None, errors: int = 0, dropped: int = 0) -> bool:
        """Send one report now; False when the agent did not take it."""
        lat = () if latency_ms is None else (latency_ms,) if isinstance(latency_ms, (int, float)) else latency_ms
        for v in lat:
            _check_latency(v)
        if len(lat) > MAX_SAMPLES_PER_REPORT:
            raise ValueError(f"at most {MAX_SAMPLES_PER_REPORT} latencies per report")
        for name, n in (("errors", errors), ("dropped", dropped)):
            if type(n) is not int or not 0 <= n <= MAX_COUNT:
                raise ValueError(f"{name} must be an integer in [0, {MAX_COUNT}]")
        return self._send(AppReport(tuple(float(v) for v in lat), errors, dropped, self.bundle))

    def current_bundle(self) -> str | None:
        """The id of the bundle the store's ``current`` link names now (None: no store known, no bundle, or a
        link that is not ``bundles/<id>``). Compare it with the one the application runs and reload from
        ``<store>/bundles/<id>`` when it changed; then set ``self.bundle``. Never raises."""
        if self.store is None:
            return None
        try:
            target = os.readlink(self.store / "current")
        except OSError:
            return None
        parts = PurePosixPath(target).parts
        if len(parts) != 2 or parts[0] != "bundles" or not _BUNDLE_ID.fullmatch(parts[1]):
            return None
        return parts[1]

    def _send(self, r: AppReport) -> bool:
        try:
            self._sock.sendto(r.encode(), self.path)
        except OSError:  # no agent (ENOENT, ECONNREFUSED), its queue full (EAGAIN): the app goes on
            self.lost += 1
            return False
        self.sent += 1
        return True

    def close(self) -> None:
        self.flush()
        self._sock.close()

    def __enter__(self) -> AppReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_latency(v: Any) -> None:
    if type(v) not in (int, float) or not 0 <= v < MAX_LATENCY_MS:
        raise ValueError(f"latency_ms must be a number in [0, {MAX_LATENCY_MS:g}), got {v!r}")


_default: AppReporter | None = None
_default_lock = threading.Lock()


def report(
    *,
    latency_ms: float | Sequence[float] | None = None,
    errors: int = 0,
    dropped: int = 0,
    path: str | os.PathLike[str] | None = None,
) -> bool:
    """``edge.agent.report(latency_ms=8.2)``: one report through a process-wide ``AppReporter`` (on ``path``,
    else ``$EDGEKIT_APP_SOCKET``). False when the agent did not take it."""
    global _default
    with _default_lock:
        if _default is None or (path is not None and str(path) != _default.path):
            if _default is not None:
                _default.close()
            _default = AppReporter(path)
        reporter = _default
    return reporter.report(latency_ms=latency_ms, errors=errors, dropped=dropped)
