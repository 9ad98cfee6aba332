"""``edgekit bench``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from edge.bench import BenchOptions, judge_device_class, run_benchmark
from edge.bundle.bundle import Bundle
from edge.bundle.schema import device_class_of
from edge.cli._common import (
    AllowCpuFallback,
    JsonOut,
    console,
    err_console,
    fallback_options,
    fmt_ms,
    print_json,
    progress,
    safe,
    threads_line,
)
from edge.graph.quantized import int8_report_of, speedup_line
from edge.stats import budget_from

Fps = typer.Option(None, "--fps", help="Frame budget as frames per second (60 -> 16.67 ms).", show_default=False)
BudgetMs = typer.Option(None, "--budget-ms", help="Frame budget in milliseconds.", show_default=False)


def warn_on_reference_check(b: Bundle, options: dict[str, Any] | None) -> None:
    """The bundle's reference pairs run on this device (``edge.verify.refpairs``; once per bundle and device
    when it lies in a device store, which records the result); a failure is one warning line on stderr."""
    from edge.verify.refpairs import check_bundle, describe

    line = describe(check_bundle(b, options or None))
    if line is not None:
        err_console.print(f"[yellow]warning:[/] {safe(line)}", highlight=False, soft_wrap=True)


def render_bench(r: dict[str, Any]) -> None:
    run = r["runner"]
    lat = r["latency"]
    t = Table(title=f"bench {r['bundle']}", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row(
        "runtime",
        f"{run['runtime']} on {run['device_used']}, computing in {run['precision_used']}"
        + (f", {run['threads']} threads" if run.get("threads") else ""),
    )
    if threads_line(run):
        t.add_row("threads", threads_line(run))
    if run.get("fallback"):
        t.add_row("fallback", f"[yellow]{safe(run['fallback'])}[/]")
    t.add_row("load", f"{r['load_ms']:.1f} ms (first inference {r['first_inference_ms']:.2f} ms)")
    t.add_row("iterations", f"{lat['count']} in {r['duration_s']:.2f} s after {r['warmup']} warm-up")
    t.add_row(
        "latency ms",
        f"p50 {fmt_ms(lat['p50_ms'])}  p90 {fmt_ms(lat['p90_ms'])}  p99 {fmt_ms(lat['p99_ms'])}  "
        f"max {fmt_ms(lat['max_ms'])}  mean {fmt_ms(lat['mean_ms'])} ± {fmt_ms(lat['std_ms'])}",
    )
    t.add_row("throughput", f"{r['throughput_fps']:.1f} inferences/s")
    if r.get("int8_speedup_at_build"):
        try:
            t.add_row("int8 vs fp32", safe(speedup_line(r["int8_speedup_at_build"])))
        except (KeyError, TypeError, ValueError):  # a manifest's free-form details: shown when complete
            pass
    t.add_row("peak RSS", f"{r['peak_rss_mb']:.0f} MB (whole process)")
    if r["budget_ms"] is not None:
        colour = "green" if r["verdict"] == "pass" else "red"
        why = (device_class_of(r) or {}).get("reason") or "measured on a fallback device"
        extra = "" if r["on_target_device"] else f" [yellow](indicative only: {safe(why)})[/]"
        t.add_row(
            "budget",
            f"[{colour}]{r['verdict']}[/]: p99 {lat['p99_ms']:.2f} ms vs {r['budget_ms']:.2f} ms ({safe(r['budget_source'])}){extra}",
        )
    console.print(t)


def render_llm_bench(r: dict[str, Any]) -> None:
    run = r["runner"]
    t = Table(title=f"bench {r['bundle']}", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row(
        "runtime",
        f"{run['runtime']} on {run['device_used']} ({run['precision_used']}, {run['threads'] or 'default'} threads)",
    )
    if run.get("fallback"):
        t.add_row("fallback", f"[yellow]{safe(run['fallback'])}[/]")
    if not run["details"].get("amx_extra_buffers", True):
        t.add_row("AMX", f"[yellow]off[/]: {safe(run['details']['amx_probe'])}")
    if run["details"].get("n_ctx_note"):
        t.add_row("context", f"[yellow]{safe(run['details']['n_ctx_note'])}[/]")
    t.add_row("load", f"{r['load_ms']:.1f} ms")
    t.add_row(
        "workload", f"{r['prompt_tokens']} prompt tokens, {r['gen_tokens']} generated, {r['repetitions']} repetitions"
    )
    t.add_row("time to first token", f"{r['ttft_ms']['mean']:.2f} ± {r['ttft_ms']['std']:.2f} ms")
    t.add_row("prompt processing", f"{r['prompt_tps']['mean']:.1f} ± {r['prompt_tps']['std']:.1f} tokens/s")
    t.add_row("generation", f"{r['gen_tps']['mean']:.1f} ± {r['gen_tps']['std']:.1f} tokens/s")
    t.add_row("peak RSS", f"{r['peak_rss_mb']:.0f} MB (whole process)")
    if r["verdict"] != "no budget":
        colour = "green" if r["verdict"] == "pass" else "red"
        t.add_row("budget", f"[{colour}]{r['verdict']}[/] (ttft ≤ {r['ttft_budget_ms']} ms, ≥ {r['min_tps']} tokens/s)")
    console.print(t)


def bench_cmd(
    bundle: Path = typer.Argument(..., help="Bundle directory (from `edgekit convert`)."),
    iterations: int | None = typer.Option(
        None, "--iterations", "-n", help="Timed iterations (default: 200).", show_default=False
    ),
    duration: float | None = typer.Option(
        None, "--duration", help="Run for this many seconds instead.", show_default=False
    ),
    warmup: int = typer.Option(10, "--warmup", help="Untimed iterations first."),
    fps: float | None = Fps,
    budget_ms: float | None = BudgetMs,
    record: bool = typer.Option(False, "--record", help="Store the report in the bundle's manifest."),
    prompt_tokens: int = typer.Option(128, "--prompt-tokens", help="LLM bundles: prompt length."),
    gen_tokens: int = typer.Option(64, "--gen-tokens", help="LLM bundles: tokens generated per repetition."),
    repetitions: int = typer.Option(3, "--repetitions", "-r", help="LLM bundles: repetitions (mean ± std)."),
    ttft_ms: float | None = typer.Option(
        None, "--ttft-ms", help="LLM bundles: time-to-first-token budget.", show_default=False
    ),
    min_tps: float | None = typer.Option(
        None, "--min-tps", help="LLM bundles: minimum generation tokens/s.", show_default=False
    ),
    allow_cpu_fallback: bool = AllowCpuFallback,
    as_json: bool = JsonOut,
) -> None:
    """Benchmark a bundle on this host: load time, p50/p90/p99/max latency, throughput, budget verdict (p99).

    LLM (GGUF) bundles report time to first token, prompt and generation tokens/s instead."""
    b = Bundle.open(bundle)
    if b.kind == "llm":
        from edge.llm.bench import run_llm_benchmark

        warn_on_reference_check(b, None)  # the reference pairs, as for vision bundles
        from edge.backends.llamacpp.run import context_note

        note = context_note(b.artifact, b.info.runner.options_dict)
        if note is not None:  # the profile's n_ctx is longer than this model was trained for
            err_console.print(f"[yellow]note:[/] {safe(note)}", highlight=False, soft_wrap=True)

        if not as_json:
            progress(f"benchmarking {b.id} ...")
        llm_report = run_llm_benchmark(
            lambda **o: b.open_runner(o),
            prompt_tokens=prompt_tokens,
            gen_tokens=gen_tokens,
            repetitions=repetitions,
            ttft_ms=ttft_ms,
            min_tps=min_tps,
            bundle=b.id,
            target=b.target,
        )
        data = llm_report.to_json()
        if record:
            b.record("benchmark", data)
        print_json(data) if as_json else render_llm_bench(data)
        if llm_report.verdict == "fail":
            raise typer.Exit(1)
        return
    budget, source = budget_from(fps, budget_ms, b.frame_budget_ms)
    extra = fallback_options(b.info.runner.name, allow_cpu_fallback)  # refused before any progress line
    warn_on_reference_check(b, extra)  # its own runner: the benchmark's load time stays the load alone
    if not as_json:
        progress(f"benchmarking {b.id} ...")
    from edge.bench import bundle_feeds

    feeds, feeds_from = bundle_feeds(b)  # the reference pairs' input: real shapes and values (a sample rate)
    options = BenchOptions(
        iterations=iterations,
        duration_s=duration,
        warmup=warmup,
        budget_ms=budget,
        budget_source=source,
        bundle=b.id,
        target=b.target,
    )
    report = run_benchmark(lambda: b.open_runner(extra), options, feeds=feeds, feeds_from=feeds_from)
    judge_device_class(report, b.target)  # budget verdict gates only for a benchmark on the target's device class
    data = report.to_json()
    if record:
        b.record("benchmark", data)
    built = (int8_report_of(b.manifest.get("chain") or []) or {}).get("speedup")
    if isinstance(built, dict):  # an int8 bundle whose build timed it against its fp32 source
        data["int8_speedup_at_build"] = built
    if as_json:
        print_json(data)
    else:
        render_bench(data)
    if report.verdict == "fail":
        raise typer.Exit(1)
