"""The CPU kernel table: (domain, op) -> kernel class. One module per kernel family; native kernels listed after
the numpy ones replace them."""

from __future__ import annotations

from . import elementwise, llm, matmul, movement, nn, numpy_ops, onnx_extra

KERNELS = {
    **numpy_ops.KERNELS,
    **elementwise.KERNELS,
    **nn.KERNELS,
    **movement.KERNELS,
    **onnx_extra.KERNELS,
    ("", "MatMul"): matmul.CpuMatMul,
    ("", "Gemm"): matmul.CpuGemm,
    ("hetero", "FusedMatMul"): matmul.CpuFusedMatMul,
    **llm.KERNELS,
}
