"""Steady-state replay and zero-copy views: same results as the interpreter, run after run, shape after shape."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetero
from conftest import backend_ok, make_model

BACKENDS = ["reference"] + (["cpu"] if backend_ok("cpu")[0] else [])


def _view_model():
    # b is a view of a; a's own last reader is the Reshape, so only the view keeps a's memory from being reused by c.
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Reshape", ["a", "shape"], ["b"]),
        helper.make_node("Neg", ["x2"], ["c"]),
        helper.make_node("Exp", ["c"], ["c2"]),
        helper.make_node("Add", ["b", "c2"], ["y"]),
    ]
    return make_model(
        nodes,
        [("x", TensorProto.FLOAT, ["N", 6]), ("x2", TensorProto.FLOAT, ["N", 2, 3])],
        [("y", TensorProto.FLOAT, ["N", 2, 3])],
        [("shape", np.array([-1, 2, 3], np.int64))],
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_views_survive_arena_reuse_and_replay(backend):
    session = hetero.Session(_view_model(), backends=[backend], on_fallback="silent")
    assert any(step.alias for step in session.programs[0].steps)
    rng = np.random.default_rng(0)
    previous = None
    for batch in (2, 2, 2, 2, 3, 3, 3, 2, 2):
        x = rng.normal(size=(batch, 6)).astype(np.float32)
        x2 = rng.normal(size=(batch, 2, 3)).astype(np.float32)
        y = session.run({"x": x, "x2": x2})["y"]
        np.testing.assert_allclose(y, np.maximum(x, 0).reshape(-1, 2, 3) + np.exp(-x2), rtol=1e-6)
        if previous is not None and previous.shape == y.shape:
            assert not np.shares_memory(previous, y)  # outputs are the caller's, never the arena's
        previous = y
    assert session.programs[0].replay is not None and session.programs[0].replay.signature[0][1] == (2, 6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_replay_matches_interpreter(backend, mlp_model):
    model, expected = mlp_model
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    rng = np.random.default_rng(1)
    for _ in range(4):
        x = rng.normal(size=(3, 8)).astype(np.float32)
        np.testing.assert_allclose(session.run({"x": x})["y"], expected(x), rtol=1e-5, atol=1e-6)
    assert session.programs[0].replay is not None


def test_data_dependent_models_do_not_replay():
    model = make_model([helper.make_node("NonZero", ["x"], ["y"])], [("x", TensorProto.FLOAT, [4])],
                       [("y", TensorProto.INT64, [1, None])])
    session = hetero.Session(model, backends=["reference"])
    for values in ([1, 0, 2, 0], [1, 1, 1, 0], [0, 0, 0, 0]):
        y = session.run({"x": np.array(values, np.float32)})["y"]
        np.testing.assert_array_equal(y, np.array(np.nonzero(values)))
    assert session.programs[0].replay is None
