"""The pre-processing a model file declares itself, and the one a conversion request ends up with.

``--preprocess auto`` guesses ImageNet normalisation for a float 3-channel image input; a file that says how it was
trained wins over that guess (issue #34: MediaPipe's BlazeFace, trained on ``(x - 127.5) / 127.5``, failed its int8
parity by default on ImageNet-normalised inputs and passed with the right range). Two declarations are read:

* a .tflite's ``TFLITE_METADATA`` NormalizationOptions (MediaPipe, TF Hub, Model Maker;
  :mod:`edge.backends.litert.metadata`): ``(pixel - mean) / std`` per channel, one value or one per channel;
* an Ultralytics ONNX export's ``metadata_props`` (``author`` Ultralytics, ``task``): detect / segment / pose / obb
  models take 0..1 letterboxed RGB (the ``yolo`` preset), classify models 0..1 RGB (``unit``).

An explicit ``--preprocess PRESET`` (or ``none``) is a declaration too and always wins.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edge.spec import AUTO, PRESETS, DeclaredPreprocess, IOSpec, PreprocessSpec, default_preprocess, image_channels

if TYPE_CHECKING:
    from edge.pipeline.request import ConvertRequest
    from edge.pipeline.sources import Source

#: Ultralytics ``task`` metadata -> the preset its own predictor applies
_ULTRALYTICS_TASKS = {"detect": "yolo", "segment": "yolo", "pose": "yolo", "obb": "yolo", "classify": "unit"}


def request_preprocess(src: Source, io: IOSpec, req: ConvertRequest) -> PreprocessSpec | None:
    """The pre-processing a conversion of ``src`` with ``req`` applies to its image input (None: none)."""
    if req.preprocess == "none":
        return None
    declared = declared_preprocess(src, io) if req.preprocess == AUTO else None
    return default_preprocess(io, req.preprocess, letterbox=req.letterbox, declared=declared)


def declared_preprocess(src: Source, io: IOSpec) -> DeclaredPreprocess | None:
    """What ``src``'s own metadata says its image input takes, or None."""
    from edge.pipeline.sources import OnnxSource, TFLiteSource

    if isinstance(src, TFLiteSource):
        return _from_tflite(src.file.normalization, io)
    if isinstance(src, OnnxSource):
        return _from_ultralytics({p.key: p.value for p in src.model.metadata_props}, io)
    return None


def _from_tflite(normalization: Any, io: IOSpec) -> DeclaredPreprocess | None:
    for t in io.inputs:
        norm = normalization.get(t.name)
        channels = image_channels(t)
        if norm is None or channels is None:
            continue
        if len(norm.mean) not in (1, channels) or len(norm.std) not in (1, channels):
            return None  # per-channel values for another channel count: not this input's
        mean, std = (tuple(norm.mean) * 3)[:3], (tuple(norm.std) * 3)[:3]  # one value: every channel
        said = ", ".join(f"{m:g}" for m in norm.mean), ", ".join(f"{s:g}" for s in norm.std)
        return DeclaredPreprocess(
            input=t.name,
            fields={"scale": 1.0, "mean": mean, "std": std, "color": "RGB"},
            preset="tflite-metadata",
            evidence=f"the file's TFLite metadata declares (pixel - {said[0]}) / {said[1]}",
        )
    return None


def _from_ultralytics(props: dict[str, str], io: IOSpec) -> DeclaredPreprocess | None:
    if not props.get("author", "").lower().startswith("ultralytics"):
        return None
    task = props.get("task", "")
    preset = _ULTRALYTICS_TASKS.get(task)
    if preset is None:
        return None
    image = next((t for t in io.inputs if image_channels(t) == 3), None)
    if image is None:
        return None
    return DeclaredPreprocess(
        input=image.name,
        fields=dict(PRESETS[preset]),
        preset=preset,
        evidence=f"its Ultralytics metadata (task {task[:16]!r}) says {preset} pre-processing",
    )
