"""``edgekit run``: a bundle on video frames (file, camera, images, synthetic) through the pipelined runner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from edge.bundle.bundle import Bundle
from edge.cli._common import (
    AllowCpuFallback,
    JsonOut,
    console,
    err_console,
    fallback_options,
    fmt_ms,
    print_json,
    safe,
    threads_line,
)
from edge.cli._common import progress as progress_line
from edge.cli.bench import BudgetMs, Fps, warn_on_reference_check
from edge.errors import EdgeError
from edge.stats import budget_from


def _source_line(s: dict[str, Any]) -> str:
    size = f"{s['width']}x{s['height']}" if s.get("width") else "?"
    bits = [f"{s['kind']} {s['name']}", size]
    if s.get("fps"):
        bits.append(f"{s['fps']:.4g} fps")
    if s.get("frame_count"):
        bits.append(f"{s['frame_count']} frames")
    if s.get("codec") or s.get("backend"):
        bits.append(" ".join(v for v in (s.get("codec"), s.get("backend") and f"via {s['backend']}") if v))
    return ", ".join(bits)


def render_run(r: dict[str, Any]) -> None:
    run = r["runner"]
    f = r["frames"]
    mode = {
        "offline": "offline: every frame, as fast as the pipeline goes",
        "realtime": f"realtime: fed at {r['pace_fps'] or 0:.4g} fps, frames that would be late dropped",
        "live": "live camera: the camera sets the pace, frames that would be late dropped",
        "sequential": "sequential loop (read, pre-process, infer, post-process, repeat)",
    }[r["mode"]]
    t = Table(title=f"run {r['bundle']}", show_header=False)
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    t.add_row("source", _source_line(r["source"]))
    t.add_row("mode", mode + (f"; {r['infer_workers']} inference workers" if r["infer_workers"] > 1 else ""))
    if run:
        t.add_row(
            "runtime",
            f"{run['runtime']} on {run['device_used']}, computing in {run['precision_used']}"
            + (f", {run['threads']} threads" if run.get("threads") else ""),
        )
        if threads_line(run):
            t.add_row("threads", threads_line(run))
    t.add_row("post-processing", r["postprocess"] + (f" -> {r['output']}" if r["output"] else ""))
    drops = ", ".join(f"{k} {v}" for k, v in f["dropped_by_reason"].items() if v)
    declared = f" of {f['declared']} declared" if f.get("declared") is not None and f.get("short_by") else ""
    t.add_row(
        "frames",
        f"in {f['in']}{declared}, processed {f['processed']}, dropped {f['dropped']}"
        + (f" ({drops})" if drops else "")
        + f", late {f['late']}",
    )
    e2e_label = "end-to-end ms (incl. waits in full queues)" if r["mode"] == "offline" else "end-to-end ms"
    for key, label in (("e2e", e2e_label), ("service", "service ms (sum of stages)")):
        s = r[key]
        if s:
            t.add_row(label, f"p50 {fmt_ms(s['p50_ms'])}  p99 {fmt_ms(s['p99_ms'])}  max {fmt_ms(s['max_ms'])}")
    bound = (
        f"; bound {r['bound_fps']:.1f} fps (slowest stage: {r['bottleneck']}), {r['pct_of_bound']:.0f}% of it"
        if r["bound_fps"] and r["mode"] != "sequential"
        else ""
    )
    t.add_row("throughput", f"{r['effective_fps']:.1f} fps over {r['duration_s']:.2f} s{bound}")
    if r.get("waits") and r["mode"] != "sequential":
        t.add_row(
            "threads (waiting)",
            "; ".join(
                f"{name} ({'+'.join(r['threads'].get(name, [name]))}): input {w['input_ms']:.0f} ms, "
                f"hand-over {w['output_ms']:.0f} ms"
                for name, w in r["waits"].items()
            ),
        )
    t.add_row(
        "host", f"{r['cpus']} CPUs" + (f", load average {r['load_avg']:.2f}" if r.get("load_avg") is not None else "")
    )
    if r["budget_ms"] is not None:
        t.add_row(
            "budget",
            f"{r['budget_ms']:.2f} ms ({r['budget_source']}): {f['deadline_misses']} deadline misses of {f['in']} frames",
        )
    colour = {"pass": "green", "fail": "red"}.get(r["verdict"], "yellow")
    t.add_row("verdict", f"[{colour}]{r['verdict']}[/]: {safe(r['summary'])}")
    for note in r.get("notes", []):
        t.add_row("note", f"[yellow]{safe(note)}[/]")
    if r["hung_threads"]:
        t.add_row("threads", f"[red]still running after the join timeout: {safe(', '.join(r['hung_threads']))}[/]")
    console.print(t)
    st = Table(title="per stage (ms a frame)")
    for col in ("stage", "frames", "p50", "p90", "p99", "max", "mean"):
        st.add_column(col, justify="left" if col == "stage" else "right")
    for name, s in r["stages"].items():
        if s:
            cells = (fmt_ms(s[k]) for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms"))
            st.add_row(name, str(s["count"]), *cells)
    console.print(st)


def run_cmd(
    bundle: Path = typer.Argument(..., help="Bundle directory (from `edgekit convert`)."),
    video: Path | None = typer.Option(None, "--video", help="Video file, decoded with OpenCV.", show_default=False),
    camera: int | None = typer.Option(
        None, "--camera", help="Camera index (live: it sets the pace).", show_default=False
    ),
    images: Path | None = typer.Option(
        None, "--images", help="Directory of images, in name order.", show_default=False
    ),
    synthetic: str | None = typer.Option(
        None,
        "--synthetic",
        help="Generated frames of this size, e.g. 640x480 (300 unless --max-frames).",
        show_default=False,
    ),
    fps: float | None = Fps,
    budget_ms: float | None = BudgetMs,
    realtime: bool = typer.Option(
        False, "--realtime", help="Feed frames at the source's fps; drop and count frames that would be late."
    ),
    source_fps: float | None = typer.Option(
        None,
        "--source-fps",
        help="The source's frame rate for --realtime (default: the container's; for images and synthetic frames: --fps).",
        show_default=False,
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Write one JSON line per processed frame.", show_default=False
    ),
    max_frames: int | None = typer.Option(
        None, "--max-frames", "-n", help="Stop after this many frames.", show_default=False
    ),
    duration: float | None = typer.Option(None, "--duration", help="Stop after this many seconds.", show_default=False),
    task: str = typer.Option(
        "auto", "--task", help="Post-processing: auto, classify (top-k), detect (YOLO boxes + NMS) or raw."
    ),
    top_k: int = typer.Option(5, "--top-k", help="Classes per frame for classifiers."),
    conf: float = typer.Option(0.25, "--conf", help="Detection score threshold."),
    iou: float = typer.Option(0.45, "--iou", help="NMS IoU threshold."),
    queue_size: int = typer.Option(2, "--queue-size", help="Frames each queue between stages holds."),
    infer_workers: int | None = typer.Option(
        None,
        "--infer-workers",
        show_default=False,
        help="Parallel inference workers, each with its own runner and a "
        "share of the cores (default: the bundle's tuned workers, from "
        "`edgekit tune --objective e2e`, else 1).",
    ),
    stage_threads: int | None = typer.Option(
        None,
        "--stage-threads",
        show_default=False,
        help="Threads the stages run in: 4 (one each) or 2 (decode + pre-processing, inference + "
        "post-processing); default 2 on a host of 2 CPUs or fewer with one inference worker, else 4.",
    ),
    sequential: bool = typer.Option(False, "--sequential", help="Run the plain loop instead (no pipelining)."),
    warmup: int = typer.Option(3, "--warmup", help="Untimed inferences before the first frame."),
    prompt: str | None = typer.Option(
        None, "--prompt", help="LLM bundles: the prompt; the completion streams to stdout.", show_default=False
    ),
    allow_cpu_fallback: bool = AllowCpuFallback,
    max_tokens: int = typer.Option(64, "--max-tokens", help="LLM bundles: tokens to generate."),
    temperature: float = typer.Option(0.0, "--temperature", help="LLM bundles: sampling temperature (0 = greedy)."),
    as_json: bool = JsonOut,
) -> None:
    """Run a bundle on video frames: decode, pre-process, infer and post-process in a pipeline; report
    per-stage and end-to-end latency, dropped and late frames, effective fps and the verdict.

    For an LLM (GGUF) bundle: stream the completion of --prompt."""
    b = Bundle.open(bundle)
    if b.kind == "llm":
        if prompt is None:
            raise EdgeError(f"{b.id} is a language model: give --prompt TEXT")
        if any(x is not None for x in (video, camera, images, synthetic)):
            raise EdgeError(
                "--video/--camera/--images/--synthetic are for vision bundles; an LLM bundle takes --prompt"
            )
        warn_on_reference_check(b, None)  # the reference pairs, as for vision bundles
        _run_llm(b, prompt, max_tokens, temperature, as_json)
        return
    if prompt is not None:
        raise EdgeError(f"--prompt is for LLM (GGUF) bundles; {b.id} is a {b.info.format} vision bundle")
    from edge.video import PipelineOptions, PostConfig, open_source, run_pipeline, run_sequential

    budget, source_label = budget_from(fps, budget_ms, b.frame_budget_ms)
    options = PipelineOptions(
        realtime=realtime,
        source_fps=source_fps,
        budget_ms=budget,
        budget_source=source_label,
        queue_size=queue_size,
        infer_workers=infer_workers,
        stage_threads=stage_threads,
        max_frames=max_frames,
        duration_s=duration,
        warmup=warmup,
        out=out,
        post=PostConfig(task=task, top_k=top_k, conf=conf, iou=iou),
        runner_options=fallback_options(b.info.runner.name, allow_cpu_fallback) or None,
    )
    with open_source(
        video=video, camera=camera, images=images, synthetic=synthetic, frames=max_frames, fps=source_fps or fps
    ) as source:
        warn_on_reference_check(b, dict(options.runner_options or {}))  # after the source: its errors come first
        run = run_sequential if sequential else run_pipeline
        if as_json:
            report = run(b, source, options)
        else:
            progress_line(f"running {b.id} on {source.info.name} ...")
            with Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[detail]}"),
                TimeElapsedColumn(),
                console=err_console,
                transient=True,
            ) as bar:
                task_id = bar.add_task("frames", total=None, detail="")

                def progress(frames_in: int, processed: int, dropped: int, total: int | None) -> None:
                    bar.update(task_id, completed=processed, total=total, detail=f"in {frames_in}, dropped {dropped}")

                report = run(b, source, options, progress)
    data = report.to_json()
    if as_json:
        print_json(data)
    else:
        render_run(data)
    report.raise_for_failure()
    if report.verdict in ("fail", "incomplete"):  # incomplete: frames lost by the source (the notes say which)
        raise typer.Exit(1)


def _run_llm(b: Bundle, prompt: str, max_tokens: int, temperature: float, as_json: bool) -> None:
    import time

    pieces: list[str] = []
    with b.open_runner() as r:
        start = time.perf_counter()
        first = None
        for piece in r.generate(prompt, max_tokens=max_tokens, temperature=temperature):
            first = first or time.perf_counter()
            pieces.append(piece)
            if not as_json:
                typer.echo(piece, nl=False)
        end = time.perf_counter()
        info = r.info.to_json()
    n = len(pieces)
    ttft = ((first or end) - start) * 1e3
    tps = (n - 1) / (end - first) if first and n > 1 and end > first else None
    if as_json:
        print_json(
            {
                "bundle": b.id,
                "prompt": prompt,
                "text": "".join(pieces),
                "pieces": n,
                "ttft_ms": round(ttft, 2),
                "gen_tps": round(tps, 2) if tps else None,
                "runner": info,
            }
        )
        return
    typer.echo()
    err_console.print(
        f"[dim]{n} pieces, first after {ttft:.0f} ms, {tps or 0:.1f}/s on {safe(info['device_used'])} ({safe(info['precision_used'])})[/]",
        highlight=False,
    )
