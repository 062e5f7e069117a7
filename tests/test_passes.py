"""Graph passes: each rewrite keeps the model's outputs (checked against the unoptimised graph) and fires where
it should."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import hetero
from conftest import backend_ok, make_model
from hetero.contract import dtypes
from hetero.contract.graph import Node
from hetero.contract.onnx_export import onnx_nodes
from hetero.contract.registry import OpContext, get
from hetero.contract.tensor import TensorInfo
from hetero.demo import tiny_cnn
from hetero.ir import passes

BACKENDS = ["reference"] + (["cpu"] if backend_ok("cpu")[0] else [])


def _compare(model, feeds, backend: str, rtol: float = 1e-5, atol: float = 1e-5) -> hetero.Session:
    plain = hetero.Session(model, backends=["reference"], optimize=False).run(feeds)
    session = hetero.Session(model, backends=[backend], on_fallback="silent")
    for name, value in session.run(feeds).items():
        np.testing.assert_allclose(value, plain[name], rtol=rtol, atol=atol)
    return session


def _ops(session: hetero.Session) -> list[str]:
    return [n.op_type for n in session.graph.nodes]


def _conv_model(activation_nodes, rng):
    w = rng.normal(size=(8, 3, 3, 3)).astype(np.float32)
    b = rng.normal(size=8).astype(np.float32)
    stats = [rng.uniform(0.5, 1.5, 8), rng.normal(size=8), rng.normal(size=8), rng.uniform(0.5, 2, 8)]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "sh", "m", "v"], ["bn"], epsilon=1e-3),
        *activation_nodes,
    ]
    inits = [("w", w), ("b", b), *zip(["s", "sh", "m", "v"], [a.astype(np.float32) for a in stats], strict=True)]
    return make_model(nodes, [("x", TensorProto.FLOAT, [2, 3, 8, 8])], [("y", TensorProto.FLOAT, None)], inits)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "acts, fused",
    [
        ([helper.make_node("Relu", ["bn"], ["y"])], "Relu"),
        ([helper.make_node("Clip", ["bn", "lo", "hi"], ["y"])], "Clip"),
        ([helper.make_node("LeakyRelu", ["bn"], ["y"], alpha=0.2)], "LeakyRelu"),
        ([helper.make_node("HardSigmoid", ["bn"], ["y"], alpha=0.3, beta=0.4)], "HardSigmoid"),
        ([helper.make_node("Sigmoid", ["bn"], ["sg"]), helper.make_node("Mul", ["bn", "sg"], ["y"])], "Silu"),
        ([helper.make_node("Sigmoid", ["bn"], ["y"])], "Sigmoid"),
        # Paddle 2.x's hard-swish, x * HardSigmoid(x, 1/6, 0.5), either Mul order; 0.16666670 as PP-OCRv5 writes it
        ([helper.make_node("HardSigmoid", ["bn"], ["hs"], alpha=1 / 6, beta=0.5),
          helper.make_node("Mul", ["hs", "bn"], ["y"])], "HardSwish"),
        ([helper.make_node("HardSigmoid", ["bn"], ["hs"], alpha=0.16666670143604279, beta=0.5),
          helper.make_node("Mul", ["bn", "hs"], ["y"])], "HardSwish"),
    ],
)
def test_conv_bn_activation_fuse_to_one_node(backend, acts, fused):
    rng = np.random.default_rng(0)
    model = _conv_model(acts, rng)
    if fused == "Clip":
        model.graph.initializer.extend([helper.make_tensor("lo", TensorProto.FLOAT, [], [0.0]),
                                        helper.make_tensor("hi", TensorProto.FLOAT, [], [6.0])])
    x = rng.normal(size=(2, 3, 8, 8)).astype(np.float32)
    session = _compare(model, {"x": x}, backend)
    assert _ops(session) == ["FusedConv"]
    assert session.graph.nodes[0].attrs["activation"] == fused
    assert session.rewrites["fold_conv_batchnorm"] == 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("alpha, beta, second_user", [(0.2, 0.5, False), (1 / 6, 0.4, False), (1 / 6, 0.5, True)])
def test_conv_hard_sigmoid_times_x_fuses_only_as_hard_swish(backend, alpha, beta, second_user):
    """x * HardSigmoid(x) is HardSwish only at alpha 1/6, beta 0.5, and only where the Mul alone reads the
    HardSigmoid: otherwise both nodes stay (the conv has two readers, no activation of its own)."""
    rng = np.random.default_rng(5)
    acts = [helper.make_node("HardSigmoid", ["bn"], ["hs"], alpha=alpha, beta=beta),
            helper.make_node("Mul", ["bn", "hs"], ["y"])]
    model = _conv_model(acts, rng)
    if second_user:
        model.graph.node.append(helper.make_node("Neg", ["hs"], ["z"]))
        model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    x = rng.normal(size=(2, 3, 8, 8)).astype(np.float32) * 3
    session = _compare(model, {"x": x}, backend)
    assert "HardSigmoid" in _ops(session) and "Mul" in _ops(session)
    assert all(n.attrs.get("activation") != "HardSwish" for n in session.graph.nodes)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("group,bias", [(1, True), (2, True), (2, False)])
def test_conv_transpose_batchnorm_folds(backend, group, bias):
    """A decoder's ConvTranspose (4 x 4, stride 2, pad 1), BatchNormalization, ReLU: the BatchNorm's scale goes into
    the weight of each output channel g * Cout/group + co (the weight's [g * C/group:, co] slice), its shift into the
    bias (made where the ConvTranspose has none)."""
    rng = np.random.default_rng(3)
    w = rng.normal(size=(6, 4, 4, 4)).astype(np.float32)
    channels = 4 * group
    stats = [rng.uniform(0.5, 1.5, channels), rng.normal(size=channels), rng.normal(size=channels),
             rng.uniform(0.5, 2, channels)]
    inputs = ["x", "w", "b"] if bias else ["x", "w"]
    nodes = [helper.make_node("ConvTranspose", inputs, ["c"], group=group, strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "sh", "m", "v"], ["bn"], epsilon=1e-3),
             helper.make_node("Relu", ["bn"], ["y"])]
    inits = [("w", w), *([("b", rng.normal(size=channels).astype(np.float32))] if bias else []),
             *zip(["s", "sh", "m", "v"], [a.astype(np.float32) for a in stats], strict=True)]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [2, 6, 5, 7])], [("y", TensorProto.FLOAT, None)], inits)
    session = _compare(model, {"x": rng.normal(size=(2, 6, 5, 7)).astype(np.float32)}, backend, rtol=1e-4,
                       atol=1e-4)
    assert _ops(session) == ["ConvTransposeRelu"]
    assert session.rewrites["fold_conv_batchnorm"] == 1
    assert session.rewrites["fuse_conv_transpose_relu"] == 1
    with passes.leaving_out("fuse_conv_transpose_relu"):
        unfused = hetero.Session(model, backends=[backend], on_fallback="silent")
    assert _ops(unfused) == ["ConvTranspose", "Relu"]
    x = rng.normal(size=(2, 6, 5, 7)).astype(np.float32)
    x[0, 0, :2, :3] = np.nan  # NaN passes the Relu, as np.maximum(x, 0)
    np.testing.assert_array_equal(session.run({"x": x})["y"], unfused.run({"x": x})["y"])  # the two nodes' bits


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k,stride,pads,shape", [
    (4, 2, [1, 1, 1, 1], (1, 6, 5, 7)),  # the stride-2 phase convs (img_focus's decoder)
    (2, 2, [0, 0, 0, 0], (2, 6, 3, 4)),  # a 2 x 2 kernel at stride 2: the 1 x 1 conv and interleave
    (3, 1, [1, 1, 1, 1], (1, 6, 4, 1)),  # stride 1: the column matrix and its scatter
    (4, 2, [1, 1, 1, 1], (1, 300, 3, 2)),  # more than 256 input channels: the column matrix at stride 2
])
def test_conv_transpose_relu_is_the_two_nodes(backend, k, stride, pads, shape):
    """ConvTranspose -> Relu as one hetero.ConvTransposeRelu on each of the native kernel's paths: the same bits as the
    ConvTranspose and the Relu apart; a ConvTranspose whose output another node also reads keeps its Relu apart."""
    rng = np.random.default_rng(k + stride + shape[1])
    cout = 5
    w = (rng.normal(size=(shape[1], cout, k, k)) * 0.2).astype(np.float32)
    b = rng.normal(size=cout).astype(np.float32)
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["c"], strides=[stride, stride], pads=pads),
             helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, [("x", TensorProto.FLOAT, list(shape))], [("y", TensorProto.FLOAT, None)],
                       [("w", w), ("b", b)])
    x = rng.normal(size=shape).astype(np.float32)
    session = _compare(model, {"x": x}, backend, rtol=1e-4, atol=1e-4)
    assert _ops(session) == ["ConvTransposeRelu"]
    exported = onnx_nodes(session.graph.nodes[0], {})  # as standard ONNX (a vendor backend's segment)
    assert [n.op_type for n in exported] == ["ConvTranspose", "Relu"] and exported[-1].output == ["y"]
    with passes.leaving_out("fuse_conv_transpose_relu"):
        unfused = hetero.Session(model, backends=[backend], on_fallback="silent")
    np.testing.assert_array_equal(session.run({"x": x})["y"], unfused.run({"x": x})["y"])
    nodes.append(helper.make_node("Neg", ["c"], ["z"]))
    shared = make_model(nodes, [("x", TensorProto.FLOAT, list(shape))],
                        [("y", TensorProto.FLOAT, None), ("z", TensorProto.FLOAT, None)], [("w", w), ("b", b)])
    session = _compare(shared, {"x": x}, backend, rtol=1e-4, atol=1e-4)
    assert session.rewrites["fuse_conv_transpose_relu"] == 0 and "Relu" in _ops(session)


def test_conv_transpose_batchnorm_mismatch_stays():
    """A BatchNormalization over other channels than the ConvTranspose makes (here: C, not Cout) is left alone."""
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["c"], strides=[2, 2]),
             helper.make_node("BatchNormalization", ["c", "s", "sh", "m", "v"], ["y"])]
    inits = [("w", rng.normal(size=(6, 4, 2, 2)).astype(np.float32)),
             *zip(["s", "sh", "m", "v"], [np.ones(6, np.float32)] * 4, strict=True)]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [1, 6, 3, 3])], [("y", TensorProto.FLOAT, None)], inits)
    session = hetero.Session(model, backends=["reference"])
    assert session.rewrites["fold_conv_batchnorm"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("gamma_shape,bias,folds", [((6,), True, True), ((1, 1, 6), False, True), ((1, 6), True, True),
                                                    ((), True, False), ((1,), True, False), ((3, 6), True, False),
                                                    ((1, 1, 1, 6), True, False)])
def test_matmul_layer_scale_folds(backend, gamma_shape, bias, folds):
    """A ViT's layer scale: Mul of [N] (or [1, 1, N]) after a projection's bias folds into its weight's columns and
    bias; a single value (a query's scale), a constant varying along another axis or raising the rank stays a Mul."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"])]
    inits = [("w", rng.normal(size=(4, 6)).astype(np.float32)),
             ("gamma", rng.uniform(0.5, 1.5, gamma_shape).astype(np.float32))]
    if bias:
        nodes.append(helper.make_node("Add", ["mm", "b"], ["pre"]))
        inits.append(("b", rng.normal(size=6).astype(np.float32)))
    nodes += [helper.make_node("Mul", ["gamma", "pre" if bias else "mm"], ["ls"]),  # the constant first
              helper.make_node("Add", ["ls", "x6"], ["y"])]  # the residual
    model = make_model(nodes, [("x", TensorProto.FLOAT, [2, 3, 4]), ("x6", TensorProto.FLOAT, [2, 3, 6])],
                       [("y", TensorProto.FLOAT, None)], inits)
    feeds = {"x": rng.normal(size=(2, 3, 4)).astype(np.float32), "x6": rng.normal(size=(2, 3, 6)).astype(np.float32)}
    session = _compare(model, feeds, backend)
    assert session.rewrites["fold_matmul_scale"] == int(folds)
    assert ("Mul" in _ops(session)) != folds


def _paddle_conv_model(divide_by_six: bool, rng):
    """Paddle's export: Conv, BatchNorm as Mul and Add of scalars, hard-swish as x * Clip(x + 3, 0, 6) / 6."""
    w = rng.normal(size=(8, 3, 3, 3)).astype(np.float32)
    b = rng.normal(size=8).astype(np.float32)
    tail = (helper.make_node("Div", ["hm", "six"], ["y"]) if divide_by_six
            else helper.make_node("Mul", ["hm", "sixth"], ["y"]))
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["c", "scale"], ["cs"]),
        helper.make_node("Add", ["shift", "cs"], ["bn"]),  # the constant first: either order folds
        helper.make_node("Sub", ["bn", "channel"], ["a"]),  # per channel [8, 1, 1]
        helper.make_node("Add", ["a", "three"], ["a3"]),
        helper.make_node("Clip", ["a3", "zero", "six"], ["cl"]),
        helper.make_node("Mul", ["a", "cl"], ["hm"]),
        tail,
    ]
    f32 = np.float32
    inits = [("w", w), ("b", b), ("scale", np.array([0.7], f32)), ("shift", np.array([0.3], f32)),
             ("channel", rng.normal(size=(8, 1, 1)).astype(f32)), ("three", np.array(3.0, f32)),
             ("zero", np.array(0.0, f32)), ("six", np.array(6.0, f32)), ("sixth", np.array(1 / 6, f32))]
    return make_model(nodes, [("x", TensorProto.FLOAT, [2, 3, 8, 8])], [("y", TensorProto.FLOAT, None)], inits)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("divide_by_six", [True, False])
def test_conv_scale_shift_and_hard_swish_fuse_to_one_node(backend, divide_by_six):
    rng = np.random.default_rng(4)
    model = _paddle_conv_model(divide_by_six, rng)
    x = rng.normal(size=(2, 3, 8, 8)).astype(np.float32) * 3
    session = _compare(model, {"x": x}, backend)
    assert _ops(session) == ["FusedConv"]
    assert session.graph.nodes[0].attrs["activation"] == "HardSwish"
    assert session.rewrites["fold_conv_scale_shift"] == 3


def _gelu_tanh_nodes(x: str, y: str, constants_first: bool) -> list:
    """jax2tf's tanh GELU (magika): nine elementwise nodes, the constants on either side."""
    def mul(a, b, out):
        return helper.make_node("Mul", [b, a] if constants_first else [a, b], [out])

    return [mul(x, "c_cube", "g0"), helper.make_node("Mul", [x, "g0"], ["g1"]),
            helper.make_node("Mul", [x, "g1"], ["g2"]), helper.make_node("Add", [x, "g2"], ["g3"]),
            mul("g3", "c_sqrt", "g4"), helper.make_node("Tanh", ["g4"], ["g5"]),
            helper.make_node("Add", ["c_one", "g5"] if constants_first else ["g5", "c_one"], ["g6"]),
            mul("g6", "c_half", "g7"), helper.make_node("Mul", [x, "g7"], [y])]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("constants_first", [True, False])
def test_gelu_tanh_written_out_becomes_one_node(backend, constants_first):
    f32 = np.float32
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["x", "r"], ["h"]),
             *_gelu_tanh_nodes("h", "y", constants_first)]
    inits = [("c_cube", np.array(0.044715, f32)), ("c_sqrt", np.array(np.sqrt(2 / np.pi), f32)),
             ("c_one", np.array(1.0, f32)), ("c_half", np.array(0.5, f32))]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [3, 40])], [("y", TensorProto.FLOAT, None)], inits)
    x = np.random.default_rng(6).normal(size=(3, 40)).astype(f32) * 3
    session = _compare(model, {"x": x}, backend)
    assert session.rewrites["fuse_gelu_tanh"] == 1
    assert _ops(session) == ["Relu", "Add", "Gelu"]


def test_gelu_tanh_with_a_shared_intermediate_is_left_alone():
    f32 = np.float32
    nodes = [*_gelu_tanh_nodes("x", "y", True), helper.make_node("Add", ["y", "g5"], ["z"])]  # tanh read twice
    inits = [("c_cube", np.array(0.044715, f32)), ("c_sqrt", np.array(np.sqrt(2 / np.pi), f32)),
             ("c_one", np.array(1.0, f32)), ("c_half", np.array(0.5, f32))]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [2, 8])], [("z", TensorProto.FLOAT, None)], inits)
    session = _compare(model, {"x": np.linspace(-3, 3, 16, dtype=f32).reshape(2, 8)}, "reference")
    assert session.rewrites["fuse_gelu_tanh"] == 0


def _gelu_tanh_torch_nodes(x: str, y: str) -> list:
    """PyTorch's tanh GELU (HF NewGELU, T5): (x * 0.5) * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * Pow(x, 3))))."""
    mk = helper.make_node
    return [mk("Mul", [x, "c_half"], ["t0"]), mk("Pow", [x, "c_three"], ["t1"]), mk("Mul", ["t1", "c_cube"], ["t2"]),
            mk("Add", [x, "t2"], ["t3"]), mk("Mul", ["t3", "c_sqrt"], ["t4"]), mk("Tanh", ["t4"], ["t5"]),
            mk("Add", ["t5", "c_one"], ["t6"]), mk("Mul", ["t0", "t6"], [y])]


_GELU_TANH_CONSTANTS = [("c_cube", np.array(0.044715, np.float32)),
                        ("c_sqrt", np.array(np.sqrt(2 / np.pi), np.float32)), ("c_one", np.array(1.0, np.float32)),
                        ("c_half", np.array(0.5, np.float32)), ("c_three", np.array(3.0, np.float32))]


@pytest.mark.parametrize("backend", BACKENDS)
def test_gelu_tanh_as_pytorch_writes_it_becomes_one_node(backend):
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["x", "r"], ["h"]),
             *_gelu_tanh_torch_nodes("h", "y")]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [3, 40])], [("y", TensorProto.FLOAT, None)],
                       _GELU_TANH_CONSTANTS)
    x = np.random.default_rng(6).normal(size=(3, 40)).astype(np.float32) * 3
    session = _compare(model, {"x": x}, backend)
    assert session.rewrites["fuse_gelu_tanh"] == 1
    assert _ops(session) == ["Relu", "Add", "Gelu"]


def test_gelu_tanh_as_pytorch_writes_it_left_alone_when_x_is_not_the_halved_value():
    nodes = [helper.make_node("Neg", ["x"], ["n"]), *_gelu_tanh_torch_nodes("x", "y")]
    nodes[1] = helper.make_node("Mul", ["n", "c_half"], ["t0"])  # halves -x: not a GELU
    model = make_model(nodes, [("x", TensorProto.FLOAT, [2, 8])], [("y", TensorProto.FLOAT, None)],
                       _GELU_TANH_CONSTANTS)
    session = _compare(model, {"x": np.linspace(-3, 3, 16, dtype=np.float32).reshape(2, 8)}, "reference")
    assert session.rewrites["fuse_gelu_tanh"] == 0


def _rms_norm_nodes(x: str, y: str, form: str, weight: bool = True) -> list:
    """RMS norm written out: mean of squares over the last axis, + eps, Sqrt, then the division in one of three
    forms, then maybe the weight."""
    mk = helper.make_node
    square = mk("Pow", [x, "c_two"], ["r0"]) if form == "pow" else mk("Mul", [x, x], ["r0"])
    head = [square, mk("ReduceMean", ["r0", "c_axes"], ["r1"]), mk("Add", ["r1", "c_eps"], ["r2"]),
            mk("Sqrt", ["r2"], ["r3"])]
    out = y if not weight else "r5"
    if form == "divide":  # x / sqrt
        body = [mk("Div", [x, "r3"], [out])]
    elif form == "reciprocal":
        body = [mk("Reciprocal", ["r3"], ["r4"]), mk("Mul", ["r4", x], [out])]
    else:  # T5: x * (1 / sqrt)
        body = [mk("Div", ["c_one", "r3"], ["r4"]), mk("Mul", [x, "r4"], [out])]
    return [*head, *body, *([mk("Mul", ["c_weight", "r5"], [y])] if weight else [])]


def _rms_constants(width: int, axis: int = -1) -> list:
    w = np.random.default_rng(11).uniform(0.5, 2, width).astype(np.float32)
    return [("c_two", np.array(2.0, np.float32)), ("c_axes", np.array([axis], np.int64)),
            ("c_eps", np.array(1e-6, np.float32)), ("c_one", np.array(1.0, np.float32)), ("c_weight", w)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form, weight", [("t5", True), ("pow", True), ("divide", True), ("reciprocal", False)])
@pytest.mark.parametrize("width", [40, 77, 512])
def test_rms_norm_written_out_becomes_one_node(backend, form, weight, width):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sub", ["x", "a"], ["h"]),
             *_rms_norm_nodes("h", "y", form, weight)]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [2, 5, width])], [("y", TensorProto.FLOAT, None)],
                       _rms_constants(width), opset=18)
    x = np.random.default_rng(12).normal(size=(2, 5, width)).astype(np.float32) * 4
    session = _compare(model, {"x": x}, backend, rtol=2e-6, atol=1e-6)
    assert session.rewrites["fuse_rms_norm"] == 1
    assert _ops(session) == ["Relu", "Sub", "RMSNorm"]
    if backend == "cpu" and form in ("t5", "pow"):
        # The fused kernel rounds as the written-out nodes do on this backend (each square rounded, the row summed
        # in the same lane order, mean * (1 / n), + eps, 1 / sqrt, two products): bit for bit. A dynamically
        # quantized model re-quantizes from each activation's min / max, so a last-bit change moves whole steps.
        plain = hetero.Session(model, backends=["cpu"], optimize=False).run({"x": x})["y"]
        np.testing.assert_array_equal(session.run({"x": x})["y"], plain)


def test_rms_norm_left_alone_unless_over_the_last_axis_with_private_intermediates():
    x = {"x": np.random.default_rng(13).normal(size=(2, 3, 8)).astype(np.float32)}
    model = make_model(_rms_norm_nodes("x", "y", "t5"), [("x", TensorProto.FLOAT, [2, 3, 8])],
                       [("y", TensorProto.FLOAT, None)], _rms_constants(8, axis=1), opset=18)  # over axis 1
    assert _compare(model, x, "reference").rewrites["fuse_rms_norm"] == 0
    shared = [*_rms_norm_nodes("x", "y", "t5"), helper.make_node("Add", ["y", "r3"], ["z"])]  # the root read twice
    model = make_model(shared, [("x", TensorProto.FLOAT, [2, 3, 8])], [("z", TensorProto.FLOAT, None)],
                       _rms_constants(8), opset=18)
    assert _compare(model, x, "reference").rewrites["fuse_rms_norm"] == 0
    wrong = [*_rms_norm_nodes("x", "y", "t5")]
    wrong[5] = helper.make_node("Mul", ["a", "r4"], ["r5"])  # normalises another tensor by x's root mean square
    model = make_model([helper.make_node("Neg", ["x"], ["a"]), *wrong], [("x", TensorProto.FLOAT, [2, 3, 8])],
                       [("y", TensorProto.FLOAT, None)], _rms_constants(8), opset=18)
    assert _compare(model, x, "reference").rewrites["fuse_rms_norm"] == 0


def _group_norm_model(channels: int, groups: int, silu: bool, unit: float = 1.0, channel_shape: tuple = (),
                      outputs: tuple = ("y",)):
    """GroupNorm as a diffusion U-Net's exporter writes it: Reshape [0, G, -1], InstanceNormalization (scale 1,
    bias 0), Reshape back to Shape(x), Mul by a per-channel scale, Add of a per-channel bias, then maybe SiLU."""
    mk = helper.make_node
    rng = np.random.default_rng(14)
    shape = channel_shape or (channels, 1, 1)
    nodes = [mk("Reshape", ["x", "c_groups"], ["g"]), mk("InstanceNormalization", ["g", "c_unit", "c_zero"], ["n"],
                                                           epsilon=1e-5),
             mk("Shape", ["x"], ["s"]), mk("Reshape", ["n", "s"], ["r"]), mk("Mul", ["r", "c_scale"], ["m"]),
             mk("Add", ["m", "c_bias"], ["y" if not silu else "a"])]
    if silu:
        nodes += [mk("Sigmoid", ["a"], ["sg"]), mk("Mul", ["a", "sg"], ["y"])]
    constants = [("c_groups", np.array([0, groups, -1], np.int64)),
                 ("c_unit", np.full(groups, unit, np.float32)), ("c_zero", np.zeros(groups, np.float32)),
                 ("c_scale", rng.uniform(0.5, 1.5, shape).astype(np.float32)),
                 ("c_bias", rng.normal(size=shape).astype(np.float32))]
    return make_model(nodes, [("x", TensorProto.FLOAT, [2, channels, 6, 10])],
                      [(name, TensorProto.FLOAT, None) for name in outputs], constants, opset=18)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("channels, groups, silu, channel_shape", [(32, 32, True, ()), (64, 32, True, ()),
                                                                    (12, 4, False, ()), (12, 3, True, (1, 12, 1, 1))])
def test_group_norm_written_out_becomes_one_node(backend, channels, groups, silu, channel_shape):
    model = _group_norm_model(channels, groups, silu, channel_shape=channel_shape)
    x = (np.random.default_rng(15).normal(size=(2, channels, 6, 10)) * 3 + 1).astype(np.float32)
    session = _compare(model, {"x": x}, backend, rtol=1e-5, atol=2e-5)
    assert session.rewrites["fuse_group_norm"] == 1
    assert _ops(session) == ["GroupNorm"]
    assert session.graph.nodes[0].attrs.get("activation", "") == ("Silu" if silu else "")


def test_group_norm_left_alone_unless_unit_affine_and_private_intermediates():
    x = {"x": np.random.default_rng(16).normal(size=(2, 8, 6, 10)).astype(np.float32)}
    # InstanceNormalization's own scale not 1: left written out (the fused node has one per-channel scale)
    assert _compare(_group_norm_model(8, 4, True, unit=2.0), x, "reference").rewrites["fuse_group_norm"] == 0
    # the scaled values before the bias also a model output
    model = _group_norm_model(8, 4, True, outputs=("y", "m"))
    assert _compare(model, x, "reference").rewrites["fuse_group_norm"] == 0


def _layer_norm_nodes(form: str, weight: bool, bias: bool) -> list:
    """Layer norm as exporters before opset 17 write it: d = x - mean(x), the RMS span of d, then maybe a bias."""
    mk = helper.make_node
    tail = [mk("Add", ["n", "c_bias"], ["y"])] if bias else []
    return [mk("ReduceMean", ["x", "c_axes"], ["m"]), mk("Sub", ["x", "m"], ["d"]),
            *_rms_norm_nodes("d", "n" if bias else "y", form, weight), *tail]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form, weight, bias", [("pow", True, True), ("divide", True, True), ("t5", False, True),
                                                ("divide", True, False)])
def test_layer_norm_written_out_becomes_one_node(backend, form, weight, bias):
    width = 96
    b = np.random.default_rng(14).normal(size=width).astype(np.float32)
    model = make_model(_layer_norm_nodes(form, weight, bias), [("x", TensorProto.FLOAT, [3, 4, width])],
                       [("y", TensorProto.FLOAT, None)], [*_rms_constants(width), ("c_bias", b)], opset=18)
    x = (np.random.default_rng(15).normal(size=(3, 4, width)) * 3 + 5).astype(np.float32)
    session = _compare(model, {"x": x}, backend)
    assert session.rewrites["fuse_layer_norm"] == 1
    assert _ops(session) == ["LayerNormalization"]


def test_layer_norm_left_alone_when_the_centred_values_are_read_elsewhere():
    x = {"x": np.random.default_rng(16).normal(size=(2, 3, 8)).astype(np.float32)}
    b = np.zeros(8, np.float32)
    nodes = [*_layer_norm_nodes("pow", True, True), helper.make_node("Add", ["y", "d"], ["z"])]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [2, 3, 8])], [("z", TensorProto.FLOAT, None)],
                       [*_rms_constants(8), ("c_bias", b)], opset=18)
    session = _compare(model, x, "reference")
    assert session.rewrites["fuse_layer_norm"] == 0 and "LayerNormalization" not in _ops(session)
    model = make_model(_layer_norm_nodes("pow", True, True), [("x", TensorProto.FLOAT, [2, 3, 8])],
                       [("y", TensorProto.FLOAT, None)], [*_rms_constants(8, axis=1), ("c_bias", b)], opset=18)
    assert _compare(model, x, "reference").rewrites["fuse_layer_norm"] == 0  # over axis 1


def _gelu_erf_nodes(x: str, y: str, form: str) -> list:
    """Exact GELU as PyTorch exports it: x / sqrt(2) (or * 1/sqrt(2)), Erf, + 1, and the halving in one of three
    places."""
    mul = helper.make_node
    scale = (mul("Div", [x, "c_sqrt2"], ["e0"]) if form != "mul_first" else mul("Mul", ["c_rsqrt2", x], ["e0"]))
    head = [scale, mul("Erf", ["e0"], ["e1"]), mul("Add", ["e1", "c_one"], ["e2"])]
    if form == "half_last":  # (x * (1 + erf)) * 0.5: BERT's export
        return [*head, mul("Mul", [x, "e2"], ["e3"]), mul("Mul", ["e3", "c_half"], [y])]
    if form == "half_inner":  # x * ((1 + erf) * 0.5)
        return [*head, mul("Mul", ["c_half", "e2"], ["e3"]), mul("Mul", ["e3", x], [y])]
    return [mul("Mul", [x, "c_half"], ["h"]), *head, mul("Mul", ["h", "e2"], [y])]  # (x * 0.5) * (1 + erf)


_GELU_ERF_CONSTANTS = [("c_sqrt2", np.array(np.sqrt(2), np.float32)), ("c_rsqrt2", np.array(np.sqrt(0.5), np.float32)),
                       ("c_one", np.array(1.0, np.float32)), ("c_half", np.array(0.5, np.float32))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", ["half_last", "half_inner", "mul_first"])
def test_gelu_erf_written_out_becomes_one_node(backend, form):
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sub", ["x", "r"], ["g"]),
             *_gelu_erf_nodes("g", "y", form)]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [3, 40])], [("y", TensorProto.FLOAT, None)],
                       _GELU_ERF_CONSTANTS)
    x = np.random.default_rng(7).normal(size=(3, 40)).astype(np.float32) * 3
    session = _compare(model, {"x": x}, backend)
    assert session.rewrites["fuse_gelu_erf"] == 1
    assert _ops(session) == ["Relu", "Sub", "Gelu"]


def test_gelu_erf_with_a_wrong_constant_or_a_shared_intermediate_is_left_alone():
    x = {"x": np.linspace(-3, 3, 16, dtype=np.float32).reshape(2, 8)}
    shared = [*_gelu_erf_nodes("x", "y", "half_last"), helper.make_node("Add", ["y", "e1"], ["z"])]  # erf read twice
    model = make_model(shared, [("x", TensorProto.FLOAT, [2, 8])], [("z", TensorProto.FLOAT, None)],
                       _GELU_ERF_CONSTANTS)
    assert _compare(model, x, "reference").rewrites["fuse_gelu_erf"] == 0
    wrong = [(name, np.array(0.25, np.float32) if name == "c_half" else v) for name, v in _GELU_ERF_CONSTANTS]
    model = make_model(_gelu_erf_nodes("x", "y", "half_last"), [("x", TensorProto.FLOAT, [2, 8])],
                       [("y", TensorProto.FLOAT, None)], wrong)
    assert _compare(model, x, "reference").rewrites["fuse_gelu_erf"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("axes, bias_shape, folded", [
    ([3], (1, 4, 1), True),  # magika: Conv [N, C, L, 1], Squeeze the last axis, Add a [1, C, 1] bias
    ([-1], (4, 1), True),
    ([3], (1, 1, 6), False),  # varies along L: not per channel
    ([0], (4, 1, 1), False),  # the batch axis dropped: the channel axis moves
])
def test_conv_bias_folds_through_a_squeeze_of_a_spatial_axis(backend, axes, bias_shape, folded):
    rng = np.random.default_rng(6)
    f32 = np.float32
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Squeeze", ["c", "axes"], ["s"]),
             helper.make_node("Add", ["s", "b"], ["y"])]
    inits = [("w", rng.normal(size=(4, 3, 3, 1)).astype(f32)), ("axes", np.array(axes, np.int64)),
             ("b", rng.normal(size=bias_shape).astype(f32))]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [1, 3, 8, 1])], [("y", TensorProto.FLOAT, None)], inits)
    session = _compare(model, {"x": rng.normal(size=(1, 3, 8, 1)).astype(f32)}, backend)
    assert session.rewrites["fold_conv_scale_shift"] == int(folded)
    assert ("Add" in _ops(session)) != folded


def test_no_scale_fold_of_a_spatial_constant_or_a_divided_constant():
    rng = np.random.default_rng(5)
    f32 = np.float32
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Mul", ["c", "spatial"], ["m"]),  # varies along W: not a per-channel factor
             helper.make_node("Conv", ["x", "w"], ["c2"]),
             helper.make_node("Div", ["two", "c2"], ["d"]),  # the conv is the divisor: not linear
             helper.make_node("Add", ["m", "d"], ["y"])]
    inits = [("w", rng.normal(size=(4, 3, 1, 1)).astype(f32)), ("spatial", rng.normal(size=(1, 5)).astype(f32)),
             ("two", np.array(2.0, f32))]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [1, 3, 5, 5])], [("y", TensorProto.FLOAT, None)], inits)
    session = _compare(model, {"x": rng.uniform(0.5, 1.5, size=(1, 3, 5, 5)).astype(f32)}, "reference")
    assert session.rewrites["fold_conv_scale_shift"] == 0
    assert sorted(_ops(session)) == ["Add", "Conv", "Conv", "Div", "Mul"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_matmul_bias_activation(backend):
    rng = np.random.default_rng(1)
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["bias", "m"], ["a"]),
         helper.make_node("Tanh", ["a"], ["y"])],
        [("x", TensorProto.FLOAT, [2, 5, 6])], [("y", TensorProto.FLOAT, [2, 5, 4])],
        [("w", rng.normal(size=(6, 4)).astype(np.float32)), ("bias", rng.normal(size=4).astype(np.float32))],
    )
    session = _compare(model, {"x": rng.normal(size=(2, 5, 6)).astype(np.float32)}, backend)
    assert _ops(session) == ["FusedMatMul"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_matmul_bias_hard_sigmoid_swish(backend):
    """x * HardSigmoid(x, 1/6, 0.5) after a MatMul + bias (fuse_matmul_bias reads the same activation finder as the
    conv): one FusedMatMul with HardSwish, values on both sides of the clamp's corners (-3, 3)."""
    rng = np.random.default_rng(6)
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "bias"], ["a"]),
         helper.make_node("HardSigmoid", ["a"], ["hs"], alpha=1 / 6, beta=0.5),
         helper.make_node("Mul", ["a", "hs"], ["y"])],
        [("x", TensorProto.FLOAT, [7, 19])], [("y", TensorProto.FLOAT, [7, 37])],
        [("w", rng.normal(size=(19, 37)).astype(np.float32)), ("bias", rng.normal(size=37).astype(np.float32))],
    )
    session = _compare(model, {"x": rng.normal(size=(7, 19)).astype(np.float32)}, backend)
    assert _ops(session) == ["FusedMatMul"]
    assert session.graph.nodes[0].attrs["activation"] == "HardSwish"


def test_no_fusion_when_the_intermediate_is_used_twice():
    rng = np.random.default_rng(2)
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
         helper.make_node("Add", ["m", "r"], ["y"])],
        [("x", TensorProto.FLOAT, [3, 4])], [("y", TensorProto.FLOAT, [3, 4])],
        [("w", rng.normal(size=(4, 4)).astype(np.float32))],
    )
    session = _compare(model, {"x": rng.normal(size=(3, 4)).astype(np.float32)}, "reference")
    assert _ops(session) == ["MatMul", "Relu", "Add"]


def test_no_fusion_of_a_graph_output():
    rng = np.random.default_rng(3)
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
        [("x", TensorProto.FLOAT, [3, 4])], [("y", TensorProto.FLOAT, [3, 4]), ("m", TensorProto.FLOAT, [3, 4])],
        [("w", rng.normal(size=(4, 4)).astype(np.float32))],
    )
    session = _compare(model, {"x": rng.normal(size=(3, 4)).astype(np.float32)}, "reference")
    assert _ops(session) == ["MatMul", "Relu"]


def test_identity_and_dropout_are_removed():
    model = make_model(
        [helper.make_node("Identity", ["x"], ["a"]), helper.make_node("Dropout", ["a"], ["b"]),
         helper.make_node("Neg", ["b"], ["y"])],
        [("x", TensorProto.FLOAT, [4])], [("y", TensorProto.FLOAT, [4])], opset=13,
    )
    session = _compare(model, {"x": np.arange(4, dtype=np.float32)}, "reference")
    assert _ops(session) == ["Neg"]


@pytest.mark.parametrize("ends, axes, steps, removed", [
    ([2**31 - 1, 1], [1, 3], None, True),  # magika's [:, :, :, :1] of a last axis of length 1
    ([2, 7], None, None, True),  # no axes: the first two, each kept whole
    ([1, 7], None, None, False),  # axis 0 (length 2) cut to 1
    ([2**31 - 1, 1], [-3, -1], [1, 1], True),
    ([2**31 - 1, 1], [1, 3], [1, 2], False),  # a step of 2
    ([4, 1], [1, 3], None, False),  # ends short of axis 1's length 5
])
def test_a_slice_that_keeps_its_whole_input_is_removed(ends, axes, steps, removed):
    inputs = ["x", "starts", "ends"] + (["axes"] if axes is not None else []) + (["steps"] if steps else [])
    consts = [("starts", np.zeros(len(ends), np.int64)), ("ends", np.array(ends, np.int64))]
    consts += [("axes", np.array(axes, np.int64))] if axes is not None else []
    consts += [("steps", np.array(steps, np.int64))] if steps else []
    model = make_model(
        [helper.make_node("Slice", inputs, ["a"]), helper.make_node("Neg", ["a"], ["y"])],
        [("x", TensorProto.FLOAT, [2, 5, 3, 1])], [("y", TensorProto.FLOAT, None)], consts,
    )
    x = np.arange(30, dtype=np.float32).reshape(2, 5, 3, 1)
    session = _compare(model, {"x": x}, "reference")
    assert _ops(session) == (["Neg"] if removed else ["Slice", "Neg"])


def test_a_cast_to_its_own_type_is_removed():
    model = make_model(
        [helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Cast", ["a"], ["b"], to=TensorProto.FLOAT),
         helper.make_node("Cast", ["b"], ["c"], to=TensorProto.INT32), helper.make_node("Neg", ["c"], ["y"])],
        [("x", TensorProto.FLOAT, [4])], [("y", TensorProto.INT32, [4])],
    )
    session = _compare(model, {"x": np.array([1.5, -2.5, 3.0, 0.0], np.float32)}, "reference")
    assert _ops(session) == ["Neg", "Cast", "Neg"]  # the float -> int32 Cast stays


@pytest.mark.parametrize("backend", BACKENDS)
def test_tiny_cnn_end_to_end(backend):
    x = np.random.default_rng(4).normal(size=(2, 3, 32, 32)).astype(np.float32)
    session = _compare(tiny_cnn(), {"image": x}, backend, rtol=1e-4, atol=1e-6)
    assert "BatchNormalization" not in _ops(session)


def _one_hot_model(w, iota, batch="N"):
    """jax2tf's one-hot embedding (magika): bytes [N, L] -> [N, L, 1] -> Expand to [N, L, K] (shape computed from
    the input's) -> Equal iota -> Cast -> MatMul W."""
    k = iota.shape[-1]
    nodes = [
        helper.make_node("Reshape", ["x", "col"], ["x1"]),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Concat", ["s", "k"], ["target"], axis=0),
        helper.make_node("Expand", ["x1", "target"], ["wide"]),
        helper.make_node("Equal", ["wide", "iota"], ["hot"]),
        helper.make_node("Cast", ["hot"], ["hotf"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["hotf", "w"], ["y"]),
    ]
    return make_model(nodes, [("x", TensorProto.INT32, [batch, 6])], [("y", TensorProto.FLOAT, None)],
                      [("col", np.array([-1, 6, 1], np.int64)), ("k", np.array([k], np.int64)), ("iota", iota),
                       ("w", w)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_hot_matmul_becomes_a_gather(backend):
    rng = np.random.default_rng(9)
    w = rng.normal(size=(5, 3)).astype(np.float32)
    model = _one_hot_model(w, np.arange(5, dtype=np.int32).reshape(1, 1, 5))
    # values outside [0, K) (negative ones too: a Gather would wrap them) match no column: zero rows
    x = np.array([[0, 4, 5, -1, -6, 2], [2**31 - 1, -2**31, 3, 1, 17, 4]], np.int32)
    session = _compare(model, {"x": x}, backend, rtol=0, atol=0)
    assert session.rewrites["one_hot_matmul_to_gather"] == 1
    assert {"Equal", "MatMul"}.isdisjoint(_ops(session)) and "Gather" in _ops(session)
    want = np.where(((x >= 0) & (x < 5))[..., None], w[np.clip(x, 0, 4)], 0)
    np.testing.assert_array_equal(session.run({"x": x})["y"], want)
    assert session.placement.fallback_summary() == "" or backend == "reference"


def test_one_hot_matmul_left_alone_unless_exact():
    w = np.ones((5, 3), np.float32)
    shuffled = np.array([1, 0, 2, 3, 4], np.int32).reshape(1, 1, 5)  # not 0..K-1 in order
    nan_w = w.copy()
    nan_w[2, 1] = np.nan  # 0 * NaN in the GEMM spreads NaN to every row; a Gather would not
    for model in (_one_hot_model(w, shuffled), _one_hot_model(nan_w, np.arange(5, dtype=np.int32).reshape(1, 1, 5))):
        x = np.array([[0, 1, 2, 3, 4, 5]], np.int32)
        session = _compare(model, {"x": x}, "reference")
        assert session.rewrites["one_hot_matmul_to_gather"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_pow_by_two_or_three_becomes_products(backend):
    f32 = np.float32
    nodes = [helper.make_node("Pow", ["x", "two"], ["sq"]), helper.make_node("Pow", ["x", "three"], ["cube"]),
             helper.make_node("Pow", ["x", "half"], ["root"]), helper.make_node("Pow", ["x", "twos"], ["sq1"])]
    inits = [("two", np.array(2.0, f32)), ("three", np.array(3.0, f32)), ("half", np.array(0.5, f32)),
             ("twos", np.array([2.0], f32))]  # a 1-element vector may broadcast a scalar x: left alone
    outs = [(n, TensorProto.FLOAT, None) for n in ("sq", "cube", "root", "sq1")]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [4, 33])], outs, inits)
    x = np.abs(np.random.default_rng(8).normal(size=(4, 33)).astype(f32)) * 3
    session = _compare(model, {"x": x}, backend, rtol=2e-7, atol=0)  # the cube: two roundings, not powf's one
    assert session.rewrites["pow_to_mul"] == 2
    assert sorted(_ops(session)) == ["Mul", "Mul", "Mul", "Pow", "Pow"]
    got = session.run({"x": x})
    np.testing.assert_array_equal(got["sq"], x * x)
    np.testing.assert_array_equal(got["cube"], x * x * x)


def test_fold_and_infer_orders_a_graph_a_rewrite_left_unordered():
    # A pass that inserts a producer after its reader must not lose it: inference and pruning (which walks the
    # node list backwards) used to drop the producer, the model then failing or computing something else.
    from hetero.contract import dtypes
    from hetero.contract.graph import Graph, Node
    from hetero.contract.tensor import TensorInfo
    from hetero.runtime.infer import fold_and_infer

    graph = Graph(
        nodes=[Node("Relu", ["t"], ["y"], name="reader"), Node("Neg", ["x"], ["t"], name="producer")],
        inputs=["x"], outputs=["y"],
    )
    graph.values["x"] = TensorInfo(dtypes.float32, (2, 3))
    fold_and_infer(graph)
    assert [n.name for n in graph.nodes] == ["producer", "reader"]
    assert graph.values["y"].shape == (2, 3)


def _attention_model(mask: str, scaling: str, transposes: bool, batch: int = 2, seq: int = 7, heads: int = 3,
                     width: int = 8):
    """An exported encoder's self-attention: q, k, v [B, S, H*d] reshaped to heads, transposed, Q K^T scaled, plus
    a mask, Softmax, times V, transposed back and reshaped; ``transposes=False`` feeds [B, H, S, d] directly."""
    mk = helper.make_node
    b, s, h, d = batch, seq, heads, width
    nodes: list = []
    if transposes:
        nodes += [mk("Reshape", [n, "c_heads"], [f"{n}4"]) for n in ("q", "k", "v")]
        nodes += [mk("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
                  mk("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
                  mk("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1])]
        q, k, v = "qt", "kt", "vt"
    else:
        nodes.append(mk("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]))  # [B, H, S, d] -> [B, H, d, S]
        q, k, v = "q", "kt", "v"
    nodes.append(mk("MatMul", [q, k], ["s0"]))
    scores = "s0"
    if scaling == "div":
        nodes.append(mk("Div", ["s0", "c_root"], ["s1"]))
        scores = "s1"
    elif scaling == "mul":
        nodes.append(mk("Mul", ["c_inv_root", "s0"], ["s1"]))  # the constant first
        scores = "s1"
    if mask != "none":
        nodes.append(mk("Add", ["m", scores] if mask == "heads" else [scores, "m"], ["s2"]))
        scores = "s2"
    nodes += [mk("Softmax", [scores], ["p"], axis=-1), mk("MatMul", ["p", v], ["o"])]
    if transposes:
        nodes += [mk("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]), mk("Reshape", ["ot", "c_flat"], ["y"])]
    else:
        nodes.append(mk("Identity", ["o"], ["y"]))
    shape = [b, s, h * d] if transposes else [b, h, s, d]
    inputs = [(n, TensorProto.FLOAT, shape) for n in ("q", "k", "v")]
    mask_shape = {"padding": [b, 1, 1, s], "heads": [1, h, s, s], "none": None}[mask]
    if mask_shape is not None:
        inputs.append(("m", TensorProto.FLOAT, mask_shape))
    f32 = np.float32
    inits = [("c_heads", np.array([b, s, h, d], np.int64)), ("c_flat", np.array([b, s, h * d], np.int64)),
             ("c_root", np.array(np.sqrt(d), f32)), ("c_inv_root", np.array(1 / np.sqrt(d), f32))]
    model = make_model(nodes, inputs, [("y", TensorProto.FLOAT, None)], inits)
    rng = np.random.default_rng(14)
    feeds = {n: rng.normal(size=shape).astype(f32) for n in ("q", "k", "v")}
    if mask_shape is not None:
        feeds["m"] = np.where(rng.random(mask_shape) < 0.3, -10000.0, rng.normal(size=mask_shape)).astype(f32)
    return model, feeds


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask, scaling, transposes", [
    ("padding", "div", True), ("heads", "none", True), ("none", "mul", True), ("padding", "mul", False),
    ("heads", "div", False)])
@pytest.mark.parametrize("seq", [3, 7, 37])
def test_attention_written_out_becomes_one_node(backend, mask, scaling, transposes, seq):
    model, feeds = _attention_model(mask, scaling, transposes, seq=seq)
    session = _compare(model, feeds, backend, rtol=1e-5, atol=1e-6)
    assert session.rewrites["fuse_attention"] == 1
    ops = _ops(session)
    assert "FusedAttention" in ops and {"Softmax", "MatMul", "Div", "Add"}.isdisjoint(ops)
    assert "Transpose" not in ops  # read through strides instead (K's [0, 1, 3, 2] too)
    if backend == "cpu" and seq > 4:
        # The native kernel runs the unfused kernels' steps (the packed GEMM per head, the vector binary ops, the
        # softmax row kernel): the same bits as the written-out nodes on this backend. (At S <= 4 the GEMM takes its
        # GEMV path, which sums in another order for K^T read through strides.)
        plain = hetero.Session(model, backends=["cpu"], optimize=False).run(feeds)["y"]
        np.testing.assert_array_equal(session.run(feeds)["y"], plain)


@pytest.mark.skipif("cpu" not in BACKENDS, reason="cpu plugin not built")
@pytest.mark.parametrize("seq, width, transposes", [(70, 64, True), (19, 20, True), (33, 32, False), (5, 48, False)])
def test_fused_attention_tiles_keep_the_unfused_bits(seq, width, transposes):
    """The native kernel runs each head on the direct tiles (K^T copied once, V read in place when its rows are
    whole vectors, else copied padded; whole tiles into padded scores): T5's shape (70 tokens, d 64) and widths with
    and without a ragged vector, against the written-out nodes on the cpu backend, bit for bit."""
    model, feeds = _attention_model("heads", "div", transposes, batch=1, seq=seq, heads=2, width=width)
    session = _compare(model, feeds, "cpu", rtol=1e-5, atol=1e-6)
    assert session.rewrites["fuse_attention"] == 1
    plain = hetero.Session(model, backends=["cpu"], optimize=False).run(feeds)["y"]
    np.testing.assert_array_equal(session.run(feeds)["y"], plain)


def _scaled_operands_model(seq: int, scale_shape: tuple[int, ...] = ()):
    """PyTorch's exported attention (torch.export of scaled_dot_product_attention): Q and K each times d^-1/4, Q's
    Mul before its Transpose (sink_transposes' order), K's after it with the constant first."""
    model, feeds = _attention_model("padding", "none", True, seq=seq)
    nodes = list(model.graph.node)
    at = next(i for i, n in enumerate(nodes) if n.op_type == "Transpose" and n.input[0] == "q4")
    nodes[at].input[0] = "q4s"
    nodes.insert(at, helper.make_node("Mul", ["q4", "c_q"], ["q4s"]))
    matmul = next(n for n in nodes if n.op_type == "MatMul" and n.input[0] == "qt")
    matmul.input[1] = "kts"
    nodes.insert(nodes.index(matmul), helper.make_node("Mul", ["c_k", "kt"], ["kts"]))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    quarter = np.full(scale_shape, 8 ** -0.25, np.float32)
    model.graph.initializer.extend([numpy_helper.from_array(quarter, "c_q"),
                                    numpy_helper.from_array(quarter * np.float32(1.5), "c_k")])
    return model, feeds


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seq", [7, 37])
def test_attention_operands_scaled_by_scalars_fold_into_the_node(backend, seq):
    """The Muls of Q and K by a scalar become the node's q_scale / k_scale: no Mul left, the same values (on cpu the
    same bits as the written-out nodes: each operand rounded as its Mul rounded it)."""
    model, feeds = _scaled_operands_model(seq)
    session = _compare(model, feeds, backend, rtol=1e-5, atol=1e-6)
    assert session.rewrites["fuse_attention"] == 1
    ops = _ops(session)
    assert "FusedAttention" in ops and {"Mul", "Transpose", "Softmax", "MatMul"}.isdisjoint(ops)
    if backend == "cpu":
        plain = hetero.Session(model, backends=["cpu"], optimize=False).run(feeds)["y"]
        np.testing.assert_array_equal(session.run(feeds)["y"], plain)


def test_attention_operand_mul_by_a_vector_stays():
    model, feeds = _scaled_operands_model(7, scale_shape=(2, 1, 1, 1))  # one factor per batch: not a scalar
    session = _compare(model, feeds, "reference")
    assert session.rewrites["fuse_attention"] == 1
    assert _ops(session).count("Mul") == 2


def _batched_k_transpose_model(seq: int, split_order: tuple[int, int, int] = (0, 1, 2), dynamic: bool = True):
    """torch.export's K.transpose(-2, -1) of [B, H, S, d] through 3-D: Reshape to [-1, S, d] and back to [B, H, d,
    S], the shapes sliced out of Shape(K) at run time. ``split_order``: the pieces of the second shape (lead dims,
    d, S: (0, 1, 2)); another order is another reshape, left alone. ``dynamic``: batch and sequence unknown until
    run time (the exported model's case: the shapes stay Shape / Slice / Concat nodes), else known (constants)."""
    mk = helper.make_node
    model, feeds = _attention_model("padding", "div", True, seq=seq)
    if dynamic:
        for value in model.graph.input:
            for axis, symbol in enumerate(("batch", "seq")):
                value.type.tensor_type.shape.dim[axis].dim_param = symbol
        for init in model.graph.initializer:
            if init.name in ("c_heads", "c_flat"):  # 0: the input's own batch and sequence
                init.CopyFrom(numpy_helper.from_array(np.array([0, 0, *numpy_helper.to_array(init)[2:]], np.int64),
                                                      init.name))
    nodes = list(model.graph.node)
    at = next(i for i, n in enumerate(nodes) if n.op_type == "Transpose" and n.input[0] == "k4")
    pieces = [("lead", "c_min", "c_m2"), ("last", "c_m1", "c_max"), ("rows", "c_m2", "c_m1")]
    nodes[at:at + 1] = [
        mk("Transpose", ["k4"], ["kh"], perm=[0, 2, 1, 3]), mk("Shape", ["kh"], ["kshape"]),
        *[mk("Slice", ["kshape", lo, hi], [name]) for name, lo, hi in pieces],
        mk("Concat", ["c_flat3", "rows", "last"], ["s_merge"], axis=0),
        mk("Concat", [pieces[i][0] for i in split_order], ["s_split"], axis=0),
        mk("Reshape", ["kh", "s_merge"], ["k3"]), mk("Transpose", ["k3"], ["k3t"], perm=[0, 2, 1]),
        mk("Reshape", ["k3t", "s_split"], ["kt"])]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.extend(numpy_helper.from_array(np.array([v], np.int64), name) for name, v in (
        ("c_min", -2 ** 63), ("c_max", 2 ** 63 - 1), ("c_m1", -1), ("c_m2", -2), ("c_flat3", -1)))
    return model, feeds


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seq, dynamic", [(7, True), (37, True), (7, False)])
def test_batched_k_transpose_becomes_one_transpose(backend, seq, dynamic):
    """The merge / swap / split of K's last two axes is one Transpose composed with K's head Transpose, which
    fuse_attention reads through strides: no Transpose or Reshape of K left, the same values (on cpu the same bits
    as the written-out nodes: transposes move values, they round nothing)."""
    model, feeds = _batched_k_transpose_model(seq, dynamic=dynamic)
    session = _compare(model, feeds, backend, rtol=1e-5, atol=1e-6)
    assert session.rewrites["merge_batched_transposes"] == 1
    ops = _ops(session)
    if backend == "cpu":
        assert session.rewrites["fuse_attention"] == 1
        assert {"Transpose", "Shape", "Slice", "Concat"}.isdisjoint(ops) and ops.count("Reshape") == 4
        plain = hetero.Session(model, backends=["cpu"], optimize=False).run(feeds)["y"]
        np.testing.assert_array_equal(session.run(feeds)["y"], plain)


def test_batched_k_transpose_of_another_split_stays():
    # split back to [B, H, S, d] (S = d = 8, so the product is still defined): a reshape, not a transpose
    model, feeds = _batched_k_transpose_model(8, split_order=(0, 2, 1))
    session = _compare(model, feeds, "reference")
    assert session.rewrites["merge_batched_transposes"] == 0


def test_attention_left_alone_when_scores_or_probabilities_are_read_elsewhere():
    model, feeds = _attention_model("padding", "div", True)
    model.graph.output.append(helper.make_tensor_value_info("p", TensorProto.FLOAT, None))  # the probabilities out
    session = _compare(model, feeds, "reference")
    assert session.rewrites["fuse_attention"] == 0
    model, feeds = _attention_model("padding", "div", True)
    model.graph.node.append(helper.make_node("Mul", ["s0", "s0"], ["extra"]))  # the raw scores read twice
    model.graph.output.append(helper.make_tensor_value_info("extra", TensorProto.FLOAT, None))
    assert _compare(model, feeds, "reference").rewrites["fuse_attention"] == 0


def test_float64_attention_left_alone():
    # The fused kernels are float32 only: a double-precision attention keeps its nodes (fusing it made the cpu
    # backend decline the fused node and the whole span fall back to the reference backend).
    mk = helper.make_node
    nodes = [mk("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), mk("MatMul", ["q", "kt"], ["s"]),
             mk("Softmax", ["s"], ["p"], axis=-1), mk("MatMul", ["p", "v"], ["y"])]
    shape = [1, 2, 5, 4]
    model = make_model(nodes, [(n, TensorProto.DOUBLE, shape) for n in ("q", "k", "v")],
                       [("y", TensorProto.DOUBLE, None)], [])
    rng = np.random.default_rng(3)
    feeds = {n: rng.normal(size=shape) for n in ("q", "k", "v")}
    scores = feeds["q"] @ feeds["k"].transpose(0, 1, 3, 2)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    expected = probs / probs.sum(-1, keepdims=True) @ feeds["v"]
    session = hetero.Session(model)
    assert session.rewrites["fuse_attention"] == 0
    np.testing.assert_allclose(session.run(feeds)["y"], expected, rtol=1e-12)


@pytest.mark.skipif("cpu" not in BACKENDS, reason="cpu plugin not built")
def test_fused_attention_kernel_rejects_mismatched_operands():
    from hetero_cpu import _native

    q = np.zeros((1, 2, 3, 4), np.float32)
    with pytest.raises(ValueError, match="fused_attention: k is"):
        _native.fused_attention(q, np.zeros((1, 2, 5, 3), np.float32), np.zeros((1, 2, 3, 4), np.float32), None,
                                np.zeros((1, 2, 3, 4), np.float32))
    with pytest.raises(ValueError, match="mask is"):
        _native.fused_attention(q, np.zeros((1, 2, 4, 3), np.float32), np.zeros((1, 2, 3, 4), np.float32),
                                np.zeros((1, 2, 3, 2), np.float32), np.zeros((1, 2, 3, 4), np.float32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_with_pytorchs_nan_cleanup_becomes_one_node(backend):
    """torch.export's scaled_dot_product_attention: Where(IsNaN(p), 0, p) after the Softmax; a fully masked row
    (all -inf) gives NaN probabilities there, zeros after."""
    model, feeds = _attention_model("padding", "mul", True, seq=9)
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    at = list(model.graph.node).index(softmax) + 1
    model.graph.node.insert(at, helper.make_node("IsNaN", ["p"], ["isnan"]))
    model.graph.node.insert(at + 1, helper.make_node("Where", ["isnan", "c_zero", "p"], ["p0"]))
    next(n for n in model.graph.node if n.op_type == "MatMul" and n.input[0] == "p").input[0] = "p0"
    model.graph.initializer.append(helper.make_tensor("c_zero", TensorProto.FLOAT, [], [0.0]))
    feeds["m"][1] = -np.inf  # the second sequence masked out entirely: its rows are NaN, then 0
    session = _compare(model, feeds, backend)
    assert session.rewrites["fuse_attention"] == 1
    assert {"IsNaN", "Where", "Softmax"}.isdisjoint(_ops(session))
    y = session.run(feeds)["y"]
    assert np.all(y[1] == 0) and np.all(np.isfinite(y))


def test_fusions_into_ops_the_backend_lacks_are_left_out():
    from hetero.ir import passes

    kept = passes.for_backend(lambda key: key != ("hetero", "FusedAttention"))
    assert passes.fuse_attention not in kept and passes.fuse_rms_norm in kept and passes.fuse_gelu_erf in kept
    if not backend_ok("opencl")[0]:
        return
    model, feeds = _attention_model("padding", "div", True)  # no FusedAttention kernel on opencl: written out
    session = hetero.Session(model, backends=["opencl"], on_fallback="error")
    assert "fuse_attention" not in session.rewrites and "FusedAttention" not in _ops(session)
    plain = hetero.Session(model, backends=["reference"], optimize=False).run(feeds)["y"]
    np.testing.assert_allclose(session.run(feeds)["y"], plain, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_whose_mask_broadcasts_the_batch_up(backend):
    """q, k, v of one sequence, a mask of three: the written-out Add broadcasts the scores to three batches, and so
    does the fused node (its shape inference and the kernel's stride-0 views)."""
    model, feeds = _attention_model("padding", "div", False, batch=1, seq=6)
    model.graph.input[3].type.tensor_type.shape.dim[0].dim_value = 3
    feeds["m"] = np.random.default_rng(15).normal(size=(3, 1, 1, 6)).astype(np.float32)
    session = _compare(model, feeds, backend)
    assert session.rewrites["fuse_attention"] == 1
    assert session.run(feeds)["y"].shape == (3, 3, 6, 8)


# (Conv attributes, group, input chain, rewrites, ops left): PP-LCNetV3's learnable affine block (``s * h + t`` of
# scalars after an activation) before a 1x1 conv folds whole; before a padded conv (a depthwise one too) the scale
# folds and an Add of t / s stays; a lone Mul or Add (the constant first or second) folds where it may; a value read
# twice, or a constant along another axis than the channels, stays. Per-channel constants and an inference
# BatchNormalization fold the same way (a BatchNormalization before a padded conv stays).
INPUT_AFFINE_CASES = [
    ({}, 1, "mul_add", 2, ["Conv", "Relu"]),
    ({"pads": [1, 1, 1, 1]}, 1, "mul_add", 1, ["Add", "Conv", "Relu"]),
    ({"pads": [1, 1, 1, 1]}, 4, "mul_add", 1, ["ConvInputShift", "Relu"]),  # depthwise: fold_conv_input_shift
    ({"auto_pad": "SAME_UPPER"}, 1, "mul_add", 1, ["Add", "Conv", "Relu"]),
    ({}, 1, "add_first", 1, ["Conv", "Relu"]),
    ({"pads": [1, 1, 1, 1]}, 1, "add_only", 0, ["Add", "Conv", "Relu"]),
    ({"pads": [1, 1, 1, 1]}, 1, "mul_first", 1, ["Conv", "Relu"]),
    ({}, 1, "mul_add_shared", 0, ["Add", "Add", "Conv", "Mul", "Relu"]),
    ({}, 1, "mul_add_rank4", 2, ["Conv", "Relu"]),  # a [1, 1, 1, 1] scale against the rank-4 map
    ({}, 1, "mul_add_channels", 2, ["Conv", "Relu"]),  # per-channel s and t
    ({}, 2, "mul_add_channels", 2, ["Conv", "Relu"]),  # grouped: each output channel's own input channels
    ({"pads": [1, 1, 1, 1]}, 1, "mul_add_channels", 1, ["Add", "Conv", "Relu"]),  # an Add of t / s per channel
    ({}, 1, "mul_add_width", 0, ["Add", "Conv", "Mul", "Relu"]),  # constants along the width: no fold
    ({}, 1, "batchnorm", 1, ["Conv", "Relu"]),
    ({}, 4, "batchnorm", 1, ["Conv", "Relu"]),
    ({"pads": [1, 1, 1, 1]}, 1, "batchnorm", 0, ["BatchNormalization", "Conv", "Relu"]),  # zero padding: stays
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("attrs, group, chain, rewrites, left", INPUT_AFFINE_CASES,
                         ids=[str(i) for i in range(len(INPUT_AFFINE_CASES))])
def test_conv_input_affine_folds(backend, attrs, group, chain, rewrites, left):
    rng = np.random.default_rng(8)
    f32 = np.float32
    k = 1 if not attrs else 3
    nodes = [helper.make_node("Relu", ["x"], ["h"])]
    if chain.startswith("mul_add"):
        nodes += [helper.make_node("Mul", ["s", "h"], ["m"]), helper.make_node("Add", ["m", "t"], ["a"])]
    elif chain == "batchnorm":
        nodes += [helper.make_node("BatchNormalization", ["h", "bs", "bb", "bm", "bv"], ["a"], epsilon=1e-3)]
    elif chain == "add_first":
        nodes += [helper.make_node("Add", ["t", "h"], ["a"])]
    elif chain == "add_only":
        nodes += [helper.make_node("Add", ["h", "t"], ["a"])]
    else:
        nodes += [helper.make_node("Mul", ["h", "s"], ["a"])]
    nodes.append(helper.make_node("Conv", ["a", "w", "b"], ["y"], group=group, **attrs))
    outputs = [("y", TensorProto.FLOAT, None)]
    if chain == "mul_add_shared":  # the Add's output is read twice: nothing folds
        nodes.append(helper.make_node("Add", ["a", "a"], ["z"]))
        outputs.append(("z", TensorProto.FLOAT, None))
    inits = [("w", rng.normal(size=(6, 4 // group, k, k)).astype(f32)), ("b", rng.normal(size=6).astype(f32)),
             ("s", np.full((1, 1, 1, 1) if chain.endswith("rank4") else (1,), 0.75, f32)), ("t", np.array(-0.4, f32)),
             *[(n, rng.uniform(0.5, 1.5, 4).astype(f32)) for n in ("bs", "bv")],
             *[(n, rng.normal(size=4).astype(f32)) for n in ("bb", "bm")]]
    if chain == "mul_add_channels":
        inits[2:4] = [("s", rng.uniform(-1.5, 1.5, (4, 1, 1)).astype(f32)),
                      ("t", rng.normal(size=(1, 4, 1, 1)).astype(f32))]
    elif chain == "mul_add_width":
        inits[2:4] = [("s", rng.uniform(0.5, 1.5, 9).astype(f32)), ("t", rng.normal(size=(1, 1, 9)).astype(f32))]
    if group == 4:
        inits[0] = ("w", rng.normal(size=(4, 1, k, k)).astype(f32))
        inits[1] = ("b", rng.normal(size=4).astype(f32))
    model = make_model(nodes, [("x", TensorProto.FLOAT, [2, 4, 7, 9])], outputs, inits)
    session = _compare(model, {"x": rng.normal(size=(2, 4, 7, 9)).astype(f32)}, backend)
    assert session.rewrites["fold_conv_input_affine"] == rewrites
    assert sorted(_ops(session)) == left


# (kernel, strides, pads, input shape, what is read): PP-OCRv5's scalar shift (``s * h + t`` after an activation,
# the scale folded into the weights) before a zero-padded depthwise conv becomes one ConvInputShift. On the cpu:
# 3x3 and 5x5 on the row kernel (whole planes, bands of a plane taller than the band), stride (2, 1), and the paths
# that read the input in place and so take x + shift made apart (3x3 / 2 with a left pad, rows narrower than a
# vector: the channel-blocked kernel); asymmetric pads; the constant first, of shape [1, 1, 1, 1].
INPUT_SHIFT_CASES = [
    (3, [1, 1], [1, 1, 1, 1], (2, 6, 12, 40), "add"),
    (5, [1, 1], [2, 2, 2, 2], (1, 8, 70, 90), "add"),
    (5, [2, 1], [2, 2, 2, 2], (1, 5, 12, 33), "add_first"),
    (3, [2, 2], [1, 1, 1, 1], (1, 16, 20, 40), "add"),
    (3, [1, 1], [1, 1, 1, 1], (1, 16, 7, 7), "add_rank4"),
    (3, [1, 1], [0, 1, 2, 0], (2, 3, 9, 21), "add"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k, strides, pads, shape, chain", INPUT_SHIFT_CASES,
                         ids=[str(i) for i in range(len(INPUT_SHIFT_CASES))])
def test_conv_input_shift_folds_into_padded_depthwise(backend, k, strides, pads, shape, chain):
    """The Add goes into the conv, whose output is the same bits as the Add and the conv apart (the same float32
    sums, the same taps); x + shift never reaches the padding (against the unoptimised reference too)."""
    rng = np.random.default_rng(9)
    f32, c = np.float32, shape[1]
    add = helper.make_node("Add", ["t", "m"] if chain == "add_first" else ["m", "t"], ["a"])
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Mul", ["h", "s"], ["m"]), add,
             helper.make_node("Conv", ["a", "w", "b"], ["c"], group=c, pads=pads, strides=strides),
             helper.make_node("HardSwish", ["c"], ["y"])]
    inits = [("w", rng.normal(size=(c, 1, k, k)).astype(f32)), ("b", rng.normal(size=c).astype(f32)),
             ("s", np.array([0.8], f32)),
             ("t", np.full((1, 1, 1, 1), -0.6, f32) if chain == "add_rank4" else np.array(-0.6, f32))]
    model = make_model(nodes, [("x", TensorProto.FLOAT, list(shape))], [("y", TensorProto.FLOAT, None)], inits)
    x = rng.normal(size=shape).astype(f32) * 2
    session = _compare(model, {"x": x}, backend, rtol=1e-4, atol=1e-4)
    assert session.rewrites["fold_conv_input_shift"] == 1
    assert _ops(session) == ["Relu", "ConvInputShift"]
    with passes.leaving_out("fold_conv_input_shift"):
        apart = hetero.Session(model, backends=[backend], on_fallback="silent")
    assert sorted(_ops(apart)) == ["Add", "FusedConv", "Relu"]
    np.testing.assert_array_equal(session.run({"x": x})["y"], apart.run({"x": x})["y"])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["shared", "per_channel", "dense", "unpadded"])
def test_conv_input_shift_left_alone(backend, case):
    """The Add stays where its output has another reader, its constant is per channel, the conv is not depthwise
    (a 1-channel conv included), or the conv pads nothing (fold_conv_input_affine folds the shift into its bias)."""
    rng = np.random.default_rng(10)
    f32 = np.float32
    c = 1 if case == "dense" else 4
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Add", ["h", "t"], ["a"]),
             helper.make_node("Conv", ["a", "w", "b"], ["y"], group=c, pads=[0] * 4 if case == "unpadded" else [1] * 4)]
    outputs = [("y", TensorProto.FLOAT, None)]
    if case == "shared":
        nodes.append(helper.make_node("Neg", ["a"], ["z"]))
        outputs.append(("z", TensorProto.FLOAT, None))
    t = rng.normal(size=(1, c, 1, 1)).astype(f32) if case == "per_channel" else np.array(0.3, f32)
    inits = [("w", rng.normal(size=(c, 1, 3, 3)).astype(f32)), ("b", rng.normal(size=c).astype(f32)), ("t", t)]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [1, c, 6, 20])], outputs, inits)
    session = _compare(model, {"x": rng.normal(size=(1, c, 6, 20)).astype(f32)}, backend, rtol=1e-4, atol=1e-4)
    assert session.rewrites["fold_conv_input_shift"] == 0
    assert "ConvInputShift" not in _ops(session)


def _stepwise_projection(steps: int, trans_b: int = 1, shared: bool = True, alpha: float = 1.0,
                         extra_output: bool = False, rows: int | str | None = None):
    """An RNN exported step by step: h_t = tanh(Gemm(Gather(X, t), W, b) + h_{t-1}), the sum of the h_t the output
    (and each step's gathered row too, where ``extra_output``)."""
    rng = np.random.default_rng(7)
    k, n = 6, 5
    nodes, inits = [], [("b", rng.normal(size=n).astype(np.float32)), ("h0", np.zeros((2, n), np.float32))]
    w_shape = (n, k) if trans_b else (k, n)
    inits += [(f"w{t}", rng.normal(size=w_shape).astype(np.float32)) for t in range(1 if shared else steps)]
    outputs = [("y", TensorProto.FLOAT, [2, n])]
    h = "h0"
    for t in range(steps):
        inits.append((f"i{t}", np.array(t, np.int64)))
        nodes += [helper.make_node("Gather", ["x", f"i{t}"], [f"row{t}"], axis=0),
                  helper.make_node("Gemm", [f"row{t}", "w0" if shared else f"w{t}", "b"], [f"p{t}"], transB=trans_b,
                                   alpha=alpha),
                  helper.make_node("Add", [f"p{t}", h], [f"s{t}"]), helper.make_node("Tanh", [f"s{t}"], [f"h{t + 1}"])]
        h = f"h{t + 1}"
    nodes.append(helper.make_node("Sum", [f"h{t + 1}" for t in range(steps)], ["y"]))
    if extra_output:
        outputs.append(("row1", TensorProto.FLOAT, [2, k]))
    return make_model(nodes, [("x", TensorProto.FLOAT, [rows or steps + 1, 2, k])], outputs, inits)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("trans_b, rows", [(0, None), (1, None), (1, "T")])
def test_gemms_of_gathered_rows_sharing_a_weight_become_one_matmul(backend, trans_b, rows):
    model = _stepwise_projection(5, trans_b, rows=rows)  # X of 6 rows, or of a free length T (rows 0-4 read)
    x = np.random.default_rng(8).normal(size=(6, 2, 6)).astype(np.float32)
    session = _compare(model, {"x": x}, backend)
    assert session.rewrites["batch_gathered_gemms"] == 5
    ops = _ops(session)
    assert "Gemm" not in ops and ops.count("Gather") == 5 and ops.count("FusedMatMul") == 1  # its bias fused


@pytest.mark.parametrize("kwargs", [{"steps": 3}, {"steps": 5, "shared": False}, {"steps": 5, "alpha": 0.5},
                                    {"steps": 5, "rows": 16}])
def test_gemms_of_gathered_rows_left_alone_when_few_or_different(kwargs):
    """Fewer than four, other weights, a scaled Gemm, or 5 of X's 16 rows (the batched product would compute all)."""
    model = _stepwise_projection(**kwargs)
    steps = kwargs["steps"]
    x = np.random.default_rng(9).normal(size=(kwargs.get("rows", steps + 1), 2, 6)).astype(np.float32)
    session = _compare(model, {"x": x}, "reference")
    assert session.rewrites["batch_gathered_gemms"] == 0
    assert _ops(session).count("Gemm") == steps


def test_gemms_of_gathered_rows_keep_a_gathered_row_read_elsewhere():
    model = _stepwise_projection(5, extra_output=True)
    x = np.random.default_rng(10).normal(size=(6, 2, 6)).astype(np.float32)
    session = _compare(model, {"x": x}, "reference")
    assert session.rewrites["batch_gathered_gemms"] == 5
    assert _ops(session).count("Gather") == 6  # the five rows of the product, and the graph output row1


# Max / Min by a scalar after a conv: (the activation nodes, the clamps, the ops left, the rewrites). The clamps
# tighten a Relu's or a Clip's bounds (a Max above a Clip's max makes the output constant) or floor a LeakyRelu; a
# Min after a LeakyRelu, a constant of more than one value, a clamp read twice or a second input computed stay.
CLAMP_CASES = [
    ([], [("Max", "c_neg")], ["FusedConv"], 1),
    (["Relu"], [("Max", "c_neg")], ["FusedConv"], 1),
    (["Relu"], [("Max", "c_pos"), ("Min", "c_six")], ["FusedConv"], 2),
    (["Clip"], [("Max", "c_big")], ["FusedConv"], 1),
    ([], [("Min", "c_rank4")], ["FusedConv"], 1),
    (["LeakyRelu"], [("Max", "c_neg")], ["FusedConv"], 1),
    (["LeakyRelu"], [("Max", "c_neg"), ("Max", "c_pos")], ["FusedConv"], 2),
    (["LeakyRelu"], [("Min", "c_pos")], ["FusedConv", "Min"], 0),
    ([], [("Max", "c_vector")], ["Conv", "Max"], 0),
    (["Relu"], [("Max", "shared")], ["FusedConv", "Max"], 0),  # the Relu fuses, its output a graph output
    (["Relu"], [("Max", "x2")], ["FusedConv", "Max"], 0),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("acts, clamps, left, rewrites", CLAMP_CASES, ids=[str(i) for i in range(len(CLAMP_CASES))])
def test_max_or_min_by_a_constant_after_a_conv_folds_into_its_clip(backend, acts, clamps, left, rewrites):
    rng = np.random.default_rng(3)
    f32 = np.float32
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["v0"], pads=[0, 1, 0, 1])]
    for i, act in enumerate(acts):
        extra = {"alpha": 0.2} if act == "LeakyRelu" else {}
        inputs = [f"v{i}", "lo", "hi"] if act == "Clip" else [f"v{i}"]
        nodes.append(helper.make_node(act, inputs, [f"v{i + 1}"], **extra))
    last = f"v{len(acts)}"
    outputs = [("y", TensorProto.FLOAT, None)]
    for j, (op, const) in enumerate(clamps):
        out = "y" if j == len(clamps) - 1 else f"m{j}"
        if const == "shared":  # the Relu's output is read by the Max and by a graph output
            nodes.append(helper.make_node(op, [last, "c_neg"], [out]))
            outputs.append((last, TensorProto.FLOAT, None))
        elif const == "x2":  # Max of the conv and another input
            nodes.append(helper.make_node(op, ["x2", last], [out]))
        else:
            nodes.append(helper.make_node(op, [const, last] if j % 2 else [last, const], [out]))
        last = out
    inits = [("w", rng.normal(size=(5, 4, 1, 3)).astype(f32)), ("b", rng.normal(size=5).astype(f32)),
             ("lo", np.array(-1.0, f32)), ("hi", np.array(1.5, f32)), ("c_neg", np.array([-0.4], f32)),
             ("c_pos", np.array(0.3, f32)), ("c_six", np.array(2.0, f32)), ("c_big", np.array(2.5, f32)),
             ("c_rank4", np.full((1, 1, 1, 1), 0.5, f32)), ("c_vector", np.linspace(-1, 1, 7).astype(f32))]
    inputs = [("x", TensorProto.FLOAT, [2, 4, 6, 7])]
    feeds = {"x": rng.normal(size=(2, 4, 6, 7)).astype(f32)}
    if clamps[0][1] == "x2":
        inputs.append(("x2", TensorProto.FLOAT, [2, 5, 6, 7]))
        feeds["x2"] = rng.normal(size=(2, 5, 6, 7)).astype(f32)
    model = make_model(nodes, inputs, outputs, inits)
    session = _compare(model, feeds, backend)
    assert session.rewrites["fold_conv_clamp"] == rewrites
    assert sorted(_ops(session)) == sorted(left)
    if rewrites:
        y = session.run(feeds)["y"]
        assert y.min() < y.max() or clamps == [("Max", "c_big")]  # the clamps do not make every value one bound


def _nhwc_block_model(rng, residual_shared: bool = False):
    """A tf2onnx-style channels-last block (yahoo_open_nsfw's ResNet): Transpose to NCHW, Conv, Transpose back, the
    BatchNormalization as Add / Sub / Mul / Add of [C] constants and a scalar, Relu, a residual Add of two such
    branches, Transpose to NCHW for the next Conv, Transpose back. ``residual_shared``: the first branch's value is
    also a graph output, so its Transpose must stay."""
    f32 = np.float32
    to_nchw, to_nhwc = [0, 3, 1, 2], [0, 2, 3, 1]
    nodes = []
    for i in (0, 1):
        nodes += [helper.make_node("Transpose", ["x"], [f"t{i}"], perm=to_nchw),
                  helper.make_node("Conv", [f"t{i}", f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Transpose", [f"c{i}"], [f"n{i}"], perm=to_nhwc),
                  helper.make_node("Add", [f"n{i}", "bias"], [f"a{i}"]),
                  helper.make_node("Sub", [f"a{i}", "mean"], [f"s{i}"]),
                  helper.make_node("Mul", ["half", f"s{i}"], [f"m{i}"]),  # a scalar, first
                  helper.make_node("Add", [f"m{i}", "shift"], [f"b{i}"]),
                  helper.make_node("Relu", [f"b{i}"], [f"r{i}"])]
    nodes += [helper.make_node("Add", ["r0", "r1"], ["sum"]),
              helper.make_node("Transpose", ["sum"], ["t2"], perm=to_nchw),
              helper.make_node("Conv", ["t2", "w2"], ["c2"]),
              helper.make_node("Transpose", ["c2"], ["y"], perm=to_nhwc)]
    inits = [("w0", rng.normal(size=(4, 3, 3, 3)).astype(f32)), ("w1", rng.normal(size=(4, 3, 3, 3)).astype(f32)),
             ("w2", rng.normal(size=(5, 4, 1, 1)).astype(f32)), ("bias", rng.normal(size=4).astype(f32)),
             ("mean", rng.normal(size=(1, 1, 4)).astype(f32)), ("half", np.array(0.5, f32)),
             ("shift", rng.normal(size=4).astype(f32))]
    outputs = [("y", TensorProto.FLOAT, None)] + ([("r0", TensorProto.FLOAT, None)] if residual_shared else [])
    return make_model(nodes, [("x", TensorProto.FLOAT, [2, 6, 7, 3])], outputs, inits)


@pytest.mark.parametrize("backend", BACKENDS)
def test_transposes_sink_through_elementwise_ops_and_cancel(backend):
    rng = np.random.default_rng(11)
    model = _nhwc_block_model(rng)
    session = _compare(model, {"x": rng.normal(size=(2, 6, 7, 3)).astype(np.float32)}, backend, rtol=1e-4, atol=1e-4)
    ops = _ops(session)
    # x's Transpose twice (one per branch), and the last one back to NHWC: the three pairs around the convs cancel
    assert ops.count("Transpose") == 3
    assert ops.count("FusedConv") == 2 and "Sub" not in ops and "Mul" not in ops  # the affine ops folded, Relu fused
    assert session.rewrites["sink_transposes"] > 0


def test_transposes_kept_where_their_value_is_read_as_is():
    rng = np.random.default_rng(12)
    model = _nhwc_block_model(rng, residual_shared=True)
    x = rng.normal(size=(2, 6, 7, 3)).astype(np.float32)
    session = _compare(model, {"x": x}, "reference", rtol=1e-4, atol=1e-4)
    assert session.run({"x": x})["r0"].shape == (2, 6, 7, 4)  # the graph output keeps its channels-last layout


def test_transpose_pairs_compose_or_cancel():
    rng = np.random.default_rng(13)
    nodes = [helper.make_node("Transpose", ["x"], ["a"], perm=[0, 2, 3, 1]),
             helper.make_node("Transpose", ["a"], ["b"], perm=[0, 3, 1, 2]),  # cancels
             helper.make_node("Transpose", ["a"], ["c"], perm=[1, 0, 2, 3]),  # composes into one of x
             helper.make_node("Add", ["b", "x"], ["y"]),
             helper.make_node("Relu", ["c"], ["z"])]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [2, 3, 4, 5])],
                       [("y", TensorProto.FLOAT, None), ("z", TensorProto.FLOAT, None)])
    session = _compare(model, {"x": rng.normal(size=(2, 3, 4, 5)).astype(np.float32)}, "reference")
    assert _ops(session).count("Transpose") == 1


def test_transpose_left_before_an_op_that_is_not_elementwise():
    rng = np.random.default_rng(14)
    nodes = [helper.make_node("Transpose", ["x"], ["a"], perm=[0, 2, 1]),
             helper.make_node("Add", ["a", "v"], ["b"]),  # a varying operand, not a transposed twin: stays
             helper.make_node("Softmax", ["b"], ["y"], axis=-1)]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [2, 3, 4]), ("v", TensorProto.FLOAT, [2, 4, 3])],
                       [("y", TensorProto.FLOAT, None)])
    feeds = {"x": rng.normal(size=(2, 3, 4)).astype(np.float32), "v": rng.normal(size=(2, 4, 3)).astype(np.float32)}
    session = _compare(model, feeds, "reference")
    assert _ops(session) == ["Transpose", "Add", "Softmax"] and session.rewrites["sink_transposes"] == 0


def _keras_stem_model(rng, opset: int, negative: bool):
    """madmom's beat TCN stem as a Keras / tf2onnx export writes it: every conv and pool wrapped in ``Unsqueeze,
    Transpose to NCHW`` and ``Transpose to NHWC, Squeeze`` of the batch axis, the Elu on the 3-D channels-last map, a
    1 x W conv over the whole remaining width, and a last Squeeze of a moved axis (W) besides the batch."""
    to_nchw, to_nhwc = [0, 3, 1, 2], [0, 2, 3, 1]
    batch = -4 if negative else 0  # Unsqueeze counts in the output rank, Squeeze in the input rank
    squeeze_batch = -4 if negative else 0

    def axes(kind: str, values: list[int], name: str) -> tuple[dict, list[str]]:
        if opset >= 13:
            inits.append((name, np.asarray(values, np.int64)))
            return {}, [name]
        return {"axes": values}, []

    inits: list = []
    nodes = []

    def wrap(x: str, i: int) -> str:  # Unsqueeze, Transpose to NCHW
        attrs, extra = axes("Unsqueeze", [batch], f"ua{i}")
        nodes.extend([helper.make_node("Unsqueeze", [x, *extra], [f"u{i}"], **attrs),
                      helper.make_node("Transpose", [f"u{i}"], [f"t{i}"], perm=to_nchw)])
        return f"t{i}"

    def unwrap(x: str, i: int, values: list[int] | None = None) -> str:  # Transpose to NHWC, Squeeze
        attrs, extra = axes("Squeeze", values or [squeeze_batch], f"sa{i}")
        nodes.extend([helper.make_node("Transpose", [x], [f"n{i}"], perm=to_nhwc),
                      helper.make_node("Squeeze", [f"n{i}", *extra], [f"s{i}"], **attrs)])
        return f"s{i}"

    h = wrap("x", 0)
    nodes.append(helper.make_node("Conv", [h, "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node("Elu", [unwrap("c0", 0)], ["e0"], alpha=1.0))
    nodes.append(helper.make_node("MaxPool", [wrap("e0", 1)], ["p1"], kernel_shape=[1, 3], strides=[1, 3]))
    h = wrap(unwrap("p1", 1), 2)  # Squeeze then Unsqueeze straight after: madmom's pool -> conv
    nodes.append(helper.make_node("Conv", [h, "w1", "b1"], ["c1"]))  # 1 x 3 over the pooled width of 3
    nodes.append(helper.make_node("Elu", [unwrap("c1", 2, [0, 2])], ["y"], alpha=1.0))  # [N, T, 1, C] -> [T, C]
    inits += [("w0", rng.normal(size=(5, 3, 3, 3)).astype(np.float32)), ("b0", rng.normal(size=5).astype(np.float32)),
              ("w1", rng.normal(size=(4, 5, 1, 3)).astype(np.float32)), ("b1", rng.normal(size=4).astype(np.float32))]
    return make_model(nodes, [("x", TensorProto.FLOAT, [11, 9, 3])], [("y", TensorProto.FLOAT, None)], inits,
                      opset=opset)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("opset", [11, 17])
@pytest.mark.parametrize("negative", [False, True])
def test_transposes_sink_through_squeeze_and_unsqueeze(backend, opset, negative):
    rng = np.random.default_rng(15)
    model = _keras_stem_model(rng, opset, negative)
    session = _compare(model, {"x": rng.normal(size=(11, 9, 3)).astype(np.float32)}, backend, rtol=1e-4, atol=1e-4)
    # of the six Transposes only the input's (moved through its Unsqueeze) and the last one (its Squeeze drops the
    # batch and the moved W axis, so it is a 2-D one) are left
    assert _ops(session).count("Transpose") <= 2 and session.rewrites["sink_transposes"] > 0


@pytest.mark.parametrize("axes, perm", [([1], [0, 2, 3, 1]), ([0, 3], [0, 2, 3, 1]), ([1, -1], [2, 0, 1]),
                                        ([2], [1, 2, 0])])
def test_transpose_sinks_through_unsqueeze_then_squeeze_of_other_axes(axes, perm):
    """An Unsqueeze at any place (the middle, both ends, two axes) of a Transpose's output, then a Squeeze of an axis
    the perm moved: the values and shapes of the unoptimised graph."""
    rng = np.random.default_rng(16)
    shape = [2, 1, 3, 4][:len(perm)] if len(perm) == 4 else [1, 3, 4]
    unsq_rank = len(perm) + len(axes)
    moved_unit = perm.index(shape.index(1))  # the output axis that holds the input's unit axis
    out_unit = moved_unit + sum(1 for a in sorted(a % unsq_rank for a in axes) if a <= moved_unit)
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=perm),
             helper.make_node("Unsqueeze", ["t", "ua"], ["u"]),
             helper.make_node("Relu", ["u"], ["r"]),
             helper.make_node("Squeeze", ["r", "sa"], ["y"])]
    inits = [("ua", np.asarray(axes, np.int64)), ("sa", np.asarray([out_unit], np.int64))]
    model = make_model(nodes, [("x", TensorProto.FLOAT, shape)], [("y", TensorProto.FLOAT, None)], inits)
    x = rng.normal(size=shape).astype(np.float32)
    session = _compare(model, {"x": x}, "reference")
    assert session.rewrites["sink_transposes"] > 0
    plain = hetero.Session(model, backends=["reference"], optimize=False)
    assert session.run({"x": x})["y"].shape == plain.run({"x": x})["y"].shape


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("activation", ["Relu", "Sigmoid"])
def test_conv_activation_fuses_through_a_squeeze(backend, activation):
    """A Keras Conv1D export: Conv on [N, C, 1, W], Squeeze of the unit axis, the bias Add, the activation."""
    rng = np.random.default_rng(15)
    f32 = np.float32
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Squeeze", ["c", "axes"], ["s"]),
             helper.make_node("Add", ["s", "b"], ["a"]), helper.make_node(activation, ["a"], ["r"]),
             helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1])]
    inits = [("w", rng.normal(size=(6, 3, 1, 4)).astype(f32)), ("axes", np.array([2], np.int64)),
             ("b", rng.normal(size=(1, 6, 1)).astype(f32))]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [5, 3, 1, 9])], [("y", TensorProto.FLOAT, None)], inits)
    session = _compare(model, {"x": rng.normal(size=(5, 3, 1, 9)).astype(f32)}, backend, rtol=1e-4, atol=1e-4)
    assert _ops(session) == ["FusedConv", "Squeeze", "Transpose"]
    assert session.graph.nodes[0].attrs["activation"] == activation


def _keras_conv1d_model(rng, convs: list[dict], batch: int = 5, width: int = 21, channels: int = 6):
    """tf2onnx's Conv1D blocks on one channels-last input [N, W, C]: Unsqueeze to [N, 1, W, C], one Transpose to NCHW
    that every conv reads, then per conv: Conv, Squeeze of the unit H axis, the bias Add, ReLU, Transpose back to
    [N, L, Cout]; the outputs summed over their first positions (so every conv's output is read)."""
    f32 = np.float32
    nodes = [helper.make_node("Unsqueeze", ["x", "one"], ["x4"]),
             helper.make_node("Transpose", ["x4"], ["xt"], perm=[0, 3, 1, 2])]
    inits = [("one", np.array([1], np.int64)), ("axes", np.array([2], np.int64))]
    outs = []
    for i, attrs in enumerate(convs):
        taps, cout = attrs.pop("taps"), attrs.pop("cout")
        inits += [(f"w{i}", rng.normal(size=(cout, channels, 1, taps)).astype(f32)),
                  (f"b{i}", rng.normal(size=(1, cout, 1)).astype(f32))]
        nodes += [helper.make_node("Conv", ["xt", f"w{i}"], [f"c{i}"], kernel_shape=[1, taps], **attrs),
                  helper.make_node("Squeeze", [f"c{i}", "axes"], [f"s{i}"]),
                  helper.make_node("Add", [f"s{i}", f"b{i}"], [f"a{i}"]),
                  helper.make_node("Relu", [f"a{i}"], [f"r{i}"]),
                  helper.make_node("Transpose", [f"r{i}"], [f"y{i}"], perm=[0, 2, 1])]
        outs.append((f"y{i}", TensorProto.FLOAT, None))
    model = make_model(nodes, [("x", TensorProto.FLOAT, [batch, width, channels])], outs, inits)
    return model, {"x": rng.normal(size=(batch, width, channels)).astype(f32)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_keras_conv1d_runs_channels_last(backend):
    """The Transposes around a Keras Conv1D go (``conv1d_channels_last``): ConvNHWC reads the channels-last input,
    for taps 1 (the input itself is the product's rows), several, stride 2 and dilation 2; a padded conv keeps its
    Transposes, and the shared input Transpose stays while that conv reads it."""
    rng = np.random.default_rng(18)
    convs = [{"taps": 1, "cout": 7}, {"taps": 5, "cout": 9}, {"taps": 3, "cout": 4, "strides": [1, 2]},
             {"taps": 3, "cout": 5, "dilations": [1, 2]}, {"taps": 12, "cout": 17}]
    model, feeds = _keras_conv1d_model(rng, [dict(c) for c in convs])
    session = _compare(model, feeds, backend, rtol=1e-4, atol=1e-4)
    assert session.rewrites["conv1d_channels_last"] == len(convs)
    assert _ops(session).count("ConvNHWC") == len(convs) and "Transpose" not in _ops(session)
    padded, feeds = _keras_conv1d_model(rng, [{"taps": 3, "cout": 4}, {"taps": 3, "cout": 4, "pads": [0, 1, 0, 1]}])
    session = _compare(padded, feeds, backend, rtol=1e-4, atol=1e-4)
    assert session.rewrites["conv1d_channels_last"] == 1
    assert _ops(session).count("Transpose") == 2  # the padded conv's input and output transposes


@pytest.mark.parametrize("backend", BACKENDS)
def test_keras_conv1d_reads_its_windows_in_place(backend):
    """The product reads the windows as groups of overlapping rows of the input (stride 1, 2 and 3; 150 output
    channels: the dot-product tail group by group), dilation 2 still copies them; run again on new values, the replay
    must read those, not the first run's."""
    rng = np.random.default_rng(20)
    convs = [{"taps": 5, "cout": 9}, {"taps": 3, "cout": 4, "strides": [1, 2]}, {"taps": 3, "cout": 5,
             "dilations": [1, 2]}, {"taps": 12, "cout": 150}, {"taps": 1, "cout": 7, "strides": [1, 3]}]
    model, feeds = _keras_conv1d_model(rng, [dict(c) for c in convs], batch=3, width=40, channels=32)
    session = _compare(model, feeds, backend, rtol=1e-4, atol=1e-4)
    assert _ops(session).count("ConvNHWC") == len(convs)
    plain = hetero.Session(model, backends=["reference"], optimize=False)
    for _ in range(2):
        feeds = {"x": rng.normal(size=feeds["x"].shape).astype(np.float32)}
        want = plain.run(feeds)
        for name, value in session.run(feeds).items():
            np.testing.assert_allclose(value, want[name], rtol=1e-4, atol=1e-4)


def test_conv_nhwc_reference_is_the_transposed_conv():
    """ConvNHWC's reference: FusedConv on the input seen as NCHW, its output transposed to channels-last."""
    rng = np.random.default_rng(19)
    x = rng.normal(size=(2, 3, 8, 4)).astype(np.float32)  # [N, H, W, C]
    w = rng.normal(size=(5, 4, 2, 3)).astype(np.float32)
    node = Node("ConvNHWC", ["x", "w"], ["y"], {"strides": [1, 2], "activation": "Relu"}, domain="hetero")
    conv = helper.make_node("Conv", ["xt", "w"], ["c"], strides=[1, 2])
    want = hetero.Session(make_model([helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 3, 1, 2]), conv,
                                      helper.make_node("Relu", ["c"], ["r"]),
                                      helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 3, 1])],
                                     [("x", TensorProto.FLOAT, list(x.shape))], [("y", TensorProto.FLOAT, None)],
                                     [("w", w)]), backends=["reference"], optimize=False).run({"x": x})["y"]
    infos = [TensorInfo(dtypes.float32, x.shape), TensorInfo(dtypes.float32, w.shape)]
    schema = get("hetero", "ConvNHWC")
    (got,) = schema.reference(OpContext(node, infos, [x, w], 17))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    (info,) = schema.infer(OpContext(node, infos, [None, w], 17))
    assert tuple(info.shape) == want.shape == (2, 2, 3, 5)


# equation, operand shapes, the Transposes the rewrite makes (the order that copies least: known sizes, or a Softmax
# output counted as large when the sizes are symbolic)
EINSUMS = [
    ("bct,bcs->bts", (3, 8, 20), (3, 8, 12), 1),  # guided-diffusion's attention scores: Q transposed
    ("bts,bcs->bct", (3, 20, 12), (3, 8, 12), 2),  # its weighted values: V and the small product transposed
    ("bhqd,bhkd->bhqk", (2, 3, 7, 16), (2, 3, 9, 16), 1),
    ("bhqk,bhkd->bhqd", (2, 3, 7, 9), (2, 3, 9, 16), 0),
    ("ij,jk->ik", (5, 6), (6, 4), 0),
    ("ij,kj->ki", (5, 6), (4, 6), 2),  # swapped it would copy less, but not by a quarter: as written
    ("ij,kj->ki", (5, 6), (40, 6), 1),  # swapped: only the small [i, j] operand transposed
    ("abc,cd->abd", (2, 3, 4), (4, 5), None),  # batch only on one side: not one batched product
    ("bij,bj->bi", (2, 3, 4), (2, 4), None),  # a matrix-vector product: left alone
    ("ii,ij->ij", (4, 4), (4, 5), None),  # a diagonal
    ("ij,jk", (3, 4), (4, 5), None),  # implicit output
    ("ik,jk->", (3, 4), (3, 4), None),  # a full contraction
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("equation,a_shape,b_shape,transposes", EINSUMS)
def test_einsum_of_one_batched_product_becomes_a_matmul(backend, equation, a_shape, b_shape, transposes):
    rng = np.random.default_rng(9)
    a, b = (rng.normal(size=s).astype(np.float32) for s in (a_shape, b_shape))
    model = make_model([helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation)],
                       [("a", TensorProto.FLOAT, list(a_shape)), ("b", TensorProto.FLOAT, list(b_shape))],
                       [("y", TensorProto.FLOAT, None)])
    session = _compare(model, {"a": a, "b": b}, backend, rtol=1e-5, atol=1e-5)
    want = np.einsum(equation if "->" in equation else equation + "->ik", a.astype(np.float64), b)
    np.testing.assert_allclose(session.run({"a": a, "b": b})["y"], want, rtol=1e-5, atol=1e-5)
    if transposes is None:
        assert session.rewrites["einsum_to_matmul"] == 0 and _ops(session) == ["Einsum"]
    else:
        assert session.rewrites["einsum_to_matmul"] == 1
        assert sorted(_ops(session)) == sorted(["MatMul"] + ["Transpose"] * transposes)


@pytest.mark.parametrize("backend", BACKENDS)
def test_einsum_of_attention_probabilities_keeps_them_in_place_when_sizes_are_symbolic(backend):
    # guided-diffusion's QKVAttentionLegacy with the batch and length symbolic (reshapes computed at run time): the
    # probabilities are the left operand, as they are, and V [b, c, s] and the [b, t, c] product are transposed
    rng = np.random.default_rng(10)
    nodes = [helper.make_node("Einsum", ["q", "k"], ["w"], equation="bct,bcs->bts"),
             helper.make_node("Softmax", ["w"], ["p"], axis=-1),
             helper.make_node("Einsum", ["p", "v"], ["y"], equation="bts,bcs->bct")]
    shape = ["B", 8, "T"]
    model = make_model(nodes, [(n, TensorProto.FLOAT, shape) for n in "qkv"], [("y", TensorProto.FLOAT, None)])
    feeds = {n: rng.normal(size=(3, 8, 30)).astype(np.float32) for n in "qkv"}
    session = _compare(model, feeds, backend)
    transposed = {n.inputs[0] for n in session.graph.nodes if n.op_type == "Transpose"}
    assert "p" not in transposed and {"q", "v"} <= transposed


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_written_with_einsums_becomes_one_node(backend):
    rng = np.random.default_rng(11)
    nodes = [helper.make_node("Einsum", ["q", "k"], ["s"], equation="bhqd,bhkd->bhqk"),
             helper.make_node("Mul", ["s", "scale"], ["ss"]), helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
             helper.make_node("Einsum", ["p", "v"], ["y"], equation="bhqk,bhkd->bhqd")]
    model = make_model(nodes, [(n, TensorProto.FLOAT, [2, 3, 9, 16]) for n in "qkv"], [("y", TensorProto.FLOAT, None)],
                       [("scale", np.array(0.25, np.float32))])
    feeds = {n: rng.normal(size=(2, 3, 9, 16)).astype(np.float32) for n in "qkv"}
    session = _compare(model, feeds, backend)
    assert session.rewrites["einsum_to_matmul"] == 2 and session.rewrites["fuse_attention"] == 1
    assert _ops(session) == ["FusedAttention"]


def _gelu_mul_model(approximate: str, gelu_first: bool, gate_shape: list[int], extra_reader: bool = False):
    """T5's GeGLU: Gelu of one projection times another (here Relu / Sub stand in for the projections)."""
    mul_inputs = ["g", "gate"] if gelu_first else ["gate", "g"]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Gelu", ["r"], ["g"], approximate=approximate),
             helper.make_node("Sub", ["x", "w"], ["gate"]), helper.make_node("Mul", mul_inputs, ["y"])]
    outputs = [("y", TensorProto.FLOAT, None)]
    if extra_reader:
        nodes.append(helper.make_node("Add", ["g", "x"], ["z"]))
        outputs.append(("z", TensorProto.FLOAT, None))
    w = np.random.default_rng(8).normal(size=gate_shape).astype(np.float32)
    return make_model(nodes, [("x", TensorProto.FLOAT, [3, 70])], outputs, [("w", w)], opset=20)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("gelu_first", [True, False])
@pytest.mark.parametrize("gate_shape", [[3, 70], [70], [1, 1]])
def test_gelu_times_a_gate_becomes_one_node(backend, approximate, gelu_first, gate_shape):
    model = _gelu_mul_model(approximate, gelu_first, gate_shape)
    x = {"x": np.random.default_rng(9).normal(size=(3, 70)).astype(np.float32) * 4}
    session = _compare(model, x, backend)
    assert session.rewrites["fuse_gelu_mul"] == 1
    assert _ops(session) == ["Relu", "Sub", "GeluMul"]
    assert session.graph.nodes[-1].attrs["approximate"] == approximate
    if backend == "cpu":  # the fused node runs natively (no fallback to the reference)
        hetero.Session(model, backends=["cpu"], on_fallback="error")
    unfused = hetero.Session(model, backends=[backend], optimize=False, on_fallback="silent").run(x)
    np.testing.assert_array_equal(session.run(x)["y"], unfused["y"])  # the same bits as Gelu's pass, then Mul's


def test_gelu_read_elsewhere_is_left_alone():
    model = _gelu_mul_model("tanh", True, [3, 70], extra_reader=True)
    session = hetero.Session(model, backends=["reference"])
    assert session.rewrites["fuse_gelu_mul"] == 0
    assert "Gelu" in _ops(session) and "Mul" in _ops(session)


def _gelu_pool_model(approximate: str, extra_reader: bool = False):
    """magika's tail: a conv's GELU read by a GlobalMaxPool alone (a Sub stands in for the conv)."""
    nodes = [helper.make_node("Sub", ["x", "w"], ["s"]),
             helper.make_node("Gelu", ["s"], ["g"], approximate=approximate),
             helper.make_node("GlobalMaxPool", ["g"], ["y"])]
    outputs = [("y", TensorProto.FLOAT, None)]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["g"], ["z"]))
        outputs.append(("z", TensorProto.FLOAT, None))
    w = np.random.default_rng(16).normal(size=[6, 1, 1]).astype(np.float32)
    return make_model(nodes, [("x", TensorProto.FLOAT, [2, 6, 9, 4])], outputs, [("w", w)], opset=20)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_then_global_max_pool_becomes_one_node(backend, approximate):
    model = _gelu_pool_model(approximate)
    x = {"x": np.random.default_rng(17).normal(size=(2, 6, 9, 4)).astype(np.float32) * 3}
    session = _compare(model, x, backend)
    assert session.rewrites["fuse_gelu_global_max_pool"] == 1
    assert _ops(session) == ["Sub", "GeluGlobalMaxPool"]
    assert session.graph.nodes[-1].attrs["approximate"] == approximate
    if backend == "cpu":  # the fused node runs natively (no fallback to the reference)
        hetero.Session(model, backends=["cpu"], on_fallback="error")


def test_gelu_read_besides_the_pool_is_left_alone():
    model = _gelu_pool_model("tanh", extra_reader=True)
    session = hetero.Session(model, backends=["reference"])
    assert session.rewrites["fuse_gelu_global_max_pool"] == 0
    assert _ops(session) == ["Sub", "Gelu", "GlobalMaxPool", "Neg"]


def test_gelu_global_max_pool_is_left_out_where_the_backend_lacks_it():
    from hetero.ir import passes

    kept = passes.for_backend(lambda key: key != ("hetero", "GeluGlobalMaxPool"))
    assert passes.fuse_gelu_global_max_pool not in kept and passes.fuse_gelu_mul in kept
    assert passes.fuse_gelu_global_max_pool in passes.for_backend(lambda key: True)


def test_leaving_out_drops_the_named_passes_only_inside_its_block():
    from hetero.ir import passes

    everything = passes.for_backend(lambda key: True)
    with passes.leaving_out("fuse_gelu_mul", "fuse_attention"):
        kept = passes.for_backend(lambda key: True)
        with passes.leaving_out("fuse_rms_norm"):  # nested blocks add up
            assert passes.fuse_rms_norm not in passes.for_backend(lambda key: True)
        assert passes.fuse_rms_norm in passes.for_backend(lambda key: True)
    assert set(everything) - set(kept) == {passes.fuse_attention, passes.fuse_gelu_mul}
    assert passes.for_backend(lambda key: True) == everything
    with pytest.raises(ValueError, match="not a default pass: fuse_nothing"), passes.leaving_out("fuse_nothing"):
        pass


def _add_relu_model(b_shape: list[int], extra_reader: bool = False):
    """A residual block's tail: Add of two branches (here Sub / Mul stand in for them), then Relu."""
    nodes = [helper.make_node("Sub", ["x", "w"], ["s"]), helper.make_node("Mul", ["x", "x"], ["m"]),
             helper.make_node("Add", ["s", "m"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    outputs = [("y", TensorProto.FLOAT, None)]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["a"], ["z"]))
        outputs.append(("z", TensorProto.FLOAT, None))
    w = np.random.default_rng(14).normal(size=b_shape).astype(np.float32)
    return make_model(nodes, [("x", TensorProto.FLOAT, [2, 8, 5, 5])], outputs, [("w", w)])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("b_shape", [[2, 8, 5, 5], [8, 1, 1], [1]])
def test_add_then_relu_becomes_one_node(backend, b_shape):
    model = _add_relu_model(b_shape)
    x = np.random.default_rng(15).normal(size=(2, 8, 5, 5)).astype(np.float32)
    x.flat[:3] = [np.nan, -0.0, np.inf]
    session = hetero.Session(model, backends=[backend], on_fallback="error" if backend == "cpu" else "silent")
    assert session.rewrites["fuse_add_relu"] == 1
    assert _ops(session) == ["Sub", "Mul", "AddRelu"]
    unfused = hetero.Session(model, backends=[backend], optimize=False, on_fallback="silent").run({"x": x})
    np.testing.assert_array_equal(session.run({"x": x})["y"], unfused["y"])  # the same bits as Add's pass, then Relu's


def test_add_read_elsewhere_is_left_alone():
    session = _compare(_add_relu_model([1], extra_reader=True),
                       {"x": np.random.default_rng(16).normal(size=(2, 8, 5, 5)).astype(np.float32)}, "reference")
    assert session.rewrites["fuse_add_relu"] == 0
    assert "Add" in _ops(session) and "Relu" in _ops(session)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float16_add_relu_stays_two_nodes(backend):
    """A float16 model's Add then Relu (a Keras mixed-precision export: slovorez's Conv1D blocks): no AddRelu, which no
    backend runs on float16 (on cpu it went to the reference); the Add and the Relu stay on the backend. On cpu,
    float16_chains_to_float32 first makes them float32 nodes between Casts, and those do fuse."""
    nodes = [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    b = np.random.default_rng(17).normal(size=(8, 1, 1)).astype(np.float16)
    model = make_model(nodes, [("x", TensorProto.FLOAT16, [2, 8, 5, 5])], [("y", TensorProto.FLOAT16, None)],
                       [("b", b)])
    session = hetero.Session(model, backends=[backend], on_fallback="error")
    if session.rewrites.get("float16_chains_to_float32"):  # cpu: the chain in float32, then a float32 AddRelu
        assert session.rewrites["fuse_add_relu"] == 1
        assert _ops(session) == ["Cast", "AddRelu", "Cast"]
    else:
        assert session.rewrites["fuse_add_relu"] == 0
        assert _ops(session) == ["Add", "Relu"]
    x = np.random.default_rng(18).normal(size=(2, 8, 5, 5)).astype(np.float16)
    np.testing.assert_array_equal(session.run({"x": x})["y"], np.maximum(x + b, np.float16(0)))


def _add_layer_norm_model(a_dims: list, b_dims: list, extra_reader: bool = False, bias: bool = True,
                          outputs_ln: int = 1):
    """A post-norm encoder's residual: Add(x, Sub(r, w)) read by a LayerNormalization over the last axis (the
    operands' dims as the graph declares them: strings are dims known only at a run)."""
    rng = np.random.default_rng(41)
    width = 24
    ln_inputs = ["a", "scale", "bias"] if bias else ["a", "scale"]
    ln_outputs = ["y", "mean", "invstd"][:outputs_ln]
    nodes = [helper.make_node("Sub", ["r", "w"], ["s"]), helper.make_node("Add", ["x", "s"], ["a"]),
             helper.make_node("LayerNormalization", ln_inputs, ln_outputs, axis=-1, epsilon=1e-6)]
    outputs = [("y", TensorProto.FLOAT, None)] + [(o, TensorProto.FLOAT, None) for o in ln_outputs[1:]]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["a"], ["z"]))
        outputs.append(("z", TensorProto.FLOAT, None))
    inits = [("w", rng.normal(size=width).astype(np.float32)),
             ("scale", rng.normal(size=width).astype(np.float32)), ("bias", rng.normal(size=width).astype(np.float32))]
    return make_model(nodes, [("x", TensorProto.FLOAT, a_dims), ("r", TensorProto.FLOAT, b_dims)], outputs, inits)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("a_dims,b_dims,a_shape,b_shape,bias", [
    (["B", "T", 24], ["B", "T", 24], (2, 7, 24), (2, 7, 24), True),  # MiniLM's: token dims known at a run
    ([1, 5, 24], [1, 5, 24], (1, 5, 24), (1, 5, 24), False),  # no LayerNorm bias
    (["B", "T", 24], ["C", "U", 24], (3, 1, 24), (3, 4, 24), True),  # they broadcast after all: the two passes
])
def test_add_then_layer_norm_becomes_one_node(backend, a_dims, b_dims, a_shape, b_shape, bias):
    model = _add_layer_norm_model(a_dims, b_dims, bias=bias)
    rng = np.random.default_rng(42)
    feeds = {"x": rng.normal(size=a_shape).astype(np.float32) * 3, "r": rng.normal(size=b_shape).astype(np.float32)}
    session = hetero.Session(model, backends=[backend], on_fallback="error" if backend == "cpu" else "silent")
    assert session.rewrites["fuse_add_layer_norm"] == 1
    assert _ops(session) == ["Sub", "AddLayerNorm"]
    unfused = hetero.Session(model, backends=[backend], optimize=False, on_fallback="silent").run(feeds)
    got = session.run(feeds)["y"]
    np.testing.assert_array_equal(got, unfused["y"])  # the same bits as the Add's pass, then the LayerNorm's
    plain = hetero.Session(model, backends=["reference"], optimize=False).run(feeds)
    np.testing.assert_allclose(got, plain["y"], rtol=1e-5, atol=1e-5)
    feeds2 = {k: v[..., ::-1].copy() for k, v in feeds.items()}  # a second run on new values (a replay)
    np.testing.assert_array_equal(session.run(feeds2)["y"],
                                  hetero.Session(model, backends=[backend], optimize=False,
                                                 on_fallback="silent").run(feeds2)["y"])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("a_dims,b_dims,a_shape,b_shape", [
    (["B", "T", 24], ["B", "T", 24], (2, 7, 24), (2, 7, 24)),
    (["B", "T", "C"], [1, "T", 24], (2, 5, 24), (1, 5, 24)),  # a ViT's patch tokens + position embeddings
])
def test_pre_norm_add_layer_norm_also_writes_the_sum(backend, a_dims, b_dims, a_shape, b_shape):
    """A pre-norm block's residual: the sum is read by the LayerNorm and again (here a Neg stands in for the next
    residual Add): AddLayerNorm writes it as its second output, the same bits as the Add's."""
    model = _add_layer_norm_model(a_dims, b_dims, extra_reader=True)
    rng = np.random.default_rng(44)
    feeds = {"x": rng.normal(size=a_shape).astype(np.float32) * 3, "r": rng.normal(size=b_shape).astype(np.float32)}
    session = hetero.Session(model, backends=[backend], on_fallback="error" if backend == "cpu" else "silent")
    assert session.rewrites["fuse_add_layer_norm"] == 1
    assert _ops(session) == ["Sub", "AddLayerNorm", "Neg"]
    assert session.graph.nodes[1].outputs == ["y", "a"]
    unfused = hetero.Session(model, backends=[backend], optimize=False, on_fallback="silent")
    for _ in range(2):  # the second: a replay on new values
        got, want = session.run(feeds), unfused.run(feeds)
        for name in ("y", "z"):
            np.testing.assert_array_equal(got[name], want[name])
        feeds = {k: v[..., ::-1].copy() for k, v in feeds.items()}


def test_add_layer_norm_whose_sum_is_a_graph_output():
    model = _add_layer_norm_model([2, 3, 24], [2, 3, 24])
    model.graph.output.append(helper.make_tensor_value_info("a", TensorProto.FLOAT, None))
    rng = np.random.default_rng(45)
    feeds = {k: rng.normal(size=(2, 3, 24)).astype(np.float32) for k in "xr"}
    session = _compare(model, feeds, BACKENDS[-1])
    assert session.rewrites["fuse_add_layer_norm"] == 1 and _ops(session) == ["Sub", "AddLayerNorm"]
    np.testing.assert_array_equal(session.run(feeds)["a"], feeds["x"] + (feeds["r"] - _initializer(model, "w")))


def _initializer(model, name: str) -> np.ndarray:
    return next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == name)


@pytest.mark.parametrize("kind", ["stats", "ranks"])
def test_add_layer_norm_left_alone(kind):
    model = {"stats": lambda: _add_layer_norm_model([2, 3, 24], [2, 3, 24], outputs_ln=3),
             "ranks": lambda: _add_layer_norm_model([2, 3, 24], [3, 24])}[kind]()
    rng = np.random.default_rng(43)
    feeds = {"x": rng.normal(size=(2, 3, 24)).astype(np.float32),
             "r": rng.normal(size=(3, 24) if kind == "ranks" else (2, 3, 24)).astype(np.float32)}
    session = _compare(model, feeds, "reference")
    assert session.rewrites["fuse_add_layer_norm"] == 0
    assert "Add" in _ops(session) and "LayerNormalization" in _ops(session)


def _dw_pointwise_model(stride: int, extra_reader: bool = False, pw_pads: bool = False):
    """A MobileNet / PP-LCNet block: depthwise 3x3 + HardSwish, then a 1x1 conv + Relu."""
    rng = np.random.default_rng(31)
    c, cout = 12, 20
    nodes = [helper.make_node("Conv", ["x", "wd", "bd"], ["d"], group=c, pads=[1, 0, 1, 1], strides=[stride, stride]),
             helper.make_node("HardSwish", ["d"], ["h"]),
             helper.make_node("Conv", ["h", "wp", "bp"], ["p"], pads=[1, 1, 1, 1] if pw_pads else [0, 0, 0, 0]),
             helper.make_node("Relu", ["p"], ["y"])]
    outputs = [("y", TensorProto.FLOAT, None)]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["h"], ["z"]))
        outputs.append(("z", TensorProto.FLOAT, None))
    inits = [("wd", rng.normal(size=(c, 1, 3, 3)).astype(np.float32)), ("bd", rng.normal(size=c).astype(np.float32)),
             ("wp", rng.normal(size=(cout, c, 1, 1)).astype(np.float32) * 0.3),
             ("bp", rng.normal(size=cout).astype(np.float32))]
    return make_model(nodes, [("x", TensorProto.FLOAT, [2, c, 19, 23])], outputs, inits)


@pytest.mark.parametrize("backend", BACKENDS)
def test_depthwise_then_1x1_becomes_one_node(backend):
    x = np.random.default_rng(32).normal(size=(2, 12, 19, 23)).astype(np.float32)
    session = _compare(_dw_pointwise_model(1), {"x": x}, backend, rtol=1e-4, atol=1e-4)
    assert session.rewrites["fuse_dw_pointwise"] == 1
    assert _ops(session) == ["DwPointwiseConv"]
    node = session.graph.nodes[0]
    assert node.attrs["activation"] == "HardSwish" and node.attrs["pw_activation"] == "Relu"


@pytest.mark.parametrize("stride, extra_reader, pw_pads", [(1, True, False), (1, False, True), (2, False, False)])
def test_depthwise_read_elsewhere_strided_or_padded_1x1_is_left_alone(stride, extra_reader, pw_pads):
    # the strided pair: not one DwPointwiseConv takes (fuse_dw_pointwise's shapes)
    x = np.random.default_rng(33).normal(size=(2, 12, 19, 23)).astype(np.float32)
    session = _compare(_dw_pointwise_model(stride, extra_reader, pw_pads), {"x": x}, "reference")
    assert session.rewrites["fuse_dw_pointwise"] == 0
    assert "DwPointwiseConv" not in _ops(session)


def _pad_pool_model(x_shape, pads, mode="edge", value=None, pool=None, opset=17, axes=None, extra_reader=False):
    """Pad (spatial ``pads``: begins then ends, ``axes`` the Pad's own axes input, opset 18) -> MaxPool."""
    pool = {"kernel_shape": [3, 3], "strides": [2, 2], **(pool or {})}
    rank = len(x_shape)
    if axes is None:
        full = [0, 0, *pads[:rank - 2], 0, 0, *pads[rank - 2:]]
        inits = [("pads", np.array(full, np.int64))]
    else:
        inits = [("pads", np.array(pads, np.int64)), ("axes", np.array(axes, np.int64))]
    pad_inputs = ["x", "pads"]
    if value is not None or axes is not None:
        pad_inputs.append("value" if value is not None else "")
        if value is not None:
            inits.append(("value", np.array(value, np.float32)))
    if axes is not None:
        pad_inputs.append("axes")
    nodes = [helper.make_node("Pad", pad_inputs, ["p"], mode=mode), helper.make_node("MaxPool", ["p"], ["y"], **pool)]
    outputs = [("y", TensorProto.FLOAT, None)]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["p"], ["z"]))
        outputs.append(("z", TensorProto.FLOAT, None))
    return make_model(nodes, [("x", TensorProto.FLOAT, ["N", *list(x_shape[1:])])], outputs, inits, opset=opset)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("x_shape, pads, pool, mode, value, axes, opset", [
    ((1, 64, 112, 112), [0, 0, 1, 1], None, "edge", None, None, 17),  # open_nsfw's stem pool (TF's SAME)
    ((2, 5, 9, 8), [1, 0, 1, 1], None, "edge", None, None, 17),  # odd and even sizes, pads on both sides
    ((1, 3, 1, 1), [1, 1, 1, 1], {"strides": [1, 1]}, "edge", None, None, 17),  # a 1-pixel map
    ((1, 4, 7, 6), [2, 1, 0, 2], {"kernel_shape": [3, 2], "strides": [1, 3]}, "edge", None, None, 17),
    ((2, 3, 10, 11), [0, 2, 2, 0], None, "constant", -np.inf, None, 17),  # a constant -inf
    ((1, 6, 9, 8), [0, 1], None, "edge", None, [3], 18),  # the axes input: the width's end alone
    ((1, 6, 9, 9), [1, 1, 1, 1], None, "edge", None, [-2, -1], 18),
    ((2, 4, 13), [1, 1], {"kernel_shape": [3], "strides": [2]}, "edge", None, None, 17),  # a 1-D pool
])
def test_edge_pad_becomes_the_max_pool_padding(backend, x_shape, pads, pool, mode, value, axes, opset):
    model = _pad_pool_model(x_shape, pads, mode, value, pool, opset, axes)
    rng = np.random.default_rng(41)
    for n in (x_shape[0], 3):
        x = rng.normal(size=(n, *x_shape[1:])).astype(np.float32)
        x.reshape(-1)[:: 7] = np.nan if n == 3 else x.reshape(-1)[:: 7]  # NaN where the runtime's max keeps it
        session = _compare(model, {"x": x}, backend, rtol=0, atol=0)
        assert session.rewrites["fold_pad_into_max_pool"] == 1
        assert _ops(session) == ["MaxPool"]


@pytest.mark.parametrize("x_shape, pads, pool, mode, value, extra_reader", [
    ((1, 2, 9, 9), [3, 0, 0, 0], None, "edge", None, False),  # the first window all padding (begin = k)
    ((1, 2, 9, 9), [0, 0, 0, 3], {"strides": [1, 1]}, "edge", None, False),  # the last window all padding
    ((1, 2, 9, 9), [1, 1, 1, 1], None, "constant", 0.0, False),  # zeros: a max over negatives would take them
    ((1, 2, 9, 9), [1, 1, 1, 1], None, "reflect", None, False),
    ((1, 2, 9, 9), [1, 1, 1, 1], {"pads": [1, 1, 1, 1]}, "edge", None, False),  # the pool pads too
    ((1, 2, 9, 9), [1, 1, 1, 1], {"dilations": [2, 2]}, "edge", None, False),
    ((1, 2, 9, 9), [1, 1, 1, 1], {"ceil_mode": 1}, "edge", None, False),
    ((1, 2, 9, 9), [1, 1, 1, 1], None, "edge", None, True),  # the padded map read elsewhere
])
def test_pad_left_before_max_pool_unless_every_window_holds_an_input_value(x_shape, pads, pool, mode, value,
                                                                           extra_reader):
    model = _pad_pool_model(x_shape, pads, mode, value, pool, extra_reader=extra_reader)
    x = np.random.default_rng(42).normal(size=x_shape).astype(np.float32) - 3  # all negative: zeros would show
    session = _compare(model, {"x": x}, "reference", rtol=0, atol=0)
    assert session.rewrites["fold_pad_into_max_pool"] == 0
    assert "Pad" in _ops(session)


def test_pad_of_the_channels_is_left_before_max_pool():
    full = np.array([0, 1, 1, 1, 0, 0, 1, 1], np.int64)
    model = make_model([helper.make_node("Pad", ["x", "pads"], ["p"], mode="edge"),
                        helper.make_node("MaxPool", ["p"], ["y"], kernel_shape=[3, 3], strides=[2, 2])],
                       [("x", TensorProto.FLOAT, [1, 2, 9, 9])], [("y", TensorProto.FLOAT, None)], [("pads", full)])
    x = np.random.default_rng(43).normal(size=(1, 2, 9, 9)).astype(np.float32)
    session = _compare(model, {"x": x}, "reference", rtol=0, atol=0)
    assert session.rewrites["fold_pad_into_max_pool"] == 0


def test_gather_of_static_dims_of_a_partly_dynamic_shape_folds():
    # [N, 3, 5, 7] with N dynamic: dims 2 and -1 (5, 7) are constants, dim 0 stays a run-time value
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "hw"], ["g"], axis=0),
             helper.make_node("Gather", ["s", "n"], ["b"], axis=0),
             helper.make_node("Shape", ["x"], ["t"], start=-2), helper.make_node("Gather", ["t", "one"], ["w"]),
             helper.make_node("Mul", ["g", "two"], ["y"]), helper.make_node("Add", ["b", "w"], ["z"])]
    inits = [("hw", np.array([2, -1], np.int64)), ("n", np.array(0, np.int64)), ("one", np.array(1, np.int64)),
             ("two", np.array(2, np.int64))]
    model = make_model(nodes, [("x", TensorProto.FLOAT, ["N", 3, 5, 7])],
                       [("y", TensorProto.INT64, None), ("z", TensorProto.INT64, None)], inits)
    session = hetero.Session(model, backends=["reference"])
    assert "y" in session.graph.initializers  # Shape -> Gather -> Mul folded
    assert _ops(session) == ["Shape", "Gather", "Add"]  # the batch dim's Gather (and the folded width) at run time
    for n in (1, 4):
        got = session.run({"x": np.zeros((n, 3, 5, 7), np.float32)})
        np.testing.assert_array_equal(got["y"], [10, 14])
        assert int(got["z"]) == n + 7


def _pad_conv_model(x_shape, full_pads, perm=None, conv=None, mode="constant", value=None, opset=17,
                    pad_reader=False, transpose_reader=False, cout=6):
    """Pad (``full_pads``: every axis of x, begins then ends) [-> Transpose(perm)] -> Conv of ``cout`` channels."""
    conv = {"kernel_shape": [3] * (len(x_shape) - 2), **(conv or {})}
    axis, rank = (perm[1] if perm else 1), len(x_shape)
    cin = x_shape[axis] + full_pads[axis] + full_pads[rank + axis]  # the padded map's channels
    rng = np.random.default_rng(44)
    w = rng.normal(size=(cout, cin // conv.get("group", 1), *conv["kernel_shape"])).astype(np.float32)
    inits = [("w", w), ("b", rng.normal(size=cout).astype(np.float32))]
    if opset >= 11:
        pad = helper.make_node("Pad", ["x", "pads"] + (["value"] if value is not None else []), ["p"], mode=mode)
        inits.append(("pads", np.array(full_pads, np.int64)))
        inits += [("value", np.array(value, np.float32))] if value is not None else []
    else:
        pad = helper.make_node("Pad", ["x"], ["p"], mode=mode, pads=full_pads, value=value or 0.0)
    nodes = [pad]
    if perm:
        nodes.append(helper.make_node("Transpose", ["p"], ["t"], perm=perm))
    nodes.append(helper.make_node("Conv", ["t" if perm else "p", "w", "b"], ["y"], **conv))
    outputs = [("y", TensorProto.FLOAT, None)]
    for reader, name in ((pad_reader, "p"), (transpose_reader, "t")):
        if reader:
            nodes.append(helper.make_node("Neg", [name], [name + "_neg"]))
            outputs.append((name + "_neg", TensorProto.FLOAT, None))
    return make_model(nodes, [("x", TensorProto.FLOAT, ["N", *x_shape[1:]])], outputs, inits, opset=opset)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("x_shape, full_pads, perm, conv, value, opset", [
    ((1, 17, 16, 3), [0, 3, 3, 0, 0, 3, 3, 0], [0, 3, 1, 2], {"kernel_shape": [7, 7], "strides": [2, 2]}, None, 17),
    ((2, 4, 9, 8), [0, 0, 1, 0, 0, 0, 2, 1], None, None, 0.0, 17),  # asymmetric, the value given
    ((1, 4, 9, 8), [0, 0, 1, 1, 0, 0, 1, 1], None, {"pads": [1, 0, 0, 2]}, None, 17),  # added to the conv's pads
    ((1, 6, 7, 7), [0, 0, 2, 2, 0, 0, 2, 2], None, {"group": 2, "dilations": [2, 2]}, None, 17),
    ((1, 1, 1, 4), [0, 1, 1, 0, 0, 1, 1, 0], [0, 3, 1, 2], None, None, 17),  # a 1-pixel map
    ((2, 3, 11), [0, 0, 2, 0, 0, 1], None, {"strides": [2]}, None, 17),  # 1-D
    ((1, 4, 9, 8), [0, 0, 1, 2, 0, 0, 1, 0], None, {"auto_pad": "VALID"}, None, 10),  # opset 10's attributes
])
def test_zero_pad_becomes_the_conv_padding(backend, x_shape, full_pads, perm, conv, value, opset):
    model = _pad_conv_model(x_shape, full_pads, perm, conv, value=value, opset=opset)
    rng = np.random.default_rng(45)
    for n in (x_shape[0], 3):
        x = rng.normal(size=(n, *x_shape[1:])).astype(np.float32)
        session = _compare(model, {"x": x}, backend, rtol=1e-4, atol=1e-5)
        assert session.rewrites["fold_pad_into_conv"] == 1
        assert "Pad" not in _ops(session)


@pytest.mark.parametrize("full_pads, perm, conv, mode, value, pad_reader, transpose_reader", [
    ([0, 0, 1, 1, 0, 0, 1, 1], None, None, "constant", 1.0, False, False),  # not zeros
    ([0, 0, 1, 1, 0, 0, 1, 1], None, None, "edge", None, False, False),
    ([0, 0, 1, 1, 0, 0, 1, 1], None, None, "reflect", None, False, False),
    ([0, 1, 1, 1, 0, 0, 1, 1], None, None, "constant", None, False, False),  # the channels padded
    ([0, 1, 1, 0, 0, 1, 1, 0], [0, 2, 3, 1], None, "constant", None, False, False),  # H becomes the channels
    ([0, 0, 1, 1, 0, 0, 1, 1], None, {"auto_pad": "SAME_UPPER"}, "constant", None, False, False),
    ([0, 0, 1, 1, 0, 0, 1, 1], None, None, "constant", None, True, False),  # the padded map read elsewhere
    ([0, 1, 1, 0, 0, 1, 1, 0], [0, 3, 1, 2], None, "constant", None, False, True),  # the transposed one too
])
def test_pad_left_before_conv_unless_zeros_of_the_spatial_axes(full_pads, perm, conv, mode, value, pad_reader,
                                                               transpose_reader):
    x_shape = (1, 6, 6, 6)
    model = _pad_conv_model(x_shape, full_pads, perm, conv, mode, value, pad_reader=pad_reader,
                            transpose_reader=transpose_reader)
    x = np.random.default_rng(46).normal(size=x_shape).astype(np.float32)
    session = _compare(model, {"x": x}, "reference", rtol=1e-5, atol=1e-5)
    assert session.rewrites["fold_pad_into_conv"] == 0
    assert "Pad" in _ops(session)


def _matmul_gelu_model(bias: bool, extra_reader: bool = False, approximate: str = "none"):
    """A transformer's fc1: MatMul by a constant weight, maybe its bias Add, then Gelu."""
    rng = np.random.default_rng(31)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"])]
    inits = [("w", rng.normal(size=(12, 20)).astype(np.float32) * 0.3)]
    product = "p"
    if bias:
        nodes.append(helper.make_node("Add", ["b", "p"], ["pb"]))
        inits.append(("b", rng.normal(size=(20,)).astype(np.float32)))
        product = "pb"
    nodes.append(helper.make_node("Gelu", [product], ["y"], approximate=approximate))
    outputs = [("y", TensorProto.FLOAT, None)]
    if extra_reader:
        nodes.append(helper.make_node("Neg", [product], ["z"]))
        outputs.append(("z", TensorProto.FLOAT, None))
    return make_model(nodes, [("x", TensorProto.FLOAT, [2, 5, 12])], outputs, inits, opset=20)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_matmul_then_gelu_becomes_one_node(backend, bias, approximate):
    model = _matmul_gelu_model(bias, approximate=approximate)
    x = {"x": np.random.default_rng(32).normal(size=(2, 5, 12)).astype(np.float32) * 2}
    session = _compare(model, x, backend)
    assert session.rewrites["fuse_matmul_gelu"] == 1
    assert _ops(session) == ["MatMulGelu"]
    assert session.graph.nodes[0].attrs["approximate"] == approximate
    assert len(session.graph.nodes[0].inputs) == (3 if bias else 2)


def test_matmul_whose_product_is_read_elsewhere_keeps_its_gelu():
    session = hetero.Session(_matmul_gelu_model(True, extra_reader=True), backends=["reference"])
    assert session.rewrites["fuse_matmul_gelu"] == 0
    assert _ops(session) == ["FusedMatMul", "Gelu", "Neg"]


def test_matmul_gelu_is_left_out_where_the_backend_lacks_it():
    """MatMulGelu is an op of its own, not a FusedMatMul activation: OpenCL / Metal, whose FusedMatMul has no GELU,
    keep the FusedMatMul and the Gelu."""
    from hetero.ir import passes

    kept = passes.for_backend(lambda key: key != ("hetero", "MatMulGelu"))
    assert passes.fuse_matmul_gelu not in kept and passes.fuse_matmul_bias in kept
    if not backend_ok("opencl")[0]:
        return
    model = _matmul_gelu_model(True)
    x = {"x": np.random.default_rng(33).normal(size=(2, 5, 12)).astype(np.float32)}
    session = hetero.Session(model, backends=["opencl"], on_fallback="error")
    assert "fuse_matmul_gelu" not in session.rewrites and "MatMulGelu" not in _ops(session)
    plain = hetero.Session(model, backends=["reference"], optimize=False).run(x)["y"]
    np.testing.assert_allclose(session.run(x)["y"], plain, rtol=1e-4, atol=1e-5)


def _loop_model(rng, step_count: int, written_back: bool = False):
    """paddle2onnx's decoder Loop: the weights ride along as carried values that the body passes through unchanged
    (W, b), beside a state h, a carried weight the body does change (u: must stay a loop value) and a scan output.
    ``written_back``: W returns as ``Squeeze(Add(Unsqueeze(W), 0))`` (Constant nodes), as paddle2onnx writes state."""
    f32, i64 = np.float32, np.int64
    back = [helper.make_node("Constant", [], ["ax"], value=numpy_helper.from_array(np.array([0], i64))),
            helper.make_node("Constant", [], ["z"], value=numpy_helper.from_array(np.array([0.0], f32))),
            helper.make_node("Unsqueeze", ["W_in", "ax"], ["Wu"]), helper.make_node("Add", ["Wu", "z"], ["Wz"]),
            helper.make_node("Squeeze", ["Wz", "ax"], ["W_back"])] if written_back else []
    body = helper.make_graph(
        [helper.make_node("Transpose", ["W_in"], ["Wt"], perm=[1, 0]),
         helper.make_node("MatMul", ["h_in", "Wt"], ["hw"]),
         helper.make_node("Add", ["hw", "b_in"], ["pre"]),
         helper.make_node("Add", ["pre", "u_in"], ["pre_u"]),
         helper.make_node("Tanh", ["pre_u"], ["h_out"]),
         helper.make_node("Mul", ["u_in", "half"], ["u_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("ReduceSum", ["h_out"], ["scan"], keepdims=0), *back],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [1, 6]),
         helper.make_tensor_value_info("W_in", TensorProto.FLOAT, [6, 6]),
         helper.make_tensor_value_info("b_in", TensorProto.FLOAT, [6]),
         helper.make_tensor_value_info("u_in", TensorProto.FLOAT, [6])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [1, 6]),
         helper.make_tensor_value_info("W_back" if written_back else "W_in", TensorProto.FLOAT, [6, 6]),  # invariant
         helper.make_tensor_value_info("b_in", TensorProto.FLOAT, [6]),
         helper.make_tensor_value_info("u_out", TensorProto.FLOAT, [6]),
         helper.make_tensor_value_info("scan", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(np.array(0.5, f32), "half")])
    nodes = [helper.make_node("Loop", ["trip", "cond", "h0", "W", "b", "u"], ["h", "W_last", "b_last", "u_last", "s"],
                              body=body)]
    inits = [("trip", np.array(step_count, np.int64)), ("cond", np.array(True)),
             ("W", rng.normal(size=(6, 6)).astype(f32) * 0.5), ("b", rng.normal(size=6).astype(f32)),
             ("u", rng.normal(size=6).astype(f32))]
    outs = [(n, TensorProto.FLOAT, None) for n in ("h", "W_last", "b_last", "u_last", "s")]
    return make_model(nodes, [("h0", TensorProto.FLOAT, [1, 6])], outs, inits)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("step_count", [0, 1, 7])
@pytest.mark.parametrize("written_back", [False, True])
def test_loop_invariant_weights_become_body_constants(backend, step_count, written_back):
    import onnxruntime as ort

    rng = np.random.default_rng(11)
    model = _loop_model(rng, step_count, written_back)
    h0 = rng.normal(size=(1, 6)).astype(np.float32)
    session = _compare(model, {"h0": h0}, backend)
    # W and b (passed through, started from weights) are rewired; u changes every iteration and stays carried
    assert session.rewrites["loop_invariant_constants"] == 2
    body = session.graph.nodes[0].attrs["body"]
    read = {name for node in body.nodes for name in node.inputs}
    assert {"W", "b"} <= read and not {"W_in", "b_in"} & read and "u_in" in read
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"h0": h0})
    got = session.run({"h0": h0})
    for name, value in zip(["h", "W_last", "b_last", "u_last", "s"], want, strict=True):
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6)
    # a Graph handed to a Session keeps its body (subgraph attributes are shared by Graph.copy): the pass copies it
    from hetero.frontends import load

    graph = load(model)
    hetero.Session(graph, backends=[backend], on_fallback="silent").run({"h0": h0})
    assert "W_in" in {n for node in graph.nodes[0].attrs["body"].nodes for n in node.inputs}


def _hoist_model(rng, step_count: int, feats_change: bool = False):
    """SLANet's decoder Loop in small: the encoder features F (computed, not a weight) ride along as a carried value
    written back as ``Squeeze(Add(Unsqueeze(F), 0))`` with Constant nodes; the body projects them by a weight of the
    enclosing graph (loop-invariant: hoisted), attends with the state, writes a step-indexed Slice of a carried
    buffer and a scan output. ``feats_change``: the body writes ``F * 0.5`` back (not invariant: stays)."""
    f32, i64 = np.float32, np.int64
    c = helper.make_node
    back = [c("Mul", ["F_in", "half"], ["F_out"])] if feats_change else [
        c("Constant", [], ["ax"], value=numpy_helper.from_array(np.array([0], i64))),
        c("Constant", [], ["z"], value=numpy_helper.from_array(np.array([0.0], f32))),
        c("Unsqueeze", ["F_in", "ax"], ["Fu"]), c("Add", ["Fu", "z"], ["Fz"]), c("Squeeze", ["Fz", "ax"], ["F_out"])]
    body = helper.make_graph(
        [c("MatMul", ["F_in", "Wp"], ["proj"]),  # [1, 5, 4] x [4, 3]: invariant
         c("MatMul", ["F_in", "h_in"], ["score"]),  # [1, 5, 4] x [4, 1]: reads the state, stays
         c("Softmax", ["score"], ["att"], axis=1),
         c("Mul", ["proj", "att"], ["ctx3"]),
         c("ReduceSum", ["ctx3", "ax1"], ["ctx"], keepdims=0),  # [1, 3]
         c("Unsqueeze", ["i", "ax0"], ["i1"]), c("Add", ["i1", "one"], ["i2"]),
         c("Slice", ["buf_in", "i1", "i2", "ax1"], ["row"]),  # [1, 1, 3] at the step counter
         c("Add", ["row", "ctx"], ["row2"]),
         c("Reshape", ["row2", "shape13"], ["row3"]),
         c("Expand", ["i1", "shape113"], ["idx"]),
         c("ScatterElements", ["buf_in", "idx", "row3"], ["buf_out"], axis=1),
         c("ReduceMean", ["ctx"], ["hm"], axes=[1], keepdims=0),
         c("Add", ["h_in", "hm"], ["h_out"]),
         c("Identity", ["cond_in"], ["cond_out"]),
         c("Identity", ["ctx"], ["scan"]), *back],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [4, 1]),
         helper.make_tensor_value_info("F_in", TensorProto.FLOAT, [1, 5, 4]),
         helper.make_tensor_value_info("buf_in", TensorProto.FLOAT, [1, 9, 3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [4, 1]),
         helper.make_tensor_value_info("F_out", TensorProto.FLOAT, [1, 5, 4]),
         helper.make_tensor_value_info("buf_out", TensorProto.FLOAT, [1, 9, 3]),
         helper.make_tensor_value_info("scan", TensorProto.FLOAT, [1, 3])],
        [numpy_helper.from_array(v, k) for k, v in [("half", np.array(0.5, f32)), ("ax0", np.array([0], i64)),
                                                     ("ax1", np.array([1], i64)), ("one", np.array([1], i64)),
                                                     ("shape13", np.array([1, 1, 3], i64)),
                                                     ("shape113", np.array([1, 1, 3], i64))]])
    nodes = [c("Relu", ["x"], ["F"]),  # the features: a computed value, not a weight
             c("Loop", ["trip", "", "h0", "F", "buf0"], ["h", "F_last", "buf", "s"], body=body)]
    inits = [("trip", np.array(step_count, i64)), ("h0", rng.normal(size=(4, 1)).astype(f32)),
             ("Wp", rng.normal(size=(4, 3)).astype(f32)), ("buf0", rng.normal(size=(1, 9, 3)).astype(f32))]
    outs = [(n, TensorProto.FLOAT, None) for n in ("h", "F_last", "buf", "s")]
    return make_model(nodes, [("x", TensorProto.FLOAT, [1, 5, 4])], outs, inits)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("step_count", [0, 1, 9])
@pytest.mark.parametrize("feats_change", [False, True])
def test_loop_invariant_matmul_is_hoisted(backend, step_count, feats_change):
    import onnxruntime as ort

    rng = np.random.default_rng(5)
    model = _hoist_model(rng, step_count, feats_change)
    x = rng.normal(size=(1, 5, 4)).astype(np.float32)
    session = _compare(model, {"x": x}, backend)
    assert session.rewrites["hoist_loop_invariants"] == (0 if feats_change else 1)
    loop = next(n for n in session.graph.nodes if n.op_type == "Loop")
    body_ops = [n.op_type for n in loop.attrs["body"].nodes]
    assert body_ops.count("MatMul") == (2 if feats_change else 1)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = session.run({"x": x})
    for name, value in zip(["h", "F_last", "buf", "s"], want, strict=True):
        assert got[name].shape == value.shape
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6)
    # the model's own body is untouched (subgraph attributes are shared by Graph.copy)
    from hetero.frontends import load

    graph = load(model)
    hetero.Session(graph, backends=[backend], on_fallback="silent").run({"x": x})
    assert [n.op_type for n in graph.nodes[-1].attrs["body"].nodes].count("MatMul") == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_adding_a_zero_is_removed_unless_it_broadcasts(backend):
    f32 = np.float32
    nodes = [helper.make_node("Add", ["x", "zero"], ["a"]),  # removed
             helper.make_node("Mul", ["a", "two"], ["m"]),
             helper.make_node("Sub", ["m", "zero1"], ["s"]),  # removed
             helper.make_node("Add", ["s", "zero3"], ["y"]),  # a graph output, and [1, 1, 1] makes it rank 3: kept
             helper.make_node("Add", ["x", "one"], ["p"]),  # not a zero: kept
             helper.make_node("Sub", ["zero1", "x"], ["n"]),  # 0 - x: kept
             helper.make_node("Add", ["i", "izero"], ["i1"]),  # an int64 zero on int64: removed
             helper.make_node("Mul", ["i1", "i3"], ["j"])]
    inits = [("zero", np.array(0.0, f32)), ("two", np.array(2.0, f32)), ("zero1", np.array([0.0], f32)),
             ("zero3", np.zeros((1, 1, 1), f32)), ("one", np.array([1.0], f32)), ("izero", np.array(0, np.int64)),
             ("i3", np.array(3, np.int64))]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [2, 3]), ("i", TensorProto.INT64, [4])],
                       [("y", TensorProto.FLOAT, None), ("p", TensorProto.FLOAT, None), ("n", TensorProto.FLOAT, None),
                        ("j", TensorProto.INT64, None)], inits)
    x = np.array([[-0.0, 1.5, -2.0], [3.0, np.inf, -np.inf]], f32)
    session = _compare(model, {"x": x, "i": np.arange(4, dtype=np.int64) - 2}, backend)
    assert session.rewrites["remove_noops"] == 3
    assert session.run({"x": x, "i": np.zeros(4, np.int64)})["y"].shape == (1, 2, 3)
    assert [n.op_type for n in session.graph.nodes].count("Add") == 2


_BIG = np.iinfo(np.int64).max


def _space_to_depth_conv_model(x_shape, phases, s=2, conv=None, chained=True, w_first=False, ends=_BIG,
                               sliced_reader=False, extra_slices=None, cin=None):
    """YOLOv5's Focus: ``Concat([x[..., dy::s, dx::s] for (dy, dx) in phases], axis=1)`` (each phase as two Slices,
    H then W or W then H, or one Slice of both axes) -> Conv (3x3, pads 1 unless ``conv`` says)."""
    conv = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], **(conv or {})}
    rng = np.random.default_rng(47)
    c = x_shape[1]
    cin = len(phases) * c if cin is None else cin  # the Concat's channels
    w = rng.normal(size=(6, cin // conv.get("group", 1), *conv["kernel_shape"])).astype(np.float32)
    inits = [("w", w), ("b", rng.normal(size=6).astype(np.float32)), ("step", np.array([s], np.int64)),
             ("end", np.array([ends], np.int64)), ("ax2", np.array([2], np.int64)), ("ax3", np.array([-1], np.int64)),
             ("ends2", np.array([ends, ends], np.int64)), ("axes23", np.array([2, 3], np.int64)),
             ("steps2", np.array([s, s], np.int64))]
    inits += [(f"start{i}", np.array([i], np.int64)) for i in range(s)]
    nodes, pieces = [], []
    for k, (dy, dx) in enumerate(phases):
        if chained:
            first, second = (("ax3", dx), ("ax2", dy)) if w_first else (("ax2", dy), ("ax3", dx))
            nodes.append(helper.make_node("Slice", ["x", f"start{first[1]}", "end", first[0], "step"], [f"h{k}"]))
            nodes.append(helper.make_node("Slice", [f"h{k}", f"start{second[1]}", "end", second[0], "step"],
                                          [f"p{k}"]))
        else:
            inits.append((f"st{k}", np.array([dy, dx], np.int64)))
            nodes.append(helper.make_node("Slice", ["x", f"st{k}", "ends2", "axes23", "steps2"], [f"p{k}"]))
        pieces.append(f"p{k}")
    for k, starts, axes in extra_slices or []:  # a piece's Slice with other bounds (N or C sliced)
        inits += [(f"xs{k}", np.array(starts, np.int64)), (f"xa{k}", np.array(axes, np.int64)),
                  (f"xe{k}", np.array([_BIG] * len(axes), np.int64))]
        nodes.append(helper.make_node("Slice", [pieces[k], f"xs{k}", f"xe{k}", f"xa{k}"], [f"q{k}"]))
        pieces[k] = f"q{k}"
    nodes.append(helper.make_node("Concat", pieces, ["f"], axis=1))
    nodes.append(helper.make_node("Conv", ["f", "w", "b"], ["y"], **conv))
    outputs = [("y", TensorProto.FLOAT, None)]
    if sliced_reader:
        nodes.append(helper.make_node("Neg", [pieces[0]], ["z"]))
        outputs.append(("z", TensorProto.FLOAT, None))
    return make_model(nodes, [("x", TensorProto.FLOAT, ["N", *x_shape[1:]])], outputs, inits)


_FOCUS = [(0, 0), (1, 0), (0, 1), (1, 1)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("x_shape, phases, s, conv, chained, w_first, ends", [
    ((1, 3, 16, 12), _FOCUS, 2, None, True, False, _BIG),  # ddddocr_det's (YOLOv5's) Focus and 3x3 conv
    ((2, 2, 6, 10), [(1, 1), (0, 1), (1, 0), (0, 0)], 2, {"kernel_shape": [2, 3], "pads": [0, 1, 2, 1]}, False,
     False, _BIG),  # another order, one Slice of both axes, asymmetric pads, a 2 x 3 kernel
    ((1, 4, 4, 8), _FOCUS, 2, {"kernel_shape": [1, 1], "pads": [0, 0, 0, 0]}, True, True, 8),  # W first, end = W
    ((1, 2, 9, 6), [(dy, dx) for dx in range(3) for dy in range(3)], 3, None, True, False, _BIG),  # 3 x 3 phases
    ((1, 1, 2, 2), _FOCUS, 2, {"kernel_shape": [3, 3], "pads": [2, 1, 0, 1]}, True, False, _BIG),  # 1-pixel phases
])
def test_space_to_depth_becomes_a_strided_conv(backend, x_shape, phases, s, conv, chained, w_first, ends):
    model = _space_to_depth_conv_model(x_shape, phases, s, conv, chained, w_first, ends)
    rng = np.random.default_rng(48)
    for n in (x_shape[0], 3):
        x = rng.normal(size=(n, *x_shape[1:])).astype(np.float32)
        session = _compare(model, {"x": x}, backend, rtol=1e-4, atol=1e-5)
        assert session.rewrites["fold_space_to_depth_into_conv"] == 1
        assert _ops(session) in (["Conv"], ["FusedConv"])
        kh, kw = (conv or {}).get("kernel_shape", [3, 3])
        assert session.graph.nodes[0].attrs["kernel_shape"] == [s * kh, s * kw]
        assert session.graph.nodes[0].attrs["strides"] == [s, s]


@pytest.mark.parametrize("x_shape, phases, conv, kwargs", [
    ((1, 3, 8, 8), _FOCUS, {"strides": [2, 2]}, {}),
    ((1, 3, 8, 8), _FOCUS, {"dilations": [2, 2]}, {}),
    ((1, 4, 8, 8), _FOCUS, {"group": 2}, {}),
    ((1, 3, 8, 8), _FOCUS, {"auto_pad": "SAME_UPPER", "pads": None}, {}),
    ((1, 3, 8, 8), [(0, 0), (1, 0), (0, 1), (0, 0)], None, {}),  # a phase twice, one missing
    ((1, 3, 8, 8), _FOCUS, None, {"sliced_reader": True}),  # a piece read elsewhere
    ((2, 3, 8, 8), _FOCUS, None, {"extra_slices": [(k, [1], [0]) for k in range(4)]}),  # the batch sliced
    ((1, 3, 8, 8), _FOCUS, None, {"extra_slices": [(k, [1], [1]) for k in range(4)], "cin": 8}),  # the channels
])
def test_space_to_depth_left_before_conv_unless_it_folds(x_shape, phases, conv, kwargs):
    conv = dict(conv or {})
    if conv.get("pads", 0) is None:
        conv.pop("pads")
        conv = {"kernel_shape": [3, 3], **conv}
    model = _space_to_depth_conv_model(x_shape, phases, 2, conv, **kwargs)
    x = np.random.default_rng(49).normal(size=x_shape).astype(np.float32)
    session = _compare(model, {"x": x}, "reference", rtol=1e-5, atol=1e-5)
    assert session.rewrites["fold_space_to_depth_into_conv"] == 0
    assert "Concat" in _ops(session)


def _max_pools_model(x_shape, pools, concat=True):
    """Size-keeping MaxPools of x (each a dict of attributes; "pads" (k - 1) / 2 where left out), then their outputs
    and x concatenated along the channels (YOLOv5's SPP), or each an output of its own."""
    nodes, outs = [], []
    for i, attrs in enumerate(pools):
        attrs = dict(attrs)
        kernel = attrs["kernel_shape"]
        attrs.setdefault("pads", [(k - 1) // 2 for k in kernel] * 2)
        if attrs["pads"] is None:
            attrs.pop("pads")
        nodes.append(helper.make_node("MaxPool", ["x"], [f"m{i}"], **attrs))
        outs.append(f"m{i}")
    if concat:
        nodes.append(helper.make_node("Concat", ["x", *outs], ["y"], axis=1))
        outputs = [("y", TensorProto.FLOAT, None)]
    else:
        outputs = [(o, TensorProto.FLOAT, None) for o in outs]
    return make_model(nodes, [("x", TensorProto.FLOAT, ["N", *x_shape[1:]])], outputs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("x_shape, kernels, rewrites, concat", [
    ((1, 6, 13, 13), [(5, 5), (9, 9), (13, 13)], 2, True),  # ddddocr_det's SPP
    ((2, 3, 7, 11), [(9, 9), (3, 3), (5, 5)], 2, False),  # out of order, windows past the map
    ((1, 4, 6, 5), [(3, 5), (7, 9), (5, 5)], 2, True),  # rectangular: 7 x 9 reads 5 x 5's (3 x 5 on 5 x 5)
    ((1, 2, 1, 1), [(3, 3), (5, 5)], 1, False),  # a 1-pixel map
    ((1, 3, 8, 8), [(5, 5), (5, 5), (3, 7)], 0, True),  # equal kernels; 3 x 7 holds neither 5 x 5
])
def test_same_max_pools_become_a_chain(backend, x_shape, kernels, rewrites, concat):
    model = _max_pools_model(x_shape, [{"kernel_shape": list(k)} for k in kernels], concat)
    rng = np.random.default_rng(50)
    for n in (x_shape[0], 3):
        x = rng.normal(size=(n, *x_shape[1:])).astype(np.float32)
        x.flat[::7] = np.nan
        x.flat[3::11] = -np.inf
        x.flat[5::13] = np.inf
        plain = hetero.Session(model, backends=["reference"], optimize=False).run({"x": x})
        session = hetero.Session(model, backends=[backend], on_fallback="silent")
        for name, value in session.run({"x": x}).items():
            np.testing.assert_array_equal(value, plain[name])  # the same maxima, NaNs in the same places
        assert session.rewrites["chain_same_max_pools"] == rewrites


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [9, 9], "strides": [2, 2]},
    {"kernel_shape": [9, 9], "dilations": [2, 2], "pads": [8, 8, 8, 8]},
    {"kernel_shape": [9, 9], "pads": [4, 4, 4, 3]},  # not symmetric
    {"kernel_shape": [9, 9], "pads": [0, 0, 0, 0]},
    {"kernel_shape": [8, 8], "pads": [4, 4, 3, 3]},  # even
    {"kernel_shape": [9, 9], "auto_pad": "SAME_UPPER", "pads": None},
    {"kernel_shape": [9, 9], "ceil_mode": 1},
])
def test_max_pool_left_alone_unless_it_keeps_the_size(attrs):
    model = _max_pools_model((1, 3, 11, 11), [{"kernel_shape": [5, 5]}, attrs], concat=False)
    x = np.random.default_rng(51).normal(size=(1, 3, 11, 11)).astype(np.float32)
    session = _compare(model, {"x": x}, "reference", rtol=0, atol=0)
    assert session.rewrites["chain_same_max_pools"] == 0


def test_max_pool_with_indices_is_left_alone():
    nodes = [helper.make_node("MaxPool", ["x"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["x"], ["b", "i"], kernel_shape=[5, 5], pads=[2, 2, 2, 2])]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [1, 2, 6, 6])],
                       [("a", TensorProto.FLOAT, None), ("b", TensorProto.FLOAT, None), ("i", TensorProto.INT64, None)])
    x = np.random.default_rng(52).normal(size=(1, 2, 6, 6)).astype(np.float32)
    session = _compare(model, {"x": x}, "reference", rtol=0, atol=0)
    assert session.rewrites["chain_same_max_pools"] == 0


def test_nodes_are_found_by_identity_not_by_value():
    """Two nodes with the same fields are two nodes: a pass removing the second must not remove the first."""
    first, second = (Node("Relu", ["x"], ["y"]) for _ in range(2))
    nodes = [first, second]
    nodes.remove(second)
    assert nodes == [first] and nodes[0] is first and first != second


def test_single_consumer_counts_readers_and_reads():
    graph = hetero.load(make_model(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
         helper.make_node("Add", ["b", "b"], ["c"]), helper.make_node("Abs", ["x"], ["d"]),
         helper.make_node("Sum", ["c", "d"], ["e"])],
        [("x", TensorProto.FLOAT, [2])], [("e", TensorProto.FLOAT, [2]), ("a", TensorProto.FLOAT, [2])]))
    by_output = {n.outputs[0]: n for n in graph.nodes}
    assert [n.outputs[0] for n in graph.readers("x")] == ["a", "d"] and graph.readers("") == []
    assert passes._single_consumer(graph, "x") is None  # two readers
    assert passes._single_consumer(graph, "b") is None  # one reader, reading it twice
    assert passes._single_consumer(graph, "a") is None  # a graph output
    assert passes._single_consumer(graph, "c") is by_output["e"]
    assert passes._single_consumer(graph, "e") is None and passes._single_consumer(graph, "nothing") is None
