"""The numpy arithmetic of the model-based drafters (Eagle-3, DFlash): RMSNorm, rotary embedding, attention under an
arbitrary visibility mask, the SwiGLU MLP, and one decoder layer's weights.

A drafter is one to a few layers run on a handful of rows per step; the target's verify pass dominates a speculative
step, so float32 numpy (BLAS, one thread under ``OMP_NUM_THREADS=1``) is fast enough and keeps the drafters
independent of the backends. Conventions follow Hugging Face Llama/Qwen3: ``x @ W.T`` linears, rotate-half RoPE,
GQA with query head ``h`` reading key-value head ``h // (heads // kv_heads)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis."""
    scale = 1.0 / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + eps)
    return (x * scale * weight).astype(np.float32, copy=False)


@dataclass(frozen=True)
class Rope:
    """Rotate-half rotary embedding over the whole head (``theta`` base; linear position scaling ``factor``)."""

    head_dim: int
    theta: float
    factor: float = 1.0

    def tables(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin, ``[T, head_dim]``, for integer ``positions``."""
        inv_freq = 1.0 / (self.theta ** (np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim))
        angles = np.outer(np.asarray(positions, dtype=np.float64) / self.factor, inv_freq)
        angles = np.concatenate([angles, angles], axis=-1)
        return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)

    def apply(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """``x``: ``[T, heads, head_dim]``."""
        cos, sin = self.tables(positions)
        half = self.head_dim // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return (x * cos[:, None, :] + rotated * sin[:, None, :]).astype(np.float32, copy=False)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray | None) -> np.ndarray:
    """Softmax attention. ``q`` ``[Tq, H, d]``, ``k``/``v`` ``[Tk, Hkv, d]``, ``visible`` ``[Tq, Tk]`` booleans
    (None: every key). Returns ``[Tq, H * d]``."""
    tq, heads, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    qg = q.reshape(tq, kv_heads, group, dim).transpose(1, 2, 0, 3)  # [Hkv, G, Tq, d]
    kt = k.transpose(1, 2, 0)  # [Hkv, d, Tk]
    scores = np.matmul(qg, kt[:, None]) * np.float32(dim ** -0.5)  # [Hkv, G, Tq, Tk]
    if visible is not None:
        scores = np.where(visible, scores, np.float32(-np.inf))
    scores -= scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    out = np.matmul(weights, v.transpose(1, 0, 2)[:, None])  # [Hkv, G, Tq, d]
    return out.transpose(2, 0, 1, 3).reshape(tq, heads * dim).astype(np.float32, copy=False)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


@dataclass
class LayerWeights:
    """One Llama/Qwen3 decoder layer, linears stored transposed (``[in, out]``) for ``x @ w``. ``q_norm`` and
    ``k_norm`` are Qwen3's per-head norms (None for Llama-style layers)."""

    input_norm: np.ndarray
    post_norm: np.ndarray
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray
    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None

    def mlp(self, x: np.ndarray) -> np.ndarray:
        return (silu(x @ self.gate) * (x @ self.up)) @ self.down

    def heads(self, x: np.ndarray, weight: np.ndarray, norm: np.ndarray | None, head_dim: int,
              eps: float) -> np.ndarray:
        """A projection split into ``[T, heads, head_dim]``, per-head normed when the layer has the norm."""
        out = (x @ weight).reshape(x.shape[0], -1, head_dim)
        return out if norm is None else rms_norm(out, norm, eps)
