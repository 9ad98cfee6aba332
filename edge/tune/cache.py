"""The tuner's conversions and their cache: what a trial converts with, the recipe key a bundle is cached under
(the source, calibration and parity data by content), and the conversion's parity as a trial records it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

from edge.errors import EdgeError
from edge.pipeline.request import ConvertRequest
from edge.spec import AUTO
from edge.tune.config import Config
from edge.tune.measure import combine_parity
from edge.tune.space import Space


def trial_request(req: ConvertRequest) -> ConvertRequest:
    """What every trial converts with: the request's inputs, data and task (a trial's precision and target come
    from its configuration; its gate is recorded, never fatal)."""
    return ConvertRequest(
        calib=req.calib,
        input_shapes=req.input_shapes,
        preprocess=req.preprocess,
        letterbox=req.letterbox,
        freeze=req.freeze,
        parity_data=req.parity_data,
        parity_samples=req.parity_samples,
        task=req.task,
        accept_parity_failure=True,
    )


#: ``--preprocess auto`` in the recipe key, with the revision of its rule (2: the file's declared pre-processing wins)
AUTO_RULE = "auto/2"


def source_key(req: ConvertRequest) -> dict[str, Any]:
    """The request's part of the recipe key: what the conversion reads besides the model (the parity data by
    what its files are)."""
    source: dict[str, Any] = {
        "input_shapes": {k: [int(d) for d in v] for k, v in req.input_shapes.items()},
        # auto's rule changed (it takes what the file declares, edge.pipeline.declared): a bundle cached under the
        # older rule may hold another pre-processing, so auto is keyed with its rule's revision
        "preprocess": AUTO_RULE if req.preprocess == AUTO else req.preprocess,
        "letterbox": req.letterbox,
    }
    if req.task != "auto":  # (auto, convert's default, is left out of the key: conversions cached before stay valid)
        source["task"] = req.task
    if req.freeze:
        source["freeze"] = {str(k): str(v) for k, v in req.freeze.items()}
    if req.parity_data is not None:
        source["parity_data"] = data_identity(req.parity_data, "parity data")
    return source


def calib_identity(calib: str | os.PathLike[str] | None) -> str | None:
    """What the calibration data is, for the recipe key: 'random', a digest of the files' names, sizes, times, or
    (none given) edgekit's natural images by their index's digest (they are also the parity inputs then)."""
    if calib is None:
        from edge.verify import natural

        return "natural-" + hashlib.sha256(natural.INDEX.read_bytes()).hexdigest()[:16]
    if str(calib) == "random":
        return "random"
    return data_identity(calib, "calibration data")


def natural_calibration_problem(model: str | os.PathLike[str], req: ConvertRequest) -> str | None:
    """Why a conversion of ``model`` without --calib cannot calibrate on edgekit's natural images (None: it can, so
    int8 is in the space by default): the model's image input with its pre-processing is what they feed."""
    from edge.pipeline import open_source
    from edge.pipeline.declared import request_preprocess
    from edge.verify.inputs import natural_samples

    try:
        src = open_source(Path(model))
        io = src.checked_io(req.input_shapes)
    except EdgeError as e:
        return e.message
    pre = request_preprocess(src, io, req)
    return natural_samples(io, pre, "calibration", calibrating=True)[1]


def data_identity(data: str | os.PathLike[str], what: str = "data") -> str:
    """A digest of a file's or directory's files (names, sizes, modification times), for the recipe key."""
    p = Path(data)
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p] if p.is_file() else []
    if not files:
        raise EdgeError(f"{what} {p} does not exist or is empty")
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.relative_to(p) if p.is_dir() else f.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def recipe_key(
    model_sha256: str,
    profile: Any,
    cfg: Config,
    space: Space,
    calib_id: str | None,
    parity_samples: int,
    source: Mapping[str, Any] | None = None,
) -> str:
    """The conversion's identity: the same key, the same bundle (runner options are not part of it)."""
    import edge

    ov = space.overlay(profile, cfg, tuned={}, with_knobs=False)
    data = {
        "edgekit": edge.__version__,
        "model": model_sha256,
        "target": profile.name,
        "runner": cfg.runner,
        "chain": list(ov.chain),
        "precision": cfg.bundle_precision,
        "convert_options": {k: dict(v) for k, v in ov.convert_options.items()},
        "run_options": dict(ov.run_options),
        "calib": calib_id,
        "parity_samples": parity_samples,
        "source": dict(source or {}),
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:24]


def convert_cached(
    model: Path, profile: Any, cfg: Config, space: Space, key: str, cache: Path, request: ConvertRequest
) -> tuple[Any, bool]:
    """(bundle, converted now): the cached bundle for ``key``, else a real conversion into the cache
    (``request``: a ``trial_request``)."""
    from edge.bundle.bundle import Bundle
    from edge.pipeline import convert

    out = cache / key
    if (out / "manifest.json").is_file():
        try:
            return Bundle.open(out, trust=False), False
        except EdgeError:
            pass  # a damaged cache entry is converted again
    b = convert(
        model, space.base_profile(profile, cfg), out, request.replace(precision=cfg.bundle_precision), force=True
    )
    return b, True


def bundle_size(b: Any) -> int:
    ref = (b.manifest.get("reference_pairs") or {}).get("file")
    return sum(int(a["bytes"]) for a in b.manifest.get("artifacts", []) if a.get("path") != ref)


def conversion_parity(rec: dict[str, Any], b: Any) -> None:
    """A trial's record after its conversion: the bundle, its size, and the conversion gate's verdict."""
    rec["bundle"] = str(b.path)
    rec["size_bytes"] = bundle_size(b)
    gate = b.manifest.get("parity") or {}
    par = rec.get("parity") or {}
    par["conversion"] = gate.get("passed")
    outs = gate.get("outputs")
    outs = outs if isinstance(outs, list) else []
    par["conversion_failures"] = [
        f"conversion gate ({gate.get('samples')} samples): {o.get('name')}: {f}"
        for o in outs
        if isinstance(o, dict) and isinstance(o.get("failures"), list)
        for f in o["failures"]
    ][:4]
    if gate.get("passed") is None:
        par["conversion_failures"].append(f"conversion gate did not run: {gate.get('skipped')}")
    rec["parity"] = par
    combine_parity(par)
