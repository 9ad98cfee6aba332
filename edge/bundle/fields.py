"""The manifest's vocabulary: the character sets, precisions and dtypes its fields are checked against.

Shared by the manifest tree (:mod:`edge.bundle.schema`) and the evidence it carries (:mod:`edge.bundle.evidence`).
"""

from __future__ import annotations

from typing import Any, Literal, Sequence

#: bundle, target, runner and format ids: a name, never a path (no '/', no leading '.' or '-')
ID = r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$"
CONVERTER = r"^[A-Za-z0-9_][A-Za-z0-9._+>-]{0,63}$"  # "onnx->tflite"
SHA256 = r"^[0-9a-f]{64}$"
_SEG = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}"
#: a file inside the bundle: relative, '/'-separated, no '.', '..' or empty parts, no leading '.' or '-'
REL_PATH = rf"^{_SEG}(/{_SEG}){{0,15}}$"
TENSOR_NAME = r"^[^\x00-\x1f\x7f]{1,256}$"
#: a runner option's text value: a word, never a path or a command line (no '/', no space)
OPTION_TEXT = r"^[A-Za-z0-9_.:,+-]{0,64}$"
OPTION_KEY = r"^[a-z][a-z0-9_]{0,63}$"
VERSION = r"^[A-Za-z0-9_.+-]{1,64}$"
UTC_TIME = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]{5,15}(Z|[+-][0-9]{2}:[0-9]{2})?$"

Precision = Literal[
    "fp32",
    "fp16",
    "bf16",
    "int8",
    "int8-dynamic",
    "f16",
    "q8_0",
    "q5_k_m",
    "q4_k_m",
    "q4_0",
    # GGUF files shipped as they came (--precision keep): llama.cpp's file types
    "f32",
    "q4_1",
    "q5_0",
    "q5_1",
    "q2_k",
    "q2_k_s",
    "q3_k_s",
    "q3_k_m",
    "q3_k_l",
    "q4_k_s",
    "q5_k_s",
    "q6_k",
    "iq1_s",
    "iq1_m",
    "iq2_xxs",
    "iq2_xs",
    "iq2_s",
    "iq2_m",
    "iq3_xxs",
    "iq3_xs",
    "iq3_s",
    "iq3_m",
    "iq4_nl",
    "iq4_xs",
    "tq1_0",
    "tq2_0",
    "mxfp4_moe",
    "nvfp4",
    "q1_0",
]
DType = Literal[
    "float32",
    "float16",
    "float64",
    "bfloat16",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "bool",
]
TEXT: dict[str, Any] = dict(max_len=1024)
#: a chain step's notes (``edge.bundle.schema`` ChainStep.notes): at most this many, each at most TEXT's length
MAX_NOTES = 64


def fit_notes(notes: Sequence[str]) -> list[str]:
    """A converter's notes as the manifest holds them: each at most ``TEXT``'s 1,024 characters (a longer one cut at
    its last "; " that fits, saying how much was cut), at most :data:`MAX_NOTES` (the rest counted in the last). A
    note that grows with the model (onnx2tf's layout note: one entry per transposed input and output, ~140 characters
    each with its int8 scale) made U^2-Net-p's coral-edgetpu manifest fail its own schema, a refusal that told the
    user not to edit manifests by hand."""
    limit = TEXT["max_len"]
    out = []
    for note in notes:
        note = str(note)
        if len(note) > limit:
            room = limit - 40
            cut = note.rfind("; ", 0, room)
            cut = cut if cut > room // 2 else room
            note = f"{note[:cut]}; ... ({len(note) - cut:,} more characters not kept)"
        out.append(note)
    if len(out) > MAX_NOTES:
        out = out[: MAX_NOTES - 1] + [f"... {len(out) - MAX_NOTES + 1} more notes not kept"]
    return out


MS: dict[str, Any] = dict(ge=0.0, le=1e9)
