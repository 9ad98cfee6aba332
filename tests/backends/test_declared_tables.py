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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import pytest

from edge.backends.converter import CONVERTERS, Converter
from edge.backends.openvino.format import STREAMS
from edge.backends.runner import RUNNERS, Runner
from edge.backends.tuning import TuneSpace
from edge.base.typedjson import spec
from edge.errors import ConversionError
from edge.graph.opsupport import OpSupport, check_ops
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


# -- a new runtime: its own classes and one registration reach the tuner, the precision trial and the op check --


@dataclass(frozen=True)
class _PluginOptions:
    threads: int = spec(0, ge=0, le=64, search=(1, 2), doc="threads")
    fused: bool = spec(True, search=(True, False), doc="fused kernels")


def _plugin_conflict(opts: Mapping[str, Any], cpus: int) -> str | None:
    return (
        "plugin-cpu fused=false with one thread: the same kernels" if opts == {"threads": 1, "fused": False} else None
    )


class _PluginRunner(Runner):
    name = "plugin-cpu"
    formats = ("onnx",)
    options_class = _PluginOptions
    fast_cpu_precision = "bf16"
    tune_space = TuneSpace(
        _PluginOptions,
        "onnx->onnx",
        "x86-cpu",
        threads_option="threads",
        cpu_archs=("x86_64",),
        conflict=_plugin_conflict,
    )

    def infer(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        return {}


class _PluginConverter(Converter):
    name = "onnx->plugin"
    source_format = "onnx"
    target_format = "onnx"
    precisions = frozenset({"fp32"})

    @classmethod
    def op_support(cls) -> OpSupport:
        return OpSupport(cls.name, "the plugin's compiler", unsupported=frozenset({"Relu"}), way_forward="no Relu")

    def convert(self, request: Any) -> Any:
        raise NotImplementedError


def test_a_registered_runtime_is_read_from_its_own_declarations() -> None:
    """No shared module is edited: the runner's and converter's classes plus their registration are enough."""
    import onnx.helper as h

    from edge.pipeline.precision_trial import trial_wanted

    RUNNERS.register(_PluginRunner)
    CONVERTERS.register(_PluginConverter)
    try:
        assert cpu_runners("x86_64") == ("onnxruntime", "openvino", "plugin-cpu")
        assert runner_space("plugin-cpu") is _PluginRunner.tune_space
        assert option_conflict("plugin-cpu", {"threads": 1, "fused": False}, 8) is not None
        assert option_conflict("plugin-cpu", {"threads": 2, "fused": False}, 8) is None
        assert trial_wanted("plugin-cpu", {}, "fp32", True) is None  # it declares a fast CPU precision
        model = h.make_model(
            h.make_graph(
                [h.make_node("Relu", ["x"], ["y"], name="r")],
                "g",
                [h.make_tensor_value_info("x", 1, [1])],
                [h.make_tensor_value_info("y", 1, [1])],
            )
        )
        with pytest.raises(ConversionError, match=r"node 'r' \(Relu\)"):
            check_ops(model, CONVERTERS.get("onnx->plugin").op_support())
    finally:
        RUNNERS.unregister("plugin-cpu")
        CONVERTERS.unregister("onnx->plugin")
