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
