"""$EDGEKIT_SSH_OPTIONS is an allow-list, checked against a real sshd (issue #26 item 10).

Before the allow-list, ``-o XAuthLocation=PROG -o ForwardX11=yes`` with DISPLAY set ran PROG on the build
host, and ``-o Hostname=`` sent a deploy to another host than the URL names.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edge.errors import DeployError
from edge.store import SSH_OPTIONS_ENV, parse_ssh_options
from tests.support.cli import assert_user_error, run_cli
from tests.support.sshd_server import Sshd, needs_sshd, sshd  # noqa: F401  (sshd: the fixture)

pytestmark = needs_sshd


@pytest.mark.parametrize(
    "option",
    [
        "XAuthLocation=/bin/true",
        "ForwardX11=yes",
        "Hostname=10.0.0.1",
        "ProxyJump=evil",
        "ControlPath=/tmp/other",
        "User=other",
        "ForwardAgent=yes",
        "LocalForward=1234 localhost:22",
        "SendEnv=*",
        "Tunnel=yes",
    ],
)
def test_options_outside_the_allow_list_are_refused_in_one_line(option: str) -> None:
    with pytest.raises(DeployError, match=f"{option.split('=')[0]} is refused") as e:
        parse_ssh_options(f"-o IdentityFile=/k -o '{option}'")
    assert "IdentityFile" in (e.value.hint or "")  # the hint lists what is allowed


def test_xauthlocation_and_hostname_never_reach_ssh(tmp_path: Path, sshd: Sshd) -> None:
    remote = tmp_path / "store"
    marker = tmp_path / "PWNED"
    prog = tmp_path / "xauth"
    prog.write_text(f"#!/bin/sh\ntouch {marker}\n")
    prog.chmod(0o755)
    p = run_cli(
        "rollback",
        "--device",
        sshd.url(remote),
        env={SSH_OPTIONS_ENV: f"{sshd.options} -o XAuthLocation={prog} -o ForwardX11=yes", "DISPLAY": ":0"},
    )
    assert_user_error(p, SSH_OPTIONS_ENV, "XAuthLocation is refused")
    assert not marker.exists()
    # the URL names a host that does not exist; Hostname= would have sent the deploy to the real sshd
    p = run_cli(
        "rollback",
        "--device",
        f"ssh://root@device.invalid:{sshd.port}{remote}",
        env={SSH_OPTIONS_ENV: f"{sshd.options} -o Hostname=127.0.0.1"},
    )
    assert_user_error(p, SSH_OPTIONS_ENV, "Hostname is refused")


def test_allowed_options_still_reach_the_device(tmp_path: Path, sshd: Sshd) -> None:
    remote = tmp_path / "store"
    env = {SSH_OPTIONS_ENV: f"{sshd.options} -o ConnectTimeout=5 -o ServerAliveInterval=5 -o Port={sshd.port}"}
    p = run_cli("rollback", "--device", sshd.url(remote), "--json", env=env)
    assert_user_error(p, "does not exist")  # the answer came from the device: ssh connected and ran the script
