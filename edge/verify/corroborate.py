"""Does the rest of the evidence bear out what one recorded figure claims? (issue #33, red team)

An unsigned manifest can be edited; the gates recompute verdicts from the figures, but a figure that decides
*how* the others are judged (a reference range that makes an output "degenerate", a task note that drops a
top-1 gate, a budget said to be the profile's, a no-reference skip) must agree with what else is recorded, or
with what this host can see for itself. Each function returns the problem in words, or None.
"""

from __future__ import annotations

import importlib.util
import math
import re
from typing import Any

from edge.verify.parity import degenerate_reason

#: the source formats whose adapter computes the parity reference itself (edge.pipeline.sources): the
#: no-reference skip cannot have been written for them where their runtime is installed
_REFERENCE_RUNTIME = {"onnx": "onnxruntime", "tflite": "ai_edge_litert", "openvino-ir": "openvino"}
#: a recorded float figure past float32's range is no output a runtime produced
_F32_MAX = 3.4028234663852886e38
_FPS = re.compile(r"([0-9.eE+-]+) fps")
_MS = re.compile(r"([0-9.eE+-]+) ms")
#: the notes edge.verify.parity / edge.verify.tasks write when a classifier-shaped output is judged on raw figures
_RAW_ONLY = "raw figures only"
_LABELS = "labels at >="  # edge.verify.tasks' note for a multi-label output


def source_runs_here(fmt: str | None) -> str | None:
    """The runtime that runs a source of format ``fmt`` as parity's reference on this host (None: none here)."""
    mod = _REFERENCE_RUNTIME.get(fmt or "")
    if mod is None:
        return None
    try:
        return mod if importlib.util.find_spec(mod) is not None else None
    except (ImportError, ValueError):
        return None


def no_reference_problem(m: Any) -> str | None:
    """A "no reference outputs: the source could not be run here" skip for a source this host runs."""
    fmt = m.source.format if m.source is not None else None
    runtime = source_runs_here(fmt)
    if runtime is None:
        return None
    return (
        f"it says the source could not be run, but its format ({fmt}) runs here in {runtime}: its parity can be checked"
    )


def range_problem(o: Any) -> str | None:
    """An output's recorded reference range against its other figures: ordered, inside float32, the
    range-normalised error ``rel_max_abs = max_abs / span`` consistent with it, and, for a range that says the
    reference is constant at ``c``, a cosine and SNR no lower than a candidate within ``max_abs`` of ``c`` has."""
    lo, hi = o.ref_min, o.ref_max
    if lo is None or hi is None:
        return None
    if not (math.isfinite(lo) and math.isfinite(hi)) or max(abs(lo), abs(hi)) > _F32_MAX:
        return f"its reference range [{lo:.3g}, {hi:.3g}] is not a float32 output's"
    if lo > hi:
        return f"its reference range is inverted (min {lo:.3g} > max {hi:.3g})"
    span, m = hi - lo, o.max_abs
    rel = getattr(o, "rel_max_abs", None)
    if rel is not None and math.isfinite(m):
        if span <= 0:
            return f"it records an error relative to the reference's range ({rel:.3g}) for a range of 0"
        if not math.isclose(rel, m / span, rel_tol=1e-3, abs_tol=1e-12):
            return f"its relative error {rel:.3g} is not max abs error / range ({m:.3g} / {span:.3g})"
    if degenerate_reason(lo, hi) is None or not math.isfinite(m):
        return None
    if rel is not None and span > 1e-5 * max(1.0, abs(lo), abs(hi)):
        return None  # a ~0 / ~1 probability: not constant, the figures above agree with the range
    c = max(abs(lo), abs(hi))
    if c <= m:
        return None  # a candidate within max_abs of c may have any sign: nothing implied
    cos_floor = (c - m) / (c + m)  # every y within m of c has c's sign: mean(y) / rms(y) >= (c - m) / (c + m)
    cos_n = getattr(o, "cosine_samples", None)
    if cos_n != 0 and math.isfinite(o.cosine) and o.cosine < cos_floor - 1e-6:
        return (
            f"it says the reference is constant at {c:.3g}, but a candidate within {m:.3g} of it has cosine >= "
            f"{cos_floor:.6f} and the record says {o.cosine:.6f}"
        )
    snr = getattr(o, "snr_db", None)
    if snr is not None and m > 0 and snr < 20 * math.log10(c / m) - 0.01:
        return f"it says the reference is constant at {c:.3g}, but its SNR {snr:.1f} dB is under {20 * math.log10(c / m):.1f} dB"
    return None


def task_note_problem(o: Any, refs: list[Any] | None = None) -> str | None:
    """A classifier-shaped output with no top-1 figure, excused by its ``task_note``: the note must be one parity
    writes (it judged the output on raw figures) and the evidence must not say classifier: an output named as
    class scores, or reference outputs (the bundle's pairs, ``refs``) whose rows are probabilities."""
    from edge.verify.tasks import SCORE_NAMES, VALUE_NAMES, row_kind, unit_rows

    note = o.task_note or ""
    if getattr(o, "task", None) == "multi-label":  # judged by its labels, not one class (issue #34)
        if _LABELS not in note:
            return f"its task note {note[:80]!r} is not one parity writes for a multi-label output"
        if getattr(o, "iou", None) is None and not getattr(o, "task_degenerate", False):
            return "it is judged multi-label without a label IoU"
        if refs and not unit_rows(refs):
            return "its reference outputs are not independent probabilities in [0, 1]: parity gates its top-1"
        return None
    if _RAW_ONLY not in note:
        return f"its task note {note[:80]!r} is not one parity writes for an output judged on raw figures"
    if SCORE_NAMES.search(o.name) and not VALUE_NAMES.search(o.name):
        return f"it is named as class scores ({o.name!r}): parity gates its top-1"
    if refs:
        rows = row_kind(refs)
        if rows is not None:
            return f"its reference outputs are {rows} over every row: a classifier, parity gates its top-1"
    return None


def budget_problem(budget_ms: float | None, source: str, profile_ms: float | None, target: str) -> str | None:
    """A benchmark's budget against the source it names: "target profile" is the profile's frame budget, "N fps"
    is 1000/N ms, "N ms" is N; "none" is no budget. Anything else is no source edgekit writes."""
    if source == "tune" or budget_ms is None:  # no budget: judged against the profile's (gates._budget)
        return None
    if source == "none":
        return None if budget_ms is None else f"its budget source says none, yet it has {budget_ms:g} ms"
    if source == "target profile":
        want = profile_ms
        if want is None:
            return None  # the profile is not on this host's search path: the device-class gate says so
    elif (hit := _FPS.fullmatch(source)) is not None:
        try:
            want = 1000.0 / float(hit.group(1))
        except (ValueError, ZeroDivisionError):
            return f"its budget source {source[:40]!r} is no frame rate"
    elif (hit := _MS.fullmatch(source)) is not None:
        try:
            want = float(hit.group(1))
        except ValueError:
            return f"its budget source {source[:40]!r} is no budget"
    else:
        return f"its budget source {source[:60]!r} is not one edgekit writes"
    if not math.isclose(budget_ms, want, rel_tol=1e-3):
        return f"its budget is {budget_ms:g} ms, but its source ({source}) is {want:g} ms for {target}"
    return None


def isa_problem(m: Any) -> str | None:
    """A ``verified_on`` entry that failed, or that says passed with failures listed."""
    for e in m.verified_on:
        if e.passed and (e.failures or e.reference_check is False):
            return (
                f"its {e.label} evidence says passed with failures ({(e.failures or ('reference check failed',))[0]})"
            )
        if not e.passed:
            why = e.failures[0] if e.failures else "no reason recorded"
            return f"its reference pairs failed {e.label} ({why})"
    return None
