"""Outside its own folder, no module branches on a backend's name (issue #31 item 2).

A runtime's knowledge lives in ``edge/backends/<name>/`` and is read through what its runner or converter
declares (``Runner.fast_cpu_precision``, ``Converter.op_support``, ...). A comparison such as
``runner == "openvino"`` or ``name in ("onnxruntime", "openvino")`` anywhere else is a second home for that
knowledge, which a new runtime would have to find and edit. Names come from pyproject's entry points, so a new
backend's name is covered as soon as it is registered.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
_EPS = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["entry-points"]
NAMES = frozenset(_EPS["edgekit.runners"]) | frozenset(_EPS["edgekit.converters"])

#: (module, name) -> why the comparison stays. Keep it short; each entry is a debt or not a backend branch at all.
EXCEPTIONS: dict[tuple[str, str], str] = {
    # the toolchain driver's job protocol names its task after the conversion it runs; it runs inside the tflite
    # toolchain environment, not against the registry
    ("edge/toolchains/tflite_driver.py", "tflite->onnx"): "a task name of the driver's own protocol",
    # parity's note on ISA-bound int8/bf16 results reads which runtime computed, from the runtime string the runner
    # reported ("onnxruntime 1.x"): TensorRT's CPU fallback reports onnxruntime there, so a flag on the runner class
    # would change the notes; the flag would have to travel in RunnerInfo
    ("edge/verify/parity.py", "onnxruntime"): "reads the reported runtime, not a runner name (debt: RunnerInfo flag)",
    ("edge/verify/parity.py", "openvino"): "reads the reported runtime, not a runner name (debt: RunnerInfo flag)",
}


#: name lists and name-keyed tables that stay outside the backends' folders, and why
TABLE_EXCEPTIONS: dict[tuple[str, str], str] = {
    # a toolchain environment named like the runtime it serves; the toolchain list stays central (most serve
    # several backends, and their locks and drivers are package data of edge/toolchains)
    ("edge/toolchains/__init__.py", "rknn"): "the rknn toolchain's name",
    ("edge/toolchains/__init__.py", "executorch"): "the executorch toolchain's name",
    # a toolchain's driver records the versions of the distributions it ran (the executorch wheel is one)
    ("edge/toolchains/executorch_driver.py", "executorch"): "the distribution whose version the driver records",
    # what the aarch64 emulator's toolchain carries wheels for: a fact about that toolchain, not the runners
    ("edge/verify/isa.py", "litert"): "the aarch64 emulator's wheels",
    ("edge/verify/isa.py", "onnxruntime"): "the aarch64 emulator's wheels",
    ("edge/verify/parity.py", "onnxruntime"): "the ISA note's runtimes (see EXCEPTIONS)",
    ("edge/verify/parity.py", "openvino"): "the ISA note's runtimes (see EXCEPTIONS)",
}


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _strings(e)]
    return []


def name_branches(root: Path) -> list[tuple[str, int, str]]:
    """(module, line, name) of every comparison against a registered backend name outside edge/backends/<name>/."""
    found = []
    for path in sorted((root / "edge").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        parts = rel.split("/")
        if len(parts) > 3 and parts[1] == "backends":
            continue  # a backend's own folder may name itself
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                for side in (node.left, *node.comparators):
                    found += [(rel, node.lineno, s) for s in _strings(side) if s in NAMES]
            elif isinstance(node, ast.match_case) and isinstance(node.pattern, ast.MatchValue):
                found += [(rel, node.pattern.lineno, s) for s in _strings(node.pattern.value) if s in NAMES]
    return found


def name_tables(root: Path) -> list[tuple[str, int, str]]:
    """(module, line, name) of every registered backend name in a dict key, or in a tuple/list/set literal of
    two or more names, outside edge/backends/<name>/: a central per-backend table."""
    found = []
    for path in sorted((root / "edge").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        parts = rel.split("/")
        if len(parts) > 3 and parts[1] == "backends":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Dict):
                found += [(rel, node.lineno, s) for k in node.keys if k is not None for s in _strings(k) if s in NAMES]
            elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                hits = [s for s in _strings(node) if s in NAMES]
                found += [(rel, node.lineno, s) for s in hits] if len(hits) >= 2 else []
    return found


def test_no_central_table_of_backends() -> None:
    left = [f"{m}:{line} lists {n!r}" for m, line, n in name_tables(REPO) if (m, n) not in TABLE_EXCEPTIONS]
    assert left == [], "declare it on the runner or converter instead: " + "; ".join(left)


def test_every_table_exception_is_still_needed() -> None:
    seen = {(m, n) for m, _, n in name_tables(REPO)}
    assert sorted(set(TABLE_EXCEPTIONS) - seen) == []


def test_no_module_outside_a_backend_branches_on_its_name() -> None:
    left = [f"{m}:{line} compares with {n!r}" for m, line, n in name_branches(REPO) if (m, n) not in EXCEPTIONS]
    assert left == [], "declare it on the runner or converter instead: " + "; ".join(left)


def test_every_exception_is_still_needed() -> None:
    seen = {(m, n) for m, _, n in name_branches(REPO)}
    assert sorted(set(EXCEPTIONS) - seen) == []


def test_the_check_sees_a_branch(tmp_path: Path) -> None:
    mod = tmp_path / "edge" / "tune" / "x.py"
    mod.parent.mkdir(parents=True)
    mod.write_text('def f(r):\n    return r == "openvino" or r in ("litert", "other")\n', encoding="utf-8")
    (tmp_path / "edge" / "backends" / "openvino").mkdir(parents=True)
    (tmp_path / "edge" / "backends" / "openvino" / "run.py").write_text('name = "x" if 1 else "openvino" == 1\n')
    assert name_branches(tmp_path) == [("edge/tune/x.py", 2, "openvino"), ("edge/tune/x.py", 2, "litert")]
    table = tmp_path / "edge" / "tune" / "t.py"
    table.write_text('A = {"openvino": 1}\nB = ("litert", "onnxruntime")\nC = ("litert", "x")\n', encoding="utf-8")
    assert name_tables(tmp_path) == [
        ("edge/tune/t.py", 1, "openvino"),
        ("edge/tune/t.py", 2, "litert"),
        ("edge/tune/t.py", 2, "onnxruntime"),
    ]
