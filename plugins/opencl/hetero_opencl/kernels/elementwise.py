"""Elementwise kernels: unary math and activations, broadcasting binary arithmetic, SwiGLU (cl/elementwise.cl)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetero.backend import NodeInfo, Support, unsupported
from hetero.tensor import Tensor, TensorInfo

from .common import UNARY, ClKernel, contiguous_strides, float32_only

PROGRAM = "elementwise.cl"
# Binary codes: keep in sync with cl/elementwise.cl (B_*).
BINARY = {"Add": 0, "Sub": 1, "Mul": 2, "Div": 3, "Pow": 4, "Max": 5, "Min": 6, "PRelu": 7}

# ONNX op -> (code, attribute that feeds alpha, its default, attribute that feeds beta, its default)
_UNARY_OPS: dict[str, tuple[str, str | None, float, str | None, float]] = {
    "Relu": ("relu", None, 0.0, None, 0.0),
    "LeakyRelu": ("leaky_relu", "alpha", 0.01, None, 0.0),
    "Elu": ("elu", "alpha", 1.0, None, 0.0),
    "Selu": ("selu", "alpha", 1.6732632423543772, "gamma", 1.0507009873554805),
    "Celu": ("celu", "alpha", 1.0, None, 0.0),
    "Sigmoid": ("sigmoid", None, 0.0, None, 0.0),
    "HardSigmoid": ("hard_sigmoid", "alpha", 0.2, "beta", 0.5),
    "HardSwish": ("hard_swish", None, 0.0, None, 0.0),
    "Tanh": ("tanh", None, 0.0, None, 0.0),
    "Softplus": ("softplus", None, 0.0, None, 0.0),
    "Softsign": ("softsign", None, 0.0, None, 0.0),
    "Exp": ("exp", None, 0.0, None, 0.0),
    "Log": ("log", None, 0.0, None, 0.0),
    "Sqrt": ("sqrt", None, 0.0, None, 0.0),
    "Neg": ("neg", None, 0.0, None, 0.0),
    "Abs": ("abs", None, 0.0, None, 0.0),
    "Reciprocal": ("reciprocal", None, 0.0, None, 0.0),
    "Erf": ("erf", None, 0.0, None, 0.0),
    "Floor": ("floor", None, 0.0, None, 0.0),
    "Ceil": ("ceil", None, 0.0, None, 0.0),
    "Round": ("round", None, 0.0, None, 0.0),
    "Sin": ("sin", None, 0.0, None, 0.0),
    "Cos": ("cos", None, 0.0, None, 0.0),
    "Tan": ("tan", None, 0.0, None, 0.0),
    "Mish": ("mish", None, 0.0, None, 0.0),
    "Sign": ("sign", None, 0.0, None, 0.0),
    "ThresholdedRelu": ("thresholded_relu", "alpha", 1.0, None, 0.0),
}


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
        if node.op_type == "Gelu":
            self.op = UNARY["gelu_tanh" if self.attr("approximate", "none") == "tanh" else "gelu"]
            self.alpha = self.beta = 0.0
        else:
            name, alpha_name, alpha, beta_name, beta = _UNARY_OPS[node.op_type]
            self.op = UNARY[name]
            self.alpha = float(self.attr(alpha_name, alpha)) if alpha_name else alpha
            self.beta = float(self.attr(beta_name, beta)) if beta_name else beta

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        out = outputs[0]
        run_unary(self, inputs[0].buffer, out.buffer, out.size, self.op, self.alpha, self.beta)  # type: ignore[union-attr]


class ClClip(ClKernel):
    """Clip with bounds from attributes (opset < 11) or from optional inputs (read on the host: tiny constants)."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        return float32_only(node)

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        lo, hi = float(self.attr("min", -np.inf)), float(self.attr("max", np.inf))
        if len(inputs) > 1 and inputs[1] is not None:
            lo = float(self.host(inputs[1]).reshape(-1)[0])  # type: ignore[union-attr]
        if len(inputs) > 2 and inputs[2] is not None:
            hi = float(self.host(inputs[2]).reshape(-1)[0])  # type: ignore[union-attr]
        out = outputs[0]
        run_unary(self, inputs[0].buffer, out.buffer, out.size, UNARY["clip"], lo, hi)  # type: ignore[union-attr]


class ClBinary(ClKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if len(node.inputs) != 2:
            return unsupported(f"{node.op_type} with {len(node.inputs)} inputs (the opencl kernel takes 2)")
        if any(i is not None and i.rank is not None and i.rank > 8 for i in node.inputs):
            return unsupported("rank above 8")
        return float32_only(node)

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        self.op = BINARY[node.op_type]
        self.mode = "nd"
        self.meta_values: list[int] = []

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        a, b = inputs[0].shape, inputs[1].shape  # type: ignore[union-attr]
        out = outputs[0].shape
        n = int(np.prod(out, dtype=np.int64))  # type: ignore[arg-type]
        if a == out and (b == out or int(np.prod(b, dtype=np.int64)) == 1) and n % 4 == 0:  # type: ignore[arg-type]
            self.mode = "same" if b == out else "scalar"
            return
        self.mode = "nd"
        rank = len(out)  # type: ignore[arg-type]
        self.meta_values = [*out, *_broadcast_strides(a, out), *_broadcast_strides(b, out)]  # type: ignore[arg-type]
        self.rank = rank

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        a, b, y = inputs[0], inputs[1], outputs[0]
        n = y.size
        if self.mode != "nd":
            self.launch(self.k(PROGRAM, "binary4"), [n // 4], None, a.buffer, b.buffer, y.buffer, n // 4,  # type: ignore[union-attr]
                        self.op, int(self.mode == "scalar"))
            return
        meta = self.meta("nd", self.meta_values)
        self.launch(self.k(PROGRAM, "binary_nd"), [n], None, a.buffer, b.buffer, y.buffer, meta, n,  # type: ignore[union-attr]
                    self.rank, self.op)


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
        g, u = inputs[0].buffer, inputs[1].buffer  # type: ignore[union-attr]
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
