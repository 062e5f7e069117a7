"""Static shape inference of the trickier op schemas: unknown dims (None), value inputs, opset differences."""

from __future__ import annotations

import numpy as np
import pytest

from hetero import dtypes
from hetero.errors import ShapeError
from hetero.ir.graph import Graph, Node
from hetero.ops import registry
from hetero.runtime.infer import evaluate_node, infer_node
from hetero.tensor import TensorInfo

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
