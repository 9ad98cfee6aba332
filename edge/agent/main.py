"""The agent's own command line: ``python -m edge.agent`` (and ``edgekit-agent``).

argparse and the standard library only: the ``edgekit`` CLI's imports (typer, click, rich) cost
~30 MB of resident memory the agent does not need on a device. ``edgekit agent`` takes the same
options and calls the same functions (``config_from`` and ``run``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from edge.agent.options import AgentOptions, add_arguments, options_from, parse_runner_options  # noqa: F401
from edge.errors import INTERNAL_ERROR, USER_ERROR, EdgeError, internal_error_line, printable, thread_excepthook

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class PrintableFormatter(logging.Formatter):
    """Log lines with control characters escaped (``edge.errors.printable``): a device id, a file name or a
    broker's text in a log line never reaches the terminal as an escape sequence."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


def setup_logging(level: str) -> None:
    lvl = getattr(logging, level.upper(), None)
    if not isinstance(lvl, int):
        raise EdgeError(f"unknown --log-level {level!r}", hint="use debug, info, warning or error")
    logging.basicConfig(level=lvl, format=LOG_FORMAT)
    for handler in logging.getLogger().handlers:  # the terminal's (not a test's capture)
        if isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stderr, sys.stdout):
            handler.setFormatter(PrintableFormatter(LOG_FORMAT))


def broker_config(
    url: str,
    ca: Path | None,
    cert: Path | None,
    key: Path | None,
    username: str | None,
    password_file: Path | None,
    protocol: str = "5",
) -> Any:
    from edge.mqtt.client import BrokerConfig

    return BrokerConfig.from_url(
        url, ca_file=ca, cert_file=cert, key_file=key, username=username, password_file=password_file, protocol=protocol
    )


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGTERM/SIGINT (installed before anything starts, so a stop during start-up is clean too)."""
    stop = threading.Event()
    old = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def build_parser() -> argparse.ArgumentParser:
    """Generated from ``edge.agent.options.AgentOptions`` (as ``edgekit agent``'s typer options are)."""
    p = argparse.ArgumentParser(
        prog="python -m edge.agent",
        description="Run the device store's current bundle, "
        "apply desired states, and report birth, telemetry, reported state and death over "
        "MQTT (until SIGTERM).",
    )
    add_arguments(p)
    return p


def config_from(ns: argparse.Namespace | Mapping[str, Any]) -> Any:
    """The agent's configuration from parsed arguments, argparse's or typer's (and the --config file they name)."""
    return options_from(ns).to_config()


def run(cfg: Any, *, duration: float | None, flush_timeout: float, say: Any = None) -> dict[str, Any]:
    """Start the agent, run until SIGTERM/SIGINT or ``duration``, stop it cleanly; the summary."""
    from edge.agent.agent import Agent

    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    with stop_on_signals() as stop:
        agent = Agent(cfg).start()
        assert agent.session is not None
        say(
            f"agent {cfg.fleet}/{cfg.device_id} session {agent.session.session} -> {cfg.broker.url}: {agent.state}"
            f"{' (' + agent.state_detail + ')' if agent.state_detail else ''}; SIGTERM or Ctrl-C stops it"
        )
        try:
            stop.wait(duration)
        finally:
            session = agent.session
            flushed = agent.stop(flush_timeout)
    return {
        "device": cfg.device_id,
        "fleet": cfg.fleet,
        "session": session.session,
        "last_seq": session.seq,
        "outbox_flushed": flushed,
        "reloads": agent.reloads,
        **session.counters,
        **agent.counters,
    }


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    threading.excepthook = thread_excepthook(lambda line: print(f"error: {line}", file=sys.stderr))
    opts: AgentOptions | None = None
    try:
        opts = options_from(ns)
        setup_logging(opts.log_level)
        summary = run(config_from(ns), duration=opts.duration, flush_timeout=opts.flush_timeout)
    except EdgeError as e:
        print(f"error: {e}", file=sys.stderr)
        return USER_ERROR
    except Exception as e:  # noqa: BLE001 - the firewall: one line, the traceback in a log file, exit 3
        print(f"error: {internal_error_line('agent', e)}", file=sys.stderr)
        return INTERNAL_ERROR
    if opts.as_json:
        print(json.dumps(summary))
    elif not summary["outbox_flushed"]:
        print(
            f"note: the broker did not acknowledge everything; the rest stays in the outbox "
            f"({os.path.join(opts.store, 'agent', 'outbox.sqlite')}) and is sent on the next start",
            file=sys.stderr,
        )
    return 0
