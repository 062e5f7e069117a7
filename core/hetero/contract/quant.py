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
high nibble. With B = 32, the symmetric formats are byte-identical to GGUF's Q8_0 and Q4_0, and the 4-bit
asymmetric one to GGUF's Q4_1 (hetero loads those GGUF types as ``q8`` / ``q4`` with ``block_size`` 32).

GGUF block formats (``GgmlFormat``, read from GGUF files as stored): wtypes ``q5_0``, ``q5_1``, ``q4_k``,
``q5_k``, ``q6_k``. They take no ``block_size`` / ``symmetric`` attributes (the layout fixes them), and K
must be a whole number of blocks (32, or 256 for the k-quants). All multi-byte fields are little-endian; ``f16`` is
IEEE half. A row of K elements is ``K / B`` blocks, back to back:

``q5_0`` (B = 32, 22 bytes): f16 d, uint32 qh, uint8 qs[16]. 5-bit q[i] = low nibble of qs[i] (i < 16) or high
nibble of qs[i - 16] (i >= 16), plus bit i of qh as bit 4. Value d * (q[i] - 16).

``q5_1`` (B = 32, 24 bytes): f16 d, f16 m, uint32 qh, uint8 qs[16]; q[i] as in q5_0. Value d * q[i] + m.

``q4_k`` (B = 256, 144 bytes): f16 d, f16 dmin, uint8 scales[12], uint8 qs[128]. Eight sub-blocks j of 32 elements,
each with a 6-bit scale sc[j] and 6-bit min m[j] unpacked from ``scales`` (s = scales):
j < 4: sc = s[j] & 63, m = s[j + 4] & 63; j >= 4: sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4),
m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4). Elements 64c .. 64c + 63 (c = 0..3) come from qs[32c .. 32c + 31]:
element 64c + l is the low nibble of qs[32c + l] (sub-block 2c), element 64c + 32 + l its high nibble (sub-block
2c + 1). Value d * sc[j] * q - dmin * m[j].

``q5_k`` (B = 256, 176 bytes): f16 d, f16 dmin, uint8 scales[12] (as q4_k), uint8 qh[32], uint8 qs[128] (as
q4_k). Element l (0..31) of sub-block j gets bit j of qh[l] as its bit 4 (q in 0..31). Value d * sc[j] * q -
dmin * m[j].

``q6_k`` (B = 256, 210 bytes): uint8 ql[128], uint8 qh[64], int8 scales[16], f16 d. Sixteen groups of 16 elements,
group g scaled by scales[g]. Each half h (elements 128h .. 128h + 127) uses ql[64h ..], qh[32h ..]; for l in
0..31, with L = ql[64h + l], L2 = ql[64h + 32 + l], H = qh[32h + l]: element 128h + l = (L & 15) | ((H & 3) << 4),
128h + 32 + l = (L2 & 15) | (((H >> 2) & 3) << 4), 128h + 64 + l = (L >> 4) | (((H >> 4) & 3) << 4),
128h + 96 + l = (L2 >> 4) | (((H >> 6) & 3) << 4); the value is d * scales[g] * (q - 32).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .errors import HeteroError

BLOCK_SIZES = (32, 64, 128)
FLOAT_WTYPES = ("f32", "f16", "bf16")
QUANT_WTYPES = ("q8", "q4")


class _BlockLayout(Protocol):
    @property
    def block_size(self) -> int: ...

    @property
    def block_bytes(self) -> int: ...


class _RowsOfBlocks:
    """Row sizes of a format stored as whole blocks (both format families below lay rows out alike)."""

    def blocks(self: _BlockLayout, k: int) -> int:
        return -(-k // self.block_size)

    def row_bytes(self: _BlockLayout, k: int) -> int:
        return -(-k // self.block_size) * self.block_bytes

    @property
    def bits_per_weight(self: _BlockLayout) -> float:
        return 8 * self.block_bytes / self.block_size



@dataclass(frozen=True)
class QuantFormat(_RowsOfBlocks):
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
    """None for float weights; the QuantFormat for q8/q4 (raises on unknown wtypes, GGUF's block types included:
    code that handles those calls ``weight_format``)."""
    if wtype in FLOAT_WTYPES:
        return None
    if wtype not in QUANT_WTYPES:
        raise HeteroError(f"weight type {wtype!r}; expected one of {FLOAT_WTYPES + QUANT_WTYPES}")
    return QuantFormat(int(wtype[1]), int(block_size), bool(symmetric))


def weight_format(wtype: str, block_size: int = 32, symmetric: int = 1) -> QuantFormat | GgmlFormat | None:
    """``format_from_attrs`` that also knows GGUF's block types (``GgmlFormat``; ``block_size`` and ``symmetric``
    do not apply to them). The op references use this one."""
    if wtype in GGML_FORMATS:
        return GGML_FORMATS[wtype]
    try:
        return format_from_attrs(wtype, block_size, symmetric)
    except HeteroError:
        raise HeteroError(f"weight type {wtype!r}; expected one of {FLOAT_WTYPES + QUANT_WTYPES + GGML_WTYPES}") \
            from None


# -- quantize --------------------------------------------------------------------------------------------------------
def quantize(w: np.ndarray, fmt: QuantFormat | GgmlFormat, *, chunk_rows: int = 4096) -> np.ndarray:
    """Quantize ``w[..., N, K]`` (any float dtype) to ``uint8[..., N, row_bytes(K)]``, in chunks of rows to bound
    memory."""
    w = np.asarray(w)
    lead, k = w.shape[:-1], w.shape[-1]
    rows = w.reshape(-1, k)
    out = np.empty((rows.shape[0], fmt.row_bytes(k)), dtype=np.uint8)
    for start in range(0, rows.shape[0], chunk_rows):
        chunk = rows[start:start + chunk_rows]
        out[start:start + chunk_rows] = (_quantize_ggml_rows(chunk, fmt) if isinstance(fmt, GgmlFormat)
                                         else _quantize_rows(chunk, fmt))
    return out.reshape(*lead, fmt.row_bytes(k))


def _quantize_rows(rows: np.ndarray, fmt: QuantFormat) -> np.ndarray:
    n, k = rows.shape
    bs, nb = fmt.block_size, fmt.blocks(k)
    x: np.ndarray = np.zeros((n, nb * bs), dtype=np.float32)
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
def dequantize(data: np.ndarray, fmt: QuantFormat | GgmlFormat, k: int) -> np.ndarray:
    """``uint8[..., N, row_bytes(k)]`` -> ``float32[..., N, k]`` (the reference that native kernels must match)."""
    if isinstance(fmt, GgmlFormat):
        return dequantize_ggml(data, fmt, k)
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


def weight_to_f32(w: np.ndarray, wtype: str, k: int | None = None,
                  fmt: QuantFormat | GgmlFormat | None = None) -> np.ndarray:
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


# -- GGUF block formats ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GgmlFormat(_RowsOfBlocks):
    """A GGUF (ggml) block layout, kept as stored in the file (layouts in the module doc)."""

    wtype: str
    block_size: int
    block_bytes: int
    ggml: str  # the GGUF type name
    f16_fields: tuple[int, ...]  # byte offsets of the block's float16 scales (d, and m / dmin where there is one)

    @property
    def name(self) -> str:
        return self.wtype

    def attrs(self) -> dict[str, object]:
        return {"wtype": self.wtype}


GGML_FORMATS: dict[str, GgmlFormat] = {f.wtype: f for f in (
    GgmlFormat("q5_0", 32, 22, "Q5_0", (0,)),
    GgmlFormat("q5_1", 32, 24, "Q5_1", (0, 2)),
    GgmlFormat("q4_k", 256, 144, "Q4_K", (0, 2)),
    GgmlFormat("q5_k", 256, 176, "Q5_K", (0, 2)),
    GgmlFormat("q6_k", 256, 210, "Q6_K", (208,)),
)}
GGML_WTYPES = tuple(GGML_FORMATS)


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The f16 at byte ``at`` of each block, as float32 ``[..., 1]``."""
    return np.ascontiguousarray(blocks[..., at:at + 2]).view(np.float16).astype(np.float32)


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 packed scale bytes of q4_k / q5_k -> 6-bit scales and mins, each ``[..., 8]``."""
    s = s.astype(np.uint8)
    lo_sc, lo_m = s[..., 0:4] & 63, s[..., 4:8] & 63
    hi_sc = (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)
    hi_m = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return np.concatenate([lo_sc, hi_sc], axis=-1), np.concatenate([lo_m, hi_m], axis=-1)


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """qs ``[..., 128]`` of q4_k / q5_k -> 4-bit values ``[..., 8, 32]`` (sub-block, element)."""
    qs = qs.reshape(*qs.shape[:-1], 4, 1, 32)
    return np.concatenate([qs & 15, qs >> 4], axis=-2).reshape(*qs.shape[:-3], 8, 32)


def _bits(qh: np.ndarray, n: int) -> np.ndarray:
    """Little-endian uint32 ``qh`` (4 bytes, ``[..., 4]``) -> its n low bits as uint8 ``[..., n]``."""
    word = np.ascontiguousarray(qh).view("<u4")  # [..., 1]
    return ((word >> np.arange(n, dtype=np.uint32)) & 1).astype(np.uint8)


def dequantize_ggml(data: np.ndarray, fmt: GgmlFormat, k: int) -> np.ndarray:
    """GGUF blocks ``uint8[..., N, row_bytes(k)]`` -> ``float32[..., N, k]`` (the numpy reference)."""
    data = np.asarray(data)
    if data.dtype != np.uint8 or data.shape[-1] != fmt.row_bytes(k) or k % fmt.block_size:
        raise HeteroError(
            f"{fmt.name} weight with rows of {k} elements (a multiple of {fmt.block_size}) must be uint8 with "
            f"{fmt.row_bytes(k)} bytes per row; got {data.dtype}{list(data.shape)}"
        )
    lead = data.shape[:-1]
    b = data.reshape(-1, fmt.blocks(k), fmt.block_bytes)
    w = fmt.wtype
    if w in ("q5_0", "q5_1"):
        at = 2 if w == "q5_0" else 4
        qs = b[..., at + 4:at + 20]
        q = np.concatenate([qs & 15, qs >> 4], axis=-1) | (_bits(b[..., at:at + 4], 32) << 4)
        if w == "q5_0":
            values = (q.astype(np.float32) - 16.0) * _f16(b, 0)
        else:
            values = q.astype(np.float32) * _f16(b, 0) + _f16(b, 2)
    elif w in ("q4_k", "q5_k"):
        d, dmin = _f16(b, 0), _f16(b, 2)  # [R, nb, 1]
        sc, m = _k_scales(b[..., 4:16])
        q = _k_nibbles(b[..., 16:144] if w == "q4_k" else b[..., 48:176])
        if w == "q5_k":
            qh = b[..., 16:48]  # [R, nb, 32]
            q = q | ((qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1) << 4
        scale = d * sc.astype(np.float32)  # [R, nb, 8]
        offset = dmin * m.astype(np.float32)
        values = q.astype(np.float32) * scale[..., None] - offset[..., None]
    elif w == "q6_k":
        ql = b[..., 0:128].reshape(*b.shape[:2], 2, 64)
        qh = b[..., 128:192].reshape(*b.shape[:2], 2, 32)
        sc = b[..., 192:208].view(np.int8).astype(np.float32)  # [R, nb, 16]
        d = _f16(b, 208)
        lo, lo2 = ql[..., :32], ql[..., 32:]
        q = np.concatenate([
            (lo & 15) | ((qh & 3) << 4),
            (lo2 & 15) | (((qh >> 2) & 3) << 4),
            (lo >> 4) | (((qh >> 4) & 3) << 4),
            (lo2 >> 4) | (((qh >> 6) & 3) << 4),
        ], axis=-1).astype(np.float32) - 32.0  # [R, nb, 2, 128]
        values = q.reshape(*b.shape[:2], 16, 16) * (d * sc)[..., None]
    else:  # pragma: no cover - GGML_FORMATS and this dispatch are kept in step
        raise HeteroError(f"no dequantization for {w!r}")
    return values.reshape(*lead, k).astype(np.float32, copy=False)


def _quantize_ggml_rows(rows: np.ndarray, fmt: GgmlFormat) -> np.ndarray:
    """A plain reference quantizer for the GGUF layouts (round to nearest; no search for the best scales)."""
    n, k = rows.shape
    if k % fmt.block_size:
        raise HeteroError(f"{fmt.name} needs rows of a multiple of {fmt.block_size} elements; got {k}")
    x = np.asarray(rows, dtype=np.float32)
    if not np.isfinite(x).all():
        raise HeteroError("cannot quantize a weight that holds NaN or infinity")
    nb = k // fmt.block_size
    x = x.reshape(n, nb, fmt.block_size)
    w = fmt.wtype

    def h16(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """float32 -> (the f16 bytes [..., 2], the f16 value as float32)"""
        v16 = v.astype(np.float16)
        return v16[..., None].view(np.uint8), v16.astype(np.float32)

    if w in ("q5_0", "q5_1"):
        if w == "q5_0":
            pick = np.take_along_axis(x, np.abs(x).argmax(axis=-1)[..., None], axis=-1)[..., 0]
            dbytes, d = h16(pick / -16.0)
            q = np.clip(np.rint(x * _safe_inverse(d)[..., None]) + 16, 0, 31).astype(np.uint32)
            header = [dbytes]
        else:
            lo, hi = x.min(axis=-1), x.max(axis=-1)
            mbytes, m = h16(lo)
            dbytes, d = h16((hi - m) / 31.0)
            q = np.clip(np.rint((x - m[..., None]) * _safe_inverse(d)[..., None]), 0, 31).astype(np.uint32)
            header = [dbytes, mbytes]
        qh = ((q >> 4) << np.arange(32, dtype=np.uint32)).sum(axis=-1, dtype=np.uint32)
        qs = ((q[..., :16] & 15) | ((q[..., 16:] & 15) << 4)).astype(np.uint8)
        parts = [*header, qh.astype("<u4")[..., None].view(np.uint8), qs]
    elif w in ("q4_k", "q5_k"):
        levels = 15 if w == "q4_k" else 31
        sub = x.reshape(n, nb, 8, 32)
        lo = np.minimum(sub.min(axis=-1), 0.0)
        scale = (sub.max(axis=-1) - lo) / levels  # >= 0
        mins = -lo  # >= 0
        dbytes, d = h16(scale.max(axis=-1) / 63.0)
        mbytes, dmin = h16(mins.max(axis=-1) / 63.0)
        sc = np.clip(np.rint(scale * _safe_inverse(d)[..., None]), 0, 63).astype(np.uint8)
        m = np.clip(np.rint(mins * _safe_inverse(dmin)[..., None]), 0, 63).astype(np.uint8)
        step = d[..., None] * sc.astype(np.float32)
        shift = dmin[..., None] * m.astype(np.float32)
        q = np.clip(np.rint((sub + shift[..., None]) * _safe_inverse(step)[..., None]), 0, levels).astype(np.uint8)
        packed = np.concatenate([
            sc[..., :4] | ((sc[..., 4:] >> 4) << 6),
            m[..., :4] | ((m[..., 4:] >> 4) << 6),
            (sc[..., 4:] & 15) | ((m[..., 4:] & 15) << 4),
        ], axis=-1)
        nib = q & 15  # [n, nb, 8, 32]
        qs = (nib[..., 0::2, :] | (nib[..., 1::2, :] << 4)).reshape(n, nb, 128)
        parts = [dbytes, mbytes, packed]
        if w == "q5_k":
            qh = ((q >> 4) << np.arange(8, dtype=np.uint8)[:, None]).sum(axis=-2, dtype=np.uint8)  # [n, nb, 32]
            parts.append(qh)
        parts.append(qs)
    elif w == "q6_k":
        groups = x.reshape(n, nb, 16, 16)
        pick = np.take_along_axis(groups, np.abs(groups).argmax(axis=-1)[..., None], axis=-1)[..., 0]
        gscale = pick / -32.0  # [n, nb, 16]
        dbytes, d = h16(np.abs(gscale).max(axis=-1) / 127.0)
        sc = np.clip(np.rint(gscale * _safe_inverse(d)[..., None]), -128, 127).astype(np.int8)
        step = d[..., None] * sc.astype(np.float32)
        q = np.clip(np.rint(groups * _safe_inverse(step)[..., None]) + 32, 0, 63).astype(np.uint8)
        q = q.reshape(n, nb, 2, 4, 32)  # half, quarter, l
        ql = np.concatenate([(q[..., 0, :] & 15) | ((q[..., 2, :] & 15) << 4),
                             (q[..., 1, :] & 15) | ((q[..., 3, :] & 15) << 4)], axis=-1)  # [n, nb, 2, 64]
        qh = ((q[..., 0, :] >> 4) | ((q[..., 1, :] >> 4) << 2) | ((q[..., 2, :] >> 4) << 4)
              | ((q[..., 3, :] >> 4) << 6))  # [n, nb, 2, 32]
        parts = [ql.reshape(n, nb, 128), qh.reshape(n, nb, 64), sc.view(np.uint8), dbytes]
    else:  # pragma: no cover
        raise HeteroError(f"no quantizer for {w!r}")
    out = np.concatenate([p.astype(np.uint8, copy=False) for p in parts], axis=-1)
    return out.reshape(n, nb * fmt.block_bytes)
