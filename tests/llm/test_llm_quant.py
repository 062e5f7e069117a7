"""hetero's block formats: round-trip error bounds, the byte layout, and parsing quant specs."""

from __future__ import annotations

import numpy as np
import pytest

from hetero.contract import HeteroError
from hetero.contract.quant import (
    QuantFormat,
    bf16_to_f32,
    dequantize,
    error_bound,
    f32_to_bf16,
    parse_quant,
    quantize,
)

FORMATS = [QuantFormat(b, s, sym) for b in (8, 4) for s in (32, 64, 128) for sym in (True, False)]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("k", [256, 100])
def test_round_trip_within_bound(fmt, k):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((33, k)) * rng.uniform(0.01, 3, size=(33, 1))).astype(np.float32)
    packed = quantize(w, fmt)
    assert packed.dtype == np.uint8 and packed.shape == (33, fmt.row_bytes(k))
    back = dequantize(packed, fmt, k)
    assert back.shape == w.shape
    for row in range(33):  # the bound holds per row (a row's blocks see its own magnitudes)
        assert np.abs(back[row] - w[row]).max() <= error_bound(fmt, w[row])
    # and typical errors are far below the bound: about a quarter step on average
    rel = np.abs(back - w).mean() / np.abs(w).mean()
    assert rel < (0.01 if fmt.bits == 8 else 0.12)


def test_sizes():
    assert QuantFormat(8, 32, True).block_bytes == 34  # GGUF Q8_0's size
    assert QuantFormat(4, 32, True).block_bytes == 18  # GGUF Q4_0's size
    assert QuantFormat(4, 128, False).block_bytes == 68
    assert QuantFormat(8, 64, False).row_bytes(100) == 2 * 68


def test_q4_sym_byte_layout():
    """Element j in the low nibble of byte j, element j + 16 in its high nibble; value = d * (q - 8)."""
    w = np.zeros((1, 32), dtype=np.float32)
    w[0, 0], w[0, 16], w[0, 1] = -8.0, 7.0, 1.0
    block = quantize(w, QuantFormat(4, 32, True))[0]
    assert np.frombuffer(block[:2].tobytes(), dtype=np.float16)[0] == 1.0  # d = -8 / -8
    assert block[2] == (0 | (15 << 4))  # q(-8) = 0 low, q(7) = 15 high
    assert block[3] == (9 | (8 << 4))  # q(1) = 9, q(0) = 8
    np.testing.assert_array_equal(dequantize(block[None], QuantFormat(4, 32, True), 32), w)


def test_q8_asym_byte_layout():
    w = np.linspace(-1, 3, 32, dtype=np.float32)[None]
    block = quantize(w, QuantFormat(8, 32, False))[0]
    d, m = np.frombuffer(block[:4].tobytes(), dtype=np.float16)
    assert m == np.float16(-1.0) and d == np.float16(4 / 255)
    assert block[4] == 0 and block[-1] == 255


def test_zero_and_constant_blocks():
    for fmt in FORMATS:
        w = np.zeros((2, 64), dtype=np.float32)
        w[1] = 0.5
        np.testing.assert_allclose(dequantize(quantize(w, fmt), fmt, 64), w, atol=1e-3)


def test_nan_is_refused():
    with pytest.raises(HeteroError, match="NaN"):
        quantize(np.array([[np.nan] * 32], dtype=np.float32), QuantFormat())


def test_parse_quant():
    assert parse_quant("q4") == QuantFormat(4, 32, True)
    assert parse_quant("Q8_ASYM_B128") == QuantFormat(8, 128, False)
    assert parse_quant("q4_sym_b64") == QuantFormat(4, 64, True)
    assert parse_quant(None) is None
    for bad in ("q3", "q4_b48", "int8", "q4_b"):
        with pytest.raises(HeteroError):
            parse_quant(bad)


def test_bf16_conversion():
    x = np.array([1.0, -2.5, 3.14159, 1e-3, 65504.0], dtype=np.float32)
    back = bf16_to_f32(f32_to_bf16(x))
    np.testing.assert_allclose(back, x, rtol=2 ** -8)
    assert f32_to_bf16(np.float32(1.0)) == 0x3F80
