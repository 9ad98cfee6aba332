"""The ``aarch64-executorch`` toolchain: ExecuTorch's aarch64 runtime for the emulated device (``aarch64``), so
``edgekit verify BUNDLE --isa aarch64`` runs an executorch-xnnpack bundle's reference pairs on the ARM instruction
set with the real aarch64 XNNPack and ExecuTorch kernels.

``edgekit toolchain install aarch64-executorch`` lays out, under ``<toolchains root>/aarch64-executorch``:

* ``site/executorch``: the aarch64 ``executorch`` wheel (pinned by sha256), installed by the host pip with
  ``--platform``/``--target`` and ``--no-deps``: the device runner needs only its runtime libraries (libc and
  libstdc++), never torch (``edge.backends.executorch.native``);
* ``site/edgekit_executorch_native``: edgekit's C interface to that runtime, cross-built with the host's
  ``aarch64-linux-gnu-g++`` (Debian: ``apt install g++-aarch64-linux-gnu``) against the wheel's headers, exactly as
  a device builds it with its own compiler;
* the same interface built for this x86-64 host inside the ``executorch`` toolchain's environment, so the check's
  x86 side runs the bundle through the same runner code (``host_python``).

It needs the ``aarch64`` and ``executorch`` toolchains first. The build calls ``python -m
edge.backends.executorch.native`` (the toolchains sit below the backends: a subprocess, not an import).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import edge
from edge.base.typedjson import UnreadableFile, read_json_file
from edge.errors import EdgeError, MissingDependencyError
from edge.toolchains import aarch64
from edge.toolchains.state import STATE_FILE, ToolchainStatus, root, run_logged

NAME = "aarch64-executorch"
#: the aarch64 wheel of the executorch toolchain's executorch, sha256-pinned (pip's hash-checking mode)
WHEEL = "executorch==1.5.1 --hash=sha256:8ee02348a3ea80ddf770822911ebf78da616b73afce0fbaaa79f23311c88c66a"
CROSS_CXX = "aarch64-linux-gnu-g++"
HOST_CXX = "c++"
RUNNER = "executorch"  # the runner whose aarch64 runtime this adds to the emulator
SIZE_HINT = (
    "about 65 MB on disk, under a minute (needs the aarch64 and executorch toolchains, and g++-aarch64-linux-gnu)"
)
_SOURCE = Path(edge.__file__).resolve().parent / "backends" / "executorch" / "edgekit_executorch.cpp"

Output = Callable[[str], None]


def toolchain_dir() -> Path:
    return root() / NAME


def guest_site() -> Path:
    return toolchain_dir() / "site"


def host_python(executorch: ToolchainStatus) -> Path:
    """The executorch toolchain's Python (``executorch``: its status): the check's x86 side runs the runner there."""
    return executorch.venv / "bin" / "python"


def spec_hash() -> str:
    return hashlib.sha256("\n".join((WHEEL, aarch64.GUEST_PYTHON, *aarch64.PLATFORMS)).encode()).hexdigest()


def host_problems(executorch: ToolchainStatus) -> list[str]:
    """What keeps this host from installing it (every problem, not the first); ``executorch``: that toolchain's
    status."""
    found = [
        st.problem or f"toolchain {st.name!r} is not usable" for st in (aarch64.status(), executorch) if not st.usable
    ]
    missing = [c for c in (CROSS_CXX, HOST_CXX) if shutil.which(c) is None]
    if missing:
        found.append(f"{', '.join(missing)} missing (apt install g++-aarch64-linux-gnu g++)")
    return found


def status() -> ToolchainStatus:
    d = toolchain_dir()
    st = ToolchainStatus(name=NAME, path=d, installed=False)
    again = f"reinstall with: edgekit toolchain install {NAME} --force"
    try:
        state = read_json_file(d / STATE_FILE, what="toolchain state", max_bytes=1 << 20, max_depth=8)
    except UnreadableFile:
        st.problem = f"toolchain {NAME!r} is not installed at {d}; install it with: edgekit toolchain install {NAME} ({SIZE_HINT})"
        return st
    st.installed = True
    if not isinstance(state, dict):
        st.problem = f"{d / STATE_FILE} is not a toolchain state; {again}"
        return st
    st.python, st.packages = aarch64.GUEST_PYTHON, dict(state.get("packages") or {})
    st.created_utc, st.install_seconds = state.get("created_utc"), state.get("install_seconds")
    st.lock_hash, st.reference_lock, st.matches_reference = state.get("lock_hash"), True, True
    if state.get("spec_hash") != spec_hash():
        st.problem = f"toolchain {NAME!r} at {d} was installed from another version of its spec; {again}"
    elif state.get("source_sha256") != hashlib.sha256(_SOURCE.read_bytes()).hexdigest():
        st.problem = f"edgekit's ExecuTorch interface changed since {NAME!r} was built; {again}"
    elif not (guest_site() / "executorch" / "lib" / "libexecutorch.so").is_file():
        st.problem = f"{guest_site()} lacks the executorch wheel's runtime; {again}"
    return st


def install(
    executorch: ToolchainStatus, *, force: bool = False, on_step: Output | None = None, on_output: Output | None = None
) -> ToolchainStatus:
    """Lay out the aarch64 executorch runtime and build edgekit's interface for the guest and for this host
    (``executorch``: the executorch toolchain's status, whose environment gets the host's build)."""
    say = on_step or (lambda _line: None)
    cannot = host_problems(executorch)
    if cannot:
        raise MissingDependencyError(f"toolchain {NAME!r} cannot be installed on this host: {'; '.join(cannot)}")
    current = status()
    d = current.path
    if current.usable and not force:
        say(f"toolchain {NAME!r} is already installed at {d}; use --force to reinstall")
        return current
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    t0 = time.perf_counter()
    with open(d / "install.log", "w", encoding="utf-8") as log:
        say(f"the aarch64 executorch wheel by the host pip (--no-deps, sha256-checked): {WHEEL.split()[0]}")
        _install_wheel(guest_site(), log, on_output)
        here = str(Path(edge.__file__).resolve().parent.parent)
        env = {**os.environ, "PYTHONPATH": here}
        native = [sys.executable, "-m", "edge.backends.executorch.native", "build"]
        say(f"edgekit's ExecuTorch interface for the guest ({CROSS_CXX})")
        run_logged(
            [*native, "--cxx", CROSS_CXX, "--machine", "aarch64", "--site", str(guest_site())], log, None, env=env
        )
        say(f"edgekit's ExecuTorch interface for this host, in the executorch toolchain ({HOST_CXX})")
        run_logged([str(host_python(executorch)), *native[1:], "--cxx", HOST_CXX], log, None, env=env)
        say("checking the guest: the interface loads under emulation and finds XnnpackBackend")
        seen = probe()
    packages = {p.name.split("-")[0]: p.name[:-10].split("-")[1] for p in guest_site().glob("*.dist-info")}
    state: dict[str, Any] = {
        "name": NAME,
        "kind": "emulator-addon",
        "spec_hash": spec_hash(),
        "requirements": [WHEEL.split()[0]],
        "packages": packages,
        "lock_hash": hashlib.sha256(json.dumps(packages, sort_keys=True).encode()).hexdigest(),
        "source_sha256": hashlib.sha256(_SOURCE.read_bytes()).hexdigest(),
        "guest": seen,
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "install_seconds": round(time.perf_counter() - t0, 1),
        "disk_bytes": aarch64.disk_bytes(d),
        "edgekit_version": edge.__version__,
    }
    (d / f".{STATE_FILE}.tmp").write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    os.replace(d / f".{STATE_FILE}.tmp", d / STATE_FILE)
    say(f"installed toolchain {NAME!r} at {d} in {state['install_seconds']:.0f} s, {state['disk_bytes'] / 1e6:.0f} MB")
    return status()


def _install_wheel(site: Path, log: Any, on_output: Output | None) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PIP_TARGET", "PIP_PREFIX")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    plats = [a for p in aarch64.PLATFORMS for a in ("--platform", p)]
    abi = "cp" + aarch64.GUEST_PYTHON.replace(".", "")
    with tempfile.TemporaryDirectory(prefix="edgekit-aarch64-et-") as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(WHEEL + "\n", encoding="utf-8")
        cmd = [sys.executable, "-m", "pip", "install", "--no-input", "--progress-bar", "off", "--no-deps"]
        cmd += ["--only-binary=:all:", *plats, "--python-version", aarch64.GUEST_PYTHON, "--implementation", "cp"]
        cmd += ["--abi", abi, "--target", str(site), "--require-hashes", "-r", str(req)]
        run_logged(cmd, log, on_output, env=env)


_PROBE = """
import json, platform
from edge.backends.executorch import native
from edge.backends.executorch.run import load_interface
et = native.executorch_dir()
problem = native.library_problem(et)
lib = None if problem else load_interface(native.native_dir(et) / native.LIB_NAME)
print(json.dumps({'machine': platform.machine(), 'problem': problem, 'executorch': native.executorch_version(et),
                  'xnnpack': bool(lib and lib.ek_et_has_backend(b'XnnpackBackend'))}))
"""


def probe(timeout_s: float = 600.0) -> dict[str, Any]:
    """Load the interface in the guest; what it reports (machine, executorch version, XNNPack present)."""
    here = Path(edge.__file__).resolve().parent.parent
    out = aarch64.require().run("-c", _PROBE, timeout_s=timeout_s, pythonpath=(guest_site(), here))
    lines = out.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if out.returncode == 0 and lines else {}
    if result.get("machine") != "aarch64" or result.get("problem") or not result.get("xnnpack"):
        why = result.get("problem") or (out.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise EdgeError(f"the emulated aarch64 Python could not use ExecuTorch's runtime: {why}")
    return result


def describe() -> str:
    st = status()
    if not st.usable:
        return st.problem or f"toolchain {NAME!r} is not usable"
    return (
        f"ready: executorch {st.packages.get('executorch', '?')} (aarch64) with edgekit's interface, built for the "
        f"guest and for this {platform.machine()} host"
    )
