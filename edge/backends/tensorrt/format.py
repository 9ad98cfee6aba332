"""The TensorRT bundle format, read by both sides: ``trt_build.json`` (what the device-side engine build needs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge.base.typedjson import UnreadableFile, read_json_file, spec
from edge.errors import ConversionError

BUILD_FILE = "trt_build.json"


BUILD_SCHEMA = "edgekit.trt-build/1"

# ONNX ops TensorRT's ONNX parser (onnx-tensorrt, TensorRT 8.6-10.x, docs/operators.md) does not
# implement, plus the integer-arithmetic quantized ops that onnxruntime emits in QOperator format
# (TensorRT only takes QDQ). Ops from a non-default domain (com.microsoft ...) are flagged too.
TRT_UNSUPPORTED_OPS = frozenset(
    {
        "BitShift",
        "Bernoulli",
        "Col2Im",
        "ConcatFromSequence",
        "ConvInteger",
        "DynamicQuantizeLinear",
        "ImageDecoder",
        "MatMulInteger",
        "MelWeightMatrix",
        "Multinomial",
        "Optional",
        "OptionalGetElement",
        "OptionalHasElement",
        "QLinearConv",
        "QLinearMatMul",
        "RegexFullMatch",
        "SequenceAt",
        "SequenceConstruct",
        "SequenceEmpty",
        "SequenceErase",
        "SequenceInsert",
        "SequenceLength",
        "SplitToSequence",
        "StringConcat",
        "StringNormalizer",
        "StringSplit",
        "TfIdfVectorizer",
        "Unique",
    }
)
# Parsed, but known to run slowly or with restrictions worth a look (from the same table).
TRT_RESTRICTED_OPS = {
    "Loop": "supported, but loops run step by step (no fusion across iterations)",
    "NonZero": "data-dependent output shape: needs TensorRT >= 8.5 and stops fusion",
    "NonMaxSuppression": "data-dependent output shape; often faster as an EfficientNMS plugin",
    "Resize": "only nearest/linear/cubic with the common coordinate modes",
    "ScatterND": "no reduction attribute before TensorRT 10",
}


def read_build_settings(bundle_dir: Path) -> dict[str, Any]:
    path = Path(bundle_dir) / BUILD_FILE
    if not path.exists():
        raise ConversionError(f"{path} is missing: the bundle was not made by onnx->tensorrt-plan")
    try:
        data = read_json_file(path, what="TensorRT build settings", max_bytes=4 << 20, max_depth=16)
    except UnreadableFile as e:
        raise ConversionError(e.message) from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != BUILD_SCHEMA:
        raise ConversionError(f"{path} has schema {str(schema)[:40]!r}, this edgekit reads {BUILD_SCHEMA}")
    settings: dict[str, Any] = data  # a dict: its schema matched
    return settings


# -- runner options (declared once: edge.backends.options) --------------------------------------

#: the device's engine cache directory (the runner option engine_cache_dir, device configuration only)
CACHE_ENV = "EDGEKIT_ENGINE_CACHE"


@dataclass(frozen=True)
class TensorRTOptions:
    allow_cpu_fallback: bool = spec(
        False,
        doc="when TensorRT or the GPU is missing, run the ONNX in onnxruntime on "
        "the CPU, labelled 'CPU fallback' in every report (default false: an error)",
    )
    rebuild: bool = spec(False, doc="ignore a cached engine and build again (default false)")
    device: int = spec(0, ge=0, le=64, doc="CUDA device index (default 0)")
