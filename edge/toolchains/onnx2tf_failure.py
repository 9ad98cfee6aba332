"""What stopped onnx2tf, as one line naming the ONNX node and its op: read in the ``tflite`` toolchain by
``tflite_driver.py`` (loaded from its directory; standard library only).

onnx2tf fails in two ways. An op's translation raises (TensorFlow's errors inside ``onnx2tf/ops/<Op>.py``
``make_node``): :func:`node_error`. Or onnx2tf logs an ``ERROR:`` line and calls ``sys.exit(1)`` (an op it cannot
translate with these attributes: ScatterElements with ``reduction="add"``, an If branch holding an op it lacks, a
ConvTranspose it needs parameters for): :func:`exit_error` reads the reason from what onnx2tf logged and the node
from the exit's traceback, which passes through that op's ``make_node`` (its ``graph_node`` is the ONNX node), as
an exception's does. Each returns ``(kind, message, data)`` for the driver's error event.
"""

from __future__ import annotations

import os
import re
from typing import Any

#: what onnx2tf logs after every failure, whatever it was: advice for its own CLI, not the reason
_BOILERPLATE = (
    "The trace log is below.",
    "input_onnx_file_path:",
    "onnx_op_name:",
    "Read this and deal with it.",
    "Alternatively, if the input OP",
    "If the input OP of ONNX",
    "Also, for models that include",
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def failing_node(tb: Any) -> Any:
    """The ONNX node (onnx_graphsurgeon's) whose translation was running, the innermost one, or None."""
    node = None
    while tb is not None:
        f = tb.tb_frame
        if f.f_code.co_name == "make_node" and f"onnx2tf{os.sep}ops{os.sep}" in f.f_code.co_filename:
            node = f.f_locals.get("graph_node") or node
        tb = tb.tb_next
    return node


def _named(node: Any, reason: str, fallback: str) -> tuple[str, str, dict[str, Any]]:
    if node is None:
        return "onnx2tf", f"{fallback}: {reason}", {}
    op, name = str(getattr(node, "op", "?")), str(getattr(node, "name", "") or "?")
    return "onnx2tf_node", f"onnx2tf cannot translate node {name!r} ({op}): {reason}", {"op": op, "node": name}


def node_error(e: BaseException) -> tuple[str, str, dict[str, Any]]:
    """An exception inside one op's translation: that node, its op and the reason without TensorFlow's
    function-node noise."""
    reason = re.sub(r"\{\{function_node [^}]*\}\}\s*|\s*\[Op:\w+\]( name: \S*)?", "", str(e)).strip()
    reason = f"{type(e).__name__}: {' '.join(reason.split())[:300]}"
    return _named(failing_node(e.__traceback__), reason, "onnx2tf failed")


def logged_reason(log_text: str) -> str | None:
    """The last ``ERROR:`` onnx2tf logged before it gave up (its continuation lines joined), boilerplate aside."""
    found: list[str] = []
    current: list[str] | None = None
    for raw in _ANSI.sub("", log_text).splitlines():
        line = raw.strip()
        if line.startswith("ERROR:"):
            text = line.removeprefix("ERROR:").strip()
            current = None if not text or text.startswith(_BOILERPLATE) else [text]
            if current is not None:
                found.append("")
        elif current is not None and line and not line.startswith(("WARNING:", "INFO:", "Traceback")):
            current.append(line)
        else:
            current = None
        if current is not None:
            found[-1] = " ".join(current)
    return found[-1][:300] if found else None


def exit_error(e: SystemExit, log_text: str) -> tuple[str, str, dict[str, Any]]:
    """onnx2tf's ``sys.exit``: the node whose translation called it and the reason it logged (``log_text``: what it
    wrote to the log during this run)."""
    reason = logged_reason(log_text) or "it logged no reason"
    return _named(failing_node(e.__traceback__), reason, f"onnx2tf stopped (exit {e.code})")
