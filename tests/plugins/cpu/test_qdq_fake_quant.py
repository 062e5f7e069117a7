"""A QDQ model's int8 product outputs: ``fuse_matmul_integer_fake_quant`` folds ``MatMulIntegerScaled -> QuantizeLinear
-> DequantizeLinear [-> Add(bias row)]`` into the MatMulIntegerScaled (inputs 8-10), whose cpu kernel applies them in
place (``fake_quant``: the same bits as the three nodes); and ``qgemm_batched_f32``, the batched product of two
run-time 8-bit operands (a QDQ attention's Q Kᵀ / P V) in one native call. Each against numpy (int64 sums, the
native QuantizeLinear / DequantizeLinear kernels) bit for bit on every ISA at 1 and 2 threads, with edge shapes (one
row, one column, K not a multiple of 4, K = 0, 1536-wide rows), NaN / inf and half-step values; the pass against
the unfused session and the reference backend, and the patterns it leaves alone."""

from __future__ import annotations

import numpy as np
import pytest

import hetero
from hetero.ir import passes

_native = pytest.importorskip("hetero_cpu._native")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from .test_qdq_fusion import _rand8  # noqa: E402


# -- the native kernels --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (3, 16), (5, 129), (2, 17, 33), (128, 1536), (0, 5)])
@pytest.mark.parametrize("zp", [np.array([128], np.uint8), np.array([0], np.uint8), np.array([3], np.int8),
                                np.array([-7], np.int8)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fake_quant_is_quantize_then_dequantize_then_add(isa, threads, shape, zp, with_bias):
    rng = np.random.default_rng(len(shape) + shape[-1])
    scale = np.array([0.05], np.float32)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    flat = x.reshape(-1)
    specials = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 0.025, -0.075, 0.125, 6.375, -6.425], np.float32)
    flat[: min(flat.size, specials.size)] = specials[: flat.size]  # NaN -> the low bound; half steps: to even
    if flat.size > 64:
        flat[16:64] = (np.arange(48) - 24 + 0.5).astype(np.float32) * scale[0]  # exact half steps
    bias = rng.standard_normal(shape[-1]).astype(np.float32) if with_bias else None
    q = np.empty(shape, zp.dtype)
    want = np.empty_like(x)
    _native.quantize_linear(x, scale, zp, q)
    _native.dequantize_linear(q, scale, zp, want)
    if bias is not None:
        want = want + bias
    got = x.copy()
    _native.fake_quant(got, scale, zp, bias)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
    # and the values: the float32 quotient x / scale (QuantizeLinear divides in the scale's type) rounded to even,
    # saturated, dequantized in float64
    lo, hi = np.iinfo(zp.dtype).min, np.iinfo(zp.dtype).max
    with np.errstate(invalid="ignore", over="ignore"):
        quotient = (x / scale[0]).astype(np.float64)
        q64 = np.clip(np.nan_to_num(np.rint(quotient), nan=lo - int(zp[0])) + int(zp[0]), lo, hi)
    ref = ((q64 - int(zp[0])) * np.float64(scale[0])).astype(np.float32)
    if bias is not None:
        ref = ref + bias
    np.testing.assert_array_equal(got, ref)


def test_fake_quant_refusals():
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(Exception, match="bias"):
        _native.fake_quant(x, np.array([0.1], np.float32), np.array([0], np.uint8), np.zeros(3, np.float32))
    with pytest.raises(Exception, match="single"):
        _native.fake_quant(x, np.array([0.1, 0.2], np.float32), np.array([0], np.uint8), None)


@pytest.mark.parametrize("batch, m, k, n", [(24, 64, 32, 64), (24, 64, 64, 32), (1, 1, 1, 1), (3, 5, 7, 9),
                                            (2, 1, 33, 17), (1, 70, 3, 5), (2, 3, 0, 4), (4, 17, 64, 3),
                                            (2, 9, 130, 66)])
@pytest.mark.parametrize("adt, bdt", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.uint8),
                                      (np.int8, np.int8)])
def test_qgemm_batched_f32_against_int64(isa, threads, batch, m, k, n, adt, bdt):
    rng = np.random.default_rng(batch * 1000 + m * 10 + k)
    a, b = _rand8(rng, (batch, m, k), adt), _rand8(rng, (batch, k, n), bdt)
    za, zb = np.array(rng.integers(0, 100), adt), np.array(rng.integers(0, 100), bdt)
    scale, factor = np.array([0.013], np.float32), np.array([0.7], np.float32)
    for f in (factor, None):
        out = np.full((batch, m, n), np.nan, np.float32)
        _native.qgemm_batched_f32(a, b, za, zb, scale, f, out)
        acc = np.matmul(a.astype(np.int64) - int(za), b.astype(np.int64) - int(zb))
        want = acc.astype(np.float32) * (scale if f is None else scale * f)
        np.testing.assert_array_equal(out, want)


def test_qgemm_batched_f32_rank4_and_refusals():
    rng = np.random.default_rng(5)
    a, b = _rand8(rng, (2, 3, 6, 8), np.uint8), _rand8(rng, (2, 3, 8, 5), np.int8)
    out = np.empty((2, 3, 6, 5), np.float32)
    _native.qgemm_batched_f32(a, b, None, None, np.array([0.5], np.float32), None, out)
    np.testing.assert_array_equal(out, (a.astype(np.int64) @ b.astype(np.int64)).astype(np.float32) * 0.5)
    with pytest.raises(Exception, match="batch"):
        _native.qgemm_batched_f32(a, b[:1], None, None, np.array([0.5], np.float32), None, out)
    with pytest.raises(Exception, match="chain"):
        _native.qgemm_batched_f32(a, np.ascontiguousarray(b[..., :7, :]), None, None, np.array([0.5], np.float32),
                                  None, out)


# -- the pass --------------------------------------------------------------------------------------------------------
def _qdq_linear_model(x_shape: list, n: int, bias: str = "const", dq_zp: int = 121, output_q: bool = False,
                      seed: int = 0) -> tuple[object, dict[str, np.ndarray]]:
    """xq -> DQ -> MatMul by DQ(int8 W) -> Q -> DQ [-> Add(bias)]: a QDQ MiniLM's projection (bias "const": a
    constant row, "input": a graph input, "": none); ``output_q``: the Q's bytes are a graph output too."""
    rng = np.random.default_rng(seed)
    k = x_shape[-1]
    nodes = [helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["x"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=1),
             helper.make_node("MatMul", ["x", "w"], ["p"]),
             helper.make_node("QuantizeLinear", ["p", "ys", "yz"], ["pq"]),
             helper.make_node("DequantizeLinear", ["pq", "ys", "yz2"], ["pd" if bias else "y"])]
    inits = [numpy_helper.from_array(np.array(0.037, np.float32), "xs"),
             numpy_helper.from_array(np.array(128, np.uint8), "xz"),
             numpy_helper.from_array(_rand8(rng, (k, n), np.int8), "wq"),
             numpy_helper.from_array(rng.uniform(0.002, 0.02, n).astype(np.float32), "ws"),
             numpy_helper.from_array(np.zeros(n, np.int8), "wz"),
             numpy_helper.from_array(np.array(0.021, np.float32), "ys"),
             numpy_helper.from_array(np.array(121, np.uint8), "yz"),
             numpy_helper.from_array(np.array(dq_zp, np.uint8), "yz2")]
    inputs = [helper.make_tensor_value_info("xq", TensorProto.UINT8, x_shape)]
    feeds: dict[str, np.ndarray] = {"xq": _rand8(rng, tuple(d if isinstance(d, int) else 3 for d in x_shape),
                                                  np.uint8)}
    if bias == "const":
        nodes.append(helper.make_node("Add", ["pd", "b"], ["y"]))
        inits.append(numpy_helper.from_array(rng.normal(size=n).astype(np.float32), "b"))
    elif bias == "input":
        nodes.append(helper.make_node("Add", ["pd", "b"], ["y"]))
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [n]))
        feeds["b"] = rng.normal(size=n).astype(np.float32)
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if output_q:
        outputs.append(helper.make_tensor_value_info("pq", TensorProto.UINT8, None))
    graph = helper.make_graph(nodes, "qdq_linear", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), feeds


def _without_fake_quant(model: object, backend: str) -> hetero.Session:
    """The session with every default pass but fuse_matmul_integer_fake_quant (as benchmarks/onnx_pass_ab.py)."""
    with passes.leaving_out("fuse_matmul_integer_fake_quant"):
        return hetero.Session(model.SerializeToString(), backends=[backend], on_fallback="error")


@pytest.mark.parametrize("x_shape, n", [([1, 16], 8), ([5, 7], 3), (["b", 9, 64], 50), ([33, 130], 1),
                                        ([2, 64, 384], 1536)])
@pytest.mark.parametrize("bias", ["const", ""])
def test_fake_quant_pass_same_bits_as_the_unfused_nodes(threads, x_shape, n, bias):
    model, feeds = _qdq_linear_model(x_shape, n, bias)
    session = hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error")
    assert session.rewrites["fuse_matmul_integer_fake_quant"] == 1
    assert [node.op_type for node in session.graph.nodes] == ["MatMulIntegerScaled"]
    unfused = _without_fake_quant(model, "cpu")
    assert unfused.rewrites["fuse_qdq_matmul"] == 1
    assert [node.op_type for node in unfused.graph.nodes] == \
        ["MatMulIntegerScaled", "QuantizeLinear", "DequantizeLinear", *(["Add"] if bias else [])]
    want = unfused.run(feeds)["y"]
    for _ in range(2):  # the second run replays the bound calls
        np.testing.assert_array_equal(session.run(feeds)["y"].view(np.int32), want.view(np.int32))
    # the reference backend's fused op: the same nodes' arithmetic
    reference = hetero.Session(model.SerializeToString(), backends=["reference"])
    assert reference.rewrites["fuse_matmul_integer_fake_quant"] == 1
    np.testing.assert_array_equal(reference.run(feeds)["y"], want)


def test_fake_quant_pass_on_an_attention_product(threads):
    """aq, bq (run time) -> DQ each -> MatMul -> Q -> DQ: a QDQ attention's Q Kᵀ, B packed at each call."""
    nodes = [helper.make_node("DequantizeLinear", ["aq", "as", "az"], ["a"]),
             helper.make_node("DequantizeLinear", ["bq", "bs", "bz"], ["b"]),
             helper.make_node("MatMul", ["a", "b"], ["p"]),
             helper.make_node("QuantizeLinear", ["p", "ys", "yz"], ["pq"]),
             helper.make_node("DequantizeLinear", ["pq", "ys", "yz"], ["y"])]
    inits = [numpy_helper.from_array(np.array(0.021, np.float32), "as"),
             numpy_helper.from_array(np.array(120, np.uint8), "az"),
             numpy_helper.from_array(np.array(0.017, np.float32), "bs"),
             numpy_helper.from_array(np.array(9, np.uint8), "bz"),
             numpy_helper.from_array(np.array(0.8, np.float32), "ys"),
             numpy_helper.from_array(np.array(-3, np.int8), "yz")]
    graph = helper.make_graph(nodes, "qdq_scores", [helper.make_tensor_value_info("aq", TensorProto.UINT8,
                                                                                  ["b", 12, 64, 32]),
                                                    helper.make_tensor_value_info("bq", TensorProto.UINT8,
                                                                                  ["b", 12, 32, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(2)
    feeds = {"aq": _rand8(rng, (2, 12, 64, 32), np.uint8), "bq": _rand8(rng, (2, 12, 32, 64), np.uint8)}
    session = hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error")
    assert session.rewrites["fuse_matmul_integer_fake_quant"] == 1
    assert [node.op_type for node in session.graph.nodes] == ["MatMulIntegerScaled"]
    acc = np.matmul(feeds["aq"].astype(np.int64) - 120, feeds["bq"].astype(np.int64) - 9)
    p = acc.astype(np.float32) * (np.float32(0.021) * np.float32(0.017))
    q = np.empty(p.shape, np.int8)
    want = np.empty_like(p)
    _native.quantize_linear(p, np.array([0.8], np.float32), np.array([-3], np.int8), q)
    _native.dequantize_linear(q, np.array([0.8], np.float32), np.array([-3], np.int8), want)
    np.testing.assert_array_equal(session.run(feeds)["y"], want)
    np.testing.assert_array_equal(_without_fake_quant(model, "cpu").run(feeds)["y"], want)


def test_fake_quant_pass_leaves_other_patterns_alone():
    # the Q's bytes read elsewhere (a graph output): nothing fused
    model, feeds = _qdq_linear_model([4, 16], 8, output_q=True)
    session = hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error")
    assert session.rewrites["fuse_matmul_integer_fake_quant"] == 0
    unfused = hetero.Session(model.SerializeToString(), backends=["reference"], optimize=False).run(feeds)
    got = session.run(feeds)
    np.testing.assert_array_equal(got["pq"], unfused["pq"])
    # DequantizeLinear by another zero point than the QuantizeLinear's: not a fake quantization
    model, feeds = _qdq_linear_model([4, 16], 8, dq_zp=120)
    session = hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error")
    assert session.rewrites["fuse_matmul_integer_fake_quant"] == 0
    np.testing.assert_allclose(session.run(feeds)["y"], _without_fake_quant(model, "cpu").run(feeds)["y"])
    # a bias computed at run time: the Q / DQ fused, the Add left as it is
    model, feeds = _qdq_linear_model([4, 16], 8, bias="input")
    session = hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error")
    assert session.rewrites["fuse_matmul_integer_fake_quant"] == 1
    assert [node.op_type for node in session.graph.nodes] == ["MatMulIntegerScaled", "Add"]
    np.testing.assert_array_equal(session.run(feeds)["y"], _without_fake_quant(model, "cpu").run(feeds)["y"])
