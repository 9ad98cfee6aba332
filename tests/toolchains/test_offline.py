"""Offline toolchain runs (issue 11, attack 8): no socket of any protocol, from any process of the run.

A probe script is started through :func:`edge.toolchains.offline_popen`, the launcher every driver
run goes through. It tries what a converter stack could: a TCP connection (``create_connection``,
a raw ``_socket.socket``, ``connect_ex``) and UDP datagrams (``sendto``, ``sendmsg``) to listeners
this test opened on 127.0.0.1 in its own namespace, and a child ``python -c`` that connects. Without
the launcher all of it gets through (so these tests can fail); through it, nothing does, with the
network namespace alone, with the in-process guard alone, and with what the host allows (the
default). Local IPC (a Unix socket) keeps working. Then real conversions record what was enforced
in the manifest.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from edge import toolchains
from edge.errors import EdgeError
from edge.pipeline.request import ConvertRequest
from tests.support.skips import HARDWARE

PROBE = r"""
import _socket, json, os, socket, subprocess, sys

tcp, udp, unix = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
out = {}

def attempt(name, fn):
    try:
        r = fn()
    except OSError as e:
        out[name] = f"refused: errno {e.errno}: {e.strerror or e}"
        return
    out[name] = f"refused: errno {r}" if name == "connect_ex" and r != 0 else "ok"

attempt("create_connection", lambda: socket.create_connection(("127.0.0.1", tcp), timeout=3))
attempt("raw_socket_connect", lambda: _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM).connect(("127.0.0.1", tcp)))
attempt("connect_ex", lambda: socket.socket().connect_ex(("127.0.0.1", tcp)))
attempt("udp_sendto", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"sendto", ("127.0.0.1", udp)))
attempt("udp_sendmsg", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendmsg([b"sendmsg"], [], 0,
                                                                                          ("127.0.0.1", udp)))
child = subprocess.run([sys.executable, "-c", "import socket, sys; socket.socket().connect(('127.0.0.1', int(sys.argv[1])))",
                        str(tcp)], capture_output=True, text=True)
out["child_connect"] = "ok" if child.returncode == 0 else "refused: " + (child.stderr.strip().splitlines() or ["?"])[-1]
attempt("unix_connect", lambda: socket.socket(socket.AF_UNIX).connect(unix))
out["env"] = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "PIP_NO_INDEX", "https_proxy")}
print(json.dumps(out))
"""
NETWORK = ("create_connection", "raw_socket_connect", "connect_ex", "udp_sendto", "udp_sendmsg", "child_connect")


class Listeners:
    """What the probe aims at, opened here (the parent's namespace): TCP, UDP and a Unix socket."""

    def __init__(self, tmp: Path) -> None:
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(16)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.unix_path = str(tmp / "ipc.sock")
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(self.unix_path)
        self.unix.listen(4)

    @property
    def args(self) -> list[str]:
        return [str(self.tcp.getsockname()[1]), str(self.udp.getsockname()[1]), self.unix_path]

    def tcp_connections(self) -> int:
        """Connections that reached the TCP listener (completed handshakes waiting in its backlog)."""
        self.tcp.settimeout(0.3)
        n = 0
        try:
            while True:
                conn, _ = self.tcp.accept()
                conn.close()
                n += 1
        except TimeoutError:
            return n

    def datagrams(self) -> list[bytes]:
        self.udp.settimeout(0.3)
        got = []
        try:
            while True:
                got.append(self.udp.recv(64))
        except TimeoutError:
            return got

    def close(self) -> None:
        for s in (self.tcp, self.udp, self.unix):
            s.close()


@pytest.fixture
def listeners(tmp_path: Path) -> Iterator[Listeners]:
    ls = Listeners(tmp_path)
    yield ls
    ls.close()


def _probe(
    tmp_path: Path, listeners: Listeners, **launch: Any
) -> tuple[dict[str, Any], dict[str, Any] | None, list[str]]:
    """Run the probe through offline_popen (``launch`` its options), or plainly when ``launch`` is None."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    argv = [sys.executable, str(script), *listeners.args]
    attempts_log = tmp_path / "attempts.log"
    if launch.pop("plain", False):
        proc: subprocess.Popen[str] = subprocess.Popen(
            argv, stdout=subprocess.PIPE, text=True, env=toolchains._clean_env()
        )
        record = None
    else:
        proc, record = toolchains.offline_popen(
            argv, env=toolchains._clean_env(), attempts_log=attempts_log, stdout=subprocess.PIPE, text=True, **launch
        )
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    return json.loads(out), record, toolchains.offline_attempts(attempts_log)


def _assert_nothing_got_out(result: dict[str, Any], listeners: Listeners) -> None:
    leaked = {k: result[k] for k in NETWORK if not result[k].startswith("refused")}
    assert not leaked, f"reached the network: {leaked}"
    assert listeners.tcp_connections() == 0 and listeners.datagrams() == []
    assert result["unix_connect"] == "ok"  # local IPC is not network


def _namespace_or_skip() -> toolchains.NetworkIsolation:
    iso = toolchains.network_isolation()
    if not iso.prefix:
        pytest.skip(f"{HARDWARE}no network namespace on this host: {iso.reason}")
    return iso


def test_without_the_launcher_everything_gets_through(tmp_path: Path, listeners: Listeners) -> None:
    """The control: the probe really reaches the listeners, so the tests below can fail."""
    result, _, _ = _probe(tmp_path, listeners, plain=True)
    assert all(result[k] == "ok" for k in NETWORK), result
    assert listeners.tcp_connections() == 4  # create_connection, _socket, connect_ex, the child
    assert sorted(listeners.datagrams()) == [b"sendmsg", b"sendto"]
    assert result["env"]["HF_HUB_OFFLINE"] is None


def test_network_namespace_alone_stops_every_socket(tmp_path: Path, listeners: Listeners) -> None:
    """The kernel refuses: no Python guard loaded, so this holds for native code and any child too."""
    _namespace_or_skip()
    result, record, attempts = _probe(tmp_path, listeners, namespace=True, seccomp=False, guard=False)
    _assert_nothing_got_out(result, listeners)
    assert (
        "Network is unreachable" in result["create_connection"] and "Network is unreachable" in result["child_connect"]
    )
    assert record is not None and record["enforced"] == toolchains.NAMESPACE and record["in_process_guard"] is False
    assert attempts == []  # nothing in the process named them: the kernel alone stopped them


def test_in_process_guard_alone_stops_python_sockets(tmp_path: Path, listeners: Listeners) -> None:
    """The fallback: every Python process of the run (the child included) refuses, and names the attempts."""
    result, record, attempts = _probe(tmp_path, listeners, namespace=False, seccomp=False, guard=True)
    _assert_nothing_got_out(result, listeners)
    assert all("edgekit: network access refused" in result[k] or result[k] == "refused: errno 101" for k in NETWORK), (
        result
    )
    assert (
        record is not None
        and record["weak"] is True
        and record["enforced"]
        == (f"{toolchains.WEAK} (namespace unavailable: not requested; seccomp unavailable: not requested)")
    )
    port = listeners.args[0]
    kinds = [a.split(" ", 1)[0] for a in attempts]
    assert sorted(kinds) == ["connect", "connect", "connect", "create_connection", "sendmsg", "sendto"], attempts
    assert all(port in a for a in attempts if not a.startswith("send"))
    assert len({a.split("(pid ")[1].split(":")[0] for a in attempts}) == 2  # the probe and its child


def test_default_uses_what_the_host_allows(tmp_path: Path, listeners: Listeners) -> None:
    iso = toolchains.network_isolation()
    result, record, attempts = _probe(tmp_path, listeners)
    _assert_nothing_got_out(result, listeners)
    assert record is not None and record["enforced"] == iso.enforced and record["in_process_guard"] is True
    # the guard names them whichever layer would have stopped them; under the seccomp filter (inside the namespace
    # too, issue #33) socket() itself fails, so only create_connection, wrapped before it makes a socket, is named
    assert len(attempts) == (1 if iso.seccomp else 6), attempts
    # downloaders' own offline switches, and a proxy that goes nowhere, reach the process too
    assert result["env"] == {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PIP_NO_INDEX": "1",
        "https_proxy": "http://127.0.0.1:9",
    }
    if iso.prefix:
        assert record["enforced"].startswith("network namespace (unshare -n)")
        assert record["namespace_command"].startswith("unshare --net")
    else:
        assert record["enforced"].startswith("in-process socket guard (namespace unavailable: ")


def test_namespace_can_be_switched_off(tmp_path: Path, listeners: Listeners, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(toolchains.NETNS_ENV, "0")
    result, record, _ = _probe(tmp_path, listeners)
    _assert_nothing_got_out(result, listeners)
    assert record is not None and record["weak"] is False
    assert record["enforced"] == f"{toolchains.SECCOMP} (namespace unavailable: disabled by EDGEKIT_NETNS=0)"
    with pytest.raises(EdgeError, match="no network namespace on this host: disabled by EDGEKIT_NETNS=0"):
        toolchains.offline_popen([sys.executable, "-c", "pass"], env={}, namespace=True)
    with pytest.raises(EdgeError, match="needs a network namespace, the seccomp filter or the in-process guard"):
        toolchains.offline_popen([sys.executable, "-c", "pass"], env={}, namespace=False, seccomp=False, guard=False)


# -- what the in-process guard alone cannot stop (issue #26 item 12) --------------------------------------

BYPASS = r"""
import ctypes, json, shutil, socket, struct, subprocess, sys

tcp, unix = int(sys.argv[1]), sys.argv[2]
out = {}
libc = ctypes.CDLL(None, use_errno=True)

def native():  # the C library's socket() and connect(), as TensorFlow's C++ or any native extension would
    fd = libc.socket(2, 1, 0)
    if fd < 0:
        return f"refused: socket errno {ctypes.get_errno()}"
    addr = struct.pack("=HH4s8x", 2, socket.htons(tcp), socket.inet_aton("127.0.0.1"))
    return "ok" if libc.connect(fd, addr, len(addr)) == 0 else f"refused: connect errno {ctypes.get_errno()}"

class Sneaky(socket.socket):  # super().connect: the C type's own method, past any patched Python one
    def go(self, a):
        return super(socket.socket, self).connect(a)

def sneaky():
    try:
        Sneaky().go(("127.0.0.1", tcp))
        return "ok"
    except OSError as e:
        return f"refused: {e}"

out["ctypes_connect"] = native()
out["super_connect"] = sneaky()
child = subprocess.run([sys.executable, "-I", "-c", "import socket, sys; socket.socket().connect(('127.0.0.1', "
                        "int(sys.argv[1])))", str(tcp)], capture_output=True, text=True)
out["isolated_child"] = "ok" if child.returncode == 0 else "refused: " + (child.stderr.strip().splitlines() or ["?"])[-1]
curl = shutil.which("curl")
if curl:
    c = subprocess.run([curl, "-sS", "-m", "5", "--noproxy", "*", f"http://127.0.0.1:{tcp}/"], capture_output=True,
                       text=True)
    out["curl"] = "refused: " + c.stderr.strip() if "Failed to connect" in c.stderr or "Couldn't" in c.stderr else "ok"
try:
    s = socket.socket(socket.AF_UNIX)
    s.connect(unix)
    out["unix_connect"] = "ok"
except OSError as e:
    out["unix_connect"] = f"refused: {e}"
print(json.dumps(out))
"""


def _bypass(tmp_path: Path, listeners: Listeners, **launch: Any) -> tuple[dict[str, str], dict[str, Any]]:
    script = tmp_path / "bypass.py"
    script.write_text(BYPASS)
    argv = [sys.executable, str(script), listeners.args[0], listeners.args[2]]
    proc, record = toolchains.offline_popen(
        argv, env=toolchains._clean_env(), stdout=subprocess.PIPE, text=True, **launch
    )
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    return json.loads(out), record


def _seccomp_or_skip() -> None:
    sc, why = toolchains.seccomp_isolation()
    if not sc:
        pytest.skip(f"{HARDWARE}no seccomp filter on this host: {why}")


def test_the_guard_alone_is_bypassed_and_the_seccomp_filter_is_not(tmp_path: Path, listeners: Listeners) -> None:
    """ctypes connect, super().connect, a `python -I` child and curl get past the in-process guard (the control:
    the test can fail); under the seccomp filter the kernel refuses every one, and local IPC still works."""
    _seccomp_or_skip()
    weak, record = _bypass(tmp_path, listeners, namespace=False, seccomp=False, guard=True)
    assert record["weak"] is True
    assert weak["ctypes_connect"] == "ok" and weak["isolated_child"] == "ok", weak
    assert listeners.tcp_connections() >= 2
    held, record = _bypass(tmp_path, listeners, namespace=False, guard=True)
    assert record["enforced"] == f"{toolchains.SECCOMP} (namespace unavailable: not requested)" and not record["weak"]
    leaked = {k: v for k, v in held.items() if k != "unix_connect" and not v.startswith("refused")}
    assert not leaked, held
    assert held["unix_connect"] == "ok" and listeners.tcp_connections() == 0


def test_the_weak_guard_alone_is_refused_unless_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(toolchains.NETNS_ENV, "0")
    monkeypatch.setenv(toolchains.SECCOMP_ENV, "0")
    with pytest.raises(EdgeError, match="cannot run a toolchain offline on this host") as e:
        toolchains.offline_popen([sys.executable, "-c", "pass"], env={})
    assert toolchains.WEAK_ENV in str(e.value)
    monkeypatch.setenv(toolchains.WEAK_ENV, "1")
    with caplog.at_level("WARNING", logger="edge.toolchains"):
        proc, record = toolchains.offline_popen([sys.executable, "-c", "pass"], env={})
        proc.wait(30)
    assert record["weak"] is True and record["enforced"].startswith(toolchains.WEAK), record
    assert any("ONLY (WEAK" in r.getMessage() for r in caplog.records)


# -- real conversions record it ------------------------------------------------------------


def _toolchain_or_skip(name: str) -> None:
    st = toolchains.status(name)
    if not st.usable:
        pytest.skip(f"needs the {name} toolchain: {st.problem}")


def _assert_offline_recorded(details: dict[str, Any], expected: str) -> None:
    offline = details["toolchain"]["offline"]
    assert offline["enforced"] == expected and offline["in_process_guard"] is True
    assert offline["attempts"] == []  # the converter stacks reached for nothing
    assert "HF_HUB_OFFLINE" in offline["env"]


def test_tflite_conversion_records_what_kept_it_offline(models: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("ai_edge_litert", reason="ai-edge-litert is not installed (pip install 'edgekit-ml[litert]')")
    _toolchain_or_skip("tflite")
    from edge.pipeline import convert

    b = convert(models["tiny"], "arm-xnnpack", tmp_path / "b", ConvertRequest(precision="fp32"))
    details = json.loads((b.path / "manifest.json").read_text())["chain"][0]["details"]
    _assert_offline_recorded(details, toolchains.network_isolation().enforced)
    assert details["network_attempts"] == []


@pytest.mark.parametrize("netns", ["default", "off"])
def test_coreml_conversion_records_what_kept_it_offline(
    models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, netns: str
) -> None:
    _toolchain_or_skip("coreml")
    from edge.pipeline import convert

    if netns == "off":  # the fallback, as on a host that refuses namespaces: the manifest says so
        monkeypatch.setenv(toolchains.NETNS_ENV, "0")
    b = convert(models["tiny"], "apple-ane", tmp_path / "b")
    details = json.loads((b.path / "manifest.json").read_text())["chain"][0]["details"]
    expected = toolchains.network_isolation().enforced
    if netns == "off":  # the kernel still holds it: the seccomp filter
        assert expected == f"{toolchains.SECCOMP} (namespace unavailable: disabled by EDGEKIT_NETNS=0)"
    _assert_offline_recorded(details, expected)


SETNS_PROBE = r"""
import ctypes, json, os, socket, sys
tcp, parent = int(sys.argv[1]), int(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(f"/proc/{parent}/ns/net", os.O_RDONLY)
joined = libc.setns(fd, 0x40000000) == 0  # CLONE_NEWNET: back into the parent's network namespace
try:
    socket.create_connection(("127.0.0.1", tcp), timeout=3).close()
    got = "ok"
except OSError as e:
    got = f"refused: errno {e.errno}: {e.strerror}"
print(json.dumps({"joined": joined, "connect": got}))
"""


def test_leaving_the_namespace_with_setns_finds_no_socket(tmp_path: Path, listeners: Listeners) -> None:
    """Issue #33 red team: root in the namespace joined the parent's network with setns() and connected (the
    namespace was the only layer there). The seccomp filter now runs inside the namespace too."""
    _namespace_or_skip()
    sc, why = toolchains.seccomp_isolation()
    if not sc:
        pytest.skip(f"{HARDWARE}no seccomp filter on this host: {why}")
    script = tmp_path / "setns.py"
    script.write_text(SETNS_PROBE)
    argv = [sys.executable, str(script), listeners.args[0], str(os.getpid())]
    proc, record = toolchains.offline_popen(
        argv, env=toolchains._clean_env(), guard=False, stdout=subprocess.PIPE, text=True
    )  # the kernel layers only: the in-process guard is bypassed by native code
    out, _ = proc.communicate(timeout=60)
    result = json.loads(out)
    assert result["connect"].startswith("refused"), result
    assert record["enforced"] == f"{toolchains.NAMESPACE} + {toolchains.SECCOMP}"
    assert listeners.tcp_connections() == 0
