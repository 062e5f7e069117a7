"""Elementwise ops on Metal (msl/elementwise.metal): unary math and activations, broadcasting binary arithmetic,
SwiGLU. One element per thread, threadgroups of 256."""

from __future__ import annotations

import numpy as np

from hetero.contract import NodeInfo, Support, unsupported
from hetero.contract.opforms import UNARY_FORMS, unary_params

from ..plan import ArgumentBuffer, Dispatch, dispatch, groups_for
from .common import MetalKernel, float32_only

THREADS = 256
# Unary op codes: the cases of unary_op() in msl/elementwise.metal.
UNARY = {
    "identity": 0, "relu": 1, "leaky_relu": 2, "elu": 3, "selu": 4, "celu": 5, "sigmoid": 6, "hard_sigmoid": 7,
    "hard_swish": 8, "tanh": 9, "softplus": 10, "softsign": 11, "exp": 12, "log": 13, "sqrt": 14, "neg": 15,
    "abs": 16, "reciprocal": 17, "floor": 19, "ceil": 20, "round": 21, "sin": 22, "cos": 23, "mish": 24,
    "clip": 25, "gelu_tanh": 27, "silu": 28, "sign": 29, "thresholded_relu": 30, "tan": 31,
    "leaky_relu_min": 32,
}
BINARY = {"Add": 0, "Sub": 1, "Mul": 2, "Div": 3, "Pow": 4, "Max": 5, "Min": 6, "PRelu": 7}
MAX_RANK = 8


def unary_dispatch(x: np.ndarray, y: np.ndarray, op: str, alpha: float = 0.0, beta: float = 0.0) -> Dispatch:
    n = y.size
    return dispatch("unary_f32", {"x": x, "y": y, "p": {"n": n, "op": UNARY[op], "alpha": alpha, "beta": beta}},
                    (groups_for(n, THREADS),), (THREADS,))


class MetalUnary(MetalKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        name = unary_params(node.op_type, node.node.attrs)[0]
        if name not in UNARY:
            return unsupported(f"no metal kernel for {node.op_type} ({name})")
        return float32_only(node)

    def plan(self, inputs, outputs):
        name, alpha, beta = unary_params(self.node.op_type, self.node.attrs)
        return [unary_dispatch(inputs[0], outputs[0], name, alpha, beta)] if outputs[0].size else []


class MetalClip(MetalKernel):
    """The bounds (inputs since opset 11) are read on the host and written to the kernel's argument buffer at each
    run, so a bound plan sees bounds that change between runs."""

    accepts = staticmethod(float32_only)
    host_inputs = (1, 2)

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        self.args = ArgumentBuffer("unary_f32", "p")

    def update(self, inputs) -> bool:
        lo, hi = float(self.attr("min", -np.inf)), float(self.attr("max", np.inf))
        if len(inputs) > 1 and inputs[1] is not None:
            lo = float(inputs[1].reshape(-1)[0])
        if len(inputs) > 2 and inputs[2] is not None:
            hi = float(inputs[2].reshape(-1)[0])
        self.args.write({"n": inputs[0].size, "op": UNARY["clip"], "alpha": lo, "beta": hi})
        return True

    def plan(self, inputs, outputs):
        self.update(inputs)
        n = outputs[0].size
        return [dispatch("unary_f32", {"x": inputs[0], "y": outputs[0], "p": self.args},
                         (groups_for(n, THREADS),), (THREADS,))] if n else []


def broadcast_strides(shape: tuple[int, ...], out: tuple[int, ...]) -> list[int]:
    """Element strides of an input of ``shape`` over the output dims (0 where it broadcasts)."""
    padded = (1,) * (len(out) - len(shape)) + tuple(shape)
    strides, step = [0] * len(out), 1
    for d in range(len(out) - 1, -1, -1):
        strides[d] = 0 if padded[d] == 1 else step
        step *= padded[d]
    return strides


class MetalBinary(MetalKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if len(node.inputs) != 2:
            return unsupported(f"{node.op_type} with {len(node.inputs)} inputs (the metal kernel takes 2)")
        if any(i is not None and i.rank is not None and i.rank > MAX_RANK for i in node.inputs):
            return unsupported(f"rank above {MAX_RANK}")
        return float32_only(node)

    def plan(self, inputs, outputs):
        a, b, y = inputs[0], inputs[1], outputs[0]
        if y.size == 0:
            return []
        out = tuple(y.shape) or (1,)
        shape = [*out, *broadcast_strides(a.shape, out), *broadcast_strides(b.shape, out)]
        meta = np.asarray(shape, dtype=np.uint32)
        return [dispatch("binary_f32", {
            "a": a, "b": b, "y": y, "shape": meta,
            "p": {"n": y.size, "op": BINARY[self.node.op_type], "rank": len(out)},
        }, (groups_for(y.size, THREADS),), (THREADS,))]


class MetalSwiGLU(MetalKernel):
    accepts = staticmethod(float32_only)

    def plan(self, inputs, outputs):
        y = outputs[0]
        return [dispatch("swiglu_f32", {
            "gate": inputs[0], "up": inputs[1], "y": y, "p": {"n": y.size, "op": 0, "alpha": 0.0, "beta": 0.0},
        }, (groups_for(y.size, THREADS),), (THREADS,))] if y.size else []


KERNELS = {
    **{("", op): MetalUnary for op in UNARY_FORMS},
    ("", "Gelu"): MetalUnary,
    ("", "Clip"): MetalClip,
    **{("", op): MetalBinary for op in BINARY},
    ("hetero", "SwiGLU"): MetalSwiGLU,
}
