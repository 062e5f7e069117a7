"""Shape and layout ops: reshaping, joining and splitting, slicing, padding, and shape queries."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Literal

import numpy as np

from ..contract import dtypes
from ..contract.opforms import shape_range
from ..contract.registry import OpContext, op
from ..contract.tensor import Dim, Shape, TensorInfo
from .shapes import (
    UNKNOWN_VALUE,
    attr_or_input,
    broadcast_shapes,
    input_info,
    int_list,
    normalize_axis,
    numel,
    same_as_input,
    shape_of,
    static_dims,
    unknown,
)


def _prod(dims: tuple[Dim, ...] | list[Dim]) -> int | None:
    if any(d is None for d in dims):
        return None
    return numel([d for d in dims if d is not None])


# -- Reshape / Flatten / Squeeze / Unsqueeze / Transpose -----------------------------------------------------------
def _reshape_target(ctx: OpContext, in_shape: Shape | None, target: list[int]) -> Shape:
    allowzero = bool(ctx.attr("allowzero", 0))
    out: list[Dim] = []
    for i, d in enumerate(target):
        if d == 0 and not allowzero:
            if in_shape is None or i >= len(in_shape):
                out.append(None)
            else:
                out.append(in_shape[i])
        else:
            out.append(d)
    if out.count(-1) > 1:
        raise ctx.fail(f"shape {target} has more than one -1")
    if -1 in out:
        known = _prod([d for d in out if d != -1])
        total = None if in_shape is None else _prod(in_shape)
        pos = out.index(-1)
        if known is None or total is None:
            out[pos] = None
        elif known == 0:
            out[pos] = 0
        else:
            if total % known:
                raise ctx.fail(f"cannot reshape {list(in_shape or ())} to {target}")
            out[pos] = total // known
    elif in_shape is not None:
        total, wanted = _prod(in_shape), _prod(out)
        if total is not None and wanted is not None and total != wanted:
            raise ctx.fail(f"cannot reshape {list(in_shape)} ({total} elements) to {target}")
    return tuple(out)


def _reshape_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    target = ctx.value(1)
    if target is None:
        n = shape_of(ctx, 1)
        return [unknown(x.dtype, None if n is None or n[0] is None else n[0])]
    return [TensorInfo(x.dtype, _reshape_target(ctx, x.shape, int_list(target) or []))]


@op("Reshape", infer=_reshape_infer, value_inputs=(1,))
def reshape(ctx: OpContext) -> list[np.ndarray]:
    """Reshape to the shape input (0 copies the input dim unless allowzero, -1 is inferred)."""
    x = ctx.array(0)
    shape = _reshape_target(ctx, x.shape, int_list(ctx.array(1)) or [])
    return [x.reshape(shape)]


def _flatten_shape(ctx: OpContext, shape: Shape | None) -> Shape:
    if shape is None:
        return (None, None)
    axis = ctx.attr("axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis <= len(shape):
        raise ctx.fail(f"axis {ctx.attr('axis', 1)} is out of range for rank {len(shape)}")
    return (_prod(shape[:axis]), _prod(shape[axis:]))


@op("Flatten", infer=lambda ctx: [TensorInfo(input_info(ctx, 0).dtype, _flatten_shape(ctx, shape_of(ctx, 0)))])
def flatten(ctx: OpContext) -> list[np.ndarray]:
    """Flatten to 2-D: dims before ``axis`` form the rows, the rest the columns."""
    x = ctx.array(0)
    return [x.reshape(_flatten_shape(ctx, x.shape))]


def _squeeze_shape(ctx: OpContext, shape: Shape | None) -> Shape | None:
    axes = attr_or_input(ctx, "axes", 1)
    if shape is None or axes is UNKNOWN_VALUE:
        return None
    if axes is None or axes == []:
        if any(d is None for d in shape):
            return None
        return tuple(d for d in shape if d != 1)
    drop = {normalize_axis(ctx, a, len(shape)) for a in axes}
    for a in drop:
        if shape[a] not in (1, None):
            raise ctx.fail(f"cannot squeeze axis {a} of size {shape[a]}")
    return tuple(d for i, d in enumerate(shape) if i not in drop)


@op("Squeeze", infer=lambda ctx: [TensorInfo(input_info(ctx, 0).dtype, _squeeze_shape(ctx, shape_of(ctx, 0)))],
    value_inputs=(1,))
def squeeze(ctx: OpContext) -> list[np.ndarray]:
    """Remove the listed size-1 axes (all size-1 axes when none are listed)."""
    x = ctx.array(0)
    return [x.reshape(_squeeze_shape(ctx, x.shape))]


def _unsqueeze_shape(ctx: OpContext, shape: Shape | None) -> Shape | None:
    axes = attr_or_input(ctx, "axes", 1)
    if axes is UNKNOWN_VALUE or axes is None:
        return None
    if shape is None:
        return None
    rank = len(shape) + len(axes)
    where = sorted(normalize_axis(ctx, a, rank) for a in axes)
    if len(set(where)) != len(where):
        raise ctx.fail(f"repeated axes {axes}")
    out: list[Dim] = list(shape)
    for a in where:
        out.insert(a, 1)
    return tuple(out)


@op("Unsqueeze", infer=lambda ctx: [TensorInfo(input_info(ctx, 0).dtype, _unsqueeze_shape(ctx, shape_of(ctx, 0)))],
    value_inputs=(1,))
def unsqueeze(ctx: OpContext) -> list[np.ndarray]:
    """Insert size-1 axes at the listed positions of the output."""
    x = ctx.array(0)
    return [x.reshape(_unsqueeze_shape(ctx, x.shape))]


def _perm(ctx: OpContext, rank: int) -> list[int]:
    perm = ctx.attr("perm", None)
    if perm is None:
        return list(range(rank))[::-1]
    perm = [normalize_axis(ctx, p, rank) for p in perm]
    if sorted(perm) != list(range(rank)):
        raise ctx.fail(f"perm {perm} is not a permutation of {rank} axes")
    return perm


def _transpose_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    if x.shape is None:
        perm = ctx.attr("perm", None)
        return [unknown(x.dtype, None if perm is None else len(perm))]
    return [TensorInfo(x.dtype, tuple(x.shape[p] for p in _perm(ctx, len(x.shape))))]


@op("Transpose", infer=_transpose_infer)
def transpose(ctx: OpContext) -> list[np.ndarray]:
    """Permute axes (reverse them by default)."""
    x = ctx.array(0)
    return [np.transpose(x, _perm(ctx, x.ndim))]


@op("Identity", infer=same_as_input(0))
def identity(ctx: OpContext) -> list[np.ndarray]:
    """The input, unchanged."""
    return [ctx.array(0)]


# -- Concat / Split ------------------------------------------------------------------------------------------------
def _concat_infer(ctx: OpContext) -> list[TensorInfo]:
    infos = [i for i in ctx.inputs if i is not None]
    shapes = [i.shape for i in infos]
    known = [s for s in shapes if s is not None]
    if not known:
        return [unknown(infos[0].dtype)]
    rank = len(known[0])
    axis = normalize_axis(ctx, ctx.attr("axis"), rank)
    out: list[Dim] = []
    for a in range(rank):
        dims = [None if s is None else s[a] for s in shapes]
        if a == axis:
            sizes = [d for d in dims if d is not None]
            out.append(sum(sizes) if len(sizes) == len(dims) else None)
        else:
            fixed = {d for d in dims if d is not None}
            if len(fixed) > 1:
                raise ctx.fail(f"input shapes {[list(s) for s in known]} differ outside axis {axis}")
            out.append(fixed.pop() if fixed else None)
    return [TensorInfo(infos[0].dtype, tuple(out))]


@op("Concat", infer=_concat_infer)
def concat(ctx: OpContext) -> list[np.ndarray]:
    """Join inputs along ``axis``."""
    values = [v for v in ctx.values if v is not None]
    return [np.concatenate(values, axis=ctx.attr("axis"))]


def _split_sizes(ctx: OpContext, dim: Dim) -> Sequence[Dim] | None:
    n_out = len(ctx.node.outputs)
    split = attr_or_input(ctx, "split", 1)
    if split is UNKNOWN_VALUE:
        return None
    if split is not None:
        if len(split) != n_out:
            raise ctx.fail(f"split {split} does not match the {n_out} outputs")
        if any(int(s) < 0 for s in split):
            raise ctx.fail(f"split {split} has a negative size")
        return list(split)
    num = ctx.attr("num_outputs", None)
    if num is not None and int(num) != n_out:  # (checked first: the sizes below are a list of num entries)
        raise ctx.fail(f"num_outputs={num} does not match the node's {n_out} outputs")
    if dim is None:
        return [None] * n_out
    if num is not None:
        chunk = -(-dim // int(num))
        sizes = [min(chunk, max(dim - i * chunk, 0)) for i in range(int(num))]
        return sizes
    if dim % n_out:
        raise ctx.fail(f"dim {dim} does not split evenly into {n_out} outputs")
    return [dim // n_out] * n_out


def _split_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    n_out = len(ctx.node.outputs)
    if x.shape is None:
        return [unknown(x.dtype)] * n_out
    axis = normalize_axis(ctx, ctx.attr("axis", 0), len(x.shape))
    sizes = _split_sizes(ctx, x.shape[axis]) or [None] * n_out
    return [TensorInfo(x.dtype, (*x.shape[:axis], s, *x.shape[axis + 1 :])) for s in sizes]


@op("Split", infer=_split_infer, value_inputs=(1,))
def split(ctx: OpContext) -> list[np.ndarray]:
    """Split along ``axis`` into the given sizes (equal parts, the last one smaller, when not given)."""
    x = ctx.array(0)
    axis = normalize_axis(ctx, ctx.attr("axis", 0), x.ndim)
    sizes = _split_sizes(ctx, x.shape[axis])
    bounds = np.cumsum([0, *static_dims(ctx, sizes)])
    index = [slice(None)] * x.ndim
    outs = []
    for lo, hi in itertools.pairwise(bounds):
        index[axis] = slice(int(lo), int(hi))
        outs.append(x[tuple(index)])
    return outs


# -- Slice ---------------------------------------------------------------------------------------------------------
def _slice_args(ctx: OpContext) -> tuple[list[int], list[int], list[int] | None, list[int] | None] | None:
    if ctx.opset < 10:
        return ctx.attr("starts"), ctx.attr("ends"), ctx.attr("axes", None), None
    vals = [ctx.value(i) if ctx.has_input(i) else None for i in range(1, 5)]
    starts, ends = vals[0], vals[1]
    if starts is None or ends is None or any(ctx.has_input(i) and vals[i - 1] is None for i in range(3, 5)):
        return None
    return int_list(starts), int_list(ends), int_list(vals[2]), int_list(vals[3])


def _slices(ctx: OpContext, shape: Shape) -> list[slice | None]:
    """Python slices per axis; None for a sliced axis whose size is unknown."""
    args = _slice_args(ctx)
    assert args is not None
    starts, ends, axes, steps = args
    rank = len(shape)
    axes = list(range(len(starts))) if axes is None else [normalize_axis(ctx, a, rank) for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    out: list[slice | None] = [slice(None)] * rank
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        if step == 0:
            raise ctx.fail("slice step cannot be 0")
        dim = shape[axis]
        if dim is None:
            out[axis] = None
            continue
        # Clamp like the spec: into [0, dim] for positive steps, [-1, dim-1] for negative ones.
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:
            start, end = min(max(start, -1), dim - 1), min(max(end, -1), dim - 1)
        out[axis] = slice(start, None if end < 0 else end, step)
    return out


def _slice_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    if x.shape is None:
        return [unknown(x.dtype)]
    if _slice_args(ctx) is None:
        return [unknown(x.dtype, len(x.shape))]
    dims = tuple(
        None if s is None or d is None else d if s == slice(None) else len(range(*s.indices(d)))
        for d, s in zip(x.shape, _slices(ctx, x.shape), strict=True)
    )
    return [TensorInfo(x.dtype, dims)]


@op("Slice", infer=_slice_infer, value_inputs=(1, 2, 3, 4))
def slice_(ctx: OpContext) -> list[np.ndarray]:
    """Numpy-style strided slicing on the listed axes; out-of-range bounds are clamped."""
    x = ctx.array(0)
    return [x[tuple(_slices(ctx, x.shape))]]


# -- Expand / Tile / Pad -------------------------------------------------------------------------------------------
def _expand_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    shape = ctx.value(1)
    if shape is None:
        n = shape_of(ctx, 1)
        rank = None if n is None or n[0] is None or x.shape is None else max(n[0], len(x.shape))
        return [unknown(x.dtype, rank)]
    return [TensorInfo(x.dtype, broadcast_shapes(ctx, [x.shape, tuple(int_list(shape) or [])]))]


@op("Expand", infer=_expand_infer, value_inputs=(1,))
def expand(ctx: OpContext) -> list[np.ndarray]:
    """Broadcast to the given shape (bidirectionally: size-1 target dims keep the input's)."""
    x = ctx.array(0)
    shape = broadcast_shapes(ctx, [x.shape, tuple(int_list(ctx.array(1)) or [])])
    return [np.broadcast_to(x, static_dims(ctx, shape)).copy()]


def _tile_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    reps = int_list(ctx.value(1))
    if x.shape is None or reps is None:
        return [unknown(x.dtype, None if x.shape is None else len(x.shape))]
    return [TensorInfo(x.dtype, tuple(None if d is None else d * r for d, r in zip(x.shape, reps, strict=True)))]


@op("Tile", infer=_tile_infer, value_inputs=(1,))
def tile(ctx: OpContext) -> list[np.ndarray]:
    """Repeat the input ``repeats[i]`` times along each axis."""
    return [np.tile(ctx.array(0), int_list(ctx.array(1)))]


def _pads(ctx: OpContext, rank: int) -> list[int] | None:
    """Pads as [begin_0..begin_n, end_0..end_n] over all axes, or None when not known yet."""
    if ctx.opset < 11:
        pads = list(ctx.attr("pads" if ctx.opset >= 2 else "paddings"))
        axes = None
    else:
        value = ctx.value(1)
        if value is None:
            return None
        pads = int_list(value) or []
        axes = None
        if ctx.has_input(3):
            if ctx.value(3) is None:
                return None
            axes = [normalize_axis(ctx, a, rank) for a in int_list(ctx.value(3)) or []]
    if axes is None:
        if len(pads) != 2 * rank:
            raise ctx.fail(f"pads {pads} need 2 values per axis of rank {rank}")
        return pads
    full = [0] * (2 * rank)
    for i, a in enumerate(axes):
        full[a], full[a + rank] = pads[i], pads[i + len(axes)]
    return full


def _pad_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    if x.shape is None:
        return [unknown(x.dtype)]
    rank = len(x.shape)
    pads = _pads(ctx, rank)
    if pads is None:
        return [unknown(x.dtype, rank)]
    return [TensorInfo(x.dtype, tuple(None if d is None else d + pads[i] + pads[i + rank]
                                      for i, d in enumerate(x.shape)))]


@op("Pad", infer=_pad_infer, value_inputs=(1, 3))
def pad(ctx: OpContext) -> list[np.ndarray]:
    """Pad (constant, reflect, edge or wrap); negative pads crop."""
    x = ctx.array(0)
    rank = x.ndim
    pads = _pads(ctx, rank)
    assert pads is not None
    mode = ctx.attr("mode", "constant")
    if ctx.opset < 11:
        constant = ctx.attr("value", 0.0)
    else:
        constant = ctx.value(2) if ctx.has_input(2) else 0
        constant = 0 if constant is None else np.asarray(constant).reshape(-1)[0] if np.size(constant) else 0
    # Negative pads crop first; then the non-negative part pads.
    crop = tuple(slice(max(-pads[i], 0), x.shape[i] - max(-pads[i + rank], 0)) for i in range(rank))
    x = x[crop]
    widths = [(max(pads[i], 0), max(pads[i + rank], 0)) for i in range(rank)]
    if mode == "constant":
        return [np.pad(x, widths, mode="constant", constant_values=np.asarray(constant).astype(x.dtype))]
    np_modes: dict[str, Literal["reflect", "edge", "wrap"]] = {"reflect": "reflect", "edge": "edge", "wrap": "wrap"}
    np_mode = np_modes.get(mode)
    if np_mode is None:
        raise ctx.fail(f"unknown pad mode {mode!r}")
    return [np.pad(x, widths, mode=np_mode)]


# -- Shape queries -------------------------------------------------------------------------------------------------
def _shape_range(ctx: OpContext, rank: int) -> tuple[int, int]:
    return shape_range(ctx.attr("start", 0), ctx.attr("end", None), rank)


def _shape_infer(ctx: OpContext) -> list[TensorInfo]:
    shape = shape_of(ctx, 0)
    if shape is None:
        return [unknown(dtypes.int64, 1)]
    start, end = _shape_range(ctx, len(shape))
    return [TensorInfo(dtypes.int64, (end - start,))]


@op("Shape", infer=_shape_infer)
def shape(ctx: OpContext) -> list[np.ndarray]:
    """The input's shape as int64 (optionally the dims [start, end))."""
    dims = ctx.array(0).shape
    start, end = _shape_range(ctx, len(dims))
    return [np.array(dims[start:end], dtype=np.int64)]


@op("Size", infer=lambda ctx: [TensorInfo(dtypes.int64, ())])
def size(ctx: OpContext) -> list[np.ndarray]:
    """The input's element count as an int64 scalar."""
    return [np.array(ctx.array(0).size, dtype=np.int64)]


# -- Gather / Scatter ----------------------------------------------------------------------------------------------
def _gather_infer(ctx: OpContext) -> list[TensorInfo]:
    x, idx = input_info(ctx, 0), input_info(ctx, 1)
    if x.shape is None or idx.shape is None:
        return [unknown(x.dtype)]
    axis = normalize_axis(ctx, ctx.attr("axis", 0), len(x.shape))
    return [TensorInfo(x.dtype, (*x.shape[:axis], *idx.shape, *x.shape[axis + 1 :]))]


def _fix_indices(indices: np.ndarray, dim: int | np.ndarray) -> np.ndarray:
    indices = indices.astype(np.int64)
    return np.where(indices < 0, indices + dim, indices)


@op("Gather", infer=_gather_infer)
def gather(ctx: OpContext) -> list[np.ndarray]:
    """Take slices along ``axis`` at the given indices (negative indices count from the end)."""
    x, idx = ctx.array(0), ctx.array(1)
    axis = normalize_axis(ctx, ctx.attr("axis", 0), x.ndim)
    return [np.take(x, _fix_indices(idx, x.shape[axis]), axis=axis)]


@op("GatherElements", infer=lambda ctx: [TensorInfo(input_info(ctx, 0).dtype, shape_of(ctx, 1))])
def gather_elements(ctx: OpContext) -> list[np.ndarray]:
    """out[i][j] = x[idx[i][j]][j] along ``axis`` (take_along_axis)."""
    x, idx = ctx.array(0), ctx.array(1)
    axis = normalize_axis(ctx, ctx.attr("axis", 0), x.ndim)
    return [np.take_along_axis(x, _fix_indices(idx, x.shape[axis]), axis=axis)]


def _gather_nd_infer(ctx: OpContext) -> list[TensorInfo]:
    x, idx = input_info(ctx, 0), input_info(ctx, 1)
    b = ctx.attr("batch_dims", 0)
    if x.shape is None or idx.shape is None or idx.shape[-1] is None:
        return [unknown(x.dtype)]
    k = idx.shape[-1]
    return [TensorInfo(x.dtype, (*idx.shape[:-1], *x.shape[b + k :]))]


@op("GatherND", infer=_gather_nd_infer)
def gather_nd(ctx: OpContext) -> list[np.ndarray]:
    """Gather slices addressed by the last axis of ``indices`` (after ``batch_dims`` shared leading axes)."""
    x, idx = ctx.array(0), ctx.array(1).astype(np.int64)
    b = ctx.attr("batch_dims", 0)
    k = idx.shape[-1]
    batch = x.shape[:b]
    xb: np.ndarray = x.reshape((numel(batch), *x.shape[b:]))
    ib: np.ndarray = idx.reshape((numel(batch), -1, k))
    out = np.empty((xb.shape[0], ib.shape[1], *x.shape[b + k :]), dtype=x.dtype)
    for n in range(xb.shape[0]):
        coords = _fix_indices(ib[n], np.array(x.shape[b : b + k]))
        out[n] = xb[n][tuple(coords.T)]
    return [out.reshape((*idx.shape[:-1], *x.shape[b + k :]))]


_REDUCTIONS = {
    "none": None,
    "add": np.add,
    "mul": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
}


def _reduction(ctx: OpContext):
    name = ctx.attr("reduction", "none")
    if name not in _REDUCTIONS:
        raise ctx.fail(f"unknown reduction {name!r}")
    return _REDUCTIONS[name]


@op("ScatterND", infer=same_as_input(0))
def scatter_nd(ctx: OpContext) -> list[np.ndarray]:
    """Copy of data with the slices addressed by ``indices`` replaced (or combined) by ``updates``."""
    x, idx, updates = ctx.array(0), ctx.array(1).astype(np.int64), ctx.array(2)
    out = x.copy()
    fn = _reduction(ctx)
    k = idx.shape[-1]
    flat_idx = _fix_indices(idx.reshape(-1, k), np.array(x.shape[:k]))
    flat_upd = updates.reshape((flat_idx.shape[0], *x.shape[k:]))
    for where, upd in zip(flat_idx, flat_upd, strict=True):
        key = tuple(where)
        out[key] = upd if fn is None else fn(out[key], upd)
    return [out]


def _scatter_elements(ctx: OpContext, reduction: bool) -> list[np.ndarray]:
    x, idx, updates = ctx.array(0), ctx.array(1), ctx.array(2)
    axis = normalize_axis(ctx, ctx.attr("axis", 0), x.ndim)
    fn = _reduction(ctx) if reduction else None
    idx = _fix_indices(idx, x.shape[axis])
    out = x.copy()
    grid = np.indices(idx.shape)
    coords = [grid[i] for i in range(idx.ndim)]
    coords[axis] = idx
    key = tuple(c.reshape(-1) for c in coords)
    if fn is None:
        out[key] = updates.reshape(-1)
    else:
        fn.at(out, key, updates.reshape(-1))  # ufunc.at applies repeated indices one after another
    return [out]


@op("ScatterElements", infer=same_as_input(0))
def scatter_elements(ctx: OpContext) -> list[np.ndarray]:
    """out[idx[i][j]][j] = updates[i][j] along ``axis`` (optionally reduced with add/mul/max/min)."""
    return _scatter_elements(ctx, True)


@op("Scatter", infer=same_as_input(0))
def scatter(ctx: OpContext) -> list[np.ndarray]:
    """The deprecated name of ScatterElements (no reduction)."""
    return _scatter_elements(ctx, False)


# -- Rearrangements ------------------------------------------------------------------------------------------------
def _d2s_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    b = ctx.attr("blocksize")
    if x.shape is None:
        return [unknown(x.dtype, 4)]
    n, c, h, w = x.shape
    mul = lambda d, f: None if d is None else d * f  # noqa: E731
    div = lambda d, f: None if d is None else d // f  # noqa: E731
    if ctx.node.op_type == "DepthToSpace":
        return [TensorInfo(x.dtype, (n, div(c, b * b), mul(h, b), mul(w, b)))]
    return [TensorInfo(x.dtype, (n, mul(c, b * b), div(h, b), div(w, b)))]


@op("DepthToSpace", infer=_d2s_infer)
def depth_to_space(ctx: OpContext) -> list[np.ndarray]:
    """Move channel blocks into spatial blocks (DCR: depth-column-row order, CRD: column-row-depth)."""
    x = ctx.array(0)
    b = ctx.attr("blocksize")
    n, c, h, w = x.shape
    if ctx.attr("mode", "DCR") == "DCR":
        t = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        t = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return [t.reshape(n, c // (b * b), h * b, w * b)]


@op("SpaceToDepth", infer=_d2s_infer)
def space_to_depth(ctx: OpContext) -> list[np.ndarray]:
    """Move spatial blocks into channels (the inverse of DepthToSpace in the same mode)."""
    x = ctx.array(0)
    b = ctx.attr("blocksize")
    n, c, h, w = x.shape
    t = x.reshape(n, c, h // b, b, w // b, b)
    t = t.transpose(0, 3, 5, 1, 2, 4) if ctx.attr("mode", "DCR") == "DCR" else t.transpose(0, 1, 3, 5, 2, 4)
    return [t.reshape(n, c * b * b, h // b, w // b)]


@op("Trilu", infer=same_as_input(0))
def trilu(ctx: OpContext) -> list[np.ndarray]:
    """Keep the upper (default) or lower triangle of the last two axes, shifted by diagonal k."""
    x = ctx.array(0)
    k = int(ctx.array(1).reshape(-1)[0]) if ctx.has_input(1) else 0
    return [np.triu(x, k) if ctx.attr("upper", 1) else np.tril(x, k)]


def _onehot_infer(ctx: OpContext) -> list[TensorInfo]:
    idx, values = input_info(ctx, 0), input_info(ctx, 2)
    depth = ctx.value(1)
    if idx.shape is None:
        return [unknown(values.dtype)]
    rank = len(idx.shape) + 1
    axis = normalize_axis(ctx, ctx.attr("axis", -1), rank)
    d = None if depth is None else int(np.asarray(depth).reshape(-1)[0])
    out = list(idx.shape)
    out.insert(axis, d)
    return [TensorInfo(values.dtype, tuple(out))]


@op("OneHot", infer=_onehot_infer, value_inputs=(1,))
def one_hot(ctx: OpContext) -> list[np.ndarray]:
    """values[1] where the new axis equals the index (negative indices count from depth), values[0] elsewhere."""
    idx, depth, values = ctx.array(0), int(np.asarray(ctx.array(1)).reshape(-1)[0]), ctx.array(2)
    axis = normalize_axis(ctx, ctx.attr("axis", -1), idx.ndim + 1)
    idx = idx.astype(np.int64)
    idx = np.where(idx < 0, idx + depth, idx)
    hot = np.expand_dims(idx, axis) == np.arange(depth).reshape([-1 if a == axis else 1 for a in range(idx.ndim + 1)])
    return [np.where(hot, values[1], values[0]).astype(values.dtype)]


# -- Data-dependent ------------------------------------------------------------------------------------------------
def _compress_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    cond = ctx.value(1)
    axis = ctx.attr("axis", None)
    if cond is None or x.shape is None:
        return [unknown(x.dtype, 1 if axis is None else None if x.shape is None else len(x.shape))]
    count = int(np.count_nonzero(np.asarray(cond)[: _axis_len(ctx, x.shape, axis)]))
    if axis is None:
        return [TensorInfo(x.dtype, (count,))]
    axis = normalize_axis(ctx, axis, len(x.shape))
    return [TensorInfo(x.dtype, (*x.shape[:axis], count, *x.shape[axis + 1 :]))]


def _axis_len(ctx: OpContext, shape: Shape, axis: int | None) -> int | None:
    if axis is None:
        return _prod(shape)
    return shape[normalize_axis(ctx, axis, len(shape))]


@op("Compress", infer=_compress_infer, data_dependent=True)
def compress(ctx: OpContext) -> list[np.ndarray]:
    """Keep the slices along ``axis`` (or elements of the flattened input) where the condition is true."""
    x, cond = ctx.array(0), ctx.array(1).astype(bool)
    axis = ctx.attr("axis", None)
    n = _axis_len(ctx, x.shape, axis)
    return [np.compress(cond[:n], x, axis=axis)]


def _nonzero_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    value = ctx.value(0)
    rank = None if x.shape is None else len(x.shape)
    if value is None:
        return [TensorInfo(dtypes.int64, (rank, None))]
    # A scalar input gives one row, like a 1-element vector.
    return [TensorInfo(dtypes.int64, (max(value.ndim, 1), int(np.count_nonzero(value))))]


@op("NonZero", infer=_nonzero_infer, data_dependent=True)
def nonzero(ctx: OpContext) -> list[np.ndarray]:
    """Indices of the non-zero elements, one row per axis (row-major order)."""
    x = ctx.array(0)
    if x.ndim == 0:
        return [np.zeros((1, int(x != 0)), dtype=np.int64)]
    return [np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]


def _unique(ctx: OpContext, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    axis = ctx.attr("axis", None)
    if axis is not None:
        axis = normalize_axis(ctx, axis, x.ndim)
    _, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True, axis=axis)
    inverse = inverse.reshape(-1)
    if not ctx.attr("sorted", 1):
        # Order of first occurrence: renumber the sorted uniques by where they first appear.
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        first, counts, inverse = first[order], counts[order], rank[inverse]
    y = np.take(x.reshape(-1) if axis is None else x, first, axis=0 if axis is None else axis)
    return y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)


def _unique_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    value = ctx.value(0)
    axis = ctx.attr("axis", None)
    if value is None:
        rank = 1 if axis is None else x.rank
        n = None if axis is None or x.shape is None else x.shape[normalize_axis(ctx, axis, len(x.shape))]
        return [unknown(x.dtype, rank), unknown(dtypes.int64, 1), TensorInfo(dtypes.int64, (n,)),
                unknown(dtypes.int64, 1)]
    y, first, inverse, counts = _unique(ctx, value)
    return [TensorInfo(x.dtype, y.shape), TensorInfo(dtypes.int64, first.shape),
            TensorInfo(dtypes.int64, inverse.shape), TensorInfo(dtypes.int64, counts.shape)]


@op("Unique", infer=_unique_infer, data_dependent=True)
def unique(ctx: OpContext) -> list[np.ndarray]:
    """Unique elements (or slices along ``axis``), with first indices, inverse indices and counts."""
    return list(_unique(ctx, ctx.array(0)))


# -- Scans and sorting ---------------------------------------------------------------------------------------------
def _cumulative(ctx: OpContext, fn: np.ufunc, identity: int) -> list[np.ndarray]:
    x = ctx.array(0)
    axis = normalize_axis(ctx, int(np.asarray(ctx.array(1)).reshape(-1)[0]), x.ndim)
    exclusive, reverse = ctx.attr("exclusive", 0), ctx.attr("reverse", 0)
    y = np.flip(x, axis) if reverse else x
    out = fn.accumulate(y, axis=axis, dtype=x.dtype)
    if exclusive:
        pad = np.full_like(np.take(out, [0], axis=axis), identity)
        out = np.concatenate([pad, np.take(out, np.arange(out.shape[axis] - 1), axis=axis)], axis=axis)
    return [np.flip(out, axis) if reverse else out]


@op("CumSum", infer=same_as_input(0))
def cumsum(ctx: OpContext) -> list[np.ndarray]:
    """Running sum along an axis (optionally exclusive and/or reversed)."""
    return _cumulative(ctx, np.add, 0)


@op("CumProd", infer=same_as_input(0))
def cumprod(ctx: OpContext) -> list[np.ndarray]:
    """Running product along an axis (optionally exclusive and/or reversed)."""
    return _cumulative(ctx, np.multiply, 1)


@op("ReverseSequence", infer=same_as_input(0))
def reverse_sequence(ctx: OpContext) -> list[np.ndarray]:
    """Reverse the first seq_lens[b] elements along time_axis of each batch entry b."""
    x, lens = ctx.array(0), ctx.array(1)
    t_axis, b_axis = ctx.attr("time_axis", 0), ctx.attr("batch_axis", 1)
    out = x.copy()
    for b, n in enumerate(lens.astype(np.int64)):
        src: list[int | slice] = [slice(None)] * x.ndim
        src[b_axis], src[t_axis] = b, slice(0, int(n))
        dst = list(src)
        dst[t_axis] = slice(int(n) - 1, None, -1) if n > 0 else slice(0, 0)
        out[tuple(src)] = x[tuple(dst)]
    return [out]


def _topk_k(ctx: OpContext) -> int | None:
    if ctx.opset < 10:
        k = ctx.attr("k")
        if not isinstance(k, int):
            raise ctx.fail(f"attribute k must be an integer, got {k!r}")
    else:
        value = ctx.value(1)
        if value is None:
            return None
        flat = np.asarray(value).reshape(-1)
        if flat.size != 1 or flat.dtype.kind not in "iu":
            raise ctx.fail(f"K must hold one integer, got {flat.size} value(s) of {flat.dtype}")
        k = int(flat[0])
    if k < 0:
        raise ctx.fail(f"k={k} is negative")
    return k


def _topk_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    if x.shape is None:
        return [unknown(x.dtype), unknown(dtypes.int64)]
    axis = normalize_axis(ctx, ctx.attr("axis", -1), len(x.shape))
    k = _topk_k(ctx)
    if k is not None and (dim := x.shape[axis]) is not None and k > dim:
        raise ctx.fail(f"k={k} is larger than axis {axis} of the input, {x.shape[axis]}")
    shape = (*x.shape[:axis], k, *x.shape[axis + 1 :])
    return [TensorInfo(x.dtype, shape), TensorInfo(dtypes.int64, shape)]


@op("TopK", infer=_topk_infer, value_inputs=(1,))
def topk(ctx: OpContext) -> list[np.ndarray]:
    """The k largest (or smallest) elements along ``axis`` and their indices; ties keep the lower index first."""
    x = ctx.array(0)
    axis = normalize_axis(ctx, ctx.attr("axis", -1), x.ndim)
    k = _topk_k(ctx)
    if k is None:
        raise ctx.fail("input K has no value")
    largest = ctx.attr("largest", 1)
    # A stable sort on the (negated) keys keeps lower indices first among equal values.
    keys = -x if largest and x.dtype.kind != "u" else x
    if largest and x.dtype.kind == "u":
        keys = np.iinfo(x.dtype).max - x
    order = np.argsort(keys, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    return [np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)]


def _arg_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    if x.shape is None:
        return [unknown(dtypes.int64)]
    axis = normalize_axis(ctx, ctx.attr("axis", 0), len(x.shape))
    if ctx.attr("keepdims", 1):
        shape = (*x.shape[:axis], 1, *x.shape[axis + 1 :])
    else:
        shape = (*x.shape[:axis], *x.shape[axis + 1 :])
    return [TensorInfo(dtypes.int64, shape)]


def _arg(ctx: OpContext, fn) -> list[np.ndarray]:
    x = ctx.array(0)
    axis = normalize_axis(ctx, ctx.attr("axis", 0), x.ndim)
    last = ctx.attr("select_last_index", 0)
    idx = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis) if last else fn(x, axis=axis)
    if ctx.attr("keepdims", 1):
        idx = np.expand_dims(idx, axis)
    return [np.asarray(idx, dtype=np.int64)]


@op("ArgMax", infer=_arg_infer)
def argmax(ctx: OpContext) -> list[np.ndarray]:
    """Index of the largest element along ``axis`` (first or last occurrence)."""
    return _arg(ctx, np.argmax)


@op("ArgMin", infer=_arg_infer)
def argmin(ctx: OpContext) -> list[np.ndarray]:
    """Index of the smallest element along ``axis`` (first or last occurrence)."""
    return _arg(ctx, np.argmin)


def _center_crop_pad_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    target = int_list(ctx.value(1))
    if x.shape is None or target is None:
        return [unknown(x.dtype, None if x.shape is None else len(x.shape))]
    rank = len(x.shape)
    axes = [normalize_axis(ctx, a, rank) for a in ctx.attr("axes", None) or range(rank)]
    out = list(x.shape)
    for a, t in zip(axes, target, strict=True):
        out[a] = t
    return [TensorInfo(x.dtype, tuple(out))]


@op("CenterCropPad", infer=_center_crop_pad_infer, value_inputs=(1,))
def center_crop_pad(ctx: OpContext) -> list[np.ndarray]:
    """Crop (window start rounded down) or zero-pad (extra pixel on the right) each listed axis to the target size."""
    x = ctx.array(0)
    target = int_list(ctx.array(1)) or []
    axes = [normalize_axis(ctx, a, x.ndim) for a in ctx.attr("axes", None) or range(x.ndim)]
    for a, t in zip(axes, target, strict=True):
        n = x.shape[a]
        if n > t:
            start = (n - t) // 2
            x = np.take(x, np.arange(start, start + t), axis=a)
        elif n < t:
            widths = [(0, 0)] * x.ndim
            widths[a] = ((t - n) // 2, t - n - (t - n) // 2)
            x = np.pad(x, widths)
    return [x]
