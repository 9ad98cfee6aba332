"""The TFLite bundle format, read by both sides: the flatbuffer check, what the file says, the I/O sidecar."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from edge.backends.litert.metadata import Normalization, input_normalization
from edge.backends.options import RESERVE_CPUS_DOC, THREAD_SEARCH, THREADS
from edge.backends.tuning import TuneSpace
from edge.base.typedjson import UnreadableFile, read_json_file, spec
from edge.errors import InputFileError

IO_SIDECAR_SUFFIX = ".io.json"
IO_SCHEMA = "edgekit.tflite-io/1"
EDGETPU_CUSTOM_OP = "edgetpu-custom-op"
TFLITE_IDENTIFIER = b"TFL3"


@dataclass(frozen=True)
class TFLiteFile:
    """What the flatbuffer says, read without an interpreter."""

    path: Path
    size: int
    schema_version: int
    subgraphs: int
    builtin_ops: tuple[str, ...]  # op code names, in the model's table
    custom_ops: tuple[str, ...]
    description: str
    #: input tensor name -> the normalisation the file's own metadata declares for it (edge.backends.litert.metadata)
    normalization: Mapping[str, Normalization] = dataclasses.field(default_factory=dict)

    @property
    def edgetpu_compiled(self) -> bool:
        return EDGETPU_CUSTOM_OP in self.custom_ops


def check_tflite_bytes(data: bytes, origin: str) -> None:
    """Raise InputFileError unless ``data`` starts like a TFLite flatbuffer (identifier TFL3, root in range)."""
    if len(data) < 16:
        raise InputFileError(f"{origin} is not a TFLite model: {len(data)} bytes")
    if data[4:8] != TFLITE_IDENTIFIER:
        head = data[:8]
        what = (
            "an ONNX/protobuf file"
            if head[:1] == b"\x08"
            else "a ZIP archive"
            if head[:2] == b"PK"
            else "text"
            if all(32 <= b < 127 or b in (9, 10, 13) for b in head)
            else "something else"
        )
        raise InputFileError(
            f"{origin} is not a TFLite flatbuffer: its file identifier is {data[4:8]!r}, not {TFLITE_IDENTIFIER!r} (it looks like {what})"
        )
    root = int.from_bytes(data[0:4], "little")
    if not 8 <= root < len(data) - 4:
        raise InputFileError(
            f"{origin} is a truncated or corrupt TFLite flatbuffer (root offset {root}, {len(data)} bytes)"
        )


def verify_tflite_bytes(data: bytes, origin: str) -> None:
    """What ``convert`` holds a .tflite to before it reads one (``edgekit firmware c-array`` too): the identifier
    and root (:func:`check_tflite_bytes`), every table the flatbuffer's object API unpacks (tensor, buffer,
    subgraph and op-code indices), and LiteRT's own flatbuffer verifier where LiteRT is installed. An op LiteRT
    does not know (a TFLite Micro custom op) is not a damaged file. InputFileError naming ``origin`` otherwise."""
    check_tflite_bytes(data, origin)
    try:
        from edge.backends.litert.rewrite import load

        model = load(data)
        if not model.subgraphs:
            raise InputFileError(f"{origin} is a TFLite flatbuffer with no subgraph")

        def seq(x: Any) -> list[Any]:  # the object API holds index lists as numpy arrays, absent ones as None
            return list(x) if x is not None else []

        for g in model.subgraphs:
            tensors, ops = seq(g.tensors), seq(g.operators)
            used = [*seq(g.inputs), *seq(g.outputs)]
            used += [i for op in ops for i in (*seq(op.inputs), *seq(op.outputs))]
            if any(not -1 <= int(i) < len(tensors) for i in used):
                raise InputFileError(f"{origin} is a corrupt TFLite flatbuffer: a tensor index is out of range")
            if any(not 0 <= int(op.opcodeIndex) < len(seq(model.operatorCodes)) for op in ops):
                raise InputFileError(f"{origin} is a corrupt TFLite flatbuffer: an op-code index is out of range")
            if any(not 0 <= int(t.buffer) < len(seq(model.buffers)) for t in tensors):
                raise InputFileError(f"{origin} is a corrupt TFLite flatbuffer: a buffer index is out of range")
    except InputFileError:
        raise
    except ImportError:
        return
    except Exception as e:  # noqa: BLE001 - a flatbuffer that does not unpack is a bad input file
        raise InputFileError(
            f"{origin} has a TFLite identifier but does not parse as a TFLite model: {type(e).__name__}: {str(e)[:120]}"
        ) from None
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        return
    try:
        Interpreter(model_content=bytes(data))  # builds through tflite::FlatBufferModel's verifier
    except ValueError as e:
        text = str(e)
        if "custom op" in text.lower() or "unresolved" in text.lower():
            return
        line = next((x.strip() for x in text.splitlines() if x.strip()), "rejected")
        raise InputFileError(f"{origin} is not a TFLite model LiteRT accepts: {line[:160]}") from None


def read_tflite(path: str | os.PathLike[str]) -> TFLiteFile:
    p = Path(path)
    if not p.is_file():
        raise InputFileError(f"TFLite model {p} does not exist" if not p.exists() else f"{p} is not a file")
    data = p.read_bytes()
    check_tflite_bytes(data, str(p))
    try:
        from ai_edge_litert import schema_py_generated as schema

        model = schema.Model.GetRootAs(data, 0)
        names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
        builtin, custom = [], []
        for i in range(model.OperatorCodesLength()):
            oc = model.OperatorCodes(i)
            code = max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())
            if oc.CustomCode():
                custom.append(oc.CustomCode().decode(errors="replace"))
            else:
                builtin.append(names.get(code, str(code)))
        return TFLiteFile(
            p,
            len(data),
            model.Version(),
            model.SubgraphsLength(),
            tuple(builtin),
            tuple(custom),
            (model.Description() or b"").decode(errors="replace"),
            _declared_normalization(data, model),
        )
    except InputFileError:
        raise
    except ImportError:
        return TFLiteFile(p, len(data), -1, -1, (), (), "")
    except Exception as e:  # noqa: BLE001 - a flatbuffer that does not parse is a bad input file
        raise InputFileError(
            f"{p} has a TFLite identifier but does not parse as a TFLite model: {type(e).__name__}: {e}"
        ) from None


def _declared_normalization(data: bytes, model: Any) -> dict[str, Normalization]:
    declared = input_normalization(data, model)
    if not declared or model.SubgraphsLength() < 1:
        return {}
    g = model.Subgraphs(0)
    names = {}
    for k, norm in declared.items():
        if k < g.InputsLength():
            name = g.Tensors(g.Inputs(k)).Name()
            if name:
                names[name.decode(errors="replace")] = norm
    return names


def load_sidecar(artifact: Path) -> dict[str, Any] | None:
    side = sidecar_path(artifact)
    if not side.is_file():
        return None
    try:
        data = read_json_file(side, what="I/O sidecar", max_bytes=4 << 20, max_depth=16)
    except UnreadableFile as e:
        raise InputFileError(e.message) from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != IO_SCHEMA:
        raise InputFileError(f"{side} has schema {str(schema)[:40]!r}; this edgekit reads {IO_SCHEMA}")
    sidecar: dict[str, Any] = data  # a dict: its schema matched
    return sidecar


def sidecar_path(artifact: Path) -> Path:
    return Path(artifact).with_suffix(IO_SIDECAR_SUFFIX)


def signature_names(path: str | os.PathLike[str]) -> dict[str, str]:
    """For a .tflite with a SignatureDef (every TF2 export): each I/O tensor's name -> its signature name
    (``serving_default_x.1:0`` -> ``x.1``, ``PartitionedCall:0`` -> ``logits``), from the first signature, the
    one LiteRT (and so the bundle) names the model's I/O by. Empty without a signature. Converters that keep
    tensor names (tf2onnx, OpenVINO's TFLite frontend) rename their I/O through it (issue #23)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    it = Interpreter(
        model_path=str(path), experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    )
    sigs = it.get_signature_list()
    if not sigs:
        return {}
    runner = it.get_signature_runner(next(iter(sigs)))
    found: dict[str, str] = {}
    for details in (runner.get_input_details(), runner.get_output_details()):
        for sig_name, d in details.items():
            if d.get("name") and d["name"] != sig_name:
                found[str(d["name"])] = str(sig_name)
    return found


# -- runner options (declared once: edge.backends.options) --------------------------------------

#: set to 1 to allow the CPU fallback from every command (same as the runner option allow_cpu_fallback)
ALLOW_CPU_FALLBACK_ENV = "EDGEKIT_ALLOW_CPU_FALLBACK"


@dataclass(frozen=True)
class LiteRTOptions:
    delegate: Literal["xnnpack", "edgetpu", "none", "reference", "XNNPACK", "EDGETPU", "NONE", "REFERENCE"] = spec(
        "xnnpack",
        search=("xnnpack", "none"),
        doc="xnnpack (default: LiteRT's CPU delegate), edgetpu (libedgetpu), none (builtin kernels only) "
        "or reference (LiteRT's reference kernels: slow, the parity reference for a TFLite source)",
    )
    reserve_cpus: float = spec(0.0, ge=0, le=4096, doc=RESERVE_CPUS_DOC)
    num_threads: int = spec(
        0,
        **THREADS,
        search=THREAD_SEARCH,
        doc="CPU threads; 0 (default) = edgekit's choice: the CPUs this process may "
        "use that other processes and reserve_cpus leave (edge.backends.threads). LiteRT's own "
        "default (None) runs XNNPack on one thread",
    )
    load_recheck_s: float = spec(
        2.0,
        ge=0,
        le=3600,
        doc="delegate xnnpack, num_threads 0: seconds between two looks at the CPU load while the runner runs; "
        "when edgekit's thread count changes (the device turned busy or idle), the interpreter is created again "
        "with it (bounded: at most 1% of the time); 0 = decide once, when opened",
    )
    allow_cpu_fallback: bool = spec(
        False,
        doc="run on the CPU when the delegate cannot be used (libedgetpu missing, "
        "model not compiled for the Edge TPU, XNNPack refusing the model); reported as CPU "
        f"fallback. Default false; {ALLOW_CPU_FALLBACK_ENV}=1 sets it for every command",
    )
    edgetpu_device: str = spec(
        "",
        pattern=r"^((usb|pci)(:[0-9]{1,3})?)?$",
        doc="which Edge TPU libedgetpu opens: '' (the first, default), 'usb', 'usb:0', 'pci:0'",
    )
    xnnpack_latest_features: bool = spec(
        False,
        search=(False, True),
        doc="delegate xnnpack only: create XNNPack with its latest operators enabled "
        "(TFLITE_XNNPACK_DELEGATE_FLAG_ENABLE_LATEST_OPERATORS, ai-edge-litert's "
        "experimental_default_delegate_latest_features) instead of LiteRT's default XNNPack; true or false "
        "(default)",
    )

    def invalid(self) -> tuple[str, str] | None:
        """(option, problem) where options disagree with each other: read by the runner (``read_options``), the
        manifest check and the tuner's space alike, so the rule is written once."""
        delegate = self.delegate.lower()
        if self.xnnpack_latest_features and delegate != "xnnpack":
            # the flag makes the interpreter add an XNNPack delegate of its own whatever the op resolver: with
            # delegate none/reference it would silently run XNNPack (measured: ai-edge-litert 2.3)
            return (
                "xnnpack_latest_features",
                f"applies to delegate xnnpack only, not {delegate} (it would apply XNNPack anyway)",
            )
        return None


def untranslated_ops(source: Path, ops: Sequence[str]) -> tuple[str, str]:
    """TFLite ops another framework's frontend (tf2onnx, OpenVINO) has no translation for: (each op with what it
    is: a TFLite builtin or a custom op, read from ``source``), and the hint: a builtin runs on LiteRT as it is,
    a custom op needs its own lowering."""
    try:
        custom = set(read_tflite(source).custom_ops)
    except Exception:  # noqa: BLE001 - only for the message
        custom = set()
    what = ", ".join(f"{op} ({'a custom op' if op in custom else 'a TFLite builtin op'})" for op in ops)
    hints = []
    if any(op not in custom for op in ops):
        hints.append(f"LiteRT runs TFLite builtin ops as they are: edgekit convert {source.name} -t arm-xnnpack")
    if any(op in custom for op in ops):
        hints.append("a custom op needs its own lowering")
    return what, "; ".join(hints) + "; or bring the model's ONNX"


# -- what edgekit tune searches (edge.backends.tuning) ------------------------------------------


def tune_conflict(opts: Mapping[str, Any], cpus: int) -> str | None:
    """The runner's own rule (:meth:`LiteRTOptions.invalid`), not a copy of it."""
    bad = dataclasses.replace(LiteRTOptions(), **opts).invalid()
    return f"litert {bad[0]} with delegate={opts.get('delegate')}: {bad[1]} (the runner refuses it)" if bad else None


# XNNPack or LiteRT's builtin kernels (``none``): XNNPack is not faster for every graph (small or op-by-op models pay
# its packing), and some ops stay outside it anyway. xnnpack_latest_features: ai-edge-litert's
# experimental_default_delegate_latest_features, an XNNPack delegate created with
# TFLITE_XNNPACK_DELEGATE_FLAG_ENABLE_LATEST_OPERATORS (edge.backends.litert.run)
TUNE_SPACE = TuneSpace(
    LiteRTOptions,
    "onnx->tflite",
    "arm-xnnpack",
    threads_option="num_threads",
    conflict=tune_conflict,
    labels={"num_threads": "threads", "xnnpack_latest_features": "latest"},
)
