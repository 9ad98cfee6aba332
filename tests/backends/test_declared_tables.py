"""The backends' own declarations give exactly what the central tables they replaced gave (issue #31 item 2).

``declared_before.json`` was captured from the central tables (``edge.graph.opsupport.rules()``) before each
declaration moved into its backend's folder. A declaration changed on purpose updates that file in the same
commit, saying why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edge.backends.converter import CONVERTERS
from edge.graph.opsupport import OpSupport

BEFORE = json.loads((Path(__file__).parent / "declared_before.json").read_text(encoding="utf-8"))


def _ops(s: OpSupport) -> dict[str, Any]:
    return {
        "converter": s.converter,
        "tool": s.tool,
        "unsupported": sorted(s.unsupported),
        "supported_only": None if s.supported_only is None else sorted(s.supported_only),
        "other_domains": None if s.other_domains is None else sorted(s.other_domains),
        "same_rank_if": s.same_rank_if,
        "limits": sorted(s.limits),
        "descend": s.descend,
        "way_forward": s.way_forward,
    }


def test_op_support_is_declared_by_each_converter_as_the_central_table_had_it() -> None:
    declared = {}
    for name in CONVERTERS.names():
        support = CONVERTERS.get(name).op_support()
        if support is not None:
            assert support.converter == name  # the declaration names the converter that holds it
            declared[name] = _ops(support)
    assert declared == BEFORE["opsupport"]
