"""Core ML / Apple Neural Engine: ONNX -> edgekit bridge -> torch.jit.trace -> ML Program, in the ``coreml`` toolchain.

Conversion tests need the toolchain (``edgekit toolchain install torch``, about 40 s and 1.1 GB
with the torch CPU wheel available); without it they skip saying so, and with
``CI=true`` they fail instead (tests/conftest.py). Predictions need macOS: those tests
skip with the runner's own message elsewhere.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge import toolchains
from edge.backends.converter import CONVERTERS, ConversionRequest
from edge.backends.coreml.convert import OnnxToCoreML
from edge.backends.coreml.format import IO_NAMES, IO_SHAPES, package_dir, renamed_io, reshaped_io
from edge.backends.coreml.run import NEEDS_MACOS, CoreMLRunner
from edge.backends.runner import RUNNERS
from edge.bundle.bundle import Bundle
from edge.errors import ConversionError, HardwareUnavailableError
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest

on_mac = pytest.mark.skipif(sys.platform != "darwin", reason="hardware: not macOS: " + NEEDS_MACOS)


@pytest.fixture(scope="module")
def toolchain() -> toolchains.ToolchainStatus:
    st = toolchains.status("coreml")
    if not st.usable:
        pytest.skip(f"needs the coreml toolchain: {st.problem}")
    return st


def test_registered_and_spec_pins_no_torchvision() -> None:
    assert CONVERTERS.get("onnx->coreml") is OnnxToCoreML and RUNNERS.get("coreml") is CoreMLRunner
    spec = toolchains.get_spec("coreml")
    assert "torch==2.13.0" in spec.requirements
    lock = toolchains.lock_lines(spec.lock_text.splitlines())
    assert not any(ln.lower().startswith(("torchvision", "nvidia-")) for ln in lock)  # CPU torch, no CUDA stack


@pytest.mark.skipif(sys.platform == "darwin", reason="hardware: macOS: the runner predicts there")
def test_runner_elsewhere_says_macos(tmp_path: Path) -> None:
    with pytest.raises(HardwareUnavailableError, match="Core ML predictions need macOS; the bundle is ready to copy"):
        CoreMLRunner(tmp_path / "model.mlpackage" / "Manifest.json")


@pytest.fixture(scope="module")
def ane_bundle(
    toolchain: toolchains.ToolchainStatus, models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Bundle:
    return convert(models["tiny"], "apple-ane", tmp_path_factory.mktemp("ane") / "b")


def test_tiny_to_mlpackage_with_linux_checks(ane_bundle: Bundle) -> None:
    m = ane_bundle.manifest
    assert m["format"] == "mlpackage" and m["precision"] == "fp16"
    assert package_dir(ane_bundle.artifact).name == "model.mlpackage"
    assert any(a["path"].endswith("weight.bin") for a in m["artifacts"])
    d = m["chain"][0]["details"]
    assert d["spec_check"]["loads_as_spec"] and d["spec_check"]["io_matches_manifest"]
    assert d["spec_check"]["io"]["inputs"] == [{"name": "input", "shape": [1, 3, 32, 32], "dtype": "float32"}]
    assert d["spec_check"]["io"]["outputs"][0]["name"] == "logits"
    assert d["ops"]["conv"] == 3 and d["ane_flagged"] == {} and d["compute_units"] == "CPU_AND_NE"
    assert d["bridge_parity"]["passed"] is True and d["toolchain"]["lock_hash"]
    assert "coremltools" in m["chain"][0]["tool_versions"] and "torch" in m["chain"][0]["tool_versions"]
    # Core ML predicts only on macOS: the gate ran the converter's host proxy (the traced module in fp16 on the CPU)
    assert m["parity"]["passed"] is True and m["parity"]["candidate"]["precision_used"] == "f16"
    assert m["parity"]["candidate"]["runtime"].startswith("host proxy: torch")
    assert any(n.startswith("host proxy: torch") for n in m["parity"]["host_notes"])


def _op_zoo(path: Path) -> Path:
    """Every bridged op in one graph, with asymmetric pads and opset-11 Clip/Softmax forms."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def init(name: str, a: np.ndarray) -> onnx.TensorProto:
        return numpy_helper.from_array(a, name)

    inits = [
        init("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3),
        init("b", np.zeros(4, np.float32)),
        init("bn_s", np.full(4, 1.1, np.float32)),
        init("bn_b", np.full(4, 0.1, np.float32)),
        init("bn_m", np.full(4, 0.05, np.float32)),
        init("bn_v", np.full(4, 0.9, np.float32)),
        init("lo", np.array(0.0, np.float32)),
        init("hi", np.array(6.0, np.float32)),
        init("scale", np.full((1, 4, 1, 1), 0.5, np.float32)),
        init("shape", np.array([1, -1], np.int64)),
        init("mm", rng.standard_normal((8, 6)).astype(np.float32)),
        init("gw", rng.standard_normal((5, 6)).astype(np.float32)),
        init("gb", np.ones(5, np.float32)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[0, 0, 1, 1], strides=[1, 1]),
        helper.make_node("BatchNormalization", ["c", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"], epsilon=1e-5),
        helper.make_node("Clip", ["bn", "lo", "hi"], ["r6"]),
        helper.make_node("Relu", ["r6"], ["r"]),
        helper.make_node("Mul", ["r", "scale"], ["ms"]),
        helper.make_node("HardSigmoid", ["ms"], ["hs"], alpha=0.2, beta=0.5),
        helper.make_node("Sigmoid", ["ms"], ["sg"]),
        helper.make_node("Add", ["hs", "sg"], ["a"]),
        helper.make_node("MaxPool", ["a"], ["mp"], kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1]),
        helper.make_node("AveragePool", ["a"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Concat", ["mp", "ap"], ["cat"], axis=1),
        helper.make_node("GlobalAveragePool", ["cat"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["f"], axis=1),
        helper.make_node("Reshape", ["f", "shape"], ["rs"]),
        helper.make_node("MatMul", ["rs", "mm"], ["mmo"]),
        helper.make_node("Gemm", ["mmo", "gw", "gb"], ["g"], transB=1, alpha=0.7, beta=1.3),
        helper.make_node("Softmax", ["g"], ["y"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "zoo",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


# Runs in the coreml toolchain's Python (torch lives only there): the bridge on an ONNX file, traced as the
# driver traces it (on the first sample), then the *traced* module (what ct.convert receives) on every sample.
_TRACED_OUTPUTS = r"""
import sys, numpy as np, onnx, torch
sys.path.insert(0, sys.argv[1])
import coreml_bridge
torch.set_grad_enabled(False)
module = coreml_bridge.OnnxModule(onnx.load(sys.argv[2])).eval()
feeds = np.load(sys.argv[3])
names = module.input_names
traced = torch.jit.trace(module, tuple(torch.from_numpy(feeds[k][0]) for k in names), check_trace=False)
outs = {o: [] for o in module.output_names}
for i in range(feeds[names[0]].shape[0]):
    y = traced(*[torch.from_numpy(np.ascontiguousarray(feeds[k][i])) for k in names])
    for o, v in zip(module.output_names, y if isinstance(y, tuple) else (y,)):
        outs[o].append(v.numpy())
np.savez(sys.argv[4], **{k: np.stack(v) for k, v in outs.items()})
"""


def _onnxruntime(model: Path, feeds: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    runs = [sess.run(names, f) for f in feeds]
    return {n: np.stack([r[i] for r in runs]) for i, n in enumerate(names)}


def _assert_traced_bridge_matches_onnxruntime(st: toolchains.ToolchainStatus, model: Path, work: Path) -> None:
    """The traced bridge against onnxruntime, both fp32 CPU, on 4 random inputs, computed here (not the
    manifest's own figure). Tolerance: the two differ only in kernel summation order, ~1e-7 relative per
    accumulation over a few hundred terms; 1e-4 relative / 1e-5 absolute is far above that and far below any
    real bridge error (a wrong pad, axis or attribute moves outputs by 1e-2 or more)."""
    import subprocess

    import onnx

    g = onnx.load(str(model)).graph
    inits = {t.name for t in g.initializer}
    rng = np.random.default_rng(7)
    feeds = [
        {
            i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in g.input
            if i.name not in inits
        }
        for _ in range(4)
    ]
    np.savez(work / "feeds.npz", **{k: np.stack([f[k] for f in feeds]) for k in feeds[0]})
    subprocess.run(
        [
            str(toolchains._venv_python(st.venv)),
            "-c",
            _TRACED_OUTPUTS,
            str(toolchains.driver_path("coreml").parent),
            str(model),
            str(work / "feeds.npz"),
            str(work / "traced.npz"),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    ref = _onnxruntime(model, feeds)
    with np.load(work / "traced.npz") as got:
        assert set(got.files) == set(ref)
        for name, want in ref.items():
            assert np.ptp(want, axis=0).max() > 1e-3, "inputs that give the same output compare nothing"
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


def test_every_bridged_op_matches_onnxruntime(toolchain: toolchains.ToolchainStatus, tmp_path: Path) -> None:
    zoo = _op_zoo(tmp_path / "zoo.onnx")
    b = convert(zoo, "apple-ane", tmp_path / "zoo", ConvertRequest(precision="fp32", preprocess="none"))
    d = b.manifest["chain"][0]["details"]
    bp = d["bridge_parity"]
    assert bp["passed"] and bp["outputs"][0]["max_abs"] < 1e-4, bp
    assert {"conv", "max_pool", "avg_pool", "concat", "softmax", "sigmoid", "linear", "pad"} <= set(d["ops"]), d["ops"]
    _assert_traced_bridge_matches_onnxruntime(toolchain, zoo, tmp_path)


def test_traced_bridge_of_the_tiny_model_matches_onnxruntime(
    toolchain: toolchains.ToolchainStatus, models: dict[str, Path], tmp_path: Path
) -> None:
    # what Linux can run of the apple-ane path: the traced module ct.convert turns into the ML Program
    _assert_traced_bridge_matches_onnxruntime(toolchain, models["tiny"], tmp_path)


def _refused_before(path: Path) -> Path:
    """A speech-model-like graph of the ops the bridge refused before issue #34 class 5 (Div, Sub, Pow, Sqrt, Erf, Pad,
    Slice, Transpose, Shape, Gather, Concat of a computed shape, Unsqueeze, Squeeze, ReduceMean, ReduceMax, Split,
    LeakyRelu, HardSwish, Resize, ConvTranspose, a bidirectional GRU given its state), with TensorFlow- and
    Paddle-style I/O names that coremltools renames (``Identity:0``, ``save/x.tmp_0``)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)

    def c(name: str, a: Any) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(a), name)

    h, f = 3, 4  # GRU hidden size; features a step
    inits = [
        c("mean", np.float32(0.1)),
        c("two", np.float32(2.0)),
        c("eps", np.float32(1e-3)),
        c("pads", np.array([0, 0, 1, 2, 0, 0, 1, 0], np.int64)),
        c("starts", np.array([1, 1], np.int64)),
        c("ends", np.array([9, -1], np.int64)),
        c("axes", np.array([2, 3], np.int64)),
        c("grid", np.array([4, 8], np.int64)),
        c("minus1", np.array([-1], np.int64)),
        c("ax0", np.array([0], np.int64)),
        c("sizes", np.array([1, 3], np.int64)),
        c("scales", np.array([1, 1, 2, 2], np.float32)),
        c("wt", (rng.standard_normal((4, 2, 2, 2)) * 0.3).astype(np.float32)),
        c("W", (rng.standard_normal((2, 3 * h, f)) * 0.5).astype(np.float32)),
        c("R", (rng.standard_normal((2, 3 * h, h)) * 0.5).astype(np.float32)),
        c("B", (rng.standard_normal((2, 6 * h)) * 0.1).astype(np.float32)),
    ]
    n = helper.make_node
    nodes = [
        n("Sub", ["Input:0", "mean"], ["a"]),
        n("Div", ["a", "two"], ["b"]),
        n("Pow", ["b", "two"], ["p2"]),
        n("Add", ["p2", "eps"], ["p3"]),
        n("Sqrt", ["p3"], ["r"]),
        n("Erf", ["r"], ["e"]),
        n("Pad", ["e", "pads"], ["pad"], mode="constant"),  # [1, 4, 10, 10]
        n("Slice", ["pad", "starts", "ends", "axes"], ["sl"]),  # [1, 4, 8, 8]
        n("LeakyRelu", ["sl"], ["lr"], alpha=0.1),
        n("HardSwish", ["lr"], ["hs"]),
        n(
            "Resize",
            ["hs", "", "scales"],
            ["up"],
            mode="nearest",
            coordinate_transformation_mode="asymmetric",
            nearest_mode="floor",
        ),  # [1, 4, 16, 16]
        n("ConvTranspose", ["up", "wt"], ["ct"], strides=[2, 2]),  # [1, 2, 32, 32]
        n("ReduceMax", ["ct"], ["rmax"], axes=[1], keepdims=0),  # [1, 32, 32]
        n("Transpose", ["rmax"], ["t"], perm=[1, 0, 2]),  # [32, 1, 32]: steps, batch, features
        n("Shape", ["t"], ["shape"]),
        n("Gather", ["shape", "ax0"], ["steps"]),
        n("Concat", ["steps", "minus1", "grid"], ["seq_shape"], axis=0),  # [32, -1, 4, 8]: computed, folded
        n("Reshape", ["t", "seq_shape"], ["t4"]),
        n("ReduceMean", ["t4"], ["m4"], axes=[3], keepdims=0),  # [32, 1, 4]
        n("Split", ["m4", "sizes"], ["s1", "s2"], axis=2),
        n("Concat", ["s2", "s1"], ["gx"], axis=2),  # [32, 1, 4]
        n("Squeeze", ["state", "ax0"], ["h0"]),  # [2, 1, 3]
        n(
            "GRU",
            ["gx", "W", "R", "B", "", "h0"],
            ["Y", "yh"],
            hidden_size=h,
            direction="bidirectional",
            linear_before_reset=1,
        ),
        n("Transpose", ["Y"], ["Identity:0"], perm=[2, 1, 0, 3]),  # [1, 2, 32, 3]
        n("Unsqueeze", ["yh", "ax0"], ["save/y.tmp_0"]),  # [1, 2, 1, 3]
    ]
    graph = helper.make_graph(
        nodes,
        "refused_before",
        [
            helper.make_tensor_value_info("Input:0", TensorProto.FLOAT, [1, 4, 8, 8]),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, [1, 2, 1, h]),
        ],
        [
            helper.make_tensor_value_info("Identity:0", TensorProto.FLOAT, [1, 2, 32, h]),
            helper.make_tensor_value_info("save/y.tmp_0", TensorProto.FLOAT, [1, 2, 1, h]),
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def test_ops_refused_before_convert_with_parity(toolchain: toolchains.ToolchainStatus, tmp_path: Path) -> None:
    """Issue #34 class 5: apple-ane refused every non-vision corpus model because the bridge lacked Div, Sub, Slice,
    Transpose, Pad, Shape, Gather, GRU, ... . They convert now: the bridge matches onnxruntime (fp32), the fp16
    host proxy passes the parity gate, the package holds Core ML's own GRU, and the renamed I/O maps back."""
    model = _refused_before(tmp_path / "refused_before.onnx")
    b = convert(model, "apple-ane", tmp_path / "b", ConvertRequest(preprocess="none"))
    m = b.manifest
    d = m["chain"][0]["details"]
    bp = d["bridge_parity"]
    assert bp["passed"] and all(o["max_abs"] < 1e-4 for o in bp["outputs"]), bp
    assert m["parity"]["passed"] is True and m["parity"]["candidate"]["precision_used"] == "f16", m["parity"]
    assert {"conv_transpose", "erf", "pad", "transpose", "reduce_max"} <= set(d["ops"]), d["ops"]
    assert {"gru", "while_loop"} & set(d["ops"]), d["ops"]  # coremltools' GRU (a loop of its steps in this target)
    assert "shape" not in d["ops"]  # the shape arithmetic was folded into constants, not computed in the package
    assert d["renamed_io"] == {  # coremltools' identifiers ('state' is a reserved word to it)
        "Input:0": "Input_0",
        "state": "state_workaround",
        "Identity:0": "Identity_0",
        "save/y.tmp_0": "save_y_tmp_0",
    }
    assert [t["name"] for t in m["io"]["inputs"]] == ["Input:0", "state"]  # the bundle keeps the model's names


def test_package_metadata_gives_the_bundles_names_and_shapes() -> None:
    """What the runner reads from a package (macOS only there; the parsing is checked here)."""
    meta = {
        IO_NAMES: json.dumps({"Identity:0": "Identity_0", "state": "state_workaround"}),
        IO_SHAPES: json.dumps({"plcmos": []}),
    }
    assert renamed_io(meta) == {"Identity:0": "Identity_0", "state": "state_workaround"}
    assert reshaped_io(meta) == {"plcmos": ()}
    assert renamed_io({}) == {} and reshaped_io({"other": "x"}) == {}
    with pytest.raises(ValueError, match="edgekit.io_names in the package's metadata is not a map of str"):
        renamed_io({IO_NAMES: json.dumps({"a": 1})})
    driver = toolchains.driver_path("coreml").read_text(encoding="utf-8")  # it writes them, and cannot import edge
    assert f'IO_NAMES = "{IO_NAMES}"' in driver and f'IO_SHAPES = "{IO_SHAPES}"' in driver


def test_unsupported_ops_listed_in_one_error(toolchain: toolchains.ToolchainStatus, tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [
            helper.make_node("Hardmax", ["x"], ["t"], name="t1"),
            helper.make_node("Celu", ["t"], ["e"]),
            helper.make_node("Relu", ["e"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "u.onnx"))
    with pytest.raises(ConversionError) as e:
        convert(tmp_path / "u.onnx", "apple-ane", tmp_path / "out", ConvertRequest(preprocess="none"))
    assert "Celu, Hardmax" in str(e.value) and "t1" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_converter_returns_an_fp16_host_proxy(
    toolchain: toolchains.ToolchainStatus, models: dict[str, Path], tmp_path: Path
) -> None:
    """Off macOS the fp16 package cannot predict; the converter runs the traced module cast to half on its own
    parity inputs instead. The reference is computed here, on exactly those inputs."""
    from edge.pipeline.sources import OnnxSource
    from edge.verify.parity import compare, reference_outputs, thresholds_for

    io = OnnxSource(models["tiny"]).io({})
    (tmp_path / "out").mkdir()
    result = CONVERTERS.get("onnx->coreml")().convert(
        ConversionRequest(source=models["tiny"], workdir=tmp_path / "out", precision="fp16", io=io)
    )
    proxy = result.proxy
    assert proxy is not None and proxy.precision_used == "f16" and proxy.fallback is None
    assert "CPU fp16 (the traced module, cast to half)" in proxy.label and proxy.label.startswith("torch 2.")
    assert proxy.info.runtime == f"host proxy: {proxy.label}" and proxy.info.precision_used == "f16"
    assert proxy.inputs_from == "generated" and len(proxy.inputs) == len(proxy.outputs) == 8
    assert result.details["host_proxy"] == {
        "label": proxy.label,
        "precision_used": "f16",
        "fallback": None,
        "samples": 8,
    }
    reference = reference_outputs(models["tiny"], proxy.inputs)
    [logits] = compare(reference, proxy.outputs, thresholds_for("fp16", proxy.precision_used))
    assert logits.passed and logits.cosine >= 0.9999, logits
    # It really computed in fp16: fp32 (the bridge, ~1e-5 here) cannot be 1e-3 of the output scale away.
    ref = np.stack([r["logits"] for r in reference])
    assert logits.max_abs > 1e-3 * np.abs(ref).max(), "labelled fp16 but as exact as fp32"


# Runs in the toolchain: the driver's host_proxy on a module torch CPU cannot run in half (det -> lu_cpu),
# then on one it can; prints what it returned.
_PROXY_FALLBACK = r"""
import json, sys, numpy as np, torch
sys.path.insert(0, sys.argv[1])
import coreml_driver as d
class Det(torch.nn.Module):
    def forward(self, x):
        return torch.det(x) + x.sum()
class Lin(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
    def forward(self, x):
        return self.fc(x)
torch.manual_seed(0)
samples = {"x": np.random.default_rng(0).standard_normal((3, 8, 8)).astype(np.float32)}
out = {}
for name, m in (("det", Det()), ("lin", Lin())):
    traced = torch.jit.trace(m.eval(), (torch.from_numpy(samples["x"][0]),))
    with_fb = d.host_proxy(traced, {"precision": "fp16"}, samples, ["x"], "the traced module", fallback=traced)
    without = d.host_proxy(traced, {"precision": "fp16"}, samples, ["x"], "the TorchScript module")
    fp32 = d.run_samples(traced, samples, ["x"])
    out[name] = {"with": {k: v for k, v in with_fb.items() if k != "outputs"},
                 "without": {k: v for k, v in without.items() if k != "outputs"},
                 "same_as_fp32": all(np.array_equal(a[0], b[0]) for a, b in zip(with_fb["outputs"], fp32)),
                 "still_fp32": next(traced.parameters(), torch.zeros(1)).dtype == torch.float32}
print(json.dumps(out))
"""


def test_host_proxy_without_an_fp16_kernel_says_it_ran_fp32(toolchain: toolchains.ToolchainStatus) -> None:
    import subprocess

    run = subprocess.run(
        [
            str(toolchains._venv_python(toolchain.venv)),
            "-c",
            _PROXY_FALLBACK,
            str(toolchains.driver_path("coreml").parent),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    det, lin = got["det"], got["lin"]
    why = "torch CPU has no fp16 kernel for lu_cpu"
    assert det["with"]["precision_used"] == "f32" and det["with"]["fallback"] == why
    assert det["with"]["label"].endswith(f"CPU fp32 bridge: {why}") and "fp16" not in det["with"]["label"].split(":")[0]
    assert det["same_as_fp32"]  # the fallback is the fp32 module itself, nothing else
    assert det["without"] == {"label": None, "precision_used": None, "fallback": why}  # no stand-in claimed
    assert lin["with"]["precision_used"] == "f16" and lin["with"]["fallback"] is None
    assert "CPU fp16 (the traced module, cast to half)" in lin["with"]["label"]
    assert not lin["same_as_fp32"] and lin["still_fp32"]  # computed in half, on a copy: ct.convert gets fp32


@on_mac
def test_predict_on_mac_matches_onnxruntime(ane_bundle: Bundle, models: dict[str, Path]) -> None:
    rng = np.random.default_rng(0)
    feeds = [{"input": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(4)]
    with ane_bundle.open_runner() as r:
        got = np.stack([r.infer(f)["logits"] for f in feeds])
    want = _onnxruntime(models["tiny"], feeds)["logits"]
    assert got.shape == want.shape == (4, 1, 10) and np.isfinite(got).all()
    # fp16 weights and activations (11-bit mantissa, ~5e-4 relative per rounding) through three convs and a
    # linear layer: errors of ~1% of the output scale are expected, a wrong graph is off by far more. The
    # same limits as the fp16 parity gate (edge/verify/parity.py): cosine >= 0.999, and the same top-1 class.
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=0.02 * scale)
    cos = (got * want).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(want, axis=-1))
    assert cos.min() >= 0.999 and (got.argmax(-1) == want.argmax(-1)).all(), cos
    assert r.info.details["compute_units"] == "CPU_AND_NE" and json.dumps(r.info.to_json())
