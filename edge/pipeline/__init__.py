"""The one conversion pipeline: source adapters, the planner, ``convert``.

``edge.pipeline.convert`` takes ONNX, TFLite, OpenVINO IR, TorchScript / torch.export and GGUF
sources through one planner, one parity service and one manifest builder (see ``pipeline.py``; a GGUF
language model takes ``gguf.py``'s quantize-and-quality-gate path);
``overlay`` reads the tuned settings (``edgekit tune``'s output) it applies to a profile.
Build-host code: nothing a device imports pulls it (``tests/test_layering.py``).
"""

from edge.pipeline.pipeline import convert
from edge.pipeline.plan import KEEP, Plan, PlannedStep, conversion_problems, plan, resolve_chain, runnable_here
from edge.pipeline.request import ConvertRequest
from edge.pipeline.sources import Source, open_source

__all__ = [
    "convert",
    "ConvertRequest",
    "KEEP",
    "Plan",
    "PlannedStep",
    "conversion_problems",
    "plan",
    "resolve_chain",
    "runnable_here",
    "Source",
    "open_source",
]
