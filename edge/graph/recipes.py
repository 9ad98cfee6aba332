"""Precision recipes that keep accuracy: which nodes stay in higher precision, found from the fp32 reference.

Shared by the ONNX Runtime and OpenVINO converters (build host only; a device never imports it).

fp16 (``mixed_precision = "auto"``):

1. *Range*: the fp32 source runs on the search inputs with every intermediate float tensor exposed. A node
   whose output leaves fp16's range (``max |x| > 2**15``, half of fp16's largest finite value, so a rounded
   neighbour cannot cross it) stays fp32, and so do the nodes that read that tensor (they would read it back
   through a cast to fp16, i.e. as inf). A tensor whose values all lie in fp16's subnormals (``max |x| <
   2**-14``, nonzero) is kept the same way, and so is a node whose weights leave fp16's range. ``Exp`` whose
   input reaches ``ln(2**15)`` is named for that reason.
2. *Verify*: the candidate runs on the same inputs; it passes when, for every output, the mean cosine over the
   samples reaches the gate's threshold with a margin (the pipeline's gate later runs on other inputs).
3. *Grow*: while it fails, both models run with every intermediate exposed; each node is scored by how much
   relative error it adds (the relative L2 error of its output minus the largest of its inputs'; non-finite
   output scores infinity). The worst ``2**(trial-1)`` not yet kept are kept too, and it is verified again,
   for a bounded number of trials and while less than half the float nodes are kept.

int8 is the same loop with nodes excluded from quantization instead (onnxruntime ``nodes_to_exclude``): the
first candidate is the fully quantized model, there is no range step.

The result lists every kept node with its op and why, for the manifest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

FP16_MAX = 65504.0
#: a tensor above this stays fp32: half of fp16's largest finite value
OVERFLOW_AT = 2.0**15
#: a nonzero tensor entirely below this is all fp16 subnormals (fewer than 11 significant bits)
UNDERFLOW_BELOW = 2.0**-14
MODES = ("auto", "off")
#: at most this many verification trials after the first candidate
DEFAULT_TRIALS = 6
#: the search stops when this share of the float nodes would be kept: the model would barely be converted
MAX_KEPT_SHARE = 0.5
#: the search aims below the gate's error budget, 1 - min_cosine, by this factor
MARGIN = 0.5
#: how many intermediate values one exposed run of one sample may hold (float32 bytes / 4): bounds memory on
#: large maps (a 640x640 DBNet holds 281M); every group costs one run per sample
_EXPOSE_ELEMENTS = 128 * 1024 * 1024
_FLOAT_TYPES = {1: "float32", 10: "float16", 11: "float64", 16: "bfloat16"}


@dataclass(frozen=True)
class KeptNode:
    """A node left in higher precision, and the measurement that put it there."""

    node: str
    op: str
    why: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class Trial:
    kept: int  # nodes kept in higher precision in this candidate
    cosine: float  # worst output's mean cosine over the search samples
    finite: bool
    passed: bool
    failures: list[str] = field(default_factory=list)  # the task judgement's (search with ``precision``)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "kept": self.kept,
            "cosine": round(self.cosine, 6),
            "finite": self.finite,
            "passed": self.passed,
        }
        if self.failures:
            data["failures"] = self.failures[:4]
        return data


@dataclass
class SearchResult:
    kept: list[KeptNode]
    trials: list[Trial]
    target_cosine: float
    samples: int
    stopped: str | None = None  # why the search gave up, when it did
    artifact: Any = None  # what the builder returned for the chosen candidate
    chosen: int = -1  # the trial whose candidate was kept: the passing one, else the best
    origin: str = ""  # what the search inputs are: "calibration (images)", "generated"
    method: str | None = None  # int8: the calibration method of the chosen candidate
    calibrations: dict[str, Any] | None = None  # int8: the calibrations' fully quantized candidates, when several

    @property
    def passed(self) -> bool:
        return bool(self.trials) and self.trials[self.chosen].passed

    def to_json(self) -> dict[str, Any]:
        return {
            "target_cosine": round(self.target_cosine, 6),
            "search_samples": self.samples,
            "search_inputs": self.origin,
            "trials": [t.to_json() for t in self.trials],
            "chosen_trial": self.chosen % max(len(self.trials), 1),
            "passed": self.passed,
            "stopped": self.stopped,
            **({"calibrations": self.calibrations} if self.calibrations else {}),
        }

    def note(self, what: str) -> str | None:
        """One line for the manifest's notes, or None when nothing was kept and the first candidate passed."""
        if not self.kept and self.passed:
            return None
        ops: dict[str, int] = {}
        for k in self.kept:
            ops[k.op] = ops.get(k.op, 0) + 1
        by_op = ", ".join(f"{n} {op}" for op, n in sorted(ops.items(), key=lambda kv: -kv[1]))
        last = self.trials[self.chosen] if self.trials else None
        reached = f"cosine {last.cosine:.6f} on {self.samples} search inputs" if last else "not verified"
        if self.passed:
            return f"{len(self.kept)} node(s) kept in {what} ({by_op}) to keep parity: {reached}"
        return (
            f"mixed precision search stopped ({self.stopped}) with {len(self.kept)} node(s) kept in {what}"
            f"{f' ({by_op})' if by_op else ''}: {reached}, below the target {self.target_cosine:.6f}"
        )


# -- the ONNX graph -------------------------------------------------------------------------------------


def name_nodes(model: Any) -> Any:
    """Give every unnamed node a unique name (block and exclude lists are by node name); in place."""
    seen = {n.name for n in model.graph.node if n.name}
    for i, n in enumerate(model.graph.node):
        if not n.name:
            name = f"{n.op_type}_{i}"
            while name in seen:
                name += "_"
            n.name = name
            seen.add(name)
    return model


def subgraph_nodes(graph: Any) -> list[Any]:
    """The nodes of every If/Loop/Scan body inside ``graph``'s nodes, recursively (not ``graph``'s own)."""
    found = []
    for n in graph.node:
        for attr in n.attribute:
            for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                found += list(g.node) + subgraph_nodes(g)
    return found


def drop_fp16_round_trips(model: Any) -> int:
    """Remove Cast(fp32 -> fp16) -> Cast(fp16 -> fp32) pairs; in place, returns how many.

    onnxruntime's ``convert_float_to_float16`` passes a tensor between two blocked (fp32) nodes through fp16
    all the same, which is exactly what overflows; the consumer then reads the fp32 tensor directly.
    The main graph's casts only; a tensor an If/Loop body reads from the outer scope counts as used, and the
    renames reach into the bodies (Silero VAD's If branches read the fp16 cast of the graph's input).
    """
    graph = model.graph
    inner = subgraph_nodes(graph)
    to = {n.name: next((a.i for a in n.attribute if a.name == "to"), None) for n in graph.node if n.op_type == "Cast"}
    producer = {o: n for n in graph.node for o in n.output}
    outputs = {o.name for o in graph.output}
    rename: dict[str, str] = {}
    drop: list[Any] = []
    for n in graph.node:
        if n.op_type != "Cast" or to.get(n.name) != 1:
            continue
        src = producer.get(n.input[0])
        if src is None or src.op_type != "Cast" or to.get(src.name) != 10 or n.output[0] in outputs:
            continue
        rename[n.output[0]] = src.input[0]
        drop.append(n)
    for n in drop:
        graph.node.remove(n)
    for n in [*graph.node, *inner]:
        for i, name in enumerate(n.input):
            if name in rename:
                n.input[i] = rename[name]
    used = {i for n in [*graph.node, *inner] for i in n.input} | outputs
    restore: dict[str, str] = {}
    fixed = {i.name for i in graph.input} | {i.name for i in graph.initializer} | outputs
    for n in [n for n in graph.node if n.op_type == "Cast" and to.get(n.name) == 10 and n.output[0] not in used]:
        graph.node.remove(n)
        if n.input[0] not in fixed:
            restore[n.input[0]] = n.output[0]  # the fp32 tensor takes its original name back
    for n in [*graph.node, *inner]:
        for seq in (n.input, n.output):
            for i, name in enumerate(seq):
                if name in restore:
                    seq[i] = restore[name]
    for vi in graph.value_info:
        if vi.name in restore or vi.name in restore.values():
            vi.Clear()
    kept_vi = [vi for vi in graph.value_info if vi.name]
    del graph.value_info[:]
    graph.value_info.extend(kept_vi)
    return len(drop)


def float_tensors(model: Any) -> dict[str, int]:
    """Node outputs of a floating-point type -> element count (0 when the shape is not static)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - a graph shape inference cannot follow: expose what is declared
        inferred = model
    infos = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    produced = [o for n in model.graph.node for o in n.output if o]
    found: dict[str, int] = {}
    for name in produced:
        vi = infos.get(name)
        if vi is None or vi.type.tensor_type.elem_type not in _FLOAT_TYPES:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in vi.type.tensor_type.shape.dim]
        found[name] = int(np.prod(dims)) if dims and all(dims) else (1 if not dims else 0)
    return found


def _with_outputs(model: Any, names: Sequence[str]) -> Any:
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(m)
    except Exception:  # noqa: BLE001
        inferred = m
    types = {
        vi.name: vi.type.tensor_type.elem_type for vi in list(inferred.graph.value_info) + list(inferred.graph.output)
    }
    have = {o.name for o in m.graph.output}
    produced = {o for n in m.graph.node for o in n.output}
    for name in names:
        if name not in have and name in produced and types.get(name) in _FLOAT_TYPES:
            m.graph.output.append(onnx.helper.make_tensor_value_info(name, types[name], None))
    return m


def _session(model: Any) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


#: exposed runs (ranges, attribution) use at most this many values in all, and at least 2 samples: a
#: 640x640 DBNet (281M values a sample) is measured on 2 samples, a 224x224 classifier on all 8
_EXPOSE_TOTAL = 600 * 1024 * 1024


def _exposed(samples: Sequence[Any], sizes: Mapping[str, int]) -> Sequence[Any]:
    per_sample = max(sum(max(n, 1) for n in sizes.values()), 1)
    return samples[: max(2, _EXPOSE_TOTAL // per_sample)]


def _groups(sizes: Mapping[str, int]) -> list[list[str]]:
    """Tensor names in groups whose values for one sample fit the memory bound."""
    groups: list[list[str]] = [[]]
    total = 0
    for name, n in sizes.items():
        n = max(n, 1)
        if groups[-1] and total + n > _EXPOSE_ELEMENTS:
            groups.append([])
            total = 0
        groups[-1].append(name)
        total += n
    return [g for g in groups if g]


def onnx_infer(
    model: Any,
) -> Callable[[Sequence[Mapping[str, np.ndarray]], Sequence[str]], list[dict[str, np.ndarray]]]:
    """``infer(samples, tensors)`` for an in-memory ONNX model in onnxruntime's CPU provider: the graph's
    outputs plus the named intermediate tensors that exist in it."""
    cache: dict[tuple[str, ...], Any] = {}

    def infer(samples: Sequence[Mapping[str, np.ndarray]], tensors: Sequence[str]) -> list[dict[str, np.ndarray]]:
        key = tuple(tensors)
        if key not in cache:
            cache.clear()  # one exposed session at a time: large graphs
            cache[key] = _session(_with_outputs(model, tensors) if tensors else model)
        sess = cache[key]
        names = [o.name for o in sess.get_outputs()]
        feeds_names = {i.name for i in sess.get_inputs()}
        return [dict(zip(names, sess.run(names, {k: v for k, v in s.items() if k in feeds_names}))) for s in samples]

    return infer


Infer = Callable[[Sequence[Mapping[str, np.ndarray]], Sequence[str]], list[dict[str, np.ndarray]]]


# -- measurements ---------------------------------------------------------------------------------------


@dataclass
class Range:
    max_abs: float
    min_nonzero: float  # smallest nonzero |x|, inf when all zero

    @property
    def subnormal_only(self) -> bool:
        return 0.0 < self.max_abs < UNDERFLOW_BELOW


def activation_ranges(
    infer: Infer, sizes: Mapping[str, int], samples: Sequence[Mapping[str, np.ndarray]]
) -> dict[str, Range]:
    """max |x| and the smallest nonzero |x| of every named tensor over the samples (the first few, on large
    graphs: :data:`_EXPOSE_TOTAL`)."""
    ranges: dict[str, Range] = {}
    for group in _groups(sizes):
        for sample in _exposed(samples, sizes):  # one sample at a time: memory
            out = infer([sample], group)[0]
            for name in group:
                if name not in out:
                    continue
                a = np.abs(np.asarray(out[name], dtype=np.float64))
                finite = a[np.isfinite(a)]
                mx = float(finite.max()) if finite.size else 0.0
                if finite.size < a.size:
                    mx = math.inf
                nz = finite[finite > 0]
                mn = float(nz.min()) if nz.size else math.inf
                r = ranges.get(name)
                ranges[name] = Range(max(mx, r.max_abs), min(mn, r.min_nonzero)) if r else Range(mx, mn)
    return ranges


def output_cosine(
    reference: Sequence[Mapping[str, np.ndarray]], candidate: Sequence[Mapping[str, np.ndarray]], outputs: Sequence[str]
) -> tuple[float, bool]:
    """The worst output's mean cosine over the samples (as the parity gate computes it), and whether every
    value is finite."""
    worst, finite = 1.0, True
    for name in outputs:
        a = np.stack([np.asarray(r[name], dtype=np.float64).ravel() for r in reference])
        b = np.stack([np.asarray(c[name], dtype=np.float64).ravel() for c in candidate])
        finite &= bool(np.isfinite(b).all())
        b = np.nan_to_num(b, nan=0.0, posinf=FP16_MAX, neginf=-FP16_MAX)
        na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            cos = np.where((na == 0) & (nb == 0), 1.0, (a * b).sum(axis=1) / (na * nb))
        worst = min(worst, float(np.nan_to_num(cos, nan=0.0).mean()))
    return worst, finite


def tensor_errors(
    ref: Infer, cand: Infer, sizes: Mapping[str, int], samples: Sequence[Mapping[str, np.ndarray]]
) -> dict[str, float]:
    """Relative L2 error ||cand - ref|| / ||ref|| of every named tensor present in both (inf if non-finite)."""
    errors: dict[str, float] = {}
    for group in _groups(sizes):
        num: dict[str, float] = {}
        den: dict[str, float] = {}
        bad: set[str] = set()
        for sample in _exposed(samples, sizes):  # one sample at a time: memory
            r, c = ref([sample], group)[0], cand([sample], group)[0]
            for name in group:
                if name not in r or name not in c:
                    continue
                a = np.asarray(r[name], dtype=np.float64)
                b = np.asarray(c[name], dtype=np.float64)
                if a.shape != b.shape or not np.isfinite(b).all():
                    bad.add(name)
                    continue
                num[name] = num.get(name, 0.0) + float(((a - b) ** 2).sum())
                den[name] = den.get(name, 0.0) + float((a**2).sum())
        for name in set(num) | bad:
            if name in bad:
                errors[name] = math.inf
            else:
                n, d = num[name], den[name]
                errors[name] = math.sqrt(n) / (math.sqrt(d) + 1e-30) if n or d else 0.0
    return errors


_PASS_THROUGH = frozenset({"QuantizeLinear", "DequantizeLinear", "Cast"})


def attribute(
    model: Any, errors: Mapping[str, float], eligible: Iterable[str], candidate: Any = None
) -> list[tuple[str, str, float]]:
    """(node, op, added error) for the eligible nodes, worst first: the relative error of a node's output
    minus the largest of its inputs' (a node that only carries its inputs' error scores ~0).

    ``candidate`` is the converted graph when its nodes read other tensors than the float ``model``'s
    (a QDQ model reads ``x_DequantizeLinear_Output``, an fp16 one ``x_cast_to_fp32``; a quantizer may fuse a
    Relu into its Conv): inputs are followed back through Q/DQ/Cast to the float tensor, and an input that was
    not measured takes the error of the float model's inputs upstream of it.
    """
    allowed = set(eligible)
    float_producer = {o: n for n in model.graph.node for o in n.output}
    graph = (candidate if candidate is not None else model).graph
    producer = {o: n for n in graph.node for o in n.output}
    memo: dict[str, float] = {}

    def source(t: str) -> str:
        seen = 0
        while t in producer and producer[t].op_type in _PASS_THROUGH and producer[t].input and seen < 8:
            t, seen = producer[t].input[0], seen + 1
        return t

    def error_of(t: str, depth: int = 0) -> float:
        if t in errors:
            return errors[t]
        if t in memo:
            return memo[t]
        n = float_producer.get(t)
        memo[t] = 0.0
        if n is not None and depth < 16:
            memo[t] = max((error_of(i, depth + 1) for i in n.input if i), default=0.0)
        return memo[t]

    scored = []
    for n in graph.node:
        if n.name not in allowed:
            continue
        outs = [errors[o] for o in n.output if o in errors]
        if not outs:
            continue
        out_err = max(outs)
        in_err = max((error_of(source(i)) for i in n.input if i), default=0.0)
        if math.isinf(out_err):
            score = math.inf if not math.isinf(in_err) else 0.0
        else:
            score = out_err - (in_err if math.isfinite(in_err) else out_err)
        scored.append((n.name, n.op_type, score))
    scored.sort(key=lambda t: -t[2])
    return scored


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.3g}"


def fp16_range_keep(model: Any, ranges: Mapping[str, Range]) -> list[KeptNode]:
    """The nodes that must stay fp32 because a tensor they produce or read, or a weight, leaves fp16's range."""
    from onnx import numpy_helper

    kept: dict[str, KeptNode] = {}

    def keep(n: Any, why: str) -> None:
        kept.setdefault(n.name, KeptNode(n.name, n.op_type, why))

    weights = {}
    for init in model.graph.initializer:
        if init.data_type in (1, 11):
            w = np.abs(numpy_helper.to_array(init))
            weights[init.name] = float(w.max()) if w.size else 0.0
    for n in model.graph.node:
        for o in n.output:
            r = ranges.get(o)
            if r is None:
                continue
            if r.max_abs > OVERFLOW_AT:
                keep(n, f"activation {o!r} max |x| {_fmt(r.max_abs)} > {OVERFLOW_AT:g} (fp16 max {FP16_MAX:g})")
            elif r.subnormal_only:
                keep(n, f"activation {o!r} max |x| {_fmt(r.max_abs)} < {UNDERFLOW_BELOW:.3g}: only fp16 subnormals")
        for i in n.input:
            r = ranges.get(i)
            if r is not None and r.max_abs > OVERFLOW_AT:
                keep(n, f"reads {i!r} (max |x| {_fmt(r.max_abs)} > {OVERFLOW_AT:g}), which fp16 cannot hold")
            elif r is not None and n.op_type == "Exp" and r.max_abs > math.log(OVERFLOW_AT):
                keep(n, f"Exp of {i!r} reaching {_fmt(r.max_abs)} > ln({OVERFLOW_AT:g}): exp overflows fp16")
            elif i in weights and weights[i] > OVERFLOW_AT:
                keep(n, f"weight {i!r} max |w| {_fmt(weights[i])} > {OVERFLOW_AT:g}")
    return list(kept.values())


# -- the search -----------------------------------------------------------------------------------------


def task_failures(
    reference: Sequence[Mapping[str, np.ndarray]],
    candidate: Sequence[Mapping[str, np.ndarray]],
    precision: str,
    margin: float = MARGIN,
) -> list[str]:
    """What the parity gate's task judgement (``edge.verify.parity.compare``, --task auto) fails for ``candidate``,
    with every task limit tightened by ``margin`` of its budget as the cosine target is (detection recall
    0.90 -> 0.95 at int8): a YOLOX head quantized to cosine 0.9968 still lost 13 % of its detections."""
    from edge.verify.parity import compare, thresholds_for

    th = thresholds_for(precision)

    def tight(v: float | None) -> float | None:
        return None if v is None else 1.0 - (1.0 - v) * margin

    th = replace(
        th,
        min_top1=1.0 - (1.0 - th.min_top1) * margin,
        min_top5=tight(th.min_top5),
        min_detection=tight(th.min_detection),
        min_iou=tight(th.min_iou),
        min_sequence=tight(th.min_sequence),
    )
    task_words = ("top-1", "top-5", "detection", "IoU", "sequence")
    return [
        f"{o.name}: {f}"
        for o in compare(list(reference), list(candidate), th)
        for f in o.failures
        if any(w in f for w in task_words)
    ]


@dataclass(frozen=True)
class Candidates:
    """How :func:`search` makes and runs a candidate: ``build(kept node names)`` makes one, ``infer_of(candidate)``
    runs it, ``graph_of(candidate)`` is its ONNX graph when it has one (for :func:`attribute`)."""

    build: Callable[[list[str]], Any]
    infer_of: Callable[[Any], Infer]
    graph_of: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class SearchGoal:
    """What :func:`search` looks for: outputs at ``target_cosine`` (and the gate's task figures for ``precision``)
    within ``max_trials``, starting from ``initial`` kept nodes (a callable: computed only when the plain
    candidate fails), among ``eligible`` nodes (default: every node with a float output in ``sizes``); ``why``
    is each kept node's reason (``{err}``: the error it adds)."""

    target_cosine: float
    initial: Sequence[KeptNode] | Callable[[], Sequence[KeptNode]] = ()
    eligible: Sequence[str] | None = None
    max_trials: int = DEFAULT_TRIALS
    why: str = "adds {err} relative error"
    sizes: Mapping[str, int] | None = None
    precision: str | None = None


def search(
    *,
    model: Any,
    samples: Sequence[Mapping[str, np.ndarray]],
    reference: Infer,
    candidates: Candidates,
    goal: SearchGoal,
) -> SearchResult:
    """Keep nodes in higher precision until the candidate's outputs reach ``goal.target_cosine``.

    ``model`` is the float ONNX graph whose node and tensor names the candidates share (``candidates``: how one
    is built and run). The first candidate keeps ``goal.initial``; each further trial keeps the ``2**(trial-1)``
    nodes adding the most error (see :func:`attribute`).

    ``initial`` given as a callable is computed only when the plain candidate (nothing kept) fails: the
    fp16 range check runs the fp32 graph with every tensor exposed (minutes on a 640x640 detector), which
    a model that is fine in fp16 (most are) should not pay.

    ``goal.precision``: a candidate must also pass the gate's task figures for it (:func:`task_failures`), not
    only the cosine target.
    """
    build, infer_of, graph_of = candidates.build, candidates.infer_of, candidates.graph_of
    target_cosine, initial, eligible, max_trials = goal.target_cosine, goal.initial, goal.eligible, goal.max_trials
    why, sizes, precision = goal.why, goal.sizes, goal.precision
    outputs = [o.name for o in model.graph.output]
    sizes = dict(sizes if sizes is not None else float_tensors(model))
    if eligible is None:
        eligible = [n.name for n in model.graph.node if any(o in sizes for o in n.output)]
    eligible = list(eligible)
    lazy: Callable[[], Sequence[KeptNode]] | None = None
    kept: dict[str, KeptNode] = {}
    if callable(initial):
        lazy = initial
    else:
        kept = {k.node: k for k in initial}
    ref_out = reference(samples, [])
    result = SearchResult([], [], target_cosine, len(samples))
    best: tuple[float, Any, list[KeptNode], int] | None = None
    for trial in range(max_trials + 1):
        candidate = build(list(kept))
        cand_infer = infer_of(candidate)
        cand_out = cand_infer(samples, [])
        cos, finite = output_cosine(ref_out, cand_out, outputs)
        passed = finite and cos >= target_cosine
        failures = task_failures(ref_out, cand_out, precision) if passed and precision is not None else []
        passed = passed and not failures
        result.trials.append(Trial(len(kept), cos, finite, passed, failures))
        score = cos if finite else -1.0
        if best is None or score > best[0] or passed:
            best = (score, candidate, list(kept.values()), trial)
        if passed:
            break
        if trial == max_trials:
            result.stopped = f"{max_trials} trials"
            break
        if lazy is not None:  # the plain candidate failed: now the range-based set
            extra = [k for k in lazy() if k.node not in kept]
            lazy = None
            if extra:
                kept.update({k.node: k for k in extra})
                continue
        room = int(MAX_KEPT_SHARE * len(eligible)) - len(kept)
        if room <= 0:
            result.stopped = f"{len(kept)} of {len(eligible)} nodes kept"
            break
        errors = tensor_errors(reference, cand_infer, sizes, samples)
        graph = graph_of(candidate) if graph_of is not None else None
        ranked = [t for t in attribute(model, errors, (e for e in eligible if e not in kept), graph) if t[2] > 0]
        if not ranked:
            result.stopped = "no node adds error"
            break
        for name, op, err in ranked[: min(2**trial, room)]:
            kept[name] = KeptNode(name, op, why.format(err=_fmt(err)))
    assert best is not None
    result.artifact, result.kept, result.chosen = best[1], best[2], best[3]
    return result


def trial_score(t: Trial) -> tuple[bool, int, float]:
    """How good a candidate is, to compare two: passing, then fewer task-figure failures, then cosine."""
    return (t.passed, -len(t.failures) if t.finite else -99, t.cosine if t.finite else -1.0)


def target_cosine(precision: str, margin: float = MARGIN) -> float:
    """The gate's mean-cosine threshold for ``precision``, tightened by ``margin`` of its error budget."""
    from edge.verify.parity import thresholds_for

    th = thresholds_for(precision).min_cosine
    return 1.0 - (1.0 - th) * margin


def search_samples(request: Any, count: int = 8, seed: int = 7) -> tuple[list[dict[str, np.ndarray]], str]:
    """Inputs for the search: the calibration samples when given, else generated ones (another seed than the
    pipeline's parity inputs, so the gate checks the recipe on inputs it was not chosen on)."""
    if request.calibration is not None and request.calibration.samples:
        return [dict(s) for s in request.calibration.samples[:count]], f"calibration ({request.calibration.kind})"
    from edge.verify.inputs import generated_samples

    return generated_samples(request.io, request.preprocess, count, seed=seed), "generated"
