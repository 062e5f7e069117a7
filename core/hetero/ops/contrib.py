"""onnxruntime's contrib ops (domain ``com.microsoft``) that files saved after onnxruntime's graph optimizer, Hugging
Face Optimum's ``ORTOptimizer`` or ``onnxruntime.transformers.optimizer`` hold (issue 17): fused MatMul / Conv, the
GELU family, the skip / embed layer normalisations, packed-QKV ``Attention``, ``MultiHeadAttention`` and the two
dynamically quantized MatMuls. Semantics as onnxruntime's ContribOperators document and its CPU kernels; these
references compute in float64. ``hetero.ir.passes.lower_contrib_ops`` rewrites most of them into standard ONNX nodes
so that the fusion passes and the native kernels take over.
"""

from __future__ import annotations

import math

import numpy as np

from ..contract import dtypes
from ..contract.graph import MICROSOFT_DOMAIN
from ..contract.registry import OpContext, get, op
from ..contract.tensor import Dim, Shape, TensorInfo
from .elementwise import _erf
from .rnn import quantize_activation
from .shapes import broadcast_shapes, input_info, same_as_input, unknown

F64 = np.float64


def _out(x: np.ndarray, like: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.astype(like.dtype, copy=False))


def _erf_gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _tanh_gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


# ------------------------------------------------------------------------------------------------- FusedMatMul

def _fused_matmul_shapes(ctx: OpContext) -> list[TensorInfo]:
    a, b = input_info(ctx, 0), input_info(ctx, 1)
    if a.shape is None or b.shape is None or len(a.shape) < 2 or len(b.shape) < 2:
        return [unknown(a.dtype)]
    if ctx.attr("transBatchA", 0) or ctx.attr("transBatchB", 0):
        raise ctx.fail("transBatchA / transBatchB are not supported")
    m = a.shape[-1] if ctx.attr("transA", 0) else a.shape[-2]
    n = b.shape[-2] if ctx.attr("transB", 0) else b.shape[-1]
    batch = broadcast_shapes(ctx, [tuple(a.shape[:-2]), tuple(b.shape[:-2])])
    return [TensorInfo(a.dtype, None if batch is None else (*batch, m, n))]


@op("FusedMatMul", domain=MICROSOFT_DOMAIN, infer=_fused_matmul_shapes)
def fused_matmul(ctx: OpContext) -> list[np.ndarray]:
    """``alpha * op(A) @ op(B)``, op() swapping the last two axes where ``transA`` / ``transB`` is set (batch axes
    broadcast as MatMul's do)."""
    a, b = ctx.array(0), ctx.array(1)
    if ctx.attr("transBatchA", 0) or ctx.attr("transBatchB", 0):
        raise ctx.fail("transBatchA / transBatchB are not supported")
    at = np.swapaxes(a, -1, -2) if ctx.attr("transA", 0) else a
    bt = np.swapaxes(b, -1, -2) if ctx.attr("transB", 0) else b
    return [_out(np.matmul(at.astype(F64), bt.astype(F64)) * float(ctx.attr("alpha", 1.0)), a)]


# --------------------------------------------------------------------------------------------------- FusedConv

# activation -> the ONNX op and the names that activation_params fill, in order
CONV_ACTIVATIONS: dict[str, tuple[str, ...]] = {"Relu": (), "Tanh": (), "Sigmoid": (), "LeakyRelu": ("alpha",),
                                                "Clip": ("min", "max"), "HardSigmoid": ("alpha", "beta")}


def _conv_infer(ctx: OpContext) -> list[TensorInfo]:
    return get("", "Conv").infer(ctx)


def conv_activation_attrs(ctx_attrs: dict) -> tuple[str, dict]:
    """(the ONNX activation op, its attributes) of a FusedConv's ``activation`` / ``activation_params``."""
    name = str(ctx_attrs.get("activation", ""))
    if name not in CONV_ACTIVATIONS:
        raise ValueError(f"FusedConv activation {name!r} is not supported")
    params = [float(p) for p in ctx_attrs.get("activation_params", [])]
    return name, dict(zip(CONV_ACTIVATIONS[name], params, strict=False))


@op("FusedConv", domain=MICROSOFT_DOMAIN, infer=_conv_infer)
def fused_conv(ctx: OpContext) -> list[np.ndarray]:
    """Conv (its attributes), plus the optional ``Z`` (input 3, a residual summed before the activation), then the
    ``activation`` (Relu, Tanh, Sigmoid, LeakyRelu, Clip, HardSigmoid) with ``activation_params``."""
    try:
        act, act_attrs = conv_activation_attrs(ctx.node.attrs)
    except ValueError as e:
        raise ctx.fail(str(e)) from None
    conv_attrs = {k: v for k, v in ctx.node.attrs.items() if k not in ("activation", "activation_params")}
    arrays = [ctx.array(i) if ctx.has_input(i) else None for i in range(3)]
    (y,) = _reference(ctx, "Conv", arrays, conv_attrs)
    if ctx.has_input(3):
        y = (y.astype(F64) + ctx.array(3)).astype(y.dtype)
    (y,) = _reference(ctx, act, [y], act_attrs) if act != "Clip" else _clip(ctx, y, act_attrs)
    return [y]


def _clip(ctx: OpContext, y: np.ndarray, attrs: dict) -> list[np.ndarray]:
    return [np.clip(y, attrs.get("min", -np.inf), attrs.get("max", np.inf)).astype(y.dtype)]


def _reference(ctx: OpContext, op_type: str, arrays: list[np.ndarray | None], attrs: dict) -> list[np.ndarray]:
    from ..contract.graph import Node

    names = [f"i{i}" if a is not None else "" for i, a in enumerate(arrays)]
    inner = Node(op_type, names, ["y"], attrs, name=f"{ctx.node.name}/{op_type}")
    infos = [TensorInfo(dtypes.from_numpy(a.dtype), a.shape) if a is not None else None for a in arrays]
    return get("", op_type).reference(OpContext(inner, infos, list(arrays), max(ctx.opset, 13)))


# ------------------------------------------------------------------------------------------------- GELU family

def _sum_infer(ctx: OpContext) -> list[TensorInfo]:
    """The broadcast of the present inputs (X plus a bias row)."""
    infos = [input_info(ctx, i) for i in range(len(ctx.inputs)) if ctx.has_input(i)]
    shape = broadcast_shapes(ctx, [i.shape for i in infos]) if all(i.shape is not None for i in infos) else None
    return [TensorInfo(infos[0].dtype, shape)]


def _present_sum(ctx: OpContext) -> np.ndarray:
    total = ctx.array(0).astype(F64)
    for i in range(1, len(ctx.inputs)):
        if ctx.has_input(i):
            total = total + ctx.array(i)
    return total


@op("Gelu", domain=MICROSOFT_DOMAIN, infer=same_as_input(0))
def gelu(ctx: OpContext) -> list[np.ndarray]:
    """Exact GELU: ``0.5 x (1 + erf(x / sqrt 2))``."""
    return [_out(_erf_gelu(ctx.array(0).astype(F64)), ctx.array(0))]


@op("BiasGelu", domain=MICROSOFT_DOMAIN, infer=_sum_infer)
def bias_gelu(ctx: OpContext) -> list[np.ndarray]:
    """Exact GELU of ``A + B`` (B a bias row)."""
    return [_out(_erf_gelu(_present_sum(ctx)), ctx.array(0))]


@op("FastGelu", domain=MICROSOFT_DOMAIN, infer=_sum_infer)
def fast_gelu(ctx: OpContext) -> list[np.ndarray]:
    """The tanh approximation of GELU of ``X`` (plus the optional ``bias`` row)."""
    return [_out(_tanh_gelu(_present_sum(ctx)), ctx.array(0))]


@op("QuickGelu", domain=MICROSOFT_DOMAIN, infer=same_as_input(0))
def quick_gelu(ctx: OpContext) -> list[np.ndarray]:
    """``x * sigmoid(alpha * x)`` (``alpha`` 1.702 unless given)."""
    x = ctx.array(0).astype(F64)
    alpha = float(ctx.attr("alpha", 1.702))
    return [_out(x * (0.5 * (1 + np.tanh(0.5 * alpha * x))), ctx.array(0))]


@op("BiasAdd", domain=MICROSOFT_DOMAIN, infer=_sum_infer)
def bias_add(ctx: OpContext) -> list[np.ndarray]:
    """``X + bias + skip`` (X and skip [N, S, C], bias [C])."""
    return [_out(_present_sum(ctx), ctx.array(0))]


# --------------------------------------------------------------------------------- skip / embed layer norms

def _stat_shape(shape: Shape) -> Shape:
    return (*shape[:-1], 1)


def _skip_ln_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    stat = TensorInfo(dtypes.float32, None if x.shape is None else _stat_shape(x.shape))
    return [x, stat, stat, x][: len(ctx.node.outputs)]


def _normalize(total: np.ndarray, eps: float, simplified: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    mean = np.zeros((*total.shape[:-1], 1)) if simplified else total.mean(axis=-1, keepdims=True)
    centred = total - mean
    inv_std = 1.0 / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps)
    return centred * inv_std, mean, inv_std


def _skip_norm(ctx: OpContext, simplified: bool) -> list[np.ndarray]:
    x = ctx.array(0)
    bias_at, beta_at = (3, None) if simplified else (4, 3)
    total = x.astype(F64) + ctx.array(1)
    if ctx.has_input(bias_at):
        total = total + ctx.array(bias_at)
    y, mean, inv_std = _normalize(total, float(ctx.attr("epsilon", 1e-12)), simplified)
    y = y * ctx.array(2)
    if beta_at is not None and ctx.has_input(beta_at):
        y = y + ctx.array(beta_at)
    outs = [_out(y, x), mean.astype(np.float32), inv_std.astype(np.float32), _out(total, x)]
    return outs[: len(ctx.node.outputs)]


@op("SkipLayerNormalization", domain=MICROSOFT_DOMAIN, infer=_skip_ln_infer)
def skip_layer_normalization(ctx: OpContext) -> list[np.ndarray]:
    """LayerNormalization over the last axis of ``input + skip (+ bias)`` with ``gamma`` (and ``beta``); outputs the
    result, the mean and inverse standard deviation [..., 1] and the sum ``input + skip + bias``."""
    return _skip_norm(ctx, simplified=False)


@op("SkipSimplifiedLayerNormalization", domain=MICROSOFT_DOMAIN, infer=_skip_ln_infer)
def skip_simplified_layer_normalization(ctx: OpContext) -> list[np.ndarray]:
    """RMS normalisation (no mean subtracted) of ``input + skip (+ bias)`` times ``gamma``; the same outputs as
    SkipLayerNormalization (the mean output all zeros)."""
    return _skip_norm(ctx, simplified=True)


def _simplified_ln_infer(ctx: OpContext) -> list[TensorInfo]:
    x = input_info(ctx, 0)
    if x.shape is None:
        return [x, unknown(dtypes.float32)][: len(ctx.node.outputs)]
    axis = int(ctx.attr("axis", -1)) % len(x.shape)
    stat = TensorInfo(dtypes.float32, (*x.shape[:axis], *[1] * (len(x.shape) - axis)))
    return [x, stat][: len(ctx.node.outputs)]


# onnxruntime registers this one in the ONNX domain (its optimizer writes it there: T5 / Llama RMS norms)
@op("SimplifiedLayerNormalization", infer=_simplified_ln_infer)
def simplified_layer_normalization(ctx: OpContext) -> list[np.ndarray]:
    """onnxruntime's RMS normalisation: ``x / sqrt(mean(x^2 over the axes from axis on) + epsilon) * scale``; the
    optional second output is the inverse RMS (float32, 1 on the normalised axes)."""
    x = ctx.array(0)
    axis = int(ctx.attr("axis", -1)) % x.ndim
    x64 = x.astype(F64)
    inv = 1.0 / np.sqrt((x64 * x64).mean(axis=tuple(range(axis, x.ndim)), keepdims=True)
                        + float(ctx.attr("epsilon", 1e-5)))
    return [_out(x64 * inv * ctx.array(1), x), inv.astype(np.float32)][: len(ctx.node.outputs)]


def _embed_ln_infer(ctx: OpContext) -> list[TensorInfo]:
    ids = input_info(ctx, 0)
    word = input_info(ctx, 2)
    hidden: Dim = None if word.shape is None else word.shape[-1]
    out: Shape | None = None if ids.shape is None else (*ids.shape, hidden)
    mask_index = TensorInfo(dtypes.int32, None if ids.shape is None else (ids.shape[0],))
    return [TensorInfo(word.dtype, out), mask_index, TensorInfo(word.dtype, out)][: len(ctx.node.outputs)]


@op("EmbedLayerNormalization", domain=MICROSOFT_DOMAIN, infer=_embed_ln_infer)
def embed_layer_normalization(ctx: OpContext) -> list[np.ndarray]:
    """BERT's embeddings: LayerNormalization of ``word[input_ids] + position[position_ids or 0..S-1] (+
    segment[segment_ids])`` with ``gamma`` / ``beta``; outputs it, ``mask_index`` (per row the count of nonzero
    ``mask`` values, zeros without a mask) and the sum before normalising."""
    ids = ctx.array(0).astype(np.int64)
    word = ctx.array(2)
    total = word[ids].astype(F64)
    positions = ctx.array(8).astype(np.int64) if ctx.has_input(8) else np.arange(ids.shape[1])[None, :]
    total = total + ctx.array(3)[np.broadcast_to(positions, ids.shape)]
    if ctx.has_input(1) and ctx.has_input(4):
        total = total + ctx.array(4)[ctx.array(1).astype(np.int64)]
    y, _, _ = _normalize(total, float(ctx.attr("epsilon", 1e-12)), simplified=False)
    y = y * ctx.array(5) + (ctx.array(6) if ctx.has_input(6) else 0.0)
    if ctx.has_input(7):
        mask_index = (ctx.array(7) != 0).sum(axis=1).astype(np.int32)
    else:
        mask_index = np.zeros(ids.shape[0], np.int32)
    return [_out(y, word), mask_index, _out(total, word)][: len(ctx.node.outputs)]


# ------------------------------------------------------------------------------------------------- attention

def _softmax(scores: np.ndarray) -> np.ndarray:
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


_LOWEST = float(np.finfo(np.float32).min)


def attention_mask_bias(mask: np.ndarray | None, batch: int, seq: int, past: int, causal: bool,
                        filter_value: float) -> np.ndarray:
    """The additive [B, 1, S, T] bias of an Attention ``mask_index`` as onnxruntime's CPU kernel builds it: 1-D [B]
    valid lengths (keys from the length on masked) or [2B] end then start positions; 2-D [B, T] or 3-D [B, S, T]
    raw masks (0: masked); 4-D [B, 1, M, M] (rows past..past+S, the first T columns); masked keys get
    ``filter_value``, and ``causal`` masks the future keys (with float32's lowest value, ``filter_value`` for 3-D
    masks)."""
    total = past + seq
    bias = np.zeros((batch, seq, total))
    rank = None if mask is None else mask.ndim
    if mask is not None:
        m = np.asarray(mask).astype(np.int64)
        keys = np.arange(total)
        if rank == 1:
            ends = m[:batch]
            masked = keys[None, :] >= ends[:, None]
            if m.shape[0] == 2 * batch:
                masked |= keys[None, :] < np.minimum(m[batch:], total)[:, None]
            elif m.shape[0] != batch:
                raise ValueError(f"a 1-D mask_index must have {batch} or {2 * batch} values, got {m.shape[0]}")
            bias[:] = np.where(masked, filter_value, 0.0)[:, None, :]
        elif rank == 2:
            bias[:] = np.where(m.reshape(batch, total) > 0, 0.0, filter_value)[:, None, :]
        elif rank == 3:
            bias[:] = np.where(m.reshape(batch, seq, total) > 0, 0.0, filter_value)
        elif rank == 4:
            bias[:] = np.where(m[:, 0, past:past + seq, :total] > 0, 0.0, filter_value)
        else:
            raise ValueError(f"mask_index of rank {rank} is not supported")
    if causal:
        future = np.arange(total)[None, :] > (past + np.arange(seq))[:, None]
        bias = np.where(future[None], filter_value if rank == 3 else _LOWEST, bias)
    return bias[:, None]


def _sdpa(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, bias: np.ndarray) -> np.ndarray:
    """softmax(q k^T * scale + bias) v on [B, H, S, d] / [B, H, T, d] float64 arrays: [B, S, H * dv]."""
    probs = _softmax(q @ np.swapaxes(k, -1, -2) * scale + bias)
    out = probs @ v
    b, h, s, dv = out.shape
    return out.transpose(0, 2, 1, 3).reshape(b, s, h * dv)


def _heads(x: np.ndarray, h: int) -> np.ndarray:
    """[B, S, H * d] as [B, H, S, d]."""
    b, s, hidden = x.shape
    return x.reshape(b, s, h, hidden // h).transpose(0, 2, 1, 3)


def attention_sizes(ctx_attrs: dict, weight_cols: Dim) -> tuple[Dim, Dim, Dim]:
    sizes = ctx_attrs.get("qkv_hidden_sizes")
    if sizes:
        return int(sizes[0]), int(sizes[1]), int(sizes[2])
    hidden = None if weight_cols is None else weight_cols // 3
    return hidden, hidden, hidden


def _attention_infer(ctx: OpContext) -> list[TensorInfo]:
    x, w = input_info(ctx, 0), input_info(ctx, 1)
    heads = int(ctx.attr("num_heads"))
    if x.shape is None or w.shape is None:
        return [unknown(x.dtype, 3), unknown(x.dtype, 5)][: len(ctx.node.outputs)]
    _, dk, dv = attention_sizes(ctx.node.attrs, w.shape[1])
    b, s = x.shape[0], x.shape[1]
    past = input_info(ctx, 4).shape if ctx.has_input(4) else (2, b, heads, 0, None)
    total = None if past is None or past[3] is None or s is None else past[3] + s
    head = None if dk is None else dk // heads
    return [TensorInfo(x.dtype, (b, s, dv)), TensorInfo(x.dtype, (2, b, heads, total, head))][: len(ctx.node.outputs)]


@op("Attention", domain=MICROSOFT_DOMAIN, infer=_attention_infer)
def attention(ctx: OpContext) -> list[np.ndarray]:
    """BERT / GPT-2 self-attention with packed weights: ``[Q K V] = input @ weights + bias`` (widths
    ``qkv_hidden_sizes``, else a third each), ``num_heads`` heads, ``softmax(Q K^T * scale + mask + attention_bias)
    V`` (``scale`` 1 / sqrt(head size) unless given; ``mask_index`` as ``attention_mask_bias`` reads it,
    ``unidirectional`` masks the future) with the optional ``past`` [2, B, H, P, d] prepended to K and V; outputs
    [B, S, Dv] and ``present`` [2, B, H, P + S, d]."""
    x = ctx.array(0)
    heads = int(ctx.attr("num_heads"))
    if ctx.attr("do_rotary", 0) or ctx.attr("past_present_share_buffer", 0):
        raise ctx.fail("do_rotary and past_present_share_buffer are not supported")
    proj = x.astype(F64) @ ctx.array(1)
    if ctx.has_input(2):
        proj = proj + ctx.array(2)
    dq, dk, _ = attention_sizes(ctx.node.attrs, proj.shape[-1])
    assert dq is not None and dk is not None
    q, k, v = (_heads(part, heads) for part in np.split(proj, [dq, dq + dk], axis=-1))
    past_len = 0
    if ctx.has_input(4):
        past = ctx.array(4).astype(F64)
        past_len = past.shape[3]
        k, v = np.concatenate([past[0], k], axis=2), np.concatenate([past[1], v], axis=2)
    b, s = x.shape[0], x.shape[1]
    try:
        bias = attention_mask_bias(ctx.array(3) if ctx.has_input(3) else None, b, s, past_len,
                                   bool(ctx.attr("unidirectional", 0)), float(ctx.attr("mask_filter_value", -10000.0)))
    except ValueError as e:
        raise ctx.fail(str(e)) from None
    if ctx.has_input(5):
        bias = bias + ctx.array(5)
    scale = ctx.attr("scale", 0.0) or 1.0 / math.sqrt(q.shape[-1])
    y = _out(_sdpa(q, k, v, float(scale), bias), x)
    return [y, _out(np.stack([k, v]), x)] if len(ctx.node.outputs) > 1 else [y]


def _mha_infer(ctx: OpContext) -> list[TensorInfo]:
    q = input_info(ctx, 0)
    heads = int(ctx.attr("num_heads"))
    if q.shape is None or len(q.shape) != 3 or not ctx.has_input(2):
        return [unknown(q.dtype, 3), unknown(q.dtype, 4), unknown(q.dtype, 4)][: len(ctx.node.outputs)]
    k, v = input_info(ctx, 1), input_info(ctx, 2)
    b, s = q.shape[0], q.shape[1]
    if v.shape is None or k.shape is None:
        return [unknown(q.dtype, 3), unknown(q.dtype, 4), unknown(q.dtype, 4)][: len(ctx.node.outputs)]
    if len(v.shape) == 4:
        dv: Dim = None if v.shape[3] is None else v.shape[3] * heads
        length = v.shape[2]
    else:
        dv, length = v.shape[2], v.shape[1]
    past = input_info(ctx, 6).shape if ctx.has_input(6) else (b, heads, 0, None)
    total = None if past is None or past[2] is None or length is None else past[2] + length
    dk = q.shape[2]
    kv = (b, heads, total, None if dk is None else dk // heads)
    vv = (b, heads, total, None if dv is None else dv // heads)
    return [TensorInfo(q.dtype, (b, s, dv)), TensorInfo(q.dtype, kv), TensorInfo(q.dtype, vv)][: len(ctx.node.outputs)]


@op("MultiHeadAttention", domain=MICROSOFT_DOMAIN, infer=_mha_infer)
def multi_head_attention(ctx: OpContext) -> list[np.ndarray]:
    """Attention of separate ``query`` [B, S, D], ``key`` and ``value`` ([B, L, D] or, without bias and past,
    [B, H, L, d]), the optional ``bias`` [D + D + Dv] added to the three, ``key_padding_mask`` ([B] valid lengths or
    [B, T] 0 / 1), ``attention_bias`` [B or 1, H or 1, S, T], ``past_key`` / ``past_value`` [B, H, P, d] prepended,
    ``unidirectional``; outputs [B, S, Dv] and ``present_key`` / ``present_value``."""
    q_in = ctx.array(0)
    heads = int(ctx.attr("num_heads"))
    if q_in.ndim != 3 or not ctx.has_input(1) or not ctx.has_input(2):
        raise ctx.fail("only separate 3-D query with key and value inputs are supported (no packed QKV / KV)")
    k_in, v_in = ctx.array(1).astype(F64), ctx.array(2).astype(F64)
    q = q_in.astype(F64)
    d = q.shape[-1]
    if ctx.has_input(3):
        if k_in.ndim != 3:
            raise ctx.fail("bias with 4-D key / value is not supported")
        bias_row = ctx.array(3).astype(F64)
        q, k_in, v_in = q + bias_row[:d], k_in + bias_row[d:2 * d], v_in + bias_row[2 * d:]
    k = k_in if k_in.ndim == 4 else _heads(k_in, heads)
    v = v_in if v_in.ndim == 4 else _heads(v_in, heads)
    past_len = 0
    if ctx.has_input(6) and ctx.has_input(7):
        past_len = ctx.array(6).shape[2]
        k = np.concatenate([ctx.array(6).astype(F64), k], axis=2)
        v = np.concatenate([ctx.array(7).astype(F64), v], axis=2)
    b, s = q.shape[0], q.shape[1]
    total = k.shape[2]
    mask = ctx.array(4) if ctx.has_input(4) else None
    if mask is not None and not (mask.ndim == 2 or (mask.ndim == 1 and mask.shape[0] == b)):
        raise ctx.fail(f"key_padding_mask of shape {list(mask.shape)} is not supported")
    bias = attention_mask_bias(mask, b, s, total - s, bool(ctx.attr("unidirectional", 0)),
                               float(ctx.attr("mask_filter_value", -10000.0)))
    if mask is not None and mask.ndim == 2 and mask.shape[1] != total:
        raise ctx.fail("a 2-D key_padding_mask must cover every key")
    del past_len
    if ctx.has_input(5):
        bias = bias + ctx.array(5)
    scale = ctx.attr("scale", 0.0) or 1.0 / math.sqrt(q.shape[-1] // heads)
    y = _sdpa(_heads(q, heads), k, v, float(scale), bias)
    return [_out(y, q_in), _out(k, q_in), _out(v, q_in)][: len(ctx.node.outputs)]


# ------------------------------------------------------------------------------------------ quantized MatMuls

def _qmatmul_infer(ctx: OpContext) -> list[TensorInfo]:
    a, b = input_info(ctx, 0), input_info(ctx, 1)
    out_dtype = dtypes.float32 if ctx.node.op_type == "DynamicQuantizeMatMul" else input_info(ctx, 2).dtype
    if a.shape is None or b.shape is None or len(b.shape) != 2:
        return [unknown(out_dtype)]
    return [TensorInfo(out_dtype, (*a.shape[:-1], b.shape[1]))]


def _zero(ctx: OpContext, index: int) -> np.ndarray | float:
    return ctx.array(index).astype(F64) if ctx.has_input(index) else 0.0


@op("MatMulIntegerToFloat", domain=MICROSOFT_DOMAIN, infer=_qmatmul_infer)
def matmul_integer_to_float(ctx: OpContext) -> list[np.ndarray]:
    """``(A - a_zero_point) @ (B - b_zero_point) * a_scale * b_scale + bias`` (8-bit A [..., K] and B [K, N]; b's
    scale and zero point per tensor or per column [N])."""
    a = ctx.array(0).astype(F64) - _zero(ctx, 4)
    b = ctx.array(1).astype(F64) - _zero(ctx, 5)
    y = (a @ b) * ctx.array(2).astype(F64) * ctx.array(3).astype(F64)
    if ctx.has_input(6):
        y = y + ctx.array(6)
    return [_out(y, ctx.array(2))]


@op("DynamicQuantizeMatMul", domain=MICROSOFT_DOMAIN, infer=_qmatmul_infer)
def dynamic_quantize_matmul(ctx: OpContext) -> list[np.ndarray]:
    """float A quantized to uint8 on the fly (DynamicQuantizeLinear's per-tensor range), times the 8-bit B [K, N]
    less ``b_zero_point``, scaled by A's and ``b_scale`` (per tensor or per column), plus the optional ``bias``."""
    a_ints, a_scale = quantize_activation(ctx.array(0))
    b = ctx.array(1).astype(F64) - _zero(ctx, 3)
    y = (a_ints @ b) * (np.float32(a_scale) * ctx.array(2).astype(np.float32)).astype(F64)
    if ctx.has_input(4):
        y = y + ctx.array(4)
    return [y.astype(np.float32)]
