"""A real sshd for tests: own host and client keys, a free loopback port, stopped after.

Imported by the ssh store tests (not by conftest). Needs openssh-server and root (sshd's privilege
separation); the tests that use it skip, saying so, without them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)
MISSING = (
    None
    if SSHD and shutil.which("ssh") and shutil.which("ssh-keygen") and os.geteuid() == 0
    else "needs openssh-server, openssh-client and root (CI installs them: apt-get install openssh-server)"
)
needs_sshd = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


@dataclass(frozen=True)
class Sshd:
    port: int
    options: str  # for $EDGEKIT_SSH_OPTIONS: -o Key=Value only

    def url(self, path: Path | str) -> str:
        return f"ssh://root@127.0.0.1:{self.port}{path}"

    def option_list(self) -> list[str]:
        return self.options.split()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def sshd(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sshd]:
    from edge.store import SSH_OPTIONS_ENV

    d = tmp_path_factory.mktemp("sshd")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host")], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "client")], check=True)
    (d / "authorized_keys").write_text((d / "client.pub").read_text())
    port = _free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host'}\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
        f"PidFile {d / 'sshd.pid'}\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
        "StrictModes no\nPermitRootLogin prohibit-password\nMaxStartups 50\nMaxSessions 50\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)
    proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(d / "sshd_config")], stderr=subprocess.PIPE)
    options = (
        f"-o IdentityFile={d / 'client'} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
    )
    monkeypatch.setenv(SSH_OPTIONS_ENV, options)
    deadline = time.monotonic() + 10
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail(f"sshd did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
        time.sleep(0.05)
    try:
        yield Sshd(port, options)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
