"""The backends' own declarations give exactly what the central tables they replaced gave (issue #31 item 2).

``declared_before.json`` was captured from the central tables (``edge.graph.opsupport.rules()``;
``edge.tune.space.SPACES``, ``CPU_RUNNERS`` and ``option_conflict``) before each declaration moved into its
backend's folder; the cross-option rules are compared through every combination of the values tried, on 1, 2 and
8 CPUs (their messages hashed). A declaration changed on purpose updates that file in the same
commit, saying why.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from typing import Any

from edge.backends.converter import CONVERTERS
from edge.backends.openvino.format import STREAMS
from edge.backends.runner import RUNNERS
from edge.graph.opsupport import OpSupport
from edge.tune.space import THREADS, cpu_runners, option_conflict, runner_space

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


def _conflicts(runner: str, options: dict[str, tuple[Any, ...]]) -> dict[str, str]:
    found = {}
    keys = list(options)
    for cpus in (1, 2, 8):
        for vals in itertools.product(*[options[k] for k in keys]):
            opts = {k: v for k, v in zip(keys, vals) if not (k == "num_streams" and v == 0)}
            why = option_conflict(runner, opts, cpus)
            if why is not None:
                found[f"{cpus}|{json.dumps(sorted(opts.items()))}"] = why
    return found


def test_each_runner_declares_the_search_space_the_central_table_had() -> None:
    spaces = {}
    for name in RUNNERS.names():
        rs = runner_space(name)
        if rs is None:
            continue
        conflicts = _conflicts(name, rs.options)
        spaces[name] = {
            "converter": rs.converter,
            "home": rs.home,
            "options": {k: list(v) for k, v in rs.options.items()},
            "option_order": list(rs.options),
            "recipes": {p: {k: list(v) for k, v in r.items()} for p, r in rs.recipes.items()},
            "threads_option": rs.threads_option,
            "conflicts_count": len(conflicts),
            "conflicts_sha256": hashlib.sha256(json.dumps(conflicts, sort_keys=True).encode()).hexdigest(),
        }
    got = {
        "spaces": spaces,
        "cpu_runners": {"x86_64": list(cpu_runners("x86_64"))},
        "streams": list(STREAMS),
        "threads": list(THREADS),
    }
    assert got == BEFORE["tune"]
    assert cpu_runners("aarch64") == ()  # as before: an ARM CPU target is served by its own runner only
