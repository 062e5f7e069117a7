"""The native Relu(a + b) (binary op "add_relu", hetero.AddRelu's kernel): the same bits as the native Add then the
native Relu on every ISA path, NaN and signed zeros included."""

from __future__ import annotations

import numpy as np
import pytest

from hetero_cpu import _native


@pytest.mark.parametrize("shape,b_shape", [((70, 1024), (70, 1024)), ((3, 37), (3, 37)), ((5, 19), (19,)),
                                            ((4, 21), (1, 1)), ((1, 1), (6, 33)), ((2, 64, 7, 7), (2, 64, 7, 7))])
def test_add_relu_is_add_then_relu_bit_for_bit(isa, threads, shape, b_shape):
    rng = np.random.default_rng(sum(shape))
    a = rng.normal(0, 2, shape).astype(np.float32)
    a.flat[:5] = [np.nan, -0.0, 0.0, np.inf, -np.inf]
    b = rng.normal(0, 2, b_shape).astype(np.float32)
    b.flat[-1] = np.nan
    out_shape = np.broadcast_shapes(shape, b_shape)
    a_b, b_b = np.broadcast_to(a, out_shape), np.broadcast_to(b, out_shape)  # how the kernel class passes them
    y = np.empty(out_shape, np.float32)
    _native.binary("add_relu", a_b, b_b, y)
    s = np.empty(out_shape, np.float32)
    _native.binary("add", a_b, b_b, s)
    want = np.empty(out_shape, np.float32)
    _native.unary("relu", s, want, 0.0, 0.0)
    np.testing.assert_array_equal(y, want)
    ref = np.maximum(a_b + b_b, np.float32(0))  # numpy's maximum: NaN passes, as ONNX Relu's
    np.testing.assert_array_equal(y, ref)


def test_add_relu_refuses_integers():
    a = np.ones((2, 3), np.int32)
    with pytest.raises(Exception, match="float32"):
        _native.binary("add_relu", a, a, np.empty_like(a))
