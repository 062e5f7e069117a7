"""QDQ-quantized MatMul and Conv (onnxruntime's quantize_static: DequantizeLinear of 8-bit activations and of
constant 8-bit weights in front of a float op) as one int8 op on the native kernels: ``fuse_qdq_matmul`` ->
``MatMulIntegerScaled``, ``fuse_qdq_conv`` -> ``ConvIntegerScaled`` (per-channel weight scales, the int32 bias),
against a float64 numpy reference of the dequantized operands and against onnxruntime; the weights' 8-bit values kept
by constant folding only where the pass takes them. Edge shapes: one row, rank-3 activations, K not a multiple of 4,
one output column, strided and grouped convs."""

from __future__ import annotations

import numpy as np
import pytest

import hetero

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _rand8(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def _elem(dtype: type) -> int:
    return TensorProto.UINT8 if dtype == np.uint8 else TensorProto.INT8


def _qdq_matmul_model(x_shape: tuple[int, ...], n: int, xdt: type, x_zp: int, per_column: bool, bias: bool,
                      seed: int = 0) -> tuple[object, dict[str, np.ndarray], np.ndarray]:
    """xq (an input) -> DequantizeLinear -> MatMul by DequantizeLinear(int8 W, axis 1) [-> Add bias]; the model,
    its feeds and the float64 reference of its output."""
    rng = np.random.default_rng(seed)
    k = x_shape[-1]
    w = _rand8(rng, (k, n), np.int8)
    w_scale = rng.uniform(0.002, 0.02, n).astype(np.float32) if per_column else np.array(0.011, np.float32)
    w_zp = np.zeros(n, np.int8) if per_column else np.array(0, np.int8)
    x_scale, zx = np.array(0.037, np.float32), np.array(x_zp, xdt)
    nodes = [helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["x"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=1),
             helper.make_node("MatMul", ["x", "w"], ["y0" if bias else "y"])]
    inits = [numpy_helper.from_array(x_scale, "xs"), numpy_helper.from_array(zx, "xz"),
             numpy_helper.from_array(w, "wq"), numpy_helper.from_array(w_scale, "ws"),
             numpy_helper.from_array(w_zp, "wz")]
    b = rng.normal(size=n).astype(np.float32)
    if bias:
        nodes.append(helper.make_node("Add", ["y0", "b"], ["y"]))
        inits.append(numpy_helper.from_array(b, "b"))
    graph = helper.make_graph(nodes, "qdq_matmul", [helper.make_tensor_value_info("xq", _elem(xdt), list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    xq = _rand8(rng, x_shape, xdt)
    want = ((xq.astype(np.float64) - x_zp) * float(x_scale)) @ (w.astype(np.float64) * w_scale.astype(np.float64))
    return model, {"xq": xq}, want + (b if bias else 0.0)


def _check(got: np.ndarray, want: np.ndarray) -> None:
    # float32 products of exact int32 sums: rounding only
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("x_shape, n", [((1, 16), 8), ((5, 7), 3), ((2, 9, 64), 50), ((33, 130), 1),
                                        ((3, 400, 96), 40)])
@pytest.mark.parametrize("xdt, x_zp", [(np.uint8, 131), (np.int8, 0), (np.int8, -5)])
@pytest.mark.parametrize("per_column, bias", [(False, False), (True, True), (True, False)])
def test_qdq_matmul_fused_against_float64(threads, x_shape, n, xdt, x_zp, per_column, bias):
    model, feeds, want = _qdq_matmul_model(x_shape, n, xdt, x_zp, per_column, bias)
    session = hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error")
    assert session.rewrites["fuse_qdq_matmul"] == 1
    ops = [node.op_type for node in session.graph.nodes]
    assert ops == ["MatMulIntegerScaled"], ops  # both DequantizeLinear gone, the bias in the output stage
    assert session.graph.initializers["wq"].dtype == np.int8  # packed as the 8-bit weight, not a folded float
    _check(session.run(feeds)["y"], want)
    unfused = hetero.Session(model.SerializeToString(), backends=["cpu"], optimize=False)
    _check(unfused.run(feeds)["y"], want)


def test_qdq_matmul_against_onnxruntime(threads):
    ort = pytest.importorskip("onnxruntime")
    model, feeds, want = _qdq_matmul_model((2, 17, 96), 48, np.uint8, 128, True, True, seed=3)
    got = hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error").run(feeds)["y"]
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    _check(got, want)
    _check(ref, want)


def test_qdq_matmul_weight_shared_with_a_float_op_stays_float():
    """A weight that another node reads as a float is folded as before (no 8-bit copy kept for one reader)."""
    model, feeds, want = _qdq_matmul_model((4, 12), 6, np.uint8, 7, True, False)
    graph = model.graph
    graph.node.append(helper.make_node("Add", ["w", "w"], ["w2"]))
    graph.output.append(helper.make_tensor_value_info("w2", TensorProto.FLOAT, None))
    session = hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error")
    assert session.rewrites["fuse_qdq_matmul"] == 0
    out = session.run(feeds)
    _check(out["y"], want)
    w = numpy_helper.to_array(graph.initializer[2]).astype(np.float32)
    np.testing.assert_array_equal(out["w2"], 2 * (w * numpy_helper.to_array(graph.initializer[3])))


def test_qdq_matmul_leaves_other_patterns_alone():
    """A weight DequantizeLinear along rows (axis 0: one scale per input row) is not the per-column form the int8
    GEMM's output stage scales: folded to float as before."""
    model, feeds, _ = _qdq_matmul_model((4, 12), 6, np.uint8, 7, True, False)
    model.graph.node[1].attribute[0].i = 0  # per-row scales of a (12, 6) weight: not a valid per-column form
    model.graph.initializer[3].CopyFrom(numpy_helper.from_array(np.full(12, 0.01, np.float32), "ws"))
    model.graph.initializer[4].CopyFrom(numpy_helper.from_array(np.zeros(12, np.int8), "wz"))
    session = hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error")
    assert session.rewrites["fuse_qdq_matmul"] == 0
    xq = feeds["xq"]
    w = numpy_helper.to_array(model.graph.initializer[2]).astype(np.float64) * 0.01
    _check(session.run(feeds)["y"], ((xq.astype(np.float64) - 7) * 0.037) @ w)


CONV_CASES = [
    {"x": (1, 80, 37), "w": (16, 80, 3), "pads": [1, 1], "strides": [1]},
    {"x": (2, 24, 40), "w": (24, 24, 3), "pads": [1, 1], "strides": [2]},  # Whisper's second conv, smaller
    {"x": (1, 3, 9, 11), "w": (8, 3, 3, 3), "pads": [1, 1, 1, 1], "strides": [2, 2]},
    {"x": (1, 8, 7, 6), "w": (6, 4, 1, 1), "group": 2},
    {"x": (1, 5, 1), "w": (1, 5, 1)},  # one output channel, one position
]


def _qdq_conv_model(case: dict, xdt: type, x_zp: int, per_channel: bool, bias: bool):
    """xq -> DequantizeLinear -> Conv by DequantizeLinear(int8 W, axis 0) with DequantizeLinear(int32 bias, scale
    x_scale x w_scale) as quantize_static writes it."""
    rng = np.random.default_rng(11)
    cout = case["w"][0]
    attrs = {k: v for k, v in case.items() if k in ("pads", "strides", "group")}
    w = _rand8(rng, case["w"], np.int8)
    w_scale = rng.uniform(0.002, 0.02, cout).astype(np.float32) if per_channel else np.array(0.013, np.float32)
    x_scale = np.array(0.029, np.float32)
    nodes = [helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["x"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0),
             helper.make_node("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["y"], **attrs)]
    inits = [numpy_helper.from_array(x_scale, "xs"), numpy_helper.from_array(np.array(x_zp, xdt), "xz"),
             numpy_helper.from_array(w, "wq"), numpy_helper.from_array(w_scale, "ws"),
             numpy_helper.from_array(np.zeros(cout, np.int8) if per_channel else np.array(0, np.int8), "wz")]
    if bias:  # large int32 values: their float32 products are rounded (the pass recovers the integers)
        bias_scale = (x_scale * np.broadcast_to(w_scale, (cout,))).astype(np.float32)
        bq = rng.integers(-3_000_000, 3_000_000, cout).astype(np.int32)
        nodes.insert(2, helper.make_node("DequantizeLinear", ["bq", "bs", "bz"], ["b"], axis=0))
        inits += [numpy_helper.from_array(bq, "bq"), numpy_helper.from_array(bias_scale, "bs"),
                  numpy_helper.from_array(np.zeros(cout, np.int32), "bz")]
    graph = helper.make_graph(nodes, "qdq_conv", [helper.make_tensor_value_info("xq", _elem(xdt), list(case["x"]))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), {"xq": _rand8(rng, case["x"], xdt)}


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("xdt, x_zp", [(np.uint8, 127), (np.int8, 3)])
@pytest.mark.parametrize("per_channel, bias", [(True, True), (False, True), (True, False)])
def test_qdq_conv_fused_against_onnxruntime_unfused(isa, threads, case, xdt, x_zp, per_channel, bias):
    """The fused conv against onnxruntime running the graph as written (float convs of the dequantized values)."""
    ort = pytest.importorskip("onnxruntime")
    model, feeds = _qdq_conv_model(case, xdt, x_zp, per_channel, bias)
    session = hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error")
    assert session.rewrites["fuse_qdq_conv"] == 1
    assert [node.op_type for node in session.graph.nodes] == ["ConvIntegerScaled"]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
        None, feeds)[0]
    got = session.run(feeds)["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    ref = hetero.Session(model.SerializeToString(), backends=["reference"]).run(feeds)["y"]  # the fused op's reference
    np.testing.assert_allclose(ref, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_qdq_conv_float_bias_not_a_multiple_of_the_step_stays_float():
    """A float bias that is no int32 multiple of x_scale x w_scale leaves the Conv unfused (and right)."""
    model, feeds = _qdq_conv_model(CONV_CASES[0], np.uint8, 127, True, False)
    model.graph.node[2].input.append("b")
    model.graph.initializer.append(numpy_helper.from_array(np.linspace(-1, 1, 16).astype(np.float32) + 1e-3, "b"))
    session = hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error")
    assert session.rewrites["fuse_qdq_conv"] == 0
    unfused = hetero.Session(model.SerializeToString(), backends=["reference"], optimize=False).run(feeds)["y"]
    np.testing.assert_allclose(session.run(feeds)["y"], unfused, rtol=1e-4, atol=1e-4)


def _qdq_activations_model(a_dims: list, b_dims: list, adt: type, bdt: type):
    """aq, bq (inputs) -> DequantizeLinear each -> MatMul: a QDQ attention's Q Kᵀ / P V."""
    nodes = [helper.make_node("DequantizeLinear", ["aq", "as", "az"], ["a"]),
             helper.make_node("DequantizeLinear", ["bq", "bs", "bz"], ["b"]),
             helper.make_node("MatMul", ["a", "b"], ["y"])]
    inits = [numpy_helper.from_array(np.array(0.021, np.float32), "as"),
             numpy_helper.from_array(np.array(120 if adt == np.uint8 else -3, adt), "az"),
             numpy_helper.from_array(np.array(0.017, np.float32), "bs"),
             numpy_helper.from_array(np.array(9 if bdt == np.uint8 else 2, bdt), "bz")]
    graph = helper.make_graph(nodes, "qdq_attention", [helper.make_tensor_value_info("aq", _elem(adt), a_dims),
                                                       helper.make_tensor_value_info("bq", _elem(bdt), b_dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("a_shape, b_shape", [
    ((2, 3, 130, 64), (2, 3, 64, 130)),  # B packed per batch at each call, the int8 GEMM
    ((1, 2, 400, 64), (1, 2, 64, 41)),
    ((2, 5, 7, 12), (2, 5, 12, 9)),  # small heads: one native call for every batch (qgemm_batched_f32)
    ((3, 1, 5), (3, 5, 1)),
    ((2, 3, 5, 8), (1, 3, 8, 4)),  # batch dims that broadcast, known only at run time: numpy
])
@pytest.mark.parametrize("adt, bdt", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
def test_qdq_activation_matmul_against_float64(threads, a_shape, b_shape, adt, bdt):
    rank = len(a_shape)
    symbolic = [f"a{i}" for i in range(rank - 2)], [f"b{i}" for i in range(rank - 2)]
    model = _qdq_activations_model([*symbolic[0], *a_shape[-2:]], [*symbolic[1], *b_shape[-2:]], adt, bdt)
    session = hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error")
    assert session.rewrites["fuse_qdq_matmul"] == 1
    assert [node.op_type for node in session.graph.nodes] == ["MatMulIntegerScaled"]
    rng = np.random.default_rng(13)
    aq, bq = _rand8(rng, a_shape, adt), _rand8(rng, b_shape, bdt)
    a_zp, b_zp = (120 if adt == np.uint8 else -3), (9 if bdt == np.uint8 else 2)
    want = ((aq.astype(np.float64) - a_zp) * np.float64(np.float32(0.021))) @ \
        ((bq.astype(np.float64) - b_zp) * np.float64(np.float32(0.017)))
    for _ in range(2):  # the second run replays the bound call
        _check(session.run({"aq": aq, "bq": bq})["y"], want)


def test_qdq_activation_matmul_known_broadcast_not_fused():
    model = _qdq_activations_model([2, 3, 5, 8], [1, 3, 8, 4], np.uint8, np.int8)
    session = hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error")
    assert session.rewrites["fuse_qdq_matmul"] == 0
