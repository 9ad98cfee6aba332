"""TFLite sources with a SignatureDef (every TF2 export; issue #23, class 8): the bundle names I/O as the
signature does (``x.1``, ``logits``) while tf2onnx and OpenVINO's TFLite frontend keep the tensor names
(``serving_default_x.1:0``, ``PartitionedCall:0``); the converters rename through the signature. The model is
exported here by TensorFlow in the tflite toolchain (skipped where it is not installed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from edge import toolchains
from edge.backends.litert.format import signature_names
from edge.pipeline import convert
from edge.pipeline.request import ConvertRequest

EXPORT = '''
import sys
import numpy as np
import tensorflow as tf
class M(tf.Module):
    def __init__(self):
        self.w = tf.constant(np.random.default_rng(0).standard_normal((3, 3, 3, 8)).astype(np.float32) * 0.2)
    @tf.function(input_signature=[tf.TensorSpec([1, 32, 32, 3], tf.float32, name="x.1")])
    def __call__(self, x):
        return {"logits": tf.reduce_mean(tf.nn.relu(tf.nn.conv2d(x, self.w, 1, "SAME")), axis=[1, 2])}
m = M()
converter = tf.lite.TFLiteConverter.from_concrete_functions([m.__call__.get_concrete_function()], m)
open(sys.argv[1], "wb").write(converter.convert())
'''


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    st = toolchains.status("tflite")
    if not st.usable:
        pytest.skip(f"needs the tflite toolchain (TensorFlow, tf2onnx): {st.problem}")
    out = tmp_path_factory.mktemp("sig") / "signed.tflite"
    script = out.with_suffix(".py")
    script.write_text(EXPORT)
    subprocess.run([str(st.venv / "bin" / "python"), str(script), str(out)], check=True, capture_output=True,
                   timeout=300)
    return out


def test_the_signature_maps_tensor_names(signed: Path) -> None:
    assert signature_names(signed) == {"serving_default_x.1:0": "x.1", "PartitionedCall:0": "logits"}


@pytest.mark.parametrize("target", ["x86-cpu", "intel-igpu"])
def test_a_tf2_export_converts_with_its_signature_names(signed: Path, tmp_path: Path, target: str) -> None:
    """Before: x86-cpu 'tf2onnx's ONNX of signed.tflite does not take the TFLite's inputs: missing x.1';
    intel-igpu 'bad feeds ... missing input serving_default_x.1:0'."""
    b = convert(signed, target, tmp_path / "out", ConvertRequest(precision="fp32"))
    assert [t.name for t in b.io.inputs] == ["x.1"] and [t.name for t in b.io.outputs] == ["logits"]
    assert b.manifest["parity"]["passed"] is True
    assert b.manifest["chain"][0]["details"]["io_renamed_to_signature"] == {
        "serving_default_x.1:0": "x.1", "PartitionedCall:0": "logits"}
