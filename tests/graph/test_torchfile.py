"""What kind of PyTorch file a zip archive is, from its entries alone (no torch needed): the layouts below are
the entry lists torch 2.13 wrote for tests/support/torch_models.py's ``tvstyle.pt`` (torch.jit.save of a traced
model whose code lives in a ``models`` package, as torchvision's does), ``tiny.pt2`` (torch.export.save) and
``packaged.pt`` (torch.package)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from edge.errors import ModelError
from edge.graph.torchfile import torch_kind
from edge.pipeline.sources import is_torch_source

TORCHSCRIPT_MODELS_PACKAGE = [
    "tvstyle/data/0",
    "tvstyle/data.pkl",
    "tvstyle/code/__torch__/models/tvnet.py",
    "tvstyle/code/__torch__/models/tvnet.py.debug_pkl",
    "tvstyle/code/__torch__/torch/nn/modules/container.py",
    "tvstyle/constants.pkl",
    "tvstyle/traced_inputs/0",
    "tvstyle/traced_inputs.pkl",
    "tvstyle/version",
    "tvstyle/byteorder",
    "tvstyle/.data/serialization_id",
]
EXPORTED_PROGRAM = [
    "tiny/data/weights/weight_0",
    "tiny/data/weights/model_weights_config.json",
    "tiny/data/constants/model_constants_config.json",
    "tiny/models/model.json",
    "tiny/data/sample_inputs/model.pt",
    "tiny/archive_format",
    "tiny/archive_version",
    "tiny/.data/version",
    "tiny/byteorder",
    "tiny/.data/serialization_id",
]
TORCH_PACKAGE = [
    "packaged/.data/0.storage",
    "packaged/models/model.pkl",
    "packaged/models/tvnet.py",
    "packaged/.data/extern_modules",
    "packaged/.data/python_version",
    "packaged/.data/version",
    "packaged/byteorder",
    "packaged/.data/serialization_id",
]


def _archive(path: Path, names: list[str]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for n in names:
            z.writestr(n, b"")
    return path


@pytest.mark.parametrize(
    "names,kind",
    [
        (TORCHSCRIPT_MODELS_PACKAGE, "torchscript"),
        ([n.replace("/models/", "/mynet/") for n in TORCHSCRIPT_MODELS_PACKAGE], "torchscript"),
        (EXPORTED_PROGRAM, "exported_program"),
    ],
)
def test_kind_from_the_archive_layout(tmp_path: Path, names: list[str], kind: str) -> None:
    path = _archive(tmp_path / "model.bin", names)
    assert is_torch_source(path)
    assert torch_kind(path) == kind


def test_torch_package_has_its_own_reason(tmp_path: Path) -> None:
    path = _archive(tmp_path / "model.bin", TORCH_PACKAGE)
    assert is_torch_source(path)
    with pytest.raises(ModelError, match=r"model.bin is a torch.package archive") as e:
        torch_kind(path)
    assert "torch.export.save" not in e.value.message and "PackageImporter" in (e.value.hint or "")


def test_checkpoint_is_still_a_checkpoint(tmp_path: Path) -> None:
    path = _archive(tmp_path / "weights.pt", ["weights/data.pkl", "weights/data/0", "weights/version"])
    with pytest.raises(ModelError, match="torch.save checkpoint"):
        torch_kind(path)


SILERO_JIT = Path(__file__).resolve().parents[2] / "examples" / "models" / "silero_vad.jit"


@pytest.mark.skipif(
    not SILERO_JIT.is_file(), reason=f"{SILERO_JIT.name} not fetched: run python examples/fetch_pretrained.py (CI does)"
)
def test_a_real_torchscript_from_a_wheel_is_torchscript() -> None:
    """silero_vad.jit (silero-vad 6.2.3, MIT): TorchScript written by Silero's torch, not by the toolchain; its
    input names come from torch.jit.load in the torch toolchain when that is installed."""
    from edge.backends.onnxruntime.from_torch import TorchToOnnx
    from tests.support import torch_models

    assert is_torch_source(SILERO_JIT) and torch_kind(SILERO_JIT) == "torchscript"
    if torch_models.toolchain_problem() is None:
        assert TorchToOnnx.input_names(SILERO_JIT) == ["x", "sr"]
