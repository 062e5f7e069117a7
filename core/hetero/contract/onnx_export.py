"""A segment as a standalone ONNX model, for whole-graph backends that hand segments to a vendor compiler (QNN, RKNN).

hetero's fused nodes (``FusedConv``, ``FusedMatMul``, ``ConvResidual`` in the ``hetero`` domain, made by
``hetero.ir.passes``) are written back as the standard ops they replaced, so any ONNX consumer reads the model. The
output is deterministic: the same segment gives the same bytes, which makes the bytes a cache key for compiled
artifacts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .backend import Segment
from .errors import BackendError
from .graph import HETERO_DOMAIN, ONNX_DOMAIN, Node


def _activation_nodes(node: Node, src: str, dst: str, weights: dict[str, np.ndarray]) -> list[Any]:
    """The standard nodes of a fused node's ``activation`` attribute, reading ``src`` and writing ``dst``."""
    from onnx import helper

    kind, name = node.attrs["activation"], node.name or dst
    if kind == "Silu":
        gate = f"{dst}/sigmoid"
        return [helper.make_node("Sigmoid", [src], [gate], name=f"{name}/sigmoid"),
                helper.make_node("Mul", [src, gate], [dst], name=f"{name}/mul")]
    if kind == "Clip":
        inputs = [src]
        for bound in ("min", "max"):
            value = node.attrs.get(f"activation_{bound}")
            if value is None:
                inputs.append("")
                continue
            weights[f"{name}/clip_{bound}"] = np.array(value, dtype=np.float32)
            inputs.append(f"{name}/clip_{bound}")
        while inputs[-1] == "":
            inputs.pop()
        return [helper.make_node("Clip", inputs, [dst], name=f"{name}/clip")]
    extra = {k.removeprefix("activation_"): v for k, v in node.attrs.items() if k.startswith("activation_")}
    return [helper.make_node(kind, [src], [dst], name=f"{name}/{kind.lower()}", **extra)]


GELU_SINCE = 20  # the opset that added Gelu; hetero's passes fuse the erf form into it at any opset


def _gelu_erf_nodes(node: Node, weights: dict[str, np.ndarray]) -> list[Any]:
    """Gelu as the erf form it was fused from, x * 0.5 * (1 + erf(x / sqrt 2)), for an opset without Gelu."""
    from onnx import helper

    if node.attrs.get("approximate", "none") != "none":
        raise BackendError(f"{node.label()}: Gelu(approximate={node.attrs['approximate']!r}) has no form before "
                           f"opset {GELU_SINCE}")
    (x,), (y,), name = node.inputs, node.outputs, node.name or node.outputs[0]
    for constant, value in (("sqrt2", np.sqrt(2.0)), ("half", 0.5), ("one", 1.0)):
        weights[f"{name}/{constant}"] = np.array(value, dtype=np.float32)
    return [helper.make_node("Div", [x, f"{name}/sqrt2"], [f"{name}/scaled"], name=f"{name}/div"),
            helper.make_node("Erf", [f"{name}/scaled"], [f"{name}/erf"], name=f"{name}/erf"),
            helper.make_node("Add", [f"{name}/erf", f"{name}/one"], [f"{name}/erf1"], name=f"{name}/add"),
            helper.make_node("Mul", [x, f"{name}/erf1"], [f"{name}/xerf1"], name=f"{name}/mul"),
            helper.make_node("Mul", [f"{name}/xerf1", f"{name}/half"], [y], name=f"{name}/half")]


def onnx_nodes(node: Node, weights: dict[str, np.ndarray], opset: int | None = None) -> list[Any]:
    """``node`` as standard ONNX nodes of ``opset`` (one, or the op plus its bias and activation for a fused node);
    constants the expansion needs are added to ``weights``."""
    from onnx import helper, numpy_helper

    plain = {k: (numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v)
             for k, v in node.attrs.items() if not k.startswith("activation")}
    if node.domain == ONNX_DOMAIN and node.op_type == "Gelu" and opset is not None and opset < GELU_SINCE:
        return _gelu_erf_nodes(node, weights)
    if node.domain != HETERO_DOMAIN:
        return [helper.make_node(node.op_type, node.inputs, node.outputs, name=node.name, domain=node.domain or None,
                                 **plain)]
    out = node.outputs[0]
    has_activation = node.attrs.get("activation") is not None
    mid = f"{out}/pre_activation" if has_activation else out
    if node.op_type == "FusedConv":
        nodes = [helper.make_node("Conv", node.inputs, [mid], name=node.name, **plain)]
    elif node.op_type == "ConvResidual":  # conv(x, w[, b]) + r
        conv_inputs = node.inputs[:3] if node.inputs[2] else node.inputs[:2]
        nodes = [helper.make_node("Conv", conv_inputs, [f"{out}/conv"], name=node.name, **plain),
                 helper.make_node("Add", [f"{out}/conv", node.inputs[3]], [mid], name=f"{node.name}/residual")]
    elif node.op_type == "ConvTransposeRelu":
        return [helper.make_node("ConvTranspose", node.inputs, [f"{out}/conv_transpose"], name=node.name, **plain),
                helper.make_node("Relu", [f"{out}/conv_transpose"], [out], name=f"{node.name}/relu")]
    elif node.op_type == "FusedMatMul":  # x @ W, plus the bias row
        product = f"{out}/matmul" if len(node.inputs) > 2 else mid
        nodes = [helper.make_node("MatMul", node.inputs[:2], [product], name=node.name)]
        if len(node.inputs) > 2:
            nodes.append(helper.make_node("Add", [product, node.inputs[2]], [mid], name=f"{node.name}/bias"))
    else:
        raise BackendError(f"{node.label()}: no standard ONNX form of hetero.{node.op_type}")
    if has_activation:
        nodes += _activation_nodes(node, mid, out, weights)
    return nodes


def segment_to_onnx(segment: Segment, *, producer: str = "hetero", opset: int | None = None,
                    ir_version: int | None = None) -> bytes:
    """The serialized ONNX model of ``segment``: its nodes, the weights they read, its inputs and outputs with the
    static shapes inference found. ``opset`` / ``ir_version`` override the graph's (a vendor reader may want older
    ones; the caller checks that the ops mean the same there)."""
    from onnx import helper, numpy_helper

    graph = segment.graph
    target = opset or graph.opset("")
    weights = dict(graph.initializers)
    nodes = [n for node in graph.nodes for n in onnx_nodes(node, weights, target)]

    def value(name: str) -> Any:
        info = graph.values[name]
        if info.dtype.onnx_type is None:
            raise BackendError(f"segment {segment.index}: {name!r} is {info.dtype}, which ONNX cannot carry")
        return helper.make_tensor_value_info(name, info.dtype.onnx_type, list(info.shape or ()))

    used = {name for n in nodes for name in n.input}
    initializers = [numpy_helper.from_array(np.asarray(weights[name]), name)
                    for name in sorted(weights) if name in used]
    onnx_graph = helper.make_graph(nodes, f"hetero_segment_{segment.index}", [value(n) for n in graph.inputs],
                                   [value(n) for n in graph.outputs], initializers)
    domains = {"": target} | {d: v for d, v in graph.opsets.items() if d not in ("", HETERO_DOMAIN)}
    model = helper.make_model(onnx_graph, producer_name=producer,
                              opset_imports=[helper.make_opsetid(d, v) for d, v in sorted(domains.items())])
    if ir_version is not None:
        model.ir_version = ir_version
    return model.SerializeToString(deterministic=True)
