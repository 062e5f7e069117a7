"""Matrix products: MatMul (numpy semantics, batched and broadcast) and Gemm."""

from __future__ import annotations

import numpy as np

from ..contract.registry import OpContext, op
from ..contract.tensor import Dim, TensorInfo
from .shapes import broadcast_shapes, input_info


def _matmul_infer(ctx: OpContext) -> list[TensorInfo]:
    a, b = input_info(ctx, 0), input_info(ctx, 1)
    if a.shape is None or b.shape is None:
        return [TensorInfo(a.dtype, None)]
    if len(a.shape) == 0 or len(b.shape) == 0:
        raise ctx.fail("MatMul inputs must have rank >= 1")
    sa = (1, *a.shape) if len(a.shape) == 1 else a.shape
    sb = (*b.shape, 1) if len(b.shape) == 1 else b.shape
    k_a, k_b = sa[-1], sb[-2]
    if k_a is not None and k_b is not None and k_a != k_b:
        raise ctx.fail(f"inner dimensions differ: {list(a.shape)} @ {list(b.shape)}")
    batch = broadcast_shapes(ctx, [sa[:-2], sb[:-2]])
    assert batch is not None
    out: list[Dim] = [*batch, sa[-2], sb[-1]]
    if len(a.shape) == 1:
        out.pop(-2)
    if len(b.shape) == 1:
        out.pop(-1)
    return [TensorInfo(a.dtype, tuple(out))]


@op("MatMul", infer=_matmul_infer)
def matmul(ctx: OpContext) -> list[np.ndarray]:
    """Matrix product with numpy.matmul semantics (batch dims broadcast)."""
    a, b = ctx.array(0), ctx.array(1)
    return [np.matmul(a, b).astype(a.dtype, copy=False)]


def _gemm_infer(ctx: OpContext) -> list[TensorInfo]:
    a, b = input_info(ctx, 0), input_info(ctx, 1)
    if a.shape is None or b.shape is None:
        return [TensorInfo(a.dtype, (None, None))]
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise ctx.fail(f"Gemm takes 2-D inputs, got {list(a.shape)} and {list(b.shape)}")
    m, k_a = a.shape[::-1] if ctx.attr("transA", 0) else a.shape
    k_b, n = b.shape[::-1] if ctx.attr("transB", 0) else b.shape
    if k_a is not None and k_b is not None and k_a != k_b:
        raise ctx.fail(f"inner dimensions differ: {k_a} vs {k_b}")
    if ctx.has_input(2):
        c = input_info(ctx, 2)
        broadcast_shapes(ctx, [(m, n), c.shape])
    return [TensorInfo(a.dtype, (m, n))]


@op("Gemm", infer=_gemm_infer)
def gemm(ctx: OpContext) -> list[np.ndarray]:
    """Y = alpha * op(A) @ op(B) + beta * C."""
    a, b = ctx.array(0), ctx.array(1)
    if ctx.attr("transA", 0):
        a = a.T
    if ctx.attr("transB", 0):
        b = b.T
    y = ctx.attr("alpha", 1.0) * (a @ b)
    if ctx.has_input(2):
        y = y + ctx.attr("beta", 1.0) * ctx.array(2)
    return [np.asarray(y).astype(ctx.array(0).dtype, copy=False)]
