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
* fp16 with ``mixed_precision = "auto"`` (edge.graph.recipes) marks the ops that must compute in f32 with the
  ``precise_0`` rt_info, which the IR keeps (``DisablePrecisionConversion``) and the GPU and CPU plugins honour
  when they compute in f16; the search verifies with the CPU plugin forced to f16, as an iGPU computes.
  int8 has no such search yet (NNCF ``ignored_scope`` would be the mechanism).
* OpenVINO's and NNCF's opt-out telemetry is turned off before they are imported
  (:func:`edge.backends.openvino.run.disable_openvino_telemetry`).
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections import Counter
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal, Mapping

from edge.backends.converter import ConversionRequest, ConversionResult, Converter
from edge.backends.openvino.format import OPENVINO_REQUIREMENT, disable_openvino_telemetry, ov_core
from edge.backends.openvino.frontend_errors import frontend_error
from edge.base.typedjson import spec
from edge.capabilities import Requirement, require
from edge.errors import CalibrationError, ConversionError, PrecisionError
from edge.graph.opsupport import CPU_WAY, IF_WAY, OpSupport
from edge.verify.inputs import CALIB_FLAG

NNCF_REQUIREMENT = Requirement(
    "python", "nncf", install="pip install 'edgekit-ml[convert]'", why="int8 OpenVINO IR is quantized with NNCF"
)

# Constant element types that hold weights (shape/index constants are i32/i64 and are not counted)
_WEIGHT_TYPES = frozenset({"f64", "f32", "f16", "bf16", "i8", "u8", "i4", "u4", "nf4", "f8e4m3", "f8e5m2"})


def dist_version(dist: str, fallback: str = "unknown") -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return fallback


def weight_types(model: Any) -> dict[str, int]:
    """Count of weight-like Constants per element type, e.g. {"f32": 7}."""
    counts: Counter[str] = Counter()
    for op in model.get_ordered_ops():
        if op.get_type_name() == "Constant":
            et = op.get_output_element_type(0).get_type_name()
            if et in _WEIGHT_TYPES:
                counts[et] += 1
    return dict(sorted(counts.items()))


def op_counts(model: Any, *types: str) -> dict[str, int]:
    counts = Counter(op.get_type_name() for op in model.get_ordered_ops())
    return {t: counts.get(t, 0) for t in types}


#: rt_info key that keeps an op in its original precision: serialized in the IR (as DisablePrecisionConversion)
#: and honoured at compile time by the GPU and CPU plugins. ``disable_fp16_compression_0`` set from Python is a
#: plain string: measured with OpenVINO 2026.4, it is neither saved in the IR nor honoured by the CPU plugin.
_KEEP_PRECISION = "precise_0"
_SKIP_MARK = frozenset({"Parameter", "Constant", "Result"})


def _tensor_index(model: Any) -> dict[str, Any]:
    """ONNX tensor name -> the OpenVINO op that produces it (OpenVINO keeps ONNX tensor names)."""
    index: dict[str, Any] = {}
    for op in model.get_ordered_ops():
        for out in op.outputs():
            for name in out.get_names():
                index.setdefault(name, op)
    return index


def _ops_of(onnx_node: Any, index: dict[str, Any], limit: int = 64) -> list[Any]:
    """The OpenVINO ops one ONNX node became: from the producers of its outputs up to its inputs' producers
    (a Conv with a bias is a Convolution and an Add; only the Add carries the output's name)."""
    inputs = {i for i in onnx_node.input if i}
    start = [index[o] for o in onnx_node.output if o in index]
    found: dict[str, Any] = {}
    stack = list(start)
    while stack and len(found) < limit:
        op = stack.pop()
        if op.get_friendly_name() in found or op.get_type_name() in _SKIP_MARK:
            continue
        names = set().union(*(o.get_names() for o in op.outputs())) if op.outputs() else set()
        if names & inputs:
            continue
        found[op.get_friendly_name()] = op
        stack.extend(v.get_node() for v in op.input_values())
    return list(found.values())


def _mixed_fp16(ov: Any, source: Path, request: ConversionRequest, trials: int) -> tuple[Any, Any]:
    """The fp16 model with the ops that must compute in f32 marked, and the search that chose them; the search
    is None when this host cannot compute in f16 (only the range check is applied then)."""
    import tempfile

    from edge.graph import recipes
    from edge.graph.model import load_onnx

    onnx_model = recipes.name_nodes(load_onnx(source))
    samples, origin = recipes.search_samples(request)
    sizes = recipes.float_tensors(onnx_model)
    reference = recipes.onnx_infer(onnx_model)

    def initial() -> list[Any]:  # the fp16 range check: computed only when needed (see recipes.search)
        return recipes.fp16_range_keep(onnx_model, recipes.activation_ranges(reference, sizes, samples))

    by_name = {n.name: n for n in onnx_model.graph.node}
    core = ov_core()

    def build(kept: list[str]) -> Any:
        model = ov.convert_model(str(source))
        index = _tensor_index(model)
        for name in kept:
            for op in _ops_of(by_name[name], index):
                op.get_rt_info()[_KEEP_PRECISION] = ""
        return model

    if "FP16" not in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        return build([k.node for k in initial()]), None

    def infer_of(model: Any) -> recipes.Infer:
        import numpy as np

        tmp = tempfile.mkdtemp(prefix="edgekit-ovmp-")
        xml = Path(tmp) / "m.xml"
        ov.save_model(model, str(xml), compress_to_fp16=True)
        known = set(_tensor_index(core.read_model(str(xml))))

        def infer(feeds: Any, tensors: Any) -> list[dict[str, Any]]:
            m = core.read_model(str(xml))
            wanted = [t for t in tensors if t in known]
            if wanted:
                m.add_outputs(wanted)
            compiled = core.compile_model(m, "CPU", {"INFERENCE_PRECISION_HINT": "f16"})
            req = compiled.create_infer_request()
            results = []
            for feed in feeds:
                req.infer(dict(feed))
                row = {}
                for port in compiled.outputs:
                    value = np.array(req.get_tensor(port).data)
                    for name in port.get_names():
                        row[name] = value
                results.append(row)
            return results

        return infer

    goal = recipes.SearchGoal(
        target_cosine=recipes.target_cosine("fp16"),
        initial=initial,
        max_trials=trials,
        sizes=sizes,
        why="adds {err} relative error computed in f16 (error attribution)",
    )
    found = recipes.search(
        model=onnx_model,
        samples=samples,
        reference=reference,
        candidates=recipes.Candidates(build=build, infer_of=infer_of),
        goal=goal,
    )
    found.origin = origin + "; verified with OpenVINO's CPU plugin computing in f16"
    return found.artifact, found


# What each overflow-fix setting assumes of the device's CPU (recorded in the chain details).
_OVERFLOW_FIX = {
    "all": "7-bit weights in every layer: u8*s8 pair sums fit int16, so every x86 CPU (VNNI or AVX2 only) and the GPU compute the same",
    "first_layer": "7-bit weights in the first layer only: later layers assume an int8 dot product "
    "(VNNI/AMX CPU, or a GPU); an AVX2-only CPU saturates there",
    "none": "8-bit weights everywhere: assumes an int8 dot product (VNNI/AMX CPU, or a GPU)",
}


@dataclass(frozen=True)
class NNCFOptions:
    """NNCF's int8 options, what both OpenVINO converters take (``tflite->openvino-ir``: these alone), declared once
    (``edge.backends.options``): the names and descriptions ``doctor`` and the CLI print, the check of a profile's or
    a tuned overlay's values and the defaults all come from these fields. Words are read case-insensitively
    (``Mixed`` is ``mixed``)."""

    nncf_preset: Literal["performance", "mixed"] = spec(
        "performance",
        doc="int8: NNCF quantization preset, performance (default: symmetric activations) "
        "or mixed (asymmetric activations, for models with asymmetric ranges)",
    )
    nncf_subset_size: int | None = spec(
        None, ge=1, le=1 << 20, doc="int8: number of calibration samples NNCF uses (default: all samples given)"
    )
    nncf_overflow_fix: Literal["all", "first_layer", "none"] = spec(
        "all",
        doc="int8: 7-bit weights so x86 CPUs without VNNI (AVX2 vpmaddubsw) do not saturate: "
        "all (default: the same result on every CPU), first_layer (NNCF's default) or none",
    )


@dataclass(frozen=True)
class OpenVINOConvertOptions(NNCFOptions):
    """``onnx->openvino-ir``'s options: NNCF's, and the fp16 recipe's."""

    mixed_precision: Literal["auto", "off"] = spec(
        "auto",
        doc="fp16: auto (default) marks the ops of the ONNX nodes whose activations leave fp16's range, "
        "then of those adding the most error, to compute in f32 (rt_info precise_0, saved in the IR "
        "as DisablePrecisionConversion), verified with the CPU plugin computing in f16 as an iGPU "
        "does (edge.graph.recipes); off leaves every op to the device's precision",
    )
    mixed_precision_trials: int = spec(
        6, ge=0, le=1000, doc="fp16: at most this many re-verifications while growing the kept set (default 6)"
    )


def convert_options(request: ConversionRequest) -> OpenVINOConvertOptions:
    """The request's options, typed and checked (one line naming the option otherwise)."""
    typed: OpenVINOConvertOptions = OnnxToOpenVINO.read_options(words_lowered(request.options))
    return typed


def words_lowered(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with its words in lower case, as the OpenVINO converters read them."""
    return {k: v.lower() if isinstance(v, str) else v for k, v in options.items()}


class OnnxToOpenVINO(Converter):
    name = "onnx->openvino-ir"
    source_format = "onnx"
    target_format = "openvino-ir"
    precisions = frozenset({"fp32", "fp16", "int8"})
    calibrated_precisions = frozenset({"int8"})
    requires = (OPENVINO_REQUIREMENT,)
    #: extra requirements per precision, checked inside convert()
    precision_requires = {"int8": (NNCF_REQUIREMENT,)}
    options_class = OpenVINOConvertOptions  # ``options`` (names and descriptions) derive from it

    @classmethod
    def op_support(cls) -> OpSupport:
        """``If`` with branch outputs of different rank: the If output gets a dynamic rank, which OpenVINO 2026.4's
        ONNX frontend refuses before a Conv (Silero VAD) and its CPU plug-in refuses outright ("If operation with
        dynamic rank", the graph in tests/graph/test_graphs.py). If itself is not the limit (the GPU plug-in has a
        condition primitive, openvinotoolkit/openvino#18043): the frontend does not fold a condition computed from
        shapes, so Silero VAD fails the same way with static input/state and ``sr`` frozen to 16000 (measured,
        2026.4.1); the frontend fix, openvinotoolkit/openvino#32677, was closed unmerged. What works is inlining
        every If at one sample rate and static shapes (snakers4/silero-vad#779's examples/openvino): OpenVINO CPU
        fp32 then matches onnxruntime (max abs 7.7e-8, 32 chained steps; measured). Every domain is taken."""
        return OpSupport(
            cls.name, "OpenVINO's ONNX frontend", other_domains=None, same_rank_if=True, way_forward=IF_WAY + CPU_WAY
        )

    def convert(self, request: ConversionRequest) -> ConversionResult:
        opts = convert_options(request)
        self._check_request(request)
        int8 = request.precision == "int8"
        preset, subset_size = self._int8_options(opts, request) if int8 else (None, None)
        # Default "all": measured on the PP-OCR classifier (240 text lines), first_layer failed parity on an
        # AVX2-only Zen 2 (cosine 0.9798, worst 0.64) while "all" passed there (0.9960) and was no worse on
        # an AMX Xeon (0.9981 vs 0.9945; accuracy 91.3% vs 90.8%, source 93.8%).
        overflow_fix = opts.nncf_overflow_fix

        telemetry = disable_openvino_telemetry()
        import openvino as ov

        source = Path(request.source)
        model = _convert_source(ov, source)
        source_types = weight_types(model)

        tool_versions = {"openvino": dist_version("openvino", ov.get_version().split("-", 1)[0])}
        details: dict[str, Any] = {"openvino_build": ov.get_version()}
        notes: list[str] = []
        if int8:
            assert preset is not None and subset_size is not None
            model, used = self._quantize(model, request, preset, subset_size, overflow_fix)
            tool_versions["nncf"] = dist_version("nncf")
            details.update(
                nncf_preset=preset,
                nncf_subset_size=used,
                calibration_samples=len(request.calibration.samples),  # type: ignore[union-attr]
                nncf_overflow_fix=overflow_fix,
                isa_assumption=_OVERFLOW_FIX[overflow_fix],
            )
            if used < subset_size:
                notes.append(
                    f"nncf_subset_size {subset_size} is more than the {used} calibration samples given; NNCF used {used}"
                )

        compress = request.precision == "fp16"
        if compress:
            model = _fp16_recipe(ov, model, source, request, details, notes)
        xml = request.workdir / "model.xml"
        bin_ = xml.with_suffix(".bin")
        saved_types, ops = _save_checked(ov, model, xml, source, request, source_types, notes)
        if int8 and not ops["FakeQuantize"]:
            raise ConversionError(
                f"NNCF quantized no operation of {source} (no FakeQuantize in the IR)",
                hint="the model may have no Conv/MatMul/Gemm; use fp16 or fp32",
            )

        details.update(
            compress_to_fp16=compress,
            weight_element_types=saved_types,
            source_weight_element_types=source_types,
            bin_bytes=bin_.stat().st_size,
            telemetry=telemetry,
        )
        if int8:
            details["fake_quantize_ops"] = ops["FakeQuantize"]
            details["int8_report"], note = _int8_report(xml)
            notes.extend([note] if note else [])
        return ConversionResult(
            artifact=xml,
            format=self.target_format,
            files=[xml, bin_],
            tool_versions=tool_versions,
            details=details,
            notes=notes,
        )

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

    @staticmethod
    def _int8_options(opts: NNCFOptions, request: ConversionRequest) -> tuple[str, int]:
        assert request.calibration is not None
        return opts.nncf_preset, opts.nncf_subset_size or len(request.calibration.samples)

    def _quantize(
        self, model: Any, request: ConversionRequest, preset: str, subset_size: int, overflow_fix: str
    ) -> tuple[Any, int]:
        import numpy as np

        disable_openvino_telemetry()
        import nncf

        assert request.calibration is not None
        inputs = [
            (p.get_any_name(), tuple(p.get_shape()), np.dtype(p.get_element_type().to_dtype())) for p in model.inputs
        ]
        samples: list[dict[str, Any]] = []
        for i, sample in enumerate(request.calibration.samples):
            feed: dict[str, Any] = {}
            for name, shape, dtype in inputs:
                if name not in sample:
                    raise CalibrationError(
                        f"calibration sample {i} for {request.source} has no input {name!r} "
                        f"(it has: {', '.join(map(str, sample)) or 'nothing'})"
                    )
                a = np.ascontiguousarray(np.asarray(sample[name]), dtype=dtype)
                if tuple(a.shape) != shape:
                    raise CalibrationError(
                        f"calibration sample {i} for {request.source}: input {name!r} has shape {tuple(a.shape)}, the model takes {shape}"
                    )
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
                quantized = nncf.quantize(
                    model,
                    dataset,
                    preset=nncf.QuantizationPreset(preset),
                    subset_size=used,
                    advanced_parameters=AdvancedQuantizationParameters(overflow_fix=fix[overflow_fix]),
                )
        except Exception as e:
            raise ConversionError(
                f"NNCF could not quantize {request.source} to int8: {type(e).__name__}: {str(e)[:500]}"
            ) from e
        finally:
            nncf_log.setLevel(level)
        return quantized, used


def _convert_source(ov: Any, source: Path) -> Any:
    """The ONNX model read by OpenVINO's frontend; a failure is a ConversionError saying why."""
    try:
        return ov.convert_model(str(source))
    except Exception as e:
        # the op, the node and what takes it instead; never the frontend's source lines or edgekit's temp path
        raise frontend_error(str(e), source, ov.get_version().split("-", 1)[0]) from e


def _fp16_recipe(
    ov: Any, model: Any, source: Path, request: ConversionRequest, details: dict[str, Any], notes: list[str]
) -> Any:
    """The model with the mixed-precision fp16 recipe (``mixed_precision = "auto"``: the nodes kept in f32 where
    f16 adds error, verified on this host's CPU plugin in f16 when it can)."""

    opts = convert_options(request)
    mode, trials = opts.mixed_precision, opts.mixed_precision_trials
    details["mixed_precision"] = mode
    if mode != "auto":
        return model
    model, found = _mixed_fp16(ov, source, request, trials)
    if found is None:
        notes.append(
            "mixed precision: this host's OpenVINO CPU plugin cannot compute in f16, so the fp16 "
            "recipe was not verified here; only the activation range check was applied"
        )
        return model
    details["kept_fp32"] = [k.to_json() for k in found.kept]
    details["mixed_precision_search"] = found.to_json()
    note = found.note("f32")
    if note:
        notes.append(note)
    return model


def _save_checked(
    ov: Any, model: Any, xml: Path, source: Path, request: ConversionRequest, source_types: Any, notes: list[str]
) -> tuple[Any, dict[str, int]]:
    """Save the IR and inspect what was really written, not what was asked for: (its weight types, its
    FakeQuantize/FakeConvert counts)."""
    compress = request.precision == "fp16"
    try:
        ov.save_model(model, str(xml), compress_to_fp16=compress)
    except Exception as e:
        raise ConversionError(
            f"OpenVINO could not save the IR of {source} to {xml}: {type(e).__name__}: {str(e)[:500]}"
        ) from e
    try:
        saved = ov_core().read_model(str(xml))
    except Exception as e:
        raise ConversionError(
            f"the IR OpenVINO wrote for {source} cannot be read back from {xml}: {type(e).__name__}: {str(e)[:500]}"
        ) from e
    saved_types = weight_types(saved)
    if request.precision in ("fp32", "int8") and "f16" in saved_types and "f16" not in source_types:
        raise ConversionError(
            f"OpenVINO saved f16 weights for {source} although compress_to_fp16=False "
            f"(weights: {saved_types}); the {request.precision} IR would not be what it claims"
        )
    if compress and "f16" not in saved_types and saved_types:
        notes.append(f"compress_to_fp16 left no f16 weights (weights: {saved_types})")
    return saved_types, op_counts(saved, "FakeQuantize", "FakeConvert")


def _int8_report(xml: Path) -> tuple[dict[str, Any], str | None]:
    """The int8 IR's layers in int8 and in float on this host's CPU plugin, with the reasons
    (``edge.graph.quantized.openvino_int8_placement``): (the report for the chain details, the convert-report line)."""
    from edge.graph.quantized import openvino_int8_placement

    try:
        placement = openvino_int8_placement(xml, ov_core())
    except Exception as e:  # noqa: BLE001 - the IR is sound; only the analysis is missing (recorded)
        return {"placement_not_read": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"}, None
    report = {"placement": placement.to_json(), "optimized_by": "OpenVINO CPU plugin, f32 for float layers, build host"}
    return report, placement.summary().replace("int8 kernels", "int8 layers")
