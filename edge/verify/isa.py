"""A bundle checked on the device's instruction set: ``edgekit verify BUNDLE --isa aarch64 [--cpu CORE]``.

The bundle's own reference inputs run under user-mode emulation (``edge.toolchains.aarch64``) through the
runner its manifest names, with the real aarch64 runtime wheels: LiteRT/XNNPack and onnxruntime/MLAS pick
their ARM kernels (NEON, dot-product, fp16 arithmetic) exactly as on a Raspberry Pi or a Graviton. The guest
runs edgekit's own runner code from this installation (``edge.verify.isa_guest``: the package is put on the
guest's PYTHONPATH; only the runtime wheels come from the emulated root) and hands back its raw outputs.

The build host then judges them twice, per output:

* against the build host's own runtime on the same inputs (x86 vs ARM): the largest difference must stay
  within :func:`isa_limit` of the output's range. The limits come from the differences measured on the
  conformance corpus (``benchmarks/corpus_aarch64.py``, docs/aarch64.md): float bundles differ by 3e-7 to
  5.2e-5 of the range (the most on probability outputs, whose range is 1: PP-OCR's CTC softmax, 5.2e-5; the
  selfie mask's sigmoid, 2.7e-5), so the limit is 2e-4 of it; int8 bundles differed by nothing measurable, and
  ARM may round a requantisation one step apart (1/255 of the range), so the limit is 1e-2 of it;
* against the reference outputs the bundle carries, with the bundle's own gate
  (:func:`edge.verify.refpairs.check_reference_pairs`, as a device checks on first load).

A Coral bundle (LiteRT with the Edge TPU delegate) is checked on its CPU int8 path while its ``.tflite`` is not
compiled for the Edge TPU yet (XNNPack in place of the delegate, said in the label, :func:`cpu_path`); a compiled
one runs only with the accelerator and is not checked.

The result is the manifest's ``verified_on`` evidence (``edge.bundle.schema.IsaEvidence``), labelled
``emulated``: it proves numerics on the ISA, never speed (emulation is 300-1000x slower than a device).

Signed bundles: the evidence is a manifest field like parity and the benchmark, so a signature covers it.
Recording it changes the manifest, so the old signature (over the manifest without it) is removed
(``Bundle.record``) and the bundle must be signed again (``--key``, or ``edgekit sign``): a separate
unsigned record beside a signed manifest could be swapped or forged; one signature over both cannot.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import math
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from collections import deque
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from edge.backends.runner import RunnerInfo
from edge.base.env import seconds_from_env
from edge.bundle.bundle import Bundle
from edge.errors import BundleError, EdgeError, MissingDependencyError, ParityError
from edge.toolchains import aarch64, aarch64_executorch
from edge.verify.isa_guest import PROGRESS
from edge.verify.refpairs import check_reference_pairs, load_reference_pairs, runner_json

ISAS = (aarch64.ISA,)
#: |ARM - x86| over the output's range, per bundle precision class: the measured worst x 3.8 for float, 2.5
#: requantisation steps for int8 (module docstring, docs/aarch64.md)
FLOAT_LIMIT = 2e-4
INT8_LIMIT = 1e-2
#: below this range an output is compared in absolute terms (a constant output, a mask of zeros)
ABS_FLOOR = 1e-6
_MAX_OUT_BYTES = 64 << 20
#: the guest run's bound once a sample is measured: start-up + BOUND_FACTOR x (seconds per sample) x samples +
#: BOUND_GRACE_S (load on a shared host varies the pace), never over the cap (:func:`isa_timeout_s`)
BOUND_FACTOR = 2.0
BOUND_GRACE_S = 60.0
#: a sample's progress line is said at most this often (the first and the last always): a tiny model's 16
#: samples take a second, a heavy audio model's 30-45 s each
SAY_EVERY_S = 5.0
#: the cap on the whole guest run (``$EDGEKIT_ISA_TIMEOUT_S``), and the only bound until a sample is measured
ISA_TIMEOUT_S = 1800.0
#: what to do when the bound is hit (convert's options; deploy has --no-isa-check too)
_FEWER = (
    "convert with fewer pairs (--parity-samples N: the check runs min(N, 16)), or skip the check with --no-isa-check"
)


def isa_timeout_s() -> float:
    """The most seconds the emulated run may take: ``$EDGEKIT_ISA_TIMEOUT_S``, else :data:`ISA_TIMEOUT_S`."""
    return seconds_from_env("EDGEKIT_ISA_TIMEOUT_S", ISA_TIMEOUT_S)


def parse_progress(line: str) -> tuple[int, int] | None:
    """(samples done, samples in all) from a guest progress line (``edge.verify.isa_guest.progress``), else None."""
    if not line.startswith(PROGRESS):
        return None
    try:
        doc = json.loads(line[len(PROGRESS) :])
        done, of = doc["done"], doc["of"]
    except (ValueError, KeyError, TypeError):
        return None
    ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (done, of)) and 0 <= done <= of
    return (done, of) if ok else None


def run_bound(ready_s: float | None, done: int, done_at_s: float, samples: int, cap_s: float) -> float:
    """Seconds the guest run may take in all: ``cap_s`` until a sample is measured; then its start-up
    (``ready_s``, the runner open) + :data:`BOUND_FACTOR` x the seconds per sample so far x ``samples`` +
    :data:`BOUND_GRACE_S`, never over ``cap_s``. ``done`` samples were computed ``done_at_s`` after the start."""
    if ready_s is None or done <= 0:
        return cap_s
    per = max(done_at_s - ready_s, 0.0) / done
    return min(cap_s, ready_s + BOUND_FACTOR * per * samples + BOUND_GRACE_S)


class GuestWatch:
    """Fed the guest's stderr lines (None: a tick with no line), it says its progress through ``say`` and raises
    :class:`EdgeError` in one line once the run is past :func:`run_bound`."""

    def __init__(
        self, samples: int, cap_s: float, say: Callable[[str], None], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.samples, self.cap_s, self.say, self.clock = samples, cap_s, say, clock
        self.start = clock()
        self.ready_s: float | None = None
        self.done, self.done_at_s, self.said_at_s = 0, 0.0, -math.inf

    def __call__(self, line: str | None) -> None:
        now = self.clock() - self.start
        got = parse_progress(line) if line is not None else None
        if got is not None and got[0] == 0 and self.ready_s is None:
            self.ready_s = now
            self.say(f"emulated aarch64 check: started in {now:.0f} s, {self.samples} samples to run")
        elif got is not None and got[0] > self.done:
            self.done, self.done_at_s = got[0], now
            per = (now - (self.ready_s or 0.0)) / self.done
            left = per * (self.samples - self.done)
            if self.done in (1, self.samples) or now - self.said_at_s >= SAY_EVERY_S:
                self.said_at_s = now
                self.say(
                    f"emulated aarch64 check: sample {self.done} of {self.samples}, ~{left:.0f} s left"
                    " (emulation, not a speed figure)"
                )
        bound = run_bound(self.ready_s, self.done, self.done_at_s, self.samples, self.cap_s)
        if now > bound:
            raise EdgeError(self.stopped(now, bound), hint=_FEWER)

    def stopped(self, now: float, bound: float) -> str:
        """The one line for a run stopped at ``now`` past ``bound``."""
        head = f"emulated aarch64 check stopped after {now:.0f} s with {self.done} of {self.samples} samples done"
        if self.done == 0 or self.ready_s is None:
            return f"{head}: past its cap of {bound:.0f} s before a sample was measured ($EDGEKIT_ISA_TIMEOUT_S)"
        per = (self.done_at_s - self.ready_s) / self.done
        why = (
            "its cap ($EDGEKIT_ISA_TIMEOUT_S)"
            if bound >= self.cap_s
            else (
                f"start-up {self.ready_s:.0f} s + {BOUND_FACTOR:g} x {per:.0f} s per sample x {self.samples}"
                f" + {BOUND_GRACE_S:.0f} s"
            )
        )
        return f"{head} (~{per:.0f} s each): past its bound of {bound:.0f} s ({why})"


def _watched_run(
    em: aarch64.Emulator, args: Sequence[str], pythonpath: tuple[Path, ...], watch: Callable[[str | None], None]
) -> subprocess.CompletedProcess[str]:
    """``em.run(*args)`` with each stderr line handed to ``watch`` as it comes (and ``watch(None)`` every second
    without one); an exception from ``watch`` kills the guest and propagates."""
    with (
        tempfile.TemporaryDirectory(prefix="edgekit-guest-pyc-") as pycache,
        tempfile.TemporaryFile("w+", encoding="utf-8") as out,
    ):
        proc = subprocess.Popen(
            em.command(*args),
            env=em.env(pythonpath, None, pycache),
            stdout=out,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
        )
        lines: queue.Queue[str | None] = queue.Queue()
        tail: deque[str] = deque(maxlen=200)

        def pump() -> None:
            assert proc.stderr is not None
            for ln in proc.stderr:
                lines.put(ln)
            lines.put(None)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            while True:
                try:
                    ln = lines.get(timeout=1.0)
                except queue.Empty:
                    watch(None)
                    continue
                if ln is None:
                    break
                tail.append(ln)
                watch(ln.rstrip("\n"))
            while proc.poll() is None:  # stderr closed, the process not gone yet
                watch(None)
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            reader.join(timeout=5)
        out.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), "".join(tail))


def isa_limit(precision: str, value_range: float) -> float:
    """The largest |ARM - x86| difference an output of ``value_range`` may show in a bundle of ``precision``."""
    rel = INT8_LIMIT if precision.startswith("int8") else FLOAT_LIMIT
    return max(rel * value_range, ABS_FLOOR)


class ReplayRunner:
    """The outputs the guest computed, handed back in order to ``check_reference_pairs`` as if it ran them."""

    def __init__(
        self, inputs: Sequence[Mapping[str, np.ndarray]], outputs: Sequence[dict[str, np.ndarray]], info: RunnerInfo
    ) -> None:
        self._inputs, self._outputs, self.info, self._next = list(inputs), list(outputs), info, 0

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        s = self._next
        if s >= len(self._outputs) or any(not np.array_equal(feeds[k], v) for k, v in self._inputs[s].items()):
            raise EdgeError("the reference check asked for an input the emulated run did not compute")
        self._next += 1
        return self._outputs[s]


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def guest_pythonpath() -> Path:
    """A directory for the guest's PYTHONPATH: ``edge`` (a link to this installation's package, so the guest
    runs this edgekit's runner code) and a dist-info with its entry points (the runner registry reads them).
    One per installation, kept under the toolchain (its compiled modules are then reused run after run)."""
    import edge

    pkg = Path(edge.__file__).resolve().parent
    try:
        eps = md.distribution("edgekit-ml").read_text("entry_points.txt") or ""
    except md.PackageNotFoundError:
        eps = ""
    if "[edgekit.runners]" not in eps:
        raise EdgeError(
            "edgekit's entry points are not installed, so the guest could not find its runners",
            hint="install edgekit (pip install -e .), not just put it on sys.path",
        )
    site = aarch64.toolchain_dir() / "guest" / hashlib.sha256(str(pkg).encode()).hexdigest()[:16]
    site.mkdir(parents=True, exist_ok=True)
    link = site / "edge"
    if os.path.lexists(link) and not link.is_symlink():  # a directory or file planted where the link goes
        raise EdgeError(
            f"{link} is not the link to edgekit's package that verify --isa makes: refusing to run the guest on it",
            hint=f"remove it (rm -r {link}); the next run makes the link again",
        )
    if not (link.is_symlink() and os.readlink(link) == str(pkg)):
        tmp = site / f".edge.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(pkg, target_is_directory=True)
        os.replace(tmp, link)
    info = site / f"edgekit_ml-{edge.__version__}.dist-info"
    for old in site.glob("edgekit_ml-*.dist-info"):
        if old != info:
            shutil.rmtree(old, ignore_errors=True)
    info.mkdir(exist_ok=True)
    _write_atomic(info / "METADATA", f"Metadata-Version: 2.1\nName: edgekit-ml\nVersion: {edge.__version__}\n")
    _write_atomic(info / "entry_points.txt", eps)
    return site


def _guest_run(
    em: aarch64.Emulator, bundle: Bundle, tmp: Path, options: Mapping[str, Any] | None, watch: GuestWatch
) -> tuple[dict[str, Any], Path]:
    out = tmp / "outputs.npz"
    extra = (json.dumps(dict(options)),) if options else ()
    args = ("-m", "edge.verify.isa_guest", str(bundle.path.resolve()), str(out), *extra)
    addon = (aarch64_executorch.guest_site(),) if bundle.info.runner.name == aarch64_executorch.RUNNER else ()
    r = _watched_run(em, args, (guest_pythonpath(), *addon), watch)
    lines = [ln for ln in r.stdout.strip().splitlines() if ln.startswith("{")]
    try:
        result = json.loads(lines[-1]) if lines else {}
    except ValueError:
        result = {}
    if r.returncode != 0 or "error" in result or not out.is_file():
        why = result.get("error") or (
            f"killed by signal {-r.returncode}"
            if r.returncode < 0
            else f"exit code {r.returncode}: " + ((r.stderr.strip().splitlines() or ["no output"])[-1][:300])
        )
        raise EdgeError(f"bundle {bundle.id} did not run on emulated {em.cpu}: {why}")
    return result, out


def _read_outputs(path: Path, bundle: Bundle, samples: int) -> list[dict[str, np.ndarray]]:
    """The guest's outputs, checked against the bundle's I/O spec (sizes bounded, no pickles)."""
    if path.stat().st_size > _MAX_OUT_BYTES:
        raise BundleError(f"{path}: the emulated run wrote over {_MAX_OUT_BYTES >> 20} MiB")
    specs = list(bundle.io.outputs)
    outs: list[dict[str, np.ndarray]] = [{} for _ in range(samples)]
    with np.load(path, allow_pickle=False) as npz:
        if set(npz.files) != {f"o{s}_{k}" for s in range(samples) for k in range(len(specs))}:
            raise EdgeError(
                f"the emulated run returned {sorted(npz.files)[:8]}, not {samples} samples of {len(specs)} outputs"
            )
        for s in range(samples):
            for k, t in enumerate(specs):
                outs[s][t.name] = npz[f"o{s}_{k}"]
    return outs


def _figure(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def per_output(
    bundle: Bundle,
    reference: Sequence[Mapping[str, np.ndarray]],
    arm: Sequence[Mapping[str, np.ndarray]],
    host: Sequence[Mapping[str, np.ndarray]],
    gate: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """Per output: the largest |``arm`` - ``host``| over the samples, the ``reference`` outputs' range (max - min)
    and the limit from it, and the bundle gate's figures against the reference (``gate``'s outputs)."""
    by_name = {o.get("name"): o for o in gate.get("outputs") or []}
    out = []
    for t in bundle.io.outputs:
        n = t.name
        if any(np.shape(a[n]) != np.shape(h[n]) for a, h in zip(arm, host)):
            diff = math.inf
        else:
            diff = max(
                float(np.max(np.abs(np.asarray(a[n], np.float64) - np.asarray(h[n], np.float64)), initial=0.0))
                for a, h in zip(arm, host)
            )
        ref = [np.asarray(r[n], np.float64) for r in reference if np.size(r[n])]
        rng = float(max(r.max() for r in ref) - min(r.min() for r in ref)) if ref else 0.0
        limit = isa_limit(bundle.precision, rng)
        g = by_name.get(n, {})
        out.append(
            {
                "name": n,
                "max_abs_vs_host": diff if math.isfinite(diff) else 3.4e38,
                "range": rng,
                "limit": limit,
                "passed": diff <= limit,
                "cosine": _figure(g.get("cosine")),
                "max_abs": _figure(g.get("max_abs")),
                "snr_db": _figure(g.get("snr_db")),
            }
        )
    return out


def cpu_path(bundle: Bundle) -> tuple[dict[str, Any] | None, str]:
    """Runner options for the emulated run, and what they change for the label: none for a CPU bundle; for a Coral
    bundle whose .tflite is not compiled for the Edge TPU yet, its CPU int8 path (XNNPack in place of the Edge TPU
    delegate, which emulation cannot have). A compiled one cannot run without the accelerator: an error."""
    if str(bundle.info.runner.options_dict.get("delegate", "")).lower() != "edgetpu":
        return None, ""
    compiled = any((c.get("details") or {}).get("edgetpu_compiled") for c in bundle.manifest.get("chain") or [])
    if compiled or bundle.info.primary_artifact.endswith("_edgetpu.tflite"):
        raise EdgeError(
            f"bundle {bundle.id} is compiled for the Edge TPU: it runs only with the accelerator, which emulation does not have",
            hint="check the bundle before `edgekit finish` compiles it",
        )
    return {"delegate": "xnnpack"}, ", CPU int8 path (XNNPack in place of the Edge TPU)"


def verify_isa(
    bundle_path: str | os.PathLike[str],
    *,
    isa: str = aarch64.ISA,
    cpu: str = aarch64.DEFAULT_CPU,
    record: bool = True,
    timeout_s: float | None = None,
    on_step: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run ``bundle_path``'s reference pairs on emulated ``isa``/``cpu``, judge them (module docstring) and, with
    ``record``, put the evidence in the manifest's ``verified_on`` (replacing one for the same ISA and core; a
    signature is removed: sign again). ``on_step`` hears the guest's progress (a line per sample, with an
    estimate); the run is bounded by :func:`run_bound`, at most ``timeout_s`` (default :func:`isa_timeout_s`). Returns the evidence (``IsaEvidence`` as JSON). A bundle that cannot run
    there is an :class:`EdgeError`; one that runs and differs is evidence with ``passed`` False."""
    if isa not in ISAS:
        raise EdgeError(f"unknown instruction set {isa!r}; edgekit checks: {', '.join(ISAS)}")
    bundle = Bundle.open(bundle_path)
    if bundle.kind != "vision":
        raise EdgeError(
            f"bundle {bundle.id} is a language model: its aarch64 runtime (llama.cpp) has no wheel to emulate",
            hint="see docs/aarch64.md: what llama.cpp on aarch64 would need",
        )
    entry = bundle.info.reference_pairs
    if entry is None or entry.file is None:
        raise EdgeError(
            f"bundle {bundle.id} carries no reference pairs to run on {isa}",
            hint="rebuild it with `edgekit convert` (it writes them by default)",
        )
    options, path = cpu_path(bundle)
    em = aarch64.require().with_cpu(cpu)
    if bundle.info.runner.name == aarch64_executorch.RUNNER and not aarch64_executorch.status().usable:
        raise MissingDependencyError(f"bundle {bundle.id} runs on ExecuTorch: {aarch64_executorch.status().problem}")
    pairs = load_reference_pairs(bundle.path, entry, bundle.io)
    with tempfile.TemporaryDirectory(prefix="edgekit-isa-") as tmp:
        watch = GuestWatch(len(pairs.inputs), timeout_s or isa_timeout_s(), on_step or (lambda _msg: None))
        guest, out = _guest_run(em, bundle, Path(tmp), options, watch)
        arm = _read_outputs(out, bundle, len(pairs.inputs))
    info = RunnerInfo(
        **{
            k: guest["runner"][k]
            for k in ("runtime", "device_requested", "device_used", "precision_used", "threads", "fallback")
        }
    )
    gate = check_reference_pairs(bundle, ReplayRunner(pairs.inputs, arm, info))
    host, host_info = _host_outputs(bundle, options, pairs.inputs)
    outputs = per_output(bundle, pairs.outputs, arm, host, gate)
    failures = [
        f"{o['name']}: |{isa} - x86| {o['max_abs_vs_host']:.3g} > {o['limit']:.3g}" for o in outputs if not o["passed"]
    ] + [f"reference check: {f}" for f in gate.get("failures") or []]
    state = aarch64.read_state() or {}
    evidence = {
        "isa": isa,
        "cpu": cpu,
        "emulated": True,
        "label": f"checked on {isa} (emulated {cpu})" + path,
        "runtime": info.runtime,
        "device_used": info.device_used,
        "host_runtime": host_info["runtime"],
        "samples": len(pairs.inputs),
        "passed": not failures and gate.get("passed") is not False,
        "checked_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "emulator": f"qemu-aarch64 {state.get('qemu', {}).get('version', '?')}",
        "cpu_part": guest.get("cpu_part"),
        "versions": guest.get("versions") or {},
        "reference_check": gate.get("passed"),
        "outputs": outputs,
        "failures": failures[:64],
        "toolchain_lock_hash": state.get("lock_hash"),
    }
    if guest.get("machine") != "aarch64":
        raise EdgeError(f"the emulated run reports machine {guest.get('machine')!r}, not aarch64")
    if record:
        kept = [e for e in bundle.manifest.get("verified_on") or [] if (e.get("isa"), e.get("cpu")) != (isa, cpu)]
        bundle.record("verified_on", [*kept, evidence][-8:])
    return evidence


def _host_outputs(
    bundle: Bundle, options: Mapping[str, Any] | None, inputs: Sequence[Mapping[str, np.ndarray]]
) -> tuple[list[dict[str, np.ndarray]], dict[str, Any]]:
    """The bundle's reference inputs through its runner on this x86 host: here, or (an executorch bundle, whose
    runtime lives in the executorch toolchain) the same guest module run natively with that toolchain's Python."""
    if bundle.info.runner.name != aarch64_executorch.RUNNER:
        with bundle.open_runner(options) as runner:
            return [runner.infer(feeds) for feeds in inputs], runner_json(runner)
    from edge import toolchains

    py = aarch64_executorch.host_python(toolchains.require("executorch", "the x86 side of the executorch check"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(guest_pythonpath())
    with tempfile.TemporaryDirectory(prefix="edgekit-isa-host-") as tmp:
        out = Path(tmp) / "outputs.npz"
        cmd = [str(py), "-m", "edge.verify.isa_guest", str(bundle.path.resolve()), str(out)]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=isa_timeout_s())
        lines = [ln for ln in r.stdout.strip().splitlines() if ln.startswith("{")]
        result = json.loads(lines[-1]) if lines else {}
        if r.returncode != 0 or "error" in result or not out.is_file():
            why = result.get("error") or (r.stderr.strip().splitlines() or ["no output"])[-1][:300]
            raise EdgeError(f"bundle {bundle.id} did not run on this host's ExecuTorch runtime: {why}")
        return _read_outputs(out, bundle, len(inputs)), result["runner"]


def describe(evidence: Mapping[str, Any]) -> str:
    """One line: "checked on aarch64 (emulated cortex-a76): pass, max |ARM - x86| 3.1e-07 of range (logits)"."""
    outs = evidence.get("outputs") or []
    worst = max(outs, key=lambda o: o["max_abs_vs_host"] / max(o["range"], ABS_FLOOR), default=None)
    fig = (
        ""
        if worst is None
        else (
            f", max |{evidence['isa']} - x86| {worst['max_abs_vs_host']:.2g} (limit {worst['limit']:.2g}, {worst['name']})"
        )
    )
    verdict = "pass" if evidence.get("passed") else "FAIL: " + "; ".join(evidence.get("failures") or [])[:300]
    return f"{evidence['label']}: {verdict}{fig}"


#: runners whose aarch64 runtime the toolchain carries (wheels), so a bundle for them can run emulated
EMULATED_RUNNERS = ("litert", "onnxruntime")


def isa_for(bundle: Bundle, profile: Any) -> tuple[str | None, str]:
    """The ISA to check ``bundle`` (built for ``profile``) on, or None with the reason it is not checked (empty
    when the target's devices are not aarch64)."""
    archs = tuple(getattr(getattr(profile, "device_class", None), "arch", ()) or ())
    if aarch64.ISA not in archs:
        return None, ""  # the build host's own ISA family, or one edgekit does not emulate: nothing to say
    if bundle.kind != "vision":
        return None, "a language model: llama.cpp has no aarch64 wheel to emulate (docs/aarch64.md)"
    runner = bundle.info.runner
    if runner.name == aarch64_executorch.RUNNER:
        st = aarch64_executorch.status()
        if not st.usable:
            return None, st.problem or f"toolchain {aarch64_executorch.NAME!r} is not usable"
    elif runner.name not in EMULATED_RUNNERS:
        return None, f"the {runner.name} runtime has no aarch64 wheel in the emulator"
    try:
        cpu_path(bundle)
    except EdgeError:
        return None, "compiled for the Edge TPU, which emulation does not have"
    if bundle.info.reference_pairs is None or bundle.info.reference_pairs.file is None:
        return None, "the bundle carries no reference pairs"
    return aarch64.ISA, ""


def check_after_convert(
    bundle: Bundle,
    profile: Any,
    *,
    enabled: bool = True,
    accept_failure: bool = False,
    cpu: str = aarch64.DEFAULT_CPU,
    on_step: Callable[[str], None] | None = None,
) -> tuple[str, dict[str, Any] | None]:
    """What ``convert``/``deploy`` do for a bundle whose devices are aarch64: the reference pairs on emulated
    ``cpu`` when the toolchain is installed, recorded in the manifest. Returns the report's line ("checked on
    aarch64 (emulated cortex-a76): pass ..." or why not; empty for a target whose devices are not aarch64) and the
    evidence (``on_step`` hears the guest's progress). A failed check raises
    :class:`~edge.errors.ParityError` unless ``accept_failure``."""
    isa, why = isa_for(bundle, profile)
    if isa is None:
        return (f"not checked on aarch64: {why}" if why else ""), None
    if not enabled:
        return f"not checked on {isa}: skipped (--no-isa-check)", None
    st = aarch64.status()
    if not st.usable:
        return f"not checked on {isa}: {st.problem}", None
    evidence = verify_isa(bundle.path, isa=isa, cpu=cpu, on_step=on_step)
    line = describe(evidence)
    if not evidence["passed"] and not accept_failure:
        raise ParityError(
            f"bundle {bundle.id}: {line}",
            hint="it computes differently on the device ISA; --accept-parity-failure ships it anyway, --no-isa-check skips the check",
        )
    return line, evidence
