"""The rotated low-bit KV cache formats ("q4r": 4 bits, "q3r": 3 bits a value), defined in numpy: the reference the
cpu kernel (plugins/cpu/src/kv_quant.*) matches bit for bit.

A (position, head) row x of D values (D a multiple of 32) is stored as:

1. **Rotated**: cut into groups of G = the largest power of two dividing D, at most 128 (D = 128: one group; 96: three
   of 32); each group is multiplied by fixed pseudo-random signs s (``signs``) and then by the normalized
   Walsh-Hadamard matrix H / sqrt(G): y = H (s * x) / sqrt(G). The map is orthogonal, so q . k = rot(q) . rot(k):
   the kernel rotates each query row once and never un-rotates a key; V is summed in the rotated domain and the
   output row un-rotated once (x = s * (H y) / sqrt(G)). The rotation spreads an outlier channel over the whole group,
   leaving coordinates close to Gaussian.
2. **Quantized** per block of 32 rotated values: scale = the block's RMS (float64 sum, then float32, then float16,
   capped at 65504), and each value the index of the nearest level of the Lloyd-Max codebook of a unit Gaussian
   (``CODEBOOKS``: 16 levels for 4 bits, 8 for 3; computed by scripts/kv_codebook.py), i.e. the number of decision
   thresholds (midpoints of neighbouring levels, float32) below x / scale (float32). A block of zeros has scale 0.
   It reads back as level * scale.

Keys are stored centred: k - m, m (per kv head) the mean of the first (up to 64) keys of the step that wrote position 0
(``key_mean``; a new sequence starts a new mean, later steps keep it; so a cache's bytes for positions [0, n) depend
on those tokens alone when the first step held at least 64 of them — what makes a restored prefix of 64+ tokens
continue exactly like a computed one). Subtracting one vector from every key moves all of a query's
scores by the same q . m, which the softmax cancels exactly, and removes the large constant part of real models' keys
(a K projection bias: |k| up to ~360 in Qwen2.5-1.5B's first layer, ~50 % of the keys' energy in the others) that
would otherwise set every block's scale and drown the part of the keys that differs between positions.

Bytes: 4 bits + 16 bits per 32 values = 0.5625 bytes a value (q4r), 0.4375 (q3r); f16 is 2, q8 1.125 (plus d float32
of key mean per kv head and layer).
``pack_codes`` is the byte layout of a block of 32 codes (V rows; K tiles use it along 64 positions).
"""

from __future__ import annotations

import numpy as np

BLOCK = 32  # values per scale (and the unit of code packing)
MEAN_POSITIONS = 64  # keys averaged into the keys' centre
MAX_GROUP = 128  # largest Walsh-Hadamard group
KV_ROTATED_BITS = {"q4r": 4, "q3r": 3}

# Lloyd-Max levels for N(0, 1) (scripts/kv_codebook.py); the C++ copy is kv_quant.cpp's kCodebook4 / kCodebook3.
CODEBOOKS = {
    4: np.array([-2.7325896, -2.0690172, -1.6180464, -1.2562312, -0.9423405, -0.6567591, -0.3880483, -0.1283950,
                 0.1283950, 0.3880483, 0.6567591, 0.9423405, 1.2562312, 1.6180464, 2.0690172, 2.7325896],
                dtype=np.float32),
    3: np.array([-2.1519457, -1.3439093, -0.7560053, -0.2450942, 0.2450942, 0.7560053, 1.3439093, 2.1519457],
                dtype=np.float32),
}
# Signs of the rotation (bit i set: value i of a group is negated), 128 fixed pseudo-random bits; kv_quant.cpp's
# kSignBits holds the same two words.
SIGN_BITS = (0x9E3779B97F4A7C15, 0xD1B54A32D192ED03)


def rotation_group(d: int) -> int:
    """The Walsh-Hadamard group size of a head of ``d`` values (a multiple of 32)."""
    return min(d & -d, MAX_GROUP)


def check_head_dim(d: int, kind: str) -> str | None:
    """Why a head of ``d`` values cannot use the rotated cache ``kind``; None when it can."""
    if d <= 0 or d % BLOCK:
        return f"kv_dtype {kind!r} needs head_dim a multiple of {BLOCK}, got {d}"
    return None


def signs(g: int) -> np.ndarray:
    """The ±1 float32 signs of a group of ``g`` values."""
    bits = [(SIGN_BITS[i // 64] >> (i % 64)) & 1 for i in range(g)]
    return np.where(np.array(bits, dtype=bool), np.float32(-1), np.float32(1)).astype(np.float32)


def _hadamard(x: np.ndarray, g: int) -> np.ndarray:
    """Unnormalized fast Walsh-Hadamard transform of each group of ``g`` of the last axis (float32, in the kernel's
    butterfly order: stride 1, 2, 4, ..., each pair (a, b) -> (a + b, a - b))."""
    shape = x.shape
    y: np.ndarray = x.reshape(-1, g).astype(np.float32, copy=True)
    h = 1
    while h < g:
        pairs = y.reshape(-1, g // (2 * h), 2, h)
        a, b = pairs[:, :, 0, :], pairs[:, :, 1, :]
        y = np.stack([a + b, a - b], axis=2).reshape(-1, g)
        h *= 2
    return y.reshape(shape)


def _norm(g: int) -> np.float32:
    return np.float32(1) / np.sqrt(np.float32(g))


def rotate(x: np.ndarray) -> np.ndarray:
    """y = H (s * x) / sqrt(G) per group of the last axis."""
    x = np.asarray(x, dtype=np.float32)
    g = rotation_group(x.shape[-1])
    s = np.tile(signs(g), x.shape[-1] // g)
    return (_hadamard(x * s, g) * _norm(g)).astype(np.float32)


def unrotate(y: np.ndarray) -> np.ndarray:
    """The inverse of ``rotate``: x = s * (H y) / sqrt(G)."""
    y = np.asarray(y, dtype=np.float32)
    g = rotation_group(y.shape[-1])
    s = np.tile(signs(g), y.shape[-1] // g)
    return ((_hadamard(y, g) * _norm(g)) * s).astype(np.float32)


def thresholds(bits: int) -> np.ndarray:
    c = CODEBOOKS[bits]
    return ((c[:-1] + c[1:]) * np.float32(0.5)).astype(np.float32)


def quantize(y: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Rotated rows ``y[..., D]`` -> (codes uint8 ``[..., D]``, scales float16 ``[..., D / 32]``)."""
    y = np.asarray(y, dtype=np.float32)
    blocks = y.reshape(*y.shape[:-1], -1, BLOCK)
    rms = np.sqrt(np.square(blocks.astype(np.float64)).sum(-1) / BLOCK).astype(np.float32)
    scales = np.minimum(rms, np.float32(65504)).astype(np.float16)
    s = scales.astype(np.float32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        unit = np.where(s > 0, blocks / np.where(s > 0, s, np.float32(1)), np.float32(0)).astype(np.float32)
    codes = (unit[..., None] > thresholds(bits)).sum(-1).astype(np.uint8)
    return codes.reshape(y.shape), scales


def dequantize(codes: np.ndarray, scales: np.ndarray, bits: int) -> np.ndarray:
    """level * scale, float32 ``[..., D]`` (still rotated)."""
    levels = CODEBOOKS[bits][codes.reshape(*codes.shape[:-1], -1, BLOCK)]
    return (levels * scales.astype(np.float32)[..., None]).astype(np.float32).reshape(codes.shape)


def key_mean(k: np.ndarray) -> np.ndarray:
    """The keys' centre of a step's keys ``k[T, Hkv, D]``: float32 of the float64 sum over the first
    n = min(T, 64) rows (in order) / n."""
    k = np.asarray(k, dtype=np.float32)[:MEAN_POSITIONS]
    return (k.astype(np.float64).sum(axis=0) / k.shape[0]).astype(np.float32)


def kv_rotated_round(x: np.ndarray, kind: str) -> np.ndarray:
    """The values a ``kind`` ("q4r" / "q3r") cache holds for rows ``x[..., D]``, read back in the original (un-rotated)
    domain (float32)."""
    bits = KV_ROTATED_BITS[kind]
    codes, scales = quantize(rotate(x), bits)
    return unrotate(dequantize(codes, scales, bits))


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Blocks of 32 codes (last axis a multiple of 32) -> bytes, per block: 4 bits: 16 bytes, byte j = code j | code
    (j + 16) << 4; 3 bits: 12 bytes, byte j < 8 = the low two bits of codes j, j + 8, j + 16, j + 24 (bits 0-1, 2-3,
    4-5, 6-7), then 4 bytes holding bit 2 of code i at bit i % 8 of byte 8 + i / 8."""
    c = np.asarray(codes, dtype=np.uint8).reshape(-1, BLOCK)
    if bits == 4:
        out = c[:, :16] | (c[:, 16:] << 4)
    else:
        low = c & 3
        two = low[:, 0:8] | (low[:, 8:16] << 2) | (low[:, 16:24] << 4) | (low[:, 24:32] << 6)
        high = np.packbits((c >> 2) & 1, axis=-1, bitorder="little")
        out = np.concatenate([two, high], axis=-1)
    return out.astype(np.uint8).reshape(*codes.shape[:-1], -1)
