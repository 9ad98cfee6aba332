"""Desired state applied by a real agent: a real Mosquitto, bundle archives from a real HTTP server.

Each test starts the agent on a store holding bundle A, publishes a retained desired state on
edgekit/<fleet>/<device>/desired, and reads the retained reported state back as a fleet tool would.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from edge.agent.agent import Agent, AgentConfig
from edge.agent.appsocket import AppReporter
from edge.agent.download import DownloadOptions
from edge.bench import random_feeds
from edge.bundle.archive import ArchiveError, archive_sha256, pack_bundle, unpack_bundle
from edge.bundle.bundle import Bundle
from edge.deploy import DeviceStore
from edge.graph.samples import build_tiny_cnn
from edge.mqtt.client import BrokerConfig, paho
from edge.mqtt.desired import DesiredError, DesiredState, ReportedState
from edge.mqtt.netloop import Backoff
from edge.mqtt.payloads import load_schema
from edge.pipeline import ConvertRequest, convert
from tests.agent.test_agent_mqtt import schema_errors
from tests.support.cli import wait_for

FLEET, DEVICE = "lab", "cam-01"


# -- bundles and their archives ----------------------------------------------------------------


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory, models: dict[str, Path]) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("rollout")
    a = convert(models["tiny"], "x86-cpu", d / "a")
    b = convert(build_tiny_cnn(d / "src-b" / "tiny.onnx", seed=1), "x86-cpu", d / "b")
    assert a.id != b.id
    www = d / "www"
    www.mkdir()
    sha = {name: pack_bundle(bundle.path, www / f"{name}.tar") for name, bundle in (("a", a), ("b", b))}
    return {"a": a, "b": b, "www": www, "sha": sha}


# -- an artifact server that answers Range requests, and can cut a response short ---------------


class ArtifactServer:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[tuple[str, str | None]] = []  # path, Range header
        self.cut_once: dict[str, int] = {}  # path -> bytes sent before the connection is dropped (first time)
        self.stall: dict[str, float] = {}  # path -> after the headers and 100 bytes, wait this long (a hung server)
        self.closing = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                rng = self.headers.get("Range")
                server.requests.append((self.path, rng))
                f = server.root / self.path.lstrip("/")
                if not f.is_file():
                    self.send_error(404)
                    return
                data = f.read_bytes()
                start = 0
                if rng:
                    start = int(rng.removeprefix("bytes=").split("-")[0])
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                if self.path in server.stall:
                    self.wfile.write(data[start : start + 100])
                    self.wfile.flush()
                    server.closing.wait(server.stall[self.path])
                    return
                cut = server.cut_once.pop(self.path, None)
                if cut is not None:
                    self.wfile.write(data[start : start + cut])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)  # the connection drops mid-body
                    return
                self.wfile.write(data[start:])

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = False  # server_close joins the request threads
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="test-http", daemon=True)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"

    def __enter__(self) -> ArtifactServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def http(bundles: dict[str, Any]) -> Iterator[ArtifactServer]:
    with ArtifactServer(bundles["www"]) as s:
        yield s


# -- the fleet side: publish desired, read reported --------------------------------------------


class Fleet:
    def __init__(self, url: str) -> None:
        mqtt = paho()
        self.cfg = BrokerConfig.from_url(url)
        self.reported: list[dict[str, Any]] = []
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="test-fleet", protocol=mqtt.MQTTv5)
        self.c.on_message = lambda _c, _u, m: self.reported.append(json.loads(m.payload))
        self.c.connect(self.cfg.host, self.cfg.port)
        self.c.subscribe(f"edgekit/{FLEET}/{DEVICE}/reported", qos=1)
        self.c.loop_start()

    def desire(self, **fields: Any) -> None:
        body = {"schema_version": 1, "type": "desired", "fleet": FLEET, "device": DEVICE, **fields}
        self.c.publish(f"edgekit/{FLEET}/{DEVICE}/desired", json.dumps(body), qos=1, retain=True).wait_for_publish(5)

    def last(self) -> dict[str, Any] | None:
        return self.reported[-1] if self.reported else None

    def wait_state(self, *states: str, version: int, timeout: float = 60.0) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            r = self.last()
            return r if r and r["desired_version"] == version and r["state"] in states else None

        return wait_for(done, timeout, f"reported state in {states} for version {version} (last: {self.last()})")

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


@pytest.fixture
def fleet(broker: Any) -> Iterator[Fleet]:
    f = Fleet(broker.url)
    yield f
    f.close()


def start_agent(url: str, store: Path, **kw: Any) -> Agent:
    cfg = dict(
        fleet=FLEET,
        device_id=DEVICE,
        broker=BrokerConfig.from_url(url),
        store=store,
        source="synthetic",
        fps=50.0,
        interval_s=1.0,
        backoff=Backoff(0.05, 0.5),
        runner_options={"intra_op_num_threads": 1},
        poll_current_s=0.2,
        watch_s=1.5,
        smoke_frames=10,
        download=DownloadOptions(timeout_s=60, read_timeout_s=5, retry_delay_s=0.05),
    )
    cfg.update(kw)
    return Agent(AgentConfig(**cfg)).start()


def store_with(root: Path, bundle: Bundle) -> Path:
    DeviceStore(root).install(bundle)
    return root


def desired_for(bundles: dict[str, Any], http: ArtifactServer, name: str, version: int, **kw: Any) -> dict[str, Any]:
    www: Path = bundles["www"]
    return {
        "rollout_id": f"r{version}",
        "bundle_id": bundles[name].id,
        "version": version,
        "replaces": version - 1,
        "artifact_url": http.url(f"{name}.tar"),
        "sha256": bundles["sha"][name],
        "size": (www / f"{name}.tar").stat().st_size,
        **kw,
    }


# -- (a) a good bundle is applied and reported running ------------------------------------------


def test_good_bundle_is_applied_watched_and_reported_running(
    tmp_path: Path, broker: Any, fleet: Fleet, http: ArtifactServer, bundles: dict[str, Any]
) -> None:
    store = store_with(tmp_path / "store", bundles["a"])
    agent = start_agent(broker.url, store)
    try:
        fleet.desire(**desired_for(bundles, http, "b", 2))
        r = fleet.wait_state("running", "failed", "rolled-back", version=2)
        assert r["state"] == "running", r
        assert r["bundle_running"] == bundles["b"].id and r["reason"] is None
        assert r["reference_check"]["passed"] is True
        assert r["smoke"]["device_used"] == r["smoke"]["device_requested"] and r["smoke"]["frames"] == 10
        assert r["health"]["frames"] > 0
        states = [m["state"] for m in fleet.reported if m["desired_version"] == 2]
        assert states[:1] == ["downloading"] and "verifying" in states and "smoke-testing" in states
        assert "watching" in states
        assert DeviceStore(store).state().current == bundles["b"].id
        assert DeviceStore(store).state().previous == bundles["a"].id
        assert agent.bundle.id == bundles["b"].id and agent.state == "running"
        ReportedState.from_json(r)  # closed sets: state and reason code
        schema = load_schema()
        for m in fleet.reported:
            assert not schema_errors(m, schema, schema), (schema_errors(m, schema, schema), m)
        assert not list((store / "agent" / "staging").iterdir())  # the unpacked copy is gone
    finally:
        agent.stop(5)
    # a restart does not apply the retained desired state again: its version is recorded
    agent = start_agent(broker.url, store)
    try:
        wait_for(lambda: agent.counters["desired_ignored"] >= 1, 10, "the retained desired state to be ignored")
        assert agent.counters["desired_accepted"] == 0
    finally:
        agent.stop(5)


# -- (b) over budget: refused by the smoke test, or rolled back by the watch ---------------------


def test_bundle_over_budget_is_refused_by_the_smoke_test(
    tmp_path: Path, broker: Any, fleet: Fleet, http: ArtifactServer, bundles: dict[str, Any]
) -> None:
    store = store_with(tmp_path / "store", bundles["a"])
    agent = start_agent(broker.url, store)
    try:
        fleet.desire(**desired_for(bundles, http, "b", 2, budget_ms=0.0001))
        r = fleet.wait_state("running", "failed", "rolled-back", version=2)
        assert r["state"] == "failed", r
        assert r["reason"]["code"] == "over_budget" and r["reason"]["step"] == "smoke-testing"
        assert "p99" in r["reason"]["detail"] and r["smoke"]["p99_ms"] > 0.0001
        assert r["bundle_running"] == bundles["a"].id
        assert DeviceStore(store).state().current == bundles["a"].id  # never switched
        assert not (store / "bundles" / bundles["b"].id).exists()
    finally:
        agent.stop(5)


def test_bundle_over_budget_on_the_workload_is_rolled_back_after_the_switch(
    tmp_path: Path, broker: Any, fleet: Fleet, http: ArtifactServer, bundles: dict[str, Any]
) -> None:
    store = store_with(tmp_path / "store", bundles["a"])
    agent = start_agent(broker.url, store, smoke_frames=0)  # no smoke benchmark: the watch must catch it
    try:
        fleet.desire(**desired_for(bundles, http, "b", 2, budget_ms=0.0001, watch_s=5))
        r = fleet.wait_state("running", "failed", "rolled-back", version=2)
        assert r["state"] == "rolled-back", r
        assert r["reason"]["code"] == "watch_p99_over_budget" and r["reason"]["step"] == "watching"
        assert r["health"]["p99_ms"] > 0.0001 and r["health"]["frames"] > 0
        assert r["bundle_running"] == bundles["a"].id
        st = DeviceStore(store).state()
        assert st.current == bundles["a"].id
        assert [h["action"] for h in DeviceStore(store).history()][-2:] == ["deploy", "rollback"]
        wait_for(lambda: agent.bundle is not None and agent.bundle.id == bundles["a"].id, 10, "the agent back on A")
    finally:
        agent.stop(5)


# -- (c) a download cut mid-way resumes ------------------------------------------------------------


def test_download_cut_midway_resumes_with_a_range_request(
    tmp_path: Path, broker: Any, fleet: Fleet, http: ArtifactServer, bundles: dict[str, Any]
) -> None:
    store = store_with(tmp_path / "store", bundles["a"])
    size = (bundles["www"] / "b.tar").stat().st_size
    http.cut_once["/b.tar"] = size // 2
    agent = start_agent(broker.url, store)
    try:
        fleet.desire(**desired_for(bundles, http, "b", 2))
        r = fleet.wait_state("running", "failed", "rolled-back", version=2)
        assert r["state"] == "running", r
        got = [rng for path, rng in http.requests if path == "/b.tar"]
        assert got[0] is None and got[1] == f"bytes={size // 2}-", got  # the second request resumed
        assert len(got) == 2
    finally:
        agent.stop(5)


# -- (d) a corrupt artifact is refused before install ---------------------------------------------


def test_corrupt_artifact_is_refused_before_install(
    tmp_path: Path, broker: Any, fleet: Fleet, http: ArtifactServer, bundles: dict[str, Any]
) -> None:
    store = store_with(tmp_path / "store", bundles["a"])
    www: Path = bundles["www"]
    data = bytearray((www / "b.tar").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (www / "b-corrupt.tar").write_bytes(bytes(data))
    agent = start_agent(broker.url, store)
    try:
        d = desired_for(bundles, http, "b", 2)
        d["artifact_url"] = http.url("b-corrupt.tar")  # the sha256 is the good archive's
        fleet.desire(**d)
        r = fleet.wait_state("running", "failed", "rolled-back", version=2)
        assert r["state"] == "failed" and r["reason"]["code"] == "sha256_mismatch", r
        assert r["reason"]["step"] == "downloading"
        assert DeviceStore(store).state().current == bundles["a"].id
        assert not (store / "bundles" / bundles["b"].id).exists()
        assert not list((store / "agent" / "downloads").glob("*.part"))  # not kept to be resumed
    finally:
        agent.stop(5)


# -- stuck steps time out; a full disk is refused before downloading ---------------------------------


def test_a_stalled_download_times_out(tmp_path: Path, http: ArtifactServer, bundles: dict[str, Any]) -> None:
    from edge.agent.download import DownloadError, fetch

    http.stall["/b.tar"] = 5.0
    t0 = time.monotonic()
    with pytest.raises(DownloadError) as e:
        fetch(
            http.url("b.tar"),
            tmp_path / "dl",
            bundles["sha"]["b"],
            options=DownloadOptions(timeout_s=1.5, read_timeout_s=0.3, attempts=50, retry_delay_s=0.05),
        )
    assert e.value.code in ("timeout", "download_failed") and time.monotonic() - t0 < 5


def test_not_enough_disk_is_refused_before_any_request(
    tmp_path: Path, http: ArtifactServer, bundles: dict[str, Any]
) -> None:
    from edge.agent.download import DownloadError, fetch

    with pytest.raises(DownloadError, match="not enough free disk") as e:
        fetch(http.url("b.tar"), tmp_path / "dl", bundles["sha"]["b"], size=1 << 60)
    assert e.value.code == "disk_full" and http.requests == []


def test_a_newer_desired_state_supersedes_a_stuck_apply(
    tmp_path: Path, broker: Any, fleet: Fleet, http: ArtifactServer, bundles: dict[str, Any]
) -> None:
    store = store_with(tmp_path / "store", bundles["a"])
    (bundles["www"] / "b-stuck.tar").write_bytes((bundles["www"] / "b.tar").read_bytes())
    http.stall["/b-stuck.tar"] = 30.0
    agent = start_agent(broker.url, store, download=DownloadOptions(timeout_s=120, read_timeout_s=60))
    try:
        stuck = desired_for(bundles, http, "b", 2)
        stuck["artifact_url"] = http.url("b-stuck.tar")
        fleet.desire(**stuck)
        fleet.wait_state("downloading", version=2)
        fleet.desire(**desired_for(bundles, http, "b", 3))
        r = fleet.wait_state("running", "failed", "rolled-back", version=3)
        assert r["state"] == "running", r
        v2 = [m for m in fleet.reported if m["desired_version"] == 2]
        assert v2[-1]["state"] == "failed" and v2[-1]["reason"]["code"] == "superseded"
    finally:
        agent.stop(5)


def test_agent_stopped_mid_apply_applies_the_retained_desired_state_at_the_next_start(
    tmp_path: Path, broker: Any, fleet: Fleet, http: ArtifactServer, bundles: dict[str, Any]
) -> None:
    store = store_with(tmp_path / "store", bundles["a"])
    agent = start_agent(broker.url, store, watch_s=30.0)
    try:
        fleet.desire(**desired_for(bundles, http, "b", 2))
        fleet.wait_state("watching", version=2)
    finally:
        agent.stop(5)
    assert fleet.wait_state("failed", version=2)["reason"]["code"] == "interrupted"
    agent = start_agent(broker.url, store, watch_s=1.0)
    try:
        r = fleet.wait_state("running", "rolled-back", version=2)
        assert r["state"] == "running" and r["bundle_running"] == bundles["b"].id
        assert [m["state"] for m in fleet.reported if m["desired_version"] == 2][-2:] == ["watching", "running"]
    finally:
        agent.stop(5)


# -- (e) an older desired version after a newer one is ignored ------------------------------------


def test_older_desired_version_after_a_newer_one_is_ignored(
    tmp_path: Path, broker: Any, fleet: Fleet, http: ArtifactServer, bundles: dict[str, Any]
) -> None:
    store = store_with(tmp_path / "store", bundles["a"])
    agent = start_agent(broker.url, store)
    try:
        fleet.desire(**desired_for(bundles, http, "b", 5))
        fleet.wait_state("running", version=5)
        fleet.desire(**desired_for(bundles, http, "a", 3))  # late: older than the version applied
        fleet.desire(**desired_for(bundles, http, "b", 5))  # duplicated
        wait_for(lambda: agent.counters["desired_ignored"] >= 2, 10, "both to be ignored")
        time.sleep(0.5)
        assert agent.counters["desired_accepted"] == 1
        assert DeviceStore(store).state().current == bundles["b"].id
        assert fleet.last()["desired_version"] == 5 and fleet.last()["state"] == "running"
    finally:
        agent.stop(5)


# -- reload on a change of `current`, without a restart -------------------------------------------


def test_agent_reloads_when_current_changes(tmp_path: Path, broker: Any, bundles: dict[str, Any]) -> None:
    store = store_with(tmp_path / "store", bundles["a"])
    agent = start_agent(broker.url, store, desired=False)
    try:
        assert agent.bundle.id == bundles["a"].id
        DeviceStore(store).install(bundles["b"])  # `edgekit deploy` by someone else
        wait_for(lambda: agent.reloads == 1, 15, "a reload")
        assert agent.bundle.id == bundles["b"].id and agent.state == "running"
        wait_for(
            lambda: agent.worker is not None and agent.worker.total + len(agent.worker._samples) > 0,
            10,
            "frames on the new runner",
        )
        DeviceStore(store).rollback()
        wait_for(lambda: agent.reloads == 2, 15, "a reload")
        assert agent.bundle.id == bundles["a"].id
    finally:
        agent.stop(5)


# -- payloads: typed, and never a local path ------------------------------------------------------


def _desired(**kw: Any) -> bytes:
    base = {
        "schema_version": 1,
        "type": "desired",
        "fleet": FLEET,
        "device": DEVICE,
        "rollout_id": "r1",
        "bundle_id": "b-1",
        "version": 2,
        "replaces": 1,
        "artifact_url": "https://example.invalid/b.tar",
        "sha256": "0" * 64,
    }
    base.update(kw)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


@pytest.mark.parametrize(
    "fields, needle",
    [
        ({"artifact_url": "file:///etc/passwd"}, "no --artifact-root"),
        ({"artifact_url": "ftp://host/b.tar"}, "not supported"),
        ({"artifact_url": "https://user:pw@host/b.tar"}, "credentials"),
        ({"bundle_id": "../x"}, "bundle_id"),
        ({"version": 2, "replaces": 2}, "replaces"),
        ({"version": -1}, "version"),
        ({"version": True}, "version"),
        ({"sha256": "X" * 64}, "sha256"),
        ({"command": "rm -rf /"}, "unknown fields"),
        ({"device": "other"}, "another fleet or device"),
        ({"budget_ms": 0}, "budget_ms"),
    ],
)
def test_desired_payloads_are_checked(fields: dict[str, Any], needle: str) -> None:
    with pytest.raises(DesiredError, match=needle):
        DesiredState.parse(_desired(**fields), fleet=FLEET, device=DEVICE)


def test_desired_payloads_match_the_published_schema() -> None:
    schema = load_schema()
    good = json.loads(_desired(size=10, budget_ms=5.0, watch_s=2))
    assert not schema_errors(good, schema, schema)
    d = DesiredState.parse(json.dumps(good).encode(), fleet=FLEET, device=DEVICE)
    again = d.to_json(FLEET, DEVICE)
    assert not schema_errors(again, schema, schema) and DesiredState.from_json(again, fleet=FLEET, device=DEVICE) == d
    assert schema_errors({**good, "command": "x"}, schema, schema)


def test_file_urls_only_under_the_artifact_root(tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    root.mkdir()
    ok = DesiredState.parse(
        _desired(artifact_url=f"file://{root}/b.tar"), fleet=FLEET, device=DEVICE, artifact_root=root
    )
    assert ok.version == 2 and ok.replaces == 1
    for bad in (f"file://{root}/../b.tar", "file:///etc/passwd", f"file://{root}"):
        with pytest.raises(DesiredError, match="outside the artifact root"):
            DesiredState.parse(_desired(artifact_url=bad), fleet=FLEET, device=DEVICE, artifact_root=root)


def test_file_url_artifact_is_applied(tmp_path: Path, broker: Any, fleet: Fleet, bundles: dict[str, Any]) -> None:
    store = store_with(tmp_path / "store", bundles["a"])
    root = tmp_path / "artifacts"
    root.mkdir()
    (root / "b.tar").write_bytes((bundles["www"] / "b.tar").read_bytes())
    agent = start_agent(broker.url, store, artifact_root=root)
    try:
        fleet.desire(
            rollout_id="r2",
            bundle_id=bundles["b"].id,
            version=2,
            replaces=1,
            artifact_url=f"file://{root}/b.tar",
            sha256=bundles["sha"]["b"],
        )
        r = fleet.wait_state("running", "failed", "rolled-back", version=2)
        assert r["state"] == "running", r
    finally:
        agent.stop(5)


def test_archives_with_links_or_escaping_names_are_refused(tmp_path: Path) -> None:
    import io
    import tarfile

    for make in ("symlink", "dotdot", "absolute"):
        tar_path = tmp_path / f"{make}.tar"
        with tarfile.open(tar_path, "w") as t:
            info = tarfile.TarInfo({"symlink": "link", "dotdot": "../evil", "absolute": "/tmp/evil"}[make])
            if make == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                t.addfile(info)
            else:
                info.size = 1
                t.addfile(info, io.BytesIO(b"x"))
        with pytest.raises(ArchiveError):
            unpack_bundle(tar_path, tmp_path / "staging")
        assert not list((tmp_path / "staging").iterdir())


def test_pack_is_reproducible(tmp_path: Path, bundles: dict[str, Any]) -> None:
    assert pack_bundle(bundles["a"].path, tmp_path / "again.tar") == bundles["sha"]["a"]
    assert hashlib.sha256((tmp_path / "again.tar").read_bytes()).hexdigest() == bundles["sha"]["a"]


# == issue #14 follow-ups: local rollback, nothing to do, the app's watch, step deadlines ==============


def _states(fleet: Fleet, version: int) -> list[str]:
    return [m["state"] for m in fleet.reported if m["desired_version"] == version]


def test_archive_sha256_of_a_stored_bundle_is_its_packed_sha256(tmp_path: Path, bundles: dict[str, Any]) -> None:
    store = store_with(tmp_path / "store", bundles["a"])
    stored = store / "bundles" / bundles["a"].id
    assert archive_sha256(stored) == bundles["sha"]["a"]  # the copy the store made packs to the same bytes
    assert archive_sha256(bundles["b"].path) == bundles["sha"]["b"] != bundles["sha"]["a"]


# -- 1. a rollback to the store's previous bundle is a local switch -----------------------------------


def test_rollback_to_the_previous_bundle_switches_locally_without_a_download(
    tmp_path: Path, broker: Any, fleet: Fleet, http: ArtifactServer, bundles: dict[str, Any]
) -> None:
    store = store_with(tmp_path / "store", bundles["a"])
    agent = start_agent(broker.url, store, watch_s=1.0)
    try:
        fleet.desire(**desired_for(bundles, http, "b", 2))
        assert fleet.wait_state("running", "failed", "rolled-back", version=2)["state"] == "running"
        assert DeviceStore(store).state().previous == bundles["a"].id
        fleet.desire(**desired_for(bundles, http, "a", 3))  # the fleet rolls back: A's artifact URL and sha256
        r = fleet.wait_state("running", "failed", "rolled-back", version=3)
        assert r["state"] == "running" and r["bundle_running"] == bundles["a"].id, r
        assert [p for p, _ in http.requests if p == "/a.tar"] == []  # never downloaded
        assert [p for p, _ in http.requests if p == "/b.tar"] == ["/b.tar"]
        assert agent.counters["local_switches"] == 1 and agent.counters["downloads"] == 1
        v3 = [m for m in fleet.reported if m["desired_version"] == 3]
        assert v3[0]["state"] == "verifying" and v3[0]["progress"] == {"from": "store"}
        assert [m["state"] for m in v3][1:] == ["smoke-testing", "switching", "watching", "running"]
        assert r["reference_check"]["passed"] is True and r["health"]["frames"] > 0  # smoke-tested and watched
        st = DeviceStore(store).state()
        assert (st.current, st.previous) == (bundles["a"].id, bundles["b"].id)
        assert DeviceStore(store).history()[-1]["action"] == "rollback"
        assert agent.bundle.id == bundles["a"].id
        assert not (store / "agent" / "unconfirmed.json").exists()
    finally:
        agent.stop(5)


def test_a_rollback_to_the_bundle_that_was_running_is_not_refused_for_its_budget(
    tmp_path: Path, broker: Any, fleet: Fleet, http: ArtifactServer, bundles: dict[str, Any]
) -> None:
    """A ran here under a budget it always missed (a busy device); the rollout of B, with its own loose budget,
    passes; the abort's rollback to A must not be refused by A's smoke test (issue #33: the device stayed on
    the aborted bundle, ``rollback pending`` for good)."""
    store = store_with(tmp_path / "store", bundles["a"])
    agent = start_agent(broker.url, store, watch_s=1.0, budget_ms=0.0001)
    try:
        fleet.desire(**desired_for(bundles, http, "b", 2, budget_ms=1000.0))
        assert fleet.wait_state("running", "failed", "rolled-back", version=2)["state"] == "running"
        fleet.desire(**desired_for(bundles, http, "a", 3))  # judged against the agent's 0.0001 ms, as A always was
        r = fleet.wait_state("running", "failed", "rolled-back", version=3)
        assert r["state"] == "running" and r["bundle_running"] == bundles["a"].id, (
            r["reason"],
            r["smoke"],
            r["health"],
        )
        assert r["smoke"]["budget_gated"] is False and r["smoke"]["p99_ms"] > r["smoke"]["budget_ms"], r["smoke"]
        assert r["health"]["budget_gated"] is False and r["reference_check"]["passed"] is True
        lived = json.loads((store / "agent" / "lived.json").read_text())["bundles"]
        assert set(lived) == {bundles["a"].id, bundles["b"].id} and lived[bundles["b"].id]["budget_ms"] == 1000.0
    finally:
        agent.stop(5)


def test_a_stored_copy_that_is_not_the_desired_artifact_is_downloaded(
    tmp_path: Path, broker: Any, fleet: Fleet, http: ArtifactServer, bundles: dict[str, Any]
) -> None:
    store = store_with(tmp_path / "store", bundles["a"])
    DeviceStore(store).install(bundles["b"])  # previous: A
    agent = start_agent(broker.url, store, watch_s=0.5)
    try:
        d = desired_for(bundles, http, "a", 2)
        d["sha256"] = "0" * 64  # names another artifact than the one the stored copy packs to
        fleet.desire(**d)
        r = fleet.wait_state("running", "failed", "rolled-back", version=2)
        assert r["state"] == "failed" and r["reason"]["code"] == "sha256_mismatch", r  # downloaded, then refused
        assert [p for p, _ in http.requests] == ["/a.tar"]
        assert agent.counters["local_switches"] == 0 and DeviceStore(store).state().current == bundles["b"].id
    finally:
        agent.stop(5)


# -- 2. a desired state naming the bundle already run: running at once --------------------------------


def test_rollback_naming_the_bundle_already_running_reports_running_at_once(
    tmp_path: Path, broker: Any, fleet: Fleet, http: ArtifactServer, bundles: dict[str, Any]
) -> None:
    store = store_with(tmp_path / "store", bundles["a"])
    agent = start_agent(broker.url, store, watch_s=60.0)  # a watch would take a minute
    try:
        fleet.desire(**desired_for(bundles, http, "b", 2, budget_ms=0.0001))  # refused by the smoke test
        assert fleet.wait_state("running", "failed", "rolled-back", version=2)["state"] == "failed"
        t0 = time.monotonic()
        fleet.desire(**desired_for(bundles, http, "a", 3))  # the controller's rollback: A, which never left
        r = fleet.wait_state("running", "failed", "rolled-back", version=3, timeout=20)
        assert time.monotonic() - t0 < 20
        assert r["state"] == "running" and r["bundle_running"] == bundles["a"].id and r["reason"] is None
        assert _states(fleet, 3) == ["running"]  # no download, no smoke test, no watch
        assert agent.counters["already_running"] == 1 and [p for p, _ in http.requests if p == "/a.tar"] == []
        assert DeviceStore(store).history()[-1]["action"] == "deploy"  # the store was not touched
    finally:
        agent.stop(5)


# -- 4. a stuck step times out ------------------------------------------------------------------------


def test_a_verify_step_past_its_deadline_fails_with_timeout(
    tmp_path: Path, broker: Any, fleet: Fleet, http: ArtifactServer, bundles: dict[str, Any], mobilenet: Path
) -> None:
    # the tiny bundle's unpack + hashing could finish inside the interpreter's 5 ms thread switch interval,
    # before the deadline was ever looked at (a flaky pass of the step); MobileNetV2's 14 MB cannot
    if "big" not in bundles:
        big = convert(mobilenet, "x86-cpu", tmp_path / "big", ConvertRequest(parity_samples=2))
        bundles["sha"]["big"] = pack_bundle(big.path, bundles["www"] / "big.tar")
        bundles["big"] = big
    store = store_with(tmp_path / "store", bundles["a"])
    agent = start_agent(broker.url, store, verify_timeout_s=1e-6)  # no unpack + hashing fits in a microsecond
    try:
        fleet.desire(**desired_for(bundles, http, "big", 2))
        r = fleet.wait_state("running", "failed", "rolled-back", version=2)
        assert r["state"] == "failed" and r["reason"]["code"] == "timeout", r
        assert r["reason"]["step"] == "verifying" and "did not finish within" in r["reason"]["detail"]
        assert DeviceStore(store).state().current == bundles["a"].id and agent.bundle.id == bundles["a"].id
        fleet.desire(**desired_for(bundles, http, "big", 3))  # the next desired state is not blocked
        r = fleet.wait_state("failed", "running", version=3)
        assert r["reason"]["code"] == "timeout"
    finally:
        agent.stop(5)


# -- 3. --source app: the watch judges the application's frames; the application follows `current` ------


class App:
    """An application on edgekit's Python API: runs the store's current bundle itself, reloads it when
    ``AppReporter.current_bundle()`` changes, and reports each frame's latency over the app socket."""

    def __init__(self, sock: Path, store: Path, *, slow_on: str | None = None, crash_on: str | None = None) -> None:
        self.reporter = AppReporter(sock, batch=5, max_delay_s=0.1, store=store)
        self.slow_on, self.crash_on = slow_on, crash_on
        self.ran: list[str] = []  # bundles loaded, in order
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        runner = None
        current = None
        try:
            while not self.stop.is_set():
                now = self.reporter.current_bundle()
                if now is not None and now != current:
                    if runner is not None:
                        runner.close()
                    current = now
                    self.ran.append(now)
                    self.reporter.flush()
                    self.reporter.bundle = now
                    runner = Bundle.open(self.reporter.store / "bundles" / now).open_runner({"intra_op_num_threads": 1})
                    feeds = random_feeds(runner)
                if runner is None:
                    time.sleep(0.05)
                    continue
                if current == self.crash_on:  # the application dies on this bundle: it reports nothing
                    time.sleep(0.05)
                    continue
                t = time.perf_counter_ns()
                runner.infer(feeds)
                ms = (time.perf_counter_ns() - t) / 1e6
                if current == self.slow_on:
                    ms += 50.0  # the application's own pipeline is slow with this bundle
                self.reporter.frame(ms)
                time.sleep(0.02)
        finally:
            if runner is not None:
                runner.close()

    def __enter__(self) -> App:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        self.reporter.close()


def _app_agent(broker: Any, store: Path, sock: Path, **kw: Any) -> Any:
    return start_agent(broker.url, store, source=f"app:{sock}", smoke_frames=0, watch_s=3.0, **kw)


def test_app_source_watch_judges_the_applications_frames_and_the_app_follows_the_switch(
    tmp_path: Path, broker: Any, fleet: Fleet, http: ArtifactServer, bundles: dict[str, Any]
) -> None:
    store = store_with(tmp_path / "store", bundles["a"])
    sock = tmp_path / "app.sock"
    agent = _app_agent(broker, store, sock)
    try:
        with App(sock, store, slow_on=bundles["b"].id) as app:
            wait_for(lambda: agent.app.last_report is not None, 20, "the application's first report")
            fleet.desire(**desired_for(bundles, http, "b", 2, budget_ms=20.0))
            r = fleet.wait_state("running", "failed", "rolled-back", version=2)
            assert r["state"] == "rolled-back", r
            assert (
                r["reason"]["code"] == "watch_p99_over_budget" and "the application reported" in r["reason"]["detail"]
            )
            assert r["health"]["source"] == "app" and r["health"]["frames"] >= 20 and r["health"]["p99_ms"] > 20
            wait_for(
                lambda: app.ran == [bundles["a"].id, bundles["b"].id, bundles["a"].id],
                10,
                f"the application to follow A -> B -> A (ran {app.ran})",
            )
            # a good bundle on the application's frames: watched and kept
            fleet.desire(**desired_for(bundles, http, "b", 3, budget_ms=1000.0))
            r = fleet.wait_state("running", "failed", "rolled-back", version=3)
            assert r["state"] == "running", r
            assert r["health"]["source"] == "app" and r["health"]["frames"] > 0 and r["health"]["errors"] == 0
            assert r["health"]["p99_ms"] < 1000.0
            wait_for(lambda: app.ran[-1] == bundles["b"].id, 10, "the application on B")
    finally:
        agent.stop(5)


def test_app_that_stops_reporting_on_the_new_bundle_is_rolled_back(
    tmp_path: Path, broker: Any, fleet: Fleet, http: ArtifactServer, bundles: dict[str, Any]
) -> None:
    store = store_with(tmp_path / "store", bundles["a"])
    sock = tmp_path / "app.sock"
    agent = _app_agent(broker, store, sock)
    try:
        with App(sock, store, crash_on=bundles["b"].id):
            wait_for(lambda: agent.app.last_report is not None, 20, "the application's first report")
            fleet.desire(**desired_for(bundles, http, "b", 2, budget_ms=1000.0))
            r = fleet.wait_state("running", "failed", "rolled-back", version=2)
            assert r["state"] == "rolled-back" and r["reason"]["code"] == "watch_inference_error", r
            assert "none on" in r["reason"]["detail"] and r["health"]["frames"] == 0
            assert DeviceStore(store).state().current == bundles["a"].id
    finally:
        agent.stop(5)
