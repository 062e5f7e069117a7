"""A segment as an ONNX model the RKNN toolkit loads: its nodes (hetero's fused ops written out as the standard ops
they replaced), its weights, and its inputs and outputs with their static shapes.

The opset is lowered to 19 (the newest rknn-toolkit2 2.5 reads) when every op of the segment means the same there;
otherwise the model keeps the graph's opset and the toolkit says whether it reads it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hetero.contract import BackendError, Segment
from hetero.contract.graph import HETERO_DOMAIN, Node

RKNN_MAX_OPSET = 19


def _activation_nodes(name: str, attrs: dict[str, Any], src: str, dst: str, weights: dict[str, np.ndarray]) -> list:
    """The standard ONNX nodes of a fused node's ``activation`` attribute, reading ``src`` and writing ``dst``."""
    from onnx import helper

    kind = attrs["activation"]
    if kind == "Silu":
        gate = f"{dst}/sigmoid"
        return [helper.make_node("Sigmoid", [src], [gate], name=f"{name}/sigmoid"),
                helper.make_node("Mul", [src, gate], [dst], name=f"{name}/mul")]
    if kind == "Clip":
        inputs = [src]
        for bound in ("min", "max"):
            value = attrs.get(f"activation_{bound}")
            if value is None:
                inputs.append("")
                continue
            weights[f"{name}/clip_{bound}"] = np.array(value, dtype=np.float32)
            inputs.append(f"{name}/clip_{bound}")
        while inputs[-1] == "":
            inputs.pop()
        return [helper.make_node("Clip", inputs, [dst], name=f"{name}/clip")]
    extra = {k.removeprefix("activation_"): v for k, v in attrs.items() if k.startswith("activation_")}
    return [helper.make_node(kind, [src], [dst], name=f"{name}/{kind.lower()}", **extra)]


def _onnx_nodes(node: Node, weights: dict[str, np.ndarray]) -> list:
    from onnx import helper, numpy_helper

    plain = {k: (numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v)
             for k, v in node.attrs.items() if not k.startswith("activation")}
    if node.domain != HETERO_DOMAIN:
        return [helper.make_node(node.op_type, node.inputs, node.outputs, name=node.name, **plain)]
    has_activation = node.attrs.get("activation") is not None
    out = node.outputs[0]
    mid = f"{out}/pre_activation" if has_activation else out
    if node.op_type == "FusedConv":
        nodes = [helper.make_node("Conv", node.inputs, [mid], name=node.name, **plain)]
    else:  # FusedMatMul: x @ W, plus the bias row
        product = f"{out}/matmul" if len(node.inputs) > 2 else mid
        nodes = [helper.make_node("MatMul", node.inputs[:2], [product], name=node.name)]
        if len(node.inputs) > 2:
            nodes.append(helper.make_node("Add", [product, node.inputs[2]], [mid], name=f"{node.name}/bias"))
    if has_activation:
        nodes += _activation_nodes(node.name, node.attrs, mid, out, weights)
    return nodes


def _opset(segment: Segment) -> int:
    from onnx import defs

    opset = segment.graph.opset("")
    if opset <= RKNN_MAX_OPSET:
        return opset
    ops = {"Conv", "MatMul", "Add", "Sigmoid", "Mul", "Clip"} | {n.op_type for n in segment.graph.nodes
                                                                 if n.domain == ""}
    for op in ops:
        try:
            if defs.get_schema(op, opset).since_version != defs.get_schema(op, RKNN_MAX_OPSET).since_version:
                return opset
        except defs.SchemaError:
            return opset
    return RKNN_MAX_OPSET


def segment_to_onnx(segment: Segment) -> bytes:
    """The serialized ONNX model of ``segment`` (deterministic: the same segment gives the same bytes)."""
    from onnx import helper, numpy_helper

    graph = segment.graph
    weights = dict(graph.initializers)
    nodes = [n for node in graph.nodes for n in _onnx_nodes(node, weights)]

    def value(name: str) -> Any:
        info = graph.values[name]
        if info.dtype.onnx_type is None:
            raise BackendError(f"segment {segment.index}: {name!r} is {info.dtype}, which ONNX cannot carry")
        return helper.make_tensor_value_info(name, info.dtype.onnx_type, list(info.shape or ()))

    used = {name for n in nodes for name in n.input}
    initializers = [numpy_helper.from_array(np.asarray(weights[name]), name) for name in sorted(weights)
                    if name in used]
    onnx_graph = helper.make_graph(nodes, f"hetero_segment_{segment.index}", [value(n) for n in graph.inputs],
                                   [value(n) for n in graph.outputs], initializers)
    opset = _opset(segment)
    model = helper.make_model(onnx_graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="hetero-rknn")
    model.ir_version = 9 if opset <= 19 else 10  # what the toolkit's onnx 1.18 reads for these opsets
    return model.SerializeToString(deterministic=True)
