"""Fixes to tf2onnx applied inside the ``tflite`` toolchain before it reads a model (imported by tflite_driver.py as a
sibling module; it must not import ``edge``: edgekit is not installed there).

tf2onnx 1.17.0 drops a FULLY_CONNECTED op's bias when the op flattens its input (``keep_num_dims`` false, input of
rank > 2: onnx2tf writes one after a MEAN that keeps its dims, [1, 1, 1, C]): its handler rewires the op to
``[Reshape(input), weights]`` and then adds the bias only ``if len(node.input) == 3``, which no longer holds. Found
converting an onnx2tf-made classifier (tiny CNN: conv, global mean, dense) for x86-cpu: outputs off by the bias
(max |diff| 44 on logits of magnitude ~3, parity cosine 0.81). The wrapped handler adds the Add that was lost.
"""

from __future__ import annotations

from typing import Any

_DOMAIN = "com.google.tensorflow"
_OP = "TFL_FULLY_CONNECTED"


def keep_fully_connected_bias() -> bool:
    """Wrap tf2onnx's FULLY_CONNECTED handler so that a flattened op keeps its bias; True when applied."""
    import tf2onnx.tflite_handlers  # noqa: F401 - registers the handlers (tf2onnx imports them only when converting)
    from tf2onnx.handler import tf_op

    table = tf_op.get_opsets().get(_DOMAIN, [{}])[0]
    if _OP not in table or getattr(table[_OP][0], "edgekit_fix", False):
        return False
    handler, kwargs = table[_OP]

    def to_tf(ctx: Any, node: Any, **kw: Any) -> None:
        flattens = node.attr["keep_num_dims"].i == 0 and ctx.get_rank(node.input[0]) != 2
        bias = node.input[2] if len(node.input) == 3 and flattens else None
        handler(ctx, node, **kw)
        if bias is not None and len(node.input) == 2:  # the handler dropped it: add it after the MatMul
            add = ctx.insert_new_node_on_output("Add", node.output[0], inputs=[node.output[0], bias])
            add.skip_conversion = True

    to_tf.edgekit_fix = True  # type: ignore[attr-defined]
    table[_OP] = (to_tf, kwargs)
    return True
