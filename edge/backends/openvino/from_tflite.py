"""TFLite -> OpenVINO IR (model.xml + model.bin), read by OpenVINO's own TFLite frontend.

Recipe notes (openvino 2026.4):

* ``ov.convert_model('x.tflite')`` reads the flatbuffer directly; tensor names (the TFLite tensor names,
  e.g. BlazeFace's ``input`` / ``regressors`` / ``classificators``) are kept, so the LiteRT reference and
  the IR compare output by output.
* An fp16-weight TFLite (MediaPipe's models: float16 buffers behind DEQUANTIZE) arrives as f16 Constants
  followed by Convert to f32. An **fp32** bundle folds each such pair into one f32 Constant (the values are
  exact: every f16 is an f32), so the IR holds what it claims; the element types found in the saved IR are
  recorded in ``details`` and checked.
* fp16 is ``compress_to_fp16=True`` (the f16 weights stay f16, the remaining f32 ones are compressed). The
  mixed-precision search of ``onnx->openvino-ir`` reads ONNX nodes, so it does not run here; the parity gate
  (OpenVINO computing the bundle's precision) judges the result.
* int8 is NNCF on the OpenVINO model, the same recipe and options as ``onnx->openvino-ir``.
* MediaPipe's custom ``Convolution2DTransposeBias`` is lowered to the builtin TRANSPOSE_CONV first (exact:
  :mod:`edge.backends.litert.rewrite`); any other op the frontend has no translator for ("No translator found
  for X node") is refused in one line naming it, with every custom op of the file.
* Measured on an AMD EPYC (AVX512-BF16, no FP16): OpenVINO's CPU plugin computes an fp16 bundle in bf16, and
  neither ``precise_0`` nor ``disable_fp16_compression_0`` rt_info changes that (selfie segmentation: mean
  cosine 0.9878 with no op marked and with every op marked), so no mixed-precision recipe can help there.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from edge.backends.converter import ConversionRequest, ConversionResult, Converter
from edge.backends.openvino.convert import (
    NNCF_REQUIREMENT,
    NNCFOptions,
    OnnxToOpenVINO,
    dist_version,
    op_counts,
    weight_types,
    words_lowered,
)
from edge.backends.openvino.format import OPENVINO_REQUIREMENT, disable_openvino_telemetry, ov_core
from edge.capabilities import require
from edge.errors import CalibrationError, ConversionError, PrecisionError
from edge.verify.inputs import CALIB_FLAG

_NO_TRANSLATOR = re.compile(r"No translator found for (\S+) node")
# OpenVINO 2026's form: "The translation is incomplete due to operation 0 of type RFFT2D"
_INCOMPLETE = re.compile(r"translation is incomplete due to operation (\d+) of type (\w+)")


def fold_f16_constants(model: Any) -> int:
    """Replace every ``Constant(f16) -> Convert(f32)`` pair with one f32 Constant; returns how many were folded."""
    import numpy as np
    import openvino as ov
    from openvino import opset13 as ops

    folded = 0
    for op in model.get_ordered_ops():
        if op.get_type_name() != "Convert" or op.get_output_element_type(0) != ov.Type.f32:
            continue
        src = op.input_value(0).get_node()
        if src.get_type_name() != "Constant" or src.get_output_element_type(0) != ov.Type.f16:
            continue
        value = np.asarray(src.get_data(), dtype=np.float16).astype(np.float32)
        const = ops.constant(value, dtype=np.float32)
        const.set_friendly_name(src.get_friendly_name())
        op.output(0).replace(const.output(0))
        folded += 1
    if folded:
        model.validate_nodes_and_infer_types()
    return folded


class TFLiteToOpenVINO(Converter):
    name = "tflite->openvino-ir"
    source_format = "tflite"
    target_format = "openvino-ir"
    precisions = frozenset({"fp32", "fp16", "int8"})
    calibrated_precisions = frozenset({"int8"})
    requires = (OPENVINO_REQUIREMENT,)
    precision_requires = {"int8": (NNCF_REQUIREMENT,)}
    options_class = NNCFOptions  # ``options`` (names and descriptions) derive from it

    @staticmethod
    def _read(ov: Any, path: Path, source: Path) -> Any:
        """OpenVINO's TFLite frontend on ``path``; an op it has no translator for is refused in one line."""
        try:
            return ov.convert_model(str(path))
        except Exception as e:  # noqa: BLE001 - OpenVINO's frontend errors are plain RuntimeErrors
            missing = sorted(set(_NO_TRANSLATOR.findall(str(e))) | {op for _i, op in _INCOMPLETE.findall(str(e))})
            if missing:
                from edge.backends.litert.format import untranslated_ops

                what, hint = untranslated_ops(path, missing)
                where = sorted({int(i) for i, _op in _INCOMPLETE.findall(str(e))})
                at = f" (operator {', '.join(map(str, where))} of the graph)" if where else ""
                raise ConversionError(
                    f"OpenVINO's TFLite frontend cannot convert {source.name}: no translator for op {what}{at}",
                    hint=hint.replace(path.name, source.name),
                ) from None
            first = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise ConversionError(
                f"OpenVINO could not convert {source.name}: {type(e).__name__}: {first[:300]}"
            ) from None

    def convert(self, request: ConversionRequest) -> ConversionResult:
        import tempfile

        # the lowered copy lives until the IR is saved: OpenVINO may keep reading the file's weights
        with tempfile.TemporaryDirectory(prefix="edgekit-tflite-ov-") as tmp:
            return self._convert(request, Path(tmp))

    def _check_request(self, request: ConversionRequest) -> None:
        """The precision is one this converter makes, its packages are installed, and int8 has calibration samples."""
        if request.precision not in self.precisions:
            raise PrecisionError(
                f"converter {self.name!r} does not produce precision {request.precision!r}",
                hint=f"choose one of {', '.join(sorted(self.precisions))}",
            )
        require(
            self.requires + self.precision_requires.get(request.precision, ()),
            f"converter {self.name!r} at precision {request.precision}",
        )
        if request.precision == "int8" and (request.calibration is None or not request.calibration.samples):
            raise CalibrationError(
                f"int8 OpenVINO IR needs calibration samples for {request.source}; none were given",
                hint=f"pass {CALIB_FLAG} DIR, or {CALIB_FLAG} random for a smoke test",
            )

    def _convert(self, request: ConversionRequest, tmp: Path) -> ConversionResult:
        opts: NNCFOptions = self.read_options(words_lowered(request.options))
        self._check_request(request)
        int8 = request.precision == "int8"
        helper = OnnxToOpenVINO()
        preset, subset_size = helper._int8_options(opts, request) if int8 else (None, None)
        overflow_fix = opts.nncf_overflow_fix

        telemetry = disable_openvino_telemetry()
        import openvino as ov

        from edge.backends.litert.from_tflite import prepare_tflite

        source = Path(request.source)
        readable, lowered = prepare_tflite(source, tmp)  # MediaPipe's custom ops -> builtins
        model = self._read(ov, readable, source)
        renamed = _name_by_signature(model, source)
        source_types = weight_types(model)
        details: dict[str, Any] = {"openvino_build": ov.get_version(), "frontend": "tflite"}
        if lowered:
            details["tflite_rewrite"] = lowered
        if renamed:
            details["io_renamed_to_signature"] = renamed

        notes: list[str] = []
        folded = 0
        if request.precision in ("fp32", "int8"):
            folded = fold_f16_constants(model)
            details["f16_weights_folded_to_f32"] = folded
        tool_versions = {"openvino": dist_version("openvino", ov.get_version().split("-", 1)[0])}
        if int8:
            assert preset is not None and subset_size is not None
            model, used = helper._quantize(model, request, preset, subset_size, overflow_fix)
            tool_versions["nncf"] = dist_version("nncf")
            details.update(nncf_preset=preset, nncf_subset_size=used, nncf_overflow_fix=overflow_fix)
        compress = request.precision == "fp16"
        if compress:
            notes.append(
                "fp16 from a TFLite source: no mixed-precision search (it reads ONNX nodes); the parity gate "
                "judges OpenVINO computing the bundle"
            )
        xml = request.workdir / "model.xml"
        saved = _save_ir(ov, model, xml, compress, source)
        saved_types = weight_types(saved)
        if request.precision in ("fp32", "int8") and "f16" in saved_types:
            raise ConversionError(
                f"the {request.precision} IR of {source.name} still holds f16 weights "
                f"({saved_types}) after folding {folded}; it would not be what it claims"
            )
        if int8 and not op_counts(saved, "FakeQuantize")["FakeQuantize"]:
            raise ConversionError(f"NNCF quantized no operation of {source.name} (no FakeQuantize in the IR)")
        details.update(
            compress_to_fp16=compress,
            weight_element_types=saved_types,
            source_weight_element_types=source_types,
            bin_bytes=xml.with_suffix(".bin").stat().st_size,
            telemetry=telemetry,
        )
        return ConversionResult(
            artifact=xml,
            format=self.target_format,
            files=[xml, xml.with_suffix(".bin")],
            tool_versions=tool_versions,
            details=details,
            notes=notes,
        )


def _save_ir(ov: Any, model: Any, xml: Path, compress: bool, source: Path) -> Any:
    """Save the IR at ``xml`` (its weights compressed to f16 with ``compress``) and read it back; a failure is a
    ConversionError naming the source."""
    try:
        ov.save_model(model, str(xml), compress_to_fp16=compress)
        return ov_core().read_model(str(xml))
    except Exception as e:  # noqa: BLE001
        raise ConversionError(
            f"OpenVINO could not save the IR of {source.name}: {type(e).__name__}: {str(e)[:300]}"
        ) from None


def _name_by_signature(model: Any, tflite: Path) -> dict[str, str]:
    """OpenVINO's TFLite frontend names ports by tensor (``serving_default_x.1:0``); the bundle names them as the
    file's SignatureDef does (``x.1``). Each port whose name the signature maps gets the signature's name."""
    from edge.backends.litert.format import signature_names

    names = signature_names(tflite)
    done: dict[str, str] = {}
    for port in list(model.inputs) + list(model.outputs):
        old = next((n for n in port.get_names() if n in names), None)
        if old is not None:
            port.get_tensor().set_names({names[old]})
            done[old] = names[old]
    return done
