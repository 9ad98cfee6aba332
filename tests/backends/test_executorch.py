"""ExecuTorch (issue #32): a torch.export program -> ``.pte`` with the XNNPack delegate in the ``executorch``
toolchain, parity on ExecuTorch's own x86 runtime, the device runner behind an exact check, and the one-line
refusals (TorchScript, ONNX) that need no toolchain.

The toolchain (``edgekit toolchain install executorch``: 1.5 GB, 60-105 s to install here) is not in CI's install
list, so every test that needs it is ``corpus_full``; run them with
``pytest -m corpus_full tests/backends/test_executorch.py``.
"""

from __future__ import annotations

from edge import toolchains


def test_toolchain_pins_executorch_beside_the_cpu_torch_and_locks_the_set() -> None:
    spec = toolchains.get_spec("executorch")
    assert spec.install_command == "edgekit toolchain install executorch"
    lock = toolchains.lock_lines(spec.lock_text.splitlines())
    assert all(ln.count("==") == 1 for ln in lock)
    # executorch declares no torch: its runtime links libtorch, so the CPU wheel is pinned beside it
    assert "torch==2.13.0+cpu" in lock and "executorch==1.5.1" in lock
    for req in spec.requirements:  # every top-level pin agrees with the lock (torch's local +cpu label aside)
        name, version = req.split("==")
        assert any(ln.lower().split("+")[0] == f"{name.lower()}=={version}" for ln in lock), req
