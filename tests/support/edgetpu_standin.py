"""A stand-in for Google's ``edgetpu_compiler`` (x86-64 Linux only, from Coral's apt repository, which
this test host cannot reach): same command line, same files, same output format.

``edgetpu_compiler [-s] -o OUTDIR [more args] MODEL.tflite`` writes ``OUTDIR/MODEL_edgetpu.tflite`` --
the input with its operators replaced by one ``edgetpu-custom-op`` (what the real compiler writes when
it maps every op) -- and ``OUTDIR/MODEL_edgetpu.log`` (the op table), and prints what the real one
prints (version, summary, the table with ``-s``). ``--version`` prints the version line.
``$EDGETPU_STANDIN_FAIL`` set: it prints an error and exits 1 without writing anything, as the real
compiler does on a model it cannot compile. ``$EDGETPU_STANDIN_ARGS``: a file it appends its argv to.

``install(directory)`` puts an executable ``edgetpu_compiler`` there that runs this file.
"""

from __future__ import annotations

import os
import stat
import sys
from collections import Counter
from pathlib import Path

VERSION = "16.0.384591198"
CUSTOM_OP = "edgetpu-custom-op"


def install(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    exe = directory / "edgetpu_compiler"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return exe


def compile_model(src: Path, out_dir: Path) -> tuple[Path, Path, Counter[str]]:
    import flatbuffers
    from ai_edge_litert import schema_py_generated as S

    m = S.ModelT.InitFromPackedBuf(src.read_bytes(), 0)
    names = {v: k for k, v in vars(S.BuiltinOperator).items() if not k.startswith("_")}
    ops: Counter[str] = Counter()
    for sg in m.subgraphs:
        for o in sg.operators or []:
            oc = m.operatorCodes[o.opcodeIndex]
            ops[names.get(max(oc.builtinCode, oc.deprecatedBuiltinCode), "?")] += 1
    code = S.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = S.BuiltinOperator.CUSTOM
    code.customCode, code.version = CUSTOM_OP, 1
    m.operatorCodes = [*(m.operatorCodes or []), code]
    sg = m.subgraphs[0]
    op = S.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = len(m.operatorCodes) - 1, list(sg.inputs), list(sg.outputs)
    sg.operators = [op]
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    out = out_dir / f"{src.stem}_edgetpu.tflite"
    log = out_dir / f"{src.stem}_edgetpu.log"
    out.write_bytes(bytes(b.Output()))
    return out, log, ops


def table(ops: Counter[str]) -> str:
    rows = "".join(f"{name:<31}{n:<11}Mapped to Edge TPU\n" for name, n in sorted(ops.items()))
    return f"Operator                       Count      Status\n\n{rows}"


def main(argv: list[str]) -> int:
    if os.environ.get("EDGETPU_STANDIN_ARGS"):
        with open(os.environ["EDGETPU_STANDIN_ARGS"], "a", encoding="utf-8") as f:
            f.write(" ".join(argv) + "\n")
    if "--version" in argv:
        print(f"Edge TPU Compiler version {VERSION}")
        return 0
    out_dir, show, rest, i = Path("."), False, [], 0
    while i < len(argv):
        a = argv[i]
        if a in ("-o", "--out_dir"):
            out_dir, i = Path(argv[i + 1]), i + 2
            continue
        if a in ("-s", "--show_operations"):
            show = True
        elif not a.startswith("-"):
            rest.append(a)
        elif a in ("-n", "--num_segments", "-t", "--timeout_sec"):
            i += 1
        i += 1
    print(f"Edge TPU Compiler version {VERSION}")
    if len(rest) != 1:
        print("ERROR: expected exactly one model file", file=sys.stderr)
        return 1
    if os.environ.get("EDGETPU_STANDIN_FAIL"):
        print(
            "ERROR: Attempting to use a delegate that only supports static-sized tensors with a graph that has "
            "dynamic-sized tensors.\nCompilation failed!",
            flush=True,
        )
        return 1
    src = Path(rest[0])
    out, log, ops = compile_model(src, out_dir)
    total = sum(ops.values())
    log.write_text(f"Edge TPU Compiler version {VERSION}\nInput: {src}\nOutput: {out}\n\n{table(ops)}")
    print(
        f"Started a compilation timeout timer of 180 seconds.\n\nModel compiled successfully in 12 ms.\n\n"
        f"Input model: {src}\nInput size: {src.stat().st_size / 1024:.2f}KiB\nOutput model: {out}\n"
        f"Output size: {out.stat().st_size / 1024:.2f}KiB\nNumber of Edge TPU subgraphs: 1\n"
        f"Total number of operations: {total}\nOperation log: {log}\n"
    )
    if show:
        print(table(ops))
    else:
        print("See the operation log file for individual operation details.")
    print(
        f"Number of operations that will run on Edge TPU: {total}\nNumber of operations that will run on CPU: 0\n"
        "Compilation child process completed within timeout period.\nCompilation succeeded! "
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
