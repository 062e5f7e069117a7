"""Pieces shared by the CPU kernels: dtype checks and the kernel base class."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hetero import dtypes
from hetero.backend import SUPPORTED, NodeInfo, Support, unsupported
from hetero.dtypes import DType
from hetero.tensor import Tensor, TensorInfo


def dtype_check(node: NodeInfo, allowed: Iterable[DType], indices: Sequence[int] | None = None) -> Support:
    """Supported when the chosen inputs (default: all present) and every output have an allowed dtype."""
    allowed = tuple(allowed)
    picked = node.inputs if indices is None else [node.inputs[i] for i in indices if i < len(node.inputs)]
    for info in [*picked, *node.outputs]:
        if info is not None and info.dtype not in allowed:
            names = "/".join(d.name for d in allowed)
            return unsupported(f"{node.op_type} on {info.dtype} (cpu kernels take {names})")
    return SUPPORTED


def float32_only(node: NodeInfo, indices: Sequence[int] | None = None) -> Support:
    return dtype_check(node, (dtypes.float32,), indices)


class CpuKernel:
    """Base: keeps the node; ``prepare`` does nothing unless a kernel has shape-dependent plans."""

    def __init__(self, node: NodeInfo) -> None:
        self.info = node
        self.node = node.node

    def attr(self, name: str, default=None):
        return self.node.attrs.get(name, default)

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        pass

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        raise NotImplementedError


# Fused-activation attribute (hetero.ops.fused) -> (native unary op, alpha from attribute/default, beta likewise)
_FUSED_ACTIVATIONS = {
    "Relu": ("relu", None, 0.0, None, 0.0),
    "Clip": ("clip", "activation_min", float("-inf"), "activation_max", float("inf")),
    "Sigmoid": ("sigmoid", None, 0.0, None, 0.0),
    "Tanh": ("tanh", None, 0.0, None, 0.0),
    "LeakyRelu": ("leaky_relu", "activation_alpha", 0.01, None, 0.0),
    "HardSigmoid": ("hard_sigmoid", "activation_alpha", 0.2, "activation_beta", 0.5),
    "HardSwish": ("hard_swish", None, 0.0, None, 0.0),
    "Silu": ("silu", None, 0.0, None, 0.0),
}


def fused_activation(attrs: dict) -> tuple[str, float, float]:
    """The native (op, alpha, beta) of a fused node's ``activation`` attribute; ("none", 0, 0) without one."""
    name = attrs.get("activation", "")
    if not name:
        return "none", 0.0, 0.0
    op, alpha_key, alpha, beta_key, beta = _FUSED_ACTIVATIONS[name]
    return (op, float(attrs.get(alpha_key, alpha)) if alpha_key else alpha,
            float(attrs.get(beta_key, beta)) if beta_key else beta)


def fused_activation_known(node: NodeInfo) -> Support:
    name = node.attr("activation", "")
    if name and name not in _FUSED_ACTIVATIONS:
        return unsupported(f"fused activation {name}")
    return SUPPORTED
