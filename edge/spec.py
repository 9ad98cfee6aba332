"""What a model takes and gives (I/O spec) and how frames become its input (pre-processing spec).

Both are plain frozen dataclasses that round-trip through the bundle manifest as JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, Mapping, Sequence

from edge.errors import EdgeError

Layout = Literal["NCHW", "NHWC"]
ColorOrder = Literal["RGB", "BGR", "GRAY"]  # GRAY: one luminance channel
ResizeMode = Literal["resize", "letterbox"]


@dataclass(frozen=True)
class TensorSpec:
    """One input or output tensor. Once a bundle is built its inputs' shapes are static; an output dim its reference
    samples disagree on (a decoder's steps) stays dynamic, a str (``edge.pipeline.pipeline._bundle_io``)."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str  # numpy dtype name: "float32", "uint8", ...
    layout: str | None = None  # "NCHW"/"NHWC" for image tensors, None otherwise
    #: a float input the runner quantizes into an integer tensor (a TFLite int8/uint8 input): (scale, zero point,
    #: lowest level, highest level). Read where the spec is built, for the parity generator; not in the manifest.
    quant: tuple[float, int, int, int] | None = field(default=None, compare=False)

    @property
    def quant_range(self) -> tuple[float, float] | None:
        """The float range a quantized input represents (scale x (level - zero point)), or None."""
        if self.quant is None:
            return None
        scale, zp, lo, hi = self.quant
        return scale * (lo - zp), scale * (hi - zp)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) and d > 0 for d in self.shape)

    @property
    def dynamic_dims(self) -> list[int]:
        return [i for i, d in enumerate(self.shape) if not (isinstance(d, int) and d > 0)]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "layout": self.layout}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TensorSpec:
        return cls(
            name=str(data["name"]), shape=tuple(data["shape"]), dtype=str(data["dtype"]), layout=data.get("layout")
        )

    def describe(self) -> str:
        dims = "x".join(str(d) for d in self.shape)
        return f"{self.name} {self.dtype}[{dims}]" + (f" {self.layout}" if self.layout else "")


@dataclass(frozen=True)
class IOSpec:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def input(self, name: str) -> TensorSpec:
        for t in self.inputs:
            if t.name == name:
                return t
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {"inputs": [t.to_json() for t in self.inputs], "outputs": [t.to_json() for t in self.outputs]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> IOSpec:
        return cls(
            inputs=tuple(TensorSpec.from_json(t) for t in data["inputs"]),
            outputs=tuple(TensorSpec.from_json(t) for t in data["outputs"]),
        )


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class PreprocessSpec:
    """How an 8-bit frame becomes the model's image input.

    ``value = ((pixel * scale) - mean) / std`` per channel, in ``color`` order, then laid out
    as ``layout``. ``size`` is (height, width).
    """

    input: str
    size: tuple[int, int]
    layout: Layout = "NCHW"
    color: ColorOrder = "RGB"
    scale: float = 1.0 / 255.0
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    resize: ResizeMode = "resize"
    pad_value: int = 114
    dtype: str = "float32"
    preset: str = "imagenet"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["size"] = list(self.size)
        d["mean"] = list(self.mean)
        d["std"] = list(self.std)
        return d

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreprocessSpec:
        d = dict(data)
        d["size"] = tuple(d["size"])
        d["mean"] = tuple(d["mean"])
        d["std"] = tuple(d["std"])
        return cls(**d)

    def with_(self, **changes: Any) -> PreprocessSpec:
        return replace(self, **changes)


PRESETS: dict[str, dict[str, Any]] = {
    # torchvision / timm classifiers
    "imagenet": {"scale": 1.0 / 255.0, "mean": IMAGENET_MEAN, "std": IMAGENET_STD, "color": "RGB"},
    # YOLO-family detectors: 0..1, no mean/std, letterboxed
    "yolo": {
        "scale": 1.0 / 255.0,
        "mean": (0.0, 0.0, 0.0),
        "std": (1.0, 1.0, 1.0),
        "color": "RGB",
        "resize": "letterbox",
    },
    # scaled to 0..1 only
    "unit": {"scale": 1.0 / 255.0, "mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0), "color": "RGB"},
    # PaddleOCR (PP-OCR) models: BGR, (x/255 - 0.5) / 0.5
    "ppocr": {"scale": 1.0 / 255.0, "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "color": "BGR"},
    # raw 0..255 floats
    "raw": {"scale": 1.0, "mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0), "color": "RGB"},
}


def image_layout(shape: Sequence[int | str]) -> Layout | None:
    """NCHW or NHWC when ``shape`` looks like a batch of 1- or 3-channel images, else None."""
    if len(shape) != 4:
        return None
    if shape[1] in (1, 3) and shape[3] not in (1, 3):
        return "NCHW"
    if shape[3] in (1, 3) and shape[1] not in (1, 3):
        return "NHWC"
    if shape[1] in (1, 3):
        return "NCHW"
    return None


#: ``--preprocess auto``: a pre-processing only where it is certain (see :func:`default_preprocess`)
AUTO = "auto"


@dataclass(frozen=True)
class DeclaredPreprocess:
    """A pre-processing the model file itself declares (a .tflite's metadata, an Ultralytics export's
    ``metadata_props``): ``--preprocess auto`` takes it over any guess. ``fields``: PreprocessSpec fields
    (scale, mean, std, color, resize); ``preset``: the name the manifest records; ``evidence``: where it was read."""

    input: str
    fields: Mapping[str, Any]
    preset: str
    evidence: str


def image_channels(t: TensorSpec) -> int | None:
    """The channel count (1 or 3) of a static image-shaped input, else None."""
    layout = image_layout(t.shape)
    if layout is None or not t.is_static:
        return None
    return int(t.shape[1] if layout == "NCHW" else t.shape[3])


def default_preprocess(
    io: IOSpec, preset: str = AUTO, *, letterbox: bool | None = None, declared: DeclaredPreprocess | None = None
) -> PreprocessSpec | None:
    """The pre-processing spec for the first image-shaped input, or None when there is none.

    A named ``preset`` is a declaration: it applies to the first image-shaped input, a 1-channel one
    as grey (``color="GRAY"``). ``auto`` applies one only where it is certain: a 3-channel image input
    (``imagenet``; uint8: ``raw`` pixels); a 1-channel ``[1,1,H,W]`` / ``[1,T,F,1]`` input
    may be a grey picture, a spectrogram or a feature map, so it gets none (its parity inputs follow its
    own shape, ``edge.verify.inputs``). Where the file ``declared`` its own pre-processing for an image input,
    ``auto`` takes that (1 or 3 channels: the file says so)."""
    if preset != AUTO and preset not in PRESETS:
        raise EdgeError(f"unknown pre-processing preset {preset!r}", hint=f"choose one of {AUTO}, {', '.join(PRESETS)}")
    for t in io.inputs:
        channels = image_channels(t)
        own = declared if preset == AUTO and declared is not None and declared.input == t.name else None
        if channels is None or (preset == AUTO and channels != 3 and own is None):
            continue
        layout = image_layout(t.shape)
        if layout is None:  # never with channels known: image_channels reads them at the layout's axis
            continue
        h, w = (t.shape[2], t.shape[3]) if layout == "NCHW" else (t.shape[1], t.shape[2])
        name = preset if preset != AUTO else ("raw" if t.dtype == "uint8" else "imagenet")
        fields: dict[str, Any] = dict(PRESETS[name])
        if own is not None and t.dtype != "uint8":
            name, fields = own.preset, {**PRESETS["raw"], **own.fields}
        if channels == 1:
            fields["color"] = "GRAY"
        if letterbox is not None:
            fields["resize"] = "letterbox" if letterbox else "resize"
        return PreprocessSpec(input=t.name, size=(int(h), int(w)), layout=layout, dtype=t.dtype, preset=name, **fields)
    return None


@dataclass(frozen=True)
class Calibration:
    """Where calibration samples came from; recorded in the manifest."""

    source: str  # a directory path, or "random"
    kind: Literal["tensors", "images", "audio", "text", "random", "natural"]
    count: int
    samples: tuple[Mapping[str, Any], ...] = field(repr=False, compare=False, default=())
    #: kind "natural" (edge.verify.natural, the default when no data is given): per image its file, sha256, licence
    files: tuple[Mapping[str, Any], ...] = field(compare=False, default=())

    def provenance(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source, "kind": self.kind, "count": self.count}
        if self.files:
            out["files"] = [dict(f) for f in self.files]
        return out
