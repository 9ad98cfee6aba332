"""A runner's (or a converter's) options, declared once: a frozen dataclass per runner in its backend's ``format.py``,
per converter beside it (``options_class`` on the converter class: ``onnx->openvino-ir``'s in ``openvino/convert.py``).

Each field is one option: its type and range (``edge.base.typedjson.spec`` rules), its default and its
description (``doc``); a rule across options is its ``invalid()`` method. From that one declaration come the runner's ``options`` (the names and descriptions
``edgekit doctor`` and the CLI print), the check of what a profile, overlay, agent flag or manifest gives it
(:func:`read_options`, run by ``Runner.__init__`` and by the manifest reader) and the manifest's JSON Schema.
A plugin runner declares its own the same way (``options_class`` on its class); nothing else lists them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from edge.base.typedjson import Invalid, read, to_json
from edge.errors import EdgeError

#: thread counts: 0 is the runtime's (or edgekit's) choice
THREADS: dict[str, Any] = dict(ge=0, le=4096)
#: cores this process's other threads take (edgekit run reserves its pipeline stages)
RESERVE_CPUS_DOC = (
    "cores this process's other threads take (edgekit run reserves its pipeline stages); the "
    "automatic thread count leaves them free. Default 0"
)


@dataclass(frozen=True)
class DeviceOption:
    """An option only the device gives (a library to load, a device node, a directory to write): declared once on
    the runner (``Runner.device_options``), described by ``doc``, refused in a manifest with :meth:`hint`, which
    says where it belongs: the environment variable ``env`` where the runner reads one, else the agent's flag."""

    doc: str
    env: str | None = None
    example: str = "/abs/path"

    def hint(self, key: str) -> str:
        """Where to give option ``key`` instead of in a bundle."""
        flag = f"the agent's --runner-option {key}={self.example}"
        return f"set {self.env} on the device, or {flag}" if self.env else f"give it on the device: {flag}"


def device_option(value: DeviceOption | str) -> DeviceOption:
    """A ``device_options`` entry as a :class:`DeviceOption` (a plugin may give the description alone)."""
    return value if isinstance(value, DeviceOption) else DeviceOption(doc=value)


#: thread counts a tuner tries (filtered to the CPUs this process may use)
THREAD_SEARCH = (1, 2, 4, 8, 16)


def search_values(cls: type, first: str | None = None) -> dict[str, tuple[Any, ...]]:
    """Option name -> the values a tuner tries (``spec(..., search=...)`` on the field), in declaration order with
    ``first`` (the thread count) ahead of the rest."""
    found = {f.name: f.metadata["search"] for f in dataclasses.fields(cls) if "search" in f.metadata}
    return {k: found[k] for k in sorted(found, key=lambda k: k != first)}


def option_docs(cls: type) -> dict[str, str]:
    """Option name -> its description, in declaration order."""
    out: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        rule = f.metadata.get("rule")
        doc = getattr(rule, "doc", None)
        if not doc:
            raise EdgeError(f"option {cls.__name__}.{f.name} has no description (spec(..., doc=...))")
        out[f.name] = doc
    return out


def read_options(runner: str, cls: type, options: Mapping[str, Any], kind: str = "runner") -> Any:
    """``options`` read into ``cls`` (unknown names, wrong types and out-of-range values refused, defaults
    filled in); one line naming the runner (or the converter: ``kind``) and the option otherwise."""
    try:
        typed = read(cls, to_json(dict(options)), "options")
    except Invalid as e:
        where = e.where.removeprefix("options.").removeprefix("options")
        raise EdgeError(f"{kind} {runner!r}: option {where or '(all)'} {e.problem}") from None
    bad = typed.invalid() if hasattr(typed, "invalid") else None  # a rule across options (``invalid()``)
    if bad is not None:
        raise EdgeError(f"{kind} {runner!r}: option {bad[0]} {bad[1]}")
    return typed
