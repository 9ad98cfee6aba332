"""The apply's state table (issue #31: ``Applier`` as an explicit state machine with a narrow context per state)."""

from __future__ import annotations

import dataclasses

from edge.agent.apply import STEPS, TERMINAL, Applier, Plan
from edge.mqtt.desired import REASONS


def test_every_state_is_reachable_goes_somewhere_known_and_touches_only_plan_fields() -> None:
    plan_fields = {f.name for f in dataclasses.fields(Plan)}
    seen, todo = set(), ["start"]
    while todo:
        state = todo.pop()
        if state in seen or state in TERMINAL:
            continue
        seen.add(state)
        step = STEPS[state]
        assert callable(getattr(Applier, step.handler)), step.handler
        assert set(step.reads) | set(step.writes) <= plan_fields, state
        assert step.then and all(t in STEPS or t in TERMINAL for t in step.then), (state, step.then)
        todo += step.then
    assert seen == set(STEPS)  # no state the walk from start never reaches
    reached = {t for s in STEPS.values() for t in s.then}
    assert set(TERMINAL) <= reached


def test_a_field_a_state_reads_is_written_by_a_state_before_it() -> None:
    """Along every path from start, what a state reads was written on the way (or is the Plan's default)."""

    def walk(state: str, written: frozenset[str]) -> None:
        if state in TERMINAL:
            return
        step = STEPS[state]
        assert set(step.reads) <= written | {"held"}, (state, step.reads, written)  # held: None = not stored
        for nxt in step.then:
            walk(nxt, written | set(step.writes))

    walk("start", frozenset())


def test_unforeseen_failures_map_to_known_reason_codes() -> None:
    from edge.agent.apply import UNFORESEEN

    assert set(UNFORESEEN.values()) <= set(REASONS)
    entered = {s for s, step in STEPS.items() if step.enter} | {"verifying"}
    assert entered <= set(UNFORESEEN), entered - set(UNFORESEEN)
