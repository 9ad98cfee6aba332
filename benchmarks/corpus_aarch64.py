#!/usr/bin/env python3
"""Every arm-xnnpack case of the conformance corpus, verified on emulated aarch64 (issue #22).

    python benchmarks/corpus_aarch64.py [--cpu cortex-a76]... [--model NAME]... [--workdir DIR] [--json FILE]

Each ``arm-xnnpack`` case that ``tests/pipeline/test_corpus.py``'s ``EXPECTED`` table says passes (plus an
int8 and an fp16 case, ``EXTRA``: reduced precisions are where ARM's kernels could differ most) is converted as a user's would
(``edge.pipeline.convert``; kept in ``--workdir`` and reused by name) and then checked with
``edge.verify.isa.verify_isa``: its reference pairs run under ``qemu-aarch64 -cpu CORE`` with the aarch64
LiteRT/XNNPack wheels, and each output's largest difference from the x86 run of the same bundle on the same
inputs is printed, absolute and over the output's range, beside the limit edgekit holds it to
(``edge.verify.isa.isa_limit``) and the cosine against the source model's reference outputs.

Needs ``edgekit toolchain install tflite`` and ``edgekit toolchain install aarch64`` and the corpus models
(``python examples/fetch_pretrained.py``). Every figure is from emulation: numerics only, never speed (the wall
time printed at the end is what the check costs on this host, not the model's latency anywhere).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

sys.path.insert(0, str(C.REPO))
from tests.pipeline.test_corpus import EXPECTED  # noqa: E402
from tests.support.corpus import CORPUS  # noqa: E402

#: beyond the table: an int8 bundle (generated calibration), where ARM's and x86's requantisation may round apart,
#: and an fp16 one (ARM cores from the A76 on have fp16 arithmetic, which x86 XNNPack does not use)
EXTRA: tuple[tuple[str, str, str, str], ...] = (
    ("ppocr-cls", "arm-xnnpack", "int8", "pass"),
    ("ppocr-cls", "arm-xnnpack", "fp16", "pass"),
)


def cases(models: list[str] | None) -> list[tuple[str, str]]:
    out = [
        (name, precision)
        for name, target, precision, expected in (*EXPECTED, *EXTRA)
        if target == "arm-xnnpack" and expected == "pass" and CORPUS[name].source_format != "gguf"
    ]
    return [c for c in out if not models or c[0] in models]


def build(name: str, precision: str, work: Path) -> Path:
    """The case's bundle in ``work`` (converted once; reused by name)."""
    from edge.bundle.bundle import Bundle
    from edge.pipeline import convert

    out = work / f"{name}-arm-xnnpack-{precision}"
    if (out / "manifest.json").is_file():
        Bundle.open(out)
        return out
    m = CORPUS[name]
    request = m.convert_request("arm-xnnpack").replace(
        precision=precision, calib="random" if precision.startswith("int8") else None
    )
    convert(m.path, "arm-xnnpack", out, request, force=True)
    return out


def main() -> int:
    C.print_measured_on()  # the CPU's ISA class and the load, with every figure
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="append", help="emulated core(s) (default: cortex-a76)")
    p.add_argument("--model", action="append", help="only these corpus models")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    p.add_argument("--workdir", metavar="DIR", help="keep bundles here (default: a temporary directory)")
    args = p.parse_args()
    from edge.verify.isa import verify_isa

    cpus = args.cpu or ["cortex-a76"]
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    with C.workdir(args.workdir) as work:
        for name, precision in cases(args.model):
            if not CORPUS[name].path.is_file():
                print(f"{name}: missing ({CORPUS[name].file}): python examples/fetch_pretrained.py", file=sys.stderr)
                continue
            print(f"{name} {precision}: converting / checking on {', '.join(cpus)} (emulated)", file=sys.stderr)
            bundle = build(name, precision, work)
            for cpu in cpus:
                try:
                    ev = verify_isa(bundle, cpu=cpu)
                except Exception as e:  # noqa: BLE001 - a row says what happened
                    rows.append(
                        {"model": name, "precision": precision, "cpu": cpu, "error": f"{type(e).__name__}: {e}"}
                    )
                    continue
                for o in ev["outputs"]:
                    rows.append(
                        {
                            "model": name,
                            "precision": precision,
                            "cpu": cpu,
                            "output": o["name"],
                            "samples": ev["samples"],
                            "range": o["range"],
                            "max_abs_vs_x86": o["max_abs_vs_host"],
                            "relative": o["max_abs_vs_host"] / o["range"] if o["range"] > 0 else None,
                            "limit": o["limit"],
                            "passed": o["passed"],
                            "cosine_vs_reference": o["cosine"],
                            "reference_check": ev["reference_check"],
                            "runtime": ev["runtime"],
                            "emulator": ev["emulator"],
                        }
                    )
                if args.json:  # as it goes: a long run that stops keeps what it measured
                    Path(args.json).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    header = [
        "model",
        "precision",
        "core (emulated)",
        "output",
        "pairs",
        "range",
        "max |ARM-x86|",
        "of range",
        "limit",
        "ok",
        "cosine vs source",
    ]
    table = [
        [
            r["model"],
            r["precision"],
            r["cpu"],
            r.get("output", "ERROR"),
            str(r.get("samples", "")),
            f"{r['range']:.4g}" if "range" in r else "",
            f"{r['max_abs_vs_x86']:.3g}" if "range" in r else "",
            f"{r['relative']:.2g}" if r.get("relative") is not None else "",
            f"{r['limit']:.3g}" if "limit" in r else "",
            ("pass" if r.get("passed") else "FAIL") if "range" in r else r["error"][:120],
            f"{r['cosine_vs_reference']:.6f}" if r.get("cosine_vs_reference") else "",
        ]
        for r in rows
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for row in table:
        print("| " + " | ".join(row) + " |")
    print(
        f"\nall figures emulated (qemu user mode; numerics only, never speed); {len(rows)} rows in "
        f"{time.monotonic() - t0:.0f} s on {C.host_info().get('cpu', '?')}",
        file=sys.stderr,
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0 if all(r.get("passed") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
