"""ONNX opset-27 recurrent ops of linear-attention models (Gated DeltaNet / Qwen3.5, Mamba, RetNet, GLA):
``LinearAttention`` and ``CausalConvWithState``.

Both are written as the plain per-token recurrence the spec defines, in float64, so that they serve as the oracle
for chunk-parallel kernels (which must agree with it up to rounding).

LinearAttention, per batch entry and KV head, with a state ``S`` of shape (d_k, d_v) (zeros unless ``past_state``):

    linear       S_t = S_{t-1} + k_t ⊗ v_t
    gated        S_t = exp(g_t) * S_{t-1} + k_t ⊗ v_t
    delta        S_t = S_{t-1} + β_t * k_t ⊗ (v_t - S_{t-1}^T k_t)
    gated_delta  S_t = exp(g_t) * S_{t-1} + β_t * k_t ⊗ (v_t - exp(g_t) * S_{t-1}^T k_t)
    output       o_t = scale * q_t^T S_t                 (scale defaults to 1/sqrt(d_k))

``g_t`` (the ``decay`` input, log-space) is either one scalar per head, shape (B, T, H_kv), or one value per key
dimension, shape (B, T, H_kv * d_k); in the second case ``exp(g_t) * S`` scales row i of S by exp(g_t[i]).
``β_t`` has shape (B, T, H_kv) or (B, T, 1) (one rate shared by all heads). With GQA each KV head and its state serve
``q_num_heads / kv_num_heads`` consecutive query heads (query head h reads KV head h // group).

Note that gated_delta is the delta rule applied to the decayed state: with ``S' = exp(g_t) * S_{t-1}``,
``S_t = S' + β_t * k_t ⊗ (v_t - S'^T k_t)``; the reference computes it in exactly that form.
"""

from __future__ import annotations

import numpy as np

from ..contract.registry import OpContext, op
from ..contract.tensor import Dim, TensorInfo
from .shapes import expect_shape, input_info, shape_of

_RULES = ("linear", "gated", "delta", "gated_delta")


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _heads(ctx: OpContext) -> tuple[int, int]:
    hq, hkv = int(ctx.attr("q_num_heads")), int(ctx.attr("kv_num_heads"))
    if hq <= 0 or hkv <= 0 or hq % hkv:
        raise ctx.fail(f"q_num_heads ({hq}) must be a positive multiple of kv_num_heads ({hkv})")
    return hq, hkv


def _per_head(d: Dim, heads: int) -> Dim:
    return None if d is None else d // heads


def _linear_attention_infer(ctx: OpContext) -> list[TensorInfo]:
    q, k, v = (input_info(ctx, i) for i in range(3))
    hq, hkv = _heads(ctx)
    rule = _text(ctx.attr("update_rule", "gated_delta"))
    if rule not in _RULES:
        raise ctx.fail(f"update_rule {rule!r} is not one of {', '.join(_RULES)}")
    if rule in ("gated", "gated_delta") and not ctx.has_input(4):
        raise ctx.fail(f"update_rule {rule!r} needs the decay input")
    if rule in ("delta", "gated_delta") and not ctx.has_input(5):
        raise ctx.fail(f"update_rule {rule!r} needs the beta input")
    state_dtype = input_info(ctx, 3).dtype if ctx.has_input(3) else q.dtype
    qs, ks, vs = q.shape, k.shape, v.shape
    for name, s in (("query", qs), ("key", ks), ("value", vs)):
        if s is not None and len(s) != 3:
            raise ctx.fail(f"{name} must be 3-D (B, T, heads * head_size), got rank {len(s)}")
    if ks is not None and ks[2] is not None and ks[2] % hkv:
        raise ctx.fail(f"key's last dim {ks[2]} is not a multiple of kv_num_heads {hkv}")
    batch = next((s[0] for s in (qs, ks, vs) if s is not None and s[0] is not None), None)
    steps = next((s[1] for s in (qs, ks, vs) if s is not None and s[1] is not None), None)
    if vs is not None and vs[2] is not None and vs[2] % hkv:
        raise ctx.fail(f"value's last dim {vs[2]} is not a multiple of kv_num_heads {hkv}")
    dk = None if ks is None else _per_head(ks[2], hkv)
    dv = None if vs is None else _per_head(vs[2], hkv)
    # Every kernel indexes its inputs by these sizes: an input that disagrees would be read past its end.
    expect_shape(ctx, "query", qs, (batch, steps, None if dk is None else hq * dk))
    expect_shape(ctx, "key", ks, (batch, steps, None))
    expect_shape(ctx, "value", vs, (batch, steps, None))
    if ctx.has_input(3):
        expect_shape(ctx, "past_state", input_info(ctx, 3).shape, (batch, hkv, dk, dv))
    if ctx.has_input(4):
        decay = input_info(ctx, 4).shape  # one value per KV head, or per key dimension of each head
        per_key = decay is not None and len(decay) == 3 and dk is not None and decay[2] == hkv * dk
        expect_shape(ctx, "decay", decay, (batch, steps, None if dk is None else hkv * dk if per_key else hkv))
    if ctx.has_input(5):
        beta = input_info(ctx, 5).shape
        expect_shape(ctx, "beta", beta, (batch, steps, 1 if beta is not None and len(beta) == 3 and beta[2] == 1
                                    else hkv))
    out = TensorInfo(q.dtype, (batch, steps, None if dv is None else hq * dv))
    return [out, TensorInfo(state_dtype, (batch, hkv, dk, dv))]



@op("LinearAttention", infer=_linear_attention_infer)
def linear_attention(ctx: OpContext) -> list[np.ndarray]:
    """Linear attention recurrence (linear / gated / delta / gated_delta) over 3-D packed heads, with an optional
    recurrent state in and the final state out. See the module docstring for the update rules."""
    query, key, value = map(ctx.array, range(3))
    hq, hkv = _heads(ctx)
    group = hq // hkv
    rule = _text(ctx.attr("update_rule", "gated_delta"))
    b, t = query.shape[:2]
    dk, dv = key.shape[2] // hkv, value.shape[2] // hkv
    q = query.astype(np.float64).reshape(b, t, hq, dk)
    k = key.astype(np.float64).reshape(b, t, hkv, dk)
    v = value.astype(np.float64).reshape(b, t, hkv, dv)
    scale = float(ctx.attr("scale", 0.0)) or 1.0 / np.sqrt(dk)
    past = ctx.array(3) if ctx.has_input(3) else None
    state = np.zeros((b, hkv, dk, dv)) if past is None else past.astype(np.float64).copy()

    # Decay as a per-row factor of S: (B, T, H_kv, d_k, 1); a per-head decay is the same factor for every row.
    decay = None
    if rule in ("gated", "gated_delta"):
        g = ctx.array(4).astype(np.float64)
        gate = np.exp(g.reshape(b, t, hkv, dk) if g.shape[2] == hkv * dk else g.reshape(b, t, hkv, 1))
        decay = np.broadcast_to(gate, (b, t, hkv, dk))[..., None]
    beta = None
    if rule in ("delta", "gated_delta"):
        bt = ctx.array(5).astype(np.float64)
        beta = np.broadcast_to(bt.reshape(b, t, -1), (b, t, hkv))[..., None, None]  # (B, T, H_kv, 1, 1)

    out = np.empty((b, t, hq, dv))
    for step in range(t):
        kt, vt = k[:, step, :, :, None], v[:, step, :, None, :]  # (B, H_kv, d_k, 1), (B, H_kv, 1, d_v)
        if decay is not None:
            state = decay[:, step] * state
        if beta is None:
            state = state + kt * vt
        else:
            recalled = np.sum(state * kt, axis=2, keepdims=True)  # S^T k: (B, H_kv, 1, d_v)
            state = state + beta[:, step] * kt * (vt - recalled)
        # Query head h reads the state of KV head h // group.
        shared = np.repeat(state, group, axis=1)  # (B, H_q, d_k, d_v)
        out[:, step] = scale * np.einsum("bhk,bhkv->bhv", q[:, step], shared)
    state_dtype = past.dtype if past is not None else query.dtype
    return [out.reshape(b, t, hq * dv).astype(query.dtype), state.astype(state_dtype)]


# -- CausalConvWithState ---------------------------------------------------------------------------------------------
def _causal_conv_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    input_info(ctx, 1)
    if x.shape is not None and len(x.shape) != 3:
        raise ctx.fail(f"input must be 3-D (batch, channels, length), got rank {len(x.shape)}")
    ws = shape_of(ctx, 1)
    if ws is not None and (len(ws) != 3 or ws[1] not in (1, None)):
        raise ctx.fail(f"weight must have shape (channels, 1, k), got {list(ws)}")
    activation = _text(ctx.attr("activation", "none"))
    if activation not in ("none", "silu", "swish"):
        raise ctx.fail(f"activation {activation!r} is not one of none, silu, swish")
    k = None if ws is None or ws[2] is None else ws[2]
    batch, channels = (None, None) if x.shape is None else x.shape[:2]
    if ctx.has_input(3):
        ps = shape_of(ctx, 3)
        if ps is not None and k is not None and ps[2] not in (k - 1, None):
            raise ctx.fail(f"past_state's last dim {ps[2]} must be kernel size - 1 = {k - 1}")
    state = TensorInfo(x.dtype, (batch, channels, None if k is None else k - 1))
    return [TensorInfo(x.dtype, x.shape), state]


@op("CausalConvWithState", infer=_causal_conv_infer)
def causal_conv_with_state(ctx: OpContext) -> list[np.ndarray]:
    """Causal depthwise 1-D convolution with a carried state.

    With k the kernel size, the sequence ``p = concat(past_state or zeros(k - 1), input)`` along the length axis
    gives ``y[b, c, t] = bias[c] + sum_j weight[c, 0, j] * p[b, c, t + j]`` (then SiLU if activation is silu/swish),
    and ``present_state = p[:, :, -(k - 1):]`` (the last k - 1 values, past and zero padding included).
    """
    x, w = ctx.array(0), ctx.array(1)
    k = w.shape[2]
    b, c, length = x.shape
    past = ctx.array(3) if ctx.has_input(3) else None
    head = np.zeros((b, c, k - 1)) if past is None else past.astype(np.float64)
    p = np.concatenate([head, x.astype(np.float64)], axis=2)
    taps = w.astype(np.float64)[:, 0, :]  # (C, k)
    y = np.zeros((b, c, length))
    for j in range(k):
        y += taps[None, :, j, None] * p[:, :, j : j + length]
    if ctx.has_input(2):
        y += ctx.array(2).astype(np.float64)[None, :, None]
    if _text(ctx.attr("activation", "none")) in ("silu", "swish"):
        with np.errstate(over="ignore"):
            y = y / (1 + np.exp(-y))
    present = p[:, :, p.shape[2] - (k - 1) :]
    return [y.astype(x.dtype), present.astype(x.dtype)]
