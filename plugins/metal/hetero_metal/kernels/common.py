"""The base of the Metal backend's kernels: each op plans a list of ``Dispatch``es from its input and output arrays
(kernel choice, argument packing, grid and threadgroup sizes: shared by the emulator and the Metal host code) and
submits them to the backend's queue."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from hetero.contract import NodeInfo, Support, Tensor, TensorInfo, dtypes
from hetero.contract import dtype_check as backend_dtype_check
from hetero.contract.dtypes import DType

from ..plan import Dispatch


def dtype_check(node: NodeInfo, allowed: Iterable[DType], indices: Sequence[int] | None = None) -> Support:
    return backend_dtype_check(node, allowed, "metal", indices)


def float32_only(node: NodeInfo, indices: Sequence[int] | None = None) -> Support:
    return dtype_check(node, (dtypes.float32,), indices)


class MetalKernel:
    """prepare() keeps the static infos; run() plans and submits; bind() plans once for the session's replay and
    submits the same dispatches at every step, which the queue then records into a command plan once and replays.

    A kernel that reads values on the host (``host_inputs``: past_len, token ids) keeps what changes between steps
    in ``ArgumentBuffer``s: ``update`` reads the inputs and rewrites them before each bound submission, and says
    when the plan itself must change (a table that had to grow). ``bindable = False``: planned at each run."""

    bindable = True
    host_inputs: tuple[int, ...] = ()

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

    def update(self, inputs: list[np.ndarray | None]) -> bool:
        """A bound plan's host work before each step: read the host inputs, rewrite the argument buffers. False:
        the planned dispatches no longer fit (plan again)."""
        return True

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        if not self.bindable:
            self.backend.synchronize()  # the plan reads values on the host: earlier queued work must have landed
        ins = [None if t is None else np.ascontiguousarray(t.numpy()) for t in inputs]
        self._host_ready(ins)
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
        self._host_ready(ins)
        planned = [tuple(self.plan(ins, outs))]
        submit = self.backend.submit

        def step() -> None:
            self._host_ready(ins)
            if not self.update(ins):
                planned[0] = tuple(self.plan(ins, outs))  # a new submission: the queue records a new plan
            submit(planned[0], bound=True)

        return step

    def _host_ready(self, inputs: list[np.ndarray | None]) -> None:
        """Waits for queued work that writes an input this kernel reads on the host."""
        for i in self.host_inputs:
            array = inputs[i] if i < len(inputs) else None
            if array is not None and self.backend.queue.writes_pending(array):
                self.backend.synchronize()
                return


def placeholder() -> np.ndarray:
    """Bound where a kernel's optional buffer is absent (Metal needs a buffer at every index the kernel reads)."""
    return np.zeros(4, dtype=np.float32)
