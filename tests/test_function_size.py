"""No function in the library over 80 lines or with more than 10 parameters (the CLI's typer commands excepted),
and no module in ``edge/`` over 800 lines (the CLI's included: a module that big is two modules).

An AST walk over ``edge/`` (``edge/cli`` left out: a typer command's parameters are its flags). A function that
takes many options takes a request object instead (``edge.pipeline.request.ConvertRequest``,
``edge.tune.search.TuneOptions``, ...); a long one is split into named steps. ``self``/``cls`` are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

EDGE = Path(__file__).resolve().parents[1] / "edge"
MAX_LINES = 80
MAX_PARAMS = 10
MAX_MODULE_LINES = 800


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return [n for n in names if n not in ("self", "cls")]


def offenders() -> dict[str, str]:
    """``path:function`` -> what is over, for every function in ``edge/`` outside ``edge/cli``."""
    out: dict[str, str] = {}
    for path in sorted(EDGE.rglob("*.py")):
        rel = path.relative_to(EDGE).as_posix()
        if rel.startswith("cli/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            params = len(_params(node))
            over = ([f"{lines} lines"] if lines > MAX_LINES else []) + (
                [f"{params} parameters"] if params > MAX_PARAMS else []
            )
            if over:
                out[f"{rel}:{node.name}"] = ", ".join(over)
    return out


def big_modules(root: Path = EDGE) -> dict[str, int]:
    """``path`` -> its line count, for every module under ``root`` over :data:`MAX_MODULE_LINES` lines."""
    out: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES:
            out[path.relative_to(root).as_posix()] = lines
    return out


def test_no_module_over_800_lines() -> None:
    found = big_modules()
    assert not found, "split these along a seam (one concern a module; keep the import paths others use):\n" + (
        "\n".join(f"  edge/{k}: {v} lines" for k, v in sorted(found.items()))
    )


def test_the_module_walk_sees_a_big_one(tmp_path: Path) -> None:
    """The module check itself: 801 lines are found, 800 are not."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "big.py").write_text("x = 1\n" * 801, encoding="utf-8")
    (tmp_path / "small.py").write_text("x = 1\n" * 800, encoding="utf-8")
    assert big_modules(tmp_path) == {"pkg/big.py": 801}


def test_no_function_over_80_lines_or_10_parameters() -> None:
    found = offenders()
    assert not found, "split these into steps, or take a request/options object:\n" + "\n".join(
        f"  edge/{k}: {v}" for k, v in sorted(found.items())
    )


def test_the_walk_sees_what_it_should() -> None:
    """The check itself: a long function and a long parameter list are found (a walk that saw nothing would pass)."""
    src = "def f(a, b, c, d, e, f, g, h, i, j, k):\n" + "    x = 1\n" * 85
    fn = ast.parse(src).body[0]
    assert isinstance(fn, ast.FunctionDef)
    assert len(_params(fn)) == 11 and fn.end_lineno - fn.lineno + 1 == 86
    method = ast.parse("class C:\n    def m(self, a):\n        pass\n").body[0].body[0]  # type: ignore[attr-defined]
    assert _params(method) == ["a"]
    assert offenders() is not None and any(EDGE.rglob("*.py"))
