"""MatMul and Gemm on the native packed GEMM; constant weights are packed once, when the kernel is made."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetero.contract import Backend, NodeInfo, Support, Tensor, TensorInfo, unsupported

from .. import _native
from .common import CpuKernel, float32_only, fused_activation, fused_activation_known


class CpuMatMul(CpuKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        return float32_only(node)

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        weight = node.constants.get(1)
        # A constant 2-D right operand is a weight matrix: pack it once in the micro-kernel's layout.
        self.packed = _native.pack_b(np.ascontiguousarray(weight, dtype=np.float32)) if (
            weight is not None and weight.ndim == 2
        ) else None

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        a, b = inputs[0].numpy(), inputs[1].numpy()
        out = outputs[0].buffer
        if _empty(a, out):
            return
        if a.ndim == 1:
            a = a[None, :]
        if self.packed is not None:
            k = a.shape[-1]
            _native.gemm_packed(np.ascontiguousarray(a).reshape(-1, k), self.packed, out.reshape(-1, self.packed.n))
            return
        squeeze_n = b.ndim == 1
        if squeeze_n:
            b = b[:, None]
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        count = int(np.prod(batch, dtype=np.int64))
        out3 = out.reshape(count, m, n)
        _native.matmul(_batched(a, batch, count, m, k), _batched(b, batch, count, k, n), out3)


def _empty(a: np.ndarray, out: np.ndarray) -> bool:
    """Zero-sized products: nothing to compute (an empty K gives zeros)."""
    if out.size == 0:
        return True
    if a.size == 0:
        out.fill(0)
        return True
    return False


def _batched(x: np.ndarray, batch: tuple[int, ...], count: int, rows: int, cols: int) -> np.ndarray:
    """(..., rows, cols) as (1 or count, rows, cols), materialising only mixed broadcasts."""
    if int(np.prod(x.shape[:-2], dtype=np.int64)) == 1:
        return np.ascontiguousarray(x).reshape(1, rows, cols)
    if x.shape[:-2] == batch:
        return np.ascontiguousarray(x).reshape(count, rows, cols)
    return np.ascontiguousarray(np.broadcast_to(x, (*batch, rows, cols))).reshape(count, rows, cols)


class CpuFusedMatMul(CpuMatMul):
    """MatMul by a packed constant weight with the bias in the GEMM epilogue, then the activation in place."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if 1 not in node.constants:
            return unsupported("FusedMatMul with weights computed at run time")
        verdict = float32_only(node)
        return fused_activation_known(node) if verdict else verdict

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        bias = node.constants.get(2)
        self.bias = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
        self.activation = fused_activation(self.node.attrs)

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        a = inputs[0].numpy()
        out = outputs[0].buffer
        if out.size == 0:
            return
        bias = self.bias
        if bias is None and len(inputs) > 2 and inputs[2] is not None:
            bias = np.ascontiguousarray(inputs[2].numpy(), dtype=np.float32)
        n = self.packed.n
        flat = out.reshape(-1, n)
        if a.size == 0:
            flat[...] = 0 if bias is None else bias
        else:
            _native.gemm_packed(np.ascontiguousarray(a).reshape(-1, a.shape[-1]), self.packed, flat, bias=bias)
        act, alpha, beta = self.activation
        if act != "none":
            _native.unary(act, flat, flat, alpha, beta)


class CpuGemm(CpuKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        return float32_only(node)

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        self.trans_a = bool(self.attr("transA", 0))
        self.trans_b = bool(self.attr("transB", 0))
        self.alpha = float(self.attr("alpha", 1.0))
        self.beta = float(self.attr("beta", 1.0))
        weight = node.constants.get(1)
        self.packed = (
            _native.pack_b(np.ascontiguousarray(weight, dtype=np.float32), trans_b=self.trans_b)
            if weight is not None
            else None
        )
        bias = node.constants.get(2)
        self.bias = None if bias is None else np.ascontiguousarray(bias * self.beta, dtype=np.float32)

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        pass

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        a = inputs[0].numpy()
        out = outputs[0].buffer
        if _empty(a, out):
            if out.size and len(inputs) > 2 and inputs[2] is not None:
                out[...] = self.beta * inputs[2].numpy()
            return
        bias = self.bias
        if bias is None and len(inputs) > 2 and inputs[2] is not None:
            c = inputs[2].numpy()
            bias = np.ascontiguousarray(c if self.beta == 1.0 else c * self.beta, dtype=np.float32)
        if self.packed is not None:
            a_op = np.ascontiguousarray(a.T) if self.trans_a else a
            _native.gemm_packed(a_op, self.packed, out, alpha=self.alpha, beta=0.0, bias=bias)
        else:
            b = inputs[1].numpy()
            _native.gemm(a, b, out, trans_a=self.trans_a, trans_b=self.trans_b, alpha=self.alpha, beta=0.0,
                         bias=bias)
