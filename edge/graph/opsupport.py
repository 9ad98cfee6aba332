"""What an ONNX converter can express, checked before any heavy conversion starts.

Each converter declares its own limits as data, in its own backend folder (style: capabilities are declared,
not discovered by failing): :meth:`edge.backends.converter.Converter.op_support` returns an :class:`OpSupport`
(``onnx->tflite``: onnx2tf's missing translators and measured limits, ``edge/backends/litert/convert.py``;
``onnx->tensorrt-plan``: TensorRT's parser, ``edge/backends/tensorrt/convert.py``; ``onnx->coreml``: the
ONNX->PyTorch bridge, ``edge/backends/coreml/convert.py``; ``onnx->openvino-ir``: OpenVINO's ONNX frontend,
``edge/backends/openvino/convert.py``). This module holds no per-converter table: it walks a model against the
declaration it is given.

Every offending node is counted at once, in one line, with the way forward: up to three named, past that their
op types with node counts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from edge.errors import ConversionError

DEFAULT_DOMAINS = ("", "ai.onnx")
_RANK_IF = "its branches give outputs of different rank, so the If output has no static rank"


@dataclass(frozen=True)
class OpSupport:
    """What one converter can express, as data."""

    converter: str
    tool: str  # who translates, for the message
    unsupported: frozenset[str] = frozenset()  # default-domain ops it refuses
    supported_only: frozenset[str] | None = None  # when set: the only default-domain ops it takes
    other_domains: frozenset[str] | None = frozenset()  # op types taken from non-default domains (None: all)
    same_rank_if: bool = False  # If branches must give outputs of the same rank
    limits: Mapping[str, Callable[[Any], str | None]] = field(default_factory=dict)  # op -> why this node fails
    descend: bool = True  # check nodes inside subgraphs of ops it takes
    way_forward: str = ""


@dataclass(frozen=True)
class Offence:
    node: str
    op: str  # "If", "com.microsoft.FusedMatMul"
    reason: str  # shared by every node refused for the same cause
    detail: str = ""  # this node's own evidence
    where: tuple[str, ...] = field(default=())  # enclosing node/attribute chain


#: the way forward every converter's message may end with: the ONNX Runtime target runs every ONNX op
CPU_WAY = "choose x86-cpu, whose onnxruntime runs every ONNX op"
#: the way forward where a different-rank If is refused (followed by :data:`CPU_WAY`)
IF_WAY = (
    "re-export the model without those nodes (a different-rank If goes away when its condition is fixed at "
    "export time: one sample rate and static input shapes, with every If whose condition is then constant "
    "inlined, as Silero VAD's examples/openvino/convert.py does), or "
)


def _rank(vi: Any) -> int | None:
    t = vi.type.tensor_type if vi.type.WhichOneof("value") == "tensor_type" else None
    return len(t.shape.dim) if t is not None and t.HasField("shape") else None


def _branch_ranks(node: Any) -> str | None:
    """'output 0: then rank 2, else rank 3' where an If's branches disagree on a known rank, else None."""
    from edge.graph.model import subgraphs

    g = dict(subgraphs(node))
    then, other = g.get("then_branch"), g.get("else_branch")
    if then is None or other is None:
        return None
    bad = []
    for i, (a, b) in enumerate(zip(then.output, other.output)):
        ra, rb = _rank(a), _rank(b)
        if ra is not None and rb is not None and ra != rb:
            bad.append(f"output {i}: then rank {ra}, else rank {rb}")
    return "; ".join(bad) or None


def offences(model: Any, support: OpSupport) -> list[Offence]:
    """Every node (subgraphs included where the converter takes their holder) ``support`` cannot express."""
    from edge.graph.model import node_label, subgraphs

    found: list[Offence] = []

    def visit(graph: Any, where: tuple[str, ...]) -> None:
        for i, n in enumerate(graph.node):
            label = node_label(n, i)
            default = n.domain in DEFAULT_DOMAINS
            op = n.op_type if default else f"{n.domain}.{n.op_type}"
            reason, detail = None, ""
            if not default:
                if support.other_domains is not None and n.op_type not in support.other_domains:
                    reason = f"{support.tool} takes no {n.domain} ops" + (
                        f" but {', '.join(sorted(support.other_domains))}" if support.other_domains else ""
                    )
            elif support.supported_only is not None and n.op_type not in support.supported_only:
                reason = f"not among the ops {support.tool} translates"
            elif n.op_type in support.unsupported:
                reason = f"{support.tool} has no translation for them"
            elif n.op_type in support.limits:
                reason = support.limits[n.op_type](n)
            elif support.same_rank_if and n.op_type == "If":
                detail = _branch_ranks(n) or ""
                if detail:
                    reason = _RANK_IF
            if reason is not None:
                found.append(Offence(label, op, reason, detail, where))
                continue
            if support.descend:
                for attr, g in subgraphs(n):
                    visit(g, (*where, f"{label}/{attr}"))

    visit(model.graph, ())
    return found


def _with_inferred_shapes(model: Any) -> Any:
    """A copy with ONNX's shape inference applied (branch outputs often carry no shape until then); the model
    itself when inference fails: the check then works from the declared shapes."""
    import onnx

    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - inference is evidence here, never a reason to fail
        return model


def targets_using(converter: str, extra_dirs: Iterable[str | os.PathLike[str]] = ()) -> list[str]:
    """Names of the targets whose chain starts with ``converter``."""
    from edge.targets import load_targets

    try:
        profiles = load_targets(extra_dirs)
    except Exception:  # noqa: BLE001 - only used to word a message: a broken profile must not hide the real error
        return []
    return sorted(n for n, p in profiles.items() if p.chain and p.chain[0].converter == converter)


#: up to this many offending nodes a refusal names each; past it, it names op types with their node counts (a line
#: a user reads: Core ML's refusal of a speech model once listed 115 nodes in 12 KB, issue #34 class 5)
NODES_NAMED = 3
#: op types a refusal names, most nodes first; the rest are counted
OPS_NAMED = 4


def _few(ops: list[str]) -> str:
    return ", ".join(ops[:OPS_NAMED]) + (f" and {len(ops) - OPS_NAMED} more" if len(ops) > OPS_NAMED else "")


def _by_op(found: Sequence[Offence]) -> str:
    """'Div (18 nodes, first 'Div.0'), Loop (1 node, 'Loop.0') and 7 more op types (34 nodes)'."""
    counts: dict[str, int] = {}
    first: dict[str, str] = {}  # the first node of each op type, with its own evidence
    for o in found:
        counts[o.op] = counts.get(o.op, 0) + 1
        first.setdefault(o.op, repr(o.node) + (f": {o.detail}" if o.detail else ""))
    ranked = sorted(counts, key=lambda op: (-counts[op], op))
    named = [
        f"{op} ({counts[op]} nodes, first {first[op]})" if counts[op] > 1 else f"{op} (1 node, {first[op]})"
        for op in ranked[:OPS_NAMED]
    ]
    rest = ranked[OPS_NAMED:]
    more = f" and {len(rest)} more op types ({sum(counts[op] for op in rest)} nodes)" if rest else ""
    return ", ".join(named) + more


def message(source: str, who: str, found: Sequence[Offence], support: OpSupport) -> str:
    """One line: the offending nodes (up to :data:`NODES_NAMED`; past that the op types, most nodes first, with their
    counts), each reason once, the way forward."""
    if len(found) <= NODES_NAMED:
        nodes = ", ".join(f"node {o.node!r} ({o.op}{': ' + o.detail if o.detail else ''})" for o in found)
    else:
        nodes = _by_op(found)
    by_reason: dict[str, list[str]] = {}  # each reason once, after the ops it applies to
    for o in found:
        ops = by_reason.setdefault(o.reason, [])
        if o.op not in ops:
            ops.append(o.op)
    nested = sum(1 for o in found if o.where)
    inside = f" ({nested} inside If/Loop/Scan subgraphs)" if nested else ""
    reasons = "; ".join(f"{_few(sorted(ops))}: {reason}" for reason, ops in by_reason.items())
    return (
        f"{source}: {who} cannot express {len(found)} node{'s' if len(found) != 1 else ''}{inside}: {nodes} — {reasons}"
    )


def check_ops(
    model: Any, support: OpSupport | None, *, source: str | os.PathLike[str] | None = None, target: str | None = None
) -> None:
    """Raise :class:`ConversionError` naming every node a converter cannot express; nothing where it declares no
    limits (``support`` None). ``support``: the converter's :meth:`~edge.backends.converter.Converter.op_support`;
    ``model``: a ModelProto or a path."""
    if support is None:
        return
    converter = support.converter
    if isinstance(model, (str, os.PathLike)):
        from edge.graph.model import load_onnx

        source = source or model
        model = load_onnx(model)
    found = offences(_with_inferred_shapes(model) if support.same_rank_if else model, support)
    if not found:
        return
    if target:
        who = f"target {target} ({converter}, {support.tool})"
    else:
        users = targets_using(converter)
        who = (
            f"target{'s' if len(users) > 1 else ''} {', '.join(users)} " if users else ""
        ) + f"({converter}, {support.tool})"
    name = Path(source).name if source else "the model"
    raise ConversionError(message(name, who, found, support), hint=support.way_forward)
