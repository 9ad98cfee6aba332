"""What each ONNX converter can express, checked before any heavy conversion starts.

Declared as data per converter (style: capabilities are declared, not discovered by failing),
from reading each converter:

==========================  ==================================================================
converter                   what it refuses up front
==========================  ==================================================================
``onnx->tflite``            ops onnx2tf 1.29.24 has no translator for (its ``onnx2tf/ops``
                            against ONNX 1.23's operator set); non-default domains except the
                            contrib ops it translates; ``If`` whose branches give outputs of
                            different rank (onnx2tf builds both branches and joins them with
                            ``keras.backend.switch``: PINTO0309/onnx2tf#782, the Silero VAD case);
                            Loop, Scan and LSTM forms its translators fail on with the pinned
                            TensorFlow 2.19 (measured, see ``_ONNX2TF_LIMITS``)
``onnx->tensorrt-plan``     :data:`edge.backends.tensorrt.format.TRT_UNSUPPORTED_OPS`,
                            non-default domains, and ``If`` with branch outputs of different
                            rank (onnx-tensorrt docs/operators.md: "output tensors of the two
                            conditional branches must have broadcastable shapes")
``onnx->coreml``            every op outside the ONNX->PyTorch bridge's ``SUPPORTED`` list
                            (``edge/toolchains/coreml_bridge.py``, read from its source: it
                            imports torch): control flow and recurrent ops included
``onnx->openvino-ir``       ``If`` with branch outputs of different rank: the If output gets a
                            dynamic rank, which OpenVINO 2026.4's ONNX frontend refuses before a
                            Conv (Silero VAD) and its CPU plug-in refuses outright ("If operation
                            with dynamic rank", the graph in tests/graph/test_graphs.py). If itself is
                            not the limit (the GPU plug-in has a condition primitive,
                            openvinotoolkit/openvino#18043): the frontend does not fold a
                            condition computed from shapes, so Silero VAD fails the same way with
                            static input/state and ``sr`` frozen to 16000 (measured, 2026.4.1);
                            the frontend fix, openvinotoolkit/openvino#32677, was closed unmerged.
                            What works is inlining every If at one sample rate and static shapes
                            (snakers4/silero-vad#779's examples/openvino): OpenVINO CPU fp32 then
                            matches onnxruntime (max abs 7.7e-8, 32 chained steps; measured)
==========================  ==================================================================

Every offending node is listed at once, in one line, with the way forward.
"""

from __future__ import annotations

import ast
import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from edge.backends.tensorrt.format import TRT_UNSUPPORTED_OPS
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


# ONNX 1.23 default-domain ops with no onnx2tf/ops/<Op>.py in onnx2tf 1.29.24 (the pinned toolchain)
_ONNX2TF_MISSING = frozenset(
    {"BitCast", "CastLike", "CausalConvWithState", "LinearAttention", "SequenceMap", "SwiGLU", "Swish"}
)
# contrib (com.microsoft) op types onnx2tf 1.29.24 translates
_ONNX2TF_CONTRIB = frozenset(
    {
        "FusedConv",
        "Gelu",
        "GroupNorm",
        "Inverse",
        "QLinearAdd",
        "QLinearConcat",
        "QLinearLeakyRelu",
        "QLinearMul",
        "QLinearSigmoid",
        "QLinearSoftmax",
        "ScaleAndTranslate",
    }
)


def _input_given(node: Any, index: int) -> bool:
    return len(node.input) > index and node.input[index] != ""


def _onnx2tf_lstm(node: Any) -> str | None:
    state = _input_given(node, 5) or _input_given(node, 6)
    if _input_given(node, 3) and not state:
        return None
    from edge.graph.lower import lstm_lowerable

    why = lstm_lowerable(node)
    if why is None:
        return None  # the converter unrolls it into plain ops first (edge.graph.lower.lower_lstm)
    fails = (
        "mistranslates an LSTM given its state initial_h/initial_c (a Reshape fails)"
        if state
        else "needs the bias input B (KeyError on an omitted one)"
    )
    return f"onnx2tf 1.29.24 {fails}, and edgekit lowers only the default LSTM form to plain ops (this one has {why})"


# Measured with the pinned toolchain (onnx2tf 1.29.24, TensorFlow 2.19, tf_keras) on the graphs built in
# tests/graph/test_graphs.py: its Loop and Scan translators fail under TF2 graph mode; its LSTM fails on an omitted
# bias and on an LSTM given its state (a streaming model's h0/c0).
_ONNX2TF_LIMITS: Mapping[str, Callable[[Any], str | None]] = {
    "Loop": lambda n: (
        "onnx2tf 1.29.24's while_loop translation fails under TensorFlow 2.19 (graph-mode TensorArray, NotImplementedError)"
    ),
    "Scan": lambda n: (
        "onnx2tf 1.29.24's translation fails under TensorFlow 2.19 (TensorArray size from a KerasTensor, TypeError)"
    ),
    "LSTM": _onnx2tf_lstm,
}
_CPU_WAY = "choose x86-cpu, whose onnxruntime runs every ONNX op"
_IF_WAY = (
    "re-export the model without those nodes (a different-rank If goes away when its condition is fixed at "
    "export time: one sample rate and static input shapes, with every If whose condition is then constant "
    "inlined, as Silero VAD's examples/openvino/convert.py does), or "
)


def _coreml_bridge_ops() -> frozenset[str]:
    """``SUPPORTED + STRUCTURAL`` of the Core ML bridge, read from its source (importing it needs torch)."""
    src = Path(__file__).resolve().parents[1] / "toolchains" / "coreml_bridge.py"
    values: dict[str, tuple[str, ...]] = {}
    for node in ast.parse(src.read_text(encoding="utf-8")).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in ("SUPPORTED", "STRUCTURAL")
        ):
            values[node.targets[0].id] = tuple(ast.literal_eval(node.value))
    return frozenset(values.get("SUPPORTED", ()) + values.get("STRUCTURAL", ()))


@functools.cache
def rules() -> Mapping[str, OpSupport]:
    return {
        "onnx->tflite": OpSupport(
            "onnx->tflite",
            "onnx2tf 1.29.24",
            unsupported=_ONNX2TF_MISSING,
            other_domains=_ONNX2TF_CONTRIB,
            same_rank_if=True,
            limits=_ONNX2TF_LIMITS,
            way_forward=_IF_WAY + _CPU_WAY,
        ),
        "onnx->tensorrt-plan": OpSupport(
            "onnx->tensorrt-plan",
            "TensorRT's ONNX parser",
            unsupported=frozenset(TRT_UNSUPPORTED_OPS),
            same_rank_if=True,
            way_forward=_IF_WAY + _CPU_WAY,
        ),
        "onnx->coreml": OpSupport(
            "onnx->coreml",
            "edgekit's ONNX->PyTorch bridge",
            supported_only=_coreml_bridge_ops(),
            descend=False,
            way_forward="bring the PyTorch model (TorchScript or torch.export .pt2: coremltools converts control "
            f"flow and recurrent layers from it), or {_CPU_WAY}",
        ),
        "onnx->openvino-ir": OpSupport(
            "onnx->openvino-ir",
            "OpenVINO's ONNX frontend",
            other_domains=None,
            same_rank_if=True,
            way_forward=_IF_WAY + _CPU_WAY,
        ),
    }


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


def message(source: str, who: str, found: Sequence[Offence], support: OpSupport) -> str:
    """One line: every offending node and op, each reason once, the way forward."""
    nodes = ", ".join(f"node {o.node!r} ({o.op}{': ' + o.detail if o.detail else ''})" for o in found)
    by_reason: dict[str, list[str]] = {}  # each reason once, after the ops it applies to
    for o in found:
        ops = by_reason.setdefault(o.reason, [])
        if o.op not in ops:
            ops.append(o.op)
    nested = sum(1 for o in found if o.where)
    inside = f" ({nested} inside If/Loop/Scan subgraphs)" if nested else ""
    reasons = "; ".join(f"{', '.join(sorted(ops))}: {reason}" for reason, ops in by_reason.items())
    return (
        f"{source}: {who} cannot express {len(found)} node{'s' if len(found) != 1 else ''}{inside}: {nodes} — {reasons}"
    )


def check_ops(
    model: Any, converter: str, *, source: str | os.PathLike[str] | None = None, target: str | None = None
) -> None:
    """Raise :class:`ConversionError` naming every node ``converter`` cannot express; nothing for converters
    without declared limits. ``model``: a ModelProto or a path."""
    support = rules().get(converter)
    if support is None:
        return
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


def check_target(model: Any, profile: Any, *, source: str | os.PathLike[str] | None = None) -> None:
    """The pipeline's up-front check: the first converter of ``profile``'s chain (the one that reads ONNX)."""
    if profile.chain:
        check_ops(model, profile.chain[0].converter, source=source, target=profile.name)
