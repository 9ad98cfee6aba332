"""The declarative search space of ``edgekit tune``: runners, precisions, recipes and runner options per target.

Data first (Olive's ``OrtSessionParamsTuning`` is the model): each runner declares its own search space
(``Runner.tune_space``, an :class:`edge.backends.tuning.TuneSpace` in its backend's ``format.py``): which
converter feeds it, which recipe knobs (convert options) and which runner options are worth trying, and which
combinations cannot run. This module reads those declarations and names no runner.
:func:`build_space` expands it for one target on this host and prunes every combination that cannot
run or cannot mean anything here, each with its reason:

* runners: the target's own, plus, for a target whose accelerator is a plain CPU, every runner that declares
  its architecture (``TuneSpace.cpu_archs``: x86-cpu is served by onnxruntime and OpenVINO's CPU plugin);
  a runner or converter this host lacks is pruned with what is missing;
* precisions: the target's precisions the runner's converter produces; bf16 only as OpenVINO's compute
  precision on an fp32 IR, and only where OpenVINO reports BF16 for the CPU; int8 only with calibration;
* threads: up to the CPUs this process may use; OpenVINO's THROUGHPUT hint only for the throughput
  objective (a single stream of frames runs one request at a time, which THROUGHPUT's streams split);
* OpenVINO's ``num_streams`` (objective ``throughput`` only, measured with the compiled model's optimal number of
  requests in flight): the hint's own choice (option not set), then ``edge.backends.openvino.format.STREAMS`` up to the usable CPUs, with
  the THROUGHPUT hint only (LATENCY is one stream, and OpenVINO lets NUM_STREAMS override it) and never more
  streams than ``num_threads``;
* LiteRT: XNNPack with or without its latest-features delegate (``xnnpack_latest_features``, the one XNNPack
  switch ai-edge-litert's Interpreter takes), never with ``delegate=none`` (it would apply XNNPack anyway);
* batch (objective ``throughput`` only): :data:`BATCHES` items per inference, converted at that batch (the pipeline
  converts a static copy of the model, so the batch is part of the recipe and of its cache key), for a model whose
  first input dimension is a batch dimension -- :func:`batch_plan` runs onnxruntime once at batch 2 to find out,
  and a model that fails is pruned with the reason.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from edge.backends.options import THREAD_SEARCH
from edge.backends.runner import RUNNERS
from edge.backends.threads import usable_cpus
from edge.backends.tuning import TuneSpace
from edge.errors import EdgeError
from edge.tune.config import OBJECTIVES, Config, runner_space, word  # noqa: F401 - OBJECTIVES, runner_space re-exported

THREADS = THREAD_SEARCH  # on the runners' thread options (spec(search=...)), re-exported
WORKERS = (1, 2)  # video pipeline inference workers (objective e2e)
#: items per inference tried for the throughput objective (batch 1 first: the default)
BATCHES = (1, 2, 4, 8)
#: the largest batch's input, in bytes, at most (a batch of 8 224x224 images is 4.8 MB)
MAX_BATCH_BYTES = 64 << 20


def cpu_runners(arch: str) -> tuple[str, ...]:
    """The runners that serve a plain-CPU target of ``arch`` (each declares it: ``TuneSpace.cpu_archs``), by name."""
    return tuple(n for n in RUNNERS.names() if (rs := runner_space(n)) is not None and arch in rs.cpu_archs)


@dataclass
class Space:
    configs: list[Config]
    pruned: list[str]  # "what: why", one per pruned combination group
    convert_options: dict[str, dict[str, Any]]  # runner -> its converter's base options on this target
    run_options: dict[str, dict[str, Any]]  # runner -> its base runner options on this target
    notes: list[str] = field(default_factory=list)
    #: the space was built for the video pipeline (objective e2e): an overlay then carries the inference workers
    video: bool = False
    #: how batched trials are converted (objective throughput); None: batch 1 only
    batch: BatchPlan | None = None

    def base_profile(self, profile: Any, cfg: Config) -> Any:
        """``profile`` set up to convert ``cfg`` (its runner, chain and recipe; the base runner options)."""
        from edge.pipeline.overlay import apply_overlay

        return apply_overlay(profile, self.overlay(profile, cfg, tuned={}, with_knobs=False))

    def overlay(self, profile: Any, cfg: Config, *, tuned: Mapping[str, Any], with_knobs: bool = True) -> Any:
        from edge.pipeline.overlay import TunedOverlay

        rs = runner_space(cfg.runner)
        if rs is None:  # a configuration exists only for a runner that declares a space
            raise EdgeError(f"runner {cfg.runner!r} declares no search space (Runner.tune_space)")
        conv = rs.converter
        run_opts = dict(self.run_options[cfg.runner])
        if with_knobs:
            run_opts.update(dict(cfg.options))
        return TunedOverlay(
            target=profile.name,
            precision=cfg.bundle_precision,
            runner=cfg.runner,
            chain=(conv,),
            convert_options={conv: {**self.convert_options[cfg.runner], **dict(cfg.recipe)}},
            run_options=run_opts,
            tuned=dict(tuned),
            infer_workers=cfg.workers if (with_knobs and self.video) else None,
        )


def option_conflict(runner: str, opts: Mapping[str, Any], cpus: int) -> str | None:
    """Why a combination of runner options cannot run or cannot differ from another one here ("what: why"),
    None when it is worth a trial: the runner's own rule (``TuneSpace.conflict``). Olive's OrtSessionParamsTuning
    prunes the same way."""
    rs = runner_space(runner)
    return rs.conflict(opts, cpus) if rs is not None else None


@dataclass(frozen=True)
class BatchPlan:
    """Whether ``model``'s first input dimension is a batch dimension, and how a batched trial is converted.

    ``batches``: the batch sizes worth a trial (1 first); ``problem``: why batch > 1 is pruned (None: it is not);
    ``model``: a copy of the model whose inputs' first dimension is symbolic, which batched trials are converted
    from (at ``input_shapes(n)``: the pipeline converts a static copy); ``shapes``: each input's batch-1 shape."""

    batches: tuple[int, ...] = (1,)
    problem: str | None = None
    model: Path | None = None
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    pruned: tuple[str, ...] = ()

    def input_shapes(self, n: int) -> dict[str, list[int]]:
        return {k: [n, *v[1:]] for k, v in self.shapes.items()}


_ONNX_NP = {
    1: "float32",
    10: "float16",
    11: "float64",
    2: "uint8",
    3: "int8",
    5: "int16",
    6: "int32",
    7: "int64",
    9: "bool",
}


def batch_plan(
    model: str | Path,
    out_dir: str | Path,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    batches: Sequence[int] = BATCHES,
) -> BatchPlan:
    """Find out whether ``model`` (ONNX) can run batched: every input's first dimension must be 1 or symbolic,
    and a copy with that dimension symbolic must run in onnxruntime at batch 2, give outputs whose first dimension
    is 2, and give each item what batch 1 gives it. Anything else is the plan's ``problem`` (batch > 1 pruned).
    Writes the copy as ``out_dir/<stem>.batch.onnx``."""
    import numpy as np
    import onnx

    model = Path(model)
    given = {k: tuple(int(d) for d in v) for k, v in (input_shapes or {}).items()}
    try:
        m = onnx.load(str(model))
    except Exception as e:  # noqa: BLE001 - reported as the reason batch is pruned
        return BatchPlan(problem=f"cannot read {model.name}: {str(e).splitlines()[0][:200]}")
    inits = {i.name for i in m.graph.initializer}
    inputs = [i for i in m.graph.input if i.name not in inits]
    shapes_or_problem = _batch1_shapes(inputs, given)
    if isinstance(shapes_or_problem, str):
        return BatchPlan(problem=shapes_or_problem)
    shapes = shapes_or_problem
    for i in inputs:
        i.type.tensor_type.shape.dim[0].Clear()
        i.type.tensor_type.shape.dim[0].dim_param = "edgekit_batch"
    for k, o in enumerate(m.graph.output):
        if o.type.tensor_type.HasField("shape") and len(o.type.tensor_type.shape.dim):
            o.type.tensor_type.shape.dim[0].Clear()
            o.type.tensor_type.shape.dim[0].dim_param = f"edgekit_out{k}"
    del m.graph.value_info[:]  # intermediate shapes recorded at batch 1
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    variant = out / f"{model.stem}.batch.onnx"
    try:
        onnx.save(m, str(variant))
    except (ValueError, OSError) as e:  # e.g. over protobuf's 2 GB: no batched copy, no batched trials
        return BatchPlan(problem=f"cannot write a batched copy of {model.name}: {str(e).splitlines()[0][:200]}")
    types = {i.name: _ONNX_NP.get(i.type.tensor_type.elem_type, "float32") for i in inputs}
    rng = np.random.default_rng(0)

    def sample(n: int) -> dict[str, np.ndarray]:
        return {
            k: (
                rng.standard_normal((n, *v[1:])).astype(types[k])
                if types[k].startswith("float")
                else np.zeros((n, *v[1:]), types[k])
            )
            for k, v in shapes.items()
        }

    try:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 4  # the failure is the reason given, not a log line
        sess = ort.InferenceSession(str(variant), so, providers=["CPUExecutionProvider"])
        two = sample(2)
        got = sess.run(None, two)
        singles = [sess.run(None, {k: v[j : j + 1] for k, v in two.items()}) for j in range(2)]
    except Exception as e:  # noqa: BLE001 - onnxruntime's own message is the reason
        msg = " ".join(str(e).split())[:240]
        return BatchPlan(problem=f"onnxruntime cannot run {model.name} at batch 2 ({msg}); the graph fixes its batch")
    problem = _batch_problem([o.name for o in sess.get_outputs()], got, singles)
    if problem is not None:
        return BatchPlan(problem=problem)
    item_bytes = sum(int(np.prod(v)) * np.dtype(types[k]).itemsize for k, v in shapes.items())
    ok = tuple(b for b in batches if b == 1 or b * item_bytes <= MAX_BATCH_BYTES)
    pruned = tuple(
        f"batch={b}: {b} items are {b * item_bytes / (1 << 20):.0f} MB of input, over the {MAX_BATCH_BYTES >> 20} MB cap"
        for b in batches
        if b not in ok
    )
    return BatchPlan(batches=tuple(sorted(set(ok) | {1})), model=variant, shapes=shapes, pruned=pruned)


def runners_for(profile: Any) -> tuple[str, ...]:
    """The runners that serve ``profile``'s device class (the target's own first)."""
    found = [profile.runner]
    if profile.accelerator.strip().upper() == "CPU":
        for arch in profile.device_class.arch:
            found += [r for r in cpu_runners(arch) if r not in found]
    return tuple(found)


@dataclass(frozen=True)
class Extent:
    """How far a space reaches beyond its configurations: ``batch``, the model's :func:`batch_plan` (objective
    throughput only; None: batch 1); ``vary``, the runner options and recipe knobs that take more than their first
    value (None: all of them)."""

    batch: BatchPlan | None = None
    vary: Sequence[str] | None = None


def build_space(
    profile: Any,
    *,
    objective: str = "latency",
    calibrated: bool = False,
    video: bool = False,
    runners: Sequence[str] | None = None,
    precisions: Sequence[str] | None = None,
    threads: Sequence[int] | None = None,
    targets_dir: Iterable[Any] = (),
    bf16_capabilities: list[str] | None | str = "ask",
    extent: Extent | None = None,
) -> Space:
    """Expand the serving runners' declared spaces for ``profile`` on this host; every pruned combination says why.

    ``runners``/``precisions``/``threads`` narrow the space (tests, a user who knows); naming one the target
    cannot use is an error, never silently dropped. ``bf16_capabilities``: the compute capabilities the runner's
    device reports (``TuneSpace.compute_capabilities``; default: asked, e.g. from OpenVINO's CPU plugin). ``extent``: ``batch``, the model's :func:`batch_plan` (objective throughput
    only; None: batch 1) and ``vary``, only these runner options and recipe knobs take more than their first value
    (deploy's budget search: threads and spin-wait); None: all of them."""
    from edge.backends.converter import CONVERTERS

    batch, vary = (extent.batch, extent.vary) if extent is not None else (None, None)
    if objective not in OBJECTIVES:
        raise EdgeError(f"unknown objective {objective!r}", hint=f"choose one of {', '.join(OBJECTIVES)}")
    serving, allowed_prec, thread_values = _narrowed(profile, runners, precisions, threads)
    cpus = usable_cpus()
    space = Space([], [], {}, {}, video=video)
    batches = _batches(space, objective, batch)
    for runner in serving:
        rs = _runner_space(space, profile, runner, targets_dir)
        if rs is None:
            continue
        conv_precisions = CONVERTERS.get(rs.converter).precisions
        for prec in allowed_prec:
            if precisions and prec not in precisions:
                continue
            why = _precision_pruned(runner, rs, prec, conv_precisions, calibrated, bf16_capabilities)
            if why is not None:
                space.pruned.append(why)
                continue
            knobs = [
                (name, _knob_values(space, runner, rs, name, values, objective, thread_values, cpus))
                for name, values in rs.options.items()
            ]
            recipe = list(rs.recipes.get(prec, {}).items())
            if vary is not None:  # the others at their first value: the runner's and recipe's defaults
                knobs = [(n, v if n in vary else v[:1]) for n, v in knobs]
                recipe = [(n, v if n in vary else v[:1]) for n, v in recipe]
            base = tuple(rs.compute_precisions.get(prec, {}).items())  # the options asking for a compute precision
            _expand(space, (runner, prec, base), rs, recipe, knobs, cpus, (WORKERS if video else (1,)), batches)
    space.pruned = list(dict.fromkeys(space.pruned))
    if not space.configs:
        raise EdgeError(f"nothing to tune for {profile.name} on this host: " + "; ".join(space.pruned))
    return space


def _narrowed(
    profile: Any, runners: Sequence[str] | None, precisions: Sequence[str] | None, threads: Sequence[int] | None
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...]]:
    """(the runners serving the target, the precisions tunable for it, the thread counts to try), narrowed as
    asked; a runner or precision the target cannot use is refused, never dropped."""
    serving = runners_for(profile)
    if runners:
        unknown = [r for r in runners if r not in serving]
        if unknown:
            raise EdgeError(
                f"runner(s) {', '.join(unknown)} do not serve {profile.name}'s device class ({profile.device_class.describe()})",
                hint=f"choose from {', '.join(serving)}",
            )
        serving = tuple(r for r in serving if r in runners)
    allowed_prec = tuple(profile.precisions) + (("bf16",) if "bf16" not in profile.precisions else ())
    if precisions:
        unknown = [p for p in precisions if p not in allowed_prec]
        if unknown:
            raise EdgeError(
                f"precision(s) {', '.join(unknown)} are not tunable for {profile.name}",
                hint=f"choose from {', '.join(allowed_prec)}",
            )
    thread_values = tuple(threads) if threads else THREADS
    if any(not isinstance(t, int) or t < 1 for t in thread_values):
        raise EdgeError(f"threads must be integers >= 1, got {list(thread_values)}")
    return tuple(serving), allowed_prec, thread_values


def _batches(space: Space, objective: str, batch: BatchPlan | None) -> tuple[int, ...]:
    """The batch sizes tried (throughput only), with what was pruned and why."""
    if objective != "throughput":
        space.pruned.append(
            f"batch > 1: only for the throughput objective (objective {objective} runs one item per inference, as a stream of frames does)"
        )
        return (1,)
    if batch is None:
        return (1,)
    batches: tuple[int, ...] = (1,)
    if batch.problem:
        space.pruned.append(f"batch > 1: {batch.problem}")
    else:
        batches = tuple(batch.batches)
        space.batch = batch
    space.pruned.extend(batch.pruned)
    return batches


def _runner_space(space: Space, profile: Any, runner: str, targets_dir: Iterable[Any]) -> Any:
    """The runner's search space, its conversion and run options recorded in ``space``; None (pruned, with the
    reason) where it cannot run or convert here."""
    from edge.backends.runner import RUNNERS
    from edge.capabilities import problems
    from edge.pipeline import conversion_problems
    from edge.targets import ChainStep, get_target

    rs = runner_space(runner)
    if rs is None:
        space.pruned.append(f"{runner}: edgekit tune has no search space for this runner")
        return None
    try:
        missing = problems(RUNNERS.get(runner).requires)
    except EdgeError as e:
        missing = [str(e)]
    missing += [m for m in conversion_problems(profile, chain=(ChainStep(rs.converter),)) if m not in missing]
    if missing:
        space.pruned.append(f"{runner}: cannot run or convert here: {'; '.join(missing)}")
        return None
    if runner == profile.runner and profile.chain and profile.chain[-1].converter == rs.converter:
        conv_opts = dict(profile.convert_options.get(rs.converter, {}))
        run_opts = dict(profile.runtime_options)
    else:  # another runner on this target: its home target's recipe, pinned to the target's device
        home = get_target(rs.home, targets_dir)
        conv_opts = dict(home.convert_options.get(rs.converter, {}))
        run_opts = dict(home.runtime_options)
        if rs.elsewhere:
            run_opts.update(rs.elsewhere)
            space.notes.append(f"{runner} on {profile.name}: {rs.elsewhere_note}, {rs.home}'s conversion recipe")
    space.convert_options[runner], space.run_options[runner] = conv_opts, run_opts
    return rs


def _precision_pruned(
    runner: str, rs: Any, prec: str, conv_precisions: Any, calibrated: bool, bf16_capabilities: list[str] | None | str
) -> str | None:
    """Why ``runner`` cannot be tuned at ``prec`` here (None: it can)."""
    if prec in rs.compute_precisions:
        caps = rs.compute_capabilities() if bf16_capabilities == "ask" else bf16_capabilities
        if not caps or prec.upper() not in caps:
            return (
                f"{runner} {prec}: {rs.capability_source} does not report {prec.upper()} on this host "
                f"(it reports {', '.join(caps) if caps else 'nothing'})"
            )
    elif prec == "bf16":
        return (
            f"{runner} bf16: {runner} has no bf16 compute precision to ask for "
            "(bf16 is tuned as OpenVINO's inference precision on an fp32 IR)"
        )
    elif prec not in conv_precisions:
        return f"{runner} {prec}: converter {rs.converter} cannot produce it (it produces {', '.join(sorted(conv_precisions))})"
    if prec == "int8" and not calibrated:
        return f"{runner} int8: static int8 needs calibration data (pass --calib DIR, or --calib random for generated inputs)"
    return None


def _knob_values(
    space: Space,
    runner: str,
    rs: Any,
    name: str,
    values: Any,
    objective: str,
    thread_values: tuple[int, ...],
    cpus: int,
) -> tuple[Any, ...]:
    """The values of runner option ``name`` worth trying for ``objective`` on this host's ``cpus``."""
    if name == rs.threads_option:
        ok = tuple(t for t in thread_values if t <= cpus)
        over = [t for t in thread_values if t > cpus]
        if over:
            space.pruned.append(
                f"{runner} {name}={','.join(map(str, over))}: more threads than the {cpus} CPUs this process may use"
            )
        values = tuple(sorted(ok, reverse=True)) or (cpus,)  # all CPUs first: the default
    if name in rs.throughput_only and objective != "throughput":
        keep, why = rs.throughput_only[name]
        if any(v != keep for v in values):
            space.pruned.append(f"{runner} {why.format(objective=objective)}")
        values = (keep,)
    elif name in rs.cpu_capped:
        over = [n for n in values if n > cpus]
        if over:
            space.pruned.append(f"{runner} {name}={','.join(map(str, over))}: {rs.cpu_capped[name].format(cpus=cpus)}")
        values = tuple(n for n in values if n <= cpus)
    return tuple(values)


def _expand(
    space: Space,
    what: tuple[str, str, tuple[tuple[str, Any], ...]],
    rs: TuneSpace,
    recipe_knobs: list[tuple[str, Any]],
    knobs: list[tuple[str, tuple[Any, ...]]],
    cpus: int,
    workers: Sequence[int],
    batches: Sequence[int],
) -> None:
    """Every combination of recipe and option values (those that conflict pruned), per worker count and batch;
    ``what``: (runner, precision, the runner options that ask for that compute precision)."""
    runner, prec, base_opts = what
    for rvals in itertools.product(*[v for _, v in recipe_knobs]):
        recipe = tuple(zip([k for k, _ in recipe_knobs], rvals))
        for ovals in itertools.product(*[v for _, v in knobs]):
            # an option at its "not set" value is left out (the id stays what it was without the option)
            opts = base_opts + tuple(
                (k, v) for (k, _), v in zip(knobs, ovals) if not (k in rs.unset and v == rs.unset[k])
            )
            conflict = option_conflict(runner, dict(opts), cpus)
            if conflict is not None:
                space.pruned.append(conflict)
                continue
            for w in workers:
                for n in batches:
                    space.configs.append(Config(runner, prec, recipe, opts, w, n))


def _batch1_shapes(inputs: Sequence[Any], given: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]] | str:
    """Each input's batch-1 shape (``given`` by --input-shape, else its declared dims), or why it cannot be batched."""
    shapes: dict[str, tuple[int, ...]] = {}
    for i in inputs:
        dims = list(i.type.tensor_type.shape.dim)
        if not i.type.tensor_type.HasField("shape") or not dims:
            return f"input {i.name!r} has no first dimension to batch (rank 0 or undeclared)"
        d0 = dims[0]
        if d0.HasField("dim_value") and d0.dim_value not in (0, 1):
            return f"input {i.name!r} has a fixed first dimension {d0.dim_value}: not a batch of one"
        if i.name in given:
            shape = given[i.name]
            if len(shape) != len(dims) or shape[0] != 1:
                return f"--input-shape {i.name}={','.join(map(str, shape))}: batch tuning needs its first dimension 1, rank {len(dims)}"
        else:
            rest = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in dims[1:]]
            if None in rest:
                return f"input {i.name!r} has dynamic dims besides the first: pass --input-shape"
            shape = (1, *rest)  # type: ignore[arg-type]
        shapes[i.name] = tuple(int(x) for x in shape)
    return shapes


def _batch_problem(names: Sequence[str], got: Sequence[Any], singles: Sequence[Sequence[Any]]) -> str | None:
    """Why the batch-2 outputs ``got`` are not two items (first dimension 2, each what it is alone), else None."""
    import numpy as np

    for k, name in enumerate(names):
        a = np.asarray(got[k])
        if a.ndim == 0 or a.shape[0] != 2:
            return f"output {name!r} at batch 2 has shape {list(a.shape)}: its first dimension is not the batch, so items cannot be told apart"
        for j in range(2):
            ref = np.asarray(singles[j][k])
            if ref.shape[1:] != a.shape[1:] or not np.allclose(
                a[j : j + 1].astype(np.float64),
                ref.astype(np.float64),
                rtol=1e-3,
                atol=1e-4 * (1 + float(np.abs(ref).max(initial=0))),
            ):
                return f"output {name!r}: item {j} of a batch of 2 differs from the same input alone (the graph mixes items across the batch)"
    return None
