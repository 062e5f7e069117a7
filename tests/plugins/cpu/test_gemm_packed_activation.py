"""``gemm_packed``'s activation epilogue (ConvNHWC's Conv1D products): the same bits as the product with its bias
then the native activation as a pass of its own, on every ISA path and at 1 and 2 threads, NaN included."""

from __future__ import annotations

import numpy as np
import pytest

from hetero_cpu import _native

# (M, K, N): deepcut's Conv1D shapes (ragged N against the 32-column panels, ragged M against the 12-row tiles; 100:
# 4 columns past the last panel, gemm_narrow's dot products on AVX-512), one below the small-M path's 4 rows, a
# narrow N (gemm_narrow's path); 150: 22 columns past the last panel, the last 6 as dot products at K >= 64 on AVX-512
SHAPES = [(882, 256, 200), (630, 384, 100), (693, 352, 150), (37, 64, 100), (13, 32, 17), (3, 40, 48), (50, 96, 8)]
ACTIVATIONS = [("relu", 0.0, 0.0), ("clip", -0.5, 0.75), ("sigmoid", 0.0, 0.0), ("leaky_relu", 0.1, 0.0)]


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("act", ACTIVATIONS, ids=lambda a: a[0])
@pytest.mark.parametrize("bias_kind", ["column", "none"])
def test_gemm_packed_activation_is_the_separate_pass(isa, threads, m, k, n, act, bias_kind):
    rng = np.random.default_rng(m * 7 + n)
    a = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32) if bias_kind == "column" else None
    a[1, 3] = np.nan  # row 1 is all NaN: relu and clip must pass it, not clamp it to 0
    packed = _native.pack_b(w, False, True, "high")
    fused = np.empty((m, n), np.float32)
    _native.gemm_packed(a, packed, fused, 1.0, 0.0, bias, *act)
    want = np.empty((m, n), np.float32)
    _native.gemm_packed(a, packed, want, 1.0, 0.0, bias)
    _native.unary(act[0], want, want, act[1], act[2])
    np.testing.assert_array_equal(fused, want)
    assert np.isnan(fused[1]).all()
    # and against an independent float64 reference
    ref = a.astype(np.float64) @ w.astype(np.float64) + (0.0 if bias is None else bias)
    name, alpha, beta = act
    ref = {"relu": lambda x: np.maximum(x, 0), "clip": lambda x: np.clip(x, alpha, beta),
           "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "leaky_relu": lambda x: np.where(x < 0, alpha * x, x)}[name](ref)
    scale = np.abs(a).astype(np.float64) @ np.abs(w) + 1.0
    ok = ~np.isnan(ref)
    assert (np.abs(fused[ok] - ref[ok]) / scale[ok]).max() < 1e-5


def test_gemm_packed_activation_in_a_prepared_step():
    """The step op's three extra arguments (a replayed ConvNHWC): the same bits as the direct call."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((40, 64), dtype=np.float32)
    packed = _native.pack_b(rng.standard_normal((64, 24), dtype=np.float32), False, True, "high")
    bias = rng.standard_normal(24, dtype=np.float32)
    want = np.empty((40, 24), np.float32)
    _native.gemm_packed(a, packed, want, 1.0, 0.0, bias, "relu", 0.0, 0.0)
    assert (want == 0).any() and (want > 0).any()
    got = np.empty_like(want)
    step = _native.LlmStep()
    step.add_call("gemm_packed", (a, packed, got, 1.0, 0.0, bias, "relu", 0.0, 0.0))
    assert step() is True
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("n", [33, 34, 36, 65, 98, 40, 17, 150, 152, 54, 57, 86])
@pytest.mark.parametrize("k", [7, 20, 384])
@pytest.mark.parametrize("bias_shape,alpha,beta", [((), 1.0, 0.0), ("n", 1.0, 0.0), ("mn", 1.0, 0.0),
                                                  ("m1", 1.0, 0.0), ("n", 0.5, 0.0), ("n", 1.0, 2.0)])
def test_gemm_packed_columns_past_the_last_panel(isa, threads, n, k, bias_shape, alpha, beta):
    """The 1-4 columns past the last whole panel, or the 1-8 past one whole vector more (150 = 128 + 16 + 6 on
    AVX-512, K >= 4 vectors), run as dot products where the ISA takes them (gemm_narrow; K under the bound, alpha != 1
    or beta != 0: the panels' ragged tile): every bias shape, against a float64 product."""
    m = 45
    rng = np.random.default_rng(n * 31 + k)
    a = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32)
    shape = {(): None, "n": (n,), "mn": (m, n), "m1": (m, 1)}[bias_shape]
    bias = None if shape is None else rng.standard_normal(shape, dtype=np.float32)
    c0 = rng.standard_normal((m, n), dtype=np.float32)
    out = c0.copy()
    _native.gemm_packed(a, _native.pack_b(w, False, True, "high"), out, alpha, beta, bias, "relu", 0.0, 0.0)
    ref = alpha * (a.astype(np.float64) @ w) + beta * c0 + (0.0 if bias is None else bias)
    ref = np.maximum(ref, 0)
    scale = np.abs(a).astype(np.float64) @ np.abs(w) + np.abs(beta * c0) + 1.0
    assert (np.abs(out - ref) / scale).max() < 1e-5


@pytest.mark.parametrize("n", [100, 66, 36, 150, 54])
def test_int8_panels_same_bits_with_columns_past_the_last_panel(isa, threads, n):
    """Weights exactly int8 x a column scale: the int8 panels and the float form give the same bits where the last
    1-4 columns (or the 6 past 128 + 16 / 32 + 16) run as dot products (both forms compute them from the same float
    values)."""
    rng = np.random.default_rng(n)
    k = 384
    q = rng.integers(-127, 128, (k, n))
    q[0] = 127  # each column's largest magnitude: its scale is this one
    w = (q * np.float32(2.0) ** -rng.integers(5, 9, n)).astype(np.float32)
    a = rng.standard_normal((70, k), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    as_int8, as_float = np.empty((70, n), np.float32), np.empty((70, n), np.float32)
    _native.gemm_packed(a, _native.pack_b(w, False, True, "high"), as_int8, 1.0, 0.0, bias, "relu", 0.0, 0.0)
    _native.gemm_packed(a, _native.pack_b(w, False, False, "high"), as_float, 1.0, 0.0, bias, "relu", 0.0, 0.0)
    np.testing.assert_array_equal(as_int8, as_float)
    ref = np.maximum(a.astype(np.float64) @ w + bias, 0)
    assert np.abs(as_float - ref).max() < 1e-3


@pytest.mark.parametrize("groups,rows,stride", [(63, 13, 1), (5, 10, 2), (1, 40, 1), (3, 1, 1), (2, 7, 3)])
@pytest.mark.parametrize("n,taps", [(150, 12), (100, 12), (200, 3), (17, 5), (6, 4)])
@pytest.mark.parametrize("int8", [False, True])
def test_gemm_packed_grouped_rows_read_in_place(isa, threads, groups, rows, stride, n, taps, int8):
    """A 3-D a (a Conv1D's windows over a batch of sequences: groups of overlapping rows of the input, ConvNHWC):
    the same bits as its rows copied into a matrix, and a float64 product; the dot-product tails group by group,
    a narrow B and a few rows (3 x 1) through the copy."""
    c = 32
    rng = np.random.default_rng(groups * 100 + n + taps)
    width = (rows - 1) * stride + taps
    x = rng.standard_normal((groups, width * c + 5), dtype=np.float32)[:, :width * c]  # groups apart by more
    windows = np.lib.stride_tricks.as_strided(x, (groups, rows, taps * c),
                                              (x.strides[0], stride * c * 4, 4), writeable=False)
    w = rng.standard_normal((taps * c, n), dtype=np.float32)
    if int8:
        w = (rng.integers(-127, 128, w.shape) * np.float32(2.0) ** -6).astype(np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    packed = _native.pack_b(w, False, True, "high")
    got, want = np.empty((groups * rows, n), np.float32), np.empty((groups * rows, n), np.float32)
    _native.gemm_packed(windows, packed, got, 1.0, 0.0, bias, "relu", 0.0, 0.0)
    flat = np.ascontiguousarray(windows.reshape(groups * rows, taps * c))
    _native.gemm_packed(flat, packed, want, 1.0, 0.0, bias, "relu", 0.0, 0.0)
    np.testing.assert_array_equal(got, want)
    ref = np.maximum(flat.astype(np.float64) @ w + bias, 0)
    scale = np.abs(flat).astype(np.float64) @ np.abs(w) + 1.0
    assert (np.abs(got - ref) / scale).max() < 1e-5
