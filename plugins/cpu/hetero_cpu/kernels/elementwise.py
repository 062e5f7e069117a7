"""Elementwise kernels: broadcasting binary arithmetic and the unary math/activation family, all native."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetero import dtypes
from hetero.backend import NodeInfo, Support, unsupported
from hetero.tensor import Tensor

from .. import _native
from .common import CpuKernel, dtype_check, float32_only

_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Max": "max", "Min": "min"}
# Integer paths exist natively for these (ONNX integer Div truncates toward zero, which the native kernel does).
_INT_OK = {"add", "sub", "mul", "div", "max", "min"}


class CpuBinary(CpuKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if len(node.inputs) != 2:
            return unsupported(f"{node.op_type} with {len(node.inputs)} inputs (the cpu kernel takes 2)")
        if _BINARY[node.op_type] in _INT_OK:
            return dtype_check(node, (dtypes.float32, dtypes.int32, dtypes.int64))
        return float32_only(node)

    def __init__(self, node: NodeInfo) -> None:
        super().__init__(node)
        self.op = _BINARY[node.op_type]

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        out = outputs[0].buffer
        if out.size == 0:
            return
        a = np.broadcast_to(inputs[0].numpy(), out.shape)  # type: ignore[union-attr]
        b = np.broadcast_to(inputs[1].numpy(), out.shape)  # type: ignore[union-attr]
        _native.binary(self.op, a, b, out)


# ONNX op -> (native op, attribute that feeds alpha, its default, attribute that feeds beta, its default)
_UNARY: dict[str, tuple[str, str | None, float, str | None, float]] = {
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
    "Mish": ("mish", None, 0.0, None, 0.0),
}


class CpuUnary(CpuKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if node.op_type == "Gelu" and node.attr("approximate", "none") not in ("none", "tanh"):
            return unsupported(f"Gelu approximate={node.attr('approximate')!r}")
        return float32_only(node)

    def __init__(self, node: NodeInfo) -> None:
        super().__init__(node)
        if node.op_type == "Gelu":
            self.op = "gelu_tanh" if self.attr("approximate", "none") == "tanh" else "gelu"
            self.alpha = self.beta = 0.0
        else:
            self.op, alpha_name, alpha, beta_name, beta = _UNARY[node.op_type]
            self.alpha = float(self.attr(alpha_name, alpha)) if alpha_name else alpha
            self.beta = float(self.attr(beta_name, beta)) if beta_name else beta

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        out = outputs[0].buffer
        if out.size:
            _native.unary(self.op, inputs[0].numpy(), out, self.alpha, self.beta)  # type: ignore[union-attr]


class CpuClip(CpuKernel):
    """Clip with bounds from attributes (opset < 11) or from optional inputs."""

    accepts = staticmethod(float32_only)

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        lo = _bound(inputs, 1, self.attr("min", -np.inf))
        hi = _bound(inputs, 2, self.attr("max", np.inf))
        out = outputs[0].buffer
        if out.size:
            _native.unary("clip", inputs[0].numpy(), out, lo, hi)  # type: ignore[union-attr]


def _bound(inputs: Sequence[Tensor | None], index: int, default: float) -> float:
    if index < len(inputs) and inputs[index] is not None:
        return float(inputs[index].numpy())  # type: ignore[union-attr]
    return float(default)


KERNELS = {
    **{("", op): CpuBinary for op in _BINARY},
    **{("", op): CpuUnary for op in [*_UNARY, "Gelu"]},
    ("", "Clip"): CpuClip,
}
