"""Rare ops that the cpu backend runs with hetero's numpy reference instead of a native kernel.

They keep whole models on the cpu backend (no fallback, no copies, one placement report) where a native kernel
would not pay for itself. ``docs/ops.md`` lists which ops are native and which are numpy. A native kernel for any
of them simply replaces the entry in the table (see kernels/__init__.py).
"""

from __future__ import annotations

from hetero.backend import NodeInfo, Support
from hetero.reference import ReferenceBackend, ReferenceKernel


class CpuNumpyKernel(ReferenceKernel):
    implementation = "numpy"  # shown in `hetero ops` / docs/ops.md
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        return ReferenceBackend.supports(None, node)  # type: ignore[arg-type]  (it reads no backend state)


# Left out on purpose: random ops (their values follow the reference's generator), training losses, and control
# flow (If/Loop/Scan), which stays with the reference backend and its subgraph runner.
NUMPY_OPS = (
    "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "BitShift", "BitwiseAnd", "BitwiseNot", "BitwiseOr",
    "BitwiseXor", "CastLike", "CenterCropPad", "Compress", "ConstantOfShape", "ConvInteger", "Cosh", "CumProd",
    "CumSum", "DequantizeLinear", "Det", "DynamicQuantizeLinear", "Einsum", "EyeLike", "GatherElements", "GatherND",
    "GlobalLpPool", "Hardmax", "IsInf", "IsNaN", "LRN", "LpNormalization", "LpPool", "MatMulInteger", "Mean",
    "MeanVarianceNormalization", "Mod", "NonZero", "OneHot", "QLinearConv", "QLinearMatMul", "QuantizeLinear",
    "RMSNormalization", "RNN", "Range", "ReverseSequence", "Scatter", "ScatterElements", "ScatterND", "Shape",
    "Shrink", "Sign", "Sinh", "Size", "Sum", "Swish", "Tan", "ThresholdedRelu", "Trilu", "Unique",
)

KERNELS = {("", op): CpuNumpyKernel for op in NUMPY_OPS}
