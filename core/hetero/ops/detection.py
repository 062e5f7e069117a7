"""Object-detection ops: NonMaxSuppression, RoiAlign, MaxRoiPool."""

from __future__ import annotations

import math

import numpy as np

from ..contract import dtypes
from ..contract.registry import OpContext, op
from ..contract.tensor import TensorInfo
from .shapes import input_info, shape_of


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _scalar(ctx: OpContext, index: int, default: float) -> float:
    if not ctx.has_input(index):
        return default
    value = np.asarray(ctx.array(index)).reshape(-1)
    return float(value[0]) if value.size else default


# -- NonMaxSuppression -----------------------------------------------------------------------------------------------
def _corners(boxes: np.ndarray, center_point: bool) -> np.ndarray:
    """Boxes as (y_min, x_min, y_max, x_max) in float64."""
    b = boxes.astype(np.float64)
    if center_point:  # [x_center, y_center, width, height]
        xc, yc, w, h = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
        return np.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], axis=-1)
    # [y1, x1, y2, x2] with any diagonal pair of corners.
    return np.stack([np.minimum(b[..., 0], b[..., 2]), np.minimum(b[..., 1], b[..., 3]),
                     np.maximum(b[..., 0], b[..., 2]), np.maximum(b[..., 1], b[..., 3])], axis=-1)


def _iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    h = np.clip(np.minimum(box[2], others[:, 2]) - np.maximum(box[0], others[:, 0]), 0, None)
    w = np.clip(np.minimum(box[3], others[:, 3]) - np.maximum(box[1], others[:, 1]), 0, None)
    inter = h * w
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
    union = area + areas - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def _nms_infer(ctx: OpContext) -> list[TensorInfo]:
    if any(ctx.has_input(i) and ctx.value(i) is None for i in range(5)):
        return [TensorInfo(dtypes.int64, (None, 3))]
    return [TensorInfo(dtypes.int64, non_max_suppression(ctx)[0].shape)]  # data-dependent: exact once values are known


@op("NonMaxSuppression", infer=_nms_infer, data_dependent=True)
def non_max_suppression(ctx: OpContext) -> list[np.ndarray]:
    """Greedy NMS per batch and class: visit boxes by descending score (ties: lower index first), drop those under
    score_threshold, keep a box unless its IoU with an already kept one is strictly greater than iou_threshold, stop
    at max_output_boxes_per_class (0 or absent: no output). Rows are [batch, class, box], by batch, class, then
    selection order."""
    boxes, scores = ctx.array(0), ctx.array(1)
    limit = int(_scalar(ctx, 2, 0))
    iou_threshold = _scalar(ctx, 3, 0.0)
    score_threshold = _scalar(ctx, 4, -math.inf) if ctx.has_input(4) else None
    corners = _corners(boxes, bool(ctx.attr("center_point_box", 0)))
    selected: list[tuple[int, int, int]] = []
    if limit > 0:
        for b in range(scores.shape[0]):
            for c in range(scores.shape[1]):
                s = scores[b, c].astype(np.float64)
                order = np.argsort(-s, kind="stable")
                if score_threshold is not None:
                    order = order[s[order] >= score_threshold]  # "less than score_threshold are removed"
                kept: list[int] = []
                for i in order:
                    if len(kept) >= limit:
                        break
                    if kept and np.any(_iou(corners[b, i], corners[b, kept]) > iou_threshold):
                        continue
                    kept.append(int(i))
                selected += [(b, c, i) for i in kept]
    return [np.array(selected, dtype=np.int64).reshape(-1, 3)]


# -- RoiAlign --------------------------------------------------------------------------------------------------------
def _roi_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    rois = shape_of(ctx, 1)
    channels = None if x.shape is None else x.shape[1]
    n = None if rois is None else rois[0]
    return [TensorInfo(x.dtype, (n, channels, int(ctx.attr("output_height", 1)), int(ctx.attr("output_width", 1))))]


def _bilinear_taps(pos: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For sample coordinates along one axis: (low index, high index, low weight, high weight), zero weights for
    samples more than one pixel outside the map; samples in [-1, 0) read the first pixel."""
    outside = (pos < -1.0) | (pos > size)
    p = np.clip(pos, 0, None)
    low = np.floor(p).astype(np.int64)
    at_end = low >= size - 1
    low = np.where(at_end, size - 1, low)
    high = np.where(at_end, size - 1, low + 1)
    p = np.where(at_end, low, p)
    frac = p - low
    w_low, w_high = 1 - frac, frac
    return low, high, np.where(outside, 0.0, w_low), np.where(outside, 0.0, w_high)


@op("RoiAlign", infer=_roi_infer)
def roi_align(ctx: OpContext) -> list[np.ndarray]:
    """RoI Align: each output bin averages (or takes the max of) bilinear samples on a regular grid inside the bin.

    RoI corners are scaled by spatial_scale and, with coordinate_transformation_mode='half_pixel', shifted by -0.5;
    in 'output_half_pixel' mode RoIs are at least 1x1. The grid has sampling_ratio points per bin side, or
    ceil(roi_size / output_size) when sampling_ratio is 0.
    """
    x, rois, batch_idx = ctx.array(0), ctx.array(1).astype(np.float64), ctx.array(2).astype(np.int64)
    out_h, out_w = int(ctx.attr("output_height", 1)), int(ctx.attr("output_width", 1))
    scale = float(ctx.attr("spatial_scale", 1.0))
    ratio = int(ctx.attr("sampling_ratio", 0))
    half_pixel = _text(ctx.attr("coordinate_transformation_mode", "half_pixel")) == "half_pixel"
    use_max = _text(ctx.attr("mode", "avg")) == "max"
    height, width = x.shape[2], x.shape[3]
    xf = x.astype(np.float64)
    out = np.zeros((rois.shape[0], x.shape[1], out_h, out_w))
    offset = 0.5 if half_pixel else 0.0
    for r, (x1, y1, x2, y2) in enumerate(rois):
        x1, y1, x2, y2 = x1 * scale - offset, y1 * scale - offset, x2 * scale - offset, y2 * scale - offset
        roi_w, roi_h = x2 - x1, y2 - y1
        if not half_pixel:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / out_h, roi_w / out_w
        grid_h = ratio if ratio > 0 else math.ceil(roi_h / out_h)
        grid_w = ratio if ratio > 0 else math.ceil(roi_w / out_w)
        count = max(grid_h * grid_w, 1)
        # Sample coordinates: (out_h, grid_h) and (out_w, grid_w).
        ys = y1 + np.arange(out_h)[:, None] * bin_h + (np.arange(grid_h)[None, :] + 0.5) * bin_h / max(grid_h, 1)
        xs = x1 + np.arange(out_w)[:, None] * bin_w + (np.arange(grid_w)[None, :] + 0.5) * bin_w / max(grid_w, 1)
        yl, yh, wyl, wyh = _bilinear_taps(ys, height)
        xl, xh, wxl, wxh = _bilinear_taps(xs, width)
        img = xf[batch_idx[r]]  # (C, H, W)

        def tap(yi: np.ndarray, xi: np.ndarray, img: np.ndarray = img) -> np.ndarray:
            # -> (C, out_h, grid_h, out_w, grid_w)
            return img[:, yi[:, :, None, None], xi[None, None, :, :]]

        corners = [
            (wyl[:, :, None, None] * wxl[None, None], tap(yl, xl)),
            (wyl[:, :, None, None] * wxh[None, None], tap(yl, xh)),
            (wyh[:, :, None, None] * wxl[None, None], tap(yh, xl)),
            (wyh[:, :, None, None] * wxh[None, None], tap(yh, xh)),
        ]
        if use_max:
            # Max mode takes the largest weighted corner contribution over all samples of the bin.
            terms = np.stack([w * v for w, v in corners])  # (4, C, out_h, grid_h, out_w, grid_w)
            out[r] = terms.max(axis=(0, 3, 5)) if grid_h * grid_w else 0.0
        else:
            samples = sum(w * v for w, v in corners)
            out[r] = samples.sum(axis=(2, 4)) / count
    return [out.astype(x.dtype)]


# -- MaxRoiPool ------------------------------------------------------------------------------------------------------
def _max_roi_pool_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    rois = shape_of(ctx, 1)
    ph, pw = (int(v) for v in ctx.attr("pooled_shape"))
    return [TensorInfo(x.dtype, (None if rois is None else rois[0], None if x.shape is None else x.shape[1], ph, pw))]


@op("MaxRoiPool", infer=_max_roi_pool_infer)
def max_roi_pool(ctx: OpContext) -> list[np.ndarray]:
    """Max pooling over each RoI [batch, x1, y1, x2, y2] (corners scaled by spatial_scale and rounded, inclusive),
    split into pooled_shape bins of floor/ceil integer bounds; empty bins give 0."""
    x, rois = ctx.array(0), ctx.array(1).astype(np.float64)
    ph, pw = (int(v) for v in ctx.attr("pooled_shape"))
    scale = float(ctx.attr("spatial_scale", 1.0))
    height, width = x.shape[2], x.shape[3]
    out = np.zeros((rois.shape[0], x.shape[1], ph, pw), dtype=x.dtype)
    for r, roi in enumerate(rois):
        b = int(roi[0])
        x1, y1, x2, y2 = (int(np.round(v * scale)) for v in roi[1:])
        roi_h, roi_w = max(y2 - y1 + 1, 1), max(x2 - x1 + 1, 1)
        for i in range(ph):
            h0 = min(max(math.floor(i * roi_h / ph) + y1, 0), height)
            h1 = min(max(math.ceil((i + 1) * roi_h / ph) + y1, 0), height)
            for j in range(pw):
                w0 = min(max(math.floor(j * roi_w / pw) + x1, 0), width)
                w1 = min(max(math.ceil((j + 1) * roi_w / pw) + x1, 0), width)
                if h1 > h0 and w1 > w0:
                    out[r, :, i, j] = x[b, :, h0:h1, w0:w1].max(axis=(1, 2))
    return [out]
