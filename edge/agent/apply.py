"""Apply one desired state on the device, and roll it back when the new model is unhealthy.

The apply is an explicit state table, :data:`STEPS`: each state names its handler, whether it is reported
when it begins, the :class:`Plan` fields it reads and writes (its narrow context) and the states it may go to;
``Applier.run`` walks it from ``start`` to a terminal state. What the states do:

    downloading    the artifact, resumed where a cut left it; free disk checked first (edge.agent.download)
    verifying      its sha256 (before anything is unpacked), then unpacked into <store>/agent/staging and
                   opened as a bundle: every listed sha256, exactly the listed files, the signature and
                   version through the store's trust store when there is one; its id must be the desired one
    smoke-testing  on the staged copy, before the switch: the runner loads; the device it uses is the one
                   the bundle asks for (no fallback); the bundle's reference pairs pass (edge.verify.refpairs); a
                   short benchmark's p99 fits the budget
    switching      DeviceStore.install (staged under the store's lock, trust-checked again, atomic switch of
                   `current`); the agent reloads its runner from `current`, as at start
    watching       for ``watch_s``: the application's p99 against the budget, inference errors, a fallback,
                   and at the end the reference pairs again on the live runner (drift)
    running        or, on a breach during the watch, ``DeviceStore.rollback`` and a reload: rolled-back

A bundle the store already holds is not downloaded again: when the desired bundle is the store's
``previous`` (a fleet rollback) or its ``current`` while the agent does not run it, and the archive
``pack_bundle`` makes of the stored copy has the desired sha256 (``archive_sha256``), the copy is
verified (every file's sha256; the trust store, an older version allowed as for any rollback) under
``verifying``, smoke-tested as usual, and switched to by ``DeviceStore.rollback`` (or a reload);
``Agent.counters['local_switches']`` counts it and the report's ``progress`` says ``{"from": "store"}``.

A bundle that lived on this device (it ran here at start, or its watch passed: ``<store>/agent/lived.json``,
with the budget it ran under) is not refused for its budget when a desired state brings it back (a fleet
rollback): its smoke test and watch measure p99 and report it (``budget_gated: false``) but do not gate on a
budget no stricter than the one it lived with (any budget when the store still holds it: a rollback to the
bundle that was running). Everything else (load, device, reference pairs, errors,
drift) is checked as for any bundle. Without this, an abort's rollback to the bundle that was running
was refused by its own smoke test on a busy device, and the device stayed on the aborted bundle.

A desired state naming the bundle the agent already runs changes nothing: it is reported ``running`` at
once, without a watch (the bundle was judged when it was switched to, or deployed by hand, and a rollback
to it must not wait a watch window or risk rolling the device off its known-good bundle). The exception
is a switch whose watch never finished (the agent stopped, or a newer desired state cut it short): the
agent keeps ``<store>/agent/unconfirmed.json`` from the switch until its watch ends, and watches that
bundle again.

With ``--source app`` the watch reads the application's reports (``edge.agent.appsocket``): only those
naming the new bundle (or none) count; p99 against the budget, the error rate (over 1% of the inferences
fails it), and frames at all: an application that reported before the switch and reports nothing on the
new bundle during the window (it crashed, or never reloaded) fails it; with ``--fps`` set, fewer than half
the frames expected fail it too (the rollout's ``fps<0.95*target`` criterion is the precise check).

Every outcome is reported (retained, ``edge.mqtt.desired.ReportedState``) with a machine-readable
reason. Each step has a deadline (download: ``DownloadOptions.timeout_s``; verify: ``verify_timeout_s``
and smoke test: ``smoke_timeout_s``, each run in a thread so a hung disk or runtime cannot block the
agent; the switch: the store's lock timeout; the watch is bounded by its window), so a stuck step ends as
``failed``/``timeout`` and never blocks the next desired state.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from edge.agent.download import DownloadError, discard_download, fetch
from edge.agent.host import AgentHost
from edge.base.typedjson import UnreadableFile, read_json_file, write_json_atomic
from edge.errors import EdgeError, SignatureError
from edge.mqtt.desired import HELD_URL, DesiredState, Reason, ReportedState

log = logging.getLogger("edge.agent")


#: the reason code of an error no step foresaw, by the step it happened in
UNFORESEEN = {
    "downloading": "download_failed",
    "verifying": "bad_archive",
    "smoke-testing": "inference_error",
    "switching": "install_failed",
    "watching": "watch_inference_error",
}


class StepFailed(Exception):
    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code, self.detail = code, detail


@dataclass
class Plan:
    """What one state hands the next; each state reads and writes only the fields its :data:`STEPS` entry
    names (the narrow context: a handler sees nothing else of the apply)."""

    held: str | None = None  # "previous" or "current": the store holds the desired bundle there
    archive: Path | None = None  # the downloaded, sha256-checked artifact
    bundle: Any = None  # the staged (or stored) bundle, verified
    breach: Reason | None = None  # why the switch or the watch failed
    reason: Reason | None = None  # the terminal state's reason


@dataclass(frozen=True)
class Step:
    handler: str  # the Applier method that runs the state: (Plan) -> the next state
    enter: bool  # reported (retained) when the state begins
    reads: tuple[str, ...]  # Plan fields
    writes: tuple[str, ...]
    then: tuple[str, ...]  # the states it may go to


#: the apply as a state table (Mender's client is built the same way); ``start`` first, a TERMINAL state last
STEPS: dict[str, Step] = {
    "start": Step("_s_start", False, (), ("held",), ("already-running", "watching", "verifying-stored", "downloading")),
    "verifying-stored": Step(
        "_s_verify_stored", False, ("held",), ("held", "bundle"), ("smoke-testing", "downloading")
    ),
    "downloading": Step("_s_download", True, (), ("archive",), ("verifying",)),
    "verifying": Step("_s_verify", True, ("archive",), ("bundle",), ("smoke-testing",)),
    "smoke-testing": Step("_s_smoke", True, ("bundle",), (), ("switching",)),
    "switching": Step("_s_switch", True, ("bundle", "held"), ("breach",), ("watching", "rolling-back")),
    "watching": Step("_s_watch", True, (), ("breach",), ("running", "rolling-back")),
    "rolling-back": Step("_s_roll_back", False, ("breach",), ("reason",), ("rolled-back", "failed")),
}
TERMINAL = ("running", "rolled-back", "failed", "already-running")  # already-running: reported running, no watch


class Applier:
    def __init__(
        self, agent: AgentHost, desired: DesiredState, stop: threading.Event, *, stopping: threading.Event | None = None
    ) -> None:
        """``stop``: set when a newer desired state supersedes this one, or the agent stops (``stopping``)."""
        self.agent, self.d, self.stop = agent, desired, stop
        self.stopping = stopping or threading.Event()
        self.step = "downloading"
        self.reference_check: dict[str, Any] | None = None
        self.smoke: dict[str, Any] | None = None
        self.health: dict[str, Any] | None = None
        self.staged: Any = None  # the unpacked copy; removed before the outcome is reported
        self.lived_budget_ms = lived_budget(agent.config.store, desired.bundle_id)  # None: it never lived here
        self.going_back = False  # the store holds the desired bundle as previous or current: a rollback

    # reporting -----------------------------------------------------------------------------
    def _running_id(self) -> str | None:
        b = self.agent.bundle
        return b.id if b is not None else None

    def _report(self, state: str, reason: Reason | None = None, progress: dict[str, Any] | None = None) -> None:
        self.agent.report(
            ReportedState(
                state=state,
                bundle_running=self._running_id(),
                rollout_id=self.d.rollout_id,
                desired_version=self.d.version,
                desired_bundle=self.d.bundle_id,
                reason=reason,
                reference_check=self.reference_check,
                smoke=self.smoke,
                health=self.health,
                progress=progress,
            )
        )

    def _enter(self, step: str) -> None:
        self.step = step
        self._report(step)

    # the steps -----------------------------------------------------------------------------
    def run(self) -> str:
        """Apply: the states of :data:`STEPS` from ``start`` to a terminal one (running, rolled-back or failed),
        reported and recorded."""
        d = self.d
        log.info("applying desired version %d (rollout %s): bundle %s", d.version, d.rollout_id, d.bundle_id)
        plan, state = Plan(), "start"
        try:
            while state not in TERMINAL:
                step = STEPS[state]
                if step.enter:
                    self._enter(state)
                nxt = getattr(self, step.handler)(plan)
                if nxt not in step.then:  # the table is the contract: a handler going elsewhere is a bug
                    raise RuntimeError(f"apply state {state!r} went to {nxt!r}, not one of {step.then}")
                state = nxt
            if state == "already-running":
                return self._finish("running", None)
            return self._finish(state, plan.reason)
        except StepFailed as e:
            if self.stop.is_set():
                return self._interrupted()
            return self._finish("failed", Reason(e.code, e.detail, self.step))
        except Exception as e:  # noqa: BLE001 - a failure no step foresaw still ends in a terminal state
            log.warning(
                "apply of desired version %d failed while %s: %s: %s", d.version, self.step, type(e).__name__, e
            )
            code = UNFORESEEN.get(self.step, "install_failed")
            return self._finish("failed", Reason(code, f"{type(e).__name__}: {str(e)[:500]}", self.step))
        finally:
            self._clean()

    # the states' handlers: each reads and writes only the Plan fields its STEPS entry names -----------------
    def _s_start(self, p: Plan) -> str:
        agent, d = self.agent, self.d
        if self._running_id() == d.bundle_id and agent.state in ("running", "idle"):
            if unconfirmed(agent.config.store) != d.bundle_id:
                # nothing changes: the bundle runs and was judged when it was switched to (or deployed)
                agent.counters["already_running"] += 1
                log.info(
                    "desired version %d names bundle %s, which this device already runs: nothing to do",
                    d.version,
                    d.bundle_id,
                )
                return "already-running"
            return "watching"  # switched to, but its watch never finished (the agent stopped, or was superseded)
        p.held = self._held()
        self.going_back = p.held is not None
        return "verifying-stored" if p.held is not None else self._download_or_fail()

    def _download_or_fail(self) -> str:
        if self.d.artifact_url == HELD_URL:  # the controller knew no artifact: only the store's copy would do
            raise StepFailed(
                "download_failed",
                f"bundle {self.d.bundle_id} is not in this device's store (or "
                "differs from the desired sha256), and the desired state names no URL",
            )
        return "downloading"

    def _s_verify_stored(self, p: Plan) -> str:
        held = p.held
        assert held is not None
        self.step = "verifying"
        self._report("verifying", progress={"from": "store"})
        p.bundle = self._bounded(
            lambda: self._verify_held(held), self.agent.config.verify_timeout_s, "checking the stored copy"
        )
        if p.bundle is None:
            p.held = None
            return self._download_or_fail()
        self.agent.counters["local_switches"] += 1
        log.info(
            "bundle %s is in the store (%s) and matches the desired sha256: switching to it locally, no download",
            self.d.bundle_id,
            held,
        )
        return "smoke-testing"

    def _s_download(self, p: Plan) -> str:
        p.archive = self._download()
        self.agent.counters["downloads"] += 1
        return "verifying"

    def _s_verify(self, p: Plan) -> str:
        archive = p.archive
        self.staged, p.bundle = self._bounded(
            lambda: self._verify(archive), self.agent.config.verify_timeout_s, "verifying the artifact"
        )
        return "smoke-testing"

    def _s_smoke(self, p: Plan) -> str:
        self._smoke(p.bundle)
        return "switching"

    def _s_switch(self, p: Plan) -> str:
        p.breach = self._switch(p.bundle, p.held)
        return "watching" if p.breach is None else "rolling-back"

    def _s_watch(self, p: Plan) -> str:
        p.breach = self._watch()
        return "running" if p.breach is None else "rolling-back"

    def _s_roll_back(self, p: Plan) -> str:
        breach = p.breach
        assert breach is not None
        log.warning("rolling back %s: %s (%s)", self.d.bundle_id, breach.code, breach.detail)
        try:
            back = self.agent.store.rollback()
        except EdgeError as e:
            p.reason = Reason("rollback_failed", f"{breach.code}: {breach.detail}; rollback failed: {e}", breach.step)
            return "failed"
        self.agent.reload(f"rolled back to {back}: {breach.code}")
        p.reason = breach
        return "rolled-back"

    def _clean(self) -> None:
        if self.staged is not None:
            shutil.rmtree(self.staged, ignore_errors=True)
            self.staged = None

    def _interrupted(self) -> str:
        """Superseded by a newer desired state (applied next), or the agent is stopping: then the version is
        not recorded, so the retained desired state is applied again after the restart."""
        if self.stopping.is_set():
            self._clean()
            self._report(
                "failed",
                Reason("interrupted", "the agent stopped during the apply; it resumes at the next start", self.step),
            )
            return "failed"
        return self._finish("failed", Reason("superseded", "a newer desired state arrived", self.step))

    def _finish(self, state: str, reason: Reason | None) -> str:
        self._clean()
        discard_download(self.agent.config.store / "agent" / "downloads", self.d.sha256)
        if state in ("running", "rolled-back"):  # the watch ended: nothing is left unconfirmed
            set_unconfirmed(self.agent.config.store, None)
        if state == "running" and self._running_id() == self.d.bundle_id and self.agent.budget_ms is not None:
            record_lived(self.agent.config.store, self.d.bundle_id, self._lived_with())
        self._report(state, reason)
        try:
            self.agent.record_desired(self.d, state)
        except (OSError, EdgeError) as e:  # the report stands; a restart may apply the same version again
            log.warning("cannot record the desired version applied: %s", e)
        return state

    def _bounded(self, fn: Any, timeout: float, what: str) -> Any:
        """``fn()`` in a thread, for at most ``timeout`` s (a hung disk or runtime cannot block the agent: the
        thread is abandoned, a daemon, and the step fails with ``timeout``)."""
        box: dict[str, Any] = {}

        def body() -> None:
            try:
                box["value"] = fn()
            except BaseException as e:  # noqa: BLE001 - re-raised in the control thread
                box["error"] = e

        t = threading.Thread(target=body, name=f"edgekit-{self.step}", daemon=True)
        t.start()
        deadline = time.monotonic() + timeout
        while t.is_alive() and time.monotonic() < deadline and not self.stop.is_set():
            t.join(min(0.2, max(0.0, deadline - time.monotonic())))
        if t.is_alive() and self.stop.is_set():
            raise StepFailed("superseded", f"{what} was cut short")
        if t.is_alive():
            raise StepFailed("timeout", f"{what} ({self.d.bundle_id}) did not finish within {timeout:g} s")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def _held(self) -> str | None:
        """``previous`` or ``current`` when the store holds the desired bundle there (cheap: links only)."""
        store = self.agent.store
        if store is None:
            return None
        try:
            st = store.state()
        except EdgeError:
            return None
        for which, bid in (("previous", st.previous), ("current", st.current)):
            if bid == self.d.bundle_id and (self.agent.config.store / "bundles" / bid).is_dir():
                return which
        return None

    def _verify_held(self, which: str) -> Any:
        """The stored copy, verified, when it is the desired artifact; None (download it) when it is not."""
        from edge.bundle.archive import archive_sha256
        from edge.bundle.bundle import Bundle

        store = self.agent.store
        path = self.agent.config.store / "bundles" / self.d.bundle_id
        try:
            bundle = Bundle.open(path, trust=False)
            if bundle.id != self.d.bundle_id:
                raise EdgeError(f"{path} holds bundle {bundle.id}")
            sha = archive_sha256(path)
        except (EdgeError, OSError) as e:
            log.warning("the store's %s copy of %s cannot be used (%s): downloading it", which, self.d.bundle_id, e)
            return None
        if sha != self.d.sha256:
            log.warning(
                "the store's %s copy of %s packs to sha256 %s..., the desired state names %s...: downloading it",
                which,
                self.d.bundle_id,
                sha[:16],
                self.d.sha256[:16],
            )
            return None
        if store.trust is not None:  # as for any rollback: an older version, never an untrusted one
            try:
                store.trust.check(bundle, older_ok=True)
            except EdgeError as e:
                raise StepFailed("untrusted", str(e)) from None
        return bundle

    def _download(self) -> Any:
        cfg = self.agent.config
        last = [0.0]

        def progress(have: int, total: int | None) -> None:
            now = time.monotonic()
            if now - last[0] >= 1.0:
                last[0] = now
                self._report("downloading", progress={"bytes": have, "total": total})

        try:
            return fetch(
                self.d.artifact_url,
                cfg.store / "agent" / "downloads",
                self.d.sha256,
                size=self.d.size,
                options=cfg.download,
                stop=self.stop,
                progress=progress,
            )
        except DownloadError as e:
            raise StepFailed(e.code, str(e)) from None
        except OSError as e:
            raise StepFailed("download_failed", f"{type(e).__name__}: {e}") from None

    def _verify(self, archive: Any) -> tuple[Any, Any]:
        from edge.bundle.archive import ArchiveError, unpack_bundle
        from edge.bundle.bundle import Bundle

        store = self.agent.store
        if store is None:
            raise StepFailed(
                "install_failed", f"the device store {self.agent.config.store} is not usable: {self.agent.state_detail}"
            )
        try:
            staged = unpack_bundle(archive, self.agent.config.store / "agent" / "staging", sha256=self.d.sha256)
        except ArchiveError as e:
            raise StepFailed("bad_archive", str(e)) from None
        try:
            bundle = Bundle.open(staged, trust=store.trust if store is not None and store.trust is not None else False)
        except SignatureError as e:
            shutil.rmtree(staged, ignore_errors=True)
            raise StepFailed("untrusted", str(e)) from None
        except EdgeError as e:
            shutil.rmtree(staged, ignore_errors=True)
            code = "untrusted" if "trust" in type(e).__module__ or "Trust" in type(e).__name__ else "bundle_invalid"
            raise StepFailed(code, str(e)) from None
        if bundle.id != self.d.bundle_id:
            shutil.rmtree(staged, ignore_errors=True)
            raise StepFailed(
                "bundle_mismatch", f"the artifact holds bundle {bundle.id}, the desired state names {self.d.bundle_id}"
            )
        return staged, bundle

    def _budget(self, bundle: Any) -> float | None:
        return self.d.budget_ms or self.agent.config.budget_ms or bundle.frame_budget_ms

    def _gated(self, budget: float | None, record: dict[str, Any]) -> float | None:
        """The budget to judge p99 against: None (said in ``record``: the smoke or health report) when the desired
        bundle lived here, and either the store still holds it (``going_back``: a rollback to the bundle that was
        running) or the budget is no stricter than the one it lived with."""
        lived = self.lived_budget_ms
        if budget is None or lived is None or (budget < lived * (1 - 1e-9) and not self.going_back):
            return budget
        record["budget_gated"] = False
        record["budget_note"] = f"{self.d.bundle_id} ran on this device under a {lived:g} ms budget: not refused for it"
        return None

    def _lived_with(self) -> float:
        """The budget the bundle now runs under: the rollout's, else the agent's (the bundle's own, or --budget-ms)."""
        return float(self.d.budget_ms or self.agent.budget_ms or 0.0)

    def _smoke(self, bundle: Any) -> None:
        box: dict[str, Any] = {}
        t = threading.Thread(target=self._smoke_body, args=(bundle, box), name="edgekit-smoke", daemon=True)
        t.start()
        timeout = self.agent.config.smoke_timeout_s
        deadline = time.monotonic() + timeout
        while t.is_alive() and time.monotonic() < deadline and not self.stop.is_set():
            t.join(min(0.2, max(0.0, deadline - time.monotonic())))
        if t.is_alive() and self.stop.is_set():
            raise StepFailed("superseded", "the smoke test was cut short")
        if t.is_alive():  # a hung runtime: the thread is abandoned (daemon), the apply fails and the agent goes on
            raise StepFailed("timeout", f"the smoke test of {bundle.id} did not finish within {timeout:g} s")
        if "failed" in box:
            raise box["failed"]

    def _smoke_body(self, bundle: Any, box: dict[str, Any]) -> None:
        from edge.verify.refpairs import check_on_load, describe

        cfg = self.agent.config
        try:
            t0 = time.perf_counter()
            try:
                runner = bundle.open_runner(cfg.runner_options or None)
            except Exception as e:  # noqa: BLE001 - any runtime failure to load is a failed smoke test
                raise StepFailed("load_failed", f"{type(e).__name__}: {e}") from None
            with runner:
                load_ms = (time.perf_counter() - t0) * 1e3
                info = runner.info
                self.smoke = {
                    "load_ms": round(load_ms, 1),
                    "device_requested": info.device_requested,
                    "device_used": info.device_used,
                    "fallback": info.fallback,
                }
                if info.fallback or info.device_used != info.device_requested:
                    raise StepFailed(
                        "fallback",
                        f"{bundle.id} runs on {info.device_used}, not {info.device_requested}: {info.fallback or 'fallback'}",
                    )
                self.reference_check = check_on_load(bundle, runner, records=self.agent.store, mode=True)
                failed = describe(self.reference_check)
                if failed is not None:
                    raise StepFailed("reference_pairs_failed", failed)
                self._bench(bundle, runner)
        except StepFailed as e:
            box["failed"] = e
        except Exception as e:  # noqa: BLE001 - reported, the agent goes on
            box["failed"] = StepFailed("inference_error", f"{type(e).__name__}: {e}")

    def _bench(self, bundle: Any, runner: Any) -> None:
        from edge.bench import random_feeds
        from edge.stats import LatencyStats

        n = self.agent.config.smoke_frames
        if n <= 0:
            return
        from edge.bench import bundle_feeds

        feeds = bundle_feeds(bundle)[0]  # the reference pairs' input: real shapes and values (a sample rate)
        if feeds is None:
            feeds = random_feeds(runner)
        for _ in range(3):
            runner.infer(feeds)
        samples = []
        for _ in range(n):
            t = time.perf_counter_ns()
            runner.infer(feeds)
            samples.append((time.perf_counter_ns() - t) / 1e6)
        stats = LatencyStats.from_ms(samples)
        budget = self._budget(bundle)
        assert self.smoke is not None
        self.smoke.update(
            {"frames": n, "p50_ms": round(stats.p50_ms, 3), "p99_ms": round(stats.p99_ms, 3), "budget_ms": budget}
        )
        budget = self._gated(budget, self.smoke)
        if budget is not None and stats.p99_ms > budget:
            raise StepFailed(
                "over_budget",
                f"{bundle.id}: smoke-test p99 {stats.p99_ms:.3f} ms over the budget {budget:g} ms ({n} inferences on this device)",
            )

    def _switch(self, bundle: Any, held: str | None = None) -> Reason | None:
        agent = self.agent
        set_unconfirmed(agent.config.store, bundle.id)  # until its watch ends (a restart watches it again)
        try:
            if held == "previous":
                back = agent.store.rollback()  # under the store's lock; trust-checked with older_ok
                if back != bundle.id:
                    raise StepFailed(
                        "install_failed",
                        f"the store's previous bundle changed meanwhile: switched to {back}, not {bundle.id}",
                    )
            elif held is None:
                agent.store.install(bundle)
        except EdgeError as e:
            raise StepFailed("untrusted" if "trust" in str(e).lower() else "install_failed", str(e)) from None
        agent.reload(f"desired version {self.d.version} installed")
        if self._running_id() != bundle.id or agent.state not in ("running", "idle"):
            return Reason(
                "load_failed",
                f"after the switch the agent runs {self._running_id()} in state {agent.state}: {agent.state_detail or ''}",
                "switching",
            )
        return None

    def _watch(self) -> Reason | None:
        agent = self.agent
        window = self.d.watch_s if self.d.watch_s is not None else agent.config.watch_s
        if agent.app is not None:
            return self._watch_app(window)
        worker = agent.worker
        if worker is not None:
            worker.take_health()  # the window starts now
        samples: list[float] = []
        for _ in self._ticks(window):
            worker = agent.worker
            if worker is not None:
                samples += worker.take_health()
                if worker.error:
                    return Reason("watch_inference_error", worker.error, "watching")
            runner = agent.runner
            if runner is not None and runner.info.fallback:
                return Reason("watch_fallback", f"the runner fell back: {runner.info.fallback}", "watching")
            breach = self._latency(samples)
            if breach is not None and len(samples) >= 20:
                return breach
        if worker is not None:
            samples += worker.take_health()
        breach = self._latency(samples)
        if breach is not None:
            return breach
        return self._drift()

    def _watch_app(self, window: float) -> Reason | None:
        """The watch on the application's own reports (``--source app``): only frames that name the new
        bundle (or no bundle) count; p99 vs budget, the error rate, frames at all, and fps when it is set."""
        from edge.agent.appsocket import latency_json

        agent, app = self.agent, self.agent.app
        bid = self._running_id()
        alive_before = app.last_report is not None  # the application reported since the agent started
        app.watch(bid)
        t0 = time.monotonic()
        samples: list[float] = []
        frames = errors = 0
        budget = self._budget(agent.bundle) if agent.bundle is not None else None

        def judge(final: bool) -> Reason | None:
            span = max(time.monotonic() - t0, 1e-9)
            self.health = {
                "source": "app",
                "frames": frames,
                "errors": errors,
                "fps": round(frames / span, 2),
                "budget_ms": budget,
            }
            if samples:
                lat = latency_json(samples)
                self.health.update(p50_ms=lat["p50_ms"], p99_ms=lat["p99_ms"])
            tried = frames + errors
            if errors and (final or tried >= 20) and errors > 0.01 * tried:
                return Reason(
                    "watch_inference_error",
                    f"the application reported {errors} inference error(s) in {tried} inferences on {bid} (over 1%)",
                    "watching",
                )
            gated = self._gated(budget, self.health)
            if gated is not None and len(samples) >= (1 if final else 20) and self.health["p99_ms"] > gated:
                return Reason(
                    "watch_p99_over_budget",
                    f"p99 {self.health['p99_ms']:.3f} ms over the budget {budget:g} ms on {len(samples)} frames the application reported",
                    "watching",
                )
            if not final:
                return None
            if alive_before and frames == 0:
                return Reason(
                    "watch_inference_error",
                    f"the application reported frames before the switch and "
                    f"none on {bid} during the {window:g} s watch (it stopped, crashed, or did not "
                    "reload)",
                    "watching",
                )
            fps = agent.config.fps
            if fps and frames < 0.5 * fps * span:
                return Reason(
                    "watch_inference_error",
                    f"the application ran {frames / span:.2f} fps on {bid}, under half the configured {fps:g} fps",
                    "watching",
                )
            return None

        for _ in self._ticks(window, start=t0):
            w = app.take_health()
            samples += w.samples
            frames += w.frames
            errors += w.errors
            breach = judge(False)
            if breach is not None:
                return breach
        w = app.take_health()
        samples += w.samples
        frames += w.frames
        errors += w.errors
        if not alive_before and frames == 0:
            log.warning("the application reported nothing during the watch of %s: not judged on its frames", bid)
        return judge(True)

    def _ticks(self, window: float, start: float | None = None) -> Iterator[None]:
        """One step every 0.5 s until ``window`` seconds after ``start`` (default: now); a newer desired
        state cuts the watch short."""
        deadline = (time.monotonic() if start is None else start) + window
        while (left := deadline - time.monotonic()) > 0:
            if self.stop.wait(min(0.5, left)):
                raise StepFailed("superseded", "the watch was cut short")
            yield

    def _latency(self, samples: list[float]) -> Reason | None:
        if not samples:
            self.health = {"frames": 0}
            return None
        from edge.stats import LatencyStats

        stats = LatencyStats.from_ms(samples)
        budget = self._budget(self.agent.bundle) if self.agent.bundle is not None else None
        errors = self.agent.worker.error if self.agent.worker is not None else None
        self.health = {
            "frames": len(samples),
            "p50_ms": round(stats.p50_ms, 3),
            "p99_ms": round(stats.p99_ms, 3),
            "budget_ms": budget,
            "errors": 1 if errors else 0,
        }
        budget = self._gated(budget, self.health)
        if budget is not None and stats.p99_ms > budget:
            return Reason(
                "watch_p99_over_budget",
                f"p99 {stats.p99_ms:.3f} ms over the budget {budget:g} ms on {len(samples)} frames of the workload",
                "watching",
            )
        return None

    def _drift(self) -> Reason | None:
        """The reference pairs again on the live runner: a model that computes something else now is a breach."""
        agent = self.agent
        if agent.runner is None or agent.bundle is None:
            return None
        from edge.verify.refpairs import check_reference_pairs, describe

        with agent.runtime_lock:  # the runner stays the one loaded; the worker's infer_lock keeps its frames apart
            try:
                worker = agent.worker
                if worker is not None and worker.runner is agent.runner:
                    result = worker.check_live(agent.bundle)
                else:
                    result = check_reference_pairs(agent.bundle, agent.runner)
            except Exception as e:  # noqa: BLE001 - a check that cannot run on the live runner is a drift
                return Reason("watch_reference_drift", f"{type(e).__name__}: {e}", "watching")
        if self.health is not None:
            self.health["reference_passed"] = result.get("passed")
        failed = describe(result)
        return Reason("watch_reference_drift", failed, "watching") if failed else None


UNCONFIRMED = "unconfirmed.json"


def unconfirmed(store: Any) -> str | None:
    """The bundle switched to whose watch has not ended (``<store>/agent/unconfirmed.json``), if any."""
    try:
        rec = read_json_file(
            os.path.join(store, "agent", UNCONFIRMED), what="agent record", max_bytes=4096, max_depth=4
        )
    except UnreadableFile:
        return None
    bid = rec.get("bundle_id") if isinstance(rec, dict) else None
    return bid if isinstance(bid, str) else None


def set_unconfirmed(store: Any, bundle_id: str | None) -> None:
    path = os.path.join(store, "agent", UNCONFIRMED)
    try:
        if bundle_id is None:
            if os.path.exists(path):
                os.unlink(path)
            return
        write_json_atomic(Path(path), {"bundle_id": bundle_id, "since": round(time.time(), 3)})
    except OSError as e:  # at worst, a later desired state for this bundle is not watched again
        log.warning("cannot record the unconfirmed switch to %s: %s", bundle_id, e)


LIVED = "lived.json"
LIVED_MAX = 32  # bundles remembered (the oldest forgotten first)


def _lived(store: Any) -> dict[str, Any]:
    try:
        rec = read_json_file(
            os.path.join(store, "agent", LIVED), what="agent record", max_bytes=64 << 10, max_depth=4, missing={}
        )
    except UnreadableFile:
        return {}
    bundles = rec.get("bundles") if isinstance(rec, dict) else None
    return bundles if isinstance(bundles, dict) else {}


def lived_budget(store: Any, bundle_id: str) -> float | None:
    """The budget (ms) ``bundle_id`` ran under on this device (``<store>/agent/lived.json``); None when it never
    ran here (or the record is damaged: then every budget is gated, as for a new bundle)."""
    entry = _lived(store).get(bundle_id)
    budget = entry.get("budget_ms") if isinstance(entry, dict) else None
    return float(budget) if isinstance(budget, (int, float)) and not isinstance(budget, bool) and budget > 0 else None


def record_lived(store: Any, bundle_id: str, budget_ms: float) -> None:
    """``bundle_id`` runs on this device under ``budget_ms`` (the agent loaded it at start, or its watch passed)."""
    bundles = {k: v for k, v in _lived(store).items() if k != bundle_id}
    bundles[bundle_id] = {"budget_ms": budget_ms, "since": round(time.time(), 3)}
    keep = dict(list(bundles.items())[-LIVED_MAX:])
    try:
        os.makedirs(os.path.join(store, "agent"), exist_ok=True)  # at the agent's first start, before the outbox
        write_json_atomic(Path(os.path.join(store, "agent", LIVED)), {"bundles": keep})
    except OSError as e:  # at worst, a later rollback to it is gated on its budget
        log.warning("cannot record that %s ran on this device: %s", bundle_id, e)
