#!/usr/bin/env python3
"""Write the example MobileNetV2 (deterministic random weights) used by the demos.

    python examples/build_models.py                        # -> examples/models/mobilenetv2.onnx
    python examples/build_models.py -o /tmp/m.onnx --seed 1 --input-size 160 --num-classes 10

Offline: the model is generated with onnx + numpy by ``edge.graph.samples``; same arguments,
same bytes. See examples/models/README.md for its input spec.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

try:
    from edge.graph.samples import build_mobilenet_v2
except ModuleNotFoundError as exc:  # run from a checkout without `pip install -e .`
    if exc.name != "edge":
        raise
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from edge.graph.samples import build_mobilenet_v2

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "models" / "mobilenetv2.onnx"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "-o", "--output", type=Path, default=DEFAULT_OUTPUT, help="where to write the model (default: %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--input-size", type=int, default=224)
    parser.add_argument("--width-mult", type=float, default=1.0)
    parser.add_argument("--opset", type=int, default=17)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    path = build_mobilenet_v2(
        args.output,
        num_classes=args.num_classes,
        input_size=args.input_size,
        width_mult=args.width_mult,
        seed=args.seed,
        opset=args.opset,
    )
    elapsed = time.perf_counter() - start
    data = path.read_bytes()
    print(f"wrote  {path}")
    print(f"size   {len(data):,} bytes")
    print(f"sha256 {hashlib.sha256(data).hexdigest()}")
    print(
        f"built in {elapsed:.2f} s (seed {args.seed}, {args.input_size}x{args.input_size}, "
        f"{args.num_classes} classes, width {args.width_mult}, opset {args.opset})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
