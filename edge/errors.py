"""One error hierarchy. Each error says what is wrong and what to do next.

The CLI prints ``str(err)`` on one line and exits with code 2; anything that is not an
``EdgeError`` is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib


class EdgeError(Exception):
    """Base of every error edgekit raises on purpose."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message} ({hint})")


class InputFileError(EdgeError):
    """A file given by the user is missing, unreadable or not what it claims to be."""


class ModelError(EdgeError):
    """The source model cannot be used as it is (dynamic shapes, bad graph, ...)."""


class TargetError(EdgeError):
    """Unknown target name, or a target profile that fails validation."""


class PrecisionError(EdgeError):
    """A precision the target or converter does not allow."""


class MissingDependencyError(EdgeError):
    """A package, binary or platform a step needs is not present on this host."""


class UnknownBackendError(EdgeError):
    """A converter or runner name that no installed plugin provides."""


class CalibrationError(EdgeError):
    """Calibration data missing, empty, or of the wrong shape/dtype."""


class ConversionError(EdgeError):
    """A converter failed on a model it should handle."""


class ParityError(EdgeError):
    """The converted model does not compute the same thing as the source."""

    def __init__(self, message: str, report: object | None = None, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.report = report


class BudgetError(EdgeError):
    """The benchmark's p99 latency is over the frame budget."""


class BundleError(EdgeError):
    """A bundle is missing, malformed, or its artifacts do not match their hashes."""


class ManifestError(BundleError):
    """A manifest.json that is not a valid manifest: the message names the file and the field."""


class SignatureError(BundleError):
    """A bundle the trust store does not vouch for: unsigned, bad signature, unknown, revoked or expired
    key, an older version than seen, or another target class; or a signing key that cannot be used."""


class DeployError(EdgeError):
    """Shipping to a device store failed or was refused."""


class HardwareUnavailableError(MissingDependencyError):
    """The step needs hardware (GPU, NPU, OS) this host does not have."""


def did_you_mean(name: str, choices: list[str]) -> str:
    """'did you mean 'x86-cpu'? ' for a near miss among ``choices``, else ''."""
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    return f"did you mean {close[0]!r}? " if close else ""
