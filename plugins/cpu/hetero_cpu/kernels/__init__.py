"""The CPU kernel table: (domain, op) -> kernel class. One module per kernel family."""

from __future__ import annotations

from . import elementwise, matmul, movement, nn

KERNELS = {
    **elementwise.KERNELS,
    **nn.KERNELS,
    **movement.KERNELS,
    ("", "MatMul"): matmul.CpuMatMul,
    ("", "Gemm"): matmul.CpuGemm,
    ("hetero", "FusedMatMul"): matmul.CpuFusedMatMul,
}
