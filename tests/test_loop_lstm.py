"""``passes.keras_loop_lstm``: a Keras LSTM layer that tf2onnx wrote as a Loop (chars2vec's word embedder) runs as one
ONNX LSTM. Built here as tf2onnx writes it (the step counter carried beside the Loop's own, the sequence length and
the weights carried through unchanged, the condition ``k + 1 < T and i < T``), with every gate order; checked against
the unoptimised graph on the numpy reference and against onnxruntime, at 0, 1 and several steps. Near misses (another
recurrent activation, an extra body node, a counter from 1, a fixed trip count, the counter read after the Loop) keep
their Loop."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import hetero
from conftest import backend_ok, make_model

BACKENDS = ["reference"] + (["cpu"] if backend_ok("cpu")[0] else [])
IN, H = 5, 6


def _keras_loop_model(rng: np.random.Generator, order: tuple[int, ...] = (0, 1, 2, 3), recurrent: str = "Sigmoid",
                      extra_node: bool = False, counter_start: int = 0, fixed_trip: int | None = None,
                      read_counter: bool = False, final_states: bool = False, batch: int = 1, opset: int = 17,
                      cond: str = "k"):
    """``x`` [batch, T, IN] -> the last step's h [batch, H] (and the whole sequence ``seq``). ``order[j]``: the
    split part of Keras gate j (i, f, c, o); tf2onnx's own is (0, 1, 2, 3). ``cond``: the body's condition is
    ``k + 1 < T`` ("k"), ``T < T`` ("len": one step) or ``k + 1 < 3`` ("three")."""
    f32, i64 = np.float32, np.int64
    c = helper.make_node
    part = [f"z{k}" for k in range(4)]
    gi, gf, gc, go = (part[order[j]] for j in range(4))
    act = [c(recurrent, [gi], ["i_g"]), c(recurrent, [gf], ["f_g"]), c("Tanh", [gc], ["c_g"]),
           c(recurrent, [go], ["o_g"])]
    h_out = "h_scaled" if extra_node else "h_new"
    body = helper.make_graph(
        [c("MatMul", ["h_in", "R_in"], ["hr"]),
         c("Add", ["k_in", "one"], ["k_out"]),
         c("Gather", ["xt", "k_in"], ["x_k"]),
         c("MatMul", ["x_k", "W_in"], ["xw"]),
         c("Add", ["xw", "hr"], ["z0s"]),
         c("Add", ["z0s", "b_in"], ["z"]),
         c("Split", ["z"], part, axis=1),
         *act,
         c("Mul", ["f_g", "c_in"], ["fc"]),
         c("Mul", ["i_g", "c_g"], ["ig"]),
         c("Add", ["fc", "ig"], ["c_out"]),
         c("Tanh", ["c_out"], ["tc"]),
         c("Mul", ["o_g", "tc"], ["h_new"]),
         *([c("Mul", ["h_new", "two"], ["h_scaled"])] if extra_node else []),
         c("Identity", [h_out], ["h_out"]),
         *([] if cond == "three" else [c("Cast", ["len_in"], ["len_f"], to=TensorProto.FLOAT)]),
         *([] if cond == "len" else [c("Cast", ["k_out"], ["k_f"], to=TensorProto.FLOAT)]),
         c("Cast", ["len"], ["len_f2"], to=TensorProto.FLOAT),
         c("Cast", ["it"], ["it_f"], to=TensorProto.FLOAT),
         c("Less", ["it_f", "len_f2"], ["more_it"]),
         c("Less", ["len_f" if cond == "len" else "k_f", "three_f" if cond == "three" else "len_f"], ["more_k"]),
         c("And", ["more_it", "more_k"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("it", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("k_in", TensorProto.INT32, []),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [None, H]),
         helper.make_tensor_value_info("c_in", TensorProto.FLOAT, [None, H]),
         helper.make_tensor_value_info("len_in", TensorProto.INT32, []),
         helper.make_tensor_value_info("W_in", TensorProto.FLOAT, [IN, 4 * H]),
         helper.make_tensor_value_info("R_in", TensorProto.FLOAT, [H, 4 * H]),
         helper.make_tensor_value_info("b_in", TensorProto.FLOAT, [4 * H])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("k_out", TensorProto.INT32, []),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [None, H]),
         helper.make_tensor_value_info("c_out", TensorProto.FLOAT, [None, H]),
         helper.make_tensor_value_info("len_in", TensorProto.INT32, []),
         helper.make_tensor_value_info("W_in", TensorProto.FLOAT, [IN, 4 * H]),
         helper.make_tensor_value_info("R_in", TensorProto.FLOAT, [H, 4 * H]),
         helper.make_tensor_value_info("b_in", TensorProto.FLOAT, [4 * H]),
         helper.make_tensor_value_info("h_new", TensorProto.FLOAT, [None, H])],
        [numpy_helper.from_array(np.array(1, np.int32), "one"), numpy_helper.from_array(np.array(2, f32), "two"),
         numpy_helper.from_array(np.array(3, f32), "three_f")])
    trip = ["trip_fixed"] if fixed_trip is not None else ["len64"]
    nodes = [
        c("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
        c("Shape", ["xt"], ["shp_t"]), c("Cast", ["shp_t"], ["shp_t32"], to=TensorProto.INT32),
        c("Slice", ["shp_t32", "ax0", "ax1", "ax0"], ["len1"]),
        c("Squeeze", ["len1", "ax0"], ["len"]) if opset >= 13 else c("Squeeze", ["len1"], ["len"], axes=[0]),
        c("Cast", ["len"], ["len_of"], to=TensorProto.FLOAT), c("Less", ["zero_f", "len_of"], ["go0"]),
        c("And", ["go0", "go0"], ["go"]),
        c("Cast", ["len"], ["len64"], to=TensorProto.INT64),
        c("Shape", ["x"], ["shp_x"]), c("Slice", ["shp_x", "ax0", "ax1", "ax0"], ["batch"]),
        c("Concat", ["batch", "hidden"], ["zshape"], axis=0), c("Expand", ["zero_f", "zshape"], ["zeros"]),
        c("Loop", [*trip, "go", "k0", "zeros", "zeros", "len", "W", "R", "b"],
          ["k_last", "h_last", "c_last", "len_last", "W_last", "R_last", "b_last", "seq"], body=body),
        c("Gather", ["seq", "minus_one"], ["y"], axis=0),
        *([c("Cast", ["k_last"], ["steps"], to=TensorProto.INT64)] if read_counter else []),
    ]
    inits = [("ax0", np.array([0], i64)), ("ax1", np.array([1], i64)), ("zero_f", np.array(0.0, f32)),
             ("hidden", np.array([H], i64)), ("k0", np.array(counter_start, np.int32)),
             ("minus_one", np.array(-1, i64)),
             ("W", rng.normal(0, 0.5, (IN, 4 * H)).astype(f32)), ("R", rng.normal(0, 0.5, (H, 4 * H)).astype(f32)),
             ("b", rng.normal(0, 0.5, 4 * H).astype(f32))]
    if fixed_trip is not None:
        inits.append(("trip_fixed", np.array(fixed_trip, i64)))
    outs = [("seq", TensorProto.FLOAT, None)]
    outs += [("y", TensorProto.FLOAT, None)]
    if final_states:
        outs += [("h_last", TensorProto.FLOAT, None), ("c_last", TensorProto.FLOAT, None)]
    if read_counter:
        outs.append(("steps", TensorProto.INT64, None))
    return make_model(nodes, [("x", TensorProto.FLOAT, [batch, None, IN])], outs, inits, opset=opset)


def _check(model, feeds: dict[str, np.ndarray], backend: str, rewritten: bool) -> None:
    import onnxruntime as ort

    plain = hetero.Session(model, backends=["reference"], optimize=False).run(feeds)
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    assert session.rewrites["keras_loop_lstm"] == int(rewritten)
    ops = [n.op_type for n in session.graph.nodes]
    assert ("Loop" in ops) != rewritten and ("LSTM" in ops) == rewritten
    got = session.run(feeds)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for (name, value), ort_value in zip(plain.items(), want, strict=True):
        assert got[name].shape == value.shape == ort_value.shape, name
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(got[name], ort_value, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("order", list(itertools.permutations(range(4)))[::5])
def test_keras_loop_lstm_every_gate_order(backend, order):
    rng = np.random.default_rng(sum(order))
    model = _keras_loop_model(rng, order=order, final_states=True)
    for steps in (1, 2, 7):
        _check(model, {"x": rng.normal(size=(1, steps, IN)).astype(np.float32)}, backend, rewritten=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("batch, opset", [(1, 17), (3, 17), (2, 11)])
def test_keras_loop_lstm_lengths_and_batches(backend, batch, opset):
    """Several lengths in one session, batches of 1 to 3, and opset 11 (Squeeze / Unsqueeze axes as attributes)."""
    rng = np.random.default_rng(batch)
    model = _keras_loop_model(rng, batch=batch, final_states=True, opset=opset)
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    for steps in (1, 12, 3, 1):  # the signature changes between runs (each its own replay)
        x = rng.normal(size=(batch, steps, IN)).astype(np.float32)
        plain = hetero.Session(model, backends=["reference"], optimize=False).run({"x": x})
        for name, value in session.run({"x": x}).items():
            np.testing.assert_allclose(value, plain[name], rtol=1e-5, atol=1e-6, err_msg=name)
    _check(model, {"x": rng.normal(size=(batch, 5, IN)).astype(np.float32)}, backend, rewritten=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_keras_loop_lstm_no_steps(backend):
    """T = 0: the Loop runs no step; the rewritten graph's sequence is empty as well (the model's Gather of the last
    step then fails in both: only the sequence and the final states are compared)."""
    rng = np.random.default_rng(3)
    model = _keras_loop_model(rng, final_states=True)
    model.graph.node.pop()  # the Gather of the last step
    del model.graph.output[1]
    x = np.zeros((1, 0, IN), np.float32)
    plain = hetero.Session(model, backends=["reference"], optimize=False).run({"x": x})
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    assert session.rewrites["keras_loop_lstm"] == 1
    got = session.run({"x": x})
    assert got["seq"].size == plain["seq"].size == 0 and got["seq"].shape[1:] == (1, H)
    for name in ("h_last", "c_last"):
        np.testing.assert_array_equal(got[name], plain[name])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("miss", [dict(recurrent="HardSigmoid"), dict(extra_node=True), dict(counter_start=1),
                                  dict(fixed_trip=3), dict(read_counter=True), dict(order=(0, 1, 2, 2)),
                                  dict(cond="len"), dict(cond="three")])
def test_keras_loop_lstm_near_misses_keep_their_loop(backend, miss):
    rng = np.random.default_rng(7)
    if miss.get("order") == (0, 1, 2, 2):  # two gates from one part: not an LSTM cell
        model = _keras_loop_model(rng, **miss)
        _check(model, {"x": rng.normal(size=(1, 4, IN)).astype(np.float32)}, backend, rewritten=False)
        return
    model = _keras_loop_model(rng, **miss)
    steps = 2 if miss.get("counter_start") == 1 else 4  # from 1, step T would gather past the end
    _check(model, {"x": rng.normal(size=(1, steps, IN)).astype(np.float32)}, backend, rewritten=False)
