"""The agent's options are declared once (issue #31): ``edge.agent.options.AgentOptions`` generates
``python -m edge.agent``'s argparse parser, ``edgekit agent``'s typer options and the ``--config`` file's keys.

Each front-end is parsed for real (argparse's ``parse_args``, click's ``make_context`` on the typer command) and
must give the same ``AgentConfig``; nothing starts an agent, so these run in milliseconds.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import typer

from edge.agent.main import build_parser, config_from
from edge.agent.options import AgentOptions, flag, options_from
from edge.cli import app
from edge.errors import EdgeError

FLAGS = {flag(f) for f in dataclasses.fields(AgentOptions)} | {"--config"}


def _typer_params(args: list[str]) -> dict[str, Any]:
    cmd = typer.main.get_command(app).commands["agent"]  # type: ignore[attr-defined]
    return dict(cmd.make_context("agent", list(args)).params)  # click consumes the list it is given


def _typer_flags() -> set[str]:
    cmd = typer.main.get_command(app).commands["agent"]  # type: ignore[attr-defined]
    return {o for p in cmd.params for o in p.opts if o.startswith("--") and o != "--help"}


def _argparse_flags() -> set[str]:
    return {o for a in build_parser()._actions for o in a.option_strings if o.startswith("--") and o != "--help"}


def test_both_front_ends_take_exactly_the_declared_options() -> None:
    assert _argparse_flags() == FLAGS
    assert _typer_flags() == FLAGS


ARGS = [
    ["--device-id", "cam-01", "--store", "/var/lib/edgekit"],
    ["--device-id", "cam-01", "--store", "s", "--fleet", "lab", "--interval", "2", "--no-desired", "--json"]
    + ["--runner-option", "intra_op_num_threads=1", "--runner-option", "x=abc", "--spool-max-mb", "1.5"]
    + ["--broker", "mqtts://b.example:8883", "--protocol", "3.1.1", "--watch", "0", "--poll-current", "0"],
]


@pytest.mark.parametrize("args", ARGS)
def test_argparse_and_typer_give_the_same_configuration(args: list[str]) -> None:
    a = options_from(build_parser().parse_args(args))
    t = options_from(_typer_params(args))
    assert a == t
    assert repr(config_from(build_parser().parse_args(args))) == repr(t.to_config())


def test_a_config_file_sets_options_and_the_command_line_wins(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text(
        'device_id = "cam-07"\nstore = "/var/lib/edgekit"\nfleet = "lab"\ninterval = 2\n'
        '"runner-option" = ["intra_op_num_threads=1"]\nno_desired = true\n'
    )
    for given in (build_parser().parse_args(["--config", str(cfg), "--fleet", "prod"]), None):
        opts = (
            options_from(given)
            if given is not None
            else options_from(_typer_params(["--config", str(cfg), "--fleet", "prod"]))
        )
        assert (opts.device_id, opts.store, opts.fleet, opts.interval) == (
            "cam-07",
            Path("/var/lib/edgekit"),
            "prod",
            2.0,
        )
        c = opts.to_config()
        assert c.runner_options == {"intra_op_num_threads": 1} and c.desired is False and c.interval_s == 2.0


def test_a_config_file_is_checked_every_problem_at_once(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text('device_id = "d"\nstore = "s"\ninterval = "fast"\nwatch = -1\nbroker_url = "x"\n')
    with pytest.raises(EdgeError) as e:
        options_from(build_parser().parse_args(["--config", str(cfg)]))
    msg = str(e.value)
    assert "unknown option 'broker_url'" in msg and "--interval: 'fast' is not float" in msg
    assert "--watch must be >= 0" in msg


def test_required_options_may_come_from_either_place(tmp_path: Path) -> None:
    with pytest.raises(EdgeError, match=r"--device-id and --store required"):
        options_from(build_parser().parse_args([]))
    with pytest.raises(EdgeError, match=r"--interval must be >= 0.001"):
        options_from(build_parser().parse_args(["--device-id", "d", "--store", "s", "--interval", "0"]))
