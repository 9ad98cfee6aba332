"""The runner contract: load an artifact, describe its I/O, run it.

Runners own a runtime session and release it in ``close()`` (or on leaving a ``with``
block). They import their runtime inside ``__init__`` so the agent on a device only ever
imports the runtime its bundle needs. ``info`` states the device and the precision the
runtime actually uses: a fallback is reported, never silent.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping

import numpy as np

from edge.capabilities import Host, Requirement, problems, require
from edge.errors import EdgeError
from edge.registry import Registry
from edge.spec import TensorSpec


@dataclass(frozen=True)
class RunnerInfo:
    runtime: str  # "onnxruntime 1.31.1"
    device_requested: str
    device_used: str
    precision_used: str  # what the runtime computes in ("f32", "bf16", ...)
    threads: int | None = None
    fallback: str | None = None  # why device_used differs from device_requested
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Runner(ABC):
    name: ClassVar[str]
    formats: ClassVar[tuple[str, ...]]  # artifact formats it loads
    requires: ClassVar[tuple[Requirement, ...]] = ()
    options: ClassVar[Mapping[str, str]] = {}

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    info: RunnerInfo

    def __init__(self, artifact: Path, *, options: Mapping[str, Any] | None = None, precision: str = "fp32") -> None:
        require(self.requires, f"runner {self.name!r}")
        unknown = [k for k in (options or {}) if k not in self.options]
        if unknown:
            raise EdgeError(f"runner {self.name!r} does not take option(s) {', '.join(unknown)}; "
                            f"it takes: {', '.join(self.options) or 'none'}")
        self.artifact = Path(artifact)
        self.precision = precision
        self._options = dict(options or {})

    @classmethod
    def problems(cls, host: Host | None = None) -> list[str]:
        return problems(cls.requires, host)

    @abstractmethod
    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once. ``feeds`` maps every input name to an array of its spec's shape and dtype."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the runtime session."""

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check_feeds(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Explicit, readable errors for wrong feeds (used by tools; ``infer`` stays lean)."""
        problems_: list[str] = []
        names = {t.name for t in self.inputs}
        for t in self.inputs:
            if t.name not in feeds:
                problems_.append(f"missing input {t.name!r}")
                continue
            a = feeds[t.name]
            if tuple(a.shape) != tuple(t.shape):
                problems_.append(f"input {t.name!r} has shape {tuple(a.shape)}, expected {tuple(t.shape)}")
            if a.dtype != np.dtype(t.dtype):
                problems_.append(f"input {t.name!r} has dtype {a.dtype}, expected {t.dtype}")
        problems_ += [f"unknown input {k!r}" for k in feeds if k not in names]
        if problems_:
            raise EdgeError("bad feeds for " + str(self.artifact) + ": " + "; ".join(problems_))


RUNNERS: Registry[Runner] = Registry("edgekit.runners", "runner")
