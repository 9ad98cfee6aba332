"""What ``edgekit tune`` searches for a runner, declared by the runner (``Runner.tune_space``) in its own folder.

Olive's ``OrtSessionParamsTuning`` is the model: the values tried sit on the option fields themselves
(``spec(search=...)``, read by :func:`edge.backends.options.search_values`); this declaration adds what the
tuner needs beyond them -- which converter feeds the runner, the recipe knobs per precision, the rule that says
which combinations of options cannot run or cannot differ, and where else the runner serves. ``edge.tune.space``
reads it for every runner and names none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from edge.backends.options import search_values


def no_conflict(opts: Mapping[str, Any], cpus: int) -> str | None:
    """The default cross-option rule: every combination is worth a trial."""
    return None


def not_reported() -> list[str] | None:
    """The default compute-capability query: nothing reported."""
    return None


@dataclass(frozen=True)
class TuneSpace:
    #: the runner's options class: the values tried are its fields' ``search`` values
    options_class: type
    converter: str  # the one converter that takes an ONNX source to what the runner loads
    home: str  # the shipped target whose convert options this runner takes on a target with another chain
    #: the runner option naming the thread count (the tuner filters its values to this host's CPUs)
    threads_option: str | None = None
    #: precision -> convert knob -> values tried (the first is the default)
    recipes: Mapping[str, Mapping[str, tuple[Any, ...]]] = field(default_factory=dict)
    #: a target whose accelerator is a plain CPU of one of these architectures is served by this runner too
    cpu_archs: tuple[str, ...] = ()
    #: runner options set when it serves another target's device class, and what that means (a note)
    elsewhere: Mapping[str, Any] = field(default_factory=dict)
    elsewhere_note: str = ""
    #: why a combination of runner options cannot run or cannot differ from another one on ``cpus`` CPUs
    #: ("what: why"), None when it is worth a trial; the runner's own rules and words
    conflict: Callable[[Mapping[str, Any], int], str | None] = no_conflict
    #: options tried for the throughput objective only: name -> (the value every other objective keeps, why: a
    #: phrase after the runner's name, with ``{objective}``), pruned with that reason where a value is dropped
    throughput_only: Mapping[str, tuple[Any, str]] = field(default_factory=dict)
    #: options whose values above this host's usable CPUs are pruned: name -> why (with ``{cpus}``)
    cpu_capped: Mapping[str, str] = field(default_factory=dict)
    #: option -> its "not set" value: a trial at that value leaves the option out (its id stays what it was)
    unset: Mapping[str, Any] = field(default_factory=dict)
    #: option or recipe knob -> its short name in the tuner's tables ("threads", "hint")
    labels: Mapping[str, str] = field(default_factory=dict)
    #: options the deploy's budget search varies besides the thread count (the rest stay at their defaults)
    budget_vary: tuple[str, ...] = ()
    #: precisions tuned as the runner's compute precision on an fp32 artifact (not produced by the converter) ->
    #: the runner options that ask for it; each only where :attr:`compute_capabilities` lists it (upper case)
    compute_precisions: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    compute_capabilities: Callable[[], list[str] | None] = not_reported
    capability_source: str = ""  # who reports the capabilities, for the pruning message

    @property
    def compute_options(self) -> frozenset[str]:
        """The options that ask for a compute precision: the trial's precision already says them (left out of ids)."""
        return frozenset(k for opts in self.compute_precisions.values() for k in opts)

    @property
    def options(self) -> dict[str, tuple[Any, ...]]:
        """Runner option -> values tried (the first is the default), the thread option first."""
        return search_values(self.options_class, first=self.threads_option)
