"""``edgekit agent``: run the device store's current bundle and report over MQTT until SIGTERM.

Its options are generated from ``edge.agent.options.AgentOptions`` (as ``python -m edge.agent``'s argparse
options are); the fleet commands share the broker options from the same declaration."""

from __future__ import annotations

import inspect
from typing import Any

from edge.agent.main import setup_logging
from edge.agent.options import (
    options_from,
    parse_runner_options,  # noqa: F401 - a public name (tests)
    typer_option,
    typer_parameters,
)
from edge.cli._common import err_console, print_data, print_json

Broker = typer_option("broker")
Ca = typer_option("ca")
Cert = typer_option("cert")
Key = typer_option("key")
Username = typer_option("username")
PasswordFile = typer_option("password_file")
ReconnectMax = typer_option("reconnect_max")
Duration = typer_option("duration")
LogLevel = typer_option("log_level")
Protocol = typer_option("protocol")


def agent_cmd(**given: Any) -> None:
    """Run the device store's current bundle, apply desired states, report over MQTT (until SIGTERM).

    The same agent as `python -m edge.agent`, which starts without this CLI's imports (~15 MB less)."""
    from edge.agent.main import config_from, run

    opts = options_from(given)
    setup_logging(opts.log_level)
    summary = run(
        config_from(given),
        duration=opts.duration,
        flush_timeout=opts.flush_timeout,
        say=lambda line: print_data(line, err=True),
    )
    if opts.as_json:
        print_json(summary)
    elif not summary["outbox_flushed"]:
        err_console.print(
            "[yellow]note:[/] the broker did not acknowledge everything; the rest stays in the "
            f"outbox ({opts.store}/agent/outbox.sqlite) and is sent on the next start",
            highlight=False,
        )


agent_cmd.__signature__ = inspect.Signature(typer_parameters(), return_annotation=None)  # type: ignore[attr-defined]
