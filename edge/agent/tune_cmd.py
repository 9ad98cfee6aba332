"""``cmd/tune`` on the device: measure the trials of an ``edgekit fleet tune`` study here and reply with the figures.

    edgekit/<fleet>/<device>/cmd/tune    the request (host -> device), typed and versioned JSON (``TuneRequest``)
    edgekit/<fleet>/<device>/tune        the replies (device -> host, QoS 1, not retained): ``accepted``,
                                         ``progress``, then one of ``done``, ``refused``, ``busy``, ``failed``

Nothing in a request is trusted: its size, every field's type and range, the artifact URLs (``http(s)://`` only,
no credentials), sha256s, trial ids and runner options (only the options the bundle's runner declares, scalar
values) are checked into frozen dataclasses before anything is fetched; a refusal names the field. One request
runs at a time, never while a rollout's apply (download to watch) runs: a second gets ``busy``. A desired state
that arrives during a tune is held until the tune ends, then applied (``Agent._hold_for_tune``: reported ``idle``
with ``progress.waiting_for = "tune"`` meanwhile; the ``done`` reply names it in ``rollout_waiting``).

A trial whose runner this device cannot run (the runner's declared requirements: a package, the OS, a GPU) is
answered ``unavailable: <what is missing>`` before anything is fetched; the host lists it as pruned on the device.
Each trial's bundle travels as a rollout artifact does (``edge.agent.download.fetch``: resume, sha256; then
``unpack_bundle`` and ``Bundle.open`` with the store's trust store, as ``edge.agent.apply`` verifies), and is
measured as ``edgekit tune`` measures on the host (``edge.tune.measure``: the trial's own reference check, then
interleaved repetitions timing only ``infer``). The trial bundles are deleted afterwards.

This module is imported when the first ``cmd/tune`` arrives, never at agent start; numpy, the runtimes and
``edge.tune.measure`` only inside the worker thread.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import shutil
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import urlparse

from edge.agent.host import AgentHost
from edge.errors import EdgeError, daemon_error_line
from edge.mqtt.payloads import MAX_TUNE_REQUEST_BYTES as MAX_REQUEST_BYTES
from edge.mqtt.payloads import SCHEMA_VERSION, encode, message
from edge.mqtt.topics import Topic

log = logging.getLogger("edge.agent")

REQUEST_TYPE = "tune-request"
REPLY_KIND = "tune"
#: a trial's status when this device lacks what its runner needs (a package, the OS, a GPU): not fetched, not run
UNAVAILABLE = "unavailable"
MAX_TRIALS = 64
MAX_URL = 2048
OBJECTIVES = ("latency", "throughput")  # e2e needs the video on the device: not over MQTT
LIMITS = {"reps": (1, 50), "iters": (1, 10_000), "warmup": (0, 1_000)}
REQUEST_FIELDS = {"schema_version", "type", "fleet", "device", "ts", "study_id", "objective", "schedule", "trials"}
TRIAL_FIELDS = {"id", "url", "sha256", "size", "runner", "precision", "options"}
_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")
_SHA = re.compile(r"[0-9a-f]{64}")
MAX_SIZE = 8 << 30


class TuneRequestError(EdgeError):
    """A ``cmd/tune`` request the device refuses; ``field`` names what is wrong."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"tune request: {field}: {problem}")
        self.field, self.problem = field, problem


@dataclass(frozen=True)
class TuneTrial:
    id: str
    url: str
    sha256: str
    size: int
    runner: str
    precision: str
    options: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class TuneRequest:
    study_id: str
    objective: str
    reps: int
    iters: int
    warmup: int
    trials: tuple[TuneTrial, ...]

    @classmethod
    def parse(cls, payload: bytes, *, fleet: str, device: str) -> TuneRequest:
        if len(payload) > MAX_REQUEST_BYTES:
            raise TuneRequestError("payload", f"{len(payload)} bytes; at most {MAX_REQUEST_BYTES}")
        try:
            obj = json.loads(payload.decode("utf-8"), parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise TuneRequestError("payload", f"not JSON: {str(e)[:80]}") from None
        if not isinstance(obj, dict):
            raise TuneRequestError("payload", "not a JSON object")
        _unknown(obj, REQUEST_FIELDS, "")
        if obj.get("schema_version") != SCHEMA_VERSION:
            raise TuneRequestError(
                "schema_version", f"must be {SCHEMA_VERSION}, got {str(obj.get('schema_version'))[:20]!r}"
            )
        if obj.get("type") != REQUEST_TYPE:
            raise TuneRequestError("type", f"must be {REQUEST_TYPE!r}")
        if obj.get("fleet") != fleet or obj.get("device") != device:
            raise TuneRequestError("device", "the request names another fleet or device than its topic")
        study = _ident(obj.get("study_id"), "study_id")
        objective = obj.get("objective")
        if objective not in OBJECTIVES:
            raise TuneRequestError("objective", f"must be one of {', '.join(OBJECTIVES)}, got {str(objective)[:40]!r}")
        sched = obj.get("schedule")
        if not isinstance(sched, dict):
            raise TuneRequestError("schedule", "must be an object {reps, iters, warmup}")
        _unknown(sched, set(LIMITS), "schedule.")
        nums = {k: _int(sched.get(k), f"schedule.{k}", lo, hi) for k, (lo, hi) in LIMITS.items()}
        trials = obj.get("trials")
        if not isinstance(trials, list) or not 1 <= len(trials) <= MAX_TRIALS:
            raise TuneRequestError("trials", f"must be a list of 1 to {MAX_TRIALS} trials")
        parsed = tuple(_trial(t, f"trials[{i}]") for i, t in enumerate(trials))
        ids = [t.id for t in parsed]
        if len(set(ids)) != len(ids):
            raise TuneRequestError("trials", "trial ids must be unique")
        return cls(study_id=study, objective=objective, trials=parsed, **nums)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _unknown(obj: Mapping[str, Any], allowed: set[str], prefix: str) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        raise TuneRequestError(prefix + str(extra[0])[:40], "unknown field")


def _ident(v: Any, where: str) -> str:
    if not isinstance(v, str) or not _ID.fullmatch(v) or v.startswith((".", "-")):
        raise TuneRequestError(where, "must be an id ([A-Za-z0-9._-], 1-64, not starting with '.' or '-')")
    return v


def _int(v: Any, where: str, lo: int, hi: int) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise TuneRequestError(where, f"must be an integer in [{lo}, {hi}], got {str(v)[:20]!r}")
    return v


def _url(v: Any, where: str) -> str:
    if not isinstance(v, str) or not v or len(v) > MAX_URL:
        raise TuneRequestError(where, f"must be a URL of at most {MAX_URL} characters")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in v):
        raise TuneRequestError(where, "contains whitespace or a control character")
    try:  # a bad IPv6 host or port makes urlparse or .port raise ValueError: a refusal, never a traceback
        u = urlparse(v)
        host, _port = u.hostname, u.port
    except ValueError as e:
        raise TuneRequestError(where, f"is not a valid URL: {str(e)[:80]}") from None
    if u.scheme not in ("http", "https"):
        raise TuneRequestError(where, f"scheme {u.scheme[:20]!r} is not allowed: http:// or https:// only")
    if not host:
        raise TuneRequestError(where, "has no host")
    if u.username or u.password:
        raise TuneRequestError(where, "carries credentials; use a presigned URL (query) instead")
    return v


def _trial(t: Any, where: str) -> TuneTrial:
    if not isinstance(t, dict):
        raise TuneRequestError(where, "must be an object")
    _unknown(t, TRIAL_FIELDS, where + ".")
    sha = t.get("sha256")
    if not isinstance(sha, str) or not _SHA.fullmatch(sha):
        raise TuneRequestError(f"{where}.sha256", "must be 64 lower-case hex digits")
    runner = t.get("runner")
    if not isinstance(runner, str) or not _NAME.fullmatch(runner):
        raise TuneRequestError(f"{where}.runner", "must be a runner name ([A-Za-z0-9_], 1-64)")
    precision = t.get("precision")
    if not isinstance(precision, str) or not _ID.fullmatch(precision):
        raise TuneRequestError(f"{where}.precision", "must be a precision name")
    opts = t.get("options")
    if not isinstance(opts, dict) or len(opts) > 16:
        raise TuneRequestError(f"{where}.options", "must be an object of at most 16 runner options")
    for k, v in opts.items():
        if not _NAME.fullmatch(k):
            raise TuneRequestError(f"{where}.options", f"option name {k[:40]!r} is not [A-Za-z0-9_]")
        ok = (
            isinstance(v, bool)
            or (type(v) is int and -(2**31) <= v < 2**31)
            or (isinstance(v, str) and len(v) <= 64 and v.isprintable())
        )
        if not ok:
            raise TuneRequestError(f"{where}.options.{k}", "must be a boolean, an integer or a short string")
    return TuneTrial(
        id=_ident(t.get("id"), f"{where}.id"),
        url=_url(t.get("url"), f"{where}.url"),
        sha256=sha,
        size=_int(t.get("size"), f"{where}.size", 1, MAX_SIZE),
        runner=runner,
        precision=precision,
        options=tuple(sorted(opts.items())),
    )


# -- the device side ----------------------------------------------------------------------------------


def device_host() -> dict[str, Any]:
    """Who measured: the figures the host's table states (CPU model and the ISA flags edgekit reads)."""
    import socket

    from edge.backends.threads import usable_cpus
    from edge.capabilities import cpu_isa, current_host

    h, isa = current_host(), cpu_isa()
    return {
        "hostname": socket.gethostname(),
        "os": h.os,
        "arch": h.arch,
        "cpu": isa.model,
        "isa": sorted(isa.flags),
        "cpus": usable_cpus(),
        "nvidia_gpu": h.nvidia_gpu,
        "jetson": h.jetson,
    }


class TuneJob:
    """One request on its own thread; ``Agent.tune`` holds it while it runs."""

    def __init__(self, agent: AgentHost, req: TuneRequest) -> None:
        self.agent, self.req = agent, req
        self.stop = threading.Event()
        self.dir = agent.config.store / "agent" / "tune" / f"{req.study_id}-{secrets.token_hex(4)}"
        self.thread = threading.Thread(target=self._run, name="edgekit-tune", daemon=True)

    def _reply(self, status: str, **body: Any) -> None:
        reply(self.agent, status, self.req.study_id, **body)

    def _run(self) -> None:
        t0 = time.monotonic()
        try:
            trials = self._work()
            final: tuple[str, dict[str, Any]] = (
                "done",
                {
                    "host": device_host(),
                    "trials": trials,
                    "wall_s": round(time.monotonic() - t0, 2),
                    "workload": self._workload(),
                },
            )
            held = self.agent.held
            if held is not None:  # a rollout waited for this tune; the agent applies it now
                final[1]["rollout_waiting"] = {"rollout_id": held.rollout_id, "version": held.version}
        except TuneRequestError as e:
            final = ("refused", {"field": e.field, "error": str(e)})
        except Exception as e:  # noqa: BLE001 - reported to the host; the agent goes on
            log.error("tune %s: %s", self.req.study_id, daemon_error_line("agent tune", e))
            final = ("failed", {"error": f"{type(e).__name__}: {str(e)[:500]}"})
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.agent.tune_done(self)  # before the reply: the next request, sent on it, is not "busy"
        self._reply(final[0], **final[1])
        log.info("tune %s: %s in %.1f s", self.req.study_id, final[0], time.monotonic() - t0)

    def _workload(self) -> str:
        w = self.agent.worker
        return "the agent's own model ran meanwhile" if w is not None else "none (the agent runs no model)"

    def _work(self) -> list[dict[str, Any]]:
        from edge.backends.runner import RUNNERS

        req = self.req
        for i, t in enumerate(req.trials):  # the runner's declared option set: checked before anything is fetched
            try:
                cls = RUNNERS.get(t.runner)
            except EdgeError:
                raise TuneRequestError(
                    f"trials[{i}].runner", f"{t.runner!r} is not a runner this device knows"
                ) from None
            for k, _ in t.options:
                if k not in cls.options:
                    raise TuneRequestError(
                        f"trials[{i}].options.{k}",
                        f"runner {t.runner!r} takes no such option (it takes: {', '.join(sorted(cls.options))})",
                    )
        recs: dict[str, dict[str, Any]] = {t.id: {"id": t.id, "status": "pending"} for t in req.trials}
        lacking: dict[str, list[str]] = {}  # runner -> what this device lacks for it (its declared requirements)
        for t in req.trials:
            if t.runner not in lacking:
                lacking[t.runner] = RUNNERS.get(t.runner).problems()
            if lacking[t.runner]:  # said before anything is fetched, not found by failing to load
                recs[t.id]["status"] = (
                    f"{UNAVAILABLE}: runner {t.runner} cannot run on this device: " + "; ".join(lacking[t.runner])
                )[:400]
        bundles: dict[str, Any] = {}  # sha256 -> Bundle or the error that stopped it
        for t in req.trials:
            if recs[t.id]["status"] != "pending":
                continue
            if t.sha256 not in bundles:
                self._reply("progress", step=f"fetching {len(bundles) + 1}", trial=t.id)
                bundles[t.sha256] = self._fetch(t)
            b = bundles[t.sha256]
            if isinstance(b, str):
                recs[t.id]["status"] = b
            elif b.info.runner.name != t.runner:
                recs[t.id]["status"] = (
                    f"failed: the bundle's runner is {b.info.runner.name}, the trial names {t.runner}"
                )
            if self.stop.is_set():
                raise RuntimeError("the agent stopped during the tune")
        todo = [t for t in req.trials if recs[t.id]["status"] == "pending"]
        self._measure(todo, recs, bundles)
        return [recs[t.id] for t in req.trials]

    def _fetch(self, t: TuneTrial) -> Any:
        """The trial's bundle, downloaded and verified as a rollout's; the reason (text) when it cannot be."""
        from edge.agent.download import DownloadError, fetch
        from edge.bundle.archive import ArchiveError, unpack_bundle
        from edge.bundle.bundle import Bundle

        agent = self.agent
        try:
            archive = fetch(
                t.url, self.dir / "downloads", t.sha256, size=t.size, options=agent.config.download, stop=self.stop
            )
            staged = unpack_bundle(archive, self.dir / "staging", sha256=t.sha256)
            archive.unlink(missing_ok=True)
        except DownloadError as e:
            return f"{e.code}: {str(e)[:300]}"
        except ArchiveError as e:
            return f"bad_archive: {str(e)[:300]}"
        store = agent.store
        if store is None:
            return f"failed: the device store {agent.config.store} is not usable ({agent.state_detail})"
        try:
            return Bundle.open(staged, trust=store.trust if store.trust is not None else False)
        except EdgeError as e:
            return f"untrusted or invalid bundle: {str(e).splitlines()[0][:300]}"

    def _measure(self, todo: list[TuneTrial], recs: dict[str, dict[str, Any]], bundles: Mapping[str, Any]) -> None:
        from edge.tune.config import Config
        from edge.tune.measure import MAX_OPEN, measure_infer, open_trial_runner

        req = self.req
        done = 0
        for i in range(0, len(todo), MAX_OPEN):
            opened: dict[str, Any] = {}
            try:
                for t in todo[i : i + MAX_OPEN]:
                    rec = recs[t.id]
                    cfg = Config(t.runner, t.precision, (), t.options)
                    try:
                        opened[t.id] = open_trial_runner(rec, bundles[t.sha256], cfg)
                    except EdgeError as e:
                        rec["status"] = f"failed to load: {str(e).splitlines()[0][:300]}"
                    if self.stop.is_set():
                        raise RuntimeError("the agent stopped during the tune")
                self._reply(
                    "progress",
                    step=f"measuring {len(opened)} trials, {req.reps} interleaved repetitions of {req.iters} inferences",
                    done=done,
                    total=len(todo),
                )
                if opened:
                    got = measure_infer(opened, req.objective, req.reps, req.iters, req.warmup)
                    for tid, m in got.items():
                        recs[tid]["measurement"] = m
                        recs[tid]["status"] = "measured"
                done += len(opened)
            finally:
                for runner, _ in opened.values():
                    runner.close()


def reply(agent: AgentHost, status: str, study_id: str | None, **body: Any) -> None:
    """One reply on ``edgekit/<fleet>/<device>/tune`` (QoS 1, not retained), from any thread."""
    cfg, session, loop = agent.config, agent.session, agent.loop
    if session is None or loop is None:
        return
    msg = message(
        REPLY_KIND,
        cfg.fleet,
        cfg.device_id,
        session.session,
        session.seq,
        {"study_id": study_id, "status": status, **body},
    )
    data = encode(msg)
    topic = str(Topic(cfg.fleet, cfg.device_id, REPLY_KIND))
    loop.call_soon(lambda: session.conn.publish(topic, data, qos=1))


def handle(agent: AgentHost, payload: bytes) -> TuneJob | None:
    """A ``cmd/tune`` payload (the MQTT loop thread): refused, busy, or started on its own thread."""
    cfg = agent.config
    try:
        req = TuneRequest.parse(payload, fleet=cfg.fleet, device=cfg.device_id)
    except TuneRequestError as e:
        agent.ratelog.warning("tune_refused", "%s", e)  # one line per interval: the sender chooses the rate
        reply(agent, "refused", _study_of(payload), field=e.field, error=str(e))
        return None
    except Exception as e:  # noqa: BLE001 - a check missed: still a refusal, never a traceback per message
        agent.ratelog.warning("tune_refused", "tune request refused: %s: %s", type(e).__name__, str(e)[:200])
        reply(agent, "refused", _study_of(payload), field="payload", error=f"{type(e).__name__}: {str(e)[:200]}")
        return None
    job = TuneJob(agent, req)
    busy = agent.tune_start(job)  # checked and taken under the agent's lock: an apply cannot start between
    if busy is not None:
        agent.ratelog.info("tune_busy", "tune %s: %s", req.study_id, busy)
        reply(agent, "busy", req.study_id, error=busy)
        return None
    reply(agent, "accepted", req.study_id, trials=len(req.trials))
    log.info("tune %s: %d trials, %s, %dx%d", req.study_id, len(req.trials), req.objective, req.reps, req.iters)
    job.thread.start()
    return job


def _study_of(payload: bytes) -> str | None:
    """The study id of a refused request when it is a safe id (so the host can match the refusal), else None."""
    try:
        obj = json.loads(payload[:MAX_REQUEST_BYTES].decode("utf-8"))
        sid = obj.get("study_id") if isinstance(obj, dict) else None
        return _ident(sid, "study_id")
    except (ValueError, UnicodeDecodeError, RecursionError, TuneRequestError):
        return None
