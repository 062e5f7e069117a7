"""Run a three-node model with the toy backend first: Add and Relu run on toy, Sigmoid falls back."""

import numpy as np
from onnx import TensorProto, helper

import hetero


def build_model():
    nodes = [
        helper.make_node("Add", ["x", "bias"], ["h"], name="add"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Sigmoid", ["r"], ["y"], name="sigmoid"),
    ]
    bias = helper.make_tensor("bias", TensorProto.FLOAT, [4], [0.5, -0.5, 1.0, -1.0])
    graph = helper.make_graph(
        nodes, "toy_demo",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [bias],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def main() -> None:
    for row in hetero.backends():
        devices = ", ".join(map(str, row.devices))
        print(f"{row.name:10} {row.status:8} {row.distribution} {row.version}  {devices or row.reason}")

    session = hetero.Session(build_model(), backends=["toy"], on_fallback="silent")
    print(session.explain())
    x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)
    print(session.run({"x": x})["y"])


if __name__ == "__main__":
    main()
