"""Ranking a rung and choosing the winner: parity is a hard constraint, trials of one chunk rank by their ratio to
the chunk's anchor, the rest by the objective's score; the same rule on this host and on a device."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from edge.tune.config import Config
from edge.tune.measure import missed_share, rank_key, trial_score
from edge.tune.space import Space

#: e2e: the share of frames a configuration may miss at the target rate and still count as holding it (the p99
#: rule of ``edgekit bench`` and ``run``)
E2E_MISS_TOLERANCE = 0.01


def mark_rung(records: Iterable[dict[str, Any]], kept: set[str], name: str, last: bool) -> None:
    """After rung ``name``: each record's status (unless already failed, pruned or failing parity): parity failed
    or not verified, eliminated (not in ``kept``), or measured (a survivor of the last rung)."""
    for rec in records:
        if rec["status"].startswith(("failed", "parity", "pruned")):
            continue
        passed = (rec.get("parity") or {}).get("passed")
        if passed is not True:
            rec["status"] = "parity failed" if passed is False else "parity not verified"
        elif rec["id"] not in kept:
            rec["status"] = f"eliminated at {name}"
        elif last:
            rec["status"] = "measured"


def priority(space: Space) -> list[Config]:
    """The order trials are taken in under --max-trials: each runner, precision, recipe and batch's defaults first
    (batch 1 before the batched ones: it is their per-item reference)."""
    import random

    firsts: list[Config] = []
    rest: list[Config] = []
    seen: set[tuple[str, str, tuple[Any, ...], int]] = set()
    for c in space.configs:
        k = (c.runner, c.precision, c.recipe, c.batch)
        (rest if k in seen else firsts).append(c)
        seen.add(k)
    random.Random(0).shuffle(rest)
    return firsts + rest


def ranked_trials(
    recs: Iterable[dict[str, Any]], rung: str, budget_ms: float | None, objective: str
) -> list[dict[str, Any]]:
    """Trials that passed parity and were measured at ``rung``, best first: those within the budget first."""
    ok = [r for r in recs if (r.get("parity") or {}).get("passed") is True and rung in r.get("rungs", {})]

    def within(r: dict[str, Any]) -> bool:
        m = r["rungs"][rung]
        if objective == "e2e":  # the budget is the pace: within it when (almost) no frame was missed
            return missed_share(m) <= E2E_MISS_TOLERANCE
        if budget_ms is None:
            return True
        if objective == "latency":
            return m.get("p99_ms") is not None and m["p99_ms"] <= budget_ms
        return -trial_score(objective, m["rep_scores"]) >= 1000.0 / budget_ms

    # measured in several chunks, each with the same anchor: ranked by the ratio to it (else on raw figures: a
    # rung measured in one chunk, or one whose records mix anchors, e.g. resumed from an older study)
    relative = (
        bool(ok)
        and objective != "e2e"
        and len({_anchor_id(r["rungs"][rung]) for r in ok} - {None}) == 1
        and all(_anchor_id(r["rungs"][rung]) is not None for r in ok)
    )

    def key(r: dict[str, Any]) -> tuple[float, float]:
        m = r["rungs"][rung]
        return (0.0, float(m["vs_anchor"])) if relative else rank_key(objective, m)

    return sorted(ok, key=lambda r: (not within(r), key(r), r["id"]))


def _anchor_id(m: Mapping[str, Any]) -> str | None:
    """The anchor a rung record was measured against (None: none, or no figure relative to it)."""
    a = m.get("anchor")
    return a.get("id") if isinstance(a, dict) and isinstance(m.get("vs_anchor"), (int, float)) else None


def choose(
    trials: Sequence[dict[str, Any]], budget_ms: float | None = None, objective: str = "latency"
) -> dict[str, Any] | None:
    """The winner: the best trial at the deepest rung any trial that passed parity reached; a trial that failed
    parity (or was not checked) is never chosen, however fast."""
    rungs = sorted(
        {k for t in trials if (t.get("parity") or {}).get("passed") is True for k in t.get("rungs", {})},
        key=_rung_order,
    )
    for rung in reversed(rungs):
        ranked = ranked_trials(trials, rung, budget_ms, objective)
        if ranked:
            return ranked[0]
    return None


def _rung_order(name: str) -> int:
    """Rungs are named "K:REPSxITERS"; a later rung is a longer measurement of fewer trials."""
    try:
        return int(name.partition(":")[0])
    except ValueError:
        return -1


def trial_results(trials: Sequence[dict[str, Any]], objective: str) -> None:
    """Each trial's ``result``: the figures of its deepest rung and its score there (None: never measured)."""
    for t in trials:
        best = best_rung(t)
        m = t["rungs"][best] if best else None
        t["result"] = (
            {
                "rung": best,
                **{k: v for k, v in m.items() if not k.startswith("rep_")},
                "score": trial_score(objective, m["rep_scores"]),
            }
            if m
            else None
        )


def best_rung(t: Mapping[str, Any]) -> str | None:
    names = sorted(t.get("rungs", {}), key=_rung_order)
    return names[-1] if names else None
