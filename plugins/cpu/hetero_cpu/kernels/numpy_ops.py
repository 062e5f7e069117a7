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
    "Acos", "Acosh", "And", "ArgMax", "ArgMin", "Asin", "Asinh", "Atan", "Atanh", "BitShift", "BitwiseAnd",
    "BitwiseNot", "BitwiseOr", "BitwiseXor", "CastLike", "CenterCropPad", "Compress", "ConstantOfShape",
    "ConvInteger", "ConvTranspose", "Cosh", "CumProd", "CumSum", "DepthToSpace", "DequantizeLinear", "Det",
    "DynamicQuantizeLinear", "Einsum", "Equal", "EyeLike", "GRU", "GatherElements", "GatherND", "GlobalLpPool",
    "GlobalMaxPool", "Greater", "GreaterOrEqual", "GroupNormalization", "Hardmax", "InstanceNormalization", "IsInf",
    "IsNaN", "LRN", "LSTM", "Less", "LessOrEqual", "LpNormalization", "LpPool", "MatMulInteger", "Mean",
    "MeanVarianceNormalization", "Mod", "NonZero", "Not", "OneHot", "Or", "PRelu", "Pad", "QLinearConv",
    "QLinearMatMul", "QuantizeLinear", "RMSNormalization", "RNN", "Range", "ReduceL1", "ReduceL2", "ReduceLogSum",
    "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare",
    "Resize", "ReverseSequence", "Scatter", "ScatterElements", "ScatterND", "Shape", "Shrink", "Sign", "Sinh",
    "Size", "SpaceToDepth", "Split", "Sum", "Swish", "Tan", "ThresholdedRelu", "Tile", "TopK", "Trilu", "Unique",
    "Upsample", "Where", "Xor",
)

KERNELS = {("", op): CpuNumpyKernel for op in NUMPY_OPS}
