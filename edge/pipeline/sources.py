"""Source adapters: one per model file kind a user arrives with.

Each adapter says what the file is (``format``: the converter/runner format string it enters the
chain as), what it holds (``describe``: the manifest's ``source``), its static I/O, the file the
chain starts from, the precision it already carries, and how to compute the parity reference on
this host:

=============  ====================  ==============================================================
kind           format                reference
=============  ====================  ==============================================================
ONNX           ``onnx``              onnxruntime fp32, CPU provider, on the static source
TFLite         ``tflite``            LiteRT's reference kernels (no delegate)
OpenVINO IR    ``openvino-ir``       OpenVINO CPU with inference precision f32
PyTorch        ``torchscript``       the PyTorch model itself, run by the first converter in its
                                     toolchain (``ConversionResult.reference``)
GGUF           ``gguf``              the source GGUF in llama.cpp (the LLM quality gate)
=============  ====================  ==============================================================

Detection reads the file's first bytes, never trusts the suffix alone, and refuses what it does
not know with the kinds it does.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from edge.errors import EdgeError, InputFileError, ModelError, printable
from edge.graph.torchfile import is_exported_program, is_torch_package, is_torchscript, torch_kind, zip_names
from edge.spec import IOSpec, TensorSpec, image_layout

Shapes = Mapping[str, Sequence[int]]
Samples = list[dict[str, np.ndarray]]

TORCH_FORMAT = "torchscript"  # TorchScript and ExportedProgram files alike: what torch converters read
TORCH_SUFFIXES = (".pt", ".ts", ".pt2")
KINDS = (
    "ONNX (.onnx)",
    "TFLite (.tflite)",
    "OpenVINO IR (.xml + .bin)",
    "TorchScript / torch.export (.pt, .ts, .pt2)",
    "GGUF (.gguf)",
)


@dataclass
class Source:
    """A model file as it arrived; subclasses know one kind."""

    path: Path
    format: str = field(init=False, default="")
    kind: str = field(init=False, default="vision")  # "vision" (tensors in/out) or "llm"
    #: False where the file names no outputs before conversion (PyTorch: they come from the export)
    declares_outputs: bool = field(init=False, default=True)

    def describe(self) -> dict[str, Any]:
        """The manifest's ``source`` entry (file and sha256 are added by the manifest builder)."""
        return {"format": self.format}

    def own_precision(self) -> str | None:
        """The precision the file already holds, when it ships as it is (no converter)."""
        return None

    def io(self, input_shapes: Shapes) -> IOSpec:
        raise NotImplementedError

    def checked_io(self, input_shapes: Shapes) -> IOSpec:
        """:meth:`io`, refused in one line when no conversion could work with it (:func:`check_io`)."""
        io = self.io(input_shapes)
        return io if self.kind == "llm" else check_io(io, self.path, outputs_expected=self.declares_outputs)

    def static_file(self, work: Path, io: IOSpec) -> Path:
        """The file the chain starts from, with the static shapes of ``io``."""
        return self.path

    def reference(self, static: Path, inputs: Samples) -> tuple[Samples, str] | None:
        """Outputs of the source on ``inputs`` and who computed them; None when a converter does it."""
        return None


#: the most bytes one sample of a model's inputs may take: parity, calibration and the benchmark hold
#: several samples at once (4K RGB float32 is 100 MB; beyond this a file's dims are a mistake or an attack)
MAX_SAMPLE_BYTES = 1 << 28


def check_io(io: IOSpec, origin: Path, *, outputs_expected: bool = True) -> IOSpec:
    """``io`` when a tensor model with it can be converted and compared; else one ModelError naming the file:
    no outputs, an empty input (a 0 dim), inputs too big to hold a sample of, or I/O names that would reach
    a terminal or a manifest with control characters in them. ``outputs_expected`` False: a format whose outputs
    are known only after conversion (PyTorch)."""
    problems = [] if io.outputs or not outputs_expected else ["it declares no outputs: nothing to convert or compare"]
    names = [t.name for t in (*io.inputs, *io.outputs)]
    problems += [
        f"tensor name '{printable(n)}' has control characters" for n in names if printable(n) != n or "\n" in n
    ]
    total = 0
    for t in io.inputs:
        dims = [d for d in t.shape if isinstance(d, int)]
        if any(d <= 0 for d in dims):
            problems.append(f"input {printable(t.name)!r} has shape {list(t.shape)}: a tensor without elements")
            continue
        total += int(np.prod(dims, dtype=np.float64)) * _itemsize(t.dtype)
    if total > MAX_SAMPLE_BYTES:
        shapes = ", ".join(f"{printable(t.name)!r} {t.dtype}{list(t.shape)}" for t in io.inputs)
        problems.append(
            f"one sample of its inputs ({shapes}) is {total / 2**20:,.0f} MiB, more than the "
            f"{MAX_SAMPLE_BYTES >> 20} MiB edgekit holds per sample (parity and calibration keep several)"
        )
    if problems:
        hint = (
            "pass a smaller --input-shape, or re-export the model"
            if total > MAX_SAMPLE_BYTES
            else "re-export the model"
        )
        raise ModelError(f"{origin.name}: " + "; ".join(problems), hint=hint)
    return io


def _itemsize(dtype: str) -> int:
    try:
        return int(np.dtype(dtype).itemsize) or 1
    except TypeError:
        return 8


# -- ONNX ----------------------------------------------------------------------------------------


@dataclass
class OnnxSource(Source):
    def __post_init__(self) -> None:
        from edge.graph.model import load_onnx

        self.format = "onnx"
        self.model = load_onnx(self.path)

    def describe(self) -> dict[str, Any]:
        from edge.graph.model import opset_of

        m = self.model
        info: dict[str, Any] = {
            "format": "onnx",
            "opset": opset_of(m),
            "producer": f"{m.producer_name} {m.producer_version}".strip(),
        }
        q = self.quantization()
        if q is not None:  # an already-quantized graph: what the file holds, and the ops that say so
            info.update(precision=q.precision, quantized=q.describe())
        return info

    def quantization(self) -> Any:
        """How the graph is already quantized (``edge.graph.quantized.Quantization``), or None."""
        from edge.graph.quantized import quantization_of

        return quantization_of(self.model)

    def own_precision(self) -> str | None:
        """An already-quantized graph's own precision (int8, int8-dynamic), kept by the plan; None for floats."""
        q = self.quantization()
        return None if q is None or q.precision not in ("int8", "int8-dynamic") else q.precision

    def io(self, input_shapes: Shapes) -> IOSpec:
        from edge.graph.model import io_spec, resolve_static_inputs

        return resolve_static_inputs(
            io_spec(self.model, self.path), {k: tuple(v) for k, v in input_shapes.items()}, self.path
        )

    def static_file(self, work: Path, io: IOSpec) -> Path:
        from edge.graph.model import make_static, save_onnx

        return save_onnx(make_static(self.model, io, source=self.path), work / "source.static.onnx")

    def reference(self, static: Path, inputs: Samples) -> tuple[Samples, str]:
        from edge.verify.parity import REFERENCE, reference_outputs

        return reference_outputs(static, inputs), REFERENCE

    def frozen(self, values: Mapping[str, str], io: IOSpec) -> tuple[FrozenOnnxSource, IOSpec]:
        """This source with ``values`` frozen and the Ifs they decide inlined (``edge.graph.freeze``); its I/O."""
        from edge.graph.freeze import freeze_inputs

        model, rest, record = freeze_inputs(self.model, values, io, source=self.path)
        return FrozenOnnxSource(self.path, model, record), rest


@dataclass
class FrozenOnnxSource(OnnxSource):
    """An ONNX source with inputs frozen (``--freeze-input``): ``path`` is still the user's file (the manifest
    names and hashes it); ``model`` is the frozen graph the chain starts from."""

    frozen_model: Any = None
    record: Any = None

    def __post_init__(self) -> None:
        self.format = "onnx"
        self.model = self.frozen_model

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "frozen": self.record.to_json()}


# -- TFLite --------------------------------------------------------------------------------------


@dataclass
class TFLiteSource(Source):
    def __post_init__(self) -> None:
        from edge.backends.litert.format import read_tflite

        self.format = "tflite"
        self.file = read_tflite(self.path)  # flatbuffer checked: identifier, root offset, schema parse
        if self.file.edgetpu_compiled:
            self.format = "edgetpu-tflite"
        self._io: IOSpec | None = None
        self._quant: dict[str, Any] | None = None
        self.runnable = self.path
        self.lowered: dict[str, Any] = {}
        self.resized: dict[str, list[int]] = {}  # dynamic inputs made static at the --input-shape given
        from edge.backends.litert.rewrite import LOWERABLE, dynamic_inputs

        try:
            self.dynamic = dynamic_inputs(self.path.read_bytes())
        except Exception as e:  # noqa: BLE001 - tensor or subgraph indices read_tflite's parse does not follow
            raise InputFileError(
                f"{self.path} has a TFLite identifier but does not parse as a TFLite model: {type(e).__name__}: {e}"
            ) from None

        if set(self.file.custom_ops) & LOWERABLE:  # MediaPipe's ops -> builtins (exact), so stock LiteRT runs it
            import tempfile
            import weakref

            from edge.backends.litert.from_tflite import prepare_tflite

            tmp = tempfile.TemporaryDirectory(prefix="edgekit-tflite-src-")
            weakref.finalize(self, tmp.cleanup)
            self.runnable, self.lowered = prepare_tflite(self.path, Path(tmp.name))

    def _read(self) -> None:
        if self._io is not None:
            return
        from edge.backends.litert.run import LiteRTRunner

        if self.file.edgetpu_compiled:
            raise ModelError(
                f"{self.path.name} is already compiled for the Edge TPU (edgetpu-custom-op): it runs only "
                "there and cannot be checked or converted on this host",
                hint="bring the int8 .tflite it was compiled from; edgekit compiles it for coral-edgetpu",
            )
        unsized = {k: v for k, v in self.dynamic.items() if k not in self.resized}
        try:
            r = LiteRTRunner(self.runnable, options={"delegate": "reference", "num_threads": 1})
        except ModelError as e:
            if self.resized and not unsized:
                given = " ".join(f"{k}={','.join(map(str, v))}" for k, v in self.resized.items())
                why = str(e.args[0] if e.args else e).split(f"{self.runnable}: ", 1)[-1]
                raise ModelError(
                    f"{self.path.name}: LiteRT cannot run it with --input-shape {given}: {why}",
                    hint="the model needs another size: read the shape its producer feeds it",
                ) from e
            if not unsized:
                raise
            raise ModelError(
                f"{self.path.name}: LiteRT cannot allocate it at the shapes the file holds: "
                + "; ".join(f"input {k!r} is dynamic ({v})" for k, v in unsized.items()),
                hint=" ".join(f"--input-shape {k}={_sig_template(v)}" for k, v in unsized.items())
                + " with the size the model runs at (edgekit makes that input static in the bundle)",
            ) from e
        with r:
            self._io = IOSpec(tuple(r.inputs), tuple(r.outputs))
            it = r._it
            self._quant = {"tensor_types": _tflite_tensor_types(it), "float_ops": _float_compute_ops(it)}

    def own_precision(self) -> str:
        """From what the ops compute, not from tensor sizes: a dynamic-range model (int8 weights, float
        compute) can hold more int8 than float32 elements and is still not full-integer."""
        self._read()
        assert self._quant is not None
        types = self._quant["tensor_types"]
        if types.get("int8", 0) or types.get("uint8", 0):
            return "int8-dynamic" if self._quant["float_ops"] else "int8"
        if types.get("float16", 0):
            return "fp16"
        return "fp32"

    def float_ops(self) -> list[str]:
        """Compute ops (QUANTIZE/DEQUANTIZE at the edges aside) that produce float tensors."""
        self._read()
        assert self._quant is not None
        return list(self._quant["float_ops"])

    def full_integer(self) -> bool:
        """Every compute op int8/uint8 (what the Edge TPU needs); float I/O through QUANTIZE/DEQUANTIZE is allowed."""
        return self.own_precision() == "int8"

    def describe(self) -> dict[str, Any]:
        self._read()
        f = self.file
        return {
            "format": "tflite",
            "ops": sorted(set(f.builtin_ops) | set(f.custom_ops))[:512],
            "precision": self.own_precision(),
            "tensor_types": (self._quant or {}).get("tensor_types", {}),
            "description": f.description[:200] or None,
            **(
                {
                    "inputs_made_static": [
                        {"name": k, "shape": v, "shape_signature": self.dynamic[k]} for k, v in self.resized.items()
                    ]
                }
                if self.resized
                else {}
            ),
        }

    def static_file(self, work: Path, io: IOSpec) -> Path:
        if self.runnable == self.path:
            return self.path
        import shutil

        return Path(shutil.copyfile(self.runnable, work / "source.static.tflite"))

    def io(self, input_shapes: Shapes) -> IOSpec:
        given = {k: tuple(int(d) for d in v) for k, v in input_shapes.items()}
        self._resize({k: v for k, v in given.items() if k in self.dynamic})
        self._read()
        assert self._io is not None
        for t in self._io.inputs:
            if t.name in given and tuple(given[t.name]) != tuple(t.shape):
                raise ModelError(
                    f"{self.path.name}: input {t.name!r} has the static shape {list(t.shape)} in the "
                    f"TFLite file; --input-shape {t.name}={','.join(map(str, given[t.name]))} cannot "
                    "change it",
                    hint="--input-shape applies to a TFLite input the file leaves dynamic (shape_signature -1); drop it for this one",
                )
        unknown = sorted(set(given) - {t.name for t in self._io.inputs})
        if unknown:
            raise ModelError(
                f"{self.path.name} has no input(s) {', '.join(unknown)}; its inputs: "
                + ", ".join(t.name for t in self._io.inputs)
            )
        return self._io

    def _resize(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """Make the dynamic inputs in ``shapes`` static at those shapes (a rewritten copy of the file the
        reference, the converters and a shipped bundle all take); a shape that does not fit the input's
        ``shape_signature`` is refused in one line."""
        if not shapes or {k: list(v) for k, v in shapes.items()} == self.resized:
            return
        for name, shape in shapes.items():
            sig = self.dynamic[name]
            fits = len(shape) == len(sig) and all(d > 0 and s in (-1, d) for d, s in zip(shape, sig))
            if not fits:
                raise ModelError(
                    f"{self.path.name}: --input-shape {name}={','.join(map(str, shape))} does not fit the "
                    f"input's shape_signature {sig}",
                    hint=f"--input-shape {name}={_sig_template(sig)} with the size the model runs at",
                )
            if int(np.prod(shape, dtype=np.float64)) * 8 > MAX_SAMPLE_BYTES:  # bounded before LiteRT allocates
                raise ModelError(
                    f"{self.path.name}: --input-shape {name}={','.join(map(str, shape))} is more than the "
                    f"{MAX_SAMPLE_BYTES >> 20} MiB edgekit holds per sample",
                    hint="pass a smaller --input-shape",
                )
        import tempfile
        import weakref

        from edge.backends.litert.rewrite import fix_input_shapes

        tmp = tempfile.TemporaryDirectory(prefix="edgekit-tflite-static-")
        weakref.finalize(self, tmp.cleanup)
        static = Path(tmp.name) / (self.path.stem + ".static.tflite")
        static.write_bytes(fix_input_shapes(self.runnable.read_bytes(), shapes))
        self.runnable, self.resized = static, {k: list(v) for k, v in shapes.items()}
        self._io, self._quant = None, None

    def reference(self, static: Path, inputs: Samples) -> tuple[Samples, str]:
        from edge.backends.litert.run import LiteRTRunner

        with LiteRTRunner(static, options={"delegate": "reference", "num_threads": 0}) as r:
            outs = [r.infer(s) for s in inputs]
            runtime = r.info.runtime
        lowered = ", ".join(self.lowered.get("lowered_custom_ops", {}))
        how = f" with {lowered} lowered to builtins (exact)" if lowered else ""
        return outs, f"{runtime} reference kernels (no delegate) on the source .tflite{how}"


def _sig_template(sig: list[int]) -> str:
    """``[-1, -1]`` -> ``1,D1``: a TFLite ``shape_signature`` with its static dims, the batch 1, the rest named."""
    return ",".join(str(d) if d >= 0 else "1" if i == 0 else f"D{i}" for i, d in enumerate(sig))


def _float_compute_ops(it: Any) -> list[str]:
    """Names of the ops, QUANTIZE/DEQUANTIZE aside, whose results are float (what keeps a model off the Edge TPU)."""
    floats = (np.dtype(np.float32), np.dtype(np.float16))
    return sorted(
        {
            o["op_name"]
            for o in it._get_ops_details()
            if o["op_name"] not in ("QUANTIZE", "DEQUANTIZE")
            and any(np.dtype(t) in floats for t in o.get("result_types", []))
        }
    )


def _tflite_tensor_types(it: Any) -> dict[str, int]:
    """Element counts per dtype over the model's tensors (weights and activations)."""
    counts: dict[str, int] = {}
    for d in it.get_tensor_details():
        n = int(np.prod(d["shape"])) if len(d["shape"]) else 1
        k = str(np.dtype(d["dtype"]))
        counts[k] = counts.get(k, 0) + n
    return counts


# -- OpenVINO IR ---------------------------------------------------------------------------------


@dataclass
class OpenVINOSource(Source):
    def __post_init__(self) -> None:
        self.format = "openvino-ir"
        self.bin = self.path.with_suffix(".bin")
        with open(self.path, "rb") as f:  # the head only: an IR's XML can be large
            head = f.read(4096)
        if b"<net" not in head:
            raise InputFileError(f"{self.path} is XML but not an OpenVINO IR (no <net> element at the top)")
        if not self.bin.is_file():
            raise InputFileError(
                f"{self.path.name} is an OpenVINO IR but its weights {self.bin.name} are not next to it",
                hint="an IR is two files: model.xml and model.bin, side by side",
            )
        self._model: Any = None

    def _read(self) -> Any:
        if self._model is None:
            from edge.backends.openvino.format import ov_core

            try:
                self._model = ov_core().read_model(str(self.path), str(self.bin))
            except Exception as e:  # noqa: BLE001 - a malformed IR is a bad input file
                # OpenVINO's message is a stack of "Exception from FILE:LINE:" lines; the reason is the last line
                lines = [
                    ln.strip() for ln in str(e).splitlines() if ln.strip() and not ln.startswith("Exception from ")
                ]
                reason = (lines[-1] if lines else str(e).strip() or type(e).__name__)[:300]
                raise InputFileError(f"OpenVINO could not read {self.path}: {reason}") from None
        return self._model

    def own_precision(self) -> str:
        from edge.backends.openvino.convert import op_counts, weight_types

        m = self._read()
        if op_counts(m, "FakeQuantize", "FakeConvert").get("FakeQuantize", 0):
            return "int8"
        w = weight_types(m)
        return "fp16" if w.get("f16", 0) > w.get("f32", 0) else "fp32"

    def describe(self) -> dict[str, Any]:
        import openvino as ov

        m = self._read()
        return {
            "format": "openvino-ir",
            "weights": self.bin.name,
            "runtime": f"OpenVINO {ov.get_version()}",
            "precision": self.own_precision(),
            "description": m.get_friendly_name()[:200] or None,
        }

    def io(self, input_shapes: Shapes) -> IOSpec:
        m = self._read()
        given = {k: tuple(int(d) for d in v) for k, v in input_shapes.items()}
        ins = []
        for port in m.inputs:
            name = port.get_any_name()
            ps = port.get_partial_shape()
            if ps.is_static:
                shape = tuple(int(d.get_length()) for d in ps)
                if name in given and given[name] != shape:
                    raise ModelError(
                        f"{self.path.name}: input {name!r} is static {list(shape)} in the IR; --input-shape cannot change it"
                    )
            elif name in given:
                shape = given[name]
                if len(shape) != ps.rank.get_length() or any(
                    d.is_static and d.get_length() != g for d, g in zip(ps, shape)
                ):
                    raise ModelError(
                        f"{self.path.name}: --input-shape {name}={','.join(map(str, shape))} does not fit the IR's input shape {ps}"
                    )
            else:
                raise ModelError(
                    f"{self.path.name}: input {name!r} has the dynamic shape {ps} in the IR; pass "
                    f"--input-shape {name}={_shape_template(ps)} with the size the model runs at",
                    hint="or save the IR with a static input (openvino.convert_model(..., input=[...]))",
                )
            ins.append(TensorSpec(name, shape, str(port.get_element_type().to_dtype()), image_layout(shape)))
        unknown = sorted(set(given) - {t.name for t in ins})
        if unknown:
            raise ModelError(
                f"{self.path.name} has no input(s) {', '.join(unknown)}; its inputs: " + ", ".join(t.name for t in ins)
            )
        outs = tuple(
            TensorSpec(
                p.get_any_name(),
                tuple(int(d.get_length()) if d.is_static else -1 for d in p.get_partial_shape()),
                str(p.get_element_type().to_dtype()),
            )
            for p in m.outputs
        )
        return IOSpec(tuple(ins), outs)

    def static_file(self, work: Path, io: IOSpec) -> Path:
        m = self._read()
        if all(p.get_partial_shape().is_static for p in m.inputs):
            return self.path
        import openvino as ov

        m.reshape({t.name: ov.PartialShape(list(t.shape)) for t in io.inputs})
        out = work / "source.static.xml"
        ov.save_model(m, str(out), compress_to_fp16=False)
        return out

    def reference(self, static: Path, inputs: Samples) -> tuple[Samples, str]:
        from edge.backends.openvino.run import OpenVINORunner

        with OpenVINORunner(static, options={"device": ["CPU"], "inference_precision": "f32"}) as r:
            outs = [r.infer(s) for s in inputs]
            runtime = r.info.runtime
        return outs, f"{runtime} CPU, inference precision f32, on the source IR"


def _shape_template(ps: Any) -> str:
    """``[?,3,?,?]`` -> ``1,3,H,W``: the static dims as they are, the batch 1, the rest named."""
    rank = ps.rank.get_length()
    names = {rank - 2: "H", rank - 1: "W"} if rank >= 3 else {}
    return ",".join(
        str(d.get_length()) if d.is_static else "1" if i == 0 else names.get(i, f"D{i}") for i, d in enumerate(ps)
    )


# -- PyTorch -------------------------------------------------------------------------------------


def is_torch_source(path: str | os.PathLike[str]) -> bool:
    """A ``.pt``/``.ts``/``.pt2`` file, or any zip archive written by torch.jit.save / torch.export.save (or
    torch.package, which the source adapter refuses with its own reason)."""
    p = Path(path)
    if p.suffix.lower() in TORCH_SUFFIXES:
        return True
    if not p.is_file() or _magic(p)[:4] != b"PK\x03\x04":
        return False
    names = zip_names(p)
    if not names:
        return False
    return is_torchscript(names) or is_exported_program(names) or is_torch_package(names)


@dataclass
class TorchSource(Source):
    def __post_init__(self) -> None:
        self.format = TORCH_FORMAT
        self.declares_outputs = False  # output_0.. come from the ONNX export
        self.torch_kind = torch_kind(self.path)
        #: forward()'s arguments --freeze-input gave a value (``[{name, dtype, value}]``), set by the conversion
        self.frozen: list[dict[str, Any]] = []

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "format": "torchscript" if self.torch_kind == "torchscript" else "torch-exported-program",
            "io_names": "inputs from the model's signature (--input-shape names); outputs output_0.. (torch models carry no output names)",
        }
        if self.frozen:  # passed to every call and constants in the exported graph: no If to inline, nothing to check
            info["frozen"] = {"inputs": self.frozen, "inlined_if": 0}
        return info

    def _input_names(self) -> list[str]:
        """The forward() argument names, read in the torch toolchain; empty when it is not installed."""
        from edge.backends.converter import CONVERTERS

        try:
            return list(CONVERTERS.get("torch->onnx").input_names(self.path))  # type: ignore[attr-defined]
        except (EdgeError, OSError):
            return []

    def io(self, input_shapes: Shapes) -> IOSpec:
        shapes = {k: tuple(int(d) for d in v) for k, v in input_shapes.items()}
        if not shapes:
            names = self._input_names()
            raise ModelError(
                f"{self.path}: a PyTorch model carries no input shapes; pass --input-shape for every "
                f"input ({', '.join(names) if names else 'the forward() argument names'})",
                hint=" ".join(f"--input-shape {n}=1,3,224,224" for n in names or ["x"]),
            )
        bad = [f"{k}={list(v)}" for k, v in shapes.items() if not v or any(d <= 0 for d in v)]
        if bad:
            raise ModelError(f"{self.path}: --input-shape needs positive dims: {', '.join(bad)}")
        return IOSpec(tuple(TensorSpec(k, v, "float32", image_layout(v)) for k, v in shapes.items()), ())


# -- GGUF ----------------------------------------------------------------------------------------

#: GGUF tensor types of an unquantized model: quantizing from these is the normal flow
UNQUANTIZED = ("F32", "F16", "BF16")


@dataclass
class GGUFSource(Source):
    def __post_init__(self) -> None:
        from edge.backends.llamacpp.format import read_gguf

        self.format = "gguf"
        self.kind = "llm"
        self.info = read_gguf(self.path)

    @property
    def source_type(self) -> str:
        """llama.cpp's file type as edgekit names precisions (q4_k_m, q4_1, f16...): ``general.file_type``,
        else the dominant tensor type."""
        ft = self.info.file_type
        if ft is not None:
            try:
                import gguf

                name = gguf.LlamaFileType(int(ft)).name
                if name != "GUESSED":
                    return name.removeprefix("MOSTLY_").removeprefix("ALL_").lower()
            except (ImportError, ValueError):
                pass
        return self.info.dominant_type.lower()

    @property
    def prequantized(self) -> bool:
        return self.source_type.upper() not in UNQUANTIZED

    def own_precision(self) -> str:
        return self.source_type

    def describe(self) -> dict[str, Any]:
        i = self.info
        return {
            "format": "gguf",
            "architecture": i.architecture,
            "parameters": i.parameters,
            "type": i.dominant_type,
            "bytes": self.path.stat().st_size,
        }

    def io(self, input_shapes: Shapes) -> IOSpec:
        return IOSpec((TensorSpec("tokens", ("n",), "int32"),), ())


# -- detection -----------------------------------------------------------------------------------


def _magic(p: Path) -> bytes:
    try:
        with open(p, "rb") as f:
            return f.read(16)
    except OSError as e:
        raise InputFileError(f"cannot read {p}: {e.strerror}") from None


def open_source(model: str | os.PathLike[str]) -> Source:
    """The adapter for ``model``, chosen from its first bytes (the suffix only breaks ties)."""
    p = Path(model)
    if not p.exists():
        raise InputFileError(f"model file {p} does not exist")
    if p.is_dir():
        if (p / "saved_model.pb").exists():
            raise InputFileError(
                f"{p} is a TensorFlow SavedModel, not a model file edgekit reads",
                hint="edgekit reads " + ", ".join(KINDS) + "; export it with tf2onnx "
                f"(python -m tf2onnx.convert --saved-model {p} --output model.onnx) or "
                "tf.lite.TFLiteConverter.from_saved_model",
            )
        what = "a Core ML package" if p.suffix == ".mlpackage" else "a directory"
        raise InputFileError(f"{p} is {what}, not a model file edgekit reads", hint="edgekit reads " + ", ".join(KINDS))
    try:
        mode = p.stat().st_mode
    except OSError as e:
        raise InputFileError(f"cannot read {p}: {e.strerror}") from None
    if not stat.S_ISREG(mode):  # a FIFO would block every open, /dev/zero would be read until memory runs out
        raise InputFileError(
            f"{p} is not a regular file (a FIFO, device or socket)", hint="name a model file: " + ", ".join(KINDS)
        )
    head = _magic(p)
    if head[:4] == b"GGUF" or p.suffix.lower() == ".gguf":
        return GGUFSource(p)
    if head[4:8] == b"TFL3" or p.suffix.lower() == ".tflite":
        return TFLiteSource(p)
    if head.lstrip()[:5] in (b"<?xml", b"<net ") or p.suffix.lower() == ".xml":
        return OpenVINOSource(p)
    if is_torch_source(p):
        return TorchSource(p)
    if p.suffix.lower() in (".h5", ".keras", ".pb", ".pth", ".ckpt", ".safetensors", ".bin", ".mlmodel"):
        raise InputFileError(
            f"{p.name}: edgekit does not read {p.suffix} files",
            hint="it reads " + ", ".join(KINDS) + "; export to one of them first",
        )
    try:
        return OnnxSource(p)
    except InputFileError:
        if p.suffix.lower() == ".onnx":
            raise
        # not ONNX either, and nothing in its first bytes says what it is
        raise InputFileError(
            f"{p.name} is not a model file edgekit recognises: its first bytes {head[:8]!r} match "
            f"no kind it reads, and it does not parse as ONNX",
            hint="edgekit reads " + ", ".join(KINDS),
        ) from None
