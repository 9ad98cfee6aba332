"""``edgekit agent``: run the device store's current bundle and report over MQTT until SIGTERM."""

from __future__ import annotations

from pathlib import Path

import typer

from edge.agent.main import broker_config, parse_runner_options, setup_logging, stop_on_signals  # noqa: F401
from edge.cli._common import JsonOut, err_console, print_data, print_json

Broker = typer.Option(
    "mqtt://127.0.0.1:1883",
    "--broker",
    help="mqtt://host[:port] or mqtts://host[:port] (TLS); "
    "several nodes of one cluster joined by commas (mqtt://a:1883,mqtt://b:1883: one scheme, "
    "user and CA), tried in turn when one cannot be reached or the connection drops.",
)
Ca = typer.Option(
    None,
    "--ca",
    help="CA certificate file (PEM) that signed the broker's certificate; implies TLS.",
    show_default=False,
)
Cert = typer.Option(None, "--cert", help="Client certificate (PEM), for brokers that require one.", show_default=False)
Key = typer.Option(None, "--key", help="Client private key (PEM) for --cert.", show_default=False)
Username = typer.Option(None, "--username", help="Broker user name.", show_default=False)
PasswordFile = typer.Option(
    None,
    "--password-file",
    help="File holding the broker password (or set EDGEKIT_MQTT_PASSWORD); never on the command line.",
    show_default=False,
)
ReconnectMax = typer.Option(
    60.0,
    "--reconnect-max",
    help="Longest wait between reconnection attempts (s); waits double from 0.5 s, with jitter.",
)
Duration = typer.Option(
    None,
    "--duration",
    help="Stop by itself after this many seconds (default: run until SIGTERM/Ctrl-C).",
    show_default=False,
)
LogLevel = typer.Option("info", "--log-level", help="debug, info, warning or error.")
Protocol = typer.Option(
    "5",
    "--protocol",
    help="MQTT protocol version: 5, or 3.1.1 for brokers without MQTT 5 (what needs MQTT 5 is degraded, said in one log line).",
)


def agent_cmd(
    device_id: str = typer.Option(..., "--device-id", help="This device's id (no '/', '+', '#')."),
    fleet: str = typer.Option("default", "--fleet", help="Fleet name: topics are edgekit/<fleet>/<device>/..."),
    store: Path = typer.Option(
        ...,
        "--store",
        help="Device store (from `edgekit deploy --device`); the agent runs its current bundle and keeps its outbox in <store>/agent/.",
    ),
    source: str = typer.Option(
        "synthetic",
        "--source",
        help="Frames: synthetic (random inputs at --fps), none "
        "(health only, no runtime loaded), video:FILE, camera:N or images:DIR (the application's workload "
        "through edge.video: decode, pre-processing, inference, post-processing), or "
        "app[:SOCKET] (the application reports its frames over a Unix datagram socket, "
        "default <store>/agent/app.sock: edge.agent.appsocket).",
    ),
    fps: float | None = typer.Option(
        None,
        "--fps",
        help="Source frame rate (default: the bundle's frame budget as a rate, else 30).",
        show_default=False,
    ),
    budget_ms: float | None = typer.Option(
        None,
        "--budget-ms",
        help="Frame budget for budget misses (default: the bundle's target frame budget).",
        show_default=False,
    ),
    interval: float = typer.Option(5.0, "--interval", help="Telemetry interval in seconds."),
    broker: str = Broker,
    ca: Path | None = Ca,
    cert: Path | None = Cert,
    key: Path | None = Key,
    username: str | None = Username,
    password_file: Path | None = PasswordFile,
    protocol: str = Protocol,
    client_id: str | None = typer.Option(
        None, "--client-id", help="MQTT client id (default: edgekit-<fleet>-<device>).", show_default=False
    ),
    spool_max_messages: int = typer.Option(
        50_000, "--spool-max-messages", help="Outbox bound (messages); past it the oldest are dropped and counted."
    ),
    spool_max_mb: float = typer.Option(64.0, "--spool-max-mb", help="Outbox bound (MiB)."),
    runner_option: list[str] | None = typer.Option(
        None,
        "--runner-option",
        help="KEY=VALUE overriding the "
        "bundle's runner options (repeatable; VALUE read as JSON when it "
        "parses), e.g. intra_op_num_threads=1.",
        show_default=False,
    ),
    trust_dir: Path | None = typer.Option(
        None,
        "--trust-dir",
        help="Trust store the current bundle must be "
        "signed for (default: $EDGEKIT_TRUST_DIR, else <store>/trust when it "
        "exists; none: signatures are not checked).",
        show_default=False,
    ),
    flush_timeout: float = typer.Option(
        10.0,
        "--flush-timeout",
        min=0.0,
        help="At stop, how long to wait for "
        "the broker to acknowledge what the outbox still holds (s); what is left "
        "stays on disk for the next start.",
    ),
    poll_current: float = typer.Option(
        1.0,
        "--poll-current",
        min=0.0,
        help="How often the store's `current` link is read; a change reloads the runner (s; 0: never).",
    ),
    no_desired: bool = typer.Option(
        False, "--no-desired", help="Do not subscribe to edgekit/<fleet>/<device>/desired (no rollouts applied)."
    ),
    artifact_root: Path | None = typer.Option(
        None, "--artifact-root", help="The only directory a desired state's file:// URL may name.", show_default=False
    ),
    watch: float = typer.Option(
        30.0,
        "--watch",
        min=0.0,
        help="After a switch, how long the new bundle is watched (p99, errors, fallback, reference drift) before it counts as running (s).",
    ),
    smoke_frames: int = typer.Option(30, "--smoke-frames", min=0, help="Timed inferences in the smoke test."),
    smoke_timeout: float = typer.Option(300.0, "--smoke-timeout", help="Deadline of the smoke test (s)."),
    verify_timeout: float = typer.Option(
        300.0, "--verify-timeout", help="Deadline of the artifact's unpack and hash check (s)."
    ),
    download_timeout: float = typer.Option(600.0, "--download-timeout", help="Deadline of a download (s)."),
    reconnect_max: float = ReconnectMax,
    duration: float | None = Duration,
    log_level: str = LogLevel,
    as_json: bool = JsonOut,
) -> None:
    """Run the device store's current bundle, apply desired states, report over MQTT (until SIGTERM).

    The same agent as `python -m edge.agent`, which starts without this CLI's imports (~15 MB less)."""
    from argparse import Namespace

    from edge.agent.main import config_from, run

    setup_logging(log_level)
    ns = Namespace(
        fleet=fleet,
        device_id=device_id,
        store=store,
        source=source,
        fps=fps,
        budget_ms=budget_ms,
        interval=interval,
        broker=broker,
        ca=ca,
        cert=cert,
        key=key,
        username=username,
        password_file=password_file,
        protocol=protocol,
        spool_max_messages=spool_max_messages,
        spool_max_mb=spool_max_mb,
        reconnect_max=reconnect_max,
        client_id=client_id,
        runner_option=runner_option,
        trust_dir=trust_dir,
        poll_current=poll_current,
        no_desired=no_desired,
        artifact_root=artifact_root,
        watch=watch,
        smoke_frames=smoke_frames,
        smoke_timeout=smoke_timeout,
        download_timeout=download_timeout,
        verify_timeout=verify_timeout,
    )
    cfg = config_from(ns)
    summary = run(cfg, duration=duration, flush_timeout=flush_timeout, say=lambda line: print_data(line, err=True))
    if as_json:
        print_json(summary)
    elif not summary["outbox_flushed"]:
        err_console.print(
            "[yellow]note:[/] the broker did not acknowledge everything; the rest stays in the "
            f"outbox ({store}/agent/outbox.sqlite) and is sent on the next start",
            highlight=False,
        )
