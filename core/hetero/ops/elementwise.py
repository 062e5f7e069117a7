"""Elementwise ops: unary math and activations, broadcasting binary arithmetic, comparisons and logic."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..contract import dtypes
from ..contract.registry import OpContext, op
from ..contract.tensor import TensorInfo
from .shapes import broadcast_infer, broadcast_shapes, input_info, same_as_input, with_dtype


def _unary(name: str, fn: Callable[[np.ndarray, OpContext], np.ndarray]) -> None:
    def reference(ctx: OpContext) -> list[np.ndarray]:
        x = ctx.array(0)
        return [np.asarray(fn(x, ctx)).astype(x.dtype, copy=False)]

    reference.__doc__ = f"{name}, elementwise."
    op(name, infer=same_as_input(0))(reference)


def _erf(x: np.ndarray) -> np.ndarray:
    try:
        from scipy.special import erf  # exact, when scipy is around

        return erf(x)
    except ImportError:
        return np.vectorize(math.erf, otypes=[np.float64])(x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return np.where(x64 >= 0, 1 / (1 + np.exp(-np.abs(x64))), np.exp(-np.abs(x64)) / (1 + np.exp(-np.abs(x64))))


def _gelu(x: np.ndarray, ctx: OpContext) -> np.ndarray:
    x64 = x.astype(np.float64)
    if ctx.attr("approximate", "none") == "tanh":
        return 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))
    return 0.5 * x64 * (1 + _erf(x64 / math.sqrt(2)))


_UNARY: dict[str, Callable[[np.ndarray, OpContext], np.ndarray]] = {
    "Abs": lambda x, c: np.abs(x),
    "Neg": lambda x, c: np.negative(x),
    "Exp": lambda x, c: np.exp(x),
    "Log": lambda x, c: np.log(x),
    "Sqrt": lambda x, c: np.sqrt(x),
    "Reciprocal": lambda x, c: np.reciprocal(x),
    "Floor": lambda x, c: np.floor(x),
    "Ceil": lambda x, c: np.ceil(x),
    "Round": lambda x, c: np.round(x),
    "Sign": lambda x, c: np.sign(x),
    "Sin": lambda x, c: np.sin(x),
    "Cos": lambda x, c: np.cos(x),
    "Tan": lambda x, c: np.tan(x),
    "Asin": lambda x, c: np.arcsin(x),
    "Acos": lambda x, c: np.arccos(x),
    "Atan": lambda x, c: np.arctan(x),
    "Sinh": lambda x, c: np.sinh(x),
    "Cosh": lambda x, c: np.cosh(x),
    "Asinh": lambda x, c: np.arcsinh(x),
    "Acosh": lambda x, c: np.arccosh(x),
    "Atanh": lambda x, c: np.arctanh(x),
    "Tanh": lambda x, c: np.tanh(x),
    "Erf": lambda x, c: _erf(x),
    "Relu": lambda x, c: np.maximum(x, 0),
    "LeakyRelu": lambda x, c: np.where(x >= 0, x, x * c.attr("alpha", 0.01)),
    "Elu": lambda x, c: np.where(x >= 0, x, c.attr("alpha", 1.0) * (np.exp(x.astype(np.float64)) - 1)),
    "Celu": lambda x, c: np.maximum(x, 0)
    + np.minimum(0, c.attr("alpha", 1.0) * (np.exp(x.astype(np.float64) / c.attr("alpha", 1.0)) - 1)),
    "Selu": lambda x, c: c.attr("gamma", 1.0507009873554805)
    * np.where(x > 0, x, c.attr("alpha", 1.6732632423543772) * (np.exp(x.astype(np.float64)) - 1)),
    "Sigmoid": lambda x, c: _sigmoid(x),
    "HardSigmoid": lambda x, c: np.clip(c.attr("alpha", 0.2) * x + c.attr("beta", 0.5), 0, 1),
    "HardSwish": lambda x, c: x * np.clip(x / 6 + 0.5, 0, 1),
    "Softplus": lambda x, c: np.logaddexp(0, x.astype(np.float64)),
    "Softsign": lambda x, c: x / (1 + np.abs(x)),
    "Mish": lambda x, c: x * np.tanh(np.logaddexp(0, x.astype(np.float64))),
    "Gelu": _gelu,
    "ThresholdedRelu": lambda x, c: np.where(x > c.attr("alpha", 1.0), x, 0),
    "Not": lambda x, c: np.logical_not(x),
    "BitwiseNot": lambda x, c: np.invert(x),
}

for _name, _fn in _UNARY.items():
    _unary(_name, _fn)


@op("IsNaN", infer=with_dtype(dtypes.bool_))
def is_nan(ctx: OpContext) -> list[np.ndarray]:
    """True where the input is NaN."""
    return [np.isnan(ctx.array(0))]


def _binary(name: str, fn: Callable[[np.ndarray, np.ndarray], np.ndarray], *, boolean: bool = False) -> None:
    def reference(ctx: OpContext) -> list[np.ndarray]:
        a, b = ctx.array(0), ctx.array(1)
        result = np.asarray(fn(a, b))
        return [result if boolean else result.astype(a.dtype, copy=False)]

    reference.__doc__ = f"{name}, elementwise with numpy broadcasting."
    op(name, infer=broadcast_infer(dtypes.bool_ if boolean else None))(reference)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        # ONNX integer division truncates toward zero, like C.
        with np.errstate(divide="ignore"):
            return np.trunc(np.true_divide(a, b)).astype(a.dtype)
    return np.divide(a, b)


def _mod(a: np.ndarray, b: np.ndarray, fmod: bool) -> np.ndarray:
    return np.fmod(a, b) if fmod else np.mod(a, b)


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        return np.power(a.astype(np.int64), b.astype(np.int64))
    return np.power(a, b.astype(a.dtype))


_binary("Add", np.add)
_binary("Sub", np.subtract)
_binary("Mul", np.multiply)
_binary("Div", _div)
_binary("Pow", _pow)
_binary("Equal", np.equal, boolean=True)
_binary("Greater", np.greater, boolean=True)
_binary("GreaterOrEqual", np.greater_equal, boolean=True)
_binary("Less", np.less, boolean=True)
_binary("LessOrEqual", np.less_equal, boolean=True)
_binary("And", np.logical_and, boolean=True)
_binary("Or", np.logical_or, boolean=True)
_binary("Xor", np.logical_xor, boolean=True)
_binary("BitwiseAnd", np.bitwise_and)
_binary("BitwiseOr", np.bitwise_or)
_binary("BitwiseXor", np.bitwise_xor)


@op("Mod", infer=broadcast_infer())
def mod(ctx: OpContext) -> list[np.ndarray]:
    """Remainder: sign of the divisor (fmod=0) or of the dividend (fmod=1, C fmod)."""
    a, b = ctx.array(0), ctx.array(1)
    return [_mod(a, b, bool(ctx.attr("fmod", 0))).astype(a.dtype)]


@op("PRelu", infer=broadcast_infer())
def prelu(ctx: OpContext) -> list[np.ndarray]:
    """x where x >= 0, slope * x elsewhere; slope broadcasts to x."""
    x, slope = ctx.array(0), ctx.array(1)
    return [np.where(x >= 0, x, x * slope).astype(x.dtype)]


def _variadic(name: str, fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> None:
    def reference(ctx: OpContext) -> list[np.ndarray]:
        values = [v for v in ctx.values if v is not None]
        result = values[0]
        for v in values[1:]:
            result = fn(result, v)
        return [np.asarray(result).astype(values[0].dtype, copy=False)]

    reference.__doc__ = f"{name} over any number of broadcast inputs."
    op(name, infer=broadcast_infer())(reference)


_variadic("Max", np.maximum)
_variadic("Min", np.minimum)
_variadic("Sum", np.add)


@op("Mean", infer=broadcast_infer())
def mean(ctx: OpContext) -> list[np.ndarray]:
    """Elementwise mean of broadcast inputs."""
    values = [v for v in ctx.values if v is not None]
    total = values[0]
    for v in values[1:]:
        total = total + v
    return [(total / len(values)).astype(values[0].dtype)]


@op("Clip", infer=same_as_input(0))
def clip(ctx: OpContext) -> list[np.ndarray]:
    """Clamp to [min, max] (inputs since opset 11, attributes before)."""
    x = ctx.array(0)
    lo = ctx.value(1) if ctx.has_input(1) else ctx.attr("min", None)
    hi = ctx.value(2) if ctx.has_input(2) else ctx.attr("max", None)
    out = x
    if lo is not None:
        out = np.maximum(out, np.asarray(lo, dtype=x.dtype))
    if hi is not None:
        out = np.minimum(out, np.asarray(hi, dtype=x.dtype))
    return [np.asarray(out, dtype=x.dtype)]


def _where_infer(ctx: OpContext) -> list[TensorInfo]:
    shape = broadcast_shapes(ctx, [input_info(ctx, i).shape for i in range(3)])
    return [TensorInfo(input_info(ctx, 1).dtype, shape)]


@op("Where", infer=_where_infer)
def where(ctx: OpContext) -> list[np.ndarray]:
    """Select x where the condition holds, else y."""
    cond, x, y = map(ctx.array, range(3))
    return [np.where(cond, x, y).astype(x.dtype)]


@op("IsInf", infer=with_dtype(dtypes.bool_))
def is_inf(ctx: OpContext) -> list[np.ndarray]:
    """True where the input is +inf (detect_positive) or -inf (detect_negative)."""
    x = ctx.array(0)
    pos, neg = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
    return [(np.isposinf(x) & bool(pos)) | (np.isneginf(x) & bool(neg))]


@op("BitShift", infer=broadcast_infer())
def bit_shift(ctx: OpContext) -> list[np.ndarray]:
    """Shift unsigned integers left or right by the (broadcast) amounts."""
    x, y = ctx.array(0), ctx.array(1)
    shift = np.left_shift if ctx.attr("direction") == "LEFT" else np.right_shift
    return [shift(x, y.astype(x.dtype)).astype(x.dtype)]
