"""ONNX -> ONNX with onnxruntime's own tools: offline graph optimisation, fp16, int8 QDQ, int8 dynamic.

Recipe choices come from measurements on x86 (docs/design-notes.md): static int8 is QDQ with
uint8 activations and int8 per-channel weights (S8S8 was slower than fp32 on x86 without
VNNI-friendly kernels); dynamic int8 is applied to MatMul/Gemm only (dynamic Conv ran
5-13x slower than fp32).

fp16 and int8 keep accuracy with ``mixed_precision = "auto"`` (edge.graph.recipes): nodes whose fp32 activations
leave fp16's range stay fp32, then the nodes adding the most error are kept in float (fp16: node_block_list;
int8: nodes_to_exclude) until the candidate passes parity against the fp32 source; the details list them.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal, Mapping

from edge.backends.converter import ConversionRequest, ConversionResult, Converter
from edge.base.typedjson import Rule, spec
from edge.capabilities import Requirement
from edge.errors import CalibrationError, ConversionError
from edge.graph.model import load_onnx, opset_of, save_onnx
from edge.graph.recipes import DEFAULT_TRIALS
from edge.verify.inputs import CALIB_FLAG

_ORT = Requirement("python", "onnxruntime", install="pip install 'edgekit-ml[onnx]'")
_ONNX = Requirement("python", "onnx", install="pip install 'edgekit-ml[onnx]'")

# What an int8 bundle assumes of the device's CPU, recorded in its chain details: the same bundle
# computes exactly on every x86-64 CPU only because the runner sets session.x64quantprecision where needed.
_U8S8_ASSUMPTION = (
    "8-bit weights, no reduce_range: exact where the CPU has an int8 dot product (x86 VNNI/AMX, "
    "ARM dotprod); on x86 CPUs without one (e.g. AVX2-only AMD Zen 2) the onnxruntime runner computes "
    "u8u8 (x64_quant_precision, auto by default), since u8s8 with vpmaddubsw saturates there"
)

CALIBRATE = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}
_QTYPES = {"uint8": "QUInt8", "int8": "QInt8"}


@dataclass(frozen=True)
class OnnxConvertOptions:
    """``onnx->onnx``'s options, declared once (``edge.backends.options``): the names and descriptions ``doctor``
    and the CLI print, the check of a profile's or a tuned overlay's values and the defaults come from these
    fields. Words are read case-insensitively (``MinMax`` is ``minmax``)."""

    activation_type: Literal["uint8", "int8"] = spec(
        "uint8", doc="int8 static: activation type, uint8 (default) or int8"
    )
    weight_type: Literal["int8", "uint8"] = spec(
        "int8", doc="int8 static/dynamic: weight type, int8 (default) or uint8"
    )
    per_channel: bool = spec(True, doc="int8 static: per-channel weight scales (default true)")
    calibrate_method: Literal["minmax", "entropy", "percentile"] = spec(
        "minmax",
        doc="int8 static: minmax (default), entropy or percentile; with mixed_precision auto, when the "
        "fully quantized model fails the search's check, percentile's is tried too and the "
        "search goes on from the better one (recorded)",
    )
    dynamic_op_types: tuple[str, ...] = spec(
        ("MatMul", "Gemm"),
        min_items=1,
        max_items=64,
        item=Rule(pattern=r"^[A-Za-z][A-Za-z0-9_]{0,63}$"),
        doc="int8-dynamic: op types to quantize (default [MatMul, Gemm])",
    )
    optimization_level: Literal["basic", "extended"] = spec(
        "extended", doc="fp32: offline graph optimisation, basic or extended (default)"
    )
    fold_quantized_weights: bool = spec(
        False,
        doc="fp32 from int8/uint8 weights (Cast+Mul, as a weight-only export ships them): false "
        "(default) keeps the dequantisation in the graph when folding it would grow the model (onnxruntime folds it "
        "as the device loads the model: fp32 compute, a 4x smaller download); true folds them into f32 constants",
    )
    mixed_precision: Literal["auto", "off"] = spec(
        "auto",
        doc="fp16/int8: auto (default) keeps in fp32 the nodes whose activations leave fp16's range, "
        "then the nodes adding the most error, until the candidate passes parity against the fp32 "
        "source on the search inputs (edge.graph.recipes); off converts every node",
    )
    mixed_precision_trials: int = spec(
        DEFAULT_TRIALS,
        ge=0,
        le=1000,
        doc="fp16/int8: at most this many re-conversions while growing the kept set (default 6; "
        "0 = only the range check for fp16, none for int8)",
    )
    measure_speedup: bool = spec(
        True,
        doc="int8 static: time the int8 model against the float source on the build host (true, "
        "default; about a second, recorded with the load in the int8 report)",
    )
    calibration_memory_mb: float | None = spec(
        None,
        ge=1e-3,
        le=1 << 30,
        doc="int8 static: the most memory the calibrator may hold in activations (default: a "
        "quarter of the available RAM); it calibrates on the samples that fit (recorded), "
        "refused when one sample does not",
    )


def convert_options(request: ConversionRequest) -> OnnxConvertOptions:
    """The request's options, typed and checked (one line naming the converter and the option otherwise)."""
    words = {k: v.lower() if isinstance(v, str) else v for k, v in request.options.items()}
    typed: OnnxConvertOptions = OnnxToOnnx.read_options(words)
    return typed


class OnnxToOnnx(Converter):
    name = "onnx->onnx"
    source_format = "onnx"
    target_format = "onnx"
    precisions = frozenset({"fp32", "fp16", "int8", "int8-dynamic"})
    calibrated_precisions = frozenset({"int8"})
    requires = (_ORT, _ONNX)
    options_class = OnnxConvertOptions  # ``options`` (names and descriptions) derive from it

    def convert(self, request: ConversionRequest) -> ConversionResult:
        import onnx
        import onnxruntime as ort

        opts = convert_options(request)
        out = request.workdir / "model.onnx"
        handler = {
            "fp32": self._fp32,
            "fp16": self._fp16,
            "int8": self._int8_static,
            "int8-dynamic": self._int8_dynamic,
        }[request.precision]
        try:
            details = handler(request, opts, out)
        except (CalibrationError, ConversionError):
            raise
        except Exception as e:
            # one line, and no path: request.source is the pipeline's temporary static copy of the user's model
            text = " ".join(str(e).split())
            raise ConversionError(
                f"onnxruntime could not convert the model to {request.precision}: {type(e).__name__}: {text[:300]}"
            ) from e
        notes = list(details.pop("_notes", []))
        if details.get("ops_quantized") == 0:
            notes.append(
                f"int8-dynamic found no {'/'.join(details['op_types'])} ops to quantize: the model is "
                "unchanged; use int8 (static, with calibration) for convolutional models"
            )
        return ConversionResult(
            artifact=out,
            format="onnx",
            files=[p for p in request.workdir.iterdir() if p.is_file()],
            tool_versions={"onnxruntime": ort.__version__, "onnx": onnx.__version__},
            details=details,
            notes=notes,
        )

    # -- recipes ---------------------------------------------------------------------------

    def _fp32(self, request: ConversionRequest, opts: OnnxConvertOptions, out: Path) -> dict[str, Any]:
        import onnxruntime as ort

        # "extended" and not "all": level-99 layout transforms (NCHWc) are tied to the build
        # host's SIMD width; the runner applies them at load time on the device instead.
        level_name, fold = opts.optimization_level, opts.fold_quantized_weights
        level = {
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        }[level_name]
        _optimize(Path(request.source), out, level)
        details: dict[str, Any] = {"recipe": "graph optimisation", "optimization_level": level_name}
        sizes = _weight_sizes(Path(request.source), out)
        if sizes is None:  # no int8/uint8 weights in the source, or folding did not grow the model
            return details
        src_mb, out_mb = sizes[0] / 1e6, sizes[1] / 1e6
        if not fold:
            _optimize(Path(request.source), out, level, disabled=("ConstantFolding",))
            kept_mb = _weight_sizes(Path(request.source), out, grown_by=0.0)
            details["quantized_weights"] = {
                "kept": True,
                "source_weight_bytes": sizes[0],
                "folded_weight_bytes": sizes[1],
                "weight_bytes": kept_mb[1] if kept_mb else None,
            }
            details["_notes"] = [
                f"the source's int8 weights keep their dequantisation in the graph ({src_mb:.1f} MB of weights; "
                f"folded into f32 constants they were {out_mb:.1f} MB): onnxruntime folds it as the device loads the "
                "model, so it computes in fp32 on the same weights (converter option fold_quantized_weights=true folds "
                "it here)"
            ]
            return details
        details["quantized_weights"] = {"kept": False, "source_weight_bytes": sizes[0], "weight_bytes": sizes[1]}
        details["_notes"] = [
            f"the source's int8 weights were folded into f32 constants (fold_quantized_weights): {out_mb:.1f} MB of "
            f"weights from {src_mb:.1f} MB"
        ]
        return details

    def _fp16(self, request: ConversionRequest, opts: OnnxConvertOptions, out: Path) -> dict[str, Any]:
        from onnxruntime.transformers.float16 import convert_float_to_float16

        from edge.graph import recipes

        mode, trials = opts.mixed_precision, opts.mixed_precision_trials
        model = recipes.name_nodes(load_onnx(request.source))

        def build(kept: list[str]) -> Any:
            # keep_io_types: callers keep feeding float32 and receive float32
            with quiet_root_logger():
                half = convert_float_to_float16(
                    model, keep_io_types=True, disable_shape_infer=False, node_block_list=kept
                )
            recipes.drop_fp16_round_trips(half)
            return half

        details: dict[str, Any] = {
            "recipe": "float16 weights and activations",
            "keep_io_types": True,
            "mixed_precision": mode,
        }
        if mode == "off":
            save_onnx(build([]), out)
            return details
        found = _search_fp16(model, request, build, trials)
        save_onnx(found.artifact, out)
        details["kept_fp32"] = [k.to_json() for k in found.kept]
        details["mixed_precision_search"] = found.to_json()
        if found.kept:
            details["recipe"] = "float16 with the nodes listed in kept_fp32 in float32"
        note = found.note("fp32")
        if note:
            details["_notes"] = [note]
        return details

    def _int8_static(self, request: ConversionRequest, opts: OnnxConvertOptions, out: Path) -> dict[str, Any]:
        from onnxruntime import quantization as q

        if request.calibration is None or not request.calibration.samples:
            raise CalibrationError(
                "int8 static quantization needs calibration samples",
                hint=f"pass {CALIB_FLAG} DIR (.npy/.npz tensors or images) or {CALIB_FLAG} random",
            )
        act, wt = _qtype(q, opts.activation_type), _qtype(q, opts.weight_type)
        method_name, per_channel = opts.calibrate_method, opts.per_channel
        mode, trials = opts.mixed_precision, opts.mixed_precision_trials
        import onnxruntime as ort

        ort.set_default_logger_severity(3)
        tried: list[str] = []
        with tempfile.TemporaryDirectory(prefix="edgekit-q-") as tmp, quiet_root_logger():
            source, upgraded = _opset13(request.source, Path(tmp))

            # Pre-processing with graph optimisation folds BatchNorm first, as onnxruntime recommends.
            # The result is validated; if the quantizer still produced an invalid graph, quantization
            # is redone without the pre-optimisation and the manifest says so.
            def quantize(prepped: Path, exclude: list[str], method: str = method_name) -> None:
                with contextlib.redirect_stdout(io.StringIO()):  # the percentile calibrator prints its range
                    _quantize_static(prepped, exclude, method)

            memory: dict[str, Any] = {}  # per calibration method: what the calibrator may hold (issue #23)

            def _quantize_static(prepped: Path, exclude: list[str], method: str) -> None:
                samples = request.calibration.samples  # type: ignore[union-attr]
                if method not in memory:
                    memory[method] = calibration_memory(prepped, len(samples), method, opts.calibration_memory_mb)
                q.quantize_static(
                    str(prepped),
                    str(out),
                    Reader(samples[: memory[method]["samples"]]),
                    quant_format=q.QuantFormat.QDQ,
                    activation_type=act,
                    weight_type=wt,
                    per_channel=per_channel,
                    calibrate_method=getattr(q.CalibrationMethod, CALIBRATE[method]),
                    nodes_to_exclude=exclude,
                )

            prepped, skip_optimization = _quantize_loadable(source, Path(tmp), quantize, out, tried, request.source)
            details: dict[str, Any] = {"mixed_precision": mode}
            if mode == "auto":
                found = _search_int8(prepped, request, quantize, out, trials, method_name)
                if found.method != method_name:
                    details["calibrate_method_configured"] = method_name
                    method_name = found.method
                details["kept_float"] = [k.to_json() for k in found.kept]
                details["mixed_precision_search"] = found.to_json()
                note = found.note("float (not quantized)")
                if note:
                    details["_notes"] = [note]
        kept = [k["node"] for k in details.get("kept_float", [])]
        details["int8_report"], notes = int8_report(request, out, kept, measure=opts.measure_speedup)
        details["_notes"] = [*details.get("_notes", []), *(m["note"] for m in memory.values() if m.get("note")), *notes]
        details["calibration_memory"] = {k: {f: v for f, v in m.items() if f != "note"} for k, m in memory.items()}
        return {
            "recipe": "static QDQ",
            "isa_assumption": _U8S8_ASSUMPTION,
            "activations": opts.activation_type,
            "weights": opts.weight_type,
            "per_channel": per_channel,
            "calibrate_method": method_name,
            "calibration_samples": len(request.calibration.samples),
            "pre_optimization": not skip_optimization,
            "retried_because": tried,
            "opset_upgraded": upgraded,
            **details,
        }

    def _int8_dynamic(self, request: ConversionRequest, opts: OnnxConvertOptions, out: Path) -> dict[str, Any]:
        from onnxruntime import quantization as q

        op_types = list(opts.dynamic_op_types)
        wt = _qtype(q, opts.weight_type)
        with quiet_root_logger():
            q.quantize_dynamic(str(request.source), str(out), weight_type=wt, op_types_to_quantize=op_types)
        source_ops = [n.op_type for n in load_onnx(request.source).graph.node]
        matched = sum(op in op_types for op in source_ops)
        return {
            "recipe": "dynamic int8",
            "isa_assumption": _U8S8_ASSUMPTION,
            "op_types": op_types,
            "weights": opts.weight_type,
            "ops_quantized": matched,
            "ops_total": len(source_ops),
        }


def _optimize(source: Path, out: Path, level: Any, disabled: tuple[str, ...] = ()) -> None:
    """onnxruntime's offline graph optimisation of ``source`` at ``level``, written to ``out``, without the
    optimizers named in ``disabled``."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.optimized_model_filepath = str(out)
    so.log_severity_level = 3
    ort.InferenceSession(str(source), so, providers=["CPUExecutionProvider"], disabled_optimizers=list(disabled))


def _weight_sizes(source: Path, out: Path, grown_by: float = 1.5) -> tuple[int, int] | None:
    """(the source's initializer bytes, ``out``'s) when the source holds int8/uint8 initializers and ``out``'s are
    more than ``grown_by`` times the source's (onnxruntime's constant folding turned Cast+Mul dequantised weights into
    f32 constants: all-MiniLM-L6-v2 int8, 23 MB -> 90 MB); else None."""
    import onnx
    from onnx import TensorProto

    def sizes(path: Path) -> tuple[int, int]:
        m = onnx.load(str(path))
        inits = list(m.graph.initializer)
        total = sum(onnx.numpy_helper.to_array(t).nbytes for t in inits)
        small = sum(1 for t in inits if t.data_type in (TensorProto.INT8, TensorProto.UINT8))
        return total, small

    src_bytes, quantized = sizes(source)
    out_bytes, _ = sizes(out)
    if not quantized or out_bytes <= grown_by * src_bytes:
        return None
    return src_bytes, out_bytes


def int8_report(
    request: ConversionRequest, out: Path, kept: list[str], *, measure: bool = True
) -> tuple[dict[str, Any], list[str]]:
    """What the int8 graph ``out`` computes in float and why, its quantize/dequantize boundaries
    (``edge.graph.quantized``), and, unless ``measure_speedup`` is false, its speed against the float source on
    this host, both run by edgekit's onnxruntime runner with its defaults, interleaved (:func:`measure_speedup`).
    (the report for the chain details, the notes for the convert report)."""
    from edge.graph.quantized import placement_of, speedup_line

    placement = placement_of(out, kept)
    report: dict[str, Any] = {"placement": placement.to_json(), "optimized_by": "onnxruntime, level all, build host"}
    notes = [placement.summary()]
    samples = request.calibration.samples if request.calibration is not None else []
    if measure and samples:
        try:
            speed = measure_speedup(request.source, out, samples[0])
        except Exception as e:  # noqa: BLE001 - the bundle is sound; only the figure is missing (recorded)
            report["speedup_not_measured"] = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
        else:
            report["speedup"] = speed
            notes.append(speedup_line(speed))
    return report, notes


#: the most a build spends timing int8 against fp32 (both sides together), and the samples per side it aims at
_SPEEDUP_BUDGET_S = 1.0
_SPEEDUP_SAMPLES = 30


def measure_speedup(float_model: Path, int8_model: Path, feeds: Mapping[str, Any]) -> dict[str, Any]:
    """fp32 and int8 p50 latency on this host, as edgekit's onnxruntime runner runs them by default (threads and
    u8s8/u8u8 as it chooses), in alternating blocks of 3 after 2 warm-up calls each, until each side has
    ``_SPEEDUP_SAMPLES`` samples or ``_SPEEDUP_BUDGET_S`` is spent; ratio = fp32 p50 / int8 p50. Indicative: one
    host, its load at the time (recorded)."""
    import time

    import numpy as np

    from edge.backends.onnxruntime.run import OnnxRuntimeRunner

    with OnnxRuntimeRunner(float_model, precision="fp32") as f32, OnnxRuntimeRunner(int8_model, precision="int8") as i8:
        x = {s.name: feeds[s.name] for s in f32.inputs if s.name in feeds}
        runs = {"fp32": f32, "int8": i8}
        times: dict[str, list[float]] = {k: [] for k in runs}
        for r in runs.values():
            for _ in range(2):
                r.infer(x)
        deadline = time.perf_counter() + _SPEEDUP_BUDGET_S
        while len(times["int8"]) < _SPEEDUP_SAMPLES and time.perf_counter() < deadline:
            for k, r in runs.items():
                for _ in range(3):
                    t = time.perf_counter()
                    r.infer(x)
                    times[k].append((time.perf_counter() - t) * 1e3)
        threads, kernel = i8.info.threads, str(i8.info.details.get("int8_kernel", "this CPU's int8 kernels"))
    p50 = {k: float(np.median(v)) for k, v in times.items()}
    return {
        "fp32_p50_ms": round(p50["fp32"], 4),
        "int8_p50_ms": round(p50["int8"], 4),
        "ratio": round(p50["fp32"] / max(p50["int8"], 1e-9), 3),
        "samples": len(times["int8"]),
        "threads": threads,
        "int8_kernel": kernel,
        "load": round(os.getloadavg()[0], 2),
        "cpu": _cpu_model(),
    }


def _cpu_model() -> str:
    from edge.capabilities import cpu_isa

    return cpu_isa().model[:120]


def _search_fp16(model: Any, request: ConversionRequest, build: Any, trials: int) -> Any:
    """Range check on the fp32 run, then the error-driven search (edge.graph.recipes)."""
    from edge.graph import recipes

    samples, origin = recipes.search_samples(request)
    sizes = recipes.float_tensors(model)
    reference = recipes.onnx_infer(model)
    goal = recipes.SearchGoal(
        target_cosine=recipes.target_cosine("fp16"),
        initial=lambda: recipes.fp16_range_keep(model, recipes.activation_ranges(reference, sizes, samples)),
        max_trials=trials,
        sizes=sizes,
        why="adds {err} relative error in fp16 (error attribution on the search inputs)",
    )
    found = recipes.search(
        model=model,
        samples=samples,
        reference=reference,
        candidates=recipes.Candidates(build=build, infer_of=recipes.onnx_infer),
        goal=goal,
    )
    found.origin = origin
    return found


#: the calibration tried when the configured one's fully quantized model fails the search's check, before any
#: node is kept float: on ddddocr's YOLOX detector (calibrated on 32 generated frames) minmax lost 13 % of the
#: detections (recall 86.7 %, cosine 0.9966) and percentile (99.999th, clipping outliers) 8 % (recall 91.7 %,
#: cosine 0.9982); keeping nodes float under minmax needed 70 nodes for the same
_FALLBACK_CALIBRATION = "percentile"


def _search_int8(prepped: Path, request: ConversionRequest, quantize: Any, out: Path, trials: int, method: str) -> Any:
    """Nodes excluded from quantization, worst first, until the QDQ model passes (edge.graph.recipes). When the
    fully quantized model fails with ``method``'s calibration, the other calibration's is tried first and the
    search goes on from it if it does better; ``found.method`` is the one used.

    Node and tensor names are those of the pre-processed float model the quantizer read; it is also the
    reference (the same function as the source, after BatchNorm folding)."""
    import onnx

    from edge.graph import recipes

    model = recipes.name_nodes(load_onnx(prepped))
    onnx.save(model, str(prepped))
    samples, origin = recipes.search_samples(request)

    reference = recipes.onnx_infer(model)

    def run(with_method: str, max_trials: int) -> Any:
        def build(kept: list[str]) -> Any:
            quantize(prepped, kept, with_method)
            return load_onnx(out)

        goal = recipes.SearchGoal(
            target_cosine=recipes.target_cosine("int8"),
            precision="int8",  # and the task figures: a YOLOX head at cosine 0.997 lost 13 % recall
            max_trials=max_trials,
            why="adds {err} relative error when quantized (error attribution)",
        )
        found = recipes.search(
            model=model,
            samples=samples,
            reference=reference,
            candidates=recipes.Candidates(build=build, infer_of=recipes.onnx_infer, graph_of=lambda c: c),
            goal=goal,
        )
        found.method = with_method
        return found

    other = _FALLBACK_CALIBRATION if method != _FALLBACK_CALIBRATION and trials > 0 else None
    found = run(method, trials if other is None else 0)
    if not found.passed and other is not None:
        alt = run(other, 0)
        plain = {method: found.trials[0].to_json(), other: alt.trials[0].to_json()}
        better = alt.passed or recipes.trial_score(alt.trials[0]) > recipes.trial_score(found.trials[0])
        if not alt.passed:  # the node search goes on from the better calibration (its trial 0 is built again)
            alt = run(other if better else method, trials)
        found = alt
        found.calibrations = {"configured": method, "fully_quantized": plain, "used": found.method}
    save_onnx(found.artifact, out)  # the chosen candidate: the last one built may be another
    found.origin = origin
    return found


@contextlib.contextmanager
def quiet_root_logger() -> Iterator[None]:
    """onnxruntime's quantizer logs through the root logger (dozens of WARNING lines per model)."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def _qtype(q: Any, name: str) -> Any:
    return getattr(q.QuantType, _QTYPES[name])


class Reader:
    """onnxruntime's CalibrationDataReader protocol over in-memory samples."""

    def __init__(self, samples: tuple[Mapping[str, Any], ...]) -> None:
        self._samples = samples
        self._it: Iterator[Mapping[str, Any]] = iter(samples)

    def get_next(self) -> Mapping[str, Any] | None:
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = iter(self._samples)


#: the share of the available RAM the calibrator may hold when calibration_memory_mb is not given
CALIBRATION_RAM_SHARE = 0.25


def available_ram() -> int:
    """Bytes of RAM available to a new allocation (MemAvailable; else free pages), 0 when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, AttributeError):
        return 0


def calibration_memory(model_path: Path, samples: int, method: str, given: float | None = None) -> dict[str, Any]:
    """What onnxruntime's calibrator may hold, bounded. It runs the model with every float activation as an output
    and keeps all of them for every sample until the end (minmax, percentile and entropy alike; its
    CalibMaxIntermediateOutputs drops the batches it was meant to merge in onnxruntime 1.2x, so it is not used):
    the calibration gets the ``samples`` whose activations fit in ``given`` (the option ``calibration_memory_mb``), else in a quarter of
    the available RAM, recorded with a note when that is fewer than given; a model whose one sample does not fit
    is refused in one line. (A layout detector's percentile fallback was OOM-killed at 22 GiB of a 23 GiB machine.)"""
    from edge.graph import recipes

    per_sample = 4 * sum(recipes.float_tensors(load_onnx(model_path)).values())
    limit = int(given * 2**20) if given is not None else int(available_ram() * CALIBRATION_RAM_SHARE)
    where = (
        f"{given:g} MiB (calibration_memory_mb)"
        if given is not None
        else f"{limit / 2**30:.1f} GiB (a quarter of the available RAM)"
    )
    record: dict[str, Any] = {
        "per_sample_mb": round(per_sample / 2**20, 3),
        "limit_mb": round(limit / 2**20, 1),
        "samples": samples,
    }
    if per_sample <= 0 or limit <= 0:
        return record
    fits = limit // per_sample
    if fits < 1:
        raise ConversionError(
            f"int8 calibration ({method}) holds {per_sample / 2**20:.0f} MiB of activations per sample, more than the {where} it may use",
            hint="pass a smaller --input-shape, raise calibration_memory_mb, or use int8-dynamic",
        )
    if fits < samples:
        record["samples"] = int(fits)
        record["note"] = (
            f"{method} calibration keeps every activation of every sample ({per_sample / 2**20:.1f} MiB "
            f"each): it used {fits} of the {samples} calibration samples, the most that fit in {where}"
        )
    return record


def _opset13(source: Path, tmp: Path) -> tuple[Path, str | None]:
    """``source``, upgraded to opset 13 first where it is older (the file to quantize, what was upgraded). Per-channel
    DequantizeLinear needs its `axis` attribute, which exists from opset 13; the quantizer emits it anyway and the
    model fails to load (seen on PP-OCR, opset 11)."""
    import onnx
    from onnx import version_converter

    model = load_onnx(source)
    opset = opset_of(model)
    if opset >= 13:
        return source, None
    upgraded = tmp / "opset13.onnx"
    onnx.save(version_converter.convert_version(model, 13), str(upgraded))
    return upgraded, f"{opset} -> 13"


def _quantize_loadable(
    source: Path, tmp: Path, quantize: Any, out: Path, tried: list[str], named: Path
) -> tuple[Path, bool]:
    """Quantize after onnxruntime's pre-processing with graph optimisation (it folds BatchNorm first, as onnxruntime
    recommends); if the quantizer still produced a model onnxruntime cannot load, again without the
    pre-optimisation (``tried`` says why). (the pre-processed model, whether the optimisation was skipped)."""
    import onnxruntime as ort
    from onnxruntime.quantization.shape_inference import quant_pre_process

    for skip_optimization in (False, True):
        prepped = tmp / f"prepped{int(skip_optimization)}.onnx"
        quant_pre_process(str(source), str(prepped), skip_symbolic_shape=True, skip_optimization=skip_optimization)
        quantize(prepped, [])
        try:
            ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
            return prepped, skip_optimization
        except Exception as e:  # noqa: BLE001 - onnxruntime's own error: tried again, then one line
            tried.append(f"with pre-optimisation: {str(e).splitlines()[0][:200]}")
    raise ConversionError(f"onnxruntime's quantizer produced an invalid model from {named}: " + "; ".join(tried))
