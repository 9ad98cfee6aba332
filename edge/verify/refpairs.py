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

The file comes with the bundle, so nothing in it is trusted: it is read with
``allow_pickle=False`` after its zip directory was checked (member names, count, uncompressed
size), and every array must be what the bundle's I/O spec says (names, shapes, dtypes); every
problem is one :class:`~edge.errors.BundleError` naming the file.

Device side: standard library and numpy only (``edge.verify.parity`` imports no runtime at module level).

Layout of ``reference.npz``::

    names      0-d unicode array: JSON {"inputs": [names...], "outputs": [names...]}
    i<s>_<k>   sample s, input k (the k-th name of "inputs")
    o<s>_<k>   sample s, output k

Tensor names may hold '/', ':' or anything else, so they are never part of a key. A language
model's pairs (kind "llm") use the same layout with their own tensors: see "language models" below.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import stat
import zipfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, Mapping, Protocol, Sequence

import numpy as np

from edge.errors import BundleError, EdgeError
from edge.verify.parity import (
    THRESHOLDS,
    Thresholds,
    compare,
    degenerate_reason,
    output_failures,
    thresholds_for,
    unverified_reason,
)

REFERENCE_FILE = "reference.npz"
#: what the writer keeps: a few small samples (an image classifier's pair is ~600 kB)
MAX_BYTES = 8 << 20
MAX_SAMPLES = 64  # the manifest's limit too
#: what the reader accepts: the writer's cap plus room for the npz/npy headers
MAX_FILE_BYTES = MAX_BYTES + (1 << 20)
_MAX_MEMBERS = 4096
_KEY = re.compile(r"^(names|[io](0|[1-9][0-9]{0,3})_(0|[1-9][0-9]{0,3}))\.npy$")
_NAMES = "names"
_HINT = "rebuild the bundle with `edgekit convert`; do not edit bundle files by hand"

CheckMode = bool | Literal["first"]


# -- writing (build host) ------------------------------------------------------------------------


def write_reference_pairs(
    stage: Path,
    inputs: Sequence[Mapping[str, np.ndarray]],
    outputs: Sequence[Mapping[str, np.ndarray]],
    *,
    precision: str,
    reference: str,
    samples: int = 4,
    thresholds: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Write ``stage/reference.npz`` from the first ``samples`` pairs; return the manifest's
    ``reference_pairs`` entry. Call it before ``new_manifest`` (which lists and hashes every file
    in ``stage``).

    The file is capped at :data:`MAX_BYTES`: fewer samples are kept when they would not fit, and
    none (no file, ``samples`` 0) when one pair alone is over it; ``note`` then says so.
    ``reference`` names what computed ``outputs`` (e.g. "onnxruntime 1.23.0 fp32 CPU on the source
    ONNX"); ``thresholds`` are edge.verify.parity's limits for ``precision`` unless given (a language model's:
    :func:`write_llm_reference_pairs`)."""
    if len(inputs) != len(outputs):
        raise ValueError(f"{len(inputs)} input samples but {len(outputs)} output samples")
    if not 1 <= samples <= MAX_SAMPLES:
        raise ValueError(f"samples must be 1..{MAX_SAMPLES}, got {samples}")
    if not inputs:
        raise ValueError("no reference samples given")
    in_names, out_names = list(inputs[0]), list(outputs[0])
    for s in range(len(inputs)):
        if list(inputs[s]) != in_names or list(outputs[s]) != out_names:
            raise ValueError(f"sample {s} names other tensors than sample 0")
    entry: dict[str, Any] = {
        "file": REFERENCE_FILE,
        "samples": 0,
        "reference": reference,
        "thresholds": dict(thresholds) if thresholds is not None else thresholds_for(precision).to_json(),
    }
    wanted = min(samples, len(inputs))
    pair_bytes = [
        sum(np.asarray(a).nbytes + 128 for a in (*inputs[s].values(), *outputs[s].values())) for s in range(wanted)
    ]
    keep, total = 0, 1024
    while keep < wanted and total + pair_bytes[keep] <= MAX_BYTES:
        total += pair_bytes[keep]
        keep += 1
    if keep == 0:
        entry.update(
            file=None,
            note=f"no reference pairs stored: one input/output pair is {pair_bytes[0]:,} bytes, over the {MAX_BYTES >> 20} MiB cap",
        )
        return entry
    if keep < wanted:
        entry["note"] = (
            f"kept {keep} of {wanted} samples to stay under the {MAX_BYTES >> 20} MiB cap ({pair_bytes[0]:,} bytes a pair)"
        )
    arrays: dict[str, np.ndarray] = {_NAMES: np.array(json.dumps({"inputs": in_names, "outputs": out_names}))}
    for s in range(keep):
        for k, n in enumerate(in_names):
            arrays[f"i{s}_{k}"] = np.asarray(inputs[s][n], order="C")  # ascontiguousarray makes a scalar [1]
        for k, n in enumerate(out_names):
            arrays[f"o{s}_{k}"] = np.asarray(outputs[s][n], order="C")
    bad = [f"{key}: {a.dtype}" for key, a in arrays.items() if a.dtype.hasobject or a.dtype.fields]
    if bad:
        raise ValueError(f"reference arrays must be plain numeric arrays: {', '.join(bad)}")
    with open(Path(stage) / REFERENCE_FILE, "xb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]
    entry["samples"] = keep
    return entry


# -- reading (device) ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ReferencePairs:
    """The pairs read from a bundle, checked against its I/O spec."""

    inputs: list[dict[str, np.ndarray]]
    outputs: list[dict[str, np.ndarray]]
    file: Path


def _field(entry: Any, name: str) -> Any:
    return entry.get(name) if isinstance(entry, Mapping) else getattr(entry, name, None)


def _dims(shape: Sequence[Any]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _fits(got: tuple[int, ...], want: Sequence[Any]) -> bool:
    return len(got) == len(want) and all(not isinstance(d, int) or d <= 0 or g == d for g, d in zip(got, want))


def _member_names(path: Path, refuse: Any) -> list[str]:
    """The npz's member names, from the zip directory: names, count and sizes checked before numpy reads a byte of
    data (``refuse(problem)`` makes the error)."""
    try:
        with zipfile.ZipFile(path) as z:
            members = z.infolist()
            if len(members) > _MAX_MEMBERS:
                raise refuse(f"{len(members)} members")
            names = [m.filename for m in members]
            odd = [n for n in names if not _KEY.fullmatch(n)]
            if odd:
                raise refuse("unexpected member(s) " + ", ".join(repr(n[:60]) for n in odd[:5]))
            if len(set(names)) != len(names):
                raise refuse("a member is in the archive twice")
            unpacked = sum(m.file_size for m in members)
            if unpacked > 4 * MAX_FILE_BYTES:
                raise refuse(f"unpacks to {unpacked:,} bytes")
    except BundleError:
        raise
    except Exception as e:  # noqa: BLE001 - anything a crafted archive makes zipfile raise
        raise refuse(f"not an npz archive ({type(e).__name__}: {str(e)[:120]})") from None
    return names


def _check_file(path: Path, refuse: Any) -> None:
    """The reference file is a regular file (not followed through a link) of at most ``MAX_FILE_BYTES``."""
    try:
        st = os.lstat(path)
    except OSError as e:
        raise refuse(f"cannot be read ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise refuse("not a regular file")
    if st.st_size > MAX_FILE_BYTES:
        raise refuse(f"{st.st_size:,} bytes, over the {MAX_FILE_BYTES:,} a reference file may have")


def _names_problems(npz: Any, in_specs: list[Any], out_specs: list[Any], refuse: Any) -> list[str]:
    """The npz's ``names`` member: a JSON ``{"inputs": [...], "outputs": [...]}`` (else ``refuse``), whose names
    must be the bundle's I/O names in order; returns what differs."""
    raw = npz[_NAMES]
    if raw.dtype.kind != "U" or raw.ndim != 0:
        raise refuse("'names' is not a JSON string")
    listed = json.loads(str(raw))
    if not (
        isinstance(listed, dict)
        and set(listed) == {"inputs", "outputs"}
        and all(isinstance(v, list) and all(isinstance(n, str) for n in v) for v in listed.values())
    ):
        raise refuse('\'names\' is not {"inputs": [...], "outputs": [...]}')
    problems = []
    for side, specs in (("inputs", in_specs), ("outputs", out_specs)):
        if listed[side] != [t.name for t in specs]:
            problems.append(f"{side} {listed[side][:8]} are not the bundle's {[t.name for t in specs]}")
    return problems


def _array_problems(a: np.ndarray, t: Any, what: str, *, output: bool) -> list[str]:
    """One stored array against its I/O spec ``t``: its dtype, a shape that fits, and (reference outputs) finite
    values."""
    problems = []
    if a.dtype != np.dtype(t.dtype):
        problems.append(f"{what} is {a.dtype}, the bundle's I/O spec says {t.dtype}")
    if not _fits(a.shape, t.shape):
        problems.append(f"{what} has shape {_dims(a.shape)}, the bundle's I/O spec says {_dims(t.shape)}")
    if output and a.dtype.kind in "fc" and not np.isfinite(a).all():
        problems.append(f"{what} holds NaN or Inf")
    return problems


def load_reference_pairs(bundle_path: str | os.PathLike[str], entry: Any, io: Any) -> ReferencePairs:
    """The pairs ``entry`` (the manifest's ``reference_pairs``) names in the bundle at ``bundle_path``,
    each array checked against ``io`` (an ``edge.spec.IOSpec``): the same input and output names,
    shapes that fit, the spec's dtypes, finite reference outputs, exactly ``entry.samples`` samples.
    Every problem is reported in one :class:`BundleError` naming the file; nothing in the file can
    run code (no pickles)."""
    rel, count = _field(entry, "file"), _field(entry, "samples")
    if (
        not isinstance(rel, str)
        or not isinstance(count, int)
        or isinstance(count, bool)
        or not 1 <= count <= MAX_SAMPLES
    ):
        raise BundleError(
            f"bundle {bundle_path}: its reference_pairs entry names no file, or not 1-{MAX_SAMPLES} samples", hint=_HINT
        )
    path = Path(bundle_path) / rel

    def refuse(problem: str) -> BundleError:
        return BundleError(f"{path}: reference pairs unusable: {problem}", hint=_HINT)

    _check_file(path, refuse)
    in_specs, out_specs = list(io.inputs), list(io.outputs)
    expected = {f"{_NAMES}.npy"} | {
        f"{p}{s}_{k}.npy"
        for s in range(count)
        for p, specs in (("i", in_specs), ("o", out_specs))
        for k in range(len(specs))
    }
    names = _member_names(path, refuse)
    problems = [f"missing {n[:-4]}" for n in sorted(expected - set(names))]
    problems += [
        f"unexpected {n[:-4]} (the manifest says {count} samples of {len(in_specs)} inputs and {len(out_specs)} outputs)"
        for n in sorted(set(names) - expected)
    ]
    if problems:
        raise refuse("; ".join(problems))
    inputs: list[dict[str, np.ndarray]] = [{} for _ in range(count)]
    outputs: list[dict[str, np.ndarray]] = [{} for _ in range(count)]
    try:
        with np.load(path, allow_pickle=False) as npz:
            problems += _names_problems(npz, in_specs, out_specs, refuse)
            if problems:
                raise refuse("; ".join(problems))
            for s in range(count):
                for prefix, specs, into in (("i", in_specs, inputs[s]), ("o", out_specs, outputs[s])):
                    for k, t in enumerate(specs):
                        a = npz[f"{prefix}{s}_{k}"]
                        what = f"sample {s} {'input' if prefix == 'i' else 'output'} {t.name!r}"
                        problems += _array_problems(a, t, what, output=prefix == "o")
                        into[t.name] = a
    except BundleError:
        raise
    except Exception as e:  # noqa: BLE001 - object arrays (pickles), bad headers, truncated data
        raise refuse(f"{type(e).__name__}: {str(e)[:160]}") from None
    if problems:
        more = f"; and {len(problems) - 10} more" if len(problems) > 10 else ""
        raise refuse("; ".join(problems[:10]) + more)
    return ReferencePairs(inputs, outputs, path)


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
        c, e = getattr(code, f.name), _field(entry_thresholds, f.name)
        if c is None or not isinstance(e, (int, float)) or isinstance(e, bool) or not math.isfinite(e):
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


def _built_outputs(bundle: Any) -> tuple[dict[str, Any], int, bool]:
    """The build host's parity figures per output name, its sample count, and whether it passed (not
    accepted as a failure): what the device's pairs are judged beside. Empty for an older bundle, a
    parity that was skipped, or a language model's."""
    par = getattr(getattr(bundle, "info", None), "parity", None)
    outs, samples = getattr(par, "outputs", None), getattr(par, "samples", None)
    if not outs or not isinstance(samples, int) or getattr(par, "kind", None) != "vision":
        return {}, 0, False
    passed = getattr(par, "passed", None) is True and not getattr(par, "accepted_failure", False)
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
    loosened = []
    cmin, cmean = getattr(built, "cosine_min", None), getattr(built, "cosine", None)
    if isinstance(cmin, (int, float)) and isinstance(cmean, (int, float)) and math.isfinite(cmean):
        # a mean over parity_samples figures <= 1 bounds its worst: a record claiming worse was edited
        cmin = max(cmin, 1.0 - parity_samples * (1.0 - min(1.0, cmean)))
    if isinstance(cmin, (int, float)) and math.isfinite(cmin) and th.min_cosine is not None:
        floor = 1.0 - (1.0 - min(1.0, cmin)) * energy
        if floor < th.min_cosine:
            changed["min_cosine"] = floor
            loosened.append(f"cosine >= {floor:.6f} (parity's worst sample {cmin:.6f})")
    smin = getattr(built, "snr_db_min", None)
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
    or an all-zero reference)."""
    ref = np.stack([np.asarray(r, dtype=np.float64) for r in reference])
    err = ref - np.stack([np.asarray(c, dtype=np.float64) for c in candidate])
    p_ref, p_err = float((ref**2).sum()), float((err**2).sum())
    if not (math.isfinite(p_ref) and math.isfinite(p_err)) or p_ref <= 0 or p_err <= 0:
        return None
    return round(10.0 * math.log10(p_ref / p_err), 3)


def _num(v: float | None) -> float | None:
    return v if v is None or math.isfinite(v) else None


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
        "cosine": _num(o.cosine),
        "cosine_min": _num(o.cosine_min),
        "max_abs": _num(o.max_abs),
        "mean_abs": _num(o.mean_abs),
        "top1": _num(o.top1),
        "snr_db": snr,
        "task": o.task,
    }
    rec.update(
        {
            f: _num(getattr(o, f))
            for f in ("top5", "precision", "recall", "iou", "sequence", "tokens")
            if getattr(o, f) is not None
        }
    )
    for f in ("task_note", "degenerate_note"):
        if getattr(o, f):
            rec[f] = getattr(o, f)
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
        return {**_check_llm(bundle, runner, entry, result), "runner": runner_json(runner), "checked_utc": _now()}
    pairs = load_reference_pairs(bundle.path, entry, bundle.io)
    th = gate_thresholds(entry.thresholds, bundle.precision, runner.info.precision_used)
    built, parity_samples, parity_passed = _built_outputs(bundle)
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


# -- language models (GGUF) ----------------------------------------------------------------------
#
# An llm bundle's pairs are token prefixes (input "tokens") with the reference's top-k next-token
# ids and log-probabilities after each (outputs "top_ids", "top_logprobs"; edge.llm.quality picks
# them from the build host's gate). The device runs each prefix through its llama.cpp runner
# (``infer`` gives the logits after the last token) and gates top-1 agreement and a KL estimate
# over the top-k (plus one bucket for the rest of the vocabulary) against edge.llm.quality's
# limits for the bundle's quant type.

LLM_OUTPUTS = ("top_ids", "top_logprobs")
_MAX_TOP_K = 64


def _llm_io() -> Any:
    from edge.spec import IOSpec, TensorSpec

    return IOSpec(
        (TensorSpec("tokens", ("n",), "int32"),),
        (TensorSpec("top_ids", ("k",), "int32"), TensorSpec("top_logprobs", ("k",), "float32")),
    )


def write_llm_reference_pairs(
    stage: Path, samples: Sequence[Any], *, precision: str, reference: str, note: str | None = None
) -> dict[str, Any]:
    """Write ``stage/reference.npz`` from ``samples`` (``edge.llm.quality.TopKSample``) for a GGUF
    bundle of quant type ``precision``; return the manifest's ``reference_pairs`` entry."""
    from edge.llm.quality import thresholds

    if not samples:
        raise ValueError("no reference samples given")
    max_kl, min_top1 = thresholds(precision)
    entry = write_reference_pairs(
        stage,
        [{"tokens": np.asarray(s.tokens, dtype=np.int32)} for s in samples],
        [
            {"top_ids": np.asarray(s.top_ids, dtype=np.int32), "top_logprobs": np.asarray(s.top_logprobs, np.float32)}
            for s in samples
        ],
        precision=precision,
        reference=reference,
        samples=min(len(samples), MAX_SAMPLES),
        thresholds={"max_kl_mean": max_kl, "min_top1": min_top1},
    )
    if note:
        entry["note"] = note if entry.get("note") is None else f"{entry['note']}; {note}"
    return entry


def _llm_problems(pairs: ReferencePairs, n_vocab: int) -> list[str]:
    """What makes the stored samples meaningless as a reference (a crafted or damaged file)."""
    problems = []
    for s, (i, o) in enumerate(zip(pairs.inputs, pairs.outputs)):
        tokens, ids, lps = i["tokens"], o["top_ids"], o["top_logprobs"]
        if tokens.ndim != 1 or tokens.size == 0 or tokens.min() < 0 or tokens.max() >= n_vocab:
            problems.append(f"sample {s}: tokens are not 1..n ids below the vocabulary size {n_vocab}")
        if ids.ndim != 1 or not 1 <= ids.size <= _MAX_TOP_K or ids.shape != lps.shape:
            problems.append(f"sample {s}: top_ids and top_logprobs are not two lists of 1-{_MAX_TOP_K} entries")
            continue
        if ids.min() < 0 or ids.max() >= n_vocab or len(set(ids.tolist())) != ids.size:
            problems.append(f"sample {s}: top_ids are not distinct ids below {n_vocab}")
        if (
            not np.isfinite(lps).all()
            or lps.max() > 1e-3
            or (np.diff(lps) > 1e-6).any()
            or float(np.exp(lps.astype(np.float64)).sum()) > 1.001
        ):
            problems.append(f"sample {s}: top_logprobs are not descending log-probabilities summing to at most 1")
    return problems


def _check_llm(bundle: Any, runner: Any, entry: Any, result: dict[str, Any]) -> dict[str, Any]:
    from edge.llm.quality import TopKSample, thresholds, topk_figures

    pairs = load_reference_pairs(bundle.path, entry, _llm_io())
    n_vocab = bundle.io.outputs[0].shape[0] if bundle.io.outputs else None
    if not isinstance(n_vocab, int):
        raise BundleError(f"bundle {bundle.path}: its io.outputs does not give the vocabulary size", hint=_HINT)
    problems = _llm_problems(pairs, n_vocab)
    if problems:
        raise BundleError(f"{pairs.file}: reference pairs unusable: " + "; ".join(problems[:10]), hint=_HINT)
    code_kl, code_top1 = thresholds(bundle.precision)
    kept = _field(entry, "thresholds")
    kl_b, top1_b = _field(kept, "max_kl_mean"), _field(kept, "min_top1")
    max_kl = min(code_kl, float(kl_b)) if isinstance(kl_b, (int, float)) else code_kl
    min_top1 = max(code_top1, float(top1_b)) if isinstance(top1_b, (int, float)) else code_top1
    n_ctx = (runner.info.details or {}).get("n_ctx")
    samples = [TopKSample(i["tokens"], o["top_ids"], o["top_logprobs"]) for i, o in zip(pairs.inputs, pairs.outputs)]
    fit = [s for s in samples if not isinstance(n_ctx, int) or s.tokens.size <= n_ctx]
    th = {"max_kl_mean": max_kl, "min_top1": min_top1}
    if not fit:
        return {
            **result,
            "skipped": f"every reference prefix is longer than this runner's context (n_ctx {n_ctx})",
            "thresholds": th,
        }
    figures = [topk_figures(s, runner.infer({"tokens": s.tokens})["logits"]) for s in fit]
    kls = [kl for kl, _ in figures]
    kl_mean, top1 = float(np.mean(kls)), float(np.mean([agree for _, agree in figures]))
    failures = []
    if not kl_mean <= max_kl:
        failures.append(f"mean KL over the reference's top-{samples[0].top_ids.size} {kl_mean:.4g} > {max_kl}")
    if not top1 >= min_top1:
        failures.append(f"top-1 agreement {top1:.1%} < {min_top1:.0%}")
    out = {
        "name": "logits",
        "kl_topk_mean": _num(kl_mean),
        "kl_topk_max": _num(float(max(kls))),
        "top1": top1,
        "passed": not failures,
        "failures": failures,
    }
    if len(fit) < len(samples):
        out["note"] = f"{len(samples) - len(fit)} of {len(samples)} prefixes are longer than n_ctx {n_ctx}: not run"
    result.update(
        passed=not failures,
        samples=len(fit),
        thresholds=th,
        reference=entry.reference,
        outputs=[out],
        failures=[f"logits: {f}" for f in failures],
    )
    return result


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
