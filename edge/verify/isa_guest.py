"""The device half of ``edgekit verify --isa``: run a bundle's reference inputs on this machine's runner.

``python -m edge.verify.isa_guest BUNDLE OUT.npz [OPTIONS_JSON]`` opens the bundle (hashes checked), runs every
reference input through the runner its manifest names (``OPTIONS_JSON``: only ``{"delegate": "xnnpack"}``, a Coral
bundle's CPU int8 path) (the real runtime of this machine: under ``qemu-aarch64`` the
aarch64 LiteRT/XNNPack or onnxruntime/MLAS wheels), writes the outputs to ``OUT.npz`` (``o<s>_<k>``: sample
s, output k, in the bundle's I/O order) and prints one JSON line: the runner's info, the machine, Python and
runtime versions, and the ARM core ``/proc/cpuinfo`` names. The build host judges the outputs
(``edge.verify.isa``): this side computes, it does not decide.

Progress goes to stderr, one line per step (:data:`PROGRESS` then JSON, flushed): ``{"done": 0, "of": n}`` once the
runner is open (the guest's start-up is over), then ``{"done": k, "of": n}`` after each sample. The host relays them
and bounds the run by the measured time per sample (``edge.verify.isa.run_bound``).

Device side: imports what ``edgekit run`` imports (the bundle reader, the runner, numpy), never build-host code.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

from edge.bundle.bundle import Bundle
from edge.errors import EdgeError
from edge.verify.refpairs import load_reference_pairs, runner_json

#: the prefix of a progress line on stderr (module docstring)
PROGRESS = "edgekit-isa-progress "

#: distributions whose versions the evidence names
RUNTIMES = ("ai-edge-litert", "onnxruntime", "numpy")


def cpu_part() -> str | None:
    """``CPU part`` of the first core in /proc/cpuinfo (ARM's part number: 0xd0b is a Cortex-A76), if any."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")[: 1 << 16]
    except OSError:
        return None
    parts = [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("CPU part") and ":" in ln]
    return parts[0][:16] if parts else None


def versions() -> dict[str, str]:
    out = {}
    for d in RUNTIMES:
        try:
            out[d] = md.version(d)
        except md.PackageNotFoundError:
            pass
    return out


#: the only runner option the build host may override here: LiteRT's delegate, for a Coral bundle's CPU int8 path
_OVERRIDES = {"delegate": ("xnnpack",)}


def progress(done: int, of: int) -> None:
    """One progress line on stderr: ``done`` of ``of`` samples computed (0: the runner is open)."""
    print(PROGRESS + json.dumps({"done": done, "of": of}), file=sys.stderr, flush=True)


def run(bundle_path: str, out_npz: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    bundle = Bundle.open(bundle_path, trust=False)  # the build host's own bundle; its hashes still must hold
    entry = bundle.info.reference_pairs
    if entry is None or entry.file is None:
        raise EdgeError(
            f"bundle {bundle_path} carries no reference pairs to run",
            hint="rebuild it with `edgekit convert` (reference pairs are written by default)",
        )
    pairs = load_reference_pairs(bundle.path, entry, bundle.io)
    names = [t.name for t in bundle.io.outputs]
    arrays: dict[str, np.ndarray] = {}
    bad = {k: v for k, v in (options or {}).items() if v not in _OVERRIDES.get(k, ())}
    if bad:
        raise EdgeError(f"runner options {bad} may not be overridden here")
    with bundle.open_runner(options) as runner:
        progress(0, len(pairs.inputs))
        for s, feeds in enumerate(pairs.inputs):
            got = runner.infer(feeds)
            for k, n in enumerate(names):
                arrays[f"o{s}_{k}"] = np.asarray(got[n])
            progress(s + 1, len(pairs.inputs))
        info = runner_json(runner)
    with open(out_npz, "xb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]
    return {
        "bundle_id": bundle.id,
        "samples": len(pairs.inputs),
        "runner": info,
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpu_part": cpu_part(),
        "versions": versions(),
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3):
        print(json.dumps({"error": "usage: python -m edge.verify.isa_guest BUNDLE OUT.npz [OPTIONS_JSON]"}))
        return 2
    try:
        options = json.loads(args[2]) if len(args) == 3 else None
        if options is not None and not isinstance(options, dict):
            raise EdgeError("OPTIONS_JSON is not a JSON object")
        result = run(args[0], args[1], options)
    except EdgeError as e:
        print(json.dumps({"error": str(e)}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
