"""The device install, proven on aarch64: the real agent in an emulated aarch64 Python (issue #22).

The agent (``python -m edge.agent``, this edgekit's code on the guest's PYTHONPATH, the aarch64 wheels of
ai-edge-litert, numpy, paho-mqtt and cryptography from the emulated root) runs under ``qemu-aarch64 -cpu
cortex-a76`` and talks to a real Mosquitto on the host's loopback: it publishes its birth (aarch64, the
emulated core), runs an arm-xnnpack bundle on synthetic frames, reports telemetry, applies a rollout from a
real HTTP server and rolls a bad one back. Everything it reports about speed is emulated: only the flow and
the numerics (its reference check) are asserted.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

from edge.bundle.archive import pack_bundle
from edge.deploy import DeviceStore
from edge.graph.samples import build_tiny_cnn
from edge.mqtt.client import BrokerConfig, paho
from edge.pipeline import convert
from edge.verify.isa import guest_pythonpath
from tests.agent.test_agent_infer_lock import busy_process  # noqa: F401 - a fixture: another process on a core
from tests.agent.test_agent_rollout import DEVICE, FLEET, ArtifactServer, Fleet
from tests.support.cli import wait_for
from tests.support.emulation import emulator_or_skip

NO_BUDGET_MS = 60_000.0


@pytest.fixture(scope="module")
def arm_bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three arm-xnnpack bundles of the tiny CNN (other weights each), packed for the artifact server."""
    emulator_or_skip()
    d = tmp_path_factory.mktemp("arm-rollout")
    out: dict[str, Any] = {"www": d / "www", "sha": {}}
    out["www"].mkdir()
    for seed, name in enumerate(("a", "b", "c")):
        out[name] = convert(build_tiny_cnn(d / f"src-{name}" / "tiny.onnx", seed=seed), "arm-xnnpack", d / name)
        out["sha"][name] = pack_bundle(out[name].path, out["www"] / f"{name}.tar")
    return out


class Watcher:
    """Every birth and telemetry message the device publishes."""

    def __init__(self, url: str) -> None:
        mqtt = paho()
        cfg = BrokerConfig.from_url(url)
        self.births: list[dict[str, Any]] = []
        self.telemetry: list[dict[str, Any]] = []
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="test-watch", protocol=mqtt.MQTTv5)

        def on_message(_c: Any, _u: Any, m: Any) -> None:
            (self.births if m.topic.endswith("/birth") else self.telemetry).append(json.loads(m.payload))

        self.c.on_message = on_message
        self.c.connect(cfg.host, cfg.port)
        for t in ("birth", "telemetry"):
            self.c.subscribe(f"edgekit/{FLEET}/{DEVICE}/{t}", qos=1)
        self.c.loop_start()

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


@pytest.fixture
def guest_agent(tmp_path: Path, broker: Any, arm_bundles: dict[str, Any]) -> Iterator[tuple[subprocess.Popen, Path]]:
    em = emulator_or_skip()
    store = tmp_path / "store"
    DeviceStore(store).install(arm_bundles["a"])
    log = tmp_path / "agent.log"
    with open(log, "w") as f:
        cmd = em.command(
            "-m",
            "edge.agent",
            "--device-id",
            DEVICE,
            "--fleet",
            FLEET,
            "--store",
            str(store),
            "--broker",
            broker.url,
            "--source",
            "synthetic",
            "--fps",
            "5",
            "--interval",
            "2",
            # emulation is 300-1000x slower than the device: no frame budget means anything here
            "--budget-ms",
            str(NO_BUDGET_MS),
            "--watch",
            "6",
            "--smoke-frames",
            "0",
            "--poll-current",
            "0.5",
            "--reconnect-max",
            "2",
        )
        proc = subprocess.Popen(
            cmd, env=em.env((guest_pythonpath(),)), stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        try:
            yield proc, store
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    print(log.read_text()[-3000:])


def test_the_agent_runs_on_emulated_aarch64(
    guest_agent: tuple[subprocess.Popen, Path], broker: Any, arm_bundles: dict[str, Any], busy_process: Any
) -> None:
    """Beside a busy process (issue #33: on a loaded CI machine the watch's reference check ran on the runner
    the inference thread was using, and rolled this good rollout back with watch_reference_drift)."""
    proc, store = guest_agent
    watch, fleet = Watcher(broker.url), Fleet(broker.url)
    try:
        birth = wait_for(
            lambda: next((b for b in watch.births if b.get("runner")), None),
            180,
            "the aarch64 agent's birth with its runner",
        )
        host = birth["host"]
        assert host["arch"] == "aarch64" and host["cpu"] == "ARM Cortex-A76", host  # qemu -cpu cortex-a76
        assert birth["bundle"]["id"] == arm_bundles["a"].id
        assert birth["runner"]["runtime"] == "ai-edge-litert 2.3.0"
        assert birth["runner"]["device_used"] == "CPU (XNNPack)"
        assert birth["reference_check"]["passed"] is True  # the bundle's own pairs, on ARM's kernels
        tel = wait_for(
            lambda: next((t for t in watch.telemetry if (t.get("inference") or {}).get("frames")), None),
            120,
            "telemetry with inference frames",
        )
        assert tel["inference"]["frames"] > 0
        with ArtifactServer(arm_bundles["www"]) as http:

            def desired(name: str, version: int, **kw: Any) -> dict[str, Any]:
                tar = arm_bundles["www"] / f"{name}.tar"
                return {
                    "rollout_id": f"r{version}",
                    "bundle_id": arm_bundles[name].id,
                    "version": version,
                    "replaces": version - 1,
                    "artifact_url": http.url(f"{name}.tar"),
                    "sha256": arm_bundles["sha"][name],
                    "size": tar.stat().st_size,
                    **kw,
                }

            fleet.desire(
                **desired("b", 2, budget_ms=NO_BUDGET_MS)
            )  # a good rollout: applied, checked on the device, watched, running
            r = fleet.wait_state("running", "failed", "rolled-back", version=2, timeout=240)
            assert r["state"] == "running" and r["bundle_running"] == arm_bundles["b"].id, (
                r["reason"],
                r.get("health"),
            )
            assert r["reference_check"]["passed"] is True
            # a bad one: over its budget on the device's workload, rolled back to B by the watch
            fleet.desire(**desired("c", 3, budget_ms=0.0001, watch_s=4))
            r = fleet.wait_state("running", "failed", "rolled-back", version=3, timeout=240)
            assert r["state"] == "rolled-back" and r["reason"]["code"] == "watch_p99_over_budget", r
            assert r["bundle_running"] == arm_bundles["b"].id
        assert DeviceStore(store).state().current == arm_bundles["b"].id
        assert [h["action"] for h in DeviceStore(store).history()][-2:] == ["deploy", "rollback"]
        assert proc.poll() is None  # still running
    finally:
        watch.close()
        fleet.close()
