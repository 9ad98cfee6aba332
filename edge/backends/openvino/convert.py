"""ONNX -> OpenVINO IR (model.xml + model.bin): fp32, fp16 weights, or int8 with NNCF.

Recipe notes (openvino 2026.4, nncf 3.4):

* ``ov.save_model`` compresses float weights to fp16 *by default*; an fp32 bundle is saved
  with ``compress_to_fp16=False`` and the saved IR is read back to check that no weight
  became f16 (the element types found are recorded in ``details``).
* fp16 only changes the stored weights (f16 Constants + Convert); the device still picks
  its compute precision at compile time (the runner records it).
* int8 is NNCF post-training quantization (FakeQuantize on activations and weights,
  weights stored as i8) with the profile's preset; the remaining float constants are kept
  f32. NNCF's progress bars are kept off stdout and its INFO logging is muted while it runs.
* OpenVINO's and NNCF's opt-out telemetry is turned off before they are imported
  (:func:`edge.backends.openvino.run.disable_openvino_telemetry`).
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections import Counter
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from edge.capabilities import Requirement, require
from edge.backends.converter import ConversionRequest, ConversionResult, Converter
from edge.errors import CalibrationError, ConversionError, PrecisionError
from edge.backends.openvino.format import OPENVINO_REQUIREMENT, disable_openvino_telemetry

NNCF_REQUIREMENT = Requirement("python", "nncf", install="pip install 'edgekit-ml[convert]'",
                               why="int8 OpenVINO IR is quantized with NNCF")

_PRESETS = ("performance", "mixed")
# Constant element types that hold weights (shape/index constants are i32/i64 and are not counted)
_WEIGHT_TYPES = frozenset({"f64", "f32", "f16", "bf16", "i8", "u8", "i4", "u4", "nf4", "f8e4m3", "f8e5m2"})


def _dist_version(dist: str, fallback: str = "unknown") -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return fallback


def _weight_types(model: Any) -> dict[str, int]:
    """Count of weight-like Constants per element type, e.g. {"f32": 7}."""
    counts: Counter[str] = Counter()
    for op in model.get_ordered_ops():
        if op.get_type_name() == "Constant":
            et = op.get_output_element_type(0).get_type_name()
            if et in _WEIGHT_TYPES:
                counts[et] += 1
    return dict(sorted(counts.items()))


def _op_counts(model: Any, *types: str) -> dict[str, int]:
    counts = Counter(op.get_type_name() for op in model.get_ordered_ops())
    return {t: counts.get(t, 0) for t in types}


# What each overflow-fix setting assumes of the device's CPU (recorded in the chain details).
_OVERFLOW_FIX = {
    "all": "7-bit weights in every layer: u8*s8 pair sums fit int16, so every x86 CPU (VNNI or AVX2 only) "
           "and the GPU compute the same",
    "first_layer": "7-bit weights in the first layer only: later layers assume an int8 dot product "
                   "(VNNI/AMX CPU, or a GPU); an AVX2-only CPU saturates there",
    "none": "8-bit weights everywhere: assumes an int8 dot product (VNNI/AMX CPU, or a GPU)",
}


class OnnxToOpenVINO(Converter):
    name = "onnx->openvino-ir"
    source_format = "onnx"
    target_format = "openvino-ir"
    precisions = frozenset({"fp32", "fp16", "int8"})
    calibrated_precisions = frozenset({"int8"})
    requires = (OPENVINO_REQUIREMENT,)
    #: extra requirements per precision, checked inside convert()
    precision_requires = {"int8": (NNCF_REQUIREMENT,)}
    options = {
        "nncf_preset": "int8: NNCF quantization preset, performance (default: symmetric activations) "
                       "or mixed (asymmetric activations, for models with asymmetric ranges)",
        "nncf_subset_size": "int8: number of calibration samples NNCF uses (default: all samples given)",
        "nncf_overflow_fix": "int8: 7-bit weights so x86 CPUs without VNNI (AVX2 vpmaddubsw) do not saturate: "
                             "all (default: the same result on every CPU), first_layer (NNCF's default) or none",
    }

    def convert(self, request: ConversionRequest) -> ConversionResult:
        self.check_options(request.options)
        if request.precision not in self.precisions:
            raise PrecisionError(f"converter {self.name!r} does not produce precision {request.precision!r}",
                                 hint=f"choose one of {', '.join(sorted(self.precisions))}")
        require(self.requires + self.precision_requires.get(request.precision, ()),
                f"converter {self.name!r} at precision {request.precision}")
        int8 = request.precision == "int8"
        if int8 and (request.calibration is None or not request.calibration.samples):
            raise CalibrationError(
                f"int8 OpenVINO IR needs calibration samples for {request.source}; none were given",
                hint="pass --calibration DIR, or --calibration random for a smoke test",
            )
        preset, subset_size = self._int8_options(request) if int8 else (None, None)
        # Default "all": measured on the PP-OCR classifier (240 text lines), first_layer failed parity on an
        # AVX2-only Zen 2 (cosine 0.9798, worst 0.64) while "all" passed there (0.9960) and was no worse on
        # an AMX Xeon (0.9981 vs 0.9945; accuracy 91.3% vs 90.8%, source 93.8%).
        overflow_fix = str(request.options.get("nncf_overflow_fix", "all")).lower()
        if overflow_fix not in _OVERFLOW_FIX:
            raise ConversionError(f"nncf_overflow_fix must be one of {', '.join(_OVERFLOW_FIX)}, "
                                  f"got {request.options.get('nncf_overflow_fix')!r}")

        telemetry = disable_openvino_telemetry()
        import openvino as ov

        source = Path(request.source)
        try:
            model = ov.convert_model(str(source))
        except Exception as e:
            raise ConversionError(f"OpenVINO could not convert {source}: {type(e).__name__}: {str(e)[:500]}") from e
        source_types = _weight_types(model)

        tool_versions = {"openvino": _dist_version("openvino", ov.get_version().split("-", 1)[0])}
        details: dict[str, Any] = {"openvino_build": ov.get_version()}
        notes: list[str] = []
        if int8:
            assert preset is not None and subset_size is not None
            model, used = self._quantize(model, request, preset, subset_size, overflow_fix)
            tool_versions["nncf"] = _dist_version("nncf")
            details.update(nncf_preset=preset, nncf_subset_size=used, calibration_samples=len(request.calibration.samples),  # type: ignore[union-attr]
                           nncf_overflow_fix=overflow_fix, isa_assumption=_OVERFLOW_FIX[overflow_fix])
            if used < subset_size:
                notes.append(f"nncf_subset_size {subset_size} is more than the {used} calibration samples given; "
                             f"NNCF used {used}")

        compress = request.precision == "fp16"
        xml = request.workdir / "model.xml"
        bin_ = xml.with_suffix(".bin")
        try:
            ov.save_model(model, str(xml), compress_to_fp16=compress)
        except Exception as e:
            raise ConversionError(f"OpenVINO could not save the IR of {source} to {xml}: "
                                  f"{type(e).__name__}: {str(e)[:500]}") from e

        # Inspect what was really written, not what was asked for.
        try:
            saved = ov.Core().read_model(str(xml))
        except Exception as e:
            raise ConversionError(f"the IR OpenVINO wrote for {source} cannot be read back from {xml}: "
                                  f"{type(e).__name__}: {str(e)[:500]}") from e
        saved_types = _weight_types(saved)
        if request.precision in ("fp32", "int8") and "f16" in saved_types and "f16" not in source_types:
            raise ConversionError(f"OpenVINO saved f16 weights for {source} although compress_to_fp16=False "
                                  f"(weights: {saved_types}); the {request.precision} IR would not be what it claims")
        if compress and "f16" not in saved_types and saved_types:
            notes.append(f"compress_to_fp16 left no f16 weights (weights: {saved_types})")
        ops = _op_counts(saved, "FakeQuantize", "FakeConvert")
        if int8 and not ops["FakeQuantize"]:
            raise ConversionError(f"NNCF quantized no operation of {source} (no FakeQuantize in the IR)",
                                  hint="the model may have no Conv/MatMul/Gemm; use fp16 or fp32")

        details.update(
            compress_to_fp16=compress,
            weight_element_types=saved_types,
            source_weight_element_types=source_types,
            bin_bytes=bin_.stat().st_size,
            telemetry=telemetry,
        )
        if int8:
            details["fake_quantize_ops"] = ops["FakeQuantize"]
        return ConversionResult(
            artifact=xml,
            format=self.target_format,
            files=[xml, bin_],
            tool_versions=tool_versions,
            details=details,
            notes=notes,
        )

    @staticmethod
    def _int8_options(request: ConversionRequest) -> tuple[str, int]:
        preset = str(request.options.get("nncf_preset", "performance")).lower()
        if preset not in _PRESETS:
            raise ConversionError(f"nncf_preset must be one of {', '.join(_PRESETS)}, "
                                  f"got {request.options.get('nncf_preset')!r}")
        assert request.calibration is not None
        raw = request.options.get("nncf_subset_size", len(request.calibration.samples))
        try:
            subset_size = int(raw)
        except (TypeError, ValueError):
            subset_size = 0
        if subset_size < 1:
            raise ConversionError(f"nncf_subset_size must be an integer >= 1, got {raw!r}")
        return preset, subset_size

    def _quantize(self, model: Any, request: ConversionRequest, preset: str, subset_size: int,
                  overflow_fix: str) -> tuple[Any, int]:
        import numpy as np

        disable_openvino_telemetry()
        import nncf

        assert request.calibration is not None
        inputs = [(p.get_any_name(), tuple(p.get_shape()), np.dtype(p.get_element_type().to_dtype()))
                  for p in model.inputs]
        samples: list[dict[str, Any]] = []
        for i, sample in enumerate(request.calibration.samples):
            feed: dict[str, Any] = {}
            for name, shape, dtype in inputs:
                if name not in sample:
                    raise CalibrationError(f"calibration sample {i} for {request.source} has no input {name!r} "
                                           f"(it has: {', '.join(map(str, sample)) or 'nothing'})")
                a = np.ascontiguousarray(np.asarray(sample[name]), dtype=dtype)
                if tuple(a.shape) != shape:
                    raise CalibrationError(f"calibration sample {i} for {request.source}: input {name!r} has shape "
                                           f"{tuple(a.shape)}, the model takes {shape}")
                feed[name] = a
            samples.append(feed)
        used = min(subset_size, len(samples))
        dataset = nncf.Dataset(samples)  # each item is already the dict OpenVINO's infer() takes
        nncf_log = logging.getLogger("nncf")
        level = nncf_log.level
        nncf_log.setLevel(logging.WARNING)
        captured = io.StringIO()
        try:
            with contextlib.redirect_stdout(captured):  # NNCF's rich progress bars
                from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, OverflowFix

                fix = {"all": OverflowFix.ENABLE, "first_layer": OverflowFix.FIRST_LAYER, "none": OverflowFix.DISABLE}
                quantized = nncf.quantize(model, dataset, preset=nncf.QuantizationPreset(preset), subset_size=used,
                                          advanced_parameters=AdvancedQuantizationParameters(
                                              overflow_fix=fix[overflow_fix]))
        except Exception as e:
            raise ConversionError(f"NNCF could not quantize {request.source} to int8: "
                                  f"{type(e).__name__}: {str(e)[:500]}") from e
        finally:
            nncf_log.setLevel(level)
        return quantized, used
