"""What an onnxruntime bundle takes, read by both sides: the runner's options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping

from edge.backends.options import RESERVE_CPUS_DOC, THREAD_SEARCH, THREADS
from edge.backends.tuning import TuneSpace
from edge.base.typedjson import Rule, spec


@dataclass(frozen=True)
class OnnxRuntimeOptions:
    """onnxruntime's session options edgekit sets (declared once: ``edge.backends.options``)."""

    providers: tuple[str, ...] = spec(
        (),
        min_items=1,
        max_items=8,
        item=Rule(pattern=r"^[A-Za-z0-9]{1,48}ExecutionProvider$"),
        doc="execution providers in order of preference (default [CPUExecutionProvider])",
    )
    intra_op_num_threads: int = spec(
        0,
        **THREADS,
        search=THREAD_SEARCH,
        doc="threads inside an op; 0 (default) = edgekit's choice: the CPUs "
        "that other processes and reserve_cpus leave (edge.backends.threads, "
        "docs/performance.md)",
    )
    reserve_cpus: float = spec(0.0, ge=0, le=4096, doc=RESERVE_CPUS_DOC)
    graph_optimization_level: Literal["disable", "basic", "extended", "all"] = spec(
        "all", search=("all", "extended", "basic"), doc="disable, basic, extended or all (default all)"
    )
    x64_quant_precision: bool | Literal["auto"] = spec(
        "auto",
        doc="int8 on x86: compute U8U8 instead of U8S8 (onnxruntime's session.x64quantprecision); "
        'true, false or "auto" (default): U8U8 only on CPUs without VNNI/AMX, whose U8S8 int16 pair '
        "sums saturate; with an int8 dot product U8S8 is exact and U8U8 only slower (1.3-1.8x)",
    )
    execution_mode: Literal["sequential", "parallel"] = spec(
        "sequential",
        search=("sequential", "parallel"),
        doc="sequential (default) or parallel: run independent branches of the graph at once "
        "(onnxruntime's ORT_PARALLEL; helps models with many branches, can hurt others)",
    )
    inter_op_num_threads: int = spec(
        0,
        **THREADS,
        search=(0, 2),
        doc="threads running nodes in parallel (execution_mode parallel only); 0 = onnxruntime's default",
    )
    allow_spinning: bool | None = spec(
        None,
        search=(True, False),
        doc="thread-pool threads busy-wait for work between ops (true: lower latency on an idle machine) or "
        "sleep (false: the core goes back to the rest of the device); unset (default): edgekit's choice, "
        "onnxruntime's own (on) where nothing else shares the CPUs, off where something does; "
        "session.intra_op/inter_op.allow_spinning",
    )
    load_recheck_s: float = spec(
        2.0,
        ge=0,
        le=3600,
        doc="seconds between two looks at the CPU load while the runner runs, where threads or spin-wait are "
        "edgekit's choice: when the choice changes (the device turned busy or idle), the session is opened "
        "again with it (bounded: at most 1% of the time); 0 = decide once, when opened",
    )

    def invalid(self) -> tuple[str, str] | None:
        """(option, problem) where options disagree with each other, else None."""
        if self.inter_op_num_threads and self.execution_mode != "parallel":
            return "inter_op_num_threads", (
                'applies only with execution_mode "parallel" (a sequential session runs one node at a time)'
            )
        return None


# -- what edgekit tune searches (edge.backends.tuning) ------------------------------------------


def tune_conflict(opts: Mapping[str, Any], cpus: int) -> str | None:
    """Combinations that cannot run or cannot differ from another one here (Olive's OrtSessionParamsTuning prunes
    the same way)."""
    mode, inter = opts.get("execution_mode", "sequential"), opts.get("inter_op_num_threads", 0)
    intra, spin = opts.get("intra_op_num_threads", 0), opts.get("allow_spinning", True)
    if inter and mode != "parallel":
        return (
            "onnxruntime inter_op_num_threads with execution_mode=sequential: a sequential session runs one node "
            "at a time (no inter-op threads)"
        )
    if mode == "parallel" and intra == 1:
        return (
            "onnxruntime execution_mode=parallel with intra_op_num_threads=1: one thread was asked for, and "
            "parallel mode adds an inter-op pool of its own"
        )
    if inter > cpus:
        return f"onnxruntime inter_op_num_threads={inter}: more threads than the {cpus} CPUs this process may use"
    if spin is False and intra == 1 and mode == "sequential":
        return "onnxruntime allow_spinning=false with one thread, sequential: there is no thread pool to spin, the same as allow_spinning=true"
    return None


TUNE_SPACE = TuneSpace(
    OnnxRuntimeOptions,
    "onnx->onnx",
    "x86-cpu",
    threads_option="intra_op_num_threads",
    recipes={"fp16": {"mixed_precision": ("auto", "off")}, "int8": {"mixed_precision": ("auto", "off")}},
    cpu_archs=("x86_64",),
    conflict=tune_conflict,
    labels={
        "intra_op_num_threads": "threads",
        "graph_optimization_level": "graph",
        "mixed_precision": "mixed",
        "execution_mode": "mode",
        "inter_op_num_threads": "inter",
        "allow_spinning": "spin",
    },
    budget_vary=("allow_spinning",),  # spin-wait: the deploy's budget search tries it with the thread count
)
