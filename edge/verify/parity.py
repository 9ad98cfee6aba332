"""Parity: does the converted model compute what the source computes?

The reference is the source model in its own reference runtime on the same inputs (ONNX:
onnxruntime fp32 CPU provider; TFLite: LiteRT reference kernels; OpenVINO IR: OpenVINO CPU f32;
PyTorch: the model itself in its toolchain; see ``edge.pipeline.sources``).

Per output, raw-tensor figures: max and mean abs error, the max error normalised by the reference's
range, SNR in dB (10 log10 of reference energy over error energy, pooled over samples), cosine
similarity (mean over the samples where the reference carries energy, and the worst of them).
Beside them, the task figures a user feels (``edge.verify.tasks``): top-1/top-5 agreement for a classifier,
detection precision/recall for a YOLO head, IoU of thresholded probability maps, decoded-sequence
agreement for a recognizer. A reference that is degenerate on the inputs used (constant, or a
probability that is ~0 everywhere) is said to be so and gated on absolute error only: cosine and SNR
of rounding noise measure nothing. Thresholds per precision live here only, and :func:`output_failures`
is the one judgement of a set of figures (the manifest gate recomputes with it).
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from edge.backends.runner import Runner
from edge.base.env import seconds_from_env
from edge.capabilities import CpuIsa, cpu_isa
from edge.errors import ModelError
from edge.verify.tasks import (
    TaskFigures,
    TaskGuess,
    TaskJudge,
    blank_share,
    column_range,
    explain_task,
    fits,
    is_classifier,
    row_kind,
    unit_rows,
)


@dataclass(frozen=True)
class Thresholds:
    """One precision's limits. ``None``: not gated (a reference-pair check on the device gates cosine and top-1
    only). Task limits apply to outputs whose task is known (``edge.verify.tasks``)."""

    min_cosine: float
    min_top1: float
    min_snr_db: float | None = None  # pooled over samples
    max_rel_err: float | None = None  # max abs error / the reference's range (max - min)
    degenerate_atol: float | None = None  # a degenerate reference: max abs error <= this x max(1, |ref|max)
    min_top5: float | None = None  # the reference's top-1 among the converted model's top-5
    min_detection: float | None = None  # detection precision and recall against the reference's detections
    min_iou: float | None = None  # thresholded probability maps / segmentation labels
    min_sequence: float | None = None  # decoded tokens: 1 - edit distance / length
    #: values this close (x max(1, the row's magnitude)) are equal at this precision: a top-1 among them is a tie,
    #: a label this close to its threshold undecided (issue #34: a saturated sigmoid's 60 tags at 1.0 and 2.9e-6
    #: of another CPU's rounding failed an exact conversion's top-1). Edgekit's own, not the bundle's: not recorded
    tie_rtol: float = 1e-5

    def to_json(self) -> dict[str, float | None]:
        data: dict[str, float | None] = asdict(self)
        del data["tie_rtol"]
        return data


# Measured on real pretrained models (PP-OCRv6 det/rec, the PP-OCR direction classifier, ddddocr's YOLOX
# detector, Silero VAD) on generated inputs that look like their data (edge.verify.inputs), this build host:
#   fp32  OpenVINO CPU / LiteRT XNNPack vs onnxruntime: SNR >= 99 dB, max error <= 3e-5 of the range, task 100 %
#   fp16  onnxruntime f16: SNR 49.4-66.1 dB (rec 49.4, det 50.7, cls 55.6, YOLOX 66.1), cosine >= 0.999994,
#         det IoU 0.9987, YOLOX P/R 1.0, rec sequences 100 %; max error up to 4.6 % of the range (rec)
#   bf16  OpenVINO on an AMX CPU computing an fp16 bundle: SNR 27.0-46.2 dB, cosine >= 0.99900, det IoU 0.9895,
#         YOLOX P/R 0.998, rec sequences 100 % -- with a max error of 66 % of the range on one rec logit
#   int8  onnxruntime QDQ / OpenVINO NNCF, calibrated on generated inputs: SNR 10.7-24.4 dB (det 13.9 / 10.7,
#         YOLOX 22.2 / 24.4, cls 15.8, rec 18.3), cosine 0.983-0.998, det IoU 0.888 / 0.840, YOLOX precision/recall
#         0.957/0.937 and 0.975/0.971, rec sequences 100 %, cls top-1 91.7 %
# So the range-normalised max error gates fp32 only (one outlier of a correct low-precision model is common);
# at lower precisions a region gone wrong shows in SNR and in the task figure, which gate. Cosine still
# catches a wrong graph at any scale; SNR catches what cosine is blind to (a gain error).
# int8 classifier numbers: MobileNetV2 QDQ U8S8 per-channel reached 99.2% top-1 on real images (issue #2).
THRESHOLDS: dict[str, Thresholds] = {
    "fp32": Thresholds(
        min_cosine=0.99999,
        min_top1=0.99,
        min_snr_db=40.0,
        max_rel_err=1e-2,
        degenerate_atol=1e-4,
        min_top5=0.99,
        min_detection=0.95,
        min_iou=0.98,
        min_sequence=0.98,
    ),
    # bf16 keeps 8 mantissa bits to fp16's 11: measured 0.9985 cosine on a trained classifier.
    "bf16": Thresholds(
        min_cosine=0.995,
        min_top1=0.90,
        min_snr_db=18.0,
        degenerate_atol=2e-2,
        min_top5=0.95,
        min_detection=0.90,
        min_iou=0.90,
        min_sequence=0.90,
        tie_rtol=1 / 128,  # one bf16 step at 1.0 (2^-7), as int8's
    ),
    "fp16": Thresholds(
        min_cosine=0.999,
        min_top1=0.90,
        min_snr_db=25.0,
        degenerate_atol=1e-2,
        min_top5=0.95,
        min_detection=0.95,
        min_iou=0.95,
        min_sequence=0.95,
        tie_rtol=2e-3,
    ),
    # SNR pooled over samples sits ~4 dB under what the mean cosine suggests (det: cosine 0.983, SNR 10.7 dB)
    "int8": Thresholds(
        min_cosine=0.98,
        min_top1=0.80,
        min_snr_db=10.0,
        degenerate_atol=5e-2,
        min_top5=0.90,
        min_detection=0.90,
        min_iou=0.80,
        min_sequence=0.90,
        tie_rtol=1 / 128,
    ),
}
THRESHOLDS["int8-dynamic"] = THRESHOLDS["int8"]  # weights int8, activations quantized at run time: the same gate

#: SNR reported for an exact match (10 log10(x / 0) is infinite; JSON carries no infinity)
SNR_EXACT = 300.0
#: a sample's cosine counts where its reference norm is at least this share of the largest sample's
ENERGY_SHARE = 1e-3
#: below this many values a sample the cosine is taken over all samples together (one value of a [1, 1]
#: output has cosine +/-1 with anything of its sign)
POOLED_BELOW = 8


@dataclass
class OutputParity:
    name: str
    max_abs: float
    mean_abs: float
    cosine: float  # mean over the samples whose reference carries energy: what the gate uses
    cosine_min: float  # the worst of those samples, reported
    top1: float | None
    failures: list[str] = field(default_factory=list)
    snr_db: float | None = None  # pooled over samples; SNR_EXACT for no error; None for an all-zero reference
    snr_db_min: float | None = None  # the worst sample whose reference carries energy
    rel_max_abs: float | None = None  # max_abs / (ref_max - ref_min); None for a constant reference
    ref_min: float | None = None
    ref_max: float | None = None
    cosine_samples: int | None = None  # samples the cosine is the mean of (0 pooled: one cosine over all)
    degenerate: bool = False  # the reference is constant / ~0 on these inputs: gated on absolute error only
    degenerate_note: str | None = None
    task: str | None = None  # edge.verify.tasks: how the output was judged beside the raw figures
    task_note: str | None = None
    task_degenerate: bool = False  # nothing to agree on (no detections, empty maps): the task figure is not gated
    top5: float | None = None
    precision: float | None = None  # detections of the converted model the reference also has
    recall: float | None = None  # reference detections the converted model also has
    iou: float | None = None
    sequence: float | None = None  # identical decoded sequences
    tokens: float | None = None  # 1 - edit distance / length of the decoded sequences

    @property
    def passed(self) -> bool:
        return not self.failures


def degenerate_reason(ref_min: float | None, ref_max: float | None, samples: int | None = None) -> str | None:
    """Why a reference with this range carries nothing to compare (constant; a probability ~0 or ~1
    everywhere), or None. Recomputed by the manifest gate from the recorded range. The range is pooled over
    every parity sample, so "constant" means constant across all of them (``samples``: how many, for the words)."""
    if ref_min is None or ref_max is None or not (math.isfinite(ref_min) and math.isfinite(ref_max)):
        return None
    where = "on these inputs" if samples is None else f"across {samples} sample{'s' if samples != 1 else ''}"
    span, scale = ref_max - ref_min, max(abs(ref_min), abs(ref_max))
    if span <= 1e-5 * max(1.0, scale):
        return f"the reference output is constant {where} (range {span:.3g})"
    if ref_min >= 0.0 and ref_max < 1e-3:
        return f"the reference output is ~0 everywhere {where} (max {ref_max:.3g})"
    if ref_min > 1.0 - 1e-3 and ref_max <= 1.0:
        return f"the reference output is ~1 everywhere {where} (min {ref_min:.6g})"
    return None


#: what a degenerate reference is: a pass on it proves nothing about the conversion
NOT_DISCRIMINATING = "not discriminating: "


def unverified_reason(degenerate: Sequence[str | None]) -> str | None:
    """The verdict's reason when every output's reference is degenerate (``degenerate``: each output's
    :func:`degenerate_reason`, None where it discriminates): a parity that could not have failed is not a
    pass but unverified; None when at least one output discriminates (or there is none)."""
    if not degenerate or any(d is None for d in degenerate):
        return None
    first = str(degenerate[0])
    more = f" (and every other output's: {len(degenerate) - 1} more)" if len(degenerate) > 1 else ""
    return (
        f"unverified: no output discriminates, {first}{more}: parity could not have failed "
        "(give --parity-data with real inputs)"
    )


_IOU_WORDS = {"prob-map": "IoU of the thresholded maps", "multi-label": "IoU of the label sets"}


def output_failures(o: Any, th: Thresholds) -> list[str]:
    """What one output's figures fail against ``th``: the one judgement, used by :func:`compare` and by the
    manifest gate (``edge.bundle.manifest.parity_verdict``), so a record is judged as it was built. ``o`` is an
    :class:`OutputParity` or the manifest's typed figures (same field names)."""
    fails: list[str] = []
    if not (math.isfinite(o.max_abs) and math.isfinite(o.mean_abs)):
        return fails  # compare() names the cause (missing, shape, NaN); the gate adds its own line
    degenerate = degenerate_reason(o.ref_min, o.ref_max)
    if degenerate is not None:
        if th.degenerate_atol is not None:
            scale = max(1.0, abs(o.ref_min), abs(o.ref_max))
            if o.max_abs > th.degenerate_atol * scale:
                fails.append(
                    f"max abs error {o.max_abs:.3g} > {th.degenerate_atol * scale:.3g} on a degenerate reference ({degenerate})"
                )
    else:
        if o.cosine < th.min_cosine:
            fails.append(f"mean cosine {o.cosine:.6f} < {th.min_cosine} (worst sample {o.cosine_min:.6f})")
        if th.min_snr_db is not None and o.snr_db is not None and o.snr_db < th.min_snr_db:
            fails.append(f"SNR {o.snr_db:.1f} dB < {th.min_snr_db} dB")
        if th.max_rel_err is not None and o.rel_max_abs is not None and o.rel_max_abs > th.max_rel_err:
            fails.append(f"max abs error {o.rel_max_abs:.3g} of the reference's range > {th.max_rel_err}")
    if o.top1 is not None and o.top1 < th.min_top1:
        fails.append(f"top-1 agreement {o.top1:.1%} < {th.min_top1:.0%}")
    if getattr(o, "task_degenerate", False):
        return fails
    checks = (
        ("top5", th.min_top5, "top-5 agreement (reference's top-1 in the top-5)"),
        ("precision", th.min_detection, "detection precision"),
        ("recall", th.min_detection, "detection recall"),
        ("iou", th.min_iou, _IOU_WORDS.get(o.task or "", "mean IoU")),
        ("tokens", th.min_sequence, "decoded-sequence agreement"),
    )
    for key, limit, what in checks:
        value = getattr(o, key, None)
        if limit is not None and value is not None and value < limit:
            fails.append(f"{what} {value:.1%} < {limit:.0%}")
    return fails


@dataclass
class ParityReport:
    precision: str
    thresholds: Thresholds
    samples: int
    inputs: str  # where the inputs came from, in words ("generated (...)", "calibration (images)", ...)
    reference: str
    candidate: dict[str, Any]
    outputs: list[OutputParity]
    accepted_failure: bool = False
    host_notes: list[str] = field(default_factory=list)  # where this host's arithmetic may differ from the device's
    task: str = "auto"  # --task as asked; each output records the task it was judged by
    input_provenance: dict[str, Any] | None = None  # edge.verify.inputs.ParityInputs.provenance()
    shipped_as_is: bool = False  # the bundle's file is the reference's byte for byte: exact by identity
    first_divergence: Any = None  # edge.graph.divergence.Divergence, on a failure where it could be located

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    @property
    def unverified(self) -> str | None:
        """Why a report with no failure still verifies nothing: every output's reference is degenerate (None
        otherwise). A file shipped byte for byte as it is is no exception: its device's reference pairs compare
        the same constant."""
        if not self.passed:
            return None
        return unverified_reason([degenerate_reason(o.ref_min, o.ref_max, self.samples) for o in self.outputs])

    def summary(self) -> str:
        parts = []
        for o in self.outputs:
            t = f", top-1 {o.top1:.1%}" if o.top1 is not None else ""
            snr = f", SNR {o.snr_db:.1f} dB" if o.snr_db is not None else ""
            task = _task_summary(o)
            deg = " [degenerate reference]" if o.degenerate else ""
            parts.append(f"{o.name}: cosine {o.cosine:.6f}{snr}, max abs {o.max_abs:.3g}{t}{task}{deg}")
        return "; ".join(parts)

    def failures(self) -> list[str]:
        found = [f"{o.name}: {f}" for o in self.outputs for f in o.failures]
        if found and self.first_divergence is not None:
            found.append(self.first_divergence.describe())
        return found

    def to_json(self) -> dict[str, Any]:
        data = {
            "passed": self.passed,
            "accepted_failure": self.accepted_failure,
            "precision": self.precision,
            "thresholds": self.thresholds.to_json(),
            "samples": self.samples,
            "inputs": self.inputs,
            "reference": self.reference,
            "candidate": self.candidate,
            "host_notes": self.host_notes,
            "task": self.task,
            "outputs": [
                {**{k: v for k, v in asdict(o).items() if k != "failures"}, "passed": o.passed, "failures": o.failures}
                for o in self.outputs
            ],
        }
        if self.input_provenance is not None:
            data["input_provenance"] = self.input_provenance
        if self.shipped_as_is:
            data["shipped_as_is"] = True
        if self.unverified is not None:
            data["unverified"] = self.unverified
        if self.first_divergence is not None:
            data["first_divergence"] = self.first_divergence.to_json()
        return data


def _task_summary(o: OutputParity) -> str:
    if o.task is None or o.task == "classifier" and o.top5 is None:
        return ""
    iou = "labels IoU" if o.task == "multi-label" else "IoU"
    figs = {"top-5": o.top5, "precision": o.precision, "recall": o.recall, iou: o.iou, "tokens": o.tokens}
    shown = ", ".join(f"{k} {v:.1%}" for k, v in figs.items() if v is not None)
    return f", {o.task}: {shown or 'nothing to compare'}"


_COMPUTE = {"f32": "fp32", "f16": "fp16", "bf16": "bf16"}


def thresholds_for(precision: str, precision_used: str | None = None) -> Thresholds:
    """The bundle precision's limits, loosened to the compute precision's when the runtime computes in
    something coarser (e.g. OpenVINO on a CPU without FP16 computing an fp16 bundle in bf16). The
    report names both, so a looser gate is never silent."""
    th = THRESHOLDS.get(precision, THRESHOLDS["int8"])
    used = THRESHOLDS.get(_COMPUTE.get(precision_used or "", ""), th)

    def lo(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else min(a, b)

    def hi(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else max(a, b)

    return Thresholds(
        min(th.min_cosine, used.min_cosine),
        min(th.min_top1, used.min_top1),
        lo(th.min_snr_db, used.min_snr_db),
        hi(th.max_rel_err, used.max_rel_err),
        hi(th.degenerate_atol, used.degenerate_atol),
        lo(th.min_top5, used.min_top5),
        lo(th.min_detection, used.min_detection),
        lo(th.min_iou, used.min_iou),
        lo(th.min_sequence, used.min_sequence),
        max(th.tie_rtol, used.tie_rtol),
    )


def host_notes(
    precision: str, precision_used: str | None, isa: CpuIsa | None = None, runtime: str | None = None
) -> list[str]:
    """What a parity figure measured on this CPU assumes about the device's CPU.

    int8 and bf16 results depend on the ISA: x86 CPUs without VNNI/AMX multiply u8*s8 with
    vpmaddubsw (int16 pair sums saturate), and bf16 is computed only where the CPU has it. A
    bundle built on one kind of x86 CPU runs on others, so the report says which kind it saw.
    """
    isa = isa or cpu_isa()
    notes = []
    isa_bound = runtime is None or runtime.split()[0].lower() in ("onnxruntime", "openvino")
    if precision.startswith("int8") and "avx2" in isa.flags and isa_bound:
        if isa.int8_dot_product:
            notes.append(
                "int8 measured on a CPU with an int8 dot product (VNNI/AMX: exact int32 sums); on an "
                "x86 device without it onnxruntime computes u8u8 (x64_quant_precision) and OpenVINO "
                "keeps 7-bit weights only in the first layer, so results there can differ"
            )
        else:
            notes.append(
                "int8 measured on a CPU without VNNI/AMX (AVX2 u8s8 pair sums saturate): onnxruntime "
                "computes u8u8 here unless x64_quant_precision is false; a VNNI/AMX device computes exact "
                "u8s8 and can only agree better"
            )
    if precision_used == "bf16":
        notes.append(
            "computed in bf16, this CPU's OpenVINO default (AVX512-BF16/AMX); a CPU without bf16 computes f32 and can only agree better"
        )
    return notes


def looks_like_classifier(shape: tuple[int, ...]) -> bool:
    return is_classifier(shape)


def compare(
    reference: Sequence[Mapping[str, np.ndarray]],
    candidate: Sequence[Mapping[str, np.ndarray]],
    th: Thresholds,
    *,
    task: str | Mapping[str, str] = "auto",
) -> list[OutputParity]:
    """Per-output figures and failures of ``candidate`` against ``reference`` (lists of per-sample output
    dicts). ``task``: "auto" (detected per output from its shape and the reference's values), "none", a task
    of :data:`edge.verify.tasks.TASKS` for every output it fits, or a mapping output name -> task."""
    results = []
    shapes = {name: tuple(np.shape(v)) for name, v in reference[0].items()}
    for name in reference[0]:
        if any(name not in c for c in candidate):
            results.append(
                OutputParity(
                    name, float("inf"), float("inf"), 0.0, 0.0, None, ["output missing in the converted model"]
                )
            )
            continue
        refs = [np.asarray(r[name]) for r in reference]
        cands = [np.asarray(c[name]) for c in candidate]
        if any(r.shape != c.shape for r, c in zip(refs, cands)):
            ref_shape, bad = next((r.shape, c.shape) for r, c in zip(refs, cands) if r.shape != c.shape)
            results.append(
                OutputParity(
                    name,
                    float("inf"),
                    float("inf"),
                    0.0,
                    0.0,
                    None,
                    [f"shape {list(bad)} differs from the source's {list(ref_shape)}"],
                )
            )
            continue
        wanted = task.get(name, "auto") if isinstance(task, Mapping) else task
        others = [s for n, s in shapes.items() if n != name]
        results.append(_compare_output(name, refs, cands, th, wanted, others))
    return results


@dataclass(frozen=True)
class _Cosines:
    """An output's cosines: one per sample (or one pooled), which samples carry energy, and how many count."""

    each: np.ndarray
    energetic: np.ndarray
    samples: int


def _cosines(per: int, norms_a: np.ndarray, cn: np.ndarray, dt: np.ndarray) -> _Cosines:
    """The cosine similarity from each sample's reference norm, candidate norm and dot product: one pooled over
    every sample's values for small outputs (``per < POOLED_BELOW``), else one per sample, of which the
    energetic ones (norm at least ``ENERGY_SHARE`` of the largest) count."""
    if per < POOLED_BELOW:  # one cosine over every sample's values
        den = math.sqrt(float((norms_a**2).sum())) * math.sqrt(float((cn**2).sum()))
        cos_each = np.array(
            [float(dt.sum()) / den if den > 0 else (1.0 if not norms_a.any() and not cn.any() else 0.0)]
        )
        return _Cosines(cos_each, np.array([True]), 0)
    else:
        with np.errstate(invalid="ignore", divide="ignore"):
            cos_each = np.where((norms_a == 0) & (cn == 0), 1.0, dt / (norms_a * cn))
        cos_each = np.nan_to_num(cos_each, nan=0.0)
        energetic = norms_a >= ENERGY_SHARE * norms_a.max() if norms_a.max() > 0 else np.zeros(len(norms_a), bool)
        return _Cosines(cos_each, energetic, int(energetic.sum()))


def _worst_sample_snr(per: int, norms: list[float], err_each: list[float], energetic: np.ndarray) -> float | None:
    """The lowest per-sample SNR over the samples that count (every sample when the cosine was pooled)."""
    snr_each = [
        _snr(n * n, e)
        for n, e, en in zip(norms, err_each, energetic if per >= POOLED_BELOW else [True] * len(norms))
        if en
    ]
    return min((s for s in snr_each if s is not None), default=None)


def _compare_output(
    name: str,
    refs: list[np.ndarray],
    cands: list[np.ndarray],
    th: Thresholds,
    wanted: str,
    others: Sequence[tuple[int, ...]] = (),
) -> OutputParity:
    """One output, one sample at a time (a recognizer's [1, 40, 18710] logits over 32 samples would be
    190 MB as one float64 stack)."""
    per = int(np.prod(refs[0].shape)) if refs[0].shape else 1
    finite = True
    ref2 = err2 = abs_sum = 0.0
    max_abs, rmin, rmax, count = 0.0, math.inf, -math.inf, 0
    norms, dots, cnorms, err_each = [], [], [], []
    for r, c in zip(refs, cands):
        a = r.astype(np.float64, copy=False).ravel()
        b = c.astype(np.float64, copy=False).ravel()
        ok = bool(np.isfinite(b).all())
        finite &= ok
        d = np.abs(a - b)
        if not ok:
            d = np.nan_to_num(d, nan=np.inf, posinf=np.inf)  # nan_to_num makes inf the largest float
        max_abs = max(max_abs, float(d.max()) if d.size else 0.0)
        abs_sum += float(d.sum())
        count += d.size
        e2 = float(np.square(d).sum())
        r2 = float(np.square(a).sum())
        ref2, err2 = ref2 + r2, err2 + e2
        err_each.append(e2)
        if a.size:
            rmin, rmax = min(rmin, float(a.min())), max(rmax, float(a.max()))
        norms.append(math.sqrt(r2))
        cnorms.append(float(np.linalg.norm(np.nan_to_num(b))))
        dots.append(float(np.dot(a, np.nan_to_num(b))))
    norms_a, cn, dt = np.array(norms), np.array(cnorms), np.array(dots)
    cos = _cosines(per, norms_a, cn, dt)
    cos_each, energetic, cos_samples = cos.each, cos.energetic, cos.samples
    # The gate uses the mean over samples; the worst sample is reported beside it. A worst-sample
    # gate failed a trained 2-class softmax classifier at int8 (cosine 0.93 on one sample of
    # probabilities like [0.9, 0.1] vs [0.7, 0.3]) whose top-1 and held-out accuracy were unchanged.
    used = cos_each[energetic] if energetic.any() else cos_each
    cosine, cosine_min = float(used.mean()), float(used.min())
    snr = _snr(ref2, err2)
    snr_min = _worst_sample_snr(per, norms, err_each, energetic)
    span = rmax - rmin if count else 0.0
    rel = max_abs / span if span > 0 and math.isfinite(max_abs) else None
    o = OutputParity(
        name,
        float(max_abs),
        float(abs_sum / max(count, 1)),
        cosine,
        cosine_min,
        None,
        snr_db=snr,
        snr_db_min=snr_min,
        rel_max_abs=rel,
        ref_min=rmin if count else None,
        ref_max=rmax if count else None,
        cosine_samples=cos_samples,
    )
    reason = degenerate_reason(o.ref_min, o.ref_max, len(refs))
    o.degenerate = reason is not None
    o.degenerate_note = NOT_DISCRIMINATING + reason if reason is not None else None
    _task(o, wanted, refs[0].shape, refs, cands, others, th.tie_rtol)
    if not finite:
        o.failures.append("NaN or Inf in the converted model's output")
    else:
        o.failures += output_failures(o, th)
    return o


def _snr(ref2: float, err2: float) -> float | None:
    if not (math.isfinite(ref2) and math.isfinite(err2)) or ref2 <= 0:
        return None if ref2 <= 0 or not math.isfinite(ref2) else -SNR_EXACT
    if err2 <= 0:
        return SNR_EXACT
    return round(max(-SNR_EXACT, min(SNR_EXACT, 10.0 * math.log10(ref2 / err2))), 3)


def _judge(
    task: str, shape: tuple[int, ...], refs: list[np.ndarray], cands: list[np.ndarray], tie_rtol: float
) -> TaskFigures:
    lo, hi = column_range(refs)
    blank = blank_share(refs) if task == "sequence" else 0.0
    judge = TaskJudge(task, shape, lo, hi, ctc_blank_share=blank, tie_rtol=tie_rtol)
    for r, c in zip(refs, cands):
        judge.add(r, np.nan_to_num(c))
    return judge.result()


def guess_task(name: str, refs: Sequence[np.ndarray], others: Sequence[tuple[int, ...]] = ()) -> TaskGuess:
    """What ``--task auto`` concludes about one output from the reference's values (:func:`explain_task`)."""
    shape = tuple(np.shape(refs[0]))
    lo, hi = column_range(refs)
    rows = row_kind(refs) if len(shape) in (2, 3) or is_classifier(shape) else None
    channels = row_kind(refs, axis=1) if len(shape) == 4 and shape[1] >= 2 else None
    blank = blank_share(refs) if len(shape) == 3 else 0.0
    independent = rows is None and len(shape) in (2, 3) and unit_rows(refs)
    return explain_task(
        name, shape, lo, hi, blank, others=others, rows=rows, channel_rows=channels, independent=independent
    )


def _task(
    o: OutputParity,
    wanted: str,
    shape: tuple[int, ...],
    refs: list[np.ndarray],
    cands: list[np.ndarray],
    others: Sequence[tuple[int, ...]] = (),
    tie_rtol: float = 0.0,
) -> None:
    """Judge ``o`` by the task asked for, else by the one its evidence makes unambiguous (``--task auto``); a
    classifier keeps its top-1 gate under any --task. Where no task applies, ``task_note`` says why."""
    guess = guess_task(o.name, refs, others)
    lo, hi = column_range(refs)
    kept = guess.task if guess.task in ("classifier", "multi-label") else None  # gated under any --task
    if wanted in ("auto", "none"):
        task = guess.task if wanted == "auto" else kept
        if task is None and wanted == "auto":
            o.task_note = guess.evidence
    elif fits(wanted, shape, lo, hi):
        task = wanted
    else:
        o.task_note = f"--task {wanted} does not fit this output's shape {list(shape)}: raw figures only"
        task = kept
    if task is None:
        return
    figs = _judge(task, shape, refs, cands, tie_rtol)
    if task == "classifier" and wanted not in ("auto", task):  # top-1 only: the classifier gate under another --task
        o.top1 = figs.figures["top1"]
        return
    o.task, o.task_degenerate = task, figs.degenerate
    o.task_note = figs.note if wanted != "auto" else "; ".join(x for x in (guess.evidence, figs.note) if x)
    for k, v in figs.figures.items():
        if hasattr(o, k) and k not in ("name",):
            setattr(o, k, v)


def _ort_version() -> str:
    try:
        from importlib.metadata import version

        return version("onnxruntime")
    except Exception:  # noqa: BLE001
        return "?"


#: who computes the reference for an ONNX source
REFERENCE = f"onnxruntime {_ort_version()} fp32 CPUExecutionProvider"
#: how long the source may run as parity's reference over all its samples before it is stopped (seconds)
REFERENCE_TIMEOUT_S = 300.0


def _ort_message(e: BaseException) -> str:
    """onnxruntime's error in one short line: the status message, without the C++ source location."""
    text = " ".join(str(e).split())
    text = re.sub(r"/onnxruntime_src/\S+ [^)]*\)\s*", "", text)
    return text if len(text) <= 240 else text[:237] + "..."


def reference_timeout_s() -> float:
    """How long the source may run as parity's reference, over every sample: ``$EDGEKIT_PARITY_TIMEOUT_S``, else
    :data:`REFERENCE_TIMEOUT_S`."""
    return seconds_from_env("EDGEKIT_PARITY_TIMEOUT_S", REFERENCE_TIMEOUT_S)


def reference_outputs(source_onnx: Path, samples: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """The source's outputs on ``samples`` in onnxruntime, within :func:`reference_timeout_s` (a ``Loop`` whose trip
    count is 10^15 runs for ever: onnxruntime's terminate flag stops it, and the model is refused in one line)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    sess = ort.InferenceSession(str(source_onnx), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    limit = reference_timeout_s()
    run_options = ort.RunOptions()

    def stop() -> None:
        run_options.terminate = True

    timer = threading.Timer(limit, stop)
    timer.daemon = True
    timer.start()
    try:
        return [dict(zip(names, sess.run(names, dict(s), run_options))) for s in samples]
    except Exception as e:
        if run_options.terminate:
            raise ModelError(
                f"the source model ran longer than {limit:g} s on {len(samples)} parity "
                "sample(s) and was stopped (a Loop that does not end?)",
                hint="set $EDGEKIT_PARITY_TIMEOUT_S for a model that is only slow",
            ) from None
        if type(e).__module__.startswith("onnxruntime"):  # the model fails in its own runtime: a model problem
            raise ModelError(f"the source model fails in onnxruntime: {_ort_message(e)}") from None
        raise
    finally:
        timer.cancel()


def check_parity(
    runner: Runner,
    samples: Sequence[Mapping[str, np.ndarray]],
    reference: Sequence[Mapping[str, np.ndarray]],
    *,
    precision: str,
    inputs: str,
    reference_label: str,
    host_proxy: str | None = None,
    task: str = "auto",
    input_provenance: Mapping[str, Any] | None = None,
    shipped_as_is: bool = False,
) -> ParityReport:
    """The one parity service: ``runner`` (the bundle's, or a host proxy for it) against ``reference``
    (the source model's outputs on ``samples``, from the source's own reference runtime). ``task``: see
    :func:`compare`; ``input_provenance``: where ``samples`` came from, for the manifest.

    ``shipped_as_is``: the bundle's file is, byte for byte, the file the reference ran. Nothing was converted,
    so parity is exact by identity and recorded so; the runner still runs (the bundle must load), and how far
    its runtime's arithmetic strays from the reference runtime's on this host is a note, not a verdict on a
    conversion that did not happen."""
    cand = [runner.infer(s) for s in samples]
    th = thresholds_for(precision, runner.info.precision_used)
    notes = host_notes(precision, runner.info.precision_used, runtime=runner.info.runtime)
    if host_proxy:
        notes.insert(0, host_proxy)
    outputs = compare(list(reference), cand, th, task=task)
    if shipped_as_is:
        drift = ", ".join(f"{o.name} cosine {o.cosine:.6f} max abs {o.max_abs:.3g}" for o in outputs)
        notes.insert(
            0,
            f"the bundle ships the reference's file byte for byte: parity exact by identity; "
            f"{runner.info.runtime} on this host gave {drift}"[:1000],
        )
        outputs = compare(list(reference), list(reference), th, task=task)
    return ParityReport(
        precision=precision,
        thresholds=th,
        samples=len(samples),
        inputs=inputs,
        reference=reference_label,
        candidate=runner.info.to_json(),
        outputs=outputs,
        host_notes=notes,
        task=task,
        input_provenance=dict(input_provenance) if input_provenance is not None else None,
        shipped_as_is=shipped_as_is,
    )
