"""The numpy arithmetic of the model-based drafters (Eagle-3, DFlash): RMSNorm, rotary embedding, attention under an
arbitrary visibility mask, the SwiGLU MLP, and one decoder layer's weights.

Everything here is float32 numpy but the linears: a ``Linear`` runs in numpy until ``native_linears`` hands it to
the target's backends (block-quantized, through the same QMatMul kernels as the target: a drafter at a real
target's width is ~50-170 MB of float32 that numpy re-reads for every row block, as slow as a target step).
Conventions follow Hugging Face Llama/Qwen3: ``x @ W.T`` linears, rotate-half RoPE, GQA with query head ``h``
reading key-value head ``h // (heads // kv_heads)``.
"""

from __future__ import annotations

from collections.abc import Callable
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


class Linear:
    """A drafter linear with the ``[out, in]`` weight W: ``x @ linear`` is ``x @ W.T`` for ``x`` ``[..., in]``.

    ``weight`` holds W transposed (``[in, out]``, float32) for numpy; ``native_linears.compile_linears`` sets
    ``run`` (rows ``[T, in]`` -> ``[T, out]`` through a backend) and drops ``weight``."""

    __array_ufunc__ = None  # ``ndarray @ Linear`` defers to __rmatmul__ instead of treating it as an array

    def __init__(self, weight: np.ndarray) -> None:
        self.weight: np.ndarray | None = np.ascontiguousarray(weight, dtype=np.float32)
        self.shape: tuple[int, int] = (int(weight.shape[0]), int(weight.shape[1]))  # [in, out]
        self.run: Callable[[np.ndarray], np.ndarray] | None = None

    def __rmatmul__(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        if self.run is None:
            assert self.weight is not None
            return x @ self.weight
        rows = np.ascontiguousarray(x.reshape(-1, self.shape[0]))
        return np.asarray(self.run(rows), dtype=np.float32).reshape(*x.shape[:-1], self.shape[1])

    def dense(self) -> np.ndarray:
        """W as ``[out, in]`` float32 (while the numpy copy is held)."""
        if self.weight is None:
            raise ValueError("this Linear runs through a backend; its float weight was released")
        return np.ascontiguousarray(self.weight.T)


def fused(linears: list[Linear]) -> Linear:
    """One linear computing ``linears`` side by side (their outputs concatenated): one backend call where there
    were several (a drafting level of Eagle-3 ran 8 one-row Sessions, each call's overhead ~1/8 of the level)."""
    weights = [lin.weight for lin in linears]
    if any(w is None for w in weights):
        raise ValueError("fusing linears needs their float weights (fuse before native_linears compiles them)")
    return Linear(np.concatenate(weights, axis=1))  # type: ignore[arg-type]  # None was refused above


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


@dataclass
class LayerWeights:
    """One Llama/Qwen3 decoder layer (``x @ linear``). ``q_norm`` and ``k_norm`` are Qwen3's per-head norms (None
    for Llama-style layers)."""

    input_norm: np.ndarray
    post_norm: np.ndarray
    q: Linear
    k: Linear
    v: Linear
    o: Linear
    gate: Linear
    up: Linear
    down: Linear
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None

    def mlp(self, x: np.ndarray) -> np.ndarray:
        return (silu(x @ self.gate) * (x @ self.up)) @ self.down

    def linears(self) -> list[Linear]:
        return [self.q, self.k, self.v, self.o, self.gate, self.up, self.down]

    def heads(self, x: np.ndarray, weight: Linear, norm: np.ndarray | None, head_dim: int,
              eps: float) -> np.ndarray:
        """A projection split into ``[T, heads, head_dim]``, per-head normed when the layer has the norm."""
        out = (x @ weight).reshape(x.shape[0], -1, head_dim)
        return out if norm is None else rms_norm(out, norm, eps)
