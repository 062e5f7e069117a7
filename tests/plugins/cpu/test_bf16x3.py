"""The packed fp32 GEMM's bf16x3 path (precision "normal" on CPUs with AMX-BF16; gemm_bf16x3.hpp).

Each operand x is split hi = bf16(x) (nearest even), lo = bf16(x - hi), and C = A_hi B_hi + A_hi B_lo + A_lo B_hi is
summed in fp32 by TDPBF16PS. Error bound of one output (derivation in docs/onnx-models.md, "bf16x3"):

    |c - a.b| <= (2^-14 + 3 K 2^-24) sum_k |a_k| |b_k|  +  2^-125 (3 K + sum_k |a_k| + |b_k|)

the first term the dropped A_lo B_lo and lo roundings (< 3 * 2^-16 per product) plus the fp32 sum of 3K products;
the second the hardware's flush of bf16 denormals (inputs and lo parts below 2^-126) and of denormal sums. A NaN,
inf or a value too large to split in A or B, or a product that could overflow a partial sum, runs the fp32 kernels
instead: those calls give precision "high"'s bits.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.plugins.cpu.conftest import thread_counts

_native = pytest.importorskip(
    "hetero_cpu._native",
    reason="the hetero-cpu native extension is not built (pip install --no-build-isolation ./plugins/cpu)",
)

amx = pytest.mark.skipif(not _native.bf16x3_available() or "avx512" not in _native.available_isas(),
                         reason="this CPU (or OS) has no AMX-BF16: precision normal runs the fp32 kernels here")

threads = thread_counts(1, 2)

# M, K, N: not tile multiples (16 rows, 32 columns, 32 deep), one tile, K past 1536, M from 5 (the smallest taken)
SHAPES = [(5, 32, 32), (16, 32, 32), (17, 33, 33), (37, 70, 300), (128, 384, 384), (130, 1536, 65), (64, 384, 1536),
          (200, 45, 97)]


def bound(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64))
    k = a.shape[1]
    rel = (2.0**-14 + 3 * k * 2.0**-24) * (a64 @ b64)
    flush = 2.0**-125 * (3 * k + a64.sum(1, keepdims=True) + b64.sum(0, keepdims=True))
    return rel + flush


def run(a: np.ndarray, packed, alpha: float = 1.0, beta: float = 0.0, bias=None, c0=None) -> np.ndarray:
    out = np.zeros((a.shape[0], packed.n), np.float32) if c0 is None else c0.copy()
    _native.gemm_packed(a, packed, out, alpha, beta, bias)
    return out


def pair(b: np.ndarray, **kw):
    return _native.pack_b(b, precision="normal", **kw), _native.pack_b(b, precision="high", **kw)


@amx
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_within_bound_of_float64(m, k, n, threads):
    rng = np.random.default_rng(m * 7 + k + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = (rng.standard_normal((k, n)) * rng.choice([1e-3, 1.0, 50.0], (k, n))).astype(np.float32)
    normal, high = pair(b)
    assert normal.bf16x3 and not high.bf16x3
    got = run(a, normal)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err = np.abs(got - ref)
    assert (err <= bound(a, b)).all(), float((err / bound(a, b)).max())
    # Not fp32's own result: the path did run (the fp32 kernels' error is ~2^-24, bf16x3's ~2^-16 per product).
    assert not np.array_equal(got, run(a, high))


@amx
def test_bound_is_tight_enough_to_catch_a_missing_term():
    # Dropping A_lo B_hi (or B_lo) leaves ~2^-9 relative error per product: 30x over the bound.
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 384)).astype(np.float32)
    b = rng.standard_normal((384, 96)).astype(np.float32)
    u = a.view(np.uint32)
    a_hi = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).view(np.float32)
    two_terms = a_hi.astype(np.float64) @ b.astype(np.float64)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert (np.abs(two_terms - ref) > bound(a, b)).any()
    assert (np.abs(run(a, pair(b)[0]) - ref) <= bound(a, b)).all()


@amx
@pytest.mark.parametrize("m,k,n", [(37, 70, 300), (128, 384, 384), (130, 1536, 65), (16, 384, 1536)])
def test_same_bits_at_1_2_3_threads(m, k, n):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    packed = pair(b)[0]
    before = _native.num_threads()
    try:
        outs = []
        for t in (1, 2, 3):
            _native.set_num_threads(t)
            outs.append(run(a, packed))
    finally:
        _native.set_num_threads(before)
    for o in outs[1:]:
        np.testing.assert_array_equal(o.view(np.int32), outs[0].view(np.int32))


@amx
def test_alpha_beta_bias_and_batched(threads):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((50, 200)).astype(np.float32)
    b = rng.standard_normal((200, 70)).astype(np.float32)
    bias = rng.standard_normal(70).astype(np.float32)
    c0 = rng.standard_normal((50, 70)).astype(np.float32)
    normal = pair(b)[0]
    plain = run(a, normal).astype(np.float64)
    got = run(a, normal, 0.5, 2.0, bias, c0)
    want = 0.5 * plain + 2.0 * c0 + bias  # the epilogue's fp32 roundings on top of the same products
    np.testing.assert_allclose(got, want, rtol=2**-21, atol=2**-21 * np.abs(want).max())
    # matmul_packed (3-D A, one weight) and a transposed weight take the same products.
    a3 = a.reshape(2, 25, 200)
    o3 = np.empty((2, 25, 70), np.float32)
    _native.matmul_packed(a3, normal, o3)
    np.testing.assert_array_equal(o3.reshape(50, 70), run(a, normal))
    np.testing.assert_array_equal(run(a, pair(np.ascontiguousarray(b.T), trans_b=True)[0]), run(a, normal))


@amx
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 3.4e38, 1e38])
@pytest.mark.parametrize("where", ["a", "b"])
def test_nonfinite_huge_run_fp32(bad, where, threads):
    # NaN / inf, a value whose hi would round to inf (3.4e38), or one whose products could overflow a partial sum
    # (1e38 x ~4, K = 64): the fp32 kernels' bits, NaN / inf where fp32 gives them.
    rng = np.random.default_rng(5)
    a = rng.standard_normal((40, 64)).astype(np.float32)
    b = rng.standard_normal((64, 48)).astype(np.float32)
    (a if where == "a" else b)[3, 5] = bad
    normal, high = pair(b)
    assert normal.bf16x3 == (where == "a" or bad == 1e38)  # a weight that cannot be split: fp32 panels alone
    got, want = run(a, normal), run(a, high)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
    assert np.isnan(want).any() or np.isinf(want).any() or bad == 1e38


@amx
def test_large_and_tiny_magnitudes_within_bound():
    # Finite values far from 1 (products stay below the overflow guard) and denormals: the bound's absolute term.
    rng = np.random.default_rng(6)
    a = rng.standard_normal((33, 96)).astype(np.float32)
    b = rng.standard_normal((96, 40)).astype(np.float32)
    a[0] *= np.float32(1e30)
    b[:, 1] *= np.float32(1e-30)
    a[1] = np.float32(1e-40) * rng.standard_normal(96).astype(np.float32)  # denormals
    a[2, ::2] = np.float32(3e-39)
    b[4] = np.float32(1e-42)
    normal = pair(b)[0]
    got = run(a, normal)
    assert np.isfinite(got).all()
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert (np.abs(got - ref) <= bound(a, b)).all()
    assert (got[1] == 0).all()  # a row of denormals: flushed (fp32 gives ~1e-39; the bound's absolute term)


@pytest.mark.parametrize("m,k,n", [(40, 1, 50), (40, 50, 1), (4, 384, 384), (1, 64, 64), (20, 31, 64)])
def test_shapes_left_to_fp32_give_its_bits(m, k, n, threads):
    # K or N below one tile's 32, M <= 4 (the GEMV / small-M path): precision normal is the fp32 kernels there.
    rng = np.random.default_rng(m + k + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    normal, high = pair(b)
    np.testing.assert_array_equal(run(a, normal).view(np.int32), run(a, high).view(np.int32))


@pytest.mark.parametrize("m,k,n", [(37, 70, 300), (128, 384, 384)])
def test_high_is_the_fp32_kernels(isa, m, k, n, threads):
    # precision "high": pack_b's fp32 panels alone, the same bits as the unpacked GEMM (which packs B per call).
    rng = np.random.default_rng(9)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    high = _native.pack_b(b, precision="high")
    assert not high.bf16x3
    want = np.empty((m, n), np.float32)
    _native.gemm(a, b, want)
    np.testing.assert_array_equal(run(a, high).view(np.int32), want.view(np.int32))


def test_precision_setting():
    before = _native.precision()
    try:
        _native.set_precision("high")
        assert _native.precision() == "high"
        assert not _native.pack_b(np.ones((64, 64), np.float32)).bf16x3
        _native.set_precision("normal")
        assert _native.pack_b(np.ones((64, 64), np.float32)).bf16x3 == _native.bf16x3_available()
        with pytest.raises(ValueError, match="expected \"high\" or \"normal\""):
            _native.set_precision("low")
        with pytest.raises(ValueError, match="precision"):
            _native.pack_b(np.ones((64, 64), np.float32), precision="fast")
    finally:
        _native.set_precision(before)


@pytest.mark.parametrize("env,want", [("high", "high"), ("normal", "normal"), ("", "normal")])
def test_precision_environment(env, want):
    code = "from hetero_cpu import _native; print(_native.precision())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "HETERO_CPU_PRECISION": env},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == want


def test_precision_environment_bad_value():
    code = "import numpy as np; from hetero_cpu import _native; _native.pack_b(np.ones((64, 64), np.float32))"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "HETERO_CPU_PRECISION": "low"},
                         capture_output=True, text=True)
    assert out.returncode != 0 and "HETERO_CPU_PRECISION=low" in out.stderr


def _matmul_gemm_model() -> bytes:
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(12)
    w1 = rng.standard_normal((96, 64)).astype(np.float32)
    w2 = rng.standard_normal((48, 64)).astype(np.float32)  # Gemm with transB
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Gemm", ["h", "w2"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [40, 96])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [40, 48])],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_session_precision_option():
    import hetero
    from hetero.contract import HeteroError

    data = _matmul_gemm_model()
    import onnx
    from onnx import numpy_helper

    x = np.random.default_rng(13).standard_normal((40, 96)).astype(np.float32)
    run_with = {p: hetero.Session(data, backends=["cpu"], on_fallback="error", options={"precision": p}).run(
        {"x": x})["y"] for p in ("high", "normal")}
    w1, w2 = (numpy_helper.to_array(t) for t in onnx.load_from_string(data).graph.initializer)
    h = (x.astype(np.float64) @ w1).astype(np.float32)
    ref = h.astype(np.float64) @ w2.T.astype(np.float64)
    # high: the fp32 kernels (tight); normal: within bf16x3's bound of the second product (and of the first, carried)
    np.testing.assert_allclose(run_with["high"], ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    np.testing.assert_allclose(run_with["normal"], ref, rtol=1e-3, atol=2e-4 * np.abs(ref).max())
    assert np.array_equal(run_with["high"], run_with["normal"]) != _native.bf16x3_available()
    with pytest.raises(HeteroError, match="precision='fast'"):
        hetero.Session(data, backends=["cpu"], options={"precision": "fast"})
