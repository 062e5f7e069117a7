"""Packed weights held as int8 with a per-column scale (``pack_b``'s int8 form, gemm.cpp ``pack_b_panels_s8``).

A float weight matrix that is exactly ``float32(q) * scale[column]`` for int8 q (what constant folding makes of an
int8 initializer's ``Cast + Mul`` or ``DequantizeLinear``) is packed as int8 and turned back into the same floats
inside the GEMM. The results must be the float path's bit for bit (every GEMM route: small M, whole tiles, the
ragged last rows, K past one kc block, ragged column panels, 1 / 2 threads, every ISA), and anything that is not
exactly such a matrix must stay float.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.plugins.cpu.test_native import assert_gemm_close

_native = pytest.importorskip(
    "hetero_cpu._native",
    reason="the hetero-cpu native extension is not built (pip install --no-build-isolation ./plugins/cpu)",
)


def int8_weights(k: int, n: int, seed: int = 0, qmax: int = 127) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(w, q, s): w = float32(q) * s per column, q in [-qmax - 1, qmax] with both extremes present."""
    r = np.random.default_rng(seed)
    q = r.integers(-qmax - 1, qmax + 1, (k, n)).astype(np.int8)
    q[0, :], q[1, :] = qmax, -qmax - 1
    s = (r.random((1, n)) * 0.05 + 1e-3).astype(np.float32)
    return q.astype(np.float32) * s, q, s


def assert_int8_packing_exact(a: np.ndarray, b: np.ndarray, trans_b: bool = False) -> None:
    """b packs as int8, and a @ it gives the float-packed weight's bits."""
    packed = _native.pack_b(b, trans_b=trans_b)
    assert packed.int8
    n = b.shape[0] if trans_b else b.shape[1]
    o8, of = np.empty((a.shape[0], n), np.float32), np.empty((a.shape[0], n), np.float32)
    _native.gemm_packed(a, packed, o8)
    _native.gemm_packed(a, _native.pack_b(b, trans_b=trans_b, int8=False), of)
    np.testing.assert_array_equal(o8, of)


@pytest.mark.parametrize("m", [1, 3, 4, 5, 12, 64, 70, 200])  # 64 / 70: 4 / 10 rows past the 12-row tiles
@pytest.mark.parametrize("k,n", [(384, 384), (300, 100), (600, 33)])  # K past one 256-deep block, ragged panels
def test_int8_panels_same_bits_as_float(isa, threads, m, k, n):
    w, q, s = int8_weights(k, n, seed=k + n)
    a = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
    # precision "high": the fp32 kernels' panels alone (normal adds the bf16x3 tiles to both, tests/plugins/cpu/
    # test_bf16x3.py)
    p8, pf = _native.pack_b(w, precision="high"), _native.pack_b(w, int8=False, precision="high")
    assert p8.int8 and not pf.int8
    assert p8.nbytes < pf.nbytes / 3
    bias = np.random.default_rng(5).standard_normal(n).astype(np.float32)
    for alpha, beta, b in ((1.0, 0.0, None), (0.5, 2.0, bias)):
        c0 = np.random.default_rng(7).standard_normal((m, n)).astype(np.float32)
        o8, of = c0.copy(), c0.copy()
        _native.gemm_packed(a, p8, o8, alpha, beta, b)
        _native.gemm_packed(a, pf, of, alpha, beta, b)
        np.testing.assert_array_equal(o8.view(np.int32), of.view(np.int32))
        ref = alpha * (a.astype(np.float64) @ (q.astype(np.float64) * s.astype(np.float64))) + beta * c0
        assert_gemm_close(o8, ref + (0 if b is None else b), k)


def test_int8_panels_batched_matmul(isa):
    # matmul_packed (a 3-D A against one packed weight) takes the same route.
    w, _, _ = int8_weights(256, 96, seed=3)
    a = np.random.default_rng(4).standard_normal((3, 20, 256)).astype(np.float32)
    o8, of = np.empty((3, 20, 96), np.float32), np.empty((3, 20, 96), np.float32)
    _native.matmul_packed(a, _native.pack_b(w), o8)
    _native.matmul_packed(a, _native.pack_b(w, int8=False), of)
    np.testing.assert_array_equal(o8, of)


def test_int8_scale_found_when_not_the_quantisers():
    # |q| well below 127 (the largest value is 5 * s): the scale found differs from s, the values must not.
    w, _, _ = int8_weights(256, 80, seed=9, qmax=5)
    w[:, 7] = 0.0  # an all-zero column
    w[:, 8] = np.arange(256, dtype=np.float32) % 3 - 1.0  # small integers: scale 1
    a = np.random.default_rng(1).standard_normal((16, 256)).astype(np.float32)
    assert_int8_packing_exact(a, w)


def test_int8_scale_checked_past_the_probe():
    # The scale is chosen on a column's first 32 values and checked on all: a column whose first 32 are multiples of
    # 5 steps (a coarser scale fits them) and a column off the grid at row 100 must come out exact / stay float.
    w, q, s = int8_weights(300, 64, seed=12)
    q[:32, 3] = np.resize(np.array([0, 5, -10, 5], np.int8), 32)
    w[:, 3] = q[:, 3].astype(np.float32) * s[0, 3]
    a = np.random.default_rng(8).standard_normal((20, 300)).astype(np.float32)
    assert_int8_packing_exact(a, w)
    for row, col, value in ((100, 9, np.nextafter(w[100, 9], np.float32(1))), (200, 10, np.nan), (250, 11, np.inf)):
        bad = w.copy()
        bad[row, col] = value
        assert not _native.pack_b(bad).int8


def test_int8_trans_b():
    w, _, _ = int8_weights(200, 120, seed=2)
    a = np.random.default_rng(2).standard_normal((30, 200)).astype(np.float32)
    assert_int8_packing_exact(a, np.ascontiguousarray(w.T), trans_b=True)


@pytest.mark.parametrize("change", ["float", "minus_zero", "nan", "inf", "off_grid", "wide", "small"])
def test_not_int8_stays_float(change, monkeypatch):
    w, _, _ = int8_weights(256, 64, seed=4)
    if change == "float":
        w = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
    elif change == "minus_zero":
        w[10, 3] = -0.0  # float(0) * s is +0: no int8 value gives -0 bit for bit
    elif change == "nan":
        w[5, 5] = np.nan
    elif change == "inf":
        w[5, 5] = np.inf
    elif change == "off_grid":
        w[7, 9] = np.nextafter(w[7, 9], np.float32(1))  # one value one ulp off its column's grid
    elif change == "wide":
        w[:, 2] = np.arange(256, dtype=np.float32) - 100.0  # integers up to 155: not int8 at any scale
    else:
        w = w[:64, :64].copy()  # below the size that gains from fewer bytes
    p = _native.pack_b(w)
    assert not p.int8
    a = np.random.default_rng(3).standard_normal((8, w.shape[0])).astype(np.float32)
    out = np.empty((8, w.shape[1]), np.float32)
    _native.gemm_packed(a, p, out)
    ref = a.astype(np.float64) @ w.astype(np.float64)
    if change in ("nan", "inf"):
        np.testing.assert_array_equal(np.isfinite(out), np.isfinite(ref))
    else:
        assert_gemm_close(out, ref, w.shape[0])
    monkeypatch.setenv("HETERO_CPU_INT8_WEIGHTS", "0")
    assert not _native.pack_b(int8_weights(256, 64)[0]).int8


def test_session_matmul_on_int8_initializer(isa, threads):
    # MatMul(x, Cast(int8 initializer) * scale): constant folding makes the float weight, the cpu MatMul packs it
    # as int8; the outputs against onnxruntime's (the same float products, its own summation order).
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    import hetero

    _, q, s = int8_weights(384, 160, seed=11)
    nodes = [helper.make_node("Cast", ["wq"], ["wf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["wf", "s"], ["w"]),
             helper.make_node("MatMul", ["x", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 70, 384])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 70, 160])],
                              [numpy_helper.from_array(q, "wq"), numpy_helper.from_array(s, "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data = model.SerializeToString()
    x = np.random.default_rng(6).standard_normal((1, 70, 384)).astype(np.float32)
    got = hetero.Session(data, backends=["cpu"], on_fallback="error").run({"x": x})["y"]
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))



@pytest.mark.parametrize("k,n,both", [
    (1536, 384, True),  # MiniLM's FFN down-projection: deep, 2.4 MB as floats -> int8 and float panels
    (1024, 1024, True),  # both edges: K = 1024, 4 MiB of floats
    (1023, 384, False),  # one row short of deep
    (1024, 1025, False),  # one column past 4 MiB
    (384, 1536, False),  # short panels: int8 only
])
@pytest.mark.parametrize("m", [1, 4, 5, 11, 12, 70])  # <= 4: the small-M route; 12 rows up: the float panels
def test_deep_modest_weights_keep_float_panels(isa, threads, k, n, both, m):
    """module.cpp's float_panels_too: K >= 1024 with <= 4 MiB of floats keeps float panels beside the int8 ones,
    which products of 12 rows or more run; every route gives the float-packed product's bits."""
    w, q, s = int8_weights(k, n, seed=k + n)
    packed, pf = _native.pack_b(w, precision="high"), _native.pack_b(w, int8=False, precision="high")
    assert packed.int8
    float_bytes = pf.nbytes
    assert (packed.nbytes > float_bytes) is both
    a = np.random.default_rng(k + m).standard_normal((m, k)).astype(np.float32)
    bias = np.random.default_rng(5).standard_normal(n).astype(np.float32)
    out, of = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
    _native.gemm_packed(a, packed, out, 1.0, 0.0, bias)
    _native.gemm_packed(a, pf, of, 1.0, 0.0, bias)
    np.testing.assert_array_equal(out.view(np.int32), of.view(np.int32))
    ref = a.astype(np.float64) @ (q.astype(np.float64) * s.astype(np.float64)) + bias
    assert_gemm_close(out, ref, k)
    # a 3-D A (matmul_packed) takes the same route
    a3 = np.stack([a, a[::-1].copy()])
    o3 = np.empty((2, m, n), np.float32)
    _native.matmul_packed(a3, packed, o3)
    f3 = np.empty((2, m, n), np.float32)
    _native.matmul_packed(a3, pf, f3)
    np.testing.assert_array_equal(o3.view(np.int32), f3.view(np.int32))


@pytest.mark.parametrize("force,k,n,both", [
    ("1", 384, 1536, True),  # short panels, int8 only by the rule: forced float panels too
    ("1", 64, 384, True),  # shallow and small (still int8: >= kS8MinWeights values)
    ("0", 1536, 384, False),  # deep and modest, float panels too by the rule: forced int8 alone
    ("rule", 1536, 384, True),  # anything else: the rule
    ("rule", 384, 1536, False),
])
@pytest.mark.parametrize("m", [1, 5, 12, 70])  # 12 rows up run the float panels where there are any
def test_int8_float_panels_switch(isa, threads, monkeypatch, force, k, n, both, m):
    """HETERO_CPU_INT8_FLOAT_PANELS=1 / 0 forces float panels beside every int8 weight / none (module.cpp's
    float_panels_too), for measuring one form against the other: the int8 form stays, and every route keeps the
    float-packed product's bits."""
    monkeypatch.setenv("HETERO_CPU_INT8_FLOAT_PANELS", force)
    w, q, s = int8_weights(k, n, seed=k * 3 + n)
    packed, pf = _native.pack_b(w, precision="high"), _native.pack_b(w, int8=False, precision="high")
    assert packed.int8
    assert (packed.nbytes > pf.nbytes) is both
    a = np.random.default_rng(k + m).standard_normal((m, k)).astype(np.float32)
    out, of = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
    _native.gemm_packed(a, packed, out)
    _native.gemm_packed(a, pf, of)
    np.testing.assert_array_equal(out.view(np.int32), of.view(np.int32))
    assert_gemm_close(out, a.astype(np.float64) @ (q.astype(np.float64) * s.astype(np.float64)), k)
