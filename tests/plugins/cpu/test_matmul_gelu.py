"""hetero.MatMulGelu (``ir.passes.fuse_matmul_gelu``): a transformer fc1's GELU in ``gemm_packed``'s epilogue. The
same bits as the product with its bias then the native Gelu as a pass of its own (what the unfused nodes run), on
every ISA path at 1 and 2 threads, and close to a float64 GELU of a float64 product."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetero
from conftest import make_model
from hetero_cpu import _native

# (M, K, N): ViT-S/14's fc1 (257 tokens, 384 -> 1536), one row, odd sizes against the 12-row tiles and 32-column
# panels, a narrow N (gemm_narrow's path on AVX-512)
SHAPES = [(257, 384, 1536), (1, 384, 1536), (13, 32, 17), (37, 64, 100), (50, 96, 8), (3, 5, 33)]


def _gelu64(x: np.ndarray, tanh: bool) -> np.ndarray:
    if tanh:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("act", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_gelu_epilogue_is_the_separate_pass(isa, threads, m, k, n, act, with_bias):
    rng = np.random.default_rng(m * 7 + n + k)
    a = rng.standard_normal((m, k), dtype=np.float32)
    w = (rng.standard_normal((k, n), dtype=np.float32) / np.sqrt(k)).astype(np.float32)
    bias = rng.standard_normal(n, dtype=np.float32) if with_bias else None
    if m > 1:
        a[1, 0] = np.nan  # a NaN row stays NaN through the GELU
    packed = _native.pack_b(w, False, True, "high")
    fused = np.empty((m, n), np.float32)
    _native.gemm_packed(a, packed, fused, 1.0, 0.0, bias, act, 0.0, 0.0)
    want = np.empty((m, n), np.float32)
    _native.gemm_packed(a, packed, want, 1.0, 0.0, bias)
    _native.unary(act, want, want, 0.0, 0.0)
    np.testing.assert_array_equal(fused, want)
    ref = _gelu64(a.astype(np.float64) @ w.astype(np.float64) + (0.0 if bias is None else bias), act == "gelu_tanh")
    ok = ~np.isnan(ref)
    assert np.isnan(fused[~ok]).all()
    # the product's float32 rounding (scaled by |a| @ |w|), then the GELU's own error (a few ulp of its value)
    scale = np.abs(a).astype(np.float64) @ np.abs(w) + (0.0 if bias is None else np.abs(bias))
    err = np.abs(fused[ok] - ref[ok]) - 1e-6 * scale[ok]
    assert (err <= 4e-7 * np.abs(ref[ok]) + 1e-7).all(), err.max()


def _fc1_model(approximate: str, with_bias: bool, m: int, k: int, n: int):
    rng = np.random.default_rng(m + n)
    inits = [("w", (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32))]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"])]
    product = "p"
    if with_bias:
        inits.append(("b", rng.standard_normal(n).astype(np.float32)))
        nodes.append(helper.make_node("Add", ["p", "b"], ["pb"]))
        product = "pb"
    nodes.append(helper.make_node("Gelu", [product], ["y"], approximate=approximate))
    return make_model(nodes, [("x", TensorProto.FLOAT, [m, k])], [("y", TensorProto.FLOAT, None)], inits, opset=20)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("m,k,n", [(257, 384, 1536), (1, 24, 40), (7, 33, 19)])
def test_matmul_gelu_node_is_the_unfused_nodes_bit_for_bit(approximate, with_bias, m, k, n):
    model = _fc1_model(approximate, with_bias, m, k, n)
    x = {"x": np.random.default_rng(m).standard_normal((m, k)).astype(np.float32) * 2}
    session = hetero.Session(model, backends=["cpu"], on_fallback="error")  # runs natively, no fallback
    assert [node.op_type for node in session.graph.nodes] == ["MatMulGelu"]
    assert session.graph.nodes[0].attrs["approximate"] == approximate
    unfused = hetero.Session(model, backends=["cpu"], optimize=False).run(x)["y"]
    got = session.run(x)["y"]
    np.testing.assert_array_equal(got, unfused)
    np.testing.assert_array_equal(session.run(x)["y"], got)  # the replay's bound call: the same bits again
    reference = hetero.Session(model, backends=["reference"]).run(x)["y"]  # the composed references
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5)
