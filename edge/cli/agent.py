"""``edgekit agent``: run the device store's current bundle and report over MQTT until SIGTERM."""

from __future__ import annotations

import logging
import signal
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, List, Optional

import typer

from edge.cli._common import JsonOut, err_console, print_json

Broker = typer.Option("mqtt://127.0.0.1:1883", "--broker", help="mqtt://host[:port] or mqtts://host[:port] (TLS).")
Ca = typer.Option(None, "--ca", help="CA certificate file (PEM) that signed the broker's certificate; implies TLS.",
                  show_default=False)
Cert = typer.Option(None, "--cert", help="Client certificate (PEM), for brokers that require one.", show_default=False)
Key = typer.Option(None, "--key", help="Client private key (PEM) for --cert.", show_default=False)
Username = typer.Option(None, "--username", help="Broker user name.", show_default=False)
PasswordFile = typer.Option(None, "--password-file", help="File holding the broker password (or set "
                            "EDGEKIT_MQTT_PASSWORD); never on the command line.", show_default=False)
ReconnectMax = typer.Option(60.0, "--reconnect-max", help="Longest wait between reconnection attempts (s); "
                            "waits double from 0.5 s, with jitter.")
Duration = typer.Option(None, "--duration", help="Stop by itself after this many seconds (default: run until "
                        "SIGTERM/Ctrl-C).", show_default=False)
LogLevel = typer.Option("info", "--log-level", help="debug, info, warning or error.")


def setup_logging(level: str) -> None:
    lvl = getattr(logging, level.upper(), None)
    if not isinstance(lvl, int):
        from edge.errors import EdgeError

        raise EdgeError(f"unknown --log-level {level!r}", hint="use debug, info, warning or error")
    logging.basicConfig(level=lvl, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def broker_config(url: str, ca: Optional[Path], cert: Optional[Path], key: Optional[Path], username: Optional[str],
                  password_file: Optional[Path]) -> Any:
    from edge.agent.mqtt import BrokerConfig

    return BrokerConfig.from_url(url, ca_file=ca, cert_file=cert, key_file=key, username=username,
                                 password_file=password_file)


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


def parse_runner_options(items: Optional[List[str]]) -> dict[str, Any]:
    import json

    from edge.errors import EdgeError

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


def agent_cmd(
    device_id: str = typer.Option(..., "--device-id", help="This device's id (no '/', '+', '#')."),
    fleet: str = typer.Option("default", "--fleet", help="Fleet name: topics are edgekit/<fleet>/<device>/..."),
    store: Path = typer.Option(..., "--store", help="Device store (from `edgekit deploy --device`); the agent runs "
                               "its current bundle and keeps its outbox in <store>/agent/."),
    source: str = typer.Option("synthetic", "--source", help="Frames: synthetic (random inputs at --fps), none "
                               "(health only, no runtime loaded), video:PATH or camera:N (with the video pipeline)."),
    fps: Optional[float] = typer.Option(None, "--fps", help="Source frame rate (default: the bundle's frame budget "
                                        "as a rate, else 30).", show_default=False),
    budget_ms: Optional[float] = typer.Option(None, "--budget-ms", help="Frame budget for budget misses (default: "
                                              "the bundle's target frame budget).", show_default=False),
    interval: float = typer.Option(5.0, "--interval", help="Telemetry interval in seconds."),
    broker: str = Broker, ca: Optional[Path] = Ca, cert: Optional[Path] = Cert, key: Optional[Path] = Key,
    username: Optional[str] = Username, password_file: Optional[Path] = PasswordFile,
    client_id: Optional[str] = typer.Option(None, "--client-id", help="MQTT client id (default: "
                                            "edgekit-<fleet>-<device>).", show_default=False),
    spool_max_messages: int = typer.Option(50_000, "--spool-max-messages", help="Outbox bound (messages); past it "
                                           "the oldest are dropped and counted."),
    spool_max_mb: float = typer.Option(64.0, "--spool-max-mb", help="Outbox bound (MiB)."),
    runner_option: Optional[List[str]] = typer.Option(None, "--runner-option", help="KEY=VALUE overriding the "
                                                      "bundle's runner options (repeatable; VALUE read as JSON when it "
                                                      "parses), e.g. intra_op_num_threads=1.", show_default=False),
    trust_dir: Optional[Path] = typer.Option(None, "--trust-dir", help="Trust store the current bundle must be "
                                             "signed for (default: $EDGEKIT_TRUST_DIR, else <store>/trust when it "
                                             "exists; none: signatures are not checked).", show_default=False),
    flush_timeout: float = typer.Option(10.0, "--flush-timeout", min=0.0, help="At stop, how long to wait for "
                                        "the broker to acknowledge what the outbox still holds (s); what is left "
                                        "stays on disk for the next start."),
    reconnect_max: float = ReconnectMax, duration: Optional[float] = Duration, log_level: str = LogLevel,
    as_json: bool = JsonOut,
) -> None:
    """Run the device store's current bundle and report birth, telemetry and death over MQTT (until SIGTERM)."""
    from edge.agent.agent import Agent, AgentConfig
    from edge.agent.netloop import Backoff

    setup_logging(log_level)
    cfg = AgentConfig(fleet=fleet, device_id=device_id, store=store, source=source, fps=fps, budget_ms=budget_ms,
                      interval_s=interval, broker=broker_config(broker, ca, cert, key, username, password_file),
                      spool_max_messages=spool_max_messages, spool_max_bytes=int(spool_max_mb * 1024 * 1024),
                      backoff=Backoff(0.5, reconnect_max), client_id=client_id,
                      runner_options=parse_runner_options(runner_option), trust_dir=trust_dir)
    with stop_on_signals() as stop:
        agent = Agent(cfg).start()
        assert agent.session is not None
        err_console.print(f"agent {fleet}/{device_id} session {agent.session.session} → {cfg.broker.url}: "
                          f"{agent.state}{' (' + agent.state_detail + ')' if agent.state_detail else ''}; "
                          "SIGTERM or Ctrl-C stops it", highlight=False, soft_wrap=True)
        try:
            stop.wait(duration)
        finally:
            session = agent.session
            flushed = agent.stop(flush_timeout)
    summary = {"device": device_id, "fleet": fleet, "session": session.session, "last_seq": session.seq,
               "outbox_flushed": flushed, **session.counters}
    if as_json:
        print_json(summary)
    elif not flushed:
        err_console.print("[yellow]note:[/] the broker did not acknowledge everything; the rest stays in the "
                          f"outbox ({store}/agent/outbox.sqlite) and is sent on the next start", highlight=False)
