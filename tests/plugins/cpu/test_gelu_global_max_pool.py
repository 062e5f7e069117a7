"""hetero.GeluGlobalMaxPool on the cpu plugin: the native per-row min / max ("global_min_max") against numpy, the
premise of the kernel (the native GELU falls then rises, so a row's largest GELU is that of its min or its max) on a
dense grid, and the fused node against the two ops run apart and a float64 GELU, on every ISA path at 1 and 2
threads."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetero
from hetero_cpu import _native

_GELUS = {"none": "gelu", "tanh": "gelu_tanh"}


def _gelu64(x: np.ndarray, approximate: str) -> np.ndarray:
    x = x.astype(np.float64)
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


@pytest.mark.parametrize("rows,n", [(512, 512), (7, 37), (3, 5), (1, 1), (64, 17), (2, 16), (5, 48)])
def test_global_min_max_is_numpys_min_and_max(isa, threads, rows, n):
    rng = np.random.default_rng(rows * 1000 + n)
    x = rng.normal(0, 3, (rows, n)).astype(np.float32)
    if rows >= 3:
        x[1, n // 2] = np.nan  # a NaN in a vector's lanes (or the tail) propagates to both ends of its row
        x[2, -1] = np.inf
        x[2, 0] = -np.inf
    lo, hi = np.empty(rows, np.float32), np.empty(rows, np.float32)
    _native.global_min_max(x, lo, hi)
    np.testing.assert_array_equal(lo, x.min(axis=1))
    np.testing.assert_array_equal(hi, x.max(axis=1))


def test_global_min_max_refuses_rows_that_do_not_divide_x():
    x = np.zeros((3, 5), np.float32)
    with pytest.raises(Exception, match="global_min_max"):
        _native.global_min_max(x, np.empty(4, np.float32), np.empty(4, np.float32))


# How far the native GELU's float rounding lets it rise before its minimum or fall after it (measured on every float
# of [-1, -0.5] and [0.5, 1] and a grid of [-12, 12]: 1.5e-7 at most, around its minimum -0.17; none from 0.5 on).
# The fused node's result is below the two ops' by at most this; against float64 both keep the GELU's own bound.
_WIGGLE = 2e-7


def _floats(lo: float, hi: float) -> np.ndarray:
    """Every float32 of [lo, hi] (lo, hi of one sign), ascending."""
    a, b = sorted(np.float32([lo, hi]).view(np.int32))
    return np.sort(np.arange(a, b + 1, dtype=np.int32).view(np.float32))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_native_gelu_falls_then_rises(isa, approximate):
    """The kernel's premise, for the native GELU itself (not only the exact function)."""
    grid = np.linspace(-12, 12, 1_200_001, dtype=np.float32)
    x = np.unique(np.concatenate([_floats(-1, -0.5), _floats(0.5, 1), grid,
                                  np.float32([-60, -30, -20, -15, 15, 20, 30, 60])]))  # sorted
    g = np.empty_like(x)
    _native.unary(_GELUS[approximate], x, g, 0.0, 0.0)
    low = int(np.argmin(g))
    assert -0.77 < x[low] < -0.73
    before, after = g[: low + 1], g[low:]
    assert (before - np.minimum.accumulate(before)).max() <= _WIGGLE  # rises by no more before its minimum ...
    assert (np.maximum.accumulate(after) - after).max() <= _WIGGLE  # ... nor falls after it
    assert np.all(np.diff(g[x >= 0.5]) >= 0)  # a channel whose max pool is >= 0.5 gets the two ops' bits


def _gelu_pool_model(shape: list[int], approximate: str, extra_reader: bool = False):
    """A conv's GELU read by a GlobalMaxPool (magika's tail; a Neg stands in for the conv)."""
    nodes = [helper.make_node("Neg", ["x"], ["r"]),
             helper.make_node("Gelu", ["r"], ["g"], approximate=approximate),
             helper.make_node("GlobalMaxPool", ["g"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:
        nodes.append(helper.make_node("Abs", ["g"], ["z"]))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "gelu_pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", [[1, 512, 512, 1], [2, 7, 5, 3], [1, 3, 1, 1], [2, 33, 19]])
def test_gelu_then_global_max_pool_is_one_native_node(isa, threads, approximate, shape):
    model = _gelu_pool_model(shape, approximate)
    rng = np.random.default_rng(len(shape) + shape[1])
    x = rng.normal(0, 2, shape).astype(np.float32)
    x[0, 0] = -np.abs(x[0, 0]) - 0.5  # a channel the Neg makes >= 0.5: only the GELU's rise (its max's GELU) ...
    x[-1, -1] = np.abs(x[-1, -1]) + 2  # ... and one it makes <= -2: only its fall (the GELU of its min)
    nan_at = (0, 1) + (0,) * (x.ndim - 2)
    x[nan_at] = np.nan
    session = hetero.Session(model, backends=["cpu"], on_fallback="error")
    assert session.rewrites["fuse_gelu_global_max_pool"] == 1
    assert [n.op_type for n in session.graph.nodes] == ["Neg", "GeluGlobalMaxPool"]
    y = session.run({"x": x})["y"]
    unfused = hetero.Session(model, backends=["cpu"], optimize=False).run({"x": x})["y"]
    np.testing.assert_allclose(y, unfused, rtol=0, atol=_WIGGLE)
    risen = unfused >= 0.5
    np.testing.assert_array_equal(y[risen], unfused[risen])
    ref = _gelu64(-x, approximate).max(axis=tuple(range(2, x.ndim)), keepdims=True)
    assert np.isnan(y[0, 1]).all() and np.isnan(y).sum() == 1  # the NaN's channel alone
    np.testing.assert_allclose(y, ref, rtol=2e-5, atol=1e-5)


def test_gelu_read_elsewhere_keeps_its_pass():
    model = _gelu_pool_model([1, 4, 6, 1], "tanh", extra_reader=True)
    session = hetero.Session(model, backends=["cpu"], on_fallback="error")
    assert session.rewrites["fuse_gelu_global_max_pool"] == 0
    assert [n.op_type for n in session.graph.nodes] == ["Neg", "Gelu", "GlobalMaxPool", "Abs"]
