"""Issue #26 item 6: no id, label, topic part or path guard admits a trailing newline.

``re.match(r"^[a-z]+$", "ok\\n")`` matches: ``$`` also matches before a final newline. Each guard below
is fed a valid value with one ``\\n`` appended and must refuse it; and a static check walks every module
of ``edge/`` so that no pattern ending in ``$`` is used with ``match``/``search`` again.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any, Callable

import pytest

from edge.agent.appsocket import AppReport, Refused
from edge.agent.tune_cmd import TuneRequest, TuneRequestError
from edge.base.typedjson import Invalid, Rule, read
from edge.bundle.schema import ID
from edge.errors import DeployError, EdgeError
from edge.fleet.metrics import RolloutView, label
from edge.mqtt.desired import DesiredError, DesiredState
from edge.mqtt.topics import check_part
from edge.store.base import check_bundle_id

EDGE = Path(__file__).resolve().parents[1] / "edge"
SHA = "a" * 64


def _desired(**kw: Any) -> bytes:
    base = {
        "schema_version": 1,
        "type": "desired",
        "fleet": "lab",
        "device": "cam",
        "rollout_id": "r1",
        "bundle_id": "b-1",
        "version": 2,
        "replaces": 1,
        "artifact_url": "https://example.invalid/b.tar",
        "sha256": SHA,
    }
    return json.dumps({**base, **kw}).encode()


def _tune(**trial: Any) -> bytes:
    t = {
        "id": "t1",
        "url": "https://example.invalid/t.tar",
        "sha256": SHA,
        "size": 10,
        "runner": "onnxruntime",
        "precision": "fp32",
        "options": {},
        **trial,
    }
    req = {
        "schema_version": 1,
        "type": "tune-request",
        "fleet": "lab",
        "device": "cam",
        "study_id": "s1",
        "objective": "latency",
        "schedule": {"reps": 1, "iters": 1, "warmup": 0},
        "trials": [t],
    }
    return json.dumps(req).encode()


def _tune_study(study: str) -> bytes:
    obj = json.loads(_tune())
    obj["study_id"] = study
    return json.dumps(obj).encode()


def _raises(fn: Callable[[], Any], *errors: type[BaseException]) -> bool:
    try:
        fn()
    except errors:
        return True
    return False


# each: (what, accepts(value) -> bool) for one guard; the valid value passes, value + "\n" does not
GUARDS: list[tuple[str, str, Callable[[str], bool]]] = [
    (
        "desired.rollout_id",
        "r1",
        lambda v: (
            not _raises(lambda: DesiredState.parse(_desired(rollout_id=v), fleet="lab", device="cam"), DesiredError)
        ),
    ),
    (
        "desired.bundle_id",
        "b-1",
        lambda v: (
            not _raises(lambda: DesiredState.parse(_desired(bundle_id=v), fleet="lab", device="cam"), DesiredError)
        ),
    ),
    (
        "desired.sha256",
        SHA,
        lambda v: not _raises(lambda: DesiredState.parse(_desired(sha256=v), fleet="lab", device="cam"), DesiredError),
    ),
    (
        "tune.study_id",
        "s1",
        lambda v: not _raises(lambda: TuneRequest.parse(_tune_study(v), fleet="lab", device="cam"), TuneRequestError),
    ),
    (
        "tune.trial.id",
        "t1",
        lambda v: not _raises(lambda: TuneRequest.parse(_tune(id=v), fleet="lab", device="cam"), TuneRequestError),
    ),
    (
        "tune.trial.runner",
        "onnxruntime",
        lambda v: not _raises(lambda: TuneRequest.parse(_tune(runner=v), fleet="lab", device="cam"), TuneRequestError),
    ),
    (
        "tune.trial.precision",
        "fp32",
        lambda v: (
            not _raises(lambda: TuneRequest.parse(_tune(precision=v), fleet="lab", device="cam"), TuneRequestError)
        ),
    ),
    (
        "tune.trial.sha256",
        SHA,
        lambda v: not _raises(lambda: TuneRequest.parse(_tune(sha256=v), fleet="lab", device="cam"), TuneRequestError),
    ),
    (
        "tune.trial.option name",
        "num_threads",
        lambda v: (
            not _raises(lambda: TuneRequest.parse(_tune(options={v: 1}), fleet="lab", device="cam"), TuneRequestError)
        ),
    ),
    (
        "app socket bundle",
        "b-1",
        lambda v: (
            not _raises(
                lambda: AppReport.parse(json.dumps({"v": 1, "latency_ms": [1.0], "bundle": v}).encode()), Refused
            )
        ),
    ),
    ("fleet metrics label", "x86-cpu", lambda v: label(v) is not None),
    (
        "fleet rollout id",
        "r1",
        lambda v: RolloutView.parse(json.dumps({"rollout": {"rollout_id": v, "state": "running"}})) is not None,
    ),
    (
        "fleet rollout reason",
        "timeout",
        lambda v: (
            (
                RolloutView.parse(json.dumps({"rollout": {"rollout_id": "r1", "state": "failed", "reason": v}}))
                or RolloutView("", None, "", None)
            ).reason
            is not None
        ),
    ),
    ("store bundle id", "b-1", lambda v: not _raises(lambda: check_bundle_id(v), DeployError)),
    ("manifest id (typed JSON)", "b-1", lambda v: not _raises(lambda: read(str, v, "id", Rule(pattern=ID)), Invalid)),
    ("topic part", "cam-01", lambda v: not _raises(lambda: check_part(v, "device id"), EdgeError)),
]


@pytest.mark.parametrize("what, good, accepts", GUARDS, ids=[g[0] for g in GUARDS])
def test_a_trailing_newline_is_refused(what: str, good: str, accepts: Callable[[str], bool]) -> None:
    assert accepts(good), f"{what}: the valid value {good!r} is refused"
    assert not accepts(good + "\n"), f"{what}: {good!r} + newline is accepted"


def _ends_with_dollar(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.endswith("$")
    if isinstance(node, ast.JoinedStr) and node.values:
        return _ends_with_dollar(node.values[-1])
    return False


def test_no_pattern_ending_in_dollar_is_used_with_match_or_search() -> None:
    """A ``$`` pattern is only safe with ``fullmatch`` (which must consume the newline too)."""
    found = []
    for path in sorted(EDGE.rglob("*.py")):
        if "_offline" in path.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        dollar_names = {
            t.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "attr", "") == "compile"
            and node.value.args
            and _ends_with_dollar(node.value.args[0])
            and not any(
                isinstance(k.value, ast.Attribute) and k.value.attr in ("M", "MULTILINE") for k in node.value.keywords
            )
            and len(node.value.args) < 2
            for t in node.targets
            if isinstance(t, ast.Name)
        }
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("match", "search")
            ):
                continue
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id == "re" and node.args and _ends_with_dollar(node.args[0]):
                found.append(f"{path.relative_to(EDGE.parent)}:{node.lineno} re.{node.func.attr}(...$)")
            elif isinstance(owner, ast.Name) and owner.id in dollar_names:
                found.append(f"{path.relative_to(EDGE.parent)}:{node.lineno} {owner.id}.{node.func.attr}")
    assert not found, "use fullmatch (or \\Z): " + ", ".join(found)
