"""Comparing ONNX's tensors with TensorFlow's across layouts, for the ``tflite`` toolchain's driver
(``tflite_driver.py``): which axis permutation maps one onto the other, and where onnx2tf's translation first
diverges from the ONNX graph (issue #23, class 4).

Like the driver it runs inside the toolchain environment and must not import ``edge``: the standard library,
numpy and onnx only (imported where used).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def candidate_perms(onnx_shape: list[int], tf_shape: list[int]) -> list[list[int]]:
    """Permutations p with onnx.transpose(p).shape == tf shape: identity and channels-last, else (rank <= 4) any."""
    r = len(onnx_shape)
    cands = [list(range(r))]
    if r >= 3:
        cands.append([0, *range(2, r), 1])
    found = [p for p in cands if len(tf_shape) == r and [onnx_shape[i] for i in p] == list(tf_shape)]
    if found or len(tf_shape) != r or r > 4:
        return found
    # onnx2tf moved a non-image tensor's axes some other way (Silero VAD's state [2, 1, 128] came out [1, 2, 128]):
    # any permutation giving that shape; several are told apart on a sample like the two above
    import itertools

    return [list(p) for p in itertools.permutations(range(r)) if [onnx_shape[i] for i in p] == list(tf_shape)]


def cosine(a: Any, b: Any) -> float:
    import numpy as np

    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return 1.0 if na == nb == 0 else float(a @ b / (na * nb + 1e-30))


# -- where the translation diverges (issue #23, class 4) ------------------------------------------------

#: ONNX element types compared: float tensors only (onnx2tf keeps shape vectors and indices in its own layout's order)
_FLOAT_TYPES = frozenset({1, 10, 11, 16})  # FLOAT, FLOAT16, DOUBLE, BFLOAT16


def _aligned(a: Any, b: Any) -> tuple[Any, str]:
    """``b`` (TensorFlow's tensor) in ``a``'s (ONNX's) layout: the permutation that gives ``a``'s shape and matches it
    best (identity, channels-last, else any at rank <= 4; size-1 axes ignored), or (None, why) when no
    permutation gives ``a``'s shape."""
    import numpy as np

    a, b = np.asarray(a), np.asarray(b)
    if a.size != b.size:
        return None, f"TensorFlow computes shape {list(b.shape)} where ONNX has {list(a.shape)}"
    sa = [d for d in a.shape if d != 1]
    bs = b.reshape([d for d in b.shape if d != 1])
    perms = candidate_perms(list(bs.shape), sa)
    if not perms:
        return None, f"TensorFlow's shape {list(b.shape)} is no permutation of ONNX's {list(a.shape)}"
    best = max(perms, key=lambda p: cosine(bs.transpose(p), a))
    return bs.transpose(best).reshape(a.shape), ""


def _verdict(a: Any, b: Any, rel_tolerance: float, min_cosine: float, abs_floor: float) -> dict[str, Any] | None:
    """How TensorFlow's ``b`` differs from ONNX's ``a``: ``{"diverges": bool, "cosine", "rel_err", "note"}``, or None
    when they cannot be compared (the same size in a layout no permutation undoes). It diverges beyond
    ``rel_tolerance`` of ``a``'s range or below ``min_cosine`` by more than ``abs_floor`` (rounding noise, as in
    x - mean(x) over equal values, has any cosine), when not finite, or at another size."""
    import numpy as np

    b_in_a, why = _aligned(a, b)
    if b_in_a is None:
        return None if a.size == b.size else {"diverges": True, "cosine": None, "rel_err": None, "note": why}
    a64, b64 = a.astype(np.float64).ravel(), b_in_a.astype(np.float64).ravel()
    if not np.isfinite(b64).all():
        return {"diverges": True, "cosine": None, "rel_err": None, "note": "TensorFlow's values are not finite"}
    span = float(a64.max() - a64.min()) if a64.size else 0.0
    err = float(np.abs(a64 - b64).max()) if a64.size else 0.0
    rel = err / span if span > 0 else (0.0 if err == 0 else 1.0)
    cos = cosine(a64, b64)
    return {
        "diverges": err > abs_floor and (rel > rel_tolerance or cos < min_cosine),
        "cosine": cos,
        "rel_err": rel,
        "note": "",
    }


def _descendants(tensor: str, consumers: dict[str, list[str]]) -> set[str]:
    seen: set[str] = set()
    todo = [tensor]
    while todo:
        for t in consumers.get(todo.pop(), ()):
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return seen


def compare_node_outputs(
    pairs: dict[str, tuple[Any, Any]],
    order: list[tuple[str, str, str]],
    consumers: dict[str, list[str]],
    *,
    rel_tolerance: float,
    min_cosine: float,
    abs_floor: float,
) -> dict[str, Any]:
    """The first of ``order`` (ONNX tensor, node, op, in node order) whose TensorFlow value in ``pairs`` (ONNX's value,
    TensorFlow's) diverges (:func:`_verdict`) and stays diverged: a tensor some later tensor computed from it agrees
    again (``consumers``: tensor -> the tensors computed from it) is skipped as healed (an ill-conditioned
    intermediate: the reciprocal square root of a variance that cancels to rounding noise differs by 40 % between two
    correct runtimes; the normalised output agrees). ``{"divergence": None | {...}, "compared": n,
    "not_comparable": m, "healed": k}``; ``compared`` counts up to the divergence."""
    import numpy as np

    verdicts: dict[str, dict[str, Any]] = {}
    not_comparable = 0
    for tensor, _node, _op in order:
        if tensor in pairs:
            a, b = (np.asarray(x) for x in pairs[tensor])
            v = _verdict(a, b, rel_tolerance, min_cosine, abs_floor)
            if v is None:
                not_comparable += 1
            else:
                verdicts[tensor] = v
    compared = healed = 0
    for tensor, node, op in order:
        v = verdicts.get(tensor)
        if v is None:
            continue
        compared += 1
        if not v["diverges"]:
            continue
        if any(not verdicts[d]["diverges"] for d in _descendants(tensor, consumers) if d in verdicts):
            healed += 1
            continue
        found = {"node": node, "op": op, "tensor": tensor, **{k: v[k] for k in ("cosine", "rel_err", "note")}}
        return {"divergence": found, "compared": compared, "not_comparable": not_comparable, "healed": healed}
    return {"divergence": None, "compared": compared, "not_comparable": not_comparable, "healed": healed}


def node_order(onnx_path: Path) -> tuple[list[tuple[str, str, str]], dict[str, list[str]]]:
    """(float output tensor, node name, op type) of ``onnx_path``'s main graph, in node order; and each tensor's
    consumers' outputs."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - without types every output is compared
        inferred = model
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*inferred.graph.value_info, *inferred.graph.output]}
    consumers: dict[str, list[str]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).extend(o for o in n.output if o)
    order = [
        (o, n.name or f"node {i}", n.op_type)
        for i, n in enumerate(model.graph.node)
        for o in n.output
        if o and types.get(o, 1) in _FLOAT_TYPES
    ]
    return order, consumers


def onnx2tf_name(tensor: str) -> str:
    """The name onnx2tf 1.29.24 gives an ONNX tensor (``sanitizing`` in onnx2tf.convert, with signature defs on)."""
    import re

    return re.sub("^/", "wa/", tensor.replace(":", "__"))
