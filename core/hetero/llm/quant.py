"""hetero's block-quantized weight formats: the byte layout, quantization at load, and the numpy dequantization.

A weight matrix ``W[N, K]`` (N output rows, K inputs) is stored row by row. Each row is cut into
``ceil(K / block_size)`` blocks; the last block of a row may be partial: its elements past K are quantized as
zeros and must be ignored by kernels. The stored array is ``uint8[N, blocks_per_row * block_bytes]`` (stacked
expert weights add a leading expert axis). One block, little-endian, no padding between blocks:

====================  =========================  ==========================================================
format                bytes                      value of element i of the block
====================  =========================  ==========================================================
8-bit symmetric       f16 d, int8 q[B]           d * q[i]                      (q in [-127, 127])
8-bit asymmetric      f16 d, f16 m, uint8 q[B]   d * q[i] + m
4-bit symmetric       f16 d, uint8 p[B/2]        d * (q[i] - 8)                (q in [0, 15])
4-bit asymmetric      f16 d, f16 m, uint8 p[B/2] d * q[i] + m
====================  =========================  ==========================================================

4-bit nibbles: byte ``p[j]`` (0 <= j < B/2) holds element ``j`` in its low nibble and element ``j + B/2`` in its
high nibble. With B = 32, the symmetric formats are byte-identical to GGUF's Q8_0 and Q4_0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..errors import HeteroError

BLOCK_SIZES = (32, 64, 128)
FLOAT_WTYPES = ("f32", "f16", "bf16")
QUANT_WTYPES = ("q8", "q4")


@dataclass(frozen=True)
class QuantFormat:
    """One block format: ``bits`` 8 or 4, ``block_size`` 32/64/128, symmetric or with a per-block minimum."""

    bits: int = 4
    block_size: int = 32
    symmetric: bool = True

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise HeteroError(f"quantization bits={self.bits}; expected 4 or 8")
        if self.block_size not in BLOCK_SIZES:
            raise HeteroError(f"quantization block size {self.block_size}; expected one of {BLOCK_SIZES}")

    @property
    def wtype(self) -> str:
        return f"q{self.bits}"

    @property
    def header_bytes(self) -> int:
        return 2 if self.symmetric else 4

    @property
    def block_bytes(self) -> int:
        return self.header_bytes + self.block_size * self.bits // 8

    @property
    def name(self) -> str:
        return f"q{self.bits}_{'sym' if self.symmetric else 'asym'}_b{self.block_size}"

    def blocks(self, k: int) -> int:
        return -(-k // self.block_size)

    def row_bytes(self, k: int) -> int:
        return self.blocks(k) * self.block_bytes

    def attrs(self) -> dict[str, object]:
        """The node attributes that describe this format (see ``hetero.ops.llm``)."""
        return {"wtype": self.wtype, "block_size": self.block_size, "symmetric": int(self.symmetric)}


_SPEC = re.compile(r"^q(?P<bits>[48])(?:_(?P<sym>sym|asym))?(?:_b(?P<block>\d+))?$")


def parse_quant(spec: str | QuantFormat | None) -> QuantFormat | None:
    """``"q4"``, ``"q8_asym"``, ``"q4_sym_b64"``... -> QuantFormat (defaults: symmetric, block 32)."""
    if spec is None or isinstance(spec, QuantFormat):
        return spec
    match = _SPEC.match(str(spec).strip().lower())
    if match is None:
        raise HeteroError(
            f"quant={spec!r} is not a quantization spec",
            hint='use "q8" or "q4", optionally with "_sym"/"_asym" and "_b32"/"_b64"/"_b128", e.g. "q4_asym_b64"',
        )
    return QuantFormat(int(match["bits"]), int(match["block"] or 32), match["sym"] != "asym")


def format_from_attrs(wtype: str, block_size: int = 32, symmetric: int = 1) -> QuantFormat | None:
    """None for float weights; the QuantFormat for q8/q4 (raises on unknown wtypes)."""
    if wtype in FLOAT_WTYPES:
        return None
    if wtype not in QUANT_WTYPES:
        raise HeteroError(f"weight type {wtype!r}; expected one of {FLOAT_WTYPES + QUANT_WTYPES}")
    return QuantFormat(int(wtype[1]), int(block_size), bool(symmetric))


# -- quantize --------------------------------------------------------------------------------------------------------
def quantize(w: np.ndarray, fmt: QuantFormat, *, chunk_rows: int = 4096) -> np.ndarray:
    """Quantize ``w[..., N, K]`` (any float dtype) to ``uint8[..., N, row_bytes(K)]``, in chunks of rows to bound
    memory."""
    w = np.asarray(w)
    lead, k = w.shape[:-1], w.shape[-1]
    rows = w.reshape(-1, k)
    out = np.empty((rows.shape[0], fmt.row_bytes(k)), dtype=np.uint8)
    for start in range(0, rows.shape[0], chunk_rows):
        out[start:start + chunk_rows] = _quantize_rows(rows[start:start + chunk_rows], fmt)
    return out.reshape(*lead, fmt.row_bytes(k))


def _quantize_rows(rows: np.ndarray, fmt: QuantFormat) -> np.ndarray:
    n, k = rows.shape
    bs, nb = fmt.block_size, fmt.blocks(k)
    x = np.zeros((n, nb * bs), dtype=np.float32)
    x[:, :k] = rows
    if not np.isfinite(x).all():
        raise HeteroError("cannot quantize a weight that holds NaN or infinity")
    x = x.reshape(n, nb, bs)
    levels = (1 << fmt.bits) - 1
    if fmt.symmetric:
        if fmt.bits == 8:
            d = np.abs(x).max(axis=-1) / 127.0
        else:
            # The element of largest magnitude maps to -8 exactly: one more level than amax / 7.
            pick = np.take_along_axis(x, np.abs(x).argmax(axis=-1)[..., None], axis=-1)[..., 0]
            d = pick / -8.0
        d16 = d.astype(np.float16)
        inv = _safe_inverse(d16.astype(np.float32))
        if fmt.bits == 8:
            q = np.clip(np.rint(x * inv[..., None]), -127, 127).astype(np.int8).view(np.uint8)
        else:
            q = np.clip(np.rint(x * inv[..., None]) + 8, 0, 15).astype(np.uint8)
        header = [d16]
    else:
        lo, hi = x.min(axis=-1), x.max(axis=-1)
        m16 = lo.astype(np.float16)
        d16 = ((hi - m16.astype(np.float32)) / levels).astype(np.float16)
        inv = _safe_inverse(d16.astype(np.float32))
        q = np.clip(np.rint((x - m16.astype(np.float32)[..., None]) * inv[..., None]), 0, levels).astype(np.uint8)
        header = [d16, m16]
    if fmt.bits == 4:
        half = bs // 2
        q = q[..., :half] | (q[..., half:] << 4)
    parts = [h[..., None].view(np.uint8) for h in header] + [q]
    return np.concatenate(parts, axis=-1).reshape(n, nb * fmt.block_bytes)


def _safe_inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d != 0, 1.0 / np.where(d != 0, d, 1), 0).astype(np.float32)


# -- dequantize ------------------------------------------------------------------------------------------------------
def dequantize(data: np.ndarray, fmt: QuantFormat, k: int) -> np.ndarray:
    """``uint8[..., N, row_bytes(k)]`` -> ``float32[..., N, k]`` (the reference that native kernels must match)."""
    data = np.asarray(data)
    if data.dtype != np.uint8 or data.shape[-1] != fmt.row_bytes(k):
        raise HeteroError(
            f"{fmt.name} weight with rows of {k} elements must be uint8 with {fmt.row_bytes(k)} bytes per row; got "
            f"{data.dtype}{list(data.shape)}"
        )
    lead = data.shape[:-1]
    nb, bs = fmt.blocks(k), fmt.block_size
    blocks = data.reshape(-1, nb, fmt.block_bytes)
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)  # [rows, nb, 1]
    q = blocks[..., fmt.header_bytes:]
    if fmt.bits == 4:
        q = np.concatenate([q & 0x0F, q >> 4], axis=-1)
    if fmt.symmetric:
        signed = q.view(np.int8).astype(np.float32) if fmt.bits == 8 else q.astype(np.float32) - 8.0
        values = signed * d
    else:
        m = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)
        values = q.astype(np.float32) * d + m
    return values.reshape(*lead, nb * bs)[..., :k]


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 carried as uint16 bit patterns -> float32 (a bf16 is the top half of an f32)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def weight_to_f32(w: np.ndarray, wtype: str, k: int | None = None, fmt: QuantFormat | None = None) -> np.ndarray:
    """Any weight array (float or block-quantized) as float32, as the reference kernels see it."""
    if wtype == "f32":
        return np.asarray(w, dtype=np.float32)
    if wtype == "f16":
        return np.asarray(w).astype(np.float32)
    if wtype == "bf16":
        return bf16_to_f32(w)
    if fmt is None or k is None:
        raise HeteroError(f"a {wtype} weight needs its block format and row length")
    return dequantize(w, fmt, k)


def error_bound(fmt: QuantFormat, w: np.ndarray) -> float:
    """A bound on |dequantize(quantize(w)) - w| per element of ``w``: the rounding step plus f16 scale rounding.

    4-bit symmetric blocks may clip the largest value of the sign opposite to the block's extreme by one step.
    """
    x = np.asarray(w, dtype=np.float32)
    amax = float(np.abs(x).max()) if x.size else 0.0
    rounding = {(8, True): amax / 127 / 2, (4, True): amax / 8, (8, False): amax / 255, (4, False): amax / 15}
    return rounding[(fmt.bits, fmt.symmetric)] * (1 + 1e-3) + amax * 2e-3
