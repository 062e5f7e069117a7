"""Shape-inference helpers shared by op schemas. Dims may be None (unknown until run time)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Final, Literal, overload

import numpy as np

from ..contract import dtypes
from ..contract.dtypes import DType
from ..contract.registry import InferFn, OpContext
from ..contract.tensor import Dim, Shape, TensorInfo


def input_info(ctx: OpContext, index: int) -> TensorInfo:
    info = ctx.inputs[index] if index < len(ctx.inputs) else None
    if info is None:
        raise ctx.fail(f"input {index} is required")
    return info


def expect_shape(ctx: OpContext, name: str, shape: Shape | None, want: Sequence[Dim]) -> None:
    """``shape`` (of input ``name``) matches ``want`` wherever both are known (None: unknown). Kernels index their
    inputs by sizes taken from other inputs and attributes: one that disagrees would be read past its end."""
    if shape is None:
        return
    if len(shape) != len(want) or any(a is not None and b is not None and a != b
                                      for a, b in zip(shape, want, strict=True)):
        shown = ["?" if d is None else d for d in want]
        raise ctx.fail(f"{name} has shape {list(shape)}; expected {shown} from the other inputs and the attributes")


def broadcast_shapes(ctx: OpContext, shapes: Sequence[Shape | None]) -> Shape | None:
    """Numpy (multidirectional) broadcasting over possibly-unknown dims."""
    ranked = [s for s in shapes if s is not None]
    if len(ranked) < len(shapes):
        return None
    rank = max((len(s) for s in ranked), default=0)
    out: list[Dim] = []
    for axis in range(rank):
        dims = [s[len(s) - rank + axis] for s in ranked if len(s) - rank + axis >= 0]
        known = {d for d in dims if d is not None and d != 1}
        if len(known) > 1:
            raise ctx.fail(f"shapes {[list(s) for s in ranked]} do not broadcast")
        if known:
            out.append(known.pop())
        elif any(d is None for d in dims):
            out.append(None)
        else:
            out.append(1)
    return tuple(out)


def same_as_input(index: int = 0) -> InferFn:
    def infer(ctx: OpContext) -> list[TensorInfo]:
        return [input_info(ctx, index)]

    return infer


def with_dtype(dtype: DType, index: int = 0) -> InferFn:
    def infer(ctx: OpContext) -> list[TensorInfo]:
        return [TensorInfo(dtype, input_info(ctx, index).shape)]

    return infer


def broadcast_infer(out_dtype: DType | None = None) -> InferFn:
    """Elementwise ops over broadcast inputs; dtype of input 0 unless ``out_dtype``."""

    def infer(ctx: OpContext) -> list[TensorInfo]:
        infos = [i for i in ctx.inputs if i is not None]
        if not infos:
            raise ctx.fail("needs at least one input")
        shape = broadcast_shapes(ctx, [i.shape for i in infos])
        return [TensorInfo(out_dtype or infos[0].dtype, shape)]

    return infer


def normalize_axis(ctx: OpContext, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ctx.fail(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


@overload
def int_list(value: np.ndarray | Sequence[int]) -> list[int]: ...
@overload
def int_list(value: np.ndarray | Sequence[int] | None) -> list[int] | None: ...
def int_list(value: np.ndarray | Sequence[int] | None) -> list[int] | None:
    if value is None:
        return None
    return [int(v) for v in np.asarray(value).reshape(-1)]


def output_dtype_from_attr(ctx: OpContext, name: str, default: DType) -> DType:
    code = ctx.attr(name, None)
    return default if code is None else dtypes.from_onnx(int(code))


def numel(shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64))


def static_dims(ctx: OpContext, dims: Sequence[Dim] | None) -> tuple[int, ...]:
    """``dims`` where every one must be known (a reference's shapes at run time): a failure names the node."""
    if dims is None or any(d is None for d in dims):
        raise ctx.fail(f"dims {dims} are not known at run time")
    return tuple(int(d) for d in dims if d is not None)



# -- helpers added for the ONNX op set ---------------------------------------------------------------------------
class _Unknown(enum.Enum):
    """The type of ``UNKNOWN_VALUE`` (an enum member, so that ``is UNKNOWN_VALUE`` narrows for type checkers)."""

    VALUE = "unknown value"


UNKNOWN_VALUE: Final = _Unknown.VALUE


def shape_of(ctx: OpContext, index: int) -> Shape | None:
    """The shape of input ``index`` (None when the rank is unknown or the input is absent)."""
    info = ctx.inputs[index] if index < len(ctx.inputs) else None
    return None if info is None else info.shape


def unknown(dtype: DType, rank: int | None = None) -> TensorInfo:
    """An output whose dims are not known yet (``rank=None``: not even the rank)."""
    return TensorInfo(dtype, None if rank is None else (None,) * rank)


def attr_or_input(ctx: OpContext, attr: str, index: int) -> list[int] | Literal[_Unknown.VALUE] | None:
    """An int list given as an attribute in old opsets and as an input in new ones.

    Returns the list, None when neither is given, or ``UNKNOWN_VALUE`` when the input exists but its value is not
    known yet (static inference of a non-constant input).
    """
    if ctx.has_input(index):
        value = ctx.value(index)
        return UNKNOWN_VALUE if value is None else int_list(value)
    found = ctx.attr(attr, None)
    return None if found is None else [int(v) for v in found]



def np_dtype(dtype: DType) -> np.dtype:
    if dtype.np_dtype is None:
        raise ValueError(f"{dtype} has no numpy equivalent")
    return dtype.np_dtype
