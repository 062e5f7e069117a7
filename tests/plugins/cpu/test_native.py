"""Tests of the CPU plugin's native kernels (hetero_cpu._native) against numpy, on every ISA path the CPU has."""

from __future__ import annotations

import math

import numpy as np
import pytest

_native = pytest.importorskip(
    "hetero_cpu._native",
    reason="the hetero-cpu native extension is not built (pip install --no-build-isolation ./plugins/cpu)",
)

ISAS = _native.available_isas()
ODD = [1, 3, 17, 33, 127]


def rng(seed=0):
    return np.random.default_rng(seed)


def randn(*shape, seed=0, dtype=np.float32):
    return rng(seed).standard_normal(shape).astype(dtype)


def assert_gemm_close(got, ref, k):
    # float32 accumulation over k terms: error grows ~ sqrt(k) * eps * |a||b|.
    tol = 1e-5 * max(1.0, math.sqrt(max(k, 1))) * max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=tol)


# ------------------------------------------------------------------------------------------------------ runtime


def test_isa_queries():
    assert _native.isa() in ISAS
    assert "generic" in ISAS
    assert set(ISAS) <= {"avx512", "avx2", "neon", "generic"}
    with pytest.raises(ValueError, match="not available"):
        _native.set_isa("sse9")


def test_threads_roundtrip():
    before = _native.num_threads()
    try:
        _native.set_num_threads(3)
        assert _native.num_threads() == 3
        with pytest.raises(ValueError):
            _native.set_num_threads(0)
    finally:
        _native.set_num_threads(before)


# --------------------------------------------------------------------------------------------------------- gemm


@pytest.mark.parametrize("m", [*ODD, 2, 4, 5, 12, 32, 64])  # 32, 64: 8 and 4 rows past the 12-row tiles
@pytest.mark.parametrize("n", [1, 17, 33, 100])
@pytest.mark.parametrize("k", [1, 3, 127, 300])
def test_gemm_shapes(isa, m, n, k):
    a, b = randn(m, k, seed=1), randn(k, n, seed=2)
    out = np.empty((m, n), np.float32)
    _native.gemm(a, b, out)
    assert_gemm_close(out, a.astype(np.float64) @ b, k)


# M with 1-11 rows past whole 12-row tiles (66: khmer_segmenter's 5 x 12 + 6 tokens; 70: T5's 5 x 12 + 10; 13, 14, 25,
# 26: the 2-row tile, 26 ddddocr's CRNN time steps), K and N as the transformers' products have them (N off the
# 32-column panels too), float and exactly-int8 weights
@pytest.mark.parametrize("m", [5, 6, 7, 13, 14, 18, 22, 25, 26, 28, 54, 66, 70, 71])
@pytest.mark.parametrize("k,n", [(192, 768), (64, 200)])
@pytest.mark.parametrize("weights", ["float", "int8"])
def test_gemm_packed_ragged_last_row_panel(isa, threads, m, k, n, weights):
    """The last row panel's short tiles (4-, 6-, 8-row variants of the 12-row tile): each row the same bits as in a
    product whose rows fill whole tiles (the micro-kernel's FMA chain), and a float64 product's values."""
    a = randn(m, k, seed=m)
    w = randn(k, n, seed=k)
    if weights == "int8":  # int8 x a per-column scale exactly: the GEMM keeps int8 panels and makes them floats
        w = np.round(np.clip(w * 40, -128, 127)).astype(np.float32) * np.float32(0.0125)
    bias = randn(n, seed=n)
    packed = _native.pack_b(w, False, True, "high")
    got = np.empty((m, n), np.float32)
    _native.gemm_packed(a, packed, got, 1.0, 0.0, bias)
    whole = -(-m // 12) * 12 + 12  # rows padded past the last tile: every row of a runs in a full 12-row tile
    padded = np.zeros((whole, k), np.float32)
    padded[:m] = a
    want = np.empty((whole, n), np.float32)
    _native.gemm_packed(padded, packed, want, 1.0, 0.0, bias)
    np.testing.assert_array_equal(got, want[:m])
    assert_gemm_close(got, a.astype(np.float64) @ w.astype(np.float64) + bias, k)


# gemm_prepacked_b skips the next B panel's software prefetch for <= 4 row tiles over the full depth (ddddocr's
# 26 x 1024 x 8210 Gemm, its BiLSTM's 26 x 512 x 2048 projection); HETERO_CPU_GEMM_NEXT_PANEL=1 / 0 forces it, read once
# a process. (m, k, n, int8 weights): 26 and 48 rows (3 and 4 tiles: skipped), 49 and 66 (5 and 6: kept), K past the
# kc blocking (2600: kept), N off the 32-column panels.
NEXT_PANEL_CASES = [(26, 1024, 8210, False), (26, 512, 2048, False), (5, 64, 200, False), (48, 300, 100, True),
                    (49, 300, 100, False), (66, 192, 768, True), (26, 2600, 70, False)]
_NEXT_PANEL_CODE = """
import sys
import numpy as np
from hetero_cpu import _native
out_path, isas, threads, inputs = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), np.load(sys.argv[4])
_native.set_num_threads(threads)
res = []
for isa in isas:
    _native.set_isa(isa)
    for i in range(len(inputs.files) // 3):
        a, w, bias = inputs[f"a{i}"], inputs[f"w{i}"], inputs[f"bias{i}"]
        got = np.full((a.shape[0], w.shape[1]), np.nan, np.float32)
        _native.gemm_packed(a, _native.pack_b(w, False, True, "high"), got, 1.0, 0.0, bias)
        res.append(got.ravel())
np.save(out_path, np.concatenate(res))
"""


def _next_panel_inputs() -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(a, w, bias) per NEXT_PANEL_CASES row; int8 rows: weights on an int8 grid (the int8-exact panels' path)."""
    inputs = []
    for m, k, n, int8 in NEXT_PANEL_CASES:
        rng = np.random.default_rng(m * 7 + k)
        a = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((k, n)).astype(np.float32)
        if int8:
            w = np.round(np.clip(w * 40, -128, 127)).astype(np.float32) * np.float32(0.0125)
        inputs.append((a, w, rng.standard_normal(n).astype(np.float32)))
    return inputs


@pytest.mark.parametrize("threads", [1, 2])
def test_gemm_packed_next_panel_prefetch_bits(tmp_path, threads):
    """Only a prefetch differs: the same bits with it forced on, forced off and by the rule, every ISA, 1 and 2
    threads, and a float64 product's values."""
    import os
    import subprocess
    import sys

    inputs = _next_panel_inputs()
    inputs_path = tmp_path / "inputs.npz"
    np.savez(inputs_path, **{f"{name}{i}": v for i, case in enumerate(inputs)
                             for name, v in zip(("a", "w", "bias"), case, strict=True)})
    res = {}
    for side, flag in (("on", "1"), ("off", "0"), ("rule", "")):
        path = tmp_path / f"{side}.npy"
        subprocess.run([sys.executable, "-c", _NEXT_PANEL_CODE, str(path), ",".join(ISAS), str(threads),
                        str(inputs_path)], env=dict(os.environ, HETERO_CPU_GEMM_NEXT_PANEL=flag), check=True,
                       timeout=600)
        res[side] = np.load(path)
    assert res["on"].size == res["off"].size == res["rule"].size > 0
    np.testing.assert_array_equal(res["on"].view(np.uint32), res["off"].view(np.uint32))
    np.testing.assert_array_equal(res["on"].view(np.uint32), res["rule"].view(np.uint32))
    at = 0
    for _ in ISAS:
        for a, w, bias in inputs:
            got = res["rule"][at:at + bias.size * a.shape[0]].reshape(a.shape[0], bias.size)
            at += got.size
            assert_gemm_close(got, a.astype(np.float64) @ w.astype(np.float64) + bias, a.shape[1])


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("m,k,n", [(1, 33, 17), (3, 64, 100), (37, 129, 65), (200, 300, 70)])
def test_gemm_transpose_alpha_beta(isa, trans_a, trans_b, m, k, n):
    a = randn(k, m, seed=3) if trans_a else randn(m, k, seed=3)
    b = randn(n, k, seed=4) if trans_b else randn(k, n, seed=4)
    c0 = randn(m, n, seed=5)
    out = c0.copy()
    _native.gemm(a, b, out, trans_a=trans_a, trans_b=trans_b, alpha=0.5, beta=-2.0)
    op_a = a.T if trans_a else a
    op_b = b.T if trans_b else b
    assert_gemm_close(out, 0.5 * (op_a.astype(np.float64) @ op_b) - 2.0 * c0, k)


@pytest.mark.parametrize("bias_shape", ["scalar", "n", "1n", "m1", "mn", "strided_n"])
@pytest.mark.parametrize("m", [1, 3, 50])
def test_gemm_bias(isa, bias_shape, m):
    k, n = 40, 37
    a, b = randn(m, k, seed=6), randn(k, n, seed=7)
    bias = {
        "scalar": np.array(1.5, np.float32),
        "n": randn(n, seed=8),
        "1n": randn(1, n, seed=8),
        "m1": randn(m, 1, seed=8),
        "mn": randn(m, n, seed=8),
        "strided_n": randn(2 * n, seed=8)[::2],
    }[bias_shape]
    c0 = randn(m, n, seed=9)
    out = c0.copy()
    _native.gemm(a, b, out, beta=0.25, bias=bias)
    assert_gemm_close(out, a.astype(np.float64) @ b + 0.25 * c0 + bias, k)


def test_gemm_strided_views(isa):
    base_a, base_b = randn(80, 90, seed=10), randn(120, 70, seed=11)
    a = base_a[3:60:2, 5:75]  # (29, 70) with a row step
    b = base_b[::-1][:70, ::3]  # negative row stride, column step
    out = np.empty((a.shape[0], b.shape[1]), np.float32)
    _native.gemm(a, b, out)
    assert_gemm_close(out, a.astype(np.float64) @ b, 70)
    out1 = np.empty((1, b.shape[1]), np.float32)
    _native.gemm(a[:1], b, out1)
    assert_gemm_close(out1, a[:1].astype(np.float64) @ b, 70)


def test_gemm_large_threads(isa, threads):
    m, k, n = 150, 513, 259
    a, b = randn(m, k, seed=12), randn(k, n, seed=13)
    out = np.empty((m, n), np.float32)
    _native.gemm(a, b, out)
    assert_gemm_close(out, a.astype(np.float64) @ b, k)
    a1 = randn(1, 2048, seed=14)
    b1 = randn(2048, 1000, seed=15)
    out1 = np.empty((1, 1000), np.float32)
    _native.gemm(a1, b1, out1)
    assert_gemm_close(out1, a1.astype(np.float64) @ b1, 2048)
    _native.gemm(a1, np.ascontiguousarray(b1.T), out1, trans_b=True)
    assert_gemm_close(out1, a1.astype(np.float64) @ b1, 2048)


@pytest.mark.parametrize("m,k,n", [(128, 384, 384), (37, 70, 300), (130, 1536, 65)])
def test_gemm_column_split_same_bits_at_1_2_3_threads(isa, m, k, n):
    # Few row panels, many column panels: the threads split N and share A, packed once (strided A, alpha, beta and a
    # bias through the same path). The bits must not depend on the thread count.
    a = randn(m + 3, 2 * k, seed=16)[3:, ::2]
    b, bias, c0 = randn(k, n, seed=17), randn(n, seed=18), randn(m, n, seed=19)
    packed = _native.pack_b(b)
    before = _native.num_threads()
    outs = []
    try:
        for t in (1, 2, 3):
            _native.set_num_threads(t)
            out = c0.copy()
            _native.gemm(a, b, out, alpha=0.5, beta=2.0, bias=bias)
            out_p = np.empty((m, n), np.float32)
            _native.gemm_packed(a, packed, out_p)
            outs.append((out, out_p))
    finally:
        _native.set_num_threads(before)
    assert_gemm_close(outs[0][0], 0.5 * (a.astype(np.float64) @ b) + 2.0 * c0 + bias, k)
    assert_gemm_close(outs[0][1], a.astype(np.float64) @ b, k)
    for out, out_p in outs[1:]:
        np.testing.assert_array_equal(out, outs[0][0])
        np.testing.assert_array_equal(out_p, outs[0][1])


@pytest.mark.parametrize("m,k,n", [(20, 4096, 400), (64, 1536, 77), (130, 300, 65), (13, 9000, 40), (130, 20000, 33)])
@pytest.mark.parametrize("int8", [False, True])
def test_gemm_packed_deep_k_blocking(isa, m, k, n, int8):
    # K past the table's kc: one full-depth pass where a block of A fits half of L2 (ragged row and column tiles,
    # int8 panels made floats a panel at a time), kc steps where it does not (K = 20000 at M = 130). Same bits at 1
    # and 2 threads: the depth blocking is chosen from M, not from a thread's rows.
    a = randn(m, k, seed=40)
    b = randn(k, n, seed=41)
    if int8:  # int8 values times a power of two: exact, so pack_b keeps int8 panels
        b = (np.clip(np.round(b * 40), -127, 127) + 0.0).astype(np.float32) * np.float32(0.03125)  # + 0.0: no -0
    packed = _native.pack_b(b, precision="high")
    assert packed.int8 == int8
    c0, bias = randn(m, n, seed=42), randn(n, seed=43)
    before = _native.num_threads()
    outs = []
    try:
        for t in (1, 2):
            _native.set_num_threads(t)
            out = c0.copy()
            _native.gemm_packed(a, packed, out, alpha=0.5, beta=1.0, bias=bias)
            outs.append(out)
    finally:
        _native.set_num_threads(before)
    assert_gemm_close(outs[0], 0.5 * (a.astype(np.float64) @ b) + c0 + bias, k)
    np.testing.assert_array_equal(outs[1], outs[0])


def test_gemm_k_zero(isa):
    a, b = np.empty((3, 0), np.float32), np.empty((0, 4), np.float32)
    out = np.full((3, 4), 7.0, np.float32)
    _native.gemm(a, b, out, beta=0.5, bias=np.ones(4, np.float32))
    np.testing.assert_allclose(out, 4.5)


def test_gemm_errors():
    a, b = randn(3, 4), randn(5, 6)
    with pytest.raises(ValueError, match="inner dimensions"):
        _native.gemm(a, b, np.empty((3, 6), np.float32))
    with pytest.raises(ValueError, match="float32"):
        _native.gemm(a.astype(np.float64), randn(4, 6), np.empty((3, 6), np.float32))
    with pytest.raises(ValueError, match="shape"):
        _native.gemm(a, randn(4, 6), np.empty((3, 5), np.float32))
    with pytest.raises(ValueError, match="contiguous"):
        _native.gemm(a, randn(4, 6), np.empty((6, 3), np.float32).T)
    with pytest.raises(ValueError, match="broadcastable"):
        _native.gemm(a, randn(4, 6), np.empty((3, 6), np.float32), bias=randn(5))
    ro = np.empty((3, 6), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        _native.gemm(a, randn(4, 6), ro)


@pytest.mark.parametrize("m", [1, 2, 4, 5, 33, 130])
@pytest.mark.parametrize("trans_b", [False, True])
def test_gemm_packed(isa, m, trans_b):
    k, n = 129, 77
    b = randn(n, k, seed=16) if trans_b else randn(k, n, seed=16)
    packed = _native.pack_b(b, trans_b=trans_b)
    assert (packed.k, packed.n) == (k, n)
    op_b = b.T if trans_b else b
    for seed in (17, 18):  # reused across calls
        a = randn(m, k, seed=seed)
        bias = randn(n, seed=seed + 1)
        c0 = randn(m, n, seed=seed + 2)
        out = c0.copy()
        _native.gemm_packed(a, packed, out, alpha=2.0, beta=1.0, bias=bias)
        assert_gemm_close(out, 2.0 * (a.astype(np.float64) @ op_b) + c0 + bias, k)
    with pytest.raises(ValueError, match="k="):
        _native.gemm_packed(randn(m, k + 1), packed, np.empty((m, n), np.float32))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 8, 9])
@pytest.mark.parametrize("k", [4, 16, 17, 31, 200])
def test_gemm_packed_narrow(isa, threads, n, k):
    """Few-column weights (n <= 8, k >= the ISA's lanes: gemm_narrow, B's columns as whole vectors, the last one
    meeting the row's last lanes; otherwise the panels): rows in groups and alone, the bias row in the stores, and
    alpha / beta (the panels again) on the same packed weight."""
    b = randn(k, n, seed=30)
    packed = _native.pack_b(b)
    for m in (1, 3, 4, 5, 13, 882):
        a = randn(m, k, seed=31 + m)
        bias = randn(n, seed=32)
        ref = a.astype(np.float64) @ b
        out = np.full((m, n), np.nan, np.float32)
        _native.gemm_packed(a, packed, out, 1.0, 0.0, bias)
        assert_gemm_close(out, ref + bias, k)
        _native.gemm_packed(a, packed, out)
        assert_gemm_close(out, ref, k)
        c0 = randn(m, n, seed=33)
        out = c0.copy()
        _native.gemm_packed(a, packed, out, 2.0, 1.0, bias)
        assert_gemm_close(out, 2.0 * ref + c0 + bias, k)
    # a strided A (every other row of a wider matrix): the row stride is the kernel's lda
    wide = randn(20, 2 * k, seed=34)
    out = np.empty((20, n), np.float32)
    _native.gemm_packed(wide[:, :k], packed, out)
    assert_gemm_close(out, wide[:, :k].astype(np.float64) @ b, k)


@pytest.mark.parametrize("ba,bb,bsz", [(1, 1, 1), (3, 3, 3), (1, 4, 4), (5, 1, 5), (2, 2, 2)])
@pytest.mark.parametrize("m,k,n", [(1, 17, 33), (7, 33, 5), (40, 64, 48)])
def test_matmul_batched(isa, ba, bb, bsz, m, k, n):
    a, b = randn(ba, m, k, seed=20), randn(bb, k, n, seed=21)
    out = np.empty((bsz, m, n), np.float32)
    _native.matmul(a, b, out)
    assert_gemm_close(out, np.matmul(a.astype(np.float64), b), k)


def test_matmul_strided_batches(isa):
    base = randn(4, 20, 30, seed=22)
    a = base[:, ::2, :17]  # batches not evenly spaced as rows
    b = randn(1, 17, 9, seed=23)
    out = np.empty((4, 10, 9), np.float32)
    _native.matmul(a, b, out)
    assert_gemm_close(out, np.matmul(a.astype(np.float64), b), 17)
    bt = randn(4, 9, 17, seed=24).transpose(0, 2, 1)  # transposed B views per batch
    _native.matmul(a, bt, out)
    assert_gemm_close(out, np.matmul(a.astype(np.float64), bt), 17)
    with pytest.raises(ValueError, match="batch"):
        _native.matmul(randn(2, 3, 4), randn(3, 4, 5), np.empty((3, 3, 5), np.float32))


@pytest.mark.parametrize("bsz,m", [(1, 1), (3, 1), (2, 5), (4, 33)])
def test_matmul_packed(isa, bsz, m):
    k, n = 65, 40
    b = randn(k, n, seed=25)
    packed = _native.pack_b(b)
    a = randn(bsz, m, k, seed=26)
    out = np.empty((bsz, m, n), np.float32)
    _native.matmul_packed(a, packed, out)
    assert_gemm_close(out, np.matmul(a.astype(np.float64), b), k)
    a2 = randn(bsz, 2 * m, k, seed=27)[:, ::2]
    _native.matmul_packed(a2, packed, out)
    assert_gemm_close(out, np.matmul(a2.astype(np.float64), b), k)


# ------------------------------------------------------------------------------------------------------ binary

BIN_F = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "max": np.maximum,
    "min": np.minimum,
    "pow": np.power,
}


def _broadcast_cases(shape_out, seed):
    """(a, b) pairs already broadcast to shape_out: contiguous, scalar, row, column, strided, transposed."""
    r = rng(seed)
    full = lambda: r.standard_normal(shape_out).astype(np.float32)  # noqa: E731
    rows, cols = shape_out[-2], shape_out[-1]
    yield "contiguous", full(), full()
    yield "scalar_b", full(), np.broadcast_to(np.float32(r.standard_normal()), shape_out)
    yield "scalar_a", np.broadcast_to(np.float32(r.standard_normal()), shape_out), full()
    yield "row", full(), np.broadcast_to(r.standard_normal(cols).astype(np.float32), shape_out)
    yield "column", full(), np.broadcast_to(r.standard_normal((rows, 1)).astype(np.float32), shape_out)
    yield "column_a", np.broadcast_to(r.standard_normal((rows, 1)).astype(np.float32), shape_out), full()
    big = r.standard_normal(tuple(2 * s for s in shape_out)).astype(np.float32)
    yield "strided", big[tuple(slice(None, None, 2) for _ in shape_out)], full()
    t = r.standard_normal(shape_out[::-1]).astype(np.float32)
    yield "transposed", full(), t.T


@pytest.mark.parametrize("op", list(BIN_F))
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (33, 127), (2, 3, 5, 7), (4, 70000)])
def test_binary_float(isa, op, shape):
    for name, a, b in _broadcast_cases(shape, seed=len(shape)):
        if op == "pow":
            a = np.abs(a) + np.float32(0.5)
        if op == "div":
            b = np.where(np.abs(b) < 0.1, np.float32(0.5), b)
        out = np.empty(shape, np.float32)
        _native.binary(op, a, b, out)
        ref = BIN_F[op](a.astype(np.float64), b.astype(np.float64))
        np.testing.assert_allclose(out, ref, rtol=2e-6, atol=1e-6, err_msg=f"{op} {name}")


def test_binary_nan_propagation(isa):
    a = np.array([np.nan, 1.0, 2.0, np.nan, -np.inf] * 7, np.float32)
    b = np.array([1.0, np.nan, 3.0, np.nan, 0.0] * 7, np.float32)
    for op in ("max", "min"):
        out = np.empty_like(a)
        _native.binary(op, a, b, out)
        np.testing.assert_array_equal(out, BIN_F[op](a, b))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "max", "min", "div"])
def test_binary_int(op, dtype):
    r = rng(30)
    shape = (5, 33)
    a = r.integers(-1000, 1000, shape).astype(dtype)
    b = r.integers(-50, 50, shape).astype(dtype)
    b[b == 0] = 7
    for bb in (b, np.broadcast_to(b[:, :1], shape), np.broadcast_to(b[0], shape)):
        out = np.empty(shape, dtype)
        _native.binary(op, a, bb, out)
        if op == "div":
            ref = np.trunc(a.astype(np.float64) / bb).astype(dtype)  # C semantics: toward zero
        else:
            ref = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum, "min": np.minimum}[op](
                a, bb
            )
        np.testing.assert_array_equal(out, ref)


def test_binary_int_div_edge_cases():
    a = np.array([7, -7, 7, -7, 5, np.iinfo(np.int32).min], np.int32)
    b = np.array([2, 2, -2, -2, 0, -1], np.int32)
    out = np.empty_like(a)
    _native.binary("div", a, b, out)
    np.testing.assert_array_equal(out, [3, -3, -3, 3, 0, np.iinfo(np.int32).min])


def test_binary_errors():
    a = randn(3, 4)
    with pytest.raises(ValueError, match="unknown op"):
        _native.binary("xor", a, a, np.empty_like(a))
    with pytest.raises(ValueError, match="dtype"):
        _native.binary("add", a, a.astype(np.float64), np.empty_like(a))
    with pytest.raises(ValueError, match="broadcast"):
        _native.binary("add", a, randn(4), np.empty_like(a))
    ai = np.ones((3, 4), np.int32)
    with pytest.raises(ValueError, match="pow"):
        _native.binary("pow", ai, ai, np.empty_like(ai))
    with pytest.raises(ValueError, match="dtype"):
        _native.binary("add", a.astype(np.float16), a.astype(np.float16), np.empty((3, 4), np.float16))


# ------------------------------------------------------------------------------------------------------- unary

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _ref_unary(op, x, alpha, beta):
    x = x.astype(np.float64)
    with np.errstate(all="ignore"):
        sig = np.exp(-np.logaddexp(0, -x))  # no cancellation for x << 0
        sp = np.logaddexp(0, x)
        return {
            "relu": lambda: np.maximum(x, 0),
            "leaky_relu": lambda: np.where(x < 0, alpha * x, x),
            "leaky_relu_min": lambda: np.maximum(np.where(x < 0, alpha * x, x), beta),
            "elu": lambda: np.where(x < 0, alpha * np.expm1(x), x),
            "selu": lambda: beta * np.where(x > 0, x, alpha * np.expm1(x)),
            "celu": lambda: np.maximum(0, x) + np.minimum(0, alpha * np.expm1(x / alpha)),
            "sigmoid": lambda: sig,
            "hard_sigmoid": lambda: np.clip(alpha * x + beta, 0, 1),
            "hard_swish": lambda: x * np.clip(x / 6 + 0.5, 0, 1),
            "silu": lambda: x * sig,
            "gelu": lambda: 0.5 * x * (1 + _erf(x / math.sqrt(2))),
            "gelu_tanh": lambda: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
            "tanh": lambda: np.tanh(x),
            "softplus": lambda: sp,
            "softsign": lambda: x / (1 + np.abs(x)),
            "exp": lambda: np.exp(x),
            "log": lambda: np.log(x),
            "sqrt": lambda: np.sqrt(x),
            "rsqrt": lambda: 1 / np.sqrt(x),
            "neg": lambda: -x,
            "abs": lambda: np.abs(x),
            "reciprocal": lambda: 1 / x,
            "erf": lambda: _erf(x),
            "floor": lambda: np.floor(x),
            "ceil": lambda: np.ceil(x),
            "round": lambda: np.round(x),
            "sin": lambda: np.sin(x),
            "cos": lambda: np.cos(x),
            "clip": lambda: np.clip(x, alpha, beta),
            "mish": lambda: x * np.tanh(sp),
        }[op]()


UNARY_PARAMS = {
    "leaky_relu": (0.1, 0.0),
    "leaky_relu_min": (0.2, -0.4),
    "elu": (1.3, 0.0),
    "selu": (1.6732632, 1.0507010),
    "celu": (0.7, 0.0),
    "hard_sigmoid": (0.2, 0.5),
    "clip": (-0.5, 0.75),
}
POSITIVE_ONLY = {"log", "sqrt", "rsqrt"}


@pytest.mark.parametrize("op", sorted(_native.unary_ops()))
@pytest.mark.parametrize("n", [1, 3, 17, 33, 127, 1000])
def test_unary(isa, op, n):
    alpha, beta = UNARY_PARAMS.get(op, (0.0, 0.0))
    x = randn(n, seed=n) * 3
    if op in POSITIVE_ONLY:
        x = np.abs(x) + np.float32(1e-3)
    if op == "round":
        x[: min(n, 6)] = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4], np.float32)[: min(n, 6)]
    out = np.empty_like(x)
    _native.unary(op, x, out, alpha, beta)
    ref = _ref_unary(op, x, alpha, beta)
    # gelu / gelu_tanh / mish lose relative accuracy where 1 + erf/tanh cancels (x << 0): absolute there.
    np.testing.assert_allclose(out, ref, rtol=2e-6, atol=1e-6, err_msg=op)


@pytest.mark.parametrize("op", ["exp", "sigmoid", "silu", "softplus"])
def test_unary_subnormal_tails(isa, op):
    # exp's results below 2^-126 are built as integers (vscale_tiny), not by a product that reads or writes a
    # subnormal (a microcode assist on x86); sigmoid (and so silu) is 0 below SIGMOID_FLUSH (x < -86.5, where it is
    # under 2.7e-38: 1 + exp(-x) stays under 2^125, every ISA's reciprocal estimate normal). Lanes of one vector mix
    # the tails with ordinary values, x from -110 to 400: correctly rounded where the result is normal (2e-6), within
    # 2 subnormal steps below.
    r = rng(43)
    x = np.concatenate([np.linspace(-110, -80, 30001), np.linspace(80, 400, 3001), r.uniform(-400, 400, 20000),
                        r.uniform(-3, 3, 2000),
                        [-86.5, -86.51, -87.0, -87.33, -87.34, -104.0, -104.00001, 1e-40, -1e-40]])
    x = r.permutation(x).astype(np.float32)
    out = np.empty_like(x)
    _native.unary(op, x, out)
    ref = _ref_unary(op, x, 0, 0)
    if op in ("sigmoid", "silu"):
        flushed = x < np.float32(-86.5)
        np.testing.assert_array_equal(out[flushed], 0)
        x, out, ref = x[~flushed], out[~flushed], ref[~flushed]
    tiny = np.finfo(np.float32).tiny
    fin = np.abs(ref) < 3.4e38
    normal = fin & (np.abs(ref) >= tiny)
    rel = np.abs(out[normal] - ref[normal]) / np.abs(ref[normal])
    assert rel.max() <= 2e-6, f"{op}: max rel err {rel.max():.3g} at x={x[normal][rel.argmax()]!r}"
    assert np.all(np.abs(out[fin & ~normal] - ref[fin & ~normal]) <= 2 * 1.4e-45 + 2e-6 * np.abs(ref[fin & ~normal]))
    assert np.all(np.isposinf(out[~fin]))  # exp / softplus past float's range


def _silu_ref(x):
    x = x.astype(np.float64)
    with np.errstate(all="ignore"):
        return x * np.exp(-np.logaddexp(0, -x))


def test_conv_silu_epilogue_error_bound(isa):
    # The conv tiles' SiLU (vsilu_act: a degree-5 exponential, one-constant reduction where the fma is fused, the
    # multiplicand clamped at SIGMOID_FLUSH): under 6e-7 relative wherever x >= -86.5 and x silu(x) is a normal float
    # (4.5e-7 measured, at x = -85); below -86.5 (and at -inf) a normal -2.3e-36, never 0 * inf's NaN; NaN and +inf
    # through. Every float32 bit pattern from 2e-31 to 90, a stride of 37, of both signs, through a depthwise conv
    # with weights 1 (its output is the input bit for bit), and the same with a bias (the bias added before the SiLU).
    bits = np.arange(0x0D000000, 0x42B40000, 37, dtype=np.uint32)
    pos = bits.view(np.float32)
    special = np.float32([0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, -86.5, -86.51, -87, -100, -1e30, 1e30,
                          20, 17.33, 3e38, -3e38])
    x = np.concatenate([pos, -pos, rng(44).uniform(-20, 20, 20000).astype(np.float32), special])
    c = 64
    x = np.concatenate([x, np.zeros((-x.size) % c, np.float32)])
    for bias in (0.0, 0.375):
        b = np.full(c, bias, np.float32)
        out = np.full((1, c, x.size // c, 1), np.nan, np.float32)
        _native.conv2d(x.reshape(out.shape), np.ones((c, 1, 1, 1), np.float32), b, out, group=c, activation="silu")
        y, v = out.reshape(-1), x + np.float32(bias)  # the float32 sum the kernel applies the SiLU to
        ref = _silu_ref(v)
        ok = np.isfinite(ref) & (np.abs(ref) >= np.finfo(np.float32).tiny) & (v >= np.float32(-86.5))
        rel = np.abs(y[ok] - ref[ok]) / np.abs(ref[ok])
        assert rel.max() <= 6e-7, f"max rel err {rel.max():.3g} at x={v[ok][rel.argmax()]!r}"
        low = v < np.float32(-86.5)
        assert np.all((y[low] <= 0) & (y[low] >= -2.4e-36) & (y[low] != 0)), y[low][:8]
        assert np.isnan(y[np.isnan(v)]).all() and np.isposinf(y[v == np.inf]).all()
        tiny = np.isfinite(v) & ~ok & ~low  # subnormal results near 0: within 2 subnormal steps
        assert np.all(np.abs(y[tiny] - ref[tiny]) <= 2 * 1.4e-45 + 6e-7 * np.abs(ref[tiny]))


def test_conv_silu_epilogue_gemm_paths(isa):
    # The same SiLU on a 1 -> 48 channel 1x1 conv's and a 3x3 conv's outputs (the GEMM / pointwise and direct /
    # Winograd epilogues), finite inputs: within 6e-7 relative of the float64 SiLU of the kernel's own pre-activation
    x = randn(1, 1, 37, 45, seed=45) * 9
    w = np.ones((48, 1, 1, 1), np.float32)
    out = np.empty((1, 48, 37, 45), np.float32)
    _native.conv2d(x, w, np.zeros(48, np.float32), out, activation="silu")
    ref = np.broadcast_to(_silu_ref(x), out.shape)
    np.testing.assert_allclose(out, ref, rtol=6e-7, atol=1e-30)
    x3 = randn(1, 8, 23, 29, seed=46)
    w3 = randn(16, 8, 3, 3, seed=47) * 0.5
    b3 = randn(16, seed=48)
    pre = np.empty((1, 16, 23, 29), np.float32)
    _native.conv2d(x3, w3, b3, pre, pads=(1, 1, 1, 1))
    post = np.empty_like(pre)
    _native.conv2d(x3, w3, b3, post, pads=(1, 1, 1, 1), activation="silu")
    np.testing.assert_allclose(post, _silu_ref(pre), rtol=6e-7, atol=1e-30)


def test_softmax_flushes_probabilities_under_the_normal_range(isa):
    # terms whose probability would be under 2^-126 are 0 (no subnormal products); the rest as float64 gives them
    x = np.concatenate([np.linspace(-200, 0, 400), [5.0, 3.0]]).astype(np.float32)[None]
    y = np.empty_like(x)
    _native.softmax(x, y)
    d = (x - x.max()).astype(np.float64)  # the float32 differences the kernel exponentiates
    ref = np.exp(d) / np.exp(d).sum()
    tiny = np.finfo(np.float32).tiny
    assert not np.any((y != 0) & (np.abs(y) < tiny))
    big = ref >= tiny
    np.testing.assert_allclose(y[big], ref[big], rtol=2e-6)
    assert np.all(y[~big] <= tiny)


@pytest.mark.parametrize("op", ["exp", "tanh", "sigmoid", "erf", "log"])
def test_unary_accuracy_wide_range(isa, op):
    # Dense sweep over the whole useful range plus extremes; max relative error <= 2e-6 against float64.
    r = rng(40)
    if op == "log":
        x = np.concatenate(
            [np.geomspace(1e-44, 3e38, 20000), r.uniform(0.5, 2.0, 20000), [1.0, 2.0, np.float32(1.17549435e-38)]]
        ).astype(np.float32)
    elif op == "exp":
        x = np.concatenate([np.linspace(-103, 88.7, 40000), r.uniform(-1, 1, 10000), [0.0, -0.0]]).astype(np.float32)
    else:
        x = np.concatenate([np.linspace(-30, 30, 40000), r.uniform(-1, 1, 10000), [0.0, 1e-30, -1e-30]]).astype(
            np.float32
        )
    out = np.empty_like(x)
    _native.unary(op, x, out)
    ref = _ref_unary(op, x, 0, 0)
    tiny = np.finfo(np.float32).tiny
    normal = np.abs(ref) >= tiny  # subnormal results: compare absolutely
    rel = np.abs(out[normal] - ref[normal]) / np.abs(ref[normal])
    assert rel.max() <= 2e-6, f"{op}: max rel err {rel.max():.3g} at x={x[normal][rel.argmax()]!r}"
    assert np.all(np.abs(out[~normal] - ref[~normal]) <= 2 * 1.4e-45 + 2e-6 * np.abs(ref[~normal]))


def test_tanh_rational_form_edges(isa):
    # tanh is x P(x^2) / Q(x^2) up to |x| = 9 and +-1 from there (kernels_impl.hpp): odd to the bit, exactly +-1 past
    # the clamp and never past it below, the sign of 0 kept, NaN through; within 2e-6 of float64 on both sides.
    x = np.concatenate([np.linspace(3, 9.5, 200001), np.geomspace(1e-38, 8.5, 20000), [9.0, 30.0, np.inf]])
    x = x.astype(np.float32)
    pos, neg = np.empty_like(x), np.empty_like(x)
    _native.unary("tanh", x, pos)
    _native.unary("tanh", -x, neg)
    np.testing.assert_array_equal(neg, -pos)
    assert np.all(pos[x >= 9] == 1.0)
    assert np.all(pos <= 1.0)  # BroadcastUnaryMatMul predicts the range of tanh(x) from its ends: 1 must bound it
    ref = np.tanh(x.astype(np.float64))
    assert (np.abs(pos - ref) / ref).max() <= 2e-6
    z = np.array([0.0, -0.0, np.nan], np.float32)
    out = np.empty_like(z)
    _native.unary("tanh", z, out)
    assert out[0] == 0 and not np.signbit(out[0]) and np.signbit(out[1]) and np.isnan(out[2])


def test_gelu_tanh_wide_range(isa):
    # x sigmoid(2u) with |2u| clamped at 80: relative accuracy where the value is not tiny, absolute (the tanh form's
    # own 0) where 2u < -80, and inf / nan as the tanh form gives them.
    x = np.concatenate([np.linspace(-300, 300, 60001), rng(41).uniform(-8, 8, 20000),
                        [0.0, -0.0, 1e-30, -1e-30, np.inf, -np.inf, np.nan]]).astype(np.float32)
    out = np.empty_like(x)
    _native.unary("gelu_tanh", x, out)
    with np.errstate(invalid="ignore", over="ignore"):
        ref = _ref_unary("gelu_tanh", x, 0, 0)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    fin = np.isfinite(ref)
    np.testing.assert_array_equal(out[~fin & ~np.isnan(ref)], ref[~fin & ~np.isnan(ref)])
    big = fin & (np.abs(ref) >= 1e-6)
    rel = np.abs(out[big] - ref[big]) / np.abs(ref[big])
    assert rel.max() <= 4e-6, f"max rel err {rel.max():.3g} at x={x[big][rel.argmax()]!r}"
    assert np.all(np.abs(out[fin & ~big] - ref[fin & ~big]) <= 1e-6)


def test_gelu_erf_wide_range(isa):
    # x Phi(x) from one erfc form for every x (A&S 7.1.26, absolute error 1.5e-7): relative accuracy for x >= 0
    # (Phi >= 1/2), absolute for x < 0 (no cancellation in 1 + erf there, but the form's relative error grows in the
    # tail); Phi is 0 / 1 from |x| = 9 sqrt 2 (either side of the cap), and inf / nan as 0.5 x (1 + erf) gives them.
    cap = 9 * np.sqrt(2)
    x = np.concatenate([np.linspace(-300, 300, 60001), rng(42).uniform(-8, 8, 20000),
                        np.linspace(-cap - 1e-3, -cap + 1e-3, 101), np.linspace(cap - 1e-3, cap + 1e-3, 101),
                        [0.0, -0.0, 1e-30, -1e-30, 1e-40, np.inf, -np.inf, np.nan]]).astype(np.float32)
    out = np.empty_like(x)
    _native.unary("gelu", x, out)
    with np.errstate(invalid="ignore", over="ignore"):
        ref = _ref_unary("gelu", x, 0, 0)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_array_equal(out[np.isinf(ref)], ref[np.isinf(ref)])
    pos, neg = np.isfinite(ref) & (x > 0), np.isfinite(ref) & (x <= 0)
    rel = np.abs(out[pos] - ref[pos]) / np.abs(ref[pos])
    assert rel.max() <= 1e-6, f"max rel err {rel.max():.3g} at x={x[pos][rel.argmax()]!r}"
    err = np.abs(out[neg] - ref[neg])
    assert err.max() <= 5e-7, f"max abs err {err.max():.3g} at x={x[neg][err.argmax()]!r}"
    far = np.isfinite(x) & (np.abs(x) > cap + 1e-3)
    np.testing.assert_array_equal(out[far], np.where(x[far] > 0, x[far], 0))


def test_unary_special_values(isa):
    inf, nan = np.inf, np.nan
    x = np.array([inf, -inf, nan, 0.0, -0.0, 1e30, -1e30, 100.0, -100.0], np.float32)
    expect = {
        "exp": [inf, 0, nan, 1, 1, inf, 0, inf, 3.7200760e-44],
        "tanh": [1, -1, nan, 0, -0.0, 1, -1, 1, -1],
        "sigmoid": [1, 0, nan, 0.5, 0.5, 1, 0, 1, 0],  # flushed below exp's normal range (SIGMOID_FLUSH)
        "erf": [1, -1, nan, 0, -0.0, 1, -1, 1, -1],
        "relu": [inf, 0, nan, 0, 0, 1e30, 0, 100, 0],
        "softplus": [inf, 0, nan, math.log(2), math.log(2), 1e30, 0, 100, 3.7200760e-44],
    }
    for op, ref in expect.items():
        out = np.empty_like(x)
        _native.unary(op, x, out)
        np.testing.assert_allclose(out, np.array(ref, np.float32), rtol=2e-6, atol=3e-45, err_msg=op)  # subnormals
    xl = np.array([0.0, -1.0, inf, nan, 1.0, 1e-45, 3e38, 0.5, 2.0], np.float32)
    out = np.empty_like(xl)
    _native.unary("log", xl, out)
    with np.errstate(all="ignore"):
        ref = np.log(xl.astype(np.float64))
    np.testing.assert_allclose(out, ref, rtol=2e-6)


def test_unary_strided_and_nd(isa):
    base = randn(6, 40, 50, seed=41)
    for view in (base[:, ::3, 1::2], base.transpose(2, 0, 1), base[::-1]):
        out = np.empty(view.shape, np.float32)
        _native.unary("tanh", view, out)
        np.testing.assert_allclose(out, np.tanh(view.astype(np.float64)), rtol=2e-6, atol=1e-7)


def test_unary_errors():
    x = randn(4)
    with pytest.raises(ValueError, match="unknown op"):
        _native.unary("frobnicate", x, np.empty_like(x))
    with pytest.raises(ValueError, match="shape"):
        _native.unary("exp", x, np.empty(5, np.float32))


# ------------------------------------------------------------------------------------------------ row kernels


@pytest.mark.parametrize("rows,n", [(1, 1), (3, 17), (33, 127), (5, 1000), (2000, 33), (7, 70), (4, 128), (3, 129)])
@pytest.mark.parametrize("log", [False, True])
def test_softmax(isa, rows, n, log):
    x = randn(rows, n, seed=n) * 10
    x[0, 0] = 80.0  # large values must not overflow
    out = np.empty_like(x)
    _native.softmax(x, out, log=log)
    x64 = x.astype(np.float64)
    lse = np.log(np.exp(x64 - x64.max(1, keepdims=True)).sum(1, keepdims=True)) + x64.max(1, keepdims=True)
    ref = x64 - lse if log else np.exp(x64 - lse)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [1, 5, 16, 70, 128, 129, 300])
def test_softmax_special_values_as_float64(isa, n):
    """Rows short enough to be softmaxed in registers (up to 8 vectors) and longer ones: a NaN or +inf makes the row
    NaN, -inf terms are 0, an all -inf row is NaN, as float64 numpy's exp(x - max) / sum gives them."""
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((7, n)) * 5).astype(np.float32)
    x[1, n // 2] = np.nan
    x[2, :] = -np.inf
    x[3, n // 3] = np.inf
    x[4, ::2] = -np.inf
    x[5, :] = -1e30
    x[6, -1] = 60.0  # the last, ragged vector holds the max
    out = np.empty_like(x)
    _native.softmax(x, out)
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(x64 - x64.max(1, keepdims=True))
        ref = e / e.sum(1, keepdims=True)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("shape", [(1, 16, 33600), (1, 5, 4099), (2, 7, 1000), (3, 4, 2053), (5, 9, 700)])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_axis_split_by_columns(isa, pool, shape, log):
    # Outer dims smaller than the thread count (YOLOv8's DFL softmax: 1 x 16 x 33600) split by column blocks; each
    # column is computed alone, so 2 and 3 threads must give the 1-thread bits.
    x = randn(*shape, seed=shape[2]) * 10
    x[0, 0, -1] = 80.0  # large values must not overflow (in the ragged last block)
    outs = []
    for t in (1, 2, 3):
        _native.set_num_threads(t)
        out = np.empty_like(x)
        _native.pool_stats(True)
        _native.softmax_axis(x, out, log=log)
        stats = _native.pool_stats(True)
        if t > 1 and shape[0] == 1:  # one outer block: split by columns, not run on one thread
            assert stats["calls"] == 1 and stats["serial_calls"] == 0 and stats["tasks"] >= 2
        outs.append(out)
    x64 = x.astype(np.float64)
    mx = x64.max(1, keepdims=True)
    lse = np.log(np.exp(x64 - mx).sum(1, keepdims=True)) + mx
    ref = x64 - lse if log else np.exp(x64 - lse)
    np.testing.assert_allclose(outs[0], ref, rtol=1e-5, atol=1e-6)
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])


@pytest.mark.parametrize("rows,n", [(1, 1), (3, 17), (33, 127), (7, 1000)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm(isa, rows, n, with_bias):
    x = randn(rows, n, seed=50) * 3 + 100  # large mean: a one-pass variance would lose digits
    scale, bias = randn(n, seed=51), randn(n, seed=52)
    out = np.empty_like(x)
    mean, invstd = np.empty(rows, np.float32), np.empty((rows, 1), np.float32)
    _native.layer_norm(x, scale, bias if with_bias else None, out, 1e-5, mean_out=mean, invstd_out=invstd)
    x64 = x.astype(np.float64)
    mu = x64.mean(1, keepdims=True)
    inv = 1 / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
    ref = (x64 - mu) * inv * scale + (bias if with_bias else 0)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(mean, mu[:, 0], rtol=1e-6)
    np.testing.assert_allclose(invstd, inv, rtol=1e-4)


def test_layer_norm_strided(isa):
    base = randn(10, 64, seed=53)
    x = base[::2, ::2]
    scale = randn(64, seed=54)[::2]
    out = np.empty(x.shape, np.float32)
    _native.layer_norm(x, scale, None, out, 1e-5)
    x64 = x.astype(np.float64)
    ref = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5) * scale
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="scale"):
        _native.layer_norm(x, randn(3), None, out, 1e-5)


@pytest.mark.parametrize("rows,n", [(1, 1), (3, 17), (33, 127), (4, 4096)])
def test_rms_norm(isa, rows, n):
    x, scale = randn(rows, n, seed=60), randn(n, seed=61)
    out = np.empty_like(x)
    _native.rms_norm(x, scale, out, 1e-6)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64**2).mean(1, keepdims=True) + 1e-6) * scale
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------------- data


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.float16, np.int64, np.bool_, np.complex128])
def test_copy_views(dtype, threads):
    base = (rng(70).standard_normal((6, 50, 70)) * 100).astype(dtype)
    views = {
        "contiguous": base,
        "transpose2d": base[0].T,
        "transpose3d": base.transpose(2, 0, 1),
        "swap_last": base.transpose(0, 2, 1),
        "slice_step": base[1:5:2, ::-3, 7:60],
        "expand": np.broadcast_to(base[:, :1, :], (6, 50, 70)),
        "scalar": base[2, 3, 4],
        "empty": base[:, :0],
        "big_transpose": np.broadcast_to(base[0], (40, 50, 70)).transpose(0, 2, 1),
    }
    for name, v in views.items():
        v = np.asarray(v)
        out = np.empty(v.shape, dtype)
        _native.copy(v, out)
        np.testing.assert_array_equal(out, v, err_msg=name)


def _four_byte_transposes(dtype) -> dict[str, np.ndarray]:
    """Transposed views of 4-byte values that take the in-register W x W blocks on AVX2 / AVX-512 (whole 32-row
    blocks of the output and ragged ones, narrow outputs under a vector, outer axes, reversed and unaligned sources)."""
    r = rng(72)
    bits = r.integers(-2**31, 2**31, size=(3, 512, 256), dtype=np.int64).astype(np.int32)
    bits[0, :4, :4] = np.array([0x7FA00001, 0x7FC00000, -0x800000, 0x7F800000], np.int32)  # NaN payloads, infinities
    base = bits.view(np.float32) if dtype == np.float32 else bits
    raw = np.zeros(4 * 40 * 37 + 1, np.uint8)
    unaligned = np.frombuffer(raw.data, dtype, 40 * 37, offset=1).reshape(40, 37)
    return {
        "magika": base[0].reshape(1, 512, 256, 1).transpose(0, 2, 1, 3),
        "ragged": base[0, :40, :37].T,  # 37 output rows: a 32-row block and a 5-row one; 40 columns: 2 vectors + 8
        "ragged_rows": base[0, :53, :35].T,
        "narrow": base[0, :200, :14].T,  # 14 output rows: under a vector
        "outer": base[:, :50, :33].transpose(0, 2, 1),
        "reversed": base[0, ::-1, :48].T,
        "strided": base[0, ::2, 1:65:2].T,
        "unaligned": unaligned.T,
    }


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_copy_four_byte_transposes(isa, dtype, threads):
    """Every ISA moves a transposed view's bits unchanged (NaN payloads included), as numpy does."""
    for name, v in _four_byte_transposes(dtype).items():
        out = np.empty(v.shape, dtype)
        _native.copy(v, out)
        np.testing.assert_array_equal(out.view(np.int32), np.ascontiguousarray(v).view(np.int32), err_msg=name)


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.float64])
def test_copy_into_windows(dtype, threads):
    """A Concat's parts written into their windows of the output (out strided, its last axis contiguous): windows of
    several merged axes (basic-pitch's [1, 172, 36, 2] parts of [1, 172, 324, 2]), width-1 windows of a stack on the
    last axis, and transposed sources."""
    r = rng(71)
    out = np.zeros((1, 172, 324, 2), dtype)
    first = (r.standard_normal((1, 172, 36, 2)) * 50).astype(dtype)
    rest = (r.standard_normal((1, 172, 288, 2)) * 50).astype(dtype)
    _native.copy(first, out[:, :, :36, :])
    _native.copy(rest, out[:, :, 36:, :])
    np.testing.assert_array_equal(out, np.concatenate([first, rest], axis=2))
    stacked = np.zeros((1, 172, 36, 3), dtype)
    parts = [(r.standard_normal((1, 172, 36, 1)) * 50).astype(dtype) for _ in range(3)]
    for i, part in enumerate(parts):
        _native.copy(part, stacked[..., i:i + 1])
    np.testing.assert_array_equal(stacked, np.concatenate(parts, axis=-1))
    big = (r.standard_normal((40, 300)) * 50).astype(dtype)
    window = np.zeros((300, 100), dtype)
    _native.copy(big.T, window[:, 30:70])
    np.testing.assert_array_equal(window[:, 30:70], big.T)
    assert not window[:, :30].any() and not window[:, 70:].any()


def test_copy_errors():
    with pytest.raises(ValueError, match="dtype"):
        _native.copy(randn(3), np.empty(3, np.float64))
    with pytest.raises(ValueError, match="shape"):
        _native.copy(randn(3), np.empty(4, np.float32))


@pytest.mark.parametrize("dtype", [np.int8, np.float16, np.float32, np.int64])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather(dtype, axis):
    data = (rng(80).standard_normal((5, 7, 9)) * 50).astype(dtype)
    idx = np.array([[0, -1, 3], [2, 2, -2]], np.int64)
    ref = np.take(data, idx, axis=axis)
    out = np.empty(ref.shape, dtype)
    _native.gather(data, idx, axis, out)
    np.testing.assert_array_equal(out, ref)
    # strided data and indices
    view = data[:, ::2]
    idx2 = np.array([0, 1, 2, 3, -4, 1], np.int64)[::2]
    ref2 = np.take(view, idx2, axis=axis)
    out2 = np.empty(ref2.shape, dtype)
    _native.gather(view, idx2, axis, out2)
    np.testing.assert_array_equal(out2, ref2)


def test_gather_large_and_scalar_index(threads):
    data = randn(50000, 64, seed=81)
    idx = rng(82).integers(-50000, 50000, 3000).astype(np.int64)
    out = np.empty((3000, 64), np.float32)
    _native.gather(data, idx, 0, out)
    np.testing.assert_array_equal(out, data[idx])
    out0 = np.empty((64,), np.float32)
    _native.gather(data, np.array(-1, np.int64), 0, out0)
    np.testing.assert_array_equal(out0, data[-1])


def test_gather_errors():
    data = randn(4, 3)
    with pytest.raises(ValueError, match="out of range"):
        _native.gather(data, np.array([0, 4], np.int64), 0, np.empty((2, 3), np.float32))
    with pytest.raises(ValueError, match="out of range"):
        _native.gather(data, np.array([-5], np.int64), 0, np.empty((1, 3), np.float32))
    with pytest.raises(ValueError, match="int64 or int32"):  # int32 ones are widened (test_small_data_ops)
        _native.gather(data, np.array([0], np.int16), 0, np.empty((1, 3), np.float32))
    with pytest.raises(ValueError, match="axis"):
        _native.gather(data, np.array([0], np.int64), 2, np.empty((1, 3), np.float32))


# -------------------------------------------------------------------------------------------------------- CNN


def _conv_ref(x, w, bias, strides, pads, dil, group):
    x = x.astype(np.float64)
    w = w.astype(np.float64)
    n, _, h, wd = x.shape
    cout, cin_g, kh, kw = w.shape
    sh, sw = strides
    pt, pl, pb, pr = pads
    dh, dw = dil
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    ho = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, cout, ho, wo))
    cout_g = cout // group
    for g in range(group):
        xs = xp[:, g * cin_g : (g + 1) * cin_g]
        for ky in range(kh):
            for kx in range(kw):
                patch = xs[:, :, ky * dh : ky * dh + sh * (ho - 1) + 1 : sh, kx * dw : kx * dw + sw * (wo - 1) + 1 : sw]
                wk = w[g * cout_g : (g + 1) * cout_g, :, ky, kx]
                out[:, g * cout_g : (g + 1) * cout_g] += np.einsum("nchw,oc->nohw", patch, wk)
    if bias is not None:
        out += bias.reshape(1, -1, 1, 1)
    return out


ACTS = {
    "none": lambda y: y,
    "relu": lambda y: np.maximum(y, 0),
    "relu6": lambda y: np.clip(y, 0, 6),
    "silu": lambda y: y / (1 + np.exp(-y)),
    "sigmoid": lambda y: 1 / (1 + np.exp(-y)),
    "hard_swish": lambda y: y * np.clip(y / 6 + 0.5, 0, 1),
}

CONV_CASES = [
    # (N, C, H, W, Cout, kh, kw, strides, pads, dilations, group)
    (1, 3, 17, 19, 8, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (2, 16, 9, 9, 33, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),  # pointwise: no im2col
    (1, 8, 15, 13, 12, 3, 3, (2, 2), (1, 0, 2, 1), (1, 1), 1),
    (1, 8, 16, 16, 8, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2), 2),
    (2, 12, 11, 10, 12, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 12),  # depthwise
    (1, 32, 14, 14, 32, 5, 5, (2, 2), (2, 2, 2, 2), (1, 1), 32),  # depthwise strided
    (1, 6, 13, 15, 6, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 6),  # depthwise stride 2: odd pad and width (deinterleave)
    # stride-2 depthwise on rows of >= a vector of outputs (the row kernel on column phases, deinterleave_rows): whole
    # 32-value steps and a masked tail of odd / even length, odd / even / no left pad, dilation
    (1, 5, 9, 67, 5, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 5),
    (1, 3, 8, 64, 3, 3, 3, (2, 2), (0, 0, 1, 1), (1, 1), 3),
    (1, 4, 11, 101, 4, 5, 5, (2, 2), (2, 2, 2, 2), (1, 1), 4),
    (1, 2, 12, 90, 2, 3, 3, (2, 2), (2, 2, 2, 2), (2, 2), 2),
    (1, 4, 11, 17, 4, 3, 3, (3, 3), (1, 2, 0, 1), (1, 1), 4),  # depthwise stride 3
    (2, 3, 9, 37, 3, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1), 3),  # depthwise, rows ending in a part vector
    # depthwise row blocks (8 rows of one vector up to 16 columns, else 4 rows of two, the rest in 4 / 2 / 1):
    # PP-LCNet's 7 x 7 and 14 x 14 5x5 maps, 19 rows (8 + 8 + 2 + 1), 20 columns (two vectors a row, the second
    # part), 40 (a part third vector), stride 2 onto 7 x 7
    (1, 5, 7, 7, 5, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1), 5),
    (2, 4, 14, 14, 4, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1), 4),
    (1, 3, 19, 9, 3, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 3),
    (1, 3, 11, 20, 3, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 3),
    (1, 2, 13, 40, 2, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 2),
    (1, 6, 14, 14, 6, 5, 5, (2, 2), (2, 2, 2, 2), (1, 1), 6),
    # AVX-512's shared-row blocks (each input row loaded once for the output rows it feeds, 3x3 / 5x5, strides 1 / 2
    # along each axis): 23 rows (4 + 4 + ... + 2 + 1), 56 columns (two vectors, then one part vector alone), stride 2
    # onto 35 columns with an odd left pad, 5x5 on 20 columns (blocks of 2 rows), strides (2, 1) and (1, 2); a
    # dilation along W only, which the shared blocks leave to the per-tap kernel
    (1, 3, 23, 56, 3, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 3),
    (1, 2, 45, 70, 2, 3, 3, (2, 2), (1, 1, 0, 1), (1, 1), 2),
    (2, 2, 9, 20, 2, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1), 2),
    (1, 3, 17, 33, 3, 3, 3, (2, 1), (1, 1, 1, 1), (1, 1), 3),
    (1, 3, 13, 40, 3, 5, 5, (1, 2), (2, 2, 2, 2), (1, 1), 3),
    (1, 2, 12, 30, 2, 3, 3, (1, 1), (1, 2, 1, 2), (1, 2), 2),
    # rows narrower than a vector, >= half a vector of channels: channel-blocked (a vector of channels a position;
    # the last block part-filled), two images, stride 2 with uneven pads, dilation
    (2, 20, 7, 7, 20, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1), 20),
    (1, 24, 13, 11, 24, 3, 3, (2, 2), (1, 0, 1, 1), (1, 1), 24),
    (1, 17, 9, 9, 17, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2), 17),
    # the blocked path's planes in and out by W x W transposes (AVX2 / AVX-512): 8 x 8 maps (whole 16-position
    # chunks, 40 channels: a half block), 4 x 6 (whole 8-position chunks at AVX2), stride 2 leaving the last input
    # row and column unread, with a 4-position tail
    (1, 40, 8, 8, 40, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 40),
    (2, 11, 4, 6, 11, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 11),
    (1, 18, 10, 10, 18, 3, 3, (2, 2), (0, 0, 0, 0), (1, 1), 18),
    (1, 5, 7, 7, 4, 7, 7, (1, 1), (0, 0, 0, 0), (1, 1), 1),  # kernel == input
    (1, 4, 6, 5, 6, 1, 1, (2, 2), (0, 0, 0, 0), (1, 1), 1),  # strided 1x1
    # wide rows: whole 16- / 32-column panels inside one output row (the im2col's fixed-size copy path)
    (1, 5, 6, 40, 7, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (1, 4, 5, 72, 6, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2), 1),
    # one-column images with a kh x 1 kernel (magika's 1-D convs): run as one-row images along W
    (1, 6, 40, 1, 10, 5, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (2, 4, 23, 1, 7, 3, 1, (2, 1), (1, 0, 2, 0), (2, 1), 1),
    (1, 8, 19, 1, 8, 3, 1, (1, 1), (1, 0, 1, 0), (1, 1), 8),  # depthwise
    (1, 3, 9, 1, 5, 3, 1, (1, 1), (1, 1, 1, 1), (1, 1), 1),  # padded along W too: stays as it is
    # <= 8 output positions per image: dot products of weight rows and input patches (silero-vad's encoder), with
    # K off the 16-float padding, Cout off the 4-row blocks, several images and groups, padding on every side
    (1, 129, 1, 4, 130, 1, 3, (1, 1), (0, 1, 0, 1), (1, 1), 1),
    (2, 64, 1, 4, 66, 1, 3, (1, 2), (0, 1, 0, 1), (1, 1), 1),
    (1, 1, 1, 640, 258, 1, 256, (1, 128), (0, 0, 0, 0), (1, 1), 1),  # silero's STFT
    (2, 6, 5, 5, 9, 3, 3, (2, 2), (1, 1, 0, 0), (1, 1), 3),  # grouped, 2x2 outputs
    (1, 7, 4, 4, 5, 3, 3, (1, 1), (1, 1, 1, 1), (2, 1), 1),  # 8 outputs, dilated
    (1, 10, 1, 1, 3, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),  # one output, Cout < 4
    # one position a channel (PP-LCNet's squeeze-excitation convs): bias and activation over a row block's outputs
    # as one contiguous run; two images, Cout off the 4-row blocks
    (2, 67, 1, 1, 130, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),
    # one position, two groups of 64 channels: each weight row whole 4-vector steps (x_dot_n1's unrolled loop alone)
    (1, 128, 1, 1, 70, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 2),
    # rows of >= one GEMM panel, stride 1 along W: the GEMM reads the padded input in place (no im2col), with Cout
    # off the tile height, strided rows, a ragged last panel, groups and dilation
    (2, 7, 9, 61, 23, 3, 3, (2, 1), (1, 2, 0, 1), (1, 1), 1),
    (1, 8, 6, 64, 22, 3, 5, (1, 1), (1, 2, 1, 2), (1, 2), 2),
    (1, 96, 5, 64, 24, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),  # PP-OCRv4 det's 96 -> 24
    # stride 1 both ways on rows narrower than a panel: panels over the flattened padded rows (YOLOv8n's 40 x 40)
    (2, 16, 10, 12, 23, 3, 3, (1, 1), (1, 1, 1, 1), (2, 1), 1),
    (1, 64, 13, 13, 64, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),
    # a last tile of at most one vector of columns runs the one-vector tile: YOLOv8n's stride-2 20 x 20 -> 10 x 10
    # (109 flattened columns: a 13-column tail at 32-wide tiles), a 10 x 10 map (118: 6 at 16-wide), rows of 80 (16);
    # Cout 20 and 40 leave 8 and 4 rows of the last 12-row panel (the shorter tiles)
    (1, 32, 20, 20, 20, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1),
    (1, 16, 10, 10, 12, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (1, 6, 7, 80, 40, 3, 3, (3, 1), (1, 1, 1, 1), (1, 1), 1),
    # phase-split (stride 2) maps whose output rows are whole vectors: row tiles written straight into the output
    # (YOLOv8n's 160 x 160 -> 80 x 80), with a 16-column tail tile (Wo 48), groups and two images, stride (2, 1)
    (1, 16, 20, 64, 20, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1),
    (1, 5, 12, 96, 28, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1),
    (2, 8, 10, 64, 12, 3, 3, (2, 2), (0, 1, 1, 0), (1, 1), 2),
    (1, 6, 9, 32, 16, 3, 3, (2, 1), (1, 1, 1, 1), (1, 1), 1),
    # inputs whose padded copy spans several row bands (64K floats each, halo rows copied again): flattened tiles,
    # row tiles on the phase split, row tiles on the plain padded layout (stride 3)
    (1, 64, 40, 40, 20, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1),
    (1, 32, 64, 64, 16, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1),
    (1, 40, 60, 64, 8, 3, 3, (3, 1), (1, 1, 1, 1), (1, 1), 1),
    # the plain layout (stride 3) with rows of exactly Wo floats (a kh x 1 kernel): row tiles, not the flattened
    # rows' in-place tiles
    (1, 6, 20, 64, 14, 3, 1, (3, 1), (1, 0, 1, 0), (1, 1), 1),
    # 1x1 convs (PP-LCNet's maps): the last 1-5 positions past a whole vector in a ragged last GEMM panel (7 x 7: 1,
    # 14 x 14: 4, 10 x 13: 2, 7 x 5: 3 with K off the 16-float padding, 3 x 7: 5), a last column panel of one vector
    # (28 x 28: the one-vector tile) or of 4 columns, Cout off the 12-row tile, grouped, two images
    (1, 64, 7, 7, 72, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (1, 40, 14, 14, 44, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (2, 24, 10, 13, 20, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (1, 33, 7, 5, 13, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (1, 8, 3, 7, 14, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (1, 20, 28, 28, 16, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (2, 32, 7, 7, 48, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 2),
    # flattened rows sharing their zero columns (stride 1 along W: W + max(pl, pr) a row): openWakeWord's 1x3 convs
    # on 8- and 4-wide maps, pads only on the right, uneven pads with stride 2 along H (phase planes), dilated along
    # W, two images
    (1, 24, 10, 8, 30, 1, 3, (1, 1), (0, 1, 0, 1), (1, 1), 1),
    (2, 20, 14, 4, 26, 1, 3, (1, 1), (0, 1, 0, 1), (1, 1), 1),
    (1, 8, 10, 8, 12, 1, 3, (1, 1), (0, 0, 0, 2), (1, 1), 1),
    (1, 6, 15, 9, 14, 3, 3, (2, 1), (1, 2, 0, 1), (1, 1), 1),
    (1, 5, 12, 10, 13, 1, 3, (1, 1), (0, 2, 0, 2), (1, 2), 1),
    # small maps, many channels: the transposed product (positions as rows, channels as columns; 12-row tiles): 16
    # positions, 20 of two images with a ragged channel panel, grouped, 56 positions of a padded 1x3, stride 2, 1x1
    (1, 40, 8, 2, 64, 1, 3, (1, 1), (0, 1, 0, 1), (1, 1), 1),
    (2, 24, 5, 4, 70, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (1, 16, 4, 4, 128, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 2),
    (1, 30, 14, 4, 64, 1, 3, (1, 1), (0, 1, 0, 1), (1, 1), 1),
    (1, 20, 9, 9, 64, 2, 2, (2, 2), (0, 0, 0, 0), (1, 1), 1),
    (1, 64, 4, 4, 80, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),
]


def _conv_case_inputs(case):
    """A CONV_CASES case's input, weights (scaled to keep outputs O(1)) and bias, the same in every test."""
    n, c, h, wd, cout, kh, kw, _, _, _, group = case
    return randn(n, c, h, wd, seed=90), randn(cout, c // group, kh, kw, seed=91) * 0.3, randn(cout, seed=92)


@pytest.mark.parametrize("case", CONV_CASES, ids=[str(i) for i in range(len(CONV_CASES))])
@pytest.mark.parametrize("activation", list(ACTS))
def test_conv2d(isa, case, activation):
    n, c, h, wd, cout, _, _, strides, pads, dil, group = case
    x, w, bias = _conv_case_inputs(case)
    ref = ACTS[activation](_conv_ref(x, w, bias, strides, pads, dil, group))
    out = np.empty(ref.shape, np.float32)
    _native.conv2d(x, w, bias, out, strides=strides, pads=pads, dilations=dil, group=group, activation=activation)
    packed = _native.prepack_conv(w, group)
    # Winograd's transforms round at the scale of the whole output tile, not of each value: its error is a few 1e-6
    # of the largest output (an output near zero next to large ones is off by more than 1e-4 of itself).
    winograd = packed.algorithm([n, c, h, wd], strides, pads, dil) == "winograd"
    atol = 1e-4 + (1e-5 * float(np.abs(ref).max()) if winograd else 0.0)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=atol)
    assert packed.depthwise == (group == c == cout and group > 1)
    out2 = np.full(ref.shape, np.nan, np.float32)
    _native.conv2d_packed(x, packed, None, out2, strides=strides, pads=pads, dilations=dil, activation=activation)
    ref2 = ACTS[activation](_conv_ref(x, w, None, strides, pads, dil, group))
    np.testing.assert_allclose(out2, ref2, rtol=1e-4, atol=atol)


# 1x1 convs whose GEMM blocks run as tiles with the bias and activation in registers (conv.cpp gemm_tiles_ep): odd
# channel counts (Cout off the 12-row tile, K off the 16-float padding), ragged last panels (14 x 14: 4 past a
# vector; 7 x 5), a one-vector last panel (28 x 28), K at kc (256: one k block, tiles) and past it (300: the GEMM's k
# blocks), two images. K <= 64 reads the input in place (whole panels; the ragged one packed) and runs a ragged last
# row panel (Cout 13, 64, 3: 1-4 rows past the 12-row tiles) as a short tile instead of the small-M kernel.
# PP-LCNet's 256 -> 256 on 5 x 80 (12 whole panels + one vector, 21 row panels + 4 rows), odd K on 9 positions (one
# part-vector panel) and a single output channel (the small-M kernel alone).
TILE_EP_CASES = [(1, 37, 14, 14, 29), (2, 16, 28, 28, 20), (1, 33, 7, 5, 13), (1, 256, 7, 7, 52), (1, 300, 6, 6, 24),
                 (1, 64, 56, 56, 64), (1, 24, 9, 9, 3), (2, 65, 10, 10, 16), (1, 256, 5, 80, 256),
                 (1, 129, 3, 3, 25), (1, 77, 9, 11, 1)]
_TILE_EP_CODE = """
import sys, numpy as np
from hetero_cpu import _native
rng = np.random.default_rng(5)
outs = []
for isa in sys.argv[2].split(","):
    _native.set_isa(isa)
    for n, c, h, w, co in eval(sys.argv[3]):
        x = rng.standard_normal((n, c, h, w)).astype(np.float32)
        wt = (rng.standard_normal((co, c, 1, 1)) * 0.2).astype(np.float32)
        b = rng.standard_normal(co).astype(np.float32)
        for act in ("hard_swish", "silu", "relu6", "none", "sigmoid"):
            for t in (1, 2):
                _native.set_num_threads(t)
                o = np.empty((n, co, h, w), np.float32)
                _native.conv2d(x, wt, b, o, strides=(1, 1), pads=(0, 0, 0, 0), group=1, activation=act)
                outs.append(o.ravel())
np.save(sys.argv[1], np.concatenate(outs))
"""


def test_conv1x1_tiles_ep_bits(tmp_path):
    # The in-register epilogue on packed panels (in place off: HETERO_CPU_CONV_INPLACE_K=0) against the GEMM and its
    # second pass (HETERO_CPU_CONV_TILE_EP=0; switches read once a process: each side in a fresh one): the same sums
    # in the same order, so the same bits, at 1 and 2 threads, on every ISA this CPU runs (sigmoid is not applied in
    # registers: the GEMM path on both sides). The in-place path (its short tiles sum the ragged rows in another
    # order than the small-M kernel) is checked against float64 below.
    import os
    import subprocess
    import sys

    isas = ",".join(ISAS)
    res = {}
    for side, env in (("tiles", {"HETERO_CPU_CONV_INPLACE_K": "0"}), ("gemm", {"HETERO_CPU_CONV_TILE_EP": "0"})):
        path = tmp_path / f"{side}.npy"
        subprocess.run([sys.executable, "-c", _TILE_EP_CODE, str(path), isas, repr(TILE_EP_CASES)],
                       env=dict(os.environ, **env), check=True, timeout=600)
        res[side] = np.load(path)
    assert res["tiles"].size == res["gemm"].size > 0
    np.testing.assert_array_equal(res["tiles"].view(np.uint32), res["gemm"].view(np.uint32))


@pytest.mark.parametrize("case", TILE_EP_CASES, ids=[str(i) for i in range(len(TILE_EP_CASES))])
@pytest.mark.parametrize("activation", ["hard_swish", "silu", "none"])
def test_conv1x1_tiles_ep(isa, threads, case, activation):
    n, c, h, wd, cout = case
    x = randn(n, c, h, wd, seed=60)
    w = randn(cout, c, 1, 1, seed=61) * 0.2
    bias = randn(cout, seed=62)
    ref = ACTS[activation](_conv_ref(x.astype(np.float64), w.astype(np.float64), bias, (1, 1), (0, 0, 0, 0), (1, 1),
                                     1))
    out = np.empty(ref.shape, np.float32)
    _native.conv2d(x, w, bias, out, strides=(1, 1), pads=(0, 0, 0, 0), group=1, activation=activation)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("activation,alpha,beta", [
    ("hard_sigmoid", 0.2, 0.5), ("clip", -0.5, 0.7), ("leaky_relu", 0.1, 0.0), ("relu6", 0.0, 0.0)])
def test_depthwise_threads_activations(isa, threads, activation, alpha, beta):
    # Planes in chunks across threads (the padded buffer zeroed once a chunk), two images, NaN passing through, and
    # the activations applied in registers (HardSigmoid, Clip) or after the taps (LeakyRelu): against float64.
    x = randn(2, 37, 14, 14, seed=95)
    x[1, 5, 3, 4] = np.nan
    w = randn(37, 1, 5, 5, seed=96) * 0.3
    bias = randn(37, seed=97)
    acts = {"hard_sigmoid": lambda y: np.clip(alpha * y + beta, 0, 1), "clip": lambda y: np.clip(y, alpha, beta),
            "leaky_relu": lambda y: np.where(y < 0, alpha * y, y), "relu6": lambda y: np.clip(y, 0, 6)}
    ref = acts[activation](_conv_ref(x.astype(np.float64), w.astype(np.float64), bias, (1, 1), (2, 2, 2, 2), (1, 1),
                                     37))
    out = np.empty(ref.shape, np.float32)
    _native.conv2d(x, w, bias, out, strides=(1, 1), pads=(2, 2, 2, 2), group=37, activation=activation,
                   activation_alpha=alpha, activation_beta=beta)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    assert np.isnan(out[1, 5, 1:6, 2:7]).all() and not np.isnan(np.delete(out, 5, axis=1)).any()


@pytest.mark.parametrize("shape", [(1, 512, 7, 7, 5, 1), (1, 160, 14, 14, 3, 2), (1, 72, 13, 13, 3, 2),
                                   (1, 64, 56, 56, 3, 1), (1, 256, 14, 14, 5, 1), (1, 33, 40, 40, 3, 2),
                                   (2, 40, 7, 7, 5, 1)])
def test_depthwise_contiguous_chunks_at_2_3_threads(isa, shape):
    # One image's channels in one contiguous range a thread (the row kernel's chunks, the channel-blocked kernel's
    # ranges of vector blocks: 7 x 7 and stride-2 maps), big enough to split: against float64, and the same bits at
    # 1, 2 and 3 threads; two images keep the blocked kernel's (image, block) tasks.
    n, c, h, wd, k, s = shape
    x = randn(n, c, h, wd, seed=101)
    w = randn(c, 1, k, k, seed=102) * 0.3
    bias = randn(c, seed=103)
    pads = (k // 2,) * 4
    ref = np.clip(_conv_ref(x.astype(np.float64), w.astype(np.float64), bias, (s, s), pads, (1, 1), c), 0, 6)
    before = _native.num_threads()
    outs = []
    try:
        for t in (1, 2, 3):
            _native.set_num_threads(t)
            out = np.full(ref.shape, np.nan, np.float32)
            _native.conv2d(x, w, bias, out, strides=(s, s), pads=pads, group=c, activation="relu6")
            outs.append(out)
    finally:
        _native.set_num_threads(before)
    np.testing.assert_allclose(outs[0], ref, rtol=1e-4, atol=1e-4)
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


@pytest.mark.parametrize("activation", ["leaky_relu", "leaky_relu_min"])
@pytest.mark.parametrize("shape", [(24, 30, 10, 8, 1, 3, (0, 1, 0, 1)), (12, 16, 9, 9, 3, 3, (1, 1, 1, 1)),
                                   (40, 24, 8, 2, 1, 3, (0, 1, 0, 1)), (8, 5, 2, 2, 3, 3, (1, 1, 1, 1))])
def test_conv2d_leaky_epilogue(isa, activation, shape):
    # LeakyRelu and LeakyReluMin (openWakeWord's conv + LeakyRelu + Max) applied with the bias in one pass over each
    # output row (bias_act_row), on the direct, GEMM and dot paths, NaN passing through: against float64.
    c, cout, h, wd, kh, kw, pads = shape
    x = randn(1, c, h, wd, seed=98)
    x[0, 1, 1, 1] = np.nan
    w = randn(cout, c, kh, kw, seed=99) * 0.3
    bias = randn(cout, seed=100)
    y = _conv_ref(x.astype(np.float64), w.astype(np.float64), bias, (1, 1), pads, (1, 1), 1)
    ref = np.where(y < 0, 0.2 * y, y)
    if activation == "leaky_relu_min":
        ref = np.maximum(ref, -0.4)
    out = np.empty(ref.shape, np.float32)
    _native.conv2d(x, w, bias, out, pads=pads, activation=activation, activation_alpha=0.2, activation_beta=-0.4)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    assert np.isnan(out).any() and (np.isnan(out) == np.isnan(ref)).all()


@pytest.mark.parametrize("alpha", [1.0, 0.3])
@pytest.mark.parametrize("shape", [(20, 20, 1, 37, 1, 5, (0, 4, 0, 4), (1, 2), 1),  # madmom's dilated TCN row
                                   (12, 16, 9, 9, 3, 3, (1, 1, 1, 1), (1, 1), 1), (8, 5, 2, 2, 3, 3, (1, 1, 1, 1),
                                                                                   (1, 1), 1),
                                   (16, 16, 7, 11, 3, 3, (1, 1, 1, 1), (1, 1), 16)])  # depthwise
def test_conv2d_elu_epilogue(isa, threads, alpha, shape):
    # Elu as a conv's activation (madmom's beat TCN: Conv then Elu; applied by the caller after the conv, no register
    # epilogue takes it): negative and positive outputs, a large negative one (expm1 saturates to -alpha) and NaN
    # passing through, against float64.
    c, cout, h, wd, kh, kw, pads, dil, group = shape
    x = randn(1, c, h, wd, seed=88)
    nan = h * wd > 4  # not on the 2 x 2 map, whose 3 x 3 taps would spread it to every output
    if nan:
        x[0, 1, 0, 1] = np.nan
    w = randn(cout, c // group, kh, kw, seed=89) * 0.4
    bias = randn(cout, seed=90)
    bias[0] = -80.0
    y = _conv_ref(x.astype(np.float64), w.astype(np.float64), bias, (1, 1), pads, dil, group)
    ref = np.where(y < 0, alpha * np.expm1(np.minimum(y, 0)), y)
    out = np.full(ref.shape, 7.0, np.float32)
    _native.conv2d(x, w, bias, out, pads=pads, dilations=dil, group=group, activation="elu", activation_alpha=alpha)
    assert (ref < -0.1).any() and (ref > 0.1).any()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
    assert np.isnan(out).any() == nan and (np.isnan(out) == np.isnan(ref)).all()


@pytest.mark.parametrize("activation", ["hard_sigmoid", "hard_swish", "relu"])
def test_conv2d_one_position_threads(isa, threads, activation):
    # Squeeze-excitation shapes (1 x 1 maps) large enough to split their weight rows into blocks across threads: each
    # block's bias + activation over its contiguous outputs, against float64.
    x = randn(2, 128, 1, 1, seed=70)
    w = randn(515, 128, 1, 1, seed=71) * 0.1
    bias = randn(515, seed=72)
    ref = _conv_ref(x.astype(np.float64), w.astype(np.float64), bias, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    acts = {"hard_sigmoid": lambda y: np.clip(0.2 * y + 0.5, 0, 1), "hard_swish": ACTS["hard_swish"],
            "relu": ACTS["relu"]}
    out = np.full(ref.shape, np.nan, np.float32)
    _native.conv2d(x, w, bias, out, activation=activation, activation_alpha=0.2, activation_beta=0.5)
    np.testing.assert_allclose(out, acts[activation](ref), rtol=1e-4, atol=1e-4)


def test_conv2d_small_output_threads(isa, threads):
    # silero-vad's STFT (258 x 256 weights, 4 outputs) is large enough to split its weight rows across threads.
    x = randn(1, 1, 1, 640, seed=93)
    w = randn(258, 1, 1, 256, seed=94) * 0.1
    bias = randn(258, seed=95)
    ref = _conv_ref(x, w, bias, (1, 128), (0, 0, 0, 0), (1, 1), 1)
    out = np.full(ref.shape, np.nan, np.float32)
    _native.conv2d(x, w, bias, out, strides=(1, 128), activation="relu")
    np.testing.assert_allclose(out, np.maximum(ref, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(20, 11, 60, 1), (48, 10, 10, 1), (24, 40, 40, 2)])
def test_conv2d_direct_rows_threads(isa, threads, shape):
    # the direct tile splits bands of output rows across threads; Cout just under two 12-row tiles: row tiles (60
    # columns; 20 x 22 channels keep it off Winograd), flattened tiles on a 10 x 10 map and on a stride-2 40 x 40 one
    c, h, wd, s = shape
    x = randn(1, c, h, wd, seed=96)
    w = randn(22, c, 3, 3, seed=97) * 0.1
    assert _native.prepack_conv(w).algorithm(list(x.shape), (s, s), (1, 1, 1, 1)) != "winograd"
    ref = _conv_ref(x, w, None, (s, s), (1, 1, 1, 1), (1, 1), 1)
    out = np.full(ref.shape, np.nan, np.float32)
    _native.conv2d(x, w, None, out, strides=(s, s), pads=(1, 1, 1, 1))
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


# conv_direct's tiles stored straight into the output on narrow maps (AVX-512's 32-column tiles; AVX2's 8-wide rows
# fit its vectors: row tiles, or the GEMM). 1 x kw convs at stride 1 whose flattened rows waste >= 10 % of the tiles'
# columns: the tap copies (one zero-edged copy of the input per kernel column, tiles over the output positions).
# openWakeWord's 72 -> 72 1x3 on 30 x 8; rows outside the input (pads top and bottom), a 1x2 kernel with a right pad
# only, no pads (W 10 -> Wo 8: rows copied one by one), dilation 2, an odd width (7) with a ragged last tile, input
# spanning two row bands (96 channels x 3 copies x 40 rows of 8), two images and two groups. Then kh x 1 convs, whose
# flattened rows have no padding columns: openWakeWord's 72 -> 72 3x1 on 32 x 8, a ragged last tile (9 x 7), two
# bands (96 channels x 102 rows of 8), two images and two groups.
# (N, C, H, W, Cout, kh, kw, pads, dilation along W, group)
TAP_COPY_CASES = [
    (1, 72, 30, 8, 72, 1, 3, (0, 1, 0, 1), 1, 1),
    (1, 16, 9, 8, 20, 1, 3, (1, 1, 2, 1), 1, 1),
    (1, 12, 10, 8, 14, 1, 2, (0, 1, 0, 0), 1, 1),
    (1, 10, 12, 10, 13, 1, 3, (0, 0, 0, 0), 1, 1),
    (1, 8, 11, 8, 12, 1, 3, (0, 2, 0, 2), 2, 1),
    (1, 9, 9, 7, 13, 1, 3, (0, 1, 0, 1), 1, 1),
    (1, 96, 40, 8, 24, 1, 3, (0, 1, 0, 1), 1, 1),
    (2, 16, 12, 8, 40, 1, 3, (0, 1, 0, 1), 1, 2),
    (1, 72, 32, 8, 72, 3, 1, (1, 0, 1, 0), 1, 1),
    (1, 11, 9, 7, 13, 3, 1, (1, 0, 1, 0), 1, 1),
    (1, 96, 100, 8, 24, 3, 1, (1, 0, 1, 0), 1, 1),
    (2, 16, 12, 8, 40, 3, 1, (2, 0, 0, 0), 1, 2),
]
_TAP_COPY_CODE = """
import sys, numpy as np
from hetero_cpu import _native
outs = []
for isa in sys.argv[2].split(","):
    _native.set_isa(isa)
    for i, (n, c, h, w, co, kh, kw, pads, dw, group) in enumerate(eval(sys.argv[3])):
        rng = np.random.default_rng(i)
        x = rng.standard_normal((n, c, h, w)).astype(np.float32)
        wt = (rng.standard_normal((co, c // group, kh, kw)) * 0.2).astype(np.float32)
        b = rng.standard_normal(co).astype(np.float32)
        for act in ("relu", "none", "sigmoid"):
            for t in (1, 2):
                _native.set_num_threads(t)
                ho = h + pads[0] + pads[2] - (kh - 1)
                wo = w + pads[1] + pads[3] - dw * (kw - 1)
                o = np.empty((n, co, ho, wo), np.float32)
                _native.conv2d(x, wt, b, o, strides=(1, 1), pads=pads, dilations=(1, dw), group=group, activation=act)
                outs.append(o.ravel())
np.save(sys.argv[1], np.concatenate(outs))
"""


@pytest.mark.parametrize("case", TAP_COPY_CASES, ids=[str(i) for i in range(len(TAP_COPY_CASES))])
@pytest.mark.parametrize("activation", ["relu", "none", "sigmoid"])
def test_conv2d_tap_copies(isa, threads, case, activation):
    n, c, h, wd, cout, kh, kw, pads, dw, group = case
    x = randn(n, c, h, wd, seed=70)
    w = randn(cout, c // group, kh, kw, seed=71) * 0.2
    bias = randn(cout, seed=72)
    if isa == "avx512":
        assert _native.prepack_conv(w, group).algorithm(list(x.shape), (1, 1), pads, (1, dw)) == "direct"
    ref = ACTS[activation](_conv_ref(x, w, bias, (1, 1), pads, (1, dw), group))
    out = np.full(ref.shape, np.nan, np.float32)
    _native.conv2d(x, w, bias, out, strides=(1, 1), pads=pads, dilations=(1, dw), group=group, activation=activation)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_conv2d_tap_copies_bits(tmp_path):
    # The tap copies and in-place stores against the flattened rows through the tile buffer
    # (HETERO_CPU_CONV_TAPCOPY=0; read once a process: each side in a fresh one): the same taps summed in the same
    # order over the same values (zeros where the flattened copy has its padding), so the same bits, at 1 and 2
    # threads, on every ISA this CPU runs.
    import os
    import subprocess
    import sys

    isas = ",".join(ISAS)
    res = {}
    for side, flag in (("taps", "1"), ("flat", "0")):
        path = tmp_path / f"{side}.npy"
        subprocess.run([sys.executable, "-c", _TAP_COPY_CODE, str(path), isas, repr(TAP_COPY_CASES)],
                       env=dict(os.environ, HETERO_CPU_CONV_TAPCOPY=flag), check=True, timeout=600)
        res[side] = np.load(path)
    assert res["taps"].size == res["flat"].size > 0
    np.testing.assert_array_equal(res["taps"].view(np.uint32), res["flat"].view(np.uint32))


@pytest.mark.parametrize("shape", [(96, 10, 2, 70, 1, 3, (0, 1, 0, 1)), (48, 4, 4, 70, 2, 2, (0, 0, 0, 0))])
def test_conv2d_transposed_threads(isa, threads, shape):
    # small maps: threads take whole 32-channel panels of the transposed product, the same bits as at 1 thread
    # (channels more than 1.3 x off whole blocks of 32 (70), or K < 32: conv_cblk takes the others)
    c, h, wd, cout, kh, kw, pads = shape
    x = randn(3, c, h, wd, seed=101)
    w = randn(cout, c, kh, kw, seed=102) * 0.1
    bias = randn(cout, seed=103)
    assert (_native.prepack_conv(w).algorithm(list(x.shape), (1, 1), pads) == "transposed") == (isa == "avx512")
    ref = ACTS["silu"](_conv_ref(x, w, bias, (1, 1), pads, (1, 1), 1))
    out = np.full(ref.shape, np.nan, np.float32)
    _native.conv2d(x, w, bias, out, pads=pads, activation="silu")
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    _native.set_num_threads(1)
    one = np.full(ref.shape, np.nan, np.float32)
    _native.conv2d(x, w, bias, one, pads=pads, activation="silu")
    _native.set_num_threads(threads)
    np.testing.assert_array_equal(out, one)


@pytest.mark.parametrize("shape", [
    (40, 32, 1, 21, 70, 1, 8, (1, 1), (0, 0, 0, 0), 1),  # a Conv1D: 40 windows, chunks of 17, 17 and 6
    (7, 24, 5, 4, 70, 3, 3, (1, 1), (1, 1, 1, 1), 1),  # 20 positions an image, padded: chunks of 12 images
    (13, 16, 4, 4, 128, 3, 3, (1, 1), (1, 1, 1, 1), 2),  # grouped
    (9, 20, 9, 9, 70, 2, 2, (2, 2), (0, 0, 0, 0), 1),  # stride 2: 16 positions
])
def test_conv2d_transposed_batched(isa, threads, shape):
    # the transposed product over several images at once: their positions stacked as the rows of one product
    n, c, h, wd, cout, kh, kw, strides, pads, group = shape
    x = randn(n, c, h, wd, seed=104)
    w = randn(cout, c // group, kh, kw, seed=105) * 0.2
    bias = randn(cout, seed=106)
    assert (_native.prepack_conv(w, group).algorithm(list(x.shape), strides, pads) == "transposed") == (
        isa == "avx512")
    ref = np.maximum(_conv_ref(x, w, bias, strides, pads, (1, 1), group), 0)
    out = np.full(ref.shape, np.nan, np.float32)
    _native.conv2d(x, w, bias, out, strides=strides, pads=pads, group=group, activation="relu")
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    for i in (0, n - 1):  # each image as it comes out alone
        one = np.full(ref[i:i + 1].shape, np.nan, np.float32)
        _native.conv2d(x[i:i + 1], w, bias, one, strides=strides, pads=pads, group=group, activation="relu")
        np.testing.assert_allclose(out[i:i + 1], one, rtol=1e-4, atol=1e-4)


def _pointwise_algo(isa: str, k: int, positions: int, cout: int, group: int = 1) -> str:
    """A 1x1 stride-1 conv's kernel by conv.cpp's rule: on AVX-512 conv_cblk for whole 32-channel blocks on at most
    256 positions that fill the GEMM's 32-column panels badly (pointwise_cblk_wins), the register tiles on the input
    in place at K <= 48, on at most 128 positions or (without AMX) where Cout / group < K, or = K <= 128
    (pointwise_tiles_fit), else the packed GEMM."""
    if isa != "avx512":
        return "gemm"
    rem = positions % 32
    cols = positions - rem + (0 if rem == 0 else 16 if rem <= 16 else 32)  # row_tile_cols(positions, 32, 16)
    k_overhang = 256 if _native.bf16x3_available() else 128  # without AMX K = 128 too (pointwise_cblk_wins)
    if (group == 1 and cout % 32 == 0 and positions <= 256 and k >= 64
            and (cols * 10 >= positions * 11 or (cols > positions and k >= k_overhang))):
        return "cblk"
    no_amx_tiles = (cout // group < k or cout // group == k <= 128) and not _native.bf16x3_available()
    return "pointwise" if k <= 48 or positions <= 128 or no_amx_tiles else "gemm"


# (N, C, H, W, Cout, pads): 3x3 stride-1 convs of K < 64 onto whole blocks of 32 channels (conv.cpp
# shallow_stem_cblk_wins: conv_cblk's tiles, not conv_direct's): vietcombank_captcha's 3 -> 32 on 50 x 155, a 1-channel
# one, 64 outputs (two blocks) with a ragged row, one output row and a row of one position past the tiles.
SHALLOW_STEM_CASES = [
    (1, 3, 50, 155, 32, (1, 1, 1, 1)),
    (2, 1, 17, 40, 32, (1, 1, 1, 1)),
    (1, 3, 9, 37, 64, (0, 1, 0, 1)),
    (1, 5, 3, 19, 32, (0, 0, 0, 0)),
    (1, 2, 6, 3, 32, (1, 1, 1, 1)),
]


@pytest.mark.parametrize("case", SHALLOW_STEM_CASES, ids=[str(i) for i in range(len(SHALLOW_STEM_CASES))])
@pytest.mark.parametrize("activation", ["relu", "silu"])
def test_conv2d_shallow_stem_cblk(isa, threads, case, activation):
    n, c, h, wd, cout, pads = case
    w, _ = _cblk_conv_against_float64(isa, (n, c, h, wd), cout, (1, 1), pads, activation, seed=73, w_scale=0.3)
    if isa == "avx512":  # stride 2 stays with conv_direct (K = 27 measured slower there)
        assert _native.prepack_conv(w).algorithm([n, c, h, wd], (2, 2), pads) != "cblk"


def _cblk_conv_against_float64(isa: str, x_shape: tuple, cout: int, strides: tuple, pads: tuple, activation: str,
                               seed: int, w_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """A 3x3 conv that conv_cblk takes on AVX-512 (asserted there), against float64 (x, w, bias from seed, seed + 1,
    seed + 2); returns w and the reference."""
    x = randn(*x_shape, seed=seed)
    w = randn(cout, x_shape[1], 3, 3, seed=seed + 1) * w_scale
    bias = randn(cout, seed=seed + 2)
    if isa == "avx512":
        assert _native.prepack_conv(w).algorithm(list(x.shape), strides, pads) == "cblk"
    ref = ACTS[activation](_conv_ref(x, w, bias, strides, pads, (1, 1), 1))
    out = np.full(ref.shape, np.nan, np.float32)
    _native.conv2d(x, w, bias, out, strides=strides, pads=pads, activation=activation)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    return w, ref


# (N, C, H, W, Cout, strides, pads): 3x3 convs on inputs over conv_cblk's 128 K floats (its band path: each band's
# input rows padded by its task): odd sizes with bottom / right padding read, asymmetric pads, a one-vector last
# block (48 channels), the one-vector tiles (16 channels), strides 1 x 2, two images
CBLK_BAND_CASES = [
    (1, 16, 97, 101, 32, (2, 2), (1, 1, 1, 1)),
    (1, 16, 96, 100, 48, (2, 2), (1, 0, 2, 1)),
    (1, 3, 250, 253, 16, (2, 2), (1, 1, 1, 1)),
    (1, 16, 90, 95, 32, (1, 2), (1, 1, 1, 1)),
    (2, 64, 50, 51, 64, (2, 2), (0, 1, 1, 0)),
]


@pytest.mark.parametrize("case", CBLK_BAND_CASES, ids=[str(i) for i in range(len(CBLK_BAND_CASES))])
@pytest.mark.parametrize("activation", ["none", "silu"])
def test_conv2d_cblk_bands(isa, threads, case, activation):
    n, c, h, wd, cout, strides, pads = case
    _cblk_conv_against_float64(isa, (n, c, h, wd), cout, strides, pads, activation, seed=76, w_scale=0.2)


# (N, C, H, W, Cout, pads): stride-2 3x3 convs with 64 <= K < 256 on rows of whole vectors (Wo = 64, 80), whose whole
# blocks of 32 channels run as two one-vector halves (cblk_halves_fit): an input over conv_cblk's 128 K floats (its
# bands), a small one (one padded copy), odd H with asymmetric pads, 48 channels (a half block after), two images
CBLK_HALVES_CASES = [
    (1, 16, 160, 160, 32, (1, 1, 1, 1)),
    (1, 8, 33, 128, 32, (1, 1, 1, 1)),
    (1, 16, 41, 129, 48, (0, 1, 2, 0)),
    (2, 24, 20, 160, 64, (1, 1, 1, 1)),
]


@pytest.mark.parametrize("case", CBLK_HALVES_CASES, ids=[str(i) for i in range(len(CBLK_HALVES_CASES))])
@pytest.mark.parametrize("activation", ["none", "silu"])
def test_conv2d_cblk_halves(isa, threads, case, activation):
    n, c, h, wd, cout, pads = case
    _, ref = _cblk_conv_against_float64(isa, (n, c, h, wd), cout, (2, 2), pads, activation, seed=79, w_scale=0.2)
    assert ref.shape[3] % 16 == 0


# (C, H, W, Cout, kernel, strides, pads): weights outweighing the input, so that at 2+ threads the tasks split the
# weight panels (each thread all positions): flattened tiles on a 10 x 10 map, stride 2 onto 10 x 10, row tiles at
# stride (3, 1), a 1x1 conv through the GEMM with a ragged 8-row last panel and one with a 4-row tail (small-M kernel)
PANEL_SPLIT_CASES = [
    (64, 10, 10, 100, 3, (1, 1), (1, 1, 1, 1)),
    (48, 20, 20, 136, 3, (2, 2), (1, 1, 1, 1)),
    (8, 12, 32, 100, 3, (3, 1), (1, 1, 1, 1)),
    (96, 10, 10, 140, 1, (1, 1), (0, 0, 0, 0)),
    (64, 7, 7, 100, 1, (1, 1), (0, 0, 0, 0)),
]


@pytest.mark.parametrize("case", PANEL_SPLIT_CASES, ids=[str(i) for i in range(len(PANEL_SPLIT_CASES))])
def test_conv2d_panel_split_threads(isa, threads, case):
    c, h, wd, cout, k, strides, pads = case
    x = randn(1, c, h, wd, seed=98)
    w = randn(cout, c, k, k, seed=99) * 0.1
    bias = randn(cout, seed=100)
    algo = _native.prepack_conv(w, 1, "high").algorithm(list(x.shape), strides, pads)  # the fp32 kernels' rule
    assert algo == (_pointwise_algo(isa, c, h * wd, cout) if k == 1 else "gemm" if isa == "generic" else "direct")
    ref = ACTS["silu"](_conv_ref(x, w, bias, strides, pads, (1, 1), 1))
    out = np.full(ref.shape, np.nan, np.float32)
    _native.conv2d(x, w, bias, out, strides=strides, pads=pads, activation="silu")
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    # each output element is computed by the same tile whichever way the work is split: the same bits at 1 thread
    _native.set_num_threads(1)
    one = np.full(ref.shape, np.nan, np.float32)
    _native.conv2d(x, w, bias, one, strides=strides, pads=pads, activation="silu")
    _native.set_num_threads(threads)
    np.testing.assert_array_equal(out, one)


# (N, C, H, W, Cout, kernel, strides, pads): at 2+ threads the tasks are column blocks (GEMM path) or row bands
# (direct tile) whose sizes differ by one, their count a multiple of the thread count: 15 column panels (PP-OCRv4
# rec's 480 positions) in 8 + 7 at 2 threads and 3 / 3 / 3 / 2 / 2 / 2 at 3, two images of 7.5 panels, row bands of
# 11 and 13 rows (row tiles), a stride-2 map on flattened tiles and three images of a 1x1 conv.
BLOCK_CASES = [
    (1, 48, 6, 80, 40, 1, (1, 1), (0, 0, 0, 0)),
    (2, 32, 3, 80, 24, 1, (1, 1), (0, 0, 0, 0)),
    (1, 20, 11, 64, 22, 3, (1, 1), (1, 1, 1, 1)),
    (2, 12, 13, 96, 28, 3, (1, 1), (1, 1, 1, 1)),
    (1, 16, 42, 42, 20, 3, (2, 2), (1, 1, 1, 1)),
    (3, 32, 9, 9, 48, 1, (1, 1), (0, 0, 0, 0)),
    (2, 64, 7, 7, 100, 1, (1, 1), (0, 0, 0, 0)),  # a 17-column last panel of each image in its last block
]


@pytest.mark.parametrize("nthreads", [2, 3])
@pytest.mark.parametrize("case", BLOCK_CASES, ids=[str(i) for i in range(len(BLOCK_CASES))])
def test_conv2d_balanced_blocks_threads(isa, nthreads, case):
    n, c, h, wd, cout, k, strides, pads = case
    x = randn(n, c, h, wd, seed=101)
    w = randn(cout, c, k, k, seed=102) * 0.1
    bias = randn(cout, seed=103)
    algo = _native.prepack_conv(w, 1, "high").algorithm(list(x.shape), strides, pads)  # the fp32 kernels' rule
    assert algo == (_pointwise_algo(isa, c, h * wd, cout) if k == 1 else "gemm" if isa == "generic" else "direct")
    ref = ACTS["silu"](_conv_ref(x, w, bias, strides, pads, (1, 1), 1))
    before = _native.num_threads()
    outs = {}
    try:
        for t in (1, nthreads):
            _native.set_num_threads(t)
            outs[t] = np.full(ref.shape, np.nan, np.float32)
            _native.conv2d(x, w, bias, outs[t], strides=strides, pads=pads, activation="silu")
    finally:
        _native.set_num_threads(before)
    np.testing.assert_allclose(outs[nthreads], ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(outs[nthreads], outs[1])  # the same tiles whichever way the work is split


# (N, C, H, W, Cout, kh, kw, strides, pads, dilations): shapes the channel-blocked direct kernel (conv_cblk: 2 x lanes
# output channels a vector, input values broadcast, tiles stored transposed) takes by its rule on AVX-512 (AVX2's tile
# runs in test_conv2d_cblk_forced)
# (kh x kw > 1, K >= 64, whole blocks of channels, a small padded input): YOLOv8n's 3x3 on 10 x 10 and stride 2 onto
# 10 x 10, stride 2 on an odd map (the last taps reading the padding), a 5 x 3 kernel with uneven pads, dilation 2,
# strides (1, 2) and (3, 1), two images, a 2 x 2 kernel on a 9 x 9 map
# rows of 1-25 positions (25: tiles of 13 + 12); inputs over 128K padded
# floats, padded in row bands by each task (stride 2 on 100 x 100, two images; a 5 x 5 kernel on 130 x 130).
# AVX-512's tiles of up to 14 positions: ResNet's 128 -> 128 on 14 x 14 (one tile a row), rows of 28 (14 + 14) and
# 18 (9 + 9), and rows of at most 7 two at a time (stride 2 onto 7 x 5: the second row's taps two input rows on; 5
# rows of 3: two pairs and a last row alone).
CBLK_CASES = [
    (2, 16, 100, 100, 32, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),
    (1, 8, 130, 130, 32, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1)),
    (1, 64, 10, 10, 64, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    (1, 32, 20, 20, 96, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),
    (2, 16, 15, 13, 32, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),
    (1, 8, 11, 9, 64, 5, 3, (1, 1), (2, 0, 1, 2), (1, 1)),
    (1, 16, 12, 12, 32, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2)),
    (1, 12, 9, 16, 32, 3, 3, (1, 2), (1, 1, 1, 1), (1, 1)),
    (1, 12, 16, 9, 32, 3, 3, (3, 1), (0, 1, 1, 1), (1, 1)),
    (1, 64, 9, 9, 128, 2, 2, (1, 1), (0, 0, 0, 0), (1, 1)),
    (1, 8, 3, 25, 32, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    (1, 128, 9, 14, 128, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),  # 14-wide rows (14 x 14 runs Winograd)
    (1, 16, 9, 28, 32, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),  # two images: 42 tiles, Winograd
    (1, 16, 6, 20, 32, 3, 3, (1, 1), (0, 0, 0, 0), (1, 1)),
    (1, 16, 13, 10, 32, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),
    (1, 16, 5, 3, 32, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    # small maps the transposed product took before conv_cblk's short tiles (ResNet's 7 x 7: two rows a tile; 2x2
    # onto 3 x 3, two images)
    (1, 64, 7, 7, 64, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    (2, 64, 4, 4, 128, 2, 2, (1, 1), (0, 0, 0, 0), (1, 1)),
    # deepcut's Conv1Ds (a part last block of channels, rows of 14 and 21 positions: tiles of 14, 11 + 10), K = 32
    (40, 32, 1, 21, 200, 1, 8, (1, 1), (0, 0, 0, 0), (1, 1)),
    (5, 32, 1, 21, 100, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1)),
    # Cout = 32 m + 16 on rows of >= 32 positions (the last block one vector: its one-vector tiles): DBNet's 24 -> 48
    # 3x3 / 2 onto rows of 35 (the last tile overlapping), 8 -> 80 onto rows of 33, a 24 -> 48 1x3 on rows of 32
    (1, 24, 12, 70, 48, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),
    (1, 8, 5, 33, 80, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    (2, 24, 4, 32, 48, 1, 3, (1, 1), (0, 1, 0, 1), (1, 1)),
    # one vector of output channels (16: the one-vector tiles of 16 positions, transposed in registers): a 3 -> 16
    # stem, stride 2 onto rows of 23 (the last tile overlapping the first), its input over 128K padded floats (row
    # bands: 3 x 232 x 232, rows of 115), 16 -> 16 on rows of 33 (tiles at 0, 16, 17) and exactly 16, dilation 2, a
    # 5 x 3 kernel with stride (3, 1), two images
    (1, 3, 37, 45, 16, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),
    (1, 3, 230, 230, 16, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),
    (2, 16, 20, 33, 16, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    (1, 5, 16, 16, 16, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    (1, 8, 24, 40, 16, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2)),
    (1, 4, 30, 20, 16, 5, 3, (3, 1), (2, 1, 2, 1), (1, 1)),
]


def _avx2_cblk_rule(case: tuple) -> bool:
    """conv.cpp's cblk_fits with AVX2's 8 lanes: only a kh x kw > 1 conv with K < 64 at stride 1, undilated, onto whole
    blocks of 16 channels (shallow_stem_cblk_wins)."""
    c, cout, kh, kw, strides, dil = case[1], case[4], case[5], case[6], case[7], case[9]
    return kh * kw > 1 and c * kh * kw < 64 and strides == (1, 1) and dil == (1, 1) and cout % 16 == 0


@pytest.mark.parametrize("case", CBLK_CASES, ids=[str(i) for i in range(len(CBLK_CASES))])
@pytest.mark.parametrize("activation", list(ACTS))
def test_conv2d_cblk(isa, threads, case, activation):
    # against float64, and the same bits at 1 thread (each tile computes the same outputs however the blocks and
    # rows are split); sigmoid is applied after the kernel (not one it applies in registers)
    n, c, h, wd, cout, kh, kw, strides, pads, dil = case
    x = randn(n, c, h, wd, seed=104)
    w = randn(cout, c, kh, kw, seed=105) * 0.1
    bias = randn(cout, seed=106)
    # the fp32 kernel (precision normal's AMX path takes 64 -> 64 on 10 x 10: test_conv_bf16x3.py)
    algo = _native.prepack_conv(w, 1, "high").algorithm(list(x.shape), strides, pads, dil)
    if isa == "avx512":
        assert algo == "cblk", algo
    elif isa == "avx2":  # the shallow stems alone (conv.cpp cblk_fits)
        assert (algo == "cblk") == _avx2_cblk_rule(case), algo
    else:
        assert algo != "cblk", algo
    ref = ACTS[activation](_conv_ref(x, w, bias, strides, pads, dil, 1))
    packed = _native.prepack_conv(w, 1, "high")
    out = np.full(ref.shape, np.nan, np.float32)
    _native.conv2d_packed(x, packed, bias, out, strides=strides, pads=pads, dilations=dil, activation=activation)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    _native.set_num_threads(1)
    one = np.full(ref.shape, np.nan, np.float32)
    _native.conv2d_packed(x, packed, bias, one, strides=strides, pads=pads, dilations=dil, activation=activation)
    _native.set_num_threads(threads)
    np.testing.assert_array_equal(out, one)


# (N, C, H, W, Cout, k, stride, pad): shallow stride-1 stems (K < 64) conv_cblk takes on AVX2 as on AVX-512 (measured on
# AMD Zen 3 against conv_direct, docs/onnx-models.md, branch ocr): vietcombank_captcha's 3 -> 32 on 50 x 155, a
# 1-channel one onto 64 channels (two blocks), a 5x5 one with rows shorter than a tile, two images
AVX2_CBLK_CASES = [
    (1, 3, 50, 155, 32, 3, 1, 1),
    (1, 1, 37, 41, 64, 3, 1, 1),
    (1, 2, 9, 5, 32, 5, 1, 2),
    (2, 3, 20, 23, 32, 3, 1, 0),
]


@pytest.mark.parametrize("case", AVX2_CBLK_CASES, ids=[str(i) for i in range(len(AVX2_CBLK_CASES))])
def test_conv2d_cblk_avx2_shapes(isa, threads, case):
    # AVX2 takes conv_cblk for them as AVX-512 does (it did not before); the values against float64 on every ISA
    n, c, h, wd, cout, k, s, p = case
    x = randn(n, c, h, wd, seed=111)
    w = randn(cout, c, k, k, seed=112) * np.float32(1.0 / np.sqrt(c * k * k))
    bias = randn(cout, seed=113)
    algo = _native.prepack_conv(w, 1, "high").algorithm(list(x.shape), (s, s), (p, p, p, p))
    if isa in ("avx2", "avx512"):
        assert algo == "cblk", algo
    ref = ACTS["relu"](_conv_ref(x, w, bias, (s, s), (p, p, p, p), (1, 1), 1))
    out = np.full(ref.shape, np.nan, np.float32)
    _native.conv2d_packed(x, _native.prepack_conv(w, 1, "high"), bias, out, strides=(s, s), pads=(p, p, p, p),
                          activation="relu")
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_conv2d_cblk_avx2_leaves(isa):
    # on AVX2 the deeper convs stay with conv_direct / the GEMM (inside ddddocr_det its stride-2 convs on conv_cblk
    # summed level with conv_direct): ddddocr's 48 -> 96 / 2, vietcombank's 128 -> 256 on 6 x 19, a 3 -> 32 stem at
    # stride 2, a 1x1 conv, 8 output channels
    if isa != "avx2":
        pytest.skip("AVX2's rule")
    shapes = [((1, 48, 104, 104), 96, 3, 2, 1), ((1, 128, 6, 19), 256, 3, 1, 1), ((1, 3, 64, 64), 32, 3, 2, 1),
              ((1, 64, 14, 14), 256, 1, 1, 0), ((1, 3, 20, 40), 8, 3, 1, 1)]
    for x_shape, cout, k, s, p in shapes:
        w = np.zeros((cout, x_shape[1], k, k), np.float32)
        assert _native.prepack_conv(w, 1, "high").algorithm(list(x_shape), (s, s), (p, p, p, p)) != "cblk"


# (N, C, L, Cout, dilation, (pad left, pad right), one row or one column): dilated 1-D three-tap convs that
# conv_winograd1d takes (Winograd F(4, 3), tiles 4 outputs d apart): eeg_spindles' 128 -> 128 with d = 16 on 7500
# positions (2 images); runs of d tiles split by the GEMM's 32-column panels (d = 37), pads on both sides (the taps
# reading zeros), the last run reaching far past the outputs (d = 2048, the 128 -> 64 shape); below d = 16 on the
# phase-split input (d = 4, 5, 8: outputs 4d apart), a [N, C, L, 1] input (a kh x 1 kernel).
WINOGRAD1D_CASES = [
    (2, 128, 7500 + 32, 128, 16, (0, 0), "row"),
    (1, 40, 3000, 33, 37, (5, 70), "row"),
    (1, 128, 7500 + 2 * 2048, 64, 2048, (0, 0), "row"),
    (3, 32, 517, 48, 16, (1, 2), "row"),
    (2, 128, 1208, 128, 4, (0, 0), "row"),
    (1, 64, 1003, 40, 5, (3, 9), "row"),
    (2, 32, 333, 64, 8, (1, 0), "column"),
    # a kernel as tall as its input onto one row (eeg_seizure's 20 -> 200 96 x 3 on 96 x 599): 32 channels x 8 rows
    # as 256 one-row channels, undilated (phase split) and d = 16
    (2, 32, 150, 48, 1, (1, 1), "full"),
    (1, 32, 300, 40, 16, (2, 0), "full"),
]


# Five-tap convs (Winograd F(4, 5), 8 points a tile): slovorez's 256 -> 192 on 64 positions ("same" pads, 64 words:
# the phase split at d = 1), a length that is not a multiple of 4 (the last tile past the outputs), one image of
# 59 outputs (15 tiles: a run shorter than an AVX-512 vector, the scalar rest), runs split by the GEMM's panels
# (d = 37), dilations on both sides of the phase split (d = 3, 16), a [N, C, L, 1] input (a 5 x 1 kernel), odd channel
# counts (>= 64: the rule's minimum).
WINOGRAD1D5_CASES = [
    (64, 256, 64, 192, 1, (2, 2), "row"),
    (3, 64, 203, 65, 1, (2, 2), "row"),
    (1, 67, 61, 70, 1, (0, 2), "row"),
    (1, 64, 900, 71, 37, (5, 70), "row"),
    (2, 64, 517, 80, 3, (6, 6), "row"),
    (1, 96, 700, 64, 16, (1, 2), "row"),
    (2, 64, 333, 64, 2, (4, 4), "column"),
]


def _check_conv1d_winograd(threads, case, activation, taps):
    n, c, length, cout, d, (pl, pr), layout = case
    rows = 8 if layout == "full" else 1
    x = randn(n, c, length, 1, seed=111) if layout == "column" else randn(n, c, rows, length, seed=111)
    w = randn(cout, c, rows, taps, seed=112) * np.float32(1.0 / np.sqrt(taps * c * rows))
    w = np.ascontiguousarray(w.transpose(0, 1, 3, 2)) if layout == "column" else w
    bias = randn(cout, seed=113)
    pads, dil = ((pl, 0, pr, 0), (d, 1)) if layout == "column" else ((0, pl, 0, pr), (1, d))
    packed = _native.prepack_conv(w, 1, "high")
    assert packed.algorithm(list(x.shape), (1, 1), pads, dil) == "winograd1d"
    ref = ACTS[activation](_conv_ref(x, w, bias, (1, 1), pads, dil, 1))
    out = np.full(ref.shape, np.nan, np.float32)
    _native.conv2d_packed(x, packed, bias, out, pads=pads, dilations=dil, activation=activation)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 + 1e-5 * float(np.abs(ref).max()))
    _native.set_num_threads(1)
    one = np.full(ref.shape, np.nan, np.float32)
    _native.conv2d_packed(x, packed, bias, one, pads=pads, dilations=dil, activation=activation)
    _native.set_num_threads(threads)
    np.testing.assert_array_equal(out, one)


@pytest.mark.parametrize("case", WINOGRAD1D_CASES, ids=[str(i) for i in range(len(WINOGRAD1D_CASES))])
@pytest.mark.parametrize("activation", ["none", "silu"])
def test_conv1d_winograd(isa, threads, case, activation):
    # against float64 (the transforms' rounding bounded relative to the largest output), and the same bits at 1
    # thread (blocks of tiles do not depend on the thread count)
    _check_conv1d_winograd(threads, case, activation, 3)


@pytest.mark.parametrize("case", WINOGRAD1D5_CASES, ids=[str(i) for i in range(len(WINOGRAD1D5_CASES))])
@pytest.mark.parametrize("activation", ["none", "relu"])
def test_conv1d_winograd_five_taps(isa, threads, case, activation):
    _check_conv1d_winograd(threads, case, activation, 5)


def _check_winograd1d_nonfinite(taps: int, length: int, pads: tuple[int, ...], dilations: tuple[int, int],
                                seed: int) -> None:
    # an inf and a NaN in the input: the Winograd transforms would spread them over outputs whose windows are finite,
    # so the conv falls back to a direct kernel and only the windows that read them are inf / NaN
    x = randn(1, 64, 1, length, seed=seed)
    x[0, 3, 0, 100] = np.inf
    x[0, 9, 0, 2 * length // 3] = np.nan
    w = randn(64, 64, 1, taps, seed=seed + 1) * 0.1
    bias = randn(64, seed=seed + 2)
    packed = _native.prepack_conv(w, 1, "high")
    assert packed.algorithm(list(x.shape), (1, 1), pads, dilations) == "winograd1d"
    ref = _conv_ref(x, w, bias, (1, 1), pads, dilations, 1)
    out = np.full(ref.shape, 7.0, np.float32)
    with np.errstate(invalid="ignore"):
        _native.conv2d_packed(x, packed, bias, out, pads=pads, dilations=dilations)
    assert np.isfinite(out).sum() == np.isfinite(ref).sum() > 0
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_conv1d_winograd_nonfinite_input_and_rule():
    _check_winograd1d_nonfinite(3, 600, (0, 0, 0, 0), (1, 16), 114)
    # what the rule leaves to the other kernels: no dilation or d = 2 (the tuned direct kernels), few channels,
    # d = 4096 on 7500 outputs (the tiles past the end cost what Winograd saves); a one-row conv over >= 1024
    # positions never takes conv_cblk (it re-read the padded row per block of channels)
    algo = lambda c, co, length, d: _native.prepack_conv(randn(co, c, 1, 3), 1, "high").algorithm(  # noqa: E731
        [1, c, 1, length], (1, 1), (0, 0, 0, 0), (1, d))
    assert algo(128, 128, 2000, 1) not in ("winograd1d", "cblk")
    assert algo(128, 128, 2000, 2) not in ("winograd1d", "cblk")
    assert algo(16, 128, 2000, 16) != "winograd1d"
    assert algo(128, 64, 7500 + 2 * 4096, 4096) not in ("winograd1d", "cblk")
    # a full-height kernel over fewer than 256 (channel, row) pairs
    assert _native.prepack_conv(randn(40, 8, 5, 3), 1, "high").algorithm([1, 8, 5, 77], (1, 1), (0, 1, 0, 1)) \
        != "winograd1d"


# Dilated 3x3 convs at stride 1 run as dh x dw undilated phase convs on Winograd (conv.cpp dilated_phases):
# CRAFT RefineNet's ASPP shape scaled down (64 -> 128 at d = 6, "same" pads), sizes no multiple of the dilation
# (phases of unequal size: the tallest one's extra rows cut off), unequal dilations and pads (fewer pads than the
# dilation; none on one side), one dilated axis, two images.
DILATED_PHASE_CASES = [
    # (N, C, H, W, Cout, dilations, pads)
    (1, 64, 48, 64, 128, (6, 6), (6, 6, 6, 6)),
    (2, 64, 23, 47, 130, (3, 5), (3, 5, 3, 5)),
    (1, 96, 45, 41, 97, (4, 2), (1, 2, 3, 0)),
    (1, 128, 40, 30, 64, (2, 1), (2, 1, 2, 1)),
    (1, 64, 96, 120, 128, (12, 12), (12, 12, 12, 12)),
]


@pytest.mark.parametrize("case", DILATED_PHASE_CASES, ids=[str(i) for i in range(len(DILATED_PHASE_CASES))])
@pytest.mark.parametrize("activation", ["none", "relu"])
def test_conv_dilated_phases(isa, threads, case, activation):
    # against float64 (Winograd's rounding bounded by the largest output), with a residual (the conv, then the sum),
    # and the same bits at 1 thread
    n, c, h, wd, cout, dil, pads = case
    x = randn(n, c, h, wd, seed=121)
    w = randn(cout, c, 3, 3, seed=122) * np.float32(1.0 / np.sqrt(9 * c))
    bias = randn(cout, seed=123)
    packed = _native.prepack_conv(w, 1, "high")
    assert packed.algorithm(list(x.shape), (1, 1), pads, dil) == "winograd"
    ref = _conv_ref(x, w, bias, (1, 1), pads, dil, 1)
    tol = {"rtol": 1e-4, "atol": 1e-4 + 1e-5 * float(np.abs(ref).max())}
    out = np.full(ref.shape, np.nan, np.float32)
    _native.conv2d_packed(x, packed, bias, out, pads=pads, dilations=dil, activation=activation)
    np.testing.assert_allclose(out, ACTS[activation](ref), **tol)
    residual = randn(*ref.shape, seed=124)
    summed = np.full(ref.shape, np.nan, np.float32)
    _native.conv2d_packed(x, packed, bias, summed, pads=pads, dilations=dil, activation=activation, residual=residual)
    np.testing.assert_allclose(summed, ACTS[activation](ref + residual), **tol)
    _native.set_num_threads(1)
    one = np.full(ref.shape, np.nan, np.float32)
    _native.conv2d_packed(x, packed, bias, one, pads=pads, dilations=dil, activation=activation)
    _native.set_num_threads(threads)
    np.testing.assert_array_equal(out, one)


def test_conv_dilated_phases_nonfinite_and_rule():
    # an inf and a NaN in the input: each phase conv falls back from Winograd to a direct kernel, so only the outputs
    # whose dilated windows read them are inf / NaN
    x = randn(1, 64, 30, 36, seed=125)
    x[0, 3, 10, 11] = np.inf
    x[0, 7, 20, 30] = np.nan
    w = np.abs(randn(128, 64, 3, 3, seed=126)) * np.float32(0.05)
    pads, dil = (4, 4, 4, 4), (4, 4)
    packed = _native.prepack_conv(w, 1, "high")
    assert packed.algorithm(list(x.shape), (1, 1), pads, dil) == "winograd"
    out = np.empty((1, 128, 30, 36), np.float32)
    _native.conv2d_packed(x, packed, None, out, pads=pads, dilations=dil)
    bad = np.zeros((30, 36), bool)
    for ky in range(3):
        for kx in range(3):
            for y, xc in ((10, 11), (20, 30)):
                oy, ox = y + 4 - 4 * ky, xc + 4 - 4 * kx
                if 0 <= oy < 30 and 0 <= ox < 36:
                    bad[oy, ox] = True
    assert np.array_equal(~np.isfinite(out[0]).all(axis=0), bad)
    finite = np.where(np.isfinite(x), x, 0).astype(np.float32)
    ref = _conv_ref(finite, w, None, (1, 1), pads, dil, 1)
    np.testing.assert_allclose(out[:, :, ~bad], ref[:, :, ~bad], rtol=1e-4, atol=1e-4)
    # what the rule leaves to the dilated kernels: a stride, groups, a 5x5 kernel, shallower products (64 -> 64, 16 ->
    # 32: measured slower or level), small maps (< 1024 outputs)
    algo = lambda c, co, shape, d, k=3, s=1, group=1: _native.prepack_conv(  # noqa: E731
        randn(co, c // group, k, k), group, "high").algorithm([1, c, *shape], (s, s), (d, d, d, d), (d, d))
    assert algo(64, 128, (48, 64), 6) == "winograd"
    assert algo(64, 128, (48, 64), 6, s=2) != "winograd"
    assert algo(64, 128, (48, 64), 6, group=2) != "winograd"
    assert algo(64, 128, (48, 64), 6, k=5) != "winograd"
    assert algo(64, 64, (56, 56), 2) != "winograd"
    assert algo(16, 32, (12, 12), 2) != "winograd"
    assert algo(128, 128, (30, 30), 2) != "winograd"


def test_conv1d_winograd_five_taps_nonfinite_and_rule():
    # F(4, 5) as F(4, 3) above; the rule leaves five-tap convs with fewer than 64 channels in or out (atspm_funcnet's
    # 32 -> 32 ran slower), 2-D 5 x 5 kernels, two-row inputs and stride 5 (eeg_spindles' downscale convs) to the
    # other kernels
    _check_winograd1d_nonfinite(5, 300, (0, 2, 0, 2), (1, 1), 117)

    def algo(c, co, shape, k=(1, 5), strides=(1, 1)):
        return _native.prepack_conv(randn(co, c, *k), 1, "high").algorithm([1, c, *shape], strides, (0, 0, 0, 0))

    assert algo(64, 64, (1, 300)) == "winograd1d"
    assert algo(32, 32, (1, 300)) != "winograd1d"
    assert algo(64, 32, (1, 300)) != "winograd1d"
    assert algo(64, 64, (20, 20), k=(5, 5)) != "winograd1d"
    assert algo(64, 64, (2, 300)) != "winograd1d"
    assert algo(64, 64, (1, 300), strides=(1, 5)) != "winograd1d"


def test_conv2d_one_vector_cblk_rule(isa):
    # conv_cblk's one-vector tiles take exactly one vector of output channels (16, AVX-512 alone) on rows of >= 16
    # positions, and a last block of one vector after whole 32-channel ones; fewer positions a row, other channel
    # counts, 1x1 kernels and groups keep their kernels
    def algo(cout, cin, hw, k=3, stride=2, group=1):
        w = randn(cout, cin // group, k, k)
        return _native.prepack_conv(w, group, "high").algorithm([1, cin, hw, hw], (stride, stride), (k // 2,) * 4)

    assert (algo(16, 3, 224) == "cblk") == (isa == "avx512")
    assert (algo(16, 16, 80, stride=1) == "cblk") == (isa == "avx512")
    assert algo(16, 3, 30) != "cblk"  # rows of 15
    assert algo(10, 3, 224) != "cblk"
    assert algo(24, 3, 224) != "cblk"
    assert (algo(48, 24, 208) == "cblk") == (isa == "avx512")  # whole blocks, then one vector (one_vector_last_block)
    assert algo(48, 24, 62) != "cblk"  # rows of 31
    assert algo(16, 16, 80, k=1, stride=1) != "cblk"
    assert algo(16, 16, 80, stride=1, group=2) != "cblk"


def _in_this_module(call: str) -> str:
    """Python code running ``call`` in this module in a fresh process, imported by path: a ``tests`` package of a
    plugin on PYTHONPATH would shadow this tree's ``tests.plugins.cpu``."""
    import os

    return f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import test_native as t; t.{call}"


def test_conv2d_cblk_forced():
    # HETERO_CPU_CONV_CBLK=1: every conv the kernel can run takes it (partial blocks of output channels, 1x1 convs,
    # large maps, K < 64), each CONV_CASES shape against float64 on every ISA, in a fresh process (the switch is read
    # once).
    import os
    import subprocess
    import sys

    env = dict(os.environ, HETERO_CPU_CONV_CBLK="1")
    code = _in_this_module("cblk_forced_checks()")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "cblk" in r.stdout


def cblk_forced_checks():
    taken = 0
    for isa in ISAS:
        _native.set_isa(isa)
        for case in CONV_CASES:
            n, c, h, wd, _, _, _, strides, pads, dil, group = case
            x, w, bias = _conv_case_inputs(case)
            packed = _native.prepack_conv(w, group)
            algo = packed.algorithm([n, c, h, wd], strides, pads, dil)
            taken += algo == "cblk"
            for activation in ("silu", "sigmoid"):
                ref = ACTS[activation](_conv_ref(x, w, bias, strides, pads, dil, group))
                atol = 1e-4 + (1e-5 * float(np.abs(ref).max()) if algo == "winograd" else 0.0)
                out = np.full(ref.shape, np.nan, np.float32)
                _native.conv2d_packed(x, packed, bias, out, strides=strides, pads=pads, dilations=dil,
                                      activation=activation)
                np.testing.assert_allclose(out, ref, rtol=1e-4, atol=atol, err_msg=f"{isa} {case} {algo}")
    assert taken > 0
    print("cblk", taken)


def test_conv2d_strided_input_and_errors(isa):
    x = randn(1, 6, 20, 20, seed=93)[:, ::2, ::2, ::2]
    w = randn(4, 3, 3, 3, seed=94)
    out = np.empty((1, 4, 8, 8), np.float32)
    _native.conv2d(x, w, None, out)
    np.testing.assert_allclose(out, _conv_ref(x, w, None, (1, 1), (0, 0, 0, 0), (1, 1), 1), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="shape"):
        _native.conv2d(x, w, None, np.empty((1, 4, 9, 9), np.float32))
    with pytest.raises(ValueError, match="channels"):
        _native.conv2d(x, randn(4, 2, 3, 3), None, out)
    with pytest.raises(ValueError, match="divisible"):
        _native.conv2d(x, randn(5, 1, 3, 3), None, out, group=3)
    with pytest.raises(ValueError, match="unknown op"):
        _native.conv2d(x, w, None, out, activation="swishy")


def _pool_ref(x, kernel, strides, pads, dil, mode, count_include_pad=False, out_hw=None):
    n, c, h, w = x.shape
    kh, kw = kernel
    sh, sw = strides
    pt, pl, pb, pr = pads
    dh, dw = dil
    ho, wo = out_hw
    out = np.zeros((n, c, ho, wo))
    for oy in range(ho):
        for ox in range(wo):
            vals, cnt_pad = [], 0
            for ky in range(kh):
                for kx in range(kw):
                    iy, ix = oy * sh - pt + ky * dh, ox * sw - pl + kx * dw
                    if -pt <= iy < h + pb and -pl <= ix < w + pr:
                        cnt_pad += 1
                    if 0 <= iy < h and 0 <= ix < w:
                        vals.append(x[:, :, iy, ix].astype(np.float64))
            if mode == "max":
                out[:, :, oy, ox] = np.max(vals, axis=0)
            else:
                out[:, :, oy, ox] = np.sum(vals, axis=0) / (cnt_pad if count_include_pad else len(vals))
    return out


POOL_CASES = [
    ((2, 2), (2, 2), (0, 0, 0, 0), (1, 1), (8, 8)),
    ((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), (9, 9)),
    ((3, 3), (1, 1), (1, 1, 1, 1), (1, 1), (17, 17)),
    ((3, 2), (2, 1), (1, 0, 1, 1), (2, 1), (8, 17)),
    ((5, 5), (1, 1), (2, 2, 2, 2), (1, 1), (17, 17)),  # YOLOv8's SPPF: stride 1, the taps as shifted rows
    ((3, 3), (1, 1), (2, 2, 2, 2), (2, 2), (17, 17)),  # stride 1, dilated
]


@pytest.mark.parametrize("case", POOL_CASES, ids=[str(i) for i in range(len(POOL_CASES))])
def test_pools(case):
    kernel, strides, pads, dil, (ho, wo) = case
    x = randn(2, 3, 17, 17, seed=95)
    out = np.empty((2, 3, ho, wo), np.float32)
    _native.max_pool2d(x, out, kernel, strides, pads, dil)
    np.testing.assert_allclose(out, _pool_ref(x, kernel, strides, pads, dil, "max", out_hw=(ho, wo)), rtol=1e-6)
    if dil == (1, 1):
        for cip in (False, True):
            _native.avg_pool2d(x, out, kernel, strides, pads, cip)
            ref = _pool_ref(x, kernel, strides, pads, dil, "avg", cip, out_hw=(ho, wo))
            np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kh", [1, 2])
@pytest.mark.parametrize("shape", [(2, 3, 6, 16), (1, 96, 10, 4), (1, 700, 4, 8), (1, 3, 6, 2)])
def test_max_pool_tiling_windows(isa, threads, shape, kh):
    # 1 x 2 / (1, 2) and 2 x 2 / 2 windows tiling the planes: the tensor as one stack of rows (tasks of >= 1024
    # outputs across threads), NaN passing through: against the reference
    x = randn(*shape, seed=99)
    x.reshape(-1)[[0, 7, min(2 * 1024 + 1, x.size - 3), x.size - 1]] = np.nan
    n, c, h, w = shape
    out = np.empty((n, c, h // kh, w // 2), np.float32)
    _native.max_pool2d(x, out, (kh, 2), (kh, 2), (0, 0, 0, 0), (1, 1))
    ref = _pool_ref(x, (kh, 2), (kh, 2), (0, 0, 0, 0), (1, 1), "max", out_hw=(h // kh, w // 2))
    np.testing.assert_allclose(out, ref, rtol=1e-6)
    assert (np.isnan(out) == np.isnan(ref)).all() and np.isnan(out).any()


@pytest.mark.parametrize("k", [3, 4, 8])
@pytest.mark.parametrize("shape", [(1, 16, 300, 79), (2, 3, 5, 24), (1, 1, 1, 7), (1, 5, 9, 3)])
def test_max_pool_windows_side_by_side(isa, threads, shape, k):
    # 1 x k / (1, k) windows side by side along each row, k >= 3 (madmom's beat TCN: 1 x 3 / 3 over 79 bins): one
    # pass over the rows; columns past the last whole window unread (79 -> 26 at k = 3), NaN passing through
    n, c, h, w = shape
    wo = w // k
    if wo == 0:
        pytest.skip("no whole window")
    x = randn(*shape, seed=97)
    x.reshape(-1)[[0, 4, x.size // 2, x.size - 1]] = np.nan
    x[..., -1] = 1e30  # a last column outside every window when w % k != 0 must not be read
    out = np.full((n, c, h, wo), -7.0, np.float32)
    _native.max_pool2d(x, out, (1, k), (1, k), (0, 0, 0, 0), (1, 1))
    ref = _pool_ref(x, (1, k), (1, k), (0, 0, 0, 0), (1, 1), "max", out_hw=(h, wo))
    np.testing.assert_allclose(out, ref, rtol=1e-6)
    assert (np.isnan(out) == np.isnan(ref)).all()


@pytest.mark.parametrize("case", POOL_CASES, ids=[str(i) for i in range(len(POOL_CASES))])
def test_max_pool_propagates_nan(case):
    """A NaN anywhere in a window makes that output NaN (and only those), wherever the window lies."""
    kernel, strides, pads, dil, (ho, wo) = case
    x = randn(2, 3, 17, 17, seed=98)
    x[0, 0, 0, 0] = x[0, 1, 8, 9] = x[1, 2, 16, 3] = x[1, 0, 5, 16] = np.nan
    out = np.empty((2, 3, ho, wo), np.float32)
    _native.max_pool2d(x, out, kernel, strides, pads, dil)
    np.testing.assert_allclose(out, _pool_ref(x, kernel, strides, pads, dil, "max", out_hw=(ho, wo)), rtol=1e-6)


S2_ROW_CASES = [  # (kernel, strides, pads, (h, w), (ho, wo)): stride-2 pools on rows of 64+ inputs, no left pad
    ((2, 2), (2, 2), (0, 0, 0, 0), (50, 155), (25, 77)),  # vietcombank_captcha: odd H, W; a last row, column unread
    ((2, 2), (2, 2), (0, 0, 0, 0), (25, 77), (12, 38)),
    ((3, 3), (2, 2), (0, 0, 1, 1), (9, 67), (5, 34)),  # the last window past the right edge (-inf there)
    ((3, 3), (2, 2), (0, 0, 0, 0), (7, 98), (3, 48)),  # 3 taps: the even column of the next pair
    ((1, 2), (1, 2), (0, 0, 0, 0), (3, 99), (3, 49)),
    ((2, 1), (2, 2), (0, 0, 0, 0), (4, 64), (2, 32)),  # one tap a row: whole vectors only
]


@pytest.mark.parametrize("case", S2_ROW_CASES, ids=[str(i) for i in range(len(S2_ROW_CASES))])
def test_max_pool_s2_rows_in_registers(isa, threads, case):
    """max_pool_s2_row's register path (AVX-512: each row's pairs split in registers, masked at the row's end; the
    other ISAs take the buffered passes): against the float64 reference, a NaN in a window's last tap propagating and
    one in an unread last column not, -inf inputs, 1-3 taps, a ragged last vector of outputs."""
    kernel, strides, pads, (h, w), (ho, wo) = case
    x = randn(2, 3, h, w, seed=97)
    x[0, 0, 0, min(2 * (wo - 1) + kernel[1], w) - 1] = np.nan  # the last output's last tap (in the input)
    x[1, 2, h - 1, 0] = np.nan
    x[1, 1, 1, :9] = -np.inf
    if w > 2 * (wo - 1) + kernel[1]:
        x[0, 1, 0, w - 1] = np.nan  # past every window: must not reach the output
    out = np.empty((2, 3, ho, wo), np.float32)
    _native.max_pool2d(x, out, kernel, strides, pads, (1, 1))
    ref = _pool_ref(x, kernel, strides, pads, (1, 1), "max", out_hw=(ho, wo))
    np.testing.assert_allclose(out, ref, rtol=1e-6)
    assert (np.isnan(out) == np.isnan(ref)).all() and np.isnan(out).any()


AVG_CASES = [  # (kernel, strides, pads, (h, w), (ho, wo))
    ((3, 2), (3, 2), (0, 0, 0, 0), (3, 80), (1, 40)),  # ppocr_v5_rec's neck pool
    ((3, 2), (3, 2), (0, 0, 0, 0), (7, 81), (2, 40)),  # a row and a column past the last window
    ((3, 3), (2, 2), (1, 1, 1, 1), (9, 21), (5, 11)),
    ((2, 3), (1, 2), (0, 1, 1, 2), (5, 20), (5, 11)),  # right pad past a window (ceil-mode-like last column)
    ((3, 5), (1, 1), (1, 2, 1, 2), (4, 3), (4, 3)),  # every window over an edge: no interior columns
    ((1, 1), (1, 1), (0, 0, 0, 0), (1, 17), (1, 17)),
]


@pytest.mark.parametrize("case", AVG_CASES, ids=[str(i) for i in range(len(AVG_CASES))])
def test_avg_pool_column_sums(threads, case):
    """avg_pool2d's column sums of the valid rows, then the interior windows' sums times one reciprocal and the edge
    windows' own counts: against the float64 reference with and without count_include_pad."""
    kernel, strides, pads, (h, w), (ho, wo) = case
    x = randn(2, 5, h, w, seed=94)
    out = np.empty((2, 5, ho, wo), np.float32)
    for cip in (False, True):
        _native.avg_pool2d(x, out, kernel, strides, pads, cip)
        ref = _pool_ref(x, kernel, strides, pads, (1, 1), "avg", cip, out_hw=(ho, wo))
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_pool_ceil_mode_and_errors():
    x = randn(1, 2, 6, 6, seed=96)
    out = np.empty((1, 2, 3, 3), np.float32)  # ceil((6-3)/2)+1 = 3
    _native.max_pool2d(x, out, (3, 3), (2, 2), (0, 0, 0, 0), (1, 1))
    np.testing.assert_allclose(out, _pool_ref(x, (3, 3), (2, 2), (0, 0, 0, 0), (1, 1), "max", out_hw=(3, 3)))
    with pytest.raises(ValueError, match="output spatial size"):
        _native.max_pool2d(x, np.empty((1, 2, 5, 5), np.float32), (3, 3), (2, 2), (0, 0, 0, 0), (1, 1))


def test_global_avg_pool(threads):
    x = randn(3, 70, 13, 11, seed=97)
    out = np.empty((3, 70, 1, 1), np.float32)
    _native.global_avg_pool(x, out)
    np.testing.assert_allclose(out, x.astype(np.float64).mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError):
        _native.global_avg_pool(x, np.empty((3, 70, 2, 1), np.float32))


def test_concurrent_callers():
    """Several Python threads (the GIL is released) share the pool without deadlock or wrong results."""
    import threading

    a, b = randn(200, 300, seed=100), randn(300, 150, seed=101)
    ref = a.astype(np.float64) @ b
    errors = []

    def work():
        try:
            for _ in range(10):
                out = np.empty((200, 150), np.float32)
                _native.gemm(a, b, out)
                assert_gemm_close(out, ref, 300)
                y = np.empty_like(a)
                _native.unary("exp", a, y)
                np.testing.assert_allclose(y, np.exp(a.astype(np.float64)), rtol=2e-6)
        except Exception as e:  # surfaced in the main thread
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert not errors, errors[0]


# (N, C, H, W, Cout, pads): Winograd convs whose output tiles the transposed store writes (x_wino_store: the
# activation in registers, each whole tile's rows of four after a W x W transpose; tiles cut by the map's edge by
# their rows / columns inside it), shapes every ISA runs by Winograd: YOLOv8n's 20 x 20 (one block of tiles: its
# phases split across threads) and 40 x 40, maps of 4k + 1..3 rows and columns (cut tiles in the last tile row and
# column, uneven pads), two images sharing a block, an 18 x 17 map (a vector's tiles spanning tile rows).
WINO_STORE_CASES = [
    (1, 32, 20, 20, 32, (1, 1, 1, 1)),
    (1, 16, 40, 40, 32, (1, 1, 1, 1)),
    (1, 16, 41, 43, 32, (1, 1, 1, 1)),
    (2, 32, 21, 22, 32, (0, 1, 2, 1)),
    (1, 32, 37, 29, 32, (1, 0, 2, 1)),
    (1, 64, 18, 17, 64, (1, 1, 1, 1)),
]


def _wino_store_outputs(case, activation, isa):
    n, c, h, wd, cout, pads = case
    x = randn(n, c, h, wd, seed=107)
    w = randn(cout, c, 3, 3, seed=108) * 0.1
    bias = randn(cout, seed=109)
    packed = _native.prepack_conv(w)
    assert packed.algorithm(list(x.shape), (1, 1), pads) == "winograd", (isa, case)
    out = np.full((n, cout, h + pads[0] + pads[2] - 2, wd + pads[1] + pads[3] - 2), np.nan, np.float32)
    _native.conv2d_packed(x, packed, bias, out, pads=pads, activation=activation)
    return out, ACTS[activation](_conv_ref(x, w, bias, (1, 1), pads, (1, 1), 1))


@pytest.mark.parametrize("case", WINO_STORE_CASES, ids=[str(i) for i in range(len(WINO_STORE_CASES))])
@pytest.mark.parametrize("activation", list(ACTS))
def test_conv2d_winograd_store(isa, threads, case, activation):
    # against float64 (every output written: the NaN fill never survives), and the same bits at 1 thread; sigmoid is
    # not applied in registers (the scalar store and a separate pass)
    out, ref = _wino_store_outputs(case, activation, isa)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 + 1e-5 * float(np.abs(ref).max()))
    _native.set_num_threads(1)
    one, _ = _wino_store_outputs(case, activation, isa)
    _native.set_num_threads(threads)
    np.testing.assert_array_equal(out, one)


# (N, C, H, W, Cout, pads): Winograd on maps of 9-16 tiles, whose 36 products compute one vector of columns where
# the ISA has the GEMM's one-vector tile (AVX-512: 16 of a 32-column panel; open_nsfw's 128 -> 128 on 14 x 14,
# ddddocr's 192 -> 192 on 13 x 13): Cout ragged against the 12-row tiles, 9 tiles with uneven pads, a whole
# vector of 16 tiles, 13 tiles (the vector's last lanes pad), K above the GEMM's depth block (two k blocks).
ONE_VECTOR_WINO_CASES = [
    (1, 128, 14, 14, 128, (1, 1, 1, 1)),
    (1, 48, 12, 12, 40, (0, 1, 2, 1)),
    (1, 64, 16, 16, 64, (1, 1, 1, 1)),
    (1, 32, 15, 13, 24, (1, 1, 1, 0)),
    (1, 288, 13, 13, 20, (1, 1, 1, 1)),
]


@pytest.mark.parametrize("case", ONE_VECTOR_WINO_CASES, ids=[str(i) for i in range(len(ONE_VECTOR_WINO_CASES))])
def test_conv2d_winograd_one_vector_of_tiles(isa, threads, case):
    # against float64 on every ISA (Winograd where the rule takes it, else the direct kernels); AVX-512 takes
    # Winograd on each of these maps (16 computed columns against 32 stored: two to four times the direct flops
    # saved), and the same bits at 1 thread
    n, c, h, wd, cout, pads = case
    x = randn(n, c, h, wd, seed=111)
    w = randn(cout, c, 3, 3, seed=112) * 0.1
    bias = randn(cout, seed=113)
    packed = _native.prepack_conv(w)
    algo = packed.algorithm(list(x.shape), (1, 1), pads)
    if isa == "avx512":
        assert algo == "winograd", case
    ref = np.maximum(_conv_ref(x, w, bias, (1, 1), pads, (1, 1), 1), 0)

    def run():
        out = np.full(ref.shape, np.nan, np.float32)
        _native.conv2d_packed(x, packed, bias, out, pads=pads, activation="relu")
        return out

    out = run()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 + 1e-5 * float(np.abs(ref).max()))
    _native.set_num_threads(1)
    one = run()
    _native.set_num_threads(threads)
    np.testing.assert_array_equal(out, one)


# (C, H, W, kernel, strides, pads, group): conv2d_packed's input_shift (hetero.ConvInputShift), the conv of x + shift
# with the zero padding not shifted. Depthwise on the row kernel adds it on the plane copy (whole planes, 3x3 and 5x5;
# bands of a tall plane; stride (2, 1); asymmetric pads); the in-place stride-2 and channel-blocked kernels, a
# dense conv and a 1-channel one run on x + shift made apart.
INPUT_SHIFT_CASES = [
    (6, 12, 40, 3, (1, 1), (1, 1, 1, 1), 6),
    (8, 70, 90, 5, (1, 1), (2, 2, 2, 2), 8),
    (5, 12, 33, 5, (2, 1), (2, 2, 2, 2), 5),
    (3, 9, 21, 3, (1, 1), (0, 1, 2, 0), 3),
    (16, 20, 40, 3, (2, 2), (1, 1, 1, 1), 16),
    (16, 7, 7, 3, (1, 1), (1, 1, 1, 1), 16),
    (8, 10, 12, 3, (1, 1), (1, 1, 1, 1), 1),
    (1, 10, 12, 3, (1, 1), (1, 1, 1, 1), 1),
]


@pytest.mark.parametrize("case", INPUT_SHIFT_CASES, ids=[str(i) for i in range(len(INPUT_SHIFT_CASES))])
def test_conv2d_input_shift(isa, threads, case):
    # against float64 of the zero-padded x + shift (the shift never reaches the padding), and the same bits as the
    # conv of x + shift computed in float32 first (what the Add before it wrote)
    c, h, wd, k, strides, pads, group = case
    x = randn(2, c, h, wd, seed=118)
    w = randn(c, c // group, k, k, seed=119) * 0.3
    bias = randn(c, seed=120)
    shift = np.float32(-0.7)
    packed = _native.prepack_conv(w, group)
    ref = _conv_ref(x.astype(np.float64) + float(shift), w, bias, strides, pads, (1, 1), group)
    ref_shape = ref.shape
    out = np.full(ref_shape, np.nan, np.float32)
    _native.conv2d_packed(x, packed, bias, out, strides, pads, (1, 1), "relu", 0.0, 0.0, None, float(shift))
    np.testing.assert_allclose(out, np.maximum(ref, 0), rtol=1e-4, atol=1e-4)
    apart = np.full(ref_shape, np.nan, np.float32)
    _native.conv2d_packed(x + shift, packed, bias, apart, strides, pads, (1, 1), "relu", 0.0, 0.0)
    np.testing.assert_array_equal(out, apart)


def test_conv2d_winograd_store_same_bits_as_scalar_stores():
    # HETERO_CPU_WINO_STORE=0 (read once: a fresh process) keeps the scalar stores and the separate activation pass:
    # the same transform and activation functions, so the same bits, on every ISA
    import os
    import subprocess
    import sys

    code = _in_this_module("wino_store_dump()")
    got = {}
    for flag in ("0", "1"):
        env = dict(os.environ, HETERO_CPU_WINO_STORE=flag)
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        got[flag] = r.stdout
    assert got["0"] == got["1"]
    assert len(got["1"]) > 1000


def wino_store_dump():
    import sys

    for isa in ISAS:
        _native.set_isa(isa)
        for case in WINO_STORE_CASES:
            for activation in ACTS:
                sys.stdout.buffer.write(_wino_store_outputs(case, activation, isa)[0].tobytes())


# (N, C, H, W, Cout, group): 1x1 convs conv.cpp's rule runs as register tiles on the input in place (conv_pointwise):
# YOLOv8n's 32 -> 32 on 80 x 80 and 384 -> 256 on 10 x 10 (at 2 threads the weight panels split), DFL's 16 -> 1,
# last tiles of 4, 16, 17 and 31 columns (copied, zero-filled), Cout of 12 k + 1 / 4 / 5 / 8 (part row panels), a
# 3-channel input, two images, a grouped 1x1 conv
POINTWISE_CASES = [
    (1, 32, 80, 80, 32, 1),
    (1, 384, 10, 10, 256, 1),
    (1, 16, 4, 2100, 1, 1),
    (1, 48, 9, 4, 37, 1),
    (2, 24, 7, 7, 28, 1),
    (1, 3, 17, 5, 16, 1),
    (1, 40, 3, 21, 13, 1),
    (1, 64, 11, 11, 42, 2),
    (1, 384, 8, 8, 256, 1),  # whole 32-column panels: the tiles at K = 384
    # Cout < K on > 128 positions (the tiles without AMX, else the GEMM): YOLOv8n's 192 -> 64 on 20 x 20, a ragged
    # 153-position map with Cout off the 12-row tile
    (1, 192, 20, 20, 64, 1),
    (1, 96, 17, 9, 40, 1),
    # Cout = K on > 128 positions: the tiles without AMX up to K = 128 (YOLOv8n's 64 -> 64 on 40 x 40, a ragged map),
    # the GEMM past it (DBNet's 192 -> 192 on 26 x 26)
    (1, 64, 13, 11, 64, 1),
    (1, 128, 12, 13, 128, 1),
    (1, 192, 13, 11, 192, 1),
    # conv_cblk (whole 32-channel blocks, maps the 32-column panels fit badly): 7 x 7 (two rows a tile), two images;
    # 14 x 14 at K = 512 and at K = 256 (PP-LCNet's 256 -> 256); K = 128 (PP-LCNet's 128 -> 256) there without AMX
    # only, the GEMM with it; K = 96 the GEMM / tiles
    (2, 96, 7, 7, 128, 1),
    (1, 512, 14, 14, 64, 1),
    (1, 256, 14, 14, 96, 1),
    (1, 128, 14, 14, 64, 1),
    (1, 128, 14, 14, 256, 1),
    (1, 96, 13, 15, 64, 1),
    # one image at 2+ threads: one contiguous range of channel blocks a thread (channel_ranges_fit), five blocks as
    # 3 + 2 (PP-LCNet's 7 x 7 convs: 256 -> 512, 16 blocks)
    (1, 256, 7, 7, 160, 1),
    # one image at 2+ threads on the register tiles (column blocks claimed one at a time, the last tile copied):
    # PP-LCNet's 32 -> 64 on a ragged map, 30 channels (a last part panel)
    (1, 32, 23, 19, 64, 1),
    (1, 24, 21, 21, 30, 1),
]


def _pointwise_outputs(case, activation):
    n, c, h, wd, cout, group = case
    x = randn(n, c, h, wd, seed=110)
    w = randn(cout, c // group, 1, 1, seed=111) * 0.2
    bias = randn(cout, seed=112)
    packed = _native.prepack_conv(w, group, "high")  # the fp32 kernels (precision normal: test_conv_bf16x3.py)
    out = np.full((n, cout, h, wd), np.nan, np.float32)
    _native.conv2d_packed(x, packed, bias, out, activation=activation)
    ref = ACTS[activation](_conv_ref(x, w, bias, (1, 1), (0, 0, 0, 0), (1, 1), group))
    return out, ref, packed.algorithm(list(x.shape))


@pytest.mark.parametrize("case", POINTWISE_CASES, ids=[str(i) for i in range(len(POINTWISE_CASES))])
@pytest.mark.parametrize("activation", list(ACTS))
def test_conv2d_pointwise(isa, threads, case, activation):
    # against float64 (every output written over the NaN fill) and the same bits at 1 thread; sigmoid is not applied
    # in the tiles' registers: those convs run the GEMM
    out, ref, algo = _pointwise_outputs(case, activation)
    assert algo == _pointwise_algo(isa, case[1] // case[5], case[2] * case[3], case[4], case[5])
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    _native.set_num_threads(1)
    one, _, _ = _pointwise_outputs(case, activation)
    _native.set_num_threads(threads)
    np.testing.assert_array_equal(out, one)


# (N, C, H, W, Cout, strides, group): strided 1x1 convs without padding, run as stride-1 convs on the strided input
# copied once (conv2d_packed's subsample): ResNet's stride-2 projections (odd map: the last row and column unread;
# onto 7 x 7, which the stride-1 rule sends to conv_cblk), strides (3, 1) and (1, 2), grouped, two images.
STRIDED_POINTWISE_CASES = [
    (1, 64, 28, 28, 32, (2, 2), 1),
    (1, 96, 13, 13, 64, (2, 2), 1),
    (2, 128, 14, 14, 64, (2, 2), 1),
    (1, 24, 10, 9, 20, (3, 1), 1),
    (1, 16, 8, 11, 12, (1, 2), 1),
    (2, 32, 9, 9, 48, (2, 2), 4),
]


@pytest.mark.parametrize("case", STRIDED_POINTWISE_CASES, ids=[str(i) for i in range(len(STRIDED_POINTWISE_CASES))])
def test_conv2d_strided_pointwise(isa, threads, case):
    # against float64, the kernel the stride-1 conv on the subsampled input takes, and the same bits at 1 thread
    n, c, h, wd, cout, strides, group = case
    x = randn(n, c, h, wd, seed=120)
    w = randn(cout, c // group, 1, 1, seed=121) * 0.2
    bias = randn(cout, seed=122)
    packed = _native.prepack_conv(w, group)
    sub = np.ascontiguousarray(x[:, :, :: strides[0], :: strides[1]])
    assert packed.algorithm(list(x.shape), strides) == packed.algorithm(list(sub.shape))
    ref = np.maximum(_conv_ref(x, w, bias, strides, (0, 0, 0, 0), (1, 1), group), 0)
    out = np.full(ref.shape, np.nan, np.float32)
    _native.conv2d_packed(x, packed, bias, out, strides=strides, activation="relu")
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    _native.set_num_threads(1)
    one = np.full(ref.shape, np.nan, np.float32)
    _native.conv2d_packed(x, packed, bias, one, strides=strides, activation="relu")
    _native.set_num_threads(threads)
    np.testing.assert_array_equal(out, one)
    same = np.full(ref.shape, np.nan, np.float32)  # the stride-1 conv on the subsampled input: the same bits
    _native.conv2d_packed(sub, packed, bias, same, activation="relu")
    np.testing.assert_array_equal(out, same)


def test_conv2d_pointwise_forced():
    # HETERO_CPU_CONV_PW_TILES=1: every 1x1 stride-1 conv takes the tiles (AVX2's too, and the GEMM's shapes), each
    # POINTWISE_CASES and CONV_CASES shape against float64 on every ISA at 1 and 2 threads, in a fresh process
    import os
    import subprocess
    import sys

    env = dict(os.environ, HETERO_CPU_CONV_PW_TILES="1")
    r = subprocess.run([sys.executable, "-c", _in_this_module("pointwise_forced_checks()")], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert int(r.stdout.split()[-1]) >= 10


def pointwise_forced_checks():
    taken = 0
    before = _native.num_threads()
    for isa in ISAS:
        _native.set_isa(isa)
        for threads in (1, 2):
            _native.set_num_threads(threads)
            for case in POINTWISE_CASES:
                out, ref, algo = _pointwise_outputs(case, "silu")
                taken += algo == "pointwise"
                np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4, err_msg=f"{isa} {case}")
            for case in CONV_CASES:
                *_, strides, pads, dil, group = case
                x, w, bias = _conv_case_inputs(case)
                packed = _native.prepack_conv(w, group)
                ref = ACTS["hard_swish"](_conv_ref(x, w, bias, strides, pads, dil, group))
                out = np.full(ref.shape, np.nan, np.float32)
                _native.conv2d_packed(x, packed, bias, out, strides=strides, pads=pads, dilations=dil,
                                      activation="hard_swish")
                atol = 1e-4 + 1e-5 * float(np.abs(ref).max())
                np.testing.assert_allclose(out, ref, rtol=1e-4, atol=atol, err_msg=f"{isa} {case}")
    _native.set_num_threads(before)
    print(taken)
