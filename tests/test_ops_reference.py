"""Static shape inference of the trickier op schemas: unknown dims (None), value inputs, opset differences."""

from __future__ import annotations

import numpy as np
import pytest

from hetero.contract import ShapeError, TensorInfo, dtypes, registry
from hetero.contract.graph import Graph, Node
from hetero.runtime.evaluate import evaluate_node
from hetero.runtime.infer import infer_node

F32 = dtypes.float32
I64 = dtypes.int64


def infer(op_type, inputs, values=None, attrs=None, opset=21, n_out=1):
    """Output shapes of one node; ``values`` maps input index -> known (constant) value."""
    node = Node(op_type, [f"in{i}" if info is not None else "" for i, info in enumerate(inputs)],
                [f"out{i}" for i in range(n_out)], dict(attrs or {}))
    vals = [None] * len(inputs)
    for i, v in (values or {}).items():
        vals[i] = np.asarray(v)
    outs = infer_node(registry.get("", op_type), node, inputs, vals, opset)
    return [o.shape for o in outs]


def run(op_type, arrays, attrs=None, opset=21, n_out=1):
    node = Node(op_type, [f"in{i}" for i in range(len(arrays))], [f"out{i}" for i in range(n_out)], dict(attrs or {}))
    return evaluate_node(registry.get("", op_type), node, [np.asarray(a) for a in arrays], opset)


def shape_info(*dims, dtype=F32):
    return TensorInfo(dtype, tuple(dims))


def test_reshape_zero_copies_unknown_dim_and_minus_one_stays_unknown():
    x = shape_info(None, 3, 4)
    assert infer("Reshape", [x, shape_info(3, dtype=I64)], {1: [0, -1, 2]}) == [(None, None, 2)]
    # With the batch known, -1 is exact: 2*3*4 / (2*2).
    x = shape_info(2, 3, 4)
    assert infer("Reshape", [x, shape_info(3, dtype=I64)], {1: [0, -1, 2]}) == [(2, 6, 2)]
    # allowzero=1 keeps a literal 0.
    assert infer("Reshape", [shape_info(0, 3), shape_info(2, dtype=I64)], {1: [0, 3]},
                 {"allowzero": 1}) == [(0, 3)]
    # Unknown target values: only the rank (length of the shape input) is known.
    assert infer("Reshape", [x, shape_info(3, dtype=I64)]) == [(None, None, None)]


def test_reshape_rejects_impossible_target():
    with pytest.raises(ShapeError):
        infer("Reshape", [shape_info(2, 3), shape_info(2, dtype=I64)], {1: [4, -1]})


def test_slice_negative_steps_and_unknown_dims():
    x = shape_info(10, None, 5)
    starts, ends, axes, steps = [-1, 0], [-100, 3], [0, 1], [-2, 1]
    shapes = [x] + [shape_info(2, dtype=I64)] * 4
    # Axis 0: 9, 7, 5, 3, 1 -> 5 elements; axis 1 has an unknown size so stays unknown; axis 2 untouched.
    assert infer("Slice", shapes, {1: starts, 2: ends, 3: axes, 4: steps}) == [(5, None, 5)]
    out = run("Slice", [np.arange(10), [-1], [-100], [0], [-2]])[0]
    assert out.tolist() == [9, 7, 5, 3, 1]


def test_conv_same_upper_output_size_with_unknown_batch():
    x, w = shape_info(None, 3, 7, 8), shape_info(16, 3, 3, 3)
    out = infer("Conv", [x, w], attrs={"auto_pad": "SAME_UPPER", "strides": [2, 2]})
    assert out == [(None, 16, 4, 4)]  # ceil(7/2), ceil(8/2)
    y = run("Conv", [np.ones((1, 3, 7, 8), np.float32), np.ones((16, 3, 3, 3), np.float32)],
            {"auto_pad": "SAME_UPPER", "strides": [2, 2]})[0]
    assert y.shape == (1, 16, 4, 4)
    # Rows: 2 pad pixels split 1/1, so the first window covers 2 rows. Columns: 1 pad pixel, which SAME_UPPER puts
    # at the end (the first window covers 3 columns) and SAME_LOWER at the start (2 columns).
    assert y[0, 0, 0, 0] == 3 * 2 * 3
    y = run("Conv", [np.ones((1, 3, 7, 8), np.float32), np.ones((16, 3, 3, 3), np.float32)],
            {"auto_pad": "SAME_LOWER", "strides": [2, 2]})[0]
    assert y[0, 0, 0, 0] == 3 * 2 * 2


def test_pool_ceil_mode_drops_window_starting_in_end_padding():
    x = shape_info(1, 1, 2, 2)
    out = infer("AveragePool", [x], attrs={"kernel_shape": [3, 3], "strides": [3, 3], "pads": [1, 1, 1, 1],
                                           "ceil_mode": 1}, n_out=1)
    assert out == [(1, 1, 1, 1)]


def test_resize_sizes_versus_scales():
    x = shape_info(None, 3, 4, 6)
    empty = TensorInfo(F32, (0,))
    by_scales = infer("Resize", [x, empty, shape_info(4)], {2: [1, 1, 0.5, 1.5]})
    assert by_scales == [(None, 3, 2, 9)]
    by_sizes = infer("Resize", [x, empty, empty, shape_info(2, dtype=I64)], {3: [8, 8]}, {"axes": [2, 3]})
    assert by_sizes == [(None, 3, 8, 8)]
    # not_larger keeps the aspect ratio: scale = min(8/4, 8/6) -> 4*1.333 = 5, 6*1.333 = 8.
    kept = infer("Resize", [x, empty, empty, shape_info(2, dtype=I64)], {3: [8, 8]},
                 {"axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"})
    assert kept == [(None, 3, 5, 8)]
    # Scales not known yet: rank only.
    assert infer("Resize", [x, empty, shape_info(4)]) == [(None, None, None, None)]


def test_squeeze_unsqueeze_axes_by_opset():
    x = shape_info(1, None, 1)
    assert infer("Squeeze", [x], attrs={"axes": [0]}, opset=11) == [(None, 1)]
    assert infer("Squeeze", [x, shape_info(1, dtype=I64)], {1: [-1]}, opset=13) == [(1, None)]
    # No axes and an unknown dim: which axes go is not known.
    assert infer("Squeeze", [x], opset=13) == [None]
    assert infer("Unsqueeze", [shape_info(None, 4), shape_info(2, dtype=I64)], {1: [0, -1]}) == [(1, None, 4, 1)]


def test_reduce_axes_attribute_versus_input():
    x = shape_info(None, 4, 5)
    assert infer("ReduceMean", [x], attrs={"axes": [1], "keepdims": 0}, opset=13) == [(None, 5)]
    assert infer("ReduceMean", [x, shape_info(1, dtype=I64)], {1: [-1]}, opset=18) == [(None, 4, 1)]
    assert infer("ReduceMean", [x, shape_info(1, dtype=I64)], opset=18) == [(None, None, None)]
    assert infer("ReduceSum", [x], attrs={"noop_with_empty_axes": 1}, opset=13) == [(None, 4, 5)]


def test_softmax_coerces_to_2d_before_opset_13():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    old = run("Softmax", [x], {"axis": 1}, opset=11)[0]
    assert np.allclose(old.reshape(2, 12).sum(axis=1), 1)
    new = run("Softmax", [x], {"axis": 1}, opset=13)[0]
    assert np.allclose(new.sum(axis=1), 1)


def test_split_num_outputs_uneven_and_concat_unknown():
    x = shape_info(7, None)
    assert infer("Split", [x], attrs={"axis": 0, "num_outputs": 3}, opset=18, n_out=3) == [(3, None), (3, None),
                                                                                           (1, None)]
    assert infer("Concat", [shape_info(2, None), shape_info(None, 5)], attrs={"axis": 0}) == [(None, 5)]


def test_data_dependent_ops_are_unknown_statically():
    x = shape_info(3, 4)
    assert infer("NonZero", [x]) == [(2, None)]
    assert infer("NonZero", [x], {0: np.eye(3, 4)}) == [(2, 3)]


def test_if_static_uses_declared_branch_outputs():
    then_g = Graph(outputs=["a"], values={"a": TensorInfo(F32, (5,))}, name="then")
    else_g = Graph(outputs=["b"], values={"b": TensorInfo(F32, (5,))}, name="else")
    out = infer("If", [TensorInfo(dtypes.bool_, ())], attrs={"then_branch": then_g, "else_branch": else_g})
    assert out == [(5,)]


# -- reference semantics of the low-precision conversions and the opset-27 recurrent ops ---------------------------
def run_opt(op_type, arrays, attrs=None, opset=27, n_out=1):
    """Like run(), with None for an absent optional input."""
    node = Node(op_type, [f"in{i}" if a is not None else "" for i, a in enumerate(arrays)],
                [f"out{i}" for i in range(n_out)], dict(attrs or {}))
    values = [None if a is None else np.asarray(a) for a in arrays]
    return evaluate_node(registry.get("", op_type), node, values, opset)


def test_cast_to_float8_saturates_by_default_and_not_when_asked():
    import ml_dtypes

    x = np.array([1000.0, -1000.0, np.inf, -np.inf, np.nan, 0.3, 448.0, 464.0], dtype=np.float32)
    e4m3 = dtypes.float8e4m3fn.onnx_type
    (y,) = run("Cast", [x], {"to": e4m3})
    assert y.dtype == np.dtype(ml_dtypes.float8_e4m3fn)
    got = y.astype(np.float32)
    # saturate=1: out of range and +/-inf clamp to +/-448 (e4m3fn has no inf); NaN stays NaN; 0.3 rounds to nearest.
    np.testing.assert_array_equal(got[:4], [448, -448, 448, -448])
    assert np.isnan(got[4])
    assert got[5] == np.float32(ml_dtypes.float8_e4m3fn(0.3))
    assert got[6] == 448 and got[7] == 448  # 464 is the midpoint 448..480(NaN): rounds to 448
    (y,) = run("Cast", [x], {"to": e4m3, "saturate": 0})
    assert np.isnan(y.astype(np.float32)[[0, 1, 2, 3]]).all()  # no inf in e4m3fn: overflow is NaN
    big = np.float32([1e6, -1e6, np.inf, -np.inf])
    (y,) = run("Cast", [big], {"to": dtypes.float8e5m2.onnx_type, "saturate": 0})
    np.testing.assert_array_equal(y.astype(np.float32), [np.inf, -np.inf, np.inf, -np.inf])
    (y,) = run("Cast", [big], {"to": dtypes.float8e5m2.onnx_type})
    np.testing.assert_array_equal(y.astype(np.float32), [57344, -57344, 57344, -57344])


def test_cast_to_e8m0_rounding_modes():
    x = np.array([0.0, 0.124, 0.75, 1.1, 3.0, 1e39], dtype=np.float64)
    to = dtypes.float8e8m0.onnx_type
    up = run("Cast", [x], {"to": to})[0].astype(np.float64)
    np.testing.assert_array_equal(up, [2.0**-127, 0.125, 1.0, 2.0, 4.0, 2.0**127])
    down = run("Cast", [x], {"to": to, "round_mode": "down"})[0].astype(np.float64)
    np.testing.assert_array_equal(down[1:5], [0.0625, 0.5, 1.0, 2.0])
    nearest = run("Cast", [x], {"to": to, "round_mode": "nearest"})[0].astype(np.float64)
    np.testing.assert_array_equal(nearest[1:5], [0.125, 1.0, 1.0, 4.0])  # 0.75 and 3.0 are midpoints: ties go up
    # Without saturation, 0 and out-of-range values are NaN.
    loose = run("Cast", [x], {"to": to, "saturate": 0})[0].astype(np.float64)
    assert np.isnan(loose[0]) and np.isnan(loose[5])


def test_quantize_linear_to_int4_clamps_and_float8_saturates():
    x = np.array([-20.0, -2.5, 2.5, 3.5, 20.0], dtype=np.float32)
    zp = np.array(0, dtype=dtypes.int4.np_dtype)
    (y,) = run("QuantizeLinear", [x, np.float32(1.0), zp])
    assert y.dtype == dtypes.int4.np_dtype
    np.testing.assert_array_equal(y.astype(np.int32), [-8, -2, 2, 4, 7])  # half to even, clamped to [-8, 7]
    zp8 = np.array(0, dtype=dtypes.float8e4m3fn.np_dtype)
    (y,) = run("QuantizeLinear", [np.float32([1000.0, -1000.0]), np.float32(1.0), zp8])
    np.testing.assert_array_equal(y.astype(np.float32), [448, -448])
    (y,) = run("QuantizeLinear", [np.float32([1000.0]), np.float32(1.0), zp8], {"saturate": 0})
    assert np.isnan(y.astype(np.float32)).all()


def _gated_delta_by_hand(q, k, v, g, beta, scale):
    """One head, one batch entry, plain Python loops: the spec's gated_delta rule."""
    t_len, dk = k.shape
    dv = v.shape[1]
    s = [[0.0] * dv for _ in range(dk)]
    outs = []
    for t in range(t_len):
        a = float(np.exp(g[t]))
        s = [[a * s[i][j] for j in range(dv)] for i in range(dk)]
        recalled = [sum(s[i][j] * k[t, i] for i in range(dk)) for j in range(dv)]
        s = [[s[i][j] + beta[t] * k[t, i] * (v[t, j] - recalled[j]) for j in range(dv)] for i in range(dk)]
        outs.append([scale * sum(q[t, i] * s[i][j] for i in range(dk)) for j in range(dv)])
    return np.array(outs), np.array(s)


def test_linear_attention_gated_delta_matches_hand_recurrence_and_decode_continues_prefill():
    rng = np.random.default_rng(0)
    t_len, dk, dv = 5, 3, 2
    q = rng.standard_normal((1, t_len, dk))
    k = rng.standard_normal((1, t_len, dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((1, t_len, dv))
    g = -rng.random((1, t_len, 1))  # per-head decay, log space
    beta = rng.random((1, t_len, 1))
    attrs = {"q_num_heads": 1, "kv_num_heads": 1}
    y, state = run_opt("LinearAttention", [q, k, v, None, g, beta], attrs, n_out=2)
    want_y, want_s = _gated_delta_by_hand(q[0], k[0], v[0], g[0, :, 0], beta[0, :, 0], 1 / np.sqrt(dk))
    np.testing.assert_allclose(y[0], want_y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(state[0, 0], want_s, rtol=1e-12, atol=1e-12)
    # Prefill of 4 tokens, then one decode step from the carried state, equals the 5-token prefill.
    _, s4 = run_opt("LinearAttention", [q[:, :4], k[:, :4], v[:, :4], None, g[:, :4], beta[:, :4]], attrs, n_out=2)
    y5, s5 = run_opt("LinearAttention", [q[:, 4:], k[:, 4:], v[:, 4:], s4, g[:, 4:], beta[:, 4:]], attrs, n_out=2)
    np.testing.assert_allclose(y5[0, 0], y[0, 4], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(s5, state, rtol=1e-12, atol=1e-12)


def test_linear_attention_gqa_shares_kv_state_between_consecutive_query_heads():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 3, 4 * 2))  # 4 query heads of d_k 2
    k = rng.standard_normal((1, 3, 2 * 2))  # 2 kv heads
    v = rng.standard_normal((1, 3, 2 * 3))
    (y, _) = run_opt("LinearAttention", [q, k, v], {"q_num_heads": 4, "kv_num_heads": 2, "update_rule": "linear"},
                     n_out=2)
    for h in range(4):
        kv = h // 2
        (yh, _) = run_opt("LinearAttention", [q[..., 2 * h: 2 * h + 2], k[..., 2 * kv: 2 * kv + 2],
                                              v[..., 3 * kv: 3 * kv + 3]],
                          {"q_num_heads": 1, "kv_num_heads": 1, "update_rule": "linear"}, n_out=2)
        np.testing.assert_allclose(y[..., 3 * h: 3 * h + 3], yh, rtol=1e-12)


def test_linear_attention_shapes_with_unknown_dims():
    q = shape_info(None, None, 8)
    k = shape_info(None, None, 4)
    v = shape_info(None, None, 6)
    shapes = infer("LinearAttention", [q, k, v, None, shape_info(None, None, 2), shape_info(None, None, 1)],
                   attrs={"q_num_heads": 4, "kv_num_heads": 2}, opset=27, n_out=2)
    assert shapes == [(None, None, 12), (None, 2, 2, 3)]
    with pytest.raises(ShapeError):  # gated_delta (the default) needs decay and beta
        infer("LinearAttention", [q, k, v], attrs={"q_num_heads": 4, "kv_num_heads": 2}, opset=27, n_out=2)


def test_causal_conv_with_state_short_input_carries_padding_and_past():
    x = np.arange(1, 3, dtype=np.float32).reshape(1, 1, 2)  # length 2 < k - 1 = 3
    w = np.array([[[1.0, 10.0, 100.0, 1000.0]]], dtype=np.float32)
    y, state = run_opt("CausalConvWithState", [x, w], n_out=2)
    np.testing.assert_array_equal(y, [[[1000.0, 2100.0]]])
    np.testing.assert_array_equal(state, [[[0.0, 1.0, 2.0]]])  # zero padding is part of the carried state
    y2, state2 = run_opt("CausalConvWithState", [np.float32([[[3.0]]]), w, None, state], n_out=2)
    np.testing.assert_array_equal(y2, [[[0 * 1 + 1 * 10 + 2 * 100 + 3 * 1000]]])
    np.testing.assert_array_equal(state2, [[[1.0, 2.0, 3.0]]])
