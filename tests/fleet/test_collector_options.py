"""Issue #31 item 5: the collector's options are declared once (``CollectorConfig``'s ``option()`` fields): the
``edgekit fleet collect`` flags and the keys of its ``--config`` TOML file come from there. Before, each option
was written again in the typer command (flag, help, default) and there was no config file."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer.main

from edge.cli.fleet import app
from edge.errors import InputFileError
from edge.fleet.collector_config import CollectorConfig
from tests.support.cli import assert_user_error, run_cli


def _collect_params() -> dict[str, object]:
    cmd = typer.main.get_command(app).commands["collect"]  # type: ignore[attr-defined]
    return {p.name: p for p in cmd.params}


def test_every_collector_option_is_a_flag_of_fleet_collect_with_its_declared_help_and_default() -> None:
    params = _collect_params()
    options = CollectorConfig.options()
    assert len(options) >= 14
    for f in options:
        p = params[f.name]
        flag = f.metadata["flag"].split("/")[0]
        assert flag in p.opts and p.help == f.metadata["help"] and p.default == f.default, (f.name, p.opts)  # type: ignore[attr-defined]
    assert "collector_options" not in params


def test_config_file_keys_are_the_option_names(tmp_path: Path) -> None:
    good = tmp_path / "collector.toml"
    good.write_text('batch_max = 2000\nreceive_maximum = 4000\nbatch_interval_ms = 20\nclient = "paho"\n')
    assert CollectorConfig.from_file(good) == {
        "batch_max": 2000,
        "receive_maximum": 4000,
        "batch_interval_ms": 20.0,
        "client": "paho",
    }
    bad = tmp_path / "bad.toml"
    bad.write_text('batch_maximum = 1\nbatch_max = "many"\n')
    with pytest.raises(InputFileError, match="unknown key 'batch_maximum'.*batch_max must be int"):
        CollectorConfig.from_file(bad)
    p = run_cli("fleet", "collect", "--broker", "mqtt://127.0.0.1:1", "--config", str(bad), "--duration", "1")
    assert_user_error(p, "unknown key", "batch_maximum")
