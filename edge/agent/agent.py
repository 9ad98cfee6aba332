"""The device agent: runs the store's current bundle on a frame source and reports over MQTT.

Threads: the inference worker (runner.infer in a loop, paced by the source), the
``NetworkLoop`` (MQTT, outbox, and the telemetry timer) and the control thread, which polls the
store's ``current`` link (a ``readlink`` a second: a deploy or rollback by anyone reloads the
runner, trust-checked, without a restart) and applies desired states (``edge.agent.apply``). The
worker only appends latency samples under a lock; telemetry takes the window every interval,
a rollout's watch reads its own window. With ``--source app`` the application runs the model and a fourth
thread reads its reports from the app socket (``edge.agent.appsocket``) into the telemetry window.

Imports stay lean: numpy, the runtime and ``edge.verify.refpairs`` are imported only when a model runs
(``--source none`` loads none of them).
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import edge
from edge.agent.apply import record_lived, unconfirmed
from edge.agent.download import DownloadOptions, clean_work_dirs
from edge.agent.health import CpuMeter, host_facts, process_and_system
from edge.agent.sources import open_source, parse_source
from edge.agent.thermal import ThermalProbe
from edge.agent.worker import InferenceWorker
from edge.base.typedjson import UnreadableFile, read_json_file, write_json_atomic
from edge.errors import EdgeError, daemon_error_line
from edge.mqtt.client import BrokerConfig
from edge.mqtt.desired import DesiredError, DesiredState, Reason, ReportedState, salvage
from edge.mqtt.identity import DeviceIdentity, KeyNotMade
from edge.mqtt.netloop import Backoff, NetworkLoop
from edge.mqtt.outbox import DEFAULT_MAX_BYTES, DEFAULT_MAX_MESSAGES, SpillOutbox
from edge.mqtt.ratelog import RateLimitedLog
from edge.mqtt.session import DeviceSession, SessionOptions
from edge.mqtt.topics import check_part

log = logging.getLogger("edge.agent")
DEFAULT_FPS = 30.0


@dataclass
class AgentConfig:
    fleet: str
    device_id: str
    broker: BrokerConfig
    store: Path
    source: str = "synthetic"
    fps: float | None = None  # source rate; default: the bundle's frame budget as a rate, else 30
    budget_ms: float | None = None  # default: the bundle's target frame budget, else 1000/fps
    interval_s: float = 5.0
    spool_max_messages: int = DEFAULT_MAX_MESSAGES
    spool_max_bytes: int = DEFAULT_MAX_BYTES
    backoff: Backoff = field(default_factory=Backoff)
    client_id: str | None = None
    runner_options: dict[str, Any] = field(default_factory=dict)  # override the bundle's (e.g. intra_op_num_threads)
    trust_dir: Path | None = None  # default: $EDGEKIT_TRUST_DIR, else <store>/trust when it exists
    poll_current_s: float = 1.0  # how often the store's `current` link is read (0: never; reload needs a restart)
    desired: bool = True  # subscribe to edgekit/<fleet>/<device>/desired and apply it
    artifact_root: Path | None = None  # the only directory a desired file:// URL may name
    watch_s: float = 30.0  # after a switch, how long the new bundle is watched before it counts as running
    smoke_frames: int = 30  # timed inferences of the smoke test's benchmark (0: no benchmark)
    smoke_timeout_s: float = 300.0  # load + reference pairs + benchmark
    verify_timeout_s: float = 300.0  # unpack + every file's sha256 (+ signature), or a stored copy's check
    download: DownloadOptions = field(default_factory=DownloadOptions)

    def __post_init__(self) -> None:
        check_part(self.fleet, "fleet")
        check_part(self.device_id, "device id")
        if self.interval_s <= 0:
            raise EdgeError(f"--interval must be > 0, got {self.interval_s}")
        if (
            self.poll_current_s < 0
            or self.watch_s < 0
            or self.smoke_frames < 0
            or self.smoke_timeout_s <= 0
            or self.verify_timeout_s <= 0
        ):
            raise EdgeError("--poll-current, --watch and --smoke-frames must be >= 0, --smoke-timeout > 0")
        parse_source(self.source)


def read_record(path: Path) -> dict[str, Any]:
    """One of the agent's own small JSON records; {} when it is missing or damaged (then rewritten)."""
    try:
        rec = read_json_file(path, what="agent record", max_bytes=64 << 10, missing={})
    except UnreadableFile as e:
        log.warning("%s: ignored", e)
        return {}
    return rec if isinstance(rec, dict) else {}


def rollout_summary(rollout_id: Any, desired_bundle: Any, version: Any, state: Any, reason: Any) -> dict[str, Any]:
    """The reported state in short, as every ``state`` message carries it (``edge.fleet.metrics`` reads it)."""
    return {
        "rollout_id": rollout_id,
        "desired_bundle": desired_bundle,
        "desired_version": version,
        "state": state,
        "reason": reason,
    }


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.started = time.time()
        self._t0 = time.monotonic()
        self.store: Any = None
        self.bundle: Any = None
        self.bundle_archive_sha256: str | None = None  # the archive pack_bundle makes of it (in the birth)
        self.runner: Any = None
        self.reference_check: dict[str, Any] | None = None  # edge.verify.refpairs.check_on_load's result
        self.worker: InferenceWorker | None = None
        self.state: str = "idle"
        self.state_detail: str | None = None
        self.fps: float | None = None
        self.budget_ms: float | None = None
        self._source_desc = config.source
        self.loop: NetworkLoop | None = None
        self.session: DeviceSession | None = None
        self.outbox: SpillOutbox | None = None
        self.thermal: ThermalProbe | None = None
        self._meter = CpuMeter()
        self._last_tel = time.monotonic()
        self._host = host_facts()
        self.runtime_lock = threading.RLock()  # the runner, worker and bundle change together, under it
        self._current_link: str | None = None  # what `current` pointed at when the runner was loaded
        self.reloads = 0
        self._control: threading.Thread | None = None
        self._control_stop = threading.Event()
        self._desired_q: queue.Queue[DesiredState] = queue.Queue()
        self._desired_seen = 0  # highest desired version accepted (persisted ones included)
        self._apply_cancel: threading.Event | None = None  # set when a newer desired state supersedes the apply
        self.ratelog = RateLimitedLog(log)
        self._refused_digest: str | None = None  # sha256 of the last desired payload refused (reported once)
        # downloads: artifacts fetched; local_switches: desired bundles the store held (no download);
        # already_running: desired states naming the bundle already run (reported running, no watch)
        self.counters = {
            "desired_accepted": 0,
            "desired_ignored": 0,
            "desired_refused": 0,
            "downloads": 0,
            "local_switches": 0,
            "already_running": 0,
        }
        self.reported: ReportedState | None = None
        self._rollout: dict[str, Any] | None = None  # the latest reported state in short, in every state message
        self.app: Any = None  # edge.agent.appsocket.AppSocket with --source app
        self._app_totals = [0, 0]  # frames, budget misses the application reported since start
        self.tune: Any = None  # edge.agent.tune_cmd.TuneJob while a cmd/tune request runs
        # a tune and a rollout's apply never run together: each starts under this lock, seeing the other not running
        self._tune_gate = threading.Lock()
        self.held: DesiredState | None = None  # a desired state waiting for the tune to end (applied after it)

    # bundle and runner -------------------------------------------------------------------
    def _read_current(self) -> str | None:
        try:
            return os.readlink(self.config.store / "current")
        except OSError:
            return None

    def _load(self) -> None:
        from edge.store import DeviceStore

        cfg = self.config
        self._current_link = self._read_current()
        if not cfg.store.is_dir():
            raise EdgeError(
                f"device store {cfg.store} does not exist",
                hint="deploy a bundle to it first: edgekit deploy MODEL --device DIR",
            )
        try:
            store = self.store = DeviceStore(cfg.store, trust=cfg.trust_dir)
        except EdgeError as e:  # a trust store named but missing: refuse to run anything
            self.state, self.state_detail = "error", str(e)
            log.error("%s", e)
            return
        if store.trust is None:
            from edge.bundle.trust import no_trust_note

            log.info(no_trust_note(f"device store {cfg.store}"))
        if store.current is None:
            self.state, self.state_detail = "idle", "no bundle deployed in this store"
            log.warning("%s has no current bundle: reporting health only", cfg.store)
            return
        try:
            self.bundle = store.bundle()  # verified, and vouched for by the trust store when there is one
        except EdgeError as e:
            self.state, self.state_detail = "error", str(e)
            log.error("cannot open the current bundle: %s", e)
            return
        self.bundle_archive_sha256 = _archive_sha256(self.bundle.path)
        frame_budget = self.bundle.manifest.get("target", {}).get("frame_budget_ms")
        self.fps = cfg.fps or (1000.0 / frame_budget if frame_budget else DEFAULT_FPS)
        self.budget_ms = cfg.budget_ms or frame_budget or 1000.0 / self.fps
        kind = parse_source(cfg.source)[0]
        if kind == "none":
            self.state, self.state_detail = "idle", "frame source 'none': the model is not run"
            return
        if kind == "app":  # the application runs the bundle and reports over the app socket
            self.state, self.state_detail = "running", None
            self._lived()
            return
        from edge.verify.refpairs import describe as describe_check
        from edge.verify.refpairs import open_checked

        try:  # the reference pairs checked on first load, recorded in the store (edge.verify.refpairs)
            self.runner = open_checked(self.bundle, cfg.runner_options or None, mode="first", records=store)
            source = open_source(cfg.source, bundle=self.bundle, runner=self.runner, fps=self.fps)
        except EdgeError as e:
            if self.runner is not None:
                self.runner.close()
                self.runner = None
            self.state, self.state_detail = "error", str(e)
            log.error("cannot run bundle %s: %s", self.bundle.id, e)
            return
        self._source_desc = getattr(source, "description", cfg.source)
        self.worker = InferenceWorker(self.runner, source, self.budget_ms)
        self.state, self.state_detail = "running", None
        self.reference_check = self.runner.info.details.get("reference_check")
        failed = describe_check(self.reference_check)
        if failed is not None:  # reported in birth and state; rollout decides what to do about it
            self.state_detail = failed
            log.warning("%s", failed)
        else:
            self._lived()

    def _lived(self) -> None:
        """The bundle loaded runs on this device: a later rollback to it is not refused for its budget
        (``edge.agent.apply``), unless it was just switched to and its watch has not passed yet."""
        if self.bundle is not None and self.budget_ms is not None and unconfirmed(self.config.store) != self.bundle.id:
            record_lived(self.config.store, self.bundle.id, self.budget_ms)

    def _unload(self) -> None:
        if self.worker is not None:
            self.worker.stop()
            close_source = getattr(self.worker.source, "close", None)
            if close_source is not None:
                close_source()
            self.worker = None
        if self.runner is not None:
            self.runner.close()
            self.runner = None
        self.bundle = None
        self.bundle_archive_sha256 = None
        self.reference_check = None

    def reload(self, why: str) -> None:
        """Load the store's current bundle again (trust-checked, as at start) and report the change."""
        with self.runtime_lock:
            old = self.bundle.id if self.bundle is not None else None
            self._unload()
            try:
                self._load()
            except EdgeError as e:
                self.state, self.state_detail = "error", str(e)
            self.reloads += 1
            if self.worker is not None:
                self.worker.start()
            new = self.bundle.id if self.bundle is not None else None
            log.info("reloaded (%s): bundle %s -> %s, state %s", why, old, new, self.state)
            if self.loop is not None and self.session is not None:
                detail = self.state_detail or f"reloaded ({why}): {old} -> {new}"
                self.loop.call_soon(self._set_state, self.state, detail)
                self.loop.call_soon(self._rebirth)

    def _rebirth(self) -> None:
        if self.session is not None and self.session.connected:
            self.session._publish_birth()  # the bundle and runner changed: the retained birth says so

    def _poll_current(self) -> None:
        if self._read_current() != self._current_link:
            self.reload("the store's current bundle changed")

    # desired state -----------------------------------------------------------------------
    def _desired_file(self) -> Path:
        return self.config.store / "agent" / "desired.json"

    def _read_desired_record(self) -> dict[str, Any]:
        return read_record(self._desired_file())

    def record_desired(self, desired: DesiredState, state: str) -> None:
        """Persist the version applied (terminal states only): a restart never applies it, or older, again."""
        write_json_atomic(
            self._desired_file(),
            {
                "version": desired.version,
                "rollout_id": desired.rollout_id,
                "bundle_id": desired.bundle_id,
                "state": state,
            },
        )

    def _on_desired(self, payload: bytes) -> None:
        """A desired payload from the broker (loop thread): checked, compared by version, queued."""
        cfg = self.config
        try:
            d = DesiredState.parse(payload, fleet=cfg.fleet, device=cfg.device_id, artifact_root=cfg.artifact_root)
        except DesiredError as e:
            self._refuse_desired(payload, str(e))
            return
        except Exception as e:  # noqa: BLE001 - a check missed: still one refusal, never a traceback per message
            self._refuse_desired(payload, f"{type(e).__name__}: {str(e)[:200]}")
            return
        if d.version <= self._desired_seen:  # late, duplicated or replayed: never backwards
            self.counters["desired_ignored"] += 1
            self.ratelog.info(
                "desired_ignored",
                "ignoring desired version %d (rollout %s): version %d is newer or the same",
                d.version,
                d.rollout_id,
                self._desired_seen,
            )
            return
        self._desired_seen = d.version
        self.counters["desired_accepted"] += 1
        self._desired_q.put(d)
        cancel = self._apply_cancel
        if cancel is not None:  # the apply in progress is moot: a stuck one never blocks the next
            cancel.set()

    def _refuse_desired(self, payload: bytes, why: str) -> None:
        """A desired payload that cannot be applied: logged (rate-limited) and reported ``failed`` once. The same
        payload delivered again (a retained message after every reconnect, or after a restart: the digest of
        the last one refused is kept in ``<store>/agent/refused.json``) is counted, never reported again."""
        self.counters["desired_refused"] += 1
        self.ratelog.warning("desired_refused", "refusing a desired state: %s", why)
        digest = hashlib.sha256(payload).hexdigest()
        if digest == self._refused_digest:
            return
        self._refused_digest = digest
        rollout_id, version, bundle_id = salvage(payload)
        if version is not None and version <= self._desired_seen:
            return  # an old version: moot whatever it says (never reported over the state of a newer one)
        running = self.bundle.id if self.bundle is not None else None
        self.report(
            ReportedState(
                state="failed",
                bundle_running=running,
                rollout_id=rollout_id,
                desired_version=version,
                desired_bundle=bundle_id,
                reason=Reason("invalid_desired", f"invalid desired state: {why}", "received"),
            )
        )
        try:
            write_json_atomic(self._refused_file(), {"sha256": digest})
        except OSError as e:
            self.ratelog.warning("refused_record", "cannot record the refused desired state: %s", e)

    def _refused_file(self) -> Path:
        return self.config.store / "agent" / "refused.json"

    def report(self, state: ReportedState) -> None:
        """Publish the retained reported state (any thread), and a ``state`` message that carries its summary
        (the stream the collector stores: fleet metrics read each device's rollout from its latest one)."""
        self.reported = state
        self._rollout = rollout_summary(
            state.rollout_id,
            state.desired_bundle,
            state.desired_version,
            state.state,
            state.reason.code if state.reason else None,
        )
        log.info(
            "reported: %s%s", state.state, f" ({state.reason.code}: {state.reason.detail})" if state.reason else ""
        )
        if self.loop is not None and self.session is not None:
            self.loop.call_soon(self.session.publish_reported, state.body())
            self.loop.call_soon(self._submit_state)

    # commands --------------------------------------------------------------------------
    def _on_command(self, name: str, payload: bytes) -> None:
        """``cmd/<name>`` other than rebirth (loop thread). ``tune``: ``edge.agent.tune_cmd``, imported on first use."""
        if name == "tune":
            from edge.agent.tune_cmd import handle

            handle(self, payload)
            return
        if self.session is not None:
            self.session.counters["unknown_commands"] += 1
        self.ratelog.info("unknown_command", "ignoring unknown command %r", name)

    def tune_busy(self) -> str | None:
        """Why a tune request cannot start now (None: it can): one at a time, never beside a rollout's apply."""
        if self.tune is not None:
            return f"busy: tune {self.tune.req.study_id} is running"
        if self.held is not None:  # it waited for the last tune: it goes first
            return (
                f"busy: rollout {self.held.rollout_id} (desired version {self.held.version}) is waiting to be applied"
            )
        if self._apply_cancel is not None or not self._desired_q.empty():
            return "busy: a rollout's desired state is being applied (download to watch)"
        return None

    def tune_start(self, job: Any) -> str | None:
        """Start ``job`` (the MQTT loop thread) unless busy; returns why not."""
        with self._tune_gate:
            busy = self.tune_busy()
            if busy is None:
                self.tune = job
            return busy

    def tune_done(self, job: Any) -> None:
        if self.tune is job:
            self.tune = None

    def _control_loop(self) -> None:
        from edge.agent.apply import Applier

        poll = self.config.poll_current_s
        while not self._control_stop.is_set():
            try:
                d = self._desired_q.get(timeout=poll or 1.0)
            except queue.Empty:
                d = None
            if self._control_stop.is_set():
                return
            try:
                if d is not None:
                    while not self._desired_q.empty():  # the latest wins: older queued ones are moot
                        d = self._desired_q.get_nowait()
                    held = self._hold_for_tune(d)  # sets _apply_cancel when it returns one
                    if held is None:
                        return
                    d, cancel = held
                    try:
                        Applier(self, d, cancel, stopping=self._control_stop).run()
                    finally:
                        self._apply_cancel = None
                elif poll:
                    self._poll_current()
            except Exception as e:  # a bug here must not stop the agent reporting
                log.error("%s", daemon_error_line("agent control thread", e))

    def _hold_for_tune(self, d: DesiredState) -> tuple[DesiredState, threading.Event] | None:
        """The desired state to apply now and its cancel event (``_apply_cancel``), once no device tune runs (None:
        the agent is stopping). A rollout that
        arrives during a tune is held, never lost and never applied beside it (an apply would load a model and
        download while the tune measures): reported ``idle`` with ``progress.waiting_for = "tune"`` until the tune
        ends; a newer desired state arriving meanwhile replaces it (the latest wins, as always)."""
        shown: DesiredState | None = None
        while True:
            with self._tune_gate:
                job = self.tune
                if job is None:
                    self.held = None
                    cancel = self._apply_cancel = threading.Event()
                    return d, cancel
                self.held = d
            if shown is not d:
                log.info(
                    "desired version %d (rollout %s) waits for tune %s to end",
                    d.version,
                    d.rollout_id,
                    job.req.study_id,
                )
                running = self.bundle.id if self.bundle is not None else None
                self.report(
                    ReportedState(
                        state="idle",
                        bundle_running=running,
                        rollout_id=d.rollout_id,
                        desired_version=d.version,
                        desired_bundle=d.bundle_id,
                        progress={"waiting_for": "tune", "study_id": job.req.study_id},
                    )
                )
                shown = d
            if self._control_stop.wait(0.2):
                with self._tune_gate:
                    self.held = None  # not recorded: the retained desired state is applied after a restart
                return None
            while not self._desired_q.empty():
                d = self._desired_q.get_nowait()

    # payload bodies ----------------------------------------------------------------------
    def birth_body(self) -> dict[str, Any]:
        b = self.bundle
        runner = None
        if self.runner is not None:
            from edge.verify.refpairs import runner_json

            runner = runner_json(self.runner)
        return {
            "state": self.state,
            "state_detail": self.state_detail,
            "agent": {
                "edgekit_version": edge.__version__,
                "pid": os.getpid(),
                "started_at": round(self.started, 3),
                "interval_s": self.config.interval_s,
                "source": self._source_desc,
                "fps": self.fps,
                "budget_ms": self.budget_ms,
            },
            # archive_sha256: a fleet rollback to this bundle later is applied from the store, with no artifact
            # registered anywhere (a bundle deployed by hand): the controller names it by this hash
            "bundle": None
            if b is None
            else {
                "id": b.id,
                "target": b.target,
                "precision": b.precision,
                **({"archive_sha256": self.bundle_archive_sha256} if self.bundle_archive_sha256 else {}),
            },
            "runner": runner,
            "reference_check": self.reference_check,
            "host": self._host,
        }

    def telemetry_body(self) -> dict[str, Any]:
        now = time.monotonic()
        window = now - self._last_tel
        self._last_tel = now
        inference: dict[str, Any] | None = None
        worker = self.worker
        if worker is not None:
            from edge.stats import LatencyStats

            samples, misses = worker.take_window()
            if worker.error and self.state != "error":
                self._set_state("error", worker.error)
            inference = {
                "frames": len(samples),
                "fps": round(len(samples) / window, 2) if window > 0 else None,
                "target_fps": self.fps,
                "budget_ms": self.budget_ms,
                "budget_misses": misses,
                "frames_dropped": getattr(worker.source, "dropped", 0),
                "frames_total": worker.total,
                "budget_misses_total": worker.total_misses,
                "latency_ms": LatencyStats.from_ms(samples).to_json() if samples else None,
            }
        if self.app is not None:
            inference = self._app_inference(window)
        assert self.outbox is not None
        bundle = self.bundle
        return {
            "interval_s": self.config.interval_s,
            "window_s": round(window, 3),
            "state": self.state,
            "bundle_id": bundle.id if bundle is not None else None,
            "uptime_s": round(now - self._t0, 1),
            "inference": inference,
            **process_and_system(self._meter),
            "thermal": self.thermal.sample() if self.thermal else None,
            "spool": {
                "pending": self.outbox.pending(),
                "pending_bytes": self.outbox.pending_bytes(),
                "dropped_total": self.outbox.dropped_total,
                "max_messages": self.outbox.max_messages,
                "in_memory": self.outbox.memory.pending(),  # the disk refused them (disk_error): lost at a stop
                "disk_error": self.outbox.disk_error,
            },
        }

    def _app_inference(self, window: float) -> dict[str, Any]:
        """The telemetry ``inference`` section from what the application reported over the app socket."""
        from edge.agent.appsocket import latency_json

        w = self.app.take_window()
        cfg = self.config
        budget = self.budget_ms or cfg.budget_ms or (1000.0 / cfg.fps if cfg.fps else None)
        misses = sum(1 for ms in w.samples if ms > budget) if budget else 0
        self._app_totals[0] += w.frames
        self._app_totals[1] += misses
        # inference errors and not one good frame: the application's model is failing (state error until it
        # reports frames again)
        if w.errors and not w.frames and self.state != "error":
            self._set_state("error", f"the application reported {w.errors} inference error(s) and no frame")
        elif w.frames and self.state == "error" and (self.state_detail or "").startswith("the application"):
            self._set_state("running", None)
        return {
            "source": "app",
            "frames": w.frames,
            "fps": round(w.frames / window, 2) if window > 0 else None,
            "target_fps": self.fps or cfg.fps,
            "budget_ms": budget,
            "budget_misses": misses,
            "frames_dropped": w.dropped,
            "frames_total": self._app_totals[0],
            "budget_misses_total": self._app_totals[1],
            "errors": w.errors,
            "latency_ms": latency_json(w.samples) if w.samples else None,
            "app": {"reports": w.reports, **self.app.counters()},
        }

    def _set_state(self, state: str, detail: str | None) -> None:
        self.state, self.state_detail = state, detail
        self._submit_state()

    def _submit_state(self) -> None:
        """A ``state`` message (loop thread): the agent's state, the bundle it runs, the rollout it is in."""
        if self.session is not None:
            self.session.submit(
                "state",
                {
                    "state": self.state,
                    "detail": self.state_detail,
                    "bundle_id": self.bundle.id if self.bundle is not None else None,
                    "rollout": self._rollout,
                },
            )

    def _tick(self) -> None:
        assert self.session is not None
        self.session.submit("telemetry", self.telemetry_body())

    # lifecycle ---------------------------------------------------------------------------
    def start(self) -> Agent:
        cfg = self.config
        removed = clean_work_dirs(cfg.store / "agent")  # what an earlier run left: unused, never resumed past
        if any(removed.values()):
            log.info(
                "removed what an earlier run left in %s: %s",
                cfg.store / "agent",
                ", ".join(f"{n} in {k}" for k, n in removed.items() if n),
            )
        self._load()
        record = self._read_desired_record()
        self._desired_seen = int(record.get("version") or 0)
        refused = read_record(self._refused_file())
        self._refused_digest = refused.get("sha256") if isinstance(refused.get("sha256"), str) else None
        if self._desired_seen:  # where the last apply ended, until a new desired state arrives
            self._rollout = rollout_summary(
                record.get("rollout_id"), record.get("bundle_id"), self._desired_seen, record.get("state"), None
            )
        try:
            kind, arg = parse_source(cfg.source)
            if kind == "app":
                from edge.agent.appsocket import AppSocket

                self.app = AppSocket(Path(arg) if arg else cfg.store / "agent" / "app.sock").start()
                self._source_desc = f"app:{self.app.path}"
            self.outbox = SpillOutbox.open(  # memory beside the disk while the store's filesystem is full
                cfg.store / "agent" / "outbox.sqlite",
                max_messages=cfg.spool_max_messages,
                max_bytes=cfg.spool_max_bytes,
            )
            self.thermal = ThermalProbe()
            identity = _device_identity(cfg.store / "agent")
            self.loop = NetworkLoop().start()
            self.session = DeviceSession(
                self.loop,
                cfg.broker,
                cfg.fleet,
                cfg.device_id,
                self.outbox,
                birth_body=self.birth_body,
                on_desired=self._on_desired if cfg.desired else None,
                on_command=self._on_command,
                # the key that signs births and deaths: collectors pin it (edge.mqtt.identity)
                options=SessionOptions(client_id=cfg.client_id, backoff=cfg.backoff, identity=identity),
            )
            log.info(
                "agent %s/%s session %d, device key %s, %s, state %s",
                cfg.fleet,
                cfg.device_id,
                self.session.session,
                identity.key_id if identity is not None else "none (unsigned)",
                self._source_desc,
                self.state,
            )
            self._last_tel = time.monotonic()
            self.loop.run(self.session.start)
            self.loop.run(self._set_state, self.state, self.state_detail)
            self.loop.run(self.loop.call_every, cfg.interval_s, self._tick)
            if self.worker is not None:
                self.worker.start()
            if cfg.poll_current_s or cfg.desired:
                self._control = threading.Thread(target=self._control_loop, name="edgekit-control", daemon=True)
                self._control.start()
        except BaseException:
            self.close()
            raise
        return self

    def stop(self, flush_timeout: float = 10.0) -> bool:
        """Stop inference, send a last telemetry window, flush the outbox, publish death, disconnect.

        Returns True when the outbox was empty at the end (everything acknowledged by the broker).
        """
        self._stop_control()
        if self.worker is not None:
            self.worker.stop()
        flushed = False
        if self.loop is not None and self.session is not None:
            self.loop.run(self._tick)
            flushed = self.session.drain(flush_timeout)
            self.session.close(timeout=min(5.0, flush_timeout))
        self.close()
        return flushed

    def _stop_control(self) -> None:
        self._control_stop.set()
        cancel = self._apply_cancel
        if cancel is not None:
            cancel.set()
        if self._control is not None and self._control is not threading.current_thread():
            self._control.join(30.0)
            if self._control.is_alive():
                log.warning("the control thread did not stop within 30 s")
            self._control = None

    def close(self) -> None:
        self._stop_control()
        job = self.tune
        if job is not None:  # stops between downloads and trials; its thread removes the trial bundles
            job.stop.set()
            job.thread.join(10.0)
        with self.runtime_lock:
            self._unload()
        if self.loop is not None:
            self.loop.stop()
            self.loop = None
        for res in (self.outbox, self.thermal, self.app):
            if res is not None:
                res.close()
        self.outbox = self.thermal = self.app = None

    def __enter__(self) -> Agent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _archive_sha256(path: Path) -> str | None:
    """``edge.bundle.archive.archive_sha256`` of a bundle directory; None when it cannot be read (reported
    without it: a later fleet rollback to it then needs its artifact registered)."""
    from edge.bundle.archive import archive_sha256

    try:
        return archive_sha256(path)
    except (OSError, EdgeError) as e:
        log.warning("cannot hash bundle %s for a later rollback from the store: %s", path, e)
        return None


def _device_identity(directory: Path) -> DeviceIdentity | None:
    """The device's identity key (``edge.mqtt.identity``), or None when there is none and none can be written now
    (a full disk at first start): the agent still reports, unsigned, as an agent without keys does, and makes the
    key at a later start. A key file that is there and unusable still stops the agent (IdentityError)."""
    try:
        return DeviceIdentity.load_or_create(directory)
    except KeyNotMade as e:
        log.warning("%s: births and deaths go unsigned this run (no collector has pinned a key for it)", e.message)
        return None
