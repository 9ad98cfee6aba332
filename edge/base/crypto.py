"""The one import of the ``cryptography`` package's Ed25519 primitives (bundle signatures, device identity keys), with
a one-line install hint naming what needed it when the package is missing."""

from __future__ import annotations

from typing import Any

from edge.errors import MissingDependencyError


def ed25519(needed_for: str, extra: str) -> Any:
    """``cryptography.hazmat.primitives.asymmetric.ed25519``; MissingDependencyError saying ``needed_for`` needs it and
    how to install the extra that brings it."""
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519 as module
    except ImportError:
        raise MissingDependencyError(
            f"{needed_for} needs the cryptography package", hint=f"pip install 'edgekit-ml[{extra}]'"
        ) from None
    return module
