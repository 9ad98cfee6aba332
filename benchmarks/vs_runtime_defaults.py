#!/usr/bin/env python3
"""edgekit's default bundle against each host runtime run plainly with its documented defaults (issue #25 item 3).

Per host runtime, the same artifact (the bundle's own file) is run two ways in one process:

  onnxruntime  edgekit: the x86-cpu bundle's runner (edgekit's thread policy: onnxruntime's own defaults where
               nothing else shares the CPUs; the cores other work leaves, spin-wait off where something
               does);  plain: ``onnxruntime.InferenceSession(path)``, nothing set (one thread per physical
               core, pinned, spin-wait on)
  openvino     edgekit: the intel-igpu bundle's runner (GPU absent: CPU; bf16 where the build's bf16 parity
               trial passed, f32 otherwise; threads by the policy, unpinned when shared);  plain:
               ``Core().compile_model(xml, "CPU")`` with no config (the plugin's defaults: LATENCY, bf16 on a
               CPU listing BF16, pinned threads; what benchmark_app gets without -hint/-infer_precision)
               and one ``InferRequest.infer`` per frame
  litert       edgekit: the arm-xnnpack bundle's runner (XNNPack, threads by the policy);  plain:
               ``Interpreter(model_path)`` (XNNPack applied by default, ``num_threads=None``), set_tensor /
               invoke / get_tensor on inputs already in the .tflite's NHWC layout. edgekit's ``infer`` takes
               the ONNX layout (NCHW) and converts; its ``infer_native`` takes what plain takes, and is timed
               too ("native ratio": the inference alone)

in three conditions: idle, with one core kept busy by a child ``python -c 'while 1: pass'``, and
idle->busy: edgekit's runners opened idle, then the child started and ``--follow-s`` (14) seconds of inferences
(a device that turns busy after its runner opened: the runners re-check the load while they run, see
``edge.backends.threads``). In idle and busy each side is opened in its condition (the policy looks at the
machine when a runner is opened, as on a device); plain is always opened in the condition it is timed in.
Timed in blocks interleaved A B, B A, ... (``_common.interleaved``); the conditions alternate round by
round. Reported, one table: per model, runtime and condition, the median latency of each side over all
rounds, the ratio edgekit / plain (goal: <= 1.0) and per round, the ratio of the 90th percentiles, what edgekit chose (threads, spin-wait,
where from), and the load: the 1-minute load average and the cores busy elsewhere edgekit's policy measured
when it opened the runner (the busy child included). ``uptime`` is printed before and after.

Models: the corpus's conv nets (PP-OCR cls and det, ddddocr's YOLOX det; ``tests/support/corpus.py``) and
YOLOv8n-320 (``examples/fetch_pretrained.py --model yolov8n-320``, optional), those present.

    .venv/bin/python benchmarks/vs_runtime_defaults.py --workdir /tmp/vsd            # builds bundles once
    .venv/bin/python benchmarks/vs_runtime_defaults.py --workdir /tmp/vsd --rounds 3 --block 15 --models yolov8n-320 --follow-s 0

With the defaults (2 rounds x 2 blocks of 10, 3 conditions, 4 models, 3 runtimes) it takes about 5
minutes on the 2-core host at load 5 once the bundles exist (3.5 minutes for idle and busy alone).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

MODELS = C.REPO / "examples" / "models"
#: name -> (file, convert keyword arguments)
CONV_NETS: dict[str, tuple[str, dict[str, Any]]] = {
    "ppocr-cls": (
        "ch_ppocr_mobile_v2.0_cls_mobile.onnx",
        {"input_shapes": {"x": (1, 3, 48, 192)}, "preprocess": "ppocr"},
    ),
    "ppocr-det": ("PP-OCRv6_det_small.onnx", {"input_shapes": {"x": (1, 3, 320, 320)}, "preprocess": "ppocr"}),
    "ddddocr-det": ("ddddocr_common_det.onnx", {"preprocess": "raw", "letterbox": True}),
    "yolov8n-320": (
        "nudenet_320n.onnx",
        {"input_shapes": {"images": (1, 3, 320, 320)}, "preprocess": "yolo", "task": "detector"},
    ),
}
#: untimed calls at the start of every block: the first calls after switching sessions pay for the previous one
#: (onnxruntime's intra-op workers keep spinning after a run and compete with the next session's threads on 2 cores).
#: Without them, a side whose block follows its own block in the next round (plain, in A B / B A with 2 rounds)
#: gained over one that always follows the other: identical onnxruntime sessions measured 1.07-1.18 (see _common).
SETTLE = 2
TARGETS = {"onnxruntime": "x86-cpu", "openvino": "intel-igpu", "litert": "arm-xnnpack"}


def plain_side(runtime: str, artifact: Path, feeds: dict[str, np.ndarray]) -> tuple[Callable[[], Any], Any]:
    """(infer, resource) for the runtime with its documented defaults on ``artifact``."""
    if runtime == "onnxruntime":
        import onnxruntime as ort

        sess = ort.InferenceSession(str(artifact), providers=["CPUExecutionProvider"])
        return (lambda: sess.run(None, feeds)), sess
    if runtime == "openvino":
        import openvino as ov

        req = ov.Core().compile_model(str(artifact), "CPU").create_infer_request()
        return (lambda: req.infer(feeds)), req
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(artifact))
    it.allocate_tensors()
    ins = it.get_input_details()
    outs = [d["index"] for d in it.get_output_details()]
    rng = np.random.default_rng(0)
    data = [(d["index"], rng.random(tuple(d["shape"]), dtype=np.float32).astype(d["dtype"])) for d in ins]

    def run() -> list[np.ndarray]:
        for i, x in data:
            it.set_tensor(i, x)
        it.invoke()
        return [it.get_tensor(o) for o in outs]

    return run, it


def artifact_of(bundle: Any, runtime: str) -> Path:
    a = bundle.artifact
    if runtime == "openvino" and a.is_dir():
        return a / "model.xml"
    if runtime == "litert" and a.is_dir():
        return a / "model.tflite"
    return a


class Busy:
    """One core kept busy by a child process while the block runs."""

    def __init__(self, on: bool) -> None:
        self.on, self.proc = on, None

    def __enter__(self) -> Busy:
        if self.on:
            self.proc = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
            time.sleep(0.5)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


def measure(bundle: Any, runtime: str, busy: bool, block: int, blocks: int, runner: Any = None) -> dict[str, Any]:
    """Both sides timed, interleaved. ``runner``: one opened earlier (the turned-busy condition), else edgekit's
    is opened here, in the condition, as the plain side is."""
    from edge.bench import bundle_feeds

    feeds, _ = bundle_feeds(bundle)
    with Busy(busy and runner is None):
        runner = runner or bundle.open_runner()
        try:
            plain, res = plain_side(runtime, artifact_of(bundle, runtime), feeds)
            calls: dict[str, Any] = {"edgekit": (runner.infer, (feeds,)), "plain": (plain, ())}
            if hasattr(runner, "infer_native"):  # LiteRT: the same inference on inputs in the .tflite's layout
                rng = np.random.default_rng(0)
                native = {s.name: rng.random(s.shape, dtype=np.float32).astype(s.dtype) for s in runner.native_inputs}
                calls["native"] = (runner.infer_native, (native,))
            got = C.interleaved(calls, block * blocks, block=block, warmup=5, settle=SETTLE)
            load_1m = os.getloadavg()[0]
            info = runner.info
        finally:
            runner.close()
            del res
    policy = info.details.get("threads_policy", {})
    spinning = None if policy.get("spinning_from") == "runtime" else policy.get("spinning")
    return {
        "edgekit": got["edgekit"],
        "plain": got["plain"],
        "native": got.get("native"),
        "threads": info.threads,
        "threads_from": policy.get("threads_from"),
        "precision": info.precision_used,
        "spinning": spinning,
        "spinning_from": policy.get("spinning_from"),
        "others": policy.get("others"),
        "load_1m": load_1m,
        "replans": len(policy.get("replans") or []),
    }


def follow(runners: dict[tuple[str, str], Any], bundles: dict[tuple[str, str], Any], seconds: float) -> None:
    """``seconds`` of inferences on every runner, round robin: each looks at the load as it would while serving."""
    from edge.bench import bundle_feeds

    feeds = {key: bundle_feeds(b)[0] for key, b in bundles.items()}
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        for key, runner in runners.items():
            runner.infer(feeds[key])


def run_condition(bundles: dict[tuple[str, str], Any], cond: str, args: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """Every (model, runtime) measured in ``cond``: idle, busy (both sides opened with the busy child running),
    or idle->busy (edgekit's runners opened idle, then the child started and ``--follow-s`` of inferences, as a
    device that turns busy after its runner opened; plain opened busy)."""
    if cond != "idle->busy":
        return {key: measure(b, key[1], cond == "busy", args.block, args.blocks) for key, b in bundles.items()}
    opened = {key: b.open_runner() for key, b in bundles.items()}
    with Busy(True):
        follow(opened, bundles, args.follow_s)
        return {
            key: measure(b, key[1], False, args.block, args.blocks, runner=opened[key]) for key, b in bundles.items()
        }


def chose(info: dict[str, Any]) -> str:
    """What edgekit ran with: '2 thr (default), spin on (default), bf16'."""
    spin = {True: "on", False: "off", None: "n/a"}[info["spinning"]]
    where = f" ({info['spinning_from']})" if info["spinning"] is not None else ""
    replans = f", {info['replans']} replan(s)" if info["replans"] else ""
    return f"{info['threads']} thr ({info['threads_from']}), spin {spin}{where}, {info['precision']}{replans}"


def summarise(samples: dict[tuple[str, str, str], dict[str, list]]) -> tuple[list[list[Any]], list[dict[str, Any]]]:
    """(table rows, JSON results) from every round's samples."""
    rows, out = [], []
    for (m, rt, cond), s in samples.items():
        e, q = np.concatenate(s["edgekit"]), np.concatenate(s["plain"])
        ratio = float(np.median(e) / np.median(q))
        # the tail: a runtime's own pinned threads tie in the median with one core busy but not here (OpenVINO)
        p90_ratio = float(np.percentile(e, 90) / np.percentile(q, 90))
        per_round = [float(np.median(a) / np.median(b)) for a, b in zip(s["edgekit"], s["plain"])]
        native = None
        if all(n is not None for n in s["native"]):
            native = float(np.median(np.concatenate(s["native"])) / np.median(q))
        info = s["info"]
        loads = [i["load_1m"] for i in info]
        others = [i["others"] for i in info if i["others"] is not None]
        rows.append(
            [
                m,
                rt,
                cond,
                f"{np.median(e):.2f}",
                f"{np.median(q):.2f}",
                f"{ratio:.2f}",
                " ".join(f"{x:.2f}" for x in per_round),
                f"{p90_ratio:.2f}",
                "-" if native is None else f"{native:.2f}",
                f"{min(loads):.1f}-{max(loads):.1f}",
                f"{min(others):.2f}-{max(others):.2f}" if others else "-",
                " | ".join(dict.fromkeys(chose(i) for i in info)),  # each distinct configuration, in round order
            ]
        )
        out.append(
            {
                "model": m,
                "runtime": rt,
                "condition": cond,
                "edgekit_p50_ms": float(np.median(e)),
                "plain_p50_ms": float(np.median(q)),
                "ratio": ratio,
                "ratio_per_round": per_round,
                "p90_ratio": p90_ratio,
                "native_ratio": native,
                "edgekit": info,
            }
        )
    return rows, out


def main() -> int:
    C.print_measured_on()  # the CPU's ISA class and the load, with every figure
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", required=True, help="bundles are built here once and reused")
    p.add_argument("--models", nargs="*", default=list(CONV_NETS), choices=list(CONV_NETS))
    p.add_argument("--runtimes", nargs="*", default=list(TARGETS), choices=list(TARGETS))
    p.add_argument("--rounds", type=int, default=2, help="rounds; each runs every condition once (default 2)")
    p.add_argument("--block", type=int, default=10, help="inferences per side per block (default 10)")
    p.add_argument("--blocks", type=int, default=2, help="blocks per side per round and condition (default 2)")
    p.add_argument(
        "--follow-s",
        type=float,
        default=14.0,
        help="idle->busy: seconds of inferences after the busy child started, before timing (default 14: the "
        "runners look every 2 s and switch after two looks agree, at least 5 s apart; a runner that spins "
        "while the child starts sees only part of its core at first, so the switch can take two steps: spin-wait "
        "off, then fewer threads); 0 leaves the condition out",
    )
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args()
    work = Path(args.workdir)
    info = C.host_info()
    C.log(C.host_line(info))
    C.log("uptime before: " + subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    bundles: dict[tuple[str, str], Any] = {}
    for m in args.models:
        file, kw = CONV_NETS[m]
        if not (MODELS / file).is_file():
            C.log(f"skip {m}: {file} missing (python examples/fetch_pretrained.py --model {m})")
            continue
        for rt in args.runtimes:
            bundles[(m, rt)] = C.convert_cached(
                MODELS / file, TARGETS[rt], work / f"{m}-{TARGETS[rt]}", reuse=True, parity_samples=8, **kw
            )
    samples: dict[tuple[str, str, str], dict[str, list]] = {}
    conditions = ["idle", "busy"] + (["idle->busy"] if args.follow_s > 0 else [])
    for r in range(args.rounds):
        for cond in conditions if r % 2 == 0 else conditions[::-1]:
            time.sleep(2.5)  # edge.backends.threads reuses a load sample for 2 s: let the last condition's expire
            for (m, rt), got in run_condition(bundles, cond, args).items():
                s = samples.setdefault((m, rt, cond), {"edgekit": [], "plain": [], "native": [], "info": []})
                for side in ("edgekit", "plain", "native"):
                    s[side].append(got.pop(side))
                s["info"].append(got)
    rows, out = summarise(samples)
    order = ["idle", "busy", "idle->busy"]
    rows.sort(key=lambda row: (order.index(row[2]), list(CONV_NETS).index(row[0]), list(TARGETS).index(row[1])))
    after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(
        C.table(
            [
                "model",
                "runtime",
                "cond",
                "edgekit ms",
                "plain ms",
                "ratio",
                "per round",
                "p90 ratio",
                "native ratio",
                "load 1m",
                "busy elsewhere",
                "edgekit ran with",
            ],
            rows,
            title=f"edgekit default vs runtime defaults ({args.rounds} rounds x {args.blocks} blocks of "
            f"{args.block}, interleaved; p50; ratio = edgekit / plain, goal <= 1.0; native ratio: LiteRT's "
            "infer_native, inputs in the .tflite layout as plain's; p90 ratio: of the 90th percentiles over all "
            "rounds (the tail); busy elsewhere: cores, as edgekit's policy "
            "measured them when opening or at its last re-plan, the busy child included; edgekit ran with: "
            "each distinct configuration over the rounds)",
        )
    )
    C.log("uptime after: " + after)
    C.dump_json(args.json, {"host": info, "results": out, "uptime_after": after})
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # numpy's BLAS must not join in
    sys.exit(main())
