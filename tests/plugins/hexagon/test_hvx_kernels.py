"""The HVX kernels built with clang's Hexagon target and run under qemu-hexagon, against numpy: integer results
exactly, scalar float results bit for bit against the same float32 operations (hvx_reference) and within stated
tolerances against float64 maths."""

from __future__ import annotations

import numpy as np
import pytest

from hetero.contract.errors import BackendError, BackendUnavailable

from . import hvx_reference as ref

hvx_qemu = pytest.importorskip("hetero_hexagon.hvx_qemu")
hvx_ops = pytest.importorskip("hetero_hexagon.hvx_ops")
layout = pytest.importorskip("hetero_hexagon.layout")


@pytest.fixture(scope="module")
def hvx():
    try:
        toolchain = hvx_qemu.find_toolchain()
    except BackendUnavailable as e:
        pytest.skip(e.message)
    return hvx_ops.HvxKernels(hvx_qemu.QemuTransport(toolchain))


@pytest.mark.parametrize(("rows", "cols"), [(1, 128), (7, 256), (33, 1024)])
def test_matvec_i8_is_exact(hvx, rows, cols):
    rng = np.random.default_rng(rows)
    w = rng.integers(-128, 128, size=(rows, cols), dtype=np.int8)
    x = rng.integers(-128, 128, size=cols, dtype=np.int8)
    w[0, :4] = -128  # the extremes: (-128) * (-128) products must not saturate
    x[:4] = -128
    expected = w.astype(np.int64) @ x.astype(np.int64)
    np.testing.assert_array_equal(hvx.matvec_i8(w, x), expected)


@pytest.mark.parametrize(("rows", "cols"), [(5, 256), (16, 512), (3, 96), (4, 320)])
def test_matvec_q4_matches_numpy(hvx, rows, cols):
    gguf = pytest.importorskip("gguf", reason="the gguf package (requirements/dev.txt) quantizes the Q4_0 weights")
    gguf_quants, GGMLQuantizationType = gguf.quants, gguf.GGMLQuantizationType
    rng = np.random.default_rng(cols)
    w = rng.normal(size=(rows, cols)).astype(np.float32)
    x = rng.normal(size=cols).astype(np.float32)
    x[:32] = 0  # an all-zero block: scale 0, no division by zero
    blocks = gguf_quants.quantize(w, GGMLQuantizationType.Q4_0)  # the gguf package's Q4_0, independent of hetero
    packed, w_scale, cols_p = layout.repack_q4(blocks, cols)
    x_p = layout.pad_columns(x[None], cols_p)[0]

    xq, xs, y = hvx.matvec_q4(packed, w_scale, x_p)

    exp_q, exp_s = ref.quantize_q8(x_p)
    np.testing.assert_array_equal(xq, exp_q)
    np.testing.assert_array_equal(xs, exp_s)
    nibbles, _ = layout.unpack_q4_0(blocks, cols)
    nibbles = layout.pad_columns(nibbles, cols_p, 8)
    np.testing.assert_array_equal(y, ref.matvec_q4(nibbles, w_scale, exp_q, exp_s))
    # against float64 maths on the dequantized weights: only the activations' int8 rounding differs
    w_deq = ((nibbles.astype(np.float64) - 8).reshape(rows, -1, 32) * w_scale[..., None]).reshape(rows, -1)
    exact = w_deq @ x_p.astype(np.float64)
    tol = 0.02 * np.abs(w_deq) @ np.abs(x_p)  # int8 activations: relative error <= 1/254 per element, x 5 margin
    assert np.all(np.abs(y - exact) <= tol)


def test_repack_q4_puts_each_nibble_where_the_kernel_reads_it():
    rng = np.random.default_rng(1)
    nibbles = rng.integers(0, 16, size=(2, 512), dtype=np.uint8)
    packed = nibbles.reshape(2, 16, 2, 16)
    raw = np.concatenate(
        [np.zeros((2, 16, 2), np.uint8), packed[:, :, 0] | (packed[:, :, 1] << 4)], axis=2).reshape(2, -1)
    hvx_bytes, scales, cols_p = layout.repack_q4(raw, 512)
    assert cols_p == 512 and scales.shape == (2, 16)
    chunk = hvx_bytes.reshape(2, 2, 128)
    np.testing.assert_array_equal(chunk & 0x0F, nibbles.reshape(2, 2, 2, 128)[:, :, 0])
    np.testing.assert_array_equal(chunk >> 4, nibbles.reshape(2, 2, 2, 128)[:, :, 1])


def test_repack_q4_names_a_wrong_shape():
    with pytest.raises(Exception, match=r"q4 weights: expected uint8\[rows, 144\]"):
        layout.repack_q4(np.zeros((2, 140), np.uint8), 256)


@pytest.mark.parametrize("n", [64, 896])
def test_rmsnorm(hvx, n):
    rng = np.random.default_rng(n)
    x = rng.normal(size=n).astype(np.float32) * 3
    weight = rng.normal(size=n).astype(np.float32)
    y = hvx.rmsnorm(x, weight, 1e-6)
    np.testing.assert_array_equal(y, ref.rmsnorm(x, weight, 1e-6))
    x64 = x.astype(np.float64)
    exact = x64 / np.sqrt(np.mean(x64 * x64) + 1e-6) * weight
    np.testing.assert_allclose(y, exact, rtol=2e-6, atol=1e-6)  # measured: 2.1e-7 relative at most (n = 64, 896, 4096)


@pytest.mark.parametrize("dim", [64, 128])
def test_rope(hvx, dim):
    rng = np.random.default_rng(dim)
    x = rng.normal(size=dim).astype(np.float32)
    pos, theta = 17, 1e6
    angles = pos * theta ** (-np.arange(dim // 2) * 2 / dim)
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    y = hvx.rope(x, cos, sin)
    np.testing.assert_array_equal(y, ref.rope(x, cos, sin))
    z = x[: dim // 2] + 1j * x[dim // 2:]
    turned = z * np.exp(1j * angles)
    np.testing.assert_allclose(y, np.concatenate([turned.real, turned.imag]), rtol=1e-5, atol=1e-6)


def test_the_dsp_side_refuses_bad_arguments_by_name(hvx):
    with pytest.raises(BackendError, match=r"method 2 failed: bad arguments \(HVX_EBADARGS\)"):
        hvx.matvec_i8(np.zeros((2, 100), np.int8), np.zeros(100, np.int8))  # cols not a multiple of 128
    with pytest.raises(BackendError, match=r"method 9 failed: unknown method"):
        hvx.transport.invoke(9, [np.zeros(1, np.int32)], [4])


def test_matvec_q4_reads_hetero_q4_weights(hvx):
    """hetero's own q4 (symmetric, block 32: hetero.contract.quant) is the layout the kernel's repack reads: the HVX
    product equals hetero's dequantized weights times the HVX-quantized activations, to float32 rounding."""
    from hetero.contract import quant

    rng = np.random.default_rng(11)
    rows, cols = 24, 512
    fmt = quant.QuantFormat(bits=4, block_size=32, symmetric=True)
    blocks = quant.quantize(rng.normal(size=(rows, cols)).astype(np.float32), fmt)
    packed, w_scale, _ = layout.repack_q4(blocks, cols)  # 512 columns: no padding
    x = rng.normal(size=cols).astype(np.float32)
    xq, xs, y = hvx.matvec_q4(packed, w_scale, x)
    x_deq = (xq.astype(np.float64).reshape(-1, 32) * xs[:, None]).reshape(-1)
    expected = quant.dequantize(blocks, fmt, cols).astype(np.float64) @ x_deq
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("m", [1, 3, 16])
def test_matmul_q4_rows_are_matvec_q4_bit_for_bit(hvx, m):
    """A block of m activation rows in one call (a verify step): each row's result, quantized activations and scales
    are the one-row product's, bit for bit, whatever the other rows hold (an all-zero row among them)."""
    from hetero.contract import quant

    rng = np.random.default_rng(m)
    rows, cols = 20, 512
    fmt = quant.QuantFormat(bits=4, block_size=32, symmetric=True)
    packed, w_scale, _ = layout.repack_q4(quant.quantize(rng.normal(size=(rows, cols)).astype(np.float32), fmt),
                                          cols)
    x = rng.normal(size=(m, cols)).astype(np.float32) * rng.uniform(0.1, 10, size=(m, 1)).astype(np.float32)
    x[m // 2] = 0
    xq, xs, y = hvx.matmul_q4(packed, w_scale, x)
    assert xq.shape == (m, cols) and xs.shape == (m, cols // 32) and y.shape == (m, rows)
    for j in range(m):
        one_q, one_s, one_y = hvx.matvec_q4(packed, w_scale, x[j])
        np.testing.assert_array_equal(xq[j], one_q)
        np.testing.assert_array_equal(xs[j], one_s)
        np.testing.assert_array_equal(y[j].view(np.uint32), one_y.view(np.uint32))


def test_rmsnorm_rows_and_rope_heads_are_the_one_row_calls(hvx):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(6, 64)).astype(np.float32) * 3
    weight = rng.normal(size=64).astype(np.float32)
    np.testing.assert_array_equal(hvx.rmsnorm(x, weight, 1e-6), np.stack([ref.rmsnorm(r, weight, 1e-6) for r in x]))
    angles = 9 * 1e6 ** (-np.arange(32) * 2 / 64)
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    np.testing.assert_array_equal(hvx.rope(x, cos, sin), np.stack([ref.rope(r, cos, sin) for r in x]))


def test_block_calls_refuse_more_rows_than_the_dsp_side_holds(hvx):
    packed, w_scale, _ = layout.repack_q4(np.zeros((4, 8 * 18), np.uint8), 256)
    with pytest.raises(BackendError, match=r"method 6 failed: bad arguments"):
        hvx.matmul_q4(packed, w_scale, np.zeros((17, 256), np.float32))  # Q4_MAX_ROWS is 16
    with pytest.raises(BackendError, match=r"method 4 failed: bad arguments"):
        hvx.rmsnorm(np.zeros((17, 64), np.float32), np.ones(64, np.float32), 1e-6)
    with pytest.raises(BackendError, match=r"method 4 failed: bad arguments"):
        hvx.rmsnorm(np.zeros(70, np.float32), np.ones(64, np.float32), 1e-6)  # not whole rows of the weight's n
