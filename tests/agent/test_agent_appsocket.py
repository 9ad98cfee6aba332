"""An application reports its frames to the agent over the app socket: typed, bounded, never fatal; and the
real lean agent (``python -m edge.agent --source app:SOCKET``) publishes them as telemetry on a real Mosquitto."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edge.agent.appsocket import MAX_DATAGRAM, AppReport, AppReporter, AppSocket, Refused, latency_json
from edge.errors import EdgeError
from edge.mqtt.payloads import load_schema
from tests.support.cli import wait_for

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"x" * (MAX_DATAGRAM + 1), "oversized"),
        (b"\xff\xfe", "malformed"),
        (b"not json", "malformed"),
        (b"[1, 2]", "malformed"),
        (b'{"v": 1, "latency_ms": NaN}', "malformed"),
        (b'{"latency_ms": 3}', "version"),
        (b'{"v": 2, "latency_ms": 3}', "version"),
        (b'{"v": true}', "version"),
        (b'{"v": 1, "latency_ms": 3, "cmd": "rm -rf /"}', "unknown_field"),
        (b'{"v": 1, "latency_ms": -1}', "bad_value"),
        (b'{"v": 1, "latency_ms": "3"}', "bad_value"),
        (b'{"v": 1, "latency_ms": [1, true]}', "bad_value"),
        (b'{"v": 1, "latency_ms": 1e308}', "bad_value"),
        (b'{"v": 1, "latency_ms": [' + b"1," * 1000 + b"1]}", "bad_value"),
        (b'{"v": 1, "errors": -1}', "bad_value"),
        (b'{"v": 1, "errors": 1.5}', "bad_value"),
        (b'{"v": 1, "dropped": 10000000}', "bad_value"),
    ],
)
def test_bad_datagrams_are_refused_by_reason(data: bytes, reason: str) -> None:
    with pytest.raises(Refused) as e:
        AppReport.parse(data)
    assert e.value.reason == reason


def test_good_datagrams_round_trip() -> None:
    assert AppReport.parse(b'{"v": 1, "latency_ms": 8}') == AppReport((8.0,))
    r = AppReport((1.5, 2.0), errors=2, dropped=3)
    assert AppReport.parse(r.encode()) == r
    assert AppReport.parse(b'{"v": 1}') == AppReport()


def test_latency_stats_match_the_agents_numpy_statistics() -> None:
    from edge.stats import LatencyStats

    rng = random.Random(1)
    for n in (1, 2, 7, 100, 1001):
        samples = [rng.uniform(0.1, 50.0) for _ in range(n)]
        want, got = LatencyStats.from_ms(samples).to_json(), latency_json(samples)
        assert got.keys() == want.keys()
        for k in want:
            assert got[k] == pytest.approx(want[k], abs=1e-3), (n, k)


def test_socket_takes_reports_counts_refusals_and_survives_garbage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "app.sock"
    path.write_text("not a socket")
    with pytest.raises(EdgeError, match="not a socket"):
        AppSocket(path)
    path.unlink()
    with pytest.raises(EdgeError, match="longer than"):
        AppSocket(tmp_path / ("x" * 120))
    s = AppSocket(path).start()
    try:
        assert oct(path.stat().st_mode & 0o777) == oct(0o660)
        rng = random.Random(0)
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        for _ in range(300):  # random bytes and random JSON-ish: refused and counted, the thread lives on
            junk = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 200)))
            raw.sendto(rng.choice([junk, b'{"v": 1, ' + junk + b"}"]), str(path))
        raw.sendto(b"y" * (MAX_DATAGRAM + 100), str(path))
        raw.close()
        # the reporter never blocks: a report that finds the socket's queue full (net.unix.max_dgram_qlen
        # datagrams) is counted lost, so let the reader drain the garbage first (it did not, under load)
        wait_for(lambda: sum(s.counters()["refused"].values()) == 301, 10, "the garbage to be read")
        with AppReporter(path, batch=10) as app:
            for i in range(25):
                app.frame(float(i))
            app.frame(error=True)
            assert app.report(latency_ms=[100.0, 200.0], dropped=4)
        assert app.lost == 0
        wait_for(lambda: s.received >= 4, 10, "the reports")  # 10 + 10 + report + the rest at close
        w = s.take_window()
        assert sorted(w.samples) == sorted([float(i) for i in range(25)] + [100.0, 200.0])
        assert (w.errors, w.dropped, w.frames) == (1, 4, 27)
        counts = s.counters()
        assert sum(counts["refused"].values()) == 301 and counts["refused"]["oversized"] == 1
        assert s._thread.is_alive()
    finally:
        s.close()
    assert not path.exists()
    with AppReporter(path) as gone:  # no agent: counted, never raised
        assert gone.report(latency_ms=1.0) is False and gone.lost == 1
    with AppReporter(path) as r, pytest.raises(ValueError):
        r.report(latency_ms=float("nan"))
    with monkeypatch.context() as m:
        m.delenv("EDGEKIT_APP_SOCKET", raising=False)
        with pytest.raises(EdgeError, match="EDGEKIT_APP_SOCKET"):
            AppReporter()
        m.setenv("EDGEKIT_APP_SOCKET", str(path))
        with AppReporter() as r:
            assert r.path == str(path)


def test_app_reports_reach_mqtt_as_the_agents_telemetry(tmp_path: Path, broker: Any) -> None:
    import paho.mqtt.client as mqtt

    got: list[dict[str, Any]] = []
    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="test-app-telemetry", protocol=mqtt.MQTTv5)
    sub.on_message = lambda _c, _u, m: got.append(json.loads(m.payload))
    sub.connect("127.0.0.1", broker.port)
    sub.subscribe("edgekit/lab/cam-01/+", qos=1)
    sub.loop_start()
    store = tmp_path / "store"
    store.mkdir()
    sock = tmp_path / "run" / "app.sock"
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "edge.agent",
            "--device-id",
            "cam-01",
            "--fleet",
            "lab",
            "--broker",
            broker.url,
            "--store",
            str(store),
            "--source",
            f"app:{sock}",
            "--budget-ms",
            "20",
            "--interval",
            "0.5",
            "--duration",
            "30",
            "--json",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        wait_for(lambda: sock.exists() or agent.poll() is not None, 30, "the agent's app socket")
        assert agent.poll() is None, agent.communicate()
        wait_for(lambda: any(m["type"] == "birth" for m in got), 20, "the agent's birth")
        birth = next(m for m in got if m["type"] == "birth")
        assert birth["agent"]["source"] == f"app:{sock}"
        latencies = [float(x) for x in range(1, 51)]  # 31 of 50 over the 20 ms budget
        import edge.agent

        assert edge.agent.report(latency_ms=latencies, dropped=2, errors=1, path=sock)  # the one-line API
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        raw.sendto(b'{"v": 1, "latency_ms": "fast"}', str(sock))
        raw.close()

        def with_frames() -> dict[str, Any] | None:
            return next((m for m in got if m["type"] == "telemetry" and (m["inference"] or {}).get("frames")), None)

        t = wait_for(with_frames, 20, "telemetry with the application's frames")
        inf = t["inference"]
        assert inf["source"] == "app" and inf["frames"] == 50 and inf["budget_misses"] == 30
        assert (inf["errors"], inf["frames_dropped"], inf["budget_ms"]) == (1, 2, 20.0)
        assert inf["latency_ms"] == latency_json(latencies) and inf["latency_ms"]["p50_ms"] == 25.5
        wait_for(
            lambda: any(m["type"] == "telemetry" and m["inference"]["app"]["refused"]["bad_value"] == 1 for m in got),
            10,
            "the refused datagram counted in telemetry",
        )
        import jsonschema

        schema = load_schema()
        for m in list(got):
            jsonschema.validate(m, schema)
    finally:
        agent.terminate()
        out, err = agent.communicate(timeout=30)
        sub.loop_stop()
        sub.disconnect()
    assert agent.returncode == 0, err
    assert not sock.exists()  # removed at stop


def test_agent_refuses_an_app_socket_path_that_is_not_a_socket(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    taken = tmp_path / "data.txt"
    taken.write_text("keep me")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "edge.agent",
            "--device-id",
            "cam-01",
            "--broker",
            "mqtt://127.0.0.1:9",
            "--store",
            str(tmp_path / "store"),
            "--source",
            f"app:{taken}",
            "--log-level",
            "error",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "not a socket" in lines[0], p.stderr
    assert taken.read_text() == "keep me"
