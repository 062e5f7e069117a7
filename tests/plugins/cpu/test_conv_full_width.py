"""A 1 x W conv over the whole unpadded width (madmom's beat TCN: 16 -> 16, 1 x 8 on 2996 x 8 frames): CpuConv runs
it as a 1x1 conv over C * W channels of the input transposed to [N, C, W, H] (the im2col copied runs of one float).
Against a float64 conv on every ISA at 1 and 2 threads, with the cases beside it that must keep the plain path (a
narrower kernel, width pads, 1-D, groups) and a fused activation; NaN-prefilled outputs would show a missed row."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import hetero
from hetero_cpu.kernels.nn import CpuConv

from .test_native import _conv_ref

CASES = [
    # (N, C, H, W, Cout, kw, extra attrs, full width taken)
    (1, 16, 2996, 8, 16, 8, {}, True),  # madmom's TCN
    (2, 5, 37, 13, 3, 13, {"pads": [2, 0, 1, 0]}, True),  # odd sizes, H pads, two images
    (1, 1, 81, 7, 24, 7, {"strides": [3, 1]}, True),  # one input channel, H stride
    (1, 16, 33, 2, 48, 2, {"strides": [2, 5], "pads": [1, 0, 0, 0]}, True),  # W stride is moot
    (1, 6, 1, 9, 4, 9, {}, True),  # one row
    (1, 8, 40, 8, 8, 5, {}, False),  # narrower than W: three output columns
    (1, 8, 40, 6, 8, 8, {"pads": [0, 1, 0, 1]}, False),  # W padded
    (1, 8, 40, 8, 8, 8, {"group": 2}, False),
]


def _model(x_shape, w, bias, attrs, activation: str | None):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if activation else "y"], **attrs)]
    if activation:
        nodes.append(helper.make_node(activation, ["c"], ["y"]))
    graph = helper.make_graph(nodes, "full_width", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("case", CASES, ids=[f"{c[1]}x{c[2]}x{c[3]}-k{c[5]}-{c[7]}" for c in CASES])
@pytest.mark.parametrize("activation", [None, "Relu"])
def test_full_width_conv(isa, threads, case, activation):
    n, c, h, width, cout, kw, attrs, taken = case
    rng = np.random.default_rng(7)
    group = int(attrs.get("group", 1))
    x = rng.normal(size=(n, c, h, width)).astype(np.float32)
    w = rng.normal(size=(cout, c // group, 1, kw)).astype(np.float32)
    bias = rng.normal(size=cout).astype(np.float32)
    session = hetero.Session(_model(list(x.shape), w, bias, attrs, activation), backends=["cpu"], on_fallback="error")
    y = session.run({"x": x})["y"]
    pads = attrs.get("pads", [0, 0, 0, 0])
    want = _conv_ref(x, w, bias, tuple(attrs.get("strides", [1, 1])), (pads[0], pads[1], pads[2], pads[3]), (1, 1),
                     group)
    if activation:
        want = np.maximum(want, 0)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.sqrt(c * kw))
    convs = [k for _, k in session.kernels() if isinstance(k, CpuConv)]
    assert len(convs) == 1 and (convs[0].full_width is not None) == taken
