"""``edgekit tune``: the fastest configuration of a model for a target that keeps parity, found on this host.

    from edge.pipeline import ConvertRequest
    from edge.tune.search import TuneOptions, tune
    result = tune("model.onnx", "x86-cpu", ConvertRequest(calib="random"), TuneOptions(out="build/tune"))
    result.winner            # the chosen trial (None when no configuration passed parity)
    result.overlay_path      # the winner as a profile overlay: edgekit convert/deploy --tuned FILE

The space (``edge.tune.space``) is every runner that serves the target's device class here, precision,
recipe and runner options, pruned with reasons. Each trial converts through the one pipeline
(``edge.pipeline.convert``; the bundle cached on disk by its recipe key, so a re-run converts nothing);
parity is a hard constraint: the conversion's gate and the trial's own runner options on the bundle's
reference pairs must both pass, and a trial that fails is reported, never chosen. The objective is
measured as ``bench`` measures it (only ``infer`` timed) in interleaved repetitions, the score being
the median of the repetitions' medians. ``e2e`` runs the video pipeline over ``video`` as ``edgekit run --realtime``
does, frames fed at the target rate (``fps``/``budget_ms``, else the video's own): a trial ranks by the share of
frames it missed (dropped, or processed past their deadline), then by its median frame time; the video pipeline's
inference workers are part of its space and of the overlay.

Search: successive halving (default) — every trial gets a short measurement, the best third goes on to a
longer one, until ``eta`` finalists remain, which get as many samples as the exhaustive sweep gives every
trial (``strategy="exhaustive"``), in short blocks (``Schedule.final``). A rung with more trials than are open at
once (``MAX_OPEN``) is measured in chunks, each with the same anchor trial, and ranked by each trial's ratio to the
anchor in its chunk (``vs_anchor`` in the study; the raw p50/p99 are kept and reported): background load that
drifts between chunks does not rank them. Every finished measurement is written to the study file at once, so an
interrupted or repeated run resumes: conversions and measurements in it are not done again.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from edge.base.hashing import sha256_file
from edge.errors import EdgeError
from edge.pipeline.request import ConvertRequest
from edge.tune.cache import (
    calib_identity,
    conversion_parity,
    convert_cached,
    natural_calibration_problem,
    recipe_key,
    source_key,
    trial_request,
)
from edge.tune.config import OBJECTIVES, Config
from edge.tune.measure import (
    E2E_SHORT_REPS,
    MAX_OPEN,
    MIN_E2E_FRAMES,
    SHORT_BLOCK,
    SHORT_REPS,
    THROUGHPUT_REQUESTS,
    Pool,
    Rung,
    Trials,
    measure_chunk,
)
from edge.tune.ranking import choose, mark_rung, priority, ranked_trials, trial_results
from edge.tune.space import BATCHES, Extent, Space, batch_plan, build_space
from edge.tune.study import load_study, save_study

STRATEGIES = ("halving", "exhaustive")
#: inferences per timed block of the finalists' measurement after successive halving (Schedule.final)
FINAL_BLOCK = 10
#: (reps, iters) of the first rung when successive halving has several short ones: one warm block per trial.
#: Measured on the PP-OCR classifier's 136 trials (benchmarks/tune.py, loaded 2-core host): ranked by the first of
#: its 2 repetitions of 6 alone, rung 0 kept 9 of the sweep's 10 best and its 3 best (Spearman 0.72 against the
#: 5x40 sweep; the median of both repetitions: 10, 3, 0.67), in half the inferences
FIRST_RUNG = (1, SHORT_BLOCK)
#: untimed inferences per trial before a short rung (the full measurement: Schedule.warmup): a trial was warmed
#: when it was opened, and every timed block follows edge.tune.measure.SETTLE untimed calls
SHORT_WARMUP = 1
Say = Callable[[str], None]


@dataclass(frozen=True)
class Schedule:
    """How long each measurement is: ``reps`` interleaved repetitions of ``iters`` timed inferences
    (``e2e``: ``iters`` video frames) after ``warmup`` untimed ones."""

    reps: int = 5
    iters: int = 40
    warmup: int = 5
    eta: int = 3

    def rungs(self, n: int, objective: str = "latency") -> list[tuple[int, int]]:
        """(reps, iters) per rung of successive halving for ``n`` trials; the last is the full measurement."""
        rounds = max(0, math.ceil(math.log(max(n, 1) / self.eta, self.eta))) if n > self.eta else 0
        full = self.reps * self.iters
        if objective == "e2e":
            # realtime: a repetition lasts frames/fps whatever the configuration, and frames are dropped only once
            # a queue has filled: few, long repetitions (at least MIN_E2E_FRAMES frames each)
            return [
                (E2E_SHORT_REPS, max(MIN_E2E_FRAMES, math.ceil(full / self.eta ** (rounds - k) / E2E_SHORT_REPS)))
                for k in range(rounds)
            ] + [(self.reps, self.iters)]
        # a short rung takes 1/eta of the next one's samples (at least 12), in SHORT_REPS repetitions of blocks
        # long enough to measure a warm runtime (edge.tune.measure.SHORT_BLOCK)
        short = [
            (SHORT_REPS, max(SHORT_BLOCK, math.ceil(max(12, full // self.eta ** (rounds - k)) / SHORT_REPS)))
            for k in range(rounds)
        ]
        if rounds >= 2:
            # the first of several short rungs only separates the best third from clearly slower trials, and on a
            # small model opening a trial costs more than measuring it: one warm block (FIRST_RUNG)
            short[0] = FIRST_RUNG
        return short + [self.final(rounds > 0)]

    def final(self, halving: bool = True) -> tuple[int, int]:
        """(reps, iters) of the full measurement. After halving the few finalists take the same samples in blocks
        of at most FINAL_BLOCK inferences: near-equals are decided there, and with short blocks one rotation
        through them is short, so a burst of background load (on a shared host, seconds long) hits each alike
        (a 5x40 final on a loaded 2-core host once ranked two configurations 15% apart head to head the wrong way)."""
        if not halving or self.iters <= FINAL_BLOCK:
            return self.reps, self.iters
        return math.ceil(self.reps * self.iters / FINAL_BLOCK), FINAL_BLOCK


@dataclass
class TuneResult:
    model: str
    target: str
    objective: str
    strategy: str
    budget_ms: float | None
    budget_source: str
    trials: list[dict[str, Any]]
    pruned: list[str]
    notes: list[str]
    winner: dict[str, Any] | None
    device_class: dict[str, Any]
    host: dict[str, Any]
    applied: str | None = None  # what the overlay applies, one line
    overlay_path: str | None = None
    #: the next-best trials' overlays, best first (``TuneOptions.alternates``)
    alternate_paths: list[str] = dataclasses.field(default_factory=list)
    study_path: str | None = None
    html_path: str | None = None
    png_path: str | None = None
    measured: int = 0  # measurements taken in this run (0 when everything came from the study)
    converted: int = 0  # conversions run in this run (0 when every bundle came from the cache)
    wall_s: float = 0.0
    convert_s: float = 0.0
    search_s: float = 0.0

    def nothing_converted(self) -> str | None:
        """The first refusal when no configuration converted at all (the model, not a setting, is the problem),
        else None."""
        statuses = [str(t.get("status", "")) for t in self.trials]
        if not statuses or not all(s.startswith("conversion failed: ") for s in statuses):
            return None
        return statuses[0].removeprefix("conversion failed: ")

    def summary(self) -> str:
        """One line: what was tried, what passed parity, what was chosen and how fast, and where it ran."""
        failed = sum((t.get("parity") or {}).get("passed") is False for t in self.trials)
        broken = sum(str(t.get("status", "")).startswith(("conversion failed", "failed")) for t in self.trials)
        head = (
            f"tune {self.target} ({self.objective}, {self.strategy}): {len(self.trials)} configurations, "
            f"{failed} failed parity"
            + (f", {broken} failed to convert or run" if broken else "")
            + f", {len(self.pruned)} pruned groups"
        )
        if self.winner is None:
            return head + "; none chosen"
        res = self.winner.get("result") or {}
        per_s = " items/s" if self.objective == "throughput" else " fps"  # a batched trial counts items
        figs = ", ".join(
            f"{k} {res[k]:.2f}{u}"
            for k, u in (("p50_ms", " ms"), ("p99_ms", " ms"), ("fps", per_s))
            if isinstance(res.get(k), (int, float))
        )
        if isinstance(res.get("missed"), int):
            figs += (
                f", {res['missed']} of {res.get('frames')} frames missed at {res.get('pace_fps') or 0:.4g} fps "
                f"({res.get('dropped')} dropped, {res.get('late')} late)"
            )
        where = "on the target's device class" if self.device_class.get("same") else "NOT on the target's device class"
        return f"{head}; chosen {self.winner['label']} ({figs}), measured {where}"

    def to_json(self) -> dict[str, Any]:
        from edge.tune.report import pareto_front

        return {
            "model": self.model,
            "target": self.target,
            "objective": self.objective,
            "strategy": self.strategy,
            "budget_ms": self.budget_ms,
            "budget_source": self.budget_source,
            "host": self.host,
            "device_class": self.device_class,
            "winner": self.winner,
            "applied": self.applied,
            "trials": self.trials,
            "pareto": [t["id"] for t in pareto_front(self.trials)],
            "pruned": self.pruned,
            "summary": self.summary(),
            "notes": self.notes,
            "files": {
                "overlay": self.overlay_path,
                "study": self.study_path,
                "html": self.html_path,
                "png": self.png_path,
            },
            "measured": self.measured,
            "converted": self.converted,
            "wall_s": round(self.wall_s, 2),
            "convert_s": round(self.convert_s, 2),
            "search_s": round(self.search_s, 2),
        }


@dataclass(frozen=True)
class TuneOptions:
    """How ``tune`` (and ``tune_on_device``, ``deploy(..., DeployOptions(tune=...))``) searches; what each trial
    converts is the ``ConvertRequest``. ``out``: where the overlay (``tuned.toml``), ``study.json`` (unless
    ``study``), ``pareto.html``/``.png`` and the conversion cache (``cache/``, unless ``cache``) go (default
    ``build/<model>-<target>-tune``; deploy: ``<build_dir>-tune``). ``video``: required for ``objective="e2e"``.
    ``budget_ms``/``fps``: a budget to rank within (default: the target's, reported only). ``precisions``: default
    the request's ``precision`` when it names one, else every precision the target allows. ``batches``: the batch
    sizes tried for ``objective="throughput"`` (default ``edge.tune.space.BATCHES``, for a model whose first input
    dimension is a batch: ``edge.tune.space.batch_plan``); ``[1]`` tunes batch 1 only."""

    objective: str = "latency"
    strategy: str = "halving"
    max_trials: int | None = None
    time_budget_s: float | None = None
    video: str | os.PathLike[str] | None = None
    study: str | os.PathLike[str] | None = None
    out: str | os.PathLike[str] | None = None
    runners: Sequence[str] | None = None
    precisions: Sequence[str] | None = None
    threads: Sequence[int] | None = None
    schedule: Schedule | None = None
    pictures: bool = True
    budget_ms: float | None = None
    fps: float | None = None
    cache: str | os.PathLike[str] | None = None
    batches: Sequence[int] | None = None
    #: only these runner options and recipe knobs vary (the rest at their first value); None: all
    vary: Sequence[str] | None = None
    #: the next-best trials (the same ranking) written as overlays too (``tuned-alt1.toml``, ...), for a caller
    #: whose own check may refuse the winner (deploy's budget search: the steady-state verdict)
    alternates: int = 0


def _host() -> dict[str, Any]:
    from edge.capabilities import cpu_isa, current_host

    h = current_host()
    from edge.backends.threads import usable_cpus

    return {"os": h.os, "arch": h.arch, "cpu": cpu_isa().model, "cpus": usable_cpus()}


def _isa() -> list[str]:
    """The ISA flags edgekit reads on this CPU (``edge.capabilities.ISA_FLAGS``), for the overlay and manifest."""
    from edge.capabilities import cpu_isa

    return sorted(cpu_isa().flags)


def tune(
    model: str | os.PathLike[str],
    target: str | Any,
    request: ConvertRequest | None = None,
    options: TuneOptions | None = None,
    *,
    on_step: Say | None = None,
) -> TuneResult:
    """Search ``target``'s space on this host for ``model`` (ONNX); see the module docstring and ``TuneOptions``.

    ``request``: what every trial converts with (``trial_request``: input shapes, pre-processing, frozen inputs,
    calibration and parity data, parity samples and task; part of the recipe key): every trial is the model and
    is gated on the inputs and by the task the conversion of the winner will be."""
    t_start = time.perf_counter()
    req = request if request is not None else ConvertRequest()
    opts = options if options is not None else TuneOptions()
    if opts.precisions is None and req.precision:
        opts = dataclasses.replace(opts, precisions=(req.precision,))
    run = _start(model, target, req, opts, on_step or (lambda _m: None))
    _convert_trials(run)
    _measure_trials(run)
    return _finish(run, t_start)


def _check_options(req: ConvertRequest, opts: TuneOptions) -> Schedule:
    """Every option refused before any work; the schedule to measure with."""
    if opts.strategy not in STRATEGIES:
        raise EdgeError(f"unknown strategy {opts.strategy!r}", hint=f"choose one of {', '.join(STRATEGIES)}")
    if opts.objective not in OBJECTIVES:
        raise EdgeError(f"unknown objective {opts.objective!r}", hint=f"choose one of {', '.join(OBJECTIVES)}")
    if (opts.objective == "e2e") != (opts.video is not None):
        raise EdgeError(
            "--objective e2e measures the video pipeline: give --video FILE with it (and only with it)",
            hint="--objective e2e --video clip.mp4, or --objective latency|throughput without --video",
        )
    if opts.max_trials is not None and opts.max_trials < 1:
        raise EdgeError(f"--max-trials must be >= 1, got {opts.max_trials}")
    if opts.time_budget_s is not None and opts.time_budget_s <= 0:
        raise EdgeError(f"--time-budget must be > 0 seconds, got {opts.time_budget_s}")
    if req.parity_samples < 2:
        raise EdgeError(f"parity samples must be >= 2, got {req.parity_samples}")
    if req.tuned is not None or req.eval_text is not None:
        raise EdgeError(
            "tune searches the overlay itself and takes ONNX models: a request with tuned or eval_text does not apply",
            hint="leave out --tuned and --eval-text",
        )
    sched = opts.schedule or Schedule()
    if sched.reps < 1 or sched.iters < 1 or sched.eta < 2 or sched.warmup < 0:
        raise EdgeError("schedule: reps and iters must be >= 1, eta >= 2, warmup >= 0")
    batches = opts.batches
    if batches is not None and (
        not batches or any(not isinstance(b, int) or isinstance(b, bool) or not 1 <= b <= 64 for b in batches)
    ):
        raise EdgeError(f"batches must be integers from 1 to 64, got {list(batches)}")
    return sched


@dataclass
class _Run:
    """One tune's state, filled in step by step (``tune`` reads top to bottom)."""

    model: Path
    profile: Any
    req: ConvertRequest
    opts: TuneOptions
    sched: Schedule
    say: Say
    video: Path | None
    budget: float | None
    budget_source: str
    rank_budget: float | None  # a budget the user gave: trials within it rank first
    pace_fps: float | None  # e2e: the rate frames are fed at (None: the video's own)
    out_dir: Path
    space: Space
    study_path: Path
    header: dict[str, Any]
    host: dict[str, Any]
    model_sha: str
    configs: list[Config]
    notes: list[str]
    recs: dict[str, dict[str, Any]]
    deadline: float | None
    keys: dict[str, str] = field(default_factory=dict)
    bundles: dict[str, Any] = field(default_factory=dict)  # recipe key -> Bundle or EdgeError
    singles: dict[str, Any] = field(default_factory=dict)
    converted: int = 0
    measured: int = 0
    convert_s: float = 0.0
    search_s: float = 0.0

    def over_time(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline

    def batched(self, c: Config, src: Mapping[str, Any]) -> dict[str, Any]:
        """The recipe source of a batched trial: the model converted at input shapes of batch N."""
        if c.batch == 1 or self.space.batch is None:
            return dict(src)
        return {**src, "input_shapes": {**src.get("input_shapes", {}), **self.space.batch.input_shapes(c.batch)}}

    def trial_model(self, c: Config) -> Path:
        batch = self.space.batch
        return batch.model if (c.batch != 1 and batch and batch.model) else self.model

    def trial_request(self, c: Config) -> ConvertRequest:
        req = trial_request(self.req)
        if c.batch == 1 or self.space.batch is None:
            return req
        return req.replace(input_shapes={**req.input_shapes, **self.space.batch.input_shapes(c.batch)})


def _start(model: str | os.PathLike[str], target: Any, req: ConvertRequest, opts: TuneOptions, say: Say) -> _Run:
    """Options checked, the space built, the study read, the trials' records (measurements resumed from it)."""
    from edge.pipeline import open_source
    from edge.stats import budget_from
    from edge.targets import TargetProfile, get_target

    sched = _check_options(req, opts)
    profile = target if isinstance(target, TargetProfile) else get_target(target, req.targets_dir)
    model = Path(model)
    src = open_source(model)
    if src.format != "onnx":
        raise EdgeError(
            f"edgekit tune takes an ONNX model; {model.name} is {src.format}",
            hint="export the model to ONNX (edgekit convert takes the other formats as they are)",
        )
    video = Path(opts.video) if opts.video is not None else None
    if video is not None and not video.is_file():
        raise EdgeError(f"video {video} does not exist")
    budget, budget_source = budget_from(opts.fps, opts.budget_ms, profile.frame_budget_ms)
    # a budget the user gave ranks the trials within it first; the profile's default is reported, not ranked on
    # (a short rung's p99 is the worst of a few samples: ranking on it would eliminate on noise)
    rank_budget = budget if (opts.fps is not None or opts.budget_ms is not None) else None
    # e2e runs as `edgekit run --realtime` runs: frames fed at the rate asked for, else at the video's own
    pace_fps = 1000.0 / rank_budget if (opts.objective == "e2e" and rank_budget) else None
    out_dir = Path(opts.out) if opts.out is not None else Path("build") / f"{model.stem}-{profile.name}-tune"
    space = _space(model, profile, req, opts, out_dir, video)
    out_dir.mkdir(parents=True, exist_ok=True)
    study_path = Path(opts.study) if opts.study is not None else out_dir / "study.json"
    model_sha, host = sha256_file(model), _host()
    header = {
        "model_sha256": model_sha,
        "target": profile.name,
        "objective": opts.objective,
        "strategy": opts.strategy,
        "video": video.name if video else None,
        "host": host,
    }
    if opts.objective == "e2e":  # measured at a rate: another rate's measurements do not compare
        header["e2e_pace"] = f"realtime at {pace_fps:.6g} fps" if pace_fps else "realtime at the video's rate"
    if opts.objective == "throughput":  # a study measured one request at a time throughout does not compare
        header["throughput_requests"] = THROUGHPUT_REQUESTS
    stored = load_study(study_path, header)
    configs, notes = priority(space), list(space.notes)
    if opts.max_trials is not None and len(configs) > opts.max_trials:
        notes.append(
            f"--max-trials {opts.max_trials}: {len(configs) - opts.max_trials} of {len(configs)} "
            "configurations not tried (each runner and precision's defaults were taken first)"
        )
        configs = configs[: opts.max_trials]
    deadline = time.perf_counter() + opts.time_budget_s if opts.time_budget_s is not None else None
    return _Run(
        model=model,
        profile=profile,
        req=req,
        opts=opts,
        sched=sched,
        say=say,
        video=video,
        budget=budget,
        budget_source=budget_source,
        rank_budget=rank_budget,
        pace_fps=pace_fps,
        out_dir=out_dir,
        space=space,
        study_path=study_path,
        header=header,
        host=host,
        model_sha=model_sha,
        configs=configs,
        notes=notes,
        recs=_records(configs, stored),
        deadline=deadline,
    )


def _space(
    model: Path, profile: Any, req: ConvertRequest, opts: TuneOptions, out_dir: Path, video: Path | None
) -> Space:
    batches = opts.batches
    # throughput: batch sizes where the model's first input dimension is a batch (onnxruntime tries batch 2 once)
    plan = (
        batch_plan(model, out_dir / "batch", req.input_shapes or None, tuple(batches or BATCHES))
        if opts.objective == "throughput" and any(b != 1 for b in (batches or BATCHES))
        else None
    )
    return build_space(
        profile,
        objective=opts.objective,
        calibrated=req.calib is not None or natural_calibration_problem(model, req) is None,
        video=video is not None,
        runners=opts.runners,
        precisions=opts.precisions,
        threads=opts.threads,
        targets_dir=req.targets_dir,
        extent=Extent(batch=plan, vary=opts.vary),
    )


def _records(configs: Sequence[Config], stored: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A record per trial; measurements and the trial's parity check come from the study (the status is found
    again)."""
    recs: dict[str, dict[str, Any]] = {}
    for c in configs:
        base = {"id": c.id, "label": c.label(), **c.to_json(), "status": "pending", "rungs": {}, "parity": None}
        old = stored.get(c.id)
        if old:
            base["rungs"], base["parity"] = dict(old.get("rungs") or {}), old.get("parity")
            base.update(
                {k: old[k] for k in ("runtime", "load_ms", "memory_mb") if isinstance(old.get(k), (dict, int, float))}
            )
        recs[c.id] = base
    return recs


def _convert_trials(run: _Run) -> None:
    """One conversion per recipe key, shared by the trials that differ only in runner options."""
    t_conv = time.perf_counter()
    calib_id = calib_identity(run.req.calib)
    keyed = source_key(run.req)
    cache_dir = Path(run.opts.cache) if run.opts.cache is not None else run.out_dir / "cache"
    parity_samples = run.req.parity_samples
    run.keys = {
        c.id: recipe_key(run.model_sha, run.profile, c, run.space, calib_id, parity_samples, run.batched(c, keyed))
        for c in run.configs
    }
    for c in run.configs:
        rec, key = run.recs[c.id], run.keys[c.id]
        rec["recipe_key"] = key
        if key not in run.bundles:
            if run.over_time():
                rec["status"] = "not run (time budget)"
                continue
            run.say(
                f"converting {c.runner} {c.bundle_precision} {dict(c.recipe) or ''} ({len(run.bundles) + 1} recipes)"
            )
            try:
                run.bundles[key], fresh = convert_cached(
                    run.trial_model(c), run.profile, c, run.space, key, cache_dir, run.trial_request(c)
                )
            except EdgeError as e:
                run.bundles[key], fresh = e, True
            run.converted += int(fresh)
        b = run.bundles[key]
        if isinstance(b, EdgeError):
            rec["status"] = f"conversion failed: {str(b).splitlines()[0][:300]}"
            continue
        conversion_parity(rec, b)
    run.convert_s = time.perf_counter() - t_conv
    save_study(run.study_path, run.header, run.recs)
    # a batched trial's per-item reference: the batch-1 bundle of its runner, precision and recipe
    for c in run.configs:
        if c.batch != 1:
            one = run.bundles.get(
                recipe_key(
                    run.model_sha,
                    run.profile,
                    Config(c.runner, c.precision, c.recipe, c.options, c.workers, 1),
                    run.space,
                    calib_id,
                    parity_samples,
                    keyed,
                )
            )
            run.singles[c.id] = None if isinstance(one, EdgeError) else one


def _measure_trials(run: _Run) -> None:
    """Successive halving, or every trial at full length."""
    t_search = time.perf_counter()
    sched, objective = run.sched, run.opts.objective
    alive = [c for c in run.configs if "bundle" in run.recs[c.id]]
    rungs = sched.rungs(len(alive), objective) if run.opts.strategy == "halving" else [(sched.reps, sched.iters)]
    by_id = {c.id: c for c in run.configs}
    pool = Pool()
    try:
        for k, (reps, iters) in enumerate(rungs):
            if not alive:
                break
            name = f"{k}:{reps}x{iters}"  # rung index first: two rungs of the same length stay apart
            if run.over_time() and k > 0:  # the first measurement of what was converted always runs: cheap beside
                # the conversions, and without it nothing could be chosen
                for c in alive:
                    run.recs[c.id]["status"] = f"not measured at {name} (time budget)"
                run.notes.append(
                    f"--time-budget reached before the {name} measurement: the winner comes from a shorter one"
                )
                break
            last = k == len(rungs) - 1
            # the first of several latency/throughput rungs eliminates most trials: their own reference checks
            # wait until they survive it (e2e's pipeline runs are long beside a check: checked at once)
            rung = Rung(
                name,
                objective,
                reps,
                iters,
                sched.warmup if last else min(sched.warmup, SHORT_WARMUP),
                run.video,
                run.budget,
                run.pace_fps,
                check=not (k == 0 and len(rungs) > 1 and run.video is None),
            )
            _measure_rung(run, alive, rung, pool)
            ranked = ranked_trials((run.recs[c.id] for c in alive), name, run.rank_budget, objective)
            # at least eta finalists: the last measurement decides between near-equals, and a short rung's noise
            # must not leave it only two to choose from
            keep = ranked if last else ranked[: max(min(sched.eta, len(ranked)), math.ceil(len(alive) / sched.eta))]
            kept = {r["id"] for r in keep}
            mark_rung((run.recs[c.id] for c in alive), kept, name, last)
            alive = [by_id[i] for i in (r["id"] for r in keep)]
            pool.close([i for i in list(pool.open) if i not in kept])
    finally:
        pool.close_all()
    run.search_s = time.perf_counter() - t_search


def _measure_rung(run: _Run, alive: Sequence[Config], rung: Rung, pool: Pool) -> None:
    """Every trial of ``alive`` not yet measured at ``rung`` (the study holds the others), in chunks of at most
    ``MAX_OPEN`` open at once."""
    todo = [c for c in alive if rung.name not in run.recs[c.id]["rungs"]]
    run.say(
        f"measuring {len(alive)} trials, {rung.reps} interleaved repetitions of {rung.iters} "
        f"{'frames in realtime' if run.video else 'inferences'}"
        + (f" ({len(alive) - len(todo)} from the study)" if len(todo) < len(alive) else "")
    )
    # more trials than one chunk holds: the background load differs between chunks, so an anchor (the
    # rung's first trial: the space's defaults at the first rung, the best of the last one after) is
    # measured in every chunk and the rung ranked by each trial's ratio to it in its own chunk
    # (e2e: a repetition lasts as long whatever the load; its chunks are ranked on their own figures)
    anchor = todo[0] if len(todo) > MAX_OPEN and run.video is None else None
    size = MAX_OPEN - 1 if anchor is not None else MAX_OPEN
    trials = Trials(run.recs, run.bundles, run.keys, run.singles)
    for i in range(0, len(todo), size):
        run.measured += measure_chunk(todo[i : i + size], trials, rung, pool, anchor=anchor)
        save_study(run.study_path, run.header, run.recs)
        if anchor is not None and rung.name not in run.recs[anchor.id]["rungs"]:
            anchor = None  # it failed to load: the rung is ranked on raw figures (ranked_trials)
    if anchor is not None:
        run.notes.append(
            f"{rung.name}: {len(todo)} trials measured in {math.ceil(len(todo) / size)} chunks, each "
            f"with the anchor {run.recs[anchor.id]['label']}: ranked by each trial's ratio to the "
            "anchor in its chunk (vs_anchor, median over repetitions); p50/p99 are the trials' raw "
            "figures"
        )


def _finish(run: _Run, t_start: float) -> TuneResult:
    """The winner, the result, the overlay, the pictures."""
    from edge.capabilities import current_host
    from edge.targets import same_device_class

    objective, profile = run.opts.objective, run.profile
    trials = [run.recs[c.id] for c in run.configs]
    winner = choose(trials, run.rank_budget, objective)
    trial_results(trials, objective)
    if winner is not None:
        winner["status"] = "chosen"
    save_study(run.study_path, run.header, run.recs)
    runner_info = (winner or {}).get("runtime") or {}
    same, why = same_device_class(profile, current_host(), runner_info)
    result = TuneResult(
        model=str(run.model),
        target=profile.name,
        objective=objective,
        strategy=run.opts.strategy,
        budget_ms=run.budget,
        budget_source=run.budget_source,
        trials=trials,
        pruned=run.space.pruned,
        notes=run.notes,
        winner=winner,
        device_class={"same": same, "reason": why},
        host=run.host,
        study_path=str(run.study_path),
        measured=run.measured,
        converted=run.converted,
        convert_s=run.convert_s,
        search_s=run.search_s,
    )
    if winner is None:
        run.notes.append("no configuration passed parity: nothing to apply")
    else:
        _write_winner(run, result, winner, same, why)
        _write_alternates(run, result, winner)
    if run.opts.pictures:
        from edge.tune.report import write_pictures

        write_pictures(run.out_dir, result, run.notes)
    result.wall_s = time.perf_counter() - t_start
    return result


def _write_alternates(run: _Run, result: TuneResult, winner: dict[str, Any]) -> None:
    """The next ``alternates`` trials in the winner's ranking, each as ``tuned-altN.toml``."""
    from edge.capabilities import current_host
    from edge.targets import same_device_class

    rest = [t for t in result.trials if t is not winner]
    for i in range(run.opts.alternates):
        alt = choose(rest, run.rank_budget, run.opts.objective)
        if alt is None:
            break
        rest = [t for t in rest if t is not alt]
        same, why = same_device_class(run.profile, current_host(), alt.get("runtime") or {})
        result.alternate_paths.append(_write_overlay(run, alt, same, why, run.out_dir / f"tuned-alt{i + 1}.toml")[0])


def _write_winner(run: _Run, result: TuneResult, winner: dict[str, Any], same: bool, why: str) -> None:
    """The winner as a profile overlay (``tuned.toml``) with what it was measured on."""
    result.overlay_path, result.applied = _write_overlay(run, winner, same, why, run.out_dir / "tuned.toml")


def _write_overlay(run: _Run, winner: dict[str, Any], same: bool, why: str, path: Path) -> tuple[str, str]:
    """One trial as a profile overlay at ``path`` with what it was measured on; (the path, what it applies)."""
    from edge.pipeline.overlay import write_overlay

    objective, profile, host = run.opts.objective, run.profile, run.host
    cfg = next(c for c in run.configs if c.id == winner["id"])
    res = winner["result"]
    runner_info = winner.get("runtime") or {}
    tuned = {
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": run.model.name,
        "model_sha256": run.model_sha,
        "configuration": winner["id"],
        "objective": objective,
        "strategy": run.opts.strategy,
        "measured_on": f"{host['os']}/{host['arch']}",
        "os": host["os"],
        "arch": host["arch"],
        "cpu": host["cpu"],
        "isa": _isa(),
        "cpus": host["cpus"],
        "device_used": runner_info.get("device_used") or "",
        "precision_used": runner_info.get("precision_used") or "",
        "same_device_class": same,
        "device_class": why,
        "p50_ms": res.get("p50_ms"),
        "p99_ms": res.get("p99_ms"),
        "fps": res.get("fps"),
        "parity_error": (winner.get("parity") or {}).get("error"),
        "size_bytes": winner.get("size_bytes"),
    }
    if objective == "e2e":
        tuned.update({"pace_fps": res.get("pace_fps"), "frames_missed": res.get("missed"), "frames": res.get("frames")})
    if objective == "throughput":  # items per inference; fps above is items per second
        tuned["batch"] = cfg.batch
    overlay = run.space.overlay(profile, cfg, tuned=tuned)
    comments = [
        f"edgekit tune: {winner['label']} for {profile.name}, objective {objective}",
        f"measured on this host ({host['os']}/{host['arch']}, {host['cpu']}, {host['cpus']} CPUs)",
    ]
    if not same:
        comments.append(f"NOT the target's device class: {why}; re-tune on the device")
    if cfg.batch != 1 and run.space.batch is not None:
        shapes = " ".join(
            f"--input-shape {k}={','.join(map(str, v))}" for k, v in run.space.batch.input_shapes(cfg.batch).items()
        )
        comments.append(
            f"batch {cfg.batch} ({res.get('fps')} items/s): the overlay converts at the model's own "
            f"batch; for batches of {cfg.batch} convert with {shapes} (a model whose ONNX input fixes "
            "batch 1: export it with a dynamic first dimension first)"
        )
    comments.append(f"apply with: edgekit convert MODEL --target {profile.name} --tuned FILE (or deploy --tuned)")
    return str(write_overlay(path, overlay, comments)), overlay.describe()
