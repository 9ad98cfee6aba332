"""PyTorch's ExecuTorch: a torch.export program -> ``.pte`` with the XNNPack delegate in the ``executorch``
toolchain, parity on ExecuTorch's own runtime (``format``, ``convert``, ``run``)."""
