"""``doctor``: per target, can this host convert for it, can it run it, and what is missing."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable

from edge.capabilities import Host, current_host
from edge.pipeline import conversion_problems, runnable_here
from edge.targets import TargetProfile, load_targets
from edge.toolchains import aarch64, aarch64_executorch


@dataclass(frozen=True)
class TargetHealth:
    target: TargetProfile
    convert_problems: tuple[str, ...]
    run_problem: str | None

    @property
    def can_convert(self) -> bool:
        return not self.convert_problems

    @property
    def can_run(self) -> bool:
        return self.run_problem is None

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target.name,
            "can_convert": self.can_convert,
            "convert_problems": list(self.convert_problems),
            "can_run": self.can_run,
            "run_problem": self.run_problem,
            "runner": self.target.runner,
            "chain": [s.converter for s in self.target.chain],
        }


def doctor(targets_dir: Iterable[str | os.PathLike[str]] = (), host: Host | None = None) -> list[TargetHealth]:
    host = host or current_host()
    return [
        TargetHealth(t, tuple(conversion_problems(t, host)), runnable_here(t, host))
        for t in load_targets(targets_dir).values()
    ]


def emulation() -> dict[str, dict[str, Any]]:
    """Per device ISA this host can check under emulation (``edgekit verify --isa``): ready or not, and one line
    saying what it runs with, how to install it, or what this host lacks."""
    st = aarch64.status()
    detail = f"{aarch64.describe()}; executorch-xnnpack bundles: {aarch64_executorch.describe()}"
    return {aarch64.ISA: {"ready": st.usable, "detail": detail}}
