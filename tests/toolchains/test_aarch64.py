"""The aarch64 emulator toolchain: what it installed runs the device runtimes on the ARM instruction set."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest

from edge import toolchains
from edge.errors import EdgeError
from edge.toolchains import aarch64
from tests.support.cli import run_cli
from tests.support.emulation import emulator_or_skip

_INDEX = """Package: qemu-system
Version: 1:10.0.2
Architecture: amd64
Filename: pool/main/q/qemu/qemu-system_10.0.2_amd64.deb
SHA256: {a}

Package: qemu-user
Version: 1:10.0.2+ds-2~bpo12+1
Architecture: amd64
Filename: pool/main/q/qemu/qemu-user_10.0.2_amd64.deb
SHA256: {b}
"""


def test_packages_index_is_read_and_checked() -> None:
    text = _INDEX.format(a="a" * 64, b="b" * 64)
    e = aarch64.parse_packages_index(text, "qemu-user")
    assert e == aarch64.DebEntry(
        "qemu-user", "1:10.0.2+ds-2~bpo12+1", "pool/main/q/qemu/qemu-user_10.0.2_amd64.deb", "b" * 64
    )
    assert aarch64.parse_packages_index(text, "qemu-user-static") is None
    for bad in (
        text.replace("pool/main/q/qemu/qemu-user_", "pool/../../etc/qemu-user_"),
        text.replace("b" * 64, "B" * 64),
        text.replace("Filename: pool", "Filename: /pool"),
    ):
        with pytest.raises(EdgeError, match="malformed"):
            aarch64.parse_packages_index(bad, "qemu-user")
    assert lzma.decompress(lzma.compress(text.encode())).decode() == text  # what the install reads: xz


def test_a_host_that_cannot_is_told_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(toolchains.ENV_VAR, str(tmp_path / "tc"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no debootstrap, dpkg-deb or wget on it
    monkeypatch.setattr(aarch64, "_which", lambda p: None)
    problems = aarch64.host_problems()
    assert any("debootstrap, dpkg-deb, wget missing" in p for p in problems), problems
    st = toolchains.status("aarch64")
    assert not st.usable and "cannot be installed on this host" in (st.problem or "")
    assert "\n" not in (st.problem or "")
    with pytest.raises(toolchains.MissingDependencyError, match="debootstrap"):
        toolchains.install("aarch64")
    assert not (tmp_path / "tc" / "aarch64").exists()


def test_not_installed_names_the_install_command(tmp_path: Path) -> None:
    env = {toolchains.ENV_VAR: str(tmp_path / "tc")}
    doc = json.loads(run_cli("doctor", "--json", env=env).stdout)["emulation"]["aarch64"]
    assert doc["ready"] is False
    if not aarch64.host_problems():
        assert "edgekit toolchain install aarch64" in doc["detail"]


def test_the_installed_guest_is_an_arm_core() -> None:
    em = emulator_or_skip()
    st = toolchains.status("aarch64")
    assert st.usable and st.matches_reference and st.packages["onnxruntime"] == "1.32.0"
    assert st.lock_hash == toolchains.lock_hash(f"{k}=={v}" for k, v in st.packages.items())
    seen = aarch64.probe(em.with_cpu("cortex-a72"))  # Raspberry Pi 4: ARM part 0xd08, as qemu emulates it
    assert seen["machine"] == "aarch64" and seen["cpu_part"] == "0xd08", seen
    assert seen["versions"]["ai-edge-litert"] == "2.3.0" and seen["versions"]["numpy"] == "2.4.6"
    with pytest.raises(EdgeError, match="unknown emulated core 'max'"):
        em.with_cpu("max")
    doc = json.loads(run_cli("doctor", "--json").stdout)["emulation"]["aarch64"]
    assert doc["ready"] is True and "qemu-aarch64 10." in doc["detail"]


@pytest.mark.parametrize(
    "cpu, name",
    [("cortex-a72", "ARM Cortex-A72"), ("cortex-a76", "ARM Cortex-A76"), ("neoverse-n1", "ARM Neoverse-N1")],
)
def test_an_arm_core_is_named_from_its_part(cpu: str, name: str) -> None:
    from edge.capabilities import parse_cpuinfo

    text = aarch64.cpuinfo_text(cpu)  # what qemu 7.2 is given, and the form aarch64 Linux writes
    assert parse_cpuinfo(text).model == name
    # qemu 10 adds a generic model name, as some kernels do: the part still names the core
    assert parse_cpuinfo("model name\t: ARMv8 Processor rev 1 (v8l)\n" + text).model == name
    assert "asimddp" in parse_cpuinfo(aarch64.cpuinfo_text("cortex-a76")).flags


def test_a_changed_emulator_or_wheel_set_is_noticed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """status() re-checks what toolchain.json recorded: the qemu binary's sha256 and the wheel set."""
    monkeypatch.setenv(toolchains.ENV_VAR, str(tmp_path))
    em = aarch64.Emulator(aarch64.toolchain_dir())
    for f, text in ((em.qemu, "qemu"), (em.python, "python")):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    (em.site / "numpy-2.4.6.dist-info").mkdir(parents=True)
    state = {
        "spec_hash": aarch64.spec_hash(),
        "qemu": {"sha256": aarch64.file_sha256(em.qemu), "version": "10.0.2"},
        "site_fingerprint": aarch64.site_fingerprint(em.site),
        "packages": {"numpy": "2.4.6"},
        "python_version": "3.11.2",
        "lock_hash": "0" * 64,
    }
    (em.path / toolchains.STATE_FILE).write_text(json.dumps(state))
    assert aarch64.status().usable, aarch64.status().problem
    em.qemu.write_text("another qemu")
    assert "changed since it was installed" in (aarch64.status().problem or "")
    em.qemu.write_text("qemu")
    (em.site / "numpy-2.4.5.dist-info").mkdir()
    assert "packages in" in (aarch64.status().problem or "")
    (em.site / "numpy-2.4.5.dist-info").rmdir()
    (em.path / toolchains.STATE_FILE).write_text(json.dumps({**state, "spec_hash": "0" * 64}))
    assert "another version of its spec" in (aarch64.status().problem or "")
