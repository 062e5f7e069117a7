"""Linear quantization: QuantizeLinear / DequantizeLinear (per tensor, per axis, per block), dynamic quantization,
the integer matmul / conv ops (MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv), and the fused
``hetero::MatMulIntegerScaled`` / ``hetero::ConvIntegerScaled`` of dynamically quantized models."""

from __future__ import annotations

import numpy as np

from ..contract import dtypes
from ..contract.graph import HETERO_DOMAIN
from ..contract.registry import OpContext, op
from ..contract.tensor import TensorInfo
from . import lowp
from .linalg import _matmul_infer
from .nn import _acc_dtype, _conv, _conv_infer
from .shapes import broadcast_shapes, input_info, normalize_axis, output_dtype_from_attr, shape_of


def _expand_param(ctx: OpContext, param: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Broadcast a scale / zero point to x: scalar, 1-D along ``axis``, or blocked along ``axis``."""
    if param.size == 1 and param.ndim <= 1:
        return param.reshape(())
    axis = normalize_axis(ctx, ctx.attr("axis", 1), x.ndim)
    block = ctx.attr("block_size", 0)
    if block:
        return np.repeat(param, block, axis=axis)[tuple(slice(0, n) for n in x.shape)]
    return param.reshape([-1 if a == axis else 1 for a in range(x.ndim)])


def _saturate(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    lo, hi = lowp.int_range(dtype)
    return np.clip(y, lo, hi).astype(dtype)


def _quantize_dtype(ctx: OpContext) -> dtypes.DType:
    if ctx.has_input(2):
        return input_info(ctx, 2).dtype
    return output_dtype_from_attr(ctx, "output_dtype", dtypes.uint8)


@op("QuantizeLinear", infer=lambda ctx: [TensorInfo(_quantize_dtype(ctx), shape_of(ctx, 0))])
def quantize_linear(ctx: OpContext) -> list[np.ndarray]:
    """y = saturate(round(x / scale) + zero_point).

    The division runs in the ``precision`` attribute's type, else in y_scale's type. Integer outputs (8/16-bit, int4,
    uint4, int2, uint2) round half to even and clamp to the type's range; float8 outputs round to nearest-even and
    saturate to +/-FLT_MAX unless ``saturate=0``; float4e2m1 always saturates (to +/-6).
    """
    x, scale = ctx.array(0), ctx.array(1)
    out = _quantize_dtype(ctx)
    target = out.np_dtype
    if target is None or not (lowp.is_int(target) or lowp.is_float(target)):
        raise ctx.fail(f"quantizing to {out} is not supported")
    precision = ctx.attr("precision", None)
    ftype = dtypes.from_onnx(int(precision)).np_dtype if precision else scale.dtype
    if ftype is None or not lowp.is_float(ftype):
        ftype = np.dtype(np.float32)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        q = x.astype(ftype) / _expand_param(ctx, scale.astype(ftype), x)
    zp = ctx.array(2) if ctx.has_input(2) else None
    if lowp.is_float(target):
        if zp is not None:
            q = lowp.widen(q).astype(np.float32) + _expand_param(ctx, lowp.widen(zp).astype(np.float32), x)
        return [lowp.to_float(q, target, bool(ctx.attr("saturate", 1)))]
    q = np.rint(lowp.widen(q).astype(np.float64))
    if zp is not None:
        q = q + _expand_param(ctx, zp.astype(np.int64), x)
    return [_saturate(q, target)]


def _dequantize_infer(ctx: OpContext) -> list[TensorInfo]:
    default = input_info(ctx, 1).dtype
    return [TensorInfo(output_dtype_from_attr(ctx, "output_dtype", default), shape_of(ctx, 0))]


@op("DequantizeLinear", infer=_dequantize_infer)
def dequantize_linear(ctx: OpContext) -> list[np.ndarray]:
    """y = (x - zero_point) * scale."""
    x, scale = ctx.array(0), ctx.array(1)
    zp = ctx.array(2).astype(np.float64) if ctx.has_input(2) else np.zeros(())
    # In float64 (exact for the narrow input types), then rounded once to the output type.
    out = (x.astype(np.float64) - _expand_param(ctx, zp, x)) * _expand_param(ctx, scale.astype(np.float64), x)
    return [out.astype(_dequantize_infer(ctx)[0].dtype.np_dtype)]


def _dynamic_infer(ctx: OpContext) -> list[TensorInfo]:
    return [TensorInfo(dtypes.uint8, shape_of(ctx, 0)), TensorInfo(dtypes.float32, ()), TensorInfo(dtypes.uint8, ())]


@op("DynamicQuantizeLinear", infer=_dynamic_infer)
def dynamic_quantize_linear(ctx: OpContext) -> list[np.ndarray]:
    """Quantize to uint8 with a scale and zero point chosen from the data's range (always including 0)."""
    x = ctx.array(0).astype(np.float32)
    # float32 arithmetic throughout (the spec's and onnxruntime's): the scale is (hi - lo) / 255 rounded once
    lo, hi = np.minimum(x.min(initial=0), np.float32(0)), np.maximum(x.max(initial=0), np.float32(0))
    scale = np.float32(np.float32(hi - lo) / np.float32(255))
    zp = _saturate(np.rint(np.float32(0 - lo) / scale if scale else np.float32(0)), np.dtype(np.uint8))
    y = _saturate(np.rint(x / scale if scale else x * 0) + zp.astype(np.int64), np.dtype(np.uint8))
    return [y, np.array(scale, dtype=np.float32), np.array(zp, dtype=np.uint8)]


def _minus_zp(x: np.ndarray, zp: np.ndarray | None, axis: int) -> np.ndarray:
    """x - zero point as int64; a 1-D zero point runs along ``axis`` (rows of A, columns of B)."""
    x = x.astype(np.int64)
    if zp is None:
        return x
    zp = zp.astype(np.int64)
    if zp.size > 1:
        shape = [1] * x.ndim
        shape[axis] = -1
        zp = zp.reshape(shape)
    return x - zp


def _int_matmul_infer(ctx: OpContext) -> list[TensorInfo]:
    return [TensorInfo(dtypes.int32, _matmul_infer(ctx)[0].shape)]


@op("MatMulInteger", infer=_int_matmul_infer)
def matmul_integer(ctx: OpContext) -> list[np.ndarray]:
    """(A - a_zero_point) @ (B - b_zero_point), accumulated in int32."""
    a, b = ctx.array(0), ctx.array(1)
    a_zp = ctx.array(2) if ctx.has_input(2) else None
    b_zp = ctx.array(3) if ctx.has_input(3) else None
    return [np.matmul(_minus_zp(a, a_zp, a.ndim - 2), _minus_zp(b, b_zp, b.ndim - 1)).astype(np.int32)]


@op("ConvInteger", infer=lambda ctx: [TensorInfo(dtypes.int32, _conv_infer(ctx)[0].shape)])
def conv_integer(ctx: OpContext) -> list[np.ndarray]:
    """Convolution of (x - x_zero_point) and (w - w_zero_point), accumulated in int32."""
    x, w = ctx.array(0), ctx.array(1)
    x_zp = ctx.array(2) if ctx.has_input(2) else None
    w_zp = ctx.array(3) if ctx.has_input(3) else None
    xs = _minus_zp(x, x_zp, 1)
    ws = _minus_zp(w, w_zp, 0)
    return [_conv(ctx, xs, ws, np.dtype(np.int64)).astype(np.int32)]


def _conv_scaled_infer(ctx: OpContext) -> list[TensorInfo]:
    return [TensorInfo(input_info(ctx, 4).dtype, _conv_infer(ctx)[0].shape)]


@op("ConvIntegerScaled", domain=HETERO_DOMAIN, infer=_conv_scaled_infer)
def conv_integer_scaled(ctx: OpContext) -> list[np.ndarray]:
    """ConvInteger (inputs 0-3), plus the optional int32 ``bias`` (input 5: one value per output channel, broadcast
    against the output), Cast to the scale's type, times ``scale`` (input 4; times the optional ``factor``, input 6,
    first: the activation scale x weight scale product): what ``hetero.ir.passes.fuse_conv_integer_scale`` replaces,
    computed the way those nodes compute it."""
    (acc,) = conv_integer(ctx)
    if ctx.has_input(5):
        acc = np.add(acc, ctx.array(5), dtype=np.int32)  # int32 wrapping, as the Add of two int32 tensors
    scale = ctx.array(4)
    if ctx.has_input(6):
        scale = scale * ctx.array(6)
    return [(acc.astype(scale.dtype) * scale).astype(scale.dtype, copy=False)]


def _requantize(real: np.ndarray, y_scale: np.ndarray, y_zp: np.ndarray) -> np.ndarray:
    return _saturate(np.rint(real / y_scale.astype(np.float64)) + y_zp.astype(np.int64), y_zp.dtype)


def _qlinear_matmul_infer(ctx: OpContext) -> list[TensorInfo]:
    shape = _matmul_infer(OpContextView(ctx, [0, 3]))[0].shape
    return [TensorInfo(input_info(ctx, 7).dtype, shape)]


class OpContextView(OpContext):
    """The same node seen through a subset of its inputs (to reuse another op's inference)."""

    def __init__(self, ctx: OpContext, indices: list[int]) -> None:
        super().__init__(ctx.node, [ctx.inputs[i] for i in indices],
                         [ctx.values[i] if i < len(ctx.values) else None for i in indices], ctx.opset)


def _dequant(x: np.ndarray, scale: np.ndarray, zp: np.ndarray, axis: int | None) -> np.ndarray:
    scale, zp = scale.astype(np.float64), zp.astype(np.float64)
    if axis is not None and scale.size > 1:
        shape = [1] * x.ndim
        shape[axis] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape) if zp.size > 1 else zp
    return (x.astype(np.float64) - zp) * scale


@op("QLinearMatMul", infer=_qlinear_matmul_infer)
def qlinear_matmul(ctx: OpContext) -> list[np.ndarray]:
    """Quantized matmul: dequantize A and B, multiply, requantize with y_scale / y_zero_point."""
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = map(ctx.array, range(8))
    real = np.matmul(_dequant(a, a_s, a_zp, a.ndim - 2), _dequant(b, b_s, b_zp, b.ndim - 1))
    return [_requantize(real, y_s, y_zp)]


def _qlinear_conv_infer(ctx: OpContext) -> list[TensorInfo]:
    shape = _conv_infer(OpContextView(ctx, [0, 3]))[0].shape
    return [TensorInfo(input_info(ctx, 7).dtype, shape)]


@op("QLinearConv", infer=_qlinear_conv_infer)
def qlinear_conv(ctx: OpContext) -> list[np.ndarray]:
    """Quantized convolution (per-tensor or per-output-channel weight scales), int32 bias, requantized output."""
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp = map(ctx.array, range(8))
    xs = _dequant(x, x_s, x_zp, None)
    ws = _dequant(w, w_s, w_zp, 0)
    real = _conv(ctx, xs, ws, _acc_dtype(xs))
    if len(ctx.values) > 8 and ctx.values[8] is not None:
        bias = ctx.array(8).astype(np.float64) * x_s.astype(np.float64).reshape(()) * w_s.astype(np.float64)
        real = real + bias.reshape(1, -1, *[1] * (x.ndim - 2))
    return [_requantize(real, y_s, y_zp)]


def _scaled_infer(ctx: OpContext) -> list[TensorInfo]:
    shape = _matmul_infer(ctx)[0].shape
    if ctx.has_input(7):
        shape = broadcast_shapes(ctx, [shape, input_info(ctx, 7).shape])
    return [TensorInfo(input_info(ctx, 4).dtype, shape)]


@op("MatMulIntegerScaled", domain=HETERO_DOMAIN, infer=_scaled_infer)
def matmul_integer_scaled(ctx: OpContext) -> list[np.ndarray]:
    """MatMulInteger (inputs 0-3), Cast to the scale's type, times ``scale`` (input 4; times the optional ``factor``,
    input 6, first: the activation scale x weight scale product), plus the optional ``bias`` (input 5): what
    ``hetero.ir.passes.fuse_matmul_integer_scale`` replaces, computed the way those nodes compute it; then plus the
    optional ``addend`` (input 7, broadcast: the residual Add after it, ``fuse_matmul_integer_residual``); then, with
    ``q_scale`` / ``q_zero_point`` (inputs 8, 9: one value each), QuantizeLinear then DequantizeLinear by them, plus
    the optional ``q_bias`` (input 10, along the last axis): ``fuse_matmul_integer_fake_quant``'s nodes."""
    (acc,) = matmul_integer(ctx)
    scale = ctx.array(4)
    if ctx.has_input(6):
        scale = scale * ctx.array(6)
    y = acc.astype(scale.dtype) * scale
    if ctx.has_input(5):
        y = y + ctx.array(5)
    y = y.astype(scale.dtype, copy=False)
    if ctx.has_input(7):
        y = (y + ctx.array(7)).astype(scale.dtype, copy=False)
    if ctx.has_input(8):
        q_scale, q_zp = ctx.array(8).reshape(()), ctx.array(9).reshape(())
        # QuantizeLinear's and DequantizeLinear's arithmetic (quantize_linear / dequantize_linear above)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            q = np.rint((y / q_scale.astype(y.dtype)).astype(np.float64)) + q_zp.astype(np.int64)
        q = _saturate(q, q_zp.dtype)
        y = ((q.astype(np.float64) - q_zp.astype(np.float64)) * q_scale.astype(np.float64)).astype(scale.dtype)
        if ctx.has_input(10):
            y = (y + ctx.array(10)).astype(scale.dtype, copy=False)
    return [y]
