"""The small sequence models' paths (issue 17: the romanizer's GRU encoder and decoder step).

- The small-M GEMM on packed weights (M <= 4: a decoder step's [2 x 256] x [256 x 768] Gemms) splits its column
  panels across threads by the bytes of B it streams, not only by flops: the same bits at 1 and 2 threads (each
  column's sum is the same panel kernel's, whatever thread runs it), fp32 and int8 weight panels.
- LSTM / GRU: a bidirectional layer runs its two directions on two threads, and under precision "normal" the input
  projections run as bf16x3 (AMX-BF16): the same bits at 1 and 2 threads, within tolerance of the reference.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetero
from tests.plugins.cpu.conftest import thread_counts
from tests.plugins.cpu.test_int8_weights import int8_weights

_native = pytest.importorskip(
    "hetero_cpu._native",
    reason="the hetero-cpu native extension is not built (pip install --no-build-isolation ./plugins/cpu)",
)

threads = thread_counts(1, 2)


def _at_threads(fn, counts=(1, 2)):
    """fn() run with the pool at each thread count (restored after): the results in order."""
    before = _native.num_threads()
    try:
        out = []
        for t in counts:
            _native.set_num_threads(t)
            out.append(fn())
        return out
    finally:
        _native.set_num_threads(before)


# K x N: 768 KB of fp32 B (split for its bytes when the workers are awake), 1.5 MB (split, waking them), 192 KB
# (one thread); int8-exact weights: a quarter of the bytes
@pytest.mark.parametrize("k,n", [(256, 768), (512, 768), (256, 192), (130, 1000)])
@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("int8", [False, True])
def test_small_m_split_same_bits_at_1_and_2_threads(m, k, n, int8):
    rng = np.random.default_rng(m * 1000 + k + n)
    b = int8_weights(k, n, seed=k + n)[0] if int8 else rng.standard_normal((k, n)).astype(np.float32)
    a = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    packed = _native.pack_b(b, precision="high")
    assert packed.int8 == int8

    def run():
        out = np.empty((m, n), np.float32)
        _native.gemm_packed(a, packed, out, 1.0, 0.0, bias)
        return out

    outs = _at_threads(run, (1, 2, 1, 2))
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    want = a.astype(np.float64) @ b.astype(np.float64) + bias
    np.testing.assert_allclose(outs[0], want, rtol=1e-4, atol=1e-4 * np.abs(a).sum(1, keepdims=True).max())


def _rnn_model(op: str, seq: int, batch: int, inp: int, hidden: int, seed: int = 0, lbr: int = 0):
    g = 4 if op == "LSTM" else 3
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((2, g * hidden, inp)) / np.sqrt(inp)).astype(np.float32)
    r = (rng.standard_normal((2, g * hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
    b = (rng.standard_normal((2, 2 * g * hidden)) * 0.1).astype(np.float32)
    outs = ["y", "y_h"] + (["y_c"] if op == "LSTM" else [])
    attrs = {"hidden_size": hidden, "direction": "bidirectional"}
    if op == "GRU":
        attrs["linear_before_reset"] = lbr
    node = helper.make_node(op, ["x", "W", "R", "B", "lens"], outs, **attrs)
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [node], "rnn", [helper.make_tensor_value_info("x", f, [seq, batch, inp])],
        [helper.make_tensor_value_info(o, f, None) for o in outs],
        [helper.make_tensor("W", f, w.shape, w.ravel()), helper.make_tensor("R", f, r.shape, r.ravel()),
         helper.make_tensor("B", f, b.shape, b.ravel()),
         helper.make_tensor("lens", TensorProto.INT32, [batch], [seq, max(1, seq - 3), seq - 1][:batch])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    x = rng.standard_normal((seq, batch, inp)).astype(np.float32)
    return model, {"x": x}


# The romanizer encoder's shape (seq 16, batch 3, input 256, hidden 128: the input projections [48 x 256] x
# [256 x 384] take bf16x3 under "normal"), and a small one the path leaves to fp32 (input 7 < 32).
@pytest.mark.parametrize("op,lbr", [("GRU", 1), ("GRU", 0), ("LSTM", 0)])
@pytest.mark.parametrize("seq,batch,inp,hidden", [(16, 3, 256, 128), (5, 2, 7, 9)])
@pytest.mark.parametrize("precision", ["high", "normal"])
def test_bidirectional_rnn_same_bits_at_1_and_2_threads(op, lbr, seq, batch, inp, hidden, precision):
    model, feeds = _rnn_model(op, seq, batch, inp, hidden, lbr=lbr)

    def run():
        s = hetero.Session(model, backends=["cpu"], on_fallback="error", options={"precision": precision})
        return s.run(feeds)

    one, two = _at_threads(run)
    want = hetero.Session(model, backends=["reference"]).run(feeds)
    for name in want:
        np.testing.assert_array_equal(two[name], one[name], err_msg=name)
        # bf16x3 input projections: ~2^-14 relative per product, so a looser bound than fp32's
        tol = 2e-4 if precision == "normal" else 2e-5
        np.testing.assert_allclose(one[name], want[name], rtol=tol, atol=tol, err_msg=name)


def test_rnn_normal_takes_bf16x3_where_available():
    """Under "normal" on an AMX-BF16 CPU the input projections differ from "high"'s fp32 bits (the path is taken),
    elsewhere they are the same bits."""
    model, feeds = _rnn_model("GRU", 16, 3, 256, 128, lbr=1)
    hi, no = (hetero.Session(model, backends=["cpu"], options={"precision": p}).run(feeds)["y"]
              for p in ("high", "normal"))
    if _native.bf16x3_available() and _native.isa() == "avx512":
        assert not np.array_equal(hi, no)
    else:
        np.testing.assert_array_equal(hi, no)


def _step_ops_model():
    """Not / And / Where / Softmax / Gather (indices fed) / Concat along the last axis / batched MatMul / LogSoftmax:
    the ops a replay now runs as one native step (the romanizer decoder's attention and outputs)."""
    f, b, i64 = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64
    w = np.random.default_rng(3).standard_normal((1, 10, 4)).astype(np.float32)
    nodes = [
        helper.make_node("Not", ["c"], ["nc"]),
        helper.make_node("And", ["nc", "c2"], ["both"]),
        helper.make_node("Where", ["both", "x", "zero"], ["wh"]),
        helper.make_node("Softmax", ["wh"], ["sm"], axis=-1),
        helper.make_node("Gather", ["sm", "idx"], ["g"], axis=0),
        helper.make_node("Concat", ["g", "g"], ["cat"], axis=-1),
        helper.make_node("Unsqueeze", ["cat", "ax0"], ["cat3"]),
        helper.make_node("MatMul", ["cat3", "w"], ["mm"]),
        helper.make_node("LogSoftmax", ["mm"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "steps",
        [helper.make_tensor_value_info("x", f, [3, 5]), helper.make_tensor_value_info("c", b, [3, 5]),
         helper.make_tensor_value_info("c2", b, [3, 5]), helper.make_tensor_value_info("idx", i64, [2]),
         helper.make_tensor_value_info("w", f, [1, 10, 4])],
        [helper.make_tensor_value_info("y", f, None), helper.make_tensor_value_info("cat", f, None)],
        [helper.make_tensor("zero", f, [], [0.0]), helper.make_tensor("ax0", i64, [1], [0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w


def test_replayed_step_ops_follow_their_inputs(threads):
    """Runs past the recorded replay (one native step) with new values each time, indices included: the outputs are
    the reference's; an index out of range raises, as on the first run."""
    model, w = _step_ops_model()
    s = hetero.Session(model, backends=["cpu"], on_fallback="error")
    ref = hetero.Session(model, backends=["reference"])
    rng = np.random.default_rng(0)
    for trial in range(6):
        feeds = {"x": rng.standard_normal((3, 5)).astype(np.float32), "c": rng.random((3, 5)) < 0.5,
                 "c2": rng.random((3, 5)) < 0.7, "idx": rng.integers(-3, 3, 2).astype(np.int64), "w": w}
        got, want = s.run(feeds), ref.run(feeds)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=f"{name}, run {trial}")
    feeds["idx"] = np.array([0, 3], np.int64)
    with pytest.raises(Exception, match="out of range"):
        s.run(feeds)
