"""Reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare.

Axes are an attribute up to opset 12 (ReduceSum) or 17 (the others) and an optional input afterwards; no axes means
all axes, unless ``noop_with_empty_axes`` makes the op an identity.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np

from ..contract.registry import OpContext, op
from ..contract.tensor import TensorInfo
from . import lowp
from .shapes import UNKNOWN_VALUE, _Unknown, input_info, normalize_axis, unknown

# Opset from which each reduction takes its axes as an input.
_AXES_INPUT_SINCE = {"ReduceSum": 13}


def _axes(ctx: OpContext, rank: int) -> list[int] | Literal[_Unknown.VALUE] | None:
    """Normalized axes; None: identity (noop_with_empty_axes); UNKNOWN_VALUE: not known statically."""
    if ctx.opset >= _AXES_INPUT_SINCE.get(ctx.node.op_type, 18):
        if ctx.has_input(1):
            value = ctx.value(1)
            if value is None:
                return UNKNOWN_VALUE
            axes = [int(a) for a in np.asarray(value).reshape(-1)]
        else:
            axes = []
    else:
        axes = list(ctx.attr("axes", []))
    if not axes:
        return None if ctx.attr("noop_with_empty_axes", 0) else list(range(rank))
    return sorted({normalize_axis(ctx, a, rank) for a in axes})


def _reduce_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    keep = ctx.attr("keepdims", 1)
    if x.shape is None:
        return [unknown(x.dtype)]
    axes = _axes(ctx, len(x.shape))
    if axes is None:
        return [x]
    if axes is UNKNOWN_VALUE:
        return [unknown(x.dtype, len(x.shape) if keep else None)]
    if keep:
        return [TensorInfo(x.dtype, tuple(1 if i in axes else d for i, d in enumerate(x.shape)))]
    return [TensorInfo(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in axes))]


def _wide(x: np.ndarray) -> np.ndarray:
    """Accumulate floats in float64 (the result is cast back to the input type)."""
    return x.astype(np.float64) if lowp.is_float(x.dtype) else x


def _extreme(x: np.ndarray, largest: bool) -> int | float:
    """The identity of max (min) reductions over an empty set."""
    if lowp.is_float(x.dtype):
        return -np.inf if largest else np.inf
    if x.dtype.kind == "b":
        return not largest
    lo, hi = lowp.int_range(x.dtype)
    return lo if largest else hi


def _max(x: np.ndarray, axis: tuple[int, ...], keep: bool) -> np.ndarray:
    return np.max(x, axis=axis, keepdims=keep, initial=_extreme(x, True))


def _min(x: np.ndarray, axis: tuple[int, ...], keep: bool) -> np.ndarray:
    return np.min(x, axis=axis, keepdims=keep, initial=_extreme(x, False))


def _log_sum_exp(x: np.ndarray, axis: tuple[int, ...], keep: bool) -> np.ndarray:
    x = _wide(x)
    if x.size == 0:
        return np.log(np.sum(np.exp(x), axis=axis, keepdims=keep))
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keep else np.squeeze(out, axis=axis)


_REDUCERS: dict[str, Callable[[np.ndarray, tuple[int, ...], bool], np.ndarray]] = {
    "ReduceSum": lambda x, a, k: np.sum(_wide(x), axis=a, keepdims=k),
    "ReduceMean": lambda x, a, k: np.mean(_wide(x), axis=a, keepdims=k),
    "ReduceMax": _max,
    "ReduceMin": _min,
    "ReduceProd": lambda x, a, k: np.prod(_wide(x), axis=a, keepdims=k),
    "ReduceL1": lambda x, a, k: np.sum(np.abs(_wide(x)), axis=a, keepdims=k),
    "ReduceL2": lambda x, a, k: np.sqrt(np.sum(np.square(_wide(x)), axis=a, keepdims=k)),
    "ReduceLogSum": lambda x, a, k: np.log(np.sum(_wide(x), axis=a, keepdims=k)),
    "ReduceLogSumExp": _log_sum_exp,
    "ReduceSumSquare": lambda x, a, k: np.sum(np.square(_wide(x)), axis=a, keepdims=k),
}


def _register(name: str, fn: Callable[[np.ndarray, tuple[int, ...], bool], np.ndarray]) -> None:
    def reference(ctx: OpContext) -> list[np.ndarray]:
        x = ctx.array(0)
        axes = _axes(ctx, x.ndim)
        if axes is None:
            return [x]
        if axes is UNKNOWN_VALUE:
            raise ctx.fail("input axes has no value")
        with np.errstate(divide="ignore", invalid="ignore"):
            out = fn(x, tuple(axes), bool(ctx.attr("keepdims", 1)))
        return [np.asarray(out).astype(x.dtype)]

    reference.__doc__ = f"{name} over the given axes (all by default), keeping them as size 1 if keepdims."
    op(name, infer=_reduce_infer, value_inputs=(1,))(reference)


for _name, _fn in _REDUCERS.items():
    _register(_name, _fn)
