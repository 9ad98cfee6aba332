"""ONNX -> ONNX prepared for TensorRT, plus the build settings (``onnx->tensorrt-plan``).

A TensorRT engine is tied to the GPU and the TensorRT version that built it, so the host does
not build one: it prepares what the device builds from (the ``tensorrt`` runner builds and
caches the engine on first load):

* ``model.onnx`` -- static shapes (done by the pipeline before this step), constants folded and
  the graph cleaned up with onnx-graphsurgeon (``edgekit-ml[tensorrt]``); without it,
  onnxruntime's *basic* offline optimisation folds constants (standard ONNX ops only; the
  extended/all levels would emit com.microsoft fused ops TensorRT cannot parse).
  - fp32 / fp16: an fp32 ONNX. TensorRT picks fp16 kernels itself when the FP16 builder flag is
    set; an fp16-cast ONNX would only add Cast nodes and lose the fp32 fallback per layer.
  - int8: explicit quantization. TensorRT takes QDQ graphs with *symmetric* scales (zero point
    0) for activations and weights and no quantized biases, so ``quantize_static`` runs with
    int8 activations/weights, ``ActivationSymmetric``/``WeightSymmetric`` and
    ``QuantizeBias=False``, calibrated on the bundle's calibration tensors.
* ``trt_build.json`` -- what the device's builder does: precision flags, workspace, DLA core
  (with GPU fallback), input shapes.
* ``details["tensorrt_compat"]`` in the manifest -- op inventory, dynamic dimensions, ops
  TensorRT's ONNX parser is known not to support, and polygraphy's lint report when available.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from edge.backends.converter import ConversionRequest, ConversionResult, Converter
from edge.backends.tensorrt.format import BUILD_FILE, BUILD_SCHEMA, TRT_RESTRICTED_OPS, TRT_UNSUPPORTED_OPS  # noqa: F401
from edge.base.typedjson import UnreadableFile, read_json_file, spec
from edge.capabilities import Requirement
from edge.errors import CalibrationError, ConversionError
from edge.graph.model import load_onnx, save_onnx
from edge.graph.opsupport import CPU_WAY, IF_WAY, OpSupport, check_ops
from edge.verify.inputs import CALIB_FLAG

log = logging.getLogger(__name__)

_ORT = Requirement("python", "onnxruntime", install="pip install 'edgekit-ml[tensorrt]'")
_ONNX = Requirement("python", "onnx", install="pip install 'edgekit-ml[tensorrt]'")


@dataclass(frozen=True)
class TensorRTConvertOptions:
    """``onnx->tensorrt-plan``'s options, declared once (``edge.backends.options``)."""

    workspace_mb: int = spec(1024, ge=1, le=1 << 20, doc="builder workspace (memory pool limit) in MiB (default 1024)")
    dla_core: int = spec(
        -1, ge=-1, le=1, doc="-1 = GPU only (default); 0/1 = build for that DLA core (Orin NX/AGX), GPU fallback on"
    )
    per_channel: bool = spec(True, doc="int8: per-channel weight scales (default true)")
    calibrate_method: Literal["minmax", "entropy", "percentile"] = spec(
        "minmax", doc="int8: minmax (default), entropy or percentile"
    )
    lint: bool = spec(True, doc="run polygraphy's ONNX lint for the compatibility report (default true when installed)")


class OnnxToTensorRTPlan(Converter):
    name = "onnx->tensorrt-plan"
    source_format = "onnx"
    target_format = "onnx"  # the bundle ships ONNX + build settings; the engine is built on the device
    precisions = frozenset({"fp32", "fp16", "int8"})
    calibrated_precisions = frozenset({"int8"})
    requires = (_ORT, _ONNX)
    options_class = TensorRTConvertOptions  # ``options`` (names and descriptions) derive from it

    @classmethod
    def op_support(cls) -> OpSupport:
        """TRT_UNSUPPORTED_OPS, non-default domains, and ``If`` with branch outputs of different rank
        (onnx-tensorrt docs/operators.md: "output tensors of the two conditional branches must have broadcastable
        shapes")."""
        return OpSupport(
            cls.name,
            "TensorRT's ONNX parser",
            unsupported=frozenset(TRT_UNSUPPORTED_OPS),
            same_rank_if=True,
            way_forward=IF_WAY + CPU_WAY,
        )

    def convert(self, request: ConversionRequest) -> ConversionResult:
        import onnx
        import onnxruntime as ort

        opts: TensorRTConvertOptions = self.read_options(request.options)
        self.check_precision(request.precision)
        workspace_mb, dla_core = opts.workspace_mb, opts.dla_core
        check_ops(request.source, self.op_support())  # every node TensorRT's parser refuses, before folding/quantizing
        out = request.workdir / "model.onnx"
        tool_versions = {"onnx": onnx.__version__, "onnxruntime": ort.__version__}
        with tempfile.TemporaryDirectory(prefix="edgekit-trt-") as tmp:
            folded = Path(tmp) / "folded.onnx"
            simplify = fold_graph(request.source, folded)
            tool_versions.update(simplify.pop("tool_versions", {}))
            if request.precision == "int8":
                quant = quantize_symmetric_qdq(folded, out, request, opts)
            else:
                save_onnx(load_onnx(folded), out)
                quant = None
        compat = compatibility_report(out, lint=opts.lint)
        if compat.get("polygraphy"):
            tool_versions["polygraphy"] = compat["polygraphy"]
        if compat["unsupported_ops"]:
            raise ConversionError(
                f"{request.source.name} uses ONNX ops TensorRT's parser does not support: {', '.join(compat['unsupported_ops'])}",
                hint="replace them in the source model, or choose a target whose runtime has them (x86-cpu)",
            )
        build = build_settings(request, workspace_mb=workspace_mb, dla_core=dla_core)
        build_file = request.workdir / BUILD_FILE
        build_file.write_text(json.dumps(build, indent=2) + "\n", encoding="utf-8")
        notes = [
            f"the TensorRT engine is built on the device at first load ({'+'.join(build['flags']) or 'FP32'}"
            + (f", DLA core {dla_core}" if dla_core >= 0 else "")
            + ") and cached there"
        ]
        if not simplify.get("graphsurgeon"):
            notes.append(
                f"{simplify.get('why')}: constants folded with onnxruntime's basic optimisation instead "
                "(onnx-graphsurgeon comes with the tensorrt extra of edgekit-ml)"
            )
        if compat["restricted_ops"]:
            notes.append(
                "ops TensorRT runs with restrictions: "
                + "; ".join(f"{k}: {v}" for k, v in compat["restricted_ops"].items())
            )
        if compat["dynamic_inputs"]:
            notes.append(
                f"dynamic dimensions left: {compat['dynamic_inputs']} (the builder needs an optimisation profile)"
            )
        lint = compat.get("lint") or {}
        if lint.get("errors"):
            notes.append(f"polygraphy lint reports {len(lint['errors'])} error(s): {lint['errors'][0][:200]}")
        details: dict[str, Any] = {
            "recipe": "ONNX for an on-device TensorRT build",
            "simplify": simplify,
            "build": build,
            "tensorrt_compat": compat,
        }
        if quant is not None:
            details["quantization"] = quant
        return ConversionResult(
            artifact=out,
            format="onnx",
            files=[out, build_file],
            tool_versions=tool_versions,
            details=details,
            notes=notes,
        )


def fold_graph(source: Path, out: Path) -> dict[str, Any]:
    """Fold constants and clean the graph up; what was done (and with which tool)."""
    model = load_onnx(source)
    before = len(model.graph.node)
    try:
        import onnx_graphsurgeon as gs
    except ImportError:
        gs = None
    if gs is not None:
        try:
            graph = gs.import_onnx(model)
            graph.fold_constants().cleanup().toposort()
            folded = gs.export_onnx(graph)
            folded.ir_version = model.ir_version  # graphsurgeon writes its own default IR version
            import onnx

            onnx.checker.check_model(folded)
            save_onnx(folded, out)
            return {
                "tool": "onnx-graphsurgeon fold_constants + cleanup + toposort",
                "graphsurgeon": True,
                "nodes_before": before,
                "nodes_after": len(folded.graph.node),
                "tool_versions": {"onnx-graphsurgeon": gs.__version__},
            }
        except Exception as e:  # fall through to onnxruntime, and say why
            reason = f"onnx-graphsurgeon failed ({type(e).__name__}: {str(e)[:200]})"
    else:
        reason = "onnx-graphsurgeon not installed"
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(out)
    so.log_severity_level = 3
    ort.InferenceSession(str(source), so, providers=["CPUExecutionProvider"])
    after = len(load_onnx(out).graph.node)
    return {
        "tool": "onnxruntime basic offline optimisation (constant folding)",
        "graphsurgeon": False,
        "why": reason,
        "nodes_before": before,
        "nodes_after": after,
    }


def quantize_symmetric_qdq(
    source: Path, out: Path, request: ConversionRequest, opts: TensorRTConvertOptions
) -> dict[str, Any]:
    """TensorRT explicit quantization: int8 QDQ, symmetric activations and weights, fp32 biases."""
    from onnxruntime import quantization as q

    from edge.backends.onnxruntime.convert import CALIBRATE, Reader, quiet_root_logger

    if request.calibration is None or not request.calibration.samples:
        raise CalibrationError(
            "int8 for TensorRT needs calibration samples",
            hint=f"pass {CALIB_FLAG} DIR (.npy/.npz tensors or images) or {CALIB_FLAG} random",
        )
    method, per_channel = opts.calibrate_method, opts.per_channel
    extra = {"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False}
    try:
        with quiet_root_logger():
            q.quantize_static(
                str(source),
                str(out),
                Reader(request.calibration.samples),
                quant_format=q.QuantFormat.QDQ,
                activation_type=q.QuantType.QInt8,
                weight_type=q.QuantType.QInt8,
                per_channel=per_channel,
                calibrate_method=getattr(q.CalibrationMethod, CALIBRATE[method]),
                extra_options=extra,
            )
    except Exception as e:
        raise ConversionError(
            f"int8 QDQ quantization of {request.source.name} failed: {type(e).__name__}: {str(e)[:300]}"
        ) from e
    check = check_symmetric_qdq(out)
    if check["asymmetric"] or check["quantized_biases"]:
        raise ConversionError(f"the quantizer produced QDQ TensorRT cannot take: {check}")
    return {
        "recipe": "static QDQ, symmetric",
        "activations": "int8 symmetric",
        "weights": "int8 symmetric",
        "per_channel": per_channel,
        "quantize_bias": False,
        "calibrate_method": method,
        "calibration_samples": len(request.calibration.samples),
        "extra_options": extra,
        "check": check,
    }


def check_symmetric_qdq(path: Path) -> dict[str, Any]:
    """Every QuantizeLinear/DequantizeLinear zero point is 0 and int8; no int32 (quantized bias) initializers."""
    import numpy as np
    from onnx import numpy_helper

    model = load_onnx(path)
    inits = {i.name: i for i in model.graph.initializer}
    asym, qdq, biases = [], 0, []
    for n in model.graph.node:
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        qdq += 1
        if len(n.input) > 2 and n.input[2] in inits:
            zp = numpy_helper.to_array(inits[n.input[2]])
            if zp.dtype != np.int8 or np.any(zp != 0):
                asym.append(n.name)
        if n.op_type == "DequantizeLinear" and n.input[0] in inits and inits[n.input[0]].data_type == 6:  # INT32
            biases.append(n.input[0])
    return {"qdq_nodes": qdq, "asymmetric": asym[:10], "quantized_biases": biases[:10]}


def compatibility_report(path: Path, *, lint: bool = True) -> dict[str, Any]:
    """What TensorRT will make of this ONNX, decided without TensorRT."""
    model = load_onnx(path)
    ops = Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in model.graph.node)
    unsupported = sorted(op for op in ops if op in TRT_UNSUPPORTED_OPS or "." in op)
    restricted = {op: TRT_RESTRICTED_OPS[op] for op in sorted(ops) if op in TRT_RESTRICTED_OPS}
    init_names = {i.name for i in model.graph.initializer}
    dynamic = {}
    for i in model.graph.input:
        if i.name in init_names:
            continue
        dims = [d.dim_param or "?" if not d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim]
        if any(d is not None for d in dims):
            dynamic[i.name] = [d for d in dims if d is not None]
    report: dict[str, Any] = {
        "ops": dict(sorted(ops.items())),
        "node_count": sum(ops.values()),
        "opset": next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None),
        "unsupported_ops": unsupported,
        "restricted_ops": restricted,
        "dynamic_inputs": dynamic,
        "int64_initializers": sum(1 for i in model.graph.initializer if i.data_type == 7),
        "unsupported_list": "onnx-tensorrt docs/operators.md (TensorRT 8.6-10.x), non-default domains",
    }
    if lint:
        report.update(polygraphy_lint(path))
    return report


_POLYGRAPHY_MAIN = "import sys; from polygraphy.tools import main; sys.argv[0] = 'polygraphy'; sys.exit(main())"


def polygraphy_lint(path: Path) -> dict[str, Any]:
    """``polygraphy check lint`` (onnx.checker + onnxruntime per node) as a summary; {} when absent."""
    try:
        import polygraphy
    except ImportError:
        return {"lint": None, "polygraphy": None}
    with tempfile.TemporaryDirectory(prefix="edgekit-lint-") as tmp:
        report = Path(tmp) / "lint.json"
        try:
            p = subprocess.run(
                [sys.executable, "-c", _POLYGRAPHY_MAIN, "check", "lint", str(path), "-o", str(report)],
                capture_output=True,
                text=True,
                timeout=300,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return {"lint": {"ran": False, "error": str(e)[:300]}, "polygraphy": polygraphy.__version__}
        if not report.is_file():
            return {
                "lint": {"ran": False, "error": (p.stderr or p.stdout).strip()[-300:]},
                "polygraphy": polygraphy.__version__,
            }
        try:
            data = read_json_file(report, what="polygraphy lint report", max_depth=32)
        except UnreadableFile as e:
            return {"lint": {"ran": False, "error": e.message[:300]}, "polygraphy": polygraphy.__version__}
        if not isinstance(data, dict):
            data = {}
    entries = data.get("lint_entries") or data.get("linting_entries") or []
    errors = [
        str(e.get("message", e))[:300] for e in entries if e.get("level") == "exception" or e.get("level") == "error"
    ]
    warnings = [str(e.get("message", e))[:300] for e in entries if e.get("level") == "warning"]
    summary = data.get("summary", {})
    return {
        "lint": {
            "ran": True,
            "exit_code": p.returncode,
            "passing_nodes": len(summary.get("passing", [])),
            "failing_nodes": list(summary.get("failing", []))[:20],
            "errors": errors[:20],
            "warnings": warnings[:20],
        },
        "polygraphy": polygraphy.__version__,
    }


def build_settings(request: ConversionRequest, *, workspace_mb: int, dla_core: int) -> dict[str, Any]:
    """``trt_build.json``: everything the device-side builder needs besides the ONNX."""
    flags = {"fp32": [], "fp16": ["FP16"], "int8": ["INT8", "FP16"]}[request.precision]
    return {
        "schema": BUILD_SCHEMA,
        "onnx": "model.onnx",
        "precision": request.precision,
        "flags": flags,  # int8: explicit QDQ, FP16 lets the layers outside Q/DQ pairs run in fp16
        "explicit_quantization": request.precision == "int8",
        "workspace_mb": workspace_mb,
        "dla_core": dla_core,
        "gpu_fallback": dla_core >= 0,
        "inputs": [{"name": t.name, "shape": [int(d) for d in t.shape], "dtype": t.dtype} for t in request.io.inputs],
        "outputs": [{"name": t.name, "shape": [int(d) for d in t.shape], "dtype": t.dtype} for t in request.io.outputs],
    }
