"""Steady-state replay and zero-copy views: same results as the interpreter, run after run, shape after shape."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import hetero
from conftest import backend_ok, make_model
from hetero.runtime.executor import KernelProgram

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


def _transpose_model(perm: list[int]):
    # t is a Transpose of a, a view where it moves only axes of size 1; as for _view_model, only the view then keeps
    # a's memory from being reused by c and c2.
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Transpose", ["a"], ["t"], perm=perm),
        helper.make_node("Neg", ["x2"], ["c"]),
        helper.make_node("Exp", ["c"], ["c2"]),
        helper.make_node("Add", ["t", "c2"], ["y"]),
    ]
    return make_model(nodes, [("x", TensorProto.FLOAT, ["A", "B", "C"]), ("x2", TensorProto.FLOAT, ["D", "E", "F"])],
                      [("y", TensorProto.FLOAT, ["D", "E", "F"])])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("perm", [[1, 0, 2], None])
def test_transposes_of_unit_axes_are_views(backend, perm):
    """(T, 1, 4) -> (1, T, 4) moves only an axis of size 1: a view of its input (no call in the replay), which keeps
    the input's memory alive; (T, 2, 4) -> (2, T, 4) and the reversed axes move data: the kernel runs. Same values
    as numpy either way, interpreted and replayed, the shapes alternating."""
    session = hetero.Session(_transpose_model(perm) if perm else _transpose_model([2, 1, 0]), backends=[backend],
                             on_fallback="silent")
    program = session.programs[0]
    step = next(s for s in program.steps if s.node.op_type == "Transpose")
    rng = np.random.default_rng(3)
    order = perm or [2, 1, 0]
    for rows, cols in [(5, 1), (5, 1), (5, 1), (5, 2), (5, 2), (5, 2), (5, 1)]:
        x = rng.normal(size=(rows, cols, 4) if perm else (4, cols, rows)).astype(np.float32)
        want_t = np.maximum(x, 0).transpose(order)
        x2 = rng.normal(size=want_t.shape).astype(np.float32)
        y = session.run({"x": x, "x2": x2})["y"]
        np.testing.assert_allclose(y, want_t + np.exp(-x2), rtol=1e-6)
        if backend == "cpu" and program.replay is None:  # an interpreted run: the view decided by the shapes
            assert step.viewed == (perm is not None and cols == 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_replay_matches_interpreter(backend, mlp_model):
    model, expected = mlp_model
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    rng = np.random.default_rng(1)
    for _ in range(4):
        x = rng.normal(size=(3, 8)).astype(np.float32)
        np.testing.assert_allclose(session.run({"x": x})["y"], expected(x), rtol=1e-5, atol=1e-6)
    assert session.programs[0].replay is not None


def test_a_data_dependent_op_replays_guarded_by_its_output_shape():
    # NonZero is a guarded step (tests/test_replay_data_dependent.py): the replay recorded on 3 non-zeros goes stale
    # on the run with none, which runs interpreted (and records again)
    model = make_model([helper.make_node("NonZero", ["x"], ["y"])], [("x", TensorProto.FLOAT, [4])],
                       [("y", TensorProto.INT64, [1, None])])
    session = hetero.Session(model, backends=["reference"])
    for values in ([1, 0, 2, 0], [1, 1, 1, 0], [1, 0, 1, 1], [0, 0, 0, 0]):
        y = session.run({"x": np.array(values, np.float32)})["y"]
        np.testing.assert_array_equal(y, np.array(np.nonzero(values)))
    program = session.programs[0]
    assert program._current is not None and program._current.stale == 1
    assert program.replay is not None and program.replay.signature == program._current.replay.signature


def _shape_reshape_model():
    # The Reshape's target is computed from x's shape (Shape -> Gather -> Concat), as exported models do: fixed by the
    # input shapes, so the run replays; a shape taken from the data of a feed would not be.
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Concat", ["n", "minus_one"], ["target"], axis=0),
        helper.make_node("Exp", ["x"], ["e"]),
        helper.make_node("Reshape", ["e", "target"], ["flat"]),
        helper.make_node("Mul", ["flat", "flat"], ["y"]),
    ]
    return make_model(
        nodes, [("x", TensorProto.FLOAT, ["N", 2, 3])], [("y", TensorProto.FLOAT, ["N", 6])],
        [("zero", np.array([0], np.int64)), ("minus_one", np.array([-1], np.int64))],
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_shape_derived_value_inputs_replay_and_replan_on_a_new_shape(backend):
    session = hetero.Session(_shape_reshape_model(), backends=[backend], on_fallback="silent")
    program = session.programs[0]
    assert program.replayable
    rng = np.random.default_rng(2)
    replayed = []
    for batch in (2, 2, 2, 5, 5, 5, 2, 2, 2):
        x = rng.normal(size=(batch, 2, 3)).astype(np.float32)
        replayed.append(program.replay is not None and program.replay.signature[0][1] == x.shape)
        y = session.run({"x": x})["y"]
        fresh = hetero.Session(_shape_reshape_model(), backends=[backend], on_fallback="silent").run({"x": x})["y"]
        np.testing.assert_array_equal(y, fresh)  # replayed (or re-planned) == interpreted, bit for bit
        assert y.shape == (batch, 6)
    # the third run of a signature replays; a new shape re-plans (interpreted twice) instead of replaying stale calls;
    # coming back to batch 2 replays its kept plan at once (before that run the current replay is batch 5's)
    assert replayed == [False, False, True, False, False, True, False, True, True]
    if backend == "cpu":  # a host backend: the shape chain is computed once per signature, not replayed
        assert [s.node.op_type for s in program.steps if s.per_signature] == ["Shape", "Gather", "Concat"]
        assert program.replay is not None and _calls(program.replay) == 2  # Exp, Mul (Reshape: a view)


def _calls(replay) -> int:
    """The replay's bound calls, those a backend merged into one (the cpu plugin's steps: their ``fallback``)
    counted one by one."""
    return sum(len(getattr(call, "fallback", [call])) for call in replay.program)


def _position_slice_model():
    # BERT exports slice their position ids with an end taken from the input's shape: Slice(table, 0, [T]). The
    # end's arena slot is free after the Slice, and the next shape-derived value (x's batch size, for the Reshape)
    # is computed into it: a kernel binding the Slice after the run must not read the end from there.
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["t"], axis=0),
        helper.make_node("Unsqueeze", ["t", "zero1"], ["end"]),
        helper.make_node("Slice", ["table", "zero1", "end", "one1"], ["pos"]),
        helper.make_node("Add", ["x", "pos"], ["a"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["a", "target"], ["y"]),
    ]
    return make_model(
        nodes, [("x", TensorProto.FLOAT, ["N", "T"])], [("y", TensorProto.FLOAT, ["N", "T"])],
        [("table", np.arange(16, dtype=np.float32)[None] * 10), ("one", np.array(1, np.int64)),
         ("zero", np.array(0, np.int64)), ("zero1", np.array([0], np.int64)), ("one1", np.array([1], np.int64)),
         ("minus_one", np.array([-1], np.int64))],
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_slice_end_from_the_input_shape_replays_with_its_recorded_value(backend, monkeypatch):
    session = hetero.Session(_position_slice_model(), backends=[backend], on_fallback="silent")
    program = session.programs[0]
    interpreted = []
    run_step = program._run_step
    monkeypatch.setattr(program, "_run_step", lambda step, *args: interpreted.append(step) or run_step(step, *args))
    rng = np.random.default_rng(3)
    for n, t in ((3, 5), (3, 5), (3, 5), (3, 5), (2, 7), (2, 7), (2, 7), (3, 5)):
        x = rng.normal(size=(n, t)).astype(np.float32)
        y = session.run({"x": x})["y"]
        np.testing.assert_array_equal(y, x + np.arange(t, dtype=np.float32) * 10)
    # two interpreted runs per signature (plan, record), then replays: a replay failing at its first call would
    # drop back to the interpreter (right results, but every run interpreted and recorded again)
    assert len(interpreted) == 4 * len(program.steps)


def test_reshape_to_a_fed_shape_does_not_replay():
    model = make_model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                       [("x", TensorProto.FLOAT, [6]), ("shape", TensorProto.INT64, [2])],
                       [("y", TensorProto.FLOAT, [None, None])])
    session = hetero.Session(model, backends=["reference"])
    assert not session.programs[0].replayable
    x = np.arange(6, dtype=np.float32)
    for shape in ([2, 3], [3, 2], [2, 3]):
        assert session.run({"x": x, "shape": np.array(shape, np.int64)})["y"].shape == tuple(shape)


REAL_MODELS = ["magika", "ppocr_mobile_cls", "silero_vad_openvino_16k", "silero_vad_16k_op15", "minilm_l3"]


@pytest.mark.skipif("cpu" not in BACKENDS, reason="the cpu backend (hetero_cpu) is not built")
@pytest.mark.parametrize("name", REAL_MODELS)
def test_real_models_replay_what_the_interpreter_computes(name, monkeypatch):
    from real_models.models import MODELS

    model = MODELS[name]
    path = model.file()
    if path is None:
        pytest.skip(model.install_hint)
    feeds = model.feeds(model)
    session = hetero.Session(str(path), backends=["cpu"], on_fallback="silent")
    interpreted = session.run(feeds)
    session.run(feeds)  # planned and recorded
    programs = [p for p in session.programs if isinstance(p, KernelProgram)]
    assert all(p.replay is not None for p in programs)
    steps: list[object] = []  # a replay that failed would run (and record) interpreted again
    for program in programs:
        run_step = program._run_step
        monkeypatch.setattr(program, "_run_step", lambda step, *a, run=run_step: steps.append(step) or run(step, *a))
    for _ in range(2):
        replayed = session.run(feeds)
        for key, value in interpreted.items():
            np.testing.assert_array_equal(replayed[key], value, err_msg=f"{name}: {key}")
    assert not steps, f"{name}: {len(steps)} interpreted steps after the replay was recorded"


def _if_on_batch_model(then_nodes, then_out, else_nodes, else_out):
    """y = If(x.shape[0] == 1, then, else) + 1: the condition follows from the input's shape."""
    def branch(name, nodes, out):
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])

    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Equal", ["n", "one"], ["single"]),
        helper.make_node("If", ["single"], ["b"], then_branch=branch("then", then_nodes, then_out),
                         else_branch=branch("else", else_nodes, else_out)),
        helper.make_node("Add", ["b", "onef"], ["y"]),
    ]
    return make_model(nodes, [("x", TensorProto.FLOAT, ["N", 4])], [("y", TensorProto.FLOAT, None)],
                      [("zero", np.array(0, np.int64)), ("one", np.array(1, np.int64)),
                       ("onef", np.array(1.0, np.float32))])


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_if_on_input_shapes_replays_and_switches_branch_with_the_shape(backend):
    model = _if_on_batch_model([helper.make_node("Relu", ["x"], ["r"])], "r",
                               [helper.make_node("Neg", ["x"], ["g"])], "g")
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    program = session.programs[0]
    assert program.replayable
    rng = np.random.default_rng(3)
    replayed = []
    for batch in (1, 1, 1, 1, 3, 3, 3, 1):
        x = rng.normal(size=(batch, 4)).astype(np.float32)
        replayed.append(program.replay is not None and program.replay.signature[0][1] == x.shape)
        y = session.run({"x": x})["y"]
        np.testing.assert_array_equal(y, (np.maximum(x, 0) if batch == 1 else -x) + np.float32(1))
    # the current replay before each run: coming back to batch 1 replays its kept plan (checked: the else branch)
    assert replayed == [False, False, True, True, False, False, True, False]


@pytest.mark.parametrize("backend", BACKENDS)
def test_alternating_signatures_each_replay_their_own_kept_plan(backend, monkeypatch):
    # a decode step and k-token verify steps alternating: each signature's plan and replay are kept, so after two
    # runs of each, every run replays (no re-planning at each change of shape), bit for bit the interpreter's result
    session = hetero.Session(_shape_reshape_model(), backends=[backend], on_fallback="silent")
    program = session.programs[0]
    fresh = hetero.Session(_shape_reshape_model(), backends=[backend], on_fallback="silent")
    interpreted_steps = 0
    run_step = program._run_step

    def counting(*args):
        nonlocal interpreted_steps
        interpreted_steps += 1
        return run_step(*args)

    monkeypatch.setattr(program, "_run_step", counting)
    rng = np.random.default_rng(4)
    interpreted = []
    for batch in (1, 4, 1, 4, 3, 1, 3, 4, 1, 3, 4, 1):
        x = rng.normal(size=(batch, 2, 3)).astype(np.float32)
        before = interpreted_steps
        y = session.run({"x": x})["y"]
        np.testing.assert_array_equal(y, fresh.run({"x": x})["y"])
        interpreted.append(interpreted_steps > before)
    # interpreted: the first two runs of each signature (plan, then record); every later run replays
    assert interpreted == [True, True, True, True, True, False, True, False, False, False, False, False]


def _graph(name, nodes, out):
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])


def _if_on_rate_model():
    """silero-vad's pattern: the branch is chosen by a fed integer (``sr == 16000``), and the taken branch holds
    an If of its own (on the same condition, read from the enclosing scope)."""
    inner = helper.make_node("If", ["is16k"], ["m"], then_branch=_graph("in_then", [
        helper.make_node("Mul", ["r", "two"], ["m2"])], "m2"), else_branch=_graph("in_else", [
            helper.make_node("Sub", ["r", "two"], ["s2"])], "s2"))
    then = _graph("then", [helper.make_node("Relu", ["x"], ["r"]), inner, helper.make_node("Add", ["m", "x"], ["t"])],
                  "t")
    other = _graph("else", [helper.make_node("Neg", ["x"], ["g"])], "g")
    nodes = [helper.make_node("Equal", ["sr", "rate"], ["is16k"]),
             helper.make_node("If", ["is16k"], ["y"], then_branch=then, else_branch=other)]
    return make_model(nodes, [("x", TensorProto.FLOAT, [2, 4]), ("sr", TensorProto.INT64, [])],
                      [("y", TensorProto.FLOAT, None)],
                      [("rate", np.array(16000, np.int64)), ("two", np.array(2.0, np.float32))])


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_if_on_a_small_fed_integer_replays_per_value(backend):
    session = hetero.Session(_if_on_rate_model(), backends=[backend], on_fallback="silent")
    program = session.programs[0]
    assert program.replayable and program._keyed == ["sr"]
    rng = np.random.default_rng(6)
    replayed = []
    for rate in (16000, 16000, 16000, 16000, 8000, 8000, 8000, 16000, 8000):
        x = rng.normal(size=(2, 4)).astype(np.float32)
        replayed.append(program.replay is not None and program.replay.signature[-1] == np.int64(rate).tobytes())
        y = session.run({"x": x, "sr": np.array(rate, np.int64)})["y"]
        np.testing.assert_array_equal(y, np.maximum(x, 0) * 2 + x if rate == 16000 else -x)
    assert replayed == [False, False, True, True, False, False, True, False, False]
    if backend == "cpu":  # bound kernels: both levels of If are issued as the replay's own calls
        session.run({"x": x, "sr": np.array(16000, np.int64)})
        replay = program.replay
        assert replay is not None and replay.inlinable and len(replay._bodies) == 1
        assert len(replay._bodies[0]._bodies) == 1


def test_only_integers_that_decide_an_if_join_the_signature():
    # an LLM's past_len-like scalar feeds arithmetic, not a branch: keying it by value would record a replay per step
    nodes = [helper.make_node("Cast", ["pos"], ["posf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "posf"], ["y"])]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [4]), ("pos", TensorProto.INT64, [])],
                       [("y", TensorProto.FLOAT, None)])
    session = hetero.Session(model, backends=["reference"])
    assert session.programs[0]._keyed == []
    big = make_model([helper.make_node("ReduceMax", ["flags"], ["any"], keepdims=0),
                      helper.make_node("Cast", ["any"], ["cond"], to=TensorProto.BOOL),
                      helper.make_node("If", ["cond"], ["y"], then_branch=_graph("t", [
                          helper.make_node("Relu", ["x"], ["r"])], "r"), else_branch=_graph("e", [
                              helper.make_node("Neg", ["x"], ["g"])], "g"))],
                     [("x", TensorProto.FLOAT, [4]), ("flags", TensorProto.INT64, [64])],
                     [("y", TensorProto.FLOAT, None)])
    program = hetero.Session(big, backends=["reference"]).programs[0]
    assert program._keyed == [] and not program.replayable  # 64 values: more than a branch selector


def test_an_if_on_fed_float_data_does_not_replay():
    then = _graph("then", [helper.make_node("Relu", ["x"], ["r"])], "r")
    other = _graph("else", [helper.make_node("Neg", ["x"], ["g"])], "g")
    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["flag"]),
             helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [4])], [("y", TensorProto.FLOAT, None)],
                       [("zero", np.array(0.0, np.float32))])
    session = hetero.Session(model, backends=["reference"])
    assert not session.programs[0].replayable
    for x in ([1, -2, 3, 0], [1, -2, 3, 0], [1, -2, 3, 0], [-5, 1, 1, 1], [2, 2, -1, 0]):
        x = np.array(x, np.float32)
        y = session.run({"x": x})["y"]
        np.testing.assert_array_equal(y, np.maximum(x, 0) if x.sum() > 0 else -x)


def _if_on_data_model(then_nodes, then_out, else_nodes, else_out, shape=(4,)):
    """y = If(sum(x) > 0, then, else) * 2 with both branches declaring a float output of ``shape`` (openWakeWord's
    hey_jarvis: a verifier MLP run when the first score passes 0.5)."""
    def branch(name, nodes, out):
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, shape)])

    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["flag"]),
             helper.make_node("If", ["flag"], ["b"], then_branch=branch("then", then_nodes, then_out),
                              else_branch=branch("else", else_nodes, else_out)),
             helper.make_node("Mul", ["b", "two"], ["y"])]
    return make_model(nodes, [("x", TensorProto.FLOAT, [4])], [("y", TensorProto.FLOAT, None)],
                      [("zero", np.array(0.0, np.float32)), ("two", np.array(2.0, np.float32))])


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_if_on_data_with_same_shape_branches_replays_each_branch(backend, monkeypatch):
    model = _if_on_data_model([helper.make_node("Relu", ["x"], ["r"])], "r",
                              [helper.make_node("Neg", ["x"], ["g"])], "g")
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    program = session.programs[0]
    assert program.replayable
    interpreted = []
    run_step = program._run_step
    monkeypatch.setattr(program, "_run_step", lambda *a: interpreted.append(a[0]) or run_step(*a))
    rows = [[1, -2, 3, 0], [1, -2, 3, 0], [-5, 1, 1, 1], [2, 2, -1, 0], [-1, -1, 0, 0], [4, -1, 0, 0], [-3, 0, 0, 1]]
    for i, values in enumerate(rows):
        x = np.array(values, np.float32)
        before = len(interpreted)
        y = session.run({"x": x})["y"]
        np.testing.assert_array_equal(y, (np.maximum(x, 0) if x.sum() > 0 else -x) * np.float32(2))
        assert (len(interpreted) > before) == (i < 2), f"run {i}"  # planned, recorded, then every run replays


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_if_on_data_whose_branch_breaks_its_declared_shape_falls_back(backend):
    # the else branch declares [4] but returns [2]: the replay's check of the results drops it, the interpreter runs
    model = _if_on_data_model([helper.make_node("Relu", ["x"], ["r"])], "r",
                              [helper.make_node("Slice", ["x", "s0", "s2"], ["g"])], "g")
    model.graph.initializer.extend([numpy_helper.from_array(np.array([0], np.int64), "s0"),
                                    numpy_helper.from_array(np.array([2], np.int64), "s2")])
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    for values in ([1, 2, 3, 0], [1, 2, 3, 0], [1, 2, 3, 0], [-5, 1, 1, 1], [3, 1, 0, 0], [-1, -1, 0, 0]):
        x = np.array(values, np.float32)
        y = session.run({"x": x})["y"]
        np.testing.assert_array_equal(y, (np.maximum(x, 0) if x.sum() > 0 else x[:2]) * np.float32(2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_replayed_branch_whose_result_changes_shape_falls_back_to_the_interpreter(backend):
    # the branch is fixed by the shape, but its result's length is not (NonZero): the replay must not reuse stale
    # buffers of the recorded length
    model = _if_on_batch_model(
        [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Cast", ["nz"], ["r"], to=TensorProto.FLOAT)],
        "r", [helper.make_node("Neg", ["x"], ["g"])], "g")
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    for values in ([1, 0, 2, 0], [1, 0, 2, 0], [1, 0, 2, 0], [1, 1, 1, 0], [0, 0, 0, 0], [3, 0, 0, 3]):
        x = np.array([values], np.float32)
        y = session.run({"x": x})["y"]
        np.testing.assert_array_equal(y, np.array(np.nonzero(x), np.float32) + 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_off_signatures_do_not_push_out_the_replayed_ones(backend, monkeypatch):
    # batched LLM steps: a few recurring signatures (decode steps of 1..4 sequences) replayed, and many shapes run
    # once (steps carrying a prompt's chunk): those go first when the program keeps too many plans
    monkeypatch.setattr("hetero.runtime.executor.MAX_PLANS", 4)
    session = hetero.Session(_shape_reshape_model(), backends=[backend], on_fallback="silent")
    program = session.programs[0]
    rng = np.random.default_rng(5)

    def run(batch: int) -> None:
        session.run({"x": rng.normal(size=(batch, 2, 3)).astype(np.float32)})

    for batch in (1, 2, 1, 2):  # two recurring signatures, replayed from their second run
        run(batch)
    for batch in range(10, 20):  # ten one-off shapes: each replaces the previous one-off, never a replayed plan
        run(batch)
        kept = {key[0][1][0]: plan.replay is not None for key, plan in program._plans.items()}
        assert kept[1] and kept[2] and len(kept) <= 4, kept
    before = len(program._plans)
    run(1)
    assert len(program._plans) == before and program.replay is not None  # replayed at once: not planned again


@pytest.mark.skipif("cpu" not in BACKENDS, reason="needs the cpu plugin (bound kernels)")
def test_small_graph_outputs_are_bound_and_copied_out():
    # y (small) is a graph output also read by a later kernel: the replay computes it into a buffer of its own (so
    # its kernel and the Mul after it bind) and hands each run's caller a copy.
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Mul", ["y", "y"], ["z"])]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [3, 4])],
                       [("y", TensorProto.FLOAT, [3, 4]), ("z", TensorProto.FLOAT, [3, 4])])
    session = hetero.Session(model, backends=["cpu"], on_fallback="error")
    rng = np.random.default_rng(5)
    runs = []
    for _ in range(4):
        x = rng.normal(size=(3, 4)).astype(np.float32)
        runs.append((x, session.run({"x": x})))
    replay = session.programs[0].replay
    assert replay is not None and replay.bound == 2 and _calls(replay) == 2
    for x, out in runs:  # every run's outputs kept their values: none is the replay's buffer
        np.testing.assert_array_equal(out["y"], np.maximum(x, 0))
        np.testing.assert_array_equal(out["z"], np.maximum(x, 0) ** 2)
    assert not np.shares_memory(runs[-1][1]["y"], runs[-2][1]["y"])
