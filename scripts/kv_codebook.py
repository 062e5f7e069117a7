"""The Lloyd-Max codebooks of the rotated low-bit KV cache (hetero.contract.kv_rotated: "q4r" 16 levels, "q3r" 8).

Lloyd's algorithm (S. P. Lloyd, "Least squares quantization in PCM", 1957/1982; J. Max, "Quantizing for minimum
distortion", 1960) on the unit Gaussian density: alternate (1) decision thresholds at the midpoints of neighbouring
levels and (2) each level at the centroid E[x | t_i < x < t_{i+1}] = (phi(t_i) - phi(t_{i+1})) / (Phi(t_{i+1}) -
Phi(t_i)) of its cell, until the levels stop moving. After a Walsh-Hadamard rotation the coordinates of a head vector
are close to Gaussian, so these are the minimum-MSE levels for a block scaled to unit RMS.

    python scripts/kv_codebook.py     # prints the levels (float32-exact decimals) and the MSE per level count
"""

from __future__ import annotations

import itertools
import math


def _pdf(x: float) -> float:
    return math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi) if math.isfinite(x) else 0.0


def _cdf(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2))) if math.isfinite(x) else (1.0 if x > 0 else 0.0)


def lloyd_max(levels: int, iterations: int = 10000) -> list[float]:
    """The ``levels`` reconstruction points of the minimum-MSE scalar quantizer of N(0, 1), ascending."""
    c = [-2.5 + 5.0 * (i + 0.5) / levels for i in range(levels)]
    for _ in range(iterations):
        t = [-math.inf, *((a + b) / 2 for a, b in itertools.pairwise(c)), math.inf]
        new = [(_pdf(t[i]) - _pdf(t[i + 1])) / (_cdf(t[i + 1]) - _cdf(t[i])) for i in range(levels)]
        if max(abs(a - b) for a, b in zip(new, c, strict=True)) < 1e-15:
            return new
        c = new
    return c


def mse(c: list[float]) -> float:
    """E[(x - Q(x))^2] for x ~ N(0, 1), by numerical integration."""
    t = [-8.0, *((a + b) / 2 for a, b in itertools.pairwise(c)), 8.0]
    total, n = 0.0, 4000
    for i, level in enumerate(c):
        lo, hi = t[i], t[i + 1]
        h = (hi - lo) / n
        total += sum(_pdf(lo + (j + 0.5) * h) * (lo + (j + 0.5) * h - level) ** 2 for j in range(n)) * h
    return total


if __name__ == "__main__":
    for levels in (16, 8):
        c = lloyd_max(levels)
        print(f"{levels} levels (MSE {mse(c):.5f}):", ", ".join(f"{v:.7f}" for v in c))
