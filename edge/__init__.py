"""edgekit: convert a model for an edge device, prove it still computes the same thing,
measure it against a frame budget and ship a verified bundle.

The package imports nothing heavy at start-up: runtimes (onnxruntime, OpenVINO, ...)
are imported inside the converter or runner that needs them.
"""

__version__ = "0.1.0"

from edge.errors import EdgeError

__all__ = ["EdgeError", "__version__"]
