"""The study file: every finished trial written at once (atomically), read back so an interrupted or repeated run
resumes; a record that does not hold together is dropped with the reason, never trusted."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

from edge.base.typedjson import UnreadableFile, read_json_file
from edge.errors import EdgeError

STUDY_VERSION = 1


MAX_STUDY_BYTES = 256 << 20


def read_study(path: Path) -> Any:
    """The JSON of a study file, read by the one safe reader (a regular file, bounded size, depth and integer
    digits); None when nothing is there."""
    try:  # NaN allowed: a study is what save_study wrote, and json.dumps writes a NaN figure as NaN
        return read_json_file(
            path, what="study file", max_bytes=MAX_STUDY_BYTES, max_depth=32, missing=None, allow_nan=True
        )
    except UnreadableFile as e:
        raise EdgeError(e.message, hint="remove it to start a new study") from None


def load_study(path: Path, header: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The trials of a study file made for the same model, target, objective and host; refused otherwise."""
    data = read_study(path)
    if data is None:
        return {}
    if (
        not isinstance(data, dict)
        or data.get("study_version") != STUDY_VERSION
        or not isinstance(data.get("trials"), dict)
    ):
        raise EdgeError(
            f"study file {path} is not an edgekit tune study (study_version {STUDY_VERSION})",
            hint="remove it to start a new study",
        )
    for key, want in header.items():
        if data.get(key) != want:
            raise EdgeError(
                f"study file {path} was made for {key} {data.get(key)!r}, this run is {want!r}",
                hint="give another --study file, or remove it to start a new study",
            )
    trials: dict[str, dict[str, Any]] = {}
    for tid, rec in data["trials"].items():
        problem = _record_problem(tid, rec)
        if problem:
            raise EdgeError(f"study file {path}: trial {tid[:80]!r}: {problem}", hint="remove it to start a new study")
        trials[tid] = rec
    return trials


def _record_problem(tid: Any, rec: Any) -> str | None:
    """Why a study record cannot be used (None: fine). Only the fields tune reads back are checked."""
    if not isinstance(tid, str) or not isinstance(rec, dict):
        return "expected an object"
    if not isinstance(rec.get("status"), str) or not isinstance(rec.get("rungs", {}), dict):
        return "status must be text and rungs an object"
    for name, r in rec.get("rungs", {}).items():
        if not isinstance(r, dict):
            return f"rungs.{name}: expected an object"
        reps = r.get("rep_scores")
        if (
            not isinstance(reps, list)
            or not reps
            or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in reps)
        ):
            return f"rungs.{name}.rep_scores: expected a list of finite numbers"
        for key in ("rep_missed", "rep_frames"):  # e2e: frames missed and frames fed, per repetition
            got = r.get(key, [0] * len(reps))
            if (
                not isinstance(got, list)
                or len(got) != len(reps)
                or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in got)
            ):
                return f"rungs.{name}.{key}: expected one count (an integer >= 0) per repetition"
        if "vs_anchor" in r or "anchor" in r:  # measured with an anchor in its chunk (measure_chunk)
            rel, a = r.get("vs_anchor"), r.get("anchor")
            if (
                not isinstance(rel, (int, float))
                or isinstance(rel, bool)
                or not math.isfinite(rel)
                or rel <= 0
                or not isinstance(a, dict)
                or not isinstance(a.get("id"), str)
            ):
                return f"rungs.{name}: vs_anchor must be a finite number > 0 and anchor an object with an id"
    par = rec.get("parity")
    if par is not None and (not isinstance(par, dict) or par.get("passed") not in (True, False, None)):
        return "parity.passed must be true, false or null"
    return None


def save_study(path: Path | None, header: Mapping[str, Any], trials: Mapping[str, dict[str, Any]]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(
        json.dumps({"study_version": STUDY_VERSION, **header, "trials": trials}, indent=1, default=str),
        encoding="utf-8",
    )
    os.replace(tmp, path)
