"""What a .tflite's own metadata (``TFLITE_METADATA``, TensorFlow Lite's metadata schema ``M001``) declares about
its inputs: the normalisation a MediaPipe / TF Hub / Model Maker model was trained with.

Read without the ``tflite-support`` package: the few fields needed are walked with ``flatbuffers``' table reader
(ModelMetadata.subgraph_metadata[0].input_tensor_metadata[k].process_units[].NormalizationOptions{mean, std}).
The file is untrusted: every offset read is bounds-checked by the reader, a vector longer than an image's channel
count or a value that is not finite (or a zero std) makes the declaration unusable, and any parse error means
"declares nothing" -- the metadata is advice to ``--preprocess auto``, never required.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

METADATA_NAME = b"TFLITE_METADATA"
METADATA_IDENTIFIER = b"M001"
#: ProcessUnitOptions union tag of NormalizationOptions (metadata_schema.fbs)
_NORMALIZATION = 1
#: one value per channel at most (or one for all)
_MAX_CHANNELS = 4
_MAX_UNITS = 16


@dataclass(frozen=True)
class Normalization:
    """``value = (pixel - mean) / std`` per channel (pixel in 0..255), as the file declares it."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    #: the metadata's own name for the tensor (MediaPipe: "image")
    label: str = ""


def _field(t: Any, i: int) -> int:
    return int(t.Offset(4 + 2 * i))


def _tables(t: Any, i: int, limit: int) -> list[Any]:
    from flatbuffers.table import Table

    o = _field(t, i)
    if not o:
        return []
    n = t.VectorLen(o)
    if n > limit:
        raise ValueError(f"{n} entries")
    base = t.Vector(o)
    return [Table(t.Bytes, t.Indirect(base + 4 * k)) for k in range(n)]


def _floats(t: Any, i: int) -> tuple[float, ...]:
    from flatbuffers import number_types

    o = _field(t, i)
    if not o:
        return ()
    n = t.VectorLen(o)
    if not 0 < n <= _MAX_CHANNELS:
        raise ValueError(f"{n} values")
    base = t.Vector(o)
    return tuple(float(t.Get(number_types.Float32Flags, base + 4 * k)) for k in range(n))


def _text(t: Any, i: int) -> str:
    o = _field(t, i)
    return t.String(o + t.Pos).decode(errors="replace")[:64] if o else ""


def _sub(t: Any, i: int) -> Any:
    from flatbuffers.table import Table

    o = _field(t, i)
    return Table(t.Bytes, t.Indirect(o + t.Pos)) if o else None


def _normalization(tm: Any) -> Normalization | None:
    from flatbuffers import number_types

    for unit in _tables(tm, 4, _MAX_UNITS):  # TensorMetadata.process_units
        o = _field(unit, 0)  # ProcessUnit.options_type
        if not o or unit.Get(number_types.Uint8Flags, o + unit.Pos) != _NORMALIZATION:
            continue
        options = _sub(unit, 1)
        if options is None:
            return None
        mean, std = _floats(options, 0), _floats(options, 1)
        values = (*mean, *std)
        if not mean or not std or not all(math.isfinite(v) and abs(v) <= 1e6 for v in values):
            return None
        if any(s < 1e-6 for s in std):  # a zero or negative std is no normalisation (the manifest refuses it too)
            return None
        return Normalization(mean, std, _text(tm, 0))
    return None


def input_normalization(data: bytes, model: Any) -> dict[int, Normalization]:
    """Subgraph 0's input position -> the normalisation the file's metadata declares for it ({} when none or
    when the metadata does not parse). ``model``: the ``schema_py_generated.Model`` of ``data``."""
    from flatbuffers import encode, packer
    from flatbuffers.table import Table

    try:
        for j in range(min(model.MetadataLength(), 64)):
            md = model.Metadata(j)
            if md.Name() != METADATA_NAME:
                continue
            raw = model.Buffers(md.Buffer()).DataAsNumpy()
            if not hasattr(raw, "tobytes"):
                return {}
            buf = raw.tobytes()
            if len(buf) < 8 or buf[4:8] != METADATA_IDENTIFIER:
                return {}
            root = Table(buf, encode.Get(packer.uoffset, buf, 0))
            subgraphs = _tables(root, 3, 64)  # ModelMetadata.subgraph_metadata
            if not subgraphs:
                return {}
            found = {}
            for k, tm in enumerate(_tables(subgraphs[0], 2, 256)):  # SubGraphMetadata.input_tensor_metadata
                norm = _normalization(tm)
                if norm is not None:
                    found[k] = norm
            return found
    except Exception:  # noqa: BLE001 - untrusted metadata that does not parse declares nothing
        return {}
    return {}
