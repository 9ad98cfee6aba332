"""Where did it diverge? On a parity failure of an ONNX -> ONNX or ONNX -> OpenVINO IR conversion, the first node
of the source graph whose output, under the same name in the converted graph, differs beyond tolerance (issue #23,
class 4). ONNX -> TFLite (onnx2tf) is located by onnx2tf's per-node check with the same tolerances
(``edge.backends.litert.convert.locate_divergence``).

The source runs in onnxruntime's CPU provider, the converted graph there too (ONNX) or in OpenVINO's CPU plugin in
f32 (IR: OpenVINO keeps the ONNX tensor names), each with the shared intermediate tensors exposed as outputs
(``edge.graph.recipes.onnx_infer``, ``Model.add_outputs``), on a few of the parity samples; tensors are compared in the source's node
order (ONNX keeps nodes topologically sorted), so the first one that differs is where the difference starts,
not where it shows. A converted graph that renamed every tensor (no shared names) gives no answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

#: a tensor diverges when its error passes this share of the source tensor's range, or its cosine falls below
REL_TOLERANCE = 0.02
MIN_COSINE = 0.999
#: the most samples and intermediate tensors compared (one exposed session each side)
MAX_SAMPLES = 4
MAX_TENSORS = 2048


@dataclass(frozen=True)
class Divergence:
    """The first source node whose output differs in the converted graph, and by how much."""

    node: str
    op: str
    tensor: str
    cosine: float | None  # None: the converted tensor has another size (``note`` says which)
    rel_err: float | None  # max abs error / the source tensor's range
    compared: int  # tensors compared up to and including this one
    note: str = ""  # what compared it, a size that differs

    def describe(self) -> str:
        if self.cosine is None or self.rel_err is None:
            how = self.note
        else:
            how = f"cosine {self.cosine:.4f}, max error {self.rel_err:.1%} of its range"
        return (
            f"first diverging node: {self.node} ({self.op}), output {self.tensor!r}: {how} "
            f"({self.compared} shared tensors compared{'; ' + self.note if self.note and how != self.note else ''})"
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "node": self.node,
            "op": self.op,
            "tensor": self.tensor,
            "cosine": None if self.cosine is None else round(self.cosine, 6),
            "rel_err": None if self.rel_err is None else round(self.rel_err, 6),
            "compared": self.compared,
        }
        if self.note:
            data["note"] = self.note
        return data


def first_divergence(source: Path, candidate: Path, samples: Sequence[Mapping[str, np.ndarray]]) -> Divergence | None:
    """The first diverging node between two ONNX files on ``samples`` (at most :data:`MAX_SAMPLES`), or None when
    every shared tensor agrees (the difference is in tensors the conversion renamed) or nothing is shared."""
    from edge.graph import recipes
    from edge.graph.model import load_onnx

    src = load_onnx(source)
    ir = Path(candidate).suffix == ".xml"
    if ir:
        cand_model = _read_ir(candidate)
        produced = {n for op in cand_model.get_ops() for out in op.outputs() for n in out.get_names()}
    else:
        cand = load_onnx(candidate)
        produced = {o for n in cand.graph.node for o in n.output}
    order: list[tuple[str, str, str]] = []  # (tensor, node, op) in the source's node order
    for i, n in enumerate(src.graph.node):
        for o in n.output:
            if o and o in produced:
                order.append((o, n.name or f"node {i}", n.op_type))
    order = order[:MAX_TENSORS]
    if not order:
        return None
    names = [t for t, _, _ in order]
    feeds = list(samples[:MAX_SAMPLES])
    ref = recipes.onnx_infer(src)(feeds, names)
    got = _ir_infer(cand_model, feeds, names) if ir else recipes.onnx_infer(cand)(feeds, names)
    for k, (tensor, node, op) in enumerate(order, 1):
        pairs = [(r[tensor], g[tensor]) for r, g in zip(ref, got) if tensor in r and tensor in g]
        if not pairs or any(np.shape(a) != np.shape(b) for a, b in pairs):
            continue
        a = np.concatenate([np.asarray(p[0], np.float64).ravel() for p in pairs])
        b = np.concatenate([np.asarray(p[1], np.float64).ravel() for p in pairs])
        span = float(a.max() - a.min()) if a.size else 0.0
        err = float(np.abs(a - b).max()) if a.size else 0.0
        rel = err / span if span > 0 else (0.0 if err == 0 else math.inf)
        den = float(np.linalg.norm(a) * np.linalg.norm(b))
        cos = float(a @ b) / den if den > 0 else (1.0 if err == 0 else 0.0)
        if not np.isfinite(b).all() or rel > REL_TOLERANCE or cos < MIN_COSINE:
            return Divergence(node, op, tensor, cos, rel, k)
    return None


def _read_ir(path: Path) -> Any:
    from edge.backends.openvino.format import disable_openvino_telemetry, ov_core

    disable_openvino_telemetry()
    return ov_core().read_model(str(path))


def _ir_infer(
    model: Any, samples: Sequence[Mapping[str, np.ndarray]], names: Sequence[str]
) -> list[dict[str, np.ndarray]]:
    """The IR's values of ``names`` on ``samples`` (OpenVINO CPU, f32, no run-time activation quantization)."""
    from edge.backends.openvino.format import ov_core

    outputs = model.add_outputs(list(names))
    compiled = ov_core().compile_model(
        model, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}
    )
    found = []
    for s in samples:
        result = compiled(dict(s))
        row = {}
        for port in outputs:
            name = next((n for n in port.get_names() if n in names), None)
            if name is not None:
                row[name] = np.asarray(result[compiled.output(port.get_any_name())])
        found.append(row)
    return found
