"""A Loop body whose value inputs follow the step counter (SLANet's decoder: a Slice starting at the counter, a Range
from it, OneHot of the last step's argmax) replays: those steps' kernels read the values at each run and end the
replay where they would give other shapes than recorded (``KernelProgram._guardable``). Results against
onnxruntime, including a body whose slices grow every step (which must never replay with stale shapes)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import hetero
from conftest import backend_ok, make_model
from hetero.ops import OpSchema, register
from hetero.ops.shapes import same_as_input

BACKENDS = ["reference"] + (["cpu"] if backend_ok("cpu")[0] else [])
ROWS = 9


def _const(name: str, value: np.ndarray):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value))


def _decoder_model(rng: np.random.Generator, step_count: int):
    """An attention-free SLANet decoder in small: a carried counter ``k`` (not the Loop's own), the row of a carried
    buffer at ``[k, min(k + 1, rows))`` updated and scattered back at the indices ``Range(k, min(k + 1, rows))``, the
    state fed the previous step's argmax as OneHot, a scan output of the state and of ``Range(i, i + 1)`` of the
    iteration number, one carried weight and one carried feature map written back unchanged. Past ``rows`` steps the
    slice and the range are empty: the shapes change at the tail."""
    f32, i64 = np.float32, np.int64
    c = helper.make_node
    body = helper.make_graph(
        [_const("depth", np.array(5, i64)), _const("onoff", np.array([0.0, 1.0], f32)),
         _const("one", np.array([1], i64)), _const("ax1", np.array([1], i64)), _const("step1", np.array(1, i64)),
         c("OneHot", ["cls_in", "depth", "onoff"], ["oh"]),  # [1, 5]
         c("Concat", ["h_in", "oh"], ["hc"], axis=1),  # [1, 9]
         c("MatMul", ["hc", "W"], ["hw"]),
         c("ReduceMean", ["feat_in"], ["fm"], axes=[1], keepdims=0),  # [1, 4]
         c("Add", ["hw", "fm"], ["hf"]),
         c("Tanh", ["hf"], ["h_out"]),
         c("MatMul", ["h_out", "wc_in"], ["logits"]),  # [1, 5]
         c("ArgMax", ["logits"], ["cls_out"], axis=1, keepdims=0),  # [1] int64
         c("Add", ["k_in", "one"], ["k_out"]),
         c("Shape", ["buf_in"], ["bshape"]), c("Gather", ["bshape", "one"], ["rows"]),
         c("Min", ["k_out", "rows"], ["end"]),
         c("Slice", ["buf_in", "k_in", "end", "ax1"], ["row"]),  # [1, 1, 3], [1, 0, 3] past the rows
         c("Shape", ["row"], ["rshape"]),
         c("MatMul", ["h_out", "Wr"], ["upd"]), c("Unsqueeze", ["upd", "ax1"], ["upd3"]),
         c("Expand", ["upd3", "rshape"], ["upde"]),
         c("Add", ["row", "upde"], ["newrow"]),
         c("Squeeze", ["k_in"], ["ks"]), c("Squeeze", ["end"], ["es"]),
         c("Range", ["ks", "es", "step1"], ["r"]),
         _const("shape1n1", np.array([1, -1, 1], i64)), _const("reps", np.array([1, 1, 3], i64)),
         c("Reshape", ["r", "shape1n1"], ["r3"]), c("Tile", ["r3", "reps"], ["idx"]),
         c("ScatterElements", ["buf_in", "idx", "newrow"], ["buf_out"], axis=1),
         c("Add", ["i", "step1"], ["i1"]), c("Range", ["i", "i1", "step1"], ["ir"]),  # [1]: the iteration number
         c("Identity", ["cond_in"], ["cond_out"]),
         c("Identity", ["h_out"], ["s_h"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("k_in", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("cls_in", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("buf_in", TensorProto.FLOAT, [1, ROWS, 3]),
         helper.make_tensor_value_info("wc_in", TensorProto.FLOAT, [4, 5]),
         helper.make_tensor_value_info("feat_in", TensorProto.FLOAT, [1, 6, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("k_out", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("cls_out", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("buf_out", TensorProto.FLOAT, [1, ROWS, 3]),
         helper.make_tensor_value_info("wc_in", TensorProto.FLOAT, [4, 5]),  # written back unchanged
         helper.make_tensor_value_info("feat_in", TensorProto.FLOAT, [1, 6, 4]),
         helper.make_tensor_value_info("s_h", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("ir", TensorProto.INT64, [1])])
    nodes = [c("Relu", ["x"], ["feat"]),  # a computed carried value: the body's input, passed through
             c("Loop", ["trip", "", "k0", "h0", "cls0", "buf0", "Wc", "feat"],
               ["k", "h", "cls", "buf", "wc", "feat_last", "s_h", "s_i"], body=body)]
    inits = [("trip", np.array(step_count, i64)), ("k0", np.array([0], i64)),
             ("h0", rng.normal(size=(1, 4)).astype(f32)), ("cls0", np.array([2], i64)),
             ("buf0", rng.normal(size=(1, ROWS, 3)).astype(f32)), ("Wc", rng.normal(size=(4, 5)).astype(f32)),
             ("W", rng.normal(size=(9, 4)).astype(f32)), ("Wr", rng.normal(size=(4, 3)).astype(f32))]
    return make_model(nodes, [("x", TensorProto.FLOAT, [1, 6, 4])],
                      [(n, TensorProto.FLOAT if n not in ("k", "cls", "s_i") else TensorProto.INT64, None)
                       for n in ("k", "h", "cls", "buf", "wc", "feat_last", "s_h", "s_i")], inits)


def _growing_model(step_count: int):
    """A body whose Slice grows every step (``buf[:, :i + 1]``): its sum and its Shape as scan outputs. The shapes
    of a recorded step never hold for the next: a replay must not reuse them."""
    c = helper.make_node
    i64 = np.int64
    body = helper.make_graph(
        [_const("one", np.array([1], i64)), _const("zero", np.array([0], i64)), _const("ax1", np.array([1], i64)),
         c("Unsqueeze", ["i", "zero"], ["i1"]), c("Add", ["i1", "one"], ["end"]),
         c("Slice", ["buf_in", "zero", "end", "ax1"], ["part"]),  # [1, i + 1, 3]
         c("ReduceSum", ["part", "ax1"], ["sum"], keepdims=0),  # [1, 3]
         c("Shape", ["part"], ["pshape"]), c("Cast", ["pshape"], ["pshapef"], to=TensorProto.FLOAT),
         c("ReduceSum", ["pshapef"], ["psize"], keepdims=0),
         c("Mul", ["sum", "psize"], ["s_out"]),
         c("Identity", ["cond_in"], ["cond_out"]), c("Identity", ["buf_in"], ["buf_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("buf_in", TensorProto.FLOAT, [1, ROWS, 3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("buf_out", TensorProto.FLOAT, [1, ROWS, 3]),
         helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [1, 3])])
    nodes = [c("Relu", ["x"], ["buf0"]),
             c("Loop", ["trip", "", "buf0"], ["buf", "s"], body=body)]
    return make_model(nodes, [("x", TensorProto.FLOAT, [1, ROWS, 3])],
                      [("buf", TensorProto.FLOAT, None), ("s", TensorProto.FLOAT, None)],
                      [("trip", np.array(step_count, i64))])


def _body_programs(session: hetero.Session) -> list:
    """The programs of the child sessions that run the model's Loop bodies."""
    found = []
    for program in session.programs:
        control = getattr(program, "_control", None)
        for child in ([] if control is None else control._children.values()):
            found.extend([] if child is None else child.programs)
    return found


def _check(model, feeds: dict[str, np.ndarray], backend: str) -> hetero.Session:
    import onnxruntime as ort

    want_session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in want_session.get_outputs()]
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    for call in range(3):  # the body's replay is recorded during the first call: the later ones run on it
        scaled = {k: v * (1 + call) for k, v in feeds.items()}
        want = want_session.run(None, scaled)
        got = session.run(scaled)
        for name, value in zip(names, want, strict=True):
            assert got[name].shape == value.shape, name
            assert got[name].dtype == value.dtype, name
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5, err_msg=name)
    return session


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("step_count", [0, 1, 2, 7, ROWS, ROWS + 3])
def test_loop_body_at_the_step_counter_replays(backend, step_count):
    rng = np.random.default_rng(11)
    x = rng.normal(size=(1, 6, 4)).astype(np.float32)
    session = _check(_decoder_model(rng, step_count), {"x": x}, backend)
    bodies = _body_programs(session)
    if step_count >= 3:  # planned at the 2nd step, recorded at the 3rd: a replay from there on
        assert len(bodies) == 1
        program = bodies[0]
        assert program.replayable
        assert {s.node.op_type for s in program.steps if s.guarded} == {"Slice", "Range"}
        # past the rows the slice is empty: those steps leave the replay (and the body runs interpreted), the steps
        # before it run on it; a body that never leaves keeps it
        if step_count <= ROWS:
            assert program.replay is not None


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("step_count", [1, 3, 6, ROWS])
def test_loop_body_whose_slice_grows_never_replays_stale_shapes(backend, step_count):
    rng = np.random.default_rng(12)
    x = rng.normal(size=(1, ROWS, 3)).astype(np.float32)
    session = _check(_growing_model(step_count), {"x": x}, backend)
    for program in _body_programs(session):
        # one signature (the body's inputs keep their shapes), other shapes at each step: every replay recorded is
        # dropped at its first use, and after MAX_STALE of them the program stops recording
        assert program.replay is None or step_count < 6


COUNTER_DOMAIN = "test.loop_replay"


def _count_calls(ctx) -> list[np.ndarray]:
    state = ctx.state if ctx.state is not None else {}
    state["calls"] = state.get("calls", 0) + 1
    return [ctx.values[0] + np.float32(state["calls"])]


register(OpSchema("CountCalls", same_as_input(0), _count_calls, domain=COUNTER_DOMAIN, stateful=True), replace=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_guarded_steps_beside_a_stateful_kernel(backend):
    # a replay that a guarded step ends midway runs every kernel again, interpreted: a stateful one would count twice
    f32 = np.float32
    nodes = [helper.make_node("CountCalls", ["x"], ["c"], domain=COUNTER_DOMAIN),
             helper.make_node("Add", ["s", "span"], ["limit"]),
             helper.make_node("Range", ["s", "limit", "one"], ["r"])]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [2]), ("s", TensorProto.FLOAT, []),
                               ("span", TensorProto.FLOAT, [])],
                       [("c", TensorProto.FLOAT, None), ("r", TensorProto.FLOAT, None)], [("one", np.array(1, f32))])
    model.opset_import.append(helper.make_opsetid(COUNTER_DOMAIN, 1))
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    for program in session.programs:  # on cpu the counter falls back: a program of its own (the Range may replay)
        ops = {s.node.op_type for s in getattr(program, "steps", [])}
        assert not ({"CountCalls", "Range"} <= ops and program.replayable)
    x = np.zeros(2, f32)
    for call in range(1, 7):
        span = np.array(3.0 if call < 5 else 5.0, f32)  # another length at the 5th call
        got = session.run({"x": x, "s": np.array(call, f32), "span": span})
        np.testing.assert_array_equal(got["c"], np.full(2, call, f32))
        np.testing.assert_array_equal(got["r"], np.arange(call, call + span, dtype=f32))
