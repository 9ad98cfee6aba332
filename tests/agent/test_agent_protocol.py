"""The agent's pieces without a broker: topics, outbox, back-off, broker options, sources, platform readers."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from edge.agent.health import CpuMeter, host_facts, process_cpu_seconds, rss_mb
from edge.agent.sources import parse_source
from edge.agent.tegrastats import parse_tegrastats
from edge.agent.thermal import ThermalProbe, decode_rpi_throttled, parse_vcgencmd_throttled
from edge.errors import EdgeError
from edge.mqtt.client import BrokerConfig, paho
from edge.mqtt.netloop import Backoff
from edge.mqtt.outbox import MemoryOutbox, SqliteOutbox
from edge.mqtt.payloads import encode, mark_historical, message
from edge.mqtt.topics import Topic, TopicError, fleet_filter, shared


def test_topics_format_parse_and_refuse_wildcards() -> None:
    t = Topic("lab", "cam-01", "telemetry")
    assert str(t) == "edgekit/lab/cam-01/telemetry" and Topic.parse(str(t)) == t
    c = Topic("lab", "cam-01", "cmd", "rebirth")
    assert str(c) == "edgekit/lab/cam-01/cmd/rebirth" and Topic.parse(str(c)) == c
    for bad in ("a/b", "a+", "#", "", " x", "nul\x00"):
        with pytest.raises(TopicError):
            Topic("lab", bad, "telemetry")
    for bad in (
        "edgekit/lab/cam-01",
        "edgekit/lab/cam-01/nope",
        "edgekit/lab/cam-01/birth/x",
        "x/lab/cam-01/birth",
        "edgekit/lab/+/birth",
    ):
        with pytest.raises(TopicError):
            Topic.parse(bad)
    with pytest.raises(TopicError):
        Topic("lab", "cam-01", "cmd")
    assert shared("g1", fleet_filter("lab")) == "$share/g1/edgekit/lab/+/+"
    assert fleet_filter() == "edgekit/+/+/+"


@pytest.mark.parametrize("make", ["sqlite", "memory"])
def test_outbox_bounds_order_and_drop_count(tmp_path: Path, make: str) -> None:
    def new() -> SqliteOutbox | MemoryOutbox:
        return (
            SqliteOutbox(tmp_path / "o.sqlite", max_messages=5, max_bytes=10_000)
            if make == "sqlite"
            else MemoryOutbox(max_messages=5, max_bytes=10_000)
        )

    before = int(time.time())
    o = new()
    s1 = o.next_session()
    assert before <= s1 <= time.time()  # seeded by the clock: a wiped store never reuses old (session, seq) keys
    ids = [o.append("t", f"m{i}".encode(), None) for i in range(8)]
    assert o.pending() == 5 and o.dropped_total == 3
    assert [r.payload for r in o.peek(0, 10)] == [b"m3", b"m4", b"m5", b"m6", b"m7"]  # oldest dropped first
    assert [r.id for r in o.peek(ids[4], 2)] == ids[5:7]
    o.ack(ids[3])
    o.ack(ids[3])  # twice: harmless
    assert o.pending() == 4
    o.append("t", b"x" * 9_995, None)  # the byte bound drops old rows too
    assert o.pending_bytes() <= 10_000 and o.dropped_total > 3
    if make == "sqlite":
        dropped, pending = o.dropped_total, o.pending()
        o.close()
        o = new()  # survives a restart: rows, the drop count, the session counter
        assert o.pending() == pending and o.dropped_total == dropped and o.next_session() == s1 + 1
    o.close()


def test_backoff_is_exponential_with_jitter() -> None:
    b = Backoff(0.5, 60.0, jitter=0.5)
    rng = random.Random(1)
    for n in range(12):
        cap = min(60.0, 0.5 * 2**n)
        ds = [b.delay(n, rng) for _ in range(50)]
        assert all(cap * 0.5 <= d <= cap for d in ds)
        assert (
            len({round(d, 6) for d in ds}) > 40
        )  # jittered: clients that lost the broker together do not return together
    assert b.delay(1000, rng) <= 60.0


def test_broker_urls_and_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGEKIT_MQTT_PASSWORD", raising=False)
    b = BrokerConfig.from_url("mqtt://10.0.0.5")
    assert (b.host, b.port, b.tls) == ("10.0.0.5", 1883, False)
    assert BrokerConfig.from_url("mqtts://broker.lan").port == 8883
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    b = BrokerConfig.from_url("mqtt://h:1999", ca_file=ca)
    assert b.tls and b.port == 1999 and b.url == "mqtts://h:1999"
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    b = BrokerConfig.from_url("mqtt://h", username="dev", password_file=pw)
    assert b.password == "s3cret" and "s3cret" not in repr(b)
    monkeypatch.setenv("EDGEKIT_MQTT_PASSWORD", "fromenv")
    assert BrokerConfig.from_url("mqtt://dev@h").password == "fromenv"
    for url, kw, msg in [
        ("http://h", {}, "bad broker address"),
        ("mqtt://u:p@h", {}, "visible to every user"),
        ("mqtt://h/x", {}, "no path"),
        ("mqtt://h", {"ca_file": tmp_path / "no.pem"}, "does not exist"),
        ("mqtt://h", {"cert_file": ca}, "both --cert and --key"),
    ]:
        with pytest.raises(EdgeError, match=msg):
            BrokerConfig.from_url(url, **kw)
    assert paho().MQTTv5 == 5


def test_sources() -> None:
    assert parse_source("synthetic") == ("synthetic", "") and parse_source("none") == ("none", "")
    with pytest.raises(EdgeError, match="unknown frame source"):
        parse_source("webcam")
    with pytest.raises(EdgeError, match="needs an argument"):
        parse_source("video:")
    assert parse_source("video:clip.mp4") == ("video", "clip.mp4")
    assert parse_source("images:frames/") == ("images", "frames/")
    with pytest.raises(EdgeError, match="camera is a number"):
        parse_source("camera:front")
    import edge.video

    assert callable(edge.video.open_agent_source)  # the agent's video sources exist (issue 14)


def test_payload_envelope_and_historical_mark() -> None:
    m = message("telemetry", "lab", "cam-01", 3, 9, {"historical": False, "x": float("nan"), "y": [float("inf")]})
    assert m["schema_version"] == 1 and m["x"] is None and m["y"] == [None]
    raw = encode(m)
    assert mark_historical(raw) != raw and b'"historical":true' in mark_historical(raw)


# Recorded tegrastats lines, one per L4T generation (formats as printed by the boards).
TEGRASTATS = {
    "tx1_l4t28": "RAM 3468/3983MB (lfb 48x4MB) SWAP 873/8192MB (cached 295MB) cpu [17%,13%,29%,5%]@408 EMC 1%@408 "
    "APE 25 GR3D 3%@76",
    "nano_l4t32": "RAM 1766/3964MB (lfb 197x4MB) SWAP 0/2048MB (cached 0MB) CPU [24%@1224,15%@1224,13%@1224,10%@1224] "
    "EMC_FREQ 0% GR3D_FREQ 0% PLL@21C CPU@25C PMIC@100C GPU@23.5C AO@33.5C thermal@24.5C "
    "POM_5V_IN 2545/2547 POM_5V_GPU 0/0 POM_5V_CPU 549/529",
    "xavier_nx": "12-23-2024 22:54:11 RAM 3162/7620MB (lfb 4x2MB) SWAP 0/3810MB (cached 0MB) "
    "CPU [1%@729,0%@729,0%@729,0%@729,off,off] GR3D_FREQ 1% cpu@62.843C soc2@61.968C soc0@60.625C "
    "gpu@61.687C tj@62.843C soc1@61.687C VDD_IN 3913mW/3922mW VDD_CPU_GPU_CV 598mW/598 VDD_SOC 1238mW/1237mW",
    "orin_jp6": "08-29-2023 10:43:05 RAM 2531/30536MB (lfb 6406x4MB) SWAP 0/15268MB (cached 0MB) CPU [1%@729,0%@729,"
    "0%@729,0%@729,0%@729,0%@729,0%@729,0%@729,off,off,off,off] EMC_FREQ 0%@2133 GR3D_FREQ 0%@[305,305] "
    "NVENC off NVDEC off NVJPG off NVJPG1 off VIC off OFA off NVDLA0 off NVDLA1 off PVA0_FREQ off APE 174 "
    "CV0@-256C CPU@44.062C Tboard@33C SOC2@41.343C Tdiode@35.25C SOC0@41.437C CV1@-256C GPU@-256C "
    "tj@44.062C SOC1@40.625C CV2@-256C VDD_GPU_SOC 2789mW/2789mW VDD_CPU_CV 398mW/398mW "
    "VIN_SYS_5V0 3234mW/3234mW NC 0mW/0mW VDDQ_VDD2_1V8AO 403mW/403mW NC 0mW/0mW",
}


def test_tegrastats_parser_on_recorded_lines() -> None:
    tx1 = parse_tegrastats(TEGRASTATS["tx1_l4t28"])
    assert tx1["ram_used_mb"] == 3468 and tx1["cpu"][2] == {"load_percent": 29, "freq_mhz": 408}
    assert tx1["gpu_load_percent"] == 3 and tx1["gpu_freq_mhz"] == 76 and tx1["emc_freq_mhz"] == 408
    nano = parse_tegrastats(TEGRASTATS["nano_l4t32"])
    assert nano["cpu_load_percent"] == 15.5 and nano["gpu_load_percent"] == 0
    assert nano["temperatures_c"]["gpu"] == 23.5 and "pmic" not in nano["temperatures_c"]  # PMIC@100C is a placeholder
    assert nano["power"]["POM_5V_IN"] == {"now_mw": 2545, "avg_mw": 2547}
    nx = parse_tegrastats(TEGRASTATS["xavier_nx"])
    assert nx["cpu"][4] is None and nx["cpu"][0] == {"load_percent": 1, "freq_mhz": 729}
    assert nx["max_temp_c"] == 62.843 and nx["power"]["VDD_CPU_GPU_CV"]["avg_mw"] == 598
    orin = parse_tegrastats(TEGRASTATS["orin_jp6"])
    assert orin["ram_total_mb"] == 30536 and orin["swap_total_mb"] == 15268 and len(orin["cpu"]) == 12
    assert orin["gpu_freq_mhz"] == 305 and orin["emc_freq_mhz"] == 2133
    assert "gpu" not in orin["temperatures_c"] and orin["temperatures_c"]["tj"] == 44.062  # -256C: sensor off
    assert orin["power"]["VIN_SYS_5V0"]["now_mw"] == 3234 and "RAM" not in orin["power"]
    assert parse_tegrastats("garbage line") == {}


def test_thermal_probe_on_a_fake_sysfs(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    for i, (kind, milli) in enumerate([("cpu-thermal", "61500"), ("acpitz", "40000"), ("acpitz", "41000")]):
        z = sys_root / "class" / "thermal" / f"thermal_zone{i}"
        z.mkdir(parents=True)
        (z / "type").write_text(kind + "\n")
        (z / "temp").write_text(milli + "\n")
    apex = sys_root / "class" / "apex" / "apex_0"
    apex.mkdir(parents=True)
    (apex / "temp").write_text("47250\n")
    fw = sys_root / "devices" / "platform" / "soc" / "soc:firmware"
    fw.mkdir(parents=True)
    (fw / "get_throttled").write_text("50005\n")
    cpu = sys_root / "devices" / "system" / "cpu" / "cpu0" / "thermal_throttle"
    cpu.mkdir(parents=True)
    (cpu / "core_throttle_count").write_text("7\n")
    probe = ThermalProbe(sys_root, use_vcgencmd=False, use_tegrastats=False)
    s = probe.sample()
    probe.close()
    assert s["zones_c"] == {"cpu-thermal": 61.5, "acpitz": 40.0, "acpitz_2": 41.0}
    assert s["coral_apex_c"] == {"apex_0": 47.25} and s["max_c"] == 61.5 and s["cpu_throttle_events"] == 7
    assert s["rpi_throttled"]["under_voltage"] and s["rpi_throttled"]["throttled"]
    assert s["rpi_throttled"]["under_voltage_occurred"] and not s["rpi_throttled"]["arm_freq_capped"]
    assert s["throttled_now"] is True and set(probe.sources) >= {"thermal_zones", "rpi_throttled", "coral_apex"}
    assert parse_vcgencmd_throttled("throttled=0x0\n") == 0 and decode_rpi_throttled(0)["throttled"] is False
    empty = ThermalProbe(tmp_path / "nothing", use_vcgencmd=False, use_tegrastats=False)
    assert empty.sample() == {"max_c": None, "throttled_now": None} and empty.sources == []


def test_health_from_proc() -> None:
    if not Path("/proc/self/stat").exists():
        pytest.skip("hardware: not Linux (no /proc on this platform)")
    meter = CpuMeter()
    t = time.process_time()
    while time.process_time() - t < 0.05:
        pass
    s = meter.sample()
    assert s["process_cpu_percent"] is not None and s["process_cpu_percent"] > 1
    assert process_cpu_seconds() is not None and (rss_mb() or 0) > 5
    facts = host_facts()
    assert facts["os"] == "linux" and facts["cpu_count"] >= 1 and facts["mem_total_mb"] > 0


def test_cli_user_errors_are_one_line(tmp_path: Path) -> None:
    from tests.support.cli import assert_user_error, run_cli

    (tmp_path / "store").mkdir()
    base = ["agent", "--broker", "mqtt://127.0.0.1:9", "--store", str(tmp_path / "store")]
    assert_user_error(run_cli(*base, "--device-id", "cam/01"), "contains '/'")
    assert_user_error(run_cli("agent", "--device-id", "cam-01", "--store", str(tmp_path / "nope")), "does not exist")
    assert_user_error(run_cli(*base, "--device-id", "cam-01", "--broker", "tcp://x"), "bad broker address")
    assert_user_error(run_cli(*base, "--device-id", "cam-01", "--source", "webcam"), "unknown frame source")
    assert_user_error(run_cli(*base, "--device-id", "cam-01", "--source", "camera:front"), "camera is a number")
    assert_user_error(run_cli("fleet", "collect", "--db", "oracle://x"), "unsupported database URL")


def test_missing_paho_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from edge.errors import MissingDependencyError

    for name in [m for m in sys.modules if m == "paho" or m.startswith("paho.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "paho", None)  # import paho -> ImportError
    with pytest.raises(MissingDependencyError, match=r"edgekit-ml\[mqtt\]"):
        paho()


def test_systemd_unit() -> None:
    import configparser

    unit = Path(__file__).resolve().parents[2] / "firmware_helpers" / "edgekit-agent.service"
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(unit.read_text())
    svc = cp["Service"]
    assert " -m edge.agent " in svc["ExecStart"] and "--store /var/lib/edgekit" in svc["ExecStart"]  # lean entry
    assert svc["KillSignal"] == "SIGTERM" and int(svc["TimeoutStopSec"]) >= 15  # flush (10 s) + death
    assert svc["Restart"] in ("always", "on-failure") and svc["StateDirectory"] == "edgekit"
    assert cp["Install"]["WantedBy"] == "multi-user.target" and "network-online.target" in cp["Unit"]["After"]


def test_runner_options_from_the_command_line() -> None:
    from edge.cli.agent import parse_runner_options

    assert parse_runner_options(["intra_op_num_threads=1", 'providers=["CPUExecutionProvider"]', "x=abc"]) == {
        "intra_op_num_threads": 1,
        "providers": ["CPUExecutionProvider"],
        "x": "abc",
    }
    with pytest.raises(EdgeError, match="KEY=VALUE"):
        parse_runner_options(["threads"])
