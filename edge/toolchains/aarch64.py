"""The ``aarch64`` toolchain: an emulated ARM64 device (user-mode qemu, a Debian arm64 root, the device runtimes).

``edgekit toolchain install aarch64`` lays out, under ``<toolchains root>/aarch64``:

* ``qemu/qemu-aarch64``: the static user-mode emulator. First choice: the ``qemu-user`` 10.x package of
  Debian bookworm-backports from the host's own apt mirror, its sha256 checked against the mirror's
  ``Packages`` index (only the one binary is unpacked; nothing is installed). Else the host's
  ``qemu-aarch64(-static)`` when it is 8.0 or newer. Else a 7.2 one with an ARM ``/proc/cpuinfo`` file in the
  root: qemu 7.2 does not emulate it for aarch64, and the runtimes' cpuinfo library then reads the
  host's x86 text and crashes (onnxruntime at import, LiteRT when it runs a model).
* ``rootfs/``: Debian 12 arm64 with Python 3.11: ``debootstrap --foreign`` (first stage: download and
  unpack, runs nothing arm64) and ``dpkg-deb -x`` of the packages it downloaded. No chroot, no binfmt_misc,
  no root needed to *run*: ``qemu-aarch64 -L rootfs -cpu CORE rootfs/usr/bin/python3.11``.
* ``rootfs/opt/site``: the aarch64 wheels of the device runtimes at the pins below, installed by the
  **host** pip with ``--platform``/``--target`` (pip never runs under emulation), with the reference lock
  ``aarch64.lock`` as constraints.

``toolchain.json`` (written last) records the qemu binary's version, source and sha256, the arm64 packages
unpacked, the wheel set and its lock hash. After the install nothing is downloaded: a run only reads these
files. Emulation runs the real aarch64 machine code of the wheels (XNNPack's and MLAS's NEON kernels), so
it checks numerics on the ARM instruction set; it says nothing about speed (300-1000x slower than native).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import lzma
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from edge.base.typedjson import UnreadableFile, read_json_file
from edge.errors import EdgeError, MissingDependencyError
from edge.toolchains.state import (
    STATE_FILE,
    ToolchainStatus,
    lock_hash,
    lock_lines,
    permission_problem,
    root,
    run_logged,
)

NAME = "aarch64"
ISA = "aarch64"
SUITE = "bookworm"
GUEST_PYTHON = "3.11"
#: the device runtimes at the versions edgekit's device extras ([litert,mqtt], [onnx,mqtt]) are verified with
WHEELS = ("ai-edge-litert==2.3.0", "onnxruntime==1.32.0", "numpy==2.4.6", "paho-mqtt==2.2.0", "cryptography==50.0.2")
LOCK_FILE = "aarch64.lock"
PLATFORMS = ("manylinux2014_aarch64", "manylinux_2_17_aarch64", "manylinux_2_27_aarch64", "manylinux_2_28_aarch64")
#: emulated cores a check may name (``qemu-aarch64 -cpu help`` lists more); never ``max``: it exposes SME/SVE,
#: and XNNPack/MLAS then pick kernels no Raspberry Pi has
CPUS: Mapping[str, str] = {
    "cortex-a72": "Raspberry Pi 4",
    "cortex-a76": "Raspberry Pi 5",
    "neoverse-n1": "AWS Graviton2",
}
DEFAULT_CPU = "cortex-a76"
MIRROR_ENV = "EDGEKIT_DEBIAN_MIRROR"
QEMU_MIN = (8, 0)  # older ones need the cpuinfo file
_MAX_INDEX = 64 << 20  # Packages.xz of bookworm-backports is ~1 MB; unpacked ~10 MB
_MAX_DEB = 128 << 20  # qemu-user 10.x is ~20 MB
SIZE_HINT = "about 450 MB on disk (150 MB downloaded), under a minute with a warm mirror"
_HERE = Path(__file__).resolve().parent

Output = Callable[[str], None]


def spec_hash() -> str:
    """Changes when the pins, the reference lock, the suite or the guest Python change."""
    h = hashlib.sha256("\n".join((*WHEELS, SUITE, GUEST_PYTHON, *PLATFORMS)).encode())
    h.update("\n".join(lock_lines((_HERE / LOCK_FILE).read_text(encoding="utf-8").splitlines())).encode())
    return h.hexdigest()


def toolchain_dir() -> Path:
    return root() / NAME


# -- what the host needs ---------------------------------------------------------------------


def _which(program: str) -> str | None:
    """``program`` on PATH or in the sbin directories (debootstrap lives in /usr/sbin, off a user's PATH)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return shutil.which(program, path=path)


def find_mirror() -> str | None:
    """``$EDGEKIT_DEBIAN_MIRROR``, else the first ``http(s)://.../debian`` the host's apt sources name."""
    env = os.environ.get(MIRROR_ENV, "").strip()
    if env:
        return env.rstrip("/")
    files = [
        Path("/etc/apt/sources.list"),
        *sorted(Path("/etc/apt/sources.list.d").glob("*.list")),
        *sorted(Path("/etc/apt/sources.list.d").glob("*.sources")),
    ]
    for f in files:
        try:
            text = f.read_text(encoding="utf-8", errors="replace")[: 1 << 20]
        except OSError:
            continue
        for line in text.splitlines():
            if line.lstrip().startswith(("deb ", "URIs:")):
                m = re.search(r"https?://[^\s\[\]]+/debian(?=[\s/]|$)", line)
                if m:
                    return m.group(0)
    return None


def host_problems() -> list[str]:
    """What keeps this host from installing the toolchain (empty: it can). Every problem, not the first."""
    problems: list[str] = []
    machine = platform.machine().lower()
    if sys.platform != "linux":
        problems.append(f"this host runs {sys.platform}, not Linux (user-mode qemu is Linux-only)")
    elif machine in ("aarch64", "arm64"):
        problems.append("this host is aarch64 itself: run the check natively (no emulation needed)")
    elif machine not in ("x86_64", "amd64"):
        problems.append(f"this host is {machine}; the toolchain is made for x86-64 hosts")
    missing = [p for p in ("debootstrap", "dpkg-deb", "wget") if _which(p) is None]
    if missing:
        problems.append(
            f"{', '.join(missing)} missing (not a Debian-like host, or: apt-get install "
            f"{' '.join('dpkg' if p == 'dpkg-deb' else p for p in missing)})"
        )
    if sys.platform == "linux" and find_mirror() is None:
        problems.append(f"no Debian mirror in /etc/apt/sources.list*: set {MIRROR_ENV}=http://deb.debian.org/debian")
    return problems


# -- status ------------------------------------------------------------------------------------


def site_fingerprint(site: Path) -> str:
    names = sorted(p.name for p in site.glob("*.dist-info")) if site.is_dir() else []
    return hashlib.sha256("\n".join(names).encode()).hexdigest()


def _not_installed(d: Path) -> str:
    cannot = host_problems()
    if cannot:
        return f"toolchain 'aarch64' cannot be installed on this host: {'; '.join(cannot)}"
    return (
        f"toolchain 'aarch64' is not installed at {d}"
        + (" (an unfinished install is there)" if d.exists() else "")
        + f"; install it with: edgekit toolchain install aarch64 ({SIZE_HINT})"
    )


def read_state() -> dict[str, Any] | None:
    try:
        state = read_json_file(toolchain_dir() / STATE_FILE, what="toolchain state", max_bytes=1 << 20, max_depth=8)
    except UnreadableFile:
        return None
    return state if isinstance(state, dict) else None


def status() -> ToolchainStatus:
    d = toolchain_dir()
    st = ToolchainStatus(name=NAME, path=d, installed=False)
    if not (d / STATE_FILE).is_file():
        st.problem = _not_installed(d)
        return st
    state = read_state()
    again = "reinstall with: edgekit toolchain install aarch64 --force"
    if state is None:
        st.problem = f"{d / STATE_FILE} is unreadable; {again}"
        return st
    st.installed = True
    st.python = state.get("python_version")
    st.lock_hash = state.get("lock_hash")
    st.reference_lock = state.get("reference_lock")
    st.matches_reference = state.get("matches_reference")
    st.packages = dict(state.get("packages", {}))
    st.created_utc = state.get("created_utc")
    st.install_seconds = state.get("install_seconds")
    em = Emulator(d, DEFAULT_CPU)
    unsafe = permission_problem(
        d,
        em.qemu.parent,
        em.qemu,
        em.rootfs,
        em.python.parent,
        em.python,
        em.site,
        d / "guest",
        d / "pycache",
        again=again,
    )
    if unsafe is not None:
        st.problem = unsafe
    elif not em.qemu.is_file() or not em.python.exists():
        st.problem = f"{em.qemu if not em.qemu.is_file() else em.python} is missing; {again}"
    elif state.get("spec_hash") != spec_hash():
        st.problem = f"toolchain 'aarch64' at {d} was installed from another version of its spec; update it: {again}"
    elif state.get("qemu", {}).get("sha256") != file_sha256(em.qemu):
        st.problem = f"{em.qemu} changed since it was installed; {again}"
    elif state.get("site_fingerprint") != site_fingerprint(em.site):
        st.problem = f"packages in {em.site} changed since it was installed; {again}"
    return st


def require() -> Emulator:
    """The installed emulator (default core), or a :class:`MissingDependencyError` saying what is missing."""
    st = status()
    if not st.usable:
        raise MissingDependencyError(st.problem or "toolchain 'aarch64' is not usable")
    return Emulator(st.path, DEFAULT_CPU)


# -- running ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Emulator:
    """How to run the guest Python: ``qemu-aarch64 -L rootfs -cpu CORE rootfs/usr/bin/python3.11``."""

    path: Path
    cpu: str = DEFAULT_CPU

    @property
    def qemu(self) -> Path:
        return self.path / "qemu" / "qemu-aarch64"

    @property
    def rootfs(self) -> Path:
        return self.path / "rootfs"

    @property
    def site(self) -> Path:
        return self.rootfs / "opt" / "site"

    @property
    def python(self) -> Path:
        # the real file, not /usr/bin/python3 (an absolute symlink that would resolve on the host)
        return self.rootfs / "usr" / "bin" / f"python{GUEST_PYTHON}"

    def with_cpu(self, cpu: str) -> Emulator:
        if cpu not in CPUS:
            raise EdgeError(
                f"unknown emulated core {cpu!r}; choose one of {', '.join(CPUS)}",
                hint="cortex-a72 = Raspberry Pi 4, cortex-a76 = Raspberry Pi 5, neoverse-n1 = Graviton2",
            )
        return Emulator(self.path, cpu)

    def command(self, *args: str) -> list[str]:
        """argv running the guest Python with ``args``: ``-S``, so no ``site`` runs and no ``sitecustomize`` or
        ``.pth`` planted in the root (or on the path) runs before the code asked for (the wheels and edgekit come
        from PYTHONPATH, which -S keeps; -I would drop it)."""
        return [str(self.qemu), "-L", str(self.rootfs), "-cpu", self.cpu, str(self.python), "-S", *args]

    def env(
        self,
        pythonpath: tuple[str | os.PathLike[str], ...] = (),
        extra: Mapping[str, str] | None = None,
        pycache: str | None = None,
    ) -> dict[str, str]:
        """The guest's environment: the host's minus anything that would leak host packages in, the wheels
        first on PYTHONPATH (``/opt/site`` resolves inside the root through ``-L``), then ``pythonpath``."""
        # PYTHONDONTWRITEBYTECODE too: compiling every module again on each run costs tens of emulated seconds
        drop = (
            "PYTHONPATH",
            "PYTHONHOME",
            "VIRTUAL_ENV",
            "PYTHONSTARTUP",
            "LD_LIBRARY_PATH",
            "LD_PRELOAD",
            "PYTHONDONTWRITEBYTECODE",
        )
        env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("QEMU_")}
        env["PYTHONPATH"] = os.pathsep.join(["/opt/site", *map(str, pythonpath)])
        env["PYTHONNOUSERSITE"] = "1"
        # compiled modules go to a fresh host directory that does not exist inside the root, so qemu's -L lookup
        # leaves the path alone and the guest can create it (nothing is written into the root or the checkout).
        # Fresh for every run: Python trusts a timestamp .pyc whose recorded mtime and size match the source, so a
        # shared cache (the toolchain's pycache/) let a poisoned .pyc run in the guest (issue #33). The cost is
        # compiling what the guest imports on every run (emulated seconds).
        env["PYTHONPYCACHEPREFIX"] = pycache or _fresh_pycache()
        # aarch64 children started through binfmt_misc (where registered) get the same root and core
        env["QEMU_LD_PREFIX"], env["QEMU_CPU"] = str(self.rootfs), self.cpu
        env.update(extra or {})
        return env

    def run(
        self,
        *args: str,
        timeout_s: float = 600.0,
        pythonpath: tuple[str | os.PathLike[str], ...] = (),
        extra_env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        try:
            with tempfile.TemporaryDirectory(prefix="edgekit-guest-pyc-") as pycache:
                return subprocess.run(
                    self.command(*args),
                    env=self.env(pythonpath, extra_env, pycache),
                    capture_output=True,
                    text=True,
                    timeout=timeout_s,
                    stdin=subprocess.DEVNULL,
                )
        except subprocess.TimeoutExpired:
            raise EdgeError(
                f"the emulated aarch64 Python did not finish within {timeout_s:.0f} s",
                hint="emulation is 300-1000x slower than a device: use a small model or few samples",
            ) from None


def _fresh_pycache() -> str:
    """A new empty directory for one guest run's compiled modules, removed when this process exits."""
    d = tempfile.mkdtemp(prefix="edgekit-guest-pyc-")
    atexit.register(shutil.rmtree, d, True)
    return d


def qemu_version(binary: Path) -> str:
    """``10.0.2`` from ``qemu-aarch64 version 10.0.2 (Debian 1:10.0.2+ds-1~bpo12+1)``."""
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    m = re.search(r"version (\d+\.\d+(?:\.\d+)?)", out.stdout)
    if out.returncode != 0 or m is None:
        raise EdgeError(f"{binary} --version did not say its version: {(out.stdout + out.stderr)[:200]!r}")
    return m.group(1)


def _major_minor(version: str) -> tuple[int, int]:
    parts = [int(p) for p in version.split(".")[:2]]
    return parts[0], parts[1] if len(parts) > 1 else 0


# -- install ---------------------------------------------------------------------------------


def file_sha256(path: Path) -> str | None:
    if not path.is_file():
        return None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fetch(url: str, dest: Path, max_bytes: int, timeout_s: float = 120.0) -> None:
    """``url`` into ``dest``, refusing more than ``max_bytes``."""
    req = urllib.request.Request(url, headers={"User-Agent": "edgekit toolchain install aarch64"})
    total = 0
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r, open(dest, "wb") as f:  # noqa: S310 - http(s) only
            while chunk := r.read(1 << 20):
                total += len(chunk)
                if total > max_bytes:
                    raise EdgeError(f"{url} is over {max_bytes >> 20} MiB: refused")
                f.write(chunk)
    except OSError as e:  # URLError, HTTPError, timeouts
        raise EdgeError(
            f"could not download {url}: {getattr(e, 'reason', None) or e}",
            hint=f"check the host's network and mirror, or set {MIRROR_ENV}",
        ) from None


@dataclass(frozen=True)
class DebEntry:
    package: str
    version: str
    filename: str  # relative to the mirror: pool/...
    sha256: str


_FILENAME = re.compile(r"pool/[A-Za-z0-9._+~/-]{1,300}\.deb")


def parse_packages_index(text: str, package: str, architecture: str = "amd64") -> DebEntry | None:
    """``package``'s stanza in a Debian ``Packages`` index (the first for ``architecture``), its filename and
    sha256 checked for form: the index comes from the network."""
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            key, sep, value = line.partition(":")
            if sep and not line.startswith(" "):
                fields[key.strip()] = value.strip()
        if fields.get("Package") != package or fields.get("Architecture", architecture) != architecture:
            continue
        name, sha = fields.get("Filename", ""), fields.get("SHA256", "")
        if not _FILENAME.fullmatch(name) or ".." in name.split("/") or not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise EdgeError(f"the Packages index's entry for {package} is malformed (Filename {name[:80]!r})")
        return DebEntry(package, fields.get("Version", "?")[:64], name, sha)
    return None


#: Debian's archive signing keys (debian-archive-keyring 2023.3+deb12u2, as Debian ships them): what vouches for a
#: mirror's InRelease, pinned in edgekit, never taken from the mirror or from the host's apt configuration
DEBIAN_KEYRING = Path(__file__).parent / "keys" / "debian-archive-keyring.gpg"
_INDEX = "main/binary-amd64/Packages.xz"


def verified_index_sha256(in_release: bytes, keyring: Path, work: Path, what: str = _INDEX) -> str:
    """The sha256 that ``in_release`` (a clear-signed Debian InRelease) lists for ``what``, after ``gpgv``
    verified its signature against ``keyring`` alone; EdgeError when it does not verify or does not list it."""
    gpgv = _which("gpgv")
    if gpgv is None:
        raise EdgeError("checking the Debian mirror's signature needs gpgv", hint="apt-get install gpgv")
    signed, text = work / "InRelease", work / "InRelease.verified"
    signed.write_bytes(in_release)
    r = subprocess.run(
        [gpgv, "--keyring", str(keyring), "--output", str(text), str(signed)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    if r.returncode != 0 or not text.is_file():
        why = next((ln for ln in r.stderr.splitlines() if "BAD" in ln or "No public key" in ln or "Can't" in ln), "")
        raise EdgeError(
            f"the mirror's InRelease is not signed by a Debian archive key edgekit pins: {why.strip()[:160] or 'gpgv refused it'}",
            hint=f"check the mirror ({MIRROR_ENV}); a Packages index without a valid signature is never trusted",
        )
    section = False
    for line in text.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.startswith(" "):
            section = line.strip() == "SHA256:"
            continue
        parts = line.split()
        if section and len(parts) == 3 and parts[2] == what and re.fullmatch(r"[0-9a-f]{64}", parts[0]):
            return parts[0]
    raise EdgeError(f"the mirror's signed InRelease lists no SHA256 for {what}")


def _qemu_from_backports(mirror: str, dl: Path, dest: Path, log: Any, keyring: Path = DEBIAN_KEYRING) -> dict[str, Any]:
    """The static ``qemu-aarch64`` of bookworm-backports' ``qemu-user``: the suite's InRelease verified with
    ``gpgv`` against the pinned Debian keyring, the Packages index against its signed sha256, the .deb against the
    index's sha256 (an unsigned Packages.xz vouched for the .deb before: issue #33)."""
    release = dl / "InRelease.fetched"
    _fetch(f"{mirror}/dists/{SUITE}-backports/InRelease", release, _MAX_INDEX)
    want = verified_index_sha256(release.read_bytes(), keyring, dl)
    index = dl / "Packages.xz"
    _fetch(f"{mirror}/dists/{SUITE}-backports/{_INDEX}", index, _MAX_INDEX)
    if file_sha256(index) != want:
        raise EdgeError(f"{SUITE}-backports' {_INDEX} is not the one its signed InRelease lists: refused")
    try:
        text = lzma.LZMADecompressor().decompress(index.read_bytes(), max_length=8 * _MAX_INDEX)
    except lzma.LZMAError as e:
        raise EdgeError(f"{SUITE}-backports' Packages.xz is not xz data ({e})") from None
    entry = parse_packages_index(text.decode("utf-8", errors="replace"), "qemu-user")
    if entry is None:
        raise EdgeError(f"{SUITE}-backports has no qemu-user package")
    deb = dl / "qemu-user.deb"
    _fetch(f"{mirror}/{entry.filename}", deb, _MAX_DEB)
    got = file_sha256(deb)
    if got != entry.sha256:
        raise EdgeError(f"{entry.filename}: sha256 {got} is not the index's {entry.sha256}: refused")
    with tempfile.TemporaryDirectory(dir=dl) as x:
        run_logged(["dpkg-deb", "-x", str(deb), x], log, None)
        src = Path(x) / "usr" / "bin" / "qemu-aarch64"
        if not src.is_file():
            raise EdgeError(f"{entry.filename} holds no usr/bin/qemu-aarch64")
        shutil.copy2(src, dest)
    deb.unlink()
    return {
        "source": f"debian {SUITE}-backports qemu-user {entry.version}",
        "package": entry.filename,
        "package_sha256": entry.sha256,
    }


def _qemu_from_host(dest: Path) -> dict[str, Any] | None:
    for name in ("qemu-aarch64-static", "qemu-aarch64"):
        found = _which(name)
        if found:
            shutil.copy2(found, dest)
            return {"source": f"the host's {found}"}
    return None


#: what a 7.2 guest reads as /proc/cpuinfo (per core: ARM's part number and the Linux feature words)
_PARTS = {
    "cortex-a72": ("0xd08", "fp asimd evtstrm crc32 cpuid"),
    "cortex-a76": (
        "0xd0b",
        "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp",
    ),
    "neoverse-n1": (
        "0xd0c",
        "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs",
    ),
}


def cpuinfo_text(cpu: str, cores: int = 4) -> str:
    part, features = _PARTS[cpu]
    block = (
        "processor\t: {n}\nBogoMIPS\t: 108.00\nFeatures\t: {f}\nCPU implementer\t: 0x41\n"
        "CPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: {p}\nCPU revision\t: 1\n"
    )
    return "\n".join(block.format(n=n, f=features, p=part) for n in range(cores))


def _install_qemu(d: Path, mirror: str, log: Any, say: Output) -> dict[str, Any]:
    dest = d / "qemu" / "qemu-aarch64"
    dest.parent.mkdir(parents=True, exist_ok=True)
    (d / "dl").mkdir(exist_ok=True)
    try:
        info = _qemu_from_backports(mirror, d / "dl", dest, log)
    except EdgeError as e:
        say(f"qemu-user from {SUITE}-backports unavailable ({e.message}); trying the host's qemu")
        found = _qemu_from_host(dest)
        if found is None:
            raise EdgeError(
                f"no qemu-aarch64: {e.message}; and none on this host",
                hint="apt-get install qemu-user-static (qemu >= 8 preferred)",
            ) from None
        info = found
    info["version"] = qemu_version(dest)
    info["sha256"] = file_sha256(dest)
    info["cpuinfo_file"] = _major_minor(info["version"]) < QEMU_MIN
    return info


def _install_rootfs(d: Path, mirror: str, log: Any, on_output: Output | None) -> dict[str, Any]:
    """debootstrap's first stage (download + unpack), then every downloaded .deb unpacked: no scripts run."""
    rootfs = d / "rootfs"
    run_logged(
        [
            _which("debootstrap") or "debootstrap",
            "--arch=arm64",
            "--foreign",
            "--variant=minbase",
            "--include=python3",
            SUITE,
            str(rootfs),
            mirror,
        ],
        log,
        on_output,
    )
    debs = sorted((rootfs / "var" / "cache" / "apt" / "archives").glob("*.deb"))
    if not debs:
        raise EdgeError(f"debootstrap left no .deb files in {rootfs}/var/cache/apt/archives")
    listed = []
    for deb in debs:
        run_logged(["dpkg-deb", "-x", str(deb), str(rootfs)], log, None)
        listed.append(f"{deb.name} {file_sha256(deb)}")
        deb.unlink()
    return {
        "suite": SUITE,
        "mirror": mirror,
        "packages": len(listed),
        "packages_sha256": hashlib.sha256("\n".join(listed).encode()).hexdigest(),
    }


def _dist_name(n: str) -> str:
    return re.sub(r"[-_.]+", "-", n).lower()


def site_packages(site: Path) -> dict[str, str]:
    """name -> version of the distributions installed in ``site`` (from the dist-info directory names)."""
    out = {}
    for p in site.glob("*.dist-info"):
        name, _, version = p.name[: -len(".dist-info")].rpartition("-")
        if name:
            out[_dist_name(name)] = version
    return dict(sorted(out.items()))


def _install_wheels(site: Path, log: Any, on_output: Output | None) -> None:
    """The aarch64 wheels by the host pip (``--platform``/``--target``): nothing is built, nothing runs arm64."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PIP_TARGET", "PIP_PREFIX")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    with tempfile.TemporaryDirectory(prefix="edgekit-aarch64-") as tmp:
        req, lock = Path(tmp) / "requirements.txt", Path(tmp) / "constraints.txt"
        req.write_text("\n".join(WHEELS) + "\n", encoding="utf-8")
        lock.write_text(
            "\n".join(lock_lines((_HERE / LOCK_FILE).read_text(encoding="utf-8").splitlines())) + "\n", encoding="utf-8"
        )
        plats = [a for p in PLATFORMS for a in ("--platform", p)]
        run_logged(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--no-input",
                "--progress-bar",
                "off",
                "--only-binary=:all:",
                *plats,
                "--python-version",
                GUEST_PYTHON,
                "--implementation",
                "cp",
                "--abi",
                "cp" + GUEST_PYTHON.replace(".", ""),
                "--target",
                str(site),
                "-r",
                str(req),
                "-c",
                str(lock),
            ],
            log,
            on_output,
            env=env,
        )


_PROBE = """
import importlib.metadata as md, json, platform, sys
import numpy, onnxruntime, ai_edge_litert.interpreter, paho.mqtt.client, cryptography
info = open('/proc/cpuinfo').read()
part = [l.split(':')[1].strip() for l in info.splitlines() if l.startswith('CPU part')]
print(json.dumps({'machine': platform.machine(), 'python': platform.python_version(),
                  'cpu_part': part[0] if part else None,
                  'versions': {d: md.version(d) for d in ('ai-edge-litert', 'onnxruntime', 'numpy', 'paho-mqtt')}}))
"""


def probe(em: Emulator, timeout_s: float = 300.0) -> dict[str, Any]:
    """Import every runtime in the guest; what it reports (machine, Python, versions, the CPU part it sees)."""
    out = em.run("-c", _PROBE, timeout_s=timeout_s)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        why = f"signal {-out.returncode}" if out.returncode < 0 else f"exit code {out.returncode}"
        raise EdgeError(
            f"the emulated aarch64 Python failed to import the runtimes ({why}): "
            f"{(out.stderr.strip().splitlines() or ['no output'])[-1][:300]}"
        )
    result = json.loads(lines[-1])
    if result.get("machine") != "aarch64":
        raise EdgeError(f"the guest Python says it runs on {result.get('machine')!r}, not aarch64")
    return result  # type: ignore[no-any-return]


def disk_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def install(*, force: bool = False, on_step: Output | None = None, on_output: Output | None = None) -> ToolchainStatus:
    """Lay out (or, with ``force``, again) the emulator, the arm64 root and the wheels. Explicit user action only."""
    say = on_step or (lambda _line: None)
    cannot = host_problems()
    if cannot:
        raise MissingDependencyError(f"toolchain 'aarch64' cannot be installed on this host: {'; '.join(cannot)}")
    if os.geteuid() != 0:
        raise MissingDependencyError(
            "toolchain 'aarch64': debootstrap lays out the arm64 root as root only",
            hint="run `edgekit toolchain install aarch64` as root (running it later does not need root)",
        )
    current = status()
    d = current.path
    if current.usable and not force:
        say(f"toolchain 'aarch64' is already installed at {d}; use --force to reinstall")
        return current
    if d.exists():
        say(f"removing {d}" + (" (unfinished install)" if not current.installed else ""))
        shutil.rmtree(d)
    d.mkdir(parents=True)
    mirror = find_mirror() or ""
    t0 = time.perf_counter()
    em = Emulator(d, DEFAULT_CPU)
    try:
        with open(d / "install.log", "w", encoding="utf-8") as log:
            say(f"qemu-aarch64: {SUITE}-backports qemu-user from {mirror} (sha256 from its Packages index)")
            qemu = _install_qemu(d, mirror, log, say)
            say(f"qemu-aarch64 {qemu['version']} ({qemu['source']})")
            say(f"arm64 Debian {SUITE} root with Python {GUEST_PYTHON}: debootstrap --foreign + dpkg-deb -x")
            rootfs = _install_rootfs(d, mirror, log, on_output)
            if qemu["cpuinfo_file"]:  # qemu < 8 shows the guest the host's x86 /proc/cpuinfo
                (em.rootfs / "proc").mkdir(exist_ok=True)
                (em.rootfs / "proc" / "cpuinfo").write_text(cpuinfo_text(DEFAULT_CPU), encoding="utf-8")
            say(f"aarch64 wheels by the host pip: {', '.join(WHEELS)}")
            _install_wheels(em.site, log, on_output)
            say("checking the guest: every runtime imports under emulation")
            seen = probe(em)
    except BaseException:
        say(
            f"install failed; the unfinished toolchain stays at {d} (log: {d / 'install.log'}) and is removed by the next install"
        )
        raise
    shutil.rmtree(d / "dl", ignore_errors=True)
    packages = site_packages(em.site)
    freeze = [f"{k}=={v}" for k, v in packages.items()]
    reference = [
        f"{_dist_name(ln.split('==')[0])}=={ln.split('==')[1]}"
        for ln in lock_lines((_HERE / LOCK_FILE).read_text(encoding="utf-8").splitlines())
    ]
    state = {
        "name": NAME,
        "kind": "emulator",
        "spec_hash": spec_hash(),
        "requirements": list(WHEELS),
        "python_version": seen["python"],
        "platform": f"linux-aarch64-cp{GUEST_PYTHON.replace('.', '')}",
        "qemu": qemu,
        "rootfs": rootfs,
        "guest": seen,
        "reference_lock": True,
        "lock_hash": lock_hash(freeze),
        "matches_reference": sorted(freeze) == sorted(reference),
        "packages": packages,
        "site_fingerprint": site_fingerprint(em.site),
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "install_seconds": round(time.perf_counter() - t0, 1),
        "disk_bytes": disk_bytes(d),
        "edgekit_version": __import__("edge").__version__,
    }
    tmp_state = d / f".{STATE_FILE}.tmp"
    tmp_state.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp_state, d / STATE_FILE)
    say(
        f"installed toolchain 'aarch64' at {d} in {state['install_seconds']:.0f} s, "
        f"{state['disk_bytes'] / 1e6:.0f} MB; qemu {qemu['version']}, lock hash {state['lock_hash']}"
    )
    return status()


def describe() -> str:
    """One line for ``doctor``: ready (qemu, runtimes), not installed (and how), or what this host lacks."""
    st = status()
    if not st.usable:
        return st.problem or "toolchain 'aarch64' is not usable"
    state = read_state() or {}
    p = st.packages
    return (
        f"ready: qemu-aarch64 {state.get('qemu', {}).get('version', '?')}, Debian {SUITE} arm64, Python "
        f"{st.python}, ai-edge-litert {p.get('ai-edge-litert', '?')}, onnxruntime {p.get('onnxruntime', '?')} "
        f"(cores: {', '.join(CPUS)}; emulated: numerics only, no speed)"
    )
