"""Data movement on Metal (msl/movement.metal): Reshape, Flatten, Squeeze, Unsqueeze, Identity (the session makes
views of them wherever it can; these kernels run where it cannot, e.g. a graph output), Transpose, Expand, Slice,
Concat; Gather and Cast. Each copy is numpy's own view of the input (transposed, broadcast, sliced) or of the
output (a Concat part) turned into a strided copy: dims, element strides and offsets relative to the bound arrays,
so numpy's indexing rules are the ones applied and the kernel only moves elements."""

from __future__ import annotations

import numpy as np

from hetero.contract import SUPPORTED, HeteroError, NodeInfo, Support, dtypes, unsupported

from ..plan import Dispatch, dispatch, groups_for
from .common import MetalKernel

_BY_SIZE = {1: ("copy_u8", np.uint8), 2: ("copy_u16", np.uint16), 4: ("copy_u32", np.uint32),
            8: ("copy_u64", np.int64)}
_PLAIN = tuple(d for d in dtypes.ALL if d.np_dtype is not None and d.np_dtype.isbuiltin == 1
               and d.np_dtype.kind in "biuf" and d.itemsize in _BY_SIZE)
MAX_RANK = 8  # COPY_MAX_RANK
THREADS = 256


def plain_dtypes(node: NodeInfo) -> Support:
    for info in [*node.inputs[:1], *node.outputs]:
        if info is not None and info.dtype not in _PLAIN:
            return unsupported(f"metal {node.op_type} on {info.dtype}")
        if info is not None and info.shape is not None and len(info.shape) > MAX_RANK:
            return unsupported(f"metal {node.op_type} of rank {len(info.shape)} (at most {MAX_RANK})")
    return SUPPORTED


def _strides(view: np.ndarray, base: np.ndarray) -> tuple[list[int], int]:
    """``view``'s strides and offset in elements of ``base`` (whose memory it views)."""
    size = base.itemsize
    return [s // size for s in view.strides], (view.ctypes.data - base.ctypes.data) // size


def copy_dispatch(src: np.ndarray, x: np.ndarray, dst: np.ndarray, y: np.ndarray) -> Dispatch | None:
    """The copy of the view ``src`` (of array ``x``) into the view ``dst`` (of ``y``), same shape."""
    if src.size == 0:
        return None
    if src.ndim == 0:
        src, dst = src.reshape(1), dst.reshape(1)
    src_strides, src_offset = _strides(src, x)
    dst_strides, dst_offset = _strides(dst, y)
    kernel, element = _BY_SIZE[x.itemsize]
    meta = np.array([*src.shape, *src_strides, *dst_strides], np.int32)
    return dispatch(kernel, {"x": x.reshape(-1).view(element), "y": y.reshape(-1).view(element), "meta": meta,
                             "p": {"n": src.size, "rank": src.ndim, "src_offset": src_offset,
                                   "dst_offset": dst_offset}}, (groups_for(src.size, THREADS),), (THREADS,))


class _Copy(MetalKernel):
    accepts = staticmethod(plain_dtypes)

    def views(self, inputs: list[np.ndarray | None], y: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(source view, its array, destination view of y) per copy."""
        raise NotImplementedError

    def plan(self, inputs, outputs):
        y = outputs[0]
        planned = [copy_dispatch(src, x, dst, y) for src, x, dst in self.views(inputs, y)]
        return [d for d in planned if d is not None]


class MetalView(_Copy):
    def views(self, inputs, y):
        return [(inputs[0].reshape(y.shape), inputs[0], y)]


class MetalTranspose(_Copy):
    def views(self, inputs, y):
        x = inputs[0]
        return [(x.transpose(self.attr("perm") or list(range(x.ndim))[::-1]), x, y)]


class MetalExpand(_Copy):
    def views(self, inputs, y):
        return [(np.broadcast_to(inputs[0], y.shape), inputs[0], y)]


class MetalSlice(_Copy):
    """Slice with starts/ends/axes/steps from inputs (opset >= 10) or attributes (opset < 10): numpy's slicing
    clamps them the way ONNX does."""

    host_inputs = (1, 2, 3, 4)

    def views(self, inputs, y):
        x = inputs[0]
        if self.info.opset >= 10:
            starts, ends = (_ints(inputs[i]) for i in (1, 2))
            axes = _ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else list(range(len(starts)))
            steps = _ints(inputs[4]) if len(inputs) > 4 and inputs[4] is not None else [1] * len(starts)
        else:
            starts, ends = list(self.attr("starts")), list(self.attr("ends"))
            axes, steps = list(self.attr("axes", range(len(starts)))), [1] * len(starts)
        index = [slice(None)] * x.ndim
        for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
            index[axis] = slice(start, end, step)
        return [(x[tuple(index)], x, y)]


class MetalConcat(_Copy):
    def views(self, inputs, y):
        axis = self.attr("axis")
        axis = axis + y.ndim if axis < 0 else axis
        index, offset, copies = [slice(None)] * y.ndim, 0, []
        for x in inputs:
            if x is None:
                continue
            index[axis] = slice(offset, offset + x.shape[axis])
            copies.append((x, x, y[tuple(index)]))
            offset += x.shape[axis]
        return copies


class MetalGather(MetalKernel):
    """Gather of 4- and 8-byte elements. The indices are checked on the host and copied, as int64, into a buffer of
    the kernel's own (its argument buffer for a bound plan)."""

    host_inputs = (1,)

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        x, idx = node.inputs[0], node.inputs[1]
        if x is None or x.dtype not in _PLAIN or x.dtype.itemsize not in (4, 8):
            return unsupported(f"metal Gather on {None if x is None else x.dtype} (4- and 8-byte elements)")
        if idx is None or idx.dtype not in (dtypes.int64, dtypes.int32):
            return unsupported("metal Gather takes int32 or int64 indices")
        return SUPPORTED

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        self.indices = np.zeros(0, np.int64)

    def update(self, inputs) -> bool:
        x, idx = inputs[0], inputs[1]
        axis = self._axis(x)
        dim = x.shape[axis]
        if idx.size and (idx.min() < -dim or idx.max() >= dim):
            bad = int(idx[(idx < -dim) | (idx >= dim)].reshape(-1)[0])
            raise HeteroError(f"{self.node.label()}: index {bad} is outside [-{dim}, {dim}) on axis {axis}")
        resized = self.indices.size != idx.size
        if resized:
            self.indices = np.empty(max(idx.size, 1), np.int64)
        np.copyto(self.indices[:idx.size], idx.reshape(-1), casting="unsafe")
        return not resized

    def _axis(self, x: np.ndarray) -> int:
        axis = int(self.attr("axis", 0))
        return axis + x.ndim if axis < 0 else axis

    def plan(self, inputs, outputs):
        self.update(inputs)
        x, idx, y = inputs[0], inputs[1], outputs[0]
        if y.size == 0:
            return []
        axis = self._axis(x)
        kernel, element = ("gather_u32", np.uint32) if x.itemsize == 4 else ("gather_u64", np.int64)
        inner = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
        return [dispatch(kernel, {"x": x.reshape(-1).view(element), "idx": self.indices,
                                  "y": y.reshape(-1).view(element), "p": {
                                      "n": y.size, "indices": max(idx.size, 1), "inner": inner,
                                      "axis_dim": x.shape[axis]}}, (groups_for(y.size, THREADS),), (THREADS,))]


CAST_CODES = {dtypes.float32: 0, dtypes.float16: 1, dtypes.int32: 2, dtypes.int64: 3, dtypes.uint8: 4,
              dtypes.bool_: 5}


class MetalCast(MetalKernel):
    """Cast between float32, float16, int32, int64, uint8 and bool (msl/movement.metal cast_any)."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        for info, what in ((node.inputs[0], "input"), (node.outputs[0], "output")):
            if info is None or info.dtype not in CAST_CODES:
                return unsupported(f"metal Cast {what} dtype {None if info is None else info.dtype}")
        return SUPPORTED

    def plan(self, inputs, outputs):
        x, y = inputs[0], outputs[0]
        if y.size == 0:
            return []
        codes = [CAST_CODES[dtypes.from_numpy(a.dtype)] for a in (x, y)]
        return [dispatch("cast_any", {"x": x.reshape(-1).view(np.uint8), "y": y.reshape(-1).view(np.uint8),
                                      "p": {"n": y.size, "src": codes[0], "dst": codes[1]}},
                         (groups_for(y.size, THREADS),), (THREADS,))]


def _ints(array: np.ndarray) -> list[int]:
    return [int(v) for v in array.reshape(-1)]


KERNELS = {
    **{("", op): MetalView for op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")},
    ("", "Transpose"): MetalTranspose,
    ("", "Expand"): MetalExpand,
    ("", "Slice"): MetalSlice,
    ("", "Concat"): MetalConcat,
    ("", "Gather"): MetalGather,
    ("", "Cast"): MetalCast,
}
