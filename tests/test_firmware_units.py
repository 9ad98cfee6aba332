"""The systemd units in firmware_helpers/ are hardened (issue #33, item 4), and say only what is true.

``systemd-analyze security --offline=true UNIT`` (systemd >= 250) scores a unit file without loading it: each
unit must score <= 2.5 ("OK"). The agent's unit scored 7.7 "EXPOSED" before. Skipped, with the reason, where
systemd-analyze is missing or too old to read a unit offline.
"""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path

import pytest

HELPERS = Path(__file__).resolve().parent.parent / "firmware_helpers"
UNITS = sorted(HELPERS.glob("*.service"))
MAX_EXPOSURE = 2.5  # systemd's "OK" band ends here


def _analyze() -> str:
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.skip("systemd-analyze not found (install systemd to score the units)")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    m = re.match(r"systemd (\d+)", out)
    if m is None or int(m.group(1)) < 250:
        pytest.skip(f"systemd-analyze {out.splitlines()[0] if out else '?'} cannot score a unit file offline (250+)")
    return exe


def _sections(unit: Path) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(unit.read_text())
    return cp


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_unit_scores_ok_in_systemd_analyze_security(unit: Path, tmp_path: Path) -> None:
    exe = _analyze()
    copy = tmp_path / unit.name  # systemd-analyze wants a plain unit name; never the repository's path
    copy.write_text(unit.read_text())
    p = subprocess.run(
        [exe, "security", "--offline=true", "--no-pager", str(copy)], capture_output=True, text=True, timeout=120
    )
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)", p.stdout)
    assert m is not None, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    score = float(m.group(1))
    assert score <= MAX_EXPOSURE and m.group(2) == "OK", f"{unit.name}: {score} {m.group(2)}\n{p.stdout}"


def test_agent_unit_names_only_groups_it_adds() -> None:
    """A group named in the agent unit's comments is one it adds (SupplementaryGroups) or one the install
    script adds in its drop-in (the issue: the comment named an ``apex`` group nothing added)."""
    unit = HELPERS / "edgekit-agent.service"
    text = unit.read_text()
    added = set(_sections(unit)["Service"]["SupplementaryGroups"].split())
    script = (HELPERS / "install-device.sh").read_text()
    m = re.search(r"^DEVICE_GROUPS=\"([^\"]*)\"", script, re.M)
    assert m is not None, "install-device.sh declares DEVICE_GROUPS"
    by_script = set(m.group(1).split())
    comments = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
    named = set(re.findall(r"\b(video|render|apex|plugdev|gpio|i2c|spi|dialout)\b", comments))
    assert named <= added | by_script, named - added - by_script
    assert "install-device.sh" in comments and "groups.conf" in script


def _install(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(HELPERS / "install-device.sh"), "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_install_script_writes_the_unit_its_settings_and_the_device_groups(tmp_path: Path) -> None:
    import grp

    root = tmp_path / "root"
    args = ("--device-id", "cam-01", "--fleet", "lab", "--broker", "mqtts://broker.example.net:8883")
    p = _install(root, *args, "--prefix", "/srv/ek", "--agent-opts", "--ca /etc/edgekit/ca.pem")
    assert p.returncode == 0, p.stderr
    unit = (root / "etc/systemd/system/edgekit-agent.service").read_text()
    assert "ExecStart=/srv/ek/venv/bin/python -m edge.agent " in unit and "/opt/edgekit" not in unit
    defaults = root / "etc/default/edgekit-agent"
    assert defaults.read_text().splitlines() == [
        "EDGEKIT_DEVICE_ID=cam-01",
        "EDGEKIT_FLEET=lab",
        "EDGEKIT_BROKER=mqtts://broker.example.net:8883",
        "EDGEKIT_AGENT_OPTS=--ca /etc/edgekit/ca.pem",
    ]
    assert defaults.stat().st_mode & 0o777 == 0o640
    dropin = (root / "etc/systemd/system/edgekit-agent.service.d/groups.conf").read_text()
    existing = []
    for g in ("render", "apex", "plugdev"):
        try:
            grp.getgrnam(g)
            existing.append(g)
        except KeyError:
            pass
    lines = [line for line in dropin.splitlines() if line.startswith("SupplementaryGroups=")]
    assert lines == ([f"SupplementaryGroups={' '.join(existing)}"] if existing else []), dropin
    # run again with a new broker only: the rest is kept
    assert _install(root, "--broker", "mqtt://10.0.0.2:1883").returncode == 0
    assert defaults.read_text().splitlines()[:3] == [
        "EDGEKIT_DEVICE_ID=cam-01",
        "EDGEKIT_FLEET=lab",
        "EDGEKIT_BROKER=mqtt://10.0.0.2:1883",
    ]


@pytest.mark.parametrize(
    "args",
    [
        ("--device-id", "cam 01; rm -rf /"),
        ("--fleet", "a/b"),
        ("--broker", "http://x"),
        ("--agent-opts", 'x"\ny'),
        ("--runtime", "tensorflow"),
        ("--bogus",),
    ],
)
def test_install_script_refuses_bad_values_before_writing_anything(tmp_path: Path, args: tuple[str, ...]) -> None:
    p = _install(tmp_path / "root", *args)
    assert p.returncode == 2 and p.stderr.startswith("install-device.sh: "), (p.returncode, p.stderr)
    assert not (tmp_path / "root").exists()


def test_edgekit_agent_is_a_console_script() -> None:
    """``edge/agent/main.py`` and the unit name an ``edgekit-agent`` script: pyproject declares it."""
    import importlib

    text = (HELPERS.parent / "pyproject.toml").read_text()
    scripts = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    m = re.search(r'^edgekit-agent = "([\w.]+):(\w+)"$', scripts, re.M)
    assert m is not None, scripts
    main = getattr(importlib.import_module(m.group(1)), m.group(2))
    with pytest.raises(SystemExit) as e:  # argparse's --help: the lean agent's own options
        main(["--help"])
    assert e.value.code == 0
