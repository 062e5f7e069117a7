"""LLM ops (domain ``hetero``): the decoder building blocks every model family is made of.

These schemas are the contract for native kernels: each docstring states the inputs, attributes and layouts, and
the numpy reference below it is the oracle kernels are tested against. Activations are float32. Sequences are 2-D
``[T, hidden]`` (one sequence, no batch axis); per-head tensors are ``[T, heads, head_dim]``.

Weights (``Embedding`` tables, ``QMatMul`` and ``MoE`` matrices) share three attributes:

* ``wtype``: ``"f32"`` (float32), ``"f16"`` (float16), ``"bf16"`` (bfloat16 bit patterns in a uint16 array), or
  hetero's block-quantized ``"q8"`` / ``"q4"`` (a uint8 array of blocks, layout in ``hetero.contract.quant``);
* ``block_size`` (32, 64 or 128) and ``symmetric`` (1, or 0 for a per-block minimum): quantized types only.

A float weight is ``[N, K]``; a quantized one is ``uint8[N, ceil(K / block_size) * block_bytes]``, K being read
from the activation (or the ``dim`` attribute of ``Embedding``).

GGUF's own block layouts are wtypes too, stored as in the file: ``"q5_0"``, ``"q5_1"`` (blocks of 32) and the
k-quants ``"q4_k"``, ``"q5_k"``, ``"q6_k"`` (blocks of 256); byte layouts in ``hetero.contract.quant``. They take no
``block_size`` / ``symmetric`` attribute, and K must be a whole number of their blocks. (GGUF's Q8_0, Q4_0 and
Q4_1 are ``q8`` / ``q4`` with ``block_size`` 32.)
"""

from __future__ import annotations

import math

import numpy as np

from ..contract import dtypes, quant
from ..contract.errors import HeteroError
from ..contract.graph import HETERO_DOMAIN
from ..contract.kv_rotated import KV_ROTATED_BITS, check_head_dim, key_mean, kv_rotated_round
from ..contract.opforms import cache_range_error, rope_inv_freq
from ..contract.registry import OpContext, op
from ..contract.tensor import Dim, TensorInfo
from .shapes import input_info
from .slots import by_slot, check_positions, check_slots, is_multi

_FLOAT_NP = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}


# -- weights ---------------------------------------------------------------------------------------------------------
def _wattrs(ctx: OpContext, prefix: str = "") -> tuple[str, int, int]:
    """(wtype, block_size, symmetric) of a weight; ``<prefix>wtype`` (MoE: ``gate_``, ``up_``, ``down_``), when
    present, replaces the shared three with ``<prefix>wtype``, ``<prefix>block_size``, ``<prefix>symmetric``."""
    if prefix and (prefix + "wtype") in ctx.node.attrs:
        return ctx.attr(prefix + "wtype"), ctx.attr(prefix + "block_size", 32), ctx.attr(prefix + "symmetric", 1)
    return ctx.attr("wtype", "f32"), ctx.attr("block_size", 32), ctx.attr("symmetric", 1)


def _format(ctx: OpContext, prefix: str = "") -> quant.QuantFormat | quant.GgmlFormat | None:
    try:
        return quant.weight_format(*_wattrs(ctx, prefix))
    except HeteroError as exc:
        raise ctx.fail(exc.message) from None


def _check_weight(ctx: OpContext, index: int, k: Dim, what: str, prefix: str = "") -> None:
    """Check a weight input's dtype and its last dim against K (the logical row length)."""
    info = input_info(ctx, index)
    wtype = _wattrs(ctx, prefix)[0]
    fmt = _format(ctx, prefix)
    want_dtype = dtypes.uint8 if fmt is not None else dtypes.from_numpy(_FLOAT_NP[wtype])
    if info.dtype != want_dtype:
        raise ctx.fail(f"{what} of wtype {wtype!r} must be {want_dtype}, got {info.dtype}")
    if info.shape is None or k is None or info.shape[-1] is None:
        return
    if isinstance(fmt, quant.GgmlFormat) and k % fmt.block_size:
        raise ctx.fail(f"{what} of wtype {wtype!r} needs rows of a multiple of {fmt.block_size} inputs, got {k}")
    want = fmt.row_bytes(k) if fmt is not None else k
    if info.shape[-1] != want:
        unit = "bytes" if fmt is not None else "elements"
        raise ctx.fail(f"{what} rows hold {info.shape[-1]} {unit}; rows of {k} inputs need {want} {unit}")


def _dense(ctx: OpContext, w: np.ndarray, k: int, prefix: str = "") -> np.ndarray:
    return quant.weight_to_f32(w, _wattrs(ctx, prefix)[0], k, _format(ctx, prefix))


# -- Embedding -------------------------------------------------------------------------------------------------------
def _embedding_infer(ctx: OpContext) -> list[TensorInfo]:
    ids, table = input_info(ctx, 0), input_info(ctx, 1)
    if ids.dtype not in (dtypes.int64, dtypes.int32):
        raise ctx.fail(f"ids must be int64 or int32, got {ids.dtype}")
    fmt = _format(ctx)
    dim = ctx.attr("dim", None) if fmt is not None else (None if table.shape is None else table.shape[-1])
    if fmt is not None and dim is None:
        raise ctx.fail("a quantized table needs the 'dim' attribute (elements per row)")
    _check_weight(ctx, 1, dim, "table")
    shape = None if ids.shape is None else (*ids.shape, dim)
    return [TensorInfo(dtypes.float32, shape)]


@op("Embedding", domain=HETERO_DOMAIN, infer=_embedding_infer)
def embedding(ctx: OpContext) -> list[np.ndarray]:
    """Row lookup: out[..., :] = table[ids[...], :] as float32.

    Inputs: ids (int64/int32, any shape), table (``[V, dim]`` float or quantized rows, see the module doc).
    Attributes: ``wtype``, ``block_size``, ``symmetric``; ``dim`` (row length, required when quantized).
    An id outside [0, V) is an error.
    """
    ids, table = ctx.array(0), ctx.array(1)
    vocab = table.shape[0]
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        bad = int(ids[(ids < 0) | (ids >= vocab)].reshape(-1)[0])
        raise HeteroError(f"{ctx.node.label()}: token id {bad} is outside the vocabulary [0, {vocab})")
    dim = int(ctx.attr("dim", table.shape[-1]))
    rows = table[ids.reshape(-1)]
    return [_dense(ctx, rows, dim).reshape(*ids.shape, dim)]


# -- RMSNorm ---------------------------------------------------------------------------------------------------------
def _rmsnorm_infer(ctx: OpContext) -> list[TensorInfo]:
    x, w = input_info(ctx, 0), input_info(ctx, 1)
    if x.shape is not None and w.shape is not None and x.shape[-1] is not None and w.shape != (x.shape[-1],):
        raise ctx.fail(f"weight {list(w.shape)} must be [{x.shape[-1]}], the last dim of x {list(x.shape)}")
    return [x]


@op("RMSNorm", domain=HETERO_DOMAIN, infer=_rmsnorm_infer)
def rms_norm(ctx: OpContext) -> list[np.ndarray]:
    """y = x / sqrt(mean(x², last axis) + epsilon) * (offset + weight).

    Inputs: x (float32, any rank, normalised over its last axis), weight (float32 ``[D]``).
    Attributes: ``epsilon`` (default 1e-6), ``offset`` (default 0.0; 1.0 for models that store weight - 1).
    The mean of squares is accumulated in float32 or wider.
    """
    x, w = ctx.array(0), ctx.array(1)
    eps, offset = float(ctx.attr("epsilon", 1e-6)), float(ctx.attr("offset", 0.0))
    x64 = x.astype(np.float64)
    inv = 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)
    return [(x64 * inv).astype(np.float32) * (offset + w.astype(np.float32))]


# -- RotaryEmbedding -------------------------------------------------------------------------------------------------
def _heads_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    if x.rank is not None and x.rank != 3:
        raise ctx.fail(f"x must be [T, heads, head_dim], got rank {x.rank}")
    check_positions(ctx, 1)
    return [x]


@op("RotaryEmbedding", domain=HETERO_DOMAIN, infer=_heads_infer)
def rotary_embedding(ctx: OpContext) -> list[np.ndarray]:
    """Rotary position embedding, NeoX (rotate-half) layout, at positions past_len .. past_len + T - 1.

    Inputs: x (float32 ``[T, heads, head_dim]``), past_len (int64 scalar: position of the first row; or int64
    ``[T]``: the position of each row, in a step of several sequences).
    Attributes: ``theta`` (rope_theta, default 10000), ``rotary_dim`` (default 0 = head_dim; only the first
    rotary_dim dims of each head rotate, the rest pass through), ``scaling`` ("none" | "linear" | "yarn"),
    ``factor``; for YaRN ``original_max_position``, ``beta_fast`` (32), ``beta_slow`` (1), ``truncate`` (1) and
    ``attention_factor`` (multiplies cos and sin; the model builder resolves its default, 0.1 ln(factor) + 1).

    With half = rotary_dim / 2, inv_freq[i] = theta^(-2i / rotary_dim) (linear: divided by factor; YaRN: blended
    per dim between the two, see ``rope_inv_freq``), angle = position * inv_freq[i]:
    y[i] = x[i] cos - x[i + half] sin, y[i + half] = x[i + half] cos + x[i] sin, for 0 <= i < half.
    """
    x, where = ctx.array(0), np.asarray(ctx.array(1))
    head_dim = x.shape[-1]
    rotary_dim = int(ctx.attr("rotary_dim", 0)) or head_dim
    if rotary_dim % 2 or rotary_dim > head_dim:
        raise ctx.fail(f"rotary_dim {rotary_dim} must be even and at most head_dim {head_dim}")
    inv_freq, scale = rope_inv_freq(rotary_dim, ctx.node.attrs)
    first = int(where.reshape(-1)[0]) if where.size else 0
    positions = where.astype(np.float64).reshape(-1) if where.size > 1 else \
        np.arange(first, first + x.shape[0], dtype=np.float64)
    angles = positions[:, None] * inv_freq[None, :]
    cos = (np.cos(angles) * scale).astype(np.float32)[:, None, :]
    sin = (np.sin(angles) * scale).astype(np.float32)[:, None, :]
    half = rotary_dim // 2
    x1, x2 = x[..., :half], x[..., half:rotary_dim]
    out = x.astype(np.float32, copy=True)
    out[..., :half] = x1 * cos - x2 * sin
    out[..., half:rotary_dim] = x2 * cos + x1 * sin
    return [out]


# -- Attention -------------------------------------------------------------------------------------------------------
KV_DTYPES = ("f16", "f32", "q8", "q4r", "q3r")  # the Attention op's kv_dtype values (q4r / q3r: contract.kv_rotated)
KV_Q8_BLOCK = 32  # q8 KV cache: values of a (position, head) row per scale


def kv_q8_round(x: np.ndarray) -> np.ndarray:
    """The values a q8 KV cache holds for rows ``x[..., D]`` (float32 in, float32 out).

    Each row is cut into blocks of 32 values (the last one shorter when D is not a multiple of 32); a block with
    amax = max |x| stores d = amax / 127 (float32) and q = clamp(round_half_even(x * (127 / amax)), -127, 127) as
    int8 (q = 0 when amax = 0), and reads back as q * d. Per-block scales keep one outlier channel (common in keys)
    from flattening the rest of its head.
    """
    x = np.asarray(x, dtype=np.float32)
    d_len = x.shape[-1]
    nb = -(-d_len // KV_Q8_BLOCK)
    pad = np.zeros((*x.shape[:-1], nb * KV_Q8_BLOCK), dtype=np.float32)
    pad[..., :d_len] = x
    blocks = pad.reshape(*x.shape[:-1], nb, KV_Q8_BLOCK)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    scale = amax / np.float32(127)
    inv = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax > 0)
    q = np.clip(np.rint(blocks * inv), -127, 127)
    return (q * scale).astype(np.float32).reshape(pad.shape)[..., :d_len]


def kv_round(x: np.ndarray, kv_dtype: str) -> np.ndarray:
    """``x`` (float32) as a KV cache of type ``kv_dtype`` stores it, read back as float32."""
    if kv_dtype == "q8":
        return kv_q8_round(x)
    if kv_dtype in KV_ROTATED_BITS:
        return kv_rotated_round(x, kv_dtype)
    return x.astype(np.float16 if kv_dtype == "f16" else np.float32).astype(np.float32)


def _attention_infer(ctx: OpContext) -> list[TensorInfo]:
    q, k, v = (input_info(ctx, i) for i in range(3))
    check_positions(ctx, 3)
    check_slots(ctx)
    for name, info in (("q", q), ("k", k), ("v", v)):
        if info.rank is not None and info.rank != 3:
            raise ctx.fail(f"{name} must be [T, heads, head_dim], got {info}")
    if q.shape is None:
        return [TensorInfo(dtypes.float32, (None, None))]
    if k.shape is not None and q.shape[1] is not None and k.shape[1] is not None and q.shape[1] % k.shape[1]:
        raise ctx.fail(f"query heads {q.shape[1]} are not a multiple of key/value heads {k.shape[1]}")
    if k.shape is not None and v.shape is not None and k.shape != v.shape:
        raise ctx.fail(f"k {list(k.shape)} and v {list(v.shape)} differ")
    width = None if q.shape[1] is None or q.shape[2] is None else q.shape[1] * q.shape[2]
    if int(ctx.attr("max_context", 0)) < 1:
        raise ctx.fail("the 'max_context' attribute (KV cache length) must be positive")
    return [TensorInfo(dtypes.float32, (q.shape[0], width))]


@op("Attention", domain=HETERO_DOMAIN, infer=_attention_infer, stateful=True)
def attention(ctx: OpContext) -> list[np.ndarray]:
    """Causal grouped-query attention over this layer's KV cache, which the op owns (one per node and session).

    Inputs: q (float32 ``[T, Hq, D]``), k and v (float32 ``[T, Hkv, D]``, Hq a multiple of Hkv), past_len (int64
    scalar). Output: float32 ``[T, Hq * D]`` (the heads concatenated, ready for the output projection).
    Attributes: ``max_context`` (cache length in tokens, required), ``scale`` (default 0 = 1/sqrt(D)), ``kv_dtype``
    ("f16", the default: the cache stores k and v rounded to float16 — half the memory and bandwidth of decode's
    attention; "f32": exact; "q8": int8 with a float32 scale per block of 32 values of a (position, head) row,
    see ``kv_q8_round`` — 1.125 bytes a value, and a small accuracy loss measured in docs/llm.md; or "q4r" / "q3r":
    rotated by a Walsh-Hadamard transform and 4 / 3-bit Lloyd-Max codes with a float16 scale per 32 values, see
    ``hetero.contract.kv_rotated`` — 0.5625 / 0.4375 bytes a value, head_dim a multiple of 32; docs/long-context.md).

    The new k/v rows are written at cache positions [past_len, past_len + T); query row t (position past_len + t)
    attends to cache positions [0, past_len + t] with softmax(q·k * scale); query head h reads kv head
    h // (Hq / Hkv). past_len may be smaller than what the cache holds (rolling back forgets the rest) but never
    larger; past_len + T > max_context is an error.

    A step of several sequences (``hetero.llm.batch``): past_len is int64 ``[T]`` (each row's position) and the
    optional input 4 ``slots`` (int64 ``[T]``) says which of the node's ``slots`` caches (attribute, default 1) each
    row belongs to; each run of rows of one slot at consecutive positions is the step above on that slot's cache
    (``hetero.contract.opforms.slot_runs``).
    """
    if is_multi(ctx):
        return by_slot(ctx, attention, (0, 1, 2))
    q, k, v = ctx.array(0), ctx.array(1), ctx.array(2)
    past_len = int(np.asarray(ctx.array(3)).reshape(-1)[0])
    t, hq, d = q.shape
    hkv = k.shape[1]
    max_context = int(ctx.attr("max_context"))
    state = ctx.state if ctx.state is not None else {}
    filled = int(state.get("filled", 0))
    error = cache_range_error(ctx.node.label(), past_len, t, filled, max_context)
    if error is not None:
        raise error
    if "k" not in state or state["k"].shape != (hkv, max_context, d):
        # np.zeros maps fresh pages lazily: a long context costs memory only as it fills.
        state["k"] = np.zeros((hkv, max_context, d), dtype=np.float32)
        state["v"] = np.zeros((hkv, max_context, d), dtype=np.float32)
    end = past_len + t
    kv_dtype = str(ctx.attr("kv_dtype", "f16"))
    if kv_dtype not in KV_DTYPES:
        raise ctx.fail(f"kv_dtype {kv_dtype!r}; expected one of {', '.join(KV_DTYPES)}")
    if kv_dtype in KV_ROTATED_BITS and (why := check_head_dim(d, kv_dtype)):
        raise ctx.fail(why)
    keys_in = k.transpose(1, 0, 2)
    if kv_dtype in KV_ROTATED_BITS:  # centred keys (see hetero.contract.kv_rotated): the softmax cancels the shift
        if past_len == 0 or "kmean" not in state:
            state["kmean"] = key_mean(k)
        keys_in = keys_in - state["kmean"][:, None, :]
    # Kept in float32 arrays, holding exactly the values the cache type stores.
    state["k"][:, past_len:end] = kv_round(keys_in, kv_dtype)
    state["v"][:, past_len:end] = kv_round(v.transpose(1, 0, 2), kv_dtype)
    state["filled"] = end
    keys, values = state["k"][:, :end], state["v"][:, :end]  # [Hkv, L, D]
    scale = float(ctx.attr("scale", 0.0)) or 1.0 / math.sqrt(d)
    group = hq // hkv
    qg = q.astype(np.float32).transpose(1, 0, 2).reshape(hkv, group * t, d)  # [Hkv, group*T, D]
    scores = np.matmul(qg, keys.transpose(0, 2, 1)) * np.float32(scale)  # [Hkv, group*T, L]
    scores = scores.reshape(hkv, group, t, end)
    visible = np.arange(end)[None, :] <= (past_len + np.arange(t))[:, None]  # [T, L]
    scores = np.where(visible, scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    out = np.matmul(probs.reshape(hkv, group * t, end), values)  # [Hkv, group*T, D]
    out = out.reshape(hq, t, d).transpose(1, 0, 2).reshape(t, hq * d)
    return [out.astype(np.float32)]


# -- SwiGLU ----------------------------------------------------------------------------------------------------------
def _swiglu_infer(ctx: OpContext) -> list[TensorInfo]:
    gate, up = input_info(ctx, 0), input_info(ctx, 1)
    if gate.shape is not None and up.shape is not None and len(gate.shape) == len(up.shape):
        for a, b in zip(gate.shape, up.shape, strict=True):
            if a is not None and b is not None and a != b:
                raise ctx.fail(f"gate {list(gate.shape)} and up {list(up.shape)} differ")
    return [gate]


def _silu(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float32)
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x))


@op("SwiGLU", domain=HETERO_DOMAIN, infer=_swiglu_infer)
def swiglu(ctx: OpContext) -> list[np.ndarray]:
    """silu(gate) * up, elementwise, with silu(x) = x / (1 + exp(-x)). Inputs: gate, up (float32, same shape)."""
    return [(_silu(ctx.array(0)) * ctx.array(1)).astype(np.float32)]


# -- QMatMul ---------------------------------------------------------------------------------------------------------
def _qmatmul_infer(ctx: OpContext) -> list[TensorInfo]:
    x, w = input_info(ctx, 0), input_info(ctx, 1)
    if x.dtype != dtypes.float32:
        raise ctx.fail(f"x must be float32, got {x.dtype}")
    if w.rank is not None and w.rank != 2:
        raise ctx.fail(f"weight must be 2-D, got {w}")
    k = None if x.shape is None else x.shape[-1]
    _check_weight(ctx, 1, k, "weight")
    n = None if w.shape is None else w.shape[0]
    if ctx.has_input(2):
        b = input_info(ctx, 2)
        if b.shape is not None and n is not None and b.shape != (n,):
            raise ctx.fail(f"bias {list(b.shape)} must be [{n}]")
    y = TensorInfo(dtypes.float32, None if x.shape is None else (*x.shape[:-1], n))
    if len(ctx.node.outputs) > 1:  # the argmax of each row (the greedy token of an LM head)
        return [y, TensorInfo(dtypes.int64, None if x.shape is None else tuple(x.shape[:-1]))]
    return [y]


@op("QMatMul", domain=HETERO_DOMAIN, infer=_qmatmul_infer)
def qmatmul(ctx: OpContext) -> list[np.ndarray]:
    """y = x @ W^T (+ bias): a linear layer with the weight in PyTorch's ``[out, in]`` order.

    Inputs: x (float32 ``[..., K]``), W (``[N, K]`` float or ``[N, row_bytes]`` block-quantized, see the module
    doc), optional bias (float32 ``[N]``). Output float32 ``[..., N]``; an optional second output, int64 ``[...]``:
    the argmax of each output row as numpy's (the first maximum; the first NaN where a row holds one), which an LM
    head's greedy step reads instead of the logits (the cpu plugin computes it as it writes them). Attributes:
    ``wtype``, ``block_size``, ``symmetric``. Kernels read quantized blocks directly and accumulate in float32 (or
    wider).
    """
    x, w = ctx.array(0), ctx.array(1)
    y = np.matmul(x, _dense(ctx, w, x.shape[-1]).T)
    if ctx.has_input(2):
        y = y + ctx.array(2)
    y = y.astype(np.float32)
    if len(ctx.node.outputs) > 1:
        return [y, np.argmax(y, axis=-1).astype(np.int64)]
    return [y]


# -- MoE -------------------------------------------------------------------------------------------------------------
def _moe_infer(ctx: OpContext) -> list[TensorInfo]:
    x, router = input_info(ctx, 0), input_info(ctx, 1)
    gate, up, down = (input_info(ctx, i) for i in (2, 3, 4))
    if x.rank is not None and x.rank != 2:
        raise ctx.fail(f"x must be [T, hidden], got {x}")
    hidden = None if x.shape is None else x.shape[1]
    experts = None if router.shape is None else router.shape[0]
    if router.dtype != dtypes.float32:
        raise ctx.fail(f"router must be float32, got {router.dtype}")
    for name, info in (("gate", gate), ("up", up), ("down", down)):
        if info.shape is not None and (len(info.shape) != 3 or (experts is not None and info.shape[0] != experts)):
            raise ctx.fail(f"{name} must be [{experts}, rows, row] (stacked experts), got {info}")
    inter = None if gate.shape is None else gate.shape[1]
    _check_weight(ctx, 2, hidden, "gate", "gate_")
    _check_weight(ctx, 3, hidden, "up", "up_")
    _check_weight(ctx, 4, inter, "down", "down_")
    top_k = int(ctx.attr("top_k"))
    if experts is not None and not 1 <= top_k <= experts:
        raise ctx.fail(f"top_k {top_k} must be in [1, {experts}]")
    shared = [ctx.has_input(i) for i in range(5, 9)]
    if any(shared) and not all(shared[:3]):
        raise ctx.fail("the shared expert needs shared_gate, shared_up and shared_down (inputs 5-7)")
    if all(shared[:3]):
        shared_shape = input_info(ctx, 5).shape
        s_inter = None if shared_shape is None else shared_shape[0]
        _check_weight(ctx, 5, hidden, "shared_gate", "shared_gate_")
        _check_weight(ctx, 6, hidden, "shared_up", "shared_up_")
        _check_weight(ctx, 7, s_inter, "shared_down", "shared_down_")
    if shared[3]:
        sg = input_info(ctx, 8)
        if sg.dtype != dtypes.float32 or (sg.shape is not None and hidden is not None and sg.shape != (1, hidden)):
            raise ctx.fail(f"shared_expert_gate must be float32 [1, {hidden}], got {sg}")
    return [TensorInfo(dtypes.float32, x.shape)]


def moe_routing(x: np.ndarray, router: np.ndarray, top_k: int, normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """Chosen experts ``int64[T, top_k]`` (by descending probability) and their weights ``float32[T, top_k]``."""
    logits = x @ router.T
    logits = logits - logits.max(axis=-1, keepdims=True)
    probs = np.exp(logits.astype(np.float64))
    probs /= probs.sum(axis=-1, keepdims=True)
    # A stable sort on -p breaks ties toward the lower expert index.
    chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]
    weights = np.take_along_axis(probs, chosen, axis=-1)
    if normalize:
        weights /= weights.sum(axis=-1, keepdims=True)
    return chosen, weights.astype(np.float32)


@op("MoE", domain=HETERO_DOMAIN, infer=_moe_infer)
def moe(ctx: OpContext) -> list[np.ndarray]:
    """A routed mixture of SwiGLU experts.

    Inputs: x (float32 ``[T, H]``), router (float32 ``[E, H]``), gate and up (stacked experts ``[E, I, H]`` or
    quantized ``[E, I, row_bytes(H)]``), down (``[E, H, I]`` or ``[E, H, row_bytes(I)]``). Output float32 ``[T, H]``.
    Attributes: ``top_k``, ``norm_topk_prob`` (1: the chosen weights are renormalised to sum to 1), ``wtype``,
    ``block_size``, ``symmetric`` (shared by the three expert tensors). Optional per-tensor overrides (GGUF files
    mix types, e.g. q4_k gate/up with a q6_k down): ``gate_wtype`` / ``up_wtype`` / ``down_wtype``, each with its
    own ``<name>_block_size`` / ``<name>_symmetric``, replace the shared three for that tensor when present.

    p = softmax(x @ router^T) per token; the top_k experts (ties to the lower index) with weights p (or p / sum);
    y[t] = sum over chosen e of weight * down_e(silu(gate_e(x[t])) * up_e(x[t])), each _e(z) = z @ W_e^T.
    Tokens are grouped by expert so each expert's weights are read once per call.

    Shared expert (Qwen2-MoE / Qwen3-Next / Qwen3.5-MoE), optional inputs: shared_gate and shared_up (``[I_s, H]``
    or quantized rows), shared_down (``[H, I_s]``), all three or none, each with the shared three weight attributes
    or its own ``shared_gate_`` / ``shared_up_`` / ``shared_down_`` prefixed ones; and shared_expert_gate (float32
    ``[1, H]``, optional): y[t] += s * down_s(silu(gate_s(x[t])) * up_s(x[t])) with
    s = sigmoid(x[t] @ shared_expert_gate^T) (s = 1 without it). A backend whose MoE kernel does not implement
    inputs 5-8 must refuse such nodes; the hybrid families build the shared expert from QMatMul / SwiGLU /
    Sigmoid / Mul for now.
    """
    x, router, gate, up, down = map(ctx.array, range(5))
    hidden = x.shape[1]
    inter = gate.shape[1]
    chosen, weights = moe_routing(x, router, int(ctx.attr("top_k")), bool(ctx.attr("norm_topk_prob", 1)))
    out = np.zeros_like(x, dtype=np.float32)
    for expert in np.unique(chosen):
        tokens, slot = np.nonzero(chosen == expert)
        xe = x[tokens]
        h = _silu(xe @ _dense(ctx, gate[expert], hidden, "gate_").T) * (xe @ _dense(ctx, up[expert], hidden, "up_").T)
        ye = h @ _dense(ctx, down[expert], inter, "down_").T
        np.add.at(out, tokens, ye * weights[tokens, slot][:, None])
    if ctx.has_input(5) and ctx.has_input(6) and ctx.has_input(7):
        sg, su, sd = ctx.array(5), ctx.array(6), ctx.array(7)
        s_inter = sg.shape[0]
        h = _silu(x @ _dense(ctx, sg, hidden, "shared_gate_").T) * (x @ _dense(ctx, su, hidden, "shared_up_").T)
        ys = h @ _dense(ctx, sd, s_inter, "shared_down_").T
        if ctx.has_input(8):
            score = x.astype(np.float64) @ ctx.array(8).astype(np.float64).T  # [T, 1]
            ys = ys * (1.0 / (1.0 + np.exp(-score))).astype(np.float32)
        out += ys.astype(np.float32)
    return [out]
