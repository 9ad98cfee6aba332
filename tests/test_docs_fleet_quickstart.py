"""The fleet quick start in docs/agent-fleet.md runs as written (issue #33): Mosquitto, a first bundle deployed into a
device store, the collector and an agent, a second bundle packed, served over HTTP and rolled out to completion.

Minutes under load (two conversions, a rollout watch of 30 s): outside CI's sample (``-m corpus_full``)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import REPO
from tests.support.mqtt_broker import free_port, mosquitto_binary


def quickstart_script(mqtt_port: int, http_port: int, mosquitto: str) -> str:
    """The page's bash block as a script: the install line left out (this venv has it), ports moved to free ones,
    every background job stopped at the end."""
    page = (REPO / "docs" / "agent-fleet.md").read_text(encoding="utf-8")
    section = page.split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, "no bash block under '## Quick start'"
    lines = [line for line in block.group(1).splitlines() if not line.startswith("pip install")]
    body = "\n".join(lines).replace("127.0.0.1:1883", f"127.0.0.1:{mqtt_port}").replace("-p 1883", f"-p {mqtt_port}")
    body = body.replace("8000", str(http_port)).replace("mosquitto -p", f"{mosquitto} -p")
    return "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\n" + body + "\n"


@pytest.mark.corpus_full
def test_the_fleet_quick_start_runs_as_written(tmp_path: Path) -> None:
    mosquitto = mosquitto_binary()
    assert mosquitto is not None, "mosquitto is not installed"
    script = quickstart_script(free_port(), free_port(), mosquitto)
    assert "--broker" in script and "rollout start" in script
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    p = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert "completed: 1 of 1 devices on the bundle" in " ".join(out.split()), out[-4000:]
    status = p.stdout.rsplit("fleet status", 1)[-1]  # the last status table: cam-01 on the rolled-out bundle
    assert "lab/cam-01" in status and "online" in status and "fp16" in status, status
