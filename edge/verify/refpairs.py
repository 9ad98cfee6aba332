"""Reference pairs: a bundle's own parity check, run on the device where the bundle runs.

The build host keeps a few of the parity inputs with the source model's outputs in
``reference.npz``, a bundle file like any other (listed and hashed in the manifest, so an altered
one fails ``Bundle.verify``). On first load the device runs the inputs through its runner and
judges them as parity did on the build host (:func:`edge.verify.parity.compare` and
:func:`edge.verify.parity.output_failures`: raw figures, SNR, and the task each output was judged by, which the
manifest's parity evidence records), with :func:`edge.verify.parity.thresholds_for` the bundle's precision and
the small-sample rules of :func:`pair_limits`: this is
how a TensorRT engine, Core ML on the ANE or the Edge TPU is verified on the hardware that really
computes it, which the build host cannot do.

The file (``reference.npz``: its layout, writing it and reading it untrusted) is
:mod:`edge.verify.refpairs_file`; a language model's pairs are :mod:`edge.verify.refpairs_llm`. The names other code
reads from here (writing, loading, the file's limits) are re-exported.

Device side: standard library and numpy only (``edge.verify.parity`` imports no runtime at module level).
"""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime, timezone
from typing import Any, Literal, Mapping, Protocol, Sequence

import numpy as np

from edge.errors import EdgeError
from edge.verify.parity import (
    THRESHOLDS,
    Thresholds,
    compare,
    degenerate_reason,
    output_failures,
    thresholds_for,
    unverified_reason,
)
from edge.verify.refpairs_file import MAX_BYTES as MAX_BYTES
from edge.verify.refpairs_file import MAX_SAMPLES as MAX_SAMPLES
from edge.verify.refpairs_file import REFERENCE_FILE as REFERENCE_FILE
from edge.verify.refpairs_file import ReferencePairs as ReferencePairs
from edge.verify.refpairs_file import entry_field, finite_or_none
from edge.verify.refpairs_file import load_reference_pairs as load_reference_pairs
from edge.verify.refpairs_file import write_reference_pairs as write_reference_pairs
from edge.verify.refpairs_llm import check_llm
from edge.verify.refpairs_llm import write_llm_reference_pairs as write_llm_reference_pairs

CheckMode = bool | Literal["first"]


# -- checking (device) ---------------------------------------------------------------------------

#: below this many reference pairs the device reports the task's agreement figures (top-1/top-5, decoded
#: sequences, detection precision/recall, map IoU) and does not gate on them: one flip among 4 is 25 points
MIN_TOP1_SAMPLES = 10
#: how much more error energy than the build host's worst parity sample a device may show before its raw
#: figures fail where the pairs are fewer than parity's samples (1 dB: a factor 1.26 on 1 - cosine, on the
#: error energy, 1.12 on the max error) -- room for another CPU's arithmetic (int8 with or without VNNI)
DEVICE_SLACK_DB = 1.0
#: the most parity samples the device believes a bundle's record about (the pipeline refuses more): an edited
#: ``parity.samples`` of 2^20 would otherwise loosen an agreement floor to 0 and a swapped model would pass
MAX_PARITY_SAMPLES = 4096


def gate_thresholds(entry_thresholds: Any, precision: str, precision_used: str | None) -> Thresholds:
    """The limits the device checks with: this edgekit's :func:`edge.verify.parity.thresholds_for` the bundle's
    precision (every figure parity gates: cosine, SNR, range-normalised error, the task figures), each made
    stricter where the bundle's own (``entry_thresholds``) is; where the runtime computes in something coarser
    (``precision_used``), this edgekit's limits for that instead, as parity does. A bundle's file can only
    tighten the gate, never loosen it."""
    code = THRESHOLDS.get(precision, THRESHOLDS["int8"])
    used = thresholds_for(precision, precision_used)
    if used != code:
        return used
    merged: dict[str, float | None] = {}
    for f in dataclasses.fields(Thresholds):
        c, e = getattr(code, f.name), entry_field(entry_thresholds, f.name)
        bad = not isinstance(e, (int, float)) or isinstance(e, bool) or not math.isfinite(e)
        if c is None or bad or f.name == "tie_rtol":  # the tie tolerance is this edgekit's, never a bundle's word
            merged[f.name] = c
        else:  # min_*: the higher; max_* / degenerate_atol: the lower
            merged[f.name] = (
                min(c, float(e)) if f.name.startswith("max_") or f.name == "degenerate_atol" else max(c, float(e))
            )
    return Thresholds(**merged)  # type: ignore[arg-type]


_AGREEMENT = (
    ("min_top1", "top1"),
    ("min_top5", "top5"),
    ("min_detection", "precision"),
    ("min_detection", "recall"),
    ("min_iou", "iou"),
    ("min_sequence", "tokens"),
)


def _built_outputs(bundle: Any, precision_used: str | None = None) -> tuple[dict[str, Any], int, bool]:
    """The build host's parity figures per output name, its sample count, and whether it passed (not
    accepted as a failure): what the device's pairs are judged beside. Empty for an older bundle, a
    parity that was skipped, or a language model's.

    Where the device computes in a precision the build host tried and passed (``parity.precision_trials``:
    OpenVINO's bf16 on a CPU that lists BF16), the figures are that trial's, on the same samples: the device is
    judged at the trial's limits (``gate_thresholds``), so beside what the trial accepted, not the f32 run's figures
    (U^2-Net-p passed its bf16 trial at mean cosine 0.9972 over 32 samples, worst 0.9839; its 2 stored pairs
    measure 0.9949, and beside the f32 run's worst, 0.99977, nothing was loosened: its own check refused it)."""
    par = getattr(getattr(bundle, "info", None), "parity", None)
    outs, samples = getattr(par, "outputs", None), getattr(par, "samples", None)
    if not outs or not isinstance(samples, int) or getattr(par, "kind", None) != "vision":
        return {}, 0, False
    passed = getattr(par, "passed", None) is True and not getattr(par, "accepted_failure", False)
    trials = getattr(par, "precision_trials", None) or ()
    trial = next((t for t in trials if t.passed and precision_used is not None and t.compute == precision_used), None)
    if trial is not None and {o.name for o in trial.outputs} == {o.name for o in outs}:
        outs = trial.outputs
    return {o.name: o for o in outs}, samples, passed


def pair_limits(
    o: Any, th: Thresholds, built: Any | None, pairs: int, parity_samples: int, parity_passed: bool
) -> tuple[Thresholds, list[str]]:
    """The limits one output's figures on ``pairs`` reference pairs are judged by (``o``: its
    :class:`edge.verify.parity.OutputParity` on them), and what was changed from ``th`` and why.

    The rules are parity's (:func:`edge.verify.parity.output_failures`); what differs is the sample. The pairs
    are the first ``pairs`` of the ``parity_samples`` inputs parity passed on (``built``: its figures for
    this output), and a mean over a few of them is not the mean over all: PP-OCRv6 rec int8 passed at mean
    cosine 0.986 over 32 samples, worst 0.930, and its 2 stored pairs measure 0.975. So:

    * below :data:`MIN_TOP1_SAMPLES` pairs the task's agreement figures are reported, not gated;
    * where the pairs are fewer than parity's samples and parity passed, each raw figure's limit is
      loosened to what parity accepted in its worst sample (cosine, SNR), and each agreement figure's to
      what parity's count allows among ``pairs`` samples (all its disagreements among them), less
      :data:`DEVICE_SLACK_DB` of device arithmetic for the raw ones. A mean over pairs is at least their
      worst, and each pair's figure on the build host is at least parity's worst, so a bundle that passed
      parity passes its own check on the build host by construction; a device computing something else
      (a saturated fp16 map: cosine 0.03) is far under both.
    """
    changed: dict[str, Any] = {}  # Thresholds field -> its value here (None: not gated)
    notes: list[str] = []
    if pairs < MIN_TOP1_SAMPLES:
        _agreement_off(o, th, pairs, parity_samples, changed, notes)
    parity_samples = min(parity_samples, MAX_PARITY_SAMPLES)
    # the build host's figures loosen nothing unless they pass this device's own limits (never the record's word)
    if built is None or not parity_passed or not 0 < pairs < parity_samples or output_failures(built, th):
        return dataclasses.replace(th, **changed), notes
    energy, amplitude = 10 ** (DEVICE_SLACK_DB / 10), 10 ** (DEVICE_SLACK_DB / 20)
    loosened: list[str] = []
    cmin, cmean = getattr(built, "cosine_min", None), getattr(built, "cosine", None)
    if isinstance(cmin, (int, float)) and isinstance(cmean, (int, float)) and math.isfinite(cmean):
        # a mean over parity_samples figures <= 1 bounds its worst: a record claiming worse was edited
        cmin = max(cmin, 1.0 - parity_samples * (1.0 - min(1.0, cmean)))
    smin = getattr(built, "snr_db_min", None)
    smin = float(smin) if isinstance(smin, (int, float)) and math.isfinite(smin) else None
    pooled = getattr(built, "cosine_samples", None) == 0 and smin is not None
    if pooled and smin is not None and th.min_cosine is not None:
        _pooled_cosine_floor(th, smin, changed, loosened)
    elif isinstance(cmin, (int, float)) and math.isfinite(cmin) and th.min_cosine is not None:
        floor = 1.0 - (1.0 - min(1.0, cmin)) * energy
        if floor < th.min_cosine:
            changed["min_cosine"] = floor
            loosened.append(f"cosine >= {floor:.6f} (parity's worst sample {cmin:.6f})")
    if th.min_snr_db is not None and isinstance(smin, (int, float)) and math.isfinite(smin):
        floor = smin - DEVICE_SLACK_DB
        if floor < th.min_snr_db:
            changed["min_snr_db"] = floor
            loosened.append(f"SNR >= {floor:.1f} dB (parity's worst sample {smin:.1f} dB)")
    bmax = getattr(built, "max_abs", None)
    if isinstance(bmax, (int, float)) and math.isfinite(bmax) and o.ref_min is not None and o.ref_max is not None:
        span, scale = o.ref_max - o.ref_min, max(1.0, abs(o.ref_min), abs(o.ref_max))
        if th.max_rel_err is not None and span > 0 and bmax * amplitude / span > th.max_rel_err:
            changed["max_rel_err"] = bmax * amplitude / span
            loosened.append(f"max abs error <= {bmax * amplitude:.3g} (parity's)")
        if (
            th.degenerate_atol is not None
            and degenerate_reason(o.ref_min, o.ref_max) is not None
            and bmax * amplitude / scale > th.degenerate_atol
        ):
            changed["degenerate_atol"] = bmax * amplitude / scale
            loosened.append(f"max abs error on a degenerate reference <= {bmax * amplitude:.3g} (parity's)")
    _loosen_agreement(th, built, pairs, parity_samples, changed, loosened)
    if loosened:
        notes.append(
            f"{pairs} of parity's {parity_samples} samples: judged by what parity accepted sample-wise "
            "where a mean over a few is under the rule: " + ", ".join(loosened)
        )
    return dataclasses.replace(th, **changed), notes


def _pooled_cosine_floor(th: Thresholds, snr_min: float, changed: dict[str, Any], loosened: list[str]) -> None:
    """The cosine limit for a small output whose parity cosine was pooled (one figure over every sample's values,
    ``cosine_samples`` 0): that figure bounds nothing about a subset's pooled cosine (PP-OCR cls int8 on OpenVINO:
    0.988 over 32 samples, 0.978 over the 16 stored pairs). The worst sample's SNR does: each pair has
    ``|a - b|^2 <= r |a|^2`` with ``r = 10^(-snr/10)``, so any subset does too, and then ``cos(a, b) >= sqrt(1 - r)``."""
    r = 10 ** (-(snr_min - DEVICE_SLACK_DB) / 10)
    floor = math.sqrt(1.0 - r) if r < 1.0 else 0.0
    if th.min_cosine is not None and floor < th.min_cosine:
        changed["min_cosine"] = floor
        loosened.append(f"pooled cosine >= {floor:.6f} (from parity's worst sample SNR {snr_min:.1f} dB)")


def _agreement_off(
    o: Any, th: Thresholds, pairs: int, parity_samples: int, changed: dict[str, Any], notes: list[str]
) -> None:
    """Below :data:`MIN_TOP1_SAMPLES` pairs the task's agreement figures are reported, not gated."""
    off = {
        k: (0.0 if k == "min_top1" else None)
        for k, fig in _AGREEMENT
        if getattr(o, fig, None) is not None and getattr(th, k) not in (None, 0.0)
    }
    if off:
        changed.update(off)
        notes.append(
            f"task agreement over {pairs} pair(s) is reported, not gated (one flip is "
            f"{100 / max(pairs, 1):.0f} points; the build host gated it over {parity_samples or 'more'})"
        )


def _loosen_agreement(
    th: Thresholds, built: Any, pairs: int, parity_samples: int, changed: dict[str, Any], loosened: list[str]
) -> None:
    """Each agreement figure's limit loosened to what parity's count allows among ``pairs`` samples."""
    for key, fig in _AGREEMENT:
        limit, got = changed.get(key, getattr(th, key)), getattr(built, fig, None)
        if not limit or not isinstance(got, (int, float)):
            continue
        floor = max(0.0, 1.0 - (1.0 - got) * parity_samples / pairs)
        if floor < limit:
            changed[key] = floor  # (precision and recall share min_detection: the lower floor stays)
            loosened.append(f"{fig} >= {floor:.1%} (parity's {got:.1%} over {parity_samples})")


def snr_db(reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray]) -> float | None:
    """10*log10(sum(ref^2) / sum(err^2)) over all samples; None when it is not finite (no error at all,
    or an all-zero reference). Each candidate has its reference's shape; samples may differ in shape (a decoder's
    steps: issue #34), so they are summed one by one, never stacked."""
    p_ref = p_err = 0.0
    for r, c in zip(reference, candidate, strict=True):
        ref, cand = np.asarray(r, dtype=np.float64), np.asarray(c, dtype=np.float64)
        if ref.shape != cand.shape:
            raise ValueError(f"a candidate of shape {cand.shape} for a reference of shape {ref.shape}")
        p_ref, p_err = p_ref + float((ref**2).sum()), p_err + float(((ref - cand) ** 2).sum())
    if not (math.isfinite(p_ref) and math.isfinite(p_err)) or p_ref <= 0 or p_err <= 0:
        return None
    return round(10.0 * math.log10(p_ref / p_err), 3)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _reference_sha256(bundle: Any, rel: str | None) -> str | None:
    if rel is None:
        return None
    return next((a.sha256 for a in bundle.info.artifacts if a.path == rel), None)


def runner_json(runner: Any) -> dict[str, Any]:
    """``runner.info`` as JSON, without the reference check it carries (which names the runner itself)."""
    info: dict[str, Any] = runner.info.to_json()
    info["details"] = {k: v for k, v in (info.get("details") or {}).items() if k != "reference_check"}
    return info


def _pairs_snr(name: str, candidate: list[dict[str, Any]], refs: list[dict[str, np.ndarray]]) -> float | None:
    """Output ``name``'s SNR (dB) over every pair, or None where a candidate lacks it or has another shape."""
    snr = None
    if all(name in c and np.shape(c[name]) == np.shape(r[name]) for c, r in zip(candidate, refs)):
        snr = snr_db([r[name] for r in refs], [c[name] for c in candidate])
    return snr


def _output_record(o: Any, snr: float | None, limits: Thresholds, th: Thresholds) -> dict[str, Any]:
    """One output's JSON-able record: its figures, task figures and notes, its limits where they differ from
    ``th``, whether it passed and its failures."""
    rec: dict[str, Any] = {
        "name": o.name,
        "cosine": finite_or_none(o.cosine),
        "cosine_min": finite_or_none(o.cosine_min),
        "max_abs": finite_or_none(o.max_abs),
        "mean_abs": finite_or_none(o.mean_abs),
        "top1": finite_or_none(o.top1),
        "snr_db": snr,
        "task": o.task,
    }
    rec.update(
        {
            f: finite_or_none(getattr(o, f))
            for f in ("top5", "precision", "recall", "iou", "sequence", "tokens")
            if getattr(o, f) is not None
        }
    )
    for f in ("task_note", "degenerate_note", "task_degenerate"):
        if getattr(o, f, None):
            rec[f] = getattr(o, f)  # task_degenerate: the pairs cannot judge the task (no detections among them)
    if limits != th:
        rec["limits"] = limits.to_json()
    rec.update(passed=o.passed, failures=list(o.failures))
    return rec


def check_reference_pairs(bundle: Any, runner: Any) -> dict[str, Any]:
    """Run ``bundle``'s reference inputs through ``runner`` (opened on it) and compare with the
    reference outputs, judged as parity judged the bundle on the build host: each output by the task its
    parity evidence records (``"auto"`` for a bundle without one), with :func:`gate_thresholds` and the
    small-sample limits of :func:`pair_limits`. Returns a JSON-able record: ``passed`` (None, with
    ``skipped``, when there is nothing to check), ``samples``, ``parity_samples``, ``thresholds``,
    per-output ``outputs`` (cosine, max/mean abs, top-1, ``snr_db``, ``task`` and its figures, ``limits``
    where they differ from ``thresholds``, failures), ``failures``, ``notes``, ``runner`` (the device
    actually used) and ``checked_utc``. A file that cannot be used is a :class:`BundleError`; a runner that refuses
    the inputs raises its ``EdgeError``."""
    entry = bundle.info.reference_pairs
    rel = entry.file if entry is not None else None
    result: dict[str, Any] = {
        "passed": None,
        "samples": 0,
        "bundle_id": bundle.id,
        "reference_sha256": _reference_sha256(bundle, rel),
        "outputs": [],
        "failures": [],
    }
    if entry is None:
        result["skipped"] = "the bundle carries no reference pairs (built before they were written)"
    elif rel is None:
        result["skipped"] = entry.note or "the bundle carries no reference pairs"
    if "skipped" in result:
        return {**result, "runner": runner_json(runner), "checked_utc": _now()}
    if bundle.kind == "llm":
        return {**check_llm(bundle, runner, entry, result), "runner": runner_json(runner), "checked_utc": _now()}
    pairs = load_reference_pairs(bundle.path, entry, bundle.io)
    th = gate_thresholds(entry.thresholds, bundle.precision, runner.info.precision_used)
    built, parity_samples, parity_passed = _built_outputs(bundle, runner.info.precision_used)
    # the task parity judged each output by (recorded in the manifest), not one detected again from a few pairs
    tasks = {name: (b.task or "none") for name, b in built.items()}
    candidate = [runner.infer(feeds) for feeds in pairs.inputs]
    figures = compare(pairs.outputs, candidate, th, task=tasks or "auto")
    k = len(pairs.inputs)
    outputs, notes = [], []
    for o in figures:
        b = built.get(o.name)
        if b is not None and b.task is None and b.top1 is None:
            o.top1 = None  # parity judged it on raw figures only (an anchor head's scores are not classes)
        limits, why = pair_limits(o, th, b, k, parity_samples, parity_passed)
        if math.isfinite(o.max_abs) and math.isfinite(o.mean_abs):  # else compare() named the cause
            o.failures = output_failures(o, limits)
        outputs.append(_output_record(o, _pairs_snr(o.name, candidate, pairs.outputs), limits, th))
        notes += [f"{o.name}: {n}" for n in why]
    result.update(
        passed=all(o.passed for o in figures),
        samples=k,
        thresholds=th.to_json(),
        reference=entry.reference,
        outputs=outputs,
        failures=[f"{o.name}: {f}" for o in figures for f in o.failures],
    )
    if built:
        result["parity_samples"] = parity_samples
    if notes:
        result["notes"] = notes
    # pairs whose every reference is constant check nothing on the device either (issue #23): said, not passed silently
    unverified = unverified_reason([degenerate_reason(o.ref_min, o.ref_max, k) for o in figures])
    if result["passed"] and unverified is not None:
        result["unverified"] = unverified
    return {**result, "runner": runner_json(runner), "checked_utc": _now()}


class CheckRecords(Protocol):
    """Where a device keeps check results between loads (``edge.store.local.DeviceStore``)."""

    def reference_check(self, bundle_id: str) -> dict[str, Any] | None: ...

    def record_reference_check(self, bundle_id: str, result: Mapping[str, Any]) -> Any: ...


def _still_valid(rec: Any, bundle: Any, runner: Any) -> bool:
    """A recorded result answers for this load when it is about the same bundle, the same reference
    file, and the same runtime, device and compute precision."""
    if not isinstance(rec, dict) or rec.get("bundle_id") != bundle.id or not isinstance(rec.get("runner"), dict):
        return False
    entry = bundle.info.reference_pairs
    if rec.get("reference_sha256") != _reference_sha256(bundle, entry.file if entry is not None else None):
        return False
    info = runner.info
    return all(rec["runner"].get(k) == getattr(info, k) for k in ("runtime", "device_used", "precision_used"))


def check_on_load(
    bundle: Any, runner: Any, *, records: CheckRecords | None = None, mode: CheckMode = "first"
) -> dict[str, Any]:
    """The reference check for a runner just opened on ``bundle``, put in
    ``runner.info.details["reference_check"]`` and returned. ``mode`` "first": a result in ``records``
    for this bundle, reference file, runtime and device is reused (``"recorded": true``); True: check
    again. A new result is written to ``records``. Never raises for what the bundle or the runner
    does: an unusable file, a refused input or a runtime error on this device is a failed check
    with ``error``."""
    result: dict[str, Any] | None = None
    if records is not None and mode == "first":
        try:
            rec = records.reference_check(bundle.id)
        except EdgeError:
            rec = None
        if _still_valid(rec, bundle, runner):
            result = {**rec, "recorded": True}  # type: ignore[dict-item]
    if result is None:
        try:
            result = check_reference_pairs(bundle, runner)
        except Exception as e:  # noqa: BLE001 - an unusable file, or a runtime failing on this device: a failed check
            entry = bundle.info.reference_pairs
            why = str(e) if isinstance(e, EdgeError) else f"{type(e).__name__}: {str(e)[:300]}"
            result = {
                "passed": False,
                "samples": 0,
                "bundle_id": bundle.id,
                "reference_sha256": _reference_sha256(bundle, entry.file if entry is not None else None),
                "outputs": [],
                "failures": [],
                "error": why,
                "runner": runner_json(runner),
                "checked_utc": _now(),
            }
        result["recorded"] = False
        if records is not None:
            try:
                records.record_reference_check(bundle.id, {k: v for k, v in result.items() if k != "recorded"})
            except EdgeError as e:  # a read-only or full store: the result still stands for this load
                result["record_error"] = str(e)
    runner.info.details["reference_check"] = {k: v for k, v in result.items() if k != "runner"}
    return result


def open_checked(
    bundle: Any,
    options: Mapping[str, Any] | None = None,
    *,
    mode: CheckMode = "first",
    records: CheckRecords | None = None,
) -> Any:
    """A runner on ``bundle`` (``Bundle.open_runner``) whose reference pairs were checked by
    :func:`check_on_load` (result in ``runner.info.details["reference_check"]``); the caller owns it."""
    runner = bundle.open_runner(options)
    try:
        check_on_load(bundle, runner, records=records, mode=mode)
    except BaseException:
        runner.close()
        raise
    return runner


def check_bundle(
    bundle: Any,
    options: Mapping[str, Any] | None = None,
    *,
    records: CheckRecords | None = None,
    mode: CheckMode = "first",
) -> dict[str, Any]:
    """Open a runner on ``bundle`` just for the reference check, and close it (``edgekit run``/``bench``,
    which then open their own). ``records``: default, the device store holding the bundle, if any."""
    if records is None:
        from edge.store.local import store_holding

        records = store_holding(bundle.path)
    with open_checked(bundle, options, mode=mode or "first", records=records) as runner:
        return {**runner.info.details["reference_check"], "runner": runner_json(runner)}


def describe(result: Mapping[str, Any] | None) -> str | None:
    """One line for a failed check (a CLI warning, a log line, the agent's state detail); None otherwise."""
    if not result or result.get("passed") is not False:
        return None
    why = result.get("error") or "; ".join(result.get("failures") or []) or "failed"
    where = (result.get("runner") or {}).get("device_used")
    return f"reference check failed for {result.get('bundle_id')}" + (f" on {where}" if where else "") + f": {why}"
