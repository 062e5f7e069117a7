"""A QDQ encoder's fc1 activation: ``fuse_gelu_quantize`` makes ``QuantizeLinear(Gelu(x))`` (one constant scale and
zero point) one ``hetero.GeluQuantizeLinear``, whose cpu kernel (native ``gelu_quantize``) quantizes the Gelu
kernel's floats a block at a time while in L1. Bit for bit against the two native kernels on every ISA at 1 and 2
threads (tails, one value, a block boundary, NaN / inf, values whose GELU lands on a half step), against numpy's
float64 GELU within one quantization step, the pass against the unfused session, the reference backend and
onnxruntime, and the near misses it leaves alone."""

from __future__ import annotations

import math

import numpy as np
import pytest

import hetero
from hetero.ir import passes

_native = pytest.importorskip("hetero_cpu._native")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _gelu_then_quantize(x: np.ndarray, scale: np.ndarray, zp: np.ndarray, tanh: bool) -> np.ndarray:
    g = np.empty_like(x)
    _native.unary("gelu_tanh" if tanh else "gelu", x, g)
    q = np.empty(x.shape, zp.dtype)
    _native.quantize_linear(g, scale, zp, q)
    return q


@pytest.mark.parametrize("shape", [(1,), (1, 7), (3, 16), (5, 129), (2, 17, 33), (1, 2049), (3, 16384 + 5),
                                   (128, 1536), (0, 5)])
@pytest.mark.parametrize("zp", [np.array(128, np.uint8), np.array(0, np.uint8), np.array(3, np.int8),
                                np.array(-7, np.int8)])
@pytest.mark.parametrize("tanh", [False, True])
def test_gelu_quantize_is_gelu_then_quantize(isa, threads, shape, zp, tanh):
    rng = np.random.default_rng(shape[-1] + len(shape))
    scale = np.array([0.021], np.float32)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    flat = x.reshape(-1)
    specials = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 0.0, -0.0, 13.0, -13.0, -0.75], np.float32)
    flat[: min(flat.size, specials.size)] = specials[: flat.size]
    got = np.full(shape, 77, zp.dtype)
    _native.gelu_quantize(x, scale, zp, got, tanh)
    np.testing.assert_array_equal(got, _gelu_then_quantize(x, scale, zp, tanh))


@pytest.mark.parametrize("zp", [np.array(200, np.uint8), np.array(-100, np.int8)])
def test_gelu_quantize_against_float64(zp):
    """Within one step of numpy's float64 GELU quantized (float32 GELU error < 1e-6 here: a step is 0.01)."""
    x = np.linspace(-8, 8, 40001, dtype=np.float32)
    scale = np.array([0.01], np.float32)
    got = np.empty(x.shape, zp.dtype)
    _native.gelu_quantize(x, scale, zp, got)
    erf = np.vectorize(math.erf)
    g = x.astype(np.float64) * 0.5 * (1 + erf(x.astype(np.float64) / math.sqrt(2)))
    info = np.iinfo(zp.dtype)
    want = np.clip(np.rint(g / np.float64(scale[0])) + int(zp), info.min, info.max)
    assert np.abs(got.astype(np.int64) - want).max() <= 1
    assert np.mean(got.astype(np.int64) == want) > 0.999


def test_gelu_quantize_refusals():
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(Exception, match="one value"):
        _native.gelu_quantize(x, np.array([0.1, 0.2], np.float32), np.array(0, np.uint8), np.empty((2, 4), np.uint8))
    with pytest.raises(Exception, match="expected 8"):
        _native.gelu_quantize(x, np.array([0.1], np.float32), np.array(0, np.uint8), np.empty((2, 3), np.uint8))


def _gelu_q_model(approximate: str = "none", zp_dtype: type = np.uint8, scale_size: int = 1, with_zp: bool = True,
                  gelu_out: bool = False, consumer: str = "QuantizeLinear"):
    """x -> Gelu -> QuantizeLinear (-> DequantizeLinear, so that onnxruntime can run it and the output is float)."""
    attrs = {} if approximate == "none" else {"approximate": approximate}
    nodes = [helper.make_node("Gelu", ["x"], ["g"], **attrs)]
    inits = [numpy_helper.from_array(np.full(scale_size, 0.03, np.float32).reshape(() if scale_size == 1 else -1),
                                     "s")]
    q_inputs = ["g", "s"]
    if with_zp:
        inits.append(numpy_helper.from_array(np.array(5 if zp_dtype == np.uint8 else -5, zp_dtype), "z"))
        q_inputs.append("z")
    axis = {"axis": 1} if scale_size > 1 else {}
    if consumer == "QuantizeLinear":
        nodes.append(helper.make_node("QuantizeLinear", q_inputs, ["q"], **axis))
        nodes.append(helper.make_node("DequantizeLinear", ["q", *q_inputs[1:]], ["y"], **axis))
    else:
        nodes.append(helper.make_node(consumer, ["g"], ["y"]))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if gelu_out:
        outputs.append(helper.make_tensor_value_info("g", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "gelu_q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 48])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def _without_pass(model: object) -> hetero.Session:
    """The cpu session with every default pass but fuse_gelu_quantize (as benchmarks/onnx_pass_ab.py)."""
    with passes.leaving_out("fuse_gelu_quantize"):
        return hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error")


def _feeds(rows: int = 7) -> dict[str, np.ndarray]:
    return {"x": (np.random.default_rng(rows).standard_normal((rows, 48)) * 2).astype(np.float32)}


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("zp_dtype", [np.uint8, np.int8])
def test_gelu_quantize_pass_same_bits_as_the_unfused_nodes(threads, approximate, zp_dtype):
    model = _gelu_q_model(approximate, zp_dtype)
    session = hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error")
    assert session.rewrites["fuse_gelu_quantize"] == 1
    assert [n.op_type for n in session.graph.nodes] == ["GeluQuantizeLinear", "DequantizeLinear"]
    unfused = _without_pass(model)
    assert [n.op_type for n in unfused.graph.nodes] == ["Gelu", "QuantizeLinear", "DequantizeLinear"]
    for rows in (1, 7, 300):
        feeds = _feeds(rows)
        want = unfused.run(feeds)["y"]
        for _ in range(2):  # the second run replays the bound calls
            np.testing.assert_array_equal(session.run(feeds)["y"].view(np.int32), want.view(np.int32))
    reference = hetero.Session(model.SerializeToString(), backends=["reference"])
    assert reference.rewrites["fuse_gelu_quantize"] == 1
    feeds = _feeds()
    ref = reference.run(feeds)["y"]
    step = np.float32(0.03)
    assert np.abs(ref - session.run(feeds)["y"]).max() <= step * 1.001  # the float64 GELU: a step at most


def test_gelu_quantize_pass_against_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    model = _gelu_q_model()
    feeds = _feeds(64)
    session = hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error")
    assert session.rewrites["fuse_gelu_quantize"] == 1
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = session.run(feeds)["y"]
    assert np.abs(got - want).max() <= np.float32(0.03) * 1.001
    assert np.mean(got == want) > 0.99


@pytest.mark.parametrize("near_miss", ["gelu_output", "per_axis", "no_zero_point", "other_consumer"])
def test_gelu_quantize_pass_leaves_near_misses_alone(near_miss):
    model = {"gelu_output": lambda: _gelu_q_model(gelu_out=True),  # the floats read elsewhere too
             "per_axis": lambda: _gelu_q_model(scale_size=48),  # a scale per column
             "no_zero_point": lambda: _gelu_q_model(with_zp=False),
             "other_consumer": lambda: _gelu_q_model(consumer="Relu")}[near_miss]()
    session = hetero.Session(model.SerializeToString(), backends=["cpu"])
    assert session.rewrites["fuse_gelu_quantize"] == 0
    assert "GeluQuantizeLinear" not in [n.op_type for n in session.graph.nodes]
    feeds = _feeds()
    want = hetero.Session(model.SerializeToString(), backends=["reference"], optimize=False).run(feeds)
    got = session.run(feeds)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, atol=0.031)
