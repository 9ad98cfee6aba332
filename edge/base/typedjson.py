"""Typed JSON: frozen dataclasses read from untrusted JSON, checked field by field, and their JSON Schema.

One declaration serves both directions: a dataclass's type hints plus the :class:`Rule` in each
field's metadata say what a value may be, :func:`read` checks a parsed document against them
and builds the frozen object, and :func:`json_schema` writes the same rules as JSON Schema
(draft 2020-12) for people and other tools. Nothing here trusts the input: every type, length,
range and pattern is checked, free-form parts are bounded in depth and size, and every problem
is an :class:`Invalid` naming the field's path -- never a ``TypeError``/``KeyError``/
``RecursionError`` from the data.

Supported types: ``str``, ``int`` (``bool`` refused), ``float`` (ints accepted), ``bool``,
``None``, ``Literal[...]``, ``X | Y``, ``tuple[X, ...]``, ``tuple[X, Y]``, ``Mapping[str, X]``,
nested dataclasses, :data:`JSON` (free-form, bounded) and ``Annotated[A | B, Tagged(choose)]``
(a union whose member is picked by ``choose(raw)``, written as ``oneOf``).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import json
import math
import os
import re
import stat
import tempfile
import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Callable, Literal, Mapping, NewType, Union, get_args, get_origin

from edge.errors import InputFileError

#: free-form JSON (objects become read-only mappings, arrays tuples), bounded by :data:`FREE_DEPTH`
JSON = NewType("JSON", object)

MAX_INT = 2**53  # the largest integer every JSON reader keeps exactly
MAX_FLOAT = 1e300
FREE_DEPTH = 8  # nesting inside a free-form value
FREE_ITEMS = 4096  # entries of one free-form object or array
FREE_STR = 65536
STR_LEN = 4096
# control characters (tab and newlines kept) and lone surrogates: refused in every string
_BAD_CHARS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")
#: the same rule in the schema (lone surrogates left out: ECMA-262 patterns see UTF-16 code units)
NO_CONTROL = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$"


class Invalid(Exception):
    """A value that does not fit its declaration; ``where`` is the field path (``runner.options.num_threads``)."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where or '(document)'}: {problem}")
        self.where = where
        self.problem = problem


@dataclass(frozen=True)
class Rule:
    """Limits of one value. ``item`` applies to the items of a tuple / values of a mapping, ``key`` to mapping keys."""

    pattern: str | None = None
    min_len: int = 0
    max_len: int = STR_LEN
    ge: float | None = None
    le: float | None = None
    finite: bool = True  # False: +/-Infinity accepted (a figure that really was infinite); NaN never
    min_items: int = 0
    max_items: int = 1024
    item: Rule | None = None
    key: Rule | None = None
    doc: str | None = None


def spec(default: Any = MISSING, *, doc: str | None = None, search: tuple[Any, ...] = (), **rule: Any) -> Any:
    """A dataclass field with a :class:`Rule` (``spec(pattern=ID)``, ``spec(0, ge=0, le=1024)``). ``search``: the
    values a tuner tries for it, the first the default (``edge.backends.options.search_values``); not a rule."""
    meta: dict[str, Any] = {"rule": Rule(doc=doc, **rule)}
    if search:
        meta["search"] = tuple(search)
    if isinstance(default, (list, dict, set)):
        raise TypeError("mutable default: use a tuple or a MappingProxyType")
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Tagged:
    """Marks ``Annotated[A | B, Tagged(choose)]``: ``choose(raw)`` returns the member class to read."""

    choose: Callable[[Any], type]


def _rule_of(f: dataclasses.Field[Any]) -> Rule:
    rule: Rule = f.metadata.get("rule", Rule())  # spec() puts a Rule there
    return rule


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def show_value(value: Any) -> str:
    """A short, ASCII-only rendering of a bad value for a one-line message."""
    if isinstance(value, (Mapping, list, tuple)):
        return f"an {_kind(value)}" if _kind(value) in ("object", "array") else _kind(value)
    text = json.dumps(value) if value is None or isinstance(value, (str, bool, int, float)) else ascii(value)
    return text if len(text) <= 40 else text[:37] + "..."


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_<>-]{1,64}")


def join_path(where: str, key: str | int) -> str:
    """``where`` extended by ``key``; a key that is not a plain word is shown quoted and ASCII-escaped."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    if not _PLAIN_KEY.fullmatch(key):
        return f"{where}[{show_value(key)}]"
    return f"{where}.{key}" if where else key


# -- reading --------------------------------------------------------------------------------


def read(tp: Any, value: Any, where: str = "", rule: Rule | None = None) -> Any:
    """``value`` (parsed JSON) checked against ``tp`` and ``rule``, frozen; :class:`Invalid` otherwise."""
    rule = rule or Rule()
    origin = get_origin(tp)
    if origin is Annotated:
        base, *extra = get_args(tp)
        tag = next((e for e in extra if isinstance(e, Tagged)), None)
        if tag is not None:
            return read(tag.choose(value), value, where, rule)
        return read(base, value, where, rule)
    if tp is JSON or tp is Any:
        return _free(value, where, 0)
    if tp is type(None) or tp is None:
        if value is not None:
            raise Invalid(where, f"must be null, got {show_value(value)}")
        return None
    if origin in (Union, types.UnionType):
        members = get_args(tp)
        if value is None:
            if type(None) in members:
                return None
            raise Invalid(where, f"must be {_describe(tp)}, got null")
        for m in members:
            if m is not type(None) and _fits(m, value):
                return read(m, value, where, rule)
        raise Invalid(where, f"must be {_describe(tp)}, got {show_value(value)}")
    if origin is Literal:
        choices = get_args(tp)
        for c in choices:
            if _same(value, c):
                return c
        raise Invalid(where, f"must be one of {', '.join(json.dumps(c) for c in choices)}, got {show_value(value)}")
    if tp is bool:
        if not isinstance(value, bool):
            raise Invalid(where, f"must be true or false, got {show_value(value)}")
        return value
    if tp is int:
        return _int(value, where, rule)
    if tp is float:
        return _float(value, where, rule)
    if tp is str:
        return _string(value, where, rule)
    if origin is tuple:
        args = get_args(tp)
        if not isinstance(value, list):
            raise Invalid(where, f"must be an array, got {show_value(value)}")
        if len(args) == 2 and args[1] is Ellipsis:
            if not rule.min_items <= len(value) <= rule.max_items:
                raise Invalid(where, f"must have {rule.min_items} to {rule.max_items} items, has {len(value)}")
            return tuple(read(args[0], v, join_path(where, i), rule.item) for i, v in enumerate(value))
        if len(value) != len(args):
            raise Invalid(where, f"must have exactly {len(args)} items, has {len(value)}")
        return tuple(read(a, v, join_path(where, i), rule.item) for i, (a, v) in enumerate(zip(args, value)))
    if origin in (collections.abc.Mapping, dict) or tp is Mapping:
        _, vt = get_args(tp) or (str, Any)
        if not isinstance(value, dict):
            raise Invalid(where, f"must be an object, got {show_value(value)}")
        if not rule.min_items <= len(value) <= rule.max_items:
            raise Invalid(where, f"must have {rule.min_items} to {rule.max_items} entries, has {len(value)}")
        out = {}
        for k, v in value.items():
            _string(k, join_path(where, "<key>"), rule.key or Rule(max_len=256, min_len=1))
            out[k] = read(vt, v, join_path(where, k), rule.item)
        return MappingProxyType(out)
    if is_dataclass(tp) and isinstance(tp, type):
        return _object(tp, value, where)
    raise TypeError(f"typedjson cannot read {tp!r}")  # a bug in a declaration, not bad data


def _object(cls: type, value: Any, where: str) -> Any:
    if not isinstance(value, dict):
        raise Invalid(where, f"must be an object, got {show_value(value)}")
    fs = [f for f in fields(cls) if f.init]
    names = {f.name for f in fs}
    unknown = [k for k in value if k not in names]
    if unknown:
        shown = ", ".join(json.dumps(k)[:40] for k in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise Invalid(where, f"unknown field(s) {shown}; allowed: {', '.join(sorted(names))}")
    hints = _hints(cls)
    kwargs = {}
    for f in fs:
        if f.name not in value:
            if f.default is MISSING and f.default_factory is MISSING:
                raise Invalid(join_path(where, f.name), "missing")
            continue
        kwargs[f.name] = read(hints[f.name], value[f.name], join_path(where, f.name), _rule_of(f))
    return cls(**kwargs)


def _fits(tp: Any, value: Any) -> bool:
    """Whether ``value``'s JSON kind is the one ``tp`` reads (picks the member of a union)."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _fits(get_args(tp)[0], value)
    if origin in (Union, types.UnionType):
        return any(_fits(m, value) for m in get_args(tp))
    if origin is Literal:
        return any(_same(value, c) for c in get_args(tp))
    if tp is JSON or tp is Any:
        return True
    kind = _kind(value)
    if tp is bool:
        return kind == "boolean"
    if tp is int:
        return (
            kind == "integer"
            or kind == "number"
            and math.isfinite(value)
            and value.is_integer()
            and abs(value) <= MAX_INT
        )
    if tp is float:
        return kind in ("integer", "number")
    if tp is str:
        return kind == "string"
    if origin is tuple:
        return kind == "array"
    return kind == "object"  # mappings and dataclasses


def _same(value: Any, choice: Any) -> bool:
    """JSON equality: 1 and 1.0 are the same number; true is not 1."""
    if isinstance(value, bool) or isinstance(choice, bool):
        return type(value) is type(choice) and value == choice
    if isinstance(choice, (int, float)) and isinstance(value, (int, float)):
        return bool(value == choice)
    return type(value) is type(choice) and value == choice


def _range(value: float, where: str, rule: Rule, limit: float) -> None:
    lo = -limit if rule.ge is None else rule.ge
    hi = limit if rule.le is None else rule.le
    if not lo <= value <= hi:
        raise Invalid(where, f"must be {_bounds(rule, limit)}, got {show_value(value)}")


def _int(value: Any, where: str, rule: Rule) -> int:
    if type(value) is float and math.isfinite(value) and value.is_integer() and abs(value) <= MAX_INT:
        value = int(value)  # as in JSON (and JSON Schema), 2.0 is the integer 2
    if type(value) is not int:
        raise Invalid(where, f"must be an integer, got {show_value(value)}")
    _range(value, where, rule, MAX_INT)
    return value


def _float(value: Any, where: str, rule: Rule) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Invalid(where, f"must be a number, got {show_value(value)}")
    if isinstance(value, int) and abs(value) > MAX_FLOAT:  # float() of a huge int would overflow
        raise Invalid(where, f"must be {_bounds(rule, MAX_FLOAT)}, got {show_value(value)}")
    number = float(value)
    if math.isnan(number) or (rule.finite and math.isinf(number)):
        raise Invalid(where, f"must be a finite number, got {show_value(number)}")
    if not math.isinf(number):
        _range(number, where, rule, MAX_FLOAT)
    elif rule.ge is not None and number < 0 or rule.le is not None and number > 0:
        raise Invalid(where, f"must be {_bounds(rule)}, got {show_value(number)}")
    return number


def _bounds(rule: Rule, limit: float | None = None) -> str:
    lo, hi = rule.ge, rule.le
    if lo is not None and hi is not None:
        return f"between {lo:g} and {hi:g}"
    if lo is not None:
        return f">= {lo:g}" + (f" and <= {limit:g}" if limit else "")
    if hi is not None:
        return f"<= {hi:g}" + (f" and >= {-limit:g}" if limit else "")
    return f"between {-limit:g} and {limit:g}" if limit else "in range"


def _string(value: Any, where: str, rule: Rule) -> str:
    if not isinstance(value, str):
        raise Invalid(where, f"must be a string, got {show_value(value)}")
    if not rule.min_len <= len(value) <= rule.max_len:
        raise Invalid(where, f"must be {rule.min_len} to {rule.max_len} characters long, has {len(value)}")
    if _BAD_CHARS.search(value):
        raise Invalid(where, "contains control characters or invalid Unicode")
    if rule.pattern is not None and not re.fullmatch(rule.pattern, value):
        raise Invalid(where, f"{show_value(value)} does not match {rule.pattern}")
    return value


def _free(value: Any, where: str, depth: int) -> Any:
    """Free-form JSON, frozen: objects to read-only mappings, arrays to tuples; bounded."""
    if depth > FREE_DEPTH:
        raise Invalid(where, f"nested deeper than {FREE_DEPTH} levels")
    if value is None or isinstance(value, (bool, int)):
        if type(value) is int and abs(value) > MAX_FLOAT:
            raise Invalid(where, f"number out of range ({show_value(value)})")
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or abs(value) > MAX_FLOAT:
            raise Invalid(where, f"must be a finite number, got {show_value(value)}")
        return value
    if isinstance(value, str):
        return _string(value, where, Rule(max_len=FREE_STR))
    if isinstance(value, list):
        if len(value) > FREE_ITEMS:
            raise Invalid(where, f"more than {FREE_ITEMS} items")
        return tuple(_free(v, join_path(where, i), depth + 1) for i, v in enumerate(value))
    if isinstance(value, dict):
        if len(value) > FREE_ITEMS:
            raise Invalid(where, f"more than {FREE_ITEMS} entries")
        for k in value:
            _string(k, join_path(where, "<key>"), Rule(max_len=256))
        return MappingProxyType({k: _free(v, join_path(where, k), depth + 1) for k, v in value.items()})
    raise Invalid(where, f"not a JSON value ({show_value(value)})")


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Annotated:
        return _describe(get_args(tp)[0])
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(m) for m in get_args(tp))
    if origin is Literal:
        return "one of " + ", ".join(json.dumps(c) for c in get_args(tp))
    if tp is type(None):
        return "null"
    if origin is tuple:
        return "an array"
    if origin in (collections.abc.Mapping, dict) or is_dataclass(tp):
        return "an object"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(tp, "a JSON value")


# -- writing back ---------------------------------------------------------------------------


def to_json(obj: Any) -> Any:
    """Plain JSON data (dicts, lists) of a value :func:`read` made; fields left at their default are omitted."""
    if is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in fields(obj):
            v = getattr(obj, f.name)
            default: Any = MISSING
            if f.default is not MISSING:
                default = f.default
            elif f.default_factory is not MISSING:
                default = f.default_factory()
            if default is not MISSING and v == default:
                continue
            out[f.name] = to_json(v)
        return out
    if isinstance(obj, Mapping):
        return {k: to_json(v) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return [to_json(v) for v in obj]
    return obj


# -- strict parsing of the text -------------------------------------------------------------

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = re.compile(r"[\[\]{}]")
_DOTTED = re.compile(r"[\w-]*(?:[ \t]*\.[ \t]*[\w-]*)+")


def loads_strict(text: str, *, max_depth: int, allow_nan: bool = False) -> Any:
    """``json.loads`` that refuses what a careful reader must: nesting deeper than ``max_depth``
    (checked before parsing, so no RecursionError), NaN, duplicate keys (two readers could pick
    different ones), and integers too long to convert. ``Infinity`` is kept as a float for
    figures that really are infinite; typed fields refuse it unless declared otherwise.
    Raises :class:`Invalid` with the problem."""
    depth = deepest = 0
    for b in _BRACKETS.findall(_STRINGS.sub("", text)):
        depth += 1 if b in "[{" else -1
        deepest = max(deepest, depth)
        if deepest > max_depth:
            raise Invalid("", f"nested deeper than {max_depth} levels")

    def constant(name: str) -> float:
        if name == "NaN" and not allow_nan:
            raise Invalid("", "NaN is not a number this reader accepts")
        return float(name.replace("Infinity", "inf"))

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                raise Invalid("", f"duplicate key {json.dumps(k)[:60]}")
            out[k] = v
        return out

    try:
        return json.loads(text, parse_constant=constant, object_pairs_hook=pairs)
    except RecursionError:  # belt and braces: the bracket count above should have caught it
        raise Invalid("", f"nested deeper than {max_depth} levels") from None
    except json.JSONDecodeError as e:
        raise Invalid("", f"not valid JSON: {e}") from None
    except ValueError as e:  # e.g. an integer literal longer than Python converts
        raise Invalid("", f"not valid JSON: {str(e)[:120]}") from None


# -- JSON Schema ----------------------------------------------------------------------------


def json_schema(root: type, *, schema_id: str, title: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of dataclass ``root`` and every dataclass it reaches."""
    defs: dict[str, Any] = {}
    body = _schema(root, Rule(), defs)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": schema_id,
        "title": title,
        **body,
        "$defs": dict(sorted(defs.items())),
    }


def _schema(tp: Any, rule: Rule, defs: dict[str, Any]) -> dict[str, Any]:
    origin = get_origin(tp)
    s: dict[str, Any]
    if origin is Annotated:
        base = get_args(tp)[0]
        if any(isinstance(e, Tagged) for e in get_args(tp)[1:]):
            s = {"oneOf": [_schema(m, rule, defs) for m in get_args(base)]}
        else:
            s = _schema(base, rule, defs)
    elif tp is JSON or tp is Any:
        s = _free_json_schema(defs)
    elif tp is type(None):
        s = {"type": "null"}
    elif origin in (Union, types.UnionType):
        s = {"anyOf": [_schema(m, rule, defs) for m in get_args(tp)]}
    elif origin is Literal:
        s = {"enum": list(get_args(tp))}
    elif tp is bool:
        s = {"type": "boolean"}
    elif tp is int:
        s = {
            "type": "integer",
            "minimum": -MAX_INT if rule.ge is None else rule.ge,
            "maximum": MAX_INT if rule.le is None else rule.le,
        }
    elif tp is float:
        s = {"type": "number"}
        # the reader refuses finite values beyond MAX_FLOAT either way (JSON text cannot hold Infinity)
        s.update(minimum=-MAX_FLOAT if rule.ge is None else rule.ge, maximum=MAX_FLOAT if rule.le is None else rule.le)
    elif tp is str:
        s = {
            "type": "string",
            "minLength": rule.min_len,
            "maxLength": rule.max_len,
            "pattern": _anchored(rule.pattern) if rule.pattern else NO_CONTROL,
        }
    elif origin is tuple:
        s = _tuple_schema(tp, rule, defs)
    elif origin in (collections.abc.Mapping, dict) or tp is Mapping:
        _, vt = get_args(tp) or (str, Any)
        key = rule.key or Rule(max_len=256, min_len=1)
        s = {
            "type": "object",
            "additionalProperties": _schema(vt, rule.item or Rule(), defs),
            "propertyNames": _schema(str, key, defs),
            "minProperties": rule.min_items,
            "maxProperties": rule.max_items,
        }
    elif is_dataclass(tp) and isinstance(tp, type):
        if tp.__name__ not in defs:
            defs[tp.__name__] = {}  # placeholder: recursion stops here
            defs[tp.__name__] = _object_schema(tp, defs)
        return {"$ref": f"#/$defs/{tp.__name__}"}
    else:
        raise TypeError(f"typedjson has no schema for {tp!r}")
    return s


def _free_json_schema(defs: dict[str, Any]) -> dict[str, Any]:
    """Free-form JSON (``JSON``/``Any``): a reference to the ``JSONValue`` definition, added to ``defs`` the first
    time it is needed."""
    if "JSONValue" not in defs:
        ref = {"$ref": "#/$defs/JSONValue"}
        defs["JSONValue"] = {
            "description": f"free-form JSON, nested at most {FREE_DEPTH} deep (checked by edgekit: not expressible in JSON Schema)",
            "anyOf": [
                {"type": "null"},
                {"type": "boolean"},
                {"type": "number", "minimum": -MAX_FLOAT, "maximum": MAX_FLOAT},
                {"type": "string", "maxLength": FREE_STR, "pattern": NO_CONTROL},
                {"type": "array", "maxItems": FREE_ITEMS, "items": ref},
                {
                    "type": "object",
                    "maxProperties": FREE_ITEMS,
                    "additionalProperties": ref,
                    "propertyNames": {"maxLength": 256, "pattern": NO_CONTROL},
                },
            ],
        }
    return {"$ref": "#/$defs/JSONValue"}


def _tuple_schema(tp: Any, rule: Rule, defs: dict[str, Any]) -> dict[str, Any]:
    """A tuple's schema: ``tuple[X, ...]`` an array of X within the rule's item counts, a fixed tuple an array of
    exactly its members."""
    args = get_args(tp)
    if len(args) == 2 and args[1] is Ellipsis:
        return {
            "type": "array",
            "items": _schema(args[0], rule.item or Rule(), defs),
            "minItems": rule.min_items,
            "maxItems": rule.max_items,
        }
    else:
        return {
            "type": "array",
            "prefixItems": [_schema(a, rule.item or Rule(), defs) for a in args],
            "items": False,
            "minItems": len(args),
            "maxItems": len(args),
        }


def _object_schema(tp: type, defs: dict[str, Any]) -> dict[str, Any]:
    """A dataclass's schema: its fields (with their descriptions), the required ones, its docstring's first
    paragraph, and its ``__schema_extra__`` rules."""
    name = tp.__name__
    hints = _hints(tp)
    props = {}
    required = []
    for f in fields(tp):
        fr = _rule_of(f)
        p = _schema(hints[f.name], fr, defs)
        if fr.doc:
            p = {**p, "description": fr.doc}
        props[f.name] = p
        if f.default is MISSING and f.default_factory is MISSING:
            required.append(f.name)
    d: dict[str, Any] = {"type": "object", "properties": props, "required": required, "additionalProperties": False}
    doc = (tp.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
    if doc and not doc.startswith(name + "("):
        d = {"description": doc, **d}
    extra = getattr(tp, "__schema_extra__", None)  # e.g. if/then rules between fields
    if extra is not None:
        d.update(extra(lambda t: _schema(t, Rule(), defs)))
    return d


def _anchored(pattern: str) -> str:
    return (pattern if pattern.startswith("^") else "^" + pattern) + ("" if pattern.endswith("$") else "$")


def write_json_atomic(path: Path, data: Any) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=False, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# -- one safe reader for every JSON/TOML file the product loads ----------------------------------

MAX_FILE_BYTES = 16 << 20  # a profile, a study, a record: far below; a FIFO or /dev/zero never gets this far
FILE_DEPTH = 64
_MISSING = object()
_TOML_SKIP = re.compile(r'"""(?:[^\\]|\\.)*?"""|\'\'\'.*?\'\'\'|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*', re.S)


class UnreadableFile(InputFileError):
    """A JSON/TOML file edgekit will not read: not a regular file, too big, too deep, not valid, unreadable."""


def read_bounded(path: str | os.PathLike[str], *, max_bytes: int = MAX_FILE_BYTES, what: str = "file") -> bytes:
    """The bytes of ``path``, a regular file (symlinks followed) of at most ``max_bytes``. A FIFO, a device, a
    directory or a socket is refused without blocking (opened non-blocking, checked with fstat before a read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise UnreadableFile(f"cannot read {what} {os.fspath(path)!s:.300}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnreadableFile(
                f"{what} {os.fspath(path)!s:.300} is not a regular file",
                hint="name a file, not a directory, FIFO or device",
            )
        if st.st_size > max_bytes:
            raise UnreadableFile(f"{what} {os.fspath(path)!s:.300} is {st.st_size} bytes; at most {max_bytes}")
        chunks, got = [], 0
        while got <= max_bytes and (chunk := os.read(fd, min(1 << 20, max_bytes + 1 - got))):
            chunks.append(chunk)
            got += len(chunk)
        data = b"".join(chunks)
    except OSError as e:
        raise UnreadableFile(f"cannot read {what} {os.fspath(path)!s:.300}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise UnreadableFile(f"{what} {os.fspath(path)!s:.300} is over {max_bytes} bytes")
    return data


def _text(path: str | os.PathLike[str], max_bytes: int, what: str) -> str:
    try:
        return read_bounded(path, max_bytes=max_bytes, what=what).decode("utf-8")
    except UnicodeDecodeError as e:
        raise UnreadableFile(f"{what} {os.fspath(path)!s:.300} is not UTF-8 text: {e}") from None


def _problem(what: str, path: str | os.PathLike[str], problem: str) -> str:
    sep = " is " if problem.startswith("not ") else ": "  # "... is not valid JSON: ...", "...: nested deeper ..."
    return f"{what} {os.fspath(path)!s:.300}{sep}{problem}"


def read_json_file(
    path: str | os.PathLike[str],
    *,
    what: str = "JSON file",
    max_bytes: int = MAX_FILE_BYTES,
    max_depth: int = FILE_DEPTH,
    missing: Any = _MISSING,
    allow_nan: bool = False,
) -> Any:
    """A JSON document from ``path`` through :func:`loads_strict` (depth, duplicate keys, NaN, integer digits)
    after :func:`read_bounded` (regular file, size). ``missing``: returned when nothing exists at ``path`` (not
    even a dangling link); every other failure is an :class:`UnreadableFile` naming the file and the problem."""
    if missing is not _MISSING and not os.path.lexists(path):
        return missing
    text = _text(path, max_bytes, what)
    try:
        return loads_strict(text, max_depth=max_depth, allow_nan=allow_nan)
    except Invalid as e:
        raise UnreadableFile(_problem(what, path, e.problem)) from None


def loads_toml_strict(text: str, *, max_depth: int = FILE_DEPTH) -> dict[str, Any]:
    """``tomllib.loads`` that refuses nesting deeper than ``max_depth`` (checked before parsing: no
    RecursionError) and integers longer than Python converts; raises :class:`Invalid`."""
    try:  # Python 3.11+
        import tomllib
    except ImportError:  # pragma: no cover - 3.10
        import tomli as tomllib

    bare = _TOML_SKIP.sub("", text)
    # a dotted key (a.b.c = 1, [a.b.c]) nests as deep as its parts: tomllib builds it in quadratic time (20,000
    # parts in 40 kB ran for minutes), so its parts count toward the depth before anything is parsed
    for run in _DOTTED.findall(bare):
        if run.count(".") >= max_depth:
            raise Invalid("", f"a dotted key nested deeper than {max_depth} levels")
    depth = deepest = 0
    for b in _BRACKETS.findall(bare):
        depth = max(0, depth + (1 if b in "[{" else -1))
        deepest = max(deepest, depth)
        if deepest > max_depth:
            raise Invalid("", f"nested deeper than {max_depth} levels")
    try:
        doc: dict[str, Any] = tomllib.loads(text)
        return doc
    except RecursionError:
        raise Invalid("", f"nested deeper than {max_depth} levels") from None
    except tomllib.TOMLDecodeError as e:
        raise Invalid("", f"not valid TOML: {e}") from None
    except ValueError as e:  # an integer literal longer than Python converts (sys.get_int_max_str_digits)
        raise Invalid("", f"not valid TOML: {str(e)[:120]}") from None


def read_toml_file(
    path: str | os.PathLike[str],
    *,
    what: str = "TOML file",
    max_bytes: int = MAX_FILE_BYTES,
    max_depth: int = FILE_DEPTH,
) -> dict[str, Any]:
    """A TOML document from ``path``, read as :func:`read_json_file` reads JSON."""
    text = _text(path, max_bytes, what)
    try:
        return loads_toml_strict(text, max_depth=max_depth)
    except Invalid as e:
        raise UnreadableFile(_problem(what, path, e.problem)) from None
