"""``edgekit fleet tune --device ID``: ``edgekit tune``'s trials converted here, measured on a connected device.

    from edge.tune.remote import DeviceTune, tune_on_device
    result = tune_on_device("model.onnx", "cam-01", DeviceTune(broker=BrokerConfig.from_url(url), fleet="lab",
                                                               serve="127.0.0.1:0"))
    result.to_json()   # the same table and JSON as ``edgekit tune``, with ``device`` and ``measured_on``

1. The device's retained birth says what it is (OS, architecture, CPUs, the bundle's target); the target
   (``target``, else the birth's bundle's) must be the device's class.
2. The space is ``edge.tune.space.build_space`` for that target (threads above the device's CPUs dropped), taken
   in ``edgekit tune``'s order under ``max_trials``; each recipe is converted here through ``edge.tune.search``'s
   cache (the same recipe key, the same bundle) and its conversion gate recorded as ``tune`` records it.
3. Each bundle is packed as a rollout artifact (``edge.bundle.archive.pack_bundle``) and served: at
   ``artifact_base_url`` (the user uploads ``OUT/artifacts/*.tar`` there; each URL is checked first), or by a
   small HTTP server this call runs on ``serve`` (``ADDR:PORT``) until the device has replied.
4. One ``cmd/tune`` request (``edge.agent.tune_cmd.TuneRequest``) per rung of successive halving
   (``edge.tune.rungs``: ``edgekit tune``'s rungs and elimination rule; ``strategy="exhaustive"``: one
   full-length rung) goes to the device, which downloads, verifies and measures that rung's trials interleaved,
   as ``edgekit tune`` measures, and replies on ``edgekit/<fleet>/<device>/tune``.
5. The replies (checked: nothing in them is trusted) become ``tune``'s trial records, written to the study file
   after every rung (a re-run with the same study sends only what it lacks; a study of another device, model,
   target or objective is refused); the winner is chosen by the same rule (``edge.tune.ranking.choose``: parity is a hard
   constraint) and written as an overlay stating the device.
"""

from __future__ import annotations

import functools
import json
import queue
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from edge.base.hashing import sha256_file
from edge.errors import EdgeError
from edge.mqtt.client import BrokerConfig
from edge.mqtt.payloads import SCHEMA_VERSION, encode
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
from edge.tune.config import runner_space
from edge.tune.ranking import choose, priority, trial_results
from edge.tune.remote_link import ArtifactServer, DeviceLink, RemoteTuneError
from edge.tune.rungs import (
    device_pruned,
    device_trial,
    host_of,
    load_study,
    num,
    plan_rungs,
    resume,
    save_study,
    search,
    study_header,
    text,
)
from edge.tune.search import Schedule, TuneOptions, TuneResult

Say = Callable[[str], None]
MAX_TRIALS = 64  # edge.agent.tune_cmd.MAX_TRIALS


@dataclass
class RemoteTuneResult(TuneResult):
    device: dict[str, Any] = field(default_factory=dict)  # id, birth facts, what measured (the reply's host)

    @property
    def measured_on(self) -> str:
        h = self.host
        isa = [f for f in h.get("isa", []) if f.startswith(("avx", "amx", "sse4", "neon", "sve", "vnni", "fma"))]
        return (
            f"measured on device {self.device.get('id')} ({h.get('hostname')}: {h.get('os')}/{h.get('arch')}, "
            f"{h.get('cpu')}, {h.get('cpus')} CPUs" + (f", {' '.join(isa)}" if isa else "") + ")"
        )

    def summary(self) -> str:
        return (
            super()
            .summary()
            .replace("measured on the target's", "measured on the device, the target's")
            .replace("measured NOT on", "measured on the device, NOT on")
            + f"; {self.measured_on}"
        )

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "device": self.device, "measured_on": self.measured_on}


# -- the host side: space, conversions, artifacts -----------------------------------------------------


@dataclass
class _Prepared:
    configs: list[Any]
    recs: dict[str, dict[str, Any]]
    bundles: dict[str, Any]  # recipe key -> Bundle or EdgeError
    keys: dict[str, str]
    notes: list[str]
    converted: int
    convert_s: float
    model_sha: str = ""


def _prepare(
    model: Path, profile: Any, space: Any, configs: list[Any], cache: Path, req: ConvertRequest, say: Say
) -> _Prepared:
    """Convert each recipe once (``edge.tune.search``'s cache: the same key, the same bundle), recording the conversion
    gate per trial as ``edge.tune.search.tune`` does. A wrapper here: ``tune`` has no convert-only entry point."""

    t0 = time.perf_counter()
    model_sha = sha256_file(model)
    calib_id = calib_identity(req.calib)
    trial = trial_request(req)
    keys = {
        c.id: recipe_key(model_sha, profile, c, space, calib_id, req.parity_samples, source_key(req)) for c in configs
    }
    bundles: dict[str, Any] = {}
    recs: dict[str, dict[str, Any]] = {}
    converted = 0
    for c in configs:
        rec = recs[c.id] = {
            "id": c.id,
            "label": c.label(),
            **c.to_json(),
            "status": "pending",
            "rungs": {},
            "parity": None,
            "recipe_key": keys[c.id],
        }
        key = keys[c.id]
        if key not in bundles:
            say(f"converting {c.runner} {c.bundle_precision} {dict(c.recipe) or ''} ({len(bundles) + 1} recipes)")
            try:
                bundles[key], fresh = convert_cached(model, profile, c, space, key, cache, trial)
                converted += int(fresh)
            except EdgeError as e:
                bundles[key] = e
                converted += 1
        b = bundles[key]
        if isinstance(b, EdgeError):
            rec["status"] = f"conversion failed: {str(b).splitlines()[0][:300]}"
            continue
        conversion_parity(rec, b)
    return _Prepared(configs, recs, bundles, keys, [], converted, time.perf_counter() - t0, model_sha)


def _artifacts(
    prep: _Prepared, out: Path, base_url: str, sign_key: str | None = None, keys_dir: Any = None
) -> dict[str, dict[str, Any]]:
    """recipe key -> {url, sha256, size}: each bundle packed once as a rollout artifact into ``out``; with
    ``sign_key``, a copy of it signed first (a device with a trust store refuses unsigned bundles, as for rollouts;
    the cached bundle itself stays unsigned)."""
    import shutil

    from edge.bundle.archive import pack_bundle

    out.mkdir(parents=True, exist_ok=True)
    arts: dict[str, dict[str, Any]] = {}
    for key, b in prep.bundles.items():
        if isinstance(b, EdgeError):
            continue
        src = Path(b.path)
        if sign_key is not None:
            from edge.bundle.bundle import sign_bundle

            src = out.parent / "signed" / key
            shutil.rmtree(src, ignore_errors=True)
            shutil.copytree(b.path, src)
            sign_bundle(src, sign_key, directory=keys_dir)
        tar = out / f"{key}.tar"
        sha = pack_bundle(src, tar)
        arts[key] = {"url": f"{base_url.rstrip('/')}/{key}.tar", "sha256": sha, "size": tar.stat().st_size}
    return arts


# -- the whole --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceTune:
    """How ``tune_on_device`` reaches the device and gives it the bundles. ``target``: default the target of the
    bundle the device runs (its birth). Exactly one of ``artifact_base_url`` (the user uploads
    ``OUT/artifacts/*.tar`` there) and ``serve`` (``HOST:PORT``: served from here while the device fetches).
    ``timeout_s``: for the device's whole answer to a rung; ``answer_timeout_s``: for its first reply.
    ``sign_key``: sign each trial bundle (a copy) for a device with a trust store (keys in ``keys_dir``)."""

    broker: BrokerConfig
    fleet: str = "default"
    target: str | Any | None = None
    artifact_base_url: str | None = None
    serve: str | None = None
    timeout_s: float = 900.0
    answer_timeout_s: float = 30.0
    sign_key: str | None = None
    keys_dir: Any = None


@dataclass
class _Session:
    """One device tune's state, filled in step by step (``tune_on_device`` reads top to bottom)."""

    model: Path
    device: str
    remote: DeviceTune
    req: ConvertRequest
    opts: TuneOptions
    sched: Schedule
    say: Say
    out_dir: Path
    study_path: Path
    birth_host: dict[str, Any] = field(default_factory=dict)
    profile: Any = None
    budget: float | None = None
    budget_source: str = ""
    rank_budget: float | None = None
    space: Any = None
    configs: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    header: dict[str, Any] = field(default_factory=dict)
    prep: Any = None
    state: dict[str, Any] = field(default_factory=dict)  # the reply's host, the device's wall time, measurements
    study: str = ""
    rungs: list[tuple[int, int]] = field(default_factory=list)
    replies: list[dict[str, Any]] = field(default_factory=list)
    search_s: float = 0.0


def tune_on_device(
    model: str | Path,
    device: str,
    remote: DeviceTune,
    request: ConvertRequest | None = None,
    options: TuneOptions | None = None,
    *,
    on_step: Say | None = None,
) -> RemoteTuneResult:
    """See the module docstring. ``request``: what every trial converts with (as for ``edge.tune.search.tune``).
    ``options``: as ``tune`` takes them, less ``video``, ``time_budget_s`` and ``batches``: ``cache`` is the
    conversion cache (default ``OUT/cache``; ``edgekit tune``'s cache works too: the same recipe keys);
    ``strategy``: ``halving`` (rungs, ``edge.tune.rungs``) or ``exhaustive`` (one full-length request);
    ``study``: the study file (default ``OUT/study.json``); a re-run with it measures only what it lacks."""
    from edge.pipeline import open_source

    t_start = time.perf_counter()
    req = request if request is not None else ConvertRequest()
    opts = options if options is not None else TuneOptions()
    sched = _check_options(remote, opts)
    model = Path(model)
    src = open_source(model)
    if src.format != "onnx":
        raise RemoteTuneError(f"edgekit fleet tune takes an ONNX model; {model.name} is {src.format}")
    out_dir = Path(opts.out) if opts.out is not None else Path("build") / f"{model.stem}-{device}-tune"
    run = _Session(
        model=model,
        device=device,
        remote=remote,
        req=req,
        opts=opts,
        sched=sched,
        say=on_step or (lambda _m: None),
        out_dir=out_dir,
        study_path=Path(opts.study) if opts.study is not None else out_dir / "study.json",
    )
    with DeviceLink(remote.broker, remote.fleet, device) as link:
        _read_birth(run, link)
        _plan(run)
        out_dir.mkdir(parents=True, exist_ok=True)
        # a study of another device, model, target or objective is refused before anything is converted
        run.header = study_header(
            sha256_file(model), run.profile.name, opts.objective, opts.strategy, remote.fleet, device, run.birth_host
        )
        stored, measured_by = load_study(run.study_path, run.header)
        run.state = {"host": measured_by, "wall_s": 0.0, "measured": 0}
        run.prep = _prepare(
            model,
            run.profile,
            run.space,
            run.configs,
            Path(opts.cache) if opts.cache is not None else out_dir / "cache",
            req,
            run.say,
        )
        server = ArtifactServer(out_dir / "artifacts", remote.serve) if remote.serve is not None else None
        try:
            _search(run, link, stored, server)
        finally:
            if server is not None:
                server.close()
    return _finish(run, t_start)


def _check_options(remote: DeviceTune, opts: TuneOptions) -> Schedule:
    """Every option refused before anything runs; the schedule to measure with."""
    if (remote.artifact_base_url is None) == (remote.serve is None):
        raise RemoteTuneError(
            "give exactly one of --artifact-base-url URL (you upload OUT/artifacts/*.tar there) "
            "and --serve HOST:PORT (edgekit serves them while the device fetches)"
        )
    if opts.objective == "e2e":
        raise RemoteTuneError(
            "--objective e2e runs the video pipeline on a file; over MQTT the device measures latency or throughput",
            hint="use --objective latency or throughput",
        )
    if opts.objective not in ("latency", "throughput"):
        raise RemoteTuneError(f"unknown objective {opts.objective!r}", hint="choose latency or throughput")
    if opts.video is not None or opts.time_budget_s is not None or opts.batches is not None:
        raise RemoteTuneError(
            "a device tune takes no video, time budget or batch sizes",
            hint="leave out --video, --time-budget and --batch",
        )
    if opts.max_trials is not None and opts.max_trials < 1:
        raise RemoteTuneError(f"--max-trials must be >= 1, got {opts.max_trials}")
    sched = opts.schedule or Schedule()
    if not (1 <= sched.reps <= 50 and 1 <= sched.iters <= 10_000 and 0 <= sched.warmup <= 1_000 and sched.eta >= 2):
        raise RemoteTuneError("schedule: reps 1-50, iters 1-10000, warmup 0-1000 (what a device accepts), eta >= 2")
    plan_rungs(sched, 1, opts.strategy, opts.objective)  # an unknown strategy is refused before anything runs
    return sched


def _read_birth(run: _Session, link: DeviceLink) -> None:
    """The device's birth: connected, online, what it is; the target (given, else its bundle's), of its class."""
    from edge.capabilities import Host
    from edge.targets import TargetProfile, get_target, same_device_class

    remote, device = run.remote, run.device
    broker, fleet = remote.broker, remote.fleet
    run.say(f"reading {fleet}/{device}'s birth from {broker.url}")
    if not link.synced.wait(15.0):
        raise RemoteTuneError(
            f"cannot read the fleet from the broker {broker.url}: {link.conn.last_error or 'no answer'}"
        )
    if link.birth is None:
        raise RemoteTuneError(
            f"device {device} has no birth in fleet {fleet} on {broker.url}: it never connected",
            hint="start its agent (edgekit agent --device-id ...) and check --fleet",
        )
    if not link.online():
        raise RemoteTuneError(f"device {device} is offline (its last will was published after its birth)")
    birth = link.birth
    bh = birth.get("host")
    bh = bh if isinstance(bh, dict) else {}
    run.birth_host = bh
    dev_host = Host(
        os=str(bh.get("os")),
        arch=str(bh.get("arch")),
        nvidia_gpu=bh.get("nvidia_gpu") is True,
        jetson=bh.get("jetson") is True,
    )
    target = remote.target
    if target is None:
        tb = birth.get("bundle")
        tb = tb if isinstance(tb, dict) else {}
        target = tb.get("target")
        target = target if isinstance(target, str) else None
        if target is None:
            raise RemoteTuneError(
                f"device {device} runs no bundle, so its birth names no target", hint="give --target T"
            )
    run.profile = target if isinstance(target, TargetProfile) else get_target(target, run.req.targets_dir)
    same, why = same_device_class(run.profile, dev_host, {})
    if not same:
        raise RemoteTuneError(
            f"device {device} cannot serve target {run.profile.name}: {why.replace('this host', 'the device')}"
        )


def _plan(run: _Session) -> None:
    """The budget, the space (built here; threads above the device's CPUs dropped) and the configurations sent."""
    from edge.stats import budget_from
    from edge.tune.space import build_space

    opts, bh = run.opts, run.birth_host
    run.budget, run.budget_source = budget_from(opts.fps, opts.budget_ms, run.profile.frame_budget_ms)
    run.rank_budget = run.budget if (opts.fps is not None or opts.budget_ms is not None) else None
    run.space = build_space(
        run.profile,
        objective=opts.objective,
        calibrated=run.req.calib is not None or natural_calibration_problem(run.model, run.req) is None,
        runners=opts.runners,
        precisions=opts.precisions or ((run.req.precision,) if run.req.precision else None),
        threads=opts.threads,
        targets_dir=run.req.targets_dir,
    )
    run.notes = list(run.space.notes)
    run.notes.append("the space is built on this host (runners and thread counts it has); the device measures it")
    configs = priority(run.space)
    cpu_count = bh.get("cpu_count")
    dev_cpus = cpu_count if type(cpu_count) is int and cpu_count > 0 else None
    if dev_cpus is not None:
        over = [c for c in configs if (nt := _threads(c)) is not None and nt > dev_cpus]
        if over:
            run.space.pruned.append(f"{len(over)} configurations with more threads than the device's {dev_cpus} CPUs")
            configs = [c for c in configs if c not in over]
    cap = min(opts.max_trials or MAX_TRIALS, MAX_TRIALS)
    if len(configs) > cap:
        run.notes.append(
            f"{'--max-trials' if opts.max_trials else 'a request'} takes {cap}: {len(configs) - cap} of "
            f"{len(configs)} configurations not tried (each runner and precision's defaults first)"
        )
        configs = configs[:cap]
    run.configs = configs


def _search(
    run: _Session, link: DeviceLink, stored: Mapping[str, dict[str, Any]], server: ArtifactServer | None
) -> None:
    """The trial bundles packed as artifacts, then successive halving: one request per rung to the device."""
    prep, out_dir = run.prep, run.out_dir
    (out_dir / "artifacts").mkdir(parents=True, exist_ok=True)
    base = server.base_url if server is not None else str(run.remote.artifact_base_url)
    run.say("packing the trial bundles as rollout artifacts")
    arts = _artifacts(prep, out_dir / "artifacts", base, run.remote.sign_key, run.remote.keys_dir)
    if server is None:
        from edge.fleet.rollout_spec import check_url

        for a in arts.values():
            check_url(a["url"], a["size"])
    sendable = [c for c in run.configs if prep.recs[c.id]["status"] == "pending"]
    if not sendable:
        raise RemoteTuneError(
            "no configuration converted here: " + "; ".join(prep.recs[c.id]["status"] for c in run.configs)[:600]
        )
    resumed = resume(prep.recs, stored)
    if resumed:
        run.notes.append(f"{resumed} trials resumed from the study {run.study_path} (measured on this device before)")
    run.study = f"tune-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"
    tid = {c.id: f"t{i:02d}" for i, c in enumerate(sendable)}
    for c in sendable:
        prep.recs[c.id]["device_trial"] = tid[c.id]
    run.rungs = plan_rungs(run.sched, len(sendable), run.opts.strategy, run.opts.objective)
    t_search = time.perf_counter()
    exchange = functools.partial(_exchange, run, link, arts, tid, t_search)
    run.replies = search(
        sendable,
        prep.recs,
        run.rungs,
        exchange,
        objective=run.opts.objective,
        rank_budget=run.rank_budget,
        eta=run.sched.eta,
        say=run.say,
        save=lambda: save_study(run.study_path, run.header, prep.recs, run.state["host"]),
    )
    run.search_s = time.perf_counter() - t_search


def _exchange(
    run: _Session,
    link: DeviceLink,
    arts: Mapping[str, dict[str, Any]],
    tid: Mapping[str, str],
    t_search: float,
    todo: Sequence[Any],
    k: int,
    reps: int,
    iters: int,
) -> dict[str, Any]:
    """One rung: its trials to the device, its final reply (trials keyed by config id)."""
    from edge.mqtt.payloads import MAX_TUNE_REQUEST_BYTES as MAX_REQUEST_BYTES

    device, prep = run.device, run.prep
    rung_study = f"{run.study}-r{k}"
    request = {
        "schema_version": SCHEMA_VERSION,
        "type": "tune-request",
        "fleet": run.remote.fleet,
        "device": device,
        "ts": round(time.time(), 3),
        "study_id": rung_study,
        "objective": run.opts.objective,
        "schedule": {"reps": reps, "iters": iters, "warmup": run.sched.warmup},
        "trials": [
            {
                "id": tid[c.id],
                **arts[prep.keys[c.id]],
                "runner": c.runner,
                "precision": c.precision,
                "options": dict(c.options),
            }
            for c in todo
        ],
    }
    if len(encode(request)) > MAX_REQUEST_BYTES:
        raise RemoteTuneError(
            f"the tune request is over the {MAX_REQUEST_BYTES} bytes a device takes",
            hint="fewer trials (--max-trials), or shorter artifact URLs",
        )
    run.say(f"sending {len(todo)} trials to {device} (study {rung_study}: {reps} repetitions of {iters})")
    link.send(request)
    timeout_s = run.remote.timeout_s
    left = timeout_s - (time.perf_counter() - t_search)
    try:
        reply = _wait(link, rung_study, device, min(run.remote.answer_timeout_s, max(left, 0.0)), left, run.say)
    except RemoteTuneError as e:
        raise RemoteTuneError(
            f"{e.message} (rung {k}: {reps}x{iters})",
            hint=(
                f"{e.hint + '; ' if e.hint else ''}the trials measured so far are in {run.study_path}: "
                "run again with the same --study to resume"
            ),
        ) from None
    back = (
        {t.get("id"): t for t in reply.get("trials") or [] if isinstance(t, dict)}
        if isinstance(reply.get("trials"), list)
        else {}
    )
    reply["trials"] = {c.id: device_trial(back[tid[c.id]]) for c in todo if tid[c.id] in back}
    run.state["host"] = host_of(reply)
    run.state["wall_s"] += num(reply.get("wall_s")) or 0.0
    run.state["measured"] += sum(1 for t in reply["trials"].values() if "measurement" in t)
    return reply


def _finish(run: _Session, t_start: float) -> RemoteTuneResult:
    """The winner by ``tune``'s rule, the result with the device's facts, the overlay, the pictures."""
    from edge.capabilities import Host
    from edge.targets import same_device_class

    objective, bh, device, notes = run.opts.objective, run.birth_host, run.device, run.notes
    recs = [run.prep.recs[c.id] for c in run.configs]
    run.space.pruned.extend(device_pruned(recs, device))
    trial_results(recs, objective)
    winner = choose(recs, run.rank_budget, objective)
    if winner is not None:
        winner["status"] = "chosen"
    save_study(run.study_path, run.header, run.prep.recs, run.state["host"])
    host = run.state["host"] or host_of(
        {
            "host": {
                "hostname": bh.get("hostname"),
                "os": bh.get("os"),
                "arch": bh.get("arch"),
                "cpus": bh.get("cpu_count"),
            }
        }
    )
    dev_host = Host(os=host["os"], arch=host["arch"], nvidia_gpu=host["nvidia_gpu"], jetson=host["jetson"])
    same, why = same_device_class(run.profile, dev_host, (winner or {}).get("runtime") or {})
    why = why.replace("this host", f"device {device}")
    notes.extend(_reply_notes(run.replies))
    result = RemoteTuneResult(
        model=str(run.model),
        target=run.profile.name,
        objective=objective,
        strategy=run.opts.strategy,
        budget_ms=run.budget,
        budget_source=run.budget_source,
        trials=recs,
        pruned=run.space.pruned,
        notes=notes,
        winner=winner,
        device_class={"same": same, "reason": why},
        host=host,
        measured=run.state["measured"],
        converted=run.prep.converted,
        convert_s=run.prep.convert_s,
        search_s=run.search_s,
        device={
            "id": device,
            "fleet": run.remote.fleet,
            "study_id": run.study,
            "birth_host": bh,
            "requests": len(run.replies),
            "rungs": [f"{k}:{r}x{i}" for k, (r, i) in enumerate(run.rungs)],
            "device_wall_s": round(run.state["wall_s"], 2),
        },
    )
    if winner is None:
        notes.append("no configuration passed parity on the device: nothing to apply")
    else:
        _write_overlay(
            result, run.space, run.profile, next(c for c in run.configs if c.id == winner["id"]), run.out_dir, run.model
        )
    if run.opts.pictures:
        from edge.tune.report import write_pictures

        write_pictures(run.out_dir, result, notes)
    result.study_path = str(run.study_path)
    (run.out_dir / "device-tune.json").write_text(json.dumps(result.to_json(), indent=1, default=str), encoding="utf-8")
    result.wall_s = time.perf_counter() - t_start
    return result


def _reply_notes(replies: Sequence[Mapping[str, Any]]) -> list[str]:
    """What the device's replies say happened beside the measurement: its workload, a rollout held back."""
    notes = []
    for reply in replies[-1:]:
        if isinstance(reply.get("workload"), str):
            notes.append(f"on the device during the measurement: {reply['workload'][:200]}")
    for reply in replies:
        held = reply.get("rollout_waiting")
        if isinstance(held, dict) and isinstance(held.get("rollout_id"), str) and type(held.get("version")) is int:
            notes.append(
                f"rollout {held['rollout_id'][:128]} (desired version {held['version']}) arrived during the "
                "tune and waited for it; the device applied it after that request"
            )
    return notes


def _threads(c: Any) -> int | None:
    rs = runner_space(c.runner)
    v = dict(c.options).get(rs.threads_option) if rs is not None and rs.threads_option else None
    return v if isinstance(v, int) else None


def _wait(
    link: DeviceLink, study: str, device: str, answer_timeout_s: float, timeout_s: float, say: Say
) -> dict[str, Any]:
    """The device's final reply to ``study`` (``done``); its refusal, ``busy`` or failure as one error line."""
    start = time.monotonic()
    answered = False
    while True:
        limit = (answer_timeout_s if not answered else timeout_s) - (time.monotonic() - start)
        try:
            r = link.replies.get(timeout=max(0.0, limit))
        except queue.Empty:
            if not answered:
                raise RemoteTuneError(
                    f"device {device} did not answer the tune request within {answer_timeout_s:g} s",
                    hint="is its agent an edgekit version that knows cmd/tune, and connected?",
                ) from None
            raise RemoteTuneError(f"device {device} did not finish the tune within {timeout_s:g} s") from None
        if r.get("study_id") not in (study, None):
            continue
        status = r.get("status")
        if r.get("study_id") is None and status != "refused":
            continue
        answered = True
        if status == "accepted":
            say(f"{device} accepted {r.get('trials')} trials")
        elif status == "progress":
            say(f"{device}: {text(r.get('step'), 200)}")
        elif status == "done":
            return r
        elif status in ("refused", "busy", "failed"):
            what = {"refused": "refused the tune request", "busy": "is busy", "failed": "failed the tune"}[status]
            raise RemoteTuneError(f"device {device} {what}: {text(r.get('error'), 600)}")


def _write_overlay(result: RemoteTuneResult, space: Any, profile: Any, cfg: Any, out_dir: Path, model: Path) -> None:
    from edge.pipeline.overlay import write_overlay

    w, h = result.winner or {}, result.host
    res = w.get("result") or {}
    rt = w.get("runtime") or {}
    tuned = {
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": model.name,
        "model_sha256": sha256_file(model),
        "configuration": w["id"],
        "objective": result.objective,
        "strategy": result.strategy,
        "measured_on": f"device {result.device['id']} ({h['os']}/{h['arch']})",
        "os": h["os"],
        "arch": h["arch"],
        "cpu": h["cpu"],
        "isa": h["isa"],
        "cpus": h["cpus"],
        "device_used": rt.get("device_used") or "",
        "precision_used": rt.get("precision_used") or "",
        "same_device_class": result.device_class["same"],
        "device_class": result.device_class["reason"],
        "p50_ms": res.get("p50_ms"),
        "p99_ms": res.get("p99_ms"),
        "fps": res.get("fps"),
        "parity_error": (w.get("parity") or {}).get("error"),
        "size_bytes": w.get("size_bytes"),
    }
    overlay = space.overlay(profile, cfg, tuned=tuned)
    comments = [
        f"edgekit fleet tune: {w['label']} for {profile.name}, objective {result.objective}",
        result.measured_on,
        f"apply with: edgekit convert MODEL --target {profile.name} --tuned FILE (or deploy --tuned)",
    ]
    result.overlay_path = str(write_overlay(out_dir / "tuned.toml", overlay, comments))
    result.applied = overlay.describe()
