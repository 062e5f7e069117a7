"""LLM kernels (domain ``hetero``, the ops of ``hetero.ops.llm``) on the native library.

* ``QMatMul`` / ``MoE``: block-quantized weights (hetero's q4 / q8, GGUF's q5_0 / q5_1 / q4_k / q5_k / q6_k) are
  repacked once, when the kernel is made (16 rows interleaved, see ``src/llm.hpp``), and multiplied without
  expanding them to float: the activation rows are quantized to int8 per block on the fly and the dots are integer
  (AVX-512 VNNI / AVX-512BW / AVX2 / scalar). Float weights (f32 / f16 / bf16) are read in place.
* ``Attention`` owns its layer's KV cache in native memory: float16 by default, float32 with the node attribute
  ``kv_dtype="f32"`` (``hetero.llm.load(..., kv_cache="f32")``), int8 with ``"q8"`` (a float scale per 32
  values of a position's head, dequantized inside the attention tile kernels), or the rotated 4 / 3-bit ``"q4r"`` /
  ``"q3r"`` (``hetero.contract.kv_rotated``: the query rotated once per row, each key / value tile decoded into L1
  scratch, the output un-rotated once).
* ``RotaryEmbedding`` shares one cos/sin table (grown on demand) between all nodes with the same attributes.

``run`` does no allocation: outputs are preallocated by the session; native scratch grows on the first calls only.
``bind`` (see ``CpuKernel``) gives the session's replay each kernel as one native call with its arguments
converted once (or a closure reading ``past_len`` at call time), so a replayed decode step has no Python per kernel
beyond that call.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hetero.contract import (
    SUPPORTED,
    Backend,
    HeteroError,
    NodeInfo,
    Support,
    Tensor,
    TensorInfo,
    dtypes,
    quant,
    static_shape,
    unsupported,
)
from hetero.contract.kv_rotated import KV_ROTATED_BITS, check_head_dim
from hetero.contract.opforms import SlotRun, cache_range_error, rope_inv_freq, slot_runs

from .. import _native
from .common import CpuKernel, bindable, noop, one_slot

Bound = Callable[[], None] | None  # what bind() returns
_FLOAT_DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}


def _c(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _wattrs(node: NodeInfo, prefix: str = "") -> tuple[str, int, int]:
    """(wtype, block_size, symmetric) of a weight; MoE's ``gate_`` / ``up_`` / ``down_`` prefixed attributes, when
    present, replace the shared three (as in hetero.ops.llm)."""
    if prefix and (prefix + "wtype") in node.node.attrs:
        return node.attr(prefix + "wtype"), node.attr(prefix + "block_size", 32), node.attr(prefix + "symmetric", 1)
    return node.attr("wtype", "f32"), node.attr("block_size", 32), node.attr("symmetric", 1)


def _format_ok(node: NodeInfo, prefix: str = "") -> Support:
    try:  # float weights, hetero's q8/q4 blocks and GGUF's q5_0/q5_1/q4_k/q5_k/q6_k blocks
        quant.weight_format(*_wattrs(node, prefix))
    except HeteroError as exc:
        return unsupported(exc.message)
    return SUPPORTED


def _is_f32(info: TensorInfo | None) -> bool:
    return info is not None and info.dtype == dtypes.float32


def _weights(node: NodeInfo, array: np.ndarray, k: int, prefix: str = ""):
    """The native weight object for a constant QMatMul / MoE weight (repacked once when quantized)."""
    wtype, block_size, symmetric = _wattrs(node, prefix)
    fmt = quant.weight_format(wtype, block_size, symmetric)
    if fmt is None:
        array = np.ascontiguousarray(array, dtype=_FLOAT_DTYPES[wtype])
        return _native.llm_weights(array, wtype, k=k)
    packed = np.ascontiguousarray(array, dtype=np.uint8)
    if isinstance(fmt, quant.GgmlFormat):  # GGUF blocks: the layout is implied by the type
        return _native.llm_weights(packed, wtype, k=k)
    return _native.llm_weights(packed, wtype, fmt.block_size, fmt.symmetric, k)


def _fail(node: NodeInfo, exc: ValueError, hint: str = "") -> HeteroError:
    return HeteroError(f"{node.node.label()}: {exc}", hint=hint or None)


class CpuQMatMul(CpuKernel):
    """y = x @ W^T (+ bias) on a constant weight (quantized: integer dots on the repacked blocks)."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if 1 not in node.constants:
            return unsupported("QMatMul with a weight computed at run time (cpu repacks constant weights)")
        if not _is_f32(node.inputs[0]):
            return unsupported("QMatMul on a non-float32 activation")
        if len(node.inputs) > 2 and node.inputs[2] is not None and not _is_f32(node.inputs[2]):
            return unsupported("QMatMul with a non-float32 bias")
        return _format_ok(node)

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        self.w = None
        bias = node.constants.get(2)
        self.bias = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
        x = node.inputs[0]
        if x is not None and x.shape is not None and x.shape[-1] is not None:
            self.w = _weights(node, node.constants[1], int(x.shape[-1]))

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        k = static_shape(inputs[0])[-1]
        if self.w is None or self.w.k != k:
            self.w = _weights(self.info, self.info.constants[1], k)

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        bias = self.bias
        if bias is None and len(inputs) > 2 and inputs[2] is not None:
            bias = _c(inputs[2].buffer)
        out = outputs[0].buffer
        if not out.size:
            return
        if len(outputs) > 1:  # the rows' argmax too: each task reduces the logits it wrote (an LM head's greedy step)
            _native.llm_matmul_argmax(self.w, _c(inputs[0].buffer), out, bias, outputs[1].buffer)
        else:
            _native.llm_matmul(self.w, _c(inputs[0].buffer), out, bias)

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Bound:
        x, out = inputs[0].buffer, outputs[0].buffer
        bias = self.bias
        if bias is None and len(inputs) > 2 and inputs[2] is not None:
            bias = inputs[2].buffer
        best = outputs[1].buffer if len(outputs) > 1 else None
        if not bindable(x, out, bias, best):
            return None
        if not out.size:
            return noop
        if best is not None:
            return functools.partial(_native.llm_matmul_argmax, self.w, x, out, bias, best)
        return functools.partial(_native.llm_matmul, self.w, x, out, bias)


class CpuEmbedding(CpuKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        return _format_ok(node)

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        self.wtype = node.attr("wtype", "f32")
        fmt = quant.weight_format(self.wtype, node.attr("block_size", 32), node.attr("symmetric", 1))
        self.table = node.constants.get(1)
        if self.table is not None:
            self.table = np.ascontiguousarray(self.table)
        self.block = fmt.block_size if fmt else 32
        self.sym = fmt.symmetric if isinstance(fmt, quant.QuantFormat) else True

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        out = outputs[0].buffer
        table = self.table if self.table is not None else _c(inputs[1].buffer)
        dim = out.shape[-1] if out.ndim else 0
        try:
            _native.llm_embedding(_c(inputs[0].buffer), table, self.wtype, self.block, self.sym, dim, out)
        except ValueError as exc:
            raise _fail(self.info, exc) from None

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Bound:
        ids, out = inputs[0].buffer, outputs[0].buffer
        table = self.table if self.table is not None else inputs[1].buffer
        if not bindable(ids, out, table):
            return None
        embed = functools.partial(_native.llm_embedding, ids, table, self.wtype, self.block, self.sym,
                                  out.shape[-1] if out.ndim else 0, out)

        def call() -> None:
            try:
                embed()
            except ValueError as exc:  # a token id out of range
                raise _fail(self.info, exc) from None

        return call


class CpuRMSNorm(CpuKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if not (_is_f32(node.inputs[0]) and _is_f32(node.inputs[1])):
            return unsupported("RMSNorm on non-float32 tensors")
        return SUPPORTED

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        self.eps = float(node.attr("epsilon", 1e-6))
        self.offset = float(node.attr("offset", 0.0))
        w = node.constants.get(1)
        self.scale = None if w is None else np.ascontiguousarray(self.offset + np.asarray(w, dtype=np.float32),
                                                                  dtype=np.float32)

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        out = outputs[0].buffer
        if out.size == 0:
            return
        x = _c(inputs[0].buffer)
        scale = self.scale
        if scale is None:
            scale = np.ascontiguousarray(self.offset + inputs[1].buffer, dtype=np.float32)
        d = x.shape[-1]
        _native.rms_norm(x.reshape(-1, d), scale, out.reshape(-1, d), self.eps)

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Bound:
        x, out = inputs[0].buffer, outputs[0].buffer
        if self.scale is None or not bindable(x, out):  # a runtime scale is offset and converted per call
            return None
        if out.size == 0:
            return noop
        d = x.shape[-1]
        return functools.partial(_native.rms_norm, x.reshape(-1, d), self.scale, out.reshape(-1, d), self.eps)


_ROPE_TABLES: dict[tuple, object] = {}


def _rope_table(rotary_dim: int, attrs: dict):
    key = (rotary_dim, *sorted((k, v) for k, v in attrs.items() if isinstance(v, int | float | str)))
    table = _ROPE_TABLES.get(key)
    if table is None:
        inv_freq, scale = rope_inv_freq(rotary_dim, attrs)
        table = _ROPE_TABLES[key] = _native.LlmRope(np.ascontiguousarray(inv_freq, dtype=np.float64), scale)
    return table


def _past_len(t: Tensor | None) -> int:
    return int(t.buffer.reshape(-1)[0]) if t.buffer.ndim else int(t.buffer)


def _past_reader(t: Tensor | None) -> Callable[[], int] | None:
    """Reads ``past_len`` from its buffer at call time (it changes every decode step); None if it is not a
    one-element array that a view can follow."""
    buf = t.buffer
    if not isinstance(buf, np.ndarray) or buf.size != 1:
        return None
    flat = buf.reshape(-1)
    if not np.shares_memory(flat, buf):
        return None
    return functools.partial(flat.item, 0)  # .item: a Python int, no numpy scalar


def _past_array(t: Tensor | None) -> np.ndarray | None:
    """``past_len``'s buffer as a one-element int64 array that native code reads when it runs, or None."""
    buf = t.buffer if t is not None else None
    if not isinstance(buf, np.ndarray) or buf.size != 1 or buf.dtype != np.int64 or not buf.flags.c_contiguous:
        return None
    return buf.reshape(-1)


class CpuRotaryEmbedding(CpuKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        x = node.inputs[0]
        if not _is_f32(x) or x.rank != 3:
            return unsupported("RotaryEmbedding on a non-float32 or non-[T, heads, dim] tensor")
        try:
            rope_inv_freq(2, node.node.attrs)
        except HeteroError as exc:
            return unsupported(exc.message)
        return SUPPORTED

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        self.table: Any = None  # the native rope table, built in prepare

    def prepare(self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> None:
        head_dim = static_shape(inputs[0])[-1]
        rotary_dim = int(self.attr("rotary_dim", 0)) or head_dim
        if rotary_dim % 2 or rotary_dim > head_dim:
            raise HeteroError(f"{self.node.label()}: rotary_dim {rotary_dim} must be even and at most head_dim "
                              f"{head_dim}")
        self.table = _rope_table(rotary_dim, self.node.attrs)

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        out = outputs[0].buffer
        if not out.size:
            return
        x, where = _c(inputs[0].buffer), inputs[1].buffer
        if where.size <= 1:
            self.table(x, out, _past_len(inputs[1]))
            return
        if where.size != x.shape[0]:
            raise HeteroError(f"{self.node.label()}: {where.size} positions for {x.shape[0]} rows")
        # one position per row (a step of several sequences): every row at its own, in one call
        self.table.rows(x, out, _c(where.reshape(-1)))

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Bound:
        x, out = inputs[0].buffer, outputs[0].buffer
        if not bindable(x, out):
            return None
        if out.size == 0:
            return noop
        table = self.table
        assert table is not None  # prepared
        where = inputs[1].buffer
        if where.size > 1:  # per-row positions (a step of several sequences), read at call time
            if where.size != x.shape[0] or where.dtype != np.int64 or not where.flags.c_contiguous:
                return None
            return functools.partial(table.rows, x, out, where.reshape(-1))
        flat = _past_array(inputs[1])
        if flat is not None:  # native: reads the position when it runs (and an LlmStep can take it)
            return functools.partial(table, x, out, flat)
        past = _past_reader(inputs[1])
        if past is None:
            return None

        def call() -> None:
            table(x, out, past())

        return call


_KV_ALIASES = {"float16": "f16", "float32": "f32"}


def _kv_dtype(node: NodeInfo) -> str:
    """The node's KV cache type as the native cache names it: f16, f32, q8 (int8, a scale per 32 values), q4r or
    q3r (rotated 4 / 3-bit codes, a float16 scale per 32 values; head_dim a multiple of 32)."""
    kind = str(node.attr("kv_dtype", "f16")).lower()
    kind = _KV_ALIASES.get(kind, kind)
    if kind not in ("f16", "f32", "q8", *KV_ROTATED_BITS):
        raise HeteroError(f"{node.node.label()}: KV cache type {kind!r}; expected f16, f32, q8, q4r or q3r")
    info = node.inputs[1] if len(node.inputs) > 1 else None
    k = info.shape if info is not None else None
    if kind in KV_ROTATED_BITS and k and isinstance(k[-1], int) and (why := check_head_dim(k[-1], kind)):
        raise HeteroError(f"{node.node.label()}: {why}")
    return kind


def _attention_error(label: str, past: int, filled: int, t: int, context: int) -> HeteroError:
    """The error of a step the native kernel refused (it checks the same range)."""
    return cache_range_error(label, past, t, filled, context) or HeteroError(
        f"{label}: the attention kernel refused past_len {past} with {t} new tokens")


@functools.lru_cache(maxsize=64)
def _runs_array(runs: tuple[SlotRun, ...]) -> np.ndarray:
    """``slot_runs``'s runs as ``llm_attention_runs`` takes them: int64 [R, 4] (slot, start, end, position)."""
    table = np.array([(r.slot, r.start, r.end, r.position) for r in runs], dtype=np.int64).reshape(-1, 4)
    table.setflags(write=False)
    return table


class CpuAttention(CpuKernel):
    """Causal GQA attention; the KV cache lives in the native object (one per node and session, or one per slot
    of a node serving several sequences: its rows are then cut into one-sequence runs, each a call on its slot's
    cache)."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        for i in range(3):
            info = node.inputs[i]
            if not _is_f32(info) or info.rank != 3:
                return unsupported("Attention on non-float32 or non-[T, heads, dim] tensors")
        k = node.inputs[1]
        if k.shape is None or k.shape[1] is None or k.shape[2] is None:
            return unsupported("Attention with unknown kv heads / head_dim")
        return SUPPORTED

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        k = node.inputs[1].shape
        if k is None or k[1] is None or k[2] is None:  # accepts() refused these
            raise HeteroError(f"{self.node.label()}: unknown kv heads / head_dim")
        self.hkv, self.d = k[1], k[2]
        self.max_context = int(node.attr("max_context"))
        self.scale = float(node.attr("scale", 0.0)) or 1.0 / math.sqrt(self.d)
        self.kv_dtype = _kv_dtype(node)
        self.cache = _native.LlmAttention(self.hkv, self.d, self.max_context, self.kv_dtype)
        self.slotted = len(node.inputs) > 4 and node.inputs[4] is not None
        self.slots = int(node.attr("slots", 1))
        # slot -> its cache, all made now (a slot's prefill may export or import its cache while a batched step of
        # the others runs; native memory is mapped as positions fill: an unused slot costs nothing)
        self.caches = [self.cache, *(_native.LlmAttention(self.hkv, self.d, self.max_context, self.kv_dtype)
                                     for _ in range(1, self.slots if self.slotted else 1))]

    def _slot_cache(self, slot: int) -> Any:
        if self.slotted and 0 <= slot < self.slots:
            return self.caches[slot]
        one_slot(self.node.label(), slot)
        return self.cache

    def _run_slots(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray, slots: np.ndarray,
                   out: np.ndarray) -> None:
        """Each run of one slot's rows is that slot's one-sequence step; checked here (the errors name the node),
        then all run in one native call (``llm_attention_runs``: one GIL release, no Python per run)."""
        label, context = self.node.label(), self.max_context
        runs = slot_runs(label, positions, slots, self.slots)
        filled: dict[int, int] = {}
        for run in runs:
            b, a = run.end, run.start
            cache = self._slot_cache(run.slot)
            have = filled.get(run.slot, cache.filled)
            if run.position > have or run.position + b - a > context:
                raise _attention_error(label, run.position, have, b - a, context)
            filled[run.slot] = run.position + b - a
        _native.llm_attention_runs(self.caches if self.slotted else [self.cache], q, k, v, _runs_array(runs),
                                   self.scale, out)

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        if self.slotted:
            self._run_slots(_c(inputs[0].buffer), _c(inputs[1].buffer), _c(inputs[2].buffer), inputs[3].buffer,
                            inputs[4].buffer, outputs[0].buffer)
            return
        q = inputs[0].buffer
        past = _past_len(inputs[3])
        cache = self.cache
        t = q.shape[0]
        if past < 0 or past > cache.filled or past + t > self.max_context:
            raise _attention_error(self.node.label(), past, cache.filled, t, self.max_context)
        cache(_c(q), _c(inputs[1].buffer), _c(inputs[2].buffer), past, self.scale, outputs[0].buffer)

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Bound:
        q, k, v = (inputs[i].buffer for i in range(3))
        out = outputs[0].buffer
        if self.slotted:  # positions and slots are read at call time
            positions, slots = inputs[3].buffer, inputs[4].buffer
            if not bindable(q, k, v, out):
                return None
            if q.shape[0] == 1:  # one row (a lone sequence's decode step): its slot's one-sequence call, as is
                one = self._bind_row(q, k, v, inputs[3], inputs[4], out)
                if one is not None:
                    return one
            return functools.partial(self._run_slots, q, k, v, positions, slots, out)
        if not bindable(q, k, v, out):
            return None
        flat = _past_array(inputs[3])
        if flat is not None:
            return AttentionCall(self.cache, q, k, v, flat, self.scale, out, self.max_context, self.node.label())
        past_len = _past_reader(inputs[3])
        if past_len is None:
            return None
        cache, scale, t, context, label = self.cache, self.scale, q.shape[0], self.max_context, self.node.label()

        def call() -> None:
            past = past_len()
            if past < 0 or past > cache.filled or past + t > context:  # the same checks (and errors) as run
                raise _attention_error(label, past, cache.filled, t, context)
            cache(q, k, v, past, scale, out)

        return call

    def _bind_row(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: Tensor | None,
                  slots: Tensor | None, out: np.ndarray) -> Bound:
        """A one-row step of a node serving several sequences: the row's slot and position read at call time, then
        that slot's cache called as a one-sequence step (what ``_run_slots`` does for one run, without cutting rows
        into runs: a lone stream's decode step costs what it costs on a one-sequence model, and ``hetero_cpu.fuse``
        puts it into the step's ``LlmStep`` as it does a one-sequence attention)."""
        position, slot = _past_array(positions), _past_array(slots)
        if position is None or slot is None:
            return None
        return SlotAttentionCall(list(self.caches), q, k, v, position, slot, self.scale, out, self.max_context,
                                 self.node.label())

    # -- the cache as arrays (a prefix cache: hetero.llm.snapshot) --------------------------------------------------
    def export_state(self, slot: int, length: int) -> dict[str, np.ndarray]:
        """Positions [0, length) of the cache, in its native layout (uint8 rows, one per kv head)."""
        k, v, scales = self._slot_cache(slot).export(length)
        return {"k": k, "v": v, "v_scales": scales, "kv_dtype": np.array(_kv_dtype(self.info))}

    def import_state(self, slot: int, length: int, state: dict[str, np.ndarray]) -> None:
        """Make the cache hold the first ``length`` positions of an ``export_state`` (of at least that many)."""
        cache = self._slot_cache(slot)
        kind = str(state.get("kv_dtype"))
        if kind != _kv_dtype(self.info):
            raise HeteroError(f"{self.node.label()}: a {kind} KV cache snapshot does not fit this "
                              f"{_kv_dtype(self.info)} cache")
        try:
            cache.load(length, state["k"], state["v"], state["v_scales"])
        except (ValueError, TypeError, KeyError) as exc:  # not an export of such a cache
            raise HeteroError(f"{self.node.label()}: the snapshot does not fit its KV cache: {exc}") from None


class AttentionCall:
    """A bound one-sequence attention step whose ``past_len`` is a one-element int64 array read at call time; its
    fields let ``hetero_cpu.fuse`` put it into an ``LlmStep`` (which checks the same range natively and, when it
    refuses, runs this call, whose error names the node)."""

    __slots__ = ("cache", "context", "k", "label", "out", "past", "q", "scale", "v")

    def __init__(self, cache: Any, q: np.ndarray, k: np.ndarray, v: np.ndarray, past: np.ndarray, scale: float,
                 out: np.ndarray, context: int, label: str) -> None:
        self.cache, self.q, self.k, self.v, self.past, self.scale, self.out = cache, q, k, v, past, scale, out
        self.context, self.label = context, label

    def __call__(self) -> None:
        past, t, cache = int(self.past[0]), self.q.shape[0], self.cache
        if past < 0 or past > cache.filled or past + t > self.context:  # the same checks (and errors) as run
            raise _attention_error(self.label, past, cache.filled, t, self.context)
        cache(self.q, self.k, self.v, past, self.scale, self.out)


class SlotAttentionCall:
    """A bound one-row attention step of a node serving several sequences: its position and slot are one-element
    int64 arrays read at call time, the slot choosing the cache; ``hetero_cpu.fuse`` puts it into an ``LlmStep``
    (``add_attention_slot``, which checks the same range natively and, when it refuses, runs this call, whose error
    names the node)."""

    __slots__ = ("caches", "context", "k", "label", "out", "past", "q", "scale", "slot", "v")

    def __init__(self, caches: list[Any], q: np.ndarray, k: np.ndarray, v: np.ndarray, past: np.ndarray,
                 slot: np.ndarray, scale: float, out: np.ndarray, context: int, label: str) -> None:
        self.caches, self.q, self.k, self.v, self.past, self.slot = caches, q, k, v, past, slot
        self.scale, self.out, self.context, self.label = scale, out, context, label

    def __call__(self) -> None:
        slot, past = int(self.slot[0]), int(self.past[0])
        if not 0 <= slot < len(self.caches):
            raise HeteroError(f"{self.label}: slot {slot} is not one of the node's {len(self.caches)} slot(s)")
        cache = self.caches[slot]
        if past < 0 or past > cache.filled or past + 1 > self.context:  # the checks (and errors) of _run_slots
            raise _attention_error(self.label, past, cache.filled, 1, self.context)
        cache(self.q, self.k, self.v, past, self.scale, self.out)


class CpuSwiGLU(CpuKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if not (_is_f32(node.inputs[0]) and _is_f32(node.inputs[1])):
            return unsupported("SwiGLU on non-float32 tensors")
        a, b = node.inputs[0].shape, node.inputs[1].shape
        if a is None or b is None or len(a) != len(b):
            return unsupported("SwiGLU with broadcasting (cpu: same shapes)")
        return SUPPORTED

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        g, u = inputs[0].buffer, inputs[1].buffer
        if g.shape != u.shape:
            raise HeteroError(f"{self.node.label()}: gate {list(g.shape)} and up {list(u.shape)} differ")
        _native.llm_swiglu(_c(g), _c(u), outputs[0].buffer)

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Bound:
        g, u, out = inputs[0].buffer, inputs[1].buffer, outputs[0].buffer
        if g.shape != u.shape or not bindable(g, u, out):
            return None  # run raises the shape error
        return functools.partial(_native.llm_swiglu, g, u, out)


def _present(node: NodeInfo, i: int) -> bool:
    return i < len(node.inputs) and node.inputs[i] is not None


class CpuMoE(CpuKernel):
    """Routed SwiGLU experts (tokens are grouped by expert so each expert's weights are read once per call) plus the
    optional shared expert and its sigmoid gate (inputs 5-8)."""

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        if any(i not in node.constants for i in (1, 2, 3, 4)):
            return unsupported("MoE with router / expert weights computed at run time")
        shared = [_present(node, i) for i in (5, 6, 7)]
        if any(shared) and not all(shared):
            return unsupported("MoE with a partial shared expert (inputs 5-7 go together)")
        if any(_present(node, i) and i not in node.constants for i in (5, 6, 7, 8)):
            return unsupported("MoE with shared-expert weights computed at run time")
        if not _is_f32(node.inputs[0]) or (_present(node, 8) and not _is_f32(node.inputs[8])):
            return unsupported("MoE on a non-float32 activation or shared expert gate")
        prefixes = ("gate_", "up_", "down_", *(("shared_gate_", "shared_up_", "shared_down_") if all(shared) else ()))
        for prefix in prefixes:
            verdict = _format_ok(node, prefix)
            if not verdict:
                return verdict
        return SUPPORTED

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        router = np.ascontiguousarray(node.constants[1], dtype=np.float32)
        gate, up, down = (node.constants[i] for i in (2, 3, 4))
        hidden = router.shape[1]
        inter = gate.shape[1]
        shared = {}
        if _present(node, 5):
            s_gate, s_up, s_down = (node.constants[i] for i in (5, 6, 7))
            shared = {"shared_gate": _weights(node, s_gate, hidden, "shared_gate_"),
                      "shared_up": _weights(node, s_up, hidden, "shared_up_"),
                      "shared_down": _weights(node, s_down, s_gate.shape[0], "shared_down_")}
            if _present(node, 8):
                shared["shared_expert_gate"] = np.ascontiguousarray(node.constants[8], dtype=np.float32).reshape(-1)
        try:
            self.moe = _native.LlmMoE(router, _weights(node, gate, hidden, "gate_"), _weights(node, up, hidden, "up_"),
                                      _weights(node, down, inter, "down_"), int(node.attr("top_k")),
                                      bool(node.attr("norm_topk_prob", 1)), **shared)
        except ValueError as exc:
            raise _fail(node, exc) from None

    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        out = outputs[0].buffer
        if out.size:
            self.moe(_c(inputs[0].buffer), out)

    def bind(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> Bound:
        x, out = inputs[0].buffer, outputs[0].buffer
        if not bindable(x, out):
            return None
        return functools.partial(self.moe, x, out) if out.size else noop


KERNELS = {
    ("hetero", "QMatMul"): CpuQMatMul,
    ("hetero", "Embedding"): CpuEmbedding,
    ("hetero", "RMSNorm"): CpuRMSNorm,
    ("hetero", "RotaryEmbedding"): CpuRotaryEmbedding,
    ("hetero", "Attention"): CpuAttention,
    ("hetero", "SwiGLU"): CpuSwiGLU,
    ("hetero", "MoE"): CpuMoE,
}
