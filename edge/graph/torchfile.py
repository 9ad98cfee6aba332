"""What kind of PyTorch file a source is (TorchScript or a torch.export ExportedProgram), read from its zip
entries without importing torch: the source adapter and the converters that take torch sources share it."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Sequence

from edge.errors import ModelError


def zip_names(path: Path) -> list[str] | None:
    try:
        with zipfile.ZipFile(path) as z:
            return z.namelist()
    except (OSError, zipfile.BadZipFile):
        return None


def is_exported_program(names: Sequence[str]) -> bool:
    return any(n.endswith(("/archive_format", "serialized_exported_program.json")) or "/models/" in n for n in names)


def is_torchscript(names: Sequence[str]) -> bool:
    return any("/code/" in n for n in names) and any(n.endswith("/constants.pkl") for n in names)


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
    if is_exported_program(names):
        return "exported_program"
    if is_torchscript(names):
        return "torchscript"
    raise ModelError(
        f"{p.name} is not TorchScript: it looks like a torch.save checkpoint (weights/pickled module, no graph)",
        hint="load it in PyTorch, then torch.jit.save(torch.jit.trace(model, example)) "
        "or torch.export.save(torch.export.export(model, example))",
    )
