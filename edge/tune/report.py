"""What ``edgekit tune`` shows: the table rows, the Pareto front, a self-contained HTML page and a PNG.

The Pareto front is over the trials that passed parity, their own reference check included (a trial eliminated
by the first rung of successive halving before that check ran is left out): a trial is on it when no other trial is at least as
good on latency (p50), parity error (1 - worst output cosine on the reference pairs) and artifact size, and
better on one. The HTML page draws it as inline SVG (no script, no network); the PNG needs matplotlib
(``pip install 'edgekit-ml[tune]'``), imported only here.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Mapping, Sequence


def row(t: Mapping[str, Any]) -> dict[str, Any]:
    """One table row: configuration, status, size, parity, p50/p99, fps, memory; for ``e2e`` also the frames
    missed at the target rate (``missed``: "D dropped + L late / N" per repetition's median)."""
    res = t.get("result") or {}
    par = t.get("parity") or {}
    passed = par.get("passed")
    parity = "pass" if passed is True else "FAIL" if passed is False else "-"
    if par.get("error") is not None:
        parity += f" ({par['error']:.1e})"
    elif passed is True and par.get("trial") is None:  # eliminated before its own reference check ran
        parity += " (gate)"
    size = t.get("size_bytes")
    return {
        "configuration": t.get("label") or t.get("id"),
        "status": t.get("status", ""),
        "size_mb": round(size / 1e6, 2) if isinstance(size, (int, float)) else None,
        "parity": parity,
        "p50_ms": res.get("p50_ms"),
        "p99_ms": res.get("p99_ms"),
        "fps": res.get("fps"),
        "batch": t.get("batch", 1),
        "memory_mb": t.get("memory_mb"),
        "measured": res.get("rung"),
        "dropped": res.get("dropped"),
        "late": res.get("late"),
        "missed": _missed(res),
        "requests": res.get("requests"),
    }


def _missed(res: Mapping[str, Any]) -> str | None:
    if not isinstance(res.get("missed"), int):
        return None
    return f"{res.get('dropped')} dropped + {res.get('late')} late / {res.get('frames')}"


def _metrics(t: Mapping[str, Any]) -> tuple[float, float, float] | None:
    res = t.get("result") or {}
    par = t.get("parity") or {}
    if par.get("passed") is not True or res.get("p50_ms") is None or par.get("trial") is None:
        return None  # (no trial check: eliminated early, its parity error on its own runner options is unknown)
    return float(res["p50_ms"]), float(par.get("error") or 0.0), float(t.get("size_bytes") or 0)


def pareto_front(trials: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The trials that passed parity and that no other such trial dominates (latency, parity error, size)."""
    pts = [(t, m) for t in trials if (m := _metrics(t)) is not None]
    front = []
    for t, m in pts:
        dominated = any(all(o[i] <= m[i] for i in range(3)) and any(o[i] < m[i] for i in range(3)) for _, o in pts)
        if not dominated:
            front.append(t)
    return sorted(front, key=lambda t: _metrics(t)[0])  # type: ignore[index]


def _svg(result: Any, width: int = 640, height: int = 360) -> str:
    pts = [(t, m) for t in result.trials if (m := _metrics(t)) is not None]
    failed = [t for t in result.trials if (t.get("parity") or {}).get("passed") is False and (t.get("result") or {})]
    front = {t["id"] for t in pareto_front(result.trials)}
    xs = [m[0] for _, m in pts] + [float(t["result"]["p50_ms"]) for t in failed if t["result"].get("p50_ms")]
    if not xs:
        return "<p>No trial was measured.</p>"
    sizes = [m[2] for _, m in pts] or [1.0]
    x0, x1 = min(xs) * 0.95, max(xs) * 1.05 or 1.0
    errs = [m[1] for _, m in pts] or [0.0]
    y1 = max(errs) * 1.1 or 1e-6
    pad = 50

    def sx(v: float) -> float:
        return pad + (v - x0) / ((x1 - x0) or 1.0) * (width - 2 * pad)

    def sy(v: float) -> float:
        return height - pad - (v / y1) * (height - 2 * pad)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">',
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="#444"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="#444"/>',
        f'<text x="{width / 2}" y="{height - 12}" text-anchor="middle" font-size="12">p50 latency (ms)</text>',
        f'<text x="14" y="{height / 2}" font-size="12" transform="rotate(-90 14 {height / 2})" '
        'text-anchor="middle">parity error (1 - cosine)</text>',
        f'<text x="{pad}" y="{height - pad + 14}" font-size="10">{x0:.2f}</text>',
        f'<text x="{width - pad}" y="{height - pad + 14}" font-size="10" text-anchor="end">{x1:.2f}</text>',
        f'<text x="{pad - 4}" y="{pad}" font-size="10" text-anchor="end">{y1:.1e}</text>',
    ]
    big = max(sizes) or 1.0
    line = sorted(((sx(m[0]), sy(m[1])) for t, m in pts if t["id"] in front))
    if len(line) > 1:
        out.append(
            '<polyline fill="none" stroke="#1f77b4" stroke-dasharray="4 3" points="'
            + " ".join(f"{x:.1f},{y:.1f}" for x, y in line)
            + '"/>'
        )
    for t, m in pts:
        r = 3 + 7 * (m[2] / big) ** 0.5
        colour = "#1f77b4" if t["id"] in front else "#9bbbd6"
        if t is result.winner:
            colour = "#2ca02c"
        out.append(
            f'<circle cx="{sx(m[0]):.1f}" cy="{sy(m[1]):.1f}" r="{r:.1f}" fill="{colour}" fill-opacity="0.8">'
            f"<title>{html.escape(t.get('label', t['id']))}: p50 {m[0]:.3f} ms, error {m[1]:.2e}, "
            f"{m[2] / 1e6:.2f} MB</title></circle>"
        )
    for t in failed:
        x = sx(float(t["result"]["p50_ms"]))
        out.append(
            f'<text x="{x:.1f}" y="{pad - 8}" font-size="12" fill="#d62728" text-anchor="middle">×'
            f"<title>{html.escape(t.get('label', t['id']))}: failed parity</title></text>"
        )
    out.append("</svg>")
    return "\n".join(out)


def write_html(path: Path, result: Any) -> Path:
    """A self-contained page: what ran where, the winner, the front (inline SVG) and the full table."""
    e = html.escape
    rows = [row(t) for t in result.trials]
    cols = ["configuration", "status", "size_mb", "parity", "p50_ms", "p99_ms", "fps", "memory_mb", "measured"]
    if result.objective == "e2e":
        cols.insert(4, "missed")
    table = "".join(
        "<tr>" + "".join(f"<td>{e('' if r[c] is None else str(r[c]))}</td>" for c in cols) + "</tr>" for r in rows
    )
    win = result.winner
    dc = result.device_class
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>edgekit tune: {e(Path(result.model).name)} for {e(result.target)}</title>",
        "<style>body{font:14px sans-serif;margin:2em}td,th{padding:2px 8px;border-bottom:1px solid #ddd;"
        "text-align:left}.warn{color:#b35900}</style></head><body>",
        f"<h1>edgekit tune: {e(Path(result.model).name)} for {e(result.target)}</h1>",
        f"<p>Objective <b>{e(result.objective)}</b> ({e(result.strategy)}), budget "
        f"{e(f'{result.budget_ms:.2f} ms' if result.budget_ms else 'none')} ({e(result.budget_source)}). "
        f"Host: {e(result.host['os'])}/{e(result.host['arch'])}, {e(result.host['cpu'])}, "
        f"{result.host['cpus']} CPUs.</p>",
        f"<p class='{'' if dc['same'] else 'warn'}'>{e(dc['reason'])}</p>",
        f"<p>Winner: <b>{e(win['label'])}</b> — {e(result.applied or '')}</p>"
        if win
        else "<p class='warn'>No configuration passed parity.</p>",
        "<h2>Pareto front: latency vs parity error (circle area: artifact size; × failed parity)</h2>",
        _svg(result),
        "<h2>Trials</h2><table><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>" + table + "</table>",
        "<h2>Pruned</h2><ul>" + "".join(f"<li>{e(p)}</li>" for p in result.pruned) + "</ul>",
        "</body></html>",
    ]
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def write_png(path: Path, result: Any) -> Path | str:
    """The front as a PNG with matplotlib; without it, the reason (the HTML page has the same picture)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "pareto.png not written: matplotlib is not installed (pip install 'edgekit-ml[tune]'); pareto.html has the same picture"
    pts = [(t, m) for t in result.trials if (m := _metrics(t)) is not None]
    front = pareto_front(result.trials)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    if pts:
        big = max(m[2] for _, m in pts) or 1.0
        ax.scatter(
            [m[0] for _, m in pts],
            [m[1] for _, m in pts],
            s=[20 + 180 * m[2] / big for _, m in pts],
            alpha=0.5,
            label="passed parity (area: size)",
        )
        fm = [_metrics(t) for t in front]
        ax.plot([m[0] for m in fm], [m[1] for m in fm], "--o", color="C0", label="Pareto front")  # type: ignore[index]
        if result.winner is not None and (wm := _metrics(result.winner)) is not None:
            ax.scatter([wm[0]], [wm[1]], s=160, marker="*", color="C2", label=f"chosen: {result.winner['label']}")
    failed = [
        t
        for t in result.trials
        if (t.get("parity") or {}).get("passed") is False and (t.get("result") or {}).get("p50_ms")
    ]
    if failed:
        ax.scatter(
            [t["result"]["p50_ms"] for t in failed],
            [0] * len(failed),
            marker="x",
            color="C3",
            label="failed parity (never chosen)",
        )
    ax.set_xlabel("p50 latency (ms)")
    ax.set_ylabel("parity error (1 - cosine)")
    ax.set_title(f"{Path(result.model).name} for {result.target} ({result.objective})", fontsize=10)
    if ax.get_legend_handles_labels()[0]:  # nothing measured: no legend (matplotlib warns on stderr otherwise)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_pictures(out_dir: Path, result: Any, notes: list[str]) -> None:
    """The Pareto front as ``pareto.html`` and ``pareto.png`` in ``out_dir``, their paths set on ``result``; why
    the PNG is missing (no matplotlib) goes to ``notes``."""
    result.html_path = str(write_html(out_dir / "pareto.html", result))
    png = write_png(out_dir / "pareto.png", result)
    if isinstance(png, Path):
        result.png_path = str(png)
    else:
        notes.append(png)
