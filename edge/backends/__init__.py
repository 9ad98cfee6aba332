"""Backends: one package per runtime, its bundle format, converter and runner side by side.

``edge/backends/<name>/format.py`` says what a bundle of that format contains and how to read it
(both sides use it); ``convert.py`` is build-host code; ``run.py`` is what a device imports. Nothing
a runner imports pulls converter code (``tests/test_layering.py``). Importing this package imports
no runtime: the registries load a backend only when a name is asked for.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_LAZY = {
    "CONVERTERS": "converter",
    "ConversionRequest": "converter",
    "ConversionResult": "converter",
    "Converter": "converter",
    "RUNNERS": "runner",
    "Runner": "runner",
    "RunnerInfo": "runner",
}


def __getattr__(name: str) -> Any:  # PEP 562: a runner's import does not pull the converter base
    if name in _LAZY:
        return getattr(import_module(f"edge.backends.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'edge.backends' has no attribute {name!r}")


__all__ = ["CONVERTERS", "ConversionRequest", "ConversionResult", "Converter", "RUNNERS", "Runner", "RunnerInfo"]
