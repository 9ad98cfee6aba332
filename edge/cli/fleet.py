"""``edgekit fleet collect`` and ``edgekit fleet status``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from edge.cli._common import JsonOut, command, console, err_console, fmt_ms, print_json
from edge.cli.agent import (Broker, Ca, Cert, Duration, Key, LogLevel, PasswordFile, ReconnectMax, Username,
                            broker_config, setup_logging, stop_on_signals)

app = typer.Typer(help="Fleet telemetry: collect it from MQTT into a database, show where every device stands.",
                  no_args_is_help=True)

Db = typer.Option("sqlite:///fleet.db", "--db", help="sqlite:///relative.db, sqlite:////absolute.db or "
                  "postgresql://user@host/dbname.")
_COLOURS = {"online": "green", "stale": "yellow", "offline": "red", "unknown": "magenta"}


@app.command("collect")
@command
def collect_cmd(
    broker: str = Broker, db: str = Db,
    fleet: str = typer.Option("+", "--fleet", help="Fleet to collect ('+': every fleet)."),
    group: str = typer.Option("edgekit-collectors", "--group", help="Shared-subscription group: collectors in "
                              "one group split the messages between them."),
    client_id: Optional[str] = typer.Option(None, "--client-id", help="MQTT client id; keep it stable, the broker "
                                            "keeps this collector's messages under it while it is away "
                                            "(default: edgekit-collector-<group>-<hostname>).", show_default=False),
    session_expiry: int = typer.Option(3600, "--session-expiry", help="How long (s) the broker keeps messages for "
                                       "this collector while it is disconnected."),
    rebirth_interval: float = typer.Option(30.0, "--rebirth-interval", help="At most one rebirth request per "
                                           "device per this many seconds."),
    ca: Optional[Path] = Ca, cert: Optional[Path] = Cert, key: Optional[Path] = Key,
    username: Optional[str] = Username, password_file: Optional[Path] = PasswordFile,
    reconnect_max: float = ReconnectMax, duration: Optional[float] = Duration,
    stats_interval: float = typer.Option(60.0, "--stats-interval", help="Log the counters every this many seconds."),
    log_level: str = LogLevel, as_json: bool = JsonOut,
) -> None:
    """Store every device's births, deaths and telemetry (de-duplicated) until SIGTERM/Ctrl-C."""
    from edge.agent.netloop import Backoff
    from edge.fleet.collector import Collector, CollectorConfig
    from edge.fleet.db import check_url

    setup_logging(log_level)
    cfg = CollectorConfig(broker=broker_config(broker, ca, cert, key, username, password_file), db_url=db,
                          fleet=fleet, group=group, client_id=client_id, session_expiry_s=session_expiry,
                          rebirth_interval_s=rebirth_interval, backoff=Backoff(0.5, reconnect_max))
    # A collector that never reached its broker is misconfigured (or started before it): say so and stop,
    # before the database is created. Once connected, a lost broker is waited for (reconnects, back-off).
    check_url(db)
    cfg.broker.check_reachable()
    with stop_on_signals() as stop:
        collector = Collector(cfg).start()
        loop = collector.loop
        assert loop is not None
        loop.run(lambda: loop.call_every(stats_interval, _log_stats, collector))
        err_console.print(f"collecting {collector.subscription} from {cfg.broker.url} into {_redact(db)}; "
                          "SIGTERM or Ctrl-C stops it", highlight=False, soft_wrap=True)
        try:
            stop.wait(duration)
        finally:
            stats = collector.snapshot()
            collector.stop()
    if as_json:
        print_json(stats)
    else:
        err_console.print(_stats_line(stats), highlight=False)


def _redact(url: str) -> str:
    from edge.fleet.db import _redact as r

    return r(url)


def _stats_line(s: dict[str, Any]) -> str:
    rejected = sum(s["rejected"].values())
    detail = ", ".join(f"{k} {v}" for k, v in s["rejected"].items() if v)
    return (f"received {s['received']}, stored {sum(s['stored'].values())} ({s['stored']['telemetry']} telemetry), "
            f"duplicates {s['duplicates']}, rejected {rejected}{' (' + detail + ')' if detail else ''}, "
            f"rebirth requests {s['rebirths_sent']}, gaps {s['gaps_detected']} ({s['gaps_filled']} filled)")


def _log_stats(collector: Any) -> None:
    import logging

    logging.getLogger("edge.fleet").info(_stats_line(collector.stats))


@app.command("status")
@command
def status_cmd(
    db: str = Db,
    fleet: Optional[str] = typer.Option(None, "--fleet", help="Only this fleet.", show_default=False),
    stale_factor: float = typer.Option(3.0, "--stale-factor", help="Stale after this many telemetry intervals "
                                       "of silence..."),
    min_stale: float = typer.Option(15.0, "--min-stale", help="...and at least this many seconds."),
    as_json: bool = JsonOut,
) -> None:
    """One row per device: online/stale/offline, bundle, fps, p50/p99, budget misses, temperature, last seen."""
    from edge.fleet.status import fleet_status, summarize

    rows = fleet_status(db, fleet=fleet, stale_factor=stale_factor, min_stale_s=min_stale)
    if as_json:
        print_json({"summary": summarize(rows), "devices": rows, "generated_at": time.time()})
        return
    if not rows:
        console.print(f"no devices in {_redact(db)} yet", highlight=False)
        return
    t = Table(title=f"fleet status ({_redact(db)})")
    for col, just in (("device", "left"), ("status", "left"), ("bundle", "left"), ("runtime", "left"),
                      ("fps", "right"), ("p50 ms", "right"), ("p99 ms", "right"), ("misses", "right"),
                      ("temp °C", "right"), ("CPU %", "right"), ("RSS MB", "right"), ("spool", "right"),
                      ("missing", "right"), ("last seen", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in rows:
        status = f"[{_COLOURS[r['status']]}]{r['status']}[/]"
        if r["status"] == "offline" and r.get("death_reason"):
            status += f" [dim]({r['death_reason'][:30]})[/]"
        if r.get("state") == "error":
            status += " [red]error[/]"
        runtime = " ".join(x for x in (r.get("runtime"), r.get("device_used") and f"on {r['device_used']}") if x)
        t.add_row(f"{r['fleet']}/{r['device']}", status, r.get("bundle_id") or "-", runtime or "-", _n(r.get("fps"), 1),
                  fmt_ms(r.get("p50_ms")), fmt_ms(r.get("p99_ms")), _n(r.get("misses"), 0),
                  _n(r.get("temp_c"), 1) + (" [red]throttled[/]" if r.get("throttled") else ""),
                  _n(r.get("cpu_percent"), 0), _n(r.get("rss_mb"), 0), _n(r.get("spool_pending"), 0),
                  f"[yellow]{r['missing']}[/]" if r["missing"] else "0", _ago(r.get("seen_ago_s")))
    console.print(t)
    s = summarize(rows)
    console.print(", ".join(f"{s[k]} {k}" for k in ("online", "stale", "offline", "unknown") if s[k]) +
                  f" of {s['devices']} devices", highlight=False)


def _n(v: Optional[float], nd: int) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def _ago(s: Optional[float]) -> str:
    if s is None:
        return "never"
    if s < 120:
        return f"{s:.0f} s ago"
    if s < 7200:
        return f"{s / 60:.0f} min ago"
    return f"{s / 3600:.1f} h ago"
