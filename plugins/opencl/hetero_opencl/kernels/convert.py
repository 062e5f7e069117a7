"""Dtype conversion and comparisons (cl/convert.cl): Cast, Equal / Less / Greater / LessOrEqual / GreaterOrEqual,
Not, Where. Integer and bool tensors stay on the device, so masks and index arithmetic around the float hot path do
not force copies to the host."""

from __future__ import annotations

from collections.abc import Sequence

from hetero.contract import SUPPORTED, NodeInfo, Support, Tensor, TensorInfo, dtypes, static_shape, unsupported
from hetero.contract.dtypes import DType

from .common import ClKernel, dtype_check
from .elementwise import _broadcast_strides

PROGRAM = "convert.cl"
# OpenCL C element type of each dtype the kernels take (bool is stored as one byte, 0 or 1).
CL_TYPE: dict[DType, str] = {dtypes.float32: "float", dtypes.float16: "half", dtypes.int32: "int",
                             dtypes.int64: "long", dtypes.uint8: "uchar", dtypes.int8: "char", dtypes.bool_: "bool"}
# Comparison codes: keep in sync with cl/convert.cl (C_*).
COMPARE = {"Equal": 0, "Less": 1, "Greater": 2, "LessOrEqual": 3, "GreaterOrEqual": 4}
_COMPARE_TYPES = {dtypes.float32: "float", dtypes.int32: "int", dtypes.int64: "long", dtypes.bool_: "uchar",
                  dtypes.uint8: "uchar"}
MAX_RANK = 8


def _rank_ok(node: NodeInfo) -> Support:
    if any(i is not None and i.rank is not None and i.rank > MAX_RANK for i in [*node.inputs, *node.outputs]):
        return unsupported(f"rank above {MAX_RANK}")
    return SUPPORTED


class ClCast(ClKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        src, dst = node.inputs[0], node.outputs[0]
        for info, what in ((src, "input"), (dst, "output")):
            if info is None or info.dtype not in CL_TYPE:
                return unsupported(f"Cast {what} dtype {None if info is None else info.dtype} (opencl: "
                                   f"{', '.join(str(d) for d in CL_TYPE)})")
        return SUPPORTED

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        src = CL_TYPE[node.inputs[0].dtype]
        dst = CL_TYPE[node.outputs[0].dtype]
        self.same = node.inputs[0].dtype == node.outputs[0].dtype
        self.kernel = None if self.same else self.k(PROGRAM, f"cast_{'uchar' if src == 'bool' else src}_{dst}")

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x, y = inputs[0], outputs[0]
        assert x is not None
        if y.size == 0:
            return
        if self.kernel is None:
            self.ctx.copy(x.buffer, y.buffer, 0, 0, y.dtype.nbytes(y.size))
            return
        self.launch(self.kernel, [y.size], None, x.buffer, y.buffer, y.size)


def _binary_meta(a: Sequence[int], b: Sequence[int], out: Sequence[int]) -> list[int]:
    return [*out, *_broadcast_strides(a, out), *_broadcast_strides(b, out)]


class ClCompare(ClKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        verdict = dtype_check(node, tuple(_COMPARE_TYPES), [0, 1])
        if verdict and node.inputs[0] is not None and node.inputs[1] is not None \
                and node.inputs[0].dtype != node.inputs[1].dtype:
            return unsupported(f"{node.op_type} of mixed dtypes")
        return _rank_ok(node) if verdict else verdict

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        self.op = COMPARE[node.op_type]
        self.kernel = self.k(PROGRAM, f"compare_{_COMPARE_TYPES[node.inputs[0].dtype]}")

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        out = static_shape(outputs[0])
        self.rank = len(out)
        self.meta_values = _binary_meta(static_shape(inputs[0]), static_shape(inputs[1]), out)

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        y = outputs[0]
        if y.size:
            self.launch(self.kernel, [y.size], None, inputs[0].buffer, inputs[1].buffer, y.buffer,
                        self.meta("nd", self.meta_values), y.size, self.rank, self.op)


class ClNot(ClKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        return dtype_check(node, (dtypes.bool_,))

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        y = outputs[0]
        if y.size:
            self.launch(self.k(PROGRAM, "logical_not"), [y.size], None, inputs[0].buffer, y.buffer, y.size)


class ClWhere(ClKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        cond = node.inputs[0]
        if cond is None or cond.dtype != dtypes.bool_:
            return unsupported(f"Where condition of dtype {None if cond is None else cond.dtype} (opencl: bool)")
        verdict = dtype_check(node, (dtypes.float32,), [1, 2])
        return _rank_ok(node) if verdict else verdict

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        out = static_shape(outputs[0])
        self.rank = len(out)
        self.meta_values = [*out, *(v for i in inputs for v in _broadcast_strides(i.shape, out))]

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        y = outputs[0]
        if y.size:
            c, a, b = (t.buffer for t in inputs)
            self.launch(self.k(PROGRAM, "where_float"), [y.size], None, c, a, b, y.buffer,
                        self.meta("nd", self.meta_values), y.size, self.rank)


KERNELS = {
    ("", "Cast"): ClCast,
    **{("", op): ClCompare for op in COMPARE},
    ("", "Not"): ClNot,
    ("", "Where"): ClWhere,
}
