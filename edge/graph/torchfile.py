"""What kind of PyTorch file a source is (TorchScript or a torch.export ExportedProgram), read from its zip
entries without importing torch: the source adapter and the converters that take torch sources share it."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Sequence

from edge.errors import ModelError

# what to do when the toolchain's torch cannot load a file that has a TorchScript / ExportedProgram layout
RELOAD_HINT = (
    "load the model in the torch version that saved it and save it again with the toolchain's torch "
    "(edgekit toolchain show torch) via torch.jit.save or torch.export.save, or export it there with "
    "torch.onnx.export and convert the .onnx"
)


def zip_names(path: Path) -> list[str] | None:
    try:
        with zipfile.ZipFile(path) as z:
            return z.namelist()
    except (OSError, zipfile.BadZipFile):
        return None


def _parts(names: Sequence[str]) -> list[list[str]]:
    """Each entry's path below the archive's top folder (torch writes every entry under one ``<name>/``)."""
    return [n.split("/")[1:] for n in names if "/" in n]


def is_torch_package(names: Sequence[str]) -> bool:
    """A ``torch.package`` archive (PackageExporter): ``<name>/.data/extern_modules`` (torch.export.save's
    archive has a ``.data/version`` too, never ``extern_modules``)."""
    return any(p == [".data", "extern_modules"] for p in _parts(names))


def is_exported_program(names: Sequence[str]) -> bool:
    """torch.export.save's archive: ``<name>/archive_format`` (torch >= 2.6: ``<name>/models/<m>.json``) or the
    older ``serialized_exported_program.json``. Judged by top-level entries only: a TorchScript archive of a
    model whose Python code lived in a ``models`` package holds ``<name>/code/__torch__/models/...``."""
    if is_torch_package(names):
        return False
    return any(
        p == ["archive_format"]
        or p[-1:] == ["serialized_exported_program.json"]
        or (len(p) == 2 and p[0] == "models" and p[1].endswith(".json"))
        for p in _parts(names)
    )


def is_torchscript(names: Sequence[str]) -> bool:
    """torch.jit.save's archive: ``<name>/code/...`` beside ``<name>/constants.pkl`` (torch >= 1.4) or
    ``<name>/model.json`` (the format older torch wrote; torch.jit.load says whether it still reads it)."""
    parts = _parts(names)
    return any(p[:1] == ["code"] and len(p) > 1 for p in parts) and any(
        p in (["constants.pkl"], ["model.json"]) for p in parts
    )


def torch_kind(path: str | os.PathLike[str]) -> str:
    """``torchscript`` or ``exported_program``; a ModelError for anything else (with what to do instead)."""
    p = Path(path)
    if not p.is_file():
        raise ModelError(f"{p}: no such file")
    names = zip_names(p)
    if names is None:
        raise ModelError(
            f"{p.name} is not a TorchScript or ExportedProgram file (not a zip archive)",
            hint="save the model with torch.jit.save (after torch.jit.trace/script) or torch.export.save",
        )
    if is_torch_package(names):
        raise ModelError(
            f"{p.name} is a torch.package archive (torch.package.PackageExporter): Python code and pickles, "
            "not a graph edgekit can read",
            hint="in PyTorch, load it with torch.package.PackageImporter(path).load_pickle(package, resource), "
            "then torch.jit.save(torch.jit.trace(model, example)) or torch.export.save(torch.export.export(model, example))",
        )
    if is_torchscript(names):
        return "torchscript"
    if is_exported_program(names):
        return "exported_program"
    raise ModelError(
        f"{p.name} is not TorchScript: it looks like a torch.save checkpoint (weights/pickled module, no graph)",
        hint="load it in PyTorch, then torch.jit.save(torch.jit.trace(model, example)) "
        "or torch.export.save(torch.export.export(model, example))",
    )
