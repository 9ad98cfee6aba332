"""onnx2tf's own failure report read into one line (edge/toolchains/onnx2tf_failure.py, run in the tflite toolchain
by tflite_driver.py). The real run is tests/backends/test_litert_convert.py::test_an_op_onnx2tf_exits_on_is_named_with_
its_reason; here, the reader on what that run logged (onnx2tf 1.29.24), colour codes included."""

from __future__ import annotations

from edge.toolchains.onnx2tf_failure import logged_reason

RED, RESET = "\x1b[31m", "\x1b[0m"
LOGGED = f"""\
\x1b[33mWARNING:{RESET} Failed to optimize the onnx file.

{RED}ERROR:{RESET} ScatterElements currently supports only reduction=['none']. Pull requests are welcome.{" "}
graph_node.name: scatter_add reduction: add
{RED}ERROR:{RESET} The trace log is below.
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/onnx2tf/ops/ScatterElements.py", line 134, in make_node
    sys.exit(1)
SystemExit: 1

{RED}ERROR:{RESET} input_onnx_file_path: /tmp/edgekit-tflite-ifzmix55/source.onnx
{RED}ERROR:{RESET} onnx_op_name: scatter_add
{RED}ERROR:{RESET} Read this and deal with it. https://github.com/PINTO0309/onnx2tf#parameter-replacement
{RED}ERROR:{RESET} Alternatively, if the input OP has a dynamic dimension, use the -b or -ois option.
{RED}ERROR:{RESET} Also, for models that include NonMaxSuppression in the post-processing, try the -onwdt option.
"""


def test_the_reason_is_the_last_error_onnx2tf_logged_not_its_advice() -> None:
    assert logged_reason(LOGGED) == (
        "ScatterElements currently supports only reduction=['none']. Pull requests are welcome. "
        "graph_node.name: scatter_add reduction: add"
    )
    assert logged_reason("WARNING: nothing wrong\n") is None
    assert logged_reason(f"{RED}ERROR:{RESET} onnx_op_name: n\n{RED}ERROR:{RESET} Read this and deal with it.") is None
