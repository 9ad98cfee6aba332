"""Malformed manifests never crash edgekit (issue 11, attack 5).

Hypothesis mutates a real manifest -- types swapped, fields deleted or added, objects and arrays
swapped, values nested thousands deep, huge numbers, bad ids and paths -- and every result either
opens or is refused with one ``ManifestError`` line naming manifest.json and the field. What
opens must also verify, gate and describe itself without any other exception. The same refusal
reaches a user of the console script as exit code 2 and one line.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge.bench import BenchOptions, run_benchmark
from edge.bundle.bundle import Bundle
from edge.errors import BudgetError, BundleError, DeployError, ManifestError
from edge.pipeline import convert
from edge.verify.gates import check_gates
from tests.support.cli import assert_user_error, run_cli

DEEP = "\x00deep\x00"  # placeholder replaced by thousands of brackets after json.dumps
BAD_TEXT = [
    "",
    ".",
    "..",
    "./../../..",
    "../x",
    "/etc/passwd",
    "x$(id>PWNED)",
    "-rf",
    "a b",
    "a/b",
    "\u202e",
    "[/x]",
    "x" * 200,
    "x" * 70000,
    "libedgetpu.so.1",
    "/tmp/libevil.so",
    "\x00",
    "0" * 64,
    "NaN",
]
HUGE = [2**53 + 1, -(2**63), 10**300, 10**400, 1e308, -1e308, 1.5, -1, 0, 2**31]


@pytest.fixture(scope="module")
def bases(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real bundle (its directory, for verify) and three valid manifests of it: parity run,
    parity skipped, and with a benchmark recorded."""
    d = tmp_path_factory.mktemp("fuzz") / "b"
    b = convert(models["tiny"], "x86-cpu", d)
    ran = copy.deepcopy(b.manifest)
    skipped = {**ran, "parity": {"passed": None, "skipped": "runner cannot run on this host: test"}}
    bench = run_benchmark(
        b.open_runner, BenchOptions(iterations=3, warmup=1, budget_ms=1000.0, bundle=b.id, target=b.target)
    )
    benched = {**ran, "benchmark": {**bench.to_json(), "on_target_device": True}}
    for m in (ran, skipped, benched):
        Bundle(d, m)  # each base is valid
    return Bases(d, [ran, skipped, benched])


class Bases(dict):
    def __init__(self, d: Path, manifests: list[dict[str, Any]]) -> None:
        super().__init__(dir=d, manifests=manifests)

    def __repr__(self) -> str:  # keeps hypothesis' failure report to the draws
        return "Bases(...)"


json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from(HUGE),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(BAD_TEXT),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
OPS = ["delete", "replace", "deep", "swap", "add_key", "stringify", "huge", "bad_text", "empty", "wrap"]


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _mutate(doc: Any, path: tuple, op: str, payload: Any, data: st.DataObject) -> Any:
    if not path:
        return payload if op in ("replace", "stringify") else [doc] if op == "wrap" else DEEP if op == "deep" else doc
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    old = parent[key]
    if op == "delete":
        del parent[key]
    elif op == "replace":
        parent[key] = payload
    elif op == "deep":
        parent[key] = DEEP
    elif op == "swap":  # dict <-> list
        parent[key] = (
            list(old.values())
            if isinstance(old, dict)
            else ({str(i): v for i, v in enumerate(old)} if isinstance(old, list) else [old])
        )
    elif op == "add_key":
        target = old if isinstance(old, dict) else parent if isinstance(parent, dict) else None
        if target is not None:
            target[data.draw(st.sampled_from(["extra", "edgetpu_library", "passed", "__proto__", "options"]))] = payload
    elif op == "stringify":
        parent[key] = json.dumps(old)
    elif op == "huge":
        parent[key] = data.draw(st.sampled_from(HUGE))
    elif op == "bad_text":
        parent[key] = data.draw(st.sampled_from(BAD_TEXT))
    elif op == "empty":
        parent[key] = type(old)() if isinstance(old, (dict, list, str)) else None
    elif op == "wrap":
        parent[key] = {"value": old}
    return doc


def _text(doc: Any, depth: int) -> str:
    text = json.dumps(doc)  # ensure_ascii: lone surrogates and controls travel as escapes
    return text.replace(json.dumps(DEEP), "[" * depth + "]" * depth)


@settings(
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_every_mutation_opens_or_is_one_manifest_error(bases: dict[str, Any], data: st.DataObject) -> None:
    doc = copy.deepcopy(data.draw(st.sampled_from(bases["manifests"])))
    for _ in range(data.draw(st.integers(1, 3))):
        paths = _paths(doc)
        path = paths[data.draw(st.integers(0, len(paths) - 1))]
        doc = _mutate(doc, path, data.draw(st.sampled_from(OPS)), data.draw(json_value), data)
    depth = data.draw(st.sampled_from([33, 1000, 100_000, 600_000]))
    mf = bases["dir"] / "manifest.json"
    mf.write_text(_text(doc, depth), encoding="utf-8")
    try:
        b = Bundle.open(bases["dir"], verify=False)
    except ManifestError as e:
        line = str(e)
        assert "\n" not in line and "manifest.json" in line, line
        line.encode("ascii")  # printable on any terminal: bad values are shown escaped
        return
    # what opened is usable without surprises: verify, gates, typed views
    try:
        b.verify()
    except BundleError as e:
        assert not isinstance(e, ManifestError) and "failed verification" in str(e)
    try:
        check_gates(b.info)
    except (DeployError, BudgetError):
        pass
    assert b.id and b.target and b.kind in ("vision", "llm")
    b.io, b.preprocess, b.artifact  # noqa: B018 - building them must not raise


CLI_CASES = {
    "artifacts-dict": (
        lambda m: m.update(artifacts={"model.onnx": m["artifacts"][0]}),
        "field artifacts: must be an array",
    ),
    "runner-string": (lambda m: m.update(runner="onnxruntime"), "field runner: must be an object"),
    "no-sha256": (lambda m: m["artifacts"][0].pop("sha256"), "field artifacts[0].sha256: missing"),
    "threads-text": (
        lambda m: m["runner"]["options"].update(intra_op_num_threads="two"),
        "field runner.options.intra_op_num_threads: must be an integer",
    ),
    "bad-id": (lambda m: m.update(bundle_id="x$(id>PWNED)"), "field bundle_id"),
    "deep": (lambda m: m.update(calibration=DEEP), "nested deeper than 32 levels"),
}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_cli_refuses_a_mutated_manifest_in_one_line(bases: dict[str, Any], tmp_path: Path, case: str) -> None:
    mutate, needle = CLI_CASES[case]
    d = tmp_path / "b"
    shutil.copytree(bases["dir"], d)
    doc = copy.deepcopy(bases["manifests"][0])
    mutate(doc)
    (d / "manifest.json").write_text(_text(doc, 5000), encoding="utf-8")
    assert_user_error(run_cli("bench", str(d), "--iterations", "2"), "manifest.json", needle)
