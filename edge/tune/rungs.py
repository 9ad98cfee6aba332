"""``edgekit fleet tune``'s search over the device's replies: successive halving in rungs, the study file that makes
a re-run resume, and the reading of each reply (nothing in it is trusted).

Rungs follow ``edgekit tune``'s rule (``edge.tune.search.Schedule.rungs``): every trial gets a short measurement, the best
third (at least ``eta``) goes on, the finalists get the full one. Each rung is one ``cmd/tune`` request holding
only that rung's trials, so the agent measures what it is sent, within its own request limits, and the host decides
who goes on (``edge.tune.ranking.ranked_trials``, as ``tune`` ranks). The device keeps no trial bundle between requests: a
finalist is downloaded again for the next rung. Parity is a hard constraint: the device checks each trial's
reference pairs on every rung, and only trials that passed are ranked or chosen.

The study file (``--study FILE``, default ``OUT/study.json``) is ``edgekit tune``'s format, written after every
rung; its header names the model, target, objective, strategy, the device (``<fleet>/<id>``) and what the device's
birth says it is (OS, architecture, CPUs), and a study made for another one is refused. A re-run sends a rung only
the trials it has no measurement of yet.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from edge.errors import EdgeError

Say = Callable[[str], None]
#: what one request may ask of a device (edge.agent.tune_cmd.LIMITS, kept here so the host need not import it)
MAX_REPS, MAX_ITERS = 50, 10_000
STRATEGIES = ("halving", "exhaustive")


# -- reading the device's reply ------------------------------------------------------------------


def num(v: Any) -> float | None:
    return float(v) if type(v) in (int, float) and math.isfinite(v) else None


def text(v: Any, n: int = 400) -> str | None:
    return v[:n] if isinstance(v, str) else None


def device_trial(obj: Any) -> dict[str, Any]:
    """One trial of the reply, kept to the fields the table reads, each checked."""
    if not isinstance(obj, dict):
        return {"status": "failed: malformed reply"}
    out: dict[str, Any] = {"status": text(obj.get("status")) or "failed: no status in the reply"}
    m = obj.get("measurement")
    if isinstance(m, dict):
        reps = m.get("rep_scores")
        if isinstance(reps, list) and reps and len(reps) <= 1000 and all(num(x) is not None for x in reps):
            out["measurement"] = {
                "reps": len(reps),
                "iters": int(num(m.get("iters")) or 0),
                "rep_scores": [float(x) for x in reps],
                **{k: num(m.get(k)) for k in ("p50_ms", "p99_ms", "fps")},
            }
    for k in ("load_ms", "memory_mb"):
        if num(obj.get(k)) is not None:
            out[k] = num(obj.get(k))
    rt = obj.get("runtime")
    if isinstance(rt, dict):
        out["runtime"] = {
            k: (v if isinstance(v, (int, float, bool)) or v is None else str(v)[:200])
            for k, v in list(rt.items())[:8]
            if isinstance(k, str)
        }
    par = obj.get("parity")
    if isinstance(par, dict):
        tr = par.get("trial")
        tr = tr if isinstance(tr, dict) else {}
        passed = tr.get("passed")
        out["parity"] = {
            "trial": {
                "passed": passed if passed in (True, False, None) else None,
                "samples": num(tr.get("samples")),
                "failures": [f[:300] for f in tr.get("failures") or [] if isinstance(f, str)][:4],
            },
            "error": num(par.get("error")),
        }
    return out


def host_of(reply: Mapping[str, Any]) -> dict[str, Any]:
    h = reply.get("host")
    h = h if isinstance(h, dict) else {}
    isa = h.get("isa")
    isa = isa if isinstance(isa, list) else []
    return {
        "hostname": text(h.get("hostname"), 128),
        "os": text(h.get("os"), 32) or "?",
        "arch": text(h.get("arch"), 32) or "?",
        "cpu": text(h.get("cpu"), 200) or "?",
        "cpus": int(num(h.get("cpus")) or 0),
        "isa": [f[:32] for f in isa if isinstance(f, str)][:64],
        "nvidia_gpu": h.get("nvidia_gpu") is True,
        "jetson": h.get("jetson") is True,
    }


def merge(rec: dict[str, Any], got: Mapping[str, Any], rung: str) -> bool:
    """One rung's reply for one trial into its record; True when it was measured."""
    from edge.tune.measure import combine_parity

    for k in ("load_ms", "memory_mb", "runtime"):
        if k in got:
            rec[k] = got[k]
    par = rec.get("parity") or {}
    if "parity" in got:
        par["trial"], par["error"] = got["parity"]["trial"], got["parity"]["error"]
    combine_parity(par)
    rec["parity"] = par
    if "measurement" in got:
        rec["rungs"][rung] = got["measurement"]
        return True
    status = str(got.get("status"))
    if status.startswith("unavailable: "):  # the device lacks what the runner needs (edge.agent.tune_cmd)
        rec["status"] = f"pruned on the device: {status.removeprefix('unavailable: ')}"
    else:
        rec["status"] = status if status.startswith("failed") else f"failed on the device: {status}"
    return False


def device_pruned(recs: Sequence[Mapping[str, Any]], device: str) -> list[str]:
    """One line per runner the device said it cannot run (its reason), for the result's pruned list."""
    lines: dict[str, str] = {}
    for r in recs:
        status = str(r.get("status", ""))
        if status.startswith("pruned on the device: "):
            lines.setdefault(str(r.get("runner")), f"{status.removeprefix('pruned on the device: ')} (device {device})")
    return list(lines.values())


# -- rungs ------------------------------------------------------------------------------------------


def plan_rungs(sched: Any, n: int, strategy: str, objective: str) -> list[tuple[int, int]]:
    """(reps, iters) per rung for ``n`` trials: ``tune``'s rungs, each within what a device accepts."""
    if strategy not in STRATEGIES:
        raise EdgeError(f"unknown strategy {strategy!r}", hint=f"choose one of {', '.join(STRATEGIES)}")
    if strategy == "exhaustive":
        return [(sched.reps, sched.iters)]
    rungs = sched.rungs(n, objective)
    if rungs[-1][0] > MAX_REPS:  # the finalists' short blocks would be too many repetitions for one request
        rungs[-1] = (sched.reps, sched.iters)
    return [(min(r, MAX_REPS), min(i, MAX_ITERS)) for r, i in rungs]


def search(
    configs: Sequence[Any],
    recs: dict[str, dict[str, Any]],
    rungs: Sequence[tuple[int, int]],
    exchange: Callable[[Sequence[Any], int, int, int], dict[str, Any]],
    *,
    objective: str,
    rank_budget: float | None,
    eta: int,
    save: Callable[[], None],
    say: Say,
) -> list[dict[str, Any]]:
    """Successive halving over ``configs`` (their records in ``recs``): per rung, ``exchange(todo, k, reps,
    iters)`` sends the trials without a measurement at that rung yet and returns the device's final reply
    (trials keyed by config id: ``{"trials": {id: reply trial}}``); returns the replies, in order."""
    from edge.tune.ranking import mark_rung, ranked_trials

    by_id = {c.id: c for c in configs}
    alive = list(configs)
    replies: list[dict[str, Any]] = []
    for k, (reps, iters) in enumerate(rungs):
        if not alive:
            break
        name = f"{k}:{reps}x{iters}"
        todo = [c for c in alive if name not in recs[c.id]["rungs"]]
        if len(todo) < len(alive):
            say(f"rung {name}: {len(alive) - len(todo)} of {len(alive)} trials measured before (the study)")
        if todo:
            reply = exchange(todo, k, reps, iters)
            replies.append(reply)
            got = reply["trials"]
            for c in todo:
                merge(recs[c.id], got.get(c.id, {"status": "failed: the device did not report this trial"}), name)
            save()
        last = k == len(rungs) - 1
        ranked = ranked_trials((recs[c.id] for c in alive), name, rank_budget, objective)
        keep = ranked if last else ranked[: max(min(eta, len(ranked)), math.ceil(len(alive) / eta))]
        mark_rung((recs[c.id] for c in alive), {r["id"] for r in keep}, name, last)
        alive = [by_id[r["id"]] for r in keep]
    save()
    return replies


# -- the study file ---------------------------------------------------------------------------------


def study_header(
    model_sha256: str,
    target: str,
    objective: str,
    strategy: str,
    fleet: str,
    device: str,
    birth_host: Mapping[str, Any],
) -> dict[str, Any]:
    """What a study is of: measurements of another device, model, target or objective do not compare."""
    from edge.tune.measure import THROUGHPUT_REQUESTS

    header = {
        "model_sha256": model_sha256,
        "target": target,
        "objective": objective,
        "strategy": strategy,
        "device": f"{fleet}/{device}",
        "device_host": {
            k: birth_host.get(k) if isinstance(birth_host.get(k), (str, int)) else None
            for k in ("os", "arch", "cpu_count")
        },
    }
    if objective == "throughput":  # the device measures as edgekit tune does (edge.tune.measure._measure_infer)
        header["throughput_requests"] = THROUGHPUT_REQUESTS
    return header


def load_study(path: Path, header: Mapping[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, Any] | None]:
    """(trials by config id, who measured them) from a study made for ``header``; refused otherwise."""
    from edge.tune.study import load_study, read_study

    trials = load_study(path, header)  # checks the header and every record's rungs
    measured_by = None
    if trials:
        data = read_study(path)
        if isinstance(data.get("measured_by"), dict):
            measured_by = host_of({"host": data["measured_by"]})
    return trials, measured_by


def save_study(
    path: Path, header: Mapping[str, Any], recs: Mapping[str, dict[str, Any]], measured_by: Mapping[str, Any] | None
) -> None:
    from edge.tune.study import save_study

    save_study(path, {**header, "measured_by": measured_by}, recs)


def resume(recs: Mapping[str, dict[str, Any]], stored: Mapping[str, dict[str, Any]]) -> int:
    """The device's measurements and parity checks of a study into this run's records; the number resumed."""
    from edge.tune.measure import combine_parity

    n = 0
    for cid, rec in recs.items():
        old = stored.get(cid)
        if not old or not old.get("rungs") or rec.get("status") != "pending":
            continue
        rec["rungs"] = dict(old["rungs"])
        old_par = old.get("parity")
        old_par = old_par if isinstance(old_par, dict) else {}
        par = rec.get("parity") or {}
        if isinstance(old_par.get("trial"), dict):
            par["trial"], par["error"] = old_par["trial"], num(old_par.get("error"))
        combine_parity(par)
        rec["parity"] = par
        for k in ("runtime", "load_ms", "memory_mb"):
            if isinstance(old.get(k), (dict, int, float)) and not isinstance(old.get(k), bool):
                rec[k] = old[k]
        n += 1
    return n
