"""Kernels added for real ONNX models (tests/real_models on opencl): ConvTranspose, BatchNormalization, reductions,
Pad, Cast, comparisons, Not, Where and Shape, each on opencl (on_fallback="error") against the numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import hetero

from .conftest import needs_device
from .test_kernels import check_onnx, rand

pytestmark = needs_device
RNG = np.random.default_rng(1)


@pytest.mark.parametrize("shape,w,attrs", [
    ((1, 4, 5, 6), (4, 3, 2, 2), {"strides": [2, 2]}),  # PP-OCR's upsampling: stride 2, kernel 2
    ((2, 4, 4, 5), (4, 2, 3, 3), {"group": 2, "pads": [1, 0, 1, 2], "strides": [2, 1], "dilations": [1, 2]}),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [2, 2], "output_padding": [1, 1], "pads": [1, 1, 1, 1]}),
    ((1, 2, 3, 3), (2, 2, 3, 3), {"strides": [2, 2], "output_shape": [6, 6]}),
    ((1, 3, 7), (3, 4, 3), {"strides": [2], "auto_pad": "SAME_UPPER"}),  # 1-D
])
def test_conv_transpose(shape, w, attrs):
    check_onnx("ConvTranspose", {"x": rand(*shape)}, attrs, consts={"w": rand(*w), "b": rand(w[1] * attrs.get(
        "group", 1))})


def test_batchnorm_alone():
    """Not after a Conv, so no pass folds it: the opencl kernel runs it."""
    var = np.abs(rand(5)) + 0.1
    check_onnx("BatchNormalization", {"x": rand(2, 5, 3, 4)}, {"epsilon": 1e-3},
               consts={"s": rand(5), "b": rand(5), "m": rand(5), "v": var}, optimize=False)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                                "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare"])
@pytest.mark.parametrize("axes,keep", [([1], 1), ([0, 2], 0), ([-1], 1), (None, 0)])
def test_reduce(op, axes, keep):
    x = rand(3, 70, 5, scale=0.5)  # 70: more than one work-group's worth of elements per output
    consts = {} if axes is None else {"axes": np.array(axes, np.int64)}
    check_onnx(op, {"x": x}, {"keepdims": keep}, consts=consts, opset=18, atol=1e-4)


def test_reduce_axes_attribute_and_logsum():
    check_onnx("ReduceMean", {"x": rand(2, 3, 8)}, {"axes": [2], "keepdims": 1}, opset=13)
    check_onnx("ReduceLogSum", {"x": np.abs(rand(4, 6)) + 0.5}, {"axes": [1]}, opset=13)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad(mode):
    pads = np.array([0, 2, 1, 0, 3, -1], np.int64)  # the last end pad is negative: a crop
    consts = {"pads": pads}
    if mode == "constant":
        consts["value"] = np.array(1.5, np.float32)
    check_onnx("Pad", {"x": rand(2, 4, 5)}, {"mode": mode}, consts=consts, opset=18)


def test_pad_int64_and_axes():
    x = RNG.integers(-5, 5, (3, 4)).astype(np.int64)
    check_onnx("Pad", {"x": x}, {}, consts={"pads": np.array([1, 2], np.int64), "value": np.array(7, np.int64),
                                            "axes": np.array([1], np.int64)}, opset=18)


@pytest.mark.parametrize("src,dst", [
    (np.float32, np.int64), (np.int64, np.float32), (np.int32, np.float16), (np.float16, np.float32),
    (np.float32, np.bool_), (np.bool_, np.float32), (np.uint8, np.int32), (np.float32, np.int8),
])
def test_cast(src, dst):
    x = (rand(3, 7, scale=40.0)).astype(src) if src != np.bool_ else RNG.random((3, 7)) > 0.5
    to = helper.np_dtype_to_tensor_dtype(np.dtype(dst))
    check_onnx("Cast", {"x": x}, {"to": to})


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32])
def test_compare(op, dtype):
    a = RNG.integers(0, 4, (2, 3, 4)).astype(dtype)
    b = RNG.integers(0, 4, (3, 1)).astype(dtype)  # broadcast
    check_onnx(op, {"a": a, "b": b})


def test_not_and_where():
    c = RNG.random((3, 1, 5)) > 0.5
    check_onnx("Not", {"c": c})
    check_onnx("Where", {"c": c, "a": rand(4, 5), "b": rand(3, 4, 1)})


def test_shape_feeds_a_reshape_without_a_download():
    """Shape on opencl writes its value from the host and keeps it as the tensor's host copy, so the Reshape after
    it reads the target shape without waiting for the device; start / end slice the dims."""
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=1),
             helper.make_node("Concat", ["one", "s"], ["t"], axis=0),
             helper.make_node("Reshape", ["y", "t"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4]),
                                           helper.make_tensor_value_info("y", TensorProto.FLOAT, [12])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
                              [helper.make_tensor("one", TensorProto.INT64, [1], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = hetero.Session(model, backends=["opencl"], on_fallback="error")
    y = rand(12)
    out = session.run({"x": rand(2, 3, 4), "y": y})["z"]
    np.testing.assert_array_equal(out, y.reshape(1, 3, 4))
    assert {p.op_type: p.backend for p in session.placement.nodes}["Shape"] == "opencl"


def test_conv_of_unknown_rank_input():
    """A conv whose input rank shape inference cannot tell (as after silero's If) is placed by its weight's rank."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [helper.make_tensor("w", TensorProto.FLOAT, [4, 2, 3], rand(4, 2, 3).reshape(-1))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rand(1, 2, 9)
    got = hetero.Session(model, backends=["opencl"], on_fallback="error").run({"x": x})["y"]
    want = hetero.Session(model, backends=["reference"]).run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("direction,bias,init", [("forward", True, True), ("reverse", False, False),
                                                 ("bidirectional", True, False)])
def test_lstm(direction, bias, init):
    """silero-vad's LSTM: all three outputs (Y, Y_h, Y_c), hidden size above one work-group's share per item."""
    t, b, feat, h = 4, 2, 5, 300
    d = 2 if direction == "bidirectional" else 1
    feeds = {"x": rand(t, b, feat)}
    names = ["x", "w", "r", "b" if bias else "", "", "h0" if init else "", "c0" if init else ""]
    consts = {"w": rand(d, 4 * h, feat, scale=0.3), "r": rand(d, 4 * h, h, scale=0.05)}
    if bias:
        consts["b"] = rand(d, 8 * h, scale=0.3)
    if init:
        feeds.update(h0=rand(d, b, h), c0=rand(d, b, h))
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape) for n, a in feeds.items()]
    node = helper.make_node("LSTM", names, ["y", "yh", "yc"], hidden_size=h, direction=direction)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                    for o in ("y", "yh", "yc")],
                              [numpy_helper.from_array(a, n) for n, a in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    got = hetero.Session(model, backends=["opencl"], on_fallback="error").run(feeds)
    want = hetero.Session(model, backends=["reference"]).run(feeds)
    for name in ("y", "yh", "yc"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=2e-5, err_msg=name)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min"])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("shape", [(40, 30), (3, 4)], ids=["kernel", "host"])
def test_integer_binary(op, dtype, shape):
    """Large operands run the kernel; small ones uploaded from the host are computed there (their shadows) and
    written back without a launch. Div truncates toward zero (negative operands included)."""
    a = RNG.integers(-50, 50, shape).astype(dtype)
    b = RNG.integers(1, 9, shape[-1:]).astype(dtype) * np.where(RNG.random(shape[-1:]) < 0.5, -1, 1).astype(dtype)
    check_onnx(op, {"a": a, "b": b})
