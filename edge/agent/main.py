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
from typing import Any, Iterator, Sequence

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


def parse_runner_options(items: Sequence[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise EdgeError(f"--runner-option wants KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


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
    p = argparse.ArgumentParser(
        prog="python -m edge.agent",
        description="Run the device store's current bundle, "
        "apply desired states, and report birth, telemetry, reported state and death over "
        "MQTT (until SIGTERM).",
    )
    a = p.add_argument
    a("--device-id", required=True, help="This device's id (no '/', '+', '#').")
    a("--fleet", default="default", help="Fleet name: topics are edgekit/<fleet>/<device>/...")
    a(
        "--store",
        required=True,
        type=Path,
        help="Device store; the agent runs its current bundle and keeps its outbox, downloads and staging in <store>/agent/.",
    )
    a(
        "--source",
        default="synthetic",
        help="synthetic (random inputs at --fps), none (health only, no runtime "
        "loaded), video:FILE, camera:N or images:DIR (the application's workload through edge.video), or "
        "app[:SOCKET] (the application runs the model and reports its frames over a Unix datagram socket, "
        "default <store>/agent/app.sock: edge.agent.appsocket).",
    )
    a("--fps", type=float, help="Source frame rate (default: the bundle's frame budget as a rate, else 30).")
    a("--budget-ms", type=float, help="Frame budget (default: the bundle's target frame budget).")
    a("--interval", type=float, default=5.0, help="Telemetry interval in seconds.")
    a(
        "--broker",
        default="mqtt://127.0.0.1:1883",
        help="mqtt://host[:port] or mqtts://host[:port] (TLS); several "
        "nodes of one cluster joined by commas (one scheme, user and CA), tried in turn when one cannot be reached or "
        "the connection drops.",
    )
    a("--ca", type=Path, help="CA certificate (PEM) that signed the broker's certificate; implies TLS.")
    a("--cert", type=Path, help="Client certificate (PEM).")
    a("--key", type=Path, help="Client private key (PEM) for --cert.")
    a("--username", help="Broker user name.")
    a("--password-file", type=Path, help="File holding the broker password (or $EDGEKIT_MQTT_PASSWORD).")
    a(
        "--protocol",
        default="5",
        help="MQTT protocol version: 5 (default) or 3.1.1 (brokers without MQTT 5; what needs MQTT 5 is degraded, said in one log line).",
    )
    a("--client-id", help="MQTT client id (default: edgekit-<fleet>-<device>).")
    a("--spool-max-messages", type=int, default=50_000, help="Outbox bound (messages).")
    a("--spool-max-mb", type=float, default=64.0, help="Outbox bound (MiB).")
    a("--runner-option", action="append", help="KEY=VALUE overriding the bundle's runner options (repeatable).")
    a(
        "--trust-dir",
        type=Path,
        help="Trust store bundles must be signed for (default: $EDGEKIT_TRUST_DIR, else <store>/trust when it exists).",
    )
    a(
        "--flush-timeout",
        type=float,
        default=10.0,
        help="At stop, how long to wait for the broker to acknowledge the outbox (s).",
    )
    a("--reconnect-max", type=float, default=60.0, help="Longest wait between reconnection attempts (s).")
    a(
        "--poll-current",
        type=float,
        default=1.0,
        help="How often the store's `current` link is read; a change reloads the runner (s; 0: never).",
    )
    a("--no-desired", action="store_true", help="Do not subscribe to edgekit/<fleet>/<device>/desired.")
    a("--artifact-root", type=Path, help="The only directory a desired state's file:// URL may name.")
    a("--watch", type=float, default=30.0, help="After a switch, how long the new bundle is watched (s).")
    a("--smoke-frames", type=int, default=30, help="Timed inferences in the smoke test (0: none).")
    a("--smoke-timeout", type=float, default=300.0, help="Deadline of the smoke test (s).")
    a("--verify-timeout", type=float, default=300.0, help="Deadline of the artifact's unpack and hash check (s).")
    a("--download-timeout", type=float, default=600.0, help="Deadline of a download, retries included (s).")
    a("--duration", type=float, help="Stop by itself after this many seconds.")
    a("--log-level", default="info", help="debug, info, warning or error.")
    a("--json", dest="as_json", action="store_true", help="Print a JSON summary at exit.")
    return p


def config_from(ns: argparse.Namespace) -> Any:
    from edge.agent.agent import AgentConfig
    from edge.agent.download import DownloadOptions
    from edge.mqtt.netloop import Backoff

    return AgentConfig(
        fleet=ns.fleet,
        device_id=ns.device_id,
        store=ns.store,
        source=ns.source,
        fps=ns.fps,
        budget_ms=ns.budget_ms,
        interval_s=ns.interval,
        broker=broker_config(
            ns.broker, ns.ca, ns.cert, ns.key, ns.username, ns.password_file, getattr(ns, "protocol", "5")
        ),
        spool_max_messages=ns.spool_max_messages,
        spool_max_bytes=int(ns.spool_max_mb * 1024 * 1024),
        backoff=Backoff(0.5, ns.reconnect_max),
        client_id=ns.client_id,
        runner_options=parse_runner_options(ns.runner_option),
        trust_dir=ns.trust_dir,
        poll_current_s=ns.poll_current,
        desired=not ns.no_desired,
        artifact_root=ns.artifact_root,
        watch_s=ns.watch,
        smoke_frames=ns.smoke_frames,
        smoke_timeout_s=ns.smoke_timeout,
        verify_timeout_s=getattr(ns, "verify_timeout", 300.0),
        download=DownloadOptions(timeout_s=ns.download_timeout),
    )


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
    try:
        setup_logging(ns.log_level)
        summary = run(config_from(ns), duration=ns.duration, flush_timeout=ns.flush_timeout)
    except EdgeError as e:
        print(f"error: {e}", file=sys.stderr)
        return USER_ERROR
    except Exception as e:  # noqa: BLE001 - the firewall: one line, the traceback in a log file, exit 3
        print(f"error: {internal_error_line('agent', e)}", file=sys.stderr)
        return INTERNAL_ERROR
    if ns.as_json:
        print(json.dumps(summary))
    elif not summary["outbox_flushed"]:
        print(
            f"note: the broker did not acknowledge everything; the rest stays in the outbox "
            f"({os.path.join(ns.store, 'agent', 'outbox.sqlite')}) and is sent on the next start",
            file=sys.stderr,
        )
    return 0
