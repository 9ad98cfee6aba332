"""``edgekit tune``: search runner, precision and runner options for a target on this host; parity is a hard constraint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from edge.cli._common import JsonOut, TargetsDir, Wide, console, fmt_ms, print_json, print_table, safe, steps
from edge.cli.bench import BudgetMs, Fps
from edge.cli.convert import FreezeInput, InputShape, Letterbox, ParityData, Preprocess, Task
from edge.errors import ModelError
from edge.tune.config import OBJECTIVES
from edge.verify.inputs import CALIB_FLAG


def render_tune(r: dict[str, Any], *, wide: bool = False) -> None:
    from edge.tune.report import row

    title = f"tune {Path(r['model']).name} for {r['target']} (objective {r['objective']}, {r['strategy']})"
    e2e = r["objective"] == "e2e"
    # throughput: a batched trial's fps counts items (its p50/p99 are per inference of the whole batch)
    cols = [
        "configuration",
        "status",
        "size MB",
        "parity",
        "p50 ms",
        "p99 ms",
        "items/s" if r["objective"] == "throughput" else "fps",
        "mem MB",
    ]
    if e2e:  # frames the pipeline could not process in time at the target rate: ranked on first
        cols.insert(4, "missed at " + _pace(r))
    throughput = r["objective"] == "throughput"
    if throughput:  # requests in flight while measured (OpenVINO: its optimal number; the others 1)
        cols.insert(4, "requests")
    # words wrap whole (a configuration is words: runner, precision, options); numbers never wrap
    opts: dict[str, dict[str, Any]] = {"configuration": {"min_width": 20}, "status": {"min_width": 10}, "parity": {}}
    columns = [(c, opts.get(c, {"no_wrap": True, "justify": "right"})) for c in cols]
    narrow = {
        "configuration",
        "status",
        "parity",
        "p50 ms",
        "p99 ms",
        "requests",
        *(c for c in cols if c.startswith("missed")),
    }
    rows = []
    order = {"chosen": 0, "measured": 1}

    def rank(x: dict[str, Any]) -> tuple[Any, ...]:
        res = x.get("result") or {}
        missed = (res.get("missed") or 0) / (res.get("frames") or 1)  # e2e: missed frames first, as tune ranks
        return order.get(x["status"], 2), missed, res.get("score") if res.get("score") is not None else float("inf")

    for trial in sorted(r["trials"], key=rank):
        rw = row(trial)
        status = rw["status"]
        style = (
            "green"
            if status == "chosen"
            else "red"
            if status.startswith(("parity failed", "conversion failed", "failed"))
            else ""
        )
        cells = [
            safe(rw["configuration"]),
            f"[{style}]{safe(status)}[/]" if style else safe(status),
            "-" if rw["size_mb"] is None else f"{rw['size_mb']:.2f}",
            safe(rw["parity"]),
            fmt_ms(rw["p50_ms"]),
            fmt_ms(rw["p99_ms"]),
            "-" if rw["fps"] is None else f"{rw['fps']:.1f}",
            "-" if rw["memory_mb"] is None else f"{rw['memory_mb']:.1f}",
        ]
        if e2e:
            cells.insert(4, safe(rw["missed"] or "-"))
        if throughput:
            cells.insert(4, "-" if rw.get("requests") is None else str(rw["requests"]))
        rows.append(cells)
    print_table(title, columns, rows, narrow=narrow, wide=wide)
    for p in r["pruned"]:
        console.print(f"[dim]pruned:[/] {safe(p)}", highlight=False)
    for n in r["notes"]:
        console.print(f"[yellow]note:[/] {safe(n)}", highlight=False)
    dc = r["device_class"]
    console.print(
        ("" if dc["same"] else "[yellow]") + safe(dc["reason"]) + ("" if dc["same"] else "[/]"), highlight=False
    )
    if r["winner"] is not None:
        console.print(f"[green]chosen[/] {safe(r['winner']['label'])}", highlight=False)
        console.print(f"applied by --tuned: {safe(r['applied'] or '')}", highlight=False)
    files = r["files"]
    for what in ("overlay", "study", "html", "png"):
        if files.get(what):
            console.print(f"{what}: {safe(files[what])}", highlight=False)
    console.print(safe(r["summary"]), highlight=False)
    console.print(f"{r['converted']} conversions, {r['measured']} measurements in {r['wall_s']:.1f} s", highlight=False)


def _pace(r: dict[str, Any]) -> str:
    """The rate the e2e trials were fed at (the winner's, else any measured trial's)."""
    for trial in [r.get("winner") or {}, *r["trials"]]:
        fps = (trial.get("result") or {}).get("pace_fps")
        if isinstance(fps, (int, float)):
            return f"{fps:.4g} fps"
    return "the target rate"


def tune_cmd(
    model: Path = typer.Argument(..., help="Source model (.onnx)."),
    target: str = typer.Option(..., "--target", "-t", help="Target profile (see `edgekit targets`)."),
    budget_ms: float | None = BudgetMs,
    fps: float | None = Fps,
    objective: str = typer.Option(
        "latency",
        "--objective",
        help=f"{', '.join(OBJECTIVES)} (e2e: the video pipeline over --video, decode to post-processing).",
    ),
    max_trials: int | None = typer.Option(
        None,
        "--max-trials",
        help="Try at most this many configurations (each runner and precision's defaults first).",
        show_default=False,
    ),
    time_budget: float | None = typer.Option(
        None,
        "--time-budget",
        help="Stop converting after this many seconds (what was converted is still measured once), and measuring "
        "further; the best so far wins.",
        show_default=False,
    ),
    calib: str | None = typer.Option(
        None,
        CALIB_FLAG,
        help="Calibration data for int8 (a directory of .npy/.npz/images, or 'random'); without it int8 is left out.",
        show_default=False,
    ),
    video: Path | None = typer.Option(None, "--video", help="Video file for --objective e2e.", show_default=False),
    study: Path | None = typer.Option(
        None,
        "--study",
        help="Study file (JSON of finished trials) to resume from and write to (default: OUT/study.json).",
        show_default=False,
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Output directory: tuned.toml, study.json, pareto.html/png, the conversion cache (default: build/<model>-<target>-tune).",
        show_default=False,
    ),
    strategy: str = typer.Option("halving", "--strategy", help="halving (successive halving) or exhaustive."),
    precision: list[str] | None = typer.Option(
        None, "--precision", "-p", help="Only these precisions (repeatable).", show_default=False
    ),
    runner: list[str] | None = typer.Option(
        None, "--runner", help="Only these runners (repeatable).", show_default=False
    ),
    batch: list[int] | None = typer.Option(
        None,
        "--batch",
        help="Objective throughput: only these batch sizes "
        "(repeatable; default 1, 2, 4, 8 where the model's first input "
        "dimension is a batch).",
        show_default=False,
    ),
    input_shape: list[str] | None = InputShape,
    preprocess: str = Preprocess,
    letterbox: bool | None = Letterbox,
    freeze_input: list[str] | None = FreezeInput,
    parity_data: Path | None = ParityData,
    task: str = Task,
    targets_dir: list[Path] | None = TargetsDir,
    as_json: bool = JsonOut,
    wide: bool = Wide,
) -> None:
    """Find the fastest configuration of MODEL for a target that keeps parity, on this host; write it as an overlay
    for `edgekit convert/deploy --tuned FILE`, with the table and the Pareto front (latency, parity error, size)."""
    from edge.cli.convert import convert_request
    from edge.tune.search import TuneOptions, tune

    request = convert_request(None, calib, input_shape, preprocess, letterbox, freeze_input, targets_dir).replace(
        parity_data=parity_data, task=task
    )
    options = TuneOptions(
        objective=objective,
        strategy=strategy,
        max_trials=max_trials,
        time_budget_s=time_budget,
        video=video,
        study=study,
        out=out,
        runners=runner or None,
        precisions=precision or None,
        budget_ms=budget_ms,
        fps=fps,
        batches=batch or None,
    )
    with steps(not as_json) as say:
        result = tune(model, target, request, options, on_step=say)
    data = result.to_json()
    if as_json:
        print_json(data)
    else:
        render_tune(data, wide=wide)
    reason = result.nothing_converted()
    if reason is not None:  # a bad model is a user error (exit 2), not a verdict on the configurations
        raise ModelError(f"{model.name}: no configuration converted: {reason}")
    if result.winner is None:
        raise typer.Exit(1)
