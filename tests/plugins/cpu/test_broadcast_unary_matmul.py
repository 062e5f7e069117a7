"""``hetero::BroadcastUnaryMatMul`` (``hetero.ir.passes.fuse_broadcast_unary_matmul``, cpu ``src/chain_dot.cpp``):
a broadcasting Add / Sub / Mul, a unary op and a product by a narrow constant W, without the broadcast tensor.

The quantized chain (DynamicQuantizeLinear -> MatMulIntegerScaled, text2tashkeel's attention) must give the unfused
cpu kernels' bits exactly (same elementwise table, same quantize8, exact integer sums), also when the predicted
range of the quantized values misses and the kernel runs again; the float chain agrees to float tolerance (another
summation order). Each graph is built here in ONNX and run fused, unfused (optimize=False) and on the reference.
"""

from __future__ import annotations

import numpy as np
import pytest

import hetero
from hetero.frontends.onnx import load_onnx
from hetero.ir import passes
from tests import ort_int8

from .conftest import _native


def _chain_model(d: int, n: int, *, binary: str = "Add", unary: str = "Tanh", quantized: bool = True,
                 a_shape: tuple = ("b", "t", 1, "d"), b_shape: tuple = ("b", 1, "t", "d"), bias: bool = False,
                 w_dtype: type = np.int8, w_zero: int = 0, per_column: bool = False, seed: int = 3):
    """binary(a, b) -> unary -> [DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul (x scale x w scale)] or
    [MatMul], [+ bias]: the scores of additive attention as onnxruntime's quantize_dynamic or a float export write
    them."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes = [helper.make_node(binary, ["a", "b"], ["s"])]
    x = "s"
    if unary:
        nodes.append(helper.make_node(unary, ["s"], ["u"]))
        x = "u"
    inits = []
    out = "y0" if bias else "y"
    if quantized:
        info = np.iinfo(w_dtype)
        w = rng.integers(info.min, info.max + 1, (d, n)).astype(w_dtype)
        nodes += [helper.make_node("DynamicQuantizeLinear", [x], ["xq", "xs", "xz"]),
                  helper.make_node("MatMulInteger", ["xq", "w", "xz", "wz"], ["acc"]),
                  helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
                  helper.make_node("Mul", ["xs", "ws"], ["scale"]),
                  helper.make_node("Mul", ["accf", "scale"], [out])]
        inits += [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(w_zero, w_dtype), "wz"),
                  numpy_helper.from_array(rng.uniform(0.002, 0.02, n).astype(np.float32) if per_column
                                          else np.array(0.0061, np.float32), "ws")]
    else:
        nodes.append(helper.make_node("MatMul", [x, "w"], [out]))
        inits.append(numpy_helper.from_array(rng.normal(size=(d, n)).astype(np.float32), "w"))
    if bias:
        nodes.append(helper.make_node("Add", [out, "bias"], ["y"]))
        inits.append(numpy_helper.from_array(rng.normal(size=n).astype(np.float32), "bias"))
    dims = {"d": d}
    graph = helper.make_graph(
        nodes, "chain",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [dims.get(s, s) for s in a_shape]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [dims.get(s, s) for s in b_shape])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(model, sizes: dict[str, int], seed: int = 4, scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        shape = [d.dim_value or sizes[d.dim_param] for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = (rng.normal(size=shape) * scale).astype(np.float32)
    return feeds


def _sessions(model, backend: str = "cpu") -> tuple[hetero.Session, hetero.Session]:
    blob = model.SerializeToString()
    fused = hetero.Session(blob, backends=[backend], on_fallback="error")
    unfused = hetero.Session(blob, backends=[backend], on_fallback="error", optimize=False)
    return fused, unfused


def _ops(session: hetero.Session) -> list[str]:
    return [n.op_type for n in session.graph.nodes]


QUANTIZED = [
    # (binary, unary, a shape, b shape, d, n, sizes): additive attention's outer sum, other ops, batch axes both
    # operands have (every pair does not occur: the range is scanned), one operand broadcast along D
    ("Add", "Tanh", ("b", "t", 1, "d"), ("b", 1, "t", "d"), 64, 1, {"b": 1, "t": 19}),
    ("Add", "Tanh", ("b", "t", 1, "d"), ("b", 1, "t", "d"), 64, 1, {"b": 2, "t": 7}),
    # both rows D wide and D not a multiple of any ISA's width: the one-pass tanh row's vector tail
    ("Add", "Tanh", ("t", 1, "d"), (1, "t", "d"), 37, 2, {"t": 13}),
    ("Sub", "Sigmoid", ("t", 1, "d"), ("t", "d"), 40, 3, {"t": 9}),
    ("Mul", "Tanh", ("t", 1, "d"), (1, "t", "d"), 33, 2, {"t": 6}),
    ("Add", "Relu", ("t", 1, "d"), (1, "t", 1), 48, 5, {"t": 11}),
    ("Add", "", ("t", 1, "d"), (1, "t", "d"), 36, 1, {"t": 5}),
]


@pytest.mark.parametrize("binary, unary, a_shape, b_shape, d, n, sizes", QUANTIZED)
@pytest.mark.parametrize("variant", ["plain", "bias-per-column", "uint8-zero-point"])
def test_quantized_chain_is_the_unfused_kernels_bit_for_bit(isa, threads, binary, unary, a_shape, b_shape, d, n,
                                                            sizes, variant):
    model = _chain_model(d, n, binary=binary, unary=unary, a_shape=a_shape, b_shape=b_shape,
                         bias=variant == "bias-per-column", per_column=variant == "bias-per-column",
                         w_dtype=np.uint8 if variant == "uint8-zero-point" else np.int8,
                         w_zero=131 if variant == "uint8-zero-point" else 0)
    fused, unfused = _sessions(model)
    assert _ops(fused) == ["BroadcastUnaryMatMul"], _ops(fused)
    for seed in (4, 5):
        feeds = _feeds(model, sizes, seed)
        got = fused.run(feeds)["y"]
        np.testing.assert_array_equal(got, unfused.run(feeds)["y"])
        np.testing.assert_array_equal(fused.run(feeds)["y"], got)  # replayed


@pytest.mark.parametrize("scale", [0.05, 6.0])
def test_one_pass_tanh_rows_saturated_and_near_zero(isa, threads, scale):
    """The Add -> Tanh rows in one pass (kernels' add_tanh_quantize_row) against the unfused passes: sums past
    |9| where tanh is +-1, and small values where most of the grid's levels are hit and many lanes lie near a half
    step (divided there)."""
    model = _chain_model(80, 1, a_shape=("t", 1, "d"), b_shape=(1, "t", "d"))
    fused, unfused = _sessions(model)
    assert _ops(fused) == ["BroadcastUnaryMatMul"], _ops(fused)
    feeds = _feeds(model, {"t": 21}, seed=6, scale=scale)
    np.testing.assert_array_equal(fused.run(feeds)["y"], unfused.run(feeds)["y"])


@pytest.mark.parametrize("unary", ["Tanh", "Sigmoid", ""])
@pytest.mark.parametrize("binary", ["Add", "Mul"])
def test_float_chain_matches_unfused(threads, binary, unary):
    model = _chain_model(72, 3, binary=binary, unary=unary, quantized=False, bias=True)
    fused, unfused = _sessions(model)
    assert _ops(fused) == ["BroadcastUnaryMatMul"], _ops(fused)
    feeds = _feeds(model, {"b": 1, "t": 13})
    np.testing.assert_allclose(fused.run(feeds)["y"], unfused.run(feeds)["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("quantized", [True, False])
def test_reference_of_the_fused_node_is_the_unfused_graph(quantized):
    model = _chain_model(48, 2, quantized=quantized, bias=True, per_column=True)
    fused, unfused = _sessions(model, "reference")
    assert _ops(fused) == ["BroadcastUnaryMatMul"], _ops(fused)
    feeds = _feeds(model, {"b": 1, "t": 8})
    np.testing.assert_array_equal(fused.run(feeds)["y"], unfused.run(feeds)["y"])


def test_quantized_chain_against_reference_and_onnxruntime(threads):
    """Another tanh can move a value across a rounding boundary of the 8-bit grid: at most a few steps of
    |x scale x w scale| on a few outputs, nothing more."""
    model = _chain_model(128, 1, bias=True)
    fused, _ = _sessions(model)
    feeds = _feeds(model, {"b": 1, "t": 24}, scale=0.7)
    got = fused.run(feeds)["y"]
    ref = hetero.Session(model.SerializeToString(), backends=["reference"]).run(feeds)["y"]
    step = 0.0061 * 2 / 255 * 127  # one level of x times the largest |w|
    assert np.abs(got - ref).max() <= 3 * step
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    want = ort.InferenceSession(ort_int8.exact_bytes(model.SerializeToString()), options,
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.abs(got - want).max() <= 3 * step


def _direct(a, b, a_rows, b_rows, d, packed, predict):
    out = np.empty((a_rows.size, packed.n), np.float32)
    _native.broadcast_unary_matmul("add", "tanh", 0.0, 0.0, a, b, a_rows, b_rows, d, packed, None, None, predict, out)
    return out


def test_a_missed_prediction_runs_again_with_the_seen_range(threads):
    """predict=True on rows that do not pair every a row with every b row: the range from the column extremes is
    wider than the rows', the kernel sees it and runs again; the result is the scanned one."""
    rng = np.random.default_rng(9)
    d = 32
    a, b = rng.normal(size=(4, d)).astype(np.float32), rng.normal(size=(4, d)).astype(np.float32)
    a[0] += 3.0  # a's largest row never meets b's largest: the diagonal pairs only
    b[1] += 3.0
    rows = np.arange(4, dtype=np.int64) * d
    packed = _native.qpack_b(np.random.default_rng(2).integers(-127, 128, (d, 2)).astype(np.int8), None)
    got = _direct(a, b, rows, rows, d, packed, True)
    np.testing.assert_array_equal(got, _direct(a, b, rows, rows, d, packed, False))
    # and that is the diagonal's quantized product (within a level: numpy's tanh is not the kernel's)
    x = np.tanh(a + b)
    s = (max(x.max(), 0) - min(x.min(), 0)) / 255
    z = np.rint(-min(x.min(), 0) / s)
    q = np.clip(np.rint(x / s) + z, 0, 255) - z
    w = np.random.default_rng(2).integers(-127, 128, (d, 2)).astype(np.int8)
    np.testing.assert_allclose(got, (q @ w) * s, atol=4 * s * 127)


def test_nan_operand_falls_back_to_the_scan(threads):
    model = _chain_model(40, 1)
    fused, unfused = _sessions(model)
    feeds = _feeds(model, {"b": 1, "t": 6})
    feeds["a"][0, 2, 0, 5] = np.nan
    np.testing.assert_array_equal(fused.run(feeds)["y"], unfused.run(feeds)["y"])
    feeds["a"][0, 0, 0, 0] = np.nan  # x's first value NaN: the whole range is NaN, as DynamicQuantizeLinear's
    np.testing.assert_array_equal(fused.run(feeds)["y"], unfused.run(feeds)["y"])


def _rewrites(model) -> int:
    graph = load_onnx(model)
    passes.fuse_matmul_bias(graph)
    passes.fuse_matmul_integer_scale(graph)
    return passes.fuse_broadcast_unary_matmul(graph)


def test_pass_conditions():
    from onnx import helper

    assert _rewrites(_chain_model(16, 1)) == 1
    assert _rewrites(_chain_model(16, 17)) == 0  # too wide: the GEMM over a written x is the better plan
    model = _chain_model(16, 1)
    model.graph.output.append(helper.make_tensor_value_info("u", 1, None))  # an intermediate is read elsewhere
    assert _rewrites(model) == 0
    model = _chain_model(16, 1)
    model.graph.output.append(helper.make_tensor_value_info("xs", 1, None))  # the activation scale too
    assert _rewrites(model) == 0
    model = _chain_model(16, 1, unary="Exp")  # a unary it does not take: no fusion (the binary does not feed W)
    assert _rewrites(model) == 0
    model = _chain_model(16, 1, quantized=False, a_shape=("t", 1, 16), b_shape=(1, "t", 8))
    assert _rewrites(model) == 0  # last axes 16 and 8: not rows of W's K


def test_many_sequence_lengths_in_one_session():
    """Row offsets are kept per shape (a few at a time): lengths coming and going give the unfused results."""
    model = _chain_model(24, 1)
    fused, unfused = _sessions(model)
    for t in [*range(1, 12), 3, 1, 11]:
        feeds = _feeds(model, {"b": 1, "t": t}, seed=t)
        np.testing.assert_array_equal(fused.run(feeds)["y"], unfused.run(feeds)["y"])
