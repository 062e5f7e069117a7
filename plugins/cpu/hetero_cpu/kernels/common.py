"""Pieces shared by the CPU kernels: dtype checks and the kernel base class."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hetero import dtypes
from hetero.backend import SUPPORTED, NodeInfo, Support, unsupported
from hetero.backend import dtype_check as backend_dtype_check
from hetero.dtypes import DType
from hetero.ops.fused import activation_known, activation_params
from hetero.tensor import Tensor, TensorInfo


def dtype_check(node: NodeInfo, allowed: Iterable[DType], indices: Sequence[int] | None = None) -> Support:
    return backend_dtype_check(node, allowed, "cpu", indices)


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


def fused_activation(attrs: dict) -> tuple[str, float, float]:
    """The native (op, alpha, beta) of a fused node's ``activation`` attribute; ("none", 0, 0) without one."""
    return activation_params(attrs) or ("none", 0.0, 0.0)


def fused_activation_known(node: NodeInfo) -> Support:
    if activation_known(node.node.attrs):
        return SUPPORTED
    return unsupported(f"fused activation {node.attr('activation')}")
