"""A small CNN for the rknn tests: convolutions, pooling, a residual add and a classifier head the NPU takes, with
three ops it does not (Erf in a GELU, Floor, Abs), so the model splits rknn -> cpu -> rknn -> cpu."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

INPUT_SHAPE = (1, 3, 32, 32)
CLASSES = 10
NOT_ON_NPU = ("Erf", "Floor", "Abs")


def _weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    def conv(cout: int, cin: int, k: int) -> np.ndarray:
        return (rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))).astype(np.float32)

    return {
        "w1": conv(16, 3, 3), "b1": (rng.standard_normal(16) * 0.1).astype(np.float32),
        "w2": conv(16, 16, 3), "b2": (rng.standard_normal(16) * 0.1).astype(np.float32),
        "w3": conv(32, 16, 3), "b3": (rng.standard_normal(32) * 0.1).astype(np.float32),
        "w4": conv(32, 32, 1), "b4": (rng.standard_normal(32) * 0.1).astype(np.float32),
        "fc": (rng.standard_normal((32, CLASSES)) * 0.2).astype(np.float32),
        "fc_b": (rng.standard_normal(CLASSES) * 0.1).astype(np.float32),
        "half": np.array(0.5, np.float32), "one": np.array(1.0, np.float32),
        "rsqrt2": np.array(1 / np.sqrt(2), np.float32), "scale": np.array(4.0, np.float32),
        "quarter": np.array(0.25, np.float32),
    }


def build(seed: int = 0):
    """The ONNX ModelProto (opset 17, static shapes)."""
    rng = np.random.default_rng(seed)
    n = helper.make_node
    nodes = [
        # rknn: conv + relu + conv (+ residual add) + maxpool
        n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        n("Relu", ["c1"], ["r1"], name="relu1"),
        n("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        n("Add", ["c2", "r1"], ["res"], name="residual"),
        n("MaxPool", ["res"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
        # cpu: GELU written with Erf (0.5 * x * (1 + erf(x / sqrt 2))): Erf is not on the NPU
        n("Mul", ["p1", "rsqrt2"], ["g0"], name="gelu_scale"),
        n("Erf", ["g0"], ["g1"], name="gelu_erf"),
        n("Add", ["g1", "one"], ["g2"], name="gelu_add"),
        n("Mul", ["p1", "g2"], ["g3"], name="gelu_mul"),
        n("Mul", ["g3", "half"], ["g4"], name="gelu_half"),
        # rknn: conv stride 2 + sigmoid-gated 1x1 conv
        n("Conv", ["g4", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv3"),
        n("Relu", ["c3"], ["r3"], name="relu3"),
        n("Conv", ["r3", "w4", "b4"], ["c4"], name="conv4"),
        n("Sigmoid", ["c4"], ["s4"], name="gate"),
        n("Mul", ["r3", "s4"], ["m4"], name="gated"),
        n("GlobalAveragePool", ["m4"], ["gap"], name="gap"),
        n("Flatten", ["gap"], ["flat"], name="flatten"),
        n("MatMul", ["flat", "fc"], ["logits0"], name="fc"),
        n("Add", ["logits0", "fc_b"], ["logits"], name="fc_bias"),
        # cpu: a quantised "confidence" head with Floor and Abs
        n("Mul", ["logits", "scale"], ["q0"], name="q_scale"),
        n("Floor", ["q0"], ["q1"], name="q_floor"),
        n("Abs", ["q1"], ["q2"], name="q_abs"),
        n("Mul", ["q2", "quarter"], ["steps"], name="q_unscale"),
    ]
    inits = [numpy_helper.from_array(v, k) for k, v in _weights(rng).items()]
    graph = helper.make_graph(
        nodes, "rknn_test_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(INPUT_SHAPE))],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, CLASSES]),
         helper.make_tensor_value_info("steps", TensorProto.FLOAT, [1, CLASSES])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def images(count: int, seed: int = 1) -> list[np.ndarray]:
    """Smooth random images (what a camera gives is closer to this than to white noise)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        coarse = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
        out.append(np.kron(coarse, np.ones((1, 1, 4, 4), np.float32)) + 0.1 * rng.standard_normal(INPUT_SHAPE)
                   .astype(np.float32))
    return out
