"""``edgekit convert --explain``: what edgekit concludes about a model before converting it (issue #23), each
conclusion with its evidence, so a user sees a wrong guess and overrides it (``--preprocess``, ``--task``,
``--input-shape``, ``--parity-data``).

Per input: its kind, layout, the pre-processing applied (declared, or certain under ``auto``) and what parity and
calibration feed it when no data is given (``edge.verify.inputs``). Per output: the task parity judges it by and
why (``edge.verify.tasks.explain_task``, from the source's own outputs on two generated samples), or why it gets
raw figures only. A metric those two samples cannot discriminate on (a constant output, a tied best class) is checked
on the inputs parity itself compares on before it is reported. For an ONNX: whether it is already quantized (``edge.graph.quantized``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from edge.pipeline.declared import declared_preprocess, request_preprocess
from edge.pipeline.request import ConvertRequest
from edge.pipeline.sources import GGUFSource, OnnxSource, open_source
from edge.spec import AUTO, DeclaredPreprocess, IOSpec, PreprocessSpec, TensorSpec, image_channels, image_layout
from edge.verify.inputs import describe_generated, generated_samples
from edge.verify.tasks import LABEL_THRESHOLD, NO_DISCRIMINATION, TaskJudge

#: generated samples the source runs on to read its outputs' values
EXPLAIN_SAMPLES = 2


def explain(model: str | os.PathLike[str], request: ConvertRequest | None = None) -> dict[str, Any]:
    """What a conversion of ``model`` with ``request`` would conclude, as plain data (``--json``)."""
    req = request or ConvertRequest()
    src = open_source(model)
    out: dict[str, Any] = {"model": src.path.name, "format": src.format}
    if isinstance(src, GGUFSource):
        out["note"] = "a GGUF language model: judged by llama.cpp's quality gate (KL, top-1 on text), no tensors"
        return out
    if isinstance(src, OnnxSource):
        q = src.quantization()
        out["quantized"] = q.describe() if q is not None else None
    io = src.checked_io(req.input_shapes)
    declared = declared_preprocess(src, io) if req.preprocess == AUTO else None
    pre = request_preprocess(src, io, req)
    kinds = describe_generated(io, pre)
    out["inputs"] = [_input(t, pre, kinds[t.name], req, declared) for t in io.inputs]
    out["outputs"] = _outputs(src, io, pre, req)
    return out


def _input(
    t: TensorSpec, pre: PreprocessSpec | None, kind: str, req: ConvertRequest, declared: DeclaredPreprocess | None
) -> dict[str, Any]:
    layout = t.layout or image_layout(t.shape)
    channels = image_channels(t)
    if pre is not None and pre.input == t.name:
        how = (
            "declared with --preprocess"
            if req.preprocess != AUTO
            else f"auto: {declared.evidence}"
            if declared is not None and declared.input == t.name and pre.preset == declared.preset
            else f"auto: a {channels}-channel {t.dtype} image input"
        )
        evidence = f"{pre.preset} pre-processing ({how}; colour {pre.color}, scale {pre.scale:.4g})"
    elif channels is not None:
        evidence = f"a {channels}-channel plane {list(t.shape)}: " + (
            "a grey picture, a spectrogram or a feature map look alike, so no pre-processing is guessed (--preprocess PRESET declares one)"
            if channels == 1
            else "--preprocess none: fed as it is"
        )
    else:
        evidence = f"from its name, dtype {t.dtype} and shape {list(t.shape)}"
    if kind.startswith("log-mel"):
        evidence += f"; its name {t.name!r} says audio features: fed a spectrogram"
    if t.quant is not None:
        evidence += f"; the file quantizes it (scale {t.quant[0]:.4g}, zero point {t.quant[1]}): fed every level"
    return {
        "name": t.name,
        "shape": list(t.shape),
        "dtype": t.dtype,
        "layout": layout,
        "preprocess": pre.preset if pre is not None and pre.input == t.name else None,
        "generator": kind,
        "evidence": evidence,
    }


def _outputs(src: Any, io: IOSpec, pre: PreprocessSpec | None, req: ConvertRequest) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="edgekit-explain-") as tmp:
        static = src.static_file(Path(tmp), io)
        got = src.reference(static, generated_samples(io, pre, EXPLAIN_SAMPLES))
        if got is None:
            return [
                {
                    "name": t.name,
                    "task": None,
                    "evidence": "the source cannot run here: its outputs are read by the converter",
                }
                for t in io.outputs
            ]
        found = _read_outputs(got[0], req)
        if any(NO_DISCRIMINATION in o["metric"] for o in found) and req.parity_samples > 0:
            # two probe samples are not parity's inputs: a ViSQOL lattice's MOS is the same on both and spans 1.0..2.97
            # over parity's 32. Only what parity's own inputs show is reported as a metric that cannot discriminate
            wider = src.reference(static, _parity_samples(io, pre, req))
            if wider is not None:
                found = _read_outputs(wider[0], req)
    return found


def _parity_samples(io: IOSpec, pre: PreprocessSpec | None, req: ConvertRequest) -> list[dict[str, np.ndarray]]:
    """The inputs a float conversion's parity compares on (``--parity-data``, else edgekit's natural images and
    generated inputs), as many as ``--parity-samples``."""
    from edge.verify.inputs import choose_parity_inputs

    chosen = choose_parity_inputs(io, pre, count=req.parity_samples, parity_data=req.parity_data)
    return [{t.name: s[t.name] for t in io.inputs if t.name in s} for s in chosen.samples]


def _read_outputs(refs: list[dict[str, np.ndarray]], req: ConvertRequest) -> list[dict[str, Any]]:
    from edge.verify.parity import guess_task

    shapes = {n: tuple(np.shape(v)) for n, v in refs[0].items()}
    found = []
    for name in refs[0]:
        values = [np.asarray(r[name]) for r in refs]
        guess = guess_task(name, values, [s for n, s in shapes.items() if n != name])
        declared = req.task not in ("auto", "none")
        task = req.task if declared else (None if req.task == "none" else guess.task)
        found.append(
            {
                "name": name,
                "shape": list(shapes[name]),
                "task": task,
                "metric": _metric(task, values),
                "evidence": f"declared with --task {req.task}" if declared else guess.evidence,
                "range": [float(min(v.min() for v in values)), float(max(v.max() for v in values))],
            }
        )
    return found


def _metric(task: str | None, values: list[np.ndarray]) -> str:
    """The metric parity judges the output by, and where it cannot discriminate on the generated samples (a
    constant reference, a best class tied in every sample), what replaces it."""
    from edge.verify.parity import Thresholds, degenerate_reason

    metric = {
        "classifier": "top-1 (tie-aware; top-5 over 5 classes) beside cosine and SNR",
        "multi-label": f"labels at >= {LABEL_THRESHOLD}: IoU of the label sets, beside cosine and SNR",
        "detector": "decoded boxes: precision and recall at IoU 0.5",
        "prob-map": "IoU of the maps thresholded at 0.3",
        "segmentation": "per-pixel argmax: mean IoU",
        "sequence": "decoded sequences: identical share, token agreement",
    }.get(task or "", "raw figures only: cosine, SNR, error over the reference's range (compares numbers, no task)")
    constant = degenerate_reason(float(min(v.min() for v in values)), float(max(v.max() for v in values)), len(values))
    if constant is not None:
        return f"{metric}; {NO_DISCRIMINATION}{constant}: judged on absolute error instead"
    if task == "classifier" and values[0].ndim >= 2:
        judge = TaskJudge("classifier", values[0].shape, tie_rtol=Thresholds.tie_rtol)
        for v in values:
            judge.add(v, v)
        note = judge.result()
        if note.degenerate and note.note:
            return f"{metric}; top-1 {note.note}"
    return metric
