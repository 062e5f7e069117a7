"""The toy backend: host memory, and a kernel table with two kernels (Relu on any dtype, Add on float32)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from hetero.contract import (
    SUPPORTED,
    Backend,
    HostMemory,
    KernelTableBackend,
    NodeInfo,
    Support,
    Tensor,
    TensorInfo,
    dtypes,
    unsupported,
)


class ToyRelu:
    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        self.node = node  # a device kernel also keeps its backend: its queue, its allocator

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        pass  # nothing to plan: a real kernel picks its algorithm and sizes its scratch memory here

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        np.maximum(inputs[0].numpy(), 0, out=outputs[0].numpy())  # into the preallocated output: no allocation


class ToyAdd:
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if any(info is None or info.dtype != dtypes.float32 for info in node.inputs):
            return unsupported("toy Add runs float32 only")
        return SUPPORTED

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        self.node = node

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        pass

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        np.add(inputs[0].numpy(), inputs[1].numpy(), out=outputs[0].numpy())  # numpy broadcasts like ONNX


class ToyBackend(HostMemory, KernelTableBackend):
    name: ClassVar[str] = "toy"
    kernels: ClassVar = {("", "Relu"): ToyRelu, ("", "Add"): ToyAdd}
