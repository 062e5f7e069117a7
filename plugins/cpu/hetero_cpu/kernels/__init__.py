"""The CPU kernel table: (domain, op) -> kernel class. One module per kernel family; every ONNX op starts as numpy
(numpy_ops) and the native kernels listed after replace it."""

from __future__ import annotations

from hetero.contract import KernelFactory

from . import elementwise, gated_delta, llm, matmul, movement, nn, numpy_ops, onnx_extra, quant, trees

KERNELS: dict[tuple[str, str], KernelFactory] = {
    **numpy_ops.onnx_ops(),
    **elementwise.KERNELS,
    **nn.KERNELS,
    **movement.KERNELS,
    **onnx_extra.KERNELS,
    **quant.KERNELS,
    ("", "MatMul"): matmul.CpuMatMul,
    ("", "Gemm"): matmul.CpuGemm,
    ("hetero", "FusedMatMul"): matmul.CpuFusedMatMul,
    ("hetero", "MatMulGelu"): matmul.CpuMatMulGelu,
    ("hetero", "FusedAttention"): matmul.CpuFusedAttention,
    ("hetero", "ConvNHWC"): matmul.CpuConvNHWC,
    **llm.KERNELS,
    **gated_delta.KERNELS,
    **trees.KERNELS,
}
