"""``GatedDeltaRule`` (domain ``hetero``): the linear-attention token mixer of Gated DeltaNet models (Qwen3.5,
Qwen3-Next), a stateful op that owns its layer's recurrent state and short-convolution state.

One node computes, for the new tokens at positions ``past_len .. past_len + T - 1``:

1. ``CausalConvWithState`` (ONNX opset 27) over the packed projection ``qkv`` with the node's conv state, then
   SiLU (``conv_activation``);
2. the split into q ``[T, Hk, Dk]``, k ``[T, Hk, Dk]``, v ``[T, Hv, Dv]`` (channel order q | k | v, heads
   contiguous), optional L2 normalisation of q and k (``qk_l2norm``);
3. ``LinearAttention`` (ONNX opset 27, ``update_rule="gated_delta"``) with the node's recurrent state, where value
   head h reads q/k head ``h // (Hv / Hk)`` (ONNX's equivalent: q and k repeated to Hv heads, then
   ``q_num_heads = kv_num_heads = Hv``);
4. optionally the gated per-head RMSNorm of Gated DeltaNet's output: ``rmsnorm(o_h) * norm_weight * silu(z_h)``.

The reference below runs either the per-token recurrence or the chunked parallel form (chunks of ``chunk_size``
positions, aligned to absolute positions), in float64; both are exact forms of the same recurrence.

Chunked form, per head and chunk of L positions (state S: ``[Dk, Dv]``, G_t = g_1 + ... + g_t within the chunk,
D[t, s] = exp(G_t - G_s)):
the values actually written are u_t = β_t (v_t - exp(G_t) S^T k_t - Σ_{s<t} D[t, s] (k_t·k_s) u_s), i.e.
(I + A) U = β V - (β exp(G) K) S with A[t, s] = β_t D[t, s] k_t·k_s strictly below the diagonal. With the unit
lower-triangular solve T = (I + A)^-1 (the UT transform), U = T(β V) - T(β exp(G) K) S (the WY form: both T
products do not depend on S, so every chunk computes them in parallel); then
O = scale (exp(G) Q S + (Q K^T ∘ D)_{s<=t} U) and S' = exp(G_L) S + (exp(G_L - G) K)^T U.

Rollback. Positions are explicit: ``past_len`` smaller than the tokens consumed rolls the state back. The node keeps
the history of its inputs (the pre-convolution ``qkv`` rows, and g, β after gating; like a KV cache, it grows with
the tokens) and snapshots of the recurrent state: at every multiple of ``snapshot_interval`` positions and at the
end of every call of more than one token (a prompt: the usual point a chat rolls back to), at most
``max_snapshots`` of them (the oldest dropped first); and, outside that count, a block-start checkpoint: the state at
the start of the latest call of more than one token after position 0 (a speculative verify step, which usually keeps
only part of its block). Rolling back to p restores the newest snapshot or checkpoint at or before p (or the zero
state) and recomputes the tokens from there to p (the checkpoint: only the accepted tokens' recurrence, never the
layers around it); the conv state at p is the ``K - 1`` history rows before p. So a rollback costs at most
``snapshot_interval`` tokens' worth of recurrence (plus the tokens generated since the last prompt, or a verify
block's accepted tokens), and results after it equal a fresh run up to rounding.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..contract import dtypes
from ..contract.errors import HeteroError
from ..contract.graph import HETERO_DOMAIN
from ..contract.opforms import GATED_DELTA_MODES
from ..contract.registry import OpContext, op
from ..contract.tensor import TensorInfo
from .shapes import input_info
from .slots import by_slot, check_positions, check_slots, is_multi

# inputs
QKV, CONV_W, DECAY, BETA, PAST_LEN, CONV_B, A_LOG, DT_BIAS, Z, NORM_W, SLOTS = range(11)


def _dims(attrs: dict) -> tuple[int, int, int, int]:
    hk, hv = int(attrs.get("k_heads", 0)), int(attrs.get("v_heads", 0))
    dk, dv = int(attrs.get("k_dim", 0)), int(attrs.get("v_dim", 0))
    return hk, hv, dk, dv


def _infer(ctx: OpContext) -> list[TensorInfo]:
    hk, hv, dk, dv = _dims(ctx.node.attrs)
    if min(hk, hv, dk, dv) < 1 or hv % hk:
        raise ctx.fail(f"k_heads {hk}, v_heads {hv}, k_dim {dk}, v_dim {dv}: all positive, v_heads a multiple of "
                       "k_heads")
    mode = str(ctx.attr("mode", "auto"))
    if mode not in GATED_DELTA_MODES:
        raise ctx.fail(f"mode {mode!r} is not one of {', '.join(GATED_DELTA_MODES)}")
    if int(ctx.attr("chunk_size", 64)) < 1:
        raise ctx.fail("chunk_size must be positive")
    if str(ctx.attr("conv_activation", "silu")) not in ("silu", "none"):
        raise ctx.fail("conv_activation must be silu or none")
    channels = 2 * hk * dk + hv * dv
    x = input_info(ctx, QKV)
    if x.dtype != dtypes.float32 or (x.shape is not None and (len(x.shape) != 2 or x.shape[1] not in (None, channels))):
        raise ctx.fail(f"qkv must be float32 [T, {channels}] (2 * k_heads * k_dim + v_heads * v_dim), got {x}")
    w = input_info(ctx, CONV_W)
    if w.shape is not None and (len(w.shape) != 2 or w.shape[0] not in (None, channels)):
        raise ctx.fail(f"conv_weight must be [{channels}, kernel], got {w}")
    check_positions(ctx, PAST_LEN)
    check_slots(ctx)
    t = None if x.shape is None else x.shape[0]
    for index, name in ((DECAY, "decay"), (BETA, "beta")):
        s = input_info(ctx, index).shape
        if s is not None and (len(s) != 2 or s[1] not in (None, hv)):
            raise ctx.fail(f"{name} must be [T, {hv}], got {list(s)}")
    if ctx.has_input(A_LOG) != ctx.has_input(DT_BIAS):
        raise ctx.fail("a_log and dt_bias come together")
    if ctx.has_input(Z) != ctx.has_input(NORM_W):
        raise ctx.fail("z and norm_weight come together")
    return [TensorInfo(dtypes.float32, (t, hv * dv))]


def _silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def gates(decay: np.ndarray, beta: np.ndarray, a_log: np.ndarray | None, dt_bias: np.ndarray | None
          ) -> tuple[np.ndarray, np.ndarray]:
    """(g, β) in float64: given directly, or from raw projections with Gated DeltaNet's gating
    g = -exp(A_log) * softplus(a + dt_bias), β = sigmoid(b) (no dt_bias: 0)."""
    g, b = decay.astype(np.float64), beta.astype(np.float64)
    if a_log is None:
        return g, b
    g = -np.exp(a_log.astype(np.float64)) * _softplus(g if dt_bias is None else g + dt_bias.astype(np.float64))
    return g, 1.0 / (1.0 + np.exp(-b))


def causal_conv(window: np.ndarray, w: np.ndarray, bias: np.ndarray | None, silu: bool) -> np.ndarray:
    """Depthwise causal conv: ``window`` is [K - 1 + T, C] (state rows then new rows); returns [T, C] float64."""
    k = w.shape[1]
    t = window.shape[0] - (k - 1)
    taps = w.astype(np.float64)
    y = np.zeros((t, window.shape[1]))
    for j in range(k):
        y += window[j:j + t] * taps[:, j]
    if bias is not None:
        y += bias.astype(np.float64)
    return _silu(y) if silu else y


def split_qkv(y: np.ndarray, attrs: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k ``[T, Hv, Dk]`` (repeated to the value heads, normalised, q scaled) and v ``[T, Hv, Dv]``."""
    hk, hv, dk, dv = _dims(attrs)
    t = y.shape[0]
    q = y[:, :hk * dk].reshape(t, hk, dk)
    k = y[:, hk * dk:2 * hk * dk].reshape(t, hk, dk)
    v = y[:, 2 * hk * dk:].reshape(t, hv, dv)
    if int(attrs.get("qk_l2norm", 1)):
        eps = float(attrs.get("l2norm_eps", 1e-6))
        q = q / np.sqrt(np.sum(q * q, axis=-1, keepdims=True) + eps)
        k = k / np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + eps)
    q = q * (float(attrs.get("scale", 0.0)) or 1.0 / math.sqrt(dk))
    r = hv // hk
    if r > 1:
        q, k = np.repeat(q, r, axis=1), np.repeat(k, r, axis=1)
    return q, k, v


def recurrent(state: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
              out: np.ndarray | None) -> np.ndarray:
    """The per-token recurrence; ``state`` [H, Dk, Dv] float64, updated in place; rows of ``out`` [T, H, Dv]."""
    for t in range(q.shape[0]):
        state *= np.exp(g[t])[:, None, None]
        recalled = np.einsum("hkv,hk->hv", state, k[t])
        u = beta[t][:, None] * (v[t] - recalled)
        state += k[t][:, :, None] * u[:, None, :]
        if out is not None:
            out[t] = np.einsum("hkv,hk->hv", state, q[t])
    return state


def chunk(state: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
          out: np.ndarray | None) -> np.ndarray:
    """One chunk of the parallel form (see the module doc); ``state`` [H, Dk, Dv] updated in place."""
    length = q.shape[0]
    qh, kh, vh = (a.transpose(1, 0, 2) for a in (q, k, v))  # [H, L, D]
    cum = np.cumsum(g.T, axis=1)  # [H, L]
    diff = cum[:, :, None] - cum[:, None, :]
    lower = np.tril(np.ones((length, length), dtype=bool))
    decay = np.exp(np.where(lower, diff, -np.inf))  # D[t, s], zero above the diagonal
    bt = beta.T[:, :, None]  # [H, L, 1]
    a = np.tril(np.einsum("htd,hsd->hts", kh, kh) * decay * bt, -1)  # strictly below the diagonal
    rhs = np.concatenate([bt * vh, bt * np.exp(cum)[:, :, None] * kh], axis=2)  # [H, L, Dv + Dk]
    sol = np.empty_like(rhs)
    for t in range(length):  # forward substitution with the unit lower-triangular (I + A)
        sol[:, t] = rhs[:, t] - np.einsum("hs,hsd->hd", a[:, t, :t], sol[:, :t])
    dv = vh.shape[2]
    u = sol[:, :, :dv] - np.matmul(sol[:, :, dv:], state)  # [H, L, Dv]
    if out is not None:
        scores = np.einsum("htd,hsd->hts", qh, kh) * decay
        o = np.matmul(np.exp(cum)[:, :, None] * qh, state) + np.matmul(scores, u)
        out[:] = o.transpose(1, 0, 2)
    last = cum[:, -1:]
    state *= np.exp(last)[:, :, None]
    state += np.matmul((np.exp(last - cum)[:, :, None] * kh).transpose(0, 2, 1), u)
    return state


class DeltaState:
    """The per-node state of the reference: recurrent state, input history and snapshots (see the module doc)."""

    def __init__(self, channels: int, heads: int, dk: int, dv: int, kernel: int) -> None:
        self.state = np.zeros((heads, dk, dv))
        self.pos = 0
        self.kernel = kernel
        self.x = np.zeros((0, channels), dtype=np.float32)  # pre-conv history
        self.g = np.zeros((0, heads))
        self.beta = np.zeros((0, heads))
        self.snaps: dict[int, np.ndarray] = {}
        self.block: tuple[int, np.ndarray] | None = None  # block-start checkpoint (module doc)

    def record(self, x: np.ndarray, g: np.ndarray, beta: np.ndarray) -> None:
        end = self.pos + x.shape[0]
        if end > self.x.shape[0]:
            cap = max(end, 2 * self.x.shape[0], 64)
            for name in ("x", "g", "beta"):
                old = getattr(self, name)
                new = np.zeros((cap, old.shape[1]), dtype=old.dtype)
                new[:old.shape[0]] = old
                setattr(self, name, new)
        self.x[self.pos:end], self.g[self.pos:end], self.beta[self.pos:end] = x, g, beta

    def window(self, start: int, end: int) -> np.ndarray:
        """History rows [start - K + 1, end) as float64, zero rows before position 0."""
        lo = start - (self.kernel - 1)
        rows = self.x[max(lo, 0):end].astype(np.float64)
        return np.concatenate([np.zeros((max(-lo, 0), rows.shape[1])), rows]) if lo < 0 else rows

    def snapshot(self, limit: int) -> None:
        self.snaps[self.pos] = self.state.copy()
        while len(self.snaps) > max(limit, 1):
            del self.snaps[next(iter(self.snaps))]


def advance(st: DeltaState, attrs: dict, w: np.ndarray, bias: np.ndarray | None, start: int, end: int,
            mode: str, out: np.ndarray | None) -> None:
    """Run history positions [start, end) from the state at ``start`` (st.pos == start); rows of out [T, H, Dv]."""
    silu = str(attrs.get("conv_activation", "silu")) == "silu"
    q, k, v = split_qkv(causal_conv(st.window(start, end), w, bias, silu), attrs)
    g, beta = st.g[start:end], st.beta[start:end]
    size = int(attrs.get("chunk_size", 64))
    interval = int(attrs.get("snapshot_interval", 256))
    limit = int(attrs.get("max_snapshots", 8))
    pos = start
    while pos < end:
        stop = min(end, (pos // size + 1) * size)  # chunks aligned to absolute positions
        i, j = pos - start, stop - start
        part = None if out is None else out[i:j]
        if mode == "chunked":
            chunk(st.state, q[i:j], k[i:j], v[i:j], g[i:j], beta[i:j], part)
        else:
            recurrent(st.state, q[i:j], k[i:j], v[i:j], g[i:j], beta[i:j], part)
        st.pos = pos = stop
        if interval > 0 and stop % interval == 0:
            st.snapshot(limit)


def rollback(st: DeltaState, attrs: dict, w: np.ndarray, bias: np.ndarray | None, target: int) -> None:
    """Make the state the one after ``target`` tokens (target <= st.pos)."""
    if target == st.pos:
        return
    for p in [p for p in st.snaps if p > target]:
        del st.snaps[p]
    if st.block is not None and st.block[0] > target:
        st.block = None
    base = max(st.snaps, default=0)
    if st.block is not None and st.block[0] > base:
        base = st.block[0]
        st.state = st.block[1].copy()
    else:
        st.state = st.snaps[base].copy() if base else np.zeros_like(st.state)
    st.pos = base
    if target > base:
        advance(st, attrs, w, bias, base, target, "chunked", None)


def resolve_mode(mode: str, t: int, chunk_size: int) -> str:
    """``auto``: the recurrence for a few tokens (decode), the chunked form for a prompt."""
    if mode != "auto":
        return mode
    return "recurrent" if t < max(chunk_size // 8, 2) else "chunked"


def gated_norm(o: np.ndarray, z: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """rmsnorm(o) * weight * silu(z) over the last axis; o [T, H, Dv] float64."""
    inv = 1.0 / np.sqrt(np.mean(o * o, axis=-1, keepdims=True) + eps)
    return o * inv * weight.astype(np.float64) * _silu(z.astype(np.float64))


@op("GatedDeltaRule", domain=HETERO_DOMAIN, infer=_infer, stateful=True)
def gated_delta_rule(ctx: OpContext) -> list[np.ndarray]:
    """Gated DeltaNet linear attention with its conv and recurrent state (see the module doc for the math).

    Inputs: qkv (float32 ``[T, C]``, C = 2 Hk Dk + Hv Dv: q | k | v before the convolution), conv_weight (float32
    ``[C, K]``: ``y[t, c] = Σ_j w[c, j] x[t - K + 1 + j, c]``), decay (float32 ``[T, Hv]``: g, log-space), beta
    (float32 ``[T, Hv]``), past_len (int64 scalar), then optional: conv_bias (``[C]``), a_log and dt_bias
    (``[Hv]``, together: decay and beta are then the raw projections a and b, and g = -exp(a_log) *
    softplus(a + dt_bias), β = sigmoid(b)), z and norm_weight (``[T, Hv * Dv]`` and ``[Dv]``, together: the output
    is rmsnorm(o_h) * norm_weight * silu(z_h) per value head). Output: float32 ``[T, Hv * Dv]``.

    Attributes: ``k_heads``, ``v_heads`` (a multiple of k_heads), ``k_dim``, ``v_dim`` (required);
    ``conv_activation`` ("silu" default, or "none"); ``qk_l2norm`` (1: q and k scaled to unit length,
    x / sqrt(Σx² + l2norm_eps)); ``l2norm_eps`` (1e-6); ``scale`` (0 = 1/sqrt(Dk)); ``norm_eps`` (1e-6);
    ``chunk_size`` (64); ``mode`` ("auto": recurrent for a few tokens, chunked for prompts; "chunked";
    "recurrent"); ``snapshot_interval`` (256; 0: none but the per-prompt ones) and ``max_snapshots`` (8);
    ``max_context`` (0 = unbounded; else past_len + T beyond it is an error).

    past_len may be at most the tokens consumed so far; a smaller one rolls the state back (module doc).

    A step of several sequences (``hetero.llm.batch``): past_len int64 ``[T]`` (each row's position) and the
    optional input 10 ``slots`` (int64 ``[T]``: which of the node's ``slots`` states, attribute, each row belongs
    to); each run of rows of one slot at consecutive positions is the step above on that slot's state.
    """
    if is_multi(ctx):
        return by_slot(ctx, gated_delta_rule, (QKV, DECAY, BETA, Z))
    attrs = ctx.node.attrs
    x = ctx.array(QKV)
    w = ctx.array(CONV_W)
    past = int(np.asarray(ctx.array(PAST_LEN)).reshape(-1)[0])
    t = x.shape[0]
    _, hv, dk, dv = _dims(attrs)
    state: dict[str, Any] = ctx.state if ctx.state is not None else {}
    st: DeltaState | None = state.get("delta")
    if st is None:
        st = state["delta"] = DeltaState(x.shape[1], hv, dk, dv, w.shape[1])
    max_context = int(attrs.get("max_context", 0))
    if past < 0 or past > st.pos:
        raise HeteroError(f"{ctx.node.label()}: past_len {past} is outside the {st.pos} positions consumed")
    if max_context and past + t > max_context:
        raise HeteroError(f"{ctx.node.label()}: {past} cached + {t} new tokens exceed the context of {max_context} "
                          "tokens", hint="load the model with a larger context")
    bias = ctx.array(CONV_B) if ctx.has_input(CONV_B) else None
    rollback(st, attrs, w, bias, past)
    if t > 1 and past > 0:
        st.block = (past, st.state.copy())
    opt = (lambda i: ctx.array(i) if ctx.has_input(i) else None)  # noqa: E731
    g, beta = gates(ctx.array(DECAY), ctx.array(BETA), opt(A_LOG), opt(DT_BIAS))
    st.record(x, g, beta)
    out = np.zeros((t, hv, dv))
    mode = resolve_mode(str(attrs.get("mode", "auto")), t, int(attrs.get("chunk_size", 64)))
    advance(st, attrs, w, bias, past, past + t, mode, out)
    if t > 1:
        st.snapshot(int(attrs.get("max_snapshots", 8)))
    if ctx.has_input(Z):
        out = gated_norm(out, ctx.array(Z).reshape(t, hv, dv), ctx.array(NORM_W), float(attrs.get("norm_eps", 1e-6)))
    return [out.reshape(t, hv * dv).astype(np.float32)]
