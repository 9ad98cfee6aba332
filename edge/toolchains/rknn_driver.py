"""ONNX -> ``.rknn`` inside the ``rknn`` toolchain environment (rknn-toolkit2 + a CPU torch), and the toolkit's
simulator run on the parity samples.

Run by :class:`edge.backends.rknn.convert.OnnxToRKNN` as ``<toolchain>/venv/bin/python rknn_driver.py job.json``.
It must not import ``edge``. Protocol: one JSON object per line on the original stdout (``stage`` | ``result`` |
``error``); whatever the toolkit prints goes to ``convert.log`` in the work directory. The run is offline (the
parent starts it through ``edge.toolchains.offline_popen``).

Steps: ``RKNN.config`` (the target platform; no mean/std: the model takes the same float32 tensors as every other
runtime, normalised by the caller as the manifest's preprocess spec says) -> ``load_onnx`` with the job's static
input shapes -> ``build`` (int8 ``w8a8``: calibrated on the job's samples, written as ``.npy`` files listed in the
toolkit's ``dataset.txt``, one line per sample; fp16: no quantization, the RKNPU computes fp16) ->
``export_rknn`` -> ``init_runtime(target=None)``: the toolkit's SIMULATOR of the NPU on this x86-64 host ->
``inference`` on the parity samples (``simulator_outputs.npz``, stacked per output). The simulator models the
NPU's arithmetic; it is not the NPU, and its outputs are labelled simulated wherever they are reported.
"""

from __future__ import annotations

import json
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

# the drivers' shared output plumbing, beside this file (python -I leaves the script's directory off the path)
sys.path.insert(0, str(Path(__file__).resolve().parent))

from driver_output import Events, redirect_output  # noqa: E402

EVENTS = Events()


emit = EVENTS.emit


stage = EVENTS.stage


class StepFailed(Exception):
    """A toolkit call returned non-zero: the step's name and the toolkit's code."""


def _check(ret: Any, step: str) -> None:
    if ret != 0:
        raise StepFailed(f"rknn-toolkit2 {step} returned {ret} (its log: convert.log)")


def _dataset(job: dict[str, Any], work: Path, names: list[str]) -> str:
    """The calibration samples as ``.npy`` files and the toolkit's ``dataset.txt`` (one sample per line, the
    inputs in the model's order, space-separated)."""
    import numpy as np

    calib_dir = work / "calibration"
    calib_dir.mkdir(exist_ok=True)
    with np.load(job["calibration"]) as data:
        arrays = {n: data[n] for n in names}
    count = len(arrays[names[0]])
    lines = []
    for i in range(count):
        files = []
        for j, n in enumerate(names):
            f = calib_dir / f"{i:04d}_{j}.npy"
            np.save(f, arrays[n][i].reshape(job["inputs"][j]["shape"]).astype(np.float32))
            files.append(str(f))
        lines.append(" ".join(files))
    path = work / "dataset.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _simulate(rknn: Any, job: dict[str, Any], work: Path, names: list[str]) -> dict[str, Any]:
    """The parity samples through the toolkit's simulator; the outputs stacked per output name."""
    import numpy as np

    with np.load(job["samples"]) as data:
        samples = {n: data[n] for n in names}
    count = len(samples[names[0]])
    per_output: list[list[Any]] = []
    for i in range(count):
        feeds = [samples[n][i].reshape(t["shape"]).astype(np.float32) for n, t in zip(names, job["inputs"])]
        fmt = ["nchw" if f.ndim == 4 else None for f in feeds]
        outs = rknn.inference(inputs=feeds, data_format=fmt if any(fmt) else None)
        if outs is None:
            raise StepFailed("rknn-toolkit2 inference on the simulator returned nothing (its log: convert.log)")
        if not per_output:
            per_output = [[] for _ in outs]
        for k, o in enumerate(outs):
            per_output[k].append(np.asarray(o, dtype=np.float32).reshape(job["outputs"][k]["shape"]))
    out_names = [o["name"] for o in job["outputs"]]
    if len(per_output) != len(out_names):
        raise StepFailed(f"the simulator returned {len(per_output)} outputs, the model has {len(out_names)}")
    path = work / "simulator_outputs.npz"
    stacked: dict[str, Any] = {n: np.stack(v) for n, v in zip(out_names, per_output)}
    np.savez(path, **stacked)
    return {"outputs": str(path), "samples": count}


def convert(job: dict[str, Any], work: Path) -> dict[str, Any]:
    from rknn.api import RKNN

    timings: dict[str, float] = {}
    names = [i["name"] for i in job["inputs"]]
    rknn = RKNN(verbose=False)
    try:
        t = time.perf_counter()
        stage(f"configuring rknn-toolkit2 for {job['platform']} ({job['precision']})")
        config: dict[str, Any] = {"target_platform": job["platform"], "optimization_level": 3}
        if job.get("disable_rules"):
            config["disable_rules"] = list(job["disable_rules"])
        if job["precision"] == "int8":
            config.update(quantized_dtype="w8a8", quantized_algorithm=job.get("quantized_algorithm", "normal"))
        _check(rknn.config(**config), "config")
        stage("loading the ONNX model")
        _check(
            rknn.load_onnx(model=job["onnx"], inputs=names, input_size_list=[i["shape"] for i in job["inputs"]]),
            "load_onnx",
        )
        timings["load_s"] = round(time.perf_counter() - t, 2)
        t = time.perf_counter()
        if job["precision"] == "int8":
            stage(f"building: int8 (w8a8), calibrated on {job['calibration_count']} samples")
            _check(rknn.build(do_quantization=True, dataset=_dataset(job, work, names)), "build")
        else:
            stage("building: fp16 (no quantization)")
            _check(rknn.build(do_quantization=False), "build")
        timings["build_s"] = round(time.perf_counter() - t, 2)
        artifact = work / "model.rknn"
        _check(rknn.export_rknn(str(artifact)), "export_rknn")
        t = time.perf_counter()
        stage("running the parity samples on rknn-toolkit2's simulator (not the NPU)")
        _check(rknn.init_runtime(target=None), "init_runtime (simulator)")
        simulated = _simulate(rknn, job, work, names)
        timings["simulator_s"] = round(time.perf_counter() - t, 2)
    finally:
        rknn.release()
    import numpy as np
    import onnx
    import torch

    return {
        "artifact": str(artifact),
        "simulator": simulated,
        "timings": timings,
        "tool_versions": {
            "rknn-toolkit2": _toolkit_version(),
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "numpy": np.__version__,
        },
    }


def _toolkit_version() -> str:
    from importlib.metadata import version

    return version("rknn-toolkit2")


def condensed(e: BaseException, log_text: str) -> dict[str, Any]:
    """One line for the user from an exception the toolkit raised (it wraps its own traceback into the message):
    the innermost exception and, where a graph rule failed, the rule and the toolkit's own workaround."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    last = lines[-1] if lines else type(e).__name__
    if "Traceback" not in str(e):
        last = f"{type(e).__name__}: {' '.join(lines)[:600]}"
    rules = re.findall(r'rules/(\w+)\.py", line \d+, in [\w.]+\._p_(\w+)', str(e))
    suggested = re.findall(r"disable_rules=\['(\w+)'\]", log_text)
    where = f" in its graph rule {rules[-1][1]!r} ({rules[-1][0]})" if rules else ""
    return {"message": f"rknn-toolkit2 failed{where}: {last[:600]}", "rules": sorted(set(suggested))}


def main() -> int:
    job = json.loads(Path(sys.argv[1]).read_text())
    work = Path(job["workdir"])
    EVENTS.stream, log = redirect_output(work)  # noqa: F841 - the log kept open for the run
    try:
        emit("result", **convert(job, work))
        return 0
    except Exception as e:  # noqa: BLE001 - reported to the parent as an event
        traceback.print_exc()
        if isinstance(e, StepFailed):
            emit("error", kind="toolkit", message=str(e)[:1500], rules=[])
            return 1
        text = (work / "convert.log").read_text(encoding="utf-8", errors="replace")
        emit("error", kind="conversion", **condensed(e, text))
        return 1


if __name__ == "__main__":
    sys.exit(main())
