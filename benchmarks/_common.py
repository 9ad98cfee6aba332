"""Shared helpers for the scripts in benchmarks/ (not part of the edge package).

* ``workdir(args)``: ``--workdir DIR`` (kept, models/bundles reused by name) or a temp dir (removed);
* ``mobilenet_v2(dir)`` / ``ppocr_cls()``: the two models the benchmarks use;
* ``interleaved(...)``: time several callables in round-robin blocks, rotating the order each
  round (A B, B A, A B ... for two), so drift and background load hit every side alike;
* ``ratio_ci(...)``: bootstrap confidence interval of a ratio of medians over paired rounds;
* ``table(...)``: a plain-text table; ``host_info()``: what the numbers were measured on.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

REPO = Path(__file__).resolve().parent.parent
PPOCR_CLS = REPO / "examples" / "models" / "ch_ppocr_mobile_v2.0_cls_mobile.onnx"


# -- set-up ------------------------------------------------------------------------------


def add_common_args(p: Any, iterations: int) -> None:
    p.add_argument(
        "--iterations",
        "-n",
        type=int,
        default=iterations,
        help=f"timed iterations per side/bundle (default {iterations})",
    )
    p.add_argument(
        "--json",
        metavar="FILE",
        help="also write all results as JSON to FILE ('-': JSON on stdout, the table on stderr)",
    )
    p.add_argument(
        "--workdir",
        metavar="DIR",
        help="build models and bundles here and keep them (default: a temporary directory, removed)",
    )


@contextlib.contextmanager
def workdir(path: str | None) -> Iterator[Path]:
    if path:
        p = Path(path).resolve()
        p.mkdir(parents=True, exist_ok=True)
        yield p
    else:
        with tempfile.TemporaryDirectory(prefix="edgekit-bench-") as tmp:
            yield Path(tmp)


def mobilenet_v2(directory: Path) -> Path:
    """The example MobileNetV2 (deterministic random weights, byte-identical for the same arguments)."""
    from edge.graph.samples import build_mobilenet_v2

    path = directory / "mobilenetv2.onnx"
    if not path.exists():
        build_mobilenet_v2(path)
    return path


def ppocr_cls() -> Path:
    """The pretrained PP-OCR text-direction classifier; fetched with examples/fetch_pretrained.py if missing."""
    if not PPOCR_CLS.exists():
        print(f"{PPOCR_CLS.name} is missing; running examples/fetch_pretrained.py", file=sys.stderr)
        subprocess.run([sys.executable, str(REPO / "examples" / "fetch_pretrained.py")], check=True)
    return PPOCR_CLS


def convert_cached(model: Path, target: str, out: Path, *, reuse: bool, **fields: Any) -> Any:
    """``edge.pipeline.convert`` (force, accept parity failure) of a ``ConvertRequest(**fields)``, or the existing
    bundle when ``reuse``."""
    from edge.bundle.bundle import Bundle
    from edge.pipeline import convert
    from edge.pipeline.request import ConvertRequest

    if reuse and (out / "manifest.json").is_file():
        return Bundle.open(out)
    t0 = time.perf_counter()
    b = convert(model, target, out, ConvertRequest(accept_parity_failure=True, **fields), force=True)
    log(f"  built {out.name} in {time.perf_counter() - t0:.1f} s")
    return b


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- timing ------------------------------------------------------------------------------

Call = tuple[Callable[..., Any], tuple[Any, ...]]  # (function, positional args): timed as fn(*args)


def interleaved(
    calls: Mapping[str, Call], iterations: int, *, block: int = 1, warmup: int = 20, settle: int = 0
) -> dict[str, np.ndarray]:
    """Latency in ms of each call, ``iterations`` samples each, measured in round-robin blocks.

    Round ``r`` runs ``block`` timed calls of each side, in the order of the names rotated by
    ``r`` (two sides: AB, BA, AB, ...). Sample ``i`` of every side therefore comes from the same
    round, so ``a[i] - b[i]`` is a paired difference. Every call is warmed up ``warmup`` times
    first. The garbage collector is off while timing (as in ``timeit``); only ``fn(*args)``
    is inside the timed region, the same way for every side (no lambda or partial layer).
    """
    if iterations < 1 or block < 1:
        raise ValueError("iterations and block must be >= 1")
    names = list(calls)
    for name in names:
        fn, args = calls[name]
        for _ in range(warmup):
            fn(*args)
    out = {n: np.empty(iterations, dtype=np.int64) for n in names}
    clock = time.perf_counter_ns
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        done, r = 0, 0
        while done < iterations:
            k = min(block, iterations - done)
            rot = r % len(names)
            for name in names[rot:] + names[:rot]:
                fn, args = calls[name]
                buf = out[name]
                for _ in range(settle):
                    fn(*args)
                for i in range(done, done + k):
                    t = clock()
                    fn(*args)
                    buf[i] = clock() - t
            done += k
            r += 1
    finally:
        if was_enabled:
            gc.enable()
    return {n: v.astype(np.float64) / 1e6 for n, v in out.items()}


def summary(ms: np.ndarray) -> dict[str, float]:
    from edge.stats import LatencyStats

    return LatencyStats.from_ms(ms).to_json()


def pct(a: float, b: float) -> float:
    """(a / b - 1) * 100"""
    return (a / b - 1.0) * 100.0


def ratio_ci(
    a: np.ndarray, b: np.ndarray, q: float = 50.0, *, n_boot: int = 2000, seed: int = 0, block: int = 1
) -> tuple[float, float]:
    """95% bootstrap interval of (percentile_q(a) / percentile_q(b) - 1) * 100 over paired rounds.

    Resamples whole rounds (``block`` consecutive samples of each side) so the pairing and
    the within-block correlation survive the resampling.
    """
    n = min(len(a), len(b)) // block
    if n < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    A = np.asarray(a[: n * block]).reshape(n, block)
    B = np.asarray(b[: n * block]).reshape(n, block)
    idx = rng.integers(0, n, size=(n_boot, n))
    qa = np.percentile(A[idx].reshape(n_boot, -1), q, axis=1)
    qb = np.percentile(B[idx].reshape(n_boot, -1), q, axis=1)
    lo, hi = np.percentile((qa / qb - 1.0) * 100.0, [2.5, 97.5])
    return float(lo), float(hi)


# -- reporting ---------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, title: str | None = None) -> str:
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    # numbers right-aligned, text left-aligned
    def fmt(row: list[str], header: bool = False) -> str:
        parts = []
        for i, c in enumerate(row):
            numeric = not header and _numeric(c)
            parts.append(c.rjust(widths[i]) if numeric else c.ljust(widths[i]))
        return "  ".join(parts).rstrip()

    lines = []
    if title:
        lines.append(title)
    lines.append(fmt(cells[0], header=True))
    lines.append("  ".join("-" * w for w in widths))
    lines += [fmt(r) for r in cells[1:]]
    return "\n".join(lines)


def _numeric(s: str) -> bool:
    s = s.strip().rstrip("%x").replace("+", "", 1).replace("−", "-")
    try:
        float(s)
        return True
    except ValueError:
        return False


def measured_on() -> str:
    """When, the CPU and its ISA class (AVX2-only, AVX-512 VNNI, AMX, ...), the CPUs and the load averages: printed
    with every figure (``edge.capabilities.measured_on``)."""
    from edge.capabilities import measured_on as line

    return line()


def print_measured_on(stream: Any = None) -> str:
    """Print (to stderr by default: stdout may be JSON) and return the :func:`measured_on` line."""
    line = "measured on " + measured_on()
    print(line, file=stream or sys.stderr, flush=True)
    return line


def host_info() -> dict[str, Any]:
    import edge
    from edge.capabilities import cpu_isa

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "edgekit": edge.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
        info["amx"] = " amx_tile" in flags
    except OSError:
        pass
    info["isa_class"] = cpu_isa().isa_class
    info["measured_on"] = measured_on()
    with contextlib.suppress(OSError):
        info["loadavg_1m"] = os.getloadavg()[0]
    for mod in ("onnxruntime", "openvino"):
        with contextlib.suppress(Exception):
            m = __import__(mod)
            info[mod] = m.__version__ if hasattr(m, "__version__") else m.get_version()
    return info


def host_line(info: Mapping[str, Any]) -> str:
    return (
        f"host: {info.get('cpu', '?')} [{info.get('isa_class', '?')}], {info.get('cpus')} CPUs, "
        f"AMX {'yes' if info.get('amx') else 'no'}, "
        f"load avg {info.get('loadavg_1m', float('nan')):.2f}; edgekit {info.get('edgekit')}, "
        f"onnxruntime {info.get('onnxruntime', '-')}, openvino {str(info.get('openvino', '-')).split('-')[0]}"
    )


def json_to_stdout(args: Any) -> None:
    """With ``--json -`` the JSON owns stdout: send everything else printed to stderr."""
    if getattr(args, "json", None) == "-":
        sys.stdout = sys.stderr


def dump_json(dest: str | None, data: Any) -> None:
    if not dest:
        return
    text = json.dumps(data, indent=2, default=_jsonable)
    if dest == "-":
        print(text, file=sys.__stdout__, flush=True)
    else:
        Path(dest).write_text(text + "\n", encoding="utf-8")
        log(f"wrote {dest}")


def _jsonable(o: Any) -> Any:
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    return str(o)


def f(x: float | None, nd: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.{nd}f}"


def signed(x: float, nd: int = 2, suffix: str = "%") -> str:
    return "-" if np.isnan(x) else f"{x:+.{nd}f}{suffix}"
