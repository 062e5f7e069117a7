"""hetero::EmbeddingRNN on cpu: a GRU / LSTM whose X is an embedding's rows, the table projected once
(``rnn_project``) and each run's projection a gather (``rnn_run_tokens``). The native path against the layer run on
the gathered rows (the same bits, every ISA, 1 and 2 threads), the pass on small models against the unfused graph
(cpu: the same bits; the numpy reference: within float error), and what the pass leaves alone."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetero
from conftest import make_model
from hetero_cpu import _native


def _layer(rng, gru: bool, dirs: int, vocab: int = 37, inp: int = 24, hidden: int = 20):
    gates = 3 if gru else 4
    table = rng.normal(0, 1, (vocab, inp)).astype(np.float32)
    w = rng.normal(0, 0.3, (dirs, gates * hidden, inp)).astype(np.float32)
    r = rng.normal(0, 0.3, (dirs, gates * hidden, hidden)).astype(np.float32)
    b = rng.normal(0, 0.5, (dirs, 2 * gates * hidden)).astype(np.float32)
    return table, w, r, b


@pytest.mark.parametrize("gru", [True, False], ids=["gru", "lstm"])
@pytest.mark.parametrize("direction", [0, 1, 2], ids=["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("batch_major", [False, True])
def test_tokens_are_the_layer_on_gathered_rows_bit_for_bit(isa, threads, gru, direction, batch_major):
    rng = np.random.default_rng(direction * 4 + 2 * gru + batch_major)
    dirs, seq, batch, hidden = (2 if direction == 2 else 1), 7, 3, 20
    table, w, r, b = _layer(rng, gru, dirs)
    ids = rng.integers(-len(table), len(table), (batch, seq) if batch_major else (seq, batch))
    ids = ids.astype(np.int64 if batch_major else np.int32)
    lens = np.array([7, 4, 1], np.int64)
    h0 = rng.normal(0, 1, (dirs, batch, hidden)).astype(np.float32)
    c0 = None if gru else rng.normal(0, 1, (dirs, batch, hidden)).astype(np.float32)
    packed = _native.rnn_prepack(w, r, gru)
    proj = _native.rnn_project(packed, table)
    assert proj.shape == (len(table), dirs, w.shape[1])
    rows = table[ids.T] if batch_major else table[ids]  # (seq, batch, I), negative ids from the end as Gather's
    outs = []
    for tokens in (False, True):
        y = np.full((seq, dirs, batch, hidden), np.nan, np.float32)
        yh = np.full((dirs, batch, hidden), np.nan, np.float32)
        yc = None if gru else np.full((dirs, batch, hidden), np.nan, np.float32)
        args = (b, lens, h0, c0, None, direction, 0.0, False, gru, y, yh, yc)
        if tokens:
            _native.rnn_run_tokens(packed, proj, ids, batch_major, *args)
        else:
            _native.rnn_run(packed, np.ascontiguousarray(rows), *args)
        outs.append([y, yh] + ([] if gru else [yc]))
    for got, want in zip(outs[1], outs[0], strict=True):
        assert not np.isnan(got).any()
        np.testing.assert_array_equal(got, want)


def test_an_id_outside_the_table_is_an_error():
    rng = np.random.default_rng(3)
    table, w, r, b = _layer(rng, True, 1)
    packed = _native.rnn_prepack(w, r, True)
    proj = _native.rnn_project(packed, table)
    y = np.empty((2, 1, 1, 20), np.float32)
    for bad in (len(table), -len(table) - 1):
        ids = np.array([[0], [bad]], np.int64)
        with pytest.raises(Exception, match="outside"):
            _native.rnn_run_tokens(packed, proj, ids, False, b, None, None, None, None, 0, 0.0, False, True, y, None,
                                   None)


def _embedding_rnn_model(op: str, transpose: bool, direction: str = "bidirectional", extra_reader: bool = False,
                         seq: int = 6, batch: int = 2):
    """ids -> Gather(table) [-> Transpose(1, 0, 2)] -> GRU / LSTM (B, sequence_lens, initial_h) -> Y, Y_h."""
    rng = np.random.default_rng(len(op) + transpose)
    gru = op == "GRU"
    dirs = 2 if direction == "bidirectional" else 1
    table, w, r, b = _layer(rng, gru, dirs)
    h0 = rng.normal(0, 1, (dirs, batch, 20)).astype(np.float32)
    x = "xt" if transpose else "x"
    nodes = [helper.make_node("Gather", ["table", "ids"], ["x"], axis=0)]
    if transpose:
        nodes.append(helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]))
    attrs = {"hidden_size": 20, "direction": direction}
    if gru:
        attrs["linear_before_reset"] = 1
    nodes.append(helper.make_node(op, [x, "w", "r", "b", "lens", "h0"], ["y", "yh"], **attrs))
    outputs = [("y", TensorProto.FLOAT, None), ("yh", TensorProto.FLOAT, None)]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["x"], ["z"]))
        outputs.append(("z", TensorProto.FLOAT, None))
    ids_shape = [batch, seq] if transpose else [seq, batch]
    return make_model(nodes, [("ids", TensorProto.INT64, ids_shape), ("lens", TensorProto.INT32, [batch])], outputs,
                      [("table", table), ("w", w), ("r", r), ("b", b), ("h0", h0)])


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
@pytest.mark.parametrize("transpose", [True, False])
@pytest.mark.parametrize("direction", ["bidirectional", "forward", "reverse"])
def test_the_pass_makes_one_node_with_the_same_bits(op, transpose, direction):
    model = _embedding_rnn_model(op, transpose, direction)
    fused = hetero.Session(model, backends=["cpu"], on_fallback="error")
    assert fused.rewrites["fuse_embedding_rnn"] == 1
    assert [n.op_type for n in fused.graph.nodes] == ["EmbeddingRNN"]
    unfused = hetero.Session(model, backends=["cpu"], optimize=False, on_fallback="silent")
    reference = hetero.Session(model, backends=["reference"], optimize=False)
    fused_reference = hetero.Session(model, backends=["reference"])  # the fused op's own reference
    assert fused_reference.rewrites["fuse_embedding_rnn"] == 1
    rng = np.random.default_rng(5)
    ids_shape = (2, 6) if transpose else (6, 2)
    for run in range(3):  # new ids and lengths each run: the bound call reads the fed values
        feeds = {"ids": rng.integers(-37, 37, ids_shape).astype(np.int64), "lens": np.array([6, 3 - run], np.int32)}
        got, want = fused.run(feeds), unfused.run(feeds)
        ref, fref = reference.run(feeds), fused_reference.run(feeds)
        for name in ("y", "yh"):
            np.testing.assert_array_equal(got[name], want[name])
            np.testing.assert_allclose(got[name], ref[name], rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(fref[name], ref[name])


def test_a_gather_read_elsewhere_is_left_alone():
    session = hetero.Session(_embedding_rnn_model("GRU", False, extra_reader=True), backends=["cpu"])
    assert session.rewrites["fuse_embedding_rnn"] == 0
    assert "Gather" in [n.op_type for n in session.graph.nodes]


def test_an_id_outside_the_table_fails_the_run():
    session = hetero.Session(_embedding_rnn_model("LSTM", True), backends=["cpu"], on_fallback="error")
    with pytest.raises(Exception, match="outside"):
        session.run({"ids": np.full((2, 6), 37, np.int64), "lens": np.array([6, 6], np.int32)})
