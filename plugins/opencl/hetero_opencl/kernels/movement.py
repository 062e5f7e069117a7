"""Data movement for any dtype (by element size): reshape-like ops share the input's buffer; Transpose, Slice,
Concat, Split, Expand run the strided copy of cl/movement.cl; Gather its gather kernel."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetero.contract import (
    SUPPORTED,
    BackendError,
    HeteroError,
    NodeInfo,
    Support,
    Tensor,
    TensorInfo,
    dtypes,
    unsupported,
)
from hetero.contract.opforms import shape_range

from .common import ClKernel, contiguous_strides

PROGRAM = "movement.cl"
_ELEMENT = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}
MAX_RANK = 8


def _element(info: TensorInfo | None) -> str | None:
    if info is None or info.dtype.np_dtype is None:
        return None
    return _ELEMENT.get(np.dtype(info.dtype.np_dtype).itemsize)


def _sized(node: NodeInfo) -> Support:
    info = node.inputs[0]
    if _element(info) is None:
        return unsupported(f"{node.op_type} on {None if info is None else info.dtype}")
    for i in [*node.inputs, *node.outputs]:
        if i is not None and i.rank is not None and i.rank > MAX_RANK:
            return unsupported(f"rank above {MAX_RANK}")
    return SUPPORTED


class ClView(ClKernel):
    """Reshape, Flatten, Squeeze, Unsqueeze, Identity. The session shares the input's buffer under the new shape
    (``OpenCLBackend.view``) wherever it can; this kernel runs where it cannot (a graph output): a device copy."""

    accepts = staticmethod(_sized)

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x, y = inputs[0], outputs[0]
        assert x is not None
        nbytes = x.dtype.nbytes(x.size)
        if nbytes:
            self.ctx.copy(x.buffer, y.buffer, 0, 0, nbytes)
        y.host_copy = x.host_copy  # the same values: a small input's host copy holds for the output too


class _Copy(ClKernel):
    accepts = staticmethod(_sized)

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        self.kernel = self.k(PROGRAM, f"copy_nd_{_element(node.inputs[0])}")
        self.itemsize = node.inputs[0].dtype.itemsize

    def copy(self, slot: str, x, y, dims: Sequence[int], xstrides: Sequence[int], ystrides: Sequence[int],
             xbase: int = 0, ybase: int = 0) -> None:
        n = int(np.prod(dims, dtype=np.int64))
        if n == 0:
            return
        self.check_extent("input", x, dims, xstrides, xbase)
        self.check_extent("output", y, dims, ystrides, ybase)
        meta = self.meta(slot, [*dims, *xstrides, *ystrides])
        self.launch(self.kernel, [n], None, x, y, meta, n, len(dims), int(xbase), int(ybase))


    def check_extent(self, what: str, buf, dims: Sequence[int], strides: Sequence[int], base: int) -> None:
        """The elements the copy touches lie inside ``buf`` (checked on the host before the launch: a kernel writing
        past a cl_mem on a CPU device writes into the process heap)."""
        low = high = int(base)
        for d, s in zip(dims, strides, strict=True):
            reach = (int(d) - 1) * int(s)
            low, high = (low + reach, high) if reach < 0 else (low, high + reach)
        if low < 0 or (high + 1) * self.itemsize > buf.nbytes:
            raise BackendError(f"opencl: {self.node.label()}: the copy reaches {what} elements {low}..{high} of "
                               f"{self.itemsize} bytes, outside its {buf.nbytes}-byte buffer")


class ClTranspose(_Copy):
    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x, y = inputs[0], outputs[0]
        rank = x.ndim
        perm = self.attr("perm") or list(range(rank))[::-1]
        strides = contiguous_strides(x.shape)
        self.copy("t", x.buffer, y.buffer, y.shape, [strides[p] for p in perm], contiguous_strides(y.shape))


class ClSlice(_Copy):
    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x, y = inputs[0], outputs[0]
        shape = x.shape
        rank = len(shape)
        if len(inputs) > 1:  # opset >= 10: starts, ends, axes, steps are inputs
            # constants (the usual case: the decoder's last-rows Slice) are known at load time, so a replay can
            # bind this kernel; values computed at run time are read on the host
            vals = [self.info.constants.get(i) if i in self.info.constants
                    else None if i >= len(inputs) or inputs[i] is None else self.host(inputs[i]) for i in range(1, 5)]
            starts, ends = vals[0].reshape(-1).tolist(), vals[1].reshape(-1).tolist()
            axes = vals[2].reshape(-1).tolist() if vals[2] is not None else list(range(len(starts)))
            steps = vals[3].reshape(-1).tolist() if vals[3] is not None else [1] * len(starts)
        else:
            starts, ends = list(self.attr("starts")), list(self.attr("ends"))
            axes = list(self.attr("axes", range(len(starts))))
            steps = [1] * len(starts)
        begin, step = [0] * rank, [1] * rank
        for s, e, a, st in zip(starts, ends, axes, steps, strict=False):
            a = int(a) + rank if int(a) < 0 else int(a)
            begin[a] = slice(int(s), int(e), int(st)).indices(shape[a])[0]
            step[a] = int(st)
        strides = contiguous_strides(shape)
        base = sum(b * s for b, s in zip(begin, strides, strict=True))
        self.copy("s", x.buffer, y.buffer, y.shape, [s * st for s, st in zip(strides, step, strict=True)],
                  contiguous_strides(y.shape), xbase=base)


class ClExpand(_Copy):
    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x, y = inputs[0], outputs[0]
        shape = (1,) * (y.ndim - x.ndim) + tuple(x.shape)
        strides = contiguous_strides(shape)
        xs = [0 if d == 1 and o != 1 else s for d, o, s in zip(shape, y.shape, strides, strict=True)]
        self.copy("e", x.buffer, y.buffer, y.shape, xs, contiguous_strides(y.shape))


class ClConcat(_Copy):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        verdict = _sized(node)
        if verdict and any(i is None or i.dtype != node.inputs[0].dtype for i in node.inputs):
            return unsupported("Concat of mixed dtypes")
        return verdict

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        y = outputs[0]
        axis = int(self.attr("axis", 0))
        axis += y.ndim if axis < 0 else 0
        ystrides = contiguous_strides(y.shape)
        offset = 0
        for i, x in enumerate(inputs):
            assert x is not None
            self.copy(f"c{i}", x.buffer, y.buffer, x.shape, contiguous_strides(x.shape), ystrides,
                      ybase=offset * ystrides[axis])
            offset += x.shape[axis]


class ClSplit(_Copy):
    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x = inputs[0]
        assert x is not None
        axis = int(self.attr("axis", 0))
        axis += x.ndim if axis < 0 else 0
        xstrides = contiguous_strides(x.shape)
        offset = 0
        for i, y in enumerate(outputs):
            self.copy(f"s{i}", x.buffer, y.buffer, y.shape, xstrides, contiguous_strides(y.shape),
                      xbase=offset * xstrides[axis])
            offset += y.shape[axis]


class ClGather(ClKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        verdict = _sized(node)
        idx = node.inputs[1] if len(node.inputs) > 1 else None
        if verdict and (idx is None or idx.dtype not in (dtypes.int64, dtypes.int32)):
            return unsupported("Gather indices must be int64 or int32")
        return verdict

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        index = "long" if node.inputs[1].dtype == dtypes.int64 else "int"
        self.kernel = self.k(PROGRAM, f"gather_{_element(node.inputs[0])}_{index}")

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        data, idx, y = inputs[0], inputs[1], outputs[0]
        assert data is not None and idx is not None
        axis = int(self.attr("axis", 0))
        axis += data.ndim if axis < 0 else 0
        inner = int(np.prod(data.shape[axis + 1:], dtype=np.int64))
        n = y.size
        if n == 0:
            return
        if data.shape[axis] == 0:  # the kernel clamps indices into the axis: an empty axis has nothing to clamp to
            raise HeteroError(f"{self.node.label()}: Gather of {idx.size} indices from an empty axis {axis} "
                              f"(data shape {list(data.shape)})")
        self.launch(self.kernel, [n], None, data.buffer, idx.buffer, y.buffer, n, idx.size, inner,
                    data.shape[axis])


class ClShape(ClKernel):
    """Shape: the dims are known on the host, so the output is written from there (and kept as its host copy: a
    Reshape or Slice reading it later needs no download). Nothing runs on the device and the input is never read."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        return SUPPORTED

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        dims = inputs[0].shape
        start, end = shape_range(self.attr("start", 0), self.attr("end"), len(dims))
        self.put_host_result(outputs[0], np.asarray(dims[start:end], dtype=np.int64))


_PAD_MODES = {"constant": 0, "reflect": 1, "edge": 2, "wrap": 3}


class ClPad(ClKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        verdict = _sized(node)
        mode = node.attr("mode", "constant")
        mode = mode.decode() if isinstance(mode, bytes) else str(mode)
        if verdict and mode not in _PAD_MODES:
            return unsupported(f"Pad mode {mode!r}")
        return verdict

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        mode = self.attr("mode", "constant")
        self.mode = _PAD_MODES[mode.decode() if isinstance(mode, bytes) else str(mode)]
        self.dtype = node.inputs[0].dtype.np_dtype
        self.kernel = self.k(PROGRAM, f"pad_{_element(node.inputs[0])}")
        self._value: tuple[bytes, object] | None = None

    def _pads(self, inputs: Sequence[Tensor | None], rank: int) -> list[int]:
        if self.info.opset < 11:
            return [int(p) for p in self.attr("pads" if self.info.opset >= 2 else "paddings")]
        pads = [int(p) for p in np.asarray(self.host(inputs[1])).reshape(-1)]
        if len(inputs) > 3 and inputs[3] is not None:
            axes = [int(a) % rank for a in np.asarray(self.host(inputs[3])).reshape(-1)]
            full = [0] * (2 * rank)
            for i, a in enumerate(axes):
                full[a], full[a + rank] = pads[i], pads[i + len(axes)]
            return full
        return pads

    def _constant(self, inputs: Sequence[Tensor | None]):
        """A one-element device buffer holding the pad value in the tensor's dtype (re-uploaded when it changes)."""
        if self.info.opset < 11:
            value = np.asarray(self.attr("value", 0.0))
        elif len(inputs) > 2 and inputs[2] is not None and inputs[2].size:
            value = np.asarray(self.host(inputs[2])).reshape(-1)[0]
        else:
            value = np.asarray(0)
        raw = np.asarray(value).astype(self.dtype).reshape(1).tobytes()
        if self._value is None or self._value[0] != raw:
            buf = self.ctx.alloc(len(raw))
            self.ctx.write(buf, np.frombuffer(raw, np.uint8).copy())
            self._value = (raw, buf)
        return self._value[1]

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x, y = inputs[0], outputs[0]
        assert x is not None
        if y.size == 0:
            return
        rank = x.ndim
        pads = self._pads(inputs, rank)
        begin = [max(p, 0) for p in pads[:rank]]
        crop = [max(-p, 0) for p in pads[:rank]]
        kept = [x.shape[d] - crop[d] - max(-pads[rank + d], 0) for d in range(rank)]
        if self.mode != 0 and any(k == 0 for k in kept):
            raise HeteroError(f"{self.node.label()}: Pad mode needs a non-empty input along every padded axis")
        meta = self.meta("pad", [*y.shape, *contiguous_strides(x.shape), *begin, *crop, *kept])
        self.launch(self.kernel, [y.size], None, x.buffer, y.buffer, meta, self._constant(inputs), y.size, rank,
                    self.mode)


KERNELS = {
    ("", "Shape"): ClShape,
    ("", "Pad"): ClPad,
    **{("", op): ClView for op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")},
    ("", "Transpose"): ClTranspose,
    ("", "Slice"): ClSlice,
    ("", "Expand"): ClExpand,
    ("", "Concat"): ClConcat,
    ("", "Split"): ClSplit,
    ("", "Gather"): ClGather,
}
