"""Toolchain environments: heavy converter stacks in virtual environments of their own.

onnx2tf 1.29 pins tensorflow 2.19, numpy 1.26, onnx 1.19, onnxruntime 1.23 and protobuf 4;
installed beside edgekit's runtimes it downgrades them and breaks TensorFlow's own
requirements. So such a stack lives in a separate venv that edgekit creates only when asked
(``edgekit toolchain install NAME``; never during a conversion), drives as a subprocess,
and whose exact package set is hashed (``lock_hash``: sha256 of ``pip freeze --all``) into
every manifest it produces.

Location: ``$EDGEKIT_TOOLCHAINS/<name>`` or, by default, ``<user cache>/edgekit/toolchains/<name>``
(``$XDG_CACHE_HOME`` or ``~/.cache``), holding ``venv/``, ``install.log`` and ``toolchain.json``
(written last: a directory without it is an unfinished install). The venv is made with the
Python running edgekit. Each spec carries a reference lock (``<name>.lock``, the full
``pip freeze`` of a verified install on ``lock_platform``) used as pip constraints on that
platform, so installs there are identical; elsewhere only the top-level pins apply and the
recorded lock hash says what was installed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from edge.base.typedjson import UnreadableFile, read_json_file
from edge.errors import EdgeError, MissingDependencyError, did_you_mean
from edge.toolchains import aarch64, aarch64_executorch
from edge.toolchains.state import ENV_VAR, STATE_FILE, ToolchainStatus, lock_hash, lock_lines, permission_problem, root  # noqa: F401 - re-exported: callers and tests use these names here
from edge.toolchains.state import run_logged as _run

_HERE = Path(__file__).resolve().parent

Output = Callable[[str], None]


@dataclass(frozen=True)
class ToolchainSpec:
    name: str
    purpose: str
    requirements: tuple[str, ...]  # top-level pins, exactly as given to pip
    lock: str  # file in this package: full `pip freeze` of a verified install on lock_platform
    lock_platform: str  # "linux-x86_64-cp311"
    python_min: tuple[int, int]
    python_max: tuple[int, int]  # inclusive
    imports: tuple[str, ...]  # must import after install
    programs: tuple[str, ...]  # must exist in venv/bin (called by PATH)
    versions: tuple[str, ...]  # distributions whose versions converters record
    size_hint: str
    #: names it had before (still accepted everywhere a name is, and an install made under one is used as it is:
    #: a venv cannot be moved)
    former_names: tuple[str, ...] = ()
    #: "venv": a virtual environment of this host's Python (above); "emulator": ``edge.toolchains.aarch64``
    #: (qemu, an arm64 root and aarch64 wheels), installed and checked by that module
    kind: str = "venv"
    #: installed after ``requirements`` with ``--no-deps --require-hashes`` (pip's hash-checking mode: each line
    #: carries the sha256 of every wheel it may fetch): a package whose declared pins cannot be met here (rknn-toolkit2
    #: declares torch<=2.4.0, whose CPU wheel only download.pytorch.org serves), its real dependencies listed in
    #: ``requirements`` instead
    no_deps: tuple[str, ...] = ()
    #: ``pip check`` lines that a ``no_deps`` package's declared pins produce, accepted word for word (any other
    #: line still fails the install); each must be backed by a test that the package works as installed
    accepted_conflicts: tuple[str, ...] = ()

    @property
    def lock_text(self) -> str:
        return (_HERE / self.lock).read_text(encoding="utf-8")

    @property
    def spec_hash(self) -> str:
        """Changes when the pins or the reference lock change (an install from an older spec is outdated)."""
        h = hashlib.sha256("\n".join(self.requirements).encode())
        if self.no_deps or self.accepted_conflicts:  # only where present: older specs keep their hash
            h.update("\n".join((*self.no_deps, *self.accepted_conflicts)).encode())
        h.update("\n".join(lock_lines(self.lock_text.splitlines())).encode())  # comments do not count
        return h.hexdigest()

    @property
    def install_command(self) -> str:
        return f"edgekit toolchain install {self.name}"


TOOLCHAINS: dict[str, ToolchainSpec] = {
    "tflite": ToolchainSpec(
        name="tflite",
        purpose="ONNX -> TFLite (onnx2tf + TensorFlow) for the onnx->tflite converter; TFLite -> ONNX (tf2onnx) for tflite->onnx",
        # onnx2tf's own exact pins (1.29.24 is the newest release for Python < 3.12; 2.x needs >= 3.12).
        # (the same versions onnx2tf pins itself, written out so the stack is readable here).
        # tf2onnx 1.17.0 (newest) needs only numpy>=1.23.5, onnx>=1.14, protobuf>=3.20, flatbuffers>=1.12 and
        # requests, all already in the lock at these versions: it adds itself and nothing else (pip check clean).
        requirements=(
            "onnx2tf==1.29.24",
            "tensorflow==2.19.0",
            "tf-keras==2.19.0",
            "onnxsim==0.4.36",
            "onnx==1.19.1",
            "onnxruntime==1.23.0",
            "numpy==1.26.4",
            "protobuf==4.25.5",
            "tf2onnx==1.17.0",
        ),
        lock="tflite.lock",
        lock_platform="linux-x86_64-cp311",
        python_min=(3, 10),
        python_max=(3, 12),  # tensorflow 2.19 has no wheels for 3.13
        imports=("onnx2tf", "tensorflow", "tf_keras", "onnxsim", "onnxruntime", "tf2onnx"),
        programs=("onnxsim",),
        versions=("onnx2tf", "tensorflow", "onnxsim", "onnx", "onnxruntime", "tf2onnx"),
        size_hint="about 2.6 GB on disk, 1.5-3 min with a warm network",
    ),
    "torch": ToolchainSpec(
        name="torch",
        purpose="PyTorch CPU + coremltools + onnx for torch->onnx, torch->coreml and onnx->coreml",
        # torch: the CPU wheel (its CUDA build is several GB); coremltools 9.0 is the newest release.
        # No torchvision: edgekit's own bridge (edge/toolchains/coreml_bridge.py) replaces onnx2torch, which needs it
        # (PyPI's torchvision 0.28.0 links the CUDA torch; measured in issue #34: onnx2torch took 4 of 16 corpus models).
        # No onnxscript: torch->onnx uses torch's TorchScript-based exporter (see torch_onnx_driver.py).
        requirements=("torch==2.13.0", "coremltools==9.0", "onnx==1.23.2"),
        lock="torch.lock",
        lock_platform="linux-x86_64-cp311",
        python_min=(3, 10),
        python_max=(3, 13),
        imports=("torch", "coremltools", "onnx"),
        programs=(),
        versions=("torch", "coremltools", "onnx", "numpy"),
        size_hint="about 1.2 GB on disk, about 1 min with the torch CPU wheel available",
        # named for Core ML first; it holds torch, which every PyTorch source needs, whatever the target
        former_names=("coreml",),
    ),
    "vela": ToolchainSpec(
        name="vela",
        purpose="Arm's Vela compiler: full-integer TFLite -> Ethos-U55/U65 TFLite for the tflite->ethos-u converter",
        # ethos-u-vela 5.2.0 (newest) needs numpy and flatbuffers only; its own pins, written out
        requirements=("ethos-u-vela==5.2.0", "flatbuffers==25.12.19", "numpy==2.4.6"),
        lock="vela.lock",
        lock_platform="linux-x86_64-cp311",
        python_min=(3, 10),
        python_max=(3, 13),
        imports=("ethosu.vela",),
        programs=("vela",),
        versions=("ethos-u-vela",),
        size_hint="about 60 MB on disk, about 1 min",
    ),
    "rknn": ToolchainSpec(
        name="rknn",
        purpose="Rockchip's rknn-toolkit2: ONNX -> .rknn (int8, fp16) for the RK3588/RK3576/RK3566 NPUs, and the "
        "toolkit's simulator of the NPU for host parity (onnx->rknn)",
        # rknn-toolkit2 2.5.0 (newest) declares numpy<=1.26.4, onnx<=1.18.0, protobuf<=4.25.4 and torch<=2.4.0. Its
        # dependencies are pinned here at the newest versions its pins allow, except torch: 2.4.0's CPU wheel is only
        # on download.pytorch.org, so the toolkit goes in with --no-deps beside the CPU torch of the torch toolchain
        # (2.13.0; the toolkit imports torch but converts ONNX without it: tests/backends/test_rknn.py converts and
        # simulates a corpus model through this very set). setuptools < 81: the toolkit imports pkg_resources.
        requirements=(
            "torch==2.13.0",
            "numpy==1.26.4",
            "onnx==1.18.0",
            "protobuf==4.25.4",
            "onnxruntime==1.26.0",
            "opencv-python==4.11.0.86",
            "scipy==1.17.1",
            "psutil==7.2.2",
            "ruamel.yaml==0.19.1",
            "tqdm==4.70.1",
            "fast-histogram==0.14",
            "setuptools==80.9.0",
        ),
        no_deps=(
            "rknn-toolkit2==2.5.0"
            " --hash=sha256:7dead4048d60f9cf29dc6017cf0f1dbb30f5f1d4f227c5e2e6739d9fe3e5eec6"  # cp310
            " --hash=sha256:21922dd3037503a2934fea24cbbf6eccda586158178636ae28a2ac658e710055"  # cp311
            " --hash=sha256:037765a9051df0031679b853698da11f36d28333e1d65f0c87516d06ee39eb33",  # cp312
        ),
        accepted_conflicts=(
            "rknn-toolkit2 2.5.0 has requirement torch<=2.4.0,>=1.10.1, but you have torch 2.13.0+cpu.",
        ),
        lock="rknn.lock",
        lock_platform="linux-x86_64-cp311",
        python_min=(3, 10),
        python_max=(3, 12),  # rknn-toolkit2 2.5.0 has cp310-cp312 wheels (x86-64 Linux)
        imports=("rknn.api", "torch", "onnx"),
        programs=(),
        versions=("rknn-toolkit2", "torch", "onnx", "numpy"),
        size_hint="about 1.3 GB on disk, about 1 min with the torch CPU wheel available",
    ),
    "executorch": ToolchainSpec(
        name="executorch",
        purpose="PyTorch's ExecuTorch: a torch.export program -> .pte with the XNNPack delegate "
        "(to_edge_transform_and_lower + XnnpackPartitioner) for torch->executorch, and ExecuTorch's x86 runtime "
        "for host parity",
        # executorch 1.5.1 (newest) declares no torch requirement at all (its README: "install a compatible torch
        # separately"), but its runtime module (extension/pybindings/_C) links libtorch, libtorch_cpu and
        # libtorch_python: torch is pinned here to the CPU wheel the torch toolchain uses (2.13.0+cpu, which pip
        # prefers over PyPI's CUDA 2.13.0 where both are served); export, lowering and the runtime were checked with
        # it (tests/backends/test_executorch.py). Its other requirements (coremltools, pandas, scikit-learn,
        # hydra-core...) come in as it declares them, the whole set held by the reference lock.
        requirements=("torch==2.13.0", "executorch==1.5.1", "torchao==0.18.0", "numpy==2.4.6"),
        lock="executorch.lock",
        lock_platform="linux-x86_64-cp311",
        python_min=(3, 10),
        python_max=(3, 13),
        imports=(
            "torch",
            "executorch.exir",
            "executorch.backends.xnnpack.partition.xnnpack_partitioner",
            "executorch.runtime",
        ),
        programs=(),
        versions=("executorch", "torch", "torchao", "numpy"),
        size_hint="about 1.5 GB on disk, about 1 min with the torch CPU wheel available",
    ),
    "aarch64": ToolchainSpec(
        name="aarch64",
        purpose="an emulated aarch64 device (qemu-user, Debian arm64, the aarch64 LiteRT/onnxruntime wheels) for "
        "`edgekit verify --isa aarch64` and the agent's aarch64 test",
        requirements=aarch64.WHEELS,
        lock=aarch64.LOCK_FILE,
        lock_platform="linux-aarch64-cp311",
        python_min=(3, 10),
        python_max=(3, 14),  # the host's pip only downloads and unpacks
        imports=("numpy", "onnxruntime", "ai_edge_litert.interpreter", "paho.mqtt.client", "cryptography"),
        programs=(),
        versions=("ai-edge-litert", "onnxruntime", "numpy"),
        size_hint=aarch64.SIZE_HINT,
        kind="emulator",
    ),
    "aarch64-executorch": ToolchainSpec(
        name="aarch64-executorch",
        purpose="ExecuTorch's aarch64 runtime (the executorch wheel, no torch) and edgekit's interface to it in the "
        "emulated aarch64 device, for `edgekit verify --isa aarch64` of executorch-xnnpack bundles",
        requirements=(aarch64_executorch.WHEEL.split()[0],),
        lock=aarch64.LOCK_FILE,  # the emulator's own lock: this adds one wheel, sha256-pinned, with no dependencies
        lock_platform="linux-aarch64-cp311",
        python_min=(3, 10),
        python_max=(3, 14),
        imports=(),
        programs=(),
        versions=("executorch",),
        size_hint=aarch64_executorch.SIZE_HINT,
        kind="emulator-addon",
    ),
}


def aliases() -> dict[str, str]:
    """Former name -> the toolchain's name now (``coreml`` -> ``torch``)."""
    return {old: spec.name for spec in TOOLCHAINS.values() for old in spec.former_names}


def get_spec(name: str) -> ToolchainSpec:
    name = aliases().get(name, name)
    if name not in TOOLCHAINS:
        raise EdgeError(
            f"unknown toolchain {name!r}; {did_you_mean(name, [*TOOLCHAINS, *aliases()])}known toolchains: {', '.join(TOOLCHAINS)}"
        )
    return TOOLCHAINS[name]


def toolchain_dir(name: str) -> Path:
    """``<root>/<name>``; an install made under a former name (``<root>/coreml``) while none exists under the
    current one is that toolchain (a venv holds absolute paths, so it stays where it was made)."""
    spec = get_spec(name)
    d = root() / spec.name
    if not d.exists():
        for old in spec.former_names:
            if (root() / old / STATE_FILE).is_file():
                return root() / old
    return d


def this_platform() -> str:
    return f"{sys.platform.replace('linux2', 'linux')}-{platform.machine().lower()}-cp{sys.version_info[0]}{sys.version_info[1]}"


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def _venv_bin(venv: Path) -> Path:
    return venv / ("Scripts" if sys.platform == "win32" else "bin")


def _dist_fingerprint(venv: Path) -> str:
    """Names of the installed distributions (dist-info directories): cheap to re-check on every status."""
    names: list[str] = []
    for sp in venv.glob("lib/python*/site-packages"):
        names += [p.name for p in sp.glob("*.dist-info")]
    for sp in venv.glob("Lib/site-packages"):
        names += [p.name for p in sp.glob("*.dist-info")]
    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()


def status(name: str) -> ToolchainStatus:
    spec = get_spec(name)
    if spec.kind == "emulator":
        return aarch64.status()
    if spec.kind == "emulator-addon":
        return aarch64_executorch.status()
    d = toolchain_dir(name)
    st = ToolchainStatus(name=spec.name, path=d, installed=False)
    state_file = d / STATE_FILE
    if not state_file.is_file():
        st.problem = (
            f"toolchain {spec.name!r} is not installed at {d}"
            + (" (an unfinished install is there)" if d.exists() else "")
            + f"; install it with: {spec.install_command} ({spec.size_hint})"
        )
        return st
    try:
        state = read_json_file(state_file, what="toolchain state", max_bytes=1 << 20, max_depth=8)
    except UnreadableFile as e:
        st.problem = f"{e.message}; reinstall with: {spec.install_command} --force"
        return st
    if not isinstance(state, dict) or not isinstance(state.get("packages", {}), dict):
        st.problem = f"{state_file} is not a toolchain state; reinstall with: {spec.install_command} --force"
        return st
    st.installed = True
    st.python = state.get("python_version")
    st.lock_hash = state.get("lock_hash")
    st.reference_lock = state.get("reference_lock")
    st.matches_reference = state.get("matches_reference")
    st.packages = dict(state.get("packages", {}))
    st.created_utc = state.get("created_utc")
    st.install_seconds = state.get("install_seconds")
    py = _venv_python(st.venv)
    site = sorted(st.venv.glob("lib/python*/site-packages")) + sorted(st.venv.glob("Lib/site-packages"))
    unsafe = permission_problem(
        d, st.venv, py.parent, py, *site, again=f"reinstall with: {spec.install_command} --force"
    )
    if unsafe is not None:
        st.problem = unsafe
    elif not py.exists():
        st.problem = f"{py} is missing; reinstall with: {spec.install_command} --force"
    elif state.get("spec_hash") != spec.spec_hash:
        st.problem = (
            f"toolchain {spec.name!r} at {d} was installed from another version of its spec "
            f"(edgekit's pins changed); update it with: {spec.install_command} --force"
        )
    elif state.get("dist_fingerprint") != _dist_fingerprint(st.venv):
        st.problem = (
            f"packages in {st.venv} changed since it was installed, so its lock hash no longer "
            f"describes it; reinstall with: {spec.install_command} --force"
        )
    elif state.get("base_python") and not Path(state["base_python"]).exists():
        st.problem = f"the Python it was made with ({state['base_python']}) is gone; reinstall with: {spec.install_command} --force"
    return st


def problems(name: str) -> list[str]:
    """For a converter's ``problems()``: empty when the toolchain is installed and current."""
    st = status(name)
    return [] if st.usable else [st.problem or f"toolchain {name!r} is not usable"]


def require(name: str, what: str) -> ToolchainStatus:
    st = status(name)
    if not st.usable:
        raise MissingDependencyError(f"{what}: {st.problem}")
    return st


# -- install -----------------------------------------------------------------------------


def _clean_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV", "PYTHONSTARTUP")
    }
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _base_python() -> str:
    """The interpreter the venv is made from: the one running edgekit (its base, when inside a venv)."""
    return getattr(sys, "_base_executable", None) or sys.executable


@dataclass(frozen=True)
class _Pip:
    """Where an install's commands log, who sees pip's lines, their environment, and the step lines' reader."""

    log: Any
    on_output: Output | None
    env: dict[str, str]
    say: Output


def _pip_install(spec: Any, py: str, reference: bool, pip: _Pip) -> None:
    """The pinned requirements into the venv, constrained by the reference lock where this is its platform."""
    with tempfile.TemporaryDirectory(prefix="edgekit-toolchain-") as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text("\n".join(spec.requirements) + "\n", encoding="utf-8")
        cmd = [py, "-m", "pip", "install", "--no-input", "--progress-bar", "off", "-r", str(req)]
        if reference:
            lock = Path(tmp) / "constraints.txt"
            lock.write_text("\n".join(lock_lines(spec.lock_text.splitlines())) + "\n", encoding="utf-8")
            cmd += ["-c", str(lock)]
            pip.say(
                f"installing {len(spec.requirements)} pinned requirements with the reference lock ({spec.lock_platform}) as constraints"
            )
        else:
            pip.say(
                f"installing {len(spec.requirements)} pinned requirements (no reference lock for "
                f"{this_platform()}; the reference is {spec.lock_platform}): the lock hash records "
                "what was resolved"
            )
        _run(cmd, pip.log, pip.on_output, env=pip.env)
        if spec.no_deps:
            pinned = Path(tmp) / "no-deps.txt"
            pinned.write_text("\n".join(spec.no_deps) + "\n", encoding="utf-8")
            pip.say(f"installing {len(spec.no_deps)} package(s) without their declared dependencies, sha256-checked")
            no_deps = [py, "-m", "pip", "install", "--no-input", "--progress-bar", "off", "--no-deps"]
            _run([*no_deps, "--require-hashes", "-r", str(pinned)], pip.log, pip.on_output, env=pip.env)


def _pip_check(spec: Any, py: str, pip: _Pip) -> None:
    """``pip check``: clean, or broken only by the spec's ``accepted_conflicts``, word for word."""
    pip.log.write(f"$ {py} -m pip check\n")
    proc = subprocess.run([py, "-m", "pip", "check"], capture_output=True, text=True, env=pip.env)
    pip.log.write(proc.stdout + proc.stderr)
    lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    other = [ln for ln in lines if ln not in spec.accepted_conflicts and not ln.startswith("No broken requirements")]
    if other or (proc.returncode != 0 and not lines):
        raise EdgeError(
            f"toolchain {spec.name!r}: pip check failed: {' | '.join(other)[-1200:] or proc.returncode}",
            hint=f"full log: {pip.log.name}",
        )
    for ln in lines:
        if ln in spec.accepted_conflicts:
            pip.say(f"accepted, as the spec says: {ln}")


def _check_installed(spec: Any, venv: Path, py: str, pip: _Pip) -> list[str]:
    """pip check, the imports and programs the toolchain promises; what pip freeze lists."""
    pip.say("checking the installed set (pip check)")
    _pip_check(spec, py, pip)
    pip.say(f"checking imports: {', '.join(spec.imports)}")
    probe = f"import importlib, json, sys\nmods = {list(spec.imports)!r}\nfor m in mods: importlib.import_module(m)\n"
    _run([py, "-c", probe], pip.log, None, env={**pip.env, "TF_CPP_MIN_LOG_LEVEL": "3"})
    missing = [p for p in spec.programs if not (_venv_bin(venv) / p).exists()]
    if missing:
        raise EdgeError(f"toolchain {spec.name!r}: {', '.join(missing)} missing from {_venv_bin(venv)}")
    return _run([py, "-m", "pip", "freeze", "--all"], pip.log, None, env=pip.env).splitlines()


def install(
    name: str,
    *,
    force: bool = False,
    on_step: Output | None = None,
    on_output: Output | None = None,
    use_reference_lock: bool | None = None,
) -> ToolchainStatus:
    """Create (or, with ``force``, recreate) the toolchain environment ``name``. Explicit user action only.

    ``on_step`` gets one line per step, ``on_output`` every line pip prints (also in ``install.log``).
    """
    spec = get_spec(name)
    if spec.kind == "emulator":
        return aarch64.install(force=force, on_step=on_step, on_output=on_output)
    if spec.kind == "emulator-addon":
        return aarch64_executorch.install(status("executorch"), force=force, on_step=on_step, on_output=on_output)
    say = on_step or (lambda _line: None)
    _check_python(spec)
    current = status(name)
    d = current.path
    if current.usable and not force:
        say(
            f"toolchain {spec.name!r} is already installed at {d} (lock {current.lock_hash[:16] if current.lock_hash else '?'}); "
            "use --force to reinstall"
        )
        return current
    if d.exists():
        say(f"removing {d}" + (" (unfinished install)" if not current.installed else ""))
        shutil.rmtree(d)
    d.mkdir(parents=True)
    venv = d / "venv"
    t0 = time.perf_counter()
    reference = this_platform() == spec.lock_platform if use_reference_lock is None else use_reference_lock
    env = _clean_env()
    try:
        with open(d / "install.log", "w", encoding="utf-8") as log:
            say(f"creating {venv} with Python {platform.python_version()} ({_base_python()})")
            try:
                _run([_base_python(), "-m", "venv", str(venv)], log, None, env=env)
            except EdgeError as e:
                raise EdgeError(
                    f"could not create a virtual environment: {e.message}",
                    hint="on Debian/Ubuntu: apt-get install python3-venv",
                ) from None
            py = str(_venv_python(venv))
            _pip_install(spec, py, reference, _Pip(log, on_output, env, say))
            freeze = _check_installed(spec, venv, py, _Pip(log, None, env, say))
    except BaseException:
        say(
            f"install failed; the unfinished environment stays at {d} (log: {d / 'install.log'}) and is removed by the next install"
        )
        raise
    state = _write_state(spec, d, venv, lock_lines(freeze), reference, t0)
    st = status(name)
    say(
        f"installed toolchain {spec.name!r} at {d} in {state['install_seconds']:.0f} s; lock hash {st.lock_hash}"
        + ("" if st.matches_reference else " (differs from the reference lock)")
    )
    return st


def _check_python(spec: ToolchainSpec) -> None:
    """Refuse an interpreter outside the range the toolchain's pinned wheels exist for."""
    v = sys.version_info[:2]
    if not spec.python_min <= v <= spec.python_max:
        raise MissingDependencyError(
            f"toolchain {spec.name!r} needs Python {'.'.join(map(str, spec.python_min))} to "
            f"{'.'.join(map(str, spec.python_max))} (its pinned wheels exist only there); edgekit runs on "
            f"Python {v[0]}.{v[1]} ({sys.executable})",
            hint="run edgekit from a Python in that range to install and use this toolchain",
        )


def _write_state(
    spec: ToolchainSpec, d: Path, venv: Path, freeze: list[str], reference: bool, t0: float
) -> dict[str, Any]:
    """The finished install's state file (written atomically: its presence marks the install complete)."""
    packages = dict(ln.split("==", 1) for ln in freeze if "==" in ln)
    reference_lines = lock_lines(spec.lock_text.splitlines())
    state = {
        "name": spec.name,
        "spec_hash": spec.spec_hash,
        "requirements": list(spec.requirements),
        "python_version": platform.python_version(),
        "base_python": _base_python(),
        "platform": this_platform(),
        "reference_lock": reference,
        "lock_hash": lock_hash(freeze),
        "matches_reference": freeze == reference_lines,
        "packages": packages,
        "freeze": freeze,
        "dist_fingerprint": _dist_fingerprint(venv),
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "install_seconds": round(time.perf_counter() - t0, 1),
        "edgekit_version": __import__("edge").__version__,
    }
    tmp_state = d / f".{STATE_FILE}.tmp"
    tmp_state.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp_state, d / STATE_FILE)
    return state


def remove(name: str) -> bool:
    """Delete the toolchain's directory; False when nothing is there. A symbolic link in its place is removed
    itself, never followed (what it points at is not edgekit's to delete); a file in its place is removed too."""
    d = toolchain_dir(name)
    if not os.path.lexists(d):
        return False
    try:
        if d.is_symlink() or not d.is_dir():
            d.unlink()
        else:
            shutil.rmtree(d)
    except OSError as e:
        raise EdgeError(
            f"cannot remove toolchain {name!r} at {d}: {e.strerror or e}",
            hint="remove it by hand, or fix its permissions",
        ) from None
    return True


def list_status() -> list[ToolchainStatus]:
    return [status(n) for n in TOOLCHAINS]


# -- offline runs: edge.toolchains.offline (re-exported: drivers and tests use these names) --------

from edge.toolchains.offline import (  # noqa: E402,F401
    ATTEMPTS_ENV,
    GUARD,
    NAMESPACE,
    NETNS_ENV,
    OFFLINE_ENV,
    SECCOMP,
    SECCOMP_ENV,
    WEAK,
    WEAK_ENV,
    NetworkIsolation,
    network_isolation,
    offline_attempts,
    offline_popen,
    seccomp_isolation,
)

# -- running a driver --------------------------------------------------------------------

Event = Mapping[str, Any]


def driver_path(name: str) -> Path:
    """``<name>_driver.py`` beside this module: a toolchain's own driver, or one named by ``run_driver(driver=)``."""
    return _HERE / f"{name}_driver.py"


def keep_log(work: Path, name: str) -> Path | None:
    """Copy a failed driver run's ``convert.log`` out of its temporary work dir, for the error message."""
    src = work / "convert.log"
    if not src.is_file():
        return None
    dest = Path(tempfile.gettempdir()) / f"edgekit-{name}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    shutil.copyfile(src, dest)
    return dest


def run_driver(
    name: str,
    job: Mapping[str, Any],
    workdir: Path,
    *,
    on_event: Callable[[Event], None] | None = None,
    timeout_s: float = 3600.0,
    driver: str | None = None,
) -> tuple[dict[str, Any], ToolchainStatus]:
    """Run ``<driver or name>_driver.py`` with the toolchain's Python on ``job``; its final result or error event.

    One toolchain can serve several drivers (``torch``: ``coreml_driver.py``, ``torch_onnx_driver.py``).

    The toolchain's bin directory comes first on PATH (onnx2tf calls onnxsim by name), edgekit's
    own environment variables that would leak packages in (PYTHONPATH, VIRTUAL_ENV) are dropped,
    and the driver's log goes to ``workdir/convert.log``. The run is offline (:func:`offline_popen`):
    ``final["offline"]`` and the returned status's ``offline`` (so ``manifest_record()``) say what
    enforced it and list the attempts the guard refused (also ``final["network_attempts"]``).
    """
    st = require(name, f"toolchain {name!r}")
    job_file = workdir / "job.json"
    job_file.write_text(json.dumps(dict(job)), encoding="utf-8")
    env = _driver_env(st)
    log_path = workdir / "convert.log"
    attempts_log = workdir / "network_attempts.log"
    attempts_log.unlink(missing_ok=True)  # this run's attempts only
    with open(log_path, "ab") as log:
        proc, offline = offline_popen(
            [str(_venv_python(st.venv)), str(driver_path(driver or name)), str(job_file)],
            env=env,
            attempts_log=attempts_log,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        final, timed_out = _read_events(proc, timeout_s, on_event)
        if timed_out.is_set():
            raise EdgeError(
                f"toolchain {name!r} did not finish within {timeout_s:.0f} s; stopped it",
                hint=f"log: {log_path}; raise the converter option timeout_s for big models",
            )
    attempts = offline_attempts(attempts_log)
    offline["attempts"] = attempts
    if final is None:
        tail = _tail(log_path)
        tried = f" (it tried to reach the network, refused: {'; '.join(attempts)[:500]})" if attempts else ""
        raise EdgeError(
            f"toolchain {name!r} driver exited with code {proc.returncode} without a result: {tail}" + tried,
            hint=f"log: {log_path}",
        )
    final["offline"] = offline
    final["network_attempts"] = [*final.get("network_attempts", []), *attempts]
    return final, dataclasses.replace(st, offline=offline)


def _driver_env(st: ToolchainStatus) -> dict[str, str]:
    """The driver's environment: edgekit's own dropped, the toolchain's bin first on PATH, no GPU, unbuffered."""
    env = _clean_env()
    env["PATH"] = str(_venv_bin(st.venv)) + os.pathsep + env.get("PATH", "")
    env["VIRTUAL_ENV"] = str(st.venv)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["CUDA_VISIBLE_DEVICES"] = ""  # a converter never needs the GPU; TensorFlow would probe it
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _read_events(
    proc: subprocess.Popen[str], timeout_s: float, on_event: Callable[[Event], None] | None
) -> tuple[dict[str, Any] | None, threading.Event]:
    """Read the driver's JSON event lines until it exits (a watchdog kills it after ``timeout_s``).

    Returns its final result/error event (None when it gave none) and the event set when the watchdog fired;
    other events go to ``on_event``. Any exception while reading stops the driver and propagates.
    """
    final: dict[str, Any] | None = None
    timed_out = threading.Event()

    def expire() -> None:
        timed_out.set()
        _kill(proc)

    watchdog = threading.Timer(timeout_s, expire)  # reading stdout blocks; the timer does not
    watchdog.daemon = True
    watchdog.start()
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(ev, dict):
                continue
            if ev.get("event") in ("result", "error"):
                final = ev
            elif on_event is not None:
                on_event(ev)
        proc.wait()
    except BaseException:
        _kill(proc)
        raise
    finally:
        watchdog.cancel()
    return final, timed_out


def _kill(proc: subprocess.Popen[str]) -> None:
    """Stop the driver and whatever it started (it runs in a session of its own)."""
    import signal

    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        proc.kill()
    proc.wait()


def _tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "(no log)"
    useful = [ln for ln in text if ln.strip() and not ln.startswith(("W0000", "I0000", "E0000"))]
    return " | ".join(useful[-lines:])[-1500:]
