"""TFLite -> ONNX with tf2onnx, run inside the ``tflite`` toolchain (TensorFlow + tf2onnx; edgekit's own
environment carries neither). The planner prepends it to an ONNX chain (``x86-cpu``: then ``onnx->onnx``).

Measured with tf2onnx 1.17.0 / TensorFlow 2.19 on MediaPipe's BlazeFace (fp16 weights): the DEQUANTIZE of
the f16 weights is folded into f32 initializers, the TFLite tensor names stay the ONNX I/O names, NHWC inputs
stay NHWC (Transpose nodes inside), max abs difference to LiteRT 5e-5 on outputs of magnitude 140.

tf2onnx keeps an op it cannot translate as a ``TFL_<op>`` node and still writes the model; the driver lists
every such node and this converter refuses in one line naming them.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge import toolchains
from edge.backends.converter import ConversionRequest, ConversionResult, Converter
from edge.base.typedjson import spec
from edge.errors import ConversionError, MissingDependencyError

TOOLCHAIN = "tflite"
_OPSET = 17


@dataclass(frozen=True)
class TFLiteToOnnxOptions:
    """``tflite->onnx``'s options, declared once (``edge.backends.options``)."""

    opset: int = spec(_OPSET, ge=13, le=21, doc=f"ONNX opset tf2onnx writes (13-21; default {_OPSET})")
    timeout_s: float = spec(900.0, ge=1.0, le=7 * 86400, doc="stop the toolchain after this many seconds (default 900)")


class TFLiteToOnnx(Converter):
    name = "tflite->onnx"
    source_format = "tflite"
    target_format = "onnx"
    precisions = frozenset({"fp32"})
    toolchain = TOOLCHAIN
    options_class = TFLiteToOnnxOptions  # ``options`` (names and descriptions) derive from it

    def convert(self, request: ConversionRequest) -> ConversionResult:
        opts: TFLiteToOnnxOptions = self.read_options(request.options)
        self.check_precision(request.precision)
        opset, timeout_s = opts.opset, opts.timeout_s
        st = toolchains.require(TOOLCHAIN, f"converter {self.name!r}")
        source = Path(request.source).resolve()
        with tempfile.TemporaryDirectory(prefix="edgekit-tf2onnx-") as tmp:
            work = Path(tmp)
            from edge.backends.litert.from_tflite import prepare_tflite

            readable, lowered = prepare_tflite(source, work)  # MediaPipe's custom ops -> builtins tf2onnx knows
            job = {"task": "tflite->onnx", "tflite": str(readable), "workdir": str(work), "opset": opset}
            final, st = toolchains.run_driver(TOOLCHAIN, job, work, timeout_s=timeout_s)
            if final["event"] == "error":
                raise _error_from(final, source, work)
            out = request.workdir / "model.onnx"
            shutil.move(final["artifact"], out)
        renamed = rename_to_signature(out, source)
        pinned = pin_static_dims(out, {t.name: tuple(int(d) for d in t.shape) for t in request.io.inputs})
        self._check_io(out, request)
        tool_versions = dict(final.get("tool_versions", {}))
        tool_versions["toolchain"] = f"{TOOLCHAIN} (lock {st.lock_hash[:12] if st.lock_hash else '?'})"
        details: dict[str, Any] = {
            **final.get("details", {}),
            "toolchain": st.manifest_record(),
            "timings_s": final.get("timings", {}),
        }
        if lowered:
            details["tflite_rewrite"] = lowered
        if renamed:
            details["io_renamed_to_signature"] = renamed
        if pinned:
            details["inputs_pinned_to_tflite_shape"] = pinned
        return ConversionResult(artifact=out, format="onnx", files=[out], tool_versions=tool_versions, details=details)

    @staticmethod
    def _check_io(out: Path, request: ConversionRequest) -> None:
        """The ONNX takes and gives what the TFLite did (names and shapes), or the parity gate compares nothing."""
        from edge.graph.model import io_spec, load_onnx

        got = io_spec(load_onnx(out))
        want_in = {t.name: tuple(int(d) for d in t.shape) for t in request.io.inputs}
        have_in = {t.name: tuple(int(d) if isinstance(d, int) else -1 for d in t.shape) for t in got.inputs}
        missing = sorted(set(want_in) - set(have_in))
        wrong = sorted(n for n in set(want_in) & set(have_in) if have_in[n] != want_in[n])
        if missing or wrong:
            raise ConversionError(
                f"tf2onnx's ONNX of {request.source.name} does not take the TFLite's inputs: "
                + "; ".join(
                    [f"missing {', '.join(missing)}"] * bool(missing)
                    + [f"{n}: {list(have_in[n])} vs {list(want_in[n])}" for n in wrong]
                )
            )
        want_out = {t.name for t in request.io.outputs}
        lost = sorted(want_out - {t.name for t in got.outputs})
        if want_out and lost:
            raise ConversionError(
                f"tf2onnx's ONNX of {request.source.name} lacks the TFLite's output(s) {', '.join(lost)}"
            )


def rename_to_signature(onnx_path: Path, tflite: Path) -> dict[str, str]:
    """tf2onnx keeps the TFLite tensor names (``serving_default_x.1:0``); the bundle names I/O as the file's
    SignatureDef does (``x.1``), as LiteRT reads it. Rename the ONNX's graph inputs and outputs (and every node
    edge using them) through the signature; returns what was renamed."""
    from edge.backends.litert.format import signature_names
    from edge.graph.model import load_onnx, save_onnx

    names = signature_names(tflite)
    model = load_onnx(onnx_path)
    g = model.graph
    io = {v.name for v in list(g.input) + list(g.output)}
    mapping = {old: new for old, new in names.items() if old in io and new not in io}
    if not mapping:
        return {}
    for v in list(g.input) + list(g.output) + list(g.value_info):
        v.name = mapping.get(v.name, v.name)
    _rename_edges(g, mapping)
    save_onnx(model, onnx_path)
    return mapping


def _rename_edges(graph: Any, mapping: dict[str, str]) -> None:
    """Rename node edges in ``graph`` and in every subgraph under it: an If/Loop body reads the outer graph's
    tensors by name (tf2onnx's translation of a TFLite IF reads the input ``serving_default_x.1:0`` there, and a
    body left with the old name is not a valid graph: 'Nodes in a graph must be topologically sorted')."""
    for node in graph.node:
        node.input[:] = [mapping.get(x, x) for x in node.input]
        node.output[:] = [mapping.get(x, x) for x in node.output]
        for attr in node.attribute:
            for sub in [attr.g] * attr.HasField("g") + list(attr.graphs):
                _rename_edges(sub, mapping)


def pin_static_dims(onnx_path: Path, shapes: dict[str, tuple[int, ...]]) -> dict[str, list[int]]:
    """A TF2 export keeps its batch dynamic in the TFLite's ``shape_signature`` ([-1, 76, 32, 1]) while the TFLite
    tensor, what LiteRT and the bundle take, is [1, 76, 32, 1]; tf2onnx writes the signature's -1. Set each graph
    input's unknown dims to the TFLite's (only where the rank matches and every known dim agrees: anything else is
    left for the I/O check to refuse); returns the inputs pinned, with their shapes."""
    from edge.graph.model import load_onnx, save_onnx

    model = load_onnx(onnx_path)
    pinned: dict[str, list[int]] = {}
    for v in model.graph.input:
        want = shapes.get(v.name)
        dims = v.type.tensor_type.shape.dim
        if want is None or len(dims) != len(want):
            continue
        known = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in dims]
        if None not in known or any(k is not None and k != w for k, w in zip(known, want)):
            continue
        for d, w in zip(dims, want):
            d.Clear()
            d.dim_value = w
        pinned[v.name] = list(want)
    if pinned:
        save_onnx(model, onnx_path)
    return pinned


def _error_from(ev: dict[str, Any], source: Path, work: Path) -> Exception:
    kind = ev.get("kind")
    msg = " / ".join(line.strip() for line in str(ev.get("message", "")).splitlines() if line.strip())[:600]
    if kind == "unsupported_ops" and ev.get("ops"):
        from edge.backends.litert.format import untranslated_ops

        ops = ev["ops"]
        what, hint = untranslated_ops(source, [o["op"] for o in ops])
        nodes = ", ".join(repr(n) for o in ops for n in o.get("nodes", [])[:1])
        return ConversionError(
            f"{source.name}: tf2onnx cannot translate op {what}" + (f" (node {nodes})" if nodes else ""), hint=hint
        )
    if kind == "toolchain":
        return MissingDependencyError(msg, hint=ev.get("hint"))
    log_copy = toolchains.keep_log(work, TOOLCHAIN)
    where = f" (toolchain log: {log_copy})" if log_copy else ""
    return ConversionError(f"tflite->onnx failed on {source.name}: {msg}{where}")
