"""edgekit's import graph read from source: every import statement, at module level, inside functions and under
TYPE_CHECKING alike (an import inside a function is still an import).

Used by ``tests/test_layering.py`` (the working tree) and ``benchmarks/wings.py`` (any git revision).
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# (imported edge module, line, names taken from it)
Import = tuple[str, int, list[str]]


def sources_in_tree(root: Path = REPO) -> dict[str, str]:
    """Module name -> source text for every ``edge/**/*.py`` under ``root``."""
    return {_module_name(p.relative_to(root)): p.read_text(encoding="utf-8") for p in (root / "edge").rglob("*.py")}


def sources_at(rev: str, root: Path = REPO) -> dict[str, str]:
    """Module name -> source text for every ``edge/**/*.py`` at git revision ``rev``."""
    names = subprocess.run(
        ["git", "-C", str(root), "ls-tree", "-r", "--name-only", rev, "edge/"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    out = {}
    for n in names:
        if n.endswith(".py"):
            text = subprocess.run(
                ["git", "-C", str(root), "show", f"{rev}:{n}"], capture_output=True, text=True, check=True
            )
            out[_module_name(Path(n))] = text.stdout
    return out


def _module_name(rel: Path) -> str:
    parts = rel.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(sources: dict[str, str]) -> dict[str, list[Import]]:
    """Every module's edge imports (function-level and TYPE_CHECKING included)."""
    packages = {m for m in sources if _is_package(m, sources)}

    def target(mod: str) -> str | None:
        while mod and mod not in sources:
            mod = mod.rpartition(".")[0]
        return mod or None

    graph: dict[str, list[Import]] = {}
    for mod, text in sources.items():
        out: list[Import] = []
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                out += [(t, node.lineno, []) for a in node.names if (t := target(a.name)) and t.startswith("edge")]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = mod.split(".") if mod in packages else mod.split(".")[:-1]
                    base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    t = target(sub) if sub in sources else target(base)
                    if t and t.startswith("edge") and t != mod:
                        out.append((t, node.lineno, [] if sub in sources else [a.name]))
        graph[mod] = out
    return graph


def _is_package(mod: str, sources: dict[str, str]) -> bool:
    return mod == "edge" or any(m.startswith(mod + ".") for m in sources)


def is_converter(mod: str) -> bool:
    """A backend's build-host module: the converters, their from_* front-ends and finishers. (``rewrite`` is not one:
    a pure flatbuffer reader/rewriter, importing nothing but ``edge.errors``, that the format's verifier uses.)"""
    return mod.startswith("edge.backends.") and (
        mod == "edge.backends.converter" or mod.endswith((".convert", ".edgetpu", ".firmware")) or ".from_" in mod
    )


def wing(mod: str, by_role: bool = True) -> str:
    """The wing a module belongs to: ``edge.bundle.schema`` -> ``bundle``, ``edge.errors`` -> ``errors``.

    ``edge/backends/<runtime>/`` keeps a backend's knowledge in one folder but holds two wings: what a device
    runs (format, run, options) and the converters (build host). ``by_role=False`` counts the folder as one.
    """
    if by_role and is_converter(mod):
        return "converters"
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "edge"


def wing_graph(graph: dict[str, list[Import]], by_role: bool = True) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, deps in graph.items():
        w = wing(m, by_role)
        out.setdefault(w, set()).update(wing(t, by_role) for t, _, _ in deps if wing(t, by_role) != w)
    out.pop("edge", None)
    return {w: d - {"edge"} for w, d in out.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
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


def simple_circles(graph: dict[str, set[str]], limit: int = 100_000) -> int:
    """How many simple circles the graph holds (each counted once, from its smallest node); stops at ``limit``."""
    count = 0
    nodes = sorted(graph)
    for start in nodes:
        todo = [(start, [start])]
        while todo:
            v, path = todo.pop()
            for w in graph.get(v, ()):
                if w == start:
                    count += 1
                    if count >= limit:
                        return count
                elif w > start and w not in path:
                    todo.append((w, [*path, w]))
    return count
