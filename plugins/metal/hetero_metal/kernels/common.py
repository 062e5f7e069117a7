"""The base of the Metal backend's kernels: each op plans a list of ``Dispatch``es from its input and output arrays
(kernel choice, argument packing, grid and threadgroup sizes: shared by the emulator and the Metal host code) and
submits them to the backend's queue."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from hetero.contract import SUPPORTED, NodeInfo, Support, Tensor, TensorInfo, dtypes, unsupported
from hetero.contract.dtypes import DType

from ..plan import Dispatch


def dtype_check(node: NodeInfo, allowed: Iterable[DType], indices: Sequence[int] | None = None) -> Support:
    allowed = tuple(allowed)
    chosen = range(len(node.inputs)) if indices is None else indices
    infos = [node.inputs[i] for i in chosen if i < len(node.inputs)] + list(node.outputs)
    for info in infos:
        if info is not None and info.dtype not in allowed:
            names = ", ".join(str(a) for a in allowed)
            return unsupported(f"metal {node.op_type} takes {names}, not {info.dtype}")
    return SUPPORTED


def float32_only(node: NodeInfo, indices: Sequence[int] | None = None) -> Support:
    return dtype_check(node, (dtypes.float32,), indices)


class MetalKernel:
    """prepare() keeps the static infos; run() plans and submits; bind() plans once for the replay, when every
    array the plan holds is the tensor's own buffer (so later contents are seen) and the plan reads nothing from
    the host at run time (``bindable``)."""

    bindable = True

    def __init__(self, node: NodeInfo, backend: Any) -> None:
        self.info = node
        self.node = node.node
        self.backend = backend

    def attr(self, name: str, default: Any = None) -> Any:
        return self.node.attrs.get(name, default)

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        pass

    def plan(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> list[Dispatch]:
        raise NotImplementedError

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        if not self.bindable:
            self.backend.synchronize()  # the plan reads values on the host: earlier queued work must have landed
        ins = [None if t is None else np.ascontiguousarray(t.numpy()) for t in inputs]
        outs = [t.numpy() for t in outputs]
        dense = [o if o.flags.c_contiguous else np.empty(o.shape, o.dtype) for o in outs]
        self.backend.submit(self.plan(ins, dense))
        if any(d is not o for d, o in zip(dense, outs, strict=True)):
            self.backend.synchronize()
            for d, o in zip(dense, outs, strict=True):
                if d is not o:
                    np.copyto(o, d)

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Callable[[], None] | None:
        if not self.bindable:
            return None
        ins = [None if t is None else t.numpy() for t in inputs]
        outs = [t.numpy() for t in outputs]
        if any(a is not None and not a.flags.c_contiguous for a in [*ins, *outs]):
            return None
        planned = self.plan(ins, outs)
        submit = self.backend.submit
        return lambda: submit(planned)


def placeholder() -> np.ndarray:
    """Bound where a kernel's optional buffer is absent (Metal needs a buffer at every index the kernel reads)."""
    return np.zeros(4, dtype=np.float32)
