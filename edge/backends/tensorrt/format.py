"""The TensorRT bundle format, read by both sides: ``trt_build.json`` (what the device-side engine build needs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edge.errors import ConversionError


BUILD_FILE = "trt_build.json"


BUILD_SCHEMA = "edgekit.trt-build/1"


def read_build_settings(bundle_dir: Path) -> dict[str, Any]:
    path = Path(bundle_dir) / BUILD_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConversionError(f"{path} is missing: the bundle was not made by onnx->tensorrt-plan") from None
    if data.get("schema") != BUILD_SCHEMA:
        raise ConversionError(f"{path} has schema {data.get('schema')!r}, this edgekit reads {BUILD_SCHEMA}")
    return data
