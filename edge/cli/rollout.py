"""``edgekit fleet rollout start|status|pause|resume|abort|pack`` (library: ``edge.fleet.rollout``).

Exit codes of ``start`` and ``resume`` (``edge.fleet.rollout_facts.exit_code``): 0 completed, 4 partial (a cohort
aborted while another completed, or no device ended on the bundle), 5 aborted, 6 not finished (``--timeout``,
a signal; ``resume`` continues it); ``start --detach`` 0 once recorded. ``abort``: 0 when every device given the
bundle is back on its old one (or, without ``--wait``, the broker holds every rollback), 4 when a rollback
failed, timed out or is impossible, 6 when not finished. 2 and 3 as everywhere (user error, internal error).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from edge.agent.main import broker_config, setup_logging, stop_on_signals
from edge.cli._common import JsonOut, command, console, print_json, progress, safe
from edge.cli.agent import Broker, Ca, Cert, Key, PasswordFile, Protocol, Username
from edge.errors import EdgeError

app = typer.Typer(
    help="Roll a bundle out to a fleet over MQTT: cohorts per target class, canary then waves, "
    "abort and roll back on model health; every decision stored in the fleet database.",
    no_args_is_help=True,
)

Db = typer.Option(
    "sqlite:///fleet.db",
    "--db",
    help="The fleet database (sqlite:///fleet.db or postgresql://...) where the rollout and its decisions are stored.",
)
LogLevel = typer.Option(
    "warning",
    "--log-level",
    help="debug, info, warning or error (decisions are shown at a terminal, and by `status`, whatever the level).",
)
Timeout = typer.Option(
    None,
    "--timeout",
    help="Stop driving the rollout after this many seconds (it stays as it is; `resume` continues it).",
    show_default=False,
)


def _view(
    fleet: str,
    broker: str,
    ca: Any,
    cert: Any,
    key: Any,
    username: Any,
    password_file: Any,
    protocol: str,
    telemetry: bool,
) -> Any:
    from edge.fleet.rollout import FleetView

    return FleetView(
        broker_config(broker, ca, cert, key, username, password_file, protocol), fleet, telemetry=telemetry
    ).start()


def _drive(db: Any, rid: str, view: Any, timeout: float | None, json_out: bool, wait_devices: bool = True) -> Any:
    from edge.fleet.rollout import RolloutController

    ctl = RolloutController(db, rid, view)
    if not view.wait_synced(15.0):
        raise EdgeError(
            f"cannot read the fleet from the broker {view.broker.url}: {view.conn.last_error or 'no answer'}"
        )
    seen = [0]

    def show(_res: Any) -> None:
        if json_out:
            return
        for e in ctl.store.events(rid, since=seen[0]):
            seen[0] = e["seq"]
            where = e["device"] or e["cohort"] or ""
            progress(f"{e['kind']:<26} {safe(where):<20} {safe(e['reason'] or '')}")

    with stop_on_signals() as stop:
        return ctl.run(timeout_s=timeout, stop=stop, on_step=show, wait_devices=wait_devices)


def _render(st: dict[str, Any], json_out: bool) -> None:
    if json_out:
        print_json(st)
        return
    console.print(
        f"rollout [bold]{safe(st['id'])}[/] fleet {safe(st['fleet'])}: [bold]{st['state']}[/]"
        + (f" ({safe(st['reason'])})" if st.get("reason") else ""),
        highlight=False,
    )
    t = Table("cohort", "bundle", "state", "wave", "devices", "rollback", "reason")

    def fmt(d: dict[str, Any]) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "-"

    for c in st["cohorts"]:
        t.add_row(
            safe(c["cohort"]),
            safe(c["bundle_id"]),
            c["state"],
            str(c["wave"]),
            fmt(c["devices"]),
            fmt(c["rollback"]),
            safe(c["reason"] or ""),
        )
    console.print(t)
    for e in st["events"][-15:]:
        console.print(
            f"  #{e['seq']:<4} {e['kind']:<26} {safe(e['device'] or e['cohort'] or ''):<20} {safe(e['reason'] or '')}",
            highlight=False,
        )


@app.command("start")
@command
def start_cmd(
    bundles: list[Path] = typer.Argument(
        ..., help="Bundle directories, one per target class (each cohort gets the bundle built for its target)."
    ),
    fleet: str = typer.Option(..., "--fleet", help="The fleet to roll out to."),
    artifact_url: list[str] = typer.Option(
        ...,
        "--artifact-url",
        help="Where devices download each bundle's "
        "archive (`edgekit fleet rollout pack`), one per bundle in the same "
        "order; checked before anything is published.",
    ),
    target: list[str] | None = typer.Option(
        None, "--target", help="Only these target classes (repeatable).", show_default=False
    ),
    group: list[str] | None = typer.Option(
        None,
        "--group",
        help="label=value (glob): only devices whose birth field matches, e.g. host.model=rpi5 or device=cam-* (repeatable).",
        show_default=False,
    ),
    canary: str = typer.Option("5%", "--canary", help="Share of each cohort in the canary (at least one device)."),
    waves: str = typer.Option(
        "25%,50%,100%", "--waves", help="Shares of each cohort after the canary, ending at 100%."
    ),
    watch: str = typer.Option("10m", "--watch", help="Watch each wave at least this long (30s, 10m, 1h)."),
    device_timeout: str = typer.Option(
        "15m", "--device-timeout", help="A device that has not answered by then is timed out; it never holds a wave up."
    ),
    abort_if: list[str] | None = typer.Option(
        None,
        "--abort-if",
        help="Abort criterion (repeatable): "
        "p99>budget, fps<0.95*target, fallback, parity<threshold "
        "[@N | @P%], errors>1%, failed>N, rolled_back>N, timed_out>P%. Default: failed>0 (one failed "
        "device stops its cohort); 'none': no criterion.",
        show_default=False,
    ),
    success_rate: str | None = typer.Option(
        None,
        "--success-rate",
        help="Go on to the next wave only if this "
        "share of the devices that answered runs the bundle (hawkBit's "
        "success threshold), e.g. 95%; else the cohort aborts.",
        show_default=False,
    ),
    min_devices: int = typer.Option(
        1, "--min-devices", help="Percentage criteria apply once this many devices of a cohort finished."
    ),
    budget_ms: float | None = typer.Option(
        None,
        "--budget-ms",
        help="Latency budget given to the devices (default: each device's, else the bundle's).",
        show_default=False,
    ),
    device_watch: str | None = typer.Option(
        None,
        "--device-watch",
        help="How long each device watches the new bundle after its switch (default: the agent's).",
        show_default=False,
    ),
    previous_bundle: list[Path] | None = typer.Option(
        None,
        "--previous-bundle",
        help="A bundle devices run now, to roll back to (with --previous-url, repeatable).",
        show_default=False,
    ),
    previous_url: list[str] | None = typer.Option(
        None, "--previous-url", help="Its archive's URL.", show_default=False
    ),
    rollout_id: str | None = typer.Option(
        None, "--id", help="Rollout id (default: r<UTC time>-<random>).", show_default=False
    ),
    detach: bool = typer.Option(False, "--detach", help="Record the rollout and return; `resume` drives it."),
    timeout: float | None = Timeout,
    db: str = Db,
    broker: str = Broker,
    ca: Path | None = Ca,
    cert: Path | None = Cert,
    key: Path | None = Key,
    username: str | None = Username,
    password_file: Path | None = PasswordFile,
    protocol: str = Protocol,
    log_level: str = LogLevel,
    json_out: bool = JsonOut,
) -> None:
    """Start a rollout and drive it until every cohort completed or aborted."""
    from edge.fleet.db import open_db
    from edge.fleet.rollout import RolloutBundle, RolloutFlags, RolloutSpec, start_rollout, status

    setup_logging(log_level if not json_out else "warning")
    spec = RolloutSpec.parse(
        RolloutFlags(
            fleet=fleet,
            canary=canary,
            waves=waves,
            watch=watch,
            device_timeout=device_timeout,
            abort_if=abort_if or [],
            min_devices=min_devices,
            targets=target or [],
            groups=group or [],
            budget_ms=budget_ms,
            device_watch=device_watch,
            success_rate=success_rate,
        )
    )
    if len(artifact_url) != len(bundles):
        raise EdgeError(f"{len(bundles)} bundle(s) but {len(artifact_url)} --artifact-url: give one per bundle")
    if len(previous_bundle or []) != len(previous_url or []):
        raise EdgeError("--previous-bundle and --previous-url go in pairs")
    prepared = [RolloutBundle.prepare(b, u) for b, u in zip(bundles, artifact_url)]
    previous = [RolloutBundle.prepare(b, u) for b, u in zip(previous_bundle or [], previous_url or [])]
    with open_db(db) as fdb:
        view = _view(
            fleet,
            broker,
            ca,
            cert,
            key,
            username,
            password_file,
            protocol,
            any(c.startswith("fps") for c in spec.abort_if),
        )
        try:
            rid = start_rollout(fdb, view, spec, prepared, previous=previous, rollout_id=rollout_id)
            if not detach:
                _drive(fdb, rid, view, timeout, json_out)
        finally:
            view.close()
        st = status(fdb, rid)
        _render(st, json_out)
    if not detach:
        _exit(st, "start")


def _exit(st: dict[str, Any], action: str) -> None:
    """The documented exit code of ``action`` for the rollout as it ended (module doc)."""
    from edge.fleet.rollout_facts import NOT_FINISHED, exit_code

    if action == "abort":
        bad = sum(n for c in st["cohorts"] for k, n in c["rollback"].items() if k not in ("running", "pending"))
        code = NOT_FINISHED if st["state"] != "aborted" else 4 if bad else 0
    else:
        code = exit_code(st["state"])
    if code:
        raise typer.Exit(code)


@app.command("status")
@command
def status_cmd(
    rollout_id: str | None = typer.Argument(None, help="Rollout id (default: the latest)."),
    fleet: str | None = typer.Option(None, "--fleet", help="The latest rollout of this fleet.", show_default=False),
    events: int = typer.Option(50, "--events", help="How many of the latest decisions to show."),
    db: str = Db,
    json_out: bool = JsonOut,
) -> None:
    """A rollout's state, its cohorts and the latest decisions with their reasons."""
    from edge.fleet.db import open_db
    from edge.fleet.rollout import status

    with open_db(db, must_exist=True) as fdb:
        _render(status(fdb, rollout_id, fleet=fleet, events=events), json_out)


@app.command("pause")
@command
def pause_cmd(
    rollout_id: str = typer.Argument(...),
    reason: str | None = typer.Option(None, "--reason"),
    db: str = Db,
    json_out: bool = JsonOut,
) -> None:
    """No new devices get the bundle until `resume` (outcomes and abort criteria are still followed)."""
    from edge.fleet.db import open_db
    from edge.fleet.rollout import set_state

    with open_db(db, must_exist=True) as fdb:
        _render(set_state(fdb, rollout_id, "pause", reason), json_out)


def _act(
    action: str,
    rollout_id: str,
    reason: str | None,
    timeout: float | None,
    db: str,
    broker: str,
    tls: tuple[Any, Any, Any, Any, Any],
    protocol: str,
    log_level: str,
    json_out: bool,
    wait_devices: bool = True,
) -> None:
    from edge.fleet.db import open_db
    from edge.fleet.rollout import set_state, status
    from edge.fleet.rollout_store import RolloutStore

    setup_logging(log_level if not json_out else "warning")
    with open_db(db, must_exist=True) as fdb:
        r = RolloutStore(fdb).rollout(rollout_id)
        set_state(fdb, rollout_id, action, reason)
        fleet = r["fleet"] if r else ""
        spec = (r or {}).get("spec") or {}
        view = _view(fleet, broker, *tls, protocol, any(c.startswith("fps") for c in spec.get("abort_if", [])))
        try:
            _drive(fdb, rollout_id, view, timeout, json_out, wait_devices)
        finally:
            view.close()
        st = status(fdb, rollout_id)
        _render(st, json_out)
    _exit(st, action)


@app.command("resume")
@command
def resume_cmd(
    rollout_id: str = typer.Argument(...),
    timeout: float | None = Timeout,
    db: str = Db,
    broker: str = Broker,
    ca: Path | None = Ca,
    cert: Path | None = Cert,
    key: Path | None = Key,
    username: str | None = Username,
    password_file: Path | None = PasswordFile,
    protocol: str = Protocol,
    log_level: str = LogLevel,
    json_out: bool = JsonOut,
) -> None:
    """Resume a paused rollout, or continue one whose controller stopped: drive it from where it is."""
    _act(
        "resume",
        rollout_id,
        None,
        timeout,
        db,
        broker,
        (ca, cert, key, username, password_file),
        protocol,
        log_level,
        json_out,
    )


@app.command("abort")
@command
def abort_cmd(
    rollout_id: str = typer.Argument(...),
    reason: str | None = typer.Option(None, "--reason"),
    timeout: float | None = Timeout,
    db: str = Db,
    broker: str = Broker,
    ca: Path | None = Ca,
    cert: Path | None = Cert,
    key: Path | None = Key,
    username: str | None = Username,
    password_file: Path | None = PasswordFile,
    protocol: str = Protocol,
    log_level: str = LogLevel,
    wait: bool = typer.Option(
        False,
        "--wait",
        help="Wait until every device answered its rollback (or timed out), not only until the broker holds every rollback.",
    ),
    json_out: bool = JsonOut,
) -> None:
    """Roll every device that got this rollout's bundle back to the bundle it ran before (retained: offline
    devices get it when they come back)."""
    _act(
        "abort",
        rollout_id,
        reason,
        timeout,
        db,
        broker,
        (ca, cert, key, username, password_file),
        protocol,
        log_level,
        json_out,
        wait,
    )


@app.command("pack")
@command
def pack_cmd(
    bundle: Path = typer.Argument(..., help="Bundle directory."),
    out: Path = typer.Argument(..., help="Archive to write (upload it where --artifact-url points)."),
    json_out: bool = JsonOut,
) -> None:
    """Write the archive devices download for a bundle (reproducible: the same bundle, the same sha256)."""
    from edge.bundle.archive import pack_bundle
    from edge.fleet.rollout import RolloutError

    if not (bundle / "manifest.json").is_file():
        raise RolloutError(f"{bundle} is not a bundle (no manifest.json)")
    sha = pack_bundle(bundle, out)
    if json_out:
        print_json({"archive": str(out), "sha256": sha, "size": out.stat().st_size})
    else:
        console.print(f"{safe(str(out))}  sha256 {sha}  {out.stat().st_size} bytes", highlight=False)
