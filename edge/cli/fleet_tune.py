"""``edgekit fleet tune MODEL --device ID``: ``edgekit tune``'s trials measured on a connected device
(library: ``edge.tune.remote``; the device side: ``edge.agent.tune_cmd``)."""

from __future__ import annotations

from pathlib import Path

import typer

from edge.agent.main import broker_config
from edge.cli._common import JsonOut, TargetsDir, command, print_json, steps
from edge.cli.agent import Broker, Ca, Cert, Key, PasswordFile, Protocol, Username
from edge.cli.bench import BudgetMs, Fps
from edge.cli.convert import InputShape, Letterbox, Preprocess
from edge.cli.signing import SignKey
from edge.verify.inputs import CALIB_FLAG


@command
def fleet_tune_cmd(
    model: Path = typer.Argument(..., help="Source model (.onnx)."),
    device: str = typer.Option(..., "--device", help="The device whose agent measures the trials."),
    fleet: str = typer.Option("default", "--fleet", help="The device's fleet."),
    target: str | None = typer.Option(
        None,
        "--target",
        "-t",
        help="Target profile (default: the target of the bundle the device runs, from its birth).",
        show_default=False,
    ),
    artifact_base_url: str | None = typer.Option(
        None,
        "--artifact-base-url",
        help="Where the device downloads the trial bundles: upload OUT/artifacts/*.tar there (each URL is checked first).",
        show_default=False,
    ),
    serve: str | None = typer.Option(
        None,
        "--serve",
        help="HOST:PORT: serve OUT/artifacts over HTTP from here while the device fetches (port 0: any free one).",
        show_default=False,
    ),
    objective: str = typer.Option("latency", "--objective", help="latency or throughput."),
    budget_ms: float | None = BudgetMs,
    fps: float | None = Fps,
    max_trials: int | None = typer.Option(
        None,
        "--max-trials",
        help="Send at most this many configurations (each runner and precision's defaults first; at most 64).",
        show_default=False,
    ),
    calib: str | None = typer.Option(
        None,
        CALIB_FLAG,
        help="Calibration data for int8 (a directory, or 'random'); without it int8 is left out.",
        show_default=False,
    ),
    precision: list[str] | None = typer.Option(
        None, "--precision", "-p", help="Only these precisions (repeatable).", show_default=False
    ),
    runner: list[str] | None = typer.Option(
        None, "--runner", help="Only these runners (repeatable).", show_default=False
    ),
    threads: list[int] | None = typer.Option(
        None, "--threads", help="Only these thread counts (repeatable).", show_default=False
    ),
    strategy: str = typer.Option(
        "halving",
        "--strategy",
        help="halving: a short measurement of every trial, then "
        "the best third (at least 3) measured again, one request per rung, until the "
        "finalists get the full one; exhaustive: every trial at full length, one request.",
    ),
    study: Path | None = typer.Option(
        None,
        "--study",
        help="Study file to resume from and write to after every "
        "rung (default: OUT/study.json); it names the device, model, target and "
        "objective, and one made for others is refused.",
        show_default=False,
    ),
    reps: int = typer.Option(5, "--reps", help="Interleaved repetitions on the device (the full measurement)."),
    iters: int = typer.Option(40, "--iters", help="Timed inferences per trial and repetition (the full measurement)."),
    warmup: int = typer.Option(5, "--warmup", help="Untimed inferences per trial first."),
    sign_key: str | None = SignKey,
    timeout: float = typer.Option(900.0, "--timeout", help="Wait this long (s) for the device's results (every rung)."),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Output directory: tuned.toml, study.json, "
        "device-tune.json, pareto.html/png, artifacts/, the conversion cache "
        "(default: build/<model>-<device>-tune).",
        show_default=False,
    ),
    input_shape: list[str] | None = InputShape,
    preprocess: str = Preprocess,
    letterbox: bool | None = Letterbox,
    broker: str = Broker,
    ca: Path | None = Ca,
    cert: Path | None = Cert,
    key: Path | None = Key,
    username: str | None = Username,
    password_file: Path | None = PasswordFile,
    protocol: str = Protocol,
    targets_dir: list[Path] | None = TargetsDir,
    as_json: bool = JsonOut,
) -> None:
    """Convert the tune space's trials here, have DEVICE's agent download, verify and measure them over MQTT
    (successive halving: one request per rung), and show the same table as `edgekit tune`, measured on the
    device. A re-run with the same --study (or --out) measures only what the study lacks."""
    from edge.bundle.signing import configured_sign_key
    from edge.cli.convert import convert_request
    from edge.cli.tune import render_tune
    from edge.tune.remote import DeviceTune, tune_on_device
    from edge.tune.search import Schedule, TuneOptions

    remote = DeviceTune(
        broker=broker_config(broker, ca, cert, key, username, password_file, protocol),
        fleet=fleet,
        target=target,
        artifact_base_url=artifact_base_url,
        serve=serve,
        timeout_s=timeout,
        sign_key=configured_sign_key(sign_key),
    )
    request = convert_request(None, calib, input_shape, preprocess, letterbox, None, targets_dir)
    options = TuneOptions(
        objective=objective,
        strategy=strategy,
        max_trials=max_trials,
        study=study,
        out=out,
        runners=runner or None,
        precisions=precision or None,
        threads=threads or None,
        schedule=Schedule(reps=reps, iters=iters, warmup=warmup),
        budget_ms=budget_ms,
        fps=fps,
    )
    with steps(not as_json) as say:
        result = tune_on_device(model, device, remote, request, options, on_step=say)
    data = result.to_json()
    if as_json:
        print_json(data)
    else:
        render_tune(data)  # its summary line ends with "measured on device ID (host, CPU, ISA)"
    if result.winner is None:
        raise typer.Exit(1)
