"""Training losses that appear in exported graphs: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss."""

from __future__ import annotations

import numpy as np

from ..contract.registry import OpContext, op
from ..contract.tensor import TensorInfo
from .nn import _softmax
from .shapes import input_info, shape_of


def _loss_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    shape = shape_of(ctx, 1) if ctx.attr("reduction", "mean") == "none" else ()
    return [TensorInfo(x.dtype, shape), TensorInfo(x.dtype, x.shape)]


def _nll(ctx: OpContext, logp: np.ndarray, target: np.ndarray, weight: np.ndarray | None) -> np.ndarray:
    """loss[n, d...] = -logp[n, target, d...] * weight[target]; ignore_index entries weigh 0."""
    ignore = ctx.attr("ignore_index", None)
    target = target.astype(np.int64)
    valid = np.ones(target.shape, dtype=bool) if ignore is None else target != ignore
    safe = np.where(valid, target, 0)
    picked = np.take_along_axis(logp, np.expand_dims(safe, 1), axis=1)[:, 0]
    w = (np.ones(logp.shape[1]) if weight is None else weight.astype(np.float64))[safe] * valid
    loss = -picked * w
    reduction = ctx.attr("reduction", "mean")
    if reduction == "none":
        return loss
    if reduction == "sum":
        return np.asarray(loss.sum())
    if reduction == "mean":
        total = w.sum()
        return np.asarray(loss.sum() / total if total else 0.0)
    raise ctx.fail(f"unknown reduction {reduction!r}")


@op("NegativeLogLikelihoodLoss", infer=_loss_infer)
def negative_log_likelihood_loss(ctx: OpContext) -> list[np.ndarray]:
    """Negative log-likelihood of the target classes (input holds log-probabilities on axis 1)."""
    x, target = ctx.array(0), ctx.array(1)
    weight = ctx.array(2) if ctx.has_input(2) else None
    return [_nll(ctx, x.astype(np.float64), target, weight).astype(x.dtype)]


@op("SoftmaxCrossEntropyLoss", infer=_loss_infer)
def softmax_cross_entropy_loss(ctx: OpContext) -> list[np.ndarray]:
    """NLL of log_softmax(scores, axis=1); the second output is that log-probability tensor."""
    x, target = ctx.array(0), ctx.array(1)
    weight = ctx.array(2) if ctx.has_input(2) else None
    logp = _softmax(x, (1,), True)
    return [_nll(ctx, logp, target, weight).astype(x.dtype), logp.astype(x.dtype)]
