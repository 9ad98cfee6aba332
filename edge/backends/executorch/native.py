"""edgekit's C interface to ExecuTorch's C++ runtime: ``edgekit_executorch.cpp`` built against the headers and
libraries the ``executorch`` wheel ships (``executorch/include``, ``executorch/lib/libexecutorch*.so``), so a device
runs a ``.pte`` with XNNPack from Python through ctypes, without torch.

Why: executorch 1.5.1's own Python runtime (``executorch.runtime``) links libtorch; on aarch64 the only torch 2.13
PyPI serves is a CUDA 13 build whose NVIDIA libraries this registry does not even carry (docs/executorch.md), while
the runtime libraries in the same wheel need nothing but libc and libstdc++.

Where it goes: ``<site-packages>/edgekit_executorch_native/`` beside the ``executorch`` package it was built
against (:func:`native_dir`), with ``build.json`` recording the executorch version, the source's sha256 and the
machine; the runner refuses a library that does not match (:func:`library_problem`). Built explicitly, never at run
time: ``python -m edge.backends.executorch.native build`` (``install-device.sh --runtime executorch`` runs it on the
device; ``edgekit toolchain install aarch64-executorch`` cross-builds it for the emulated device).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from edge.errors import EdgeError, MissingDependencyError

SOURCE = Path(__file__).resolve().with_name("edgekit_executorch.cpp")
LIB_NAME = "libedgekit_executorch.so"
DIR_NAME = "edgekit_executorch_native"
STAMP = "build.json"
#: the wheel's runtime libraries the interface links (XNNPack delegate, optimized and portable kernels); linked
#: --no-as-needed: the kernels and the delegate register themselves when their library loads
LIBS = ("executorch", "executorch_backend_xnnpack", "executorch_kernels_optimized", "executorch_threadpool")
BUILD_COMMAND = "python -m edge.backends.executorch.native build"


def source_sha256() -> str:
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()


def executorch_dir() -> Path | None:
    """The installed ``executorch`` package's directory, found without importing it (its ``__init__`` may pull
    torch in); None where it is not installed."""
    try:
        spec = importlib.util.find_spec("executorch")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


def executorch_version(et_dir: Path) -> str | None:
    """The version of the ``executorch`` distribution installed beside ``et_dir`` (its dist-info)."""
    found = sorted(et_dir.parent.glob("executorch-*.dist-info"))
    return found[-1].name[len("executorch-") : -len(".dist-info")] if found else None


def native_dir(et_dir: Path) -> Path:
    return et_dir.parent / DIR_NAME


def library_problem(et_dir: Path | None, machine: str | None = None) -> str | None:
    """None when edgekit's interface is built for the ``executorch`` at ``et_dir`` (this version, this source,
    this machine), else what is wrong and how to build it."""
    if et_dir is None:
        return "the executorch package is not installed"
    missing = [f"lib{n}.so" for n in LIBS if not (et_dir / "lib" / f"lib{n}.so").is_file()]
    if missing:
        return f"the executorch package at {et_dir} lacks its runtime libraries ({', '.join(missing)})"
    lib, stamp = native_dir(et_dir) / LIB_NAME, native_dir(et_dir) / STAMP
    if not lib.is_file() or not stamp.is_file():
        return f"edgekit's ExecuTorch interface is not built ({lib}); build it with: {BUILD_COMMAND}"
    try:
        built = json.loads(stamp.read_text(encoding="utf-8")[: 1 << 16])
    except (OSError, ValueError):
        built = {}
    want = {
        "executorch": executorch_version(et_dir),
        "source_sha256": source_sha256(),
        "machine": machine or platform.machine(),
    }
    stale = [k for k, v in want.items() if not isinstance(built, dict) or built.get(k) != v]
    if stale:
        return f"edgekit's ExecuTorch interface at {lib} was built for another {', '.join(stale)}; rebuild it: {BUILD_COMMAND}"
    return None


def build(
    et_dir: Path,
    *,
    cxx: str = "c++",
    machine: str | None = None,
    runtime_dir: str | None = None,
    timeout_s: float = 600.0,
) -> Path:
    """Compile the interface against the ``executorch`` at ``et_dir`` into :func:`native_dir`. ``cxx``: the
    compiler (a cross compiler for another ``machine``); ``runtime_dir``: where the executorch package is at run
    time when that differs from ``et_dir`` (a guest root's path): the library finds the wheel's libraries there."""
    version = executorch_version(et_dir)
    if version is None or not (et_dir / "include" / "executorch").is_dir():
        raise MissingDependencyError(
            f"no executorch wheel with its headers at {et_dir}", hint="pip install --no-deps 'executorch==1.5.1'"
        )
    out = native_dir(et_dir)
    out.mkdir(parents=True, exist_ok=True)
    lib_dir = f"{runtime_dir or et_dir}/lib"
    inc = et_dir / "include"
    cmd = [
        cxx,
        "-std=c++17",
        "-O2",
        "-shared",
        "-fPIC",
        "-DC10_USING_CUSTOM_GENERATED_MACROS",  # the wheel's c10 headers without torch's generated cmake_macros.h
        f"-I{inc}",
        f"-I{inc / 'executorch/runtime/core/portable_type/c10'}",
        str(SOURCE),
        f"-L{et_dir / 'lib'}",
        "-Wl,--no-as-needed",
        *(f"-l{n}" for n in LIBS),
        "-Wl,--as-needed",
        f"-Wl,-rpath,{lib_dir}",
        "-o",
        str(out / f".{LIB_NAME}.{os.getpid()}"),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise MissingDependencyError(
            f"no C++ compiler {cxx!r} to build edgekit's ExecuTorch interface", hint="apt install g++"
        ) from None
    if proc.returncode != 0:
        raise EdgeError(
            f"building edgekit's ExecuTorch interface failed: {(proc.stderr.strip().splitlines() or ['?'])[-1][:300]}"
        )
    os.replace(out / f".{LIB_NAME}.{os.getpid()}", out / LIB_NAME)
    stamp = {"executorch": version, "source_sha256": source_sha256(), "machine": machine or platform.machine()}
    (out / STAMP).write_text(json.dumps({**stamp, "compiler": cxx}) + "\n", encoding="utf-8")
    return out / LIB_NAME


def main(argv: list[str] | None = None) -> int:
    """``build`` the interface for the executorch installed here (or in ``--site DIR``: a guest's, with a cross
    ``--cxx`` for its ``--machine``); ``check`` says whether it is built for it (exit 0) or what is wrong (exit 1)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m edge.backends.executorch.native")
    ap.add_argument("command", choices=("build", "check"))
    ap.add_argument("--cxx", default=os.environ.get("CXX", "c++"), help="the C++ compiler (default $CXX or c++)")
    ap.add_argument(
        "--site", type=Path, help="a site directory holding the executorch package (default: this Python's)"
    )
    ap.add_argument("--machine", help="the machine it runs on (default: this one)")
    args = ap.parse_args(argv)
    et_dir = args.site / "executorch" if args.site is not None else executorch_dir()
    if args.command == "check":
        problem = library_problem(et_dir, args.machine)
        print(problem or "ok")
        return 1 if problem else 0
    try:
        if et_dir is None:
            raise MissingDependencyError(
                "the executorch package is not installed here", hint="pip install --no-deps 'executorch==1.5.1'"
            )
        lib = build(et_dir, cxx=args.cxx, machine=args.machine)
    except EdgeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"built {lib} for executorch {executorch_version(et_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
