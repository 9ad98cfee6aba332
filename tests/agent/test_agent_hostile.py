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
import time
from pathlib import Path
from typing import Any, Iterator

import mqtt_broker
import pytest
from conftest import wait_for

from edge.mqtt.client import BrokerConfig, paho

broker = mqtt_broker.broker
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
        self.c.publish(f"edgekit/{FLEET}/{DEVICE}/{kind}", json.dumps(body), qos=1,
                       retain=retain).wait_for_publish(5)

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
        return subprocess.Popen([sys.executable, "-m", "edge.agent", "--device-id", DEVICE, "--fleet", FLEET,
                                 "--store", str(store), "--source", "none", "--broker", url, "--interval", "1",
                                 "--reconnect-max", "1", *extra], stdout=out, stderr=subprocess.STDOUT, env=env)


def stop(p: subprocess.Popen[bytes]) -> int:
    p.send_signal(signal.SIGTERM)
    try:
        return p.wait(20)
    except subprocess.TimeoutExpired:
        p.kill()
        return p.wait(5)


def desired(url: str, version: int = 2) -> dict[str, Any]:
    return {"schema_version": 1, "type": "desired", "fleet": FLEET, "device": DEVICE, "rollout_id": f"r{version}",
            "bundle_id": "b-1", "version": version, "replaces": None, "artifact_url": url, "sha256": "0" * 64}


# -- item 1: a hostile retained desired state --------------------------------------------------------------

@pytest.mark.parametrize("url", ["http://[::1/x", "file:///srv/artifacts/b%00.tar", "http://host:99999/b.tar"])
def test_hostile_retained_desired_state_is_reported_failed_once(tmp_path: Path, broker: Any, watcher: Watcher,
                                                                url: str) -> None:
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


def test_hostile_desired_state_is_reported_once_across_a_restart(tmp_path: Path, broker: Any,
                                                                 watcher: Watcher) -> None:
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
        trial = {"id": "t1", "url": "http://[::1/x", "sha256": "0" * 64, "size": 10, "runner": "onnxruntime",
                 "precision": "fp32", "options": {}}
        req = {"schema_version": 1, "type": "tune-request", "fleet": FLEET, "device": DEVICE, "study_id": "s1",
               "objective": "latency", "schedule": {"reps": 1, "iters": 1, "warmup": 0}, "trials": [trial]}
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
