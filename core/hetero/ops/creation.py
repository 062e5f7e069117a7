"""Type conversion and tensor creation: Cast, Constant, ConstantOfShape, Range, EyeLike, and the random ops."""

from __future__ import annotations

import math

import numpy as np

from ..contract import dtypes
from ..contract.dtypes import DType
from ..contract.registry import OpContext, op
from ..contract.tensor import TensorInfo
from . import lowp
from .shapes import input_info, int_list, np_dtype, output_dtype_from_attr, shape_of, unknown


# -- Cast ----------------------------------------------------------------------------------------------------------
def _cast(x: np.ndarray, to: DType, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    target = np_dtype(to)
    if to is dtypes.string:
        # Shortest round-trip text (like printf %.9g for float32), as ONNX casts numbers to strings.
        return np.vectorize(_to_text, otypes=[object])(x) if x.dtype.kind != "O" else x
    if x.dtype.kind in "OSU":
        as_float = lowp.is_float(target)
        parsed = np.array([float(s) if as_float else int(s) for s in x.reshape(-1)],
                          dtype=np.float64 if as_float else np.int64).reshape(x.shape)
        return lowp.to_float(parsed, target, saturate, round_mode) if as_float else parsed.astype(target)
    if lowp.is_int(target) and lowp.is_float(x.dtype):
        # Out-of-range and NaN conversions are undefined in ONNX; truncate toward zero like C for the in-range ones.
        with np.errstate(invalid="ignore"):
            return np.trunc(lowp.widen(x)).astype(target)
    if lowp.is_float(target) and x.dtype.kind != "b":
        # float8 saturation, float8e8m0 rounding modes, float4 clamping; plain astype for the others.
        return lowp.to_float(x, target, saturate, round_mode)
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(target)


def _to_text(v: object) -> str:
    if isinstance(v, (float, np.floating)):
        f = float(v)
        if math.isnan(f):
            return "NaN"
        if math.isinf(f):
            return "INF" if f > 0 else "-INF"
        return np.format_float_positional(v, trim="-") if abs(f) < 1e16 and (f == 0 or abs(f) >= 1e-4) \
            else np.format_float_scientific(v, trim="-")
    return str(v)


def _cast_infer(ctx: OpContext) -> list[TensorInfo]:
    to = ctx.attr("to")
    dtype = dtypes.from_onnx(int(to)) if isinstance(to, int) else dtypes.from_name(str(to).lower())
    return [TensorInfo(dtype, shape_of(ctx, 0))]


@op("Cast", infer=_cast_infer)
def cast(ctx: OpContext) -> list[np.ndarray]:
    """Convert to the element type ``to`` (float -> int truncates toward zero; float8 targets saturate unless
    ``saturate=0``; float8e8m0 rounds by ``round_mode``)."""
    return [_cast(ctx.array(0), _cast_infer(ctx)[0].dtype, bool(ctx.attr("saturate", 1)),
                  _text(ctx.attr("round_mode", "up")))]


@op("CastLike", infer=lambda ctx: [TensorInfo(input_info(ctx, 1).dtype, shape_of(ctx, 0))])
def cast_like(ctx: OpContext) -> list[np.ndarray]:
    """Convert to the element type of the second input (same rules as Cast)."""
    return [_cast(ctx.array(0), input_info(ctx, 1).dtype, bool(ctx.attr("saturate", 1)),
                  _text(ctx.attr("round_mode", "up")))]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- Constants -----------------------------------------------------------------------------------------------------
def _constant_value(ctx: OpContext) -> np.ndarray:
    attrs = ctx.node.attrs
    if "value" in attrs:
        return np.asarray(attrs["value"])
    if "value_float" in attrs:
        return np.array(attrs["value_float"], dtype=np.float32)
    if "value_floats" in attrs:
        return np.array(attrs["value_floats"], dtype=np.float32)
    if "value_int" in attrs:
        return np.array(attrs["value_int"], dtype=np.int64)
    if "value_ints" in attrs:
        return np.array(attrs["value_ints"], dtype=np.int64)
    if "value_string" in attrs:
        return np.array(attrs["value_string"], dtype=object)
    if "value_strings" in attrs:
        return np.array(attrs["value_strings"], dtype=object)
    raise ctx.fail("Constant needs one of value, value_float(s), value_int(s), value_string(s)")


@op("Constant", infer=lambda ctx: [TensorInfo(dtypes.from_numpy(_constant_value(ctx).dtype),
                                              _constant_value(ctx).shape)])
def constant(ctx: OpContext) -> list[np.ndarray]:
    """The tensor held by the node's value attribute."""
    return [_constant_value(ctx)]


def _fill_value(ctx: OpContext) -> np.ndarray:
    value = ctx.attr("value", None)
    return np.zeros((), dtype=np.float32) if value is None else np.asarray(value).reshape(())


def _constant_of_shape_infer(ctx: OpContext) -> list[TensorInfo]:
    dtype = dtypes.from_numpy(_fill_value(ctx).dtype)
    shape = ctx.value(0)
    if shape is None:
        n = shape_of(ctx, 0)
        return [unknown(dtype, None if n is None or not n else n[0])]
    return [TensorInfo(dtype, tuple(int_list(shape) or []))]


@op("ConstantOfShape", infer=_constant_of_shape_infer, value_inputs=(0,))
def constant_of_shape(ctx: OpContext) -> list[np.ndarray]:
    """A tensor of the given shape filled with the value attribute (float32 0 by default)."""
    fill = _fill_value(ctx)
    return [np.full(int_list(ctx.array(0)) or [], fill, dtype=fill.dtype)]


# -- Range / EyeLike -----------------------------------------------------------------------------------------------
def _range_len(start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> int:
    # Scalars by the spec; one-element tensors also occur in real models (and ONNX's own expanded functions).
    first, last, step = (float(np.asarray(v).reshape(-1)[0]) for v in (start, limit, delta))
    return max(math.ceil((last - first) / step), 0)


def _range_infer(ctx: OpContext) -> list[TensorInfo]:
    dtype = input_info(ctx, 0).dtype
    vals = [v for v in (ctx.value(i) for i in range(3)) if v is not None]
    if len(vals) < 3:
        return [unknown(dtype, 1)]
    return [TensorInfo(dtype, (_range_len(*vals),))]


@op("Range", infer=_range_infer, value_inputs=(0, 1, 2))
def range_(ctx: OpContext) -> list[np.ndarray]:
    """start, start + delta, ... up to (excluding) limit; ceil((limit - start) / delta) elements."""
    start, limit, delta = (np.asarray(v).reshape(()) for v in ctx.values[:3])
    n = _range_len(start, limit, delta)
    # Accumulate like the spec's loop (start + i * delta in the input type).
    return [(start + np.arange(n).astype(start.dtype) * delta).astype(start.dtype)]


@op("EyeLike", infer=lambda ctx: [TensorInfo(output_dtype_from_attr(ctx, "dtype", input_info(ctx, 0).dtype),
                                             shape_of(ctx, 0))])
def eye_like(ctx: OpContext) -> list[np.ndarray]:
    """A 2-D identity-like tensor of the input's shape, ones on diagonal k."""
    x = ctx.array(0)
    dtype = output_dtype_from_attr(ctx, "dtype", input_info(ctx, 0).dtype)
    return [np.eye(x.shape[0], x.shape[1], k=ctx.attr("k", 0), dtype=np_dtype(dtype))]


# -- Random --------------------------------------------------------------------------------------------------------
def _rng(ctx: OpContext) -> np.random.Generator:
    seed = ctx.attr("seed", None)
    return np.random.default_rng(None if seed is None else int(np.float32(seed).view(np.uint32)))


def _random_infer(like: bool):
    def infer(ctx: OpContext) -> list[TensorInfo]:
        if like:
            x = input_info(ctx, 0)
            return [TensorInfo(output_dtype_from_attr(ctx, "dtype", x.dtype), x.shape)]
        return [TensorInfo(output_dtype_from_attr(ctx, "dtype", dtypes.float32), tuple(ctx.attr("shape")))]

    return infer


def _random_shape(ctx: OpContext, like: bool) -> tuple[int, ...]:
    return ctx.array(0).shape if like else tuple(ctx.attr("shape"))


def _register_random(name: str, like: bool, normal: bool) -> None:
    def reference(ctx: OpContext) -> list[np.ndarray]:
        info = _random_infer(like)(ctx)[0]
        shape = _random_shape(ctx, like)
        rng = _rng(ctx)
        if normal:
            out = rng.normal(ctx.attr("mean", 0.0), ctx.attr("scale", 1.0), shape)
        else:
            out = rng.uniform(ctx.attr("low", 0.0), ctx.attr("high", 1.0), shape)
        return [out.astype(np_dtype(info.dtype))]

    reference.__doc__ = f"{name}: random values ({'normal' if normal else 'uniform'}), seeded by ``seed`` if given."
    op(name, infer=_random_infer(like), nondeterministic=True)(reference)


_register_random("RandomNormal", like=False, normal=True)
_register_random("RandomUniform", like=False, normal=False)
_register_random("RandomNormalLike", like=True, normal=True)
_register_random("RandomUniformLike", like=True, normal=False)


@op("Bernoulli", infer=_random_infer(True), nondeterministic=True)
def bernoulli(ctx: OpContext) -> list[np.ndarray]:
    """1 with the input's probability per element, else 0."""
    p = ctx.array(0)
    dtype = _random_infer(True)(ctx)[0].dtype
    return [(_rng(ctx).uniform(0.0, 1.0, p.shape) < p).astype(np_dtype(dtype))]


def _multinomial_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    batch = None if x.shape is None else x.shape[0]
    return [TensorInfo(output_dtype_from_attr(ctx, "dtype", dtypes.int32), (batch, ctx.attr("sample_size", 1)))]


@op("Multinomial", infer=_multinomial_infer, nondeterministic=True)
def multinomial(ctx: OpContext) -> list[np.ndarray]:
    """sample_size draws per batch row from the categorical distribution given by unnormalized log-probabilities."""
    logits = ctx.array(0).astype(np.float64)
    n = ctx.attr("sample_size", 1)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    rng = _rng(ctx)
    out = np.stack([rng.choice(probs.shape[1], size=n, p=row) for row in probs])
    return [out.astype(np_dtype(_multinomial_infer(ctx)[0].dtype))]


# -- BitCast -------------------------------------------------------------------------------------------------------
_BITS = {"bool": 8, "int4": 4, "uint4": 4, "int2": 2, "uint2": 2, "float4e2m1": 4}


def _bitcast_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    to = _cast_infer(ctx)[0].dtype
    src_bits, dst_bits = _BITS.get(x.dtype.name, 8 * x.dtype.itemsize), _BITS.get(to.name, 8 * to.itemsize)
    if to is dtypes.string or x.dtype is dtypes.string or src_bits != dst_bits:
        raise ctx.fail(f"cannot bitcast {x.dtype} ({src_bits} bits) to {to} ({dst_bits} bits)")
    return [TensorInfo(to, x.shape)]


@op("BitCast", infer=_bitcast_infer)
def bitcast(ctx: OpContext) -> list[np.ndarray]:
    """Reinterpret the bits (little endian) as the type ``to`` of the same width; the shape is unchanged."""
    x = np.array(ctx.array(0), order="C")
    target = np_dtype(_bitcast_infer(ctx)[0].dtype)
    if x.dtype.byteorder == ">":
        x = x.astype(x.dtype.newbyteorder("<"))
    if x.dtype.itemsize != target.itemsize:  # sub-byte types are held one per byte: go through the bit pattern
        raise ctx.fail(f"bitcast between {x.dtype} and {target} is not supported")
    return [x.view(target).reshape(x.shape)]
