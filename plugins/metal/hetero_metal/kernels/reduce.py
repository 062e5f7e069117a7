"""Reductions on Metal (msl/norm.metal reduce_f32): ReduceSum, Mean, Max, Min, L1, L2, SumSquare, LogSum and
LogSumExp over float32, any axes. numpy's transposed view of the input (kept axes first, reduced ones last) gives
the dims and strides the kernel walks; one threadgroup per output element."""

from __future__ import annotations

import numpy as np

from hetero.contract import NodeInfo, Support, unsupported

from ..plan import dispatch
from .common import MetalKernel, float32_only
from .movement import MAX_RANK, copy_dispatch
from .nn import row_threads

OPS = {"ReduceSum": 0, "ReduceMean": 1, "ReduceMax": 2, "ReduceMin": 3, "ReduceL1": 4, "ReduceL2": 5,
       "ReduceSumSquare": 6, "ReduceLogSum": 7, "ReduceLogSumExp": 8}


class MetalReduce(MetalKernel):
    host_inputs = (1,)

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        x = node.inputs[0]
        if x is not None and x.shape is not None and len(x.shape) > MAX_RANK:
            return unsupported(f"metal {node.op_type} of rank {len(x.shape)} (at most {MAX_RANK})")
        return float32_only(node, [0])

    def axes(self, inputs: list[np.ndarray | None], rank: int) -> list[int] | None:
        """The reduced axes, normalised; None: an identity (``noop_with_empty_axes``)."""
        since = 13 if self.node.op_type == "ReduceSum" else 18
        if self.info.opset >= since:
            given = inputs[1] if len(inputs) > 1 else None
            axes = [] if given is None else [int(a) for a in given.reshape(-1)]
        else:
            axes = list(self.attr("axes", []) or [])
        if not axes:
            return None if self.attr("noop_with_empty_axes", 0) else list(range(rank))
        return sorted({a + rank if a < 0 else a for a in axes})

    def plan(self, inputs, outputs):
        x, y = inputs[0], outputs[0]
        axes = self.axes(inputs, x.ndim)
        if axes is None:
            copy = copy_dispatch(x.reshape(y.shape), x, y, y)
            return [] if copy is None else [copy]
        kept = [a for a in range(x.ndim) if a not in axes]
        view = x.transpose(kept + axes) if x.ndim else x.reshape(1)
        if y.size == 0:
            return []
        inner = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
        meta = np.array([*view.shape, *(s // 4 for s in view.strides)], np.int32)
        return [dispatch("reduce_f32", {"x": x, "y": y, "meta": meta, "p": {
            "inner": inner, "rank": view.ndim, "kept": len(kept), "op": OPS[self.node.op_type]}},
            (y.size,), (row_threads(max(inner, 1)),))]


KERNELS = {("", op): MetalReduce for op in OPS}
