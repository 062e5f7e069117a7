"""ONNX Attention (opset 23+): scaled dot-product attention with MHA/GQA/MQA heads, masks, softcap and a KV cache."""

from __future__ import annotations

import numpy as np

from ..contract.registry import OpContext, op
from ..contract.tensor import Dim, TensorInfo
from .shapes import input_info, unknown


def _heads(ctx: OpContext) -> tuple[int | None, int | None]:
    return ctx.attr("q_num_heads", None), ctx.attr("kv_num_heads", None)


def _div(d: Dim, n: int | None) -> Dim:
    return None if d is None or n is None else d // n


def _attention_infer(ctx: OpContext) -> list[TensorInfo]:
    q, k, v = (input_info(ctx, i) for i in range(3))
    if q.shape is None or k.shape is None or v.shape is None:
        return [unknown(q.dtype), unknown(k.dtype, 4), unknown(v.dtype, 4), unknown(q.dtype, 4)]
    hq, hkv = _heads(ctx)
    if len(q.shape) == 4:
        b, hq, sq, _ = q.shape
        hkv, skv, d = k.shape[1], k.shape[2], k.shape[3]
        dv = v.shape[3]
    else:
        b, sq = q.shape[:2]
        skv = k.shape[1]
        d, dv = _div(k.shape[2], hkv), _div(v.shape[2], hkv)
    past = input_info(ctx, 4).shape if ctx.has_input(4) else None
    p = 0 if not ctx.has_input(4) else (None if past is None else past[2])
    total = None if p is None or skv is None else p + skv
    y = (b, hq, sq, dv) if len(q.shape) == 4 else (b, sq, None if hq is None or dv is None else hq * dv)
    return [TensorInfo(q.dtype, y), TensorInfo(k.dtype, (b, hkv, total, d)), TensorInfo(v.dtype, (b, hkv, total, dv)),
            TensorInfo(q.dtype, (b, hq, sq, total))]


def _to_4d(ctx: OpContext, x: np.ndarray, heads: int | None) -> np.ndarray:
    if x.ndim == 4:
        return x
    if heads is None:
        raise ctx.fail("3-D inputs need the q_num_heads and kv_num_heads attributes")
    b, s, hidden = x.shape
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


@op("Attention", infer=_attention_infer)
def attention(ctx: OpContext) -> list[np.ndarray]:
    """softmax(Q K^T * scale (+ softcap) + mask) V, with grouped heads and an optional past KV cache."""
    q_in, k_in, v_in = map(ctx.array, range(3))
    hq_attr, hkv_attr = _heads(ctx)
    q = _to_4d(ctx, q_in, hq_attr).astype(np.float64)
    k = _to_4d(ctx, k_in, hkv_attr).astype(np.float64)
    v = _to_4d(ctx, v_in, hkv_attr).astype(np.float64)
    value = lambda i: ctx.array(i) if ctx.has_input(i) else None  # noqa: E731
    mask, past_k, past_v, nonpad = value(3), value(4), value(5), value(6)
    past_len = 0
    if (past_k is None) != (past_v is None):
        raise ctx.fail("past_key and past_value are given together or not at all")
    if past_k is not None and past_v is not None:
        past_len = past_k.shape[2]
        k = np.concatenate([past_k.astype(np.float64), k], axis=2)
        v = np.concatenate([past_v.astype(np.float64), v], axis=2)
    present_k, present_v = k, v
    b, hq, sq, d = q.shape
    hkv, total = k.shape[1], k.shape[2]
    if hq != hkv:  # GQA / MQA: each kv head serves hq / hkv query heads
        k, v = np.repeat(k, hq // hkv, axis=1), np.repeat(v, hq // hkv, axis=1)
    scale = ctx.attr("scale", None)
    scale = 1 / np.sqrt(d) if scale is None else scale
    scores = (q @ np.swapaxes(k, -1, -2)) * scale
    qk_raw = scores
    softcap = ctx.attr("softcap", 0.0)
    if softcap:
        scores = softcap * np.tanh(scores / softcap)
    qk_capped = scores
    bias = np.zeros((b, 1, sq, total))
    allowed = np.ones((b, 1, sq, total), dtype=bool)
    if mask is not None:
        if mask.shape[-1] < total:  # a short mask is padded with disallowed positions
            widths = [(0, 0)] * (mask.ndim - 1) + [(0, total - mask.shape[-1])]
            mask = np.pad(mask, widths, constant_values=False if mask.dtype == bool else -np.inf)
        if mask.dtype == bool:
            allowed = allowed & mask
        else:
            bias = bias + mask.astype(np.float64)
    rows, cols = np.arange(sq)[:, None], np.arange(total)[None, :]
    if nonpad is not None:
        offset = (nonpad.astype(np.int64) - sq).reshape(b, 1, 1, 1)
        allowed = allowed & (cols[None, None] < nonpad.astype(np.int64).reshape(b, 1, 1, 1))
    else:
        offset = np.full((b, 1, 1, 1), past_len)
    position = rows[None, None] + offset
    if ctx.attr("is_causal", 0):
        allowed = allowed & (cols[None, None] <= position)
    left, right = ctx.attr("left_window_size", -1), ctx.attr("right_window_size", -1)
    if left >= 0:
        allowed = allowed & (cols[None, None] >= position - left)
    if right >= 0:
        allowed = allowed & (cols[None, None] <= position + right)
    scores = np.where(allowed, scores + bias, -np.inf)
    qk_biased = scores
    peak = np.max(scores, axis=-1, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0)
    e = np.exp(scores - peak)
    total_e = e.sum(axis=-1, keepdims=True)
    probs = np.where(total_e > 0, e / np.where(total_e > 0, total_e, 1), 0.0)  # fully masked rows give zeros
    y = probs @ v
    if q_in.ndim == 3:
        y = y.transpose(0, 2, 1, 3).reshape(b, sq, -1)
    mode = ctx.attr("qk_matmul_output_mode", 0)
    qk = {0: qk_raw, 1: qk_capped, 2: qk_biased, 3: probs}[mode]
    return [y.astype(q_in.dtype), present_k.astype(k_in.dtype), present_v.astype(v_in.dtype), qk.astype(q_in.dtype)]


def _rotary_infer(ctx: OpContext) -> list[TensorInfo]:
    return [input_info(ctx, 0)]


@op("RotaryEmbedding", infer=_rotary_infer)
def rotary_embedding(ctx: OpContext) -> list[np.ndarray]:
    """Rotate (pairs of) the first rotary_embedding_dim features of each head by position-dependent angles."""
    x, cos_cache, sin_cache = map(ctx.array, range(3))
    positions = ctx.array(3) if ctx.has_input(3) else None
    # Work in (batch, seq, heads, head_size).
    if x.ndim == 4:
        xs = x.transpose(0, 2, 1, 3)
    else:
        heads = ctx.attr("num_heads")
        xs = x.reshape(x.shape[0], x.shape[1], heads, -1)
    xs = xs.astype(np.float64)
    rot = ctx.attr("rotary_embedding_dim", 0) or xs.shape[-1]
    cos = cos_cache[positions] if positions is not None else cos_cache
    sin = sin_cache[positions] if positions is not None else sin_cache
    cos, sin = cos[:, :, None, : rot // 2].astype(np.float64), sin[:, :, None, : rot // 2].astype(np.float64)
    part = xs[..., :rot]
    interleaved = bool(ctx.attr("interleaved", 0))
    x1, x2 = (part[..., 0::2], part[..., 1::2]) if interleaved else (part[..., : rot // 2], part[..., rot // 2 :])
    r1, r2 = cos * x1 - sin * x2, sin * x1 + cos * x2
    rotated = np.stack([r1, r2], axis=-1).reshape(part.shape) if interleaved else np.concatenate([r1, r2], axis=-1)
    out = np.concatenate([rotated, xs[..., rot:]], axis=-1)
    out = out.transpose(0, 2, 1, 3) if x.ndim == 4 else out.reshape(x.shape)
    return [out.astype(x.dtype)]


@op("SwiGLU", infer=lambda ctx: [input_info(ctx, 0)])
def swiglu(ctx: OpContext) -> list[np.ndarray]:
    """Swish(A) * B: the gated activation of LLaMA-style MLPs."""
    a, b = ctx.array(0), ctx.array(1)
    a64 = a.astype(np.float64)
    return [(a64 / (1 + np.exp(-ctx.attr("alpha", 1.0) * a64)) * b).astype(a.dtype)]


@op("TensorScatter", infer=lambda ctx: [input_info(ctx, 0)])
def tensor_scatter(ctx: OpContext) -> list[np.ndarray]:
    """Write ``update`` into a copy of the cache along ``axis`` at each batch entry's write index (circular wraps)."""
    cache, update = ctx.array(0), ctx.array(1)
    axis = ctx.attr("axis", -2)
    axis = axis + cache.ndim if axis < 0 else axis
    starts = ctx.array(2).astype(np.int64) if ctx.has_input(2) else np.zeros(cache.shape[0], dtype=np.int64)
    circular = ctx.attr("mode", "linear") == "circular"
    out = cache.copy()
    length, capacity = update.shape[axis], cache.shape[axis]
    for b in range(cache.shape[0]):
        where = starts[b] + np.arange(length)
        where = where % capacity if circular else where
        view = np.moveaxis(out[b], axis - 1, 0)
        view[where] = np.moveaxis(update[b], axis - 1, 0)
    return [out]
