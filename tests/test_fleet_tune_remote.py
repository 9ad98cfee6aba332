"""``edgekit fleet tune --device ID`` (edge.fleet.tune_remote + edge.agent.tune_cmd): a real Mosquitto, a real agent
process (``python -m edge.agent``), trials converted here, served over HTTP, downloaded, verified and measured by
the agent, the same table returned. Malformed requests are refused naming the field; a wrong sha256 is refused
before anything is unpacked; a second request while one runs is answered ``busy``. Figures are asserted to exist
and to come from the device, never their size."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

import mqtt_broker
from conftest import REPO, assert_user_error, run_cli, wait_for
from edge.agent.mqtt import BrokerConfig
from edge.agent.payloads import SCHEMA_VERSION
from edge.capabilities import cpu_isa
from edge.fleet.tune_remote import ArtifactServer, DeviceLink, tune_on_device

FLEET, DEVICE = "lab", "dev-1"
SHA = "ab" * 32


@pytest.fixture(scope="module")
def mqtt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if mqtt_broker.mosquitto_binary() is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    with mqtt_broker.Mosquitto(tmp_path_factory.mktemp("broker")) as m:
        yield m


@contextmanager
def agent_process(url: str, root: Path, device: str, *extra: str) -> Iterator[dict[str, Any]]:
    """A real agent process (``python -m edge.agent``) with an empty store: no model of its own runs."""
    store = root / "store"
    store.mkdir(parents=True)
    log = root / "agent.log"
    p = subprocess.Popen([sys.executable, "-m", "edge.agent", "--device-id", device, "--fleet", FLEET, "--broker",
                          url, "--store", str(store), "--source", "none", "--interval", "5", "--poll-current", "0",
                          "--download-timeout", "60", "--log-level", "info", *extra],
                         cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
    try:
        with DeviceLink(BrokerConfig.from_url(url), FLEET, device) as link:
            wait_for(lambda: link.synced.is_set() and link.birth is not None or p.poll() is not None, 60,
                     "the agent's birth")
        assert p.poll() is None, log.read_text()
        yield {"store": store, "log": log, "proc": p}
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.fixture(scope="module")
def agent(mqtt: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with agent_process(mqtt.url, tmp_path_factory.mktemp("device"), DEVICE) as a:
        yield a


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first test's output; its conversion cache serves the later ones (the same recipe keys)."""
    return tmp_path_factory.mktemp("work")


@pytest.fixture
def link(mqtt: Any, agent: dict[str, Any]) -> Iterator[DeviceLink]:
    with DeviceLink(BrokerConfig.from_url(mqtt.url), FLEET, DEVICE) as lk:
        wait_for(lambda: lk.synced.is_set() and lk.birth is not None, 20, "birth")
        yield lk


def request(url: str, sha: str = SHA, **over: Any) -> dict[str, Any]:
    trial = {"id": "t00", "url": url, "sha256": sha, "size": 1000, "runner": "onnxruntime", "precision": "fp32",
             "options": {"intra_op_num_threads": 1}}
    trial.update(over.pop("trial", {}))
    req = {"schema_version": SCHEMA_VERSION, "type": "tune-request", "fleet": FLEET, "device": DEVICE,
           "study_id": over.pop("study_id", "s1"), "objective": "latency",
           "schedule": {"reps": 2, "iters": 5, "warmup": 1}, "trials": [trial]}
    req.update(over)
    return req


def final(link: DeviceLink, study: str | None, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            r = link.replies.get(timeout=0.2)
        except Exception:  # noqa: BLE001 - queue.Empty
            continue
        if r.get("study_id") == study and r.get("status") not in ("accepted", "progress"):
            return r
    raise AssertionError(f"no final reply to {study} within {timeout} s")


def test_fleet_tune_measures_on_the_device_and_returns_the_table(mqtt: Any, agent: dict[str, Any],
                                                                 models: dict[str, Path], work: Path) -> None:
    out = work / "tune"
    p = run_cli("fleet", "tune", str(models["tiny"]), "--device", DEVICE, "--fleet", FLEET, "--broker", mqtt.url,
                "--target", "x86-cpu", "--serve", "127.0.0.1:0", "--runner", "onnxruntime", "--runner", "openvino",
                "--precision", "fp32", "--threads", "1", "--max-trials", "3", "--reps", "2", "--iters", "5",
                "--warmup", "1", "--out", str(out), "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    trials = r["trials"]
    assert len(trials) == 3 and {t["runner"] for t in trials} == {"onnxruntime", "openvino"}
    for t in trials:
        assert t["status"] in ("measured", "chosen"), t["status"]
        assert t["parity"]["passed"] is True and t["parity"]["trial"]["passed"] is True, t["parity"]
        res = t["result"]
        assert res["rung"] == "0:2x5" and res["p50_ms"] > 0 and res["p99_ms"] >= res["p50_ms"] and res["fps"] > 0
        assert t["load_ms"] > 0 and t["runtime"]["threads"] in (1, None)  # figures only the device's reply carries
        assert t["size_bytes"] > 0 and t["device_trial"].startswith("t")
    assert r["winner"] is not None and r["winner"]["status"] == "chosen"
    # who measured: the agent's host (this machine here), stated as the device
    assert r["device"]["id"] == DEVICE and r["host"]["hostname"] == socket.gethostname()
    assert r["host"]["cpu"] == cpu_isa().model and r["host"]["isa"] == sorted(cpu_isa().flags)
    assert r["measured_on"].startswith(f"measured on device {DEVICE} (") and cpu_isa().model in r["measured_on"]
    assert r["device_class"]["same"] is True and f"device {DEVICE}" in r["device_class"]["reason"]
    assert "tune-" in r["device"]["study_id"] and r["device"]["device_wall_s"] > 0
    overlay = (out / "tuned.toml").read_text()
    assert f"measured on device {DEVICE}" in overlay and r["winner"]["id"] in overlay
    # the agent downloaded and measured them, then deleted the trial bundles
    log = agent["log"].read_text()
    assert f"tune {r['device']['study_id']}: done" in log, log[-2000:]
    assert not any((agent["store"] / "agent" / "tune").iterdir())
    # the table, as a person sees it, from the same JSON
    from edge.cli.tune import render_tune
    from rich.console import Console
    import edge.cli.tune as cli_tune

    cli_tune.console = Console(record=True, width=200)
    try:
        render_tune(r)
        text = cli_tune.console.export_text()
    finally:
        from edge.cli._common import console

        cli_tune.console = console
    assert "chosen" in text and r["winner"]["label"] in text


@pytest.mark.parametrize("change, field", [
    ({"schedule": {"reps": 0, "iters": 5, "warmup": 1}}, "schedule.reps"),
    ({"objective": "e2e"}, "objective"),
    ({"trial": {"url": "file:///etc/passwd"}}, "trials[0].url"),
    ({"trial": {"id": "../x"}}, "trials[0].id"),
    ({"trial": {"sha256": "AB" * 32}}, "trials[0].sha256"),
    ({"trial": {"options": {"intra_op_num_threads": [1]}}}, "trials[0].options.intra_op_num_threads"),
    ({"trial": {"options": {"session_library": "/tmp/x.so"}}}, "trials[0].options.session_library"),
    ({"extra": 1}, "extra"),
])
def test_malformed_request_is_refused_naming_the_field(link: DeviceLink, change: dict[str, Any], field: str) -> None:
    link.send(request("http://127.0.0.1:9/x.tar", study_id="bad", **change))
    r = final(link, "bad")
    assert r["status"] == "refused" and r["field"] == field, r
    assert field in r["error"]


def test_wrong_sha256_is_refused_before_unpacking_and_busy_while_running(link: DeviceLink, agent: dict[str, Any],
                                                                         tmp_path: Path) -> None:
    www = tmp_path / "www"
    www.mkdir()
    (www / "a.tar").write_bytes(b"not the artifact the request names" * 30)
    with ArtifactServer(www, "127.0.0.1:0") as srv:
        link.send(request(f"{srv.base_url}/a.tar", study_id="sha", trial={"size": 1020}))
        r = final(link, "sha")
    assert r["status"] == "done", r
    (t,) = r["trials"]
    assert t["status"].startswith("sha256_mismatch") and "measurement" not in t, t
    # a request whose download does not answer yet keeps the device busy: a second one is answered busy
    with HoldServer() as hold:
        link.send(request(f"http://127.0.0.1:{hold.port}/slow.tar", study_id="slow"))
        wait_for(lambda: hold.held, 20, "the slow tune's download to start")
        link.send(request("http://127.0.0.1:9/x.tar", study_id="second"))
        r2 = final(link, "second")
        assert r2["status"] == "busy" and "slow" in r2["error"], r2
        hold.answer.set()  # now 404: the download fails at once
        (t,) = final(link, "slow")["trials"]
    assert t["status"].startswith("download_failed") and "404" in t["status"], t
    assert not any((agent["store"] / "agent" / "tune").iterdir())


class HoldServer:
    """Accepts HTTP connections and says nothing until ``answer`` is set; then answers 404."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.answer, self.done = threading.Event(), threading.Event()
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                c = None
            if c is not None:
                self.held.append(c)
            if self.answer.is_set():
                for c in self.held:
                    try:
                        c.sendall(b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                        c.close()
                    except OSError:
                        pass
                self.held.clear()

    def __enter__(self) -> "HoldServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(5)
        for c in self.held:
            c.close()
        self.sock.close()


def test_cli_refuses_an_unknown_device_in_one_line(mqtt: Any, agent: dict[str, Any], models: dict[str, Path],
                                                   tmp_path: Path) -> None:
    p = run_cli("fleet", "tune", str(models["tiny"]), "--device", "nobody", "--fleet", FLEET, "--broker", mqtt.url,
                "--target", "x86-cpu", "--serve", "127.0.0.1:0", "--out", str(tmp_path / "o"))
    assert_user_error(p, "device nobody has no birth")


def test_device_with_a_trust_store_measures_signed_trials_only(mqtt: Any, models: dict[str, Path], work: Path,
                                                              tmp_path: Path) -> None:
    from edge.signing import generate_key
    from edge.trust import TrustStore
    from edge.tune import Schedule

    keys = tmp_path / "keys"
    key = generate_key("builder", keys)
    TrustStore(tmp_path / "trust").add_key(key.public_path.read_bytes(), "builder")
    kw: dict[str, Any] = dict(broker=BrokerConfig.from_url(mqtt.url), fleet=FLEET, target="x86-cpu",
                              cache=work / "tune" / "cache", runners=["onnxruntime"], precisions=["fp32"],
                              threads=[1], max_trials=1, schedule=Schedule(reps=2, iters=5, warmup=1),
                              serve="127.0.0.1:0", pictures=False)
    with agent_process(mqtt.url, tmp_path / "dev2", "dev-2", "--trust-dir", str(tmp_path / "trust")):
        unsigned = tune_on_device(models["tiny"], "dev-2", out=tmp_path / "o1", **kw)
        signed = tune_on_device(models["tiny"], "dev-2", out=tmp_path / "o2", sign_key="builder", keys_dir=keys,
                                **kw)
    assert unsigned.converted == 0 and signed.converted == 0  # the first test's cache
    (t,) = unsigned.trials
    assert unsigned.winner is None and "unsigned" in t["status"] and t.get("result") is None, t["status"]
    (t,) = signed.trials
    assert signed.winner is t and t["result"]["p50_ms"] > 0 and t["parity"]["passed"] is True, t


def test_the_agent_stays_lean_until_a_tune_arrives() -> None:
    """The cmd/tune hook and its request parsing import no numpy and no runtime (they come with the measurement)."""
    code = ("import sys, edge.agent.agent, edge.agent.tune_cmd as t; "
            "r = t.TuneRequest.parse(sys.argv[1].encode(), fleet='lab', device='dev-1'); "
            "print(r.trials[0].options, sorted(m for m in ('numpy', 'onnxruntime', 'openvino', 'edge.tune_measure') "
            "if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code, json.dumps(request("http://h/x.tar"))], capture_output=True,
                       text=True, cwd=REPO, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "(('intra_op_num_threads', 1),) []", (p.stdout, p.stderr)
