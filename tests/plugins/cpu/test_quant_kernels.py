"""The int8 kernels (plugins/cpu/src/qlinear*.cpp) against independent references, on every ISA path this CPU runs
and at 1 / 2 threads: integer products exactly (numpy int64), the float and requantizing output stages exactly
(numpy float32 doing what onnxruntime does), DynamicQuantizeLinear and the quantized ops against hetero's numpy
reference, and a dynamically quantized MatMul graph (the fusion pass's pattern) against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

import hetero
from hetero.contract import dtypes, registry
from hetero.contract.graph import Graph, Node
from hetero.contract.registry import OpContext
from hetero.contract.tensor import TensorInfo
from hetero.frontends.onnx import load_onnx
from hetero.ir import passes
from hetero.runtime.infer import fold_and_infer
from tests import ort_int8

from .conftest import _native

# (2, 130, 70) and (3, 256, 200): tiles of 2 and 3 rows over 4 panels and a last one (an int8 LSTM's step shapes;
# every tile shape has its own named accumulators, qlinear_impl.hpp). N <= 4: the row . column dots (qgemm_dot),
# over row blocks of 64 and their last 4 rows, K past 64-byte steps and not a multiple of 4 or 16. (1, 512, 300) and
# (8, 96, 520): blocks of one row tile (GEMV-like, no software prefetch) over many column blocks, a last part panel.
SHAPES = [(1, 4, 16), (3, 5, 7), (4, 64, 64), (9, 33, 70), (70, 129, 200), (130, 256, 48), (33, 128, 70),
          (40, 192, 130), (2, 130, 70), (3, 256, 200), (1, 512, 300), (8, 96, 520),
          (70, 512, 1), (33, 130, 2), (9, 3, 3), (130, 64, 4), (5, 1030, 1), (66, 67, 4), (1, 20, 2)]


@pytest.fixture(params=["amx", "no-amx"])
def amx(request):
    """With and without the AMX blocks (taken on the avx512 path when the CPU has AMX-INT8 and K % 64 == 0)."""
    _native.qlinear_use_amx(request.param == "amx")
    yield request.param
    _native.qlinear_use_amx(True)


def _rand8(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def _exact(a: np.ndarray, b: np.ndarray, za: np.ndarray | int, zb: np.ndarray | int) -> np.ndarray:
    za = np.asarray(za, np.int64).reshape(-1, 1) if np.size(za) > 1 else np.int64(za)
    return ((a.astype(np.int64) - za) @ (b.astype(np.int64) - np.asarray(zb, np.int64))).astype(np.int32)


def test_qlinear_isa_follows_the_active_isa(isa):
    want = {"generic": "generic", "avx2": "avx2", "neon": "generic"}.get(isa)
    got = _native.qlinear_isa()
    if isa == "avx512":
        assert got in ("avx512vnni", "avx2")
    else:
        assert got == want


@pytest.mark.parametrize("adt,bdt", [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8),
                                     (np.int8, np.uint8)])
@pytest.mark.parametrize("shape", SHAPES)
def test_qgemm_i32_exact(isa, amx, threads, adt, bdt, shape):
    m, k, n = shape
    rng = np.random.default_rng(m * 1000 + k + n)
    a, b = _rand8(rng, (m, k), adt), _rand8(rng, (k, n), bdt)
    za, zb = _rand8(rng, (), adt), _rand8(rng, (n,), bdt)  # per-column weight zero points
    out = np.empty((m, n), np.int32)
    _native.qgemm_i32(a, _native.qpack_b(b, zb), np.array(za), out)
    np.testing.assert_array_equal(out, _exact(a, b, za, zb))
    # per-row zero points of A, a scalar one of B, none at all
    zrow = _rand8(rng, (m,), adt)
    _native.qgemm_i32(a, _native.qpack_b(b, np.array(zb[0])), zrow, out)
    np.testing.assert_array_equal(out, _exact(a, b, zrow, zb[0]))
    _native.qgemm_i32(a, _native.qpack_b(b), None, out)
    np.testing.assert_array_equal(out, _exact(a, b, 0, 0))


@pytest.mark.parametrize("n", [20, 3])
def test_qgemm_extremes_do_not_saturate(isa, amx, n):
    """255 x -128 summed over K = 1024: pairs of u8 x s8 products overflow int16 (vpmaddubsw would saturate)."""
    a = np.full((5, 1024), 255, np.uint8)
    b = np.full((1024, n), -128, np.int8)
    b[::3, ::2] = 127
    out = np.empty((5, n), np.int32)
    _native.qgemm_i32(a, _native.qpack_b(b), np.array(0, np.uint8), out)
    np.testing.assert_array_equal(out, _exact(a, b, 0, 0))


@pytest.mark.parametrize("bdt", [np.int8, np.uint8])
def test_qgemm_byte_pairs_past_int16_exact(isa, threads, bdt):
    """B's bytes at k 2i, 2i + 1 are the pairs vpmaddubsw sums in int16: the AVX2 tile moves the pairs that could pass
    it (every w0 + w1 = +-129, 127 + 127, -128 - 128 here, among in-bound pairs and pairs at +-128) and adds the moved
    part back. 256 such pairs in 164160: under the 1 in 32 past which B keeps the widening tile. Rows of 255, 254, 0
    and random bytes."""
    rng = np.random.default_rng(7)
    k, n = 1026, 320
    b = rng.integers(-64, 65, (k, n))
    w0 = np.concatenate([np.arange(2, 128), np.arange(-128, 0), [127, -128], np.arange(1, 128), np.arange(-128, 0)])
    w1 = np.concatenate([129 - w0[:126], -129 - w0[126:254], [127, -128], 128 - w0[256:383], -128 - w0[383:]])
    rows, cols = np.unravel_index(rng.choice(k // 2 * n, w0.size, replace=False), (k // 2, n))
    b[2 * rows, cols], b[2 * rows + 1, cols] = w0, w1
    b = (b + (128 if bdt == np.uint8 else 0)).astype(bdt)  # the kernels see b - 128 of uint8 weights
    a = np.stack([np.full(k, 255), np.full(k, 254), np.zeros(k), *rng.integers(0, 256, (4, k))]).astype(np.uint8)
    out = np.empty((a.shape[0], n), np.int32)
    _native.qgemm_i32(a, _native.qpack_b(b), np.array(0, np.uint8), out)
    np.testing.assert_array_equal(out, _exact(a, b, 0, 0))


@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("n", [80, 1])
def test_qgemm_f32_is_cast_times_scale_plus_bias(isa, amx, threads, per_column, n):
    rng = np.random.default_rng(1)
    m, k = 37, 128
    a, b = _rand8(rng, (m, k), np.uint8), _rand8(rng, (k, n), np.int8)
    scale = rng.uniform(1e-4, 1e-2, (n,) if per_column else ()).astype(np.float32)
    bias = rng.normal(size=n).astype(np.float32)
    za = np.array(131, np.uint8)
    out = np.empty((m, n), np.float32)
    _native.qgemm_f32(a, _native.qpack_b(b, np.array(3, np.int8)), za, np.ascontiguousarray(scale), bias, out)
    want = _exact(a, b, 131, 3).astype(np.float32) * scale + bias  # float32 multiply, then add: no FMA
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("adt,bdt,zps", [(np.uint8, np.int8, "per row / column"),
                                         (np.int8, np.uint8, "per row / column"),
                                         (np.uint8, np.int8, "one / zero"), (np.uint8, np.int8, "per row / zero"),
                                         (np.uint8, np.int8, "one / per column"), (np.uint8, np.int8, "one / last"),
                                         (np.uint8, np.int8, "per row / last")])
def test_qgemm_f32_zero_points_per_row_and_column(isa, amx, threads, shape, adt, bdt, zps):
    """The F32 stage over tile edges (M % 4, N % 16, panels past the last tile), with a zero point per row of A or
    one, and per column of B, zero, or zero but the last column's (symmetric weights: the VNNI tile then drops the
    row term for each 16-column panel whose zero points are all 0, and takes the column term once a panel for one A
    zero point; "last": one panel keeps the row term, the others drop it), without bias (the stage the VNNI tile
    applies in registers)."""
    rng = np.random.default_rng(7)
    m, k, n = shape
    a, b = _rand8(rng, (m, k), adt), _rand8(rng, (k, n), bdt)
    za = _rand8(rng, (m,), adt) if zps.startswith("per row") else _rand8(rng, (), adt)
    zb = np.zeros(n, bdt) if zps.endswith(("zero", "last")) else _rand8(rng, (n,), bdt)
    if zps.endswith("last"):
        zb[-1] = 5
    scale = rng.uniform(1e-4, 1e-2, (n,)).astype(np.float32)
    out = np.full((m, n), np.nan, np.float32)
    _native.qgemm_f32(a, _native.qpack_b(b, zb), za, scale, None, out)
    np.testing.assert_array_equal(out, _exact(a, b, za, zb).astype(np.float32) * scale)


def _requant(acc: np.ndarray, mult: np.ndarray, zp: int, dtype: type) -> np.ndarray:
    """onnxruntime's requantization: float32(acc) * multiplier, clamped to the range minus the zero point, rounded
    half to even, plus the zero point."""
    info = np.iinfo(dtype)
    f = acc.astype(np.float32) * mult
    f = np.clip(f, np.float32(info.min - zp), np.float32(info.max - zp))
    return (np.rint(f).astype(np.int32) + zp).astype(dtype)


@pytest.mark.parametrize("ydt", [np.uint8, np.int8])
def test_qgemm_requant(isa, amx, threads, ydt):
    rng = np.random.default_rng(2)
    m, k, n = 19, 64, 40
    a, b = _rand8(rng, (m, k), np.uint8), _rand8(rng, (k, n), np.int8)
    a_s, b_s, y_s = np.float32(0.02), rng.uniform(0.001, 0.01, n).astype(np.float32), np.float32(0.5)
    y_zp = np.array(7 if ydt is np.uint8 else -5, ydt)
    out = np.empty((m, n), ydt)
    _native.qgemm_requant(a, _native.qpack_b(b, np.array(1, np.int8)), np.array(128, np.uint8), np.array(a_s),
                          b_s, np.array(y_s), y_zp, out)
    mult = (a_s * b_s / y_s).astype(np.float32)
    np.testing.assert_array_equal(out, _requant(_exact(a, b, 128, 1), mult, int(y_zp), ydt))


def _reference(op_type: str, inputs: list[np.ndarray | None], attrs: dict | None = None) -> list[np.ndarray]:
    names = [f"i{i}" if x is not None else "" for i, x in enumerate(inputs)]
    schema = registry.get("", op_type)
    node = Node(op_type, names, ["y"], attrs or {})
    infos = [None if x is None else TensorInfo(dtypes.from_numpy(x.dtype), x.shape) for x in inputs]
    return schema.reference(OpContext(node, infos, list(inputs), 21))


@pytest.mark.parametrize("case", ["normal", "positive", "negative", "zeros", "nan", "empty"])
def test_dynamic_quantize_matches_reference(isa, threads, case):
    rng = np.random.default_rng(3)
    x = rng.normal(0, 3, 100_003).astype(np.float32)
    if case == "positive":
        x = np.abs(x) + 1
    elif case == "negative":
        x = -np.abs(x) - 1
    elif case == "zeros":
        x = np.zeros(1000, np.float32)
    elif case == "nan":
        x[17] = np.nan
    elif case == "empty":
        x = np.zeros(0, np.float32)
    y, s, z = np.empty(x.shape, np.uint8), np.empty((), np.float32), np.empty((), np.uint8)
    if case == "nan":  # min / max skip NaN in neither implementation; the element itself quantizes to 0
        x = x.copy()
    _native.dynamic_quantize(x, y, s, z)
    if case == "nan":
        assert y[17] == 0
        return
    want_y, want_s, want_z = _reference("DynamicQuantizeLinear", [x])
    assert s == want_s and z == want_z
    np.testing.assert_array_equal(y, want_y)


def _qconv_want(x, w, xzp, wzp, x_s, w_s, y_s, y_zp, bias, attrs):
    acc = _reference("ConvInteger", [x, w, np.array(xzp, x.dtype), np.asarray(wzp, w.dtype)], attrs)[0]
    if bias is not None:
        acc = acc + bias.reshape(1, -1, *[1] * (x.ndim - 2))
    mult = (x_s * w_s / y_s).astype(np.float32).reshape(1, -1, *[1] * (x.ndim - 2))
    return _requant(acc, mult, int(y_zp), y_zp.dtype.type)


CONV_CASES = [
    dict(x=(1, 3, 9, 11), w=(8, 3, 3, 3), pads=[1, 1, 1, 1]),
    dict(x=(2, 16, 10, 10), w=(24, 16, 1, 1)),
    dict(x=(1, 8, 12, 12), w=(16, 8, 3, 3), strides=[2, 2], pads=[1, 0, 1, 2]),
    dict(x=(1, 8, 9, 9), w=(8, 1, 3, 3), group=8, pads=[1, 1, 1, 1]),
    dict(x=(2, 12, 17, 20), w=(12, 1, 5, 3), group=12, strides=[2, 3], pads=[2, 0, 1, 1], dilations=[1, 2]),
    dict(x=(1, 6, 7, 7), w=(12, 1, 3, 3), group=6, pads=[1, 1, 1, 1]),  # two outputs per channel: a GEMM each
    dict(x=(1, 6, 10, 10), w=(4, 3, 3, 3), group=2, dilations=[2, 2]),
    dict(x=(1, 4, 30), w=(6, 4, 5), pads=[2, 2]),
    # magika's shape class: a kh x 1 conv on a one-column image, channels past one 32-block, K = 192 (AMX's whole
    # 64-byte rows) and 480 (not), positions past one 16-row task of the im2col
    dict(x=(1, 64, 50, 1), w=(40, 64, 3, 1), pads=[1, 0, 1, 0]),
    dict(x=(2, 96, 41, 1), w=(33, 96, 5, 1), pads=[2, 0, 2, 0], strides=[2, 1]),
    dict(x=(1, 48, 9, 13), w=(20, 48, 3, 3), pads=[1, 1, 1, 1]),
    # one-column images read in place (rows overlapping): K = 9 (not whole 4-byte groups), stride 3 with pads;
    # dilated (the im2col copy again)
    dict(x=(1, 3, 23, 1), w=(5, 3, 3, 1), pads=[2, 0, 1, 0], strides=[3, 1]),
    dict(x=(1, 8, 20, 1), w=(6, 8, 3, 1), pads=[1, 0, 1, 0], dilations=[2, 1]),
    # one input channel (a grey image's first conv: its im2col writes single bytes), strided and padded
    dict(x=(2, 1, 13, 17), w=(8, 1, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1]),
]


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("xdt,wdt", [(np.uint8, np.int8), (np.int8, np.int8), (np.uint8, np.uint8)])
def test_qlinear_conv_session(isa, threads, case, xdt, wdt):
    """QLinearConv through a cpu session (kernel choice, attributes, 1-D as 2-D) against ConvInteger's reference
    requantized like onnxruntime."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    x, w = _rand8(rng, case["x"], xdt), _rand8(rng, case["w"], wdt)
    cout = case["w"][0]
    x_zp, w_zp = _rand8(rng, (), xdt), _rand8(rng, (cout,), wdt)
    x_s, y_s = np.float32(0.05), np.float32(0.9)
    w_s = rng.uniform(0.005, 0.02, cout).astype(np.float32)
    y_zp = np.array(100, np.uint8)
    bias = rng.integers(-2000, 2000, cout).astype(np.int32)
    attrs = {k: v for k, v in case.items() if k in ("pads", "strides", "dilations", "group")}
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in
             [("xs", x_s), ("xz", x_zp), ("w", w), ("ws", w_s), ("wz", w_zp), ("ys", y_s), ("yz", y_zp), ("b", bias)]]
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"], **attrs)
    xtype = TensorProto.UINT8 if xdt is np.uint8 else TensorProto.INT8
    graph = helper.make_graph([node], "qconv", [helper.make_tensor_value_info("x", xtype, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    session = hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error")
    assert "QLinearConv" in session.explain() and "reference" not in session.placement.fallback_summary()
    got = session.run({"x": x})["y"]
    want = _qconv_want(x, w, x_zp, w_zp, x_s, w_s, y_s, y_zp, bias, attrs)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("xdt,wdt", [(np.uint8, np.int8), (np.int8, np.int8), (np.uint8, np.uint8)])
@pytest.mark.parametrize("zero_points", ["x at run time, w per channel", "x at run time, w one value", "none"])
def test_conv_integer_session(isa, threads, case, xdt, wdt, zero_points):
    """ConvInteger through a cpu session on the native int8 conv (x's zero point a run-time value, as
    DynamicQuantizeLinear gives it), bit for bit the reference's int32 sums."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(6)
    x, w = _rand8(rng, case["x"], xdt), _rand8(rng, case["w"], wdt)
    attrs = {k: v for k, v in case.items() if k in ("pads", "strides", "dilations", "group")}
    xtype = TensorProto.UINT8 if xdt is np.uint8 else TensorProto.INT8
    inputs = [helper.make_tensor_value_info("x", xtype, list(x.shape))]
    inits = [numpy_helper.from_array(w, "w")]
    feeds: dict[str, np.ndarray] = {"x": x}
    names = ["x", "w"]
    x_zp = w_zp = None
    if zero_points != "none":
        x_zp = _rand8(rng, (), xdt)
        w_zp = _rand8(rng, (case["w"][0],) if "per channel" in zero_points else (), wdt)
        inputs.append(helper.make_tensor_value_info("xz", xtype, []))
        inits.append(numpy_helper.from_array(w_zp, "wz"))
        feeds["xz"] = np.asarray(x_zp)
        names += ["xz", "wz"]
    graph = helper.make_graph([helper.make_node("ConvInteger", names, ["y"], **attrs)], "convint", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.INT32, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    session = hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error")
    assert "reference" not in session.placement.fallback_summary()
    got = session.run(feeds)["y"]
    want = _reference("ConvInteger", [x, w, x_zp, w_zp], attrs)[0]
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


def _dynamic_matmul_model(k: int, n: int, bias: bool, per_column: bool = False,
                          residual: tuple[str | int, ...] | None = None, residual_first: bool = False):
    """onnxruntime's quantize_dynamic pattern: DynamicQuantizeLinear, MatMulInteger by int8 weights, Cast, Mul by
    (activation scale x weight scale), Add of the bias; then, with ``residual`` (its shape), Add of an input r."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    w = _rand8(rng, (k, n), np.int8)
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("MatMulInteger", ["xq", "w", "xz", "wz"], ["acc"]),
        helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["xs", "ws"], ["s"]),
        helper.make_node("Mul", ["accf", "s"], ["y0" if bias else "y"]),
    ]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(2, np.int8), "wz"),
             numpy_helper.from_array(rng.uniform(0.005, 0.02, n).astype(np.float32) if per_column
                                     else np.array(0.013, np.float32), "ws")]
    if bias:
        nodes.append(helper.make_node("Add", ["y0", "bias"], ["y"]))
        inits.append(numpy_helper.from_array(rng.normal(size=n).astype(np.float32), "bias"))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])]
    if residual is not None:
        nodes[-1].output[0] = "y1"
        nodes.append(helper.make_node("Add", ["r", "y1"] if residual_first else ["y1", "r"], ["y"]))
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, list(residual)))
    graph = helper.make_graph(nodes, "dq", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _same_bits_as_written(session: hetero.Session, model, x: np.ndarray) -> None:
    """The fused session's output y for input x: the bits of onnxruntime running the graph as written, and of the
    unfused graph on hetero's reference."""
    import onnxruntime as ort

    got = session.run({"x": x})["y"]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the graph as written
    want = ort.InferenceSession(ort_int8.exact_bytes(model.SerializeToString()), options,
                                providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
    ref = hetero.Session(model.SerializeToString(), backends=["reference"]).run({"x": x})["y"]
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("bias, per_column", [(False, False), (True, False), (True, True)])
def test_dynamic_quantized_matmul_fused_and_against_onnxruntime(threads, bias, per_column):
    pytest.importorskip("onnxruntime")
    model = _dynamic_matmul_model(96, 50, bias, per_column)
    session = hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error")
    ops = [n.op_type for n in session.graph.nodes]
    assert ops == ["DynamicQuantizeLinear", "MatMulIntegerScaled"], ops  # the scales' Mul absorbed too
    fused = session.graph.nodes[1]
    assert fused.inputs[4] == "xs" and fused.inputs[6] == "ws" and bool(fused.inputs[5]) == bias
    x = np.random.default_rng(6).normal(size=(33, 96)).astype(np.float32)
    _same_bits_as_written(session, model, x)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("residual", [(33, 50), (50,), (2, 33, 50), (33, 1)])
@pytest.mark.parametrize("residual_first", [False, True])
def test_residual_add_in_the_output_stage(threads, bias, residual, residual_first):
    """Add(MatMulIntegerScaled, r) with r an input: r becomes the GEMM's addend (fuse_matmul_integer_residual),
    added in the output stage where it has the output's shape, after the GEMM where it broadcasts. The same bits
    as onnxruntime's unfused graph and hetero's reference."""
    ort = pytest.importorskip("onnxruntime")
    model = _dynamic_matmul_model(96, 50, bias, residual=residual, residual_first=residual_first)
    session = hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error")
    assert [n.op_type for n in session.graph.nodes] == ["DynamicQuantizeLinear", "MatMulIntegerScaled"]
    assert session.graph.nodes[1].inputs[7] == "r"
    rng = np.random.default_rng(8)
    x = rng.normal(size=(33, 96)).astype(np.float32)
    r = rng.normal(size=residual).astype(np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(ort_int8.exact_bytes(model.SerializeToString()), options,
                                providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "r": r})[0]
    ref = hetero.Session(model.SerializeToString(), backends=["reference"]).run({"x": x, "r": r})["y"]
    for _ in range(3):  # interpreted, recorded, replayed
        got = session.run({"x": x, "r": r})["y"]
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, ref)


def test_residual_pass_leaves_other_patterns_alone():
    model = _dynamic_matmul_model(32, 8, False, residual=("m", 8))
    graph: Graph = load_onnx(model)
    passes.fuse_matmul_integer_scale(graph)
    # the product read twice: not fused
    graph.nodes.append(Node("Identity", ["y1"], ["extra"]))
    graph.outputs.append("extra")
    assert passes.fuse_matmul_integer_residual(graph) == 0
    # a constant r: the bias's business (fuse_matmul_integer_scale), not an addend
    graph = load_onnx(_dynamic_matmul_model(32, 8, True))
    assert passes.fuse_matmul_integer_residual(graph) == 0
    graph = load_onnx(model)
    passes.fuse_matmul_integer_scale(graph)
    assert passes.fuse_matmul_integer_residual(graph) == 1 and [n.op_type for n in graph.nodes][-1] == \
        "MatMulIntegerScaled"


@pytest.mark.parametrize("shape", SHAPES)
def test_qgemm_f32_addend_added_last(isa, amx, threads, shape):
    """The output stage's addend on every tile path (the VNNI F32 tile, finish after a tile, AMX blocks, the
    narrow dots): float32(sums) * scale + bias + addend, each rounded in that order."""
    m, k, n = shape
    rng = np.random.default_rng(m + k + n)
    a, b = _rand8(rng, (m, k), np.uint8), _rand8(rng, (k, n), np.int8)
    scale = rng.uniform(1e-4, 1e-2, (n,)).astype(np.float32)
    bias = rng.normal(size=n).astype(np.float32)
    addend = rng.normal(size=(m, n)).astype(np.float32)
    out = np.full((m, n), np.nan, np.float32)
    _native.qgemm_f32(a, _native.qpack_b(b, np.array(3, np.int8)), np.array(7, np.uint8), scale, bias, out, None,
                      addend)
    np.testing.assert_array_equal(out, _exact(a, b, 7, 3).astype(np.float32) * scale + bias + addend)
    _native.qgemm_f32(a, _native.qpack_b(b), np.array(7, np.uint8), scale, None, out, None, addend)
    np.testing.assert_array_equal(out, _exact(a, b, 7, 0).astype(np.float32) * scale + addend)


def test_fusion_pass_leaves_other_patterns_alone():
    model = _dynamic_matmul_model(32, 8, False)
    graph: Graph = load_onnx(model)
    # the Cast output read twice: not fused
    graph.nodes.append(Node("Identity", ["accf"], ["extra"]))
    graph.outputs.append("extra")
    assert passes.fuse_matmul_integer_scale(graph) == 0


def _dynamic_conv_model(case: dict, bias: bool, bias_rank: int = 4):
    """onnxruntime's quantize_dynamic pattern for Conv: DynamicQuantizeLinear, ConvInteger by uint8 weights, the
    float bias rounded by the activation scale x weight scale at run time (Div, Floor, Cast to int32, Reshape to one
    value per channel) and added to the int32 sums, Cast, Mul by that scale product."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    cout = case["w"][0]
    attrs = {k: v for k, v in case.items() if k in ("pads", "strides", "dilations", "group")}
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("ConvInteger", ["xq", "w", "xz", "wz"], ["acc"], **attrs),
        helper.make_node("Mul", ["xs", "ws"], ["s"]),
    ]
    inits = [numpy_helper.from_array(_rand8(rng, case["w"], np.uint8), "w"),
             numpy_helper.from_array(np.array(131, np.uint8), "wz"),
             numpy_helper.from_array(np.array(0.0137, np.float32), "ws")]
    if bias:
        spatial = [1] * (len(case["x"]) - 2)
        shape = [1, -1, *spatial] if bias_rank == len(case["x"]) else [-1, *spatial]
        nodes += [helper.make_node("Mul", ["xs", "ws"], ["bs"]),
                  helper.make_node("Div", ["b", "bs"], ["bq"]),
                  helper.make_node("Floor", ["bq"], ["bf"]),
                  helper.make_node("Cast", ["bf"], ["bi"], to=TensorProto.INT32),
                  helper.make_node("Reshape", ["bi", "bshape"], ["br"]),
                  helper.make_node("Add", ["acc", "br"], ["acc_b"])]
        inits += [numpy_helper.from_array(rng.normal(size=cout).astype(np.float32), "b"),
                  numpy_helper.from_array(np.array(shape, np.int64), "bshape")]
    nodes += [helper.make_node("Cast", ["acc_b" if bias else "acc"], ["accf"], to=TensorProto.FLOAT),
              helper.make_node("Mul", ["accf", "s"], ["y"])]
    graph = helper.make_graph(nodes, "dynconv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, case["x"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("bias, bias_rank", [(False, 0), (True, 4), (True, 3)])
def test_dynamic_quantized_conv_fused_and_against_onnxruntime(isa, threads, case, bias, bias_rank):
    """ConvInteger -> (Add of the run-time int32 bias) -> Cast -> Mul as one ConvIntegerScaled on the native conv:
    the bits of onnxruntime running the graph as written, and of hetero's reference."""
    pytest.importorskip("onnxruntime")
    model = _dynamic_conv_model(case, bias, bias_rank)
    session = hetero.Session(model.SerializeToString(), backends=["cpu"], on_fallback="error")
    assert session.rewrites["fuse_conv_integer_scale"] == 1
    fused = [n for n in session.graph.nodes if n.op_type == "ConvIntegerScaled"]
    assert len(fused) == 1 and fused[0].inputs[4] == "xs" and fused[0].inputs[6] == "ws"
    assert bool(fused[0].inputs[5]) == bias
    assert not [n for n in session.graph.nodes if n.op_type in ("ConvInteger", "Cast") and n.outputs[0] != "bi"]
    _same_bits_as_written(session, model, np.random.default_rng(8).normal(size=case["x"]).astype(np.float32))


def _inferred(model) -> Graph:
    graph: Graph = load_onnx(model)
    fold_and_infer(graph)  # the shapes the session's passes see
    return graph


def test_conv_fusion_leaves_other_patterns_alone():
    from onnx import numpy_helper

    case = CONV_CASES[0]
    cout = case["w"][0]
    graph = _inferred(_dynamic_conv_model(case, True))
    assert passes.fuse_conv_integer_scale(graph) == 1  # the pattern as the session sees it
    # the int32 sums read twice (here a graph output): not fused
    graph = _inferred(_dynamic_conv_model(case, False))
    graph.outputs.append("acc")
    assert passes.fuse_conv_integer_scale(graph) == 0
    # a bias that is not one value per output channel (one per column of the map): the Add, so nothing, fuses
    model = _dynamic_conv_model(case, True)
    out_w = case["x"][3]  # pads 1 and a 3 x 3 kernel: the output as wide as x
    for init in model.graph.initializer:
        if init.name == "bshape":
            init.CopyFrom(numpy_helper.from_array(np.array([1, 1, 1, out_w], np.int64), "bshape"))
        if init.name == "b":
            init.CopyFrom(numpy_helper.from_array(np.ones(out_w, np.float32), "b"))
    assert passes.fuse_conv_integer_scale(_inferred(model)) == 0
    assert cout != out_w


@pytest.mark.parametrize("scale", [0.05, 0.0123, 3.3e-3, 7.0, 1e-30, 1e30, -0.07, 1.5e-38])
def test_quantize_near_half_steps_as_division(isa, scale):
    # The avx512 path multiplies by 1 / scale and divides only the lanes near a half step: values at, and up to 40
    # ulps either side of, every half step of the range (and of steps far outside it) must quantize as x / scale does.
    s = np.float32(scale)
    half = (np.arange(-400, 400, dtype=np.float32) + np.float32(0.5)) * s
    near = [half]
    up, down = half.copy(), half.copy()
    for _ in range(40):
        up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(-np.inf))
        near += [up, down]
    rng = np.random.default_rng(int(abs(scale) * 1e6) % 1000)
    far = (rng.uniform(-3e6, 3e6, 4001).astype(np.float32) + np.float32(0.5)) * s
    x = np.concatenate([*near, far, np.array([np.inf, -np.inf, np.nan, 0.0, -0.0], np.float32)]).astype(np.float32)
    for dtype, zp in ((np.uint8, 3), (np.int8, -4)):
        y = np.empty(x.shape, dtype)
        _native.quantize_linear(x, np.array(s), np.array(zp, dtype), y)
        info = np.iinfo(dtype)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            q = np.rint(x / s)  # float32 division, ties to even
        q = np.where(np.isnan(q), np.float32(info.min - zp), q)
        want = (np.clip(q, info.min - zp, info.max - zp).astype(np.int32) + zp).astype(dtype)
        np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("dtype,zp", [(np.uint8, 0), (np.uint8, 255), (np.uint8, 131), (np.int8, -128),
                                       (np.int8, 127), (np.int8, 5)])
def test_quantize_every_length_and_lane(isa, dtype, zp):
    # The vector paths quantize whole vectors (16 / 8 lanes), then one value at a time: every length up to 199 (the
    # tails, and blocks of up to 64 values should a path take several vectors a step), ties, the range's ends and
    # values far outside it (both saturations), zero points at both ends, must give the reference's bytes in place.
    scale = np.array(0.02, np.float32)
    rng = np.random.default_rng(zp + 300)
    info = np.iinfo(dtype)
    pool = np.concatenate([rng.uniform(-9, 9, 400).astype(np.float32), (np.arange(-40, 40) + 0.5) * scale,
                           np.array([1e6, -1e6, (info.max - zp) * scale, (info.min - zp) * scale], np.float32)])
    for n in range(0, 200):
        x = rng.permutation(pool)[:n].astype(np.float32)
        y = np.empty(x.shape, dtype)
        _native.quantize_linear(x, scale, np.array(zp, dtype), y)
        np.testing.assert_array_equal(y, _reference("QuantizeLinear", [x, scale, np.array(zp, dtype)])[0])


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_quantize_dequantize_linear_match_reference(isa, threads, dtype):
    rng = np.random.default_rng(7)
    scale = np.array(0.05, np.float32)
    zp = np.array(3 if dtype is np.uint8 else -4, dtype)
    # ties (k + 0.5 steps), values far outside the range, and ordinary ones
    x = np.concatenate([(np.arange(-300, 300) + 0.5) * scale, rng.normal(0, 4, 70_001).astype(np.float32),
                        np.array([1e9, -1e9, 0.0], np.float32)]).astype(np.float32)
    y = np.empty(x.shape, dtype)
    _native.quantize_linear(x, scale, zp, y)
    np.testing.assert_array_equal(y, _reference("QuantizeLinear", [x, scale, zp])[0])
    back = np.empty(x.shape, np.float32)
    _native.dequantize_linear(y, scale, zp, back)
    np.testing.assert_array_equal(back, _reference("DequantizeLinear", [y, scale, zp])[0])
