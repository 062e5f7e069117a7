"""Per-kernel checks: each op on opencl (on_fallback="error") against the numpy reference backend on the same graph.

Small shapes on purpose (PoCL builds each program once, then it is cached); shapes that exercise edges: tails of
float4 / 16-element chunks, partial quantization blocks, GEMM tiles that do not divide M/N/K, broadcasting.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import hetero
from hetero.contract import TensorInfo, dtypes, quant
from hetero.contract.graph import HETERO_DOMAIN, Graph, Node
from hetero.contract.opforms import nearest_indices, source_coords

from .conftest import needs_device

pytestmark = needs_device
RNG = np.random.default_rng(0)


def rand(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


# -- ONNX ops --------------------------------------------------------------------------------------------------------
def onnx_model(op: str, feeds: dict[str, np.ndarray], attrs: dict | None = None, consts: dict | None = None,
               opset: int = 17, n_out: int = 1):
    consts = consts or {}
    names = [*feeds, *consts]
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
              for n, a in feeds.items()]
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, **(attrs or {}))
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None)
                                                    for o in outs],
                              [numpy_helper.from_array(a, n) for n, a in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check_onnx(op: str, feeds: dict[str, np.ndarray], attrs: dict | None = None, consts: dict | None = None,
               opset: int = 17, atol: float = 1e-5, optimize: bool = True, n_out: int = 1) -> None:
    model = onnx_model(op, feeds, attrs, consts, opset, n_out)
    got = hetero.Session(model, backends=["opencl"], on_fallback="error", optimize=optimize).run(feeds)
    want = hetero.Session(model, backends=["reference"], optimize=optimize).run(feeds)
    for name in want:
        assert got[name].shape == want[name].shape
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=atol, err_msg=f"{op} {name}")


@pytest.mark.parametrize("a,b", [((3, 5), (5, 7)), ((2, 33, 17), (17, 40)), ((4, 1, 3, 6), (2, 6, 5)), ((5,), (5, 3)),
                                 ((2, 4), (4,))])
def test_matmul(a, b):
    check_onnx("MatMul", {"a": rand(*a), "b": rand(*b)})


@pytest.mark.parametrize("ta,tb,c", [(0, 0, (7,)), (1, 0, (3, 7)), (0, 1, (3, 1)), (1, 1, None)])
def test_gemm(ta, tb, c):
    a = rand(5, 3) if ta else rand(3, 5)
    b = rand(7, 5) if tb else rand(5, 7)
    feeds = {"a": a, "b": b}
    if c is not None:
        feeds["c"] = rand(*c)
    check_onnx("Gemm", feeds, {"transA": ta, "transB": tb, "alpha": 0.5, "beta": 2.0})


@pytest.mark.parametrize("shape,w,attrs", [
    ((1, 3, 9, 8), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 4, 7, 7), (6, 2, 3, 3), {"group": 2, "strides": [2, 2]}),
    ((1, 4, 6, 6), (8, 1, 3, 3), {"group": 4, "pads": [1, 0, 1, 2], "dilations": [1, 2]}),  # depthwise x2
    ((1, 8, 5, 5), (4, 8, 1, 1), {}),  # pointwise: straight into the GEMM
    ((1, 3, 10), (2, 3, 4), {"auto_pad": "SAME_UPPER"}),  # 1-D
])
def test_conv(shape, w, attrs):
    check_onnx("Conv", {"x": rand(*shape)}, attrs, consts={"w": rand(*w), "b": rand(w[0])})


@pytest.mark.parametrize("act", ["LeakyRelu", "Relu"])
def test_fused_conv_with_a_max_by_a_constant(act):
    """fold_conv_clamp turns Conv, LeakyRelu (or Relu), Max by a constant into one FusedConv on opencl."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[0, 1, 0, 1]),
             helper.make_node(act, ["c"], ["r"], **({"alpha": 0.2} if act == "LeakyRelu" else {})),
             helper.make_node("Max", ["r", "c0"], ["y"])]
    inits = {"w": rand(5, 3, 1, 3), "b": rand(5), "c0": np.full((1, 1, 1, 1), -0.4 if act == "LeakyRelu" else 0.3,
                                                                  np.float32)}
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": rand(1, 3, 6, 7, scale=2.0)}
    session = hetero.Session(model, backends=["opencl"], on_fallback="error")
    assert [p.op_type for p in session.placement.nodes] == ["FusedConv"]
    np.testing.assert_allclose(session.run(feeds)["y"], hetero.Session(model, backends=["reference"],
                                                                       optimize=False).run(feeds)["y"],
                               rtol=1e-4, atol=1e-5)


def test_fused_conv_and_matmul_with_activations():
    """Graph passes fuse Conv+Relu and MatMul+Add+Clip; both must stay on opencl."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("MatMul", ["f", "m"], ["mm"]),
             helper.make_node("Add", ["mm", "bias"], ["a"]),
             helper.make_node("Clip", ["a", "lo", "hi"], ["y"])]
    inits = {"w": rand(4, 3, 3, 3), "b": rand(4), "m": rand(144, 10, scale=0.1), "bias": rand(10),
             "lo": np.array(-0.5, np.float32), "hi": np.array(0.5, np.float32)}
    graph = helper.make_graph(nodes, "g", [x], [y], [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": rand(1, 3, 6, 6)}
    session = hetero.Session(model, backends=["opencl"], on_fallback="error")
    ops = {p.op_type for p in session.placement.nodes}
    assert "FusedConv" in ops and "FusedMatMul" in ops, ops
    np.testing.assert_allclose(session.run(feeds)["y"], hetero.Session(model, backends=["reference"]).run(feeds)["y"],
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AveragePool", {"kernel_shape": [2, 3], "pads": [0, 1, 0, 1]}),
    ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ("GlobalAveragePool", {}),
    ("GlobalMaxPool", {}),
])
def test_pooling(op, attrs):
    check_onnx(op, {"x": rand(2, 3, 7, 9)}, attrs)


@pytest.mark.parametrize("op,axis,opset", [("Softmax", -1, 17), ("Softmax", 1, 17), ("LogSoftmax", -1, 17),
                                           ("Softmax", 1, 11)])
def test_softmax(op, axis, opset):
    check_onnx(op, {"x": rand(2, 5, 300)}, {"axis": axis}, opset=opset)


def test_layer_norm():
    check_onnx("LayerNormalization", {"x": rand(3, 4, 37)}, {"axis": -1, "epsilon": 1e-5},
               consts={"s": rand(37), "b": rand(37)})


def test_layer_norm_with_a_broadcast_bias_runs_elsewhere():
    # the kernel reads the bias as a whole row: a one-element bias would be read past its end
    feeds = {"x": rand(3, 4, 37)}
    model = onnx_model("LayerNormalization", feeds, {"axis": -1}, {"s": rand(37), "b": rand(1)}, 17, 1)
    with pytest.raises(hetero.HeteroError, match="broadcast bias"):
        hetero.Session(model, backends=["opencl"], on_fallback="error")
    got = hetero.Session(model, backends=["opencl", "cpu"], on_fallback="silent").run(feeds)
    want = hetero.Session(model, backends=["reference"]).run(feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode,coord", [("nearest", "asymmetric"), ("nearest", "half_pixel"),
                                        ("linear", "half_pixel"), ("linear", "align_corners"),
                                        ("linear", "pytorch_half_pixel")])
def test_resize(mode, coord):
    scales = np.array([1, 1, 2.0, 1.5], np.float32)
    check_onnx("Resize", {"x": rand(1, 2, 4, 6)}, {"mode": mode, "coordinate_transformation_mode": coord},
               consts={"roi": np.zeros(0, np.float32), "scales": scales}, opset=13)


@pytest.mark.parametrize("nearest", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
def test_resize_nearest_ties_to_sizes(nearest):
    """2 -> 7 rows under half_pixel puts output row 3 at source 0.5 exactly, a tie: a float32 division on the
    device that is an ulp high (NVIDIA's OpenCL, 2.5 ulp allowed) rounded it up under round_prefer_floor. The
    nearest source rows and columns now come from the host in float64."""
    ties = source_coords("half_pixel", 2, 7, 7 / 2)
    assert ties[3] == 0.5
    assert nearest_indices(nearest, ties, 2)[3] == {"round_prefer_floor": 0, "round_prefer_ceil": 1, "floor": 0,
                                                     "ceil": 1}[nearest]
    check_onnx("Resize", {"x": rand(1, 2, 2, 2)}, {"mode": "nearest", "nearest_mode": nearest},
               consts={"roi": np.zeros(0, np.float32), "scales": np.zeros(0, np.float32),
                       "sizes": np.array([1, 2, 7, 8], np.int64)}, opset=13)


@pytest.mark.parametrize("op,b", [("Add", (1, 7)), ("Mul", (3, 1, 7)), ("Sub", (2, 3, 5, 7)), ("Div", ()),
                                  ("Pow", (7,)), ("Max", (3, 5, 1)), ("Min", (2, 3, 5, 7))])
def test_binary_broadcasting(op, b):
    a = np.abs(rand(2, 3, 5, 7)) + 0.5 if op == "Pow" else rand(2, 3, 5, 7)
    check_onnx(op, {"a": a, "b": rand(*b) if b else np.array(1.5, np.float32)})


@pytest.mark.parametrize("op", ["Relu", "Sigmoid", "Tanh", "Exp", "Erf", "Gelu", "HardSwish", "Softplus", "Neg",
                                "Abs", "Mish", "Elu", "LeakyRelu", "Floor", "Round"])
def test_unary(op):
    check_onnx(op, {"x": rand(3, 7) * 2}, opset=20)


def test_movement():
    x = rand(2, 3, 4, 5)
    check_onnx("Transpose", {"x": x}, {"perm": [2, 0, 3, 1]})
    check_onnx("Slice", {"x": x}, consts={"s": np.array([0, 3, -1], np.int64), "e": np.array([2, 0, -6], np.int64),
                                         "a": np.array([0, 2, 3], np.int64), "st": np.array([1, -2, -2], np.int64)})
    check_onnx("Concat", {"a": x, "b": rand(2, 1, 4, 5), "c": rand(2, 2, 4, 5)}, {"axis": 1})
    check_onnx("Gather", {"x": x}, {"axis": 2}, consts={"i": np.array([[3, -1], [0, 2]], np.int64)})
    check_onnx("Reshape", {"x": x}, consts={"s": np.array([6, -1], np.int64)})
    check_onnx("Expand", {"x": rand(3, 1, 5)}, consts={"s": np.array([2, 3, 4, 5], np.int64)})
    check_onnx("Split", {"x": x}, {"axis": 3}, consts={"s": np.array([2, 3], np.int64)}, opset=18, n_out=2)
    check_onnx("Concat", {"a": np.arange(6, dtype=np.int64).reshape(2, 3), "b": np.ones((2, 1), np.int64)},
               {"axis": 1})


def test_conformance_kit():
    from hetero.testing import conformance

    report = conformance.check_backend("opencl")
    assert not report.failures, "\n".join(str(f) for f in report.failures)


# -- LLM ops (domain hetero) --------------------------------------------------------------------------------------
def hetero_graph(op: str, feeds: dict[str, np.ndarray], consts: dict[str, np.ndarray], attrs: dict) -> Graph:
    graph = Graph(inputs=list(feeds), outputs=["y"], opsets={"": 21, HETERO_DOMAIN: 1}, name="t")
    for name, value in {**feeds, **consts}.items():
        shape = (None, *value.shape[1:]) if name in feeds and value.ndim else value.shape  # T varies between runs
        graph.values[name] = TensorInfo(dtypes.from_numpy(value.dtype), shape)
    graph.initializers.update(consts)
    graph.nodes.append(Node(op, [*feeds, *consts], ["y"], dict(attrs), name="n", domain=HETERO_DOMAIN))
    return graph


def check_hetero(op: str, feeds: dict[str, np.ndarray], consts: dict[str, np.ndarray], attrs: dict,
                 atol: float = 1e-5, steps: list[dict[str, np.ndarray]] | None = None) -> None:
    """Runs the node on opencl and on the reference; ``steps`` are further feeds for stateful ops."""
    ours = hetero.Session(hetero_graph(op, feeds, consts, attrs), backends=["opencl"], on_fallback="error")
    ref = hetero.Session(hetero_graph(op, feeds, consts, attrs), backends=["reference"])
    assert {p.backend for p in ours.placement.nodes} == {"opencl"}
    for step in [feeds, *(steps or [])]:
        np.testing.assert_allclose(ours.run(step)["y"], ref.run(step)["y"], rtol=1e-4, atol=atol, err_msg=op)


WEIGHT_SPECS = ["f32", "f16", "bf16", "q8", "q8_asym_b64", "q4", "q4_asym", "q4_b128", "q8_b128", "q4_asym_b64"]


def make_weight(spec: str, n: int, k: int) -> tuple[np.ndarray, dict]:
    w = rand(n, k, scale=0.5)
    if spec == "f32":
        return w, {"wtype": "f32"}
    if spec == "f16":
        return w.astype(np.float16), {"wtype": "f16"}
    if spec == "bf16":
        return quant.f32_to_bf16(w), {"wtype": "bf16"}
    fmt = quant.parse_quant(spec)
    assert fmt is not None, spec
    return quant.quantize(w, fmt), fmt.attrs()


@pytest.mark.parametrize("spec", WEIGHT_SPECS)
@pytest.mark.parametrize("m", [1, 3, 12])  # decode (matrix-vector), a short batch, the dequantize + GEMM path
def test_qmatmul(spec, m):
    k, n = 100, 37  # K: a partial block and a tail past the last 16-element chunk
    w, attrs = make_weight(spec, n, k)
    consts = {"w": w}
    if m == 3:
        consts["bias"] = rand(n)
    check_hetero("QMatMul", {"x": rand(m, k)}, consts, attrs, atol=1e-4)


@pytest.mark.parametrize("spec", ["f32", "f16", "bf16", "q8", "q4_asym_b64"])
def test_embedding(spec):
    table, attrs = make_weight(spec, 20, 40)
    ids = np.array([0, 19, 7, 7], np.int64)
    check_hetero("Embedding", {"ids": ids}, {"table": table}, {**attrs, "dim": 40})


def test_rmsnorm_swiglu():
    check_hetero("RMSNorm", {"x": rand(3, 2, 24)}, {"w": rand(24)}, {"epsilon": 1e-6, "offset": 1.0})
    check_hetero("SwiGLU", {"g": rand(3, 10), "u": rand(3, 10)}, {}, {})


@pytest.mark.parametrize("attrs", [{"theta": 10000.0}, {"theta": 1e6, "rotary_dim": 8},
                                   {"theta": 10000.0, "scaling": "yarn", "factor": 4.0,
                                    "original_max_position": 64, "attention_factor": 1.2}])
def test_rotary(attrs):
    x = rand(5, 3, 16)
    check_hetero("RotaryEmbedding", {"x": x, "past_len": np.array(7, np.int64)}, {}, attrs,
                 steps=[{"x": rand(1, 3, 16), "past_len": np.array(400, np.int64)}])


def test_attention_decode_and_rollback():
    """Prefill 6, decode 2, roll back to 4 and decode again: the cache lives on the device across runs."""
    hq, hkv, d = 4, 2, 16

    def feeds(t: int, past: int) -> dict[str, np.ndarray]:
        return {"q": rand(t, hq, d), "k": rand(t, hkv, d), "v": rand(t, hkv, d), "past_len": np.array(past, np.int64)}

    steps = [feeds(1, 6), feeds(1, 7), feeds(3, 4), feeds(1, 7)]
    check_hetero("Attention", feeds(6, 0), {}, {"max_context": 80}, steps=steps)


def test_attention_long_context_crosses_key_tiles():
    hq, hkv, d = 2, 1, 8
    first = {"q": rand(150, hq, d), "k": rand(150, hkv, d), "v": rand(150, hkv, d), "past_len": np.array(0, np.int64)}
    step = {"q": rand(1, hq, d), "k": rand(1, hkv, d), "v": rand(1, hkv, d), "past_len": np.array(150, np.int64)}
    check_hetero("Attention", first, {}, {"max_context": 160}, steps=[step])


def test_attention_errors_match_the_reference():
    graph = hetero_graph("Attention", {"q": rand(2, 2, 8), "k": rand(2, 1, 8), "v": rand(2, 1, 8),
                                       "past_len": np.array(0, np.int64)}, {}, {"max_context": 4})
    session = hetero.Session(graph, backends=["opencl"], on_fallback="error")
    with pytest.raises(hetero.HeteroError, match="outside the 0 cached"):
        session.run({"q": rand(2, 2, 8), "k": rand(2, 1, 8), "v": rand(2, 1, 8), "past_len": np.array(1, np.int64)})
    session.run({"q": rand(2, 2, 8), "k": rand(2, 1, 8), "v": rand(2, 1, 8), "past_len": np.array(0, np.int64)})
    with pytest.raises(hetero.HeteroError, match="exceed the context"):
        session.run({"q": rand(3, 2, 8), "k": rand(3, 1, 8), "v": rand(3, 1, 8), "past_len": np.array(2, np.int64)})


@pytest.mark.parametrize("spec", ["f32", "q4", "q8_asym_b64"])
@pytest.mark.parametrize("t", [1, 5])
def test_moe(spec, t):
    experts, hidden, inter, top_k = 6, 48, 20, 2
    gate = [make_weight(spec, inter, hidden) for _ in range(experts)]
    up = [make_weight(spec, inter, hidden) for _ in range(experts)]
    down = [make_weight(spec, hidden, inter) for _ in range(experts)]
    consts = {"router": rand(experts, hidden), "gate": np.stack([g[0] for g in gate]),
              "up": np.stack([u[0] for u in up]), "down": np.stack([d[0] for d in down])}
    check_hetero("MoE", {"x": rand(t, hidden)}, consts, {**gate[0][1], "top_k": top_k, "norm_topk_prob": 1},
                 atol=1e-4)


def test_moe_shared_expert_is_refused_not_ignored():
    """The opencl MoE kernel routes experts only: a node with a shared expert must go to another backend."""
    experts, hidden, inter = 4, 32, 16
    consts = {"router": rand(experts, hidden), "gate": rand(experts, inter, hidden), "up": rand(experts, inter, hidden),
              "down": rand(experts, hidden, inter), "sg": rand(inter, hidden), "su": rand(inter, hidden),
              "sd": rand(hidden, inter)}
    feeds = {"x": rand(3, hidden)}
    attrs = {"wtype": "f32", "top_k": 2}
    ours = hetero.Session(hetero_graph("MoE", feeds, consts, attrs), backends=["opencl", "cpu"])
    assert {p.backend for p in ours.placement.nodes} == {"cpu"}
    ref = hetero.Session(hetero_graph("MoE", feeds, consts, attrs), backends=["reference"])
    np.testing.assert_allclose(ours.run(feeds)["y"], ref.run(feeds)["y"], rtol=1e-3, atol=1e-3)
