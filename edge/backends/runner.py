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
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, TypeVar

if TYPE_CHECKING:  # numpy is imported where a runner runs (12 MB of RSS the agent's manifest checks do not need)
    import numpy as np


from edge.backends.options import DeviceOption, device_option, option_docs, read_options
from edge.backends.registry import Registry
from edge.backends.tuning import TuneSpace
from edge.capabilities import CpuIsa, Host, Requirement, problems, require
from edge.errors import EdgeError
from edge.spec import TensorSpec

_R = TypeVar("_R", bound="Runner")  # what a with-statement on a runner gives: the runner, as its own class


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
    #: (runner, options, what it is) that computes on a build host what this runner will compute on the
    #: device, for parity where this runner cannot run (TensorRT: onnxruntime on the prepared ONNX)
    host_proxy: ClassVar[tuple[str, dict[str, Any], str] | None] = None
    requires: ClassVar[tuple[Requirement, ...]] = ()
    #: at precision fp16 the device stores activations in fp16 (not only weights): the build host runs the
    #: fp16 proxy (``edge.verify.fp16proxy``) beside the f32 parity
    computes_fp16: ClassVar[bool] = False
    #: the precision this runner may compute in on a CPU that has it, faster and coarser than the bundle's (OpenVINO:
    #: bf16), asked for with the runner option ``inference_precision = "fast"``: the build host tries it against
    #: parity (``edge.pipeline.precision_trial``) and the bundle asks for it only where it passed. None: no such
    #: precision to try
    fast_cpu_precision: ClassVar[str | None] = None
    #: what ``edgekit tune`` searches for this runner (``edge.backends.tuning``), declared in its backend's
    #: ``format.py``; None: the tuner has no search space for it
    tune_space: ClassVar[TuneSpace | None] = None
    #: the runner's options, declared once (``edge.backends.options``): a frozen dataclass in its backend's
    #: ``format.py``; ``options`` and the manifest's checks and schema derive from it
    options_class: ClassVar[type | None] = None
    #: options only the device gives (a library, a device node, a directory): name -> its declaration (its
    #: description, and the environment variable the runner reads it from, if any), or the description alone;
    #: refused in a manifest, which says where to give it instead (``edge.bundle.schema.device_only_hint``)
    device_options: ClassVar[Mapping[str, DeviceOption | str]] = {}
    #: option name -> description (what `edgekit doctor` and the CLI print): ``options_class``'s fields, then
    #: ``device_options``; a runner without an ``options_class`` declares it itself
    options: ClassVar[Mapping[str, str]] = {}

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    info: RunnerInfo
    _closed: bool = False  # set by close(); validate() refuses use after it
    _signature: tuple[tuple[str, tuple[int | str, ...], np.dtype], ...] | None = None  # inputs, built on first use

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = cls.__dict__.get("options_class")
        if declared is not None and "options" not in cls.__dict__:
            cls.options = {**option_docs(declared), **{k: device_option(v).doc for k, v in cls.device_options.items()}}

    def __init__(self, artifact: Path, *, options: Mapping[str, Any] | None = None, precision: str = "fp32") -> None:
        require(self.requires, f"runner {self.name!r}")
        unknown = [k for k in (options or {}) if k not in self.options]
        if unknown:
            raise EdgeError(
                f"runner {self.name!r} does not take option(s) {', '.join(unknown)}; it takes: {', '.join(self.options) or 'none'}"
            )
        self.artifact = Path(artifact)
        self.precision = precision
        self._options = dict(options or {})
        #: the options read into ``options_class`` (types and ranges checked, defaults filled in); None without one
        self.typed_options: Any = None
        if self.options_class is not None:
            self.typed_options = read_options(
                self.name, self.options_class, {k: v for k, v in self._options.items() if k not in self.device_options}
            )

    @classmethod
    def fp16_trial_skip(cls, precision: str, isa: CpuIsa) -> str | None:
        """Why the build host does not try fp16 compute on the CPU for a bundle of ``precision`` on a CPU ``isa``
        (recorded in the manifest, ``edge.pipeline.precision_trial``); None where no such trial applies (the
        default: this runner has no CPU fp16 compute to ask for)."""
        return None

    @classmethod
    def problems(cls, host: Host | None = None) -> list[str]:
        return problems(cls.requires, host)

    @abstractmethod
    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once. ``feeds`` maps every input name to an array of its spec's shape and dtype.

        Implementations start with ``self.validate(feeds)``: wrong, missing or unknown feeds and
        a closed runner then fail the same way, as an ``EdgeError``, in every runner."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the runtime session. Overrides call ``super().close()`` so ``validate`` refuses later use."""
        self._closed = True

    def __enter__(self: _R) -> _R:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- feed validation: one fast path for every runner's hot loop ------------------------

    def check_open(self) -> None:
        if self._closed:
            raise EdgeError(
                f"runner {self.name!r} for {self.artifact} is closed",
                hint="open a new runner (Bundle.open_runner) to infer again",
            )

    def validate(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Refuse a closed runner, and feeds that are not exactly ``self.inputs``, with an ``EdgeError``.

        Fast path (every infer call): per input one dict lookup, a shape tuple compare and a dtype
        identity check (numpy's builtin dtypes are singletons). Anything else -- dynamic dims, a
        list instead of an array, an equal but distinct dtype object -- goes to ``check_feeds``,
        which accepts what is right and names everything that is wrong."""
        if self._closed:
            self.check_open()
        sig = self._signature
        if sig is None:
            import numpy as np

            sig = self._signature = tuple((t.name, tuple(t.shape), np.dtype(t.dtype)) for t in self.inputs)
        if len(feeds) == len(sig):
            try:
                for name, shape, dtype in sig:
                    a = feeds[name]
                    if a.shape != shape or a.dtype is not dtype:
                        break
                else:
                    return
            except (KeyError, AttributeError, TypeError):
                pass
        self.check_feeds(feeds)

    def check_feeds(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Every problem with ``feeds`` against ``self.inputs`` in one ``EdgeError``; dynamic dims match any size."""
        import numpy as np

        problems_: list[str] = []
        names = {t.name for t in self.inputs}
        for t in self.inputs:
            if t.name not in feeds:
                problems_.append(f"missing input {t.name!r} ({t.dtype} {_dims(t.shape)})")
                continue
            a = feeds[t.name]
            if not isinstance(a, np.ndarray):
                problems_.append(
                    f"input {t.name!r} is a {type(a).__name__}, expected a numpy array ({t.dtype} {_dims(t.shape)})"
                )
                continue
            if not _shape_matches(a.shape, t.shape):
                problems_.append(f"input {t.name!r} has shape {_dims(a.shape)}, expected {_dims(t.shape)}")
            if a.dtype != np.dtype(t.dtype):
                problems_.append(f"input {t.name!r} has dtype {a.dtype}, expected {t.dtype}")
        problems_ += [f"unknown input {k!r} (inputs: {', '.join(sorted(names))})" for k in feeds if k not in names]
        if problems_:
            raise EdgeError(
                f"runner {self.name!r}: bad feeds for {self.artifact}: " + "; ".join(problems_),
                hint="build feeds from runner.inputs (name, shape, dtype)",
            )


def _dims(shape: tuple[int | str, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _shape_matches(got: tuple[int, ...], spec: tuple[int | str, ...]) -> bool:
    """Same rank, and every static dim of ``spec`` equal (a str or non-positive dim is dynamic)."""
    return len(got) == len(spec) and all(not isinstance(d, int) or d <= 0 or g == d for g, d in zip(got, spec))


RUNNERS: Registry[Runner] = Registry("edgekit.runners", "runner")
