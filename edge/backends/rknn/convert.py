"""ONNX -> ``.rknn`` for a Rockchip NPU with rknn-toolkit2 (in the ``rknn`` toolchain), int8 or fp16.

The toolkit runs in its own environment (``edgekit toolchain install rknn``: it pins numpy 1.26, onnx 1.18 and
protobuf 4, which edgekit's runtimes do not share), driven by ``edge/toolchains/rknn_driver.py``. int8 is the
toolkit's ``w8a8`` quantization, calibrated on the request's samples (edgekit's natural images, matched to the
pre-processing, where the user gives none); fp16 is the NPU's float mode. No mean/std is folded into the model: it
takes the same float32 tensors as every other runtime, normalised by the caller as the manifest's preprocess spec
says (the NPU converts them at its input).

The ``.rknn`` runs only on its NPU (the ``rknn`` runner on the board). On this host the driver runs the parity
samples through the toolkit's SIMULATOR of the NPU; the result carries those outputs as the bundle's host proxy
(:class:`~edge.backends.converter.HostProxy`), labelled simulated (:data:`SIMULATOR_LABEL`) in the manifest and
every report, never as a measurement on the device. The device checks the bundle's reference pairs on first load.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from edge import toolchains
from edge.backends.converter import ConversionRequest, ConversionResult, Converter, HostProxy
from edge.backends.iosidecar import IO_SIDECAR
from edge.backends.rknn.format import ARTIFACT_NAME, FORMAT, SIMULATED_DEVICE, SIMULATOR_LABEL, TOOLCHAIN, write_io
from edge.base.typedjson import Rule, spec
from edge.errors import CalibrationError, ConversionError, ModelError

#: the parity samples the simulator runs (calibration samples first, as the other converters' proxies do)
_PARITY_SAMPLES = 8


@dataclass(frozen=True)
class RKNNConvertOptions:
    """onnx->rknn's options, declared once (``edge.backends.options``)."""

    platform: Literal[
        "rk3588", "rk3576", "rk3566", "rk3568", "rk3562", "rv1103", "rv1106", "rv1103b", "rv1106b", "rk2118"
    ] = spec("rk3588", doc="the Rockchip NPU the .rknn is built for (rknn-toolkit2's target_platform; default rk3588)")
    quantized_algorithm: Literal["normal", "mmse", "kl_divergence"] = spec(
        "normal",
        doc="int8: how rknn-toolkit2 picks activation ranges from the calibration samples: normal (default: "
        "min/max), mmse (slower, often closer) or kl_divergence",
    )
    disable_rules: tuple[str, ...] = spec(
        (),
        doc="graph-optimisation rules rknn-toolkit2 skips (its config's disable_rules): the workaround the toolkit "
        "itself names when one of its rules fails on a model",
        max_items=64,
        item=Rule(pattern=r"^[A-Za-z0-9_]{1,120}$"),
    )
    timeout_s: float = spec(900.0, ge=1, le=86400, doc="stop the toolchain after this many seconds (default 900)")


class OnnxToRKNN(Converter):
    name = "onnx->rknn"
    source_format = "onnx"
    target_format = FORMAT
    precisions = frozenset({"int8", "fp16"})
    calibrated_precisions = frozenset({"int8"})
    toolchain = TOOLCHAIN
    options_class = RKNNConvertOptions

    def convert(self, request: ConversionRequest) -> ConversionResult:
        opts: RKNNConvertOptions = self.read_options(request.options)
        self.check_precision(request.precision)
        st = toolchains.require(TOOLCHAIN, f"converter {self.name!r}")
        io = request.io
        if not all(t.is_static for t in io.inputs) or not all(t.is_static for t in io.outputs):
            raise ModelError(
                f"{request.source.name}: an .rknn needs static shapes; dynamic: "
                + ", ".join(t.name for t in (*io.inputs, *io.outputs) if not t.is_static),
                hint="pass --input-shape NAME=1,3,H,W for every input",
            )
        calibration = _calibration(request)
        inputs, label = _parity_inputs(request, calibration)
        t_start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="edgekit-rknn-") as tmp:
            work = Path(tmp)
            job = _job(request, opts, work, inputs, calibration)
            final, st = toolchains.run_driver(TOOLCHAIN, job, work, timeout_s=opts.timeout_s)
            if final["event"] == "error":
                _raise_driver_error(self.name, final, work, request.source)
            with np.load(final["simulator"]["outputs"]) as data:
                stacked = {k: data[k] for k in data.files}
            artifact = request.workdir / ARTIFACT_NAME
            shutil.move(final["artifact"], artifact)
        sidecar = write_io(
            request.workdir / IO_SIDECAR, io.inputs, io.outputs, platform=opts.platform, precision=request.precision
        )
        versions = final["tool_versions"]
        proxy = HostProxy(
            label=f"{SIMULATOR_LABEL}: rknn-toolkit2 {versions['rknn-toolkit2']}, {opts.platform} {request.precision}",
            precision_used="int8" if request.precision == "int8" else "f16",
            inputs=inputs,
            outputs=[{k: v[i] for k, v in stacked.items()} for i in range(len(inputs))],
            inputs_from=label,
            device_used=SIMULATED_DEVICE,
        )
        recipe = (
            f"w8a8, {opts.quantized_algorithm} ranges from {len(calibration)} calibration samples"
            if request.precision == "int8"
            else "fp16 (no quantization)"
        )
        return ConversionResult(
            artifact=artifact,
            format=FORMAT,
            files=[artifact, sidecar],
            tool_versions={**versions, "toolchain": f"{TOOLCHAIN} (lock {(st.lock_hash or '?')[:12]})"},
            details={
                "recipe": f"ONNX -> rknn-toolkit2 build for {opts.platform}: {recipe}",
                "platform": opts.platform,
                "toolchain": st.manifest_record(),
                "simulator": {"label": SIMULATOR_LABEL, "samples": len(inputs), "inputs": label},
                "timings_s": {**final["timings"], "total": round(time.perf_counter() - t_start, 2)},
            },
            notes=[
                f"the .rknn runs only on a {opts.platform.upper()} NPU (the rknn runner: rknn-toolkit-lite2 and "
                "librknnrt on the board); host parity ran on rknn-toolkit2's simulator (simulated, not the NPU)",
                "pre-processing is not folded in: inputs stay float32 tensors, normalised by the caller as the "
                "manifest's preprocess spec says",
            ],
            proxy=proxy,
        )


def _raise_driver_error(converter: str, final: dict[str, Any], work: Path, source: Path) -> None:
    log = toolchains.keep_log(work, TOOLCHAIN)
    rules = [str(r) for r in final.get("rules", [])]
    raise ConversionError(
        f"{converter} failed on {source.name}: {final['message']}" + (f" (toolchain log: {log})" if log else ""),
        hint=(
            f'the toolkit names its workaround: copy the profile and set [convert.options."{converter}"] '
            f"disable_rules = {json.dumps(rules)}"
            if rules
            else "a model rknn-toolkit2 cannot build: report it with the model, or choose another target"
        ),
    )


def _calibration(request: ConversionRequest) -> list[dict[str, Any]]:
    """int8's calibration samples, each input present with its shape; every problem at once. Empty for fp16."""
    if request.precision != "int8":
        return []
    samples = list(request.calibration.samples) if request.calibration is not None else []
    if not samples:
        raise CalibrationError(
            f"int8 .rknn needs calibration samples for {request.source.name}; none were given",
            hint="pass --calib DIR (images or .npy tensors), or leave it out for edgekit's natural images",
        )
    problems = []
    for t in request.io.inputs:
        shape = tuple(int(d) for d in t.shape)
        bad = [i for i, s in enumerate(samples) if t.name not in s or tuple(np.shape(s[t.name])) != shape]
        if bad:
            problems.append(f"{t.name}: {len(bad)} sample(s) missing or not shaped {list(shape)} (first: #{bad[0]})")
    if problems:
        raise CalibrationError(f"calibration data does not fit {request.source.name}: " + "; ".join(problems))
    return [{k: np.asarray(v, dtype=np.float32) for k, v in s.items()} for s in samples]


def _parity_inputs(
    request: ConversionRequest, calibration: list[dict[str, Any]]
) -> tuple[list[dict[str, np.ndarray]], str]:
    """The inputs the simulator runs: calibration samples, else (fp16) the user's or generated ones."""
    from edge.verify.inputs import generated_samples

    given: list[Any] = list(calibration)
    if not given and request.calibration is not None:
        given = list(request.calibration.samples)
    if given:
        return [{k: np.asarray(v, dtype=np.float32) for k, v in s.items()} for s in given[:_PARITY_SAMPLES]], (
            "calibration"
        )
    return generated_samples(request.io, request.preprocess, _PARITY_SAMPLES, seed=1234), "generated"


def _job(
    request: ConversionRequest,
    opts: RKNNConvertOptions,
    work: Path,
    inputs: list[dict[str, np.ndarray]],
    calibration: list[dict[str, Any]],
) -> dict[str, Any]:
    """The driver's job; the parity samples (and int8's calibration samples) written beside it as .npz."""
    names = [t.name for t in request.io.inputs]
    samples: dict[str, Any] = {n: np.stack([s[n] for s in inputs]) for n in names}  # savez types **arrays as bool
    np.savez(work / "samples.npz", **samples)
    job: dict[str, Any] = {
        "workdir": str(work),
        "onnx": str(Path(request.source).resolve()),
        "platform": opts.platform,
        "precision": request.precision,
        "quantized_algorithm": opts.quantized_algorithm,
        "disable_rules": list(opts.disable_rules),
        "inputs": [{"name": t.name, "shape": [int(d) for d in t.shape]} for t in request.io.inputs],
        "outputs": [{"name": t.name, "shape": [int(d) for d in t.shape]} for t in request.io.outputs],
        "samples": str(work / "samples.npz"),
        "calibration_count": len(calibration),
    }
    if calibration:
        calib: dict[str, Any] = {n: np.stack([s[n] for s in calibration]) for n in names}
        np.savez(work / "calibration.npz", **calib)
        job["calibration"] = str(work / "calibration.npz")
    return job
