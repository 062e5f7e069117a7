"""The plain ONNX RNN op (one gate: H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)) on the native recurrence
(``rnn_prepack(..., simple=f)``) instead of the float64 numpy reference, which ran madmom's bidirectional note RNN
at 6.6x onnxruntime's time. Against a float64 recurrence written here: every ISA, 1 and 2 threads, the three
directions, Tanh / Relu / Sigmoid, sequence_lens, initial_h, clip, layout 1, one step, one row, odd sizes; and
through a session, including the configurations the native path leaves to the reference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetero
from hetero_cpu import _native

_ACT = {"tanh": np.tanh, "relu": lambda v: np.maximum(v, 0), "sigmoid": lambda v: 1 / (1 + np.exp(-v))}


def _reference(x, w, r, b, lens, h0, direction: int, act: str, clip: float = 0.0):
    """float64 (seq, dirs, batch, H) and (dirs, batch, H), X (seq, batch, I); steps past a row's length stay 0."""
    seq, batch, _ = x.shape
    dirs, hidden = w.shape[0], r.shape[-1]
    y = np.zeros((seq, dirs, batch, hidden))
    yh = np.zeros((dirs, batch, hidden))
    for d in range(dirs):
        backward = direction == 1 or d == 1
        bias = (b[d, :hidden] + b[d, hidden:]) if b is not None else np.zeros(hidden)
        for bi in range(batch):
            h = h0[d, bi].astype(np.float64) if h0 is not None else np.zeros(hidden)
            n = int(lens[bi]) if lens is not None else seq
            for t in range(n):
                tx = n - 1 - t if backward else t
                pre = x[tx, bi] @ w[d].T.astype(np.float64) + h @ r[d].T.astype(np.float64) + bias
                if clip:
                    pre = np.clip(pre, -clip, clip)
                h = _ACT[act](pre)
                y[tx, d, bi] = h
            yh[d, bi] = h
    return y, yh


CASES = [
    # (seq, batch, input, hidden, direction, act, with_lens, with_h0, clip)
    (9, 3, 5, 7, "forward", "tanh", True, True, 0.0),
    (9, 3, 5, 7, "reverse", "tanh", True, False, 0.0),
    (12, 2, 482, 88, "bidirectional", "tanh", False, False, 0.0),  # madmom's note RNN's first layer (fewer frames)
    (6, 4, 1, 4, "bidirectional", "tanh", True, True, 0.0),  # madmom's onset post-processing: one input, 4 units
    (5, 2, 16, 33, "bidirectional", "relu", True, True, 0.0),
    (5, 1, 8, 17, "forward", "sigmoid", False, True, 0.0),
    (7, 2, 6, 9, "bidirectional", "tanh", False, True, 0.4),
    (1, 1, 3, 5, "reverse", "relu", False, False, 0.0),  # one step, one row
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[4]}_{c[5]}_{c[0]}x{c[1]}x{c[2]}_h{c[3]}" for c in CASES])
def test_native_against_float64(isa, threads, case):
    seq, batch, inp, hidden, direction, act, with_lens, with_h0, clip = case
    rng = np.random.default_rng(seq * 31 + hidden)
    dirs = 2 if direction == "bidirectional" else 1
    w = rng.normal(0, 0.4, (dirs, hidden, inp)).astype(np.float32)
    r = rng.normal(0, 0.4, (dirs, hidden, hidden)).astype(np.float32)
    b = rng.normal(0, 0.5, (dirs, 2 * hidden)).astype(np.float32)
    x = rng.normal(0, 1, (seq, batch, inp)).astype(np.float32)
    lens = rng.integers(1, seq + 1, batch).astype(np.int64) if with_lens else None
    if lens is not None:
        lens[0] = seq
    h0 = rng.normal(0, 1, (dirs, batch, hidden)).astype(np.float32) if with_h0 else None
    code = {"forward": 0, "reverse": 1, "bidirectional": 2}[direction]
    packed = _native.rnn_prepack(w, r, False, False, act)
    assert packed.hidden_size == hidden and packed.directions == dirs
    y = np.full((seq, dirs, batch, hidden), np.nan, np.float32)
    yh = np.full((dirs, batch, hidden), np.nan, np.float32)
    _native.rnn_run(packed, x, b, lens, h0, None, None, code, clip, False, False, y, yh, None)
    want_y, want_yh = _reference(x, w, r, b, lens, h0, code, act, clip)
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(yh, want_yh, rtol=1e-5, atol=2e-5)


def test_prepack_rejects_other_activations_and_gru():
    w, r = np.zeros((1, 4, 3), np.float32), np.zeros((1, 4, 4), np.float32)
    with pytest.raises(Exception, match="simple must be"):
        _native.rnn_prepack(w, r, False, False, "softsign")
    with pytest.raises(Exception, match="exclude"):
        _native.rnn_prepack(np.zeros((1, 12, 3), np.float32), np.zeros((1, 12, 4), np.float32), True, False, "tanh")


def _rnn_model(seq, batch, inp, hidden, direction, acts, layout=0, with_b=True, with_h0=True, with_lens=True):
    dirs = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(5)
    inits = [helper.make_tensor("W", TensorProto.FLOAT, (dirs, hidden, inp),
                                rng.normal(0, 0.4, (dirs, hidden, inp)).astype(np.float32).ravel()),
             helper.make_tensor("R", TensorProto.FLOAT, (dirs, hidden, hidden),
                                rng.normal(0, 0.4, (dirs, hidden, hidden)).astype(np.float32).ravel())]
    if with_b:
        inits.append(helper.make_tensor("B", TensorProto.FLOAT, (dirs, 2 * hidden),
                                        rng.normal(0, 0.5, (dirs, 2 * hidden)).astype(np.float32).ravel()))
    x_shape = (batch, seq, inp) if layout else (seq, batch, inp)
    h_shape = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)]
    feeds = {"x": rng.normal(0, 1, x_shape).astype(np.float32)}
    if with_lens:
        ins.append(helper.make_tensor_value_info("lens", TensorProto.INT32, (batch,)))
        feeds["lens"] = np.array([seq] + [max(1, seq - 2 - i) for i in range(batch - 1)], np.int32)
    if with_h0:
        ins.append(helper.make_tensor_value_info("h0", TensorProto.FLOAT, h_shape))
        feeds["h0"] = rng.normal(0, 1, h_shape).astype(np.float32)
    node = helper.make_node("RNN", ["x", "W", "R", "B" if with_b else "", "lens" if with_lens else "",
                                    "h0" if with_h0 else ""], ["y", "y_h"], hidden_size=hidden,
                            direction=direction, activations=acts, layout=layout)
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("y_h", TensorProto.FLOAT, None)]
    graph = helper.make_graph([node], "rnn", ins, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), feeds


@pytest.mark.parametrize("direction,acts,layout,with_b,with_h0,with_lens", [
    ("bidirectional", ["Tanh", "Tanh"], 0, True, True, True),
    ("forward", ["Relu"], 1, True, True, False),  # layout 1: the copying path
    ("reverse", ["Sigmoid"], 0, False, False, True),
    ("bidirectional", ["Tanh", "Relu"], 0, True, False, False),  # two activations: left to the reference
    ("forward", ["Softsign"], 0, True, False, False),  # not a native activation: the reference
])
def test_session_matches_the_reference(direction, acts, layout, with_b, with_h0, with_lens):
    model, feeds = _rnn_model(6, 3, 5, 7, direction, acts, layout, with_b, with_h0, with_lens)
    got = hetero.Session(model, backends=["cpu"]).run(feeds)
    want = hetero.Session(model, backends=["reference"]).run(feeds)
    for name in ("y", "y_h"):
        np.testing.assert_allclose(np.asarray(got[name]), np.asarray(want[name]), rtol=1e-5, atol=2e-5)
