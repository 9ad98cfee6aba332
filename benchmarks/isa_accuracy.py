#!/usr/bin/env python3
"""Accuracy of the pretrained PP-OCR direction classifier through target/precision pairs, on this CPU.

The figures behind docs/design-notes.md, "Machines differ": bundle accuracy on N held-out synthetic text lines,
agreement with the fp32 source, and the parity gate's mean/worst cosine. Run it natively, and
under another CPU's ISA with user-mode emulation (slow: minutes per int8 conversion):

    python benchmarks/isa_accuracy.py 240 x86-cpu:int8 intel-igpu:int8
    qemu-x86_64 -cpu EPYC-Rome .venv/bin/python benchmarks/isa_accuracy.py 240 x86-cpu:int8 intel-igpu:int8

Needs the model from ``python examples/fetch_pretrained.py``. ``--targets-dir`` adds profiles
(e.g. a copy of intel-igpu with another ``nncf_overflow_fix``). One JSON line per pair.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edge.capabilities import cpu_isa, measured_on  # noqa: E402
from edge.graph.samples import write_text_line_images  # noqa: E402
from edge.pipeline import convert  # noqa: E402
from edge.pipeline.request import ConvertRequest
from edge.preprocess import Preprocessor, read_image  # noqa: E402
from edge.verify.parity import reference_outputs  # noqa: E402
from tests.pipeline.test_pretrained import MODEL, static_source  # noqa: E402


def main() -> None:
    print("measured on " + measured_on(), file=sys.stderr)  # the CPU's ISA class and the load
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("n", type=int, help="held-out text lines")
    ap.add_argument("pairs", nargs="+", help="TARGET:PRECISION, e.g. intel-igpu:int8")
    ap.add_argument("--targets-dir", action="append", default=[])
    args = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="isa-accuracy-"))
    calib = d / "calib"
    write_text_line_images(calib, 32, seed=0)
    held = write_text_line_images(d / "eval", args.n, seed=1)
    truth = np.array([p.name.startswith("rot180") for p in held])
    feeds = source = None
    print(json.dumps({"cpu": cpu_isa().describe()}), flush=True)
    for pair in args.pairs:
        target, precision = pair.split(":")
        t = time.perf_counter()
        b = convert(
            MODEL,
            target,
            d / f"{target}-{precision}",
            ConvertRequest(
                precision=precision,
                calib=calib if precision == "int8" else None,
                input_shapes={"x": (1, 3, 48, 192)},
                preprocess="ppocr",
                accept_parity_failure=True,
                targets_dir=args.targets_dir,
            ),
        )
        if feeds is None:
            pre = Preprocessor(b.preprocess)
            feeds = [{"x": pre(read_image(p))[0]} for p in held]
            source = np.array(
                [
                    np.argmax(o["save_infer_model/scale_0.tmp_1"][0]) == 1
                    for o in reference_outputs(static_source(d), feeds)
                ]
            )
        with b.open_runner() as r:
            got = np.array([np.argmax(next(iter(r.infer(f).values()))[0]) == 1 for f in feeds])
        par = b.manifest["parity"]
        o = par["outputs"][0]
        print(
            json.dumps(
                {
                    "target": target,
                    "precision": precision,
                    "n": args.n,
                    "source_acc": round(float((source == truth).mean()), 4),
                    "acc": round(float((got == truth).mean()), 4),
                    "agree": round(float((got == source).mean()), 4),
                    "parity_passed": par["passed"],
                    "cosine": round(o["cosine"], 5),
                    "cosine_worst": round(o["cosine_min"], 4),
                    "precision_used": par["candidate"]["precision_used"],
                    "seconds": round(time.perf_counter() - t, 1),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
