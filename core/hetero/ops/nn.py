"""Neural-network layers: convolutions, pooling, normalizations, softmax family and a few activations.

Spatial ops take NC[D]HW tensors. Convolution and pooling share one window geometry (``_geometry``): per spatial
axis the begin/end pads and the output size, from kernel, strides, dilations, pads / auto_pad and ceil_mode.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from ..contract import dtypes
from ..contract.errors import ShapeError
from ..contract.registry import OpContext, op
from ..contract.tensor import Dim, Shape, TensorInfo
from . import lowp
from .shapes import input_info, normalize_axis, same_as_input, static_dims, unknown


# -- window geometry -----------------------------------------------------------------------------------------------
def _spatial_attrs(ctx: OpContext, n: int, kernel: list[int]) -> tuple[list[int], list[int]]:
    strides = list(ctx.attr("strides", None) or [1] * n)
    dilations = list(ctx.attr("dilations", None) or [1] * n)
    return strides, dilations


def _geometry(
    ctx: OpContext, spatial: tuple[Dim, ...], kernel: list[int], ceil_mode: bool = False
) -> tuple[list[Dim], list[int | None], list[int | None]]:
    """(output sizes, begin pads, end pads) per spatial axis; None where the input size is unknown."""
    n = len(spatial)
    strides, dilations = _spatial_attrs(ctx, n, kernel)
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    pads = list(ctx.attr("pads", None) or [0] * (2 * n))
    for what, values, count in (("kernel_shape", kernel, n), ("strides", strides, n), ("dilations", dilations, n),
                                ("pads", pads, 2 * n)):
        least = 0 if what == "pads" else 1
        if len(values) != count or any(int(v) < least for v in values):
            raise ShapeError(f"{ctx.node.label()}: {what} {list(values)} must hold {count} values >= {least} "
                             f"for {n} spatial axes")
    outs: list[Dim] = []
    begins: list[int | None] = []
    ends: list[int | None] = []
    for i, size in enumerate(spatial):
        ek = (kernel[i] - 1) * dilations[i] + 1
        s = strides[i]
        out: Dim
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            if size is None:
                outs.append(None)
                begins.append(None)
                ends.append(None)
                continue
            out = -(-size // s)
            total = max((out - 1) * s + ek - size, 0)
            small, big = total // 2, total - total // 2
            begin, end = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
        elif auto_pad == "VALID":
            begin, end = 0, 0
            out = None if size is None else (size - ek) // s + 1
        else:
            begin, end = pads[i], pads[i + n]
            if size is None:
                out = None
            elif ceil_mode:
                out = -(-(size + begin + end - ek) // s) + 1
                # The last window must start inside the input or its begin padding.
                if (out - 1) * s >= size + begin:
                    out -= 1
            else:
                out = (size + begin + end - ek) // s + 1
        if out is not None and out < 1:
            raise ShapeError(f"{ctx.node.label()}: spatial axis {i} of size {size} (pads {begin}, {end}) is "
                             f"shorter than the kernel's reach {ek}: the output would have {out} positions")
        outs.append(out)
        begins.append(begin)
        ends.append(end)
    return outs, begins, ends


def _windows(x: np.ndarray, kernel: list[int], strides: list[int], dilations: list[int], outs: Sequence[int],
             begins: Sequence[int], fill: float) -> tuple[np.ndarray, np.ndarray]:
    """All kernel taps: (K, N, C, *out) values and a (K, *out) mask of taps inside the unpadded input."""
    n = len(kernel)
    spatial = x.shape[2:]
    # Pad enough on every side for any tap to be addressable.
    need_end = [max((outs[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - begins[i] - spatial[i], 0)
                for i in range(n)]
    widths = [(0, 0), (0, 0)] + [(begins[i], need_end[i]) for i in range(n)]
    xp = np.pad(x, widths, constant_values=fill)
    inside = np.pad(np.ones(spatial, dtype=bool), widths[2:], constant_values=False)
    taps, masks = [], []
    for offs in itertools.product(*[range(k) for k in kernel]):
        sl = tuple(slice(o * d, o * d + (m - 1) * s + 1, s) for o, d, s, m in zip(offs, dilations, strides, outs,
                                                                                strict=True))
        window = (slice(None), slice(None), *sl)  # a name: mypy misreads a starred tuple inside [] as 3.11 syntax
        taps.append(xp[window])
        masks.append(inside[sl])
    return np.stack(taps), np.stack(masks)


# -- Conv ----------------------------------------------------------------------------------------------------------
def _kernel_shape(ctx: OpContext, w_shape: Shape | None, n: int) -> list[int] | None:
    kernel = ctx.attr("kernel_shape", None)
    if kernel is not None:
        return list(kernel)
    if w_shape is None or any(d is None for d in w_shape[2:]):
        return None
    return [d for d in w_shape[2:] if d is not None]


def _conv_infer(ctx: OpContext) -> list[TensorInfo]:
    x, w = input_info(ctx, 0), input_info(ctx, 1)
    if x.shape is None:
        return [unknown(x.dtype)]
    n = len(x.shape) - 2
    kernel = _kernel_shape(ctx, w.shape, n)
    m = None if w.shape is None else w.shape[0]
    if kernel is None:
        return [TensorInfo(x.dtype, (x.shape[0], m, *[None] * n))]
    outs, _, _ = _geometry(ctx, x.shape[2:], kernel)
    return [TensorInfo(x.dtype, (x.shape[0], m, *outs))]


def _conv(ctx: OpContext, x: np.ndarray, w: np.ndarray, acc: np.dtype) -> np.ndarray:
    n = x.ndim - 2
    kernel = _kernel_shape(ctx, w.shape, n)
    assert kernel is not None
    strides, dilations = _spatial_attrs(ctx, n, kernel)
    outs, begins, _ = _geometry(ctx, x.shape[2:], kernel)
    group = ctx.attr("group", 1)
    taps, _ = _windows(x.astype(acc), kernel, strides, dilations, static_dims(ctx, outs), static_dims(ctx, begins), 0)
    k, batch, c = taps.shape[:3]
    m = w.shape[0]
    # (not -1: a zero batch leaves nothing to infer it from)
    positions = int(np.prod(static_dims(ctx, outs), dtype=np.int64))
    taps = taps.reshape(k, batch, group, c // group, positions)  # (K, N, G, C/G, P)
    wk = w.astype(acc).reshape(group, m // group, c // group, k)  # (G, M/G, C/G, K)
    out = np.einsum("kngcp,gmck->ngmp", taps, wk, optimize=True)
    return out.reshape(batch, m, *outs)


def _acc_dtype(x: np.ndarray) -> np.dtype:
    return np.dtype(np.float64) if lowp.is_float(x.dtype) else np.dtype(np.int64)


@op("Conv", infer=_conv_infer)
def conv(ctx: OpContext) -> list[np.ndarray]:
    """N-D convolution (cross-correlation) with groups, strides, dilations, pads or auto_pad, optional bias."""
    x, w = ctx.array(0), ctx.array(1)
    y = _conv(ctx, x, w, _acc_dtype(x))
    if ctx.has_input(2):
        y = y + ctx.array(2).reshape(1, -1, *[1] * (x.ndim - 2))
    return [y.astype(x.dtype)]


def _conv_transpose_geometry(ctx: OpContext, spatial: tuple[Dim, ...], kernel: list[int]
                             ) -> tuple[list[Dim], list[int | None]]:
    """(output sizes, begin pads) of ConvTranspose per spatial axis."""
    n = len(spatial)
    strides, dilations = _spatial_attrs(ctx, n, kernel)
    out_pad = list(ctx.attr("output_padding", None) or [0] * n)
    output_shape = ctx.attr("output_shape", None)
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    pads = list(ctx.attr("pads", None) or [0] * (2 * n))
    outs: list[Dim] = []
    begins: list[int | None] = []
    for i, size in enumerate(spatial):
        ek = (kernel[i] - 1) * dilations[i] + 1
        if size is None:
            outs.append(None if output_shape is None else output_shape[-n + i])
            begins.append(None)
            continue
        full = strides[i] * (size - 1) + out_pad[i] + ek
        if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            target = output_shape[len(output_shape) - n + i] if output_shape is not None else size * strides[i]
            total = full - target
            begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            outs.append(target)
            begins.append(begin)
        else:
            outs.append(full - pads[i] - pads[i + n])
            begins.append(pads[i])
    return outs, begins


def _conv_transpose_infer(ctx: OpContext) -> list[TensorInfo]:
    x, w = input_info(ctx, 0), input_info(ctx, 1)
    if x.shape is None:
        return [unknown(x.dtype)]
    n = len(x.shape) - 2
    kernel = _kernel_shape(ctx, w.shape, n)
    m = None if w.shape is None or w.shape[1] is None else w.shape[1] * ctx.attr("group", 1)
    if kernel is None:
        return [TensorInfo(x.dtype, (x.shape[0], m, *[None] * n))]
    outs, _ = _conv_transpose_geometry(ctx, x.shape[2:], kernel)
    return [TensorInfo(x.dtype, (x.shape[0], m, *outs))]


@op("ConvTranspose", infer=_conv_transpose_infer)
def conv_transpose(ctx: OpContext) -> list[np.ndarray]:
    """Transposed convolution: every input pixel scatters the kernel into a strided, dilated output window."""
    x, w = ctx.array(0), ctx.array(1)
    n = x.ndim - 2
    kernel = _kernel_shape(ctx, w.shape, n)
    assert kernel is not None
    strides, dilations = _spatial_attrs(ctx, n, kernel)
    group = ctx.attr("group", 1)
    outs, begins = (static_dims(ctx, dims) for dims in _conv_transpose_geometry(ctx, x.shape[2:], kernel))
    batch, c = x.shape[:2]
    mg = w.shape[1]
    spatial = x.shape[2:]
    full = [max(strides[i] * (spatial[i] - 1) + (kernel[i] - 1) * dilations[i] + 1,
                begins[i] + outs[i]) for i in range(n)]
    y = np.zeros((batch, group, mg, *full), dtype=np.float64)
    xg = x.astype(np.float64).reshape(batch, group, c // group, *spatial)
    wg = w.astype(np.float64).reshape(group, c // group, mg, *kernel)
    for offs in itertools.product(*[range(k) for k in kernel]):
        tap: tuple[slice | int, ...] = (slice(None), slice(None), slice(None), *offs)
        contrib = np.einsum("ngc...,gcm->ngm...", xg, wg[tap])
        sl = tuple(slice(o * d, o * d + (sz - 1) * s + 1, s) for o, d, s, sz in zip(offs, dilations, strides,
                                                                                  spatial, strict=True))
        window = (slice(None), slice(None), slice(None), *sl)
        y[window] += contrib
    crop = tuple(slice(b, b + o) for b, o in zip(begins, outs, strict=True))
    inside = (slice(None), slice(None), *crop)
    y = y.reshape(batch, group * mg, *full)[inside]
    if ctx.has_input(2):
        y = y + ctx.array(2).reshape(1, -1, *[1] * n)
    return [y.astype(x.dtype)]


# -- Pooling -------------------------------------------------------------------------------------------------------
def _pool_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    if x.shape is None:
        return [unknown(x.dtype), unknown(dtypes.int64)]
    outs, _, _ = _geometry(ctx, x.shape[2:], list(ctx.attr("kernel_shape")), bool(ctx.attr("ceil_mode", 0)))
    shape = (*x.shape[:2], *outs)
    return [TensorInfo(x.dtype, shape), TensorInfo(dtypes.int64, shape)]


def _pool_taps(ctx: OpContext, x: np.ndarray, fill: float) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    kernel = list(ctx.attr("kernel_shape"))
    strides, dilations = _spatial_attrs(ctx, len(kernel), kernel)
    geometry = _geometry(ctx, x.shape[2:], kernel, bool(ctx.attr("ceil_mode", 0)))
    outs, begins = static_dims(ctx, geometry[0]), static_dims(ctx, geometry[1])
    taps, inside = _windows(x, kernel, strides, dilations, outs, begins, fill)
    return taps, inside, outs


@op("MaxPool", infer=_pool_infer)
def max_pool(ctx: OpContext) -> list[np.ndarray]:
    """Max over each window (padding never wins), with the flat input index of the max as optional Indices."""
    x = ctx.array(0)
    fill = -np.inf if lowp.is_float(x.dtype) else lowp.int_range(x.dtype)[0]
    wide = x.astype(np.float64) if lowp.is_float(x.dtype) else x
    taps, inside, outs = _pool_taps(ctx, wide, fill)
    taps = np.where(inside[:, None, None], taps, fill)
    which = np.argmax(taps, axis=0)  # first tap wins ties
    y = np.take_along_axis(taps, which[None], axis=0)[0].astype(x.dtype)
    if len(ctx.node.outputs) < 2:
        return [y]
    # The flat index of the chosen tap in the input (row-major, or column-major spatially with storage_order=1).
    kernel = list(ctx.attr("kernel_shape"))
    strides, dilations = _spatial_attrs(ctx, len(kernel), kernel)
    _, begins, _ = _geometry(ctx, x.shape[2:], kernel, bool(ctx.attr("ceil_mode", 0)))
    offsets = np.array(list(itertools.product(*[range(k) for k in kernel])))  # (K, n)
    spatial = x.shape[2:]
    grids = np.meshgrid(*[np.arange(o) for o in outs], indexing="ij")
    coords = [grids[i][None, None] * strides[i] + offsets[which, i] * dilations[i] - begins[i]
              for i in range(len(kernel))]
    if ctx.attr("storage_order", 0):
        flat = sum(coords[i] * int(np.prod(spatial[:i])) for i in range(len(kernel)))
    else:
        flat = np.ravel_multi_index(tuple(coords), spatial)
    nc = np.arange(x.shape[0] * x.shape[1]).reshape(x.shape[0], x.shape[1], *[1] * len(kernel))
    return [y, (nc * int(np.prod(spatial)) + flat).astype(np.int64)]


@op("AveragePool", infer=_pool_infer)
def average_pool(ctx: OpContext) -> list[np.ndarray]:
    """Mean over each window; count_include_pad decides whether explicit padding counts in the divisor."""
    x = ctx.array(0)
    taps, inside, outs = _pool_taps(ctx, x.astype(np.float64), 0.0)
    if ctx.attr("count_include_pad", 0):
        # Padding counts, but not the extra area ceil_mode adds beyond the end padding.
        kernel = list(ctx.attr("kernel_shape"))
        strides, dilations = _spatial_attrs(ctx, len(kernel), kernel)
        _, begins, ends = _geometry(ctx, x.shape[2:], kernel, bool(ctx.attr("ceil_mode", 0)))
        padded_shape = tuple(s + b + e for s, b, e in zip(x.shape[2:], begins, ends, strict=True))
        ones = np.ones((1, 1, *padded_shape))
        _, counted = _windows(ones, kernel, strides, dilations, outs, [0] * len(kernel), 0)
        count = counted.sum(axis=0)
    else:
        count = inside.sum(axis=0)
    y = taps.sum(axis=0) / np.maximum(count, 1)
    return [y.astype(x.dtype)]


@op("LpPool", infer=_pool_infer)
def lp_pool(ctx: OpContext) -> list[np.ndarray]:
    """The p-norm of each window (padding counts as zeros)."""
    x = ctx.array(0)
    p = ctx.attr("p", 2)
    taps, _, _ = _pool_taps(ctx, x.astype(np.float64), 0.0)
    return [(np.sum(np.abs(taps) ** p, axis=0) ** (1.0 / p)).astype(x.dtype)]


def _global_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    if x.shape is None:
        return [unknown(x.dtype)]
    return [TensorInfo(x.dtype, (*x.shape[:2], *[1] * (len(x.shape) - 2)))]


def _spatial_axes(x: np.ndarray) -> tuple[int, ...]:
    return tuple(range(2, x.ndim))


@op("GlobalAveragePool", infer=_global_infer)
def global_average_pool(ctx: OpContext) -> list[np.ndarray]:
    """Mean over all spatial axes."""
    x = ctx.array(0)
    return [np.mean(x.astype(np.float64), axis=_spatial_axes(x), keepdims=True).astype(x.dtype)]


@op("GlobalMaxPool", infer=_global_infer)
def global_max_pool(ctx: OpContext) -> list[np.ndarray]:
    """Max over all spatial axes."""
    x = ctx.array(0)
    return [np.max(x, axis=_spatial_axes(x), keepdims=True)]


@op("GlobalLpPool", infer=_global_infer)
def global_lp_pool(ctx: OpContext) -> list[np.ndarray]:
    """p-norm over all spatial axes."""
    x = ctx.array(0)
    p = ctx.attr("p", 2)
    s = np.sum(np.abs(x.astype(np.float64)) ** p, axis=_spatial_axes(x), keepdims=True)
    return [(s ** (1.0 / p)).astype(x.dtype)]


# -- Normalization -------------------------------------------------------------------------------------------------
def _channel(v: np.ndarray, rank: int) -> np.ndarray:
    return v.reshape(1, -1, *[1] * (rank - 2))


def _bn_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    extra = [o for o in ctx.node.outputs[1:] if o]
    if extra and ctx.opset >= 14 and not ctx.attr("training_mode", 0):
        # ONNX: "when training_mode=False, extra outputs are invalid" (opset 14+; earlier opsets took extra outputs
        # to mean training). Refused at load rather than left unwritten.
        raise ShapeError(f"{ctx.node.label()}: BatchNormalization in inference mode (training_mode=0) declares the "
                         f"training-only outputs {extra}; ONNX defines only output 0 (Y) there",
                         hint="drop the extra outputs, or set training_mode=1 to compute batch statistics")
    c = None if x.shape is None or len(x.shape) < 2 else x.shape[1]
    stat = TensorInfo(input_info(ctx, 3).dtype if ctx.has_input(3) else x.dtype, (c,))
    return [x, stat, stat, stat, stat]


@op("BatchNormalization", infer=_bn_infer)
def batch_normalization(ctx: OpContext) -> list[np.ndarray]:
    """Normalize per channel with running statistics, or with batch statistics in training mode."""
    x, scale, bias, mean, var = map(ctx.array, range(5))
    eps = ctx.attr("epsilon", 1e-5)
    r = x.ndim
    x64 = x.astype(np.float64)
    training = bool(ctx.attr("training_mode", 0)) or (ctx.opset < 14 and len(ctx.node.outputs) > 1)
    if not training:
        y = (x64 - _channel(mean, r)) / np.sqrt(_channel(var, r).astype(np.float64) + eps)
        return [(y * _channel(scale, r) + _channel(bias, r)).astype(x.dtype)]
    axes = (0, *range(2, r))
    bmean, bvar = x64.mean(axis=axes), x64.var(axis=axes)
    y = (x64 - _channel(bmean, r)) / np.sqrt(_channel(bvar, r) + eps) * _channel(scale, r) + _channel(bias, r)
    m = ctx.attr("momentum", 0.9)
    run_mean = mean * m + bmean * (1 - m)
    run_var = var * m + bvar * (1 - m)
    sd = mean.dtype
    return [y.astype(x.dtype), run_mean.astype(sd), run_var.astype(sd), bmean.astype(sd), bvar.astype(sd)]


@op("InstanceNormalization", infer=same_as_input(0))
def instance_normalization(ctx: OpContext) -> list[np.ndarray]:
    """Normalize each (batch, channel) slice over its spatial axes, then scale and shift per channel."""
    x, scale, bias = map(ctx.array, range(3))
    x64 = x.astype(np.float64)
    axes = _spatial_axes(x)
    y = (x64 - x64.mean(axis=axes, keepdims=True)) / np.sqrt(x64.var(axis=axes, keepdims=True)
                                                             + ctx.attr("epsilon", 1e-5))
    return [(y * _channel(scale, x.ndim) + _channel(bias, x.ndim)).astype(x.dtype)]


def _ln_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    if x.shape is None:
        return [x, unknown(dtypes.float32), unknown(dtypes.float32)]
    axis = normalize_axis(ctx, ctx.attr("axis", -1), len(x.shape))
    stash = dtypes.from_onnx(ctx.attr("stash_type", 1))
    stat = TensorInfo(stash, (*x.shape[:axis], *[1] * (len(x.shape) - axis)))
    return [x, stat, stat]


@op("LayerNormalization", infer=_ln_infer)
def layer_normalization(ctx: OpContext) -> list[np.ndarray]:
    """Normalize over the axes from ``axis`` on; optional Mean and InvStdDev outputs."""
    x, scale = ctx.array(0), ctx.array(1)
    axis = normalize_axis(ctx, ctx.attr("axis", -1), x.ndim)
    axes = tuple(range(axis, x.ndim))
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(((x64 - mean) ** 2).mean(axis=axes, keepdims=True) + ctx.attr("epsilon", 1e-5))
    y = (x64 - mean) * inv * scale
    if ctx.has_input(2):
        y = y + ctx.array(2)
    stash = np.dtype(dtypes.from_onnx(ctx.attr("stash_type", 1)).np_dtype)
    return [y.astype(x.dtype), mean.astype(stash), inv.astype(stash)]


@op("GroupNormalization", infer=same_as_input(0))
def group_normalization(ctx: OpContext) -> list[np.ndarray]:
    """Normalize over groups of channels (and spatial axes); scale/bias per channel (per group before opset 21)."""
    x, scale, bias = map(ctx.array, range(3))
    g = ctx.attr("num_groups")
    n, c = x.shape[:2]
    xg = x.astype(np.float64).reshape(n, g, -1)
    mean, var = xg.mean(axis=2, keepdims=True), xg.var(axis=2, keepdims=True)
    y = ((xg - mean) / np.sqrt(var + ctx.attr("epsilon", 1e-5))).reshape(x.shape)
    if ctx.opset < 21 and scale.size == g and g != c:
        scale, bias = np.repeat(scale, c // g), np.repeat(bias, c // g)
    return [(y * _channel(scale, x.ndim) + _channel(bias, x.ndim)).astype(x.dtype)]


@op("RMSNormalization", infer=same_as_input(0))
def rms_normalization(ctx: OpContext) -> list[np.ndarray]:
    """x / sqrt(mean(x^2 over the axes from ``axis``) + epsilon) * scale."""
    x, scale = ctx.array(0), ctx.array(1)
    axis = normalize_axis(ctx, ctx.attr("axis", -1), x.ndim)
    x64 = x.astype(np.float64)
    rms = np.sqrt(np.mean(x64**2, axis=tuple(range(axis, x.ndim)), keepdims=True) + ctx.attr("epsilon", 1e-5))
    return [(x64 / rms * scale).astype(x.dtype)]


@op("LpNormalization", infer=same_as_input(0))
def lp_normalization(ctx: OpContext) -> list[np.ndarray]:
    """Divide by the L1 or L2 norm along ``axis`` (zero vectors stay zero)."""
    x = ctx.array(0)
    axis = ctx.attr("axis", -1)
    p = ctx.attr("p", 2)
    x64 = x.astype(np.float64)
    norm = np.sum(np.abs(x64), axis=axis, keepdims=True) if p == 1 else np.sqrt(np.sum(x64**2, axis=axis,
                                                                                       keepdims=True))
    with np.errstate(invalid="ignore", divide="ignore"):
        return [np.where(norm == 0, 0, x64 / norm).astype(x.dtype)]


@op("MeanVarianceNormalization", infer=same_as_input(0))
def mean_variance_normalization(ctx: OpContext) -> list[np.ndarray]:
    """(x - mean) / sqrt(var + 1e-9) over ``axes`` (default N, H, W)."""
    x = ctx.array(0)
    axes = tuple(ctx.attr("axes", [0, 2, 3]))
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes, keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=axes, keepdims=True)
    return [((x64 - mean) / np.sqrt(var + 1e-9)).astype(x.dtype)]


@op("LRN", infer=same_as_input(0))
def lrn(ctx: OpContext) -> list[np.ndarray]:
    """Local response normalization across nearby channels."""
    x = ctx.array(0)
    size = ctx.attr("size")
    alpha, beta, bias = ctx.attr("alpha", 1e-4), ctx.attr("beta", 0.75), ctx.attr("bias", 1.0)
    sq = x.astype(np.float64) ** 2
    c = x.shape[1]
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    total = np.zeros_like(sq)
    for ch in range(c):
        total[:, ch] = sq[:, max(0, ch - lo) : min(c, ch + hi + 1)].sum(axis=1)
    return [(x / (bias + alpha / size * total) ** beta).astype(x.dtype)]


# -- Softmax family ------------------------------------------------------------------------------------------------
def _softmax_axes(ctx: OpContext, x: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    """The array to reduce and its reduction axes; before opset 13 the input is coerced to 2-D at ``axis``."""
    if ctx.opset < 13:
        axis = normalize_axis(ctx, ctx.attr("axis", 1), x.ndim) if x.ndim else 0
        return x.reshape(int(np.prod(x.shape[:axis])), -1), (1,)
    return x, (normalize_axis(ctx, ctx.attr("axis", -1), x.ndim),)


def _softmax(x: np.ndarray, axes: tuple[int, ...], log: bool) -> np.ndarray:
    x64 = x.astype(np.float64)
    shifted = x64 - np.max(x64, axis=axes, keepdims=True)
    lse = np.log(np.sum(np.exp(shifted), axis=axes, keepdims=True))
    return shifted - lse if log else np.exp(shifted - lse)


@op("Softmax", infer=same_as_input(0))
def softmax(ctx: OpContext) -> list[np.ndarray]:
    """exp(x) / sum(exp(x)) along ``axis``."""
    x = ctx.array(0)
    x2, axes = _softmax_axes(ctx, x)
    return [_softmax(x2, axes, False).reshape(x.shape).astype(x.dtype)]


@op("LogSoftmax", infer=same_as_input(0))
def log_softmax(ctx: OpContext) -> list[np.ndarray]:
    """log(softmax(x)) along ``axis``, computed stably."""
    x = ctx.array(0)
    x2, axes = _softmax_axes(ctx, x)
    return [_softmax(x2, axes, True).reshape(x.shape).astype(x.dtype)]


@op("Hardmax", infer=same_as_input(0))
def hardmax(ctx: OpContext) -> list[np.ndarray]:
    """1 at the first maximum along ``axis``, 0 elsewhere."""
    x = ctx.array(0)
    x2, (axis,) = _softmax_axes(ctx, x)
    idx = np.expand_dims(np.argmax(x2, axis=axis), axis)
    out = np.zeros_like(x2)
    np.put_along_axis(out, idx, 1, axis=axis)
    return [out.reshape(x.shape)]


# -- Dropout and misc activations ----------------------------------------------------------------------------------
def _dropout_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    return [x, TensorInfo(dtypes.bool_ if ctx.opset >= 10 else x.dtype, x.shape)]


@op("Dropout", infer=_dropout_infer, nondeterministic=True)
def dropout(ctx: OpContext) -> list[np.ndarray]:
    """Identity with an all-true mask at inference; in training mode, zero with probability ratio and rescale."""
    x = ctx.array(0)
    if ctx.opset >= 12:
        ratio = float(ctx.array(1)) if ctx.has_input(1) else 0.5
        training = bool(ctx.array(2)) if ctx.has_input(2) else False
    else:
        ratio, training = ctx.attr("ratio", 0.5), False
    mask_dtype = bool if ctx.opset >= 10 else x.dtype
    if not training or ratio == 0:
        return [x.copy(), np.ones(x.shape, dtype=mask_dtype)]
    seed = ctx.attr("seed", None)
    keep = np.random.default_rng(seed).uniform(size=x.shape) >= ratio
    return [(x * keep / (1 - ratio)).astype(x.dtype), keep.astype(mask_dtype)]


@op("Shrink", infer=same_as_input(0))
def shrink(ctx: OpContext) -> list[np.ndarray]:
    """x - bias above lambd, x + bias below -lambd, 0 in between."""
    x = ctx.array(0)
    lambd, bias = ctx.attr("lambd", 0.5), ctx.attr("bias", 0.0)
    return [np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0)).astype(x.dtype)]


@op("Swish", infer=same_as_input(0))
def swish(ctx: OpContext) -> list[np.ndarray]:
    """x * sigmoid(alpha * x)."""
    x = ctx.array(0)
    x64 = x.astype(np.float64)
    return [(x64 / (1 + np.exp(-ctx.attr("alpha", 1.0) * x64))).astype(x.dtype)]


# -- Einsum / Det --------------------------------------------------------------------------------------------------
def _einsum_terms(equation: str, ranks: list[int | None]) -> tuple[list[str], str]:
    """Input terms and the output term with '...' spelled as upper-case placeholder letters."""
    equation = equation.replace(" ", "")
    lhs, _, rhs = equation.partition("->")
    terms = lhs.split(",")
    ell_rank = 0
    for term, rank in zip(terms, ranks, strict=True):
        if "..." in term and rank is not None:
            ell_rank = max(ell_rank, rank - (len(term) - 3))
    ell = "".join(chr(ord("A") + i) for i in range(ell_rank))
    expanded = []
    for term, rank in zip(terms, ranks, strict=True):
        if "..." in term:
            n = (rank or 0) - (len(term) - 3)
            term = term.replace("...", ell[ell_rank - n :] if n else "")
        expanded.append(term)
    if "->" in equation:
        out = rhs.replace("...", ell)
    else:
        letters = "".join(expanded)
        out = ell + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c.islower()))
    return expanded, out


def _einsum_infer(ctx: OpContext) -> list[TensorInfo]:
    infos = [input_info(ctx, i) for i in range(len(ctx.inputs))]
    shapes = [i.shape for i in infos if i.shape is not None]
    if len(shapes) < len(infos):
        return [unknown(infos[0].dtype)]
    terms, out = _einsum_terms(ctx.attr("equation"), [len(s) for s in shapes])
    sizes: dict[str, Dim] = {}
    for term, shape in zip(terms, shapes, strict=True):
        for letter, d in zip(term, shape, strict=True):
            if d != 1 or letter not in sizes:
                sizes[letter] = d if sizes.get(letter) in (None, 1) else sizes[letter]
    return [TensorInfo(infos[0].dtype, tuple(sizes[c] for c in out))]


@op("Einsum", infer=_einsum_infer)
def einsum(ctx: OpContext) -> list[np.ndarray]:
    """Einstein summation over the inputs, as the equation says."""
    values = [ctx.array(i) for i in range(len(ctx.values))]
    terms, out = _einsum_terms(ctx.attr("equation"), [v.ndim for v in values])
    acc = _acc_dtype(values[0])
    result = np.einsum(f"{','.join(terms)}->{out}", *[v.astype(acc) for v in values], optimize=True)
    return [np.asarray(result).astype(values[0].dtype)]


def _det_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    return [TensorInfo(x.dtype, None if x.shape is None else x.shape[:-2])]


@op("Det", infer=_det_infer)
def det(ctx: OpContext) -> list[np.ndarray]:
    """Determinant of the square matrices in the last two axes."""
    x = ctx.array(0)
    return [np.asarray(np.linalg.det(x.astype(np.float64))).astype(x.dtype)]

