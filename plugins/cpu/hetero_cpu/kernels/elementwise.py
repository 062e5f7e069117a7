"""Elementwise kernels: broadcasting binary arithmetic and the unary math/activation family, all native."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np

from hetero.contract import Backend, NodeInfo, Support, Tensor, dtypes, unsupported
from hetero.contract.opforms import UNARY_FORMS, unary_params

from .. import _native
from .common import Call, CallKernel, Calls, CpuKernel, bindable, dtype_check, float32_only, noop

_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Max": "max", "Min": "min"}
# Integer paths exist natively for these (ONNX integer Div truncates toward zero, which the native kernel does).
_INT_OK = {"add", "sub", "mul", "div", "max", "min"}


class CpuBinary(CallKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if len(node.inputs) != 2:
            return unsupported(f"{node.op_type} with {len(node.inputs)} inputs (the cpu kernel takes 2)")
        if _BINARY[node.op_type] in _INT_OK:
            return dtype_check(node, (dtypes.float32, dtypes.int32, dtypes.int64))
        return float32_only(node)

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        self.op = self.native_op(node)

    @staticmethod
    def native_op(node: NodeInfo) -> str:
        return _BINARY[node.op_type]

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        a, b = inputs[0].numpy(), inputs[1].numpy()
        # broadcast_to costs ~15 us a call: on the decode path (residual adds) both inputs already have out's shape;
        # a replay makes these views once
        if a.shape != out.shape:
            a = np.broadcast_to(a, out.shape)
        if b.shape != out.shape:
            b = np.broadcast_to(b, out.shape)
        return functools.partial(_native.binary, self.op, a, b, out)


class CpuGeluMul(CpuBinary):
    """hetero.GeluMul: Gelu(a) * b in one native pass (the same bits as the two ops' passes)."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if node.attr("approximate", "none") not in ("none", "tanh"):
            return unsupported(f"GeluMul approximate={node.attr('approximate')!r}")
        return float32_only(node)

    @staticmethod
    def native_op(node: NodeInfo) -> str:
        return "gelu_tanh_mul" if node.attr("approximate", "none") == "tanh" else "gelu_mul"


class CpuAddRelu(CpuBinary):
    """hetero.AddRelu: Relu(a + b) in one native pass (the same bits as the two ops' passes)."""

    accepts = staticmethod(float32_only)

    @staticmethod
    def native_op(node: NodeInfo) -> str:
        return "add_relu"


# The ONNX unary ops whose kernel op the native library implements (their parameters: hetero.contract.opforms).
_UNARY = tuple(op for op, form in UNARY_FORMS.items() if form[0] in set(_native.unary_ops()))


class CpuUnary(CpuKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if node.op_type == "Gelu" and node.attr("approximate", "none") not in ("none", "tanh"):
            return unsupported(f"Gelu approximate={node.attr('approximate')!r}")
        return float32_only(node)

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        self.op, self.alpha, self.beta = unary_params(node.op_type, self.node.attrs)

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        out = outputs[0].buffer
        if out.size:
            _native.unary(self.op, inputs[0].numpy(), out, self.alpha, self.beta)

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Callable[[], None] | None:
        """The replay's bound call (``CpuKernel.bind``)."""
        out, x = outputs[0].buffer, inputs[0].numpy()
        if out.size == 0:
            return noop
        if not bindable(x, out):
            return None
        return functools.partial(_native.unary, self.op, x, out, self.alpha, self.beta)


class CpuClip(CallKernel):
    """Clip with bounds from attributes (opset < 11) or from optional inputs."""

    accepts = staticmethod(float32_only)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        lo = _bound(inputs, 1, self.attr("min", -np.inf))
        hi = _bound(inputs, 2, self.attr("max", np.inf))
        out = outputs[0].buffer
        return functools.partial(_native.unary, "clip", inputs[0].numpy(), out, lo, hi) if out.size else noop

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls | None:
        """Constant bounds: one native clip. A bound computed at run time (openWakeWord's melspectrogram clips at its
        maximum minus 80 dB) is read natively when the call is made: Max with the lower bound's buffer broadcast, then
        Min with the upper's (NaN passes through both, and a lower bound above the upper gives the upper, as Clip
        does)."""
        bounds = [(i, op) for i, op in ((1, "max"), (2, "min")) if i < len(inputs) and inputs[i] is not None]
        if all(i in self.info.constants for i, _ in bounds):
            return super().bind(inputs, outputs)
        out, x = outputs[0].buffer, inputs[0].numpy()
        values = [inputs[i].numpy() for i, _ in bounds]
        if out.size == 0 or any(v.size != 1 for v in values) or not bindable(x, out, *values):
            return None
        calls: list[Call] = []
        for (_, op), value in zip(bounds, values, strict=True):
            calls.append(functools.partial(_native.binary, op, x, np.broadcast_to(value.reshape(()), out.shape), out))
            x = out
        return calls


def _bound(inputs: Sequence[Tensor | None], index: int, default: float) -> float:
    if index < len(inputs) and inputs[index] is not None:
        return float(inputs[index].numpy())
    return float(default)


KERNELS = {
    **{("", op): CpuBinary for op in _BINARY},
    **{("", op): CpuUnary for op in [*_UNARY, "Gelu"]},
    ("", "Clip"): CpuClip,
    ("hetero", "GeluMul"): CpuGeluMul,
    ("hetero", "AddRelu"): CpuAddRelu,
}
