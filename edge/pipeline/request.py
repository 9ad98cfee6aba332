"""``ConvertRequest``: what a conversion is asked to do, declared once.

``edgekit convert``, ``deploy``, ``tune`` and ``fleet tune`` take the same convert options (precision,
calibration, input shapes, pre-processing, frozen inputs, parity data and task, ...). Each CLI command builds
one ``ConvertRequest`` and the library passes that object on: ``edge.pipeline.convert``, ``edge.deploy.deploy``,
``edge.tune.search.tune`` and ``edge.tune.remote.tune_on_device`` read their fields from it, so an option is
named, typed and defaulted in one place instead of in six signatures.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from edge.errors import EdgeError
from edge.verify.refpairs import MAX_PARITY_SAMPLES
from edge.verify.tasks import TASK_CHOICES

#: inputs compared against the source model when the request names no other count
PARITY_SAMPLES = 32

PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class ConvertRequest:
    """The options of one conversion (every field has the CLI's default).

    ``precision``: the target's default when None (``keep``: ship the source's own). ``calib``: calibration data
    (a directory or file of tensors/images, or ``"random"``). ``input_shapes``: dynamic inputs fixed,
    ``{"input": (1, 3, 224, 224)}``. ``preprocess``: a preset of ``edge.spec.PRESETS``, ``"none"``, or ``"auto"`` (from the input);
    ``letterbox``: None = the preset's. ``freeze``: ONNX inputs fixed to values (``{"sr": "16000"}``;
    ``edge.graph.freeze``). ``parity_data``: the inputs parity compares on; ``parity_samples``: how many;
    ``task``: how parity judges outputs (``edge.verify.tasks.TASK_CHOICES``). ``accept_parity_failure``: keep
    a bundle that fails the gate (recorded). ``allow_requantize`` and ``eval_text``: for GGUF sources.
    ``tuned``: an ``edgekit tune`` overlay (its file or an ``edge.pipeline.overlay.TunedOverlay``) applied to the
    target. ``targets_dir``: extra directories of target profiles."""

    precision: str | None = None
    calib: PathLike | None = None
    input_shapes: Mapping[str, Sequence[int]] = field(default_factory=dict)
    preprocess: str = "auto"
    letterbox: bool | None = None
    freeze: Mapping[str, str] | None = None
    parity_data: PathLike | None = None
    parity_samples: int = PARITY_SAMPLES
    task: str = "auto"
    accept_parity_failure: bool = False
    allow_requantize: bool = False
    eval_text: PathLike | None = None
    tuned: Any = None
    targets_dir: Sequence[PathLike] = ()

    def __post_init__(self) -> None:
        if self.task not in TASK_CHOICES:
            raise EdgeError(f"unknown --task {self.task!r}", hint=f"choose one of {', '.join(TASK_CHOICES)}")
        if isinstance(self.parity_samples, bool) or not isinstance(self.parity_samples, int):
            raise EdgeError(f"parity samples must be an integer, got {self.parity_samples!r}")
        if not 0 <= self.parity_samples <= MAX_PARITY_SAMPLES:  # what a device believes a record about
            raise EdgeError(f"--parity-samples must be 0..{MAX_PARITY_SAMPLES}, got {self.parity_samples}")
        # normalised once, so every reader (and the tuner's recipe key) sees the same types
        object.__setattr__(
            self, "input_shapes", {str(k): tuple(int(d) for d in v) for k, v in (self.input_shapes or {}).items()}
        )
        object.__setattr__(self, "targets_dir", tuple(Path(d) for d in self.targets_dir))

    def replace(self, **changes: Any) -> ConvertRequest:
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)
