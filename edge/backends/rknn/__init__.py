"""Rockchip RKNPU (RK3588, RK3576, RK3566/RK3568): ONNX -> ``.rknn`` with rknn-toolkit2 in the ``rknn`` toolchain,
parity on the toolkit's simulator (``format``, ``convert``, ``run``)."""
