"""Session.run's fast path for repeated calls of one signature (``session._FastRun``): the same results as the checked
path and the numpy formulas, outputs the caller's own, every bad call still answered by the checked path's errors,
shape changes and invalidated replays handled, threads taking turns."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetero
from concurrency import run_in_threads
from conftest import backend_ok, make_model
from hetero.contract.errors import InputError

BACKENDS = ["reference"] + (["cpu"] if backend_ok("cpu")[0] else [])


def _model():
    # y = relu(x @ w + b) (an output read again by z, so the replay keeps it in a buffer of its own), z = y * s
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"]), helper.make_node("Mul", ["y", "s"], ["z"])]
    weights = [("w", rng.normal(size=(6, 5)).astype(np.float32)), ("b", rng.normal(size=(5,)).astype(np.float32))]
    model = make_model(nodes, [("x", TensorProto.FLOAT, ["N", 6]), ("s", TensorProto.FLOAT, [1])],
                       [("y", TensorProto.FLOAT, ["N", 5]), ("z", TensorProto.FLOAT, ["N", 5])], weights)
    w, b = (value for _, value in weights)

    def want(x: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        y = np.maximum(x @ w + b, 0)
        return y, y * s

    return model, want


def _count_checked_runs(monkeypatch, session) -> list[int]:
    """A counter of ``session``'s runs through the checked path (its If bodies' sessions not counted)."""
    calls = [0]
    checked = session._run_tensors

    def counting(feeds, outputs):
        calls[0] += 1
        return checked(feeds, outputs)

    monkeypatch.setattr(session, "_run_tensors", counting)
    return calls


@pytest.mark.parametrize("backend", BACKENDS)
def test_repeated_runs_take_the_fast_path_and_match_the_formulas(backend, monkeypatch):
    model, want = _model()
    session = hetero.Session(model, backends=[backend], on_fallback="error")
    checked = _count_checked_runs(monkeypatch, session)
    rng = np.random.default_rng(2)
    results = []
    for i in range(6):
        x, s = rng.normal(size=(3, 6)).astype(np.float32), np.array([0.5 + i], np.float32)
        out = session.run({"x": x, "s": s})
        assert list(out) == ["y", "z"]
        results.append((x, s, out))
    assert checked[0] == 2  # planned, recorded; then every run is a fast one
    for x, s, out in results:  # earlier runs' outputs kept their values: none is a buffer a later run wrote
        y, z = want(x, s)
        np.testing.assert_allclose(out["y"], y, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out["z"], z, rtol=1e-5, atol=1e-6)
    last, before = results[-1][2], results[-2][2]
    assert not np.shares_memory(last["y"], before["y"]) and not np.shares_memory(last["z"], before["z"])
    last["y"][:] = -1  # the caller's own array: writing it changes nothing the session computes
    x, s, _ = results[0]
    np.testing.assert_allclose(session.run({"x": x, "s": s})["z"], want(x, s)[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_onnxruntime_call_form_on_the_fast_path(backend, monkeypatch):
    model, want = _model()
    session = hetero.Session(model, backends=[backend], on_fallback="error")
    x, s = np.ones((2, 6), np.float32), np.array([2.0], np.float32)
    for _ in range(4):
        y, z = session.run(None, {"x": x, "s": s})
        np.testing.assert_allclose(y, want(x, s)[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(z, want(x, s)[1], rtol=1e-5, atol=1e-6)
    checked = _count_checked_runs(monkeypatch, session)
    for _ in range(2):  # output names in any order, a subset: fast too
        z, y = session.run(["z", "y"], {"x": x, "s": s})
        (z_only,) = session.run(("z",), {"x": x, "s": s})
        picked = session.run({"x": x, "s": s}, outputs=["z"])
        also = session.run({"x": x, "s": s}, ["y"])
        np.testing.assert_allclose(y, want(x, s)[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(also["y"], want(x, s)[0], rtol=1e-5, atol=1e-6)
        for got in (z, z_only, picked["z"]):
            np.testing.assert_allclose(got, want(x, s)[1], rtol=1e-5, atol=1e-6)
        assert list(picked) == ["z"] and list(also) == ["y"]
    assert checked[0] == 0
    with pytest.raises(InputError, match="not an output"):  # an unknown name: the checked path's error
        session.run(["w"], {"x": x, "s": s})
    assert len(session.run(["z", "z"], {"x": x, "s": s})) == 1  # duplicates: as the checked path answers


@pytest.mark.parametrize("backend", BACKENDS)
def test_calls_off_the_signature_take_the_checked_path(backend):
    model, want = _model()
    session = hetero.Session(model, backends=[backend], on_fallback="error")
    x, s = np.ones((2, 6), np.float32), np.array([2.0], np.float32)
    for _ in range(3):
        session.run({"x": x, "s": s})
    assert session._fast is not None
    with pytest.raises(InputError, match="dtype"):
        session.run({"x": x.astype(np.float64), "s": s})
    with pytest.raises(InputError, match="missing input"):
        session.run({"x": x})
    with pytest.raises(InputError, match="unknown input"):
        session.run({"x": x, "s": s, "extra": s})
    with pytest.raises(InputError, match="dim 1 must be 6"):
        session.run({"x": np.ones((2, 7), np.float32), "s": s})
    # a strided view (the fast path copies it like any feed), another batch size: right answers
    wide = np.arange(24, dtype=np.float32).reshape(2, 12)
    for feed in (wide[:, ::2], np.ones((5, 6), np.float32), x):
        got = session.run({"x": feed, "s": s})
        np.testing.assert_allclose(got["z"], want(np.asarray(feed, np.float32), s)[1], rtol=1e-5, atol=1e-5)
    assert session._fast is not None


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_fast_path_follows_the_current_replay(backend, monkeypatch):
    model, want = _model()
    session = hetero.Session(model, backends=[backend], on_fallback="error")
    s = np.array([1.5], np.float32)
    small, large = np.ones((1, 6), np.float32), np.full((4, 6), -0.5, np.float32)
    for x in (small, small, small, large, large, small, large, small):  # each switch leaves the other's fast path
        np.testing.assert_allclose(session.run({"x": x, "s": s})["z"], want(x, s)[1], rtol=1e-5, atol=1e-6)
    checked = _count_checked_runs(monkeypatch, session)
    session.invalidate_replay()  # e.g. a profiler wrapping kernels: the fast path must not issue a forgotten replay
    for _ in range(3):
        np.testing.assert_allclose(session.run({"x": small, "s": s})["z"], want(small, s)[1], rtol=1e-5, atol=1e-6)
    assert checked[0] == 1  # the kept plan records a replay again at once; then fast runs


def test_one_session_from_threads_on_the_fast_path():
    model, want = _model()
    session = hetero.Session(model, backends=["cpu" if "cpu" in BACKENDS else "reference"], on_fallback="error")
    rng = np.random.default_rng(4)
    feeds = [(rng.normal(size=(3, 6)).astype(np.float32), np.array([i + 1.0], np.float32)) for i in range(8)]
    for x, s in feeds[:3]:
        session.run({"x": x, "s": s})

    def work(i: int) -> None:
        for k in range(200):
            x, s = feeds[(i + k) % len(feeds)]
            out = session.run({"x": x, "s": s})
            np.testing.assert_allclose(out["z"], want(x, s)[1], rtol=1e-5, atol=1e-6)

    run_in_threads(work, 4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_if_on_data_whose_result_is_a_graph_output_hands_out_copies(backend):
    # the taken branch's replay writes its result into its own buffer every run: each caller must get a copy
    def branch(name, node, out):
        return helper.make_graph([node], name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, [4])])

    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["flag"]),
             helper.make_node("If", ["flag"], ["y"], then_branch=branch("then", helper.make_node("Relu", ["x"], ["r"]),
                                                                         "r"),
                              else_branch=branch("else", helper.make_node("Neg", ["x"], ["g"]), "g"))]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [4])], [("y", TensorProto.FLOAT, [4])],
                       [("zero", np.array(0.0, np.float32))])
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    rows = [[1, -2, 3, 0], [2, -2, 3, 0], [-5, 1, 1, 1], [3, 2, -1, 0], [-1, -1, 0, 0], [4, -1, 0, 0],
            [-3, 0, 0, 1], [5, 1, 0, 0], [-2, -2, 1, 0]]
    runs = [(x := np.array(r, np.float32), session.run({"x": x})["y"]) for r in rows]
    for x, y in runs:
        np.testing.assert_array_equal(y, np.maximum(x, 0) if x.sum() > 0 else -x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_input_that_selects_a_branch_keys_the_fast_path_by_value(backend, monkeypatch):
    # silero-vad's sample rate: the fast path of one value must not run when the other value is fed
    def branch(name, factor):
        node = helper.make_node("Mul", ["x", factor], ["m" + name])
        return helper.make_graph([node], name, [], [helper.make_tensor_value_info("m" + name, TensorProto.FLOAT, [4])])

    nodes = [helper.make_node("Equal", ["sr", "k16"], ["is16k"]),
             helper.make_node("If", ["is16k"], ["y"], then_branch=branch("then", "two"),
                              else_branch=branch("else", "three"))]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [4]), ("sr", TensorProto.INT64, [])],
                       [("y", TensorProto.FLOAT, [4])],
                       [("k16", np.array(16000, np.int64)), ("two", np.array(2.0, np.float32)),
                        ("three", np.array(3.0, np.float32))])
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    assert session.programs[0].keyed_inputs == ["sr"]
    checked = _count_checked_runs(monkeypatch, session)
    x = np.arange(4, dtype=np.float32)
    rates = [16000, 16000, 16000, 8000, 8000, 8000, 16000, 8000, 16000, 16000]
    for rate in rates:
        got = session.run({"x": x, "sr": np.array(rate, np.int64)})["y"]
        np.testing.assert_array_equal(got, x * (2 if rate == 16000 else 3))
    assert session._fast is not None and session._fast.keyed == (("sr", np.array(16000, np.int64).tobytes()),)
    assert checked[0] < len(rates)  # the runs repeating the last value took the fast path


def test_a_backend_with_queued_work_or_its_own_buffers_keeps_the_checked_path():
    # metal computes in host memory but asynchronously, and allocates its own buffers: the fast path's numpy copies
    # (and the If's result copies) would read results before they are written
    from hetero.contract.backend import Device
    from hetero.contract.tensor import TensorInfo
    from hetero.reference import ReferenceBackend
    from hetero.runtime.replay import _numpy_buffers

    class Queued(ReferenceBackend):
        def synchronize(self) -> None:
            pass

    class OwnBuffers(ReferenceBackend):
        def empty(self, info: TensorInfo):
            return super().empty(info)

    device = Device("numpy", kind="cpu")
    assert _numpy_buffers(ReferenceBackend(device, {}))
    assert not _numpy_buffers(Queued(device, {})) and not _numpy_buffers(OwnBuffers(device, {}))


@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_passed_through_take_the_fast_path(backend, monkeypatch):
    # a Loop body's shape: outputs that are a feed (x) and a weight (w) unchanged, besides a computed one (y)
    rng = np.random.default_rng(3)
    w = rng.normal(size=(6, 5)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", TensorProto.FLOAT, [2, 6])],
                       [("y", TensorProto.FLOAT, [2, 5]), ("x", TensorProto.FLOAT, [2, 6]),
                        ("w", TensorProto.FLOAT, [6, 5])], [("w", w)])
    session = hetero.Session(model, backends=[backend], on_fallback="error")
    checked = _count_checked_runs(monkeypatch, session)
    for i in range(5):
        x = rng.normal(size=(2, 6)).astype(np.float32)
        out = session.run({"x": x})
        assert list(out) == ["y", "x", "w"]
        np.testing.assert_allclose(out["y"], x @ w, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(out["x"], x)
        np.testing.assert_array_equal(out["w"], w)
        y, w_out = session.run(["y", "w"], {"x": x})
        np.testing.assert_allclose(y, x @ w, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(w_out, w)
        if i == 0:
            assert session._fast is not None and set(session._fast.passed) == {"x", "w"}
    assert checked[0] <= 3  # plan, record; then the fast path answers every call


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_one_output_model_gets_a_dict_of_its_own_arrays(backend, monkeypatch):
    # the fast path builds a one-output answer without zip: the name, the values, and no array shared across runs
    model = make_model([helper.make_node("Neg", ["x"], ["y"])], [("x", TensorProto.FLOAT, [1, 3])],
                       [("y", TensorProto.FLOAT, [1, 3])])
    session = hetero.Session(model, backends=[backend], on_fallback="error")
    for _ in range(2):
        session.run({"x": np.zeros((1, 3), np.float32)})
    checked = _count_checked_runs(monkeypatch, session)
    outs = []
    for i in range(4):
        x = np.full((1, 3), i, np.float32)
        got = session.run({"x": x})
        assert list(got) == ["y"]
        np.testing.assert_array_equal(got["y"], -x)
        (listed,) = session.run(None, {"x": x})
        np.testing.assert_array_equal(listed, -x)
        assert not np.shares_memory(listed, got["y"])
        outs.append((i, got["y"]))
    assert checked[0] == 0
    for i, y in outs:  # kept their values: later runs wrote buffers of their own
        np.testing.assert_array_equal(y, np.full((1, 3), -i, np.float32))


def test_copy_calls_read_their_source_at_each_call_for_every_dtype():
    from hetero.runtime.replay import _copy_call

    rng = np.random.default_rng(5)
    cases = [np.float32, np.float16, np.bool_, np.int8, np.int64, np.complex64, "U3", "M8[s]", object,
             [("a", "i4"), ("b", "f8")]]
    for dtype in cases:
        for shape in [(), (1,), (2, 3), (0, 4)]:
            src = np.zeros(shape, dtype)
            dst = np.zeros(shape, dtype)
            copy = _copy_call(dst, src)
            for _ in range(2):  # the same call, new values in the same source buffer: copied again
                flat = src.reshape(-1)
                for i in range(flat.size):
                    flat[i] = np.array(rng.integers(0, 100)).astype(dtype) if dtype is not object else str(i)
                copy()
                np.testing.assert_array_equal(dst, src)
    wide = np.arange(12, dtype=np.float32).reshape(3, 4)
    dst = np.zeros((3, 2), np.float32)
    copy = _copy_call(dst, wide[:, ::2])  # a strided source: np.copyto's, which reads through the strides
    copy()
    np.testing.assert_array_equal(dst, wide[:, ::2])
    assert copy.func is np.copyto  # type: ignore[attr-defined]  # why: _copy_call returns a functools.partial


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_inlined_if_copies_the_values_its_body_reads_at_each_run(backend):
    # an If on a fed integer (silero-vad's sample rate) whose taken branch reads a value computed from the feed: the
    # replay copies that value into the branch's input buffer at each run (byte copies made once on cpu)
    then = helper.make_graph([helper.make_node("Mul", ["r", "two"], ["m"])], "then", [],
                             [helper.make_tensor_value_info("m", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Neg", ["r"], ["g"])], "else", [],
                              [helper.make_tensor_value_info("g", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Equal", ["sr", "rate"], ["is16k"]),
             helper.make_node("If", ["is16k"], ["t"], then_branch=then, else_branch=other),
             helper.make_node("Add", ["t", "x"], ["y"])]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [2, 4]), ("sr", TensorProto.INT64, [])],
                       [("y", TensorProto.FLOAT, None)],
                       [("rate", np.array(16000, np.int64)), ("two", np.array(2.0, np.float32))])
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    rng = np.random.default_rng(7)
    kept = []
    for rate in (16000,) * 5 + (8000,) * 4 + (16000,) * 3:
        x = rng.normal(size=(2, 4)).astype(np.float32)
        y = session.run({"x": x, "sr": np.array(rate, np.int64)})["y"]
        kept.append((x, rate, y))
    for x, rate, y in kept:
        np.testing.assert_allclose(y, (np.maximum(x, 0) * 2 if rate == 16000 else -np.maximum(x, 0)) + x, rtol=1e-6)
    replay = session.programs[0].replay
    if backend == "cpu":
        assert replay is not None and len(replay._bodies) == 1  # the branch inlined
        assert not any(getattr(call, "func", None) is np.copyto for call in replay.program)


def _if_on_data_model():
    """y = (3 relu(x) if sum(x) > 0 else -relu(x)) + x: the If's result read by a later node."""
    def branch(name, node, out):
        return helper.make_graph([node], name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, [4])])

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["flag"]),
             helper.make_node("If", ["flag"], ["t"],
                              then_branch=branch("then", helper.make_node("Mul", ["r", "three"], ["m"]), "m"),
                              else_branch=branch("else", helper.make_node("Neg", ["r"], ["g"]), "g")),
             helper.make_node("Add", ["t", "x"], ["y"])]
    return make_model(nodes, [("x", TensorProto.FLOAT, [4])], [("y", TensorProto.FLOAT, [4])],
                      [("zero", np.array(0.0, np.float32)), ("three", np.array(3.0, np.float32))])


def _if_on_data_want(x: np.ndarray) -> np.ndarray:
    r = np.maximum(x, 0)
    return (r * 3 if x.sum() > 0 else -r) + x


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_if_on_data_read_by_later_nodes_gets_each_runs_branch(backend):
    # oww_hey_jarvis' pattern: the branch follows the data, its bodies read a value computed from the feed (copied
    # into the branch replay's input buffer by calls made once), and here the If's result is read by a later node (a
    # buffer of the replay's own that each run's taken branch is copied into)
    session = hetero.Session(_if_on_data_model(), backends=[backend], on_fallback="silent")
    rng = np.random.default_rng(8)
    signs = [1, 1, 1, 1, -1, -1, -1, 1, -1, 1, 1, -1, -1, 1]
    runs = []
    for sign in signs:
        x = (np.abs(rng.normal(size=4)) * sign).astype(np.float32)
        x[0] = -x[0]  # Relu reads a negative entry too
        runs.append((x, session.run({"x": x})["y"]))
    for x, y in runs:
        np.testing.assert_allclose(y, _if_on_data_want(x), rtol=1e-6)
    if backend == "cpu":  # both branches issued by the calls made once, their results handed out as checked once
        from hetero.runtime.replay import _run_control

        replay = session.programs[0].replay
        assert replay is not None
        (control,) = [call.args[1] for call in replay.program if getattr(call, "func", None) is _run_control]
        assert sorted(control.branches) == [False, True]
        assert all(b.calls is not None and b.hand_out is not None for b in control.branches.values())


def test_an_if_on_data_from_threads_gets_each_runs_branch():
    # the branches' calls and hand-out tables are the session's: runs from two threads take turns on its lock
    session = hetero.Session(_if_on_data_model(), backends=["cpu" if "cpu" in BACKENDS else "reference"],
                             on_fallback="silent")
    rng = np.random.default_rng(9)
    feeds = [(rng.normal(size=4) + (1.0 if i % 2 else -1.0)).astype(np.float32) for i in range(6)]
    for x in feeds:  # both branches recorded and fitted
        session.run({"x": x})
        session.run({"x": x})

    def work(i: int) -> None:
        for k in range(300):
            x = feeds[(i + k) % len(feeds)]
            np.testing.assert_allclose(session.run({"x": x})["y"], _if_on_data_want(x), rtol=1e-6)

    run_in_threads(work, 2)
