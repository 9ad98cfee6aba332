"""TFLite -> TFLite for LiteRT: a source .tflite made runnable and in the precision asked, by rewriting its
flatbuffer (:mod:`edge.backends.litert.rewrite`; no TensorFlow).

* MediaPipe's custom ``Convolution2DTransposeBias`` is lowered to the builtin ``TRANSPOSE_CONV`` (exact), so a
  stock LiteRT runs the model;
* ``fp32`` from an fp16-weight model (MediaPipe's: f16 buffers behind DEQUANTIZE): each f16 constant and its
  DEQUANTIZE become the f32 constant they compute (exact), so the bundle is what it says;
* ``fp16`` keeps the f16 weights as they are (what the source holds; XNNPack computes in f32 on them).

It is what the planner puts in front of a TFLite source for a LiteRT target when the source cannot ship as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge.backends.converter import ConversionRequest, ConversionResult, Converter
from edge.errors import ConversionError


def prepare_tflite(source: Path, workdir: Path, *, fp32: bool = False) -> tuple[Path, dict[str, Any]]:
    """``source`` for another framework's TFLite frontend (tf2onnx, OpenVINO): MediaPipe's custom ops lowered,
    sparse weights (DENSIFY) made dense (and, ``fp32``, its f16 weights made f32), written into ``workdir`` when
    anything changed; the file to read and what was done (empty when nothing). Resource variables (state kept
    between calls) are refused in one line: no frontend translates them, LiteRT runs them as they are."""
    from edge.backends.litert.rewrite import load, resource_ops, rewrite

    data = Path(source).read_bytes()
    state = resource_ops(load(data))
    if state:
        raise ConversionError(
            f"{Path(source).name} keeps resource variables between calls ({', '.join(state)}); "
            "tf2onnx and OpenVINO's TFLite frontend cannot translate them",
            hint=f"LiteRT runs it as it is: convert it for arm-xnnpack (edgekit convert "
            f"{Path(source).name} -t arm-xnnpack), or bring the model's ONNX",
        )
    out, record = rewrite(data, lower=True, fp32=fp32, densify=True)
    if out is data:
        return Path(source), {}
    dst = Path(workdir) / (Path(source).stem + ".lowered.tflite")
    dst.write_bytes(out)
    return dst, record.to_json()


@dataclass(frozen=True)
class TFLiteToTFLiteOptions:
    """``tflite->tflite`` takes no options: declared, so that any name given is refused with what it takes."""


class TFLiteToTFLite(Converter):
    name = "tflite->tflite"
    source_format = "tflite"
    target_format = "tflite"
    precisions = frozenset({"fp32", "fp16"})
    options_class = TFLiteToTFLiteOptions

    def convert(self, request: ConversionRequest) -> ConversionResult:
        self.read_options(request.options)
        self.check_precision(request.precision)
        from edge.backends.litert.rewrite import custom_ops, has_fp16_weights, load, rewrite

        source = Path(request.source)
        data = source.read_bytes()
        if request.precision == "fp16" and not has_fp16_weights(load(data)):
            raise ConversionError(
                f"{source.name} holds no f16 weights; edgekit does not make an fp32 .tflite fp16",
                hint="ship it as it is (fp32), or bring the model's ONNX for fp16",
            )
        out, record = rewrite(data, lower=True, fp32=request.precision == "fp32")
        left = custom_ops(load(out))
        if left:
            raise ConversionError(
                f"{source.name} uses custom op(s) {', '.join(left)}, which LiteRT does not have and edgekit cannot lower",
                hint="bring the model's ONNX instead",
            )
        dst = request.workdir / "model.tflite"
        dst.write_bytes(out)
        details = {**record.to_json(), "bytes": len(out), "source_bytes": len(data)}
        notes = ["fp16: the source's f16 weights are kept as they are"] if request.precision == "fp16" else []
        import ai_edge_litert

        return ConversionResult(
            artifact=dst,
            format="tflite",
            files=[dst],
            tool_versions={"ai-edge-litert schema": getattr(ai_edge_litert, "__version__", "?")},
            details=details,
            notes=notes,
        )
