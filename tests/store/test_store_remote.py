"""The ssh store's edges, without sshd: strict URLs, ssh options, one constant script with quoted arguments."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from edge.errors import DeployError
from edge.store import SSH_OPTIONS_ENV, SshStore, open_store, parse_ssh_options, parse_ssh_url
from edge.store.remote import REMOTE_SCRIPT
from tests.support.cli import assert_user_error, run_cli


@pytest.mark.parametrize(
    "url, needle",
    [
        ("ssh://hostonly", "no store path"),
        ("ssh://host/", "no store path"),
        ("ssh://host/store#frag", "fragment"),
        ("ssh://host/store?x=1", "query"),
        ("ssh://-oProxyCommand=touch%20x/store", "must not start with '-'"),
        ("ssh://-oProxyCommand=x@host/store", "must not start with '-'"),
        ("ssh://host:0/store", "port '0'"),
        ("ssh://host:99999/store", "port '99999'"),
        ("ssh://host:x/store", "port 'x'"),
        ("ssh://host:/store", "empty port"),
        ("ssh://@host/store", "empty user"),
        ("ssh:///store", "no host"),
        ("ssh://ho$t/store", "host 'ho$t'"),
        ("ssh://us;er@host/store", "user 'us;er'"),
        ("ssh://host/st ore", "spaces or control"),
        ("ssh://host/st$(id)ore", "path '/st$(id)ore'"),
        ("ssh://host/a\nb", "spaces or control"),
        ("ssh://[zz]/store", "not an IPv6 address"),
    ],
)
def test_bad_ssh_urls_are_one_clear_line(url: str, needle: str) -> None:
    with pytest.raises(DeployError, match="bad device URL") as e:
        parse_ssh_url(url)
    assert needle in str(e.value) and "\n" not in str(e.value).replace(repr(url), "")


def test_good_ssh_urls() -> None:
    a = parse_ssh_url("ssh://orin@cam-01:2222/var/lib/edgekit/")
    assert (a.user, a.host, a.port, a.path, a.login) == ("orin", "cam-01", 2222, "/var/lib/edgekit", "orin@cam-01")
    b = parse_ssh_url("ssh://[fe80::1]/srv/store")
    assert (b.user, b.host, b.port, b.path) == (None, "fe80::1", None, "/srv/store")


@pytest.mark.parametrize(
    "text, needle",
    [
        ('-o "x', "cannot be parsed: No closing quotation"),
        ("-oProxyCommand=touch /tmp/x", "'-oProxyCommand=touch' is not accepted"),
        ("-o ProxyCommand=touch /tmp/x", "ProxyCommand is refused"),
        ("-o localcommand=id", "localcommand is refused"),
        ("-o PermitLocalCommand=yes", "PermitLocalCommand is refused"),
        ("-o KnownHostsCommand=id", "KnownHostsCommand is refused"),
        ("-o RemoteCommand=id", "RemoteCommand is refused"),
        ("-i key", "'-i' is not accepted"),
        ("-o", "'-o' is not accepted"),
        ("-o Port", "is not Key=Value"),
    ],
)
def test_ssh_options_accept_only_harmless_o_key_value(text: str, needle: str) -> None:
    with pytest.raises(DeployError, match="EDGEKIT_SSH_OPTIONS") as e:
        parse_ssh_options(text)
    assert needle in str(e.value)


def test_ssh_options_kept_as_given() -> None:
    assert parse_ssh_options('-o IdentityFile="/k/my key" -o Port=22') == [
        "-o",
        "IdentityFile=/k/my key",
        "-o",
        "Port=22",
    ]


def test_cli_refuses_bad_addresses_and_options_in_one_line(tmp_path: Path) -> None:
    assert_user_error(run_cli("rollback", "--device", "ssh://host/store#frag"), "bad device URL", "fragment")
    assert_user_error(run_cli("rollback", "--device", "ssh://-oProxyCommand=x/s"), "bad device URL", "'-'")
    p = run_cli("rollback", "--device", "ssh://host/store", env={SSH_OPTIONS_ENV: '-o "x'})
    assert_user_error(p, SSH_OPTIONS_ENV, "cannot be parsed")
    pwned = tmp_path / "PWNED"
    p = run_cli(
        "rollback", "--device", "ssh://127.0.0.1/store", env={SSH_OPTIONS_ENV: f"-o ProxyCommand=touch {pwned}"}
    )
    assert_user_error(p, "ProxyCommand is refused")
    assert not pwned.exists()


def test_the_remote_command_is_the_constant_script_with_quoted_arguments() -> None:
    s = SshStore("ssh://me@dev:2200/srv/store", options=["-o", "ConnectTimeout=5"])
    hostile = "x$(id>PWNED)'\"; touch PWNED #"
    argv = s.argv("manifest", hostile)
    assert argv[-3:-1] == ["--", "dev"] and argv[argv.index("-p") + 1] == "2200" and argv[argv.index("-l") + 1] == "me"
    # the remote shell splits the one command string back into exactly these words, the script untouched
    assert shlex.split(argv[-1]) == ["sh", "-c", REMOTE_SCRIPT, "edgekit", "manifest", "/srv/store", hostile]
    assert hostile not in REMOTE_SCRIPT and "/srv/store" not in REMOTE_SCRIPT


def _script(*args: str, env: dict[str, str] | None = None, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """The device script run directly by sh, as sshd would run it (no ssh needed to test it)."""
    return subprocess.run(
        ["sh", "-c", REMOTE_SCRIPT, "edgekit", *args], input=stdin, capture_output=True, env=env, timeout=60
    )


SHA = "0" * 64


def test_the_script_refuses_hostile_values_and_runs_none_of_them(tmp_path: Path) -> None:
    pwned = tmp_path / "PWNED"
    store = tmp_path / "store"
    for args in (
        ["install", str(store), "5", f"x$(touch {pwned})", "1", SHA, "manifest.json"],
        ["install", str(store), "5", "..", "0", SHA, "manifest.json"],
        ["install", str(store), "5", "ok", "0", SHA, "../../etc/passwd"],
        ["install", str(store), "5$(touch " + str(pwned) + ")", "ok", "0", SHA, "a"],
        ["manifest", str(store), f"`touch {pwned}`"],
        ["rollback", str(store), "5", "a;b", SHA, "a"],
        ["install", "relative/path", "5", "ok", "0", SHA, "a"],
    ):
        p = _script(*args)
        assert p.returncode == 66, (args, p.stderr)
        assert p.stderr.decode().startswith("edgekit-store: bad arguments")
    # a store path full of shell syntax is only ever a directory name
    odd = tmp_path / f"s$(touch {pwned})"
    p = _script("install", str(odd), "5", "ok", "0", SHA, "manifest.json")
    assert p.returncode == 3, p.stderr  # "send me the bundle": it got as far as looking for it
    assert odd.is_dir() and not pwned.exists()


def test_mkdir_lock_when_the_device_has_no_flock(tmp_path: Path) -> None:
    """Without flock(1) the script locks with mkdir; a lock whose owner died is taken over."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in (
        "sh",
        "mkdir",
        "rm",
        "mv",
        "cat",
        "head",
        "tr",
        "sleep",
        "readlink",
        "ln",
        "tail",
        "grep",
        "date",
        "od",
        "sync",
        "touch",
        "sha256sum",
        "printf",
    ):
        path = subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        if path.startswith("/"):
            os.symlink(path, bin_ / tool)
    env = {"PATH": str(bin_)}
    store = tmp_path / "store"
    (store / "bundles").mkdir(parents=True)
    (store / ".lock.d").mkdir()
    (store / ".lock.d" / "pid").write_text(f"{os.getpid()}\n")  # a live owner: wait, then busy
    p = _script("rollback", str(store), "1", "A", SHA, "manifest.json", env=env)
    assert p.returncode == 75 and f"busy {os.getpid()}" in p.stderr.decode(), p.stderr
    dead = subprocess.Popen(["true"])
    dead.wait()
    (store / ".lock.d" / "pid").write_text(f"{dead.pid}\n")  # its owner is gone: taken over
    p = _script("rollback", str(store), "1", "A", SHA, "manifest.json", env=env)
    assert p.returncode == 69, p.stderr  # got the lock; nothing to roll back to
    assert not (store / ".lock.d").exists()  # and released it


def test_open_store_passes_no_step_hook_to_ssh() -> None:
    with pytest.raises(DeployError, match="step hooks run only for local stores"):
        open_store("ssh://host/store", on_step=lambda s: None)
