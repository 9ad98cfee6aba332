"""Models edgekit had not met (issue #23), built in code with onnx.helper: each reproduces a class of fault
that a real pretrained model of that kind hit (a 1-channel OCR recogniser, a keyword spotter, an SSD anchor
detector, a landmark regressor, a text encoder, an already-quantized file). Weights are seeded; every test
asserts what the pipeline concluded, not a threshold tuned to the weights."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _save(path: Path, nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
          outputs: list[onnx.ValueInfoProto], inits: list[onnx.TensorProto]) -> Path:
    g = helper.make_graph(nodes, path.stem.replace("-", "_"), inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


def one_channel_net(path: Path, shape: Sequence[int], *, name: str = "x", classes: int = 8) -> Path:
    """Conv -> ReLU -> global pool -> [1, classes] logits over a 1-channel input: ``[1,1,H,W]`` (a grey text line)
    or ``[1,T,F,1]`` (a spectrogram, transposed to NCHW inside, as TF exports are)."""
    rng = np.random.default_rng(0)
    nhwc = shape[-1] == 1 and shape[1] != 1
    w = numpy_helper.from_array((rng.standard_normal((classes, 1, 3, 3)) * 0.3).astype(np.float32), "W")
    x = name
    nodes = []
    if nhwc:
        nodes.append(helper.make_node("Transpose", [name], ["xt"], perm=[0, 3, 1, 2]))
        x = "xt"
    nodes += [helper.make_node("Conv", [x, "W"], ["c"], pads=[1, 1, 1, 1]),
              helper.make_node("Relu", ["c"], ["r"]),
              helper.make_node("GlobalAveragePool", ["r"], ["g"]),
              helper.make_node("Flatten", ["g"], ["logits"])]
    return _save(path, nodes, [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))],
                 [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])], [w])
