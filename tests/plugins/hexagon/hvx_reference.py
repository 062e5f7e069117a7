"""numpy statements of what the HVX kernels compute, in the same float32 operations and order (hvx/*.c), so that
integer results compare exactly and the scalar float ones bit for bit; the tests also hold them against float64
maths with stated tolerances."""

from __future__ import annotations

import numpy as np

F = np.float32


def recip(a: np.ndarray) -> np.ndarray:
    a = a.astype(F)
    r = (np.uint32(0x7EF311C3) - a.view(np.uint32)).view(F)
    for _ in range(3):
        r = r * (F(2) - a * r)
    return r


def inv_sqrt(a: np.ndarray) -> np.ndarray:
    a = a.astype(F)
    r = (np.uint32(0x5F375A86) - (a.view(np.uint32) >> np.uint32(1))).view(F)
    for _ in range(4):
        r = r * (F(1.5) - F(0.5) * a * r * r)
    return r


def quantize_q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    xb = x.astype(F).reshape(-1, 32)
    d = np.abs(xb).max(axis=1) * (F(1) / F(127))
    inv = np.where(d != 0, recip(np.where(d != 0, d, F(1))), F(0)).astype(F)
    v = xb * inv[:, None]
    q = np.trunc(np.where(v < 0, v - F(0.5), v + F(0.5))).astype(np.int8)
    return q.reshape(-1), d.astype(F)


def matvec_q4(nibbles: np.ndarray, w_scale: np.ndarray, xq: np.ndarray, x_scale: np.ndarray) -> np.ndarray:
    """nibbles uint8[rows, cols] (0..15, value q - 8) in natural element order."""
    rows, cols = nibbles.shape
    prods = (nibbles.astype(np.int32) - 8).reshape(rows, -1, 32) * xq.astype(np.int32).reshape(1, -1, 32)
    isum = prods.sum(axis=2)
    acc = np.zeros(rows, F)
    for b in range(cols // 32):
        acc = acc + isum[:, b].astype(F) * (w_scale[:, b] * x_scale[b])
    return acc


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(F)
    ss = F(0)
    for v in x:
        ss = F(ss + v * v)
    r = inv_sqrt(np.array([ss * recip(np.array([len(x)], F))[0] + F(eps)], F))[0]
    return x * r * weight.astype(F)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    half = len(x) // 2
    x0, x1 = x[:half].astype(F), x[half:].astype(F)
    return np.concatenate([x0 * cos - x1 * sin, x1 * cos + x0 * sin]).astype(F)
