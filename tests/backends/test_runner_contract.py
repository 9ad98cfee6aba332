"""The runner contract, one suite for every runner registered in ``edge.backends.registry``.

The runner list comes from the registry (entry points, built-in or plugin), so a new runner is
tested as soon as it is registered: a real bundle of a tiny model is converted for the first
shipped target profile that uses it (vision chain, or the ``[llm]`` table for GGUF runners) and
opened the way ``edgekit bench`` opens one (``Bundle.open_runner``). Every runner must then:

* report the device and the precision it actually uses (``info``), consistent with the runtime;
* describe the manifest's I/O spec (``inputs``/``outputs``) and infer on feeds built from it,
  returning every declared output in its declared dtype and shape;
* refuse a wrong shape, a wrong dtype, a missing or an unknown input with an ``EdgeError`` that
  names the input and what was expected, and keep working afterwards;
* close (directly or on leaving ``with``) and refuse to infer after it.

A runner this host cannot run (TensorRT without an NVIDIA GPU, Core ML off macOS) must refuse to
load with the requirements it declares, and its tests skip with exactly those reasons
("hardware: ..." when an OS/arch/GPU requirement is unmet, as tests/conftest.py expects).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import pytest

from edge.backends.runner import RUNNERS, Runner
from edge.bundle.bundle import Bundle
from edge.capabilities import current_host
from edge.errors import EdgeError
from edge.pipeline import conversion_problems, convert, runnable_here
from edge.pipeline.request import ConvertRequest
from edge.spec import TensorSpec
from edge.targets import TargetProfile, load_targets

RUNNER_NAMES = RUNNERS.names()
_HARDWARE_KINDS = ("os", "arch", "nvidia-gpu")
_DYNAMIC_DIM = 8  # the size given to a dynamic dim ("n" tokens of an LLM)


@dataclass(frozen=True)
class Case:
    runner: str
    target: TargetProfile
    bundle: Bundle

    @property
    def llm(self) -> bool:
        return self.bundle.kind == "llm"


def _candidates(name: str) -> list[tuple[TargetProfile, bool]]:
    """(profile, is_llm) for every shipped profile that uses runner ``name``; the ones this host runs first."""
    found = [(t, False) for t in load_targets().values() if t.runner == name]
    found += [(t, True) for t in load_targets().values() if t.llm is not None and t.llm.runner == name]

    def blocked(c: tuple[TargetProfile, bool]) -> bool:
        t, llm = c
        return (not t.run_place.allows(current_host())) if llm else runnable_here(t) is not None

    return sorted(found, key=lambda c: (blocked(c), c[0].name))


def _skip_unavailable(name: str, tmp: Path) -> None:
    """A runner whose declared requirements are unmet must refuse to load naming each of them; then skip."""
    cls = RUNNERS.get(name)
    unmet = [r for r in cls.requires if r.problem() is not None]
    if not unmet:
        return
    reasons = [r.problem() for r in sorted(unmet, key=lambda r: r.kind not in _HARDWARE_KINDS)]
    with pytest.raises(EdgeError) as err:
        cls(tmp / f"model.{cls.formats[0]}")
    missing = [r for r in reasons if r not in str(err.value)]
    assert not missing, f"runner {name!r} refused to load without naming {missing}: {err.value}"
    hardware = any(r.kind in _HARDWARE_KINDS for r in unmet)
    pytest.skip(("hardware: " if hardware else "") + "; ".join(reasons) + f" (runner {name!r})")


@pytest.fixture(scope="module", params=RUNNER_NAMES)
def case(request: pytest.FixtureRequest, models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Case:
    """A bundle for the runner, converted once per module: the two-input/two-output model, or a tiny GGUF."""
    name: str = request.param
    tmp = tmp_path_factory.mktemp(f"contract-{name}")
    _skip_unavailable(name, tmp)
    candidates = _candidates(name)
    if not candidates:
        pytest.fail(
            f"runner {name!r} is registered but no target profile uses it: ship one (targets/*.toml) "
            "so the contract suite can build a bundle for it"
        )
    target, llm = candidates[0]
    if llm:
        from edge.backends.llamacpp.samples import build_tiny_llama

        precision = "q8_0" if "q8_0" in target.llm.precisions else target.llm.default_precision
        bundle = convert(
            build_tiny_llama(tmp / "tiny-f16.gguf"), target, tmp / "bundle", ConvertRequest(precision=precision)
        )
    else:
        blocked = runnable_here(target) or "; ".join(conversion_problems(target))
        if blocked:
            # the runner's own requirements are met (_skip_unavailable): a target that runs only on its device
            # (Ethos-U's /dev/ethosu0), an NVIDIA GPU or another OS/arch lacks hardware here, not an install
            place = target.run_place
            hardware = runnable_here(target) is not None and (
                place.needs_device or place.needs_gpu or not place.allows(current_host())
            )
            pytest.skip(
                ("hardware: " if hardware else "")
                + f"runner {name!r}: no target using it converts and runs on this host ({target.name}: {blocked})"
            )
        precision = "fp32" if "fp32" in target.precisions else target.default_precision
        bundle = convert(
            _two_input_source(target, models["two_input"], tmp),
            target,
            tmp / "bundle",
            ConvertRequest(
                precision=precision,
                preprocess="none",
                calib=None if precision == "fp32" else "random",
                input_shapes=_TWO_INPUT_SHAPES,  # a PyTorch source names its inputs' shapes; ONNX carries them
            ),
        )
    assert bundle.manifest["runner"]["name"] == name
    return Case(name, target, bundle)


#: the two-input/two-output model as a torch.export program (``image`` [1, 3, 16, 16] and ``scale`` [1, 4] ->
#: features [1, 4], embedding [1, 8]), for a target whose chain takes PyTorch programs only (executorch-xnnpack)
_TWO_INPUT_SHAPES = {"image": (1, 3, 16, 16), "scale": (1, 4)}
_TWO_INPUT_PT2 = """
import sys, torch
class TwoInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.embedding = torch.nn.Linear(4, 8)
    def forward(self, image, scale):
        features = torch.relu(self.conv(image)).mean((2, 3)) * scale
        return features, self.embedding(features)
torch.manual_seed(0)
example = (torch.randn(1, 3, 16, 16), torch.randn(1, 4))
torch.export.save(torch.export.export(TwoInput().eval(), example), sys.argv[1])
"""


def _two_input_source(target: TargetProfile, onnx_model: Path, tmp: Path) -> Path:
    """The two-input model in the format the target's chain reads: the ONNX file, or (a chain that reads PyTorch
    programs) the same network exported with torch.export in that converter's toolchain."""
    import subprocess

    from edge import toolchains
    from edge.backends.converter import CONVERTERS

    first = CONVERTERS.get(target.chain[0].converter) if target.chain else None
    if first is None or first.source_format == "onnx" or first.toolchain is None:
        return onnx_model
    out = tmp / "two_input.pt2"
    python = toolchains.require(first.toolchain, "the contract's PyTorch model").venv / "bin" / "python"
    subprocess.run([str(python), "-c", _TWO_INPUT_PT2, str(out)], check=True, timeout=300)
    return out


@pytest.fixture
def runner(case: Case) -> Iterator[Runner]:
    with case.bundle.open_runner() as r:
        yield r


# -- feeds built from a spec ------------------------------------------------------------------


def _concrete(shape: tuple[int | str, ...]) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) and d > 0 else _DYNAMIC_DIM for d in shape)


def _array(t: TensorSpec, shape: tuple[int, ...], dtype: Any, seed: int = 0) -> np.ndarray:
    dt = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    if dt.kind in "iu":
        return rng.integers(0, 16, shape).astype(dt)  # small: valid token ids, indices, class ids
    return np.zeros(shape, dt)


def feeds_for(specs: tuple[TensorSpec, ...], seed: int = 0) -> dict[str, np.ndarray]:
    return {t.name: _array(t, _concrete(t.shape), t.dtype, seed) for t in specs}


def _dims(shape: tuple[int | str, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _wrong_shape(shape: tuple[int | str, ...]) -> tuple[int, ...]:
    """The last static dim one larger; an all-dynamic shape gets an extra dim instead."""
    dims = list(_concrete(shape))
    static = [i for i, d in enumerate(shape) if isinstance(d, int) and d > 0]
    if not static:
        return (*dims, 2)
    dims[static[-1]] += 1
    return tuple(dims)


def _wrong_dtype(dtype: str) -> np.dtype:
    return np.dtype(np.float32 if np.dtype(dtype) == np.float64 or np.dtype(dtype).kind != "f" else np.float64)


def _key(specs: tuple[TensorSpec, ...]) -> list[tuple[str, tuple[int | str, ...], str]]:
    return [(t.name, tuple(t.shape), np.dtype(t.dtype).name) for t in specs]


def _check_outputs(out: Mapping[str, np.ndarray], specs: tuple[TensorSpec, ...]) -> None:
    assert sorted(out) == sorted(t.name for t in specs)
    for t in specs:
        y = out[t.name]
        assert isinstance(y, np.ndarray), (t.name, type(y))
        assert y.dtype == np.dtype(t.dtype), f"output {t.name!r}: dtype {y.dtype}, declared {t.dtype}"
        assert len(y.shape) == len(t.shape) and all(
            not (isinstance(d, int) and d > 0) or g == d for g, d in zip(y.shape, t.shape)
        ), f"output {t.name!r}: shape {y.shape}, declared {t.shape}"
        if y.dtype.kind == "f":
            assert np.isfinite(y).all(), t.name


# -- what the runtime itself says, beside what info says (optional, per runner) ----------------
# Private handles on purpose: these ask the runtime directly instead of trusting the runner.


def _ort_view(r: Any) -> dict[str, str]:
    return {"device_used": r._session.get_providers()[0]}


def _openvino_view(r: Any) -> dict[str, str]:
    return {
        "device_used": ",".join(r._compiled.get_property("EXECUTION_DEVICES")),
        "precision_used": r._compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name(),
    }


def _litert_view(r: Any) -> dict[str, str]:
    from edge.backends.litert.run import delegation

    took = delegation(r._it)["delegated_ops"]
    return {"device_used": "CPU (XNNPack)" if took else "CPU (builtin kernels)"}


def _llamacpp_view(r: Any) -> dict[str, str]:
    from edge.backends.llamacpp.format import read_gguf

    return {"precision_used": read_gguf(r.artifact).dominant_type.lower()}


RUNTIME_VIEW: dict[str, Callable[[Any], dict[str, str]]] = {
    "onnxruntime": _ort_view,
    "openvino": _openvino_view,
    "litert": _litert_view,
    "llama.cpp": _llamacpp_view,
}


def _fp32_computes_in(case: Case, runner: Any) -> str:
    """An fp32 bundle computes in f32, except where its parity in bf16 passed at build time (issue #25: the
    OpenVINO bundle then carries ``inference_precision = "fast"``) and this CPU's plugin lists BF16."""
    if case.runner == "openvino" and case.bundle.info.runner.options_dict.get("inference_precision") == "fast":
        import openvino as ov

        from edge.backends.openvino.run import fast_cpu_precision, optimization_capabilities

        if runner.info.device_used == "CPU":
            return fast_cpu_precision(optimization_capabilities(ov.Core(), "CPU"))
    return "f32"


# -- the contract -----------------------------------------------------------------------------


def test_loads_and_reports_device_and_precision(case: Case, runner: Runner) -> None:
    assert isinstance(runner, Runner) and runner.name == case.runner
    info = runner.info
    for field in ("runtime", "device_requested", "device_used", "precision_used"):
        value = getattr(info, field)
        assert isinstance(value, str) and value.strip() and value != "unknown", (field, value)
    assert info.fallback is None or (isinstance(info.fallback, str) and info.fallback.strip())
    json.dumps(info.to_json())  # goes into bench/parity/agent reports as is
    if case.llm:
        assert info.precision_used == case.bundle.precision.lower()
    elif case.bundle.precision == "fp32":
        assert info.precision_used == _fp32_computes_in(case, runner), info.precision_used
    for field, actual in RUNTIME_VIEW.get(case.runner, lambda _r: {})(runner).items():
        assert getattr(info, field) == actual, f"info.{field} = {getattr(info, field)!r}, the runtime says {actual!r}"


def test_io_spec_matches_the_manifest(case: Case, runner: Runner) -> None:
    io = case.bundle.io
    assert _key(runner.inputs) == _key(io.inputs)
    assert _key(runner.outputs) == _key(io.outputs)


def test_infers_on_the_declared_io(runner: Runner) -> None:
    feeds = feeds_for(runner.inputs)
    first = runner.infer(feeds)
    _check_outputs(first, runner.outputs)
    again = runner.infer(feeds)
    for name, y in first.items():  # outputs are the caller's: not overwritten by the next call
        np.testing.assert_array_equal(y, again[name])


def test_wrong_shape_is_refused_naming_input_and_expected_shape(runner: Runner) -> None:
    for t in runner.inputs:
        feeds = feeds_for(runner.inputs)
        feeds[t.name] = _array(t, _wrong_shape(t.shape), t.dtype)
        with pytest.raises(EdgeError) as err:
            runner.infer(feeds)
        assert repr(t.name) in str(err.value) and _dims(t.shape) in str(err.value), str(err.value)
    _check_outputs(runner.infer(feeds_for(runner.inputs)), runner.outputs)  # still usable


def test_wrong_dtype_is_refused_naming_input_and_dtype(runner: Runner) -> None:
    for t in runner.inputs:
        feeds = feeds_for(runner.inputs)
        wrong = _wrong_dtype(t.dtype)
        feeds[t.name] = feeds[t.name].astype(wrong)
        with pytest.raises(EdgeError) as err:
            runner.infer(feeds)
        msg = str(err.value)
        assert repr(t.name) in msg and wrong.name in msg and t.dtype in msg, msg
    _check_outputs(runner.infer(feeds_for(runner.inputs)), runner.outputs)


def test_missing_or_unknown_input_is_refused(runner: Runner) -> None:
    for t in runner.inputs:
        feeds = feeds_for(runner.inputs)
        del feeds[t.name]
        with pytest.raises(EdgeError, match=f"missing input '{t.name}'"):
            runner.infer(feeds)
    feeds = feeds_for(runner.inputs)
    feeds["not_an_input"] = np.zeros(1, np.float32)
    with pytest.raises(EdgeError, match="unknown input 'not_an_input'"):
        runner.infer(feeds)


def test_close_then_infer_is_refused(case: Case) -> None:
    r = case.bundle.open_runner()
    feeds = feeds_for(r.inputs)
    r.infer(feeds)
    r.close()
    with pytest.raises(EdgeError, match="closed"):
        r.infer(feeds)
    r.close()  # idempotent
    with case.bundle.open_runner() as r2:
        r2.infer(feeds)
    with pytest.raises(EdgeError, match="closed"):
        r2.infer(feeds)
