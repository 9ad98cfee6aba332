"""What a device imports: a runner, the bundle reader and the agent pull no converter or toolchain code.

Each check runs in a fresh interpreter and reads ``sys.modules`` after the import: the import graph
is what a device install pays for, so it is asserted, not assumed.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

# Build-host code: converters, toolchain launchers and the conversion pipeline.
BUILD_SIDE = ("edge.backends.converter", "edge.toolchains", "edge.pipeline", "edge.verify.inputs")
RUNNERS = [
    "edge.backends.onnxruntime.run",
    "edge.backends.openvino.run",
    "edge.backends.litert.run",
    "edge.backends.tensorrt.run",
    "edge.backends.coreml.run",
    "edge.backends.llamacpp.run",
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


def _module_files() -> dict[str, Path]:
    mods = {}
    for p in EDGE.rglob("*.py"):
        parts = p.relative_to(EDGE.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return mods


MODULES = _module_files()


def _target(mod: str) -> str | None:
    while mod and mod not in MODULES:
        mod = mod.rpartition(".")[0]
    return mod or None


def _imports(mod: str) -> list[tuple[str, int, list[str]]]:
    """(imported edge module, line, names taken from it) for every import statement in ``mod``."""
    out = []
    is_pkg = MODULES[mod].name == "__init__.py"
    for node in ast.walk(ast.parse(MODULES[mod].read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(t, node.lineno, []) for a in node.names if (t := _target(a.name)) and t.startswith("edge")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                t = _target(f"{base}.{a.name}") if f"{base}.{a.name}" in MODULES else _target(base)
                if t and t.startswith("edge") and t != mod:
                    out.append((t, node.lineno, [] if f"{base}.{a.name}" in MODULES else [a.name]))
    return out


GRAPH = {m: _imports(m) for m in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


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
