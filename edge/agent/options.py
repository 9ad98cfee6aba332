"""The agent's options, declared once: ``python -m edge.agent`` (argparse), ``edgekit agent`` (typer) and the
config file (``--config FILE.toml``) are all generated from :class:`AgentOptions`.

Each field is one option: its type, its default and its help; the flag is ``--`` plus the field's name with
dashes (``metadata["flag"]`` where it differs). Precedence: the declared default, then the config file, then
the command line. The config file's keys are the field names (``device_id`` or ``device-id``); an unknown key,
a wrong type or a value out of range is refused, every problem at once. Imports stay lean (argparse and the
standard library): typer is imported by :func:`typer_parameters` only, which only ``edge.cli.agent`` calls.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from edge.base.typedjson import UnreadableFile, read_toml_file
from edge.errors import EdgeError


def opt(default: Any, help: str, *, flag: str | None = None, minimum: float | None = None) -> Any:  # noqa: A002
    """One option's declaration (a dataclass field)."""
    meta = {"help": help, "flag": flag, "minimum": minimum}
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


REQUIRED = ""  # the default of a required option: given on the command line or in the config file


@dataclass(frozen=True)
class AgentOptions:
    device_id: str = opt(REQUIRED, "This device's id (no '/', '+', '#').")
    store: Path = opt(
        Path(),
        "Device store (from `edgekit deploy --device`); the agent runs its current bundle and keeps its outbox, "
        "downloads and staging in <store>/agent/.",
    )
    fleet: str = opt("default", "Fleet name: topics are edgekit/<fleet>/<device>/...")
    source: str = opt(
        "synthetic",
        "Frames: synthetic (random inputs at --fps), none (health only, no runtime loaded), video:FILE, camera:N "
        "or images:DIR (the application's workload through edge.video: decode, pre-processing, inference, "
        "post-processing), or app[:SOCKET] (the application reports its frames over a Unix datagram socket, "
        "default <store>/agent/app.sock: edge.agent.appsocket).",
    )
    fps: float | None = opt(None, "Source frame rate (default: the bundle's frame budget as a rate, else 30).")
    budget_ms: float | None = opt(None, "Frame budget for budget misses (default: the bundle's target frame budget).")
    interval: float = opt(5.0, "Telemetry interval in seconds.", minimum=0.001)
    broker: str = opt(
        "mqtt://127.0.0.1:1883",
        "mqtt://host[:port] or mqtts://host[:port] (TLS); several nodes of one cluster joined by commas "
        "(mqtt://a:1883,mqtt://b:1883: one scheme, user and CA), tried in turn when one cannot be reached or the "
        "connection drops.",
    )
    ca: Path | None = opt(None, "CA certificate file (PEM) that signed the broker's certificate; implies TLS.")
    cert: Path | None = opt(None, "Client certificate (PEM), for brokers that require one.")
    key: Path | None = opt(None, "Client private key (PEM) for --cert.")
    username: str | None = opt(None, "Broker user name.")
    password_file: Path | None = opt(
        None, "File holding the broker password (or set EDGEKIT_MQTT_PASSWORD); never on the command line."
    )
    protocol: str = opt(
        "5",
        "MQTT protocol version: 5, or 3.1.1 for brokers without MQTT 5 (what needs MQTT 5 is degraded, said in "
        "one log line).",
    )
    client_id: str | None = opt(None, "MQTT client id (default: edgekit-<fleet>-<device>).")
    spool_max_messages: int = opt(
        50_000, "Outbox bound (messages); past it the oldest are dropped and counted.", minimum=1
    )
    spool_max_mb: float = opt(64.0, "Outbox bound (MiB).", minimum=0.001)
    runner_option: list[str] = opt(
        [],
        "KEY=VALUE overriding the bundle's runner options (repeatable; VALUE read as JSON when it parses), "
        "e.g. intra_op_num_threads=1.",
    )
    trust_dir: Path | None = opt(
        None,
        "Trust store the current bundle must be signed for (default: $EDGEKIT_TRUST_DIR, else <store>/trust when "
        "it exists; none: signatures are not checked).",
    )
    flush_timeout: float = opt(
        10.0,
        "At stop, how long to wait for the broker to acknowledge what the outbox still holds (s); what is left "
        "stays on disk for the next start.",
        minimum=0.0,
    )
    reconnect_max: float = opt(
        60.0, "Longest wait between reconnection attempts (s); waits double from 0.5 s, with jitter.", minimum=0.0
    )
    poll_current: float = opt(
        1.0, "How often the store's `current` link is read; a change reloads the runner (s; 0: never).", minimum=0.0
    )
    no_desired: bool = opt(False, "Do not subscribe to edgekit/<fleet>/<device>/desired (no rollouts applied).")
    artifact_root: Path | None = opt(None, "The only directory a desired state's file:// URL may name.")
    watch: float = opt(
        30.0,
        "After a switch, how long the new bundle is watched (p99, errors, fallback, reference drift) before it "
        "counts as running (s).",
        minimum=0.0,
    )
    smoke_frames: int = opt(30, "Timed inferences in the smoke test (0: none).", minimum=0)
    smoke_timeout: float = opt(300.0, "Deadline of the smoke test (s).", minimum=0.001)
    verify_timeout: float = opt(300.0, "Deadline of the artifact's unpack and hash check (s).", minimum=0.001)
    download_timeout: float = opt(600.0, "Deadline of a download, retries included (s).", minimum=0.001)
    duration: float | None = opt(None, "Stop by itself after this many seconds (default: run until SIGTERM).")
    log_level: str = opt("info", "debug, info, warning or error.")
    as_json: bool = opt(False, "Print a JSON summary at exit.", flag="--json")

    @classmethod
    def resolve(cls, given: Mapping[str, Any], config: Path | None = None) -> AgentOptions:
        """The declared defaults, then ``config`` (a TOML file), then what the command line ``given`` (None, False
        and empty lists: not given)."""
        values = read_config(config) if config is not None else {}
        for f in dataclasses.fields(cls):
            v = given.get(f.name)
            if v is None or v is False or (isinstance(v, (list, tuple)) and not v):
                continue  # not given
            values[f.name] = list(v) if isinstance(v, (list, tuple)) else v
        missing = [flag(f) for f in dataclasses.fields(cls) if f.default == REQUIRED and not values.get(f.name)]
        if "store" not in values:
            missing.append("--store")
        if missing:
            raise EdgeError(f"{' and '.join(missing)} required (on the command line or in --config FILE)")
        problems = [p for f in dataclasses.fields(cls) if f.name in values for p in _check(f, values[f.name])]
        if problems:
            raise EdgeError("; ".join(problems))
        return cls(**values)

    def to_config(self) -> Any:
        """The agent's :class:`edge.agent.agent.AgentConfig`."""
        from edge.agent.agent import AgentConfig
        from edge.agent.download import DownloadOptions
        from edge.mqtt.client import BrokerConfig
        from edge.mqtt.netloop import Backoff

        broker = BrokerConfig.from_url(
            self.broker,
            ca_file=self.ca,
            cert_file=self.cert,
            key_file=self.key,
            username=self.username,
            password_file=self.password_file,
            protocol=self.protocol,
        )
        return AgentConfig(
            fleet=self.fleet,
            device_id=self.device_id,
            store=self.store,
            source=self.source,
            fps=self.fps,
            budget_ms=self.budget_ms,
            interval_s=self.interval,
            broker=broker,
            spool_max_messages=self.spool_max_messages,
            spool_max_bytes=int(self.spool_max_mb * 1024 * 1024),
            backoff=Backoff(0.5, self.reconnect_max),
            client_id=self.client_id,
            runner_options=parse_runner_options(self.runner_option),
            trust_dir=self.trust_dir,
            poll_current_s=self.poll_current,
            desired=not self.no_desired,
            artifact_root=self.artifact_root,
            watch_s=self.watch,
            smoke_frames=self.smoke_frames,
            smoke_timeout_s=self.smoke_timeout,
            verify_timeout_s=self.verify_timeout,
            download=DownloadOptions(timeout_s=self.download_timeout),
        )


CONFIG_HELP = 'A TOML file of these options (keys: the option names, e.g. device_id = "cam-01"); the command line wins.'


def parse_runner_options(items: list[str] | None) -> dict[str, Any]:
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


def flag(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata.get("flag") or "--" + f.name.replace("_", "-"))


_HINTS: dict[str, Any] = {}


def _type(f: dataclasses.Field[Any]) -> tuple[type, bool]:
    """(the value's type, whether None is allowed) of a field: str, int, float, bool, Path or list."""
    if not _HINTS:
        _HINTS.update(typing.get_type_hints(AgentOptions))
    t = _HINTS[f.name]
    args = [a for a in typing.get_args(t) if a is not type(None)]
    optional = len(args) < len(typing.get_args(t))
    base = args[0] if optional else t
    return (list if typing.get_origin(base) is list else base), optional


def _check(f: dataclasses.Field[Any], v: Any) -> list[str]:
    t, optional = _type(f)
    if v is None:
        return [] if optional else [f"{flag(f)}: a value is needed"]
    ok = {
        bool: isinstance(v, bool),
        int: isinstance(v, int) and not isinstance(v, bool),
        float: isinstance(v, (int, float)) and not isinstance(v, bool),
        str: isinstance(v, str),
        Path: isinstance(v, Path),
        list: isinstance(v, list) and all(isinstance(x, str) for x in v),
    }[t]
    if not ok:
        return [f"{flag(f)}: {v!r} is not {t.__name__}"]
    low = f.metadata.get("minimum")
    if low is not None and t in (int, float) and v < low:
        return [f"{flag(f)} must be >= {low:g}, got {v}"]
    return []


def read_config(path: Path) -> dict[str, Any]:
    """The options a config file sets, typed (paths as Path); every unknown key and bad value refused at once."""
    try:
        doc = read_toml_file(path, what="agent config file", max_bytes=256 << 10, max_depth=4)
    except (UnreadableFile, OSError) as e:
        raise EdgeError(str(e)) from None
    fields = {f.name: f for f in dataclasses.fields(AgentOptions)}
    out: dict[str, Any] = {}
    problems: list[str] = []
    for raw, v in doc.items():
        name = raw.replace("-", "_")
        f = fields.get(name)
        if f is None:
            problems.append(f"unknown option {raw!r}")
            continue
        t, _ = _type(f)
        if t is Path and isinstance(v, str):
            v = Path(v)
        elif t is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        problems += [f"{path}: {p}" for p in _check(f, v)]
        out[name] = v
    if problems:
        raise EdgeError(f"{path}: " + "; ".join(problems) if problems[0].startswith("unknown") else "; ".join(problems))
    return out


# -- the front-ends ----------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """argparse arguments for every option, and --config (``python -m edge.agent``)."""
    p.add_argument("--config", type=Path, help=CONFIG_HELP)
    for f in dataclasses.fields(AgentOptions):
        t, _ = _type(f)
        help_ = _help(f)
        if t is bool:
            p.add_argument(flag(f), dest=f.name, action="store_true", default=None, help=help_)
        elif t is list:
            p.add_argument(flag(f), dest=f.name, action="append", default=None, help=help_)
        else:
            p.add_argument(flag(f), dest=f.name, type=t, default=None, help=help_)


def options_from(ns: argparse.Namespace | Mapping[str, Any]) -> AgentOptions:
    given = dict(vars(ns)) if isinstance(ns, argparse.Namespace) else dict(ns)
    return AgentOptions.resolve(given, given.get("config"))


def _help(f: dataclasses.Field[Any]) -> str:
    d = f.default
    shown = (
        "" if d in (None, REQUIRED, False) or d is dataclasses.MISSING or isinstance(d, Path) else f" (default: {d})"
    )
    return str(f.metadata["help"]) + shown


def typer_option(name: str, *, default: Any = dataclasses.MISSING) -> Any:
    """A ``typer.Option`` for one declared option (the fleet commands share --broker, --ca, ...)."""
    import typer

    f = next(f for f in dataclasses.fields(AgentOptions) if f.name == name)
    value = f.default if default is dataclasses.MISSING else default
    return typer.Option(value, flag(f), help=str(f.metadata["help"]), show_default=value not in (None, REQUIRED))


def typer_parameters() -> list[Any]:
    """``inspect.Parameter``s for a typer command taking every option, and --config (``edgekit agent``): each
    defaults to None (not given), so the config file and the declared defaults fill in."""
    import inspect

    import typer

    params = [
        inspect.Parameter(
            "config",
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(None, "--config", help=CONFIG_HELP, show_default=False),
            annotation=Path | None,
        )
    ]
    for f in dataclasses.fields(AgentOptions):
        t, _ = _type(f)
        ann: Any = bool if t is bool else list[str] | None if t is list else t | None
        default = False if t is bool else None
        params.append(
            inspect.Parameter(
                f.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=typer.Option(default, flag(f), help=_help(f), show_default=False),
                annotation=ann,
            )
        )
    return params
