"""The reference-pairs file, ``reference.npz``: written on the build host, read on the device.

The file comes with the bundle, so nothing in it is trusted: it is read with
``allow_pickle=False`` after its zip directory was checked (member names, count, uncompressed
size), and every array must be what the bundle's I/O spec says (names, shapes, dtypes); every
problem is one :class:`~edge.errors.BundleError` naming the file. Checking the pairs on a runner is
:mod:`edge.verify.refpairs`; a language model's pairs, :mod:`edge.verify.refpairs_llm`.

Device side: standard library and numpy only.

Layout of ``reference.npz``::

    names      0-d unicode array: JSON {"inputs": [names...], "outputs": [names...]}
    i<s>_<k>   sample s, input k (the k-th name of "inputs")
    o<s>_<k>   sample s, output k

Tensor names may hold '/', ':' or anything else, so they are never part of a key.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from edge.errors import BundleError
from edge.verify.parity import thresholds_for

REFERENCE_FILE = "reference.npz"
#: what the writer keeps: a few small samples (an image classifier's pair is ~600 kB)
MAX_BYTES = 8 << 20
MAX_SAMPLES = 64  # the manifest's limit too
#: what the reader accepts: the writer's cap plus room for the npz/npy headers
MAX_FILE_BYTES = MAX_BYTES + (1 << 20)
_MAX_MEMBERS = 4096
_KEY = re.compile(r"^(names|[io](0|[1-9][0-9]{0,3})_(0|[1-9][0-9]{0,3}))\.npy$")
_NAMES = "names"
REBUILD_HINT = "rebuild the bundle with `edgekit convert`; do not edit bundle files by hand"


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
    :func:`edge.verify.refpairs_llm.write_llm_reference_pairs`)."""
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


def entry_field(entry: Any, name: str) -> Any:
    """A manifest entry's field, from the typed entry or its JSON."""
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
    rel, count = entry_field(entry, "file"), entry_field(entry, "samples")
    if (
        not isinstance(rel, str)
        or not isinstance(count, int)
        or isinstance(count, bool)
        or not 1 <= count <= MAX_SAMPLES
    ):
        raise BundleError(
            f"bundle {bundle_path}: its reference_pairs entry names no file, or not 1-{MAX_SAMPLES} samples",
            hint=REBUILD_HINT,
        )
    path = Path(bundle_path) / rel

    def refuse(problem: str) -> BundleError:
        return BundleError(f"{path}: reference pairs unusable: {problem}", hint=REBUILD_HINT)

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


def finite_or_none(v: float | None) -> float | None:
    """A figure as a check record carries it: None where it is not finite (JSON has no NaN or Inf)."""
    return v if v is None or math.isfinite(v) else None
