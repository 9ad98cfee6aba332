"""ONNX -> TFLite for real, in the ``tflite`` toolchain (onnx2tf + TensorFlow), on the tiny CNN only.

These tests need the toolchain: ``edgekit toolchain install tflite`` (about 1-2 min, 2.6 GB).
Without it they skip, saying so; with ``CI=true`` they fail instead,
so a CI that forgot the install cannot pass vacuously. MobileNetV2 is converted by
benchmarks/litert.py, not here. Checks that do not need the toolchain (calibration errors,
the Edge TPU compiler's log) are at the end and always run.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge import toolchains
from edge.errors import CalibrationError, ConversionError
from edge.pipeline.request import ConvertRequest
from edge.spec import Calibration
from tests.support.cli import assert_user_error, run_cli

pytest.importorskip("ai_edge_litert", reason="ai-edge-litert is not installed (pip install 'edgekit-ml[litert]')")


@pytest.fixture(scope="module")
def toolchain() -> toolchains.ToolchainStatus:
    st = toolchains.status("tflite")
    if not st.usable:
        pytest.skip(f"needs the tflite toolchain: {st.problem}")
    return st


@pytest.fixture(scope="module")
def convert_tiny(
    toolchain: toolchains.ToolchainStatus, models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., Any]:
    """convert(tiny, target, precision) once per (target, precision) in this module; progress lines kept."""
    from edge.backends.litert import convert as tflite
    from edge.pipeline import convert

    cache: dict[tuple[str, str], Any] = {}
    out = tmp_path_factory.mktemp("tflite-bundles")

    def get(target: str, precision: str) -> Any:
        key = (target, precision)
        if key not in cache:
            lines: list[str] = []
            tflite.set_progress(lines.append)
            try:
                b = convert(
                    models["tiny"],
                    target,
                    out / f"{target}-{precision}",
                    ConvertRequest(precision=precision, calib="random" if precision == "int8" else None),
                )
            finally:
                tflite.set_progress(None)
            cache[key] = (b, lines)
        return cache[key]

    return get


@pytest.mark.parametrize(
    "precision,computes",
    [
        ("fp32", "f32"),
        ("fp16", "f32 (fp16 weights)"),
        ("int8-dynamic", "f32 with int8 weights (dynamic range)"),
        ("int8", "int8"),
    ],
)
def test_arm_xnnpack_every_precision(
    convert_tiny: Callable[..., Any],
    toolchain: toolchains.ToolchainStatus,
    models: dict[str, Path],
    precision: str,
    computes: str,
) -> None:
    b, progress = convert_tiny("arm-xnnpack", precision)
    m = b.manifest
    step = m["chain"][0]
    d = step["details"]
    # parity against onnxruntime fp32, through the bundle's runner (XNNPack) and on LiteRT's CPU kernels
    assert m["parity"]["passed"], m["parity"]
    cand = m["parity"]["candidate"]
    assert cand["device_used"] == "CPU (XNNPack)" and cand["details"]["delegate_applied"] == "XNNPack"
    assert cand["precision_used"] == computes and cand["fallback"] is None
    assert d["cpu_parity"]["passed"] and d["cpu_parity"]["candidate"]["device_used"] == "CPU (builtin kernels)"
    # reproducibility: the exact toolchain is in the manifest
    assert d["toolchain"]["lock_hash"] == toolchain.lock_hash and d["toolchain"]["packages"]["onnx2tf"] == "1.29.24"
    assert step["tool_versions"]["onnx2tf"] == "1.29.24" and step["tool_versions"]["tensorflow"] == "2.19.0"
    # offline and simplified: onnxsim ran from the toolchain (3 times, as onnx2tf does), nothing reached out
    assert len(d["onnxsim"]) == 3 and all(r["ok"] for r in d["onnxsim"])
    assert all(str(toolchain.venv) in r["path"] for r in d["onnxsim"])
    assert d["network_attempts"] == []
    # the layout change is visible: a note, the details, and model.io.json in the bundle
    assert any("NCHW [1, 3, 32, 32] -> NHWC [1, 32, 32, 3]" in n for n in step["notes"])
    assert {a["path"] for a in m["artifacts"]} == {"model.tflite", "model.io.json", "reference.npz"}
    io = json.loads((b.path / "model.io.json").read_text())
    assert io["inputs"][0]["perm_onnx_to_tflite"] == [0, 2, 3, 1] and io["inputs"][0]["tflite_layout"] == "NHWC"
    assert any("onnx2tf" in line for line in progress)
    # the caller feeds what it fed the ONNX model and gets float32 back
    with b.open_runner() as r:
        assert [(t.name, t.shape, t.dtype) for t in r.inputs] == [("input", (1, 3, 32, 32), "float32")]
        x = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype(np.float32)
        y = r.infer({"input": x})["logits"]
        assert y.dtype == np.float32 and y.shape == (1, 10)


def test_fp16_trial_skip_is_recorded_from_this_cpu(convert_tiny: Callable[..., Any]) -> None:
    """An arm-xnnpack float bundle says why XNNPack fp16 was not tried here, from what this CPU reports."""
    from edge.capabilities import cpu_isa
    from edge.pipeline.precision_trial import xnnpack_fp16_skip

    b, _ = convert_tiny("arm-xnnpack", "fp32")
    (skipped,) = b.manifest["parity"]["precision_trials_skipped"]
    assert skipped == {"compute": "fp16", "runner": "litert", "reason": xnnpack_fp16_skip("litert", "fp32", cpu_isa())}
    expected = "has fp16 arithmetic" if cpu_isa().native_fp16 else "no fp16 arithmetic"
    assert expected in skipped["reason"]
    assert "precision_trials_skipped" not in convert_tiny("arm-xnnpack", "int8")[0].manifest["parity"]


def test_int8_details(convert_tiny: Callable[..., Any]) -> None:
    b, progress = convert_tiny("arm-xnnpack", "int8")
    d = b.manifest["chain"][0]["details"]
    assert d["recipe"].startswith("full-integer int8") and d["calibration_samples"] == 32 and d["per_channel"]
    assert any("calibrating 32/32" in line for line in progress)


def test_coral_without_the_compiler(convert_tiny: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("edgetpu_compiler"):
        pytest.skip(
            "hardware: Edge TPU compiler present: edgetpu_compiler is on PATH here: test_coral_compiled covers this host"
        )
    b, _ = convert_tiny("coral-edgetpu", "int8")
    m = b.manifest
    tflite_step, tpu_step = m["chain"]
    assert tflite_step["details"]["io_dtype"] == "uint8"
    assert tflite_step["details"]["cpu_parity"]["passed"]  # the gate where the Edge TPU itself cannot run
    assert tpu_step["details"]["edgetpu_compiled"] is False
    assert (
        tpu_step["details"]["finish_with"] == f"edgekit finish {b.path}"
    )  # tests/backends/test_edgetpu_finish.py runs it
    assert any("edgetpu_compiler is not on PATH" in n and f"`edgekit finish {b.path}`" in n for n in tpu_step["notes"])
    assert m["format"] == "tflite" and m["primary_artifact"] == "model.tflite"
    # the one gate: the Edge TPU is not here, so the same uint8 model ran on LiteRT's CPU fallback (host proxy)
    assert m["parity"]["passed"] is True and m["parity"]["candidate"]["fallback"].startswith("CPU fallback")
    assert any(n.startswith("host proxy:") and "CPU fallback" in n for n in m["parity"]["host_notes"])
    assert m["reference_pairs"]["samples"] > 0  # the device checks the compiled model against them
    p = run_cli("bench", str(b.path), "-n", "5")  # no Edge TPU: refused, with the way forward
    assert_user_error(p, "cannot use the Edge TPU", "not compiled for the Edge TPU", "allow_cpu_fallback")
    p = run_cli("bench", str(b.path), "-n", "5", "--json", env={"EDGEKIT_ALLOW_CPU_FALLBACK": "1"})
    assert p.returncode == 0, p.stderr
    runner = json.loads(p.stdout)["runner"]
    assert runner["fallback"].startswith("CPU fallback") and "CPU fallback" in runner["device_used"]


def test_coral_compiled(convert_tiny: Callable[..., Any]) -> None:
    if not shutil.which("edgetpu_compiler"):
        pytest.skip(
            "hardware: no Edge TPU compiler: edgetpu_compiler is not on PATH (Google's Edge TPU compiler: x86-64 Linux only, from Coral's "
            "apt repository, not installable here)"
        )
    b, _ = convert_tiny("coral-edgetpu", "int8")
    d = b.manifest["chain"][1]["details"]
    assert d["edgetpu_compiled"] and d["tpu_ops"] > 0 and b.manifest["primary_artifact"] == "model_edgetpu.tflite"


def test_cli_convert_then_bench(toolchain: toolchains.ToolchainStatus, models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "cli-fp32"
    p = run_cli("convert", str(models["tiny"]), "-t", "arm-xnnpack", "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert "NCHW [1, 3, 32, 32] -> NHWC" in " ".join(p.stdout.split()) and "pass" in p.stdout
    p = run_cli("bench", str(out), "-n", "20", "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)["runner"]
    assert r["details"]["delegate_applied"] == "XNNPack" and r["fallback"] is None


def test_two_inputs_two_outputs(toolchain: toolchains.ToolchainStatus, models: dict[str, Path], tmp_path: Path) -> None:
    """Names and layouts are matched per tensor: an NCHW image and a plain vector in, two vectors out."""
    from edge.pipeline import convert

    b = convert(models["two_input"], "arm-xnnpack", tmp_path / "two")
    assert b.manifest["parity"]["passed"] and [o["name"] for o in b.manifest["parity"]["outputs"]] == [
        "features",
        "embedding",
    ]
    io = json.loads((b.path / "model.io.json").read_text())
    assert [(t["name"], t["perm_onnx_to_tflite"]) for t in io["inputs"]] == [("image", [0, 2, 3, 1]), ("scale", [0, 1])]
    with b.open_runner() as r:
        assert [t.name for t in r.inputs] == ["image", "scale"] and [t.name for t in r.outputs] == [
            "features",
            "embedding",
        ]


def _onnx(path: Path, nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any] = ()) -> Path:
    m = helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8,
    )
    onnx.save(m, str(path))
    return path


def test_ops_tflite_cannot_express_are_named(toolchain: toolchains.ToolchainStatus, tmp_path: Path) -> None:
    from edge.pipeline import convert

    f = TensorProto.FLOAT
    # CastLike: onnx2tf has no translation (found before any conversion work, with every such node)
    castlike = _onnx(
        tmp_path / "castlike.onnx",
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu_0"),
            helper.make_node("CastLike", ["r", "like"], ["c"], name="castlike_0"),
            helper.make_node("CastLike", ["c", "like"], ["y"], name="castlike_1"),
        ],
        [helper.make_tensor_value_info("x", f, [1, 4])],
        [helper.make_tensor_value_info("y", f, [1, 4])],
        [numpy_helper.from_array(np.zeros((1,), np.float32), "like")],
    )
    with pytest.raises(
        ConversionError,
        match=r"^castlike\.onnx: target arm-xnnpack .*node 'castlike_0' \(CastLike\), "
        r"node 'castlike_1' \(CastLike\) — CastLike: onnx2tf 1.29.24 has no",
    ):
        convert(castlike, "arm-xnnpack", tmp_path / "b1", ConvertRequest(preprocess="none"))
    # Det: TensorFlow has it, TFLite's builtin op set does not (it would need Flex)
    det = _onnx(
        tmp_path / "det.onnx",
        [helper.make_node("Det", ["x"], ["y"], name="det_0")],
        [helper.make_tensor_value_info("x", f, [2, 3, 3])],
        [helper.make_tensor_value_info("y", f, [2])],
    )
    with pytest.raises(ConversionError, match=r"cannot express tf.MatrixDeterminant \(from ONNX node det_0 \(Det\)\)"):
        convert(det, "arm-xnnpack", tmp_path / "b2", ConvertRequest(preprocess="none"))
    assert not (tmp_path / "b1").exists() and not (tmp_path / "b2").exists()


def test_an_op_onnx2tf_exits_on_is_named_with_its_reason(toolchain: toolchains.ToolchainStatus, tmp_path: Path) -> None:
    """onnx2tf has a ScatterElements translation but logs "supports only reduction=['none']" and calls sys.exit(1) for
    reduction="add": that was "onnx2tf stopped (exit 1); see the log"; now the node, its op and onnx2tf's reason."""
    from edge.pipeline import convert

    f = TensorProto.FLOAT
    model = _onnx(
        tmp_path / "scatter_add.onnx",
        [
            helper.make_node("ScatterElements", ["x", "idx", "x"], ["s"], axis=1, reduction="add", name="scatter_add"),
            helper.make_node("Relu", ["s"], ["y"], name="relu"),
        ],
        [helper.make_tensor_value_info("x", f, [1, 8])],
        [helper.make_tensor_value_info("y", f, [1, 8])],
        [numpy_helper.from_array(np.array([[0, 0, 1, 1, 2, 2, 3, 3]], np.int64), "idx")],
    )
    with pytest.raises(ConversionError) as e:
        convert(model, "arm-xnnpack", tmp_path / "b", ConvertRequest(preprocess="none"))
    assert e.value.message.startswith(
        "scatter_add.onnx: onnx2tf cannot translate node 'scatter_add' (ScatterElements): ScatterElements currently "
        "supports only reduction=['none']"
    ), e.value.message
    assert "\n" not in str(e.value) and "ScatterElements as ONNX (x86-cpu, intel-igpu)" in (e.value.hint or "")


def test_calibration_problems_via_cli(
    toolchain: toolchains.ToolchainStatus, models: dict[str, Path], tmp_path: Path
) -> None:
    assert_user_error(
        run_cli("convert", str(models["two_input"]), "-t", "arm-xnnpack", "-p", "int8", "-o", str(tmp_path / "a")),
        "int8 for arm-xnnpack needs calibration data",
        "--calib",
    )
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "wrong.npy", np.zeros((4, 3, 16, 16), np.float32))
    assert_user_error(
        run_cli(
            "convert",
            str(models["tiny"]),
            "-t",
            "arm-xnnpack",
            "-p",
            "int8",
            "--calib",
            str(calib),
            "-o",
            str(tmp_path / "b"),
        ),
        "wrong.npy",
        "shape [4, 3, 16, 16], expected [1, 3, 32, 32]",
    )


# -- no toolchain needed -----------------------------------------------------------------


def _request(models: dict[str, Path], tmp_path: Path, precision: str, samples: tuple[Any, ...] | None) -> Any:
    from edge.backends.converter import ConversionRequest
    from edge.graph.model import io_spec, load_onnx

    calib = None if samples is None else Calibration("test", "tensors", len(samples), samples)
    return ConversionRequest(
        source=models["tiny"],
        workdir=tmp_path,
        precision=precision,
        io=io_spec(load_onnx(models["tiny"])),
        calibration=calib,
    )


def test_converter_checks_calibration_first(models: dict[str, Path], tmp_path: Path) -> None:
    from edge.backends.litert.convert import OnnxToTFLite

    conv = OnnxToTFLite()
    with pytest.raises(CalibrationError, match="full-integer int8 TFLite needs calibration samples"):
        conv.convert(_request(models, tmp_path, "int8", None))
    bad = (
        {"input": np.zeros((1, 3, 16, 16), np.float32)},
        {"inp": np.zeros((1, 3, 32, 32), np.float32)},
        {"input": np.zeros((1, 3, 32, 32), np.float64)},
    )
    with pytest.raises(CalibrationError) as e:
        conv.convert(_request(models, tmp_path, "int8", bad))
    msg = str(e.value)  # every problem at once
    assert "sample 0 input 'input' has shape [1, 3, 16, 16], the model takes [1, 3, 32, 32]" in msg
    assert "sample 1 has no input 'input'" in msg and "sample 2 input 'input' has dtype float64" in msg
    with pytest.raises(ConversionError, match='option io_dtype must be one of "int8", "uint8", "float32"'):
        conv.convert(dataclasses.replace(_request(models, tmp_path, "fp32", None), options={"io_dtype": "int4"}))


COMPILER_LOG = """Edge TPU Compiler version 16.0.384591198
Started a compilation timeout timer of 180 seconds.

Model compiled successfully in 1042 ms.

Input model: model.tflite
Input size: 3.62MiB
Output model: model_edgetpu.tflite
Output size: 3.88MiB
On-chip memory used for caching model parameters: 3.42MiB
Number of Edge TPU subgraphs: 1
Total number of operations: 66
Operation log: model_edgetpu.log

Operator                       Count      Status

ADD                            10         Mapped to Edge TPU
PAD                            4          Mapped to Edge TPU
CONV_2D                        35         Mapped to Edge TPU
DEPTHWISE_CONV_2D              17         Mapped to Edge TPU
MEAN                           1          Operation is otherwise supported, but not mapped due to some unspecified limitation
FULLY_CONNECTED                1          Operation is working on an unsupported data type
"""


def test_compiler_log_parsing() -> None:
    from edge.backends.litert.edgetpu import parse_compiler_log

    p = parse_compiler_log(COMPILER_LOG)
    assert p["compiler_version"] == "16.0.384591198"
    assert p["tpu_ops"] == 66 and p["cpu_ops"] == 2
    assert {r["op"]: r["on"] for r in p["ops"]} == {
        "ADD": "tpu",
        "PAD": "tpu",
        "CONV_2D": "tpu",
        "DEPTHWISE_CONV_2D": "tpu",
        "MEAN": "cpu",
        "FULLY_CONNECTED": "cpu",
    }
    # the compiler's stdout summary, when present, is what counts
    summary = (
        COMPILER_LOG + "Number of operations that will run on Edge TPU: 64\n"
        "Number of operations that will run on CPU: 2\n"
    )
    assert parse_compiler_log(summary)["tpu_ops"] == 64


def test_edgetpu_step_refuses_a_float_model(tmp_path: Path) -> None:
    from edge.backends.converter import ConversionRequest
    from edge.backends.litert.edgetpu import TFLiteToEdgeTPU
    from edge.spec import IOSpec
    from tests.backends.test_litert import add_model

    src = add_model(tmp_path / "float.tflite")
    out = tmp_path / "out"
    out.mkdir()
    req = ConversionRequest(source=src, workdir=out, precision="int8", io=IOSpec((), ()))
    with pytest.raises(ConversionError, match=r"float.tflite is not a full-integer model \(float ops: ADD\)"):
        TFLiteToEdgeTPU().convert(req)


def test_erf_and_paddle_node_names_convert(toolchain: toolchains.ToolchainStatus, tmp_path: Path) -> None:
    """A GELU written with Mul (x * 0.7071 -> Erf -> ...; onnx2tf only recognises x / 1.4142 as GELU) kept ONNX
    Erf as tf.math.erf, which TFLite's builtins lack; Paddle2ONNX's node names ("Softmax@0") are not TensorFlow
    scope names, and onnx2tf failed on them with a multi-line error. The driver asks onnx2tf for its builtin-only
    Erf and renames such nodes in onnx2tf's copy; fp32 parity holds (PP-OCRv6 det/rec and the PP-OCR classifier
    of tests/pipeline/test_corpus.py are the real cases)."""
    from edge.pipeline import convert

    f = TensorProto.FLOAT
    c = {
        n: numpy_helper.from_array(np.array(v, np.float32), n)
        for n, v in (("inv_sqrt2", 0.70710678), ("one", 1.0), ("half", 0.5))
    }
    model = _onnx(
        tmp_path / "gelu.onnx",
        [
            helper.make_node("Mul", ["x", "inv_sqrt2"], ["s"], name="Mul@0"),
            helper.make_node("Erf", ["s"], ["e"], name="Erf@0"),
            helper.make_node("Add", ["e", "one"], ["a"], name="Add@0"),
            helper.make_node("Mul", ["x", "a"], ["m"], name="Mul@1"),
            helper.make_node("Mul", ["m", "half"], ["g"], name="Mul@2"),
            helper.make_node("Softmax", ["g"], ["y"], name="Softmax@0", axis=-1),
        ],
        [helper.make_tensor_value_info("x", f, [1, 64])],
        [helper.make_tensor_value_info("y", f, [1, 64])],
        list(c.values()),
    )
    b = convert(model, "arm-xnnpack", tmp_path / "b", ConvertRequest(preprocess="none"))
    assert b.manifest["parity"]["passed"], b.manifest["parity"]
    details = b.manifest["chain"][-1]["details"]
    assert "Erf" in details["pseudo_operators"] and "max abs error 1.5e-7" in details["pseudo_operators"]["Erf"]
    assert details["renamed_nodes"].startswith("6 ONNX node name(s)"), details["renamed_nodes"]
    assert "EXP" in details["ops"], details["ops"]  # Abramowitz-Stegun: exp(-x^2) times a polynomial


def test_tensorflow_exported_names_map_through_onnx2tf(toolchain: toolchains.ToolchainStatus, tmp_path: Path) -> None:
    """ONNX exported from TensorFlow names its tensors like ``input_1:0`` and ``StatefulPartitionedCall:2``;
    PyTorch's exporter like ``/model/relu/Relu_output_0``. onnx2tf calls them ``input_1__0`` and ``wa/feat/x``
    (the SavedModel signature: ``wa_feat_x``); edgekit matched ``input_1_0`` and, with three outputs of one
    shape, refused: "cannot tell which TensorFlow output is ONNX output 'StatefulPartitionedCall:2'"."""
    from edge.pipeline import convert

    f = TensorProto.FLOAT
    rng = np.random.default_rng(0)
    w = [numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), f"w{i}") for i in range(3)]
    outs = ["StatefulPartitionedCall:2", "StatefulPartitionedCall:0", "/model/relu/Relu_output_0"]
    model = _onnx(
        tmp_path / "tfnames.onnx",
        [
            helper.make_node("Add", ["input_1:0", "/feat/x"], ["s"], name="StatefulPartitionedCall/model/add"),
            helper.make_node("MatMul", ["s", "w0"], [outs[1]], name="StatefulPartitionedCall/model/dense/MatMul"),
            helper.make_node("MatMul", ["s", "w1"], ["m1"], name="StatefulPartitionedCall/model/dense_1/MatMul"),
            helper.make_node("Relu", ["m1"], [outs[2]], name="/model/relu/Relu"),
            helper.make_node("MatMul", ["s", "w2"], ["m2"], name="StatefulPartitionedCall/model/dense_2/MatMul"),
            helper.make_node("Sigmoid", ["m2"], [outs[0]], name="StatefulPartitionedCall/model/sigmoid"),
        ],
        [helper.make_tensor_value_info(n, f, [1, 8]) for n in ("input_1:0", "/feat/x")],
        [helper.make_tensor_value_info(n, f, [1, 4]) for n in outs],
        w,
    )
    b = convert(model, "arm-xnnpack", tmp_path / "b", ConvertRequest(preprocess="none"))
    assert b.manifest["parity"]["passed"], b.manifest["parity"]
    assert [o["name"] for o in b.manifest["parity"]["outputs"]] == outs
    io = json.loads((b.path / "model.io.json").read_text())
    assert [(t["name"], t["tflite_name"]) for t in io["inputs"]] == [
        ("input_1:0", "input_1__0"),
        ("/feat/x", "wa/feat/x"),
    ]
    assert [t["tflite_name"] for t in io["outputs"]] == ["output_0", "output_1", "output_2"]
    x = {"input_1:0": rng.standard_normal((1, 8)).astype(np.float32), "/feat/x": np.ones((1, 8), np.float32)}
    s = x["input_1:0"] + x["/feat/x"]
    with b.open_runner() as r:
        assert [t.name for t in r.inputs] == ["input_1:0", "/feat/x"] and [t.name for t in r.outputs] == outs
        got = r.infer(x)
    ws = [numpy_helper.to_array(t) for t in w]
    np.testing.assert_allclose(got[outs[1]], s @ ws[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[outs[2]], np.maximum(s @ ws[1], 0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[outs[0]], 1 / (1 + np.exp(-(s @ ws[2]))), rtol=1e-4, atol=1e-5)


def test_an_onnx2tf_failure_inside_one_op_names_the_node(toolchain: toolchains.ToolchainStatus, tmp_path: Path) -> None:
    """onnx2tf 1.29.24 fails inside its GRU translation (a GRU with an initial state: tf.split of the weights);
    the user got TensorFlow's '{{function_node __wrapped__Split_num_split_3_device_/job:localhost/...}} Number
    of ways to split ...' under 'onnx->tflite failed on source.static.onnx'. Now: the node, the op, the reason,
    and the targets that take the model (x86-cpu and intel-igpu convert this GRU with parity)."""
    from edge.pipeline import convert

    f, hidden = TensorProto.FLOAT, 16
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n)
        for n, s in (("W", (1, 3 * hidden, 16)), ("R", (1, 3 * hidden, hidden)), ("B", (1, 6 * hidden)))
    ]
    model = _onnx(
        tmp_path / "gru.onnx",
        [helper.make_node("GRU", ["x", "W", "R", "B", "", "h0"], ["Y", "Y_h"], name="encoder/gru", hidden_size=hidden)],
        [helper.make_tensor_value_info("x", f, [5, 1, 16]), helper.make_tensor_value_info("h0", f, [1, 1, hidden])],
        [
            helper.make_tensor_value_info("Y", f, [5, 1, 1, hidden]),
            helper.make_tensor_value_info("Y_h", f, [1, 1, hidden]),
        ],
        weights,
    )
    with pytest.raises(ConversionError) as e:
        convert(model, "arm-xnnpack", tmp_path / "b", ConvertRequest(preprocess="none"))
    text = str(e.value)
    assert text.startswith("gru.onnx: onnx2tf cannot translate node 'encoder/gru' (GRU): "), text
    assert "\n" not in text and "function_node" not in text and "source.static" not in text, text
    assert "x86-cpu, intel-igpu" in (e.value.hint or "")
