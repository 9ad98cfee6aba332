"""Tables and help read at 80 columns (issue #33 item 6): no word, path or URL cut, no column squeezed to a
letter; ``--wide`` shows every column whatever the terminal's width.

Before: at 80 columns `targets` printed ``converte``/``r chain`` and ``built-i``/``n``; `fleet status` squeezed 14
columns into 80 (``lab/ca``/``m-01``); `deploy --help` cut ``ssh://user@host:po…`` and ``$EDGEKIT_SSH_OPTIO…``."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.cli import run_cli

NARROW = {"COLUMNS": "80"}


def _fits(out: str) -> None:
    too_long = [line for line in out.splitlines() if len(line) > 80]
    assert not too_long, "\n".join(too_long)
    assert "…" not in out, out


def test_targets_at_80_columns_and_wide() -> None:
    p = run_cli("targets", env=NARROW)
    assert p.returncode == 0, p.stderr
    _fits(p.stdout)
    for word in ("coral-edgetpu", "onnxruntime", "openvino", "int8-dynamic", "16.67", "budget ms", "--wide"):
        assert word in p.stdout, (word, p.stdout)
    p = run_cli("targets", "--wide", env=NARROW)
    assert p.returncode == 0, p.stderr
    for word in ("Apple Neural Engine (Core ML)", "onnx->tflite → tflite->edgetpu", "converter chain", "built-in"):
        assert word in p.stdout, (word, p.stdout)  # whole, on one line: the terminal wraps, edgekit does not squeeze


def test_doctor_at_80_columns() -> None:
    p = run_cli("doctor", env=NARROW)
    assert p.returncode == 0, p.stderr
    table = p.stdout.split("aarch64 (emulated")[0]
    _fits(table)
    assert "https://pypi.nvidia.com" in table and "coral-edgetpu" in table


def test_deploy_help_at_80_columns() -> None:
    p = run_cli("deploy", "--help", env=NARROW)
    assert p.returncode == 0, p.stderr
    _fits(p.stdout)
    text = " ".join(p.stdout.split())  # the help wraps at word boundaries
    assert "ssh://user@host:port/path" in text and "$EDGEKIT_SSH_OPTIONS" in text, p.stdout


def test_fleet_status_at_80_columns_and_wide(tmp_path: Path) -> None:
    from edge.fleet.collector import Collector, CollectorConfig
    from edge.mqtt.client import BrokerConfig
    from edge.mqtt.payloads import encode, message

    url = f"sqlite:///{tmp_path}/fleet.db"
    c = Collector(CollectorConfig(BrokerConfig("127.0.0.1", 1), url, gap_grace_s=0.0))
    now = time.time()
    for i, device in enumerate(("line-3-inspection-cam-01", "cam-02")):
        bundle = f"mobilenetv2-x86-cpu-fp32-{i}e475a3765"
        birth = {"connection": 1, "state": "running", "agent": {"interval_s": 5.0}, "bundle": {"id": bundle}}
        birth["runner"] = {"runtime": "onnxruntime", "device_used": "CPU"}
        c.handle(
            f"edgekit/lab/{device}/birth", encode(message("birth", "lab", device, int(now), 0, birth)), received_at=now
        )
        tel = {"historical": False, "bundle_id": bundle, "inference": {"fps": 59.9, "p50_ms": 8.1, "p99_ms": 14.2}}
        c.handle(
            f"edgekit/lab/{device}/telemetry",
            encode(message("telemetry", "lab", device, int(now), 1, tel)),
            received_at=now,
        )
    c.flush()
    c.db.close()
    p = run_cli("fleet", "status", "--db", url, env=NARROW)
    assert p.returncode == 0, p.stderr
    _fits(p.stdout)
    text = " ".join(p.stdout.split())
    for word in ("device", "status", "bundle", "fps", "p99 ms", "misses", "last seen", "online", "--wide"):
        assert word in text, (word, p.stdout)
    assert "lab/cam-02" in p.stdout and "RSS MB" not in p.stdout
    p = run_cli("fleet", "status", "--db", url, "--wide", env=NARROW)
    assert p.returncode == 0, p.stderr
    assert "lab/line-3-inspection-cam-01" in p.stdout and "mobilenetv2-x86-cpu-fp32-1e475a3765" in p.stdout
    for header in ("p50 ms", "temp °C", "CPU %", "RSS MB", "spool", "missing", "runtime"):
        assert header in p.stdout, (header, p.stdout)
    # a terminal wide enough for every column gets every column without asking
    p = run_cli("fleet", "status", "--db", url, env={"COLUMNS": "250"})
    assert "RSS MB" in p.stdout and "onnxruntime on CPU" in p.stdout, p.stdout


def test_tune_table_at_80_columns(models: dict[str, Path], tmp_path: Path) -> None:
    """Was 8 columns folded letter by letter (``configura``/``tion``, ``onnxrunti``/``me``)."""
    p = run_cli(
        "tune", str(models["tiny"]), "-t", "x86-cpu", "--max-trials", "2", "--time-budget", "60",
        "--out", str(tmp_path / "t"), env=NARROW,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    table = p.stdout.split("pruned:")[0]
    _fits(table)
    assert "configuration" in table and "onnxruntime" in table and "--wide" in table, table
