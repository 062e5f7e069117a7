"""Conversions to the low-precision element types, with ONNX's rules (Cast, CastLike, QuantizeLinear).

numpy (through ml_dtypes) already rounds to nearest-even when it converts to bfloat16, float8, float4, and wraps when
it converts integers to int4 / int2. What it does not do is ONNX's *saturation*:

* float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz) with ``saturate=1`` (the default): a value whose rounding exceeds the
  largest finite value, and +/-inf, become +/-FLT_MAX; NaN stays NaN. With ``saturate=0`` an overflow becomes NaN
  (inf for e5m2, the only one of the four with an infinity), which is what ml_dtypes does.
* float4e2m1 has neither inf nor NaN, so it always saturates (to +/-6).
* float8e8m0 (a bare power-of-two exponent, 2**-127 .. 2**127, 0xFF = NaN, no sign, no zero) rounds by
  ``round_mode``: ``up`` (the default) to the next power of two, ``down`` to the previous one, ``nearest`` to the
  closer one with ties going up; with ``saturate`` out-of-range values and 0 clamp to the ends, without it they are NaN.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

FLOAT8 = frozenset(
    np.dtype(t) for t in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2,
                          ml_dtypes.float8_e5m2fnuz)
)
FLOAT4 = np.dtype(ml_dtypes.float4_e2m1fn)
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
_ML_FLOATS = FLOAT8 | {FLOAT4, E8M0, np.dtype(ml_dtypes.bfloat16)}
_ML_INTS = frozenset(np.dtype(t) for t in (ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2))


def is_float(dt: np.dtype) -> bool:
    """True for numpy floats and for the ml_dtypes floats (whose numpy ``kind`` is 'V')."""
    dt = np.dtype(dt)
    return dt.kind == "f" or dt in _ML_FLOATS


def is_int(dt: np.dtype) -> bool:
    """True for numpy integers and for int4 / uint4 / int2 / uint2."""
    dt = np.dtype(dt)
    return dt.kind in "iu" or dt in _ML_INTS


def int_range(dt: np.dtype) -> tuple[int, int]:
    info = ml_dtypes.iinfo(dt) if np.dtype(dt) in _ML_INTS else np.iinfo(dt)
    return int(info.min), int(info.max)


def widen(x: np.ndarray) -> np.ndarray:
    """An ml_dtypes float array as float32 (exact); other arrays unchanged."""
    return x.astype(np.float32) if x.dtype in _ML_FLOATS else x


def to_float8(x: np.ndarray, target: np.dtype, saturate: bool = True) -> np.ndarray:
    """Round a float array to a float8 type (RNE), saturating as ONNX's Cast tables say."""
    x = widen(x)
    if saturate:
        top = float(ml_dtypes.finfo(target).max)
        x = np.clip(x, -top, top)  # NaN stays NaN, +/-inf become +/-FLT_MAX
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(target)


def to_e8m0(x: np.ndarray, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    """Round to a power of two, 2**-127 .. 2**127 (float8e8m0). Negative inputs are undefined: their magnitude is
    used."""
    a = np.abs(widen(x).astype(np.float64))
    finite = np.isfinite(a) & (a > 0)
    safe = np.where(finite, a, 1.0)
    mant, exp = np.frexp(safe)  # safe = mant * 2**exp, mant in [0.5, 1)
    low = exp - 1  # 2**low <= safe < 2**(low + 1)
    exact = mant == 0.5
    if round_mode == "up":
        e = np.where(exact, low, low + 1)
    elif round_mode == "down":
        e = low
    elif round_mode == "nearest":
        e = np.where(mant >= 0.75, low + 1, low)  # the midpoint 1.5 * 2**low rounds up
    else:
        raise ValueError(f"unknown round_mode {round_mode!r} (expected up, down or nearest)")
    lo, hi = -127, 127
    if saturate:
        e = np.clip(e, lo, hi)
        e = np.where(np.isposinf(a), hi, np.where(a == 0, lo, e))
        bad = np.isnan(a)
    else:
        bad = np.isnan(a) | np.isinf(a) | (a == 0) | (e < lo) | (e > hi)
        e = np.clip(e, lo, hi)
    out = np.ldexp(1.0, e.astype(np.int32))
    return np.where(bad, np.nan, out).astype(E8M0)


def to_float(x: np.ndarray, target: np.dtype, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    """Convert to any float type with ONNX's rounding and saturation (see the module docstring)."""
    target = np.dtype(target)
    if target in FLOAT8:
        return to_float8(x, target, saturate)
    if target == E8M0:
        return to_e8m0(x, saturate, round_mode)
    if target == FLOAT4:
        x = widen(x)
        return np.clip(x, -6.0, 6.0).astype(target)
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(target)
