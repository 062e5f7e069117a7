"""hetero.ConvResidual (ir.passes.fuse_conv_residual): a conv whose output stage adds a residual before the Relu.

The fused conv must give the unfused graph's bits (the conv, then Add, then Relu) on every conv path it reaches: the
1x1 paths add the residual per block (pointwise tiles, the GEMM and its small-M tail, the strided 1x1's copy), the
others (Winograd, cblk, direct, dot, depthwise) in one pass after the conv."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetero
from conftest import make_model

_native = pytest.importorskip("hetero_cpu._native")

# (N, C, H, W, Cout, kernel, stride, pad, group): 1x1 (tiles / GEMM, ragged tails, deep K), strided 1x1, 3x3
# (Winograd, direct / cblk), strided 3x3, odd channel counts, 1-pixel maps, depthwise
SHAPES = [
    (1, 64, 14, 14, 256, 1, 1, 0, 1),
    (1, 256, 7, 7, 64, 1, 1, 0, 1),
    (2, 17, 9, 11, 29, 1, 1, 0, 1),
    (1, 512, 5, 5, 130, 1, 1, 0, 1),
    (1, 300, 30, 30, 16, 1, 1, 0, 1),
    (1, 64, 15, 15, 128, 1, 2, 0, 1),
    (1, 32, 28, 28, 32, 3, 1, 1, 1),
    (1, 64, 14, 14, 64, 3, 1, 1, 1),
    (1, 3, 17, 13, 5, 3, 2, 1, 1),
    (2, 7, 1, 1, 9, 1, 1, 0, 1),
    (1, 16, 1, 1, 16, 3, 1, 1, 1),
    (1, 24, 12, 12, 24, 3, 1, 1, 24),
    (1, 8, 6, 6, 12, 3, 1, 1, 2),
]


def _case(shape, seed):
    n, c, h, w, cout, k, s, p, g = shape
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, c, h, w)).astype(np.float32)
    wt = (rng.normal(size=(cout, c // g, k, k)) / np.sqrt(c // g * k * k)).astype(np.float32)
    b = rng.normal(size=cout).astype(np.float32)
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    r = rng.normal(size=(n, cout, ho, wo)).astype(np.float32)
    return x, wt, b, r, (s, s), (p, p, p, p), g


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_native_residual_matches_conv_then_add(shape, relu):
    x, wt, b, r, strides, pads, g = _case(shape, 3)
    r.flat[:3] = [np.nan, -0.0, np.inf]
    packed = _native.prepack_conv(wt, g, "high")
    act = "relu" if relu else "none"
    plain = np.empty_like(r)
    _native.conv2d_packed(x, packed, b, plain, strides, pads, (1, 1))
    want = plain + r
    if relu:
        want = np.empty_like(r)
        _native.binary("add_relu", plain, r, want)
    fused = np.full_like(r, 7.0)
    _native.conv2d_packed(x, packed, b, fused, strides, pads, (1, 1), act, 0.0, 0.0, r)
    np.testing.assert_array_equal(fused, want)  # the same float operations in the same order: the same bits
    assert np.array_equal(fused, want, equal_nan=True)


def test_native_residual_rejects_other_activations_and_shapes():
    x, wt, b, r, strides, pads, g = _case(SHAPES[0], 4)
    packed = _native.prepack_conv(wt, g, "high")
    out = np.empty_like(r)
    with pytest.raises(Exception, match="relu"):
        _native.conv2d_packed(x, packed, b, out, strides, pads, (1, 1), "sigmoid", 0.0, 0.0, r)
    with pytest.raises(Exception, match="shape"):
        _native.conv2d_packed(x, packed, b, out, strides, pads, (1, 1), "none", 0.0, 0.0, r[:, :1])


def _block(shape, relu=True, shortcut_conv=False, conv_read_twice=False, broadcast=False):
    """A residual block's tail: y = Relu(Conv(x) + r), r a second input (or a second conv of x)."""
    x, wt, b, r, strides, pads, g = _case(shape, 5)
    attrs = dict(strides=list(strides), pads=list(pads), group=g)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs)]
    inits = [("w", wt), ("b", b)]
    other, inputs = "r", [("x", TensorProto.FLOAT, list(x.shape))]
    if shortcut_conv:  # a projection shortcut: the Add of two convs
        ws = (np.random.default_rng(6).normal(size=wt.shape) / 4).astype(np.float32)
        nodes.append(helper.make_node("Conv", ["x", "ws"], ["sc"], **attrs))
        inits.append(("ws", ws))
        other = "sc"
    else:
        inputs.append(("r", TensorProto.FLOAT, [1, r.shape[1], 1, 1] if broadcast else list(r.shape)))
    nodes.append(helper.make_node("Add", ["c", other], ["a"]))
    outputs = [("y", TensorProto.FLOAT, None)]
    if relu:
        nodes.append(helper.make_node("Relu", ["a"], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", ["a"], ["y"]))
    if conv_read_twice:
        nodes.append(helper.make_node("Neg", ["c"], ["z"]))
        outputs.append(("z", TensorProto.FLOAT, None))
    feeds = {"x": x}
    if not shortcut_conv:
        feeds["r"] = r[:1, :, :1, :1].copy() if broadcast else r
    return make_model(nodes, inputs, outputs, inits), feeds


def _ops(session):
    return [n.op_type for n in session.graph.nodes]


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fused_graph_matches_unfused(shape, relu):
    model, feeds = _block(shape, relu=relu)
    fused = hetero.Session(model, backends=["cpu"], on_fallback="error")
    assert fused.rewrites["fuse_conv_residual"] == 1
    assert "ConvResidual" in _ops(fused) and "Add" not in _ops(fused) and "AddRelu" not in _ops(fused)
    plain = hetero.Session(model, backends=["cpu"], optimize=False, on_fallback="error")
    for _ in range(2):  # the first run and the replay
        np.testing.assert_array_equal(fused.run(feeds)["y"], plain.run(feeds)["y"])
    ref = hetero.Session(model, backends=["reference"], on_fallback="error")
    np.testing.assert_allclose(ref.run(feeds)["y"], plain.run(feeds)["y"], rtol=1e-4, atol=1e-4)


def test_add_of_two_convs_fuses_the_later_one():
    model, feeds = _block(SHAPES[0], shortcut_conv=True)
    fused = hetero.Session(model, backends=["cpu"], on_fallback="error")
    assert fused.rewrites["fuse_conv_residual"] == 1
    assert _ops(fused) == ["Conv", "ConvResidual"]
    assert fused.graph.nodes[1].inputs[3] == "c"  # the shortcut conv (written last) took the first one's output
    plain = hetero.Session(model, backends=["cpu"], optimize=False, on_fallback="error")
    np.testing.assert_array_equal(fused.run(feeds)["y"], plain.run(feeds)["y"])


@pytest.mark.parametrize("case", ["conv_read_twice", "broadcast"])
def test_left_alone(case):
    model, feeds = _block(SHAPES[2], **{case: True})
    session = hetero.Session(model, backends=["cpu"], on_fallback="error")
    assert session.rewrites["fuse_conv_residual"] == 0
    assert "ConvResidual" not in _ops(session)
    plain = hetero.Session(model, backends=["reference"], optimize=False, on_fallback="error")
    for name, value in session.run(feeds).items():
        np.testing.assert_allclose(value, plain.run(feeds)[name], rtol=1e-4, atol=1e-4)


def test_not_for_a_backend_without_the_kernel():
    from hetero.ir import passes

    kept = passes.for_backend(lambda key: key != ("hetero", "ConvResidual"))
    assert passes.fuse_conv_residual not in kept and passes.fuse_add_relu in kept


def test_dynamic_batch_fuses_and_a_broadcast_batch_stays_correct():
    """A dynamic batch (open_nsfw's, ResNet-18's) fuses; a Z of batch 1 against a batch of 2 (the Add broadcast it)
    still gives the unfused graph's values."""
    x, wt, b, r, *_ = _case((2, 17, 9, 11, 29, 1, 1, 0, 1), 7)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Add", ["r", "c"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    model = make_model(nodes, [("x", TensorProto.FLOAT, ["N", 17, 9, 11]), ("r", TensorProto.FLOAT, ["N", 29, 9, 11])],
                       [("y", TensorProto.FLOAT, None)], [("w", wt), ("b", b)])
    fused = hetero.Session(model, backends=["cpu"], on_fallback="error")
    assert fused.rewrites["fuse_conv_residual"] == 1
    plain = hetero.Session(model, backends=["cpu"], optimize=False, on_fallback="error")
    for feeds in ({"x": x, "r": r}, {"x": x, "r": r[:1].copy()}, {"x": x[:1].copy(), "r": r[:1].copy()}):
        for _ in range(2):
            np.testing.assert_array_equal(fused.run(feeds)["y"], plain.run(feeds)["y"])
