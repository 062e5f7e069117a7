"""Spatial resampling and rearrangement: GridSample, AffineGrid, Col2Im, MaxUnpool."""

from __future__ import annotations

import itertools

import numpy as np

from ..contract.registry import OpContext, op
from ..contract.tensor import Dim, TensorInfo
from .shapes import input_info, int_list, shape_of, static_dims, unknown


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- GridSample ------------------------------------------------------------------------------------------------------
def _grid_sample_infer(ctx: OpContext) -> list[TensorInfo]:
    x, grid = input_info(ctx, 0), input_info(ctx, 1)
    if x.shape is None or grid.shape is None:
        return [unknown(x.dtype, None if x.shape is None else len(x.shape))]
    if len(grid.shape) != len(x.shape) or grid.shape[-1] not in (len(x.shape) - 2, None):
        raise ctx.fail(f"grid shape {list(grid.shape)} does not fit input rank {len(x.shape)}")
    mode = _text(ctx.attr("mode", "linear"))
    if mode not in ("linear", "bilinear", "nearest", "cubic", "bicubic"):
        raise ctx.fail(f"mode {mode!r} is not one of linear, nearest, cubic")
    padding = _text(ctx.attr("padding_mode", "zeros"))
    if padding not in ("zeros", "border", "reflection"):
        raise ctx.fail(f"padding_mode {padding!r} is not one of zeros, border, reflection")
    return [TensorInfo(x.dtype, (x.shape[0], x.shape[1], *grid.shape[1:-1]))]


def _reflect(pos: np.ndarray, size: int, align_corners: bool) -> np.ndarray:
    """Fold coordinates back into the image by mirroring at its edges (pixel centers when align_corners, else the
    outer pixel edges), as many times as needed, then clip to the valid index range."""
    lo, hi = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
    span = hi - lo
    if span <= 0:
        return np.zeros_like(pos)
    dist = np.abs(pos - lo)
    flips = np.floor(dist / span)
    extra = dist - flips * span
    folded = np.where(flips % 2 == 0, lo + extra, hi - extra)
    return np.clip(folded, 0, size - 1)


def _cubic_weights(t: np.ndarray, a: float = -0.75) -> list[np.ndarray]:
    """Keys cubic convolution weights (a = -0.75) of the taps at offsets -1, 0, 1, 2 from floor(pos)."""

    def near(d: np.ndarray) -> np.ndarray:  # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d: np.ndarray) -> np.ndarray:  # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


@op("GridSample", infer=_grid_sample_infer)
def grid_sample(ctx: OpContext) -> list[np.ndarray]:
    """Sample X at the normalized positions of ``grid`` (N-D): linear / nearest (ties to even) / cubic
    interpolation, zeros / border / reflection padding, with align_corners choosing whether -1 and 1 are the corner
    pixels' centers or their outer edges. grid's last axis lists coordinates innermost dimension first."""
    x, grid = ctx.array(0), ctx.array(1).astype(np.float64)
    mode = _text(ctx.attr("mode", "linear")).replace("bilinear", "linear").replace("bicubic", "cubic")
    padding = _text(ctx.attr("padding_mode", "zeros"))
    align = bool(ctx.attr("align_corners", 0))
    sizes = x.shape[2:]
    r = len(sizes)
    xf = x.astype(np.float64)
    n_batch, channels = x.shape[:2]
    out = np.zeros((n_batch, channels, *grid.shape[1:-1]))
    for n in range(n_batch):
        taps_per_dim = []  # per spatial dim: list of (index array, weight array)
        for d, size in enumerate(sizes):
            g = grid[n, ..., r - 1 - d]
            pos = (g + 1) / 2 * (size - 1) if align else ((g + 1) * size - 1) / 2
            if padding == "border":
                pos = np.clip(pos, 0, size - 1)
            elif padding == "reflection":
                pos = _reflect(pos, size, align)
            if mode == "nearest":
                taps_per_dim.append([(np.rint(pos), np.ones_like(pos))])
                continue
            base = np.floor(pos)
            t = pos - base
            if mode == "linear":
                taps_per_dim.append([(base, 1 - t), (base + 1, t)])
            else:
                weights = _cubic_weights(t)
                taps_per_dim.append([(base + o - 1, w) for o, w in enumerate(weights)])
        for combo in itertools.product(*taps_per_dim):
            weight = np.ones(grid.shape[1:-1])
            inside = np.ones(grid.shape[1:-1], dtype=bool)
            index = []
            for d, (idx, w) in enumerate(combo):
                size = sizes[d]
                weight = weight * w
                inside &= (idx >= 0) & (idx <= size - 1)
                if padding == "reflection":
                    idx = _reflect(idx, size, align)
                idx = np.clip(idx, 0, size - 1)  # border (and, masked below, zeros) reads the nearest edge pixel
                index.append(idx.astype(np.int64))
            gather = (slice(None), *index)  # a name: mypy misreads a starred tuple inside [] as 3.11 syntax
            values = xf[n][gather]  # (C, *out_spatial)
            if padding == "zeros":
                values = np.where(inside, values, 0.0)
            out[n] += weight * values
    return [out.astype(x.dtype)]


# -- AffineGrid ------------------------------------------------------------------------------------------------------
def _affine_grid_infer(ctx: OpContext) -> list[TensorInfo]:
    theta = input_info(ctx, 0)
    size = ctx.value(1)
    if size is None:
        n = shape_of(ctx, 1)
        rank = None if n is None or n[0] is None else n[0] - 1
        return [unknown(theta.dtype, rank)]
    dims = int_list(size) or []
    if len(dims) not in (4, 5):
        raise ctx.fail(f"size must be (N, C, H, W) or (N, C, D, H, W), got {dims}")
    return [TensorInfo(theta.dtype, (dims[0], *dims[2:], len(dims) - 2))]


@op("AffineGrid", infer=_affine_grid_infer, value_inputs=(1,))
def affine_grid(ctx: OpContext) -> list[np.ndarray]:
    """The sampling grid theta @ (x, y[, z], 1) over evenly spaced normalized positions of the output size
    (coordinates listed innermost dimension first, like GridSample's grid)."""
    theta = ctx.array(0)
    dims = int_list(ctx.array(1)) or []
    spatial = dims[2:]
    align = bool(ctx.attr("align_corners", 0))

    def axis(n: int) -> np.ndarray:
        if align:
            return np.linspace(-1, 1, n) if n > 1 else np.zeros(n)
        return (2 * np.arange(n) + 1) / n - 1

    mesh = np.meshgrid(*[axis(n) for n in spatial], indexing="ij")  # outermost first
    base = np.stack([*mesh[::-1], np.ones(spatial)], axis=-1)  # (..., r + 1), innermost coordinate first
    out = np.einsum("...k,nrk->n...r", base, theta.astype(np.float64))
    return [out.astype(theta.dtype)]


# -- Col2Im ----------------------------------------------------------------------------------------------------------
def _col2im_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    image, block = ctx.value(1), ctx.value(2)
    if image is None or block is None or x.shape is None:
        n = shape_of(ctx, 1)
        rank = None if n is None or n[0] is None else n[0] + 2
        return [unknown(x.dtype, rank)]
    image_dims, block_dims = int_list(image) or [], int_list(block) or []
    cols = x.shape[1]
    channels = None if cols is None else cols // int(np.prod(block_dims))
    return [TensorInfo(x.dtype, (x.shape[0], channels, *image_dims))]


@op("Col2Im", infer=_col2im_infer, value_inputs=(1, 2))
def col2im(ctx: OpContext) -> list[np.ndarray]:
    """Sum column blocks (N, C * prod(block), L) back into an image (N, C, *image_shape): the inverse layout of
    im2col with strides, dilations and pads; overlapping entries add up."""
    x = ctx.array(0)
    image, block = int_list(ctx.array(1)) or [], int_list(ctx.array(2)) or []
    r = len(image)
    strides = list(ctx.attr("strides", [1] * r))
    dilations = list(ctx.attr("dilations", [1] * r))
    pads = list(ctx.attr("pads", [0] * (2 * r)))
    padded = [image[i] + pads[i] + pads[i + r] for i in range(r)]
    counts = [(padded[i] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(r)]
    n, c = x.shape[0], x.shape[1] // int(np.prod(block))
    if int(np.prod(counts)) != x.shape[2]:
        raise ctx.fail(f"input has {x.shape[2]} blocks, the geometry gives {int(np.prod(counts))}")
    cols = x.astype(np.float64).reshape(n, c, *block, *counts)
    out = np.zeros((n, c, *padded))
    for offs in itertools.product(*[range(b) for b in block]):
        where = tuple(
            slice(offs[i] * dilations[i], offs[i] * dilations[i] + strides[i] * (counts[i] - 1) + 1, strides[i])
            for i in range(r)
        )
        window = (slice(None), slice(None), *where)
        tap: tuple[slice | int, ...] = (slice(None), slice(None), *offs)
        out[window] += cols[tap]
    crop = tuple(slice(pads[i], pads[i] + image[i]) for i in range(r))
    inside = (slice(None), slice(None), *crop)
    return [out[inside].astype(x.dtype)]


# -- MaxUnpool -------------------------------------------------------------------------------------------------------
def _unpool_shape(ctx: OpContext, in_shape: tuple[Dim, ...]) -> tuple[Dim, ...]:
    kernel = list(ctx.attr("kernel_shape"))
    r = len(kernel)
    strides = list(ctx.attr("strides", [1] * r))
    pads = list(ctx.attr("pads", [0] * (2 * r)))
    spatial = [
        None if d is None else (d - 1) * strides[i] + kernel[i] - pads[i] - pads[i + r]
        for i, d in enumerate(in_shape[2:])
    ]
    return (in_shape[0], in_shape[1], *spatial)


def _max_unpool_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    if ctx.has_input(2):
        shape = ctx.value(2)
        if shape is None:
            return [unknown(x.dtype, None if x.shape is None else len(x.shape))]
        return [TensorInfo(x.dtype, tuple(int_list(shape) or []))]
    if x.shape is None:
        return [unknown(x.dtype)]
    return [TensorInfo(x.dtype, _unpool_shape(ctx, x.shape))]


@op("MaxUnpool", infer=_max_unpool_infer, value_inputs=(2,))
def max_unpool(ctx: OpContext) -> list[np.ndarray]:
    """Scatter X into zeros at the flat indices I (MaxPool's second output).

    The indices address the shape that kernel_shape / strides / pads give; an explicit output_shape (which makes the
    pads moot) then extends that result with zeros at the end of each axis (or cuts it there).
    """
    x, indices = ctx.array(0), ctx.array(1)
    natural = static_dims(ctx, _unpool_shape(ctx, x.shape))
    out: np.ndarray = np.zeros(int(np.prod(natural)), dtype=x.dtype)
    out[indices.reshape(-1).astype(np.int64)] = x.reshape(-1)
    out = out.reshape(natural)
    if ctx.has_input(2):
        shape = int_list(ctx.array(2)) or []
        out = out[tuple(slice(0, d) for d in shape)]
        out = np.pad(out, [(0, d - have) for d, have in zip(shape, out.shape, strict=True)])
    return [out]
