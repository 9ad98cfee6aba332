"""Core ML / Apple Neural Engine: ONNX -> edgekit bridge -> torch.jit.trace -> ML Program, in the ``coreml`` toolchain.

Conversion tests need the toolchain (``edgekit toolchain install coreml``, about 40 s and 1.1 GB
with the torch CPU wheel available); without it they skip saying so, and with
``EDGEKIT_REQUIRE_TOOLCHAINS=1`` (CI) they fail instead. Predictions need macOS: those tests
skip with the runner's own message elsewhere.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from edge import toolchains
from edge.bundle import Bundle
from edge.capabilities import env_flag
from edge.convert import convert
from edge.converters.base import CONVERTERS
from edge.converters.coreml import OnnxToCoreML, package_dir
from edge.errors import ConversionError, HardwareUnavailableError
from edge.runners.base import RUNNERS
from edge.runners.coreml import NEEDS_MACOS, CoreMLRunner

REQUIRE_ENV = "EDGEKIT_REQUIRE_TOOLCHAINS"
on_mac = pytest.mark.skipif(sys.platform != "darwin", reason=NEEDS_MACOS)


@pytest.fixture(scope="module")
def toolchain() -> toolchains.ToolchainStatus:
    st = toolchains.status("coreml")
    if not st.usable:
        if env_flag(REQUIRE_ENV):
            pytest.fail(f"{REQUIRE_ENV}=1 but {st.problem}")
        pytest.skip(f"needs the coreml toolchain: {st.problem}")
    return st


def test_registered_and_spec_pins_no_torchvision() -> None:
    assert CONVERTERS.get("onnx->coreml") is OnnxToCoreML and RUNNERS.get("coreml") is CoreMLRunner
    spec = toolchains.get_spec("coreml")
    assert "torch==2.13.0" in spec.requirements
    lock = toolchains.lock_lines(spec.lock_text.splitlines())
    assert not any(ln.lower().startswith(("torchvision", "nvidia-")) for ln in lock)  # CPU torch, no CUDA stack


@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS the runner predicts")
def test_runner_elsewhere_says_macos(tmp_path: Path) -> None:
    with pytest.raises(HardwareUnavailableError, match="Core ML predictions need macOS; the bundle is ready to copy"):
        CoreMLRunner(tmp_path / "model.mlpackage" / "Manifest.json")


@pytest.fixture(scope="module")
def ane_bundle(toolchain: toolchains.ToolchainStatus, models: dict[str, Path],
               tmp_path_factory: pytest.TempPathFactory) -> Bundle:
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
    assert m["parity"]["passed"] is None and NEEDS_MACOS in m["parity"]["skipped"]


def _op_zoo(path: Path) -> Path:
    """Every bridged op in one graph, with asymmetric pads and opset-11 Clip/Softmax forms."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def init(name: str, a: np.ndarray) -> onnx.TensorProto:
        return numpy_helper.from_array(a, name)

    inits = [
        init("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3), init("b", np.zeros(4, np.float32)),
        init("bn_s", np.full(4, 1.1, np.float32)), init("bn_b", np.full(4, 0.1, np.float32)),
        init("bn_m", np.full(4, 0.05, np.float32)), init("bn_v", np.full(4, 0.9, np.float32)),
        init("lo", np.array(0.0, np.float32)), init("hi", np.array(6.0, np.float32)),
        init("scale", np.full((1, 4, 1, 1), 0.5, np.float32)), init("shape", np.array([1, -1], np.int64)),
        init("mm", rng.standard_normal((8, 6)).astype(np.float32)), init("gw", rng.standard_normal((5, 6)).astype(np.float32)),
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
    graph = helper.make_graph(nodes, "zoo", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def test_every_bridged_op_matches_onnxruntime(toolchain: toolchains.ToolchainStatus, tmp_path: Path) -> None:
    b = convert(_op_zoo(tmp_path / "zoo.onnx"), "apple-ane", tmp_path / "zoo", precision="fp32", preprocess="none")
    d = b.manifest["chain"][0]["details"]
    bp = d["bridge_parity"]
    assert bp["passed"] and bp["outputs"][0]["max_abs"] < 1e-4, bp
    assert {"conv", "max_pool", "avg_pool", "concat", "softmax", "sigmoid", "linear", "pad"} <= set(d["ops"]), d["ops"]


def test_unsupported_ops_listed_in_one_error(toolchain: toolchains.ToolchainStatus, tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Tanh", ["x"], ["t"], name="t1"), helper.make_node("Erf", ["t"], ["e"]),
                           helper.make_node("Relu", ["e"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "u.onnx"))
    with pytest.raises(ConversionError) as e:
        convert(tmp_path / "u.onnx", "apple-ane", tmp_path / "out", preprocess="none")
    assert "Erf, Tanh" in str(e.value) and "t1" in str(e.value)
    assert not (tmp_path / "out").exists()


@on_mac
def test_predict_on_mac_matches_onnxruntime(ane_bundle: Bundle) -> None:
    x = {"input": np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)}
    with ane_bundle.open_runner() as r:
        y = r.infer(x)
    assert y["logits"].shape == (1, 10) and np.isfinite(y["logits"]).all()
    assert r.info.details["compute_units"] == "CPU_AND_NE" and json.dumps(r.info.to_json())
