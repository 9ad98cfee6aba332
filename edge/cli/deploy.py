"""``edgekit deploy`` and ``edgekit rollback``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from edge.cli._common import AllowCpuFallback, JsonOut, TargetsDir, console, err_console, print_json, safe, steps
from edge.cli.bench import BudgetMs, Fps, render_bench
from edge.cli.convert import (
    AcceptParity,
    Calib,
    FreezeInput,
    InputShape,
    Letterbox,
    ParityData,
    Precision,
    Preprocess,
    Task,
    Tuned,
    convert_request,
    render_bundle,
)
from edge.cli.signing import SignKey
from edge.cli.verify import NoIsaCheck
from edge.deploy import DeployOptions, deploy
from edge.errors import EdgeError
from edge.store import rollback
from edge.tune.budget import SEARCH_TIME_S

EXAMPLE_MODEL = Path("build") / "example" / "mobilenetv2.onnx"


def deploy_cmd(
    model: Path | None = typer.Argument(
        None,
        help="Source model (.onnx, .tflite, OpenVINO .xml, .pt/.pt2, .gguf). Omitted: the built-in example "
        "MobileNetV2 (deterministic weights), written to build/example/.",
    ),
    target: str = typer.Option("x86-cpu", "--target", "-t", help="Target profile (see `edgekit targets`)."),
    device: str = typer.Option(
        "devices/local",
        "--device",
        "-d",
        help="Device store: a directory, or "
        "ssh://user@host:port/path, user@ and :port optional (extra ssh options: "
        "$EDGEKIT_SSH_OPTIONS, -o Key=Value only).",
    ),
    precision: str | None = Precision,
    calib: str | None = Calib,
    input_shape: list[str] | None = InputShape,
    preprocess: str = Preprocess,
    letterbox: bool | None = Letterbox,
    freeze_input: list[str] | None = FreezeInput,
    parity_data: Path | None = ParityData,
    task: str = Task,
    iterations: int = typer.Option(
        200,
        "--iterations",
        "-n",
        help="Benchmark iterations, at least (the budget verdict is measured in steady state: 1 s warm-up, then at "
        "least 2 s; a p99 within 25%% over the budget is measured 3 more times and the median run decides).",
    ),
    fps: float | None = Fps,
    budget_ms: float | None = BudgetMs,
    build_dir: Path | None = typer.Option(
        None, "--build-dir", help="Where the bundle is built (default: build/<model>-<target>).", show_default=False
    ),
    accept_parity_failure: bool = AcceptParity,
    accept_budget_failure: bool = typer.Option(
        False, "--accept-budget-failure", help="Ship even when p99 is over budget."
    ),
    allow_cpu_fallback: bool = AllowCpuFallback,
    sign_key: str | None = SignKey,
    tuned: Path | None = Tuned,
    no_isa_check: bool = NoIsaCheck,
    tune: bool = typer.Option(
        False,
        "--tune",
        help="Tune first (`edgekit tune` with this deploy's --calib, "
        "--input-shape, --freeze-input, --preprocess, --parity-data, --task, budget and --precision: every "
        "trial gated as this deploy will be), then convert, check, benchmark "
        "and ship the winner's overlay; the tune's files go to <build-dir>-tune.",
    ),
    objective: str | None = typer.Option(
        None,
        "--objective",
        help="With --tune: latency (default), throughput or e2e (needs --video).",
        show_default=False,
    ),
    max_trials: int | None = typer.Option(
        None, "--max-trials", help="With --tune: try at most this many configurations.", show_default=False
    ),
    time_budget: float | None = typer.Option(
        None,
        "--time-budget",
        help="With --tune: stop tuning after this many seconds; the best so far wins.",
        show_default=False,
    ),
    video: Path | None = typer.Option(
        None, "--video", help="With --tune --objective e2e: the video file.", show_default=False
    ),
    no_search: bool = typer.Option(
        False,
        "--no-search",
        help="When the default configuration misses the budget (where the budget gates), refuse instead of searching "
        "for one that meets it (precisions this CPU runs fast, threads, spin-wait; each through the parity gate).",
    ),
    search_time: float = typer.Option(
        SEARCH_TIME_S, "--search-time", help="The budget search's time cap in seconds (checked between its steps)."
    ),
    trust_dir: Path | None = typer.Option(
        None,
        "--trust-dir",
        help="Trust store the bundle must be signed for (default: $EDGEKIT_TRUST_DIR, else a local store's <device>/trust).",
        show_default=False,
    ),
    targets_dir: list[Path] | None = TargetsDir,
    as_json: bool = JsonOut,
) -> None:
    """Convert, check parity, benchmark on this host (when the target's runtime runs here), and ship to DEVICE."""
    if model is None:
        from edge.graph.samples import build_mobilenet_v2

        model = EXAMPLE_MODEL
        if not model.exists():
            build_mobilenet_v2(model)
        if not as_json:
            err_console.print(
                f"no model given: using the built-in example MobileNetV2 at {safe(model)}", highlight=False
            )
    request = convert_request(precision, calib, input_shape, preprocess, letterbox, freeze_input, targets_dir).replace(
        parity_data=parity_data, task=task, accept_parity_failure=accept_parity_failure, tuned=tuned
    )
    tune_opts = None
    tune_flags = {"--objective": objective, "--max-trials": max_trials, "--time-budget": time_budget, "--video": video}
    if tune:
        from edge.tune.search import TuneOptions

        tune_opts = TuneOptions(
            objective=objective or "latency", max_trials=max_trials, time_budget_s=time_budget, video=video
        )
    elif any(v is not None for v in tune_flags.values()):
        given = ", ".join(k for k, v in tune_flags.items() if v is not None)
        raise EdgeError(f"{given} tune(s) the model: give it with --tune", hint="edgekit deploy MODEL --tune ...")
    options = DeployOptions(
        build_dir=build_dir,
        bench_iterations=iterations,
        fps=fps,
        budget_ms=budget_ms,
        accept_budget_failure=accept_budget_failure,
        allow_cpu_fallback=allow_cpu_fallback,
        sign_key=sign_key,
        trust=trust_dir,
        tune=tune_opts,
        isa_check=not no_isa_check,
        budget_search=not no_search,
        search_time_s=search_time,
    )
    with steps(not as_json) as say:
        result = deploy(model, target, device, request, options, on_step=say)
    if as_json:
        print_json(result.to_json())
        return
    if result.tune is not None:
        t = result.tune  # its summary line is the first note below
        console.print(
            "tune files: "
            + ", ".join(f"{what} {safe(str(t[what]))}" for what in ("overlay", "study", "html") if t.get(what)),
            highlight=False,
        )
    render_bundle(result.bundle)
    if result.unverified is not None:
        console.print(f"[yellow]unverified on this host:[/] {safe(result.unverified)}", highlight=False)
    if result.benchmark:
        render_bench(result.benchmark)
    if result.budget_search is not None:
        render_search(result.budget_search)
    for n in result.notes:
        console.print(f"[yellow]note:[/] {safe(n)}", highlight=False)
    console.print(f"[green]shipped[/] {safe(result.bundle.id)} → {safe(result.shipped_to)}", highlight=False)


def render_search(record: dict[str, Any]) -> None:
    """The budget search's candidates, one row each, and what it chose and why."""
    from rich.table import Table

    t = Table(title=f"budget search: {safe(str(record.get('reason')))}", title_justify="left")
    for col in ("candidate", "parity", "p50 ms", "p99 ms", "within budget", "status"):
        t.add_column(col)
    for c in record.get("candidates") or []:
        t.add_row(
            safe(str(c.get("label"))),
            {True: "pass", False: "fail"}.get(c.get("parity"), "-"),
            f"{c['p50_ms']:.2f}" if c.get("p50_ms") is not None else "-",
            f"{c['p99_ms']:.2f}" if c.get("p99_ms") is not None else "-",
            "yes" if c.get("within_budget") else "no",
            safe(str(c.get("status"))),
        )
    console.print(t)
    console.print(f"chosen: {safe(str(record.get('chosen')))}: {safe(str(record.get('why')))}", highlight=False)


def rollback_cmd(
    device: str = typer.Option(..., "--device", "-d", help="Device store (directory or ssh://...)."),
    as_json: bool = JsonOut,
) -> None:
    """Switch the device store back to its previous bundle (atomically, under the store's lock; a switch a
    killed deploy left half done is finished or undone first)."""
    bid = rollback(device)
    if as_json:
        print_json({"device": device, "current": bid})
    else:
        console.print(f"rolled back: {safe(device)} now runs {safe(bid)}", highlight=False)
