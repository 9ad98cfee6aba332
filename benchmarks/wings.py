"""How the wings of ``edge/`` depend on each other, at one or more git revisions.

    python benchmarks/wings.py --rev 6ef2959 --rev HEAD

For each revision: the wings caught in a circle (every import counted, function-level and TYPE_CHECKING
included), how many simple circles run through them, the same with ``edge/backends`` counted as one folder
(its device side and its converters apart or not), and the modules over 800 lines. Reads the sources with
``git show``; imports nothing of edge.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.imports import import_graph, simple_circles, sources_at, strongly_connected, wing_graph  # noqa: E402


def report(rev: str) -> dict[str, object]:
    sources = sources_at(rev)
    graph = import_graph(sources)
    out: dict[str, object] = {"rev": rev}
    for label, by_role in (("by role", True), ("by folder", False)):
        wings = wing_graph(graph, by_role=by_role)
        caught = sorted({w for comp in strongly_connected(wings) for w in comp})
        out[label] = {"wings": len(wings), "in circles": caught, "simple circles": simple_circles(wings)}
    out["module circles"] = len(strongly_connected({m: {t for t, _, _ in d} for m, d in graph.items()}))
    out["modules over 800 lines"] = sorted(f"{m} ({n})" for m, text in sources.items() if (n := text.count("\n")) > 800)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rev", action="append", default=[], help="git revision (repeat); default HEAD")
    for rev in p.parse_args().rev or ["HEAD"]:
        r = report(rev)
        print(f"{r['rev']}:")
        for label in ("by role", "by folder"):
            d = r[label]
            assert isinstance(d, dict)
            print(
                f"  wings {label}: {d['wings']}, {len(d['in circles'])} in circles, {d['simple circles']} simple circles"
                + (f" ({', '.join(d['in circles'])})" if d["in circles"] else "")
            )
        print(f"  module-level circles: {r['module circles']}")
        big = r["modules over 800 lines"]
        assert isinstance(big, list)
        print(f"  modules over 800 lines: {len(big)} {', '.join(big)}")


if __name__ == "__main__":
    main()
