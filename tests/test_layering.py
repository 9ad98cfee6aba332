"""What a device imports: a runner, the bundle reader and the agent pull no converter or toolchain code.

Each check runs in a fresh interpreter and reads ``sys.modules`` after the import: the import graph
is what a device install pays for, so it is asserted, not assumed.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.imports import import_graph, is_converter, sources_in_tree, strongly_connected, wing_graph

# Build-host code: converters, toolchain launchers and the conversion pipeline.
BUILD_SIDE = ("edge.backends.converter", "edge.toolchains", "edge.pipeline", "edge.verify.inputs")
RUNNERS = [
    "edge.backends.onnxruntime.run",
    "edge.backends.openvino.run",
    "edge.backends.litert.run",
    "edge.backends.tensorrt.run",
    "edge.backends.coreml.run",
    "edge.backends.llamacpp.run",
    "edge.backends.executorch.run",
]


def _imported_after(module: str) -> list[str]:
    code = (
        f"import importlib, json, sys; importlib.import_module({module!r}); "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('edge'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _build_side(mods: list[str]) -> list[str]:
    return [m for m in mods if m.startswith(BUILD_SIDE) or m.endswith(".convert") or m.endswith(".edgetpu")]


@pytest.mark.parametrize(
    "module",
    RUNNERS
    + [
        "edge.bundle.bundle",
        "edge.verify.refpairs",
        "edge.verify.isa_guest",
        "edge.agent.agent",
        "edge.video.pipeline",
    ],
)
def test_device_side_imports_no_converter_code(module: str) -> None:
    mods = _imported_after(module)
    assert module in mods
    assert _build_side(mods) == [], f"{module} pulls build-host code: {_build_side(mods)}"


def test_the_check_sees_a_converter_when_one_is_imported() -> None:
    # the check itself can fail: importing a converter module is caught
    mods = _imported_after("edge.backends.onnxruntime.convert")
    assert "edge.backends.onnxruntime.convert" in _build_side(mods)
    assert "edge.backends.converter" in _build_side(mods)


# --- The house's floor plan, read from the source: every import, at module level, inside functions and
# under TYPE_CHECKING alike (an import inside a function is still an import).

EDGE = Path(__file__).resolve().parents[1] / "edge"
MODULES = {m: EDGE.parent / (m.replace(".", "/")) for m in sources_in_tree()}
MODULES = {m: p / "__init__.py" if p.is_dir() else p.with_suffix(".py") for m, p in MODULES.items()}
GRAPH = import_graph(sources_in_tree())
_cycles = strongly_connected


def test_no_import_circles() -> None:
    assert _cycles({m: {t for t, _, _ in deps} for m, deps in GRAPH.items()}) == []


def test_the_circle_check_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# The wings in their declared order, bottom first: a module may import its own floor and the floors below it,
# never one above. The backends' folders hold two floors: what a device runs (format, run, options, registry)
# sits low, under the bundle that loads it; the converters sit above the parity service and the graph tools
# they call. One wing per floor except the base, whose small modules import nothing but ``edge.errors``.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("edge", "edge.errors", "edge.native_stderr", "edge.base", "edge.spec", "edge.stats")),
    ("host", ("edge.capabilities", "edge.preprocess", "edge.mqtt")),
    ("targets", ("edge.targets", "edge.toolchains")),
    ("runtimes", ("edge.backends",)),
    ("bundle", ("edge.bundle",)),
    ("store", ("edge.store",)),
    ("llm", ("edge.llm",)),
    ("verify", ("edge.verify",)),
    ("bench", ("edge.bench",)),
    ("graph", ("edge.graph",)),
    ("converters", ()),  # edge.backends' build-host modules: see is_converter
    ("pipeline", ("edge.pipeline",)),
    ("video", ("edge.video",)),
    ("fleet", ("edge.fleet",)),
    ("tune", ("edge.tune",)),
    ("agent", ("edge.agent",)),
    ("deploy", ("edge.deploy", "edge.doctor")),
    ("cli", ("edge.cli", "edge.__main__")),
]
FLOOR_INDEX = {name: i for i, (name, _) in enumerate(FLOORS)}


def floor_of(m: str) -> str:
    if is_converter(m):
        return "converters"
    best = max(
        ((p, name) for name, prefixes in FLOORS for p in prefixes if m == p or m.startswith(p + ".")),
        key=lambda pn: len(pn[0]),
        default=None,
    )
    assert best is not None, f"{m} is on no floor: add it to FLOORS"
    return best[1]


def upward_imports(graph: dict[str, list[tuple[str, int, list[str]]]]) -> list[str]:
    return sorted(
        {
            f"{m}:{line} ({floor_of(m)}) imports {t} ({floor_of(t)})"
            for m, deps in graph.items()
            for t, line, _ in deps
            if FLOOR_INDEX[floor_of(t)] > FLOOR_INDEX[floor_of(m)]
        }
    )


def test_every_module_is_on_a_floor() -> None:
    assert {m: floor_of(m) for m in MODULES}  # floor_of names what is missing


def test_no_import_reaches_up_a_floor() -> None:
    """Every import (function-level and TYPE_CHECKING included) goes down or sideways within its floor."""
    assert upward_imports(GRAPH) == []


def test_no_circle_between_wings() -> None:
    assert strongly_connected(wing_graph(GRAPH)) == []


def test_the_floor_check_finds_an_upward_import() -> None:
    fake = {**GRAPH, "edge.bundle.schema": [*GRAPH["edge.bundle.schema"], ("edge.pipeline.plan", 1, [])]}
    assert upward_imports(fake) == ["edge.bundle.schema:1 (bundle) imports edge.pipeline.plan (pipeline)"]
    assert strongly_connected(wing_graph({**fake, "edge.pipeline.plan": [("edge.bundle.schema", 1, [])]})) != []


def _reach(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for t, _, _ in GRAPH.get(todo.pop(), []):
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return seen


def test_no_import_circles() -> None:
    assert _cycles({m: {t for t, _, _ in deps} for m, deps in GRAPH.items()}) == []


def test_the_circle_check_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


BUILD_HOST = (
    "edge.pipeline",
    "edge.backends.converter",
    "edge.deploy",
    "edge.cli",
    "edge.toolchains",
    "edge.verify.inputs",
)


def _is_build_host(m: str) -> bool:
    return m.startswith(BUILD_HOST) or m.endswith((".convert", ".edgetpu")) or ".from_" in m


@pytest.mark.parametrize(
    "root", ["edge.agent", "edge.store", *(m for m in MODULES if m.startswith("edge.backends.") and m.endswith(".run"))]
)
def test_device_code_reaches_no_build_host_code(root: str) -> None:
    """Every import a device module could ever run (function-level included), not just what one import pulls."""
    starts = [m for m in MODULES if m == root or m.startswith(root + ".")]
    bad = {s: sorted(m for m in _reach(s) if _is_build_host(m)) for s in starts}
    assert {s: b for s, b in bad.items() if b} == {}


@pytest.mark.parametrize(
    ("wing", "never"),
    [
        ("edge.fleet", "edge.agent"),
        ("edge.mqtt", "edge.agent"),
        ("edge.mqtt", "edge.fleet"),
        ("edge.bundle", "edge.verify"),
        ("edge.tune", "edge.agent"),
    ],
)
def test_wings_keep_their_distance(wing: str, never: str) -> None:
    found = [
        (m, t, line)
        for m, deps in GRAPH.items()
        if m.startswith(wing)
        for t, line, _ in deps
        if t == never or t.startswith(never + ".")
    ]
    assert found == []


def test_no_private_name_crosses_a_module() -> None:
    found = [
        (m, line, n)
        for m, deps in GRAPH.items()
        for _, line, names in deps
        for n in names
        if n.startswith("_") and not n.startswith("__")
    ]
    assert found == []


def test_errors_is_imported_at_module_level() -> None:
    """``edge.errors`` imports nothing, so there is never a reason to import it inside a function."""
    found = []
    for m, p in MODULES.items():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "edge.errors" and node.col_offset > 0:
                found.append((m, node.lineno))
    assert found == []


def test_top_of_edge_holds_at_most_twelve_modules() -> None:
    top = sorted(p.name for p in EDGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(top) <= 12, top


def test_test_files_have_unique_names() -> None:
    """tests/ has no __init__.py: pytest imports each test file by its bare name, so two files of one name
    in two folders stop the whole run at collection."""
    names = [p.name for p in (EDGE.parent / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_no_test_imports_conftest_or_a_helper_by_its_bare_name() -> None:
    """Shared helpers live in tests/support (``from tests.support.cli import run_cli``): with a conftest per folder,
    ``from conftest import`` gets whichever conftest pytest imported last, and ``import mqtt_broker`` works only
    while tests/ itself is on sys.path."""
    bare = re.compile(
        r"^\s*(from (tests\.)?conftest import|from tests import (?!support)|import (conftest|mqtt_broker|pg_server)\b)",
        re.M,
    )
    found = [
        str(p.relative_to(EDGE.parent))
        for p in sorted((EDGE.parent / "tests").rglob("*.py"))
        if bare.search(p.read_text(encoding="utf-8"))
    ]
    assert found == []
