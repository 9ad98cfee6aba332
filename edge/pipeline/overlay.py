"""Tuned profile overlays: what ``edgekit tune`` found, applied to a target profile by ``convert``/``deploy --tuned``.

An overlay is a small TOML file (written by :func:`write_overlay`, read by :func:`read_overlay`):

    schema_version = 1
    target = "x86-cpu"            # the profile it was tuned for; applying it to another one is refused
    precision = "int8"
    runner = "openvino"           # may differ from the profile's own (x86-cpu: onnxruntime or OpenVINO CPU)
    chain = ["onnx->openvino-ir"]
    [convert.options."onnx->openvino-ir"]
    ...
    [run.options]                 # replaces the profile's runner options
    ...
    [video]                       # --objective e2e only: the video pipeline's inference workers, recorded in the
    infer_workers = 2             # bundle (manifest tuned.infer_workers); `edgekit run` and the agent use it
    [tuned]                       # where and how it was measured: informational, never applied
    same_device_class = false
    device_class = "different device class: ..."

It is data from a file, so it is validated into :class:`TunedOverlay` before anything reads it: known
keys only, a registered runner and converters, runner options of their declared types (the manifest's
rules: never a path, library or command), a precision the target allows. Every problem is reported at
once in one :class:`~edge.errors.TargetError`. Build-host code: cheap to import (no runtime).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from edge.base.typedjson import Invalid, UnreadableFile, loads_toml_strict, read, read_toml_file
from edge.errors import TargetError

OVERLAY_VERSION = 1
MAX_BYTES = 64 * 1024
_TOP = {"schema_version", "target", "precision", "runner", "chain", "convert", "run", "video", "tuned"}
#: the most inference workers an overlay may ask the video pipeline for (the manifest's limit)
MAX_WORKERS = 64


@dataclass(frozen=True)
class TunedOverlay:
    """A validated overlay: the runner, chain, precision and options to apply to ``target``."""

    target: str
    precision: str
    runner: str
    chain: tuple[str, ...]
    convert_options: Mapping[str, Mapping[str, Any]]
    run_options: Mapping[str, Any]
    tuned: Mapping[str, Any] = field(default_factory=dict)
    path: Path | None = None
    #: the video pipeline's inference workers (tuned with --objective e2e); None: not part of the overlay
    infer_workers: int | None = None

    def to_toml_dict(self) -> dict[str, Any]:
        d = {
            "schema_version": OVERLAY_VERSION,
            "target": self.target,
            "precision": self.precision,
            "runner": self.runner,
            "chain": list(self.chain),
            "convert": {"options": {k: dict(v) for k, v in self.convert_options.items()}},
            "run": {"options": dict(self.run_options)},
            "tuned": dict(self.tuned),
        }
        if self.infer_workers is not None:  # absent otherwise: an overlay without it hashes as it always did
            d["video"] = {"infer_workers": self.infer_workers}
        return d

    def content_sha256(self) -> str:
        """What the overlay applies and records, hashed: sha256 of its canonical JSON (sorted keys, no spaces),
        so the same overlay has the same hash whether read from its file or built in memory."""
        import hashlib

        data = json.dumps(self.to_toml_dict(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(data.encode()).hexdigest()

    def manifest_record(self) -> dict[str, Any]:
        """The bundle manifest's ``tuned`` entry (``edge.bundle.schema.TunedEvidence``): the overlay's hash, the
        trial it is, the objective, the host it was measured on and whether that is the target's device class.
        The [tuned] table is data from a file: a value the manifest's rules refuse is left out, never carried."""
        from edge.bundle.schema import TunedEvidence

        t = self.tuned
        os_, _, arch = str(t.get("measured_on") or "").partition("/")
        host = {
            "os": t.get("os", os_),
            "arch": t.get("arch", arch),
            "cpu": t.get("cpu", ""),
            "isa": t.get("isa", []),
            "cpus": t.get("cpus"),
        }
        rec: dict[str, Any] = {"overlay_sha256": self.content_sha256()}
        if self.infer_workers is not None:  # applied, not informational: validated when the overlay was read
            rec["infer_workers"] = self.infer_workers
        fields = {
            "configuration": t.get("configuration"),
            "objective": t.get("objective"),
            "tuned_on": {k: v for k, v in host.items() if v not in (None, "")},
            "same_device_class": t.get("same_device_class"),
            "device_class": t.get("device_class"),
            "created_utc": t.get("created_utc"),
        }
        for key, value in fields.items():
            if value in (None, "", {}):
                continue
            try:
                read(TunedEvidence, {**rec, key: value})
            except Invalid:
                continue
            rec[key] = value
        return rec

    def describe(self) -> str:
        """One line: what applying it changes."""
        opts = ", ".join(f"{k}={_show(v)}" for k, v in sorted(self.run_options.items()))
        conv = "; ".join(
            f"{c}: " + ", ".join(f"{k}={_show(v)}" for k, v in sorted(o.items()))
            for c, o in self.convert_options.items()
            if o
        )
        return (
            f"{self.runner} {self.precision} via {' -> '.join(self.chain)}; runner options {opts or 'none'}"
            + (f"; convert options {conv}" if conv else "")
            + (
                f"; video pipeline: {self.infer_workers} inference worker{'s' if self.infer_workers != 1 else ''}"
                if self.infer_workers is not None
                else ""
            )
        )


def _show(v: Any) -> str:
    return ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


def overlay_problems(raw: Mapping[str, Any]) -> list[str]:
    """Every problem of an overlay table (empty: valid); the target it names is not checked here."""
    from edge.backends.converter import CONVERTERS
    from edge.backends.runner import RUNNERS
    from edge.bundle.schema import RunnerSpec, check_runner
    from edge.targets import PRECISIONS

    found: list[str] = []
    for key in raw:
        if key not in _TOP:
            found.append(f"{key}: unknown key (allowed: {', '.join(sorted(_TOP))})")
    if raw.get("schema_version") != OVERLAY_VERSION:
        found.append(
            f"schema_version: this edgekit reads {OVERLAY_VERSION}, the file has {raw.get('schema_version')!r}"
        )
    for key in ("target", "precision", "runner"):
        if not isinstance(raw.get(key), str) or not raw.get(key):
            found.append(f"{key}: expected a name, got {raw.get(key)!r}")
    if isinstance(raw.get("precision"), str) and raw["precision"] not in PRECISIONS:
        found.append(f"precision: unknown precision {raw['precision']!r}")
    chain = raw.get("chain")
    if not isinstance(chain, list) or not chain or not all(isinstance(c, str) for c in chain):
        found.append(f"chain: expected a non-empty list of converter names, got {chain!r}")
        chain = []
    for c in chain:
        if c not in CONVERTERS:
            found.append(f"chain: unknown converter {c!r}")
    conv = raw.get("convert", {})
    conv_opts = conv.get("options", {}) if isinstance(conv, dict) else None
    if not isinstance(conv, dict) or set(conv) - {"options"} or not isinstance(conv_opts, dict):
        found.append("convert: expected a table with one key, options")
    else:
        for name, opts in conv_opts.items():
            if name not in chain:
                found.append(f"convert.options.{name}: options for a converter that is not in chain")
            elif not isinstance(opts, dict):
                found.append(f"convert.options.{name}: expected a table")
            elif name in CONVERTERS:
                try:
                    CONVERTERS.get(name).check_options(opts)
                except Exception as e:  # noqa: BLE001 - the converter's own message, reported with the rest
                    found.append(f"convert.options.{name}: {str(e).splitlines()[0][:200]}")
    run = raw.get("run", {})
    run_opts = run.get("options", {}) if isinstance(run, dict) else None
    if not isinstance(run, dict) or set(run) - {"options"} or not isinstance(run_opts, dict):
        found.append("run: expected a table with one key, options")
    elif isinstance(raw.get("runner"), str) and raw["runner"] in RUNNERS:
        try:
            check_runner(RunnerSpec(raw["runner"], dict(run_opts)), where="run")
        except Invalid as e:
            found.append(str(e))
    elif isinstance(raw.get("runner"), str):
        found.append(f"runner: unknown runner {raw['runner']!r} (installed: {', '.join(RUNNERS.names())})")
    if "tuned" in raw and not isinstance(raw["tuned"], dict):
        found.append("tuned: expected a table")
    video = raw.get("video", {})
    if not isinstance(video, dict) or set(video) - {"infer_workers"}:
        found.append("video: expected a table with one key, infer_workers")
    elif "infer_workers" in video:
        w = video["infer_workers"]
        if not isinstance(w, int) or isinstance(w, bool) or not 1 <= w <= MAX_WORKERS:
            found.append(f"video.infer_workers: expected an integer from 1 to {MAX_WORKERS}, got {w!r}")
    return found


def overlay_from_dict(raw: Mapping[str, Any], where: str = "overlay") -> TunedOverlay:
    found = overlay_problems(raw)
    if found:
        raise TargetError(
            f"invalid tuned overlay {where}: " + "; ".join(found),
            hint="write it with `edgekit tune MODEL --target T --out DIR` (DIR/tuned.toml)",
        )
    conv = raw.get("convert", {}).get("options", {})
    return TunedOverlay(
        target=raw["target"],
        precision=raw["precision"],
        runner=raw["runner"],
        chain=tuple(raw["chain"]),
        convert_options={k: dict(v) for k, v in conv.items()},
        run_options=dict(raw.get("run", {}).get("options", {})),
        tuned=dict(raw.get("tuned", {})),
        infer_workers=raw.get("video", {}).get("infer_workers"),
    )


def read_overlay(path: str | os.PathLike[str]) -> TunedOverlay:
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise TargetError(
            f"tuned overlay {p} does not exist", hint="write one with `edgekit tune MODEL --target T --out DIR`"
        )
    try:  # the one safe reader: a regular file, bounded size, depth and integer digits
        raw = read_toml_file(p, what="tuned overlay", max_bytes=MAX_BYTES, max_depth=16)
    except UnreadableFile as e:
        raise TargetError(e.message, hint=e.hint) from None
    return dataclasses.replace(overlay_from_dict(raw, str(p)), path=p)


def apply_overlay(profile: Any, overlay: TunedOverlay | str | os.PathLike[str]) -> Any:
    """``profile`` (a ``TargetProfile``) with the overlay's runner, chain, converter and runner options.

    Refused when the overlay was tuned for another target or names a precision the target does not allow."""
    from edge.targets import ChainStep

    ov = overlay if isinstance(overlay, TunedOverlay) else read_overlay(overlay)
    where = f"tuned overlay {ov.path}" if ov.path else "tuned overlay"
    if ov.target != profile.name:
        raise TargetError(
            f"{where} was tuned for target {ov.target!r}, not {profile.name!r}",
            hint=f"pass --target {ov.target}, or tune for {profile.name}",
        )
    profile.check_precision(ov.precision)
    return dataclasses.replace(
        profile,
        runner=ov.runner,
        chain=tuple(ChainStep(c) for c in ov.chain),
        convert_options={k: dict(v) for k, v in ov.convert_options.items()},
        runtime_options=dict(ov.run_options),
    )


def resolve_precision(overlay: TunedOverlay, asked: str | None) -> str:
    """The overlay's precision; an explicit, different ``--precision`` is refused rather than silently mixed
    with options tuned for another precision."""
    if asked is not None and asked != overlay.precision:
        raise TargetError(
            f"--precision {asked} conflicts with the tuned overlay's precision {overlay.precision} "
            "(its runner options were measured for that precision)",
            hint="drop --precision, or tune again for the precision you want",
        )
    return overlay.precision


# -- writing --------------------------------------------------------------------------------------


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v) if isinstance(v, int) or v == v else '"nan"'
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a TOML basic string (\uXXXX escapes included)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if v is None:
        return '""'
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _toml_key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)


def overlay_toml(overlay: TunedOverlay, comments: list[str] = ()) -> str:  # type: ignore[assignment]
    d = overlay.to_toml_dict()
    lines = [f"# {c}" for c in comments]
    for k in ("schema_version", "target", "precision", "runner", "chain"):
        lines.append(f"{k} = {_toml_value(d[k])}")
    for name, opts in d["convert"]["options"].items():
        lines += ["", f"[convert.options.{_toml_key(name)}]"] + [
            f"{_toml_key(k)} = {_toml_value(v)}" for k, v in opts.items()
        ]
    lines += ["", "[run.options]"] + [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in d["run"]["options"].items()]
    if "video" in d:
        lines += ["", "[video]"] + [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in d["video"].items()]
    lines += ["", "[tuned]"] + [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in d["tuned"].items() if v is not None]
    return "\n".join(lines) + "\n"


def write_overlay(path: str | os.PathLike[str], overlay: TunedOverlay, comments: list[str] = ()) -> Path:  # type: ignore[assignment]
    p = Path(path)
    text = overlay_toml(overlay, list(comments))
    overlay_from_dict(loads_toml_strict(text), str(p))  # what is written reads back
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, p)
    return p


def apply_tuned(
    profile: Any, tuned: TunedOverlay | str | os.PathLike[str], precision: str | None, say: Any = None
) -> tuple[Any, str]:
    """(profile with the overlay applied, the precision to convert in) for ``convert``/``deploy --tuned``;
    what was applied is said through ``say``."""
    ov = tuned if isinstance(tuned, TunedOverlay) else read_overlay(tuned)
    chosen = resolve_precision(ov, precision)
    applied = apply_overlay(profile, ov)
    if say is not None:
        where = (
            ""
            if ov.tuned.get("same_device_class", True)
            else f" (tuned off the device: {ov.tuned.get('device_class')})"
        )
        say(f"applying tuned overlay {ov.path or ''}: {ov.describe()}{where}")
    return applied, chosen
