"""ONNX -> TFLite: float32, float16, dynamic-range int8 and full-integer int8.

The conversion runs in the ``tflite`` toolchain environment (onnx2tf 1.29.24 + TensorFlow
2.19, see :mod:`edge.toolchains`), driven as a subprocess by
``edge/toolchains/tflite_driver.py``; this process only prepares the inputs, shows progress,
writes the bundle files and checks the result with LiteRT. Why this path
(docs/design-notes.md): onnx2tf is the maintained ONNX->TensorFlow translator (207 ONNX op types in 1.29.24, NCHW->NHWC
layout rewriting so XNNPack and the Edge TPU get channels-last convolutions); torch-based
paths (ai-edge-torch) need the PyTorch model, which an ONNX user does not have; onnx2tf 2.x
needs Python >= 3.12.

Layout: onnx2tf turns NCHW image inputs into NHWC. The converter writes ``model.io.json``
beside ``model.tflite``: for every ONNX input and output, the TFLite tensor it became, the
permutation between the two layouts and the quantization of int8/uint8 I/O. The ``litert``
runner reads it, so callers feed the array they fed the ONNX model and get float32 back.

Besides the bundle's parity check (done by ``convert`` through the target's runner), the
converter checks its own output on LiteRT's builtin CPU kernels (no delegate) against
onnxruntime fp32 and records it as ``details["cpu_parity"]``; with ``gate_cpu_parity`` a
failure stops the conversion (used where the target's runner cannot run on the build host,
e.g. the Edge TPU).
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np

from edge import toolchains
from edge.backends.converter import ConversionRequest, ConversionResult, Converter
from edge.backends.litert.format import IO_SCHEMA, sidecar_path
from edge.base.typedjson import read_json_file, spec
from edge.capabilities import Requirement, require
from edge.errors import CalibrationError, ConversionError, MissingDependencyError
from edge.graph.divergence import MIN_COSINE, REL_TOLERANCE, Divergence
from edge.graph.opsupport import CPU_WAY, IF_WAY, OpSupport, check_ops
from edge.toolchains.state import ToolchainStatus
from edge.verify.inputs import CALIB_FLAG

log = logging.getLogger(__name__)

TOOLCHAIN = "tflite"
_ORT = Requirement(
    "python",
    "onnxruntime",
    install="pip install 'edgekit-ml[onnx]'",
    why="the converted model is checked against the source in onnxruntime",
)
_LITERT = Requirement(
    "python",
    "ai_edge_litert",
    install="pip install 'edgekit-ml[litert]'",
    why="the converted model is loaded and checked with LiteRT",
)
_PARITY_SAMPLES = 32

Progress = Callable[[str], None]
_progress: Progress | None = None


def set_progress(fn: Progress | None) -> None:
    """Where conversion progress goes (``None``: stderr when it is a terminal, and the log)."""
    global _progress
    _progress = fn


def _say(msg: str) -> None:
    log.info(msg)
    if _progress is not None:
        _progress(msg)
    elif sys.stderr.isatty():
        print(f"         {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class OnnxToTFLiteOptions:
    """``onnx->tflite``'s options, declared once (``edge.backends.options``)."""

    io_dtype: Literal["int8", "uint8", "float32"] = spec(
        "int8",
        doc="int8 (full-integer): type of the model's inputs/outputs, int8 (default), uint8 or "
        "float32 (quantize/dequantize ops inside the model); the runner converts to and from float",
    )
    per_channel: bool = spec(True, doc="int8: per-channel weight scales (default true)")
    gate_cpu_parity: bool | None = spec(
        None,
        doc="deprecated, ignored: the pipeline's one parity gate runs the bundle's runner, or its CPU "
        "fallback where the accelerator is not on the build host (--accept-parity-failure "
        "applies to both)",
    )
    timeout_s: float = spec(
        3600.0, ge=1.0, le=7 * 86400, doc="stop the toolchain after this many seconds (default 3600)"
    )


# What onnx2tf refuses up front (edge.graph.opsupport): ops it has no translator for (its ``onnx2tf/ops`` against
# ONNX 1.23's operator set); non-default domains except the contrib ops it translates; ``If`` whose branches give
# outputs of different rank (onnx2tf builds both branches and joins them with ``keras.backend.switch``:
# PINTO0309/onnx2tf#782, the Silero VAD case); Loop, Scan and LSTM forms its translators fail on with the pinned
# TensorFlow 2.19 (measured, see ``_ONNX2TF_LIMITS``).
# ONNX 1.23 default-domain ops with no onnx2tf/ops/<Op>.py in onnx2tf 1.29.24 (the pinned toolchain)
_ONNX2TF_MISSING = frozenset(
    {"BitCast", "CastLike", "CausalConvWithState", "LinearAttention", "SequenceMap", "SwiGLU", "Swish"}
)
# contrib (com.microsoft) op types onnx2tf 1.29.24 translates
_ONNX2TF_CONTRIB = frozenset(
    {
        "FusedConv",
        "Gelu",
        "GroupNorm",
        "Inverse",
        "QLinearAdd",
        "QLinearConcat",
        "QLinearLeakyRelu",
        "QLinearMul",
        "QLinearSigmoid",
        "QLinearSoftmax",
        "ScaleAndTranslate",
    }
)


def _input_given(node: Any, index: int) -> bool:
    return len(node.input) > index and node.input[index] != ""


def _onnx2tf_lstm(node: Any) -> str | None:
    state = _input_given(node, 5) or _input_given(node, 6)
    if _input_given(node, 3) and not state:
        return None
    from edge.graph.lower import lstm_lowerable

    why = lstm_lowerable(node)
    if why is None:
        return None  # the converter unrolls it into plain ops first (edge.graph.lower.lower_lstm)
    fails = (
        "mistranslates an LSTM given its state initial_h/initial_c (a Reshape fails)"
        if state
        else "needs the bias input B (KeyError on an omitted one)"
    )
    return f"onnx2tf 1.29.24 {fails}, and edgekit lowers only the default LSTM form to plain ops (this one has {why})"


# Measured with the pinned toolchain (onnx2tf 1.29.24, TensorFlow 2.19, tf_keras) on the graphs built in
# tests/graph/test_graphs.py: its Loop and Scan translators fail under TF2 graph mode; its LSTM fails on an omitted
# bias and on an LSTM given its state (a streaming model's h0/c0).
_ONNX2TF_LIMITS: Mapping[str, Callable[[Any], str | None]] = {
    "Loop": lambda n: (
        "onnx2tf 1.29.24's while_loop translation fails under TensorFlow 2.19 (graph-mode TensorArray, NotImplementedError)"
    ),
    "Scan": lambda n: (
        "onnx2tf 1.29.24's translation fails under TensorFlow 2.19 (TensorArray size from a KerasTensor, TypeError)"
    ),
    "LSTM": _onnx2tf_lstm,
}


class OnnxToTFLite(Converter):
    name = "onnx->tflite"
    source_format = "onnx"
    target_format = "tflite"
    precisions = frozenset({"fp32", "fp16", "int8", "int8-dynamic"})
    calibrated_precisions = frozenset({"int8"})
    toolchain = TOOLCHAIN
    requires = (_ORT, _LITERT)
    options_class = OnnxToTFLiteOptions  # ``options`` (names and descriptions) derive from it

    @classmethod
    def op_support(cls) -> OpSupport:
        return OpSupport(
            cls.name,
            "onnx2tf 1.29.24",
            unsupported=_ONNX2TF_MISSING,
            other_domains=_ONNX2TF_CONTRIB,
            same_rank_if=True,
            limits=_ONNX2TF_LIMITS,
            way_forward=IF_WAY + CPU_WAY,
        )

    def convert(self, request: ConversionRequest) -> ConversionResult:
        opts: OnnxToTFLiteOptions = self.read_options(request.options)
        self.check_precision(request.precision)
        require(self.requires, f"converter {self.name!r}")
        check_ops(request.source, self.op_support())  # every node onnx2tf cannot translate, before TensorFlow starts
        timeout_s = opts.timeout_s
        int8 = request.precision == "int8"
        calib = _check_samples(request, required=int8)
        st = toolchains.require(TOOLCHAIN, f"converter {self.name!r}")

        from edge.verify.parity import reference_outputs

        parity_inputs, parity_label = _parity_inputs(request, calib)
        t_start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="edgekit-tflite-") as tmp:
            work = Path(tmp)
            lowered, rewritten = _lower_for_onnx2tf(Path(request.source), work, request.io, request.precision == "int8")
            job = _driver_job(request, opts, work, lowered, parity_inputs, calib, lstm=bool(rewritten.get("LSTM")))
            _say(
                f"onnx->tflite ({request.precision}) in toolchain {TOOLCHAIN!r} "
                f"(onnx2tf {st.packages.get('onnx2tf', '?')}, tensorflow {st.packages.get('tensorflow', '?')})"
            )
            final, st = toolchains.run_driver(TOOLCHAIN, job, work, on_event=_Reporter(), timeout_s=timeout_s)
            if final["event"] == "error":
                raise _error_from(final, request, work)
            out = request.workdir / "model.tflite"
            shutil.move(final["artifact"], out)
        elapsed = time.perf_counter() - t_start
        sidecar = write_sidecar(out, final["io"])
        notes = _notes(final, sidecar)

        _say("checking the .tflite on LiteRT's builtin CPU kernels against onnxruntime fp32")
        reference = reference_outputs(Path(request.source), parity_inputs)
        cpu_parity = _cpu_parity(out, request, parity_inputs, parity_label, reference)
        if not cpu_parity["passed"]:
            notes.append(
                f"the {request.precision} .tflite fails parity on LiteRT's CPU kernels: "
                + "; ".join(f"{o['name']}: {f}" for o in cpu_parity["outputs"] for f in o["failures"])
            )
        details = _details(final, st, sidecar, elapsed, cpu_parity)
        if rewritten:
            details["lowered"] = rewritten
            notes += _rewrite_notes(rewritten)
        tool_versions = _tool_versions(final, st)
        _say(f"onnx->tflite done in {elapsed:.1f} s: {out.stat().st_size / 1e6:.2f} MB")
        return ConversionResult(
            artifact=out,
            format="tflite",
            files=[out, sidecar],
            tool_versions=tool_versions,
            details=details,
            notes=notes,
        )


def _driver_job(
    request: ConversionRequest,
    opts: OnnxToTFLiteOptions,
    work: Path,
    lowered: Path | None,
    parity_inputs: list[dict[str, Any]],
    calib: list[Mapping[str, Any]],
    *,
    lstm: bool = False,
) -> dict[str, Any]:
    """The tflite driver's job: writes ``samples.npz`` (and, for int8, ``calibration.npz``) into ``work``
    and returns the job mapping that points at them. ``lstm``: ``lowered`` has LSTMs unrolled (and its constants
    folded by edgekit: no onnxsim)."""
    names = [t.name for t in request.io.inputs]
    int8 = request.precision == "int8"
    arrays: dict[str, Any] = {
        n: np.stack([s[n] for s in parity_inputs[:1]]) for n in names
    }  # numpy's savez stub takes **arrays as allow_pickle too
    np.savez(work / "samples.npz", **arrays)
    job: dict[str, Any] = {
        "onnx": str(Path(lowered or request.source).resolve()),
        "workdir": str(work),
        "precision": request.precision,
        "samples": str(work / "samples.npz"),
        "io_dtype": opts.io_dtype,
        "per_channel": opts.per_channel,
        "inputs": [{"name": t.name, "shape": [int(d) for d in t.shape], "dtype": t.dtype} for t in request.io.inputs],
        "keep_shape_inputs": _keep_shape_inputs(request.io) if lstm else [],
        "keep_nhwc_inputs": _nhwc_inputs(request.io),
        "no_onnxsim": lstm,
        "outputs": [{"name": t.name, "shape": [int(d) for d in t.shape], "dtype": t.dtype} for t in request.io.outputs],
    }
    if int8:
        calib_arrays: dict[str, Any] = {n: np.stack([s[n] for s in calib]) for n in names}
        np.savez(work / "calibration.npz", **calib_arrays)
        job["calibration"] = str(work / "calibration.npz")
    return job


def _details(
    final: Mapping[str, Any], st: ToolchainStatus, sidecar: Path, elapsed: float, cpu_parity: Mapping[str, Any]
) -> dict[str, Any]:
    """The result's ``details``: the driver's own, the toolchain record, the I/O layout, timings and CPU parity."""
    details: dict[str, Any] = {
        **final["details"],
        "toolchain": st.manifest_record(),
        "layout": [
            f"{t['name']}: {_layout_text(t)}"
            for t in read_json_file(sidecar, what="I/O sidecar", max_bytes=4 << 20, max_depth=16)["inputs"]
        ],
        "io_sidecar": sidecar.name,
        "onnxsim": final.get("onnxsim", []),
        "network_attempts": final.get("network_attempts", []),
        "timings_s": {**final.get("timings", {}), "total": round(elapsed, 1)},
        "cpu_parity": cpu_parity,
    }
    return details


def _tool_versions(final: Mapping[str, Any], st: ToolchainStatus) -> dict[str, str]:
    """The versions recorded in the manifest: the driver's relevant tools and the toolchain's lock."""
    tool_versions = {
        k: v
        for k, v in final["tool_versions"].items()
        if k in ("onnx2tf", "tensorflow", "onnxsim", "onnx", "onnxruntime", "tf_keras")
    }
    tool_versions["toolchain"] = f"{TOOLCHAIN} (lock {st.lock_hash[:12] if st.lock_hash else '?'})"
    return tool_versions


def _parity_inputs(request: ConversionRequest, calib: Any) -> tuple[list[dict[str, Any]], str]:
    """The inputs the .tflite is checked on against onnxruntime: calibration samples, else generated ones."""
    from edge.verify.inputs import generated_samples

    if calib:
        return [dict(s) for s in calib[:_PARITY_SAMPLES]], "calibration"
    return generated_samples(request.io, request.preprocess, _PARITY_SAMPLES, seed=1234), "generated"


class _Reporter:
    """Turns driver events into progress lines: every stage, heartbeats every 15 s, calibration every 3 s."""

    def __init__(self) -> None:
        self._last_beat = 0.0
        self._last_progress = -1e9

    def __call__(self, ev: Mapping[str, Any]) -> None:
        kind, t = ev.get("event"), ev.get("elapsed_s", 0.0)
        if kind == "stage":
            _say(f"[{t:6.1f}s] {ev['stage']}")
        elif kind == "heartbeat" and t - self._last_beat >= 15:
            self._last_beat = t
            _say(f"[{t:6.1f}s] still {ev['stage']} ({ev['stage_s']:.0f} s in this step)")
        elif kind == "progress" and ev.get("total"):
            done = ev["done"] == ev["total"]
            if (done or t - self._last_progress >= 3) and ev["done"]:
                self._last_progress = t
                self._last_beat = t
                _say(f"[{t:6.1f}s] {ev['stage']} {ev['done']}/{ev['total']}")


def _keep_shape_inputs(io: Any) -> list[str]:
    """Inputs onnx2tf should not move to channels-last: with a lowered LSTM (edge.graph.lower), the rank-3 non-image
    inputs (audio frames, recurrent state [layers, batch, hidden]): onnx2tf reads them as NCW and slices the
    transposed state along the wrong axis (measured on Silero VAD: a [1, 128, 0] slice)."""
    return [t.name for t in io.inputs if t.layout is None and len(t.shape) == 3]


def _nhwc_inputs(io: Any) -> list[str]:
    """Image inputs the ONNX graph already takes channels-last (a .tflite through tf2onnx, a Keras export): onnx2tf
    reads every 4-D input as NCHW, so ``[1, 128, 128, 3]`` became a ``[1, 128, 3, 128]`` TFLite input behind a
    transpose the runner undid (MediaPipe BlazeFace for coral-edgetpu); told to keep them, the TFLite input is
    the source's own layout."""
    from edge.spec import image_layout

    return [t.name for t in io.inputs if (t.layout or image_layout(t.shape)) == "NHWC"]


def _lower_for_onnx2tf(source: Path, work: Path, io: Any, int8: bool = False) -> tuple[Path | None, dict[str, int]]:
    """The source rewritten where onnx2tf mistranslates it (``edge.graph.lower``), in ``work``, and what was rewritten
    (``{"LSTM": n, "Slice": m}``); (None, {}) when nothing needs it. LSTMs given their state are unrolled into plain
    ops; Slices lose the axes they keep whole (and go when they keep everything). ``int8`` (quantized again from
    float): constant int8 weights behind DequantizeLinear become float32 first."""
    from edge.graph.lower import (
        drop_noop_slice_axes,
        fold_constants,
        fold_weight_dequantize,
        lower_lstm,
        needs_lowering,
        squeeze_to_reshape,
    )
    from edge.graph.model import load_onnx, save_onnx

    model = load_onnx(source)
    shapes = {t.name: tuple(int(d) for d in t.shape) for t in io.inputs}
    model, dq = fold_weight_dequantize(model) if int8 else (model, 0)
    if not any(needs_lowering(n) for n in model.graph.node):
        model, slices = drop_noop_slice_axes(model, shapes)
        done = {**({"Slice": slices} if slices else {}), **({"DequantizeLinear": dq} if dq else {})}
        return (save_onnx(model, work / "rewritten.onnx"), done) if done else (None, {})
    model, count = lower_lstm(model)
    # the recurrent path's plumbing too: onnx2tf squeezes a channels-last rank-3 tensor on the wrong axis, and
    # mistranslates the full-rank Slices onnxsim makes of per-axis ones: edgekit folds the constants itself (the
    # job then runs onnx2tf without onnxsim) and keeps only the axes a Slice cuts
    model, _ = fold_constants(model, shapes)
    model, _ = squeeze_to_reshape(model)
    model, slices = drop_noop_slice_axes(model, shapes)
    return save_onnx(model, work / "lowered.onnx"), {"LSTM": count, **({"Slice": slices} if slices else {})}


#: the per-node check converts the model again: bounded like a conversion of its size, and at most this long
CHECK_TIMEOUT_S = 600.0
#: differences up to this are rounding noise to the per-node check whatever their cosine (onnx2tf's own atol)
CHECK_ABS_FLOOR = 1e-4


def locate_divergence(
    source: Path, tflite: Path, sample: Mapping[str, Any], io: Any, *, timeout_s: float = CHECK_TIMEOUT_S
) -> Divergence | None:
    """Where an ONNX -> TFLite conversion diverges from ``source`` (issue #23, class 4), run on a parity failure only:
    the source is rewritten as for the conversion (:func:`_lower_for_onnx2tf`) and converted again by onnx2tf with
    its per-node check on ``sample`` (one parity input, fed in the layouts ``tflite``'s I/O sidecar records); the
    first node, in the graph's order, whose TensorFlow value differs from onnxruntime's beyond
    ``edge.graph.divergence``'s tolerances, or has another size. None when every node agrees (the difference then
    comes from the TFLite conversion or its precision). The TensorFlow model is float: for fp16/int8 bundles this
    locates the translation's faults only. ``ConversionError`` when the check itself fails."""
    _check_fits(source)
    side = read_json_file(sidecar_path(tflite), what="I/O sidecar", max_bytes=4 << 20, max_depth=16)
    with tempfile.TemporaryDirectory(prefix="edgekit-onnx2tf-check-") as tmp:
        work = Path(tmp)
        lowered, rewritten = _lower_for_onnx2tf(Path(source), work, io)
        lstm = bool(rewritten.get("LSTM"))
        files = {}
        for i, t in enumerate(side["inputs"]):
            np.save(
                work / f"input{i}.npy",
                np.ascontiguousarray(np.asarray(sample[t["name"]]).transpose(t["perm_onnx_to_tflite"])),
            )
            files[t["name"]] = str(work / f"input{i}.npy")
        job = {
            "task": "onnx2tf-check",
            "onnx": str(Path(lowered or source).resolve()),
            "workdir": str(work),
            "sample_files": files,
            "keep_shape_inputs": _keep_shape_inputs(io) if lstm else [],
            "keep_nhwc_inputs": _nhwc_inputs(io),
            "no_onnxsim": lstm,
            "rel_tolerance": REL_TOLERANCE,
            "min_cosine": MIN_COSINE,
            "abs_floor": CHECK_ABS_FLOOR,
        }
        final, _ = toolchains.run_driver(TOOLCHAIN, job, work, timeout_s=timeout_s)
        if final["event"] == "error":
            raise ConversionError(f"onnx2tf's per-node check failed: {_one_line(str(final.get('message', '')), 300)}")
    found = final.get("divergence")
    if not found:
        return None
    return Divergence(
        node=str(found["node"])[:1024],
        op=str(found["op"])[:128],
        tensor=str(found["tensor"])[:1024],
        cosine=None if found["cosine"] is None else float(found["cosine"]),
        rel_err=None if found["rel_err"] is None else float(found["rel_err"]),
        compared=int(final["compared"]),
        note=_check_note(found, final)[:1000],
    )


#: the per-node check holds every float activation about three times (onnxruntime's, TensorFlow's, the Keras model
#: built to expose them): it runs when that fits in this share of the available RAM
CHECK_RAM_SHARE = 0.5


def _check_fits(source: Path) -> None:
    """``ConversionError`` when the per-node check of ``source`` (static shapes) would not fit in memory."""
    from edge.backends.onnxruntime.convert import available_ram
    from edge.graph.model import load_onnx
    from edge.graph.recipes import float_tensors

    need = 3 * 4 * sum(float_tensors(load_onnx(source)).values())  # float32 bytes
    have = available_ram()
    if have and need > CHECK_RAM_SHARE * have:
        raise ConversionError(
            f"onnx2tf's per-node check would hold about {need / 2**20:.0f} MiB of activations, more than "
            f"{CHECK_RAM_SHARE:.0%} of the {have / 2**20:.0f} MiB available"
        )


def _check_note(found: Mapping[str, Any], final: Mapping[str, Any]) -> str:
    note = "onnx2tf's TensorFlow model vs onnxruntime on one parity input"
    if final.get("healed"):
        note += f" ({final['healed']} earlier difference(s) healed downstream: ill-conditioned, skipped)"
    return note + (f": {found['note']}" if found.get("note") else "")


def _rewrite_notes(rewritten: Mapping[str, int]) -> list[str]:
    notes = []
    if rewritten.get("LSTM"):
        notes.append(f"{rewritten['LSTM']} LSTM given its state unrolled into plain ops for onnx2tf (edge.graph.lower)")
    if rewritten.get("Slice"):
        notes.append(
            f"{rewritten['Slice']} Slice(s) rid of the axes they keep whole for onnx2tf, which applies them to the "
            "channels-last tensor unchanged (edge.graph.lower.drop_noop_slice_axes)"
        )
    if rewritten.get("DequantizeLinear"):
        notes.append(
            f"{rewritten['DequantizeLinear']} constant int8 weight(s) behind DequantizeLinear folded to float32 before "
            "quantizing again (edge.graph.lower.fold_weight_dequantize)"
        )
    return notes


def _check_samples(request: ConversionRequest, *, required: bool) -> list[Mapping[str, Any]]:
    """The calibration samples, each input present with the model's shape; every problem at once."""
    samples = list(request.calibration.samples) if request.calibration is not None else []
    if required and not samples:
        raise CalibrationError(
            f"full-integer int8 TFLite needs calibration samples for {request.source}; none were given",
            hint=f"pass {CALIB_FLAG} DIR (.npy/.npz tensors or images), or {CALIB_FLAG} random for a smoke test",
        )
    problems: list[str] = []
    for i, s in enumerate(samples):
        for t in request.io.inputs:
            if t.name not in s:
                problems.append(f"sample {i} has no input {t.name!r}")
                continue
            a = np.asarray(s[t.name])
            if tuple(a.shape) != tuple(t.shape):
                problems.append(
                    f"sample {i} input {t.name!r} has shape {list(a.shape)}, the model takes {list(t.shape)}"
                )
            elif a.dtype != np.dtype(t.dtype):
                problems.append(f"sample {i} input {t.name!r} has dtype {a.dtype}, the model takes {t.dtype}")
        if len(problems) >= 8:
            problems.append("...")
            break
    if problems:
        raise CalibrationError(f"calibration data does not fit {request.source}: " + "; ".join(problems))
    return samples


def _one_line(text: str, limit: int = 600) -> str:
    """A toolchain's message on one line: TensorFlow's and onnx2tf's exceptions span many (the full text is in
    the toolchain log the error names)."""
    lines = [" ".join(line.split()) for line in text.splitlines()]
    flat = " / ".join(line for line in lines if line)
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _error_from(ev: Mapping[str, Any], request: ConversionRequest, work: Path) -> Exception:
    kind, msg = ev.get("kind"), _one_line(str(ev.get("message", "")))
    log_copy = toolchains.keep_log(work, TOOLCHAIN)
    where = f" (toolchain log: {log_copy})" if log_copy else ""
    if kind == "unsupported_ops":
        return ConversionError(
            f"{msg}: no TFLite translation exists for these ONNX ops",
            hint="replace them in the source model, or choose a target whose runtime has them (x86-cpu, intel-igpu)",
        )
    if kind == "tflite_unsupported_ops":
        return ConversionError(
            f"{msg}; the model would need TensorFlow's Flex kernels, which LiteRT on a device does not have",
            hint="replace these ops in the source model, or choose another target",
        )
    if kind == "onnx2tf_node":
        return ConversionError(
            f"{msg}{where}",
            hint=f"choose a target whose runtime runs {ev.get('op')} as ONNX (x86-cpu, intel-igpu), or replace "
            "it in the source model",
        )
    if kind == "calibration":
        return CalibrationError(msg)
    if kind == "toolchain":
        return MissingDependencyError(msg, hint=ev.get("hint"))
    return ConversionError(f"onnx->tflite failed on {request.source.name}: {msg}{where}")


def _parity_line(p: Mapping[str, Any]) -> str:
    parts = []
    for o in p["outputs"]:
        top1 = f", top-1 {o['top1']:.1%}" if o["top1"] is not None else ""
        parts.append(f"{o['name']} cosine {o['cosine']:.6f} (worst {o['cosine_min']:.4f}){top1}")
    return f"{'passed' if p['passed'] else 'FAILED'} on {p['samples']} {p['inputs']} inputs: " + "; ".join(parts)


def _layout_text(t: Mapping[str, Any]) -> str:
    if t["perm_onnx_to_tflite"] == list(range(len(t["shape"]))):
        s = f"{t['shape']} unchanged"
    else:
        s = f"{t.get('layout') or 'ONNX'} {t['shape']} -> {t.get('tflite_layout') or 'TFLite'} {t['tflite_shape']} (the runner transposes)"
    if t.get("quantization"):
        q = t["quantization"]
        s += f", {t['tflite_dtype']} scale {q['scale']:.6g} zero point {q['zero_point']} (the runner converts)"
    return s


def _notes(final: Mapping[str, Any], sidecar: Path) -> list[str]:
    notes = []
    io = read_json_file(sidecar, what="I/O sidecar", max_bytes=4 << 20, max_depth=16)
    changed = [t for t in io["inputs"] + io["outputs"] if t["perm_onnx_to_tflite"] != list(range(len(t["shape"])))]
    if changed:
        notes.append("layout: " + "; ".join(f"{t['name']} {_layout_text(t)}" for t in changed))
    runs = final.get("onnxsim", [])
    if not runs:
        notes.append("onnx2tf did not run onnx-simplifier")
    elif not all(r.get("ok") for r in runs):
        bad = next(r for r in runs if not r.get("ok"))
        notes.append(f"onnx-simplifier failed ({bad.get('error', '?')[:200]}); onnx2tf went on without it")
    if final.get("network_attempts"):
        notes.append(f"the toolchain tried to reach the network (refused): {final['network_attempts']}")
    return notes


# -- the I/O sidecar ---------------------------------------------------------------------


def write_sidecar(model: Path, io_map: Mapping[str, Any], *, cpu_model: str | None = None) -> Path:
    """``model.io.json``: ONNX tensors -> TFLite tensors, layouts and I/O quantization read from ``model``."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from edge.spec import image_layout

    it = Interpreter(
        model_path=str(model), experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    )
    sigs = it.get_signature_list()
    key = next(iter(sigs)) if sigs else None
    if key is not None:
        runner = it.get_signature_runner(key)
        tin, tout = runner.get_input_details(), runner.get_output_details()
    else:
        tin = {d["name"]: d for d in it.get_input_details()}
        tout = {d["name"]: d for d in it.get_output_details()}

    def entry(t: Mapping[str, Any], details: Mapping[str, Any]) -> dict[str, Any]:
        d = details.get(t["tflite_name"])
        if d is None:
            raise ConversionError(f"{model.name} has no tensor {t['tflite_name']!r} (it has {sorted(details)})")
        scale, zp = d["quantization"]
        tflite_shape = [int(x) for x in d["shape"]]
        perm, layout = t["perm_onnx_to_tflite"], image_layout(t["onnx_shape"])
        tflite_layout: str | None
        if layout == "NCHW" and perm == [0, 2, 3, 1]:
            tflite_layout = "NHWC"
        else:
            tflite_layout = layout if perm == list(range(len(perm))) else None
        return {
            "name": t["name"],
            "shape": t["onnx_shape"],
            "dtype": "float32" if scale else str(np.dtype(d["dtype"])),
            "layout": layout,
            "tflite_name": t["tflite_name"],
            "tflite_tensor": d.get("name"),
            "tflite_shape": tflite_shape,
            "tflite_dtype": str(np.dtype(d["dtype"])),
            "tflite_layout": tflite_layout,
            "perm_onnx_to_tflite": perm,
            "quantization": {"scale": float(scale), "zero_point": int(zp)} if scale else None,
        }

    data = {
        "schema": IO_SCHEMA,
        "signature": key,
        "inputs": [entry(t, tin) for t in io_map["inputs"]],
        "outputs": [entry(t, tout) for t in io_map["outputs"]],
        "cpu_model": cpu_model,
    }
    del it
    path = sidecar_path(model)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


def _cpu_parity(
    model: Path,
    request: ConversionRequest,
    samples: Sequence[Mapping[str, Any]],
    label: str,
    reference: list[dict[str, np.ndarray]],
) -> dict[str, Any]:
    from edge.backends.litert.run import LiteRTRunner
    from edge.verify.parity import ParityReport, compare, thresholds_for

    with LiteRTRunner(model, options={"delegate": "none", "num_threads": 0}, precision=request.precision) as runner:
        cand = [runner.infer(s) for s in samples]
        th = thresholds_for(request.precision, runner.info.precision_used)
        report = ParityReport(
            precision=request.precision,
            thresholds=th,
            samples=len(samples),
            inputs=label,
            reference="onnxruntime fp32 CPUExecutionProvider",
            candidate={"runtime": runner.info.runtime, "device_used": runner.info.device_used},
            outputs=compare(reference, cand, th),
        )
    out = report.to_json()
    out.pop("accepted_failure", None)
    return out
