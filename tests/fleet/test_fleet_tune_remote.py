"""``edgekit fleet tune --device ID`` (edge.tune.remote + edge.agent.tune_cmd): a real Mosquitto, a real agent
process (``python -m edge.agent``), trials converted here, served over HTTP, downloaded, verified and measured by
the agent, the same table returned. Malformed requests are refused naming the field; a wrong sha256 is refused
before anything is unpacked; a second request while one runs is answered ``busy``; a rollout arriving during a tune
waits for it, then is applied; successive halving runs one request per rung and a re-run resumes from the study; a
runner the device lacks is pruned with its reason. Figures are asserted to exist and to come from the device, never
their size."""

from __future__ import annotations

import dataclasses
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

import numpy as np
import pytest

from edge.capabilities import cpu_isa
from edge.mqtt.client import BrokerConfig
from edge.mqtt.payloads import SCHEMA_VERSION
from edge.tune.remote import DeviceTune, tune_on_device
from edge.tune.remote_link import ArtifactServer, DeviceLink
from edge.tune.search import TuneOptions
from tests.support import fuzz_models, mqtt_broker
from tests.support.cli import REPO, assert_user_error, run_cli, wait_for

FLEET, DEVICE = "lab", "dev-1"
SHA = "ab" * 32


@pytest.fixture(scope="module")
def mqtt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if mqtt_broker.mosquitto_binary() is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    with mqtt_broker.Mosquitto(tmp_path_factory.mktemp("broker")) as m:
        yield m


@contextmanager
def agent_process(
    url: str, root: Path, device: str, *extra: str, lacking: tuple[str, ...] = ()
) -> Iterator[dict[str, Any]]:
    """A real agent process (``python -m edge.agent``) with an empty store: no model of its own runs. ``lacking``:
    Python packages the process cannot import (``sys.modules[name] = None``), as on a device without them."""
    store = root / "store"
    store.mkdir(parents=True)
    log = root / "agent.log"
    start = (
        ["-m", "edge.agent"]
        if not lacking
        else [
            "-c",
            f"import runpy, sys; sys.modules.update(dict.fromkeys({list(lacking)!r})); sys.argv[0] = 'edge.agent'; "
            "runpy.run_module('edge.agent', run_name='__main__', alter_sys=True)",
        ]
    )
    p = subprocess.Popen(
        [
            sys.executable,
            *start,
            "--device-id",
            device,
            "--fleet",
            FLEET,
            "--broker",
            url,
            "--store",
            str(store),
            "--source",
            "none",
            "--interval",
            "5",
            "--poll-current",
            "0",
            "--download-timeout",
            "60",
            "--log-level",
            "info",
            "--flush-timeout",
            "1",
            *extra,
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=open(log, "wb"),
    )
    try:
        with DeviceLink(BrokerConfig.from_url(url), FLEET, device) as link:
            wait_for(
                lambda: link.synced.is_set() and link.birth is not None or p.poll() is not None, 60, "the agent's birth"
            )
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
    trial = {
        "id": "t00",
        "url": url,
        "sha256": sha,
        "size": 1000,
        "runner": "onnxruntime",
        "precision": "fp32",
        "options": {"intra_op_num_threads": 1},
    }
    trial.update(over.pop("trial", {}))
    req = {
        "schema_version": SCHEMA_VERSION,
        "type": "tune-request",
        "fleet": FLEET,
        "device": DEVICE,
        "study_id": over.pop("study_id", "s1"),
        "objective": "latency",
        "schedule": {"reps": 2, "iters": 5, "warmup": 1},
        "trials": [trial],
    }
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


def test_fleet_tune_measures_on_the_device_and_returns_the_table(
    mqtt: Any, agent: dict[str, Any], models: dict[str, Path], work: Path
) -> None:
    out = work / "tune"
    p = run_cli(
        "fleet",
        "tune",
        str(models["tiny"]),
        "--device",
        DEVICE,
        "--fleet",
        FLEET,
        "--broker",
        mqtt.url,
        "--target",
        "x86-cpu",
        "--serve",
        "127.0.0.1:0",
        "--runner",
        "onnxruntime",
        "--runner",
        "openvino",
        "--precision",
        "fp32",
        "--threads",
        "1",
        "--max-trials",
        "3",
        "--reps",
        "2",
        "--iters",
        "5",
        "--warmup",
        "1",
        "--out",
        str(out),
        "--json",
    )
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
    assert f"tune {r['device']['study_id']}-r0: done" in log, log[-2000:]  # 3 trials: one rung (halving keeps 3)
    assert r["strategy"] == "halving" and r["device"]["requests"] == 1 and r["device"]["rungs"] == ["0:2x5"]
    assert not any((agent["store"] / "agent" / "tune").iterdir())
    # the table, as a person sees it, from the same JSON
    from rich.console import Console

    import edge.cli.tune as cli_tune
    from edge.cli.tune import render_tune

    cli_tune.console = Console(record=True, width=200)
    try:
        render_tune(r)
        text = cli_tune.console.export_text()
    finally:
        from edge.cli._common import console

        cli_tune.console = console
    assert "chosen" in text and r["winner"]["label"] in text


@pytest.mark.parametrize(
    "change, field",
    [
        ({"schedule": {"reps": 0, "iters": 5, "warmup": 1}}, "schedule.reps"),
        ({"objective": "e2e"}, "objective"),
        ({"trial": {"url": "file:///etc/passwd"}}, "trials[0].url"),
        ({"trial": {"id": "../x"}}, "trials[0].id"),
        ({"trial": {"sha256": "AB" * 32}}, "trials[0].sha256"),
        ({"trial": {"options": {"intra_op_num_threads": [1]}}}, "trials[0].options.intra_op_num_threads"),
        ({"trial": {"options": {"session_library": "/tmp/x.so"}}}, "trials[0].options.session_library"),
        ({"extra": 1}, "extra"),
    ],
)
def test_malformed_request_is_refused_naming_the_field(link: DeviceLink, change: dict[str, Any], field: str) -> None:
    link.send(request("http://127.0.0.1:9/x.tar", study_id="bad", **change))
    r = final(link, "bad")
    assert r["status"] == "refused" and r["field"] == field, r
    assert field in r["error"]


def test_wrong_sha256_is_refused_before_unpacking_and_busy_while_running(
    link: DeviceLink, agent: dict[str, Any], tmp_path: Path
) -> None:
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


class Reported:
    """The device's retained ``reported`` stream, as the collector reads it (each message with its arrival order)."""

    def __init__(self, url: str, device: str = DEVICE) -> None:
        from edge.mqtt.client import paho

        mqtt = paho()
        cfg = BrokerConfig.from_url(url)
        self.topic = f"edgekit/{FLEET}/{device}"
        self.msgs: list[dict[str, Any]] = []
        self.c = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=f"test-reported-{device}", protocol=mqtt.MQTTv5
        )
        self.c.on_message = lambda _c, _u, m: m.payload and self.msgs.append(json.loads(m.payload))
        self.c.connect(cfg.host, cfg.port)
        self.c.subscribe(f"{self.topic}/reported", qos=1)
        self.c.loop_start()

    def desire(self, body: dict[str, Any] | None) -> None:
        data = json.dumps(body) if body is not None else b""  # None: clear the retained desired state
        self.c.publish(f"{self.topic}/desired", data, qos=1, retain=True).wait_for_publish(5)

    def of(self, version: int) -> list[dict[str, Any]]:
        return [m for m in list(self.msgs) if m.get("desired_version") == version]

    def __enter__(self) -> Reported:
        return self

    def __exit__(self, *exc: object) -> None:
        self.c.loop_stop()
        self.c.disconnect()


def test_a_rollout_arriving_during_a_tune_waits_for_it_then_is_applied(
    mqtt: Any, link: DeviceLink, agent: dict[str, Any]
) -> None:
    """Never applied beside the tune (its download would not even start), never lost: applied once it ends."""
    version = 7
    with Reported(mqtt.url) as fleet, HoldServer() as hold:
        link.send(request(f"http://127.0.0.1:{hold.port}/slow.tar", study_id="held"))
        wait_for(lambda: hold.held, 20, "the tune's download to start")
        fleet.desire(
            {
                "schema_version": SCHEMA_VERSION,
                "type": "desired",
                "fleet": FLEET,
                "device": DEVICE,
                "rollout_id": "r-held",
                "bundle_id": "b-held",
                "version": version,
                "artifact_url": f"http://127.0.0.1:{hold.port}/rollout.tar",
                "sha256": SHA,
                "size": 1000,
            }
        )
        first = wait_for(lambda: fleet.of(version), 20, "the device's report of the held rollout")[0]
        assert first["state"] == "idle" and first["progress"] == {"waiting_for": "tune", "study_id": "held"}, first
        assert first["rollout_id"] == "r-held" and first["desired_bundle"] == "b-held", first
        time.sleep(1.5)  # an apply beside the tune would have reported downloading and connected by now
        assert [m["state"] for m in fleet.of(version)] == ["idle"], fleet.of(version)
        assert set(hold.paths) == {"/slow.tar"}, hold.paths  # the tune's download only (it retries each quiet second)
        hold.answer.set()  # the tune's download fails (404), the tune ends, then the rollout is applied
        done = final(link, "held")
        assert done["status"] == "done" and done["rollout_waiting"] == {"rollout_id": "r-held", "version": version}
        last = wait_for(
            lambda: (fleet.of(version) or [{}])[-1].get("state") in ("failed", "running") and fleet.of(version)[-1],
            30,
            "the rollout's outcome",
        )
        fleet.desire(None)
    states = [m["state"] for m in fleet.of(version)]
    assert states[0] == "idle" and "downloading" in states and last["state"] == "failed", states
    assert last["reason"]["code"] == "download_failed" and "404" in last["reason"]["detail"], last


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
        self.paths: list[str] = []  # each request's path, as it came
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                c = None
            if c is not None:
                self.held.append(c)
                c.settimeout(2.0)
                try:
                    self.paths.append(c.recv(4096).split(b" ", 2)[1].decode())
                except (OSError, IndexError, UnicodeDecodeError):
                    self.paths.append("?")
            if self.answer.is_set():
                for c in self.held:
                    try:
                        c.sendall(b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                        c.close()
                    except OSError:
                        pass
                self.held.clear()

    def __enter__(self) -> HoldServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(5)
        for c in self.held:
            c.close()
        self.sock.close()


def test_cli_refuses_an_unknown_device_in_one_line(
    mqtt: Any, agent: dict[str, Any], models: dict[str, Path], tmp_path: Path
) -> None:
    p = run_cli(
        "fleet",
        "tune",
        str(models["tiny"]),
        "--device",
        "nobody",
        "--fleet",
        FLEET,
        "--broker",
        mqtt.url,
        "--target",
        "x86-cpu",
        "--serve",
        "127.0.0.1:0",
        "--out",
        str(tmp_path / "o"),
    )
    assert_user_error(p, "device nobody has no birth")


def test_a_model_no_configuration_converts_is_a_user_error(mqtt: Any, agent: dict[str, Any], tmp_path: Path) -> None:
    """As for `edgekit tune`: a model onnxruntime cannot load (an op from an unknown domain) is exit 2 naming the
    file and the first refusal, not exit 1 (a verdict on configurations), and nothing reaches the device."""
    model = fuzz_models.onnx_unknown_domain(tmp_path, np.random.default_rng(0))
    p = run_cli(
        "fleet", "tune", str(model), "--device", DEVICE, "--fleet", FLEET, "--broker", mqtt.url,
        "--target", "x86-cpu", "--serve", "127.0.0.1:0", "--max-trials", "1", "--out", str(tmp_path / "o"),
    )  # fmt: skip
    assert_user_error(p, "no configuration converted here", model.name)


def test_device_with_a_trust_store_measures_signed_trials_only(
    mqtt: Any, models: dict[str, Path], work: Path, tmp_path: Path
) -> None:
    from edge.bundle.signing import generate_key
    from edge.bundle.trust import TrustStore
    from edge.tune.search import Schedule

    keys = tmp_path / "keys"
    key = generate_key("builder", keys)
    TrustStore(tmp_path / "trust").add_key(key.public_path.read_bytes(), "builder")
    remote = DeviceTune(broker=BrokerConfig.from_url(mqtt.url), fleet=FLEET, target="x86-cpu", serve="127.0.0.1:0")
    opts = TuneOptions(
        cache=work / "tune" / "cache",
        runners=["onnxruntime"],
        precisions=["fp32"],
        threads=[1],
        max_trials=1,
        schedule=Schedule(reps=2, iters=5, warmup=1),
        pictures=False,
    )
    with agent_process(mqtt.url, tmp_path / "dev2", "dev-2", "--trust-dir", str(tmp_path / "trust")):
        unsigned = tune_on_device(
            models["tiny"], "dev-2", remote, options=dataclasses.replace(opts, out=tmp_path / "o1")
        )
        signed = tune_on_device(
            models["tiny"],
            "dev-2",
            dataclasses.replace(remote, sign_key="builder", keys_dir=keys),
            options=dataclasses.replace(opts, out=tmp_path / "o2"),
        )
    assert unsigned.converted == 0 and signed.converted == 0  # the first test's cache
    (t,) = unsigned.trials
    assert unsigned.winner is None and "unsigned" in t["status"] and t.get("result") is None, t["status"]
    (t,) = signed.trials
    assert signed.winner is t and t["result"]["p50_ms"] > 0 and t["parity"]["passed"] is True, t


def test_successive_halving_runs_rungs_on_the_device_and_a_rerun_resumes_from_the_study(
    mqtt: Any, agent: dict[str, Any], models: dict[str, Path], work: Path, tmp_path: Path
) -> None:
    from edge.errors import EdgeError
    from edge.tune.measure import trial_score
    from edge.tune.search import Schedule

    remote = DeviceTune(broker=BrokerConfig.from_url(mqtt.url), fleet=FLEET, target="x86-cpu", serve="127.0.0.1:0")
    opts = TuneOptions(
        cache=work / "tune" / "cache",
        runners=["onnxruntime", "openvino"],
        precisions=["fp32"],
        threads=[1],
        schedule=Schedule(reps=2, iters=5, warmup=1),
        pictures=False,
        out=tmp_path / "o",
    )
    r = tune_on_device(models["tiny"], DEVICE, remote, options=opts)
    assert r.converted == 0 and len(r.trials) == 4  # the first test's cache: two recipes, four configurations
    # 4 trials: a short rung for all, the best 3 (at least eta) at full length; one request per rung
    assert r.device["rungs"] == ["0:2x6", "1:2x5"] and r.device["requests"] == 2 and r.measured == 4 + 3
    (out,) = [t for t in r.trials if t["status"] == "eliminated at 0:2x6"]
    finalists = [t for t in r.trials if t is not out]
    assert list(out["rungs"]) == ["0:2x6"] and all(list(t["rungs"]) == ["0:2x6", "1:2x5"] for t in finalists)
    worst = trial_score("latency", out["rungs"]["0:2x6"]["rep_scores"])
    assert all(trial_score("latency", t["rungs"]["0:2x6"]["rep_scores"]) <= worst for t in finalists)
    assert all(t["parity"]["trial"]["passed"] is True for t in r.trials)  # checked on the device, every rung
    assert r.winner in finalists and r.winner["result"]["rung"] == "1:2x5"
    log = agent["log"].read_text()
    sid = r.device["study_id"]
    assert f"tune {sid}-r0: 4 trials, latency, 2x6" in log and f"tune {sid}-r1: 3 trials, latency, 2x5" in log
    study = json.loads((tmp_path / "o" / "study.json").read_text())
    assert study["device"] == f"{FLEET}/{DEVICE}" and r.study_path == str(tmp_path / "o" / "study.json")

    # a run cut short before one finalist's full measurement: the re-run sends only that one, only at full length
    cut = finalists[0]["id"]
    del study["trials"][cut]["rungs"]["1:2x5"]
    (tmp_path / "o" / "study.json").write_text(json.dumps(study))
    r2 = tune_on_device(models["tiny"], DEVICE, remote, options=opts)
    sid2 = r2.device["study_id"]
    log = agent["log"].read_text()
    assert f"tune {sid2}-r1: 1 trials, latency, 2x5" in log and f"tune {sid2}-r0" not in log
    assert r2.measured == 1 and r2.device["requests"] == 1, (r2.measured, r2.device)
    assert any("4 trials resumed from the study" in n for n in r2.notes), r2.notes
    kept = {t["id"]: t["rungs"] for t in r.trials}
    again = {t["id"]: t["rungs"] for t in r2.trials}
    assert all(again[i] == kept[i] for i in kept if i != cut)  # not measured again
    assert again[cut]["0:2x6"] == kept[cut]["0:2x6"] and again[cut]["1:2x5"] != kept[cut]["1:2x5"]
    # a study of another device is refused before anything is converted or sent
    study = json.loads((tmp_path / "o" / "study.json").read_text())
    (tmp_path / "o" / "study.json").write_text(json.dumps({**study, "device": f"{FLEET}/dev-9"}))
    with pytest.raises(EdgeError, match=f"made for device '{FLEET}/dev-9', this run is '{FLEET}/{DEVICE}'"):
        tune_on_device(models["tiny"], DEVICE, remote, options=opts)


def test_a_runner_the_device_lacks_is_pruned_with_its_reason_before_any_download(
    mqtt: Any, models: dict[str, Path], work: Path, tmp_path: Path
) -> None:
    from edge.tune.search import Schedule

    steps: list[str] = []
    with agent_process(mqtt.url, tmp_path / "dev3", "dev-3", lacking=("openvino",)) as dev:
        r = tune_on_device(
            models["tiny"],
            "dev-3",
            DeviceTune(broker=BrokerConfig.from_url(mqtt.url), fleet=FLEET, target="x86-cpu", serve="127.0.0.1:0"),
            options=TuneOptions(
                cache=work / "tune" / "cache",
                runners=["onnxruntime", "openvino"],
                precisions=["fp32"],
                threads=[1],
                max_trials=2,
                schedule=Schedule(reps=2, iters=5, warmup=1),
                pictures=False,
                out=tmp_path / "o",
            ),
            on_step=steps.append,
        )
    (ov,) = [t for t in r.trials if t["runner"] == "openvino"]
    assert ov["status"].startswith(
        "pruned on the device: runner openvino cannot run on this device: Python "
        "package providing 'openvino' is not installed"
    ), ov["status"]
    assert ov["result"] is None and "load_ms" not in ov
    assert [p for p in r.pruned if p.startswith("runner openvino") and p.endswith("(device dev-3)")], r.pruned
    assert [s for s in steps if "fetching" in s] == ["dev-3: fetching 1"], steps  # the onnxruntime bundle only
    assert r.winner is not None and r.winner["runner"] == "onnxruntime" and "failed to convert" not in r.summary()
    assert "failed to load" not in dev["log"].read_text()


def test_rungs_stay_within_what_a_device_accepts() -> None:
    from edge.agent.tune_cmd import LIMITS
    from edge.errors import EdgeError
    from edge.tune.rungs import MAX_ITERS, MAX_REPS, plan_rungs
    from edge.tune.search import Schedule

    assert (MAX_REPS, MAX_ITERS) == (LIMITS["reps"][1], LIMITS["iters"][1])
    for sched in (Schedule(), Schedule(reps=50, iters=10_000), Schedule(reps=1, iters=1), Schedule(reps=7, iters=13)):
        for n in (1, 3, 4, 10, 64):
            rungs = plan_rungs(sched, n, "halving", "latency")
            assert len(rungs) == (1 if n <= 3 else 2 if n <= 9 else 3 if n <= 27 else 4), (n, rungs)
            assert all(1 <= r <= MAX_REPS and 1 <= i <= MAX_ITERS for r, i in rungs), (sched, n, rungs)
            assert rungs[-1][0] * rungs[-1][1] >= sched.reps * sched.iters  # the finalists: the full samples
    assert plan_rungs(Schedule(), 64, "exhaustive", "latency") == [(5, 40)]
    with pytest.raises(EdgeError, match="unknown strategy"):
        plan_rungs(Schedule(), 4, "grid", "latency")


def test_the_agent_stays_lean_until_a_tune_arrives() -> None:
    """The cmd/tune hook and its request parsing import no numpy and no runtime (they come with the measurement)."""
    code = (
        "import sys, edge.agent.agent, edge.agent.tune_cmd as t; "
        "r = t.TuneRequest.parse(sys.argv[1].encode(), fleet='lab', device='dev-1'); "
        "print(r.trials[0].options, sorted(m for m in ('numpy', 'onnxruntime', 'openvino', 'edge.tune.measure') "
        "if m in sys.modules))"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, json.dumps(request("http://h/x.tar"))],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert p.returncode == 0 and p.stdout.strip() == "(('intra_op_num_threads', 1),) []", (p.stdout, p.stderr)
