"""The native layer_norm's ``skip`` (hetero.AddLayerNorm's kernel: the rows of x + skip normalised): the same bits as
the native Add then the native LayerNorm on every ISA path, at 1 and 2 threads, and float64's values."""

from __future__ import annotations

import numpy as np
import pytest

from hetero_cpu import _native


def _reference(x: np.ndarray, skip: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, eps: float) -> np.ndarray:
    s = x.astype(np.float64) + skip.astype(np.float64)
    mean = s.mean(axis=1, keepdims=True)
    y = (s - mean) / np.sqrt(((s - mean) ** 2).mean(axis=1, keepdims=True) + eps) * scale
    return y + bias if bias is not None else y


# 1 x 1, ragged last vectors (7, 129), MiniLM's 64 x 384, a row longer than one task's 16384 values, many rows
@pytest.mark.parametrize("rows,n", [(1, 1), (1, 7), (3, 16), (5, 129), (64, 384), (2, 17000), (300, 33)])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("strided", [False, True])
def test_layer_norm_skip_is_add_then_layer_norm(isa, threads, rows, n, with_bias, strided):
    rng = np.random.default_rng(rows * 1000 + n)
    wide = rng.normal(1, 3, (rows, 2 * n)).astype(np.float32)
    x = wide[:, ::2] if strided else np.ascontiguousarray(wide[:, :n])  # strided: the row kernel's gathered copy
    skip = rng.normal(0, 2, (rows, n)).astype(np.float32)
    scale = rng.normal(size=n).astype(np.float32)
    bias = rng.normal(size=n).astype(np.float32) if with_bias else None
    got = np.empty((rows, n), np.float32)
    _native.layer_norm(x, scale, bias, got, 1e-5, None, None, skip)
    total = np.empty((rows, n), np.float32)
    _native.binary("add", x, skip, total)
    want = np.empty((rows, n), np.float32)
    _native.layer_norm(total, scale, bias, want, 1e-5)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
    np.testing.assert_allclose(got, _reference(x, skip, scale, bias, 1e-5), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("rows,n", [(1, 1), (1, 7), (5, 129), (257, 384), (2, 17000)])
@pytest.mark.parametrize("strided", [False, True])
def test_layer_norm_sum_out_is_the_add(isa, threads, rows, n, strided):
    """``sum_out`` (a pre-norm block's AddLayerNorm with the sum as its second output): the Add's bits written there,
    and the normalised rows unchanged."""
    rng = np.random.default_rng(rows + n)
    wide = rng.normal(1, 3, (rows, 2 * n)).astype(np.float32)
    x = wide[:, ::2] if strided else np.ascontiguousarray(wide[:, :n])
    skip = rng.normal(0, 2, (rows, n)).astype(np.float32)
    scale, bias = rng.normal(size=n).astype(np.float32), rng.normal(size=n).astype(np.float32)
    got, total = np.empty((rows, n), np.float32), np.full((rows, n), np.nan, np.float32)
    _native.layer_norm(x, scale, bias, got, 1e-5, None, None, skip, total)
    want_total, want = np.empty((rows, n), np.float32), np.empty((rows, n), np.float32)
    _native.binary("add", x, skip, want_total)
    _native.layer_norm(want_total, scale, bias, want, 1e-5)
    np.testing.assert_array_equal(total, want_total)
    np.testing.assert_array_equal(got, want)


def test_layer_norm_sum_out_refusals():
    x, skip = np.ones((4, 8), np.float32), np.ones((4, 8), np.float32)
    scale, out = np.ones(8, np.float32), np.empty((4, 8), np.float32)
    with pytest.raises(Exception, match="needs skip"):
        _native.layer_norm(x, scale, None, out, 1e-5, None, None, None, np.empty((4, 8), np.float32))
    with pytest.raises(Exception, match="shape"):
        _native.layer_norm(x, scale, None, out, 1e-5, None, None, skip, np.empty((4, 7), np.float32))
    with pytest.raises(Exception, match="contiguous"):
        _native.layer_norm(x, scale, None, out, 1e-5, None, None, skip, np.empty((4, 16), np.float32)[:, ::2])


def test_layer_norm_skip_special_values(isa):
    x = np.array([[np.nan, 1, 2, 3], [np.inf, 0, 0, 0], [1, 2, 3, 4]], np.float32)
    skip = np.array([[0, 0, 0, 0], [0, 0, 0, 0], [-np.inf, 0, 0, 0]], np.float32)
    scale, bias = np.ones(4, np.float32), np.zeros(4, np.float32)
    got, want, total = (np.empty((3, 4), np.float32) for _ in range(3))
    _native.layer_norm(x, scale, bias, got, 1e-5, None, None, skip)
    _native.binary("add", x, skip, total)
    _native.layer_norm(total, scale, bias, want, 1e-5)
    np.testing.assert_array_equal(got, want)  # NaN where the unfused pair gives NaN


def test_layer_norm_skip_refuses_what_it_cannot_read():
    x = np.ones((4, 8), np.float32)
    scale, out = np.ones(8, np.float32), np.empty((4, 8), np.float32)
    with pytest.raises(Exception, match="shape"):
        _native.layer_norm(x, scale, None, out, 1e-5, None, None, np.ones((4, 7), np.float32))
    with pytest.raises(Exception, match="contiguous"):
        _native.layer_norm(x, scale, None, out, 1e-5, None, None, np.ones((4, 16), np.float32)[:, ::2])
    with pytest.raises(Exception, match="float32"):
        _native.layer_norm(x, scale, None, out, 1e-5, None, None, np.ones((4, 8), np.float64))
