"""Elementwise kernels: unary math and activations, broadcasting binary arithmetic, SwiGLU (cl/elementwise.cl)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetero.contract import NodeInfo, Support, Tensor, TensorInfo, dtypes, static_shape, unsupported
from hetero.contract.opforms import UNARY_FORMS, unary_params

from .common import UNARY, ClKernel, contiguous_strides, dtype_check, float32_only

PROGRAM = "elementwise.cl"
# Binary codes: keep in sync with cl/elementwise.cl (B_*).
BINARY = {"Add": 0, "Sub": 1, "Mul": 2, "Div": 3, "Pow": 4, "Max": 5, "Min": 6, "PRelu": 7}

# Every ONNX unary op of hetero.contract.opforms has an OpenCL kernel (cl/common.cl U_* codes).
_UNARY_OPS = tuple(UNARY_FORMS)


def run_unary(kernel: ClKernel, x, y, n: int, op: int, a: float, b: float) -> None:
    if n % 4 == 0:
        kernel.launch(kernel.k(PROGRAM, "unary4"), [n // 4], None, x, y, n // 4, op, a, b)
    else:
        kernel.launch(kernel.k(PROGRAM, "unary1"), [n], None, x, y, n, op, a, b)


class ClUnary(ClKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if node.op_type == "Gelu" and node.attr("approximate", "none") not in ("none", "tanh"):
            return unsupported(f"Gelu approximate={node.attr('approximate')!r}")
        return float32_only(node)

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        name, self.alpha, self.beta = unary_params(node.op_type, self.node.attrs)
        self.op = UNARY[name]

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        out = outputs[0]
        run_unary(self, inputs[0].buffer, out.buffer, out.size, self.op, self.alpha, self.beta)


class ClClip(ClKernel):
    """Clip with bounds from attributes (opset < 11) or from optional inputs (read on the host: tiny constants)."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        return float32_only(node)

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        lo, hi = float(self.attr("min", -np.inf)), float(self.attr("max", np.inf))
        if len(inputs) > 1 and inputs[1] is not None:
            lo = float(self.host(inputs[1]).reshape(-1)[0])
        if len(inputs) > 2 and inputs[2] is not None:
            hi = float(self.host(inputs[2]).reshape(-1)[0])
        out = outputs[0]
        run_unary(self, inputs[0].buffer, out.buffer, out.size, UNARY["clip"], lo, hi)


# Integer tensors (shape arithmetic, index math) get these ops, broadcasting, one element per work-item.
_INT_TYPES = {dtypes.int32: "int", dtypes.int64: "long"}
_INT_OPS = ("Add", "Sub", "Mul", "Div", "Max", "Min")


class ClBinary(ClKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if len(node.inputs) != 2:
            return unsupported(f"{node.op_type} with {len(node.inputs)} inputs (the opencl kernel takes 2)")
        if any(i is not None and i.rank is not None and i.rank > 8 for i in node.inputs):
            return unsupported("rank above 8")
        a = node.inputs[0]
        if a is not None and a.dtype in _INT_TYPES and node.op_type in _INT_OPS:
            return dtype_check(node, (a.dtype,))
        return float32_only(node)

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        self.op = BINARY[node.op_type]
        self.mode = "nd"
        self.meta_values: list[int] = []
        self.int_type = _INT_TYPES.get(node.inputs[0].dtype) if node.inputs[0] is not None else None

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        a, b = static_shape(inputs[0]), static_shape(inputs[1])
        out = static_shape(outputs[0])
        n = int(np.prod(out, dtype=np.int64))
        if self.int_type is None and a == out and (b == out or int(np.prod(b, dtype=np.int64)) == 1) \
                and n % 4 == 0:
            self.mode = "same" if b == out else "scalar"
            return
        self.mode = "nd"
        rank = len(out)
        self.meta_values = [*out, *_broadcast_strides(a, out), *_broadcast_strides(b, out)]
        self.rank = rank

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        a, b, y = inputs[0], inputs[1], outputs[0]
        n = y.size
        if self.mode != "nd":
            self.launch(self.k(PROGRAM, "binary4"), [n // 4], None, a.buffer, b.buffer, y.buffer, n // 4,
                        self.op, int(self.mode == "scalar"))
            return
        if n == 0:
            return
        if self.int_type is not None and n <= HOST_ELEMENTS:
            host = self.host_copies(inputs)
            if host is not None:  # shape arithmetic on values the host already has: no launch, no later download
                self.put_host_result(y, _int_binary(self.info.op_type, *host))
                return
        meta = self.meta("nd", self.meta_values)
        name = "binary_nd" if self.int_type is None else f"binary_nd_{self.int_type}"
        self.launch(self.k(PROGRAM, name), [n], None, a.buffer, b.buffer, y.buffer, meta, n,
                    self.rank, self.op)


HOST_ELEMENTS = 512  # integer results up to this size are computed on the host when their inputs are there


def _int_binary(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The integer kernel's semantics in numpy: Div truncates toward zero and gives 0 for a zero divisor."""
    if op == "Div":
        safe = np.where(b == 0, 1, b)
        q = np.abs(a) // np.abs(safe) * np.sign(a) * np.sign(safe)
        return np.where(b == 0, 0, q).astype(a.dtype)
    fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Max": np.maximum, "Min": np.minimum}[op]
    return fn(a, b).astype(a.dtype)


def _broadcast_strides(shape, out) -> list[int]:
    """Element strides of ``shape`` read at each index of the broadcast ``out`` shape (0 on broadcast axes)."""
    shape = (1,) * (len(out) - len(shape)) + tuple(shape)
    strides = contiguous_strides(shape)
    return [0 if d == 1 and o != 1 else s for d, o, s in zip(shape, out, strides, strict=True)]


class ClSwiGLU(ClKernel):
    accepts = staticmethod(float32_only)

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        y = outputs[0]
        n = y.size
        g, u = inputs[0].buffer, inputs[1].buffer
        if n % 4 == 0:
            self.launch(self.k(PROGRAM, "swiglu4"), [n // 4], None, g, u, y.buffer, n // 4)
        else:
            self.launch(self.k(PROGRAM, "swiglu1"), [n], None, g, u, y.buffer, n)


KERNELS = {
    **{("", op): ClBinary for op in BINARY},
    **{("", op): ClUnary for op in [*_UNARY_OPS, "Gelu"]},
    ("", "Clip"): ClClip,
    ("hetero", "SwiGLU"): ClSwiGLU,
}
