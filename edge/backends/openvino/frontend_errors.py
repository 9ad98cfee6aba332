"""OpenVINO's ONNX frontend failures as one line: the op, the node, and what would take it.

``ov.convert_model`` reports an op it cannot convert as its own internals, e.g. ``Check 'false' failed at
src/frontends/common_translators/src/unconverted_ops_report.cpp:151: ... -- Loop-17 with a message: ...
While validating ONNX node '<Node(Loop): y>': Check 'ng_inputs.size() >= control_inputs_count' failed at
src/frontends/onnx/frontend/src/op/loop.cpp:263: ... Expecting at least two canonical inputs for Loop op`` or
``-- No conversion rule found for operations: Det-17``. This module reads those two report forms back into
(op, node, reason), names the node as the ONNX graph does, and says whether ONNX Runtime's CPU kernels take
the op (``--target x86-cpu``). Anything else is passed on as OpenVINO said it, shortened.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from edge.errors import ConversionError

SHOWN = 3  # ops named in one refusal; the rest are counted
_NO_RULE = re.compile(r"No conversion rule found for operations: ([^\n]+)")
_FAILED = re.compile(r"^-- (\w+)-\d+ with a message:\n(.*?)(?=^-- |^Summary:|\Z)", re.S | re.M)
_NODE = re.compile(r"ONNX node '<Node\(\w+\): ([^>]*)>'")
_CHECK = re.compile(
    r"(Check '.*?' failed at \S+:\d+:|FrontEnd API failed with \w+:|\[ONNX Frontend\][^\n]*|While validating[^\n]*)"
)


@dataclass(frozen=True)
class FailedOp:
    op: str
    output: str | None  # the first output of the node OpenVINO names, when it names one
    reason: str


def parse_frontend_failure(message: str) -> list[FailedOp]:
    """The ops OpenVINO's ONNX frontend reported as not converted, with its reason (empty when it gave none)."""
    failed: list[FailedOp] = []
    for op, body in _FAILED.findall(message):
        node = _NODE.search(body)
        reason = " ".join(_CHECK.sub(" ", body).split()).strip(" .:")
        failed.append(FailedOp(op, node.group(1).split(",")[0].strip() if node else None, reason))
    no_rule = _NO_RULE.search(message)
    if no_rule:
        for item in no_rule.group(1).split(","):
            op = re.sub(r"-\d+$", "", item.strip())
            if op and all(f.op != op for f in failed):
                failed.append(FailedOp(op, None, "its ONNX frontend has no conversion rule for it"))
    return failed


def _walk(graph: Any) -> Iterator[Any]:
    """Every node, subgraphs (Loop/If/Scan bodies) included: the frontend names nodes inside them too."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _walk(sub)


def _node_names(source: Path, failed: list[FailedOp]) -> dict[FailedOp, list[str]]:
    """Each failed op's ONNX node names: the node that writes its output when OpenVINO named one, else every
    node of that op type (subgraphs included)."""
    import onnx

    try:
        model = onnx.load(str(source), load_external_data=False)
    except Exception:  # noqa: BLE001 - the names only sharpen the message
        return {}
    names: dict[FailedOp, list[str]] = {}
    for f in failed:
        names[f] = [
            node.name or f"{node.op_type} -> {node.output[0] if node.output else '?'}"
            for node in _walk(model.graph)
            if node.op_type == f.op and (f.output is None or f.output in node.output)
        ]
    return names


def onnxruntime_takes(ops: list[str]) -> bool:
    """Whether this host's ONNX Runtime has CPU kernels for every op (default ONNX domain)."""
    try:
        import onnxruntime.capi._pybind_state as ort_state
    except ImportError:
        return False
    kernels = {
        k.op_name
        for k in ort_state.get_all_opkernel_def()
        if k.provider == "CPUExecutionProvider" and k.domain in ("", "ai.onnx")
    }
    return all(op in kernels for op in ops)


def frontend_error(message: str, source: Path, version: str) -> ConversionError:
    """One line for an ``ov.convert_model`` failure on ``source`` (an ONNX file): what OpenVINO ``version`` could
    not convert, which node, why in its words; the hint says what takes the op instead."""
    failed = parse_frontend_failure(message)
    if not failed:
        first = next((ln.strip() for ln in message.splitlines() if ln.strip() and not _CHECK.fullmatch(ln.strip())), "")
        return ConversionError(f"OpenVINO {version} could not convert {source}: {first[:300] or message[:300]}")
    names = _node_names(source, failed)
    parts = []
    for f in failed[:SHOWN]:
        nodes = names.get(f) or []
        where = f"node {nodes[0]!r}" + (f" and {len(nodes) - 1} more" if len(nodes) > 1 else "") if nodes else "a node"
        parts.append(f"{where} ({f.op}: {f.reason[:200] or 'its translation failed'})")
    more = f"; {len(failed) - SHOWN} more op(s)" if len(failed) > SHOWN else ""
    ops = sorted({f.op for f in failed})
    takes = f"ONNX Runtime implements {', '.join(ops)}: try --target x86-cpu; " if onnxruntime_takes(ops) else ""
    return ConversionError(
        f"OpenVINO {version} cannot convert " + "; ".join(parts) + more,
        hint=f"{takes}or replace {', '.join(ops)} in the model before exporting it",
    )
