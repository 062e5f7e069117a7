"""Host-side weight layouts for the HVX kernels (done once, at load): padding to whole vectors and the q4 repack.

The HVX q4 layout (``hvx/hvx_kernels.h``): each row is cut into chunks of 256 elements stored as 128 bytes, byte i
holding element i in its low nibble and element 128 + i in its high nibble, so one vector load gives two vectors of
nibbles that line up with two plain 128-byte vectors of int8 activations. Block scales (one per 32 elements) become
float32, a row after another. Padding uses nibble 8 (value 0) and scale 0.
"""

from __future__ import annotations

import numpy as np

from hetero.contract.errors import ShapeError

VECTOR_BYTES = 128
Q4_BLOCK = 32
Q4_BLOCK_BYTES = 2 + Q4_BLOCK // 2  # f16 scale + 16 bytes of nibbles (GGUF Q4_0, hetero q4 with block size 32)
Q4_CHUNK = 2 * VECTOR_BYTES


def padded(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def pad_columns(a: np.ndarray, cols: int, value: float = 0) -> np.ndarray:
    """``a`` with its last axis padded to ``cols`` with ``value``."""
    extra = cols - a.shape[-1]
    if extra == 0:
        return np.ascontiguousarray(a)
    return np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, extra)], constant_values=value)


def unpack_q4_0(blocks: np.ndarray, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """GGUF Q4_0 rows ``uint8[rows, nblocks * 18]`` -> (nibbles ``uint8[rows, nblocks * 32]``, scales ``float32[rows,
    nblocks]``)."""
    rows = blocks.shape[0]
    nblocks = -(-cols // Q4_BLOCK)
    if blocks.dtype != np.uint8 or blocks.ndim != 2 or blocks.shape[1] != nblocks * Q4_BLOCK_BYTES:
        raise ShapeError(
            f"q4 weights: expected uint8[rows, {nblocks * Q4_BLOCK_BYTES}] for {cols} columns "
            f"({nblocks} blocks of {Q4_BLOCK_BYTES} bytes), got {blocks.dtype}{list(blocks.shape)}"
        )
    b = blocks.reshape(rows, nblocks, Q4_BLOCK_BYTES)
    scales = np.ascontiguousarray(b[:, :, :2]).view(np.float16)[:, :, 0].astype(np.float32)
    packed = b[:, :, 2:]
    nibbles = np.concatenate([packed & 0x0F, packed >> 4], axis=2).reshape(rows, nblocks * Q4_BLOCK)
    return nibbles, scales


def repack_q4(blocks: np.ndarray, cols: int) -> tuple[np.ndarray, np.ndarray, int]:
    """GGUF Q4_0 / hetero q4 (block 32) rows -> (HVX q4 bytes ``uint8[rows, padded / 2]``, scales ``float32[rows,
    padded / 32]``, padded column count, a multiple of 256)."""
    nibbles, scales = unpack_q4_0(blocks, cols)
    rows = nibbles.shape[0]
    cols_p = padded(cols, Q4_CHUNK)
    nibbles = pad_columns(nibbles[:, : padded(cols, Q4_BLOCK)], cols_p, 8)
    scales = pad_columns(scales, cols_p // Q4_BLOCK, 0.0)
    chunks = nibbles.reshape(rows, cols_p // Q4_CHUNK, 2, VECTOR_BYTES)
    packed = (chunks[:, :, 0] | (chunks[:, :, 1] << 4)).reshape(rows, cols_p // 2)
    return np.ascontiguousarray(packed, dtype=np.uint8), np.ascontiguousarray(scales, dtype=np.float32), cols_p
