"""deploy = convert + verify + bench + ship; ``ship`` checks a bundle's gates and installs it in a device store.

The stores themselves (layout, locking, crash-safe switching, local and ssh) live in ``edge.store``;
their names are re-exported here for the modules and scripts that import them from ``edge.deploy``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from edge.bundle.bundle import Bundle
from edge.errors import BudgetError, EdgeError
from edge.pipeline.request import ConvertRequest
from edge.store import (  # noqa: F401
    BUNDLES,
    CURRENT,
    HISTORY,
    PREVIOUS,
    SSH_OPTIONS_ENV,
    DeviceStore,
    SshStore,
    Store,
    open_store,
    rollback,
    symlink_atomic,
)
from edge.targets import get_target
from edge.tune.budget import SEARCH_TIME_S, not_searched
from edge.tune.verdict import VerdictOptions

log = logging.getLogger("edge.deploy")


@dataclass
class DeployResult:
    bundle: Bundle
    shipped_to: str
    benchmark: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)
    #: why parity was not run on this host (the manifest's skipped reason), or ran but no output's reference
    #: discriminates (edge.verify.gates.parity_verdict): the bundle ships unverified
    unverified: str | None = None
    #: whether the benchmark's budget verdict gated the deploy (same device class as the target's) and why;
    #: None when there was no benchmark
    budget_gates: bool | None = None
    device_class: str | None = None
    #: ``deploy(tune=...)``: the tune's summary line, what its overlay applied, the winner and the files
    tune: dict[str, Any] | None = None
    #: the tune overlay this bundle was converted with (``--tuned`` or ``--tune``), one line; None without one
    tuned_applied: str | None = None
    #: the budget search that chose this bundle's configuration (the manifest's ``budget_search``); None: not run
    budget_search: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "bundle_id": self.bundle.id,
            "bundle_path": str(self.bundle.path),
            "shipped_to": self.shipped_to,
            "parity": self.bundle.manifest.get("parity"),
            "unverified": self.unverified,
            "benchmark": self.benchmark,
            "budget_gates": self.budget_gates,
            "device_class": self.device_class,
            "tuned_applied": self.tuned_applied,
            "tune": self.tune,
            "budget_search": self.budget_search,
            "notes": self.notes,
        }


def runner_not_here(m: Any) -> str | None:
    """Why this host cannot run the bundle's runner for its target (None: it can): what a skipped parity
    record's "runner cannot run on this host" must agree with."""
    from edge.pipeline import runnable_here
    from edge.targets import get_target

    try:
        profile = get_target(m.target.name)
    except EdgeError as e:
        return f"target {m.target.name} is not known here ({e.message})"
    return runnable_here(profile, runner=m.runner.name)


def ship(
    bundle: Bundle | str | os.PathLike[str],
    device: str | os.PathLike[str],
    *,
    accept_parity_failure: bool = False,
    accept_budget_failure: bool = False,
    trust: Any = None,
) -> str:
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
        check_gates(
            b.info,
            accept_parity_failure=accept_parity_failure,
            accept_budget_failure=accept_budget_failure,
            bundle_dir=Path(b.path),
            host_check=runner_not_here,
        )
        where = store.install(b)
    return str(where)


@dataclass(frozen=True)
class DeployOptions:
    """How ``deploy`` benchmarks, signs and ships (what it converts is the ``ConvertRequest``).

    ``build_dir``: where the bundle is built (default ``build/<model>-<target>``). ``bench_iterations``, ``fps``,
    ``budget_ms``: the benchmark on this host and its budget (default: the target's). ``accept_budget_failure``:
    ship even when p99 is over budget. ``allow_cpu_fallback``: the benchmark may run on the runner's CPU
    fallback. ``sign_key``: sign with it (else ``$EDGEKIT_SIGN_KEY`` when set). ``trust``: the trust store the
    bundle must be signed for. ``tune``: True or an ``edge.tune.search.TuneOptions``: tune first and deploy the
    winner's overlay. ``verdict``: how the budget verdict is measured (``edge.tune.verdict``: steady state, a
    marginal miss measured again, the load recorded). ``budget_search``: when the default configuration misses the
    budget where the budget gates, search for one within it (``edge.tune.budget``, at most ``search_time_s``) and
    ship it. ``isa_check``: for a target whose devices are aarch64, run the reference pairs on emulated
    aarch64 when the toolchain is installed (``edge.verify.isa.check_after_convert``; its line is in ``notes``)."""

    build_dir: str | os.PathLike[str] | None = None
    bench_iterations: int = 200
    fps: float | None = None
    budget_ms: float | None = None
    accept_budget_failure: bool = False
    allow_cpu_fallback: bool = False
    sign_key: str | None = None
    trust: Any = None
    tune: Any = None
    isa_check: bool = True
    #: how the budget verdict is measured (steady state; a marginal miss measured again): edge.tune.verdict
    verdict: VerdictOptions = field(default_factory=VerdictOptions)
    #: a default configuration over the budget (where the budget gates): search for one within it (edge.tune.budget)
    budget_search: bool = True
    search_time_s: float = SEARCH_TIME_S


def deploy(
    model: str | os.PathLike[str],
    target: str,
    device: str | os.PathLike[str],
    request: ConvertRequest | None = None,
    options: DeployOptions | None = None,
    *,
    on_step: Callable[[str], None] | None = None,
) -> DeployResult:
    """Convert (as ``request`` asks) + parity + benchmark (on this host when the target runtime runs here) + sign
    (with ``options.sign_key``, else ``$EDGEKIT_SIGN_KEY``, when either names a key) + ship.

    The benchmark's budget verdict gates only when this host is the target's device class
    (``edge.targets.same_device_class``: its OS, CPU architecture and platform, and the runner on the
    target's accelerator); otherwise it is recorded as indicative, with the reason. A bundle whose
    parity could not run here ships with ``DeployResult.unverified`` saying why. ``request.tuned``: an
    ``edgekit tune`` overlay (file or ``edge.pipeline.overlay.TunedOverlay``) applied to the target before converting
    and benchmarking. ``options.tune``: True or an ``edge.tune.search.TuneOptions``: run ``edge.tune.search.tune``
    first (this deploy's request: calibration, input shapes, pre-processing, parity data, task, and its budget and
    precision) and deploy its winner's overlay; refused when no configuration passed parity. The tune's summary
    and the overlay applied are in ``notes`` and ``tune``."""
    from edge.pipeline import convert

    say = on_step or (lambda _m: None)
    req = request if request is not None else ConvertRequest()
    opts = options if options is not None else DeployOptions()
    target_profile = get_target(target, req.targets_dir)
    tune_opts, overlay = _tune_or_tuned(opts, req)
    open_store(device)  # a bad address, bad ssh options or no ssh fail here: before minutes of work, nothing built
    build = Path(opts.build_dir) if opts.build_dir else Path("build") / f"{Path(model).stem}-{target}"
    notes: list[str] = []
    tune_info = None
    if tune_opts is not None:
        overlay, tune_info = _tune_first(model, target_profile, build, req, opts, tune_opts, say)
        notes.append(tune_info["summary"])
    profile, req, applied = _apply_overlay(target_profile, req, overlay, notes)
    check_build_dir(build)
    stage = build.parent / f".{build.name}.deploy-{os.getpid()}"
    bundle = convert(model, target_profile, stage, req.replace(tuned=overlay), force=True, on_step=say)
    searched: dict[str, Any] | None = None
    try:
        try:
            report, unverified, gates, device_class, where = _check_and_ship(
                bundle, _Shipping(target_profile, profile, device, req, opts, build, notes, say)
            )
        except BudgetError:
            why_not = not_searched(model, req, tuned=overlay is not None, enabled=opts.budget_search)
            if why_not is not None:
                notes.append(f"no budget search: {why_not}")
                raise
            searched, applied, shipped = _budget_search(
                model, target_profile, stage, device, build, req, opts, notes, say
            )
            report, unverified, gates, device_class, where = shipped
    except BaseException as e:
        kept = _keep_refused(stage, build)
        if isinstance(e, EdgeError) and kept is not None:
            e.hint = (f"{e.hint}; " if e.hint else "") + kept
            e.args = (f"{e.message} ({e.hint})",)
        raise
    _replace_dir(stage, build)
    return DeployResult(
        Bundle.open(build, trust=False),
        where,
        report,
        notes,
        unverified=unverified,
        budget_gates=gates,
        device_class=device_class,
        tune=tune_info,
        tuned_applied=applied,
        budget_search=searched,
    )


def _budget_search(
    model: Any,
    target_profile: Any,
    stage: Path,
    device: Any,
    build: Path,
    req: ConvertRequest,
    opts: DeployOptions,
    notes: list[str],
    say: Callable[[str], None],
) -> tuple[dict[str, Any], str | None, Any]:
    """The default configuration (the bundle in ``stage``) missed the budget on the device class that gates: search
    (``edge.tune.budget``), convert the fastest candidate within the budget into ``stage`` with its overlay, and
    check and ship it as any bundle; (the search's record, the overlay applied, what ``_check_and_ship`` gave).
    Nothing found, or the winner missing the budget in its own steady-state verdict: a ``BudgetError`` that lists
    what was tried (the bundle refused carries the record)."""
    from edge.pipeline import convert
    from edge.tune import budget as bs

    default = Bundle.open(stage, trust=False)
    bench = default.manifest["benchmark"]
    budget, p99 = float(bench["budget_ms"]), float(bench["latency"]["p99_ms"])
    t0 = time.monotonic()
    ranked, record = bs.search_ranked(
        model, target_profile, req, build.with_name(build.name + "-budget"), budget, p99, opts.search_time_s, say
    )
    tried = bs.tried_line(record)
    if not ranked:
        default.record("budget_search", record)
        raise BudgetError(
            f"refusing to ship {default.id}: p99 {p99:.2f} ms is over the {budget:.2f} ms budget; {tried}",
            hint="pass --accept-budget-failure to ship the default anyway",
        )
    say(f"budget search chose {record['chosen']}: {record['why']}")
    notes.append(f"budget search chose {record['chosen']}: {record['why']}")
    missed: list[str] = []
    hint: str | None = None
    for i, overlay in enumerate(ranked):
        if i:  # the chosen one missed in its own verdict: the next candidate, while the search's time lasts
            if time.monotonic() - t0 > opts.search_time_s:
                missed.append(f"{len(ranked) - i} alternate(s) not tried: the {opts.search_time_s:g} s cap passed")
                break
            say(f"trying the search's next candidate: {overlay.describe()}")
        # each candidate writes its own notes (overlay, verdict, ...): a missed one's are summed up in one line below,
        # not left in the shipped bundle's report as if they were its own
        own = list(notes)
        profile, req_i, applied = _apply_overlay(target_profile, req, overlay, own)
        bundle = convert(model, target_profile, stage, req_i.replace(tuned=overlay), force=True, on_step=say)
        record["verdict_missed"] = list(missed)
        bundle.record("budget_search", record)
        if i:
            own.append(f"the search's candidate {i + 1}; before it: {'; '.join(missed)}")
        try:
            shipped = _check_and_ship(bundle, _Shipping(target_profile, profile, device, req_i, opts, build, own, say))
        except BudgetError as e:
            missed.append(f"{overlay.describe()}: {e.message}")
            hint = e.hint
            continue
        notes[:] = own
        return record, applied, shipped
    raise BudgetError(f"{missed[0]}; {tried}; then {'; '.join(missed[1:]) or 'nothing else'}", hint=hint)


def _apply_overlay(
    profile: Any, req: ConvertRequest, overlay: Any, notes: list[str]
) -> tuple[Any, ConvertRequest, str | None]:
    """(the target with the tune overlay applied, the request at its precision, what it applied); applied here too,
    so the benchmark runs the tuned runner and options (convert applies it to what it builds)."""
    if overlay is None:
        return profile, req, None
    from edge.pipeline.overlay import apply_overlay, resolve_precision

    applied = overlay.describe()
    where = (
        ""
        if overlay.tuned.get("same_device_class", True)
        else f" (tuned off the device: {overlay.tuned.get('device_class')})"
    )
    notes.append(f"tuned overlay {overlay.path or ''} applied: {applied}{where}".replace("  ", " "))
    return apply_overlay(profile, overlay), req.replace(precision=resolve_precision(overlay, req.precision)), applied


def check_build_dir(build: Path) -> None:
    """A build directory that exists must be an earlier bundle (it is replaced once the new one ships): never a
    directory of the user's that a typo in --build-dir named."""
    if build.is_symlink() or (build.exists() and not (build.is_dir() and (build / "manifest.json").is_file())):
        raise EdgeError(
            f"--build-dir {build} exists and is not an edgekit bundle: it would be replaced",
            hint="choose another --build-dir, or remove it yourself",
        )


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


@dataclass(frozen=True)
class _Shipping:
    """What a converted bundle is checked, benchmarked, signed and shipped with."""

    target_profile: Any  # as asked (the ISA check reads its device class)
    profile: Any  # with the tune overlay applied (the benchmark runs its runner and options)
    device: str | os.PathLike[str]
    req: ConvertRequest
    opts: DeployOptions
    final: Path  # where the bundle goes once shipped (it is built in a staging directory beside it)
    notes: list[str]
    say: Callable[[str], None]


def _check_and_ship(
    bundle: Bundle, s: _Shipping
) -> tuple[dict[str, Any] | None, str | None, bool | None, str | None, str]:
    """The converted bundle (in its staging directory): ISA check, benchmark, signature, ship; (the benchmark
    report, why parity was not run here, whether the budget gates, the device class line, where it shipped)."""
    from edge.verify.gates import parity_verdict

    bundle = _isa_check(bundle, s.target_profile, s.req, s.opts, s.notes, s.say)
    verdict = parity_verdict(bundle.info)  # skipped, or run with every reference degenerate: unverified, and why
    unverified = verdict.skipped if verdict.state in ("skipped", "unverified") else None
    if unverified is not None:
        s.say(f"unverified on this host: {unverified}")
    report, gates, device_class = _benchmark(bundle, s.profile, s.opts, s.final, s.notes, s.say)
    bundle = _sign(bundle, s.opts.sign_key, s.notes, s.say)
    s.say(f"shipping {bundle.id} to {s.device}")
    where = ship(
        bundle,
        s.device,
        accept_parity_failure=s.req.accept_parity_failure,
        accept_budget_failure=s.opts.accept_budget_failure,
        trust=s.opts.trust,
    )
    return report, unverified, gates, device_class, where


def _tune_or_tuned(opts: DeployOptions, req: ConvertRequest) -> tuple[Any, Any]:
    """(the TuneOptions to tune with now, or None; the overlay tuned before, read and checked now, or None)."""
    if opts.tune is not None and opts.tune is not False:
        if req.tuned is not None:
            raise EdgeError("give either --tune (tune now) or --tuned FILE (an overlay tuned before), not both")
        return _tune_options(opts.tune), None
    if req.tuned is None:
        return None, None
    from edge.pipeline.overlay import TunedOverlay, read_overlay

    return None, req.tuned if isinstance(req.tuned, TunedOverlay) else read_overlay(req.tuned)


def _isa_check(
    bundle: Bundle, profile: Any, req: ConvertRequest, opts: DeployOptions, notes: list[str], say: Callable[[str], None]
) -> Bundle:
    """The bundle after its emulated-aarch64 check (``edge.verify.isa.check_after_convert``), said and noted."""
    from edge.verify.isa import check_after_convert

    line, _ = check_after_convert(
        bundle, profile, enabled=opts.isa_check, accept_failure=req.accept_parity_failure, on_step=say
    )
    if not line:
        return bundle
    say(line)  # "checked on aarch64 (emulated cortex-a76): pass ..." or why not
    notes.append(line)
    return Bundle.open(bundle.path, trust=False)


def _benchmark(
    bundle: Bundle, profile: Any, opts: DeployOptions, final: Path, notes: list[str], say: Callable[[str], None]
) -> tuple[dict[str, Any] | None, bool | None, str | None]:
    """(the benchmark report recorded in the bundle, whether its budget verdict gates, the device class line);
    (None, None, None) with a note when the target's runner cannot run on this host."""
    from edge.bench import BenchOptions, bundle_feeds, judge_device_class
    from edge.pipeline import runnable_here
    from edge.stats import budget_from
    from edge.tune.verdict import measure_verdict

    run_here = runnable_here(profile)  # parity may have run on a host proxy; the benchmark needs the runner itself
    if run_here is not None:
        notes.append(
            f"not benchmarked: the target's runner cannot run on this host ({run_here}); run `edgekit bench {final} --record` on the device"
        )
        return None, None, None
    budget, source = budget_from(opts.fps, opts.budget_ms, profile.frame_budget_ms)
    v = opts.verdict
    say(
        f"benchmarking on this host in steady state ({v.warmup_s:g} s warm-up, then at least {v.measure_s:g} s and "
        f"{opts.bench_iterations} iterations; load average {_load_text()})"
    )
    extra = {"allow_cpu_fallback": True} if opts.allow_cpu_fallback else {}
    feeds, feeds_from = bundle_feeds(bundle)  # the reference pairs' input, as `edgekit bench` feeds
    rep, steadiness = measure_verdict(
        lambda: bundle.open_runner(extra),
        BenchOptions(
            iterations=opts.bench_iterations,
            budget_ms=budget,
            budget_source=source,
            bundle=bundle.id,
            target=profile.name,
        ),
        v,
        feeds=feeds,
        feeds_from=feeds_from,
        say=say,
    )
    gates, device_class = judge_device_class(rep, profile)
    load = steadiness.get("load_after") or steadiness.get("load_before")
    notes.append(
        f"budget verdict {rep.verdict}: p99 {rep.latency.p99_ms:.2f} ms"
        + (f" against {budget:.2f} ms" if budget is not None else "")
        + f" in steady state ({steadiness['decided_by']}; runs' p99 "
        + ", ".join(f"{x:.2f}" for x in steadiness["runs_p99_ms"])
        + f" ms; load average {' '.join(f'{x:.2f}' for x in load) if load else 'unknown'} on {steadiness['cpus']} CPUs)"
    )
    if gates:
        notes.append(f"the budget verdict gates this deploy: {device_class}")
    else:
        notes.append(f"the budget verdict is indicative and does not gate this deploy: {device_class}")
    say(notes[-1])
    report = {**rep.to_json(), "steadiness": steadiness}
    bundle.record("benchmark", report)
    return report, gates, device_class


def _load_text() -> str:
    from edge.tune.verdict import load_average

    load = load_average()
    return " ".join(f"{x:.2f}" for x in load) if load else "unknown"


def _sign(bundle: Bundle, sign_key: str | None, notes: list[str], say: Callable[[str], None]) -> Bundle:
    """The bundle signed with ``sign_key`` (else ``$EDGEKIT_SIGN_KEY``) when either names a key: last, so the
    signature covers the final manifest, benchmark included."""
    from edge.bundle.bundle import sign_bundle
    from edge.bundle.signing import configured_sign_key

    key = configured_sign_key(sign_key)
    if key is None:
        return bundle
    say(f"signing {bundle.id} with {key}")
    signed = sign_bundle(bundle.path, key)
    notes.append(f"signed with key {signed.key_id}: {signed.name} version {signed.version}")
    return Bundle.open(bundle.path, trust=False)


def _tune_options(tune: Any) -> Any:
    from edge.tune.search import TuneOptions

    if tune is True:
        return TuneOptions()
    if not isinstance(tune, TuneOptions):
        raise EdgeError(f"deploy(tune=...) takes True or an edge.tune.search.TuneOptions, got {type(tune).__name__}")
    return tune


def _tune_first(
    model: Any,
    profile: Any,
    build: Path,
    req: ConvertRequest,
    deploy_opts: DeployOptions,
    opts: Any,
    say: Callable[[str], None],
) -> tuple[Any, dict[str, Any]]:
    """``edge.tune.search.tune`` with this deploy's request and budget; (the winner's overlay, what deploy reports
    of the tune)."""
    from edge.pipeline.overlay import read_overlay
    from edge.tune.search import tune as run_tune

    precisions = opts.precisions or ((req.precision,) if req.precision else None)
    say(
        "tuning before converting (edgekit tune): "
        + (f"precisions {', '.join(precisions)}" if precisions else "every precision the target allows")
    )
    opts = dataclasses.replace(
        opts,
        out=opts.out if opts.out is not None else build.with_name(build.name + "-tune"),
        budget_ms=deploy_opts.budget_ms,
        fps=deploy_opts.fps,
        precisions=precisions,
        # deploy ships its conversion at its own input shapes: a batched winner is not what it ships
        batches=(1,),
    )
    # the trials are gated as this deploy's conversion will be: its samples, inputs and task
    result = run_tune(model, profile, req, opts, on_step=say)
    summary = result.summary()
    say(summary)
    if result.winner is None or result.overlay_path is None:
        raise EdgeError(
            f"deploy --tune: nothing to deploy: {summary}",
            hint=f"see the table and study in {Path(result.study_path or '.').parent} (`edgekit tune` prints it), or deploy without --tune",
        )
    info = {
        "summary": summary,
        "applied": result.applied,
        "winner": result.winner["id"],
        "label": result.winner["label"],
        "objective": result.objective,
        "device_class": result.device_class,
        "overlay": result.overlay_path,
        "study": result.study_path,
        "html": result.html_path,
        "png": result.png_path,
        "converted": result.converted,
        "measured": result.measured,
        "wall_s": round(result.wall_s, 2),
    }
    return read_overlay(result.overlay_path), info
