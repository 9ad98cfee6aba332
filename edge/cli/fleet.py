"""``edgekit fleet collect|status``, and the fleet's credentials: ``ca init``, ``provision``, ``csr``,
``sign-csr``, ``acl`` (library: ``edge.fleet.pki``, ``edge.fleet.acl``); the devices' pinned keys: ``trust-key``,
``forget-key`` (``edge.cli.fleet_keys``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer

from edge.agent.main import broker_config, setup_logging, stop_on_signals
from edge.cli._common import FleetDb, JsonOut, Wide, command, console, err_console, print_json, print_table, safe
from edge.cli.agent import Broker, Ca, Cert, Duration, Key, LogLevel, PasswordFile, Protocol, ReconnectMax, Username
from edge.cli.fleet_keys import forget_key_cmd, trust_key_cmd
from edge.cli.fleet_tune import fleet_tune_cmd
from edge.cli.rollout import app as rollout_app
from edge.errors import EdgeError, InputFileError

app = typer.Typer(
    help="Fleet telemetry: collect it from MQTT into a database, show where every device stands; "
    "the fleet CA, device certificates and the broker ACL.",
    no_args_is_help=True,
)
ca_app = typer.Typer(help="The fleet CA that signs device, collector and broker certificates.", no_args_is_help=True)
app.add_typer(ca_app, name="ca")
app.add_typer(rollout_app, name="rollout")
app.command("tune")(fleet_tune_cmd)  # edge.cli.fleet_tune: tune on a connected device
app.command("trust-key")(trust_key_cmd)  # edge.cli.fleet_keys: the devices' pinned identity keys
app.command("forget-key")(forget_key_cmd)

Db = FleetDb
MetricsAddr = typer.Option("127.0.0.1", "--metrics-addr", help="Address /metrics binds (0.0.0.0: every interface).")
_COLOURS = {"online": "green", "stale": "yellow", "offline": "red", "unknown": "magenta"}


def _collector_options(fn: Any) -> Any:
    """The command takes ``CollectorConfig``'s options (``edge.fleet.collector_config.option``: flag, help, default,
    declared once there) as if each were one of its parameters, and gets them as ``collector_options``."""
    import functools
    import inspect

    from edge.fleet.collector_config import CollectorConfig

    sig = inspect.signature(fn)
    params = [p for n, p in sig.parameters.items() if n != "collector_options"]
    hints = {k: v for k, v in fn.__annotations__.items() if k != "collector_options"}
    names = []
    for f in CollectorConfig.options():
        kind = str if f.default is None else type(f.default)
        hints[f.name] = kind | None if f.default is None else kind
        opt = typer.Option(f.default, f.metadata["flag"], help=f.metadata["help"], show_default=f.default is not None)
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=hints[f.name]))
        names.append(f.name)

    @functools.wraps(fn)
    def wrapper(**kw: Any) -> Any:
        opts = {n: kw.pop(n) for n in names}
        return fn(**kw, collector_options=opts)

    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = hints
    return wrapper


@app.command("collect")
@command
@_collector_options
def collect_cmd(
    broker: str = Broker,
    db: str = Db,
    config: Path | None = typer.Option(
        None,
        "--config",
        help="A TOML file of collector options (keys: the options' names in edge.fleet.collector_config."
        "CollectorConfig, e.g. batch_max = 2000); an option given on the command line wins.",
        show_default=False,
    ),
    ca: Path | None = Ca,
    cert: Path | None = Cert,
    key: Path | None = Key,
    username: str | None = Username,
    password_file: Path | None = PasswordFile,
    protocol: str = Protocol,
    reconnect_max: float = ReconnectMax,
    duration: float | None = Duration,
    stats_interval: float = typer.Option(60.0, "--stats-interval", help="Log the counters every this many seconds."),
    metrics_port: int | None = typer.Option(
        None,
        "--metrics-port",
        help="Serve Prometheus /metrics on this port: fleet aggregates read from --db, and this collector's counters (examples/grafana/).",
        show_default=False,
    ),
    metrics_addr: str = MetricsAddr,
    log_level: str = LogLevel,
    as_json: bool = JsonOut,
    collector_options: dict[str, Any] | None = None,  # CollectorConfig's options (_collector_options)
) -> None:
    """Store every device's births, deaths and telemetry (de-duplicated) until SIGTERM/Ctrl-C."""
    from edge.fleet.collector import Collector, CollectorConfig
    from edge.fleet.db import check_url
    from edge.mqtt.netloop import Backoff

    setup_logging(log_level)
    opts = dict(collector_options or {})
    if config is not None:  # the file's values where the command line left an option at its default
        defaults = {f.name: f.default for f in CollectorConfig.options()}
        for k, v in CollectorConfig.from_file(config).items():
            if opts.get(k, defaults[k]) == defaults[k]:
                opts[k] = v
    cfg = CollectorConfig(
        broker=broker_config(broker, ca, cert, key, username, password_file, protocol),
        db_url=db,
        backoff=Backoff(0.5, reconnect_max),
        **opts,
    )
    fleet = cfg.fleet
    # A collector that never reached its broker is misconfigured (or started before it): say so and stop,
    # before the database is created. Once connected, a lost broker is waited for (reconnects, back-off).
    check_url(db)
    cfg.broker.check_reachable()
    metrics = _serve_metrics(db, metrics_port, metrics_addr, fleet)  # first: a port in use is one line, nothing started
    with stop_on_signals() as stop:
        try:
            collector = Collector(cfg).start()
        except BaseException:
            if metrics is not None:
                metrics.close()
            raise
        if metrics is not None:
            metrics.add_collector(collector)
        loop = collector.loop
        assert loop is not None
        loop.run(lambda: loop.call_every(stats_interval, _log_stats, collector))
        err_console.print(
            f"collecting {safe(collector.subscription)} from {safe(cfg.broker.url)} into {safe(_redact(db))}; SIGTERM or Ctrl-C stops it",
            highlight=False,
            soft_wrap=True,
        )
        try:
            stop.wait(duration)
        finally:
            stats = collector.snapshot()
            if metrics is not None:
                metrics.close()
            collector.stop()
    if as_json:
        print_json(stats)
    else:
        err_console.print(_stats_line(stats), highlight=False)


def _serve_metrics(db: str, port: int | None, addr: str, fleet: str) -> Any:
    """``--metrics-port``: a MetricsServer for the collector about to start (None without the option)."""
    if port is None:
        return None
    from edge.fleet.metrics import MetricsServer

    server = MetricsServer(db, port=port, addr=addr, fleet=None if fleet == "+" else fleet)
    err_console.print(f"metrics on {safe(server.url)}", highlight=False)
    return server


@app.command("metrics")
@command
def metrics_cmd(
    db: str = Db,
    port: int = typer.Option(9464, "--port", help="Serve Prometheus /metrics on this port."),
    addr: str = typer.Option("127.0.0.1", "--addr", help="Address to bind (0.0.0.0: every interface)."),
    fleet: str | None = typer.Option(None, "--fleet", help="Only this fleet.", show_default=False),
    stale_factor: float = typer.Option(
        3.0, "--stale-factor", help="Stale after this many telemetry intervals of silence..."
    ),
    min_stale: float = typer.Option(15.0, "--min-stale", help="...and at least this many seconds."),
    duration: float | None = Duration,
) -> None:
    """Serve the fleet's Prometheus metrics from a collector database (the collectors may run elsewhere)."""
    from edge.fleet.db import open_db
    from edge.fleet.metrics import MetricsServer

    open_db(db, must_exist=True).close()  # a wrong URL or a missing database: one line now, not at every scrape
    with (
        stop_on_signals() as stop,
        MetricsServer(
            db, port=port, addr=addr, fleet=fleet, stale_factor=stale_factor, min_stale_s=min_stale
        ) as server,
    ):
        err_console.print(
            f"fleet metrics from {safe(_redact(db))} on {safe(server.url)}; SIGTERM or Ctrl-C stops it",
            highlight=False,
            soft_wrap=True,
        )
        stop.wait(duration)


def _redact(url: str) -> str:
    from edge.fleet.db import redact

    return redact(url)


def _cell(v: Any, limit: int = 80) -> str:
    """Device-supplied text for a table cell: no rich markup, no control or bidi characters, bounded."""
    text = "".join(c if c.isprintable() else "?" for c in str(v)[:limit])
    return safe(text)


def _stats_line(s: dict[str, Any]) -> str:
    rejected = sum(s["rejected"].values())
    detail = ", ".join(f"{k} {v}" for k, v in s["rejected"].items() if v)
    return (
        f"received {s['received']}, stored {sum(s['stored'].values())} ({s['stored']['telemetry']} telemetry), "
        f"duplicates {s['duplicates']}, rejected {rejected}{' (' + detail + ')' if detail else ''}, "
        f"rebirth requests {s['rebirths_sent']}, gaps {s['gaps_detected']} ({s['gaps_filled']} filled)"
        + (f", {s['evicted']} cache entries evicted" if s.get("evicted") else "")
        + (f", {s['shed']} QoS 0 messages shed (backlog full)" if s.get("shed") else "")
        + (f", reading paused {s['read_pauses']} time(s) (backlog full)" if s.get("read_pauses") else "")
    )


def _log_stats(collector: Any) -> None:
    import logging

    logging.getLogger("edge.fleet").info(_stats_line(collector.stats))


@app.command("prune")
@command
def prune_cmd(
    db: str = Db,
    older_than: str = typer.Option(
        ...,
        "--older-than",
        help="Remove what arrived longer ago than this: 30d, 12h, 90m, 3600s, 2w. PostgreSQL drops whole daily telemetry partitions.",
    ),
    as_json: bool = JsonOut,
) -> None:
    """Retention: drop telemetry, states, old births/deaths and finished streams older than --older-than
    (every device's row and its current session stay)."""
    from edge.fleet.retention import prune_url

    rep = prune_url(db, older_than)
    if as_json:
        print_json(rep.as_dict())
        return
    parts = ", ".join(f"{n} {t}" for t, n in rep.deleted.items() if n) or "nothing"
    dropped = f"; dropped {len(rep.dropped_partitions)} partition(s)" if rep.dropped_partitions else ""
    console.print(
        f"pruned {safe(_redact(db))} before {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(rep.cut))} UTC: {parts}{dropped}",
        highlight=False,
    )


@app.command("partition")
@command
def partition_cmd(db: str = Db, as_json: bool = JsonOut) -> None:
    """PostgreSQL: convert a telemetry table made before partitioning into daily partitions, in one transaction,
    with the collectors stopped; its rows stay, as one partition that prune drops once all of it is old enough."""
    from edge.fleet.migrate import partition_url

    rep = partition_url(db)
    if as_json:
        print_json({"kept_in_legacy": rep.kept_in_legacy, "moved": rep.moved, "legacy_until": rep.legacy_until})
        return
    console.print(
        f"telemetry in {safe(_redact(db))} is partitioned by day: {rep.kept_in_legacy} older rows kept "
        f"as partition telemetry_legacy, {rep.moved} recent rows moved to daily partitions",
        highlight=False,
    )


_NARROW_STATUS = {"device", "status", "bundle", "fps", "p99 ms", "misses", "last seen"}


@app.command("status")
@command
def status_cmd(
    db: str = Db,
    fleet: str | None = typer.Option(None, "--fleet", help="Only this fleet.", show_default=False),
    stale_factor: float = typer.Option(
        3.0, "--stale-factor", help="Stale after this many telemetry intervals of silence..."
    ),
    min_stale: float = typer.Option(15.0, "--min-stale", help="...and at least this many seconds."),
    limit: int = typer.Option(
        200,
        "--limit",
        min=0,
        help="Table rows at most, devices that need a look (offline, "
        "stale, unknown) first; 0: every device. --json always lists every device.",
    ),
    as_json: bool = JsonOut,
    wide: bool = Wide,
) -> None:
    """One row per device: online/stale/offline, bundle, fps, p99, budget misses, last seen; --wide adds the runtime,
    p50, temperature, CPU, memory, the telemetry spool and missing messages."""
    from edge.fleet.status import fleet_status, rollout_line, rollout_summary, summarize

    rows = fleet_status(db, fleet=fleet, stale_factor=stale_factor, min_stale_s=min_stale)
    rollouts = rollout_summary(db, fleet=fleet)
    if as_json:
        print_json({"summary": summarize(rows), "devices": rows, "rollouts": rollouts, "generated_at": time.time()})
        return
    if not rows:
        console.print(f"no devices in {safe(_redact(db))} yet", highlight=False)
        return
    shown = rows
    if limit and len(rows) > limit:  # a 10,000-row table helps nobody (and takes rich seconds to lay out)
        order = {"offline": 0, "stale": 1, "unknown": 2, "online": 3}
        shown = sorted(rows, key=lambda r: order[r["status"]])[:limit]  # stable: by device within a status
    columns = (
        ("device", "left"),
        ("status", "left"),
        ("bundle", "left"),
        ("runtime", "left"),
        ("fps", "right"),
        ("p50 ms", "right"),
        ("p99 ms", "right"),
        ("misses", "right"),
        ("temp °C", "right"),
        ("CPU %", "right"),
        ("RSS MB", "right"),
        ("spool", "right"),
        ("missing", "right"),
        ("last seen", "right"),
    )
    table_rows = []
    for r in shown:  # every text from the store came from a device: _cell() it
        status = f"[{_COLOURS[r['status']]}]{r['status']}[/]"
        if r["status"] == "offline" and r.get("death_reason"):
            status += f" [dim]({_cell(r['death_reason'], 30)})[/]"
        if r.get("state") == "error":
            status += " [red]error[/]"
        if r.get("flag"):
            status += " [red]flagged[/]"
        if (r.get("key") or {}).get("refused"):
            status += " [red]key refused[/]"
        runtime = " ".join(x for x in (r.get("runtime"), r.get("device_used") and f"on {r['device_used']}") if x)
        cells = (
            _cell(f"{r['fleet']}/{r['device']}", 200),
            status,
            _cell(r.get("bundle_id") or "-"),
            _cell(runtime or "-"),
            _n(r.get("fps"), 1),
            _n(r.get("p50_ms"), 2),
            _n(r.get("p99_ms"), 2),
            _n(r.get("misses"), 0),
            _n(r.get("temp_c"), 1) + (" [red]throttled[/]" if r.get("throttled") else ""),
            _n(r.get("cpu_percent"), 0),
            _n(r.get("rss_mb"), 0),
            _n(r.get("spool_pending"), 0),
            f"[yellow]{r['missing']}[/]" if r["missing"] else "0",
            _ago(r.get("seen_ago_s")),
        )
        table_rows.append(cells)
    # at 80 columns: what says whether a device needs a look; --wide: every column at its natural width
    print_table(
        f"fleet status ({_cell(_redact(db), 200)})",
        # numbers never wrap; ids and states wrap or fold whole rather than end in an ellipsis
        [
            (col, {"justify": just, "no_wrap": True} if just == "right" else {"overflow": "fold"})
            for col, just in columns
        ],
        table_rows,
        narrow=_NARROW_STATUS,
        wide=wide,
    )
    if len(shown) < len(rows):
        console.print(f"{len(rows) - len(shown)} more devices not shown (--limit 0 shows every one)", highlight=False)
    _problem_lines(
        [r for r in rows if r.get("flag")],
        "flag",
        "flagged",
        "forged or broken sequence numbers; the row shows the device's own stream",
        "flagged devices",
    )
    _problem_lines(
        [r for r in rows if (r.get("key") or {}).get("refused")],
        "key",
        "key refused",
        "a forger without the device's key, or a reinstalled device: `edgekit fleet trust-key`",
        "devices with refused births/deaths",
    )
    s = summarize(rows)
    console.print(
        ", ".join(f"{s[k]} {k}" for k in ("online", "stale", "offline", "unknown") if s[k])
        + f" of {s['devices']} devices",
        highlight=False,
    )
    for f in rollouts:  # what each recent rollout did, as its controller recorded it
        console.print("rollout " + _cell(rollout_line(f), 300), highlight=False)


def _problem_lines(rows: list[dict[str, Any]], field: str, label: str, why: str, more: str) -> None:
    """One red line per device (five at most) with ``row[field]["summary"]``, then how many more there are."""
    for r in rows[:5]:
        console.print(
            f"[red]{label}[/] {_cell(r['fleet'] + '/' + r['device'], 200)}: {_cell(r[field]['summary'], 200)} ({why})",
            highlight=False,
        )
    if len(rows) > 5:
        console.print(f"{len(rows) - 5} more {more} (--json lists them)", highlight=False)


def _n(v: float | None, nd: int) -> str:
    if v is None:
        return "-"
    return f"{v:.{nd}f}" if abs(v) < 1e12 else f"{v:.3g}"  # a forged 1e299 stays one short cell


def _ago(s: float | None) -> str:
    if s is None:
        return "never"
    if s < 120:
        return f"{s:.0f} s ago"
    if s < 7200:
        return f"{s / 60:.0f} min ago"
    return f"{s / 3600:.1f} h ago"


# credentials ---------------------------------------------------------------------------------
CaDir = typer.Option(..., "--ca", help="The fleet CA's directory (from `edgekit fleet ca init`).")
Days = typer.Option(365, "--days", help="Days the certificate is valid (at most until the CA expires).")
RoleOpt = typer.Option(
    "device",
    "--role",
    help="device (CN = the device id), collector (CN = collector:NAME) or server (the broker; NAME and --san become its subjectAltNames).",
)
San = typer.Option(
    None,
    "--san",
    help="Server certificates: a host name or IP address it answers to (repeatable; default: NAME).",
    show_default=False,
)


@ca_app.command("init")
@command
def ca_init_cmd(
    directory: Path = typer.Option(..., "--dir", help="New directory for ca.key (mode 0600) and ca.crt."),
    name: str = typer.Option("edgekit fleet CA", "--name", help="The CA certificate's common name."),
    days: int = typer.Option(3650, "--days", help="Days the CA certificate is valid."),
    as_json: bool = JsonOut,
) -> None:
    """Create the fleet CA (ECDSA P-256). Keep ca.key offline; give brokers and devices ca.crt."""
    from edge.fleet.pki import init_ca

    files = init_ca(directory, name=name, days=days)
    _done(as_json, {"ca_cert": str(files.cert), "ca_key": str(files.key)}, f"fleet CA: {files.cert} (key {files.key})")


@app.command("provision")
@command
def provision_cmd(
    name: str = typer.Argument(
        ..., help="The device id (A-Z a-z 0-9 . _ -, at most 64), or the collector's/broker's name with --role."
    ),
    ca: Path = CaDir,
    out: Path = typer.Option(..., "--out", help="Directory for NAME.key, NAME.crt and ca.crt."),
    role: str = RoleOpt,
    days: int = Days,
    san: list[str] | None = San,
    as_json: bool = JsonOut,
) -> None:
    """Make a key and CSR (as the device would) and sign the CSR with the fleet CA, on this machine."""
    from edge.fleet.pki import provision

    p = provision(name, ca, out, role=_role(role), days=days, sans=san or ())
    _done(
        as_json,
        {
            "identity": p.identity,
            "role": p.role.value,
            "key": str(p.key),
            "cert": str(p.cert),
            "ca_cert": str(p.ca_cert),
        },
        f"{p.identity}: {p.cert} (key {p.key}, CA {p.ca_cert})",
    )


@app.command("csr")
@command
def csr_cmd(
    name: str = typer.Argument(..., help="This device's id (or the collector's/broker's name with --role)."),
    out: Path = typer.Option(..., "--out", help="Directory for NAME.key (mode 0600) and NAME.csr."),
    role: str = RoleOpt,
    as_json: bool = JsonOut,
) -> None:
    """On the device: make its key (it stays here) and a CSR to send to the fleet CA."""
    from edge.fleet.pki import make_device_key_and_csr

    made = make_device_key_and_csr(name, out, role=_role(role))
    csr = out / f"{name}.csr"
    csr.write_bytes(made.csr)
    _done(as_json, {"key": str(made.key), "csr": str(csr)}, f"key {made.key} (stays here); send {csr} to the CA")


@app.command("sign-csr")
@command
def sign_csr_cmd(
    csr: Path = typer.Argument(..., help="The device's CSR (PEM), from `edgekit fleet csr`."),
    ca: Path = CaDir,
    out: Path = typer.Option(..., "--out", help="Where to write the certificate (PEM)."),
    role: str = RoleOpt,
    days: int = Days,
    san: list[str] | None = San,
    as_json: bool = JsonOut,
) -> None:
    """On the CA's machine: check a CSR and sign a certificate for it (no private key leaves the device)."""
    from edge.fleet.pki import certificate_identity, sign_csr

    if not csr.is_file():
        raise InputFileError(f"CSR {csr} does not exist")
    if out.exists():
        raise InputFileError(f"{out} already exists", hint="a certificate is never overwritten; give another --out")
    cert = sign_csr(csr.read_bytes(), ca, role=_role(role), days=days, sans=san or ())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(cert)
    who = certificate_identity(cert)
    _done(as_json, {"identity": who, "cert": str(out)}, f"{who}: {out}")


@app.command("acl")
@command
def acl_cmd(
    fleet: str = typer.Option(..., "--fleet", help="The fleet the broker serves."),
    out: Path = typer.Option(..., "--out", help="The Mosquitto acl_file to write."),
    collector: list[str] | None = typer.Option(
        None,
        "--collector",
        help="Collector name allowed to read the whole fleet (repeatable; default: main).",
        show_default=False,
    ),
    as_json: bool = JsonOut,
) -> None:
    """Write a Mosquitto ACL: each device publishes only as itself and reads only its own commands."""
    from edge.fleet.acl import DEFAULT_COLLECTOR, write_acl

    path = write_acl(out, fleet, collectors=collector or [DEFAULT_COLLECTOR])
    _done(
        as_json,
        {"acl_file": str(path)},
        f"ACL for fleet {fleet}: {path} (the listener needs require_certificate true, use_identity_as_username true, acl_file)",
    )


def _role(role: str) -> Any:
    from edge.fleet.pki import Role

    try:
        return Role(role)
    except ValueError:
        raise EdgeError(f"unknown --role {role!r}", hint="one of device, collector, server") from None


def _done(as_json: bool, data: dict[str, Any], line: str) -> None:
    if as_json:
        print_json(data)
    else:
        console.print(safe(line), highlight=False, soft_wrap=True)
