"""Issue #26 items 1-4: a hostile broker or artifact server cannot crash, fill or fool the device agent.

A real Mosquitto, the real agent process (``python -m edge.agent``), a real HTTP server streaming an endless
body, real tar files (sparse, duplicate members, a directory then a file of the same name).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from edge.mqtt.client import BrokerConfig, paho
from tests.support.cli import wait_for

FLEET, DEVICE = "lab", "cam-09"
REPO = Path(__file__).resolve().parents[2]


class Watcher:
    """The fleet side: publishes retained desired states and cmd/tune requests, collects reported and tune."""

    def __init__(self, url: str) -> None:
        mqtt = paho()
        cfg = BrokerConfig.from_url(url)
        self.msgs: list[tuple[str, dict[str, Any]]] = []
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="test-hostile", protocol=mqtt.MQTTv5)
        self.c.on_message = lambda _c, _u, m: self.msgs.append((m.topic, json.loads(m.payload)))
        self.c.connect(cfg.host, cfg.port)
        for kind in ("reported", "tune", "birth", "telemetry", "state"):
            self.c.subscribe(f"edgekit/{FLEET}/{DEVICE}/{kind}", qos=1)
        self.c.loop_start()

    def publish(self, kind: str, body: dict[str, Any], *, retain: bool) -> None:
        self.c.publish(f"edgekit/{FLEET}/{DEVICE}/{kind}", json.dumps(body), qos=1, retain=retain).wait_for_publish(5)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [m for t, m in self.msgs if t.endswith("/" + kind)]

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


@pytest.fixture
def watcher(broker: Any) -> Iterator[Watcher]:
    w = Watcher(broker.url)
    yield w
    w.close()


def start_agent_process(url: str, store: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    store.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(log, "wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "edge.agent",
                "--device-id",
                DEVICE,
                "--fleet",
                FLEET,
                "--store",
                str(store),
                "--source",
                "none",
                "--broker",
                url,
                "--interval",
                "1",
                "--reconnect-max",
                "1",
                *extra,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


def stop(p: subprocess.Popen[bytes]) -> int:
    p.send_signal(signal.SIGTERM)
    try:
        return p.wait(20)
    except subprocess.TimeoutExpired:
        p.kill()
        return p.wait(5)


def desired(url: str, version: int = 2) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "type": "desired",
        "fleet": FLEET,
        "device": DEVICE,
        "rollout_id": f"r{version}",
        "bundle_id": "b-1",
        "version": version,
        "replaces": None,
        "artifact_url": url,
        "sha256": "0" * 64,
    }


# -- item 1: a hostile retained desired state --------------------------------------------------------------


@pytest.mark.parametrize("url", ["http://[::1/x", "file:///srv/artifacts/b%00.tar", "http://host:99999/b.tar"])
def test_hostile_retained_desired_state_is_reported_failed_once(
    tmp_path: Path, broker: Any, watcher: Watcher, url: str
) -> None:
    (tmp_path / "artifacts").mkdir()
    watcher.publish("desired", desired(url.replace("/srv/artifacts", str(tmp_path / "artifacts"))), retain=True)
    log = tmp_path / "agent.log"
    p = start_agent_process(broker.url, tmp_path / "store", log, "--artifact-root", str(tmp_path / "artifacts"))
    try:
        wait_for(lambda: [r for r in watcher.of("reported") if r["state"] == "failed"], 30, "a failed report")
        n_birth = len(watcher.of("birth"))
        wait_for(lambda: len(watcher.of("telemetry")) >= 3, 30, "telemetry after the refusal")
        time.sleep(1.0)
        failed = [r for r in watcher.of("reported") if r["state"] == "failed"]
        assert len(failed) == 1, failed
        assert failed[0]["reason"]["code"] == "invalid_desired"
        assert failed[0]["reason"]["detail"].startswith("invalid desired state: "), failed[0]
        assert failed[0]["rollout_id"] == "r2" and failed[0]["desired_version"] == 2
        assert len(watcher.of("birth")) == n_birth  # still connected: no reconnect, no new birth
        assert p.poll() is None
    finally:
        rc = stop(p)
    text = log.read_text(errors="replace")
    assert rc == 0, text[-2000:]
    assert "Traceback" not in text, text[-3000:]
    assert log.stat().st_size < 20_000, log.stat().st_size


def test_hostile_desired_state_is_reported_once_across_a_restart(tmp_path: Path, broker: Any, watcher: Watcher) -> None:
    watcher.publish("desired", desired("http://[::1/x", 5), retain=True)
    for run in range(2):
        p = start_agent_process(broker.url, tmp_path / "store", tmp_path / f"agent{run}.log")
        try:
            want = 2 * (run + 1)
            wait_for(lambda: len(watcher.of("telemetry")) >= want, 30, "telemetry")  # noqa: B023
            time.sleep(1.0)
        finally:
            assert stop(p) == 0
    failed = [r for r in watcher.of("reported") if r["state"] == "failed"]
    assert len(failed) == 1, failed


def test_hostile_tune_request_is_refused_without_a_traceback(tmp_path: Path, broker: Any, watcher: Watcher) -> None:
    log = tmp_path / "agent.log"
    p = start_agent_process(broker.url, tmp_path / "store", log)
    try:
        wait_for(lambda: watcher.of("birth"), 30, "birth")
        trial = {
            "id": "t1",
            "url": "http://[::1/x",
            "sha256": "0" * 64,
            "size": 10,
            "runner": "onnxruntime",
            "precision": "fp32",
            "options": {},
        }
        req = {
            "schema_version": 1,
            "type": "tune-request",
            "fleet": FLEET,
            "device": DEVICE,
            "study_id": "s1",
            "objective": "latency",
            "schedule": {"reps": 1, "iters": 1, "warmup": 0},
            "trials": [trial],
        }
        for _ in range(200):
            watcher.publish("cmd/tune", req, retain=False)
        wait_for(lambda: len(watcher.of("tune")) >= 200, 30, "200 tune replies")
        assert {r["status"] for r in watcher.of("tune")} == {"refused"}
        assert "trials[0].url" in watcher.of("tune")[0]["field"]
        assert p.poll() is None
    finally:
        assert stop(p) == 0
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]
    assert text.count("tune request") <= 3, text[-3000:]  # rate-limited: not one line per request


# -- item 2: downloads stop at the declared size and at the cap -----------------------------------------------


class EndlessServer:
    """A real HTTP server whose body never ends (optionally with a Content-Length that lies)."""

    def __init__(self, content_length: int | None = None) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.sent = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                self.send_response(200)
                if content_length is not None:
                    self.send_header("Content-Length", str(content_length))
                self.end_headers()
                block = b"\0" * 65536
                try:
                    while server.sent < 1 << 30:  # 1 GiB: far past any limit the test sets
                        self.wfile.write(block)
                        server.sent += len(block)
                except OSError:
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/artifact.tar"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize(
    "size, cap, content_length",
    [(100_000, None, None), (None, 300_000, None), (100_000, None, 5 << 30), (None, 300_000, 5 << 30)],
)
def test_an_endless_body_stops_at_the_declared_size_or_the_cap_and_is_deleted(
    tmp_path: Path, size: int | None, cap: int | None, content_length: int | None
) -> None:
    from edge.agent.download import DownloadError, DownloadOptions, fetch

    server = EndlessServer(content_length)
    try:
        opts = DownloadOptions(
            timeout_s=30, read_timeout_s=5, attempts=2, retry_delay_s=0.05, **({"max_bytes": cap} if cap else {})
        )
        with pytest.raises(DownloadError, match="refused and deleted"):
            fetch(server.url(), tmp_path / "downloads", "0" * 64, size=size, options=opts)
    finally:
        server.close()
    assert list((tmp_path / "downloads").iterdir()) == []  # no .part kept past the limit
    assert server.sent < 64 << 20  # the agent hung up near the limit, not at 1 GiB


def test_a_partial_file_past_the_declared_size_is_never_resumed(tmp_path: Path) -> None:
    from edge.agent.download import DownloadError, DownloadOptions, fetch

    d = tmp_path / "downloads"
    d.mkdir()
    (d / ("0" * 64 + ".part")).write_bytes(b"x" * 5000)
    server = EndlessServer()
    try:
        with pytest.raises(DownloadError):
            fetch(server.url(), d, "0" * 64, size=1000, options=DownloadOptions(timeout_s=10, attempts=1))
    finally:
        server.close()
    assert list(d.iterdir()) == []


def test_agent_start_cleans_old_downloads_and_staging(tmp_path: Path, broker: Any) -> None:
    from edge.agent.agent import Agent, AgentConfig
    from edge.mqtt.netloop import Backoff

    agent_dir = tmp_path / "store" / "agent"
    (agent_dir / "staging" / "unpack-0123456789ab" / "sub").mkdir(parents=True)
    (agent_dir / "staging" / "unpack-0123456789ab" / "sub" / "big.bin").write_bytes(b"x" * 1000)
    (agent_dir / "tune" / "s1-abcd" / "downloads").mkdir(parents=True)
    dl = agent_dir / "downloads"
    dl.mkdir()
    old_part, new_part, done = dl / ("1" * 64 + ".part"), dl / ("2" * 64 + ".part"), dl / ("3" * 64)
    for p in (old_part, new_part, done, dl / "junk"):
        p.write_bytes(b"x" * 100)
    os.utime(old_part, (time.time() - 3 * 86400, time.time() - 3 * 86400))
    agent = Agent(
        AgentConfig(
            fleet=FLEET,
            device_id=DEVICE,
            broker=BrokerConfig.from_url(broker.url),
            store=tmp_path / "store",
            source="none",
            backoff=Backoff(0.05, 0.5),
        )
    ).start()
    try:
        assert list((agent_dir / "staging").iterdir()) == [] and list((agent_dir / "tune").iterdir()) == []
        assert sorted(p.name for p in dl.iterdir()) == [new_part.name]  # the newest recent .part: resumed later
    finally:
        agent.stop(2)


# -- items 3 and 4: archives are checked before a byte is unpacked; bad ones end in a clean refusal ----------


def _gnu_tar(tmp_path: Path, fmt: str) -> Path:
    src = tmp_path / f"src-{fmt}"
    src.mkdir()
    with open(src / "model.onnx", "wb") as f:  # 256 MiB apparent, a few bytes real
        f.seek(256 << 20)
        f.write(b"x")
    out = tmp_path / f"sparse-{fmt}.tar"
    subprocess.run(["tar", f"--format={fmt}", "--sparse", "-cf", str(out), "-C", str(src), "model.onnx"], check=True)
    assert out.stat().st_size < 1 << 20
    return out


@pytest.mark.parametrize("fmt", ["gnu", "pax"])
def test_a_sparse_tar_is_refused_before_anything_is_written(tmp_path: Path, fmt: str) -> None:
    from edge.bundle.archive import ArchiveError, unpack_bundle

    tar = _gnu_tar(tmp_path, fmt)
    with pytest.raises(ArchiveError, match="sparse"):
        unpack_bundle(tar, tmp_path / "staging")
    assert list((tmp_path / "staging").iterdir()) == []


def test_the_archive_sha256_is_checked_before_unpacking(tmp_path: Path) -> None:
    from edge.bundle.archive import ArchiveError, unpack_bundle

    tar = _gnu_tar(tmp_path, "gnu")
    with pytest.raises(ArchiveError, match="nothing unpacked"):
        unpack_bundle(tar, tmp_path / "staging", sha256="0" * 64)
    assert not (tmp_path / "staging").exists() or list((tmp_path / "staging").iterdir()) == []


def _tar(path: Path, members: list[tuple[str, bytes | None]]) -> Path:
    import io
    import tarfile

    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            else:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize(
    "members, needle",
    [
        ([("model.onnx", b"a"), ("model.onnx", b"b")], "twice"),
        ([("sub", None), ("sub", b"file")], "twice"),
        ([("sub", b"file"), ("sub/child", b"x")], "under the file"),
        ([("sub/child", b"x"), ("sub", b"file")], "twice"),
        ([("sub", b"file"), ("sub", None)], "twice"),
    ],
)
def test_clashing_tar_members_are_refused_cleanly(
    tmp_path: Path, members: list[tuple[str, bytes | None]], needle: str
) -> None:
    from edge.bundle.archive import ArchiveError, unpack_bundle

    tar = _tar(tmp_path / "bad.tar", members)
    with pytest.raises(ArchiveError, match=needle):
        unpack_bundle(tar, tmp_path / "staging")
    assert list((tmp_path / "staging").iterdir()) == []


@pytest.mark.parametrize(
    "members", [[("model.onnx", b"a"), ("model.onnx", b"b")], [("sub", b"file"), ("sub/child", b"x")]]
)
def test_a_clashing_archive_ends_the_apply_in_a_terminal_failure(
    tmp_path: Path, broker: Any, watcher: Watcher, members: list[tuple[str, bytes | None]]
) -> None:
    import functools
    import hashlib
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    from edge.agent.agent import Agent, AgentConfig
    from edge.mqtt.netloop import Backoff

    www = tmp_path / "www"
    www.mkdir()
    tar = _tar(www / "bad.tar", members)
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(www))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    (tmp_path / "store").mkdir()
    agent = Agent(
        AgentConfig(
            fleet=FLEET,
            device_id=DEVICE,
            broker=BrokerConfig.from_url(broker.url),
            store=tmp_path / "store",
            source="none",
            backoff=Backoff(0.05, 0.5),
        )
    ).start()
    try:
        body = desired(f"http://127.0.0.1:{httpd.server_address[1]}/bad.tar", 7)
        body.update(sha256=hashlib.sha256(tar.read_bytes()).hexdigest(), size=tar.stat().st_size)
        watcher.publish("desired", body, retain=True)
        r = wait_for(
            lambda: [
                m
                for m in watcher.of("reported")
                if m["desired_version"] == 7 and m["state"] in ("running", "failed", "rolled-back")
            ],
            30,
            "a terminal state",
        )[-1]
        assert r["state"] == "failed" and r["reason"]["code"] == "bad_archive", r
        assert list((tmp_path / "store" / "agent" / "staging").iterdir()) == []
        assert not (tmp_path / "store" / "agent" / "downloads" / body["sha256"]).exists()  # discarded at the end
    finally:
        agent.stop(2)
        httpd.shutdown()
        httpd.server_close()


def test_an_endless_artifact_ends_the_apply_failed_and_leaves_nothing(
    tmp_path: Path, broker: Any, watcher: Watcher
) -> None:
    from edge.agent.agent import Agent, AgentConfig
    from edge.agent.download import DownloadOptions
    from edge.mqtt.netloop import Backoff

    server = EndlessServer()
    (tmp_path / "store").mkdir()
    agent = Agent(
        AgentConfig(
            fleet=FLEET,
            device_id=DEVICE,
            broker=BrokerConfig.from_url(broker.url),
            store=tmp_path / "store",
            source="none",
            backoff=Backoff(0.05, 0.5),
            download=DownloadOptions(timeout_s=30, read_timeout_s=5, retry_delay_s=0.05),
        )
    ).start()
    try:
        body = desired(server.url(), 8)
        body["size"] = 200_000
        watcher.publish("desired", body, retain=True)
        r = wait_for(
            lambda: [
                m
                for m in watcher.of("reported")
                if m["desired_version"] == 8 and m["state"] in ("running", "failed", "rolled-back")
            ],
            30,
            "a terminal state",
        )[-1]
        assert r["state"] == "failed" and r["reason"]["code"] == "download_failed", r
        assert "refused and deleted" in r["reason"]["detail"]
        assert list((tmp_path / "store" / "agent" / "downloads").iterdir()) == []
        assert server.sent < 64 << 20
    finally:
        agent.stop(2)
        server.close()
