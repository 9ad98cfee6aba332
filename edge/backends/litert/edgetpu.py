"""Full-integer TFLite -> Edge TPU TFLite with Google's ``edgetpu_compiler``.

The compiler exists for x86-64 Linux only and is not on PyPI (Coral's apt repository:
``edgetpu-compiler``). When it is on PATH it compiles ``model.tflite`` into
``model_edgetpu.tflite`` and its log (``model_edgetpu.log``) says, per op type, whether it was
mapped to the Edge TPU or left on the CPU and why; both counts go into the manifest. When it
is absent the converter says exactly that, keeps the ready full-integer ``model.tflite`` as the
bundle's artifact (format ``tflite``), and records the command that finishes the job on a
machine that has the compiler (``details["finish_with"]``; also a note the CLI prints).
``require_compiler = true`` makes its absence an error instead.

The compiled bundle keeps the int8 ``model.tflite`` beside ``model_edgetpu.tflite`` (its
``io.json`` names it as ``cpu_model``): a compiled model cannot run without the Edge TPU, and
the runner's explicit CPU fallback needs something to run.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from edge.backends.converter import ConversionRequest, ConversionResult, Converter
from edge.errors import ConversionError, MissingDependencyError, PrecisionError

COMPILER = "edgetpu_compiler"
COMPILER_INSTALL = ("edgetpu_compiler runs on x86-64 Linux only; install it from Coral's apt repository "
                    "(https://coral.ai/docs/edgetpu/compiler/: apt-get install edgetpu-compiler)")
_MAPPED = "Mapped to Edge TPU"


def parse_compiler_log(text: str) -> dict[str, Any]:
    """The op table and summary lines of an edgetpu_compiler log/stdout.

    Table rows look like ``CONV_2D    35    Mapped to Edge TPU`` or
    ``MEAN   1   Operation is otherwise supported, but not mapped due to some unspecified limitation``;
    the summary says ``Number of operations that will run on Edge TPU: 65``.
    """
    rows = []
    for line in text.splitlines():
        m = re.match(r"^\s*([A-Z][A-Z0-9_]*)\s+(\d+)\s+(\S.*?)\s*$", line)
        if m and m.group(1) not in ("Operator",):
            rows.append({"op": m.group(1), "count": int(m.group(2)), "status": m.group(3),
                         "on": "tpu" if m.group(3).startswith(_MAPPED) else "cpu"})
    tpu = re.search(r"operations that will run on Edge TPU:\s*(\d+)", text)
    cpu = re.search(r"operations that will run on CPU:\s*(\d+)", text)
    version = re.search(r"Edge TPU Compiler version\s+(\S+)", text)
    return {
        "compiler_version": version.group(1) if version else None,
        "tpu_ops": int(tpu.group(1)) if tpu else sum(r["count"] for r in rows if r["on"] == "tpu"),
        "cpu_ops": int(cpu.group(1)) if cpu else sum(r["count"] for r in rows if r["on"] == "cpu"),
        "ops": rows,
    }


class TFLiteToEdgeTPU(Converter):
    name = "tflite->edgetpu"
    source_format = "tflite"
    target_format = "edgetpu-tflite"
    precisions = frozenset({"int8"})
    # No hard requirement: without the compiler the ready int8 model is kept and the finishing command recorded.
    requires = ()
    options = {
        "compiler": f"edgetpu_compiler to run (default: {COMPILER} on PATH)",
        "require_compiler": "fail when edgetpu_compiler is missing instead of keeping the uncompiled int8 model "
                            "(default false)",
        "extra_args": "more compiler arguments, e.g. [\"--num_segments\", \"2\"]",
        "timeout_s": "stop the compiler after this many seconds (default 600)",
    }

    def convert(self, request: ConversionRequest) -> ConversionResult:
        from edge.backends.litert.format import read_tflite

        self.check_options(request.options)
        if request.precision != "int8":
            raise PrecisionError(f"the Edge TPU runs full-integer int8 models only, not {request.precision!r}")
        opts = request.options
        src = Path(request.source)
        info = read_tflite(src)
        _check_full_integer(src)
        out_dir = request.workdir
        model = out_dir / "model.tflite"
        if src.resolve() != model.resolve():
            shutil.copyfile(src, model)
        side_src = src.with_suffix(".io.json")
        io = json.loads(side_src.read_text(encoding="utf-8")) if side_src.is_file() else None
        if io is not None:
            (out_dir / "model.io.json").write_text(json.dumps(io, indent=2) + "\n", encoding="utf-8")
        files = [model] + ([out_dir / "model.io.json"] if io is not None else [])
        compiler = shutil.which(str(opts.get("compiler", COMPILER)))
        bundle = _final_dir(out_dir)
        finish = f"{COMPILER} -s -o {bundle} {bundle}/model.tflite"
        details: dict[str, Any] = {"input_ops": list(info.builtin_ops), "finish_with": None}
        if compiler is None:
            what = (f"{opts.get('compiler', COMPILER)} is not on PATH, so the model was not compiled for the Edge TPU")
            if bool(opts.get("require_compiler", False)):
                raise MissingDependencyError(f"converter {self.name!r}: {what}", hint=COMPILER_INSTALL)
            details.update(edgetpu_compiled=False, reason=what, finish_with=finish)
            note = (f"{what}: the bundle holds the ready full-integer model.tflite, which the Edge TPU runs none of "
                    f"until compiled. Finish on an x86-64 Linux machine with the compiler: `{finish}` "
                    "(or convert there, which records the compiler's op mapping in the manifest)")
            return ConversionResult(artifact=model, format="tflite", files=files,
                                    tool_versions={COMPILER: "not installed"}, details=details, notes=[note])

        timeout_s = float(opts.get("timeout_s", 600))
        extra = [str(a) for a in opts.get("extra_args", [])]
        cmd = [compiler, "-s", "-o", str(out_dir), *extra, str(model)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise ConversionError(f"{COMPILER} did not finish within {timeout_s:.0f} s on {src.name}") from None
        compiled = out_dir / "model_edgetpu.tflite"
        log_file = out_dir / "model_edgetpu.log"
        text = proc.stdout + "\n" + (log_file.read_text(errors="replace") if log_file.is_file() else "")
        if proc.returncode != 0 or not compiled.is_file():
            tail = " | ".join(ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip())[-800:]
            raise ConversionError(f"{COMPILER} failed on {src.name} (exit {proc.returncode}): {tail}")
        parsed = parse_compiler_log(text)
        if parsed["compiler_version"] is None:
            v = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60)
            m = re.search(r"version\s+(\S+)", v.stdout + v.stderr)
            parsed["compiler_version"] = m.group(1) if m else None
        if io is not None:
            io_tpu = {**io, "cpu_model": "model.tflite"}
            (out_dir / "model_edgetpu.io.json").write_text(json.dumps(io_tpu, indent=2) + "\n", encoding="utf-8")
            files.append(out_dir / "model_edgetpu.io.json")
        files += [compiled] + ([log_file] if log_file.is_file() else [])
        details.update(edgetpu_compiled=True, command=" ".join(cmd[:1] + cmd[1:]), **parsed)
        notes = []
        if parsed["cpu_ops"]:
            cpu = [f"{r['op']} x{r['count']} ({r['status']})" for r in parsed["ops"] if r["on"] == "cpu"]
            notes.append(f"{parsed['cpu_ops']} op(s) stay on the CPU: " + "; ".join(cpu))
        return ConversionResult(artifact=compiled, format=self.target_format, files=files,
                                tool_versions={"edgetpu_compiler": parsed["compiler_version"] or "unknown"},
                                details=details, notes=notes)


def _final_dir(workdir: Path) -> str:
    """The bundle directory the work directory becomes (``convert`` stages ``.NAME.partial-XXXX`` beside it)."""
    m = re.match(r"^\.(.+)\.partial-[^/]*$", workdir.name)
    return str(workdir.parent / m.group(1)) if m else "<bundle>"


def _check_full_integer(path: Path) -> None:
    """The Edge TPU needs every compute op in int8/uint8; list every float op at once."""
    try:
        from ai_edge_litert.interpreter import Interpreter, OpResolverType
    except ImportError:
        return
    it = Interpreter(model_path=str(path), experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    import numpy as np

    float_ops = sorted({o["op_name"] for o in it._get_ops_details()
                        if o["op_name"] not in ("QUANTIZE", "DEQUANTIZE")
                        and any(t in (np.float32, np.float16) for t in o.get("result_types", []))})
    if float_ops:
        raise ConversionError(f"{path.name} is not a full-integer model (float ops: {', '.join(float_ops)}); "
                              "the Edge TPU compiles only full-integer int8 models",
                              hint="convert with precision int8 and calibration data")
