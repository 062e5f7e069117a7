"""The small kernels of a decoder step (SLANet's Loop body) bound by the replay: OneHot (now native-side numpy calls),
ArgMax and Tile (now ``calls``), FusedMatMul binding with a strided weight view (its packed copy is what it reads).
Replayed runs on new data equal numpy, edge values included (negative and out-of-range indices, each axis)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetero
from conftest import make_model
from hetero.contract.tensor import Tensor

pytest.importorskip("hetero_cpu._native", reason="the hetero-cpu native extension is not built")


def _unbound(session: hetero.Session) -> list[str]:
    replay = session.programs[0].replay
    assert replay is not None
    return [c.func.__self__.node.op_type for c in replay.program
            if isinstance(c, functools.partial) and c.func.__name__ == "run"]


def _one_hot_want(idx: np.ndarray, depth: int, values: np.ndarray, axis: int) -> np.ndarray:
    rank = idx.ndim + 1
    axis = axis + rank if axis < 0 else axis
    out = np.full([*idx.shape[:axis], depth, *idx.shape[axis:]], values[0], values.dtype)
    for pos in np.ndindex(*idx.shape):
        k = int(idx[pos])
        k = k + depth if k < 0 else k
        if 0 <= k < depth:
            out[(*pos[:axis], k, *pos[axis:])] = values[1]
    return out


@pytest.mark.parametrize("shape", [(1,), (3,), (2, 3)])
@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("idx_type", [TensorProto.INT64, TensorProto.INT32])
def test_one_hot_argmax_tile_replay_bound(shape, axis, idx_type):
    if axis > len(shape):
        pytest.skip("axis past the output's rank")
    depth, f32 = 5, np.float32
    idx_np = np.int64 if idx_type == TensorProto.INT64 else np.int32
    nodes = [helper.make_node("OneHot", ["idx", "depth", "values"], ["oh"], axis=axis),
             helper.make_node("ArgMax", ["x"], ["am"], axis=1, keepdims=0),
             helper.make_node("Tile", ["x", "reps"], ["t"])]
    values = np.array([-0.5, 2.0], f32)
    inits = [("depth", np.array(depth, np.int64)), ("values", values), ("reps", np.array([2, 3], np.int64))]
    model = make_model(nodes, [("idx", idx_type, list(shape)), ("x", TensorProto.FLOAT, [2, 7])],
                       [("oh", TensorProto.FLOAT, None), ("am", TensorProto.INT64, None),
                        ("t", TensorProto.FLOAT, None)], inits)
    session = hetero.Session(model, backends=["cpu"], on_fallback="error")
    rng = np.random.default_rng(3)
    for run in range(5):  # plan, record, then replays on new data
        idx = rng.integers(-depth - 2, depth + 2, size=shape).astype(idx_np)  # negative and out of range
        x = rng.normal(size=(2, 7)).astype(f32)
        got = session.run({"idx": idx, "x": x})
        np.testing.assert_array_equal(got["oh"], _one_hot_want(idx, depth, values, axis))
        np.testing.assert_array_equal(got["am"], np.argmax(x, axis=1))
        np.testing.assert_array_equal(got["t"], np.tile(x, (2, 3)))
        if run >= 2:
            assert _unbound(session) == []


def test_fused_matmul_binds_with_a_strided_weight_view():
    rng = np.random.default_rng(4)
    w, b = rng.normal(size=(6, 4)).astype(np.float32), rng.normal(size=4).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
                       [("x", TensorProto.FLOAT, [1, 6])], [("y", TensorProto.FLOAT, [1, 4])], [("w", w), ("b", b)])
    session = hetero.Session(model, backends=["cpu"], on_fallback="error")
    session.run({"x": rng.normal(size=(1, 6)).astype(np.float32)})
    kernel = next(k for node, k in session.kernels() if node.op_type == "FusedMatMul")
    x = Tensor.from_numpy(np.zeros((1, 6), np.float32))
    strided = Tensor.from_numpy(np.asfortranarray(w))  # the weight as a transposed view (a Loop body's Transpose)
    out = Tensor.from_numpy(np.zeros((1, 4), np.float32))
    ins = [x, strided] + ([Tensor.from_numpy(b)] if len(kernel.node.inputs) > 2 else [])
    call = kernel.bind(ins, [out])
    assert call is not None
    for _ in range(3):  # the bound call reads x's buffer as it is at each call
        x.buffer[...] = rng.normal(size=(1, 6))
        call()
        np.testing.assert_allclose(out.buffer, x.buffer @ w + b, rtol=1e-5, atol=1e-5)
    # a strided input row cannot be bound (a bound call must see the buffer's new contents)
    wide = Tensor.from_numpy(np.zeros((1, 12), np.float32)[:, ::2])
    assert kernel.bind([wide, *ins[1:]], [out]) is None


@pytest.mark.parametrize("elem", [TensorProto.INT64, TensorProto.INT32, TensorProto.FLOAT])
@pytest.mark.parametrize("delta", [1, 3, -2])
def test_range_of_fed_bounds_replays_and_leaves_on_another_length(elem, delta):
    # Range(s, s + span, delta) with s fed: the bounds follow the data (a guarded step: read at each replayed run);
    # a span that changes the length ends the replay (then interpreted: right results all the same)
    np_type = {TensorProto.INT64: np.int64, TensorProto.INT32: np.int32, TensorProto.FLOAT: np.float32}[elem]
    nodes = [helper.make_node("Add", ["s", "span"], ["limit"]),
             helper.make_node("Range", ["s", "limit", "delta"], ["r"]),
             helper.make_node("Mul", ["r", "two"], ["y"])]
    model = make_model(nodes, [("s", elem, []), ("span", elem, [])], [("y", elem, None)],
                       [("delta", np.array(delta, np_type)), ("two", np.array(2, np_type))])
    session = hetero.Session(model, backends=["cpu"], on_fallback="error")
    program = session.programs[0]
    assert program.replayable and [s.node.op_type for s in program.steps if s.guarded] == ["Range"]
    rng = np.random.default_rng(5)
    for run in range(9):
        start = np.array(rng.integers(-20, 20), np_type) + (np_type(0.5) if elem == TensorProto.FLOAT else 0)
        # longer at runs 6 and 7, then one element (which a missing length check would broadcast into all of them)
        span = np.array((7 if run < 6 else 5 + run if run < 8 else 1) * np.sign(delta), np_type)
        got = session.run({"s": start, "span": span})["y"]
        want = (start + np.arange(len(np.arange(start, start + span, delta))).astype(np_type) * np_type(delta)) * 2
        np.testing.assert_array_equal(got, want.astype(np_type))
        if 2 <= run < 6:
            assert program.replay is not None
