"""Reductions (cl/reduce.cl): ReduceSum / Mean / Max / Min / Prod / L1 / L2 / LogSum / LogSumExp / SumSquare over any
axes of a float32 tensor, axes from the attribute or (newer opsets) the constant input."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetero.contract import HeteroError, NodeInfo, Support, Tensor

from .common import ClKernel, contiguous_strides, float32_only, pow2_at_most

PROGRAM = "reduce.cl"
# Op codes: keep in sync with cl/reduce.cl (R_*).
REDUCE = {"ReduceSum": 0, "ReduceMean": 1, "ReduceMax": 2, "ReduceMin": 3, "ReduceProd": 4, "ReduceL1": 5,
          "ReduceL2": 6, "ReduceLogSum": 7, "ReduceLogSumExp": 8, "ReduceSumSquare": 9}
# Opset from which each reduction takes its axes as an input (hetero.ops.reduce keeps the same table).
_AXES_INPUT_SINCE = {"ReduceSum": 13}
MAX_GROUP = 64


class ClReduce(ClKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        return float32_only(node, [0])

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        self.op = REDUCE[node.op_type]
        self.axes_input = node.opset >= _AXES_INPUT_SINCE.get(node.op_type, 18)

    def _axes(self, inputs: Sequence[Tensor | None], rank: int) -> list[int] | None:
        """Sorted axes; None: the node is an identity (noop_with_empty_axes with no axes)."""
        if self.axes_input:
            value = self.host(inputs[1]) if len(inputs) > 1 else None
            axes = [] if value is None else [int(a) for a in np.asarray(value).reshape(-1)]
        else:
            axes = [int(a) for a in self.attr("axes", [])]
        if not axes:
            return None if int(self.attr("noop_with_empty_axes", 0)) else list(range(rank))
        for a in axes:
            if not -rank <= a < rank:
                raise HeteroError(f"{self.node.label()}: axis {a} is out of range for rank {rank}")
        return sorted({a % rank for a in axes})

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x, y = inputs[0], outputs[0]
        assert x is not None
        axes = self._axes(inputs, x.ndim)
        if axes is None:  # identity: copy the buffer
            if x.size:
                self.ctx.copy(x.buffer, y.buffer, 0, 0, x.size * 4)
            return
        if y.size == 0:
            return
        strides = contiguous_strides(x.shape)
        kept = [i for i in range(x.ndim) if i not in axes]
        count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
        meta = self.meta("axes", [*(x.shape[i] for i in kept), *(strides[i] for i in kept),
                                  *(x.shape[a] for a in axes), *(strides[a] for a in axes)])
        size = pow2_at_most(max(count, 1), MAX_GROUP)
        self.launch(self.k(PROGRAM, "reduce_axes"), [y.size * size], [size], x.buffer, y.buffer, meta, len(kept),
                    len(axes), count, self.op, self.rt.native.Local(size * 4))


KERNELS = {("", op): ClReduce for op in REDUCE}
