"""Resize and Upsample: nearest / linear / cubic interpolation, separable over the resized axes.

Each resized axis gets an (out, in) interpolation matrix built from the coordinate transform and the kernel; the
result is these matrices applied one axis after the other. Antialiasing stretches the kernel by max(1, 1/scale).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..contract.opforms import nearest_indices, source_coords
from ..contract.registry import OpContext, op
from ..contract.tensor import Dim, Shape, TensorInfo
from .shapes import input_info, normalize_axis, static_dims, unknown


class _Plan:
    """What the inputs decide: the resized axes with their output size, scale and roi."""

    def __init__(self, axes: list[int], sizes: Sequence[Dim], scales: Sequence[float | None], roi: np.ndarray | None,
                 from_scales: bool) -> None:
        self.axes, self.sizes, self.scales, self.roi, self.from_scales = axes, sizes, scales, roi, from_scales


def _inputs(ctx: OpContext) -> tuple[int | None, int | None, int | None]:
    """Input indices of (roi, scales, sizes) for this op and opset."""
    if ctx.node.op_type == "Upsample":
        return None, (1 if ctx.opset >= 9 else None), None
    if ctx.opset < 11:
        return None, 1, None
    return 1, 2, 3


def _present(ctx: OpContext, index: int | None) -> int | None:
    """``index`` if that input is given and not empty, else None."""
    if index is None or not ctx.has_input(index):
        return None
    info = ctx.inputs[index]
    return None if info is not None and info.shape is not None and 0 in info.shape else index


def _plan(ctx: OpContext, shape: Shape) -> _Plan | None:
    rank = len(shape)
    roi_i, scales_i, sizes_i = _inputs(ctx)
    axes = [normalize_axis(ctx, a, rank) for a in ctx.attr("axes", None) or range(rank)]
    dims = [shape[a] for a in axes]
    roi = None
    if (roi_i := _present(ctx, roi_i)) is not None:
        roi = ctx.value(roi_i)
        if roi is None and ctx.attr("coordinate_transformation_mode", "") == "tf_crop_and_resize":
            return None
    if (sizes_i := _present(ctx, sizes_i)) is not None:
        value = ctx.value(sizes_i)
        if value is None:
            return None
        sizes = [int(v) for v in np.asarray(value).reshape(-1)]
        policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
        if policy == "stretch":
            return _Plan(axes, sizes, [None if d is None else s / d for d, s in zip(dims, sizes, strict=True)], roi,
                         False)
        known = [d for d in dims if d is not None]
        if len(known) < len(dims):
            return _Plan(axes, [None] * len(axes), [None] * len(axes), roi, False)
        ratios = [s / d for d, s in zip(known, sizes, strict=True)]
        scale = min(ratios) if policy == "not_larger" else max(ratios)
        out = [math.floor(scale * d + 0.5) for d in known]
        return _Plan(axes, out, [scale] * len(axes), roi, False)
    if scales_i is None:
        scales = [float(s) for s in ctx.attr("scales")]
    else:
        value = ctx.value(scales_i)
        if value is None:
            return None
        scales = [float(s) for s in np.asarray(value).reshape(-1)]
    if len(scales) != len(axes):
        raise ctx.fail(f"{len(scales)} scales for {len(axes)} axes")
    out_sizes: list[Dim] = []
    for i, d in enumerate(dims):
        if d is None:
            out_sizes.append(None)
            continue
        extent = 1.0
        if roi is not None and ctx.attr("coordinate_transformation_mode", "") == "tf_crop_and_resize":
            r = np.asarray(roi, dtype=np.float64).reshape(-1)
            extent = r[len(axes) + i] - r[i]
        out_sizes.append(math.floor(d * extent * scales[i] + 1e-9))
    return _Plan(axes, out_sizes, scales, roi, True)


def _resize_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    if x.shape is None:
        return [unknown(x.dtype)]
    plan = _plan(ctx, x.shape)
    if plan is None:
        return [unknown(x.dtype, len(x.shape))]
    out = list(x.shape)
    for a, s in zip(plan.axes, plan.sizes, strict=True):
        out[a] = s
    return [TensorInfo(x.dtype, tuple(out))]


def _coordinate_mode(ctx: OpContext) -> str:
    if ctx.node.op_type == "Upsample":
        return "asymmetric"
    return ctx.attr("coordinate_transformation_mode", "half_pixel" if ctx.opset >= 11 else "asymmetric")


def _nearest_mode(ctx: OpContext) -> str:
    if ctx.node.op_type == "Upsample" or ctx.opset < 11:
        return "floor"
    return ctx.attr("nearest_mode", "round_prefer_floor")


def _cubic(t: np.ndarray, a: float) -> np.ndarray:
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _matrix(ctx: OpContext, n_in: int, n_out: int, scale: float, roi: tuple[float, float] | None,
            from_scales: bool) -> tuple[np.ndarray, np.ndarray]:
    """The (out, in) interpolation matrix of one axis and the mask of outputs that fall outside (extrapolated)."""
    try:
        coords = source_coords(_coordinate_mode(ctx), n_in, n_out, scale, roi, from_scales)
    except ValueError as exc:
        raise ctx.fail(str(exc)) from exc
    outside = (coords < 0) | (coords > n_in - 1)
    mode = ctx.attr("mode", "nearest")
    w = np.zeros((n_out, n_in))
    if mode == "nearest":
        try:
            idx = nearest_indices(_nearest_mode(ctx), coords, n_in)
        except ValueError as exc:
            raise ctx.fail(str(exc)) from exc
        w[np.arange(n_out), idx] = 1.0
        return w, outside
    if mode not in ("linear", "bilinear", "trilinear", "cubic", "bicubic", "tricubic"):
        raise ctx.fail(f"unknown resize mode {mode!r}")
    cubic = mode in ("cubic", "bicubic", "tricubic")
    a = ctx.attr("cubic_coeff_a", -0.75)
    stretch = max(1.0, 1.0 / scale) if ctx.attr("antialias", 0) and scale < 1 else 1.0
    radius = (2 if cubic else 1) * stretch
    exclude = bool(ctx.attr("exclude_outside", 0))
    for o, x in enumerate(coords):
        if ctx.attr("coordinate_transformation_mode", "") != "tf_crop_and_resize" and not cubic and stretch == 1.0:
            x = min(max(x, 0.0), n_in - 1.0)  # linear clamps the source coordinate
        taps = np.arange(math.floor(x - radius) + 1, math.floor(x + radius) + 1)
        t = (x - taps) / stretch
        weights = _cubic(t, a) if cubic else np.maximum(0.0, 1 - np.abs(t))
        if exclude:
            weights = np.where((taps >= 0) & (taps < n_in), weights, 0.0)
        total = weights.sum()
        if stretch != 1.0 or exclude:
            weights = weights / total if total else weights
        np.add.at(w[o], np.clip(taps, 0, n_in - 1), weights)
    return w, outside


@op("Resize", infer=_resize_infer, value_inputs=(1, 2, 3))
def resize(ctx: OpContext) -> list[np.ndarray]:
    """Resize with nearest / linear / cubic interpolation, per the coordinate transformation mode."""
    x = ctx.array(0)
    plan = _plan(ctx, x.shape)
    assert plan is not None
    y = x.astype(np.float64)
    rank = x.ndim
    roi = None if plan.roi is None else np.asarray(plan.roi, dtype=np.float64).reshape(-1)
    outside_any = np.zeros((), dtype=bool)
    for i, (a, n_out, scale) in enumerate(zip(plan.axes, static_dims(ctx, plan.sizes), plan.scales, strict=True)):
        if scale is None:
            raise ctx.fail(f"the scale of axis {a} is not known")
        n_in = x.shape[a]
        if roi is not None and roi.size == 2 * len(plan.axes):
            r = (float(roi[i]), float(roi[len(plan.axes) + i]))
        elif roi is not None and roi.size == 2 * rank:
            r = (float(roi[a]), float(roi[rank + a]))
        else:
            r = None
        if n_out == n_in and scale == 1.0 and ctx.attr("coordinate_transformation_mode", "") != "tf_crop_and_resize":
            continue
        w, outside = _matrix(ctx, n_in, n_out, scale, r, plan.from_scales)
        y = np.moveaxis(np.tensordot(w, y, axes=([1], [a])), 0, a)
        shape = [1] * rank
        shape[a] = n_out
        outside_any = outside_any | outside.reshape(shape)
    if ctx.attr("coordinate_transformation_mode", "") == "tf_crop_and_resize":
        y = np.where(outside_any, ctx.attr("extrapolation_value", 0.0), y)
    if x.dtype.kind in "iu":
        y = np.clip(np.round(y), np.iinfo(x.dtype).min, np.iinfo(x.dtype).max)
    return [y.astype(x.dtype)]


@op("Upsample", infer=_resize_infer, value_inputs=(1,))
def upsample(ctx: OpContext) -> list[np.ndarray]:
    """The deprecated Resize: scales only, asymmetric coordinates, floor for nearest."""
    return resize(ctx)
