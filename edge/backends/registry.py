"""One registry mechanism for converters and runners, built-in or third-party.

Built-ins are declared as entry points in ``pyproject.toml`` exactly as a plugin would
declare its own (groups ``edgekit.converters`` and ``edgekit.runners``). Entry points are
loaded only when a name is asked for, so listing backends imports no runtime.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import ClassVar, Generic, Protocol, TypeVar

from edge.errors import EdgeError, UnknownBackendError, did_you_mean


class Named(Protocol):
    """What a registry holds: a class that names itself (``Converter.name``, ``Runner.name``)."""

    name: ClassVar[str]


T = TypeVar("T", bound=Named)


class Registry(Generic[T]):
    def __init__(self, group: str, kind: str) -> None:
        self.group = group
        self.kind = kind
        self._entry_points: dict[str, EntryPoint] | None = None
        self._loaded: dict[str, type[T]] = {}

    def _eps(self) -> dict[str, EntryPoint]:
        if self._entry_points is None:
            found: dict[str, EntryPoint] = {}
            for ep in entry_points(group=self.group):
                if ep.name in found and found[ep.name].value != ep.value:
                    raise EdgeError(
                        f"two installed packages register the {self.kind} {ep.name!r}: {found[ep.name].value} and {ep.value}",
                        hint="uninstall one of them",
                    )
                found[ep.name] = ep
            if not found and not self._loaded:
                raise EdgeError(
                    f"no {self.kind}s are registered (entry point group {self.group!r} is empty)",
                    hint="edgekit must be installed, not just put on sys.path: pip install -e .",
                )
            self._entry_points = found
        return self._entry_points

    def names(self) -> list[str]:
        return sorted(set(self._eps()) | set(self._loaded))

    def __contains__(self, name: str) -> bool:
        return name in self._loaded or name in self._eps()

    def get(self, name: str) -> type[T]:
        if name in self._loaded:
            return self._loaded[name]
        eps = self._eps()
        if name not in eps:
            names = self.names()
            raise UnknownBackendError(
                f"no {self.kind} named {name!r}; {did_you_mean(name, names)}installed: {', '.join(names)}",
                hint=f"a plugin adds one through the {self.group!r} entry point group",
            )
        cls: type[T] = eps[name].load()
        if getattr(cls, "name", None) != name:
            raise EdgeError(f"entry point {name!r} loads {cls!r}, whose name is {getattr(cls, 'name', None)!r}")
        self._loaded[name] = cls
        return cls

    def register(self, cls: type[T]) -> type[T]:
        """Register a class at run time (tests, notebooks). Plugins should use entry points."""
        name = cls.name
        if name in self and self.get(name) is not cls:
            raise EdgeError(f"a {self.kind} named {name!r} is already registered")
        self._loaded[name] = cls
        return cls

    def unregister(self, name: str) -> None:
        self._loaded.pop(name, None)
