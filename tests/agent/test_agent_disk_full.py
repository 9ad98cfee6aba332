"""A device whose disk is small or full (issue #33, red team "Disk"): the real agent on a 40 MiB filesystem.

The agent (``python -m edge.agent``) runs in a user and mount namespace (``unshare -rm``) with its store on a
40 MiB tmpfs mounted there; the test reaches that filesystem through ``/proc/<pid>/root``. Before: a download
with no declared size and an endless chunked body filled the store to ENOSPC (the 8 GiB cap is more than a
device's disk), and with the filesystem full the agent's network loop logged an internal error every second
and sent no telemetry. Now the download is bounded by the free space (``disk_full``, the partial file
deleted) and telemetry goes on from memory (``spool.in_memory``, ``spool.disk_error``).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from edge.mqtt.client import BrokerConfig, paho
from tests.agent.test_agent_rollout import DEVICE, FLEET, Fleet
from tests.support.cli import wait_for

FS_MIB = 40


def _namespace_or_skip() -> None:
    exe = shutil.which("unshare")
    if exe is None:
        pytest.skip("unshare (util-linux) not found: a small filesystem needs a mount namespace")
    p = subprocess.run(
        [exe, "-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"], capture_output=True, text=True, timeout=30
    )
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {p.stderr.strip()[:200]}")


class EndlessServer:
    """HTTP answering every GET with a chunked body that never ends (no Content-Length); counts bytes sent."""

    def __init__(self) -> None:
        self.sent = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                chunk = b"%x\r\n%s\r\n" % (1 << 16, b"\0" * (1 << 16))
                try:
                    while True:
                        self.wfile.write(chunk)
                        server.sent += 1 << 16
                except OSError:
                    return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> EndlessServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/endless.tar"


class Telemetry:
    def __init__(self, url: str) -> None:
        mqtt = paho()
        cfg = BrokerConfig.from_url(url)
        self.messages: list[dict[str, Any]] = []
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="test-telemetry", protocol=mqtt.MQTTv5)
        self.c.on_message = lambda _c, _u, m: self.messages.append(json.loads(m.payload))
        self.c.connect(cfg.host, cfg.port)
        self.c.subscribe(f"edgekit/{FLEET}/{DEVICE}/telemetry", qos=1)
        self.c.loop_start()

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


@pytest.fixture
def small_disk_agent(tmp_path: Path, broker: Any) -> Iterator[tuple[subprocess.Popen[str], Path, Path]]:
    """The agent with its store on a 40 MiB tmpfs in its own mount namespace; (process, store, log)."""
    with _small_disk_agent(tmp_path, broker, full=False) as agent:
        yield agent


@contextmanager
def _small_disk_agent(tmp_path: Path, broker: Any, *, full: bool) -> Iterator[tuple[subprocess.Popen[str], Path, Path]]:
    """``full``: the filesystem is filled before the agent starts (its outbox file cannot even be created)."""
    _namespace_or_skip()
    mnt = tmp_path / "small"
    mnt.mkdir()
    store = mnt / "store"
    agent = [sys.executable, "-m", "edge.agent", "--device-id", DEVICE, "--fleet", FLEET, "--store", str(store)]
    agent += ["--broker", broker.url, "--source", "none", "--interval", "0.3"]
    agent += ["--reconnect-max", "1", "--flush-timeout", "1"]
    fill = ' && { cat /dev/zero > "$1/filler" 2>/dev/null; true; }' if full else ""
    script = f'mount -t tmpfs -o size={FS_MIB}m tmpfs "$1" && mkdir "$1/store"{fill} && shift && exec "$@"'
    log = tmp_path / "agent.log"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    with open(log, "w") as f:
        proc = subprocess.Popen(
            ["unshare", "-rm", "sh", "-c", script, "sh", str(mnt), *agent],
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
    try:
        yield proc, store, log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        print(log.read_text()[-3000:])


def test_a_full_disk_bounds_downloads_and_telemetry_goes_on(
    small_disk_agent: tuple[subprocess.Popen[str], Path, Path], broker: Any
) -> None:
    proc, store, log = small_disk_agent
    fleet, tel = Fleet(broker.url), Telemetry(broker.url)
    try:
        wait_for(lambda: tel.messages, 30, "the agent's first telemetry")
        seen = Path(f"/proc/{proc.pid}/root") / str(store).lstrip("/")  # the store, through the agent's namespace
        assert shutil.disk_usage(seen).total <= FS_MIB << 20
        with EndlessServer() as http:
            fleet.desire(
                rollout_id="r1",
                bundle_id="endless",
                version=1,
                replaces=0,
                artifact_url=http.url,
                sha256="ab" * 32,  # no size declared
            )
            r = fleet.wait_state("failed", "running", "rolled-back", version=1, timeout=60)
        assert r["state"] == "failed" and r["reason"]["code"] == "disk_full", r["reason"]
        assert "declares no size" in r["reason"]["detail"]
        assert http.sent < (FS_MIB << 20) * 3 // 4, http.sent  # stopped at about half the free space, not at ENOSPC
        assert not list((seen / "agent" / "downloads").glob("*.part"))  # deleted, never resumed
        # fill the filesystem: the outbox's writes fail from now on
        filler = seen / "filler"
        with open(filler, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
            except OSError as e:
                assert e.errno == errno.ENOSPC
        n = len(tel.messages)
        full = wait_for(
            lambda: next((m for m in tel.messages[n:] if m["spool"].get("disk_error")), None),
            30,
            "telemetry that says the outbox's disk refused a write",
        )
        assert "full" in full["spool"]["disk_error"] and full["spool"]["in_memory"] >= 0  # (acknowledged ones leave)
        k = tel.messages.index(full)
        wait_for(lambda: len(tel.messages) >= k + 4, 30, "telemetry going on with the disk full")
        seqs = [m["seq"] for m in tel.messages[k : k + 4]]
        assert seqs == sorted(seqs) and len(set(seqs)) == 4, seqs
        assert proc.poll() is None
        text = log.read_text()
        assert "internal error" not in text and "Traceback" not in text, text[-3000:]
        assert text.count("messages are kept in memory") == 1, text[-3000:]  # said once, not every second
    finally:
        fleet.close()
        tel.close()


def test_a_disk_full_before_the_first_start_still_reports(tmp_path: Path, broker: Any) -> None:
    """The outbox file cannot be created: the agent runs on an in-memory outbox and says so in its telemetry
    (before: the agent could not start, and systemd restarted it for ever with nothing reported)."""
    with _small_disk_agent(tmp_path, broker, full=True) as (proc, _store, log):
        tel = Telemetry(broker.url)
        try:
            first = wait_for(lambda: tel.messages[:1], 30, "telemetry from an agent whose disk is full")[0]
            assert "cannot open" in first["spool"]["disk_error"], first["spool"]
            wait_for(lambda: len(tel.messages) >= 3, 30, "telemetry going on")
            assert proc.poll() is None
            assert "internal error" not in log.read_text()
            # no device key could be written (issue #33's signed births): the agent reports unsigned and leaves no
            # half-written key behind, which would stop every later start as a damaged key (before: ENOSPC crash)
            assert "births and deaths go unsigned" in log.read_text()
            agent_dir = Path(f"/proc/{proc.pid}/root") / str(_store).lstrip("/") / "agent"
            assert not (agent_dir / "device-key.pem").exists() and not list(agent_dir.glob(".device-key*"))
        finally:
            tel.close()
