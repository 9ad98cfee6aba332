"""One point of the tuner's search space (:class:`Config`) and what a device needs to run one: kept apart from
``space`` (which plans a study on the build host and reaches the converters) so the agent's ``cmd/tune``
handler imports no build-host code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from edge.backends.runner import RUNNERS
from edge.backends.threads import usable_cpus  # noqa: F401 - the tuner's CPU count is the runners' own
from edge.backends.tuning import TuneSpace

OBJECTIVES = ("latency", "throughput", "e2e")


def runner_space(runner: str) -> TuneSpace | None:
    """What ``runner`` declares ``edgekit tune`` searches (``Runner.tune_space``); None: it declares nothing, or
    no runner has that name."""
    return RUNNERS.get(runner).tune_space if runner in RUNNERS else None


@dataclass(frozen=True)
class Config:
    """One point of the space: what is converted (runner, precision, recipe) and how it runs (options, workers)."""

    runner: str
    precision: str  # as tuned: fp32, fp16, bf16 (OpenVINO compute precision on an fp32 IR), int8, int8-dynamic
    recipe: tuple[tuple[str, Any], ...] = ()  # convert options set by the search
    options: tuple[tuple[str, Any], ...] = ()  # runner options set by the search
    workers: int = 1
    #: items per inference (objective throughput): converted at this batch, fed N stacked samples
    batch: int = 1

    @property
    def bundle_precision(self) -> str:
        return "fp32" if self.precision == "bf16" else self.precision

    def _compute_options(self) -> frozenset[str]:
        """Options that ask for a compute precision (OpenVINO's inference_precision): the precision says them."""
        rs = runner_space(self.runner)
        return rs.compute_options if rs is not None else frozenset()

    @property
    def id(self) -> str:
        parts = [self.runner, self.precision]
        parts += [f"{k}={word(v)}" for k, v in self.recipe]
        hidden = self._compute_options()
        parts += [f"{k}={word(v)}" for k, v in self.options if k not in hidden]
        if self.workers != 1:
            parts.append(f"workers={self.workers}")
        if self.batch != 1:
            parts.append(f"batch={self.batch}")
        return "/".join(parts)

    def label(self) -> str:
        """Short, for tables: 'openvino int8 threads=2 LATENCY'."""
        rs = runner_space(self.runner)
        short = rs.labels if rs is not None else {}
        hidden = self._compute_options()
        bits = [f"{short.get(k, k)}={word(v)}" for k, v in self.recipe + self.options if k not in hidden]
        if self.workers != 1:
            bits.append(f"workers={self.workers}")
        if self.batch != 1:
            bits.append(f"batch={self.batch}")
        return f"{self.runner} {self.precision} " + " ".join(bits)

    def to_json(self) -> dict[str, Any]:
        return {
            "runner": self.runner,
            "precision": self.precision,
            "recipe": dict(self.recipe),
            "options": dict(self.options),
            "workers": self.workers,
            "batch": self.batch,
        }


def word(v: Any) -> str:
    return json.dumps(v) if isinstance(v, bool) else str(v)
