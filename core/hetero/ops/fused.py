"""Fused ops that graph passes create (domain "hetero"): a producer and its cheap consumers in one kernel.

``FusedConv`` is Conv followed by an activation; ``FusedMatMul`` is MatMul by a 2-D weight, plus a bias row, plus an
activation. Their references are the unfused ops' references composed, so a fused node means exactly what the
nodes it replaced meant.
"""

from __future__ import annotations

import numpy as np

from ..contract.graph import HETERO_DOMAIN, Node
from ..contract.registry import OpContext, get, op
from ..contract.tensor import TensorInfo

# activation attribute value -> (ONNX op, the attributes it takes from the fused node)
ACTIVATIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "Relu": ("Relu", ()),
    "Clip": ("Clip", ("min", "max")),
    "Sigmoid": ("Sigmoid", ()),
    "Tanh": ("Tanh", ()),
    "LeakyRelu": ("LeakyRelu", ("alpha",)),
    "HardSigmoid": ("HardSigmoid", ("alpha", "beta")),
    "HardSwish": ("HardSwish", ()),
    "Silu": ("Silu", ()),  # x * sigmoid(x), matched from the two-node pattern
}


def apply_activation(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    name = ctx.attr("activation", "")
    if not name:
        return x
    if name == "Silu":
        return (x / (1 + np.exp(-x.astype(np.float64)))).astype(x.dtype)
    op_type, params = ACTIVATIONS[name]
    attrs = {p: ctx.node.attrs[f"activation_{p}"] for p in params if f"activation_{p}" in ctx.node.attrs}
    inner = Node(op_type, ["x"], ["y"], attrs, name=f"{ctx.node.name}/{op_type}")
    info = TensorInfo(ctx.inputs[0].dtype, x.shape) if ctx.inputs[0] is not None else None
    return get("", op_type).reference(OpContext(inner, [info], [x], ctx.opset))[0]


def _conv_infer(ctx: OpContext) -> list[TensorInfo]:
    return get("", "Conv").infer(ctx)


@op("FusedConv", domain=HETERO_DOMAIN, infer=_conv_infer)
def fused_conv(ctx: OpContext) -> list[np.ndarray]:
    """Conv (all of its attributes) followed by the activation named by ``activation``."""
    (y,) = get("", "Conv").reference(ctx)
    return [apply_activation(ctx, y)]


def _matmul_infer(ctx: OpContext) -> list[TensorInfo]:
    return get("", "MatMul").infer(ctx)


@op("FusedMatMul", domain=HETERO_DOMAIN, infer=_matmul_infer)
def fused_matmul(ctx: OpContext) -> list[np.ndarray]:
    """x @ W (W 2-D), plus the optional bias row (input 2), then the optional activation."""
    x, w = ctx.array(0), ctx.array(1)
    y = np.matmul(x, w)
    if ctx.has_input(2):
        y = y + ctx.array(2)
    return [apply_activation(ctx, y.astype(x.dtype, copy=False))]
