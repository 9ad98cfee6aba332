"""deploy = convert + verify + bench + ship; ``ship`` checks a bundle's gates and installs it in a device store.

The stores themselves (layout, locking, crash-safe switching, local and ssh) live in ``edge.store``;
their names are re-exported here for the modules and scripts that import them from ``edge.deploy``.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from edge.bundle.bundle import Bundle
from edge.store import (BUNDLES, CURRENT, HISTORY, PREVIOUS, SSH_OPTIONS_ENV, DeviceStore, SshStore, Store,  # noqa: F401
                        symlink_atomic, open_store, rollback)
from edge.errors import EdgeError

log = logging.getLogger("edge.deploy")


@dataclass
class DeployResult:
    bundle: Bundle
    shipped_to: str
    benchmark: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)
    #: why parity was not run on this host (the manifest's skipped reason): the bundle ships unverified
    unverified: str | None = None
    #: whether the benchmark's budget verdict gated the deploy (same device class as the target's) and why;
    #: None when there was no benchmark
    budget_gates: bool | None = None
    device_class: str | None = None
    #: ``deploy(tune=...)``: the tune's summary line, what its overlay applied, the winner and the files
    tune: dict[str, Any] | None = None
    #: the tune overlay this bundle was converted with (``--tuned`` or ``--tune``), one line; None without one
    tuned_applied: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"bundle_id": self.bundle.id, "bundle_path": str(self.bundle.path), "shipped_to": self.shipped_to,
                "parity": self.bundle.manifest.get("parity"), "unverified": self.unverified,
                "benchmark": self.benchmark, "budget_gates": self.budget_gates, "device_class": self.device_class,
                "tuned_applied": self.tuned_applied, "tune": self.tune, "notes": self.notes}


def ship(bundle: Bundle | str | os.PathLike[str], device: str | os.PathLike[str], *,
         accept_parity_failure: bool = False, accept_budget_failure: bool = False, trust: Any = None) -> str:
    """Verify ``bundle`` and install it as the device's current bundle. Refuses failed gates and, where a
    trust store applies (``trust``, else ``$EDGEKIT_TRUST_DIR``, else a local store's ``trust/``), what it
    does not vouch for: checked here before anything is copied or sent, and again by a local store on the
    copy that landed (the device side)."""
    b = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle, trust=False)
    b.verify()
    from edge.verify.gates import check_gates  # parity and budget recomputed from the figures, not read from flags

    with open_store(device, trust=trust) as store:
        if store.trust is None:
            from edge.bundle.trust import no_trust_note

            log.info(no_trust_note(f"device store {store.where}"))
        else:  # the evidence the gates read is then the signed evidence
            store.trust.check(b)
        check_gates(b.info, accept_parity_failure=accept_parity_failure, accept_budget_failure=accept_budget_failure)
        where = store.install(b)
    return str(where)


def deploy(model: str | os.PathLike[str], target: str, device: str | os.PathLike[str], *,
           build_dir: str | os.PathLike[str] | None = None, bench_iterations: int = 200,
           fps: float | None = None, budget_ms: float | None = None,
           accept_parity_failure: bool = False, accept_budget_failure: bool = False, allow_cpu_fallback: bool = False,
           on_step: Callable[[str], None] | None = None, sign_key: str | None = None, trust: Any = None,
           tuned: Any = None, tune: Any = None, isa_check: bool = True, **convert_kwargs: Any) -> DeployResult:
    """Convert + parity + benchmark (on this host when the target runtime runs here) + sign (with
    ``sign_key``, else ``$EDGEKIT_SIGN_KEY``, when either names a key) + ship.

    The benchmark's budget verdict gates only when this host is the target's device class
    (``edge.targets.same_device_class``: its OS, CPU architecture and platform, and the runner on the
    target's accelerator); otherwise it is recorded as indicative, with the reason. A bundle whose
    parity could not run here ships with ``DeployResult.unverified`` saying why. ``tuned``: an ``edgekit tune``
    overlay (file or ``edge.tune.overlay.TunedOverlay``) applied to the target before converting and benchmarking.
    ``tune``: True or an ``edge.tune.search.TuneOptions``: run ``edge.tune.search.tune`` first (this deploy's calibration,
    input shapes, pre-processing, budget and precision) and deploy its winner's overlay; refused when no
    configuration passed parity. The tune's summary and the overlay applied are in ``notes`` and ``tune``.
    ``isa_check``: for a target whose devices are aarch64, run the reference pairs on emulated aarch64 when the
    toolchain is installed (``edge.verify.isa.check_after_convert``; its line is in ``notes``)."""
    from edge.pipeline import convert
    from edge.targets import get_target

    say = on_step or (lambda _m: None)
    profile = get_target(target, convert_kwargs.get("targets_dir", ()))
    target_profile = profile
    overlay = None
    if tune is not None and tune is not False:
        if tuned is not None:
            raise EdgeError("give either --tune (tune now) or --tuned FILE (an overlay tuned before), not both")
        tune = _tune_options(tune)
    elif tuned is not None:  # read (and refused) before anything is built
        from edge.tune.overlay import TunedOverlay, read_overlay

        overlay = tuned if isinstance(tuned, TunedOverlay) else read_overlay(tuned)
    open_store(device)  # a bad address, bad ssh options or no ssh fail here: before minutes of work, nothing built
    build = Path(build_dir) if build_dir else Path("build") / f"{Path(model).stem}-{target}"
    notes: list[str] = []
    tune_info = None
    if tune:
        overlay, tune_info = _tune_first(model, profile, build, tune, fps, budget_ms, convert_kwargs, say)
        notes.append(tune_info["summary"])
    applied = None
    if overlay is not None:  # applied here too, so the benchmark below runs the tuned runner and options
        from edge.tune.overlay import apply_overlay, resolve_precision

        convert_kwargs["precision"] = resolve_precision(overlay, convert_kwargs.get("precision"))
        profile = apply_overlay(profile, overlay)
        applied = overlay.describe()
        where = "" if overlay.tuned.get("same_device_class", True) else \
            f" (tuned off the device: {overlay.tuned.get('device_class')})"
        notes.append(f"tuned overlay {overlay.path or ''} applied: {applied}{where}".replace("  ", " "))
    check_build_dir(build)
    stage = build.parent / f".{build.name}.deploy-{os.getpid()}"
    bundle = convert(model, target_profile, stage, accept_parity_failure=accept_parity_failure, on_step=say,
                     force=True, tuned=overlay, **convert_kwargs)
    try:
        bundle, report, notes2, unverified, gates, device_class, where = _check_and_ship(
            bundle, target_profile, profile, device, say, bench_iterations=bench_iterations, fps=fps,
            budget_ms=budget_ms, accept_parity_failure=accept_parity_failure,
            accept_budget_failure=accept_budget_failure, allow_cpu_fallback=allow_cpu_fallback, sign_key=sign_key,
            trust=trust, isa_check=isa_check, final=build)
    except BaseException as e:
        kept = _keep_refused(stage, build)
        if isinstance(e, EdgeError) and kept is not None:
            e.hint = (f"{e.hint}; " if e.hint else "") + kept
            e.args = (f"{e.message} ({e.hint})",)
        raise
    _replace_dir(stage, build)
    bundle = Bundle.open(build, trust=False)
    return DeployResult(bundle, where, report, notes + notes2, unverified=unverified, budget_gates=gates,
                        device_class=device_class, tune=tune_info, tuned_applied=applied)


def check_build_dir(build: Path) -> None:
    """A build directory that exists must be an earlier bundle (it is replaced once the new one ships): never a
    directory of the user's that a typo in --build-dir named."""
    if build.is_symlink() or (build.exists() and not (build.is_dir() and (build / "manifest.json").is_file())):
        raise EdgeError(f"--build-dir {build} exists and is not an edgekit bundle: it would be replaced",
                        hint="choose another --build-dir, or remove it yourself")


def _replace_dir(new: Path, dest: Path) -> None:
    old = None
    if dest.exists():
        old = dest.parent / f".{dest.name}.old-{os.getpid()}"
        os.replace(dest, old)
    os.replace(new, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _keep_refused(stage: Path, build: Path) -> str | None:
    """A deploy refused after converting: the earlier build stays as it was; the new bundle is kept for a look
    (in the build directory when there was none, else beside it as ``<build>.refused``). What to tell the user."""
    if not stage.exists():
        return None
    if not build.exists():
        os.replace(stage, build)
        return f"the bundle built is in {build}"
    refused = build.with_name(build.name + ".refused")
    _replace_dir(stage, refused)
    return f"the bundle built is in {refused}; {build} still holds the earlier build"


def _check_and_ship(bundle: Bundle, target_profile: Any, profile: Any, device: Any, say: Callable[[str], None], *,
                    bench_iterations: int, fps: float | None, budget_ms: float | None, accept_parity_failure: bool,
                    accept_budget_failure: bool, allow_cpu_fallback: bool, sign_key: str | None, trust: Any,
                    isa_check: bool, final: Path) -> tuple[Bundle, Any, list[str], Any, Any, Any, str]:
    """The converted bundle (in its staging directory; ``final``: where it goes once shipped): ISA check,
    benchmark, signature, ship."""
    from edge.bundle.signing import configured_sign_key
    from edge.bench import judge_device_class, run_benchmark
    from edge.bundle.schema import SkippedParity
    from edge.pipeline import runnable_here
    from edge.stats import budget_from
    from edge.verify.isa import check_after_convert

    notes: list[str] = []

    line, _ = check_after_convert(bundle, target_profile, enabled=isa_check, accept_failure=accept_parity_failure)
    if line:  # "checked on aarch64 (emulated cortex-a76): pass ..." or why not
        say(line)
        notes.append(line)
        bundle = Bundle.open(bundle.path, trust=False)
    report = None
    gates = device_class = None
    par = bundle.info.parity
    unverified = par.skipped if isinstance(par, SkippedParity) else None
    if unverified is not None:
        say(f"unverified on this host: {unverified}")
    run_here = runnable_here(profile)  # parity may have run on a host proxy; the benchmark needs the runner itself
    if run_here is not None:
        notes.append(f"not benchmarked: the target's runner cannot run on this host ({run_here}); run "
                     f"`edgekit bench {final} --record` on the device")
    else:
        budget, source = budget_from(fps, budget_ms, profile.frame_budget_ms)
        say(f"benchmarking {bench_iterations} iterations on this host")
        extra = {"allow_cpu_fallback": True} if allow_cpu_fallback else {}
        from edge.bench import bundle_feeds

        feeds, feeds_from = bundle_feeds(bundle)  # the reference pairs' input, as `edgekit bench` feeds
        rep = run_benchmark(lambda: bundle.open_runner(extra), iterations=bench_iterations, budget_ms=budget, budget_source=source,
                            bundle=bundle.id, target=profile.name, feeds=feeds, feeds_from=feeds_from)
        gates, device_class = judge_device_class(rep, profile)
        if gates:
            notes.append(f"the budget verdict gates this deploy: {device_class}")
        else:
            notes.append(f"the budget verdict is indicative and does not gate this deploy: {device_class}")
        say(notes[-1])
        report = rep.to_json()
        bundle.record("benchmark", report)
    key = configured_sign_key(sign_key)
    if key is not None:  # last: the signature covers the final manifest, benchmark included
        from edge.bundle.bundle import sign_bundle

        say(f"signing {bundle.id} with {key}")
        signed = sign_bundle(bundle.path, key)
        notes.append(f"signed with key {signed.key_id}: {signed.name} version {signed.version}")
        bundle = Bundle.open(bundle.path, trust=False)
    say(f"shipping {bundle.id} to {device}")
    where = ship(bundle, device, accept_parity_failure=accept_parity_failure, accept_budget_failure=accept_budget_failure,
                 trust=trust)
    return bundle, report, notes, unverified, gates, device_class, where


def _tune_options(tune: Any) -> Any:
    from edge.tune.search import TuneOptions

    if tune is True:
        return TuneOptions()
    if not isinstance(tune, TuneOptions):
        raise EdgeError(f"deploy(tune=...) takes True or an edge.tune.search.TuneOptions, got {type(tune).__name__}")
    return tune


def _tune_first(model: Any, profile: Any, build: Path, opts: Any, fps: float | None, budget_ms: float | None,
                convert_kwargs: dict[str, Any], say: Callable[[str], None]) -> tuple[Any, dict[str, Any]]:
    """``edge.tune.search.tune`` with this deploy's inputs; (the winner's overlay, what deploy reports of the tune)."""
    from edge.tune.search import tune as run_tune
    from edge.tune.overlay import read_overlay

    asked = convert_kwargs.get("precision")
    precisions = opts.precisions or ((asked,) if asked else None)
    say("tuning before converting (edgekit tune): " + (f"precisions {', '.join(precisions)}" if precisions
                                                          else "every precision the target allows"))
    result = run_tune(model, profile, out=opts.out if opts.out is not None else build.with_name(build.name + "-tune"),
                      objective=opts.objective, budget_ms=budget_ms, fps=fps, max_trials=opts.max_trials,
                      time_budget_s=opts.time_budget_s, calib=convert_kwargs.get("calib"), video=opts.video,
                      study=opts.study, strategy=opts.strategy, runners=opts.runners, precisions=precisions,
                      threads=opts.threads, schedule=opts.schedule,
                      # deploy ships its conversion at its own input shapes: a batched winner is not what it ships
                      batches=(1,),
                      # the trials are gated as this deploy's conversion will be: its samples, inputs and task
                      parity_samples=convert_kwargs.get("parity_samples", opts.parity_samples),
                      parity_data=convert_kwargs.get("parity_data"), task=convert_kwargs.get("task", "auto"),
                      freeze=convert_kwargs.get("freeze"),
                      targets_dir=convert_kwargs.get("targets_dir", ()), pictures=opts.pictures,
                      input_shapes=convert_kwargs.get("input_shapes"),
                      preprocess=convert_kwargs.get("preprocess", "auto"),
                      letterbox=convert_kwargs.get("letterbox"), on_step=say)
    summary = result.summary()
    say(summary)
    if result.winner is None or result.overlay_path is None:
        raise EdgeError(f"deploy --tune: nothing to deploy: {summary}",
                        hint=f"see the table and study in {Path(result.study_path or '.').parent} "
                             "(`edgekit tune` prints it), or deploy without --tune")
    info = {"summary": summary, "applied": result.applied, "winner": result.winner["id"],
            "label": result.winner["label"], "objective": result.objective, "device_class": result.device_class,
            "overlay": result.overlay_path, "study": result.study_path, "html": result.html_path,
            "png": result.png_path, "converted": result.converted, "measured": result.measured,
            "wall_s": round(result.wall_s, 2)}
    return read_overlay(result.overlay_path), info
