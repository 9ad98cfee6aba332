"""Shipping over ssh:// against a real sshd on a loopback port (key auth, temporary config)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from edge.convert import convert
from edge.deploy import SSH_OPTIONS_ENV, rollback, ship

pytestmark = pytest.mark.skipif(
    not (shutil.which("sshd") or Path("/usr/sbin/sshd").exists()) or not shutil.which("rsync")
    or not shutil.which("ssh-keygen") or os.geteuid() != 0,
    reason="needs openssh-server, rsync and root (CI installs them: apt-get install openssh-server rsync)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def sshd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    d = tmp_path / "ssh"
    d.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host")], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "client")], check=True)
    (d / "authorized_keys").write_text((d / "client.pub").read_text())
    port = _free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host'}\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
        f"PidFile {d / 'sshd.pid'}\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
        "StrictModes no\nPermitRootLogin prohibit-password\n")
    Path("/run/sshd").mkdir(exist_ok=True)
    proc = subprocess.Popen([shutil.which("sshd") or "/usr/sbin/sshd", "-D", "-e", "-f", str(d / "sshd_config")],
                            stderr=subprocess.PIPE)
    opts = f"-i {d / 'client'} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
    monkeypatch.setenv(SSH_OPTIONS_ENV, opts)
    deadline = time.monotonic() + 10
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail(f"sshd did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
        time.sleep(0.05)
    yield port
    proc.terminate()
    proc.wait(timeout=10)


def test_ship_verify_switch_and_rollback_over_ssh(models: dict[str, Path], tmp_path: Path, sshd: int) -> None:
    remote = tmp_path / "remote-store"
    url = f"ssh://root@127.0.0.1:{sshd}{remote}"
    a = convert(models["tiny"], "x86-cpu", tmp_path / "a")
    b = convert(models["tiny"], "x86-cpu", tmp_path / "b", precision="fp16")
    ship(a, url)
    assert os.readlink(remote / "current") == f"bundles/{a.id}"
    ship(b, url)
    assert os.readlink(remote / "current") == f"bundles/{b.id}"
    assert os.readlink(remote / "previous") == f"bundles/{a.id}"
    assert (remote / "bundles" / b.id / "manifest.json").exists()
    assert not [p for p in (remote / "bundles").iterdir() if p.name.startswith(".")]
    assert rollback(url) == a.id
    assert os.readlink(remote / "current") == f"bundles/{a.id}"
    assert len((remote / "history.jsonl").read_text().splitlines()) == 2


def test_corrupted_transfer_is_not_switched_to(models: dict[str, Path], tmp_path: Path, sshd: int) -> None:
    remote = tmp_path / "remote-store"
    a = convert(models["tiny"], "x86-cpu", tmp_path / "a")
    ship(a, f"ssh://root@127.0.0.1:{sshd}{remote}")
    b = convert(models["tiny"], "x86-cpu", tmp_path / "b", precision="fp16")
    b.manifest["artifacts"][0]["sha256"] = "0" * 64  # what the device must check against
    from edge.bundle import Bundle
    from edge.deploy import SshStore
    from edge.errors import DeployError

    store = SshStore(f"ssh://root@127.0.0.1:{sshd}{remote}",
                     ssh=("ssh", "-o", "BatchMode=yes", *os.environ[SSH_OPTIONS_ENV].split()))
    with pytest.raises(DeployError, match="failed sha256 verification on the device"):
        store.install(Bundle(b.path, b.manifest))
    assert os.readlink(remote / "current") == f"bundles/{a.id}"
    assert sorted(p.name for p in (remote / "bundles").iterdir()) == [a.id]  # no partial left behind
