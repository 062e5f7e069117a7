"""A Loop's body calls as a series (``Session.run_step``: values it passes again unchanged -- carried weights, the
enclosing graph's values -- are not copied into the body replay's inputs again) and a segment that replays around a
Loop (``KernelProgram._replayable_loop``: the Loop runs through ``run_dynamic`` inside the replay, results of other
shapes than recorded end the replay). Against onnxruntime and the reference backend, with a stop condition that
follows the data (0, 1, several iterations, the trip count reached), carried state of several dtypes, scan outputs
of several shapes (one a reshape of a carried input), each session called through a sequence of cases twice."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_loop_replay import COUNTER_DOMAIN  # its stateful CountCalls op (registered when imported)

import hetero
from conftest import backend_ok, make_model

BACKENDS = ["reference"] + (["cpu"] if backend_ok("cpu")[0] else [])
F32, I64 = np.float32, np.int64


def _const(name: str, value: np.ndarray):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value))


def _loop_model(extra_body_nodes=(), extra_opsets=()):
    """Loop(M, cond0) over s [2, 3] float32 (tanh(s @ w + s @ B)), w [3, 3] written back unchanged, n [1] int64,
    flag [2] bool (negated), d [2] float64 (+0.5); the condition ``i + 1 < stop_at`` (a graph input); scan outputs
    s' [2, 3], the counter as float32 [], s reshaped to [6] and flag' [2]. ``B`` is computed in the parent graph (a
    value of the enclosing scope, not a constant)."""
    c = helper.make_node
    body = helper.make_graph(
        [_const("one", np.array([1], I64)), _const("one_s", np.array(1, I64)), _const("half", np.array(0.5)),
         _const("six", np.array([6], I64)),
         c("MatMul", ["s_in", "w_in"], ["sw"]), c("MatMul", ["s_in", "B"], ["sb"]), c("Add", ["sw", "sb"], ["ss"]),
         c("Tanh", ["ss"], ["s_out"]),
         c("Add", ["n_in", "one"], ["n_out"]), c("Not", ["flag_in"], ["flag_out"]),
         c("Add", ["d_in", "half"], ["d_out"]),
         c("Add", ["i", "one_s"], ["i1"]), c("Less", ["i1", "stop_at"], ["cond_out"]),
         c("Cast", ["i"], ["i_f"], to=TensorProto.FLOAT), c("Reshape", ["s_in", "six"], ["s_flat"]),
         *extra_body_nodes],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("w_in", TensorProto.FLOAT, [3, 3]),
         helper.make_tensor_value_info("n_in", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("flag_in", TensorProto.BOOL, [2]),
         helper.make_tensor_value_info("d_in", TensorProto.DOUBLE, [2])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("w_in", TensorProto.FLOAT, [3, 3]),  # written back unchanged
         helper.make_tensor_value_info("n_out", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("flag_out", TensorProto.BOOL, [2]),
         helper.make_tensor_value_info("d_out", TensorProto.DOUBLE, [2]),
         helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("i_f", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("s_flat", TensorProto.FLOAT, [6]),
         helper.make_tensor_value_info("flag_out", TensorProto.BOOL, [2])])
    outs = ["s", "w", "n", "flag", "d", "scan_s", "scan_i", "scan_flat", "scan_flag"]
    nodes = [helper.make_node("Relu", ["bx"], ["B"]),
             helper.make_node("Loop", ["M", "cond0", "s0", "w0", "n0", "flag0", "d0"], outs, body=body)]
    types = {"s": TensorProto.FLOAT, "w": TensorProto.FLOAT, "n": TensorProto.INT64, "flag": TensorProto.BOOL,
             "d": TensorProto.DOUBLE, "scan_s": TensorProto.FLOAT, "scan_i": TensorProto.FLOAT,
             "scan_flat": TensorProto.FLOAT, "scan_flag": TensorProto.BOOL}
    model = make_model(nodes, [("M", TensorProto.INT64, []), ("cond0", TensorProto.BOOL, []),
                               ("stop_at", TensorProto.INT64, []), ("bx", TensorProto.FLOAT, [3, 3]),
                               ("s0", TensorProto.FLOAT, [2, 3]), ("w0", TensorProto.FLOAT, [3, 3]),
                               ("n0", TensorProto.INT64, [1]), ("flag0", TensorProto.BOOL, [2]),
                               ("d0", TensorProto.DOUBLE, [2])],
                       [(name, types[name], None) for name in outs])
    for domain in extra_opsets:
        model.opset_import.append(helper.make_opsetid(domain, 1))
    return model, outs


# (trip count, initial condition, stop_at): 0 iterations (condition false; no trip), 1, 3, the trip count reached
CASES = [(5, False, 3), (5, True, 1), (5, True, 3), (4, True, 100), (0, True, 3), (6, True, 3), (2, True, 100)]


def _feeds(rng: np.random.Generator, trip: int, cond: bool, stop_at: int) -> dict[str, np.ndarray]:
    return {"M": np.array(trip, I64), "cond0": np.array(cond), "stop_at": np.array(stop_at, I64),
            "bx": rng.normal(size=(3, 3)).astype(F32), "s0": rng.normal(size=(2, 3)).astype(F32),
            "w0": rng.normal(size=(3, 3)).astype(F32), "n0": np.array([7], I64),
            "flag0": np.array([True, False]), "d0": np.array([0.25, -1.0])}


def _iterations(trip: int, cond: bool, stop_at: int) -> int:
    return 0 if not cond else min(trip, max(stop_at, 1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_loop_with_a_data_dependent_stop_against_onnxruntime_and_reference(backend):
    import onnxruntime as ort

    model, outs = _loop_model()
    want_session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    reference = hetero.Session(model, backends=["reference"], on_fallback="silent")
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    rng = np.random.default_rng(5)
    cases = [_feeds(rng, *case) for case in CASES]
    for sweep in range(2):  # the second sweep runs on the replays the first one recorded: no stale buffers
        for case, feeds in zip(CASES, cases, strict=True):
            steps = _iterations(*case)
            got = session.run({k: v.copy() for k, v in feeds.items()})
            ref = reference.run(feeds)
            assert got["scan_s"].shape == (steps, 2, 3) and got["scan_flat"].shape == (steps, 6), (case, sweep)
            if steps:  # onnxruntime's scan outputs of no iteration have no shape to compare
                for name, value in zip(outs, want_session.run(outs, feeds), strict=True):
                    assert got[name].dtype == value.dtype, name
                    np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=f"{name} {case}")
            for name in outs:
                assert got[name].shape == ref[name].shape and got[name].dtype == ref[name].dtype, (name, case)
                np.testing.assert_allclose(got[name], ref[name], rtol=1e-5, atol=1e-6, err_msg=f"{name} {case}")
            # the state after the loop, computed here
            assert got["n"].tolist() == [7 + steps]
            assert got["flag"].tolist() == ([True, False] if steps % 2 == 0 else [False, True])
            np.testing.assert_array_equal(got["w"], feeds["w0"])
            np.testing.assert_array_equal(got["scan_i"], np.arange(steps, dtype=F32))
            if steps:  # each step's reshaped input is the state before that step
                np.testing.assert_array_equal(got["scan_flat"][0], feeds["s0"].reshape(6))
                np.testing.assert_allclose(got["scan_flat"][1:], got["scan_s"][:-1].reshape(steps - 1, 6), atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_segment_replays_around_its_loop(backend):
    model, outs = _loop_model()
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    reference = hetero.Session(model, backends=["reference"], on_fallback="silent")
    rng = np.random.default_rng(6)
    feeds = _feeds(rng, 6, True, 4)
    for _ in range(3):
        got = session.run(feeds)
    programs = [p for p in session.programs if any(s.node.op_type == "Loop" for s in getattr(p, "steps", []))]
    if backend == "cpu":  # the reference backend's programs may differ; cpu replays the segment around the Loop
        assert programs and all(p.replayable and p.replay is not None for p in programs)
    want = reference.run(feeds)
    for name in outs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    # another step count: the scan outputs change shape, the replay is dropped and the segment interpreted
    other = dict(feeds, stop_at=np.array(2, I64))
    for _ in range(2):
        got = session.run(other)
        want = reference.run(other)
        for name in outs:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    got = session.run(feeds)
    want = reference.run(feeds)
    for name in outs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_replay_around_a_loop_whose_body_holds_state(backend):
    # a replay that the Loop's results end runs the segment again, the Loop included: a stateful op would count twice
    counted = helper.make_node("CountCalls", ["s_out"], ["s_counted"], domain=COUNTER_DOMAIN)
    model, _ = _loop_model([counted], [COUNTER_DOMAIN])
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    for program in session.programs:
        if any(s.node.op_type == "Loop" for s in getattr(program, "steps", [])):
            assert not program.replayable


@pytest.mark.parametrize("backend", BACKENDS)
def test_run_step_copies_again_after_another_run(backend):
    # y = x @ w: a series passing the same arrays skips their copies; a run between (other values in the replay's
    # input buffers) or another series copies again
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                       [("x", TensorProto.FLOAT, [2, 3]), ("w", TensorProto.FLOAT, [3, 4])],
                       [("y", TensorProto.FLOAT, None)])
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    rng = np.random.default_rng(7)
    x, w = rng.normal(size=(2, 3)).astype(F32), rng.normal(size=(3, 4)).astype(F32)
    w2 = rng.normal(size=(3, 4)).astype(F32)
    series, other = object(), object()
    for _ in range(3):
        np.testing.assert_allclose(session.run_step({"x": x, "w": w}, series)["y"], x @ w, rtol=1e-5)
    np.testing.assert_allclose(session.run({"x": x, "w": w2})["y"], x @ w2, rtol=1e-5)
    np.testing.assert_allclose(session.run_step({"x": x, "w": w}, series)["y"], x @ w, rtol=1e-5)
    np.testing.assert_allclose(session.run_step({"x": x, "w": w2}, other)["y"], x @ w2, rtol=1e-5)
    np.testing.assert_allclose(session.run_step({"x": x, "w": w}, series)["y"], x @ w, rtol=1e-5)
    x2 = x[::-1].copy()  # a new array in the series: copied
    np.testing.assert_allclose(session.run_step({"x": x2, "w": w}, series)["y"], x2 @ w, rtol=1e-5)



@pytest.mark.parametrize("backend", BACKENDS)
def test_run_step_series_beside_another_threads_run(backend, monkeypatch):
    # another thread's plain run made while a series step runs must end the series' savings: it overwrites the input
    # buffers after the step, so the next step copies w again (a check of what the buffers hold made outside the
    # session's lock let that next step read the other thread's w)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                       [("x", TensorProto.FLOAT, [2, 3]), ("w", TensorProto.FLOAT, [3, 4])],
                       [("y", TensorProto.FLOAT, None)])
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    rng = np.random.default_rng(11)
    x = rng.normal(size=(2, 3)).astype(F32)
    w, other_w = rng.normal(size=(3, 4)).astype(F32), rng.normal(size=(3, 4)).astype(F32)
    token = object()
    for _ in range(2):  # a series under way: w held by the replay's input buffer
        np.testing.assert_allclose(session.run_step({"x": x, "w": w}, token)["y"], x @ w, rtol=1e-5)
    (program,) = session.programs
    run_arrays = program.run_arrays
    other = threading.Thread(target=session.run, args=({"x": x, "w": other_w},))

    def run_arrays_beside_another_run(*args):
        if other.ident is None:  # the series step: start the other thread's run and let it go as far as it can
            other.start()
            other.join(0.2)  # it waits for the session's lock, then runs after this step
        return run_arrays(*args)

    monkeypatch.setattr(program, "run_arrays", run_arrays_beside_another_run)
    np.testing.assert_allclose(session.run_step({"x": x, "w": w}, token)["y"], x @ w, rtol=1e-5)
    other.join()
    np.testing.assert_allclose(session.run_step({"x": x, "w": w}, token)["y"], x @ w, rtol=1e-5)
