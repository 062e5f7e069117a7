"""The native Gelu(a) * b (binary ops "gelu_mul" / "gelu_tanh_mul", hetero.GeluMul's kernel): the same bits as the
native Gelu then the native Mul on every ISA path, and close to a float64 GELU."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hetero_cpu import _native

_FORMS = [("gelu_mul", "gelu"), ("gelu_tanh_mul", "gelu_tanh")]


def _gelu64(x: np.ndarray, tanh: bool) -> np.ndarray:
    x = x.astype(np.float64)
    if tanh:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


@pytest.mark.parametrize("fused,unary", _FORMS)
@pytest.mark.parametrize("shape,b_shape", [((70, 1024), (70, 1024)), ((3, 37), (3, 37)), ((5, 19), (19,)),
                                            ((4, 21), (1, 1)), ((1, 1), (6, 33))])
def test_gelu_mul_is_gelu_then_mul_bit_for_bit(isa, threads, fused, unary, shape, b_shape):
    rng = np.random.default_rng(sum(shape) + len(fused))
    a = (rng.normal(0, 4, shape)).astype(np.float32)
    a.flat[:4] = [0.0, -0.0, 60.0, -60.0]  # exact zeros, and past the sigmoid's clamp either side
    b = rng.normal(0, 2, b_shape).astype(np.float32)
    out_shape = np.broadcast_shapes(shape, b_shape)
    a_b, b_b = np.broadcast_to(a, out_shape), np.broadcast_to(b, out_shape)  # how the kernel class passes them
    y = np.empty(out_shape, np.float32)
    _native.binary(fused, a_b, b_b, y)
    g = np.empty(shape, np.float32)
    _native.unary(unary, a, g, 0.0, 0.0)
    want = np.empty(out_shape, np.float32)
    _native.binary("mul", np.broadcast_to(g, out_shape), b_b, want)
    np.testing.assert_array_equal(y, want)
    ref = _gelu64(a_b, unary == "gelu_tanh") * b_b.astype(np.float64)
    np.testing.assert_allclose(y, ref, rtol=2e-5, atol=1e-5)


def test_gelu_mul_refuses_integers():
    a = np.ones((2, 3), np.int32)
    with pytest.raises(Exception, match="float32"):
        _native.binary("gelu_tanh_mul", a, a, np.empty_like(a))
